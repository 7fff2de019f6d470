//! `talaria mcp` as real processes. Talaria is configured with itself as
//! an MCP server (`talaria mcp serve` over stdio), so one binary shows both
//! sides: `mcp list`, `mcp test` and `mcp tools` against the server, and a
//! chat whose model searches past sessions and sends a message through the
//! MCP tools.

use std::path::Path;
use std::process::Output;

use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};

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
    assert!(shown.contains("mcp_self_session_search"), "{shown}");
    assert!(shown.contains("mcp_self_send_message"), "{shown}");

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
        ToolCallReply::new("s1", "mcp_self_session_search", r#"{"query": "flamingo"}"#),
        ToolCallReply::new(
            "s2",
            "mcp_self_send_message",
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
