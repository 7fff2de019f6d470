//! The browser tools through the binary, with Debian's Chromium: a
//! scripted model fills and submits a form on a site served on 127.0.0.1,
//! reads the result through `browser_snapshot`, follows a link and takes a
//! screenshot; a conversation's context closes after its idle timeout;
//! and no Chromium outlives the gateway, even one killed with SIGKILL.
//!
//! Chromium must be installed (`scripts/test` installs it): these tests
//! fail, never skip, without it.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Query;
use axum::response::Html;
use axum::routing::get;
use serde_json::{Value, json};
use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};

use crate::api_gateway;
use api_gateway::{ApiGateway, free_port};

const KEY: &str = "api-key-0123456789";

/// A guestbook: a form, a thank-you page with a link, and the end.
async fn site() -> String {
    #[derive(serde::Deserialize)]
    struct Sign {
        name: String,
    }
    let app = Router::new()
        .route(
            "/",
            get(|| async {
                Html(
                    "<!DOCTYPE html><html><head><title>Guestbook</title></head><body>\
                     <h1>Sign the guestbook</h1>\
                     <form action=\"/sign\" method=\"get\">\
                     <label for=\"name\">Your name</label> <input id=\"name\" name=\"name\">\
                     <button type=\"submit\">Sign</button></form></body></html>",
                )
            }),
        )
        .route(
            "/sign",
            get(|Query(sign): Query<Sign>| async move {
                let name: String = sign.name.chars().filter(|c| c.is_alphanumeric()).collect();
                Html(format!(
                    "<!DOCTYPE html><html><head><title>Thanks</title></head><body>\
                     <h1>Thanks for signing, {name}</h1>\
                     <p><a href=\"/end\">Read the other entries</a></p></body></html>"
                ))
            }),
        )
        .route(
            "/end",
            get(|| async {
                Html(
                    "<!DOCTYPE html><html><head><title>Entries</title></head><body>\
                     <h1>Entries so far: 42</h1></body></html>",
                )
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

fn write_config(home: &Path, model: &str, port: u16, idle_secs: u64) {
    std::fs::create_dir_all(home).expect("home");
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {model}\n  api_key: sk-test-secret-key-0123456789\n\
             agent:\n  api_max_retries: 1\n\
             web:\n  allow_hosts: [127.0.0.1]\n\
             browser:\n  idle_timeout_secs: {idle_secs}\n\
             platforms:\n  api_server:\n    enabled: true\n    port: {port}\n    key: {KEY}\n"
        ),
    )
    .expect("config");
}

/// The gateway, with Chromium required first (these tests fail, never
/// skip, without it).
async fn start(home: &Path, port: u16) -> ApiGateway {
    assert!(
        which("chromium"),
        "Chromium is not installed: the browser tests need it (apt install chromium; scripts/test does)"
    );
    ApiGateway::start(home, port).await
}

/// One turn in session `session` through the API server; the answer's
/// text.
async fn ask(gateway: &ApiGateway, session: &str, text: &str) -> String {
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gateway.url))
        .bearer_auth(KEY)
        .header("x-talaria-session-id", session)
        .json(&json!({"model": "talaria", "messages": [{"role": "user", "content": text}]}))
        .timeout(Duration::from_secs(90))
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.expect("json");
    body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// Running processes (not zombies) whose command line names `needle`.
fn processes_naming(needle: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            (!cmd.is_empty() && String::from_utf8_lossy(&cmd).contains(needle)).then_some(pid)
        })
        .collect()
}

