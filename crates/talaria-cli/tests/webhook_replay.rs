//! `talaria gateway run` as a real process serving a GitHub webhook route,
//! the mock LLM as its model: a captured signed delivery resent after the
//! gateway was killed and started again on the same home, under a new
//! `X-GitHub-Delivery` (which GitHub does not sign), must not reach the
//! model a second time, and must not be answered 202 "accepted".

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use talaria_testkit::{MockOpenAi, Reply};

const WAIT: Duration = Duration::from_secs(30);
const SECRET: &str = "gh-replay-secret-0123456789";

struct Home {
    _dir: tempfile::TempDir,
    root: PathBuf,
    locks: PathBuf,
}

fn home(llm: &MockOpenAi) -> Home {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("home");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n  \
             api_key: sk-test-secret-key-0123456789\nagent:\n  api_max_retries: 1\n\
             platforms:\n  webhook:\n    port: 0\n    routes:\n      gh:\n        \
             scheme: github\n        secret_env: GH_WEBHOOK_SECRET\n        \
             prompt: 'Review PR #{{payload.number}}: {{payload.title}}'\n        \
             deliver: local\n",
            llm.base_url()
        ),
    )
    .unwrap();
    std::fs::write(root.join(".env"), format!("GH_WEBHOOK_SECRET={SECRET}\n")).unwrap();
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
        .env_remove("API_SERVER_KEY")
        .env_remove("GH_WEBHOOK_SECRET")
        .env("TALARIA_GATEWAY_LOCK_DIR", &home.locks)
        .env("TALARIA_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// The webhook listener's base URL, from the line the gateway prints once
/// it is bound.
async fn listener(log: &Path, gateway: &mut Child) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(rest) = text.split("webhook listener on ").nth(1)
            && let Some(base) = rest.split_whitespace().next()
        {
            return base.to_owned();
        }
        if let Some(status) = gateway.try_wait().unwrap() {
            panic!("the gateway exited ({status}) before listening:\n{text}");
        }
        assert!(Instant::now() < deadline, "no webhook listener:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Posts a GitHub `pull_request` delivery signed with [`SECRET`] (GitHub's
/// `X-Hub-Signature-256`, the same HMAC Meta uses), until the listener
/// answers something other than 503 (the gateway attaches its inbox a
/// moment after binding).
async fn deliver(base: &str, body: &[u8], delivery: &str) -> (u16, Value) {
    let deadline = Instant::now() + WAIT;
    let client = reqwest::Client::new();
    loop {
        let resp = client
            .post(format!("{base}/webhooks/gh"))
            .header("content-type", "application/json")
            .header("X-GitHub-Event", "pull_request")
            .header("X-GitHub-Delivery", delivery)
            .header(
                "X-Hub-Signature-256",
                talaria_testkit::whatsapp::signature(SECRET, body),
            )
            .body(body.to_vec())
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let json = resp.json().await.unwrap_or(Value::Null);
        if status != 503 {
            return (status, json);
        }
        assert!(Instant::now() < deadline, "still 503: {json}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Messages accepted and not yet answered, as the store holds them.
async fn owed_turns(home: &Home) -> u64 {
    let store = talaria_store::SqliteStore::open(&home.root.join("state.db")).unwrap();
    talaria_store::OwedTurnStore::owed_turn_count(&store)
        .await
        .unwrap()
}

async fn model_requests(llm: &MockOpenAi, n: usize, log: &Path) {
    let deadline = Instant::now() + WAIT;
    while llm.requests().len() < n {
        assert!(
            Instant::now() < deadline,
            "the model got {} of {n} requests:\n{}",
            llm.requests().len(),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The last user message of model request `i`.
fn prompt_of(llm: &MockOpenAi, i: usize) -> String {
    let requests = llm.requests();
    let messages = requests[i].body["messages"].as_array().unwrap().clone();
    messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn pr(number: u64, title: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"action": "opened", "number": number, "title": title})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_delivery_replayed_after_a_restart_under_a_new_id_reaches_the_model_once() {
    let llm = MockOpenAi::start().await;
    llm.push(Reply::text("PR 7 reviewed."));
    llm.push(Reply::text("PR 8 reviewed."));
    let home = home(&llm);
    let first_log = home.root.join("first.log");
    let mut gateway = spawn_gateway(&home, &first_log);
    let base = listener(&first_log, &mut gateway).await;

    let captured = pr(7, "Fix the parser");
    let (status, json) = deliver(&base, &captured, "f0e1d2c3-0001").await;
    assert_eq!(status, 202, "{json}");
    assert_eq!(json["status"], "accepted");
    model_requests(&llm, 1, &first_log).await;
    // The turn is over (answered, nothing owed) before the gateway dies.
    let deadline = Instant::now() + WAIT;
    while owed_turns(&home).await != 0 {
        assert!(Instant::now() < deadline, "the first turn never finished");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gateway.kill().unwrap();
    gateway.wait().unwrap();

    // Started again on the same home: its in-memory replay cache is empty.
    let second_log = home.root.join("second.log");
    let mut gateway = spawn_gateway(&home, &second_log);
    let base = listener(&second_log, &mut gateway).await;
    // The captured delivery, byte for byte, with a new unsigned id.
    let (status, json) = deliver(&base, &captured, "a9b8c7d6-0002").await;
    assert_eq!(
        status,
        200,
        "{json}\n{}",
        std::fs::read_to_string(&second_log).unwrap_or_default()
    );
    assert_eq!(json["status"], "duplicate");
    assert_eq!(json["delivery_id"], "a9b8c7d6-0002");

    // A genuinely new delivery afterwards: once the model has been asked
    // about it, a turn the replay started would have asked it before.
    let (status, json) = deliver(&base, &pr(8, "Another change"), "a9b8c7d6-0003").await;
    assert_eq!(status, 202, "{json}");
    model_requests(&llm, 2, &second_log).await;
    let deadline = Instant::now() + WAIT;
    while owed_turns(&home).await != 0 {
        assert!(Instant::now() < deadline, "the second turn never finished");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(llm.requests().len(), 2, "the replay reached the model");
    assert_eq!(prompt_of(&llm, 0), "Review PR #7: Fix the parser");
    assert_eq!(prompt_of(&llm, 1), "Review PR #8: Another change");

    gateway.kill().unwrap();
    gateway.wait().unwrap();
}
