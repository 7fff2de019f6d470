//! `talaria gateway` as a real process against a fake Telegram Bot API and
//! the mock LLM: pairing approved from the CLI, status and a graceful stop,
//! and a crash (SIGKILL) in the middle of a send that loses nothing and
//! sends nothing twice.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use talaria_testkit::{FakeTelegram, MockOpenAi, Reply};

const TOKEN: &str = "424242:gateway-test-token-abcdefghij";
const WAIT: Duration = Duration::from_secs(20);

struct Home {
    _dir: tempfile::TempDir,
    root: PathBuf,
    locks: PathBuf,
}

fn home(llm: &MockOpenAi, tg: &FakeTelegram, dotenv: &str) -> Home {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("home");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n  api_key: sk-test-secret-key-0123456789\nagent:\n  api_max_retries: 1\nplatforms:\n  telegram:\n    base_url: {}\n    poll_timeout_secs: 1\n",
            llm.base_url(),
            tg.base_url()
        ),
    )
    .unwrap();
    std::fs::write(
        root.join(".env"),
        format!("TELEGRAM_BOT_TOKEN={TOKEN}\n{dotenv}"),
    )
    .unwrap();
    let locks = dir.path().join("locks");
    Home {
        _dir: dir,
        root,
        locks,
    }
}

fn command(home: &Home, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_talaria"));
    c.arg("--home")
        .arg(&home.root)
        .args(args)
        .env_remove("TALARIA_HOME")
        .env_remove("TELEGRAM_BOT_TOKEN")
        .env_remove("TELEGRAM_ALLOWED_USERS")
        .env_remove("GATEWAY_ALLOW_ALL_USERS")
        .env_remove("API_SERVER_KEY")
        .env("TALARIA_GATEWAY_LOCK_DIR", &home.locks)
        .env("TALARIA_LOG", "info")
        .stdin(Stdio::null());
    c
}

fn talaria(home: &Home, args: &[&str]) -> Output {
    command(home, args).output().unwrap()
}

fn spawn_gateway(home: &Home, log: &Path) -> Child {
    let log = std::fs::File::create(log).unwrap();
    command(home, &["gateway", "run"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Every regular file under `dir`, recursively. Sockets and the like are
/// skipped: the gateway's control socket cannot be read as a file.
fn regular_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            out.extend(regular_files(&entry.path()));
        } else if kind.is_file() {
            out.push(entry.path());
        }
    }
    out
}

