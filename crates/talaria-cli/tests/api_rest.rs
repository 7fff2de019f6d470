//! The REST routes of the real binary: `talaria gateway run` with only the
//! API server and the mock model, a cron job added with `talaria cron add`
//! beforehand. Over HTTP: a chat makes a session that the session list
//! shows, the job is paused (and `talaria cron list` sees it paused), and
//! `/health/detailed` reports the API server live, this node, and cron.

mod api_gateway;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use api_gateway::{ApiGateway, free_port};

use serde_json::{Value, json};
use talaria_testkit::{MockOpenAi, Reply};

const KEY: &str = "rest-test-key-0123456789abcdef";

struct Gateway {
    process: ApiGateway,
    base: String,
    dir: tempfile::TempDir,
}

impl Gateway {
    fn log(&self) -> String {
        self.process.log()
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }
}

/// `talaria --home <home> <args>`, its stdout, failing on a non-zero exit.
fn talaria(home: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("TALARIA_HOME")
        .env_remove("API_SERVER_KEY")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "talaria {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A home whose only platform is the API server, pointed at `llm`, with
/// one cron job.
async fn start_gateway(llm: &MockOpenAi) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let port = free_port();
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n  \
             api_key: sk-test-secret-key-0123456789\nagent:\n  api_max_retries: 0\n\
             platforms:\n  api_server:\n    port: {port}\n",
            llm.base_url()
        ),
    )
    .unwrap();
    std::fs::write(home.join(".env"), format!("API_SERVER_KEY={KEY}\n")).unwrap();
    talaria(
        &home,
        &[
            "cron",
            "add",
            "every 6h",
            "Check the backups",
            "--name",
            "backups",
        ],
    );
    let process = ApiGateway::start(&home, port).await;
    Gateway {
        base: process.url.clone(),
        process,
        dir,
    }
}

async fn call(
    http: &reqwest::Client,
    gateway: &Gateway,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = http
        .request(method, format!("{}{path}", gateway.base))
        .bearer_auth(KEY);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(Value::Null);
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_serves_sessions_jobs_and_detailed_health() {
    let llm = MockOpenAi::start().await;
    let gateway = start_gateway(&llm).await;
    let http = reqwest::Client::new();
    use reqwest::Method;

    // A chat makes a session; the list shows it with its messages.
    llm.push(Reply::text("Hello over REST."));
    let (status, answer) = call(
        &http,
        &gateway,
        Method::POST,
        "/v1/chat/completions",
        Some(json!({"model": "mock-model", "messages": [{"role": "user", "content": "hi there"}]})),
    )
    .await;
    assert_eq!(status, 200, "{answer}\n{}", gateway.log());
    let (status, list) = call(&http, &gateway, Method::GET, "/api/sessions", None).await;
    assert_eq!(status, 200, "{list}");
    let sessions = list["data"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{list}");
    assert_eq!(sessions[0]["source"], "api_server");
    assert_eq!(sessions[0]["message_count"], 2);
    let id = sessions[0]["id"].as_str().unwrap();
    let (_, messages) = call(
        &http,
        &gateway,
        Method::GET,
        &format!("/api/sessions/{id}/messages"),
        None,
    )
    .await;
    assert_eq!(messages["data"][1]["content"], "Hello over REST.");

    // The job `talaria cron add` made, paused over HTTP.
    let (status, jobs) = call(&http, &gateway, Method::GET, "/api/jobs", None).await;
    assert_eq!(status, 200, "{jobs}");
    assert_eq!(jobs["data"][0]["name"], "backups");
    assert_eq!(jobs["data"][0]["state"], "scheduled");
    let (status, paused) = call(
        &http,
        &gateway,
        Method::POST,
        "/api/jobs/backups/pause",
        None,
    )
    .await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["state"], "paused");
    let listed = talaria(&gateway.home(), &["cron", "list"]);
    assert!(
        listed
            .lines()
            .any(|l| l.contains("backups") && l.contains("paused")),
        "{listed}"
    );

    let (status, health) = call(&http, &gateway, Method::GET, "/health/detailed", None).await;
    assert_eq!(status, 200, "{health}");
    assert_eq!(
        health["platforms"]["api_server"]["liveness"], "live",
        "{health}"
    );
    assert_eq!(health["cron"]["enabled"], true);
    assert_eq!(health["cron"]["jobs"], 1);
    assert_eq!(health["cron"]["by_state"]["paused"], 1);
    assert_eq!(health["cron"]["next_run"], Value::Null);
    assert!(health["ledger"].is_object(), "{health}");
    assert_eq!(health["running_turns"]["gateway"], 0);
    // This gateway announced itself in the store.
    let nodes = health["nodes"].as_array().unwrap();
    assert!(
        nodes.iter().any(|n| n["pid"] == gateway.process.child.id()),
        "{health}"
    );

    // Without the key: refused, and nothing changes.
    let resp = http
        .post(format!("{}/api/jobs/backups/resume", gateway.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let (_, job) = call(&http, &gateway, Method::GET, "/api/jobs/backups", None).await;
    assert_eq!(job["state"], "paused");
}
