//! The official OpenAI Python SDK against the Responses API of the real
//! binary: `talaria gateway run` with only the API server, the testkit's
//! mock model behind it. Each case scripts the mock, runs
//! `tests/openai_sdk/responses.py <case>` (which validates every object
//! and event against the SDK's models), then checks what the model was
//! sent.

use crate::api_gateway;

use std::path::{Path, PathBuf};
use std::time::Duration;

use api_gateway::{ApiGateway, free_port};
use serde_json::json;
use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};

const KEY: &str = "sdk-test-key-0123456789abcdef";

/// A home whose only platform is the API server, pointed at `llm`.
fn home_for(llm: &MockOpenAi, dir: &Path) -> (PathBuf, u16) {
    let home = dir.join("home");
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
    (home, port)
}

/// Runs one case of the script; fails the test with its output unless it
/// exits 0 and says it passed.
async fn run_case(python: &Path, gateway: &ApiGateway, home: &Path, case: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_sdk/responses.py");
    let mut command = tokio::process::Command::new(python);
    command
        .arg(script)
        .arg(case)
        .env("TALARIA_API_BASE", &gateway.url)
        .env("TALARIA_API_KEY", KEY)
        .env("TALARIA_API_MODEL", "mock-model")
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .unwrap_or_else(|_| panic!("the {case} case hung"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains(&format!("PASS {case}")),
        "the {case} case failed ({}):\n{stdout}\n{stderr}\ngateway log:\n{}",
        output.status,
        std::fs::read_to_string(home.join("gateway.log")).unwrap_or_default()
    );
}

/// `(role, content)` of the user and assistant messages of model request
/// `i`, system rows and tool rows left out.
fn turns(llm: &MockOpenAi, i: usize) -> Vec<(String, String)> {
    llm.requests()[i].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user" || m["role"] == "assistant")
        .map(|m| {
            (
                m["role"].as_str().unwrap().to_owned(),
                m["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(r, c)| ((*r).to_owned(), (*c).to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_sdk_drives_the_responses_api() {
    let python = talaria_testkit::python::python_with(&["openai"]);
    let llm = MockOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (home, port) = home_for(&llm, dir.path());
    let gateway = ApiGateway::start(&home, port).await;

    llm.push(Reply::text("Hello from Talaria."));
    run_case(&python, &gateway, &home, "non_streamed").await;
    assert_eq!(turns(&llm, 0), pairs(&[("user", "say hello")]));

    // The streamed continuation: the model gets the earlier turn, then
    // the new question.
    let before = llm.requests().len();
    llm.push(Reply::text("I will remember 42."));
    llm.push(Reply::text("42."));
    run_case(&python, &gateway, &home, "stream_continue").await;
    assert_eq!(turns(&llm, before), pairs(&[("user", "remember 42")]));
    assert_eq!(
        turns(&llm, before + 1),
        pairs(&[
            ("user", "remember 42"),
            ("assistant", "I will remember 42."),
            ("user", "which number?"),
        ])
    );

    // A streamed tool turn: the terminal tool runs echo; its call and
    // output come back as items the SDK knows.
    let before = llm.requests().len();
    llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "call_echo",
        "terminal",
        json!({"command": "echo sdk-tool-ok"}).to_string(),
    )]));
    llm.push(Reply::text("The command printed sdk-tool-ok."));
    run_case(&python, &gateway, &home, "stream_tool").await;
    assert_eq!(llm.requests().len(), before + 2);

    // Two continuations of one response: each sees the root's
    // conversation and not the other's.
    let before = llm.requests().len();
    llm.push(Reply::text("Root answer."));
    llm.push(Reply::text("Branch one answer."));
    llm.push(Reply::text("Branch two answer."));
    run_case(&python, &gateway, &home, "branch").await;
    let root = [("user", "the root question"), ("assistant", "Root answer.")];
    assert_eq!(
        turns(&llm, before + 1),
        pairs(&[root[0], root[1], ("user", "branch one")])
    );
    assert_eq!(
        turns(&llm, before + 2),
        pairs(&[root[0], root[1], ("user", "branch two")])
    );

    // Kept, retrieved, deleted; `store: false` is never kept. Continuing
    // a deleted or unkept response reaches no model.
    let before = llm.requests().len();
    llm.push(Reply::text("Kept."));
    llm.push(Reply::text("Not kept."));
    run_case(&python, &gateway, &home, "retrieve_delete").await;
    assert_eq!(llm.requests().len(), before + 2);
    assert_eq!(
        turns(&llm, before + 1),
        pairs(&[("user", "do not keep this")])
    );

    run_case(&python, &gateway, &home, "models").await;
    assert_eq!(
        llm.requests().len(),
        before + 2,
        "the models case reached the model"
    );
}
