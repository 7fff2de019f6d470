//! What a turn reads and rewrites: the frozen system prompt, repair of a
//! damaged stored transcript, spilled tool output, and compression.

use crate::turn_common;

use std::sync::Arc;

use serde_json::Value;
use talaria_agent::compress::SUMMARY_HEADER;
use talaria_agent::repair::LOST_RESULT;
use talaria_agent::{NullObserver, TurnExit};
use talaria_core::{Message, Role, ToolCall};
use talaria_store::SessionStore;
use talaria_testkit::{Reply, ToolCallReply};
use tokio_util::sync::CancellationToken;
use turn_common::*;

#[tokio::test]
async fn the_system_prompt_is_byte_identical_across_turns_and_after_resume() {
    let (echo, _) = Echo::new();
    let r = rig(|_| {}, vec![echo.clone()]).await;
    std::fs::write(r.home.soul_file(), "You are Kestrel, a careful assistant.").unwrap();
    std::fs::write(
        r.workdir.join("AGENTS.md"),
        "Run `make check` before committing.",
    )
    .unwrap();
    std::fs::write(
        r.home.memories_dir().join("MEMORY.md"),
        "The user drinks tea.",
    )
    .unwrap();

    let s = r.agent.new_session("test").await.unwrap();
    let prompt = s.system_prompt().to_owned();
    for part in [
        "You are Kestrel",
        "make check",
        "The user drinks tea.",
        "Conversation started: ",
    ] {
        assert!(prompt.contains(part), "missing {part:?} in:\n{prompt}");
    }

    r.mock.push(Reply::text("one"));
    r.agent
        .run_turn(&s, "first", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    // Everything the prompt was built from changes mid-session...
    std::fs::write(r.home.soul_file(), "You are Osprey.").unwrap();
    std::fs::write(r.workdir.join("AGENTS.md"), "Never run make.").unwrap();
    std::fs::write(
        r.home.memories_dir().join("MEMORY.md"),
        "The user drinks coffee.",
    )
    .unwrap();
    r.mock.push(Reply::text("two"));
    r.agent
        .run_turn(&s, "second", &NullObserver, CancellationToken::new())
        .await
        .unwrap();

    // ...and another process resumes the session.
    let other = r.another_agent(vec![echo]);
    let resumed = other.resume_session(&s.id).await.unwrap();
    assert_eq!(resumed.system_prompt(), prompt);
    r.mock.push(Reply::text("three"));
    other
        .run_turn(&resumed, "third", &NullObserver, CancellationToken::new())
        .await
        .unwrap();

    let reqs = r.mock.requests();
    assert_eq!(reqs.len(), 3);
    for req in &reqs {
        assert_eq!(req.body["messages"][0]["role"], "system");
        assert_eq!(
            req.body["messages"][0]["content"].as_str(),
            Some(prompt.as_str())
        );
    }
    // The whole earlier request is a prefix of the later one.
    let first = reqs[0].body["messages"].as_array().unwrap();
    let third = reqs[2].body["messages"].as_array().unwrap();
    assert_eq!(&third[..first.len()], &first[..]);

    // A new session does see the changes.
    let fresh = r.agent.new_session("test").await.unwrap();
    assert!(fresh.system_prompt().contains("You are Osprey."));
    assert!(fresh.system_prompt().contains("coffee"));
    assert!(!fresh.system_prompt().contains("Kestrel"));
}

#[tokio::test]
async fn resuming_an_unknown_session_is_an_error() {
    let r = rig(|_| {}, vec![]).await;
    let e = r
        .agent
        .resume_session("20990101_000000_abcdef")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("20990101_000000_abcdef"), "{e}");
}

#[tokio::test]
async fn a_damaged_stored_transcript_is_repaired_in_the_request() {
    let (echo, _) = Echo::new();
    let r = rig(|_| {}, vec![echo]).await;
    let s = r.agent.new_session("test").await.unwrap();
    let lost_call = ToolCall {
        id: "lost_1".into(),
        name: "echo".into(),
        arguments: r#"{"text":"x"}"#.into(),
    };
    for m in [
        Message::user("earlier"),
        Message::assistant_tool_calls("", vec![lost_call]),
        // The process died here: no result for lost_1.
        Message::assistant("recovered somehow"),
        Message::tool_result("ghost_9", "echo", "a result nobody asked for"),
    ] {
        r.store.append_message(&s.id, &m).await.unwrap();
    }
    r.mock.push(Reply::text("fine"));
    let out = r
        .agent
        .run_turn(&s, "now", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.exit, TurnExit::Completed);

    let sent = r.sent_messages(0);
    let shape: Vec<(String, String)> = sent
        .iter()
        .map(|m| {
            let role = m["role"].as_str().unwrap().to_owned();
            let detail = match role.as_str() {
                "tool" => m["tool_call_id"].as_str().unwrap().to_owned(),
                _ => m["content"]
                    .as_str()
                    .unwrap_or("")
                    .chars()
                    .take(20)
                    .collect(),
            };
            (role, detail)
        })
        .collect();
    let expect: Vec<(String, String)> = [
        (
            "system",
            &s.system_prompt().chars().take(20).collect::<String>()[..],
        ),
        ("user", "earlier"),
        ("assistant", ""),
        ("tool", "lost_1"),
        ("assistant", "recovered somehow"),
        ("user", "now"),
    ]
    .iter()
    .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
    .collect();
    assert_eq!(shape, expect);
    assert_eq!(sent[3]["content"], LOST_RESULT);
    // The store keeps the record as it was; only the request is repaired.
    let stored = r.stored(&s.id).await;
    assert_eq!(stored.len(), 6);
    assert_eq!(stored[3].tool_call_id.as_deref(), Some("ghost_9"));
}

