//! `talaria mcp` as real processes. Talaria is configured with itself as
//! an MCP server (`talaria mcp serve` over stdio), so one binary shows both
//! sides: `mcp list`, `mcp test` and `mcp tools` against the server, and a
//! chat whose model searches past sessions and sends a message through the
//! MCP tools.
//!
//! Then each side against software nobody here wrote, from the Python
//! environment of `talaria_testkit::python` (the tests fail when it is
//! missing): the reference server `mcp-server-time` as a server of
//! `talaria chat`, and the MCP Python SDK's client against `talaria mcp
//! serve` with a gateway running.

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use talaria_testkit::python::{python_with, venv_bin};
use talaria_testkit::{FakeTelegram, MockOpenAi, Reply, ToolCallReply};

const TALARIA: &str = env!("CARGO_BIN_EXE_talaria");

async fn talaria(home: &Path, args: &[&str]) -> Output {
    tokio::process::Command::new(TALARIA)
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("TALARIA_HOME")
        .env_remove("TELEGRAM_BOT_TOKEN")
        .env_remove("OPENAI_API_KEY")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A home whose config names this very binary as the MCP server `self`.
fn home_with_self_server(dir: &Path, base_url: &str) -> std::path::PathBuf {
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {base_url}\n  api_key: sk-test-secret-key-0123456789\nagent:\n  api_max_retries: 0\nmcp_servers:\n  self:\n    command: {TALARIA}\n    args: [--home, {home}, mcp, serve]\n    timeout: 20\n  off:\n    command: /bin/false\n    enabled: false\n",
            home = home.display()
        ),
    )
    .unwrap();
    home
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn talaria_serves_mcp_and_uses_it_from_chat() {
    let llm = MockOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let home = home_with_self_server(dir.path(), &llm.base_url());

    let list = talaria(&home, &["mcp", "list"]).await;
    assert!(list.status.success(), "{}", text(&list.stderr));
    let listed = text(&list.stdout);
    assert!(
        listed.contains("self") && listed.contains("mcp serve"),
        "{listed}"
    );
    assert!(listed.contains("disabled"), "{listed}");

    let test = talaria(&home, &["mcp", "test", "self"]).await;
    assert!(test.status.success(), "{}", text(&test.stderr));
    let tested = text(&test.stdout);
    assert!(
        tested.contains("connected") && tested.contains("talaria"),
        "{tested}"
    );
    assert!(tested.contains("tools: 2"), "{tested}");

    let tools = talaria(&home, &["mcp", "tools", "self"]).await;
    let shown = text(&tools.stdout);
    assert!(shown.contains("mcp__self__session_search"), "{shown}");
    assert!(shown.contains("mcp__self__send_message"), "{shown}");

    let missing = talaria(&home, &["mcp", "test", "nope"]).await;
    assert!(!missing.status.success());
    assert!(text(&missing.stderr).contains("no MCP server named"));
    let disabled = talaria(&home, &["mcp", "test", "off"]).await;
    assert!(text(&disabled.stderr).contains("disabled"));

    // A first chat leaves something to find.
    llm.push(Reply::text("Noted: the flamingo password."));
    let first = talaria(&home, &["chat", "-q", "remember the flamingo"]).await;
    assert!(first.status.success(), "{}", text(&first.stderr));

    // The next one searches it and sends a note to a local file, both
    // through the MCP server.
    llm.push(Reply::tool_calls(vec![
        ToolCallReply::new(
            "s1",
            "mcp__self__session_search",
            r#"{"query": "flamingo"}"#,
        ),
        ToolCallReply::new(
            "s2",
            "mcp__self__send_message",
            r#"{"target": "local", "message": "found the flamingo"}"#,
        ),
    ]));
    llm.push(Reply::text("Found it and wrote it down."));
    let second = talaria(&home, &["chat", "-q", "find the flamingo"]).await;
    assert!(second.status.success(), "{}", text(&second.stderr));
    assert_eq!(text(&second.stdout).trim(), "Found it and wrote it down.");
    let results = llm.requests()[2].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect::<Vec<_>>();
    assert_eq!(results.len(), 2, "{results:?}");
    // The earlier session is found (this one matches too: its question
    // is stored before the model is asked).
    assert!(
        results[0].contains("remember the >>>flamingo<<<"),
        "{}",
        results[0]
    );
    assert!(
        results[1].contains("sent to a local file"),
        "{}",
        results[1]
    );
    let local = home.join("cron/output/misc");
    let files: Vec<_> = std::fs::read_dir(&local).unwrap().collect();
    assert_eq!(files.len(), 1);
    let note = std::fs::read_to_string(files[0].as_ref().unwrap().path()).unwrap();
    assert!(note.contains("found the flamingo"));
}