/// Waits for `n` more getUpdates calls than `seen`: the gateway is polling.
async fn polling(tg: &FakeTelegram, seen: usize) {
    tg.wait_for_get_updates_calls(seen + 1, WAIT).await;
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the gateway did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_code_approved_from_the_cli_lets_a_stranger_in_and_sigterm_stops_cleanly() {
    let llm = MockOpenAi::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let home = home(&llm, &tg, "");
    let log = home.root.join("test-gateway.log");
    let mut gateway = spawn_gateway(&home, &log);
    polling(&tg, 0).await;

    tg.push_private_text(7, "hello, bot?");
    let sent = tg.wait_for_sent(1, WAIT).await;
    let offer = sent[0].rendered();
    let code = offer
        .lines()
        .find_map(|l| l.strip_prefix("Your pairing code: "))
        .unwrap_or_else(|| panic!("no code in {offer:?}"))
        .to_owned();
    assert!(
        llm.requests().is_empty(),
        "a stranger never reaches the model"
    );
    // The code is stored only as a salted hash, and never logged: not in
    // any file of the home (in WAL mode the new row sits in state.db-wal,
    // not state.db; the log is there too).
    let files = regular_files(&home.root);
    assert!(
        files.iter().any(|f| f.ends_with("state.db-wal")),
        "{files:?}"
    );
    for file in &files {
        // The running gateway replaces some files by renaming a temporary
        // one over them; a temporary file gone by now is read under its
        // final name.
        let bytes = match std::fs::read(file) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            read => read.unwrap(),
        };
        assert!(
            !bytes.windows(code.len()).any(|w| w == code.as_bytes()),
            "the code was written to {}",
            file.display()
        );
    }

    let wrong = talaria(&home, &["pairing", "approve", "telegram", "ZZZZZZZZ"]);
    assert!(!wrong.status.success());
    assert!(
        text(&wrong.stderr).contains("no pending code"),
        "{}",
        text(&wrong.stderr)
    );

    let ok = talaria(
        &home,
        &["pairing", "approve", "telegram", &code.to_lowercase()],
    );
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    assert!(
        text(&ok.stdout).contains("Approved 7"),
        "{}",
        text(&ok.stdout)
    );
    let list = talaria(&home, &["pairing", "list"]);
    let listed = text(&list.stdout);
    // The approved user's row: platform, then user id 7.
    let approved = listed
        .split_once("Approved:")
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("no approvals listed: {listed}"));
    assert!(
        approved.lines().any(|l| {
            let mut cols = l.split_whitespace();
            cols.next() == Some("telegram") && cols.next() == Some("7")
        }),
        "{listed}"
    );
    // The code was spent by the approval.
    assert!(listed.contains("Pending: none"), "{listed}");

    llm.push(Reply::text("Welcome aboard."));
    tg.push_private_text(7, "am I in?");
    let sent = tg.wait_for_sent(2, WAIT).await;
    assert_eq!(sent[1].rendered(), "Welcome aboard.");

    // The state file follows changes within moments, not at once: ask
    // until it shows the delivery.
    let deadline = Instant::now() + WAIT;
    let out = loop {
        let status = talaria(&home, &["gateway", "status"]);
        let out = text(&status.stdout);
        assert!(status.status.success(), "{out}");
        if out.contains("delivered 1") || Instant::now() >= deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(out.contains(&format!("pid {}", gateway.id())), "{out}");
    assert!(out.contains("telegram") && out.contains("live"), "{out}");
    assert!(out.contains("delivered 1"), "{out}");

    // A second gateway on the same home is refused.
    let second = talaria(&home, &["gateway", "run"]);
    assert!(!second.status.success());
    assert!(
        text(&second.stderr).contains("already running"),
        "{}",
        text(&second.stderr)
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(gateway.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let exit = wait_exit(&mut gateway);
    assert!(
        exit.success(),
        "{exit:?}\n{}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert!(!home.root.join("gateway.pid").exists());
    let status = talaria(&home, &["gateway", "status"]);
    assert!(text(&status.stdout).contains("not running"));
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(!logged.contains(&code), "the code must not be logged");
    assert!(
        !logged.contains("gateway-test-token"),
        "the token must not be logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_cut_off_by_sigkill_is_sent_once_after_restart_with_the_recovery_line() {
    let llm = MockOpenAi::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let home = home(&llm, &tg, "TELEGRAM_ALLOWED_USERS=42\n");
    let log = home.root.join("test-gateway.log");

    let mut first = spawn_gateway(&home, &log);
    polling(&tg, 0).await;
    llm.push(Reply::text("The precious answer."));
    tg.hang_send(true);
    tg.push_private_text(42, "important question");
    tg.wait_for_send_attempts(1, WAIT).await;
    // The answer is on the wire and the platform has not answered: crash.
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(tg.sent().is_empty());
    assert_eq!(llm.requests().len(), 1);

    tg.hang_send(false);
    let seen = tg.get_updates_calls().len();
    let mut second = spawn_gateway(&home, &home.root.join("test-gateway-2.log"));
    polling(&tg, seen).await;
    let sent = tg.wait_for_sent(1, WAIT).await;
    let text0 = sent[0].rendered();
    assert!(
        text0.starts_with("♻️ Recovered reply"),
        "{text0:?}\n{}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default(),
        std::fs::read_to_string(home.root.join("test-gateway-2.log")).unwrap_or_default()
    );
    assert!(text0.ends_with("The precious answer."), "{text0:?}");
    assert_eq!(sent[0].chat_id, 42);
    // Exactly once, and the model was not asked again. A duplicate could
    // only come from a second sweep, which runs at startup or when the
    // adapter reconnects, both within moments of the first send: a short
    // settle catches it here, and the counts after the follow-up below
    // catch one that came later still.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(tg.sent().len(), 1);
    assert_eq!(llm.requests().len(), 1);

    // The conversation goes on where it was.
    llm.push(Reply::text("Next answer."));
    tg.push_private_text(42, "and then?");
    let sent = tg.wait_for_sent(2, WAIT).await;
    assert_eq!(sent[1].rendered(), "Next answer.");
    assert_eq!(tg.sent().len(), 2, "the recovered reply was sent again");
    // Both replies are delivered in the ledger and nothing is owed. The
    // follow-up is marked just after its send returns: wait for that.
    let deadline = Instant::now() + WAIT;
    while !ledger_open_rows(&home).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            ledger_open_rows(&home).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let store = talaria_store::SqliteStore::open(&home.root.join("state.db")).unwrap();
    let counts = talaria_store::LedgerStore::obligation_counts(&store)
        .await
        .unwrap();
    assert_eq!(
        counts.get(&talaria_store::ObligationState::Delivered),
        Some(&2),
        "{counts:?}"
    );
    assert_eq!(tg.sent().len(), 2);
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

/// The ledger's open rows (owner node, content).
async fn ledger_open_rows(home: &Home) -> Vec<(String, String)> {
    use talaria_store::LedgerStore;
    let store = talaria_store::SqliteStore::open(&home.root.join("state.db")).unwrap();
    store
        .open_obligations(0)
        .await
        .unwrap()
        .into_iter()
        .map(|o| {
            (
                o.owner.map(|o| o.to_string()).unwrap_or_default(),
                o.content,
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn talaria_send_goes_directly_without_a_gateway_and_through_it_with_one() {
    let llm = MockOpenAi::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let home = home(
        &llm,
        &tg,
        "TELEGRAM_ALLOWED_USERS=42\nTELEGRAM_HOME_CHANNEL=42\n",
    );

    // No gateway: this process connects Telegram itself, just to send.
    let direct = talaria(&home, &["send", "telegram", "backup", "finished"]);
    assert!(direct.status.success(), "{}", text(&direct.stderr));
    assert!(text(&direct.stdout).contains("sent to telegram:42"));
    let sent = tg.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].chat_id, 42);
    assert_eq!(sent[0].rendered(), "backup finished");
    let bad = talaria(&home, &["send", "discord", "hi"]);
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("not connected"),
        "{}",
        text(&bad.stderr)
    );

    // With a gateway: the message goes through its socket and its ledger.
    let log = home.root.join("test-gateway.log");
    let mut gateway = spawn_gateway(&home, &log);
    polling(&tg, tg.get_updates_calls().len()).await;
    let deadline = Instant::now() + WAIT;
    while !home.root.join("gateway.sock").exists() {
        assert!(Instant::now() < deadline, "no control socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    let via = talaria(&home, &["send", "telegram:42:5", "via", "the", "gateway"]);
    assert!(via.status.success(), "{}", text(&via.stderr));
    let sent = tg.wait_for_sent(2, WAIT).await;
    assert_eq!(sent[1].rendered(), "via the gateway");
    assert_eq!(sent[1].thread_id, Some(5));
    assert!(
        ledger_open_rows(&home).await.is_empty(),
        "both sends were delivered"
    );
    let store = talaria_store::SqliteStore::open(&home.root.join("state.db")).unwrap();
    let counts = talaria_store::LedgerStore::obligation_counts(&store)
        .await
        .unwrap();
    assert_eq!(
        counts.get(&talaria_store::ObligationState::Delivered),
        Some(&2),
        "{counts:?}"
    );
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("from the control socket was sent"),
        "the gateway sent it"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(gateway.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(wait_exit(&mut gateway).success());
    assert!(!home.root.join("gateway.sock").exists());
}
