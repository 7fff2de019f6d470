//! The gateway end to end with Signal, in one process: the fake signal-cli
//! REST API, the mock LLM, a real SQLite file, and the real runner,
//! ledger, router and Signal adapter between them.

#[path = "gateway_support/signal.rs"]
mod support;

use std::time::Duration;

use support::*;
use talaria_testkit::FakeSignal;
use talaria_testkit::Reply;
use talaria_testkit::signal::{Mode, NewMessage};

/// Alice by her number, as an operator would most likely write her.
fn alice_listed() -> Vec<(&'static str, String)> {
    vec![("SIGNAL_ALLOWED_USERS", alice().number)]
}

fn env<'a>(pairs: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    pairs.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_is_answered_in_the_dm_and_recorded_as_delivered() {
    let listed = alice_listed();
    let rig = Rig::started(&env(&listed), |_| {}).await;
    rig.llm.push(Reply::text("Hello from **Talaria**."));
    rig.signal.push(NewMessage::dm(&alice(), "hi there"));
    let sent = rig.signal.wait_for_sent(1, WAIT).await;
    // Answered to the sender's UUID, in plain text, quoting nothing.
    assert_eq!(sent[0].recipients, vec![alice().uuid]);
    assert_eq!(sent[0].number, BOT);
    assert_eq!(sent[0].message, "Hello from Talaria.");
    assert_eq!(sent[0].quote_timestamp, None);
    assert_eq!(rig.user_messages(0).last().unwrap(), "hi there");
    assert!(
        rig.signal
            .typing()
            .iter()
            .any(|t| t.recipient == alice().uuid && t.show)
    );
    rig.wait_for_delivered(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_mention_is_answered_in_the_group_quoting_it() {
    let listed = alice_listed();
    let rig = Rig::started(&env(&listed), |_| {}).await;
    let group = "R3JvdXAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDA=";
    rig.signal
        .push(NewMessage::dm(&alice(), "no mention, no answer").in_group(group, "Team"));
    rig.llm.push(Reply::text("Group answer."));
    let asked = rig.signal.push(
        NewMessage::dm(&alice(), "my name is Ada")
            .in_group(group, "Team")
            .mentioning(BOT),
    );
    let sent = rig.wait_for_text("Group answer.").await;
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].recipients, vec![FakeSignal::group_recipient(group)]);
    assert_eq!(sent[0].quote_timestamp, Some(asked));
    assert_eq!(sent[0].quote_author.as_deref(), Some(alice().uuid.as_str()));
    // Shared chats name the speaker to the model; the mention is gone.
    let asked_text = rig.user_messages(0);
    assert_eq!(asked_text.len(), 1);
    assert!(asked_text[0].starts_with("[Alice"), "{asked_text:?}");
    assert!(
        asked_text[0].ends_with("] my name is Ada"),
        "{asked_text:?}"
    );

    // Quoting the bot's answer addresses it without a mention, and the
    // group's conversation goes on.
    rig.wait_for_delivered(1).await;
    rig.llm.push(Reply::text("You are Ada."));
    rig.signal.push(
        NewMessage::dm(&alice(), "who am I?")
            .in_group(group, "Team")
            .quoting(sent[0].timestamp, BOT, "Group answer."),
    );
    rig.wait_for_text("You are Ada.").await;
    let history = rig.user_messages(1);
    assert_eq!(history.len(), 2, "{history:?}");
    assert!(history[1].contains("who am I?"), "{history:?}");
    rig.settle().await;
    assert_eq!(rig.llm.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_answer_is_split_under_the_limit_and_reassembles() {
    let listed = alice_listed();
    let rig = Rig::started(&env(&listed), |_| {}).await;
    let limit = talaria_platforms::signal::MAX_MESSAGE_CHARS;
    let mut answer = String::new();
    let mut i = 0;
    while answer.chars().count() < limit * 2 + 500 {
        answer.push_str(&format!(
            "Paragraph {i}: the quick brown fox jumps over the lazy dog, again and again.\n\n"
        ));
        i += 1;
    }
    let answer = answer.trim_end().to_owned();
    rig.llm.push(Reply::text(answer.clone()));
    rig.signal.push(NewMessage::dm(&alice(), "write a lot"));
    let first = rig.signal.wait_for_sent(1, WAIT).await;
    let total: usize = first[0]
        .message
        .rsplit_once(" (1/")
        .and_then(|(_, n)| n.trim_end_matches(')').parse().ok())
        .expect("the first part carries (1/n)");
    assert_eq!(total, 3);
    let sent = rig.signal.wait_for_sent(total, WAIT).await;
    let mut joined = String::new();
    for (i, part) in sent.iter().enumerate() {
        assert!(part.message.chars().count() <= limit);
        assert_eq!(part.recipients, vec![alice().uuid]);
        let suffix = format!(" ({}/{total})", i + 1);
        joined.push_str(part.message.strip_suffix(&suffix).expect("numbered part"));
    }
    assert_eq!(joined, answer);
    rig.wait_for_delivered(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_websocket_is_resumed_and_nothing_is_lost_or_answered_twice() {
    let listed = alice_listed();
    let rig = Rig::started(&env(&listed), |_| {}).await;
    rig.llm.push(Reply::text("First answer."));
    rig.signal.push(NewMessage::dm(&alice(), "one"));
    rig.wait_for_text("First answer.").await;
    rig.wait_for_delivered(1).await;

    rig.signal.drop_connection();
    // Arrives while the gateway is away; the server keeps it queued.
    rig.llm.push(Reply::text("Second answer."));
    rig.signal.push(NewMessage::dm(&alice(), "two"));
    rig.signal.wait_for_connections(2, WAIT).await;
    rig.wait_for_text("Second answer.").await;
    rig.wait_for_delivered(2).await;
    rig.settle().await;
    assert_eq!(rig.llm.requests().len(), 2);
    assert_eq!(rig.signal.sent().len(), 2);
    assert_eq!(rig.user_messages(1), vec!["one", "two"]);
    assert_eq!(rig.signal.queued(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_honoured_and_the_answer_is_sent_once() {
    let listed = alice_listed();
    let rig = Rig::started(&env(&listed), |_| {}).await;
    rig.signal.fail_next_sends_with_429(Some(1));
    rig.llm.push(Reply::text("Worth the wait."));
    rig.signal.push(NewMessage::dm(&alice(), "hello"));
    rig.wait_for_text("Worth the wait.").await;
    let attempts = rig.signal.send_attempts();
    assert_eq!(attempts.len(), 2);
    assert!(attempts[1].at.duration_since(attempts[0].at) >= Duration::from_millis(950));
    rig.wait_for_delivered(1).await;
    rig.settle().await;
    assert_eq!(rig.signal.sent().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_never_reach_the_model() {
    let listed = alice_listed();
    let rig = Rig::started(&env(&listed), |_| {}).await;
    let group = "R3JvdXAxMTExMTExMTExMTExMTExMTExMTExMTExMTE=";
    rig.signal.push(NewMessage::dm(&mallory(), "let me in"));
    rig.signal.push(
        NewMessage::dm(&mallory(), "hello")
            .in_group(group, "Team")
            .mentioning(BOT),
    );
    rig.settle().await;
    assert!(rig.signal.sent().is_empty(), "{:?}", rig.signal.sent());
    assert!(rig.llm.requests().is_empty());

    rig.llm.push(Reply::text("Welcome back."));
    rig.signal.push(NewMessage::dm(&alice(), "it's me"));
    let sent = rig.wait_for_text("Welcome back.").await;
    assert_eq!(sent.len(), 1);
    assert_eq!(rig.llm.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uuid_on_the_allowlist_admits_its_owner_too() {
    let listed = vec![("SIGNAL_ALLOWED_USERS", alice().uuid.to_uppercase())];
    let rig = Rig::started(&env(&listed), |_| {}).await;
    rig.llm.push(Reply::text("Hi Alice."));
    rig.signal.push(NewMessage::dm(&alice(), "hello"));
    rig.wait_for_text("Hi Alice.").await;
    rig.signal.push(NewMessage::dm(&mallory(), "me too"));
    rig.settle().await;
    assert_eq!(rig.llm.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_delivered_envelope_never_starts_a_second_turn() {
    let listed = alice_listed();
    let rig = Rig::started(&env(&listed), |_| {}).await;
    rig.llm.push(Reply::text("First answer."));
    let ts = rig.signal.push(NewMessage::dm(&alice(), "only once"));
    rig.wait_for_text("First answer.").await;
    // The first turn is over, so the next message is not met by a busy
    // notice.
    rig.wait_for_delivered(1).await;
    // The same envelope again, then a new message with the same text.
    rig.signal.redeliver(ts);
    rig.llm.push(Reply::text("Second answer."));
    rig.signal.push(NewMessage::dm(&alice(), "only once"));
    rig.wait_for_text("Second answer.").await;
    rig.settle().await;
    assert_eq!(rig.llm.requests().len(), 2);
    assert_eq!(rig.signal.sent().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_the_server_does_not_hold_is_refused_and_nothing_runs() {
    let listed = alice_listed();
    let mut rig = Rig::new(&env(&listed), Mode::JsonRpc, |_| {}).await;
    rig.account = "+15550001234".into();
    rig.start();
    rig.signal.push(NewMessage::dm(&alice(), "anyone there?"));
    // The adapter asked who the server holds, and went no further.
    let deadline = tokio::time::Instant::now() + WAIT;
    while !rig
        .signal
        .requests()
        .iter()
        .any(|r| r.path == "/v1/accounts")
    {
        assert!(tokio::time::Instant::now() < deadline, "no account check");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rig.settle().await;
    assert!(rig.signal.connections().is_empty());
    assert!(
        !rig.signal
            .requests()
            .iter()
            .any(|r| r.path.starts_with("/v1/receive"))
    );
    assert_eq!(rig.signal.queued(), 1);
    assert!(rig.llm.requests().is_empty());
    assert!(rig.signal.sent().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polling_server_is_polled_and_answered() {
    let listed = alice_listed();
    let mut rig = Rig::new(&env(&listed), Mode::Normal, |_| {}).await;
    rig.start();
    rig.signal.wait_for_polls(1, WAIT).await;
    rig.llm.push(Reply::text("Polled answer."));
    rig.signal
        .push(NewMessage::dm(&alice(), "are you polling?"));
    let sent = rig.wait_for_text("Polled answer.").await;
    assert_eq!(sent[0].recipients, vec![alice().uuid]);
    assert!(rig.signal.connections().is_empty());
    rig.wait_for_delivered(1).await;
}