/// The `tool` messages of the model's request `n`.
fn tool_results(llm: &MockOpenAi, n: usize) -> Vec<String> {
    llm.requests()[n].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_time_server_answers_the_model_in_chat_and_its_errors_reach_the_model() {
    let time_server = venv_bin("mcp-server-time");
    let llm = MockOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n  api_key: sk-test-secret-key-0123456789\nagent:\n  api_max_retries: 0\nmcp_servers:\n  time:\n    command: {}\n    args: [--local-timezone, Europe/Paris]\n    timeout: 30\n    connect_timeout: 60\n",
            llm.base_url(),
            time_server.display()
        ),
    )
    .unwrap();

    // The model asks for the time in UTC, then answers.
    llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "t1",
        "mcp__time__get_current_time",
        r#"{"timezone": "UTC"}"#,
    )]));
    llm.push(Reply::text("It is some time in UTC."));
    let asked = talaria(&home, &["chat", "-q", "what time is it in UTC?"]).await;
    assert!(asked.status.success(), "{}", text(&asked.stderr));
    assert_eq!(text(&asked.stdout).trim(), "It is some time in UTC.");

    // The server's tools were discovered and offered under Talaria's names,
    // with the server's schema.
    let first = &llm.requests()[0].body;
    let offered: Vec<&Value> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["function"])
        .filter(|f| {
            f["name"]
                .as_str()
                .unwrap_or_default()
                .starts_with("mcp__time__")
        })
        .collect();
    let names: Vec<&str> = offered
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names.len(),
        2,
        "get_current_time and convert_time: {names:?}"
    );
    assert!(names.contains(&"mcp__time__get_current_time"), "{names:?}");
    assert!(names.contains(&"mcp__time__convert_time"), "{names:?}");
    let get = offered
        .iter()
        .find(|f| f["name"] == "mcp__time__get_current_time")
        .unwrap();
    assert_eq!(
        get["parameters"]["required"],
        serde_json::json!(["timezone"])
    );
    assert_eq!(
        get["parameters"]["properties"]["timezone"]["type"],
        "string"
    );
    assert!(
        get["description"]
            .as_str()
            .unwrap()
            .contains("MCP server \"time\""),
        "{get}"
    );

    // The call ran against the real server: its answer, in its own shape,
    // reached the model's next request, marked as the server's data.
    let results = tool_results(&llm, 1);
    assert_eq!(results.len(), 1, "{results:?}");
    let result = &results[0];
    assert!(result.contains("MCP server \"time\""), "{result}");
    assert!(result.contains(r#""timezone": "UTC""#), "{result}");
    assert!(result.contains(r#""datetime": ""#), "{result}");
    assert!(result.contains("+00:00"), "{result}");
    assert!(!result.contains("\"error\""), "{result}");

    // A timezone that does not exist: the server's error reaches the model
    // as a failed tool call, and the turn goes on to an answer.
    llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "t2",
        "mcp__time__get_current_time",
        r#"{"timezone": "Mars/Olympus_Mons"}"#,
    )]));
    llm.push(Reply::text("Mars has no time zone I know."));
    let wrong = talaria(&home, &["chat", "-q", "what time is it on Mars?"]).await;
    assert!(wrong.status.success(), "{}", text(&wrong.stderr));
    assert_eq!(text(&wrong.stdout).trim(), "Mars has no time zone I know.");
    let results = tool_results(&llm, 3);
    assert_eq!(results.len(), 1, "{results:?}");
    let error: Value = serde_json::from_str(&results[0])
        .unwrap_or_else(|e| panic!("not the agent's error shape ({e}): {}", results[0]));
    let message = error["error"].as_str().unwrap_or_default();
    assert!(message.contains("The tool reported an error"), "{message}");
    assert!(message.contains("Invalid timezone"), "{message}");
    assert!(message.contains("Mars/Olympus_Mons"), "{message}");
    assert_eq!(llm.requests().len(), 4);
}

const TOKEN: &str = "424242:mcp-test-token-abcdefghijkl";
const WAIT: Duration = Duration::from_secs(30);

