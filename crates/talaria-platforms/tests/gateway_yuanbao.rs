//! The gateway end to end with Yuanbao, in one process: the adapter
//! contract suite through the fake platform (signed token, protobuf
//! socket), and what only Yuanbao does.

use crate::contract;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use contract::{AdapterKit, Rig, Skip, WAIT};
use talaria_agent::tools::Tool;
use talaria_core::{Config, Env};
use talaria_gateway::Adapter;
use talaria_platforms::yuanbao::{YuanbaoAdapter, YuanbaoConfig, YuanbaoLink, YuanbaoSettings};
use talaria_testkit::kit::PlatformKit;
use talaria_testkit::kit::yuanbao::{GROUP, YuanbaoKit};
use talaria_testkit::yuanbao::{OWNER_ID, wire};
use talaria_testkit::{Reply, ToolCallReply};

type YuanbaoRig = Rig<YuanbaoKit>;

const FRIEND: &str = "ann42";

/// The link each fake's gateway shares between its adapter and its tools,
/// by the fake's socket address: what `talaria gateway run` holds in its
/// runtime, kept here because the rig asks for tools and the adapter apart.
fn link_for(config: &Config) -> YuanbaoLink {
    static LINKS: OnceLock<Mutex<HashMap<String, YuanbaoLink>>> = OnceLock::new();
    let section: YuanbaoConfig = config.section().unwrap();
    LINKS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap()
        .entry(section.ws_url)
        .or_default()
        .clone()
}

impl AdapterKit for YuanbaoKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        let settings = YuanbaoSettings::from_config(&config.section().unwrap(), env)
            .unwrap()
            .unwrap();
        Arc::new(YuanbaoAdapter::with_link(settings, link_for(config)).unwrap())
    }

    fn tools(&self, config: &Config, _env: &Env) -> Vec<Arc<dyn Tool>> {
        talaria_tools::yuanbao::yb_tools(link_for(config))
    }
}