/// Waits (bounded) until no running process names `needle`.
async fn none_left(needle: &str) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left = processes_naming(needle);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The tool result the model was handed in request `i`.
fn tool_result(mock: &MockOpenAi, i: usize) -> String {
    mock.requests()[i].body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "tool"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// The `@eN` reference on the snapshot line holding `label`.
fn reference(snapshot: &str, label: &str) -> String {
    snapshot
        .lines()
        .find(|l| l.contains(label) && l.contains("@e"))
        .and_then(|l| {
            l.split_whitespace()
                .find(|w| w.starts_with("[@e") || w.starts_with("@e"))
        })
        .map(|w| w.trim_matches(|c| c == '[' || c == ']').to_owned())
        .unwrap_or_else(|| panic!("no reference for {label} in:\n{snapshot}"))
}

fn call(id: &str, name: &str, args: Value) -> Reply {
    Reply::tool_calls(vec![ToolCallReply::new(id, name, args.to_string())])
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_fills_a_form_follows_a_link_and_takes_a_screenshot() {
    let base = site().await;
    let mock = MockOpenAi::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let port = free_port();
    write_config(&home, &mock.base_url(), port, 2);
    let gateway = start(&home, port).await;

    // First the page: the references are the page's, so the script reads
    // them from what the model was shown.
    mock.push(call(
        "c1",
        "browser_navigate",
        json!({"url": format!("{base}/")}),
    ));
    mock.push(Reply::text("I see a form."));
    assert_eq!(
        ask(&gateway, "guest", "open the guestbook").await,
        "I see a form."
    );
    let page = tool_result(&mock, 1);
    assert!(
        page.starts_with("<untrusted_tool_result source=\"browser_navigate\">"),
        "{page}"
    );
    assert!(page.contains("Sign the guestbook"), "{page}");
    let field = reference(&page, "Your name");
    let button = reference(&page, "Sign\"");

    mock.push(call(
        "c2",
        "browser_type",
        json!({"ref": field, "text": "Ada"}),
    ));
    mock.push(call("c3", "browser_click", json!({"ref": button})));
    mock.push(call("c4", "browser_snapshot", json!({})));
    mock.push(Reply::text("Signed."));
    assert_eq!(ask(&gateway, "guest", "sign it as Ada").await, "Signed.");
    let thanks = tool_result(&mock, 5);
    assert!(thanks.contains("Thanks for signing, Ada"), "{thanks}");
    let link = reference(&thanks, "Read the other entries");

    mock.push(call("c5", "browser_click", json!({"ref": link})));
    mock.push(call("c6", "browser_snapshot", json!({})));
    mock.push(call(
        "c7",
        "browser_vision",
        json!({"question": "What does the page show?"}),
    ));
    mock.push(Reply::text("42 entries."));
    assert_eq!(
        ask(&gateway, "guest", "how many entries?").await,
        "42 entries."
    );
    let entries = tool_result(&mock, 8);
    assert!(entries.contains("Entries so far: 42"), "{entries}");
    // No vision model is configured: the screenshot is kept and its path
    // given.
    let vision = tool_result(&mock, 9);
    let path = vision
        .split('"')
        .find(|s| s.ends_with(".png"))
        .map(|s| s.trim_start_matches("MEDIA:"))
        .unwrap_or_else(|| panic!("no screenshot path in {vision}"));
    let png = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e} in {vision}"));
    assert!(png.starts_with(b"\x89PNG"), "a PNG");

    // Idle for longer than browser.idle_timeout_secs: the conversation's
    // context is closed, and the next look finds a fresh, empty one.
    tokio::time::sleep(Duration::from_secs(5)).await;
    mock.push(call("c8", "browser_snapshot", json!({})));
    mock.push(Reply::text("Nothing open."));
    ask(&gateway, "guest", "what is open now?").await;
    let after = tool_result(&mock, 11);
    assert!(
        !after.contains("Entries so far"),
        "the old page survived: {after}"
    );

    // A clean stop leaves no Chromium.
    let profile = home.join("browser");
    let needle = profile.to_string_lossy().into_owned();
    assert!(!processes_naming(&needle).is_empty(), "Chromium runs");
    let pid = gateway.child.id();
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let left = none_left(&needle).await;
    assert!(left.is_empty(), "Chromium outlived the gateway: {left:?}");
    drop(gateway);
}

#[tokio::test(flavor = "multi_thread")]
async fn no_chromium_outlives_a_gateway_killed_with_sigkill() {
    let base = site().await;
    let mock = MockOpenAi::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let port = free_port();
    write_config(&home, &mock.base_url(), port, 300);
    let mut gateway = start(&home, port).await;
    mock.push(call(
        "c1",
        "browser_navigate",
        json!({"url": format!("{base}/")}),
    ));
    mock.push(Reply::text("Open."));
    ask(&gateway, "s", "open it").await;
    let needle = home.join("browser").to_string_lossy().into_owned();
    assert!(!processes_naming(&needle).is_empty(), "Chromium runs");
    gateway.child.kill().expect("SIGKILL");
    let _ = gateway.child.wait();
    let left = none_left(&needle).await;
    assert!(
        left.is_empty(),
        "Chromium outlived a SIGKILLed gateway: {left:?}"
    );

    // The next start sweeps whatever a killed gateway's Chromium left
    // (here: its profile directory) and browses afresh.
    let gateway = start(&home, port).await;
    mock.push(call(
        "c2",
        "browser_navigate",
        json!({"url": format!("{base}/")}),
    ));
    mock.push(Reply::text("Open again."));
    assert_eq!(ask(&gateway, "s", "open it again").await, "Open again.");
    let profiles: Vec<String> = std::fs::read_dir(home.join("browser"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(profiles.len(), 1, "one live profile: {profiles:?}");
    drop(gateway);
}
