//! `talaria gateway run` as a real process against the fake Matrix
//! homeserver and the mock LLM: a crash (SIGKILL) in the middle of a send
//! loses nothing and sends nothing twice.

mod crash_support;

use std::time::{Duration, Instant};

use talaria_testkit::{FakeMatrix, MockOpenAi, Reply};

use crash_support::{Home, spawn_gateway};

const TOKEN: &str = "syt_cli_gateway_test_token_0123456789";
const WAIT: Duration = Duration::from_secs(20);
const ALICE: &str = "@alice:localhost";

fn home(llm: &MockOpenAi, hs: &FakeMatrix) -> Home {
    crash_support::home(
        llm,
        &format!(
            "  matrix:\n    homeserver: {}\n    sync_timeout_ms: 300\n",
            hs.homeserver()
        ),
        &format!("MATRIX_ACCESS_TOKEN={TOKEN}\nMATRIX_ALLOWED_USERS={ALICE}\n"),
    )
}

fn logs(home: &Home) -> String {
    ["test-gateway.log", "test-gateway-2.log"]
        .iter()
        .map(|f| std::fs::read_to_string(home.root.join(f)).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n----\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matrix_reply_cut_off_by_sigkill_is_sent_once_after_restart_with_the_recovery_line() {
    let llm = MockOpenAi::start().await;
    let hs = FakeMatrix::start(TOKEN).await;
    let dm = hs.create_dm(ALICE);
    let home = home(&llm, &hs);

    let mut first = spawn_gateway(&home, &home.root.join("test-gateway.log"));
    hs.wait_until_caught_up(WAIT).await;
    llm.push(Reply::text("The precious answer."));
    hs.hang_send(true);
    let question = hs.push_text(&dm, ALICE, "important question");
    hs.wait_for_send_attempts(1, WAIT).await;
    // The answer is on the wire and the homeserver has not answered: crash.
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(hs.sent().is_empty());
    assert_eq!(llm.requests().len(), 1);

    hs.hang_send(false);
    let mut second = spawn_gateway(&home, &home.root.join("test-gateway-2.log"));
    let sent = hs.wait_for_sent(1, WAIT).await;
    let body = sent[0].body();
    assert!(
        body.starts_with("♻️ Recovered reply"),
        "{body:?}\n{}",
        logs(&home)
    );
    assert!(body.ends_with("The precious answer."), "{body:?}");
    assert_eq!(sent[0].room_id, dm);
    assert_eq!(sent[0].in_reply_to(), Some(question));
    // Exactly once, and the model was not asked again (the question, whose
    // batch token was saved before the crash, is not re-delivered either).
    hs.wait_until_caught_up(WAIT).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(hs.sent().len(), 1, "{}", logs(&home));
    assert_eq!(llm.requests().len(), 1);

    // The conversation goes on where it was.
    llm.push(Reply::text("Next answer."));
    hs.push_text(&dm, ALICE, "and then?");
    let sent = hs.wait_for_sent(2, WAIT).await;
    assert_eq!(sent[1].body(), "Next answer.");
    let deadline = Instant::now() + WAIT;
    let store = talaria_store::SqliteStore::open(&home.root.join("state.db")).unwrap();
    loop {
        let counts = talaria_store::LedgerStore::obligation_counts(&store)
            .await
            .unwrap();
        if counts.get(&talaria_store::ObligationState::Delivered) == Some(&2) {
            break;
        }
        assert!(Instant::now() < deadline, "{counts:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(hs.sent().len(), 2);
    let users: Vec<String> = llm.requests()[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(users, vec!["important question", "and then?"]);
    assert!(
        !logs(&home).contains(TOKEN),
        "the access token must not be logged"
    );

    second.kill().unwrap();
    second.wait().unwrap();
}
