//! `talaria gateway run` over Discord as real processes, against the fake
//! Discord and the mock LLM: a crash (SIGKILL) while an answer is on the
//! wire loses nothing, and the restarted gateway sends it exactly once.

mod crash_support;

use std::time::{Duration, Instant};

use talaria_testkit::{FakeDiscord, MockOpenAi, Reply};

use crash_support::{Home, spawn_gateway};

const TOKEN: &str = "MjQyNDI0.process.discord-test-token";
const WAIT: Duration = Duration::from_secs(20);

fn home(llm: &MockOpenAi, dc: &FakeDiscord) -> Home {
    crash_support::home(
        llm,
        &format!("  discord:\n    api_base: {}\n", dc.api_base()),
        &format!("DISCORD_BOT_TOKEN={TOKEN}\nDISCORD_ALLOWED_USERS=42\n"),
    )
}

/// The ledger's rows not yet delivered.
async fn open_rows(home: &Home) -> usize {
    use talaria_store::LedgerStore;
    let store = talaria_store::SqliteStore::open(&home.root.join("state.db")).unwrap();
    store.open_obligations(0).await.unwrap().len()
}

fn logs(home: &Home) -> String {
    ["test-gateway.log", "test-gateway-2.log"]
        .iter()
        .map(|f| std::fs::read_to_string(home.root.join(f)).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discord_reply_cut_off_by_sigkill_is_sent_once_after_restart_with_the_recovery_line() {
    let llm = MockOpenAi::start().await;
    let dc = FakeDiscord::start(TOKEN).await;
    let home = home(&llm, &dc);

    let mut first = spawn_gateway(&home, &home.root.join("test-gateway.log"));
    dc.wait_for_sessions(1, WAIT).await;
    llm.push(Reply::text("The precious answer."));
    dc.hang_send(true);
    let asked = dc.push_dm("42", "important question");
    dc.wait_for_send_attempts(1, WAIT).await;
    // The answer is on the wire and Discord has not answered: crash.
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(dc.sent().is_empty());
    assert_eq!(llm.requests().len(), 1);

    dc.hang_send(false);
    let mut second = spawn_gateway(&home, &home.root.join("test-gateway-2.log"));
    dc.wait_for_sessions(2, WAIT).await;
    let sent = dc.wait_for_sent(1, WAIT).await;
    let text = &sent[0].content;
    assert!(
        text.starts_with("♻️ Recovered reply"),
        "{text:?}\n{}",
        logs(&home)
    );
    assert!(text.ends_with("The precious answer."), "{text:?}");
    assert_eq!(sent[0].channel_id, FakeDiscord::dm_channel("42"));
    assert_eq!(sent[0].reply_to.as_deref(), Some(asked.as_str()));
    // Exactly once, and the model was not asked again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(dc.sent().len(), 1);
    assert_eq!(llm.requests().len(), 1);

    // The conversation goes on where it was.
    llm.push(Reply::text("Next answer."));
    dc.push_dm("42", "and then?");
    let sent = dc.wait_for_sent(2, WAIT).await;
    assert_eq!(sent[1].content, "Next answer.");
    let deadline = Instant::now() + WAIT;
    while open_rows(&home).await > 0 {
        assert!(Instant::now() < deadline, "replies still owed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(dc.sent().len(), 2, "the recovered reply was sent again");
    let users: Vec<String> = llm.requests()[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(users, vec!["important question", "and then?"]);
    let logged = logs(&home);
    assert!(
        !logged.contains("discord-test-token"),
        "the token was logged"
    );

    second.kill().unwrap();
    second.wait().unwrap();
}
