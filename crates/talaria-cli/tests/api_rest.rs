//! The REST routes of the real binary: `talaria gateway run` with only the
//! API server and the mock model, a cron job added with `talaria cron add`
//! beforehand. Over HTTP: a chat makes a session that the session list
//! shows, the job is paused (and `talaria cron list` sees it paused), and
//! `/health/detailed` reports the API server live, this node, and cron.

use crate::api_gateway;

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

/// `talaria config check`'s `error: ` and `warning: ` lines, as the API's
/// findings list them.
fn check_findings(home: &Path) -> (Vec<String>, Vec<String>) {
    let out = Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(home)
        .args(["config", "check"])
        // The same environment as the gateway's (`ApiGateway`).
        .env_remove("TALARIA_HOME")
        .env_remove("OPENAI_API_KEY")
        .env_remove("TELEGRAM_BOT_TOKEN")
        .env_remove("API_SERVER_KEY")
        .env_remove("API_SERVER_PORT")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // A finding may span lines: the lines after its first continue it.
    let (mut errors, mut warnings): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    let mut in_errors = None;
    for line in stderr.lines() {
        if let Some(e) = line.strip_prefix("error: ") {
            errors.push(e.to_owned());
            in_errors = Some(true);
        } else if let Some(w) = line.strip_prefix("warning: ") {
            warnings.push(w.to_owned());
            in_errors = Some(false);
        } else if let Some(errs) = in_errors {
            let list = if errs { &mut errors } else { &mut warnings };
            if let Some(entry) = list.last_mut() {
                entry.push('\n');
                entry.push_str(line);
            }
        }
    }
    (errors, warnings)
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {value}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_is_served_masked_with_the_checks_findings() {
    let llm = MockOpenAi::start().await;
    let gateway = start_gateway(&llm).await;
    let http = reqwest::Client::new();
    let home = gateway.home();
    const MODEL_KEY: &str = "sk-test-secret-key-0123456789";

    let (status, report) = call(&http, &gateway, reqwest::Method::GET, "/api/config", None).await;
    assert_eq!(status, 200, "{report}\n{}", gateway.log());
    assert_eq!(report["object"], "talaria.config");
    assert_eq!(
        report["path"],
        home.join("config.yaml").display().to_string()
    );
    assert_eq!(report["config"]["model"]["default"], "mock-model");
    assert_eq!(report["model"]["model"], "mock-model");
    assert_eq!(report["model"]["api_key"], "****6789");
    assert_eq!(report["findings"]["errors"], json!([]), "{report}");
    // The API server's key comes from .env: said so, masked.
    let from_env = report["from_env"].as_array().unwrap();
    let key_entry = from_env
        .iter()
        .find(|v| v["var"] == "API_SERVER_KEY")
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(key_entry["origin"], ".env");
    assert_eq!(key_entry["shown"], "****cdef");
    let text = report.to_string();
    assert!(!text.contains(KEY), "{text}");
    assert!(!text.contains(MODEL_KEY), "{text}");

    // An edit on disk shows at the next request: a Telegram token and half
    // a WhatsApp set-up in .env. The findings are `config check`'s, word
    // for word, and no token is in the answer.
    let telegram = "123456:ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghi";
    let whatsapp = "graph-secret-token-0123456789";
    std::fs::write(
        home.join(".env"),
        format!(
            "API_SERVER_KEY={KEY}\nTELEGRAM_BOT_TOKEN={telegram}\nWHATSAPP_CLOUD_TOKEN={whatsapp}\n"
        ),
    )
    .unwrap();
    let (errors, warnings) = check_findings(&home);
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("WhatsApp Cloud is misconfigured")),
        "{errors:?}"
    );
    let (status, report) = call(&http, &gateway, reqwest::Method::GET, "/api/config", None).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(strings(&report["findings"]["errors"]), errors, "{report}");
    assert_eq!(
        strings(&report["findings"]["warnings"]),
        warnings,
        "{report}"
    );
    assert!(
        strings(&report["platforms"]).contains(&"telegram".to_owned()),
        "{report}"
    );
    let text = report.to_string();
    for secret in [KEY, MODEL_KEY, telegram, whatsapp, "ABCDEFGHIJKLMNOP"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    assert!(text.contains("****fghi"), "{text}");

    // A file that no longer parses: the load error, as `check` says it.
    std::fs::write(home.join("config.yaml"), "model: [\n").unwrap();
    let (errors, _) = check_findings(&home);
    assert_eq!(errors.len(), 1, "{errors:?}");
    let (status, report) = call(&http, &gateway, reqwest::Method::GET, "/api/config", None).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(strings(&report["findings"]["errors"]), errors, "{report}");
    assert_eq!(report["config"], Value::Null);
}
