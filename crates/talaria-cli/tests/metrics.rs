//! `/metrics` of a real `talaria gateway run`, scraped as Prometheus
//! scrapes it and read by the Prometheus project's own Python client
//! parser (`prometheus_client.parser`), not by ours: the counters move as
//! the fake Telegram and the API drive turns, a re-delivered message is
//! counted as a duplicate, and the key is asked for unless
//! `metrics.public` is set on loopback.

use crate::api_gateway::{ApiGateway, free_port};
use crate::crash_support::home;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use talaria_testkit::wait::wait_for;
use talaria_testkit::{FakeTelegram, MockOpenAi, Reply, ToolCallReply};

const KEY: &str = "sk-metrics-api-key-0123456789";
const TOKEN: &str = "123456:metrics-token";
const WAIT: Duration = Duration::from_secs(30);

/// One sample: its name and labels, as `name{a="1",b="2"}`.
type Samples = BTreeMap<String, f64>;

/// The exposition parsed by `prometheus_client`, each sample keyed by its
/// name and sorted labels; the families' types beside.
fn parse(text: &str) -> (Samples, BTreeMap<String, String>) {
    let python = talaria_testkit::python::python_with(&["prometheus_client"]);
    let script = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        out.append({"family": family.name, "type": family.type,
                    "name": s.name, "labels": s.labels, "value": s.value})
print(json.dumps(out))
"#;
    let mut child = Command::new(python)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("the exposition is written");
    let out = child.wait_with_output().expect("python ends");
    assert!(
        out.status.success(),
        "prometheus_client could not parse /metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: Vec<Value> = serde_json::from_slice(&out.stdout).expect("json");
    let mut samples = Samples::new();
    let mut types = BTreeMap::new();
    for s in parsed {
        let labels = s["labels"].as_object().cloned().unwrap_or_default();
        let labels: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", v.as_str().unwrap_or_default()))
            .collect();
        let key = format!(
            "{}{{{}}}",
            s["name"].as_str().unwrap_or_default(),
            labels.join(",")
        );
        samples.insert(key, s["value"].as_f64().unwrap_or(f64::NAN));
        types.insert(
            s["family"].as_str().unwrap_or_default().to_owned(),
            s["type"].as_str().unwrap_or_default().to_owned(),
        );
    }
    (samples, types)
}

async fn scrape(http: &reqwest::Client, url: &str) -> (Samples, BTreeMap<String, String>) {
    let response = http
        .get(format!("{url}/metrics"))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("the API server answers");
    assert_eq!(response.status(), 200);
    let kind = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    parse(&response.text().await.expect("body"))
}

fn value(samples: &Samples, key: &str) -> f64 {
    samples.get(key).copied().unwrap_or(0.0)
}

/// Waits until a scrape satisfies `ok`, and returns it.
async fn scrape_until(
    http: &reqwest::Client,
    url: &str,
    what: &str,
    ok: impl Fn(&Samples) -> bool,
) -> Samples {
    wait_for(what, || async {
        let (samples, _) = scrape(http, url).await;
        if ok(&samples) {
            Ok(samples)
        } else {
            // Each scrape starts a Python parser: poll gently.
            tokio::time::sleep(Duration::from_millis(200)).await;
            Err(samples)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_move_as_the_platforms_drive_turns() {
    let llm = MockOpenAi::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let port = free_port();
    let home = home(
        &llm,
        &format!(
            "  telegram:\n    base_url: {}\n    poll_timeout_secs: 1\n  \
             api_server:\n    enabled: true\n    host: 127.0.0.1\n    port: {port}\n",
            tg.base_url()
        ),
        &format!("API_SERVER_KEY={KEY}\nTELEGRAM_BOT_TOKEN={TOKEN}\nTELEGRAM_ALLOWED_USERS=7\n"),
    );
    let gateway = ApiGateway::start(&home.root, port).await;
    let http = reqwest::Client::new();

    // Behind the key.
    let refused = http
        .get(format!("{}/metrics", gateway.url))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);

    let connected = "talaria_adapter_connected{platform=\"telegram\"}";
    let before = scrape_until(&http, &gateway.url, "telegram connected", |s| {
        value(s, connected) == 1.0
    })
    .await;
    let turns_ok = "talaria_turns_total{outcome=\"ok\",platform=\"telegram\"}";
    assert_eq!(value(&before, turns_ok), 0.0);

    // A Telegram turn that calls a real tool and one the model made up.
    llm.push(
        Reply::tool_calls(vec![
            ToolCallReply::new(
                "c1",
                "todo",
                r#"{"todos": [{"id": "1", "content": "count"}]}"#,
            ),
            ToolCallReply::new("c2", "no_such_tool", "{}"),
        ])
        .with_usage(120, 30),
    );
    llm.push(Reply::text("counted").with_usage(200, 10));
    tg.push_private_text(7, "count something");
    tg.wait_for_sent(1, WAIT).await;

    let after = scrape_until(&http, &gateway.url, "the Telegram turn", |s| {
        value(s, turns_ok) == 1.0
    })
    .await;
    let (_, types) = scrape(&http, &gateway.url).await;
    assert_eq!(
        value(
            &after,
            "talaria_turn_duration_seconds_count{platform=\"telegram\"}"
        ),
        1.0
    );
    assert_eq!(
        value(
            &after,
            "talaria_turn_duration_seconds_bucket{le=\"+Inf\",platform=\"telegram\"}"
        ),
        1.0
    );
    assert_eq!(types["talaria_turn_duration_seconds"], "histogram");
    assert_eq!(types["talaria_turns"], "counter");
    assert_eq!(
        value(
            &after,
            "talaria_model_calls_total{model=\"mock-model\",outcome=\"ok\"}"
        ),
        2.0
    );
    assert_eq!(
        value(
            &after,
            "talaria_tokens_total{kind=\"input\",model=\"mock-model\"}"
        ),
        320.0
    );
    assert_eq!(
        value(
            &after,
            "talaria_tokens_total{kind=\"output\",model=\"mock-model\"}"
        ),
        40.0
    );
    assert_eq!(
        value(&after, "talaria_tool_calls_total{tool=\"todo\"}"),
        1.0
    );
    assert_eq!(
        value(&after, "talaria_tool_errors_total{tool=\"todo\"}"),
        0.0
    );
    assert_eq!(
        value(&after, "talaria_tool_calls_total{tool=\"unknown\"}"),
        1.0
    );
    assert_eq!(
        value(&after, "talaria_tool_errors_total{tool=\"unknown\"}"),
        1.0
    );

    // Telegram sends the same message again: dropped, and counted.
    let again = json!({
        "message": {
            "message_id": 9001,
            "chat": {"id": 7, "type": "private", "first_name": "User7"},
            "from": {"id": 7, "is_bot": false, "first_name": "User7"},
            "text": "once only",
        }
    });
    llm.push(Reply::text("once"));
    tg.push_update(again.clone());
    tg.wait_for_sent(2, WAIT).await;
    tg.push_update(again);
    let duplicates = "talaria_inbound_duplicates_total{platform=\"telegram\"}";
    let after = scrape_until(&http, &gateway.url, "the duplicate", |s| {
        value(s, duplicates) == 1.0
    })
    .await;
    assert_eq!(value(&after, turns_ok), 2.0);

    // An API turn counts under its own platform; the ledger's rows and the
    // busy queue are read with the status.
    let response = http
        .post(format!("{}/v1/chat/completions", gateway.url))
        .bearer_auth(KEY)
        .json(&json!({"model": "talaria", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success());
    let after = scrape_until(&http, &gateway.url, "the API turn and the ledger", |s| {
        value(
            s,
            "talaria_turns_total{outcome=\"ok\",platform=\"api_server\"}",
        ) == 1.0
            && s.keys().any(|k| k.starts_with("talaria_ledger_rows{"))
    })
    .await;
    assert_eq!(value(&after, "talaria_busy_queue_depth{}"), 0.0);
    assert!(
        after.contains_key("talaria_busy_queue_depth{}"),
        "{after:#?}"
    );
    drop(gateway);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_public_on_loopback_needs_no_key() {
    let llm = MockOpenAi::start().await;
    let port = free_port();
    let home = home(
        &llm,
        &format!("  api_server:\n    enabled: true\n    host: 127.0.0.1\n    port: {port}\n"),
        &format!("API_SERVER_KEY={KEY}\n"),
    );
    let config = home.root.join("config.yaml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("metrics:\n  public: true\n");
    std::fs::write(&config, text).unwrap();
    let gateway = ApiGateway::start(&home.root, port).await;
    let response = reqwest::get(format!("{}/metrics", gateway.url))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (samples, _) = parse(&response.text().await.unwrap());
    assert!(
        samples.keys().any(|k| k.starts_with("talaria_")),
        "{samples:#?}"
    );
    // The rest of the API keeps its key.
    let models = reqwest::get(format!("{}/v1/models", gateway.url))
        .await
        .unwrap();
    assert_eq!(models.status(), 401);
}
