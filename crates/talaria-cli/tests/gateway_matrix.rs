//! `talaria gateway run` as a real process against the fake Matrix
//! homeserver and the mock LLM: a crash (SIGKILL) in the middle of a send
//! loses nothing and sends nothing twice.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use talaria_testkit::{FakeMatrix, MockOpenAi, Reply};

const TOKEN: &str = "syt_cli_gateway_test_token_0123456789";
const WAIT: Duration = Duration::from_secs(20);
const ALICE: &str = "@alice:localhost";

struct Home {
    _dir: tempfile::TempDir,
    root: PathBuf,
    locks: PathBuf,
}

fn home(llm: &MockOpenAi, hs: &FakeMatrix) -> Home {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("home");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n  api_key: sk-test-secret-key-0123456789\nagent:\n  api_max_retries: 1\nplatforms:\n  matrix:\n    homeserver: {}\n    sync_timeout_ms: 300\n",
            llm.base_url(),
            hs.homeserver()
        ),
    )
    .unwrap();
    std::fs::write(
        root.join(".env"),
        format!("MATRIX_ACCESS_TOKEN={TOKEN}\nMATRIX_ALLOWED_USERS={ALICE}\n"),
    )
    .unwrap();
    let locks = dir.path().join("locks");
    Home {
        _dir: dir,
        root,
        locks,
    }
}

fn spawn_gateway(home: &Home, log: &Path) -> Child {
    let log = std::fs::File::create(log).unwrap();
    Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(&home.root)
        .args(["gateway", "run"])
        .env_remove("TALARIA_HOME")
        .env_remove("TELEGRAM_BOT_TOKEN")
        .env_remove("MATRIX_HOMESERVER")
        .env_remove("MATRIX_ACCESS_TOKEN")
        .env_remove("MATRIX_USER_ID")
        .env_remove("MATRIX_ALLOWED_USERS")
        .env_remove("GATEWAY_ALLOW_ALL_USERS")
        .env_remove("API_SERVER_KEY")
        .env("TALARIA_GATEWAY_LOCK_DIR", &home.locks)
        .env("TALARIA_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
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
