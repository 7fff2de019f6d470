//! The gateway end to end over QQ Bot, in one process: the adapter
//! contract suite through the fake QQ open platform (token, OpenAPI,
//! gateway WebSocket), and what only QQ does.

use crate::contract;

use std::sync::Arc;
use std::time::Duration;

use contract::{AdapterKit, Rig, Skip};
use talaria_core::{Config, Env};
use talaria_gateway::Adapter;
use talaria_platforms::qqbot::{QqbotAdapter, QqbotSettings, QqbotTimings};
use talaria_testkit::Reply;
use talaria_testkit::kit::qqbot::{QqbotKit, openid};
use talaria_testkit::kit::{PlatformKit, Who, long_answer, part_count};
use talaria_testkit::wait::wait_for;

impl AdapterKit for QqbotKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        let mut settings = QqbotSettings::from_config(&config.section().unwrap(), env)
            .unwrap()
            .unwrap();
        settings.timings = QqbotTimings {
            connect_timeout: Duration::from_secs(5),
            reidentify_delay: Duration::from_millis(50),
            rate_limited_pause: Duration::from_millis(50),
        };
        Arc::new(QqbotAdapter::new(settings).unwrap())
    }
}

adapter_contract!(QqbotKit;
    run: dm_turn, group_mention, long_answer_split, redelivery, dropped_connection,
         rate_limit, unauthorized, media_in, media_out;
    skip: thread_reply => Skip::Threadless);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_at_message_is_answered_passively_in_the_group_as_markdown() {
    let rig = Rig::<QqbotKit>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("It is **noon**."));
    let id = rig
        .kit
        .fake
        .push_group_at("GROUP0001", openid(Who::Friend), "what is the time");
    let sent = rig.wait_for_text("noon").await;
    let reply = &rig.kit.fake.sent()[0];
    assert_eq!(sent[0].chat, "group:GROUP0001");
    assert_eq!(
        (reply.scope.as_str(), reply.target.as_str()),
        ("groups", "GROUP0001")
    );
    assert_eq!(reply.msg_id.as_deref(), Some(id.as_str()));
    assert_eq!(reply.msg_seq, Some(1));
    assert!(reply.markdown, "markdown_support is on by default");
    assert_eq!(reply.text, "It is **noon**.");
    let asked = rig.user_messages(0);
    assert!(
        asked.last().unwrap().ends_with("] what is the time"),
        "{asked:?}"
    );
    // No input notice in groups: QQ has it in C2C only.
    assert!(rig.kit.fake.typing().is_empty());
    rig.wait_for_delivered(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_part_of_a_long_answer_is_a_passive_reply_with_its_own_seq() {
    let rig = Rig::<QqbotKit>::started(&[], |_| {}).await;
    let answer = long_answer(4000 * 2 + 500);
    rig.llm.push(Reply::text(answer));
    let id = rig.kit.push_dm(Who::Friend, "write a lot");
    let first = rig.sent(1).await;
    let total = part_count(&first[0].text).unwrap();
    rig.sent(total).await;
    let sent = rig.kit.fake.sent();
    let mut seqs: Vec<u64> = sent.iter().map(|s| s.msg_seq.unwrap()).collect();
    assert!(
        sent.iter()
            .all(|s| s.msg_id.as_deref() == Some(id.as_str()))
    );
    seqs.dedup();
    assert_eq!(seqs.len(), total, "a msg_seq used twice: {seqs:?}");
    // The typing notice came first, about the same message.
    let typing = rig.kit.fake.typing();
    assert_eq!(typing[0].msg_id, id);
    // One answer, one ledger row, however many parts.
    rig.wait_for_delivered(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_qq_took_offline_shows_why_on_the_status_board() {
    let rig = Rig::<QqbotKit>::started(&[], |_| {}).await;
    assert!(rig.kit.fake.close_connection(4914));
    let (_, error) = wait_for("the fatal close on the status board", || async {
        match rig.status() {
            Some((l, Some(e))) if e.contains("4914") => Ok((l, e)),
            other => Err(other),
        }
    })
    .await;
    assert!(error.contains("sandbox"), "{error}");
    assert!(!error.contains(talaria_testkit::kit::qqbot::SECRET));
}
