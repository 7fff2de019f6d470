//! The official OpenAI Python SDK against the API server of the real
//! binary: `talaria gateway run` with only the API server, the testkit's
//! mock model behind it. Each case scripts the mock, then runs
//! `tests/openai_sdk/client.py <case>` with the SDK from the test Python
//! environment; the script asserts what the SDK hands to client code and
//! exits non-zero on any difference.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};

const KEY: &str = "sdk-test-key-0123456789abcdef";

struct Gateway {
    child: Child,
    base: String,
    dir: tempfile::TempDir,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Gateway {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("gateway.log")).unwrap_or_default()
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A home whose only platform is the API server, pointed at `llm`.
async fn start_gateway(llm: &MockOpenAi) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let port = free_port();
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n  \
             api_key: sk-test-secret-key-0123456789\n  vision: on\nagent:\n  api_max_retries: 0\n\
             platforms:\n  api_server:\n    port: {port}\n",
            llm.base_url()
        ),
    )
    .unwrap();
    std::fs::write(home.join(".env"), format!("API_SERVER_KEY={KEY}\n")).unwrap();
    let log = std::fs::File::create(dir.path().join("gateway.log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(&home)
        .args(["gateway", "run"])
        .env_remove("TALARIA_HOME")
        .env_remove("TELEGRAM_BOT_TOKEN")
        .env_remove("API_SERVER_KEY")
        .env_remove("API_SERVER_PORT")
        .env("TALARIA_GATEWAY_LOCK_DIR", dir.path().join("locks"))
        .env("TALARIA_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut gateway = Gateway {
        child,
        base: format!("http://127.0.0.1:{port}"),
        dir,
    };
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = http.get(format!("{}/health", gateway.base)).send().await
            && r.status().is_success()
        {
            return gateway;
        }
        if let Some(status) = gateway.child.try_wait().unwrap() {
            panic!("the gateway exited ({status}):\n{}", gateway.log());
        }
        assert!(
            Instant::now() < deadline,
            "the gateway never answered /health:\n{}",
            gateway.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_sdk/client.py")
}

/// Runs one case of the script; fails the test with its output unless it
/// exits 0 and says it passed.
async fn run_case(python: &Path, gateway: &Gateway, case: &str) -> String {
    let mut command = tokio::process::Command::new(python);
    command
        .arg(script())
        .arg(case)
        .env("TALARIA_API_BASE", &gateway.base)
        .env("TALARIA_API_KEY", KEY)
        .env("TALARIA_API_MODEL", "mock-model")
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .unwrap_or_else(|_| panic!("the {case} case hung"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains(&format!("PASS {case}")),
        "the {case} case failed ({}):\n{stdout}\n{stderr}\ngateway log:\n{}",
        output.status,
        gateway.log()
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_sdk_drives_the_api_server() {
    let python = talaria_testkit::python::python_with(&["openai"]);
    let llm = MockOpenAi::start().await;
    let gateway = start_gateway(&llm).await;

    llm.push(Reply::text("Hello from Talaria."));
    llm.push(Reply::text("I will remember 42."));
    llm.push(Reply::text("42."));
    run_case(&python, &gateway, "non_streamed").await;
    // The resent history continued the stored session: the model got the
    // stored turn once, then the new question.
    let third = &llm.requests()[2].body["messages"];
    let turns: Vec<(&str, &str)> = third
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] != "system")
        .map(|m| (m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    assert_eq!(
        turns,
        vec![
            ("user", "remember 42"),
            ("assistant", "I will remember 42."),
            ("user", "which number?"),
        ]
    );

    llm.push(Reply::text("Streaming works through the SDK."));
    run_case(&python, &gateway, "streamed").await;

    // A streamed tool turn: the model runs `echo` through the terminal
    // tool, then answers. Tool progress must not reach the SDK as chunks.
    let before = llm.requests().len();
    llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "call_echo",
        "terminal",
        json!({"command": "echo sdk-tool-ok"}).to_string(),
    )]));
    llm.push(Reply::text("The command printed sdk-tool-ok."));
    run_case(&python, &gateway, "streamed_tool").await;
    let requests = llm.requests();
    assert_eq!(requests.len(), before + 2);
    let tool_rows: Vec<&str> = requests[before + 1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert!(
        tool_rows.iter().any(|c| c.contains("sdk-tool-ok")),
        "the terminal tool did not run echo: {tool_rows:?}"
    );

    let before = llm.requests().len();
    run_case(&python, &gateway, "bad_key").await;
    assert_eq!(
        llm.requests().len(),
        before,
        "a wrong key reached the model"
    );

    // The model fails after part of its answer has streamed.
    llm.push(Reply::raw_sse(vec![
        json!({"choices": [{"index": 0, "delta": {"content": "Half an ans"}}]}).to_string(),
        json!({"error": {"message": "the model fell over", "code": 400}}).to_string(),
    ]));
    let out = run_case(&python, &gateway, "stream_failure").await;
    assert!(out.contains("partial Half an ans"), "{out}");

    llm.push(Reply::error(
        400,
        r#"{"error":{"message":"bad model request","type":"invalid_request_error"}}"#,
    ));
    run_case(&python, &gateway, "failure").await;

    run_case(&python, &gateway, "models").await;

    // An image part from the SDK reaches the model as an image part.
    let before = llm.requests().len();
    llm.push(Reply::text("A tiny picture."));
    run_case(&python, &gateway, "image").await;
    let request = &llm.requests()[before].body;
    let user = request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .unwrap();
    let parts = user["content"].as_array().expect("content parts");
    assert!(
        parts
            .iter()
            .any(|p| p["type"] == "text"
                && p["text"].as_str().unwrap().contains("what colour is this?")),
        "{user}"
    );
    let url = parts
        .iter()
        .find(|p| p["type"] == "image_url")
        .and_then(|p| p["image_url"]["url"].as_str())
        .unwrap_or_else(|| panic!("no image part: {user}"));
    assert!(url.starts_with("data:image/"), "{url:.40}");
}
