//! The gateway end to end with DingTalk, in one process: the adapter
//! contract suite through the fake DingTalk (Stream mode, session webhooks
//! and the robot send API), and what only DingTalk does.

#[macro_use]
mod contract;

use std::sync::Arc;

use contract::{AdapterKit, Rig, Skip, WAIT};
use talaria_core::{Config, Env};
use talaria_gateway::Adapter;
use talaria_platforms::dingtalk::{DingTalkAdapter, DingTalkSettings};
use talaria_platforms::registry::{Built, Setup};
use talaria_testkit::Reply;
use talaria_testkit::dingtalk::Via;
use talaria_testkit::kit::dingtalk::{DingTalkKit, GROUP};
use talaria_testkit::kit::{PlatformKit, Who};

type DingTalkRig = Rig<DingTalkKit>;

impl AdapterKit for DingTalkKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        let settings = DingTalkSettings::from_config(&config.section().unwrap(), env).unwrap();
        Arc::new(DingTalkAdapter::new(settings, None).unwrap())
    }

    fn build(&self, setup: &Setup<'_>) -> Built {
        // As the registry builds it: with the store that keeps how each
        // chat is reached across restarts.
        let settings =
            DingTalkSettings::from_config(&setup.config.section().unwrap(), setup.env).unwrap();
        Built::connected(DingTalkAdapter::new(settings, Some(setup.cursors.clone())).unwrap())
    }
}

adapter_contract!(DingTalkKit;
    run: dm_turn, group_mention, long_answer_split, redelivery, dropped_connection,
         rate_limit, unauthorized, media_in;
    skip: thread_reply => Skip::Threadless, media_out => Skip::SendsNoFiles);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_goes_as_markdown_through_the_session_webhook() {
    let rig = DingTalkRig::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("Steps:\n1. **one**\n2. two"));
    rig.kit.push_dm(Who::Friend, "how?");
    let sent = rig.kit.fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].via, Via::Session);
    assert_eq!(sent[0].conversation, "cidDM42");
    assert_eq!(sent[0].msgtype, "markdown");
    assert_eq!(sent[0].title.as_deref(), Some("Talaria"));
    // A list right under a line renders only after a blank line.
    assert_eq!(sent[0].text, "Steps:\n\n1. **one**\n2. two");
    rig.wait_for_delivered(1).await;
    // The session webhook needed no token.
    assert!(
        rig.kit
            .fake
            .requests()
            .iter()
            .all(|r| r.path != "/v1.0/oauth2/accessToken")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_answer_after_the_webhook_expired_goes_through_the_robot_api() {
    let rig = DingTalkRig::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("late for the DM"));
    rig.kit.push_dm(Who::Friend, "take your time");
    rig.wait_for_text("late for the DM").await;
    // The session webhooks die (the turn took longer than they live),
    // though the next message says its webhook lives ninety minutes.
    rig.kit.fake.expire_sessions();
    rig.llm.push(Reply::text("still here"));
    rig.kit.push_dm(Who::Friend, "again");
    let sent = rig.wait_for_text("still here").await;
    let late = sent.iter().find(|s| s.text == "still here").unwrap();
    assert_eq!(late.chat, "cidDM42");
    let robot = rig.kit.fake.sent();
    assert_eq!(robot.last().unwrap().via, Via::Robot);
    let batch: Vec<_> = rig
        .kit
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1.0/robot/oToMessages/batchSend")
        .collect();
    assert!(batch.iter().all(|r| r.authorized), "{batch:?}");
    assert_eq!(batch.last().unwrap().body["userIds"][0], "staff42");
    assert_eq!(batch.last().unwrap().body["msgKey"], "sampleMarkdown");
    rig.wait_for_delivered(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_answer_goes_to_the_group_and_mentions_can_be_switched_off() {
    let rig = DingTalkRig::started(&[("DINGTALK_REQUIRE_MENTION", "false")], |_| {}).await;
    rig.llm.push(Reply::text("heard without a mention"));
    rig.kit.push_in_group("anyone there", false);
    let sent = rig.wait_for_text("heard without a mention").await;
    assert_eq!(sent[0].chat, GROUP);
    let asked = rig.user_messages(0);
    assert!(
        asked.last().unwrap().ends_with("] anyone there"),
        "{asked:?}"
    );
    // After the webhook is gone, the group is reached by its conversation.
    rig.kit.fake.expire_sessions();
    rig.llm.push(Reply::text("via the robot"));
    rig.kit.push_in_group("and now", true);
    rig.wait_for_text("via the robot").await;
    let last = rig.kit.fake.sent().last().cloned().unwrap();
    assert_eq!((last.via, last.conversation.as_str()), (Via::Robot, GROUP));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnect_notice_brings_a_new_connection_with_a_fresh_ticket() {
    let rig = DingTalkRig::started(&[], |_| {}).await;
    let ping = rig.kit.fake.send_ping("probe-1");
    let ack = rig.kit.fake.wait_for_ack(&ping, WAIT).await;
    assert_eq!(ack.code, 200);
    assert_eq!(ack.data, r#"{"opaque":"probe-1"}"#);
    rig.kit.fake.send_disconnect();
    rig.kit.fake.wait_for_connection(2, WAIT).await;
    assert_eq!(
        rig.kit.fake.refused_dials(),
        0,
        "every dial had a fresh ticket"
    );
    rig.llm.push(Reply::text("after the reconnect"));
    rig.kit.push_dm(Who::Friend, "still there?");
    rig.wait_for_text("after the reconnect").await;
    rig.kit.fake.wait_for_all_acked(WAIT).await;
    assert_eq!(
        rig.status().map(|s| s.0),
        Some(talaria_gateway::Liveness::Live)
    );
}