#[tokio::test]
async fn oversized_tool_output_is_spilled_to_a_file() {
    let r = rig(
        |c| c.agent.tool_output_max_chars = 1000,
        vec![Arc::new(Big)],
    )
    .await;
    r.mock.push(Reply::tool_calls(vec![
        ToolCallReply::new("call_big", "big", r#"{"n":5000}"#),
        ToolCallReply::new("../../escape", "big", r#"{"n":3000}"#),
        ToolCallReply::new("call_small", "big", r#"{"n":10}"#),
    ]));
    r.mock.push(Reply::text("read it"));
    let s = r.agent.new_session("test").await.unwrap();
    r.agent
        .run_turn(&s, "go", &NullObserver, CancellationToken::new())
        .await
        .unwrap();

    let dir = r.home.tool_output_dir().join(&s.id);
    let path = dir.join("call_big.txt");
    let full = std::fs::read_to_string(&path).unwrap();
    assert_eq!(full.len(), 5 + 5000 + 3);
    assert!(full.ends_with("END"));
    let stored = r.stored(&s.id).await;
    let big = &stored[2].content;
    assert!(big.contains(&path.display().to_string()), "{big}");
    assert!(
        big.contains("read_file") && big.starts_with("[This output was too large"),
        "{big}"
    );
    assert!(
        big.contains("BEGINxxx") && !big.contains("END"),
        "preview only"
    );
    assert!(big.chars().count() < 2000);

    // A hostile call id is sanitised into a file inside the session folder.
    let files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(!r.home.tool_output_dir().join("escape.txt").exists());
    assert!(stored[3].content.contains(&dir.display().to_string()));

    assert_eq!(stored[4].content, "BEGINxxxxxxxxxxEND");
    // The model saw the preview, not the full text.
    let sent = r.sent_messages(1);
    let first_result = sent.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(first_result["content"].as_str(), Some(big.as_str()));
}

/// Context window 4096 tokens, compression at half of it.
fn small_window(c: &mut talaria_core::Config) {
    c.model.context_length = 4096;
    c.compression.threshold = 0.5;
    c.compression.protect_first_n = 1;
    c.compression.protect_last_n = 2;
}

const SUMMARY: &str = "## Goal\nEcho a long text.\n## Progress\nEchoed it once.\n## Key decisions\nnone\n## Relevant files\nnone\n## Remaining work\nnone";

#[tokio::test]
async fn compression_summarises_the_middle_and_keeps_tool_pairs_together() {
    let (echo, _) = Echo::new();
    let r = rig(small_window, vec![echo]).await;
    let long = "z".repeat(5000);
    let s = r.agent.new_session("test").await.unwrap();

    // Turn 1: a big tool round trip. Nothing can be cut yet (the only
    // rows are the protected first message and the current work).
    r.mock.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c1",
        "echo",
        serde_json::json!({ "text": long }).to_string(),
    )]));
    r.mock.push(Reply::text("echoed"));
    let out = r
        .agent
        .run_turn(&s, "please echo", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.api_calls, 2);

    // Turn 2: the transcript is over the threshold, so the first request of
    // the turn is the summary.
    r.mock.push(Reply::text(SUMMARY));
    r.mock.push(Reply::text("short answer"));
    let obs = Recorder::default();
    let out = r
        .agent
        .run_turn(&s, "what now?", &obs, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.exit, TurnExit::Completed);
    assert_eq!(out.answer, "short answer");
    assert_eq!(out.api_calls, 2);
    assert!(
        obs.events()
            .iter()
            .any(|e| e.starts_with("notice:Compressing")),
        "{:?}",
        obs.events()
    );

    let reqs = r.mock.requests();
    assert_eq!(reqs.len(), 4);
    let summary_req = &reqs[2].body;
    assert!(summary_req.get("tools").is_none());
    let instructions = summary_req["messages"][0]["content"].as_str().unwrap();
    for section in [
        "## Goal",
        "## Progress",
        "## Key decisions",
        "## Relevant files",
        "## Remaining work",
    ] {
        assert!(instructions.contains(section), "{section}");
    }
    let material = summary_req["messages"][1]["content"].as_str().unwrap();
    assert!(
        material.contains("(called echo with") && material.contains("[tool result: echo]"),
        "{material}"
    );

    // The real request: first message, summary, then the tail.
    let sent = r.sent_messages(3);
    let roles: Vec<&str> = sent.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "user", "assistant", "user"]);
    assert_eq!(sent[1]["content"], "please echo");
    assert!(
        sent[2]["content"]
            .as_str()
            .unwrap()
            .starts_with(SUMMARY_HEADER)
    );
    assert!(
        sent[2]["content"]
            .as_str()
            .unwrap()
            .contains("Echoed it once.")
    );
    assert_eq!(sent[3]["content"], "echoed");
    assert_eq!(sent[4]["content"], "what now?");
    assert!(
        !sent
            .iter()
            .any(|m| m["role"] == "tool" || m.get("tool_calls").is_some_and(|t| !t.is_null()))
    );

    // The store's active transcript is the compressed one plus the answer.
    let stored = r.stored(&s.id).await;
    assert_valid(&stored);
    let contents: Vec<&str> = stored
        .iter()
        .map(|m| &m.content[..m.content.len().min(16)])
        .collect();
    assert_eq!(
        contents,
        [
            "please echo",
            &SUMMARY_HEADER[..16],
            "echoed",
            "what now?",
            "short answer"
        ]
    );
    assert_eq!(stored[1].role, Role::User);
    // The system prompt did not change.
    assert_eq!(sent[0]["content"], reqs[0].body["messages"][0]["content"]);
}

