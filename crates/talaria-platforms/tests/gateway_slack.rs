//! The gateway end to end with Slack, in one process: the fake Slack
//! (Socket Mode and Web API), the mock LLM, a real SQLite file, and the
//! real runner, supervisor, ledger and Slack adapter between them.

#[path = "gateway_support/slack.rs"]
mod slack_support;

use std::time::Duration;

use serde_json::json;
use slack_support::*;
use talaria_testkit::Reply;
use talaria_testkit::slack::PostFailure;

const USER: &str = "U42";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_turn_is_answered_with_a_working_reaction_meanwhile() {
    let rig = SlackRig::started(&[("SLACK_ALLOWED_USERS", USER)], |_| {}).await;
    rig.llm
        .push(Reply::text("Hello from **Talaria** & co.").with_delay(Duration::from_millis(300)));
    let (_, ts) = rig.slack.push_dm("D42", USER, "hi there");
    let posted = rig.posts(1).await;
    assert_eq!(posted[0].channel, "D42");
    assert_eq!(posted[0].thread_ts, None);
    assert_eq!(posted[0].text, "Hello from *Talaria* &amp; co.");
    assert_eq!(rig.user_messages(0).last().unwrap(), "hi there");
    // The reaction went on the user's message while the model worked, and
    // came off once the answer was out.
    let reactions = rig
        .slack
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
async fn a_thread_reply_lands_in_its_thread_and_a_mention_is_answered_once() {
    let rig = SlackRig::started(&[("SLACK_ALLOWED_USERS", USER)], |_| {}).await;
    let bot = rig.slack.bot_user_id();
    let parent = "1700000000.900000";
    rig.llm.push(Reply::text("thread answer"));
    let text = format!("<@{bot}> in a thread");
    let (_, ts) = rig
        .slack
        .push_channel_message("C1", USER, &text, Some(parent));
    // Slack sends the mention twice (message and app_mention).
    rig.slack
        .push_app_mention("C1", USER, &text, &ts, Some(parent));
    let posted = rig.wait_for_text("thread answer").await;
    let reply = posted.iter().find(|p| p.text == "thread answer").unwrap();
    assert_eq!(reply.channel, "C1");
    assert_eq!(reply.thread_ts.as_deref(), Some(parent));
    // The mention is stripped (shared chats prefix the sender's label).
    let asked = rig.user_messages(0).last().unwrap().clone();
    assert!(
        asked.ends_with("] in a thread") && !asked.contains("<@"),
        "{asked}"
    );

    // Without a mention, a channel message is not for the bot.
    rig.slack
        .push_channel_message("C1", USER, "talking among ourselves", None);
    // A top-level mention is answered at the top level.
    rig.llm.push(Reply::text("channel answer"));
    rig.slack
        .push_channel_message("C1", USER, &format!("<@{bot}> top level"), None);
    let posted = rig.wait_for_text("channel answer").await;
    let reply = posted.iter().find(|p| p.text == "channel answer").unwrap();
    assert_eq!(reply.thread_ts, None);
    rig.settle().await;
    assert_eq!(
        rig.llm.requests().len(),
        2,
        "one turn per mentioned message"
    );
    assert_eq!(rig.slack.posted().len(), 2);
    // The thread is its own conversation.
    let asked = rig.user_messages(1);
    assert!(
        asked.len() == 1 && asked[0].ends_with("top level"),
        "{asked:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_answer_is_split_under_the_limit_and_reassembles() {
    let rig = SlackRig::started(&[("SLACK_ALLOWED_USERS", USER)], |_| {}).await;
    let mut answer = String::new();
    let mut i = 0;
    while answer.chars().count() < 100_000 {
        answer.push_str(&format!(
            "Paragraph {i}: the quick brown fox jumps over the lazy dog, again and again.\n\n"
        ));
        i += 1;
    }
    let answer = answer.trim_end().to_owned();
    rig.llm.push(Reply::text(answer.clone()));
    rig.slack.push_dm("D42", USER, "write a lot");
    let first = rig.posts(1).await;
    let total: usize = first[0]
        .rendered()
        .rsplit_once(" (1/")
        .and_then(|(_, n)| n.trim_end_matches(')').parse().ok())
        .expect("the first part carries (1/n)");
    assert!(total >= 3, "{total} parts");
    let posted = rig.posts(total).await;
    let mut joined = String::new();
    for (i, part) in posted.iter().enumerate() {
        assert!(part.text.chars().count() <= 39_000, "part {i} is too long");
        let suffix = format!(" ({}/{total})", i + 1);
        joined.push_str(
            part.rendered()
                .strip_suffix(&suffix)
                .expect("numbered part"),
        );
    }
    assert_eq!(joined, answer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_is_resumed_and_nothing_is_lost_or_doubled() {
    let rig = SlackRig::started(&[("SLACK_ALLOWED_USERS", USER)], |_| {}).await;
    rig.llm.push(Reply::text("first answer"));
    rig.slack.push_dm("D42", USER, "before the drop");
    rig.wait_for_text("first answer").await;
    rig.slack.wait_for_all_acked(WAIT).await;

    rig.slack.drop_connection();
    // Sent while no connection is up: Slack holds it for the next one.
    rig.llm.push(Reply::text("second answer"));
    rig.slack.push_dm("D42", USER, "during the outage");
    rig.slack.wait_for_connection(2, WAIT).await;
    rig.wait_for_text("second answer").await;
    rig.slack.wait_for_all_acked(WAIT).await;
    // And the acknowledged first message is not re-sent by Slack, nor
    // answered again.
    rig.settle().await;
    assert_eq!(rig.llm.requests().len(), 2);
    assert_eq!(rig.slack.posted().len(), 2);
    assert_eq!(
        rig.user_messages(1),
        vec!["before the drop", "during the outage"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_answer_waits_for_retry_after_and_is_sent_once() {
    let rig = SlackRig::started(&[("SLACK_ALLOWED_USERS", USER)], |_| {}).await;
    rig.slack.fail_next_post(PostFailure::RateLimited(1));
    rig.llm.push(Reply::text("patient answer"));
    rig.slack.push_dm("D42", USER, "hello");
    let attempts = rig.slack.wait_for_post_attempts(1, WAIT).await;
    let first_try = attempts[0].at;
    let posted = rig.posts(1).await;
    assert_eq!(posted[0].text, "patient answer");
    assert!(
        posted[0].at.duration_since(first_try) >= Duration::from_secs(1),
        "Retry-After was not honoured"
    );
    rig.wait_for_delivered(1).await;
    assert_eq!(rig.slack.post_attempts().len(), 2);
    assert_eq!(rig.slack.posted().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthorized_sender_never_reaches_the_model() {
    let rig = SlackRig::started(&[("SLACK_ALLOWED_USERS", USER)], |_| {}).await;
    let bot = rig.slack.bot_user_id();
    rig.slack.push_dm("D7", "U7", "let me in");
    rig.slack
        .push_channel_message("C1", "U7", &format!("<@{bot}> hello"), None);
    rig.settle().await;
    rig.slack.wait_for_all_acked(WAIT).await;
    assert!(rig.llm.requests().is_empty());
    assert!(rig.slack.posted().is_empty(), "no answer, no pairing offer");
    assert!(rig.slack.reactions().is_empty());

    rig.llm.push(Reply::text("Welcome back."));
    rig.slack.push_dm("D42", USER, "it's me");
    let posted = rig.posts(1).await;
    assert_eq!(posted[0].channel, "D42");
    assert_eq!(rig.llm.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_delivered_event_never_starts_a_second_turn() {
    let mut rig = SlackRig::started(&[("SLACK_ALLOWED_USERS", USER)], |_| {}).await;
    rig.llm.push(Reply::text("First answer."));
    let (_, ts) = rig.slack.push_dm("D42", USER, "only once");
    rig.posts(1).await;
    rig.slack.wait_for_all_acked(WAIT).await;
    // Slack retries an envelope it thinks was not acknowledged.
    rig.slack.redeliver(true);
    // A restart forgets what the adapter saw; the store remembers what the
    // runner took. The same message again, in a new envelope, after it.
    rig.stop().await;
    rig.start();
    rig.slack.wait_for_connection(2, WAIT).await;
    rig.slack.redeliver(true);
    rig.slack.push_event(json!({
        "type": "message", "channel": "D42", "channel_type": "im",
        "user": USER, "text": "only once", "ts": ts,
    }));
    // A new message with the same text is a new turn.
    rig.llm.push(Reply::text("Second answer."));
    rig.slack.push_dm("D42", USER, "only once");
    let posted = rig.posts(2).await;
    assert_eq!(posted[1].text, "Second answer.");
    rig.slack.wait_for_all_acked(WAIT).await;
    rig.settle().await;
    assert_eq!(rig.llm.requests().len(), 2);
    assert_eq!(rig.slack.posted().len(), 2);
    // The same ts in another channel is another message.
    rig.llm.push(Reply::text("Third answer."));
    rig.slack.push_event(json!({
        "type": "message", "channel": "D43", "channel_type": "im",
        "user": USER, "text": "hello from D43", "ts": ts,
    }));
    let posted = rig.posts(3).await;
    assert_eq!(posted[2].channel, "D43");
}
