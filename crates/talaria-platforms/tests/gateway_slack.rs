//! The gateway end to end with Slack, in one process: the adapter contract
//! suite through the fake Slack (Socket Mode and Web API), and what only
//! Slack does.

use crate::contract;

use std::sync::Arc;
use std::time::Duration;

use contract::{AdapterKit, Rig, WAIT};
use serde_json::json;
use talaria_core::{Config, Env};
use talaria_gateway::Adapter;
use talaria_platforms::slack::{SlackAdapter, SlackSettings};
use talaria_testkit::Reply;
use talaria_testkit::kit::slack::SlackKit;

type SlackRig = Rig<SlackKit>;

const USER: &str = "U42";

impl AdapterKit for SlackKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        let settings = SlackSettings::from_config(&config.section().unwrap(), env).unwrap();
        Arc::new(SlackAdapter::new(settings).unwrap())
    }
}

adapter_contract!(SlackKit;
    run: dm_turn, group_mention, thread_reply, long_answer_split, redelivery, dropped_connection,
         rate_limit, unauthorized, media_in, media_out;
    skip: );

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_answer_is_mrkdwn_with_a_working_reaction_meanwhile() {
    let rig = SlackRig::started(&[], |_| {}).await;
    rig.llm
        .push(Reply::text("Hello from **Talaria** & co.").with_delay(Duration::from_millis(300)));
    let (_, ts) = rig.kit.fake.push_dm("D42", USER, "hi there");
    let posted = rig.kit.fake.wait_for_posts(1, WAIT).await;
    assert_eq!(posted[0].channel, "D42");
    assert_eq!(posted[0].thread_ts, None);
    assert_eq!(posted[0].text, "Hello from *Talaria* &amp; co.");
    assert_eq!(rig.user_messages(0).last().unwrap(), "hi there");
    // The reaction went on the user's message while the model worked, and
    // came off once the answer was out.
    let reactions = rig
        .kit
        .fake
        .wait_for_reactions(WAIT, |r| r.iter().any(|r| !r.added))
        .await;
    assert!(reactions[0].added && reactions[0].timestamp == ts && reactions[0].name == "eyes");
    assert!(
        reactions
            .iter()
            .all(|r| r.channel == "D42" && r.timestamp == ts)
    );
    rig.wait_for_delivered(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_top_level_mention_is_answered_at_the_top_level_and_chatter_is_ignored() {
    let rig = SlackRig::started(&[], |_| {}).await;
    let bot = rig.kit.fake.bot_user_id();
    let parent = "1700000000.900000";
    rig.llm.push(Reply::text("thread answer"));
    let text = format!("<@{bot}> in a thread");
    let (_, ts) = rig
        .kit
        .fake
        .push_channel_message("C1", USER, &text, Some(parent));
    // Slack sends the mention twice (message and app_mention).
    rig.kit
        .fake
        .push_app_mention("C1", USER, &text, &ts, Some(parent));
    let posted = rig.wait_for_text("thread answer").await;
    let reply = posted.iter().find(|p| p.text == "thread answer").unwrap();
    assert_eq!(reply.chat, "C1");
    assert_eq!(reply.thread.as_deref(), Some(parent));
    // The mention is stripped (shared chats prefix the sender's label).
    let asked = rig.user_messages(0).last().unwrap().clone();
    assert!(
        asked.ends_with("] in a thread") && !asked.contains("<@"),
        "{asked}"
    );

    // Without a mention, a channel message is not for the bot.
    rig.kit
        .fake
        .push_channel_message("C1", USER, "talking among ourselves", None);
    // A top-level mention is answered at the top level.
    rig.llm.push(Reply::text("channel answer"));
    rig.kit
        .fake
        .push_channel_message("C1", USER, &format!("<@{bot}> top level"), None);
    let posted = rig.wait_for_text("channel answer").await;
    let reply = posted.iter().find(|p| p.text == "channel answer").unwrap();
    assert_eq!(reply.thread, None);
    rig.barrier().await;
    assert_eq!(
        rig.llm.requests().len(),
        3,
        "one turn per mentioned message, and the marker's"
    );
    assert_eq!(rig.kit.fake.posted().len(), 3);
    // The thread is its own conversation.
    let asked = rig.user_messages(1);
    assert!(
        asked.len() == 1 && asked[0].ends_with("top level"),
        "{asked:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_envelope_and_a_replay_after_restart_start_no_second_turn() {
    let mut rig = SlackRig::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("First answer."));
    let (_, ts) = rig.kit.fake.push_dm("D42", USER, "only once");
    rig.kit.fake.wait_for_posts(1, WAIT).await;
    rig.kit.fake.wait_for_all_acked(WAIT).await;
    // Slack retries an envelope it thinks was not acknowledged.
    rig.kit.fake.redeliver(true);
    // A restart forgets what the adapter saw; the store remembers what the
    // runner took. The same message again, in a new envelope, after it.
    rig.stop().await;
    rig.start();
    rig.kit.fake.wait_for_connection(2, WAIT).await;
    rig.kit.fake.redeliver(true);
    rig.kit.fake.push_event(json!({
        "type": "message", "channel": "D42", "channel_type": "im",
        "user": USER, "text": "only once", "ts": ts,
    }));
    // A new message with the same text is a new turn.
    rig.llm.push(Reply::text("Second answer."));
    rig.kit.fake.push_dm("D42", USER, "only once");
    let posted = rig.kit.fake.wait_for_posts(2, WAIT).await;
    assert_eq!(posted[1].text, "Second answer.");
    rig.wait_for_delivered(2).await;
    rig.barrier().await;
    assert_eq!(rig.llm.requests().len(), 3, "a repeat started a turn");
    assert_eq!(rig.kit.fake.posted().len(), 3);
    // The same ts in another channel is another message.
    rig.llm.push(Reply::text("Third answer."));
    rig.kit.fake.push_event(json!({
        "type": "message", "channel": "D43", "channel_type": "im",
        "user": USER, "text": "hello from D43", "ts": ts,
    }));
    let posted = rig.kit.fake.wait_for_posts(4, WAIT).await;
    assert_eq!(posted[3].channel, "D43");
}
