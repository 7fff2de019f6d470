//! The Messages API provider against the mock server.

use crate::common;

use std::time::{Duration, Instant};

use common::{Events, endpoint, opts, request, tool_request};
use talaria_core::{Message, ProviderKind, ToolCall};
use talaria_llm::{AnthropicProvider, ChatRequest, ErrorKind, Provider, StreamEvent};
use talaria_testkit::{MockAnthropic, Reply, ToolCallReply};
use tokio_util::sync::CancellationToken;

const KEY: &str = "sk-ant-test-0123456789abcdefghij";

fn provider(mock: &MockAnthropic, stream: bool) -> AnthropicProvider {
    AnthropicProvider::new(
        &endpoint(
            ProviderKind::Anthropic,
            "claude-mock",
            mock.base_url(),
            Some(KEY),
        ),
        opts(stream),
    )
}

#[tokio::test]
async fn streaming_text_answer() {
    let mock = MockAnthropic::start().await;
    mock.push(Reply::text("Hello from the messages API").with_usage(11, 6));
    let p = provider(&mock, true);
    let ev = Events::default();
    let r = p
        .chat(&request(), &|e| ev.push(e), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.message.content, "Hello from the messages API");
    assert_eq!(r.message.finish_reason.as_deref(), Some("stop"));
    assert_eq!((r.usage.input_tokens, r.usage.output_tokens), (11, 6));
    assert_eq!(r.provider, "anthropic");
    assert_eq!(ev.text(), "Hello from the messages API");
    assert!(ev.count_text() > 1);

    let req = &mock.requests()[0];
    assert_eq!(req.path, "/v1/messages");
    assert_eq!(req.header("x-api-key"), Some(KEY));
    assert_eq!(req.header("anthropic-version"), Some("2023-06-01"));
    assert!(req.header("authorization").is_none());
    assert_eq!(
        req.body["system"],
        serde_json::json!([{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}])
    );
    assert_eq!(req.body["max_tokens"], 4096);
    assert_eq!(req.body["stream"], true);
    assert_eq!(req.body["messages"][0]["role"], "user");
    assert_eq!(req.body["messages"][0]["content"][0]["text"], "hi");
}

#[tokio::test]
async fn non_streaming_text_answer() {
    let mock = MockAnthropic::start().await;
    mock.push(Reply::text("whole answer").with_reasoning("hmm"));
    let p = provider(&mock, false);
    let ev = Events::default();
    let req = ChatRequest {
        max_tokens: Some(128),
        ..request()
    };
    let r = p
        .chat(&req, &|e| ev.push(e), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.message.content, "whole answer");
    assert_eq!(r.message.reasoning.as_deref(), Some("hmm"));
    assert_eq!(ev.text(), "whole answer");
    let body = &mock.requests()[0].body;
    assert!(body.get("stream").is_none());
    assert_eq!(body["max_tokens"], 128);
}

