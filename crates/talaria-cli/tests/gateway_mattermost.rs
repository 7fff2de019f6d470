//! `talaria gateway run` as real processes against the fake Mattermost
//! server and the mock LLM: a gateway killed (SIGKILL) while its answer is
//! on the wire sends that answer exactly once after a restart, marked as
//! recovered, and the conversation goes on.

mod crash_support;

use std::time::{Duration, Instant};

use talaria_store::{LedgerStore, ObligationState, SqliteStore};
use talaria_testkit::mattermost::NewPost;

use crash_support::{Home, spawn_gateway};
use talaria_testkit::{FakeMattermost, MockOpenAi, Reply};

const TOKEN: &str = "mmcrashtesttoken0123456789";
const WAIT: Duration = Duration::from_secs(20);

fn home(llm: &MockOpenAi, mm: &FakeMattermost) -> Home {
    crash_support::home(
        llm,
        &format!(
            "  mattermost:\n    url: {}\n    ping_interval_secs: 1\n",
            mm.url()
        ),
        &format!("MATTERMOST_TOKEN={TOKEN}\nMATTERMOST_ALLOWED_USERS=alice\n"),
    )
}

async fn open_ledger_rows(home: &Home) -> Vec<String> {
    let store = SqliteStore::open(&home.root.join("state.db")).unwrap();
    store
        .open_obligations(0)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.content)
        .collect()
}

fn logs(home: &Home) -> String {
    ["test-gateway.log", "test-gateway-2.log"]
        .iter()
        .map(|f| std::fs::read_to_string(home.root.join(f)).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_cut_off_by_sigkill_is_posted_once_after_restart_with_the_recovery_line() {
    let llm = MockOpenAi::start().await;
    let mm = FakeMattermost::start(TOKEN).await;
    let home = home(&llm, &mm);

    let mut first = spawn_gateway(&home, &home.root.join("test-gateway.log"));
    mm.wait_for_connections(1, WAIT).await;
    llm.push(Reply::text("The precious answer."));
    mm.hang_posts(true);
    mm.push(NewPost::dm("alice", "important question"));
    mm.wait_for_post_attempts(1, WAIT).await;
    // The answer is on the wire and the server has not answered: crash.
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(mm.posts().is_empty());
    assert_eq!(llm.requests().len(), 1);

    mm.hang_posts(false);
    let mut second = spawn_gateway(&home, &home.root.join("test-gateway-2.log"));
    mm.wait_for_connections(2, WAIT).await;
    let posts = mm.wait_for_posts(1, WAIT).await;
    let text = &posts[0].message;
    assert!(
        text.starts_with("♻️ Recovered reply"),
        "{text:?}\n{}",
        logs(&home)
    );
    assert!(text.ends_with("The precious answer."), "{text:?}");
    assert_eq!(posts[0].channel_id, "dmalice");
    // Exactly once, and the model was not asked again: a second sweep
    // would run at startup or on a reconnect, within moments.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(mm.posts().len(), 1);
    assert_eq!(llm.requests().len(), 1);

    // The conversation goes on where it was.
    llm.push(Reply::text("Next answer."));
    mm.push(NewPost::dm("alice", "and then?"));
    let posts = mm.wait_for_posts(2, WAIT).await;
    assert_eq!(posts[1].message, "Next answer.");
    let deadline = Instant::now() + WAIT;
    while !open_ledger_rows(&home).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            open_ledger_rows(&home).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let store = SqliteStore::open(&home.root.join("state.db")).unwrap();
    let counts = store.obligation_counts().await.unwrap();
    assert_eq!(
        counts.get(&ObligationState::Delivered),
        Some(&2),
        "{counts:?}"
    );
    assert_eq!(mm.posts().len(), 2);
    let users: Vec<String> = llm.requests()[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(users, vec!["important question", "and then?"]);

    second.kill().unwrap();
    second.wait().unwrap();
}