adapter_contract!(YuanbaoKit;
    run: dm_turn, group_mention, long_answer_split, redelivery, dropped_connection,
         rate_limit, unauthorized, media_in, media_out;
    skip: thread_reply => Skip::Threadless);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_looks_a_member_up_over_the_gateways_socket() {
    let rig = YuanbaoRig::started(&[], |_| {}).await;
    rig.kit.fake.add_member(GROUP, "u-bob", "Bob Builder", 0);
    rig.kit.fake.add_member(GROUP, FRIEND, "Ann", 2);
    rig.llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c1",
        "yb_query_group_members",
        format!(r#"{{"group_code": "{GROUP}", "action": "find", "name": "bob", "mention": true}}"#),
    )]));
    rig.llm.push(Reply::text("Bob is @Bob Builder"));
    rig.kit.fake.push_group(FRIEND, GROUP, "who is bob?", true);
    rig.wait_for_text("Bob is @Bob Builder").await;
    // The tool's answer, from the platform, reached the model.
    let second = rig.llm.requests()[1].body.to_string();
    assert!(second.contains("u-bob"), "{second}");
    assert!(second.contains("mention_hint"), "{second}");
    let asked: Vec<String> = rig
        .kit
        .fake
        .requests()
        .iter()
        .map(|r| r.cmd.clone())
        .filter(|c| c == "get_group_member_list")
        .collect();
    assert_eq!(asked.len(), 1);
    rig.wait_for_delivered(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reply_heartbeat_runs_while_working_and_finishes_after_the_answer() {
    let rig = YuanbaoRig::started(&[], |_| {}).await;
    rig.llm
        .push(Reply::text("Done thinking.").with_delay(std::time::Duration::from_millis(1500)));
    rig.kit.fake.push_dm(FRIEND, "think hard");
    rig.sent(1).await;
    let chat = format!("direct:{FRIEND}");
    let beats = rig
        .kit
        .fake
        .wait_for_heartbeat(WAIT, |h| h.chat == chat && h.beat == 2)
        .await;
    let mine: Vec<i32> = beats
        .iter()
        .filter(|h| h.chat == chat)
        .map(|h| h.beat)
        .collect();
    // RUNNING repeated while the model worked, FINISH last.
    assert!(mine.iter().filter(|b| **b == 1).count() >= 2, "{mine:?}");
    assert_eq!(mine.last(), Some(&2), "{mine:?}");
    rig.wait_for_delivered(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_replayed_after_a_restart_starts_no_second_turn() {
    let mut rig = YuanbaoRig::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("First answer."));
    let id = rig.kit.fake.push_dm(FRIEND, "only once");
    rig.sent(1).await;
    rig.kit.fake.wait_for_all_acked(WAIT).await;
    rig.wait_for_delivered(1).await;
    // A new process forgets what the adapter saw; the store remembers.
    rig.restart().await;
    rig.kit.fake.push(&wire::dm(FRIEND, &id, "only once"));
    rig.llm.push(Reply::text("Second answer."));
    rig.kit.fake.push_dm(FRIEND, "only once");
    let sent = rig.sent(2).await;
    assert_eq!(sent[1].text, "Second answer.");
    rig.barrier().await;
    assert_eq!(rig.llm.requests().len(), 3, "the replay started a turn");
    assert_eq!(rig.kit.sent().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_resets_a_group_session_without_mentioning_the_bot() {
    let rig = YuanbaoRig::started(
        &[("YUANBAO_ALLOWED_USERS", &format!("{FRIEND},{OWNER_ID}"))],
        |_| {},
    )
    .await;
    rig.llm.push(Reply::text("group answer"));
    rig.kit.fake.push_group(FRIEND, GROUP, "remember 42", true);
    rig.wait_for_text("group answer").await;
    rig.wait_for_delivered(1).await;
    rig.kit.fake.push(&wire::group(
        OWNER_ID,
        GROUP,
        &rig.kit.fake.next_msg_id(),
        vec![wire::text("/new")],
    ));
    // The command's confirmation goes to the group; no model turn.
    let sent = rig.sent(2).await;
    assert_eq!(sent[1].chat, format!("group:{GROUP}"));
    assert_eq!(rig.llm.requests().len(), 1);
    // Someone else's unmentioned command is chatter.
    rig.kit.fake.push(&wire::group(
        FRIEND,
        GROUP,
        &rig.kit.fake.next_msg_id(),
        vec![wire::text("/new")],
    ));
    // Had it been taken as a command, its confirmation would have gone
    // out before the marker was taken.
    rig.barrier().await;
    assert_eq!(rig.kit.sent().len(), 3, "{:?}", rig.kit.sent());
    assert_eq!(
        rig.llm.requests().len(),
        2,
        "the group's turn and the marker's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_stay_closed_under_the_default_policy() {
    let rig = YuanbaoRig::started(&[("YUANBAO_GROUP_POLICY", "pairing")], |_| {}).await;
    rig.kit
        .fake
        .push_group(FRIEND, GROUP, "anyone there?", true);
    rig.llm.push(Reply::text("dm answer"));
    rig.kit.fake.push_dm(FRIEND, "hello");
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].text, "dm answer");
    // The DM came after the group's message: its answer is the barrier.
    rig.kit.wait_acknowledged().await;
    rig.assert_nothing_owed().await;
    assert_eq!(rig.llm.requests().len(), 1);
    assert_eq!(rig.kit.sent().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_reconnect_close_code_shows_in_the_status() {
    let rig = YuanbaoRig::started(&[], |_| {}).await;
    rig.kit.fake.close_with(4014);
    talaria_testkit::wait::wait_for("the close in the status", || async {
        match rig.status() {
            Some((_, Some(error))) if error.contains("4014") => Ok(()),
            other => Err(other),
        }
    })
    .await;
    assert!(!rig.kit.fake.is_connected());
}
