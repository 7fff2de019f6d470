//! The gateway end to end with Mattermost, in one process: the fake
//! Mattermost server, the mock LLM, a real SQLite file, and the real
//! runner, ledger, router and Mattermost adapter between them.

#[path = "gateway_support/mattermost.rs"]
mod support;

use std::time::{Duration, Instant};

use support::*;
use talaria_testkit::Reply;
use talaria_testkit::mattermost::NewPost;

const ALICE: &[(&str, &str)] = &[("MATTERMOST_ALLOWED_USERS", "alice")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_turn_is_answered_and_recorded_as_delivered() {
    let rig = Rig::started(ALICE, |_| {}).await;
    rig.llm.push(Reply::text("Hello from Talaria."));
    rig.mm.push(NewPost::dm("alice", "hi there"));
    let posts = rig.mm.wait_for_posts(1, WAIT).await;
    assert_eq!(posts[0].channel_id, "dmalice");
    assert_eq!(posts[0].message, "Hello from Talaria.");
    assert_eq!(posts[0].root_id, None, "a DM is answered inline");
    assert_eq!(rig.user_messages(0).last().unwrap(), "hi there");
    assert!(
        rig.mm
            .typing()
            .iter()
            .any(|t| t.channel_id == "dmalice" && t.user_id == rig.mm.bot_id())
    );
    rig.wait_for_delivered(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_mention_is_answered_in_its_thread_and_the_thread_goes_on() {
    let rig = Rig::started(ALICE, |_| {}).await;
    let bot = rig.mm.bot_username();
    rig.llm.push(Reply::text("Thread answer."));
    rig.mm
        .push(NewPost::channel("town", "alice", "no mention, no answer"));
    let asked = rig.mm.push(NewPost::channel(
        "town",
        "alice",
        &format!("@{bot} my name is Ada"),
    ));
    let posts = rig.wait_for_text("Thread answer.").await;
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0].channel_id, "town");
    assert_eq!(posts[0].root_id.as_deref(), Some(asked.as_str()));
    // Shared chats name the speaker to the model.
    let asked_text = rig.user_messages(0);
    assert_eq!(asked_text.len(), 1);
    assert!(asked_text[0].starts_with("[useralice"), "{asked_text:?}");
    assert!(
        asked_text[0].ends_with("] my name is Ada"),
        "{asked_text:?}"
    );
    assert!(
        rig.mm
            .typing()
            .iter()
            .any(|t| t.parent_id.as_deref() == Some(asked.as_str()))
    );

    // A reply in the thread needs no mention and continues the conversation.
    rig.llm.push(Reply::text("You are Ada."));
    rig.mm
        .push(NewPost::channel("town", "alice", "who am I?").in_thread(&asked));
    let posts = rig.wait_for_text("You are Ada.").await;
    assert_eq!(posts[1].root_id.as_deref(), Some(asked.as_str()));
    let history = rig.user_messages(1);
    assert_eq!(history.len(), 2, "{history:?}");
    assert!(history[0].ends_with("my name is Ada") && history[1].ends_with("who am I?"));
    rig.settle().await;
    assert_eq!(rig.llm.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_answer_is_split_under_the_post_limit_and_reassembles() {
    let rig = Rig::started(ALICE, |_| {}).await;
    let limit = talaria_platforms::mattermost::MAX_POST_CHARS;
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
    rig.mm.push(NewPost::dm("alice", "write a lot"));
    let first = rig.mm.wait_for_posts(1, WAIT).await;
    let total: usize = first[0]
        .message
        .rsplit_once(" (1/")
        .and_then(|(_, n)| n.trim_end_matches(')').parse().ok())
        .expect("the first part carries (1/n)");
    assert_eq!(total, 3);
    let posts = rig.mm.wait_for_posts(total, WAIT).await;
    let mut joined = String::new();
    for (i, part) in posts.iter().enumerate() {
        assert!(part.message.chars().count() <= limit);
        let suffix = format!(" ({}/{total})", i + 1);
        joined.push_str(part.message.strip_suffix(&suffix).expect("numbered part"));
    }
    assert_eq!(joined, answer);

    // A code block across a cut is closed in one part and reopened, with
    // its language, in the next: every part renders as code.
    let mut code = String::from("Here:\n```rust\n");
    let mut n = 0;
    while code.chars().count() < limit + 2000 {
        code.push_str(&format!("let value_{n} = compute({n}); // keep going\n"));
        n += 1;
    }
    code.push_str("```\nDone.");
    rig.llm.push(Reply::text(code));
    rig.mm.push(NewPost::dm("alice", "write code"));
    let posts = rig.wait_for_text("Done.").await;
    // The first turn may still count as running when the question comes
    // (its ledger rows are marked just after the posts), which earns a
    // busy notice: look at the numbered parts only.
    let parts: Vec<_> = posts[total..]
        .iter()
        .filter(|p| p.message.ends_with("/2)"))
        .collect();
    assert_eq!(parts.len(), 2, "{posts:#?}");
    for p in &parts {
        assert!(p.message.chars().count() <= limit);
        let fences = p.message.lines().filter(|l| l.starts_with("```")).count();
        assert_eq!(fences % 2, 0, "unbalanced fence in {:?}", &p.message[..80]);
    }
    assert!(parts[1].message.starts_with("```rust\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_is_resumed_and_nothing_is_lost_or_answered_twice() {
    let rig = Rig::started(ALICE, |_| {}).await;
    rig.llm.push(Reply::text("First answer."));
    rig.mm.push(NewPost::dm("alice", "one"));
    rig.wait_for_text("First answer.").await;

    rig.mm.drop_connection();
    // Posted while the gateway is away; the server keeps it for a resume.
    rig.llm.push(Reply::text("Second answer."));
    rig.mm.push(NewPost::dm("alice", "two"));
    let conns = rig.mm.wait_for_connections(2, WAIT).await;
    assert!(conns[1].resumed, "{conns:#?}");
    rig.wait_for_text("Second answer.").await;
    rig.settle().await;
    assert_eq!(rig.llm.requests().len(), 2);
    assert_eq!(rig.mm.posts().len(), 2);
    assert_eq!(rig.user_messages(1), vec!["one", "two"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_waited_out_and_the_answer_is_posted_once() {
    let rig = Rig::started(ALICE, |_| {}).await;
    rig.mm.fail_next_posts_with_429(1, Some(1));
    rig.llm.push(Reply::text("Worth the wait."));
    let started = Instant::now();
    rig.mm.push(NewPost::dm("alice", "hello"));
    rig.wait_for_text("Worth the wait.").await;
    assert!(started.elapsed() >= Duration::from_millis(950));
    assert_eq!(rig.mm.post_attempts().len(), 2);
    rig.wait_for_delivered(1).await;
    assert_eq!(rig.mm.posts().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_never_reach_the_model() {
    let rig = Rig::started(ALICE, |_| {}).await;
    let bot = rig.mm.bot_username();
    rig.mm.push(NewPost::dm("mallory", "let me in"));
    rig.mm.push(NewPost::channel(
        "town",
        "mallory",
        &format!("@{bot} hello"),
    ));
    rig.settle().await;
    assert!(rig.mm.posts().is_empty(), "{:?}", rig.mm.posts());
    assert!(rig.llm.requests().is_empty());

    rig.llm.push(Reply::text("Welcome back."));
    rig.mm.push(NewPost::dm("alice", "it's me"));
    let posts = rig.wait_for_text("Welcome back.").await;
    assert_eq!(posts.len(), 1);
    assert_eq!(rig.llm.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_delivered_post_never_starts_a_second_turn() {
    let rig = Rig::started(ALICE, |_| {}).await;
    rig.llm.push(Reply::text("First answer."));
    rig.mm
        .push(NewPost::dm("alice", "only once").with_id("samepost00000000000000000a"));
    rig.wait_for_text("First answer.").await;
    // The first turn is over, so the next post is not met by a busy notice.
    rig.wait_for_delivered(1).await;
    // The same post again, as a new event: what a second delivery path
    // or a server replay looks like. Then a new post with the same text.
    rig.mm
        .push(NewPost::dm("alice", "only once").with_id("samepost00000000000000000a"));
    rig.llm.push(Reply::text("Second answer."));
    rig.mm
        .push(NewPost::dm("alice", "only once").with_id("otherpost0000000000000000b"));
    rig.wait_for_text("Second answer.").await;
    rig.settle().await;
    assert_eq!(rig.llm.requests().len(), 2);
    assert_eq!(rig.mm.posts().len(), 2);
}