#[tokio::test]
async fn a_failed_summary_leaves_the_transcript_alone() {
    let (echo, _) = Echo::new();
    let r = rig(small_window, vec![echo]).await;
    let s = r.agent.new_session("test").await.unwrap();
    r.mock.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c1",
        "echo",
        serde_json::json!({ "text": "y".repeat(5000) }).to_string(),
    )]));
    r.mock.push(Reply::text("echoed"));
    r.agent
        .run_turn(&s, "please echo", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    let before = r.stored(&s.id).await;

    r.mock.push(Reply::error(500, "summariser exploded"));
    r.mock.push(Reply::text("answered anyway"));
    let out = r
        .agent
        .run_turn(&s, "and?", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.answer, "answered anyway");
    let stored = r.stored(&s.id).await;
    assert_eq!(&stored[..before.len()], &before[..]);
    assert_valid(&stored);
}

#[tokio::test]
async fn a_context_overflow_error_compresses_and_retries_once() {
    let (echo, _) = Echo::new();
    // A big window: only the server's complaint can trigger compression.
    let r = rig(
        |c| {
            c.compression.protect_first_n = 1;
            c.compression.protect_last_n = 2;
        },
        vec![echo],
    )
    .await;
    let s = r.agent.new_session("test").await.unwrap();
    r.mock.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c1",
        "echo",
        r#"{"text":"hi"}"#,
    )]));
    r.mock.push(Reply::text("echoed"));
    r.agent
        .run_turn(&s, "please echo", &NullObserver, CancellationToken::new())
        .await
        .unwrap();

    r.mock.push(Reply::error(
        400,
        r#"{"error":{"message":"This model's maximum context length is 4096 tokens"}}"#,
    ));
    r.mock.push(Reply::text(SUMMARY));
    r.mock.push(Reply::text("fits now"));
    let out = r
        .agent
        .run_turn(&s, "next", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.exit, TurnExit::Completed);
    assert_eq!(out.answer, "fits now");
    assert_eq!(out.api_calls, 3);
    let reqs = r.mock.requests();
    assert!(
        reqs[3].body.get("tools").is_none(),
        "request 3 is the summary"
    );
    let retried: Vec<Value> = reqs[4].body["messages"].as_array().unwrap().clone();
    assert!(
        retried[2]["content"]
            .as_str()
            .unwrap()
            .starts_with(SUMMARY_HEADER)
    );
    assert_valid(&r.stored(&s.id).await);

    // A second overflow in the same call is reported, not looped on.
    r.mock.push(Reply::error(
        400,
        r#"{"error":{"message":"context length exceeded"}}"#,
    ));
    r.mock.push(Reply::text(SUMMARY));
    r.mock.push(Reply::error(
        400,
        r#"{"error":{"message":"context length exceeded"}}"#,
    ));
    let out = r
        .agent
        .run_turn(&s, "again", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    assert!(matches!(out.exit, TurnExit::Failed(_)), "{:?}", out.exit);
}
