//! Through the `talaria` binary: a model that writes its tool call as text
//! (`<tool_call>{...}</tool_call>`, as Hermes and Qwen models do) gets the
//! tool run, and the user never sees the raw call; without tools offered, a
//! JSON-looking answer stays the answer.

use std::path::Path;
use std::process::Output;

use serde_json::Value;
use talaria_testkit::{MockOpenAi, Reply};

async fn talaria(home: &Path, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("TALARIA_HOME")
        .env_remove("OPENAI_API_KEY")
        .env_remove("TALARIA_MODEL")
        .env_remove("TALARIA_BASE_URL")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `model_extra` goes under `model:`, `extra` under `agent:` (or, unindented,
/// at the top level).
fn write_config(home: &Path, base_url: &str, model_extra: &str, extra: &str) {
    std::fs::create_dir_all(home).unwrap();
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  default: local-model\n  provider: custom\n  base_url: {base_url}\n{model_extra}agent:\n  api_max_retries: 1\n{extra}"
        ),
    )
    .unwrap();
}

/// The answer a Qwen 2.5 model served without a tool parser writes when it
/// wants the `todo` tool.
const QWEN_TODO_CALL: &str = "I'll add that to the list.\n<tool_call>\n{\"name\": \"todo\", \"arguments\": {\"todos\": [{\"id\": \"1\", \"content\": \"buy-milk-marker\", \"status\": \"pending\"}]}}\n</tool_call>";

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_call_written_as_text_runs_and_stays_off_screen() {
    for stream in [true, false] {
        let mock = MockOpenAi::start().await;
        mock.push(Reply::text(QWEN_TODO_CALL));
        mock.push(Reply::text("Added buy milk to your list."));
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        write_config(
            &home,
            &mock.base_url(),
            "",
            &format!("  stream: {stream}\n"),
        );

        let out = talaria(&home, &["chat", "-q", "remind me to buy milk"]).await;
        let stdout = text(&out.stdout);
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "stream={stream} stderr: {stderr}");
        for shown in [&stdout, &stderr] {
            assert!(!shown.contains("<tool_call>"), "stream={stream}: {shown}");
            assert!(!shown.contains("\"arguments\""), "stream={stream}: {shown}");
        }
        assert!(
            stdout.contains("Added buy milk to your list."),
            "stream={stream}: {stdout}"
        );

        let reqs = mock.requests();
        assert_eq!(reqs.len(), 2, "stream={stream}");
        assert_eq!(reqs[0].body["stream"].as_bool().unwrap_or(false), stream);
        let offered: Vec<&str> = reqs[0].body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["function"]["name"].as_str())
            .collect();
        assert!(offered.contains(&"todo"), "{offered:?}");
        // The second request carries the call, as a real call, and the
        // todo tool's result.
        let messages = reqs[1].body["messages"].as_array().unwrap();
        let call_row = messages
            .iter()
            .find(|m| m["role"] == "assistant")
            .unwrap_or_else(|| panic!("no assistant row: {messages:?}"));
        assert_eq!(call_row["tool_calls"][0]["function"]["name"], "todo");
        assert_eq!(call_row["content"], "I'll add that to the list.");
        let result: &Value = messages
            .iter()
            .find(|m| m["role"] == "tool")
            .unwrap_or_else(|| panic!("no tool result: {messages:?}"));
        assert_eq!(result["tool_call_id"], call_row["tool_calls"][0]["id"]);
        let content = result["content"].as_str().unwrap();
        assert!(content.contains("buy-milk-marker"), "{content}");
        assert!(content.contains("\"pending\":1"), "{content}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn json_looking_answer_without_tools_offered_stays_text() {
    let answer = r#"{"name": "todo", "arguments": {"todos": []}}"#;
    let mock = MockOpenAi::start().await;
    mock.push(Reply::text(answer));
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    // `no_mcp` alone enables no toolset, so the CLI offers no tools.
    write_config(
        &home,
        &mock.base_url(),
        "",
        "platform_toolsets:\n  cli: [no_mcp]\n",
    );

    let out = talaria(&home, &["chat", "-q", "show me a tool call as json"]).await;
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{answer}\n"));
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 1, "nothing ran, so nothing went back");
    assert!(
        reqs[0].body.get("tools").is_none(),
        "no tools offered: {}",
        reqs[0].body["tools"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_call_parser_off_leaves_the_call_as_text() {
    let mock = MockOpenAi::start().await;
    mock.push(Reply::text(QWEN_TODO_CALL));
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    write_config(&home, &mock.base_url(), "  tool_call_parser: off\n", "");

    let out = talaria(&home, &["chat", "-q", "remind me to buy milk"]).await;
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{QWEN_TODO_CALL}\n"));
    assert_eq!(mock.requests().len(), 1, "no tool ran");
}
