//! The turn loop against a mock OpenAI server and a real SQLite file:
//! answers, tool round trips, tool-call errors, duplicates, parallelism,
//! the iteration budget, empty replies and provider failures.

use crate::turn_common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::Value;
use talaria_agent::dispatch::INVALID_ARGUMENTS;
use talaria_agent::tools::files::ReadFileTool;
use talaria_agent::{NullObserver, TurnExit};
use talaria_core::{Message, Role};
use talaria_store::SessionStore;
use talaria_testkit::{Reply, ToolCallReply};
use tokio_util::sync::CancellationToken;
use turn_common::*;

fn call(id: &str, name: &str, args: &str) -> ToolCallReply {
    ToolCallReply::new(id, name, args)
}

#[tokio::test]
async fn a_plain_answer_is_stored_in_order() {
    let (echo, _) = Echo::new();
    let r = rig(|_| {}, vec![echo]).await;
    r.mock.push(Reply::text("Hello there, friend."));
    let s = r.agent.new_session("test").await.unwrap();
    let obs = Recorder::default();
    let out = r
        .agent
        .run_turn(&s, "hi", &obs, CancellationToken::new())
        .await
        .unwrap();

    assert_eq!(out.exit, TurnExit::Completed);
    assert_eq!(out.answer, "Hello there, friend.");
    assert_eq!(out.api_calls, 1);
    assert_eq!(out.usage.output_tokens, 5);
    assert_eq!(obs.streamed_text(), "Hello there, friend.");
    let stored = r.stored(&s.id).await;
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[0], Message::user("hi"));
    assert_eq!(stored[1].role, Role::Assistant);
    assert_eq!(stored[1].content, "Hello there, friend.");
    assert_eq!(out.new_messages, stored);

    let sent = r.sent_messages(0);
    assert_eq!(sent[0]["role"], "system");
    assert_eq!(sent[0]["content"], s.system_prompt());
    assert_eq!(sent[1]["content"], "hi");
    let req = &r.mock.requests()[0].body;
    assert_eq!(req["tools"][0]["function"]["name"], "echo");

    let rec = r.store.session(&s.id).await.unwrap().unwrap();
    assert_eq!(rec.system_prompt.as_deref(), Some(s.system_prompt()));
    assert_eq!(rec.output_tokens, 5);
    assert_eq!(rec.model.as_deref(), Some("test-model"));
}

#[tokio::test]
async fn secrets_in_answers_are_redacted_before_storage() {
    let r = rig(|_| {}, vec![]).await;
    r.mock
        .push(Reply::text("the value is super-secret-value-123 ok"));
    let s = r.agent.new_session("test").await.unwrap();
    let out = r
        .agent
        .run_turn(&s, "tell", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.answer, "the value is [REDACTED] ok");
    assert_eq!(
        r.stored(&s.id).await[1].content,
        "the value is [REDACTED] ok"
    );
}

