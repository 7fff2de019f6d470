//! The gateway end to end with DingTalk, in one process: the adapter
//! contract suite through the fake DingTalk (Stream mode, session webhooks
//! and the robot send API), and what only DingTalk does.

use crate::contract;

use std::sync::Arc;
use std::time::Duration;

use contract::{AdapterKit, Rig, Skip, WAIT};
use talaria_core::{Config, Env};
use talaria_gateway::Adapter;
use talaria_platforms::dingtalk::{DingTalkAdapter, DingTalkSettings};
use talaria_platforms::registry::{Built, Setup};
use talaria_testkit::Reply;
use talaria_testkit::dingtalk::Via;
use talaria_testkit::kit::dingtalk::{DingTalkKit, GROUP};
use talaria_testkit::kit::{PlatformKit, Who};
use talaria_testkit::wait::wait_for;

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
         rate_limit, unauthorized, media_in, media_out;
    skip: thread_reply => Skip::Threadless);

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_in_an_answer_is_uploaded_and_sent_through_the_robot_api() {
    let rig = DingTalkRig::started(&[], |_| {}).await;
    let pdf = b"%PDF-1.4 a report".to_vec();
    std::fs::write(rig.dir.path().join("report.pdf"), &pdf).unwrap();
    rig.llm
        .push(Reply::text("The report is attached.\nMEDIA:report.pdf"));
    rig.kit.push_dm(Who::Friend, "the report please");
    rig.wait_for_text("The report is attached.").await;
    let files = rig.kit.fake.wait_for_file_messages(1, WAIT).await;
    assert_eq!(files[0].conversation, "cidDM42");
    assert_eq!(files[0].msg_key, "sampleFile");
    assert_eq!(files[0].file_name.as_deref(), Some("report.pdf"));
    assert_eq!(files[0].file_type.as_deref(), Some("pdf"));
    let uploads = rig.kit.fake.uploads();
    assert_eq!(uploads.len(), 1);
    assert_eq!(
        (uploads[0].kind.as_str(), &uploads[0].bytes),
        ("file", &pdf)
    );
    assert_eq!(uploads[0].media_id, files[0].media);
    // Both the upload and the message carried the app's access token.
    let requests = rig.kit.fake.requests();
    let upload = requests.iter().find(|r| r.path == "/media/upload").unwrap();
    assert!(upload.authorized);
    let batch = requests
        .iter()
        .find(|r| r.path == "/v1.0/robot/oToMessages/batchSend")
        .unwrap();
    assert!(batch.authorized);
    assert_eq!(batch.body["userIds"][0], "staff42");
    rig.wait_for_delivered(1).await;
}

/// The AI card of `rig` once `n` are finalized, checked to have grown
/// and to be finalized exactly once.
async fn finalized_card(rig: &DingTalkRig, n: usize) -> talaria_testkit::dingtalk::Card {
    let cards = rig.kit.fake.wait_for_finalized_cards(n, WAIT).await;
    let card = cards.into_iter().find(|c| c.finalized()).unwrap();
    assert_eq!(card.template, "tpl-answer.schema");
    let finals = card.updates.iter().filter(|u| u.finalize).count();
    assert_eq!(finals, 1, "finalized once: {:?}", card.updates);
    assert!(card.updates.last().unwrap().finalize, "{:?}", card.updates);
    assert!(card.updates.iter().all(|u| u.full));
    card
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_card_template_the_answer_streams_into_one_ai_card() {
    let rig = DingTalkRig::started(&[("DINGTALK_CARD_TEMPLATE_ID", "tpl-answer.schema")], |c| {
        c.gateway.stream_edit_interval_ms = 100;
    })
    .await;
    let answer = "Cards grow while the model writes, then they are finished.";
    rig.llm
        .push(Reply::text(answer).with_chunk_pause(Duration::from_millis(300)));
    rig.kit.push_dm(Who::Friend, "tell me about cards");
    let card = finalized_card(&rig, 1).await;
    assert_eq!(card.space.as_deref(), Some("dtv1.card//IM_ROBOT.staff42"));
    let contents: Vec<&str> = card.updates.iter().map(|u| u.content.as_str()).collect();
    assert!(contents.len() >= 3, "the card grew in steps: {contents:?}");
    let growing = &card.updates[..card.updates.len() - 1];
    for (i, u) in growing.iter().enumerate() {
        assert!(!u.error && !u.finalize, "{contents:?}");
        let text = u.content.trim_end_matches(" ▍");
        assert!(
            u.content.ends_with('▍') && answer.starts_with(text),
            "{contents:?}"
        );
        if let Some(next) = growing.get(i + 1) {
            assert!(
                next.content.trim_end_matches(" ▍").len() >= text.len(),
                "{contents:?}"
            );
        }
    }
    let last = card.updates.last().unwrap();
    assert_eq!((last.content.as_str(), last.error), (answer, false));
    // The card was the answer: no message went besides it.
    rig.wait_for_delivered(1).await;
    assert!(rig.kit.fake.sent().is_empty(), "{:?}", rig.kit.fake.sent());
    assert_eq!(rig.kit.fake.cards().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_card_is_finalized_as_an_error_and_the_next_answer_gets_its_own() {
    let rig = DingTalkRig::started(&[("DINGTALK_CARD_TEMPLATE_ID", "tpl-answer.schema")], |c| {
        c.gateway.stream_edit_interval_ms = 100;
        c.gateway.busy_ack = false;
    })
    .await;
    rig.llm
        .push(Reply::text("This answer never finishes because").stall_after(1));
    rig.llm.push(Reply::text("Second answer."));
    rig.kit.push_in_group("first", true);
    wait_for("the first card", || async {
        let cards = rig.kit.fake.cards();
        if cards.iter().any(|c| !c.updates.is_empty()) {
            Ok(())
        } else {
            Err(cards)
        }
    })
    .await;
    rig.kit.push_in_group("second", true);
    let cards = rig.kit.fake.wait_for_finalized_cards(2, WAIT).await;
    assert_eq!(cards.len(), 2, "{cards:?}");
    let first = &cards[0];
    let end = first.updates.last().unwrap();
    assert!(end.finalize && end.error, "{:?}", first.updates);
    assert!(end.content.contains("Stopped before"), "{end:?}");
    assert_eq!(
        first.space.as_deref(),
        Some(format!("dtv1.card//IM_GROUP.{GROUP}").as_str())
    );
    let end = cards[1].updates.last().unwrap();
    assert_eq!((end.content.as_str(), end.error), ("Second answer.", false));
    // Each card was finalized once, whatever the interleaving.
    for card in &cards {
        assert_eq!(card.template, "tpl-answer.schema");
        assert_eq!(
            card.updates.iter().filter(|u| u.finalize).count(),
            1,
            "{card:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_card_template_answers_are_messages() {
    let rig = DingTalkRig::started(&[], |c| {
        c.gateway.stream_edit_interval_ms = 100;
    })
    .await;
    rig.llm.push(
        Reply::text("Sent whole, once it is done.").with_chunk_pause(Duration::from_millis(150)),
    );
    rig.kit.push_dm(Who::Friend, "hello");
    let sent = rig.wait_for_text("Sent whole, once it is done.").await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    rig.wait_for_delivered(1).await;
    assert!(rig.kit.fake.cards().is_empty());
    assert!(
        rig.kit
            .fake
            .requests()
            .iter()
            .all(|r| !r.path.starts_with("/v1.0/card/"))
    );
}