/// `talaria` as the gateway tests run it: this home, its own lock
/// directory, none of the caller's Talaria or Telegram settings.
fn command(home: &Path, locks: &Path, args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new(TALARIA);
    c.arg("--home")
        .arg(home)
        .args(args)
        .env_remove("TALARIA_HOME")
        .env_remove("TELEGRAM_BOT_TOKEN")
        .env_remove("TELEGRAM_ALLOWED_USERS")
        .env_remove("GATEWAY_ALLOW_ALL_USERS")
        .env_remove("OPENAI_API_KEY")
        .env("TALARIA_GATEWAY_LOCK_DIR", locks)
        .env("TALARIA_LOG", "info")
        .stdin(Stdio::null());
    c
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
async fn the_mcp_python_sdk_client_searches_and_sends_through_talaria_mcp_serve() {
    let python = python_with(&["mcp", "mcp.client.stdio", "anyio"]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_py/serve_client.py");
    let llm = MockOpenAi::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let locks = dir.path().join("locks");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n  api_key: sk-test-secret-key-0123456789\nagent:\n  api_max_retries: 0\nplatforms:\n  telegram:\n    base_url: {}\n    poll_timeout_secs: 1\n",
            llm.base_url(),
            tg.base_url()
        ),
    )
    .unwrap();
    std::fs::write(
        home.join(".env"),
        format!(
            "TELEGRAM_BOT_TOKEN={TOKEN}\nTELEGRAM_ALLOWED_USERS=42\nTELEGRAM_HOME_CHANNEL=42\n"
        ),
    )
    .unwrap();

    // A stored session to find.
    llm.push(Reply::text("Noted: the pelican code."));
    let chat = command(&home, &locks, &["chat", "-q", "remember the pelican"])
        .output()
        .unwrap();
    assert!(chat.status.success(), "{}", text(&chat.stderr));

    // A gateway running, so the SDK's messages go through it.
    let log = home.join("test-gateway.log");
    let mut gateway = command(&home, &locks, &["gateway", "run"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    tg.wait_for_get_updates_calls(1, WAIT).await;
    let deadline = Instant::now() + WAIT;
    while !home.join("gateway.sock").exists() {
        assert!(Instant::now() < deadline, "no control socket");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let client = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(TALARIA)
        .arg(&home)
        .arg("pelican")
        .env_remove("TALARIA_HOME")
        .env_remove("TELEGRAM_BOT_TOKEN")
        .env("TALARIA_GATEWAY_LOCK_DIR", &locks)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let client = tokio::time::timeout(Duration::from_secs(120), client)
        .await
        .expect("the SDK client did not finish")
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(gateway.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(wait_exit(&mut gateway).success());
    assert!(
        client.status.success(),
        "the SDK client failed:\n{}\n{}",
        text(&client.stdout),
        text(&client.stderr)
    );
    let out = text(&client.stdout);
    let summary: Value = serde_json::from_str(out.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("no summary ({e}): {out}"));

    // Exactly what can be reached is offered, and each was taken.
    assert_eq!(
        summary["targets"],
        serde_json::json!(["telegram", "local"]),
        "{summary}"
    );
    assert!(summary["search_hits"].as_u64().unwrap() >= 1, "{summary}");
    // Both ways in: the `initialize` handshake, and the SDK's default (a
    // `server/discover` probe), each at a revision the SDK accepted.
    for key in ["protocol_version", "auto_protocol_version"] {
        assert!(
            summary[key].as_str().is_some_and(|v| !v.is_empty()),
            "{summary}"
        );
    }
    let sent = summary["sent"].as_array().unwrap();
    assert_eq!(sent[0], "sent to telegram:42", "{summary}");
    assert!(
        sent[1].as_str().unwrap().contains("local file"),
        "{summary}"
    );
    assert_eq!(summary["errors"].as_array().unwrap().len(), 6, "{summary}");
    assert!(
        summary["unknown_tool"]
            .as_str()
            .unwrap()
            .contains("no_such_tool"),
        "{summary}"
    );

    // The message really went out, once, through the gateway.
    let delivered = tg.wait_for_sent(1, WAIT).await;
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert_eq!(delivered[0].chat_id, 42);
    assert_eq!(delivered[0].rendered(), "hello telegram from the MCP SDK");
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("from the control socket was sent"),
        "the gateway sent it"
    );
    let local: Vec<_> = std::fs::read_dir(home.join("cron/output/misc"))
        .unwrap()
        .collect();
    assert_eq!(local.len(), 1);
}