#[tokio::test]
async fn a_tool_round_trip_with_a_test_tool_and_read_file() {
    let (echo, calls) = Echo::new();
    let r = rig(|_| {}, vec![echo, Arc::new(ReadFileTool)]).await;
    std::fs::write(r.workdir.join("notes.txt"), "alpha\nbeta\n").unwrap();
    r.mock.push(Reply::tool_calls(vec![
        call("c1", "echo", r#"{"text":"ping"}"#),
        call("c2", "read_file", r#"{"path":"notes.txt"}"#),
    ]));
    r.mock.push(Reply::text("All done."));
    let s = r.agent.new_session("test").await.unwrap();
    let obs = Recorder::default();
    let out = r
        .agent
        .run_turn(&s, "go", &obs, CancellationToken::new())
        .await
        .unwrap();

    assert_eq!(out.exit, TurnExit::Completed);
    assert_eq!(out.answer, "All done.");
    assert_eq!(out.api_calls, 2);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let stored = r.stored(&s.id).await;
    let roles: Vec<Role> = stored.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Tool,
            Role::Assistant
        ]
    );
    assert_eq!(stored[1].tool_calls.len(), 2);
    assert_eq!(stored[1].tool_calls[0].arguments, r#"{"text":"ping"}"#);
    assert_eq!(stored[2].tool_call_id.as_deref(), Some("c1"));
    assert_eq!(stored[2].content, "echo: ping");
    assert_eq!(stored[3].tool_call_id.as_deref(), Some("c2"));
    assert!(
        stored[3].content.contains("alpha") && stored[3].content.contains("beta"),
        "{}",
        stored[3].content
    );
    assert_valid(&stored);

    let sent = r.sent_messages(1);
    let tool_rows: Vec<&Value> = sent.iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(tool_rows.len(), 2);
    assert_eq!(tool_rows[0]["tool_call_id"], "c1");
    assert_eq!(tool_rows[0]["content"], "echo: ping");
    let ev = obs.events();
    assert!(ev.contains(&"done:echo:true".to_owned()), "{ev:?}");
    assert!(
        ev.iter().any(|e| e.starts_with("start:read_file:")),
        "{ev:?}"
    );
}

#[tokio::test]
async fn unknown_tools_and_bad_arguments_become_error_results() {
    let (echo, calls) = Echo::new();
    let r = rig(|_| {}, vec![echo]).await;
    r.mock.push(Reply::tool_calls(vec![
        call("c1", "no_such_tool", "{}"),
        // Not JSON even after the provider's light repair.
        call("c2", "echo", r#"{"text": ping}"#),
        call("c3", "echo", "[1, 2]"),
    ]));
    r.mock.push(Reply::text("I see the errors."));
    let s = r.agent.new_session("test").await.unwrap();
    let out = r
        .agent
        .run_turn(&s, "go", &NullObserver, CancellationToken::new())
        .await
        .unwrap();

    assert_eq!(out.exit, TurnExit::Completed);
    assert_eq!(out.answer, "I see the errors.");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "nothing valid was called");
    let stored = r.stored(&s.id).await;
    assert_valid(&stored);
    let unknown: Value = serde_json::from_str(&stored[2].content).unwrap();
    let msg = unknown["error"].as_str().unwrap();
    assert!(
        msg.contains("no_such_tool") && msg.contains("Available tools: echo"),
        "{msg}"
    );
    assert_eq!(stored[3].content, INVALID_ARGUMENTS);
    assert_eq!(stored[4].content, INVALID_ARGUMENTS);
    // The stored call keeps the model's raw text; the request repairs it.
    assert_eq!(stored[1].tool_calls[1].arguments, r#"{"text": ping}"#);
    let sent = r.sent_messages(1);
    assert_eq!(sent[2]["tool_calls"][1]["function"]["arguments"], "{}");
}

#[tokio::test]
async fn identical_calls_in_a_batch_run_once() {
    let (echo, calls) = Echo::new();
    let r = rig(|_| {}, vec![echo]).await;
    r.mock.push(Reply::tool_calls(vec![
        call("c1", "echo", r#"{"text":"same"}"#),
        call("c2", "echo", r#"{ "text" : "same" }"#),
        call("c3", "echo", r#"{"text":"other"}"#),
    ]));
    r.mock.push(Reply::text("ok"));
    let s = r.agent.new_session("test").await.unwrap();
    r.agent
        .run_turn(&s, "go", &NullObserver, CancellationToken::new())
        .await
        .unwrap();

    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let stored = r.stored(&s.id).await;
    assert_valid(&stored);
    let results: Vec<(&str, &str)> = stored
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| (m.tool_call_id.as_deref().unwrap(), m.content.as_str()))
        .collect();
    assert_eq!(
        results,
        [
            ("c1", "echo: same"),
            ("c2", "echo: same"),
            ("c3", "echo: other")
        ]
    );
}

#[tokio::test]
async fn parallel_safe_calls_run_concurrently() {
    let barrier = Arc::new(tokio::sync::Barrier::new(3));
    let r = rig(|_| {}, vec![Arc::new(Rendezvous { barrier })]).await;
    r.mock.push(Reply::tool_calls(vec![
        call("a", "rendezvous", r#"{"k":1}"#),
        call("b", "rendezvous", r#"{"k":2}"#),
        call("c", "rendezvous", r#"{"k":3}"#),
    ]));
    r.mock.push(Reply::text("met"));
    let s = r.agent.new_session("test").await.unwrap();
    r.agent
        .run_turn(&s, "go", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    let stored = r.stored(&s.id).await;
    let results: Vec<(&str, &str)> = stored
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| (m.tool_call_id.as_deref().unwrap(), m.content.as_str()))
        .collect();
    assert_eq!(results, [("a", "met"), ("b", "met"), ("c", "met")]);
}

#[tokio::test]
async fn a_panicking_tool_becomes_an_error_result() {
    let (echo, _) = Echo::new();
    let r = rig(|_| {}, vec![Arc::new(Panicker), echo]).await;
    r.mock.push(Reply::tool_calls(vec![
        call("p", "panicker", "{}"),
        call("e", "echo", r#"{"text":"still here"}"#),
    ]));
    r.mock.push(Reply::text("survived"));
    let s = r.agent.new_session("test").await.unwrap();
    let out = r
        .agent
        .run_turn(&s, "go", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.answer, "survived");
    let stored = r.stored(&s.id).await;
    let v: Value = serde_json::from_str(&stored[2].content).unwrap();
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("deliberate test panic"),
        "{v}"
    );
    assert_eq!(stored[3].content, "echo: still here");
}

#[tokio::test]
async fn budget_exhaustion_asks_for_a_summary_without_tools() {
    let (echo, calls) = Echo::new();
    let r = rig(|c| c.agent.max_turns = 2, vec![echo]).await;
    r.mock.push(Reply::tool_calls(vec![call(
        "c1",
        "echo",
        r#"{"text":"1"}"#,
    )]));
    r.mock.push(Reply::tool_calls(vec![call(
        "c2",
        "echo",
        r#"{"text":"2"}"#,
    )]));
    r.mock
        .push(Reply::text("Summary: echoed twice; nothing remains."));
    let s = r.agent.new_session("test").await.unwrap();
    let out = r
        .agent
        .run_turn(&s, "loop forever", &NullObserver, CancellationToken::new())
        .await
        .unwrap();

    assert_eq!(out.exit, TurnExit::BudgetExhausted);
    assert_eq!(out.answer, "Summary: echoed twice; nothing remains.");
    assert_eq!(out.api_calls, 3);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let reqs = r.mock.requests();
    assert_eq!(reqs.len(), 3);
    assert!(reqs[0].body.get("tools").is_some());
    assert!(
        reqs[2].body.get("tools").is_none(),
        "the summary call must offer no tools"
    );
    let last = reqs[2].body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "user");
    assert!(
        last["content"].as_str().unwrap().contains("summarise"),
        "{last}"
    );
    let stored = r.stored(&s.id).await;
    assert_valid(&stored);
    assert_eq!(stored.last().unwrap().content, out.answer);
    // The nudge is scaffolding, not conversation.
    assert_eq!(stored.iter().filter(|m| m.role == Role::User).count(), 1);
}

#[tokio::test]
async fn an_empty_reply_is_retried_once_then_reported() {
    let r = rig(|_| {}, vec![]).await;
    r.mock.push(Reply::text(""));
    r.mock.push(Reply::text("Second time lucky."));
    r.mock.push(Reply::text(""));
    r.mock.push(Reply::text(""));
    let s = r.agent.new_session("test").await.unwrap();
    let out = r
        .agent
        .run_turn(&s, "one", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.answer, "Second time lucky.");
    assert_eq!(out.api_calls, 2);
    let nudge = r.sent_messages(1).last().unwrap().clone();
    assert_eq!(nudge["role"], "user");
    assert!(
        nudge["content"].as_str().unwrap().contains("empty"),
        "{nudge}"
    );

    let out = r
        .agent
        .run_turn(&s, "two", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.exit, TurnExit::Completed);
    assert_eq!(out.answer, "(empty)");
    assert_eq!(out.api_calls, 2);
    let stored = r.stored(&s.id).await;
    assert_eq!(stored.last().unwrap(), &Message::user("two"));
    // The nudges were never stored.
    assert_eq!(stored.len(), 3);
}

#[tokio::test]
async fn a_provider_error_fails_the_turn_but_keeps_the_user_message() {
    let r = rig(|_| {}, vec![]).await;
    r.mock.push(Reply::error(
        401,
        r#"{"error":{"message":"invalid api key","type":"auth"}}"#,
    ));
    let s = r.agent.new_session("test").await.unwrap();
    let out = r
        .agent
        .run_turn(&s, "hello?", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    match &out.exit {
        TurnExit::Failed(reason) => assert!(
            reason.contains("401") || reason.contains("Auth"),
            "{reason}"
        ),
        other => panic!("expected Failed, got {other:?}"),
    }
    assert_eq!(out.answer, "");
    assert_eq!(r.stored(&s.id).await, vec![Message::user("hello?")]);
}

#[tokio::test]
async fn the_agent_is_shareable_and_the_turn_future_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    fn assert_shareable<T: Send + Sync>() {}
    assert_shareable::<talaria_agent::Agent>();
    assert_shareable::<talaria_agent::SessionHandle>();
    let r = rig(|_| {}, vec![]).await;
    let s = r.agent.new_session("test").await.unwrap();
    let fut = r
        .agent
        .run_turn(&s, "x", &NullObserver, CancellationToken::new());
    assert_send(&fut);
    drop(fut);
}

#[tokio::test]
async fn every_calls_usage_is_stored_once_whether_or_not_it_left_a_row() {
    let (echo, _) = Echo::new();
    let r = rig(|_| {}, vec![echo]).await;
    let s = r.agent.new_session("test").await.unwrap();
    let turn = |text: &'static str| {
        let (agent, s) = (&r.agent, &s);
        async move {
            agent
                .run_turn(s, text, &NullObserver, CancellationToken::new())
                .await
                .unwrap()
        }
    };
    // A tool round trip: each call's usage goes with its row.
    r.mock
        .push(Reply::tool_calls(vec![call("c1", "echo", r#"{"text":"x"}"#)]).with_usage(100, 7));
    r.mock.push(Reply::text("Done.").with_usage(120, 9));
    assert_eq!(turn("one").await.answer, "Done.");
    // An empty reply leaves no row; its usage goes with the next one.
    r.mock.push(Reply::text("").with_usage(50, 1));
    r.mock.push(Reply::text("ok").with_usage(60, 2));
    assert_eq!(turn("two").await.answer, "ok");
    // No assistant row at all: stored when the turn ends.
    r.mock.push(Reply::text("").with_usage(5, 1));
    r.mock.push(Reply::text("").with_usage(6, 1));
    assert_eq!(turn("three").await.answer, "(empty)");

    let rec = r.store.session(&s.id).await.unwrap().unwrap();
    assert_eq!(rec.input_tokens, 100 + 120 + 50 + 60 + 5 + 6);
    assert_eq!(rec.output_tokens, 7 + 9 + 1 + 2 + 1 + 1);
}
