//! The gateway end to end over Discord, in one process: the fake Discord
//! (REST and gateway WebSocket), the mock LLM, a real SQLite file, and the
//! real runner, ledger, router and Discord adapter between them.

#[path = "gateway_support/discord.rs"]
mod discord_support;

use std::time::Duration;

use discord_support::*;
use serde_json::json;
use talaria_store::{LedgerStore, ObligationState, SqliteStore};
use talaria_testkit::{FakeDiscord, Reply};

/// Waits until the ledger shows `n` delivered rows.
async fn wait_for_delivered(rig: &DiscordRig, n: u64) {
    let store = SqliteStore::open(&rig.home.state_db()).unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let counts = store.obligation_counts().await.unwrap();
        if counts.get(&ObligationState::Delivered) == Some(&n) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{counts:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_turn_is_answered_and_recorded_as_delivered() {
    let rig = DiscordRig::started(&[("DISCORD_ALLOWED_USERS", "42")], |_| {}).await;
    rig.llm.push(Reply::text("Hello from Talaria."));
    let id = rig.dc.push_dm("42", "hi there");
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].channel_id, FakeDiscord::dm_channel("42"));
    assert_eq!(sent[0].content, "Hello from Talaria.");
    assert_eq!(sent[0].reply_to.as_deref(), Some(id.as_str()));
    assert_eq!(rig.user_messages(0).last().unwrap(), "hi there");
    assert!(
        rig.dc
            .typing()
            .iter()
            .any(|t| t.channel_id == FakeDiscord::dm_channel("42"))
    );
    wait_for_delivered(&rig, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_reply_lands_in_its_thread_and_unmentioned_chatter_is_ignored() {
    let rig = DiscordRig::started(&[("DISCORD_ALLOWED_USERS", "42")], |_| {}).await;
    // Guild channels need a mention by default.
    rig.dc
        .push_thread_message("7", "70", "7001", "42", "no mention here");
    rig.dc.push_guild_message("7", "70", "42", "nor here");
    rig.settle().await;
    assert!(rig.llm.requests().is_empty());

    rig.llm.push(Reply::text("thread answer"));
    let at = rig.dc.mention();
    let id = rig
        .dc
        .push_thread_message("7", "70", "7001", "42", &format!("{at} in the thread"));
    let sent = rig.wait_for_text("thread answer").await;
    let reply = sent.iter().find(|s| s.content == "thread answer").unwrap();
    assert_eq!(reply.channel_id, "7001");
    assert_eq!(reply.reply_to.as_deref(), Some(id.as_str()));
    // Shared chats name the speaker before the text.
    let asked = rig.user_messages(0);
    assert!(
        asked.last().unwrap().ends_with("] in the thread"),
        "{asked:?}"
    );
    assert!(rig.dc.typing().iter().any(|t| t.channel_id == "7001"));

    // The parent channel is a conversation of its own.
    rig.llm.push(Reply::text("channel answer"));
    rig.dc
        .push_guild_message("7", "70", "42", &format!("{at} in the channel"));
    let sent = rig.wait_for_text("channel answer").await;
    let reply = sent.iter().find(|s| s.content == "channel answer").unwrap();
    assert_eq!(reply.channel_id, "70");
    let asked = rig.user_messages(1);
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(asked[0].ends_with("] in the channel"), "{asked:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_answer_arrives_in_parts_under_the_limit_that_reassemble() {
    let rig = DiscordRig::started(&[("DISCORD_ALLOWED_USERS", "42")], |_| {}).await;
    let mut answer = String::new();
    let mut i = 0;
    while answer.chars().count() < 5_000 {
        answer.push_str(&format!(
            "Paragraph {i}: the quick brown fox jumps over the lazy dog, again and again.\n\n"
        ));
        i += 1;
    }
    let answer = answer.trim_end().to_owned();
    rig.llm.push(Reply::text(answer.clone()));
    rig.dc.push_dm("42", "write a lot");
    let first = rig.sent(1).await;
    let total: usize = first[0]
        .content
        .rsplit_once(" (1/")
        .and_then(|(_, n)| n.trim_end_matches(')').parse().ok())
        .expect("the first part carries (1/n)");
    assert!(total >= 3, "{total} parts");
    let sent = rig.sent(total).await;
    let mut joined = String::new();
    for (i, part) in sent.iter().enumerate() {
        assert!(part.content.chars().count() <= 2000);
        let suffix = format!(" ({}/{total})", i + 1);
        joined.push_str(part.content.strip_suffix(&suffix).expect("numbered part"));
    }
    assert_eq!(joined, answer);
    assert!(sent[0].reply_to.is_some());
    assert!(sent[1..].iter().all(|s| s.reply_to.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_is_resumed_without_losing_or_repeating_a_message() {
    let rig = DiscordRig::started(&[("DISCORD_ALLOWED_USERS", "42")], |_| {}).await;
    rig.llm.push(Reply::text("first answer"));
    rig.dc.push_dm("42", "first");
    rig.sent(1).await;

    assert!(rig.dc.drop_connection());
    rig.dc.wait_for_detached(WAIT).await;
    // Sent while the bot is away: Discord keeps it for the resume.
    rig.llm.push(Reply::text("second answer"));
    rig.dc.push_dm("42", "second");
    rig.dc.wait_for_sessions(2, WAIT).await;
    assert_eq!(
        rig.dc.ready_and_resumed(),
        (1, 1),
        "resumed, not re-identified"
    );
    let sent = rig.wait_for_text("second answer").await;
    rig.settle().await;
    assert_eq!(rig.dc.sent().len(), 2, "{sent:?}");
    assert_eq!(rig.llm.requests().len(), 2);
    assert_eq!(rig.user_messages(1), vec!["first", "second"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_answer_waits_and_is_sent_once() {
    let rig = DiscordRig::started(&[("DISCORD_ALLOWED_USERS", "42")], |_| {}).await;
    rig.dc.fail_next_send_with_429(0.4, false);
    rig.llm.push(Reply::text("worth the wait"));
    rig.dc.push_dm("42", "hello");
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].content, "worth the wait");
    let attempts = rig.dc.send_attempts();
    assert_eq!(attempts.len(), 2);
    let gap = attempts[1].at.duration_since(attempts[0].at);
    assert!(gap >= Duration::from_millis(400), "retried after {gap:?}");
    rig.settle().await;
    assert_eq!(rig.dc.sent().len(), 1);
    wait_for_delivered(&rig, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_never_reach_the_model() {
    let rig = DiscordRig::started(
        &[
            ("DISCORD_ALLOWED_USERS", "42"),
            ("GATEWAY_ALLOW_ALL_USERS", "true"),
        ],
        |_| {},
    )
    .await;
    let at = rig.dc.mention();
    rig.dc.push_dm("7", "let me in");
    rig.dc
        .push_guild_message("7", "70", "7", &format!("{at} hello"));
    rig.settle().await;
    assert!(rig.dc.sent().is_empty(), "no answer, no pairing offer");
    assert!(rig.llm.requests().is_empty());

    rig.llm.push(Reply::text("Welcome back."));
    rig.dc.push_dm("42", "it's me");
    let sent = rig.sent(1).await;
    assert_eq!(sent[0].content, "Welcome back.");
    assert_eq!(rig.llm.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_delivered_message_never_starts_a_second_turn() {
    let rig = DiscordRig::started(&[("DISCORD_ALLOWED_USERS", "42")], |_| {}).await;
    let message = |id: &str, channel: &str| {
        json!({"id": id, "channel_id": channel, "content": "only once",
            "author": {"id": "42", "username": "ada"}})
    };
    rig.llm.push(Reply::text("First answer."));
    rig.dc.push_message(message("5550001", "7742"));
    rig.sent(1).await;
    // The turn is over once its answer is delivered.
    wait_for_delivered(&rig, 1).await;
    // The same message again (a second dispatch of it), then a new one
    // with the same text, which must be answered.
    rig.dc.push_message(message("5550001", "7742"));
    rig.llm.push(Reply::text("Second answer."));
    rig.dc.push_message(message("5550002", "7742"));
    let sent = rig.sent(2).await;
    assert_eq!(sent[1].content, "Second answer.");
    rig.settle().await;
    assert_eq!(rig.llm.requests().len(), 2);
    assert_eq!(rig.dc.sent().len(), 2);
}