#[tokio::test]
async fn streaming_tool_call_answer() {
    let mock = MockAnthropic::start().await;
    mock.push(
        Reply::tool_calls(vec![
            ToolCallReply::new("toolu_1", "terminal", r#"{"command": "ls -la"}"#),
            ToolCallReply::new("toolu_2", "terminal", r#"{"command": "pwd"}"#),
        ])
        .with_text("Checking.")
        .with_reasoning("I should list files"),
    );
    let p = provider(&mock, true);
    let ev = Events::default();
    let r = p
        .chat(&tool_request(), &|e| ev.push(e), &CancellationToken::new())
        .await
        .unwrap();
    let m = &r.message;
    assert_eq!(m.content, "Checking.");
    assert_eq!(m.reasoning.as_deref(), Some("I should list files"));
    assert_eq!(m.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(m.tool_calls.len(), 2);
    assert_eq!(m.tool_calls[0].id, "toolu_1");
    assert_eq!(m.tool_calls[0].arguments, r#"{"command": "ls -la"}"#);
    assert_eq!(m.tool_calls[1].arguments, r#"{"command": "pwd"}"#);
    assert!(ev.all().contains(&StreamEvent::ToolCallStarted {
        name: "terminal".into()
    }));
    assert!(
        ev.all()
            .iter()
            .any(|e| matches!(e, StreamEvent::Reasoning(_)))
    );
    let tools = &mock.requests()[0].body["tools"];
    assert_eq!(tools[0]["name"], "terminal");
    assert_eq!(tools[0]["input_schema"]["type"], "object");
}

#[tokio::test]
async fn non_streaming_tool_call_answer() {
    let mock = MockAnthropic::start().await;
    mock.push(Reply::tool_calls(vec![ToolCallReply::new(
        "toolu_9",
        "read_file",
        r#"{"path":"a.txt"}"#,
    )]));
    let r = provider(&mock, false)
        .chat(&tool_request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.message.tool_calls[0].name, "read_file");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&r.message.tool_calls[0].arguments).unwrap(),
        serde_json::json!({"path": "a.txt"})
    );
    assert_eq!(r.message.finish_reason.as_deref(), Some("tool_calls"));
}

#[tokio::test]
async fn tool_results_are_sent_as_one_user_message() {
    let mock = MockAnthropic::start().await;
    mock.push(Reply::text("done"));
    let req = ChatRequest {
        messages: vec![
            Message::user("go"),
            Message::assistant_tool_calls(
                "",
                vec![
                    ToolCall {
                        id: "a".into(),
                        name: "t".into(),
                        arguments: "{}".into(),
                    },
                    ToolCall {
                        id: "b".into(),
                        name: "t".into(),
                        arguments: "{}".into(),
                    },
                ],
            ),
            Message::tool_result("a", "t", "out a"),
            Message::tool_result("b", "t", ""),
        ],
        ..ChatRequest::default()
    };
    provider(&mock, true)
        .chat(&req, &|_| {}, &CancellationToken::new())
        .await
        .unwrap();
    let msgs = mock.requests()[0].body["messages"].clone();
    assert_eq!(msgs.as_array().unwrap().len(), 3);
    assert!(mock.requests()[0].body.get("system").is_none());
    let results = msgs[2]["content"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["tool_use_id"], "a");
    assert_eq!(results[1]["content"], "(no output)");
}

#[tokio::test]
async fn overloaded_and_auth_errors_are_classified() {
    let mock = MockAnthropic::start().await;
    mock.push(Reply::error(
        529,
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    ));
    mock.push(Reply::error(401, format!(r#"{{"type":"error","error":{{"type":"authentication_error","message":"invalid x-api-key {KEY}"}}}}"#)));
    let p = provider(&mock, true);
    let e = p
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Overloaded);
    let e = p
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Auth);
    assert!(!e.to_string().contains(KEY), "{e}");
}

#[tokio::test]
async fn an_error_event_inside_the_stream_is_classified() {
    let mock = MockAnthropic::start().await;
    mock.push(Reply::raw_sse(vec![
        r#"{"type":"message_start","message":{"usage":{"input_tokens":1}}}"#.into(),
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#.into(),
    ]));
    let e = provider(&mock, true)
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Overloaded, "{e}");
}

#[tokio::test]
async fn interrupt_mid_stream() {
    let mock = MockAnthropic::start().await;
    mock.push(Reply::text("a b c d e f g h").stall_after(2));
    let p = provider(&mock, true);
    let cancel = CancellationToken::new();
    let ev = Events::default();
    let (c2, ev2) = (cancel.clone(), ev.clone());
    tokio::spawn(async move {
        while ev2.count_text() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        c2.cancel();
    });
    let t = Instant::now();
    let e = p
        .chat(&request(), &|e| ev.push(e), &cancel)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Interrupted);
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(!ev.text().is_empty());
}
