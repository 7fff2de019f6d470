//! The todo list survives context compression: after the turns that wrote
//! it are summarised away, its open items are back in the next request.

use crate::turn_common;

use std::sync::Arc;

use talaria_agent::NullObserver;
use talaria_agent::compress::SUMMARY_HEADER;
use talaria_agent::tools::Tool;
use talaria_agent::tools::todo::{PRESERVED_HEADER, TodoTool};
use talaria_testkit::{Reply, ToolCallReply};
use tokio_util::sync::CancellationToken;
use turn_common::*;

#[tokio::test]
async fn open_todo_items_are_reinjected_after_compression() {
    let (echo, _) = Echo::new();
    let r = rig(
        |c| {
            c.model.context_length = 4096;
            c.compression.threshold = 0.5;
            c.compression.protect_first_n = 1;
            c.compression.protect_last_n = 2;
        },
        vec![echo as Arc<dyn Tool>, Arc::new(TodoTool)],
    )
    .await;
    let s = r.agent.new_session("test").await.unwrap();

    // Turn 1: the plan is written, then a big tool result fills the window.
    let todos = serde_json::json!({"todos": [
        {"id": "1", "content": "read the config loader", "status": "completed"},
        {"id": "2", "content": "add the retry flag", "status": "in_progress"},
        {"id": "3", "content": "document the retry flag", "status": "pending"},
        {"id": "4", "content": "rewrite it in COBOL", "status": "cancelled"}
    ]});
    r.mock.push(Reply::tool_calls(vec![
        ToolCallReply::new("t1", "todo", todos.to_string()),
        ToolCallReply::new(
            "c1",
            "echo",
            serde_json::json!({ "text": "q".repeat(6000) }).to_string(),
        ),
    ]));
    r.mock.push(Reply::text("planned"));
    r.agent
        .run_turn(&s, "plan the work", &NullObserver, CancellationToken::new())
        .await
        .unwrap();

    // Turn 2: over the threshold, so the summary comes first.
    r.mock.push(Reply::text(
        "## Goal\nAdd a retry flag.\n## Progress\nPlanned.",
    ));
    r.mock.push(Reply::text("continuing"));
    r.agent
        .run_turn(&s, "go on", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    let reqs = r.mock.requests();
    assert_eq!(reqs.len(), 4, "the second turn summarised then answered");
    let sent = r.sent_messages(3);
    // The todo call and its result were summarised away...
    assert!(!sent.iter().any(|m| m["role"] == "tool"));
    // ...and the open items came back with the summary.
    let summary = sent
        .iter()
        .filter_map(|m| m["content"].as_str())
        .find(|c| c.starts_with(SUMMARY_HEADER))
        .expect("a summary row");
    assert!(summary.contains(PRESERVED_HEADER), "{summary}");
    assert!(
        summary.contains("- [in_progress] 2: add the retry flag"),
        "{summary}"
    );
    assert!(
        summary.contains("- [pending] 3: document the retry flag"),
        "{summary}"
    );
    assert!(!summary.contains("read the config loader"), "{summary}");
    assert!(!summary.contains("COBOL"), "{summary}");
    // It is stored too, so a resumed session keeps it.
    let stored = r.stored(&s.id).await;
    assert!(
        stored
            .iter()
            .any(|m| m.content.contains("- [pending] 3: document the retry flag"))
    );
}
