//! The web tools through the binary: `talaria chat` with a scripted model
//! that searches (a fake SearXNG) and reads pages (the testkit's website)
//! on 127.0.0.1, the guard opened for that host only; what the model is
//! handed back is fenced as outside data; `platform_toolsets` takes the
//! web away from a platform.

use std::path::Path;

use talaria_testkit::web_pages::{ARTICLE_FACT, WebPages};
use talaria_testkit::web_search::FakeSearxng;
use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};

use crate::api_gateway;
use api_gateway::{ApiGateway, free_port};

async fn chat(home: &Path, prompt: &str) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(home)
        .args(["chat", "-q", prompt])
        .env_remove("TALARIA_HOME")
        .env_remove("OPENAI_API_KEY")
        .env_remove("TALARIA_MODEL")
        .env_remove("TALARIA_BASE_URL")
        .env_remove("SEARXNG_URL")
        .env_remove("BRAVE_API_KEY")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("talaria runs")
}

fn write_config(home: &Path, model: &str, searxng: &str, extra: &str) {
    std::fs::create_dir_all(home).expect("home");
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {model}\n  api_key: sk-test-secret-key-0123456789\n\
             agent:\n  api_max_retries: 1\n\
             web:\n  allow_hosts: [127.0.0.1]\n  search:\n    backend: searxng\n    base_url: {searxng}\n{extra}"
        ),
    )
    .expect("config");
}

fn offered(mock: &MockOpenAi, i: usize) -> Vec<String> {
    mock.requests()[i].body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The content of the tool result the model got in request `i`.
fn tool_result(mock: &MockOpenAi, i: usize) -> String {
    mock.requests()[i].body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "tool"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_searches_then_reads_a_page_and_is_refused_the_host() {
    let mock = MockOpenAi::start().await;
    let searxng = FakeSearxng::start().await;
    let site = WebPages::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    write_config(&home, &mock.base_url(), &searxng.base_url(), "");
    mock.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c1",
        "web_search",
        r#"{"query": "bridge reopening"}"#,
    )]));
    mock.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c2",
        "web_extract",
        serde_json::json!({"urls": [site.url("/article"), "http://talaria-test.invalid/", "http://[::1]/"]})
            .to_string(),
    )]));
    mock.push(Reply::text("The bridge reopened on Tuesday."));
    let out = chat(&home, "is the bridge open again?").await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("reopened on Tuesday"));

    let tools = offered(&mock, 0);
    assert!(tools.contains(&"web_search".to_owned()), "{tools:?}");
    assert!(tools.contains(&"web_extract".to_owned()), "{tools:?}");
    assert_eq!(
        searxng.requests()[0].query.get("q").map(String::as_str),
        Some("bridge reopening")
    );

    let search = tool_result(&mock, 1);
    assert!(
        search.starts_with("<untrusted_tool_result source=\"web_search\">"),
        "{search}"
    );
    assert!(search.contains("https://www.rust-lang.org/"), "{search}");

    let pages = tool_result(&mock, 2);
    assert!(
        pages.starts_with("<untrusted_tool_result source=\"web_extract\">"),
        "{pages}"
    );
    assert!(pages.contains(ARTICLE_FACT), "{pages}");
    // A name that doesn't resolve here, and loopback: neither fetched.
    assert!(
        pages.contains("cannot resolve talaria-test.invalid"),
        "{pages}"
    );
    assert!(pages.contains("::1 is a loopback address"), "{pages}");
    assert_eq!(site.hits("/article"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn platform_toolsets_take_the_web_away() {
    let mock = MockOpenAi::start().await;
    let searxng = FakeSearxng::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    write_config(
        &home,
        &mock.base_url(),
        &searxng.base_url(),
        "platform_toolsets:\n  cli: [terminal, file]\n",
    );
    mock.push(Reply::text("No web here."));
    let out = chat(&home, "search something").await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tools = offered(&mock, 0);
    assert!(!tools.iter().any(|t| t.starts_with("web_")), "{tools:?}");
    assert!(tools.contains(&"terminal".to_owned()), "{tools:?}");
    assert!(tools.contains(&"read_file".to_owned()), "{tools:?}");
    assert!(!tools.contains(&"memory".to_owned()), "{tools:?}");

    // A toolset name Talaria does not know is refused with the list.
    write_config(
        &home,
        &mock.base_url(),
        &searxng.base_url(),
        "platform_toolsets:\n  cli: [terminal, webb]\n",
    );
    let out = chat(&home, "hi").await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("platform_toolsets.cli") && err.contains("`webb`"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_api_server_fetches_image_urls_through_the_guard() {
    let mock = MockOpenAi::start().await;
    let searxng = FakeSearxng::start().await;
    let site = WebPages::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let port = free_port();
    write_config(
        &home,
        &mock.base_url(),
        &searxng.base_url(),
        &format!(
            "platforms:\n  api_server:\n    enabled: true\n    port: {port}\n    key: api-key-0123456789\n"
        ),
    );
    let gateway = ApiGateway::start(&home, port).await;
    let http = reqwest::Client::new();
    let url = gateway.url.clone();
    let ask =
        |image: String| {
            http.post(format!("{url}/v1/chat/completions"))
            .bearer_auth("api-key-0123456789")
            .json(&serde_json::json!({"model": "talaria", "messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": image}},
            ]}]}))
            .send()
        };
    // The test host is open: the image is fetched into the turn.
    mock.push(Reply::text("A tiny picture."));
    let resp = ask(site.url("/photo.png")).await.expect("answer");
    assert_eq!(
        resp.status(),
        200,
        "{}",
        resp.text().await.unwrap_or_default()
    );
    assert_eq!(site.hits("/photo.png"), 1);
    // Loopback by name and cloud metadata are refused, in words, with no
    // turn and no fetch.
    for (image, why) in [
        (
            format!("http://localhost:{}/photo.png", site.port()),
            "localhost is this machine",
        ),
        (
            "http://169.254.169.254/latest/meta-data/".to_owned(),
            "cloud metadata",
        ),
    ] {
        let resp = ask(image).await.expect("answer");
        assert_eq!(resp.status(), 400);
        let body: serde_json::Value = resp.json().await.expect("json");
        assert_eq!(body["error"]["code"], "invalid_image_url");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(why), "{message}");
    }
    assert_eq!(site.hits("/photo.png"), 1);
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn long_pages_are_summarised_by_the_auxiliary_web_model() {
    let mock = MockOpenAi::start().await;
    let summarizer = MockOpenAi::start().await;
    let searxng = FakeSearxng::start().await;
    let site = WebPages::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    write_config(
        &home,
        &mock.base_url(),
        &searxng.base_url(),
        &format!(
            "  extract:\n    summarize: true\n    max_chars: 1000\n\
             auxiliary:\n  web:\n    default: summary-model\n    provider: custom\n    base_url: {}\n",
            summarizer.base_url()
        ),
    );
    mock.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c1",
        "web_extract",
        serde_json::json!({"urls": [site.url("/huge")]}).to_string(),
    )]));
    mock.push(Reply::text("It is a long page."));
    summarizer.push(Reply::text("One sentence about work and play, repeated."));
    let out = chat(&home, "what is on that page?").await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary_request = &summarizer.requests()[0];
    assert_eq!(summary_request.body["model"], "summary-model");
    assert!(
        summary_request
            .body
            .to_string()
            .contains("All work and no play")
    );
    let result = tool_result(&mock, 1);
    assert!(result.contains("A summary of the page's"), "{result}");
    assert!(
        result.contains("One sentence about work and play, repeated."),
        "{result}"
    );
}
