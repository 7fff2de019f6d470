//! The turn loop with the habits of weaker models, against the mock model
//! server: answers cut at the output limit are continued and joined, tool
//! names that nearly match are repaired (or refused with close names), and
//! tool calls written as text in the answer run.

use crate::turn_common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::{Value, json};
use talaria_agent::TurnExit;
use talaria_agent::tools::files::ReadFileTool;
use talaria_core::Role;
use talaria_testkit::{Reply, ToolCallReply};
use tokio_util::sync::CancellationToken;
use turn_common::*;

/// A streamed answer of `parts` (one content chunk each) that ends with
/// `finish`, as a Chat Completions server sends it.
fn streamed(parts: &[&str], finish: &str) -> Reply {
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "test-model",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        .to_string()
    };
    let mut events: Vec<String> = parts
        .iter()
        .map(|p| chunk(json!({"content": p}), None))
        .collect();
    events.push(chunk(json!({}), Some(finish)));
    Reply::raw_sse(events)
}

#[tokio::test]
async fn an_answer_cut_at_the_limit_is_continued_and_stored_whole() {
    let r = rig(|_| {}, vec![]).await;
    r.mock.push(streamed(
        &["The three steps are: first, ", "mix the"],
        "length",
    ));
    r.mock
        .push(streamed(&[" flour; second, bake; ", "third, eat."], "stop"));
    let s = r.agent.new_session("test").await.unwrap();
    let obs = Recorder::default();
    let out = r
        .agent
        .run_turn(&s, "how?", &obs, CancellationToken::new())
        .await
        .unwrap();
    let whole = "The three steps are: first, mix the flour; second, bake; third, eat.";
    assert_eq!(out.exit, TurnExit::Completed);
    assert_eq!(out.answer, whole);
    assert_eq!(out.api_calls, 2);
    // The user saw each part once, in order.
    assert_eq!(obs.streamed_text(), whole);
    let stored = r.stored(&s.id).await;
    assert_eq!(
        stored.len(),
        2,
        "one user row and one whole answer: {stored:?}"
    );
    assert_eq!(stored[1].role, Role::Assistant);
    assert_eq!(stored[1].content, whole);
    assert_eq!(stored[1].finish_reason.as_deref(), Some("stop"));
    // The second request carried the partial answer and the nudge, unstored.
    let sent = r.sent_messages(1);
    let n = sent.len();
    assert_eq!(sent[n - 2]["role"], "assistant");
    assert_eq!(
        sent[n - 2]["content"],
        "The three steps are: first, mix the"
    );
    assert_eq!(sent[n - 1]["role"], "user");
    assert_eq!(
        sent[n - 1]["content"],
        "Continue exactly where you stopped."
    );
}

#[tokio::test]
async fn at_most_three_continuations() {
    let r = rig(|_| {}, vec![]).await;
    for part in ["a", "b", "c", "d", "e"] {
        r.mock.push(streamed(&[part], "length"));
    }
    let s = r.agent.new_session("test").await.unwrap();
    let out = r
        .agent
        .run_turn(&s, "go", &Recorder::default(), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.api_calls, 4, "the first call and three continuations");
    assert_eq!(out.answer, "abcd");
    assert_eq!(r.mock.pending(), 1);
    let stored = r.stored(&s.id).await;
    assert_eq!(stored.last().map(|m| m.content.as_str()), Some("abcd"));
    // Each continuation sends everything written so far.
    let sent = r.sent_messages(3);
    assert_eq!(sent[sent.len() - 2]["content"], "abc");
}

#[tokio::test]
async fn a_misspelt_tool_name_is_repaired_and_the_model_told() {
    let r = rig(|_| {}, vec![Arc::new(ReadFileTool)]).await;
    std::fs::write(r.workdir.join("notes.txt"), "alpha\nbeta\n").unwrap();
    r.mock.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c1",
        "ReadFile",
        r#"{"path":"notes.txt"}"#,
    )]));
    r.mock.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c2",
        "read_fiel",
        r#"{"path":"notes.txt"}"#,
    )]));
    r.mock.push(Reply::text("Read it."));
    let s = r.agent.new_session("test").await.unwrap();
    let out = r
        .agent
        .run_turn(
            &s,
            "read notes",
            &Recorder::default(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(out.answer, "Read it.");
    let stored = r.stored(&s.id).await;
    let results: Vec<&str> = stored
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(results.len(), 2);
    assert!(
        results[0].starts_with("note: there is no tool `ReadFile`; ran `read_file`."),
        "{}",
        results[0]
    );
    assert!(results[0].contains("alpha"), "the tool ran: {}", results[0]);
    // `read_fiel` is two edits away from `read_file` and from nothing else,
    // but a transposition is not a separator or case slip: refused, with the
    // close name offered.
    assert!(
        results[1].contains("Tool 'read_fiel' does not exist. Did you mean: read_file?"),
        "{}",
        results[1]
    );
    assert!(!results[1].contains("alpha"));
    // The model was sent the note with the result.
    let sent = r.sent_messages(1);
    let tool_row = sent.iter().find(|m| m["role"] == "tool").unwrap();
    assert!(
        tool_row["content"]
            .as_str()
            .unwrap()
            .starts_with("note: there is no tool `ReadFile`")
    );
}

#[tokio::test]
async fn a_tool_call_written_as_text_runs_and_is_not_shown() {
    let (echo, calls) = Echo::new();
    let r = rig(|_| {}, vec![echo]).await;
    r.mock.push(Reply::text(
        "Let me echo that.\n<tool_call>\n{\"name\": \"echo\", \"arguments\": {\"text\": \"ping\"}}\n</tool_call>",
    ));
    r.mock.push(Reply::text("Echoed."));
    let s = r.agent.new_session("test").await.unwrap();
    let obs = Recorder::default();
    let out = r
        .agent
        .run_turn(&s, "echo ping", &obs, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.answer, "Echoed.");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let shown = obs.streamed_text();
    assert!(!shown.contains("<tool_call>"), "{shown}");
    assert!(!shown.contains("\"name\""), "{shown}");
    let stored = r.stored(&s.id).await;
    assert_eq!(stored[1].content, "Let me echo that.");
    assert_eq!(stored[1].tool_calls.len(), 1);
    assert_eq!(stored[1].tool_calls[0].name, "echo");
    assert_eq!(stored[2].role, Role::Tool);
    // The next request carries the call and its result.
    let sent = r.sent_messages(1);
    let call_row = sent.iter().find(|m| m["role"] == "assistant").unwrap();
    assert_eq!(call_row["tool_calls"][0]["function"]["name"], "echo");
    let tool_row = sent.iter().find(|m| m["role"] == "tool").unwrap();
    assert!(tool_row["content"].as_str().unwrap().contains("ping"));
}
