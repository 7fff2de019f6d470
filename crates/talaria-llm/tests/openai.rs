//! The Chat Completions provider against the mock server.

use crate::common;

use std::time::{Duration, Instant};

use common::{Events, endpoint, opts, request, tool_request};
use serde_json::json;
use talaria_core::ProviderKind;
use talaria_llm::{ErrorKind, OpenAiProvider, Provider, StreamEvent};
use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};
use tokio_util::sync::CancellationToken;

fn provider(mock: &MockOpenAi, stream: bool) -> OpenAiProvider {
    OpenAiProvider::new(
        &endpoint(
            ProviderKind::Custom,
            "mock-1",
            mock.base_url(),
            Some("sk-test-key-0123456789"),
        ),
        opts(stream),
    )
}

#[tokio::test]
async fn streaming_text_answer() {
    let mock = MockOpenAi::start().await;
    mock.push(Reply::text("Hello there, streaming world").with_usage(7, 3));
    let p = provider(&mock, true);
    let ev = Events::default();
    let r = p
        .chat(&request(), &|e| ev.push(e), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.message.content, "Hello there, streaming world");
    assert_eq!(r.message.finish_reason.as_deref(), Some("stop"));
    assert_eq!(r.usage.input_tokens, 7);
    assert_eq!(r.usage.output_tokens, 3);
    assert_eq!(r.provider, "custom");
    assert_eq!(r.model, "mock-1");
    assert_eq!(ev.text(), "Hello there, streaming world");
    assert!(
        ev.count_text() > 1,
        "the text should arrive in several chunks"
    );

    let req = &mock.requests()[0];
    assert_eq!(req.path, "/v1/chat/completions");
    assert_eq!(
        req.header("authorization"),
        Some("Bearer sk-test-key-0123456789")
    );
    assert_eq!(req.body["stream"], true);
    assert_eq!(req.body["stream_options"]["include_usage"], true);
    assert_eq!(req.body["model"], "mock-1");
    assert_eq!(
        req.body["messages"][0],
        json!({"role": "system", "content": "You are terse."})
    );
    assert!(
        req.body.get("tools").is_none(),
        "no tools key when there are no tools"
    );
}

#[tokio::test]
async fn non_streaming_text_answer() {
    let mock = MockOpenAi::start().await;
    mock.push(
        Reply::text("plain answer")
            .with_reasoning("pondering")
            .with_usage(4, 2),
    );
    let p = provider(&mock, false);
    let ev = Events::default();
    let r = p
        .chat(&request(), &|e| ev.push(e), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.message.content, "plain answer");
    assert_eq!(r.message.reasoning.as_deref(), Some("pondering"));
    assert_eq!(r.usage.input_tokens, 4);
    assert_eq!(ev.text(), "plain answer");
    assert!(mock.requests()[0].body.get("stream").is_none());
}

#[tokio::test]
async fn streaming_tool_call_answer() {
    let mock = MockOpenAi::start().await;
    mock.push(
        Reply::tool_calls(vec![
            ToolCallReply::new("call_a", "terminal", r#"{"command": "ls -la /tmp"}"#),
            ToolCallReply::new("call_b", "read_file", r#"{"path": "notes.md"}"#),
        ])
        .with_text("Let me look."),
    );
    let p = provider(&mock, true);
    let ev = Events::default();
    let r = p
        .chat(&tool_request(), &|e| ev.push(e), &CancellationToken::new())
        .await
        .unwrap();
    let m = &r.message;
    assert_eq!(m.content, "Let me look.");
    assert_eq!(m.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(m.tool_calls.len(), 2);
    assert_eq!(m.tool_calls[0].id, "call_a");
    assert_eq!(m.tool_calls[0].name, "terminal");
    assert_eq!(m.tool_calls[0].arguments, r#"{"command": "ls -la /tmp"}"#);
    assert_eq!(m.tool_calls[1].name, "read_file");
    let started: Vec<_> = ev
        .all()
        .into_iter()
        .filter(|e| matches!(e, StreamEvent::ToolCallStarted { .. }))
        .collect();
    assert_eq!(started.len(), 2);
    let tools = &mock.requests()[0].body["tools"];
    assert_eq!(tools[0]["type"], "function");
    assert_eq!(tools[0]["function"]["name"], "terminal");
    assert_eq!(tools[0]["function"]["parameters"]["type"], "object");
}

#[tokio::test]
async fn non_streaming_tool_call_answer() {
    let mock = MockOpenAi::start().await;
    mock.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c9",
        "terminal",
        r#"{"command":"pwd"}"#,
    )]));
    let p = provider(&mock, false);
    let r = p
        .chat(&tool_request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.message.tool_calls[0].id, "c9");
    assert_eq!(r.message.tool_calls[0].arguments, r#"{"command":"pwd"}"#);
    assert_eq!(r.message.content, "");
}

fn chunk(delta: serde_json::Value) -> String {
    json!({"choices": [{"index": 0, "delta": delta, "finish_reason": null}]}).to_string()
}

#[tokio::test]
async fn accumulation_quirks_over_the_wire() {
    let mock = MockOpenAi::start().await;
    mock.push(Reply::raw_sse(vec![
        chunk(json!({"reasoning_content": "Thinking about "})),
        chunk(json!({"reasoning": "files."})),
        chunk(json!({"content": "Sure."})),
        // Name sent whole twice; arguments split over three deltas.
        chunk(json!({"tool_calls": [{"index": 0, "id": "first", "function": {"name": "terminal", "arguments": "{\"comm"}}]})),
        chunk(json!({"tool_calls": [{"index": 0, "function": {"name": "terminal", "arguments": "and\": \"l"}}]})),
        chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "s\"}"}}]})),
        // Ollama: the same index, a new id, is a second call. The id is an integer.
        chunk(json!({"tool_calls": [{"index": 0, "id": 42, "function": {"name": "read_file", "arguments": "{\"path\": \"a\"}"}}]})),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}).to_string(),
        // Usage in a chunk with no choices.
        json!({"choices": [], "usage": {"prompt_tokens": 21, "completion_tokens": 9}}).to_string(),
    ]));
    let p = provider(&mock, true);
    let ev = Events::default();
    let r = p
        .chat(&tool_request(), &|e| ev.push(e), &CancellationToken::new())
        .await
        .unwrap();
    let m = &r.message;
    assert_eq!(m.reasoning.as_deref(), Some("Thinking about files."));
    assert_eq!(m.content, "Sure.");
    assert_eq!(m.tool_calls.len(), 2, "{m:?}");
    assert_eq!(
        (m.tool_calls[0].id.as_str(), m.tool_calls[0].name.as_str()),
        ("first", "terminal")
    );
    assert_eq!(m.tool_calls[0].arguments, r#"{"command": "ls"}"#);
    assert_eq!(
        (m.tool_calls[1].id.as_str(), m.tool_calls[1].name.as_str()),
        ("42", "read_file")
    );
    assert_eq!(m.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!((r.usage.input_tokens, r.usage.output_tokens), (21, 9));
    let all = ev.all();
    assert!(all.contains(&StreamEvent::Reasoning("Thinking about ".into())));
    assert_eq!(
        all.iter()
            .filter(|e| matches!(e, StreamEvent::ToolCallStarted { .. }))
            .count(),
        2
    );
}

#[tokio::test]
async fn truncated_arguments_are_repaired() {
    let mock = MockOpenAi::start().await;
    mock.push(Reply::raw_sse(vec![
        chunk(json!({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "t", "arguments": "{\"a\": [1, 2,"}}]})),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}).to_string(),
    ]));
    let r = provider(&mock, true)
        .chat(&tool_request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.message.tool_calls[0].arguments, r#"{"a": [1, 2]}"#);
}

#[tokio::test]
async fn an_empty_stream_is_a_retryable_error() {
    let mock = MockOpenAi::start().await;
    mock.push(Reply::raw_sse(vec![]));
    let e = provider(&mock, true)
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::ServerError, "{e}");
}

#[tokio::test]
async fn a_server_that_rejects_streaming_is_asked_without_it_from_then_on() {
    let mock = MockOpenAi::start().await;
    mock.push(Reply::error(
        400,
        r#"{"error":{"message":"stream is not supported by this server"}}"#,
    ));
    mock.push(Reply::text("one"));
    mock.push(Reply::text("two"));
    let p = provider(&mock, true);
    let r = p
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.message.content, "one");
    assert!(!p.is_streaming());
    let r = p
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.message.content, "two");
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 3);
    assert_eq!(reqs[0].body["stream"], true);
    assert!(reqs[1].body.get("stream").is_none());
    assert!(reqs[2].body.get("stream").is_none());
}

#[tokio::test]
async fn plain_json_to_a_streaming_request_switches_off_streaming() {
    let mock = MockOpenAi::start().await;
    // A 200 "error" reply is just a verbatim JSON body.
    let body = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "whole"}, "finish_reason": "stop"}]});
    mock.push(Reply::error(200, body.to_string()));
    let p = provider(&mock, true);
    let r = p
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.message.content, "whole");
    assert!(!p.is_streaming());
}

#[tokio::test]
async fn interrupt_mid_stream_returns_promptly_with_partial_text_emitted() {
    let mock = MockOpenAi::start().await;
    mock.push(Reply::text("one two three four five six").stall_after(2));
    let p = provider(&mock, true);
    let cancel = CancellationToken::new();
    let ev = Events::default();
    let c2 = cancel.clone();
    let ev2 = ev.clone();
    tokio::spawn(async move {
        // Cancel once partial text has been seen.
        while ev2.count_text() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        c2.cancel();
    });
    let t = Instant::now();
    let e = p
        .chat(&request(), &|e| ev.push(e), &cancel)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Interrupted);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(!ev.text().is_empty());
}

#[tokio::test]
async fn a_stale_stream_times_out() {
    let mock = MockOpenAi::start().await;
    mock.push(Reply::text("alpha beta gamma").stall_after(1));
    let p = OpenAiProvider::new(
        &endpoint(ProviderKind::Custom, "m", mock.base_url(), None),
        talaria_llm::HttpOptions {
            stale_timeout: Duration::from_millis(300),
            ..opts(true)
        },
    );
    let t = Instant::now();
    let e = p
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(
        mock.requests()[0].header("authorization").is_none(),
        "no key, no header"
    );
}

#[tokio::test]
async fn a_slow_non_streaming_request_times_out() {
    let mock = MockOpenAi::start().await;
    mock.push(Reply::text("late").with_delay(Duration::from_secs(3)));
    let p = OpenAiProvider::new(
        &endpoint(ProviderKind::Custom, "m", mock.base_url(), None),
        talaria_llm::HttpOptions {
            request_timeout: Duration::from_millis(300),
            ..opts(false)
        },
    );
    let t = Instant::now();
    let e = p
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
    assert!(t.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn a_refused_connection_is_a_network_error() {
    // A port bound and closed again here: nothing listens on it once the
    // listener is dropped (a stopped server's socket closes only when its
    // task notices).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/v1");
    let p = OpenAiProvider::new(&endpoint(ProviderKind::Custom, "m", url, None), opts(true));
    let e = p
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Network, "{e}");
}

#[tokio::test]
async fn the_api_key_never_appears_in_an_error() {
    let key = "sk-live-SUPERSECRET-0123456789abcdef";
    let mock = MockOpenAi::start().await;
    mock.push(Reply::error(401, format!(r#"{{"error":{{"message":"Incorrect API key provided: {key}","type":"invalid_request_error"}}}}"#)));
    mock.push(Reply::error(
        400,
        format!("bad request from key {key} (not JSON)"),
    ));
    let p = OpenAiProvider::new(
        &endpoint(ProviderKind::Openai, "m", mock.base_url(), Some(key)),
        opts(true),
    );
    let e = p
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Auth);
    assert_eq!(e.status, Some(401));
    let shown = e.to_string();
    assert!(
        !shown.contains(key) && !shown.contains("SUPERSECRET"),
        "{shown}"
    );
    assert!(shown.contains("Incorrect API key"), "{shown}");
    assert!(!format!("{e:?}").contains("SUPERSECRET"));
    let e = p
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(!e.to_string().contains("SUPERSECRET"), "{e}");

    // A short key no pattern recognises is still removed by exact value.
    let mock = MockOpenAi::start().await;
    mock.push(Reply::error(401, "key zq7w9 rejected"));
    let p = OpenAiProvider::new(
        &endpoint(ProviderKind::Custom, "m", mock.base_url(), Some("zq7w9")),
        opts(true),
    );
    let e = p
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(!e.to_string().contains("zq7w9"), "{e}");
}

#[tokio::test]
async fn long_error_bodies_are_truncated() {
    let mock = MockOpenAi::start().await;
    mock.push(Reply::error(500, "x".repeat(5000)));
    let p = provider(&mock, true);
    let e = p
        .chat(&request(), &|_| {}, &CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::ServerError);
    assert!(e.message.chars().count() <= 501, "{}", e.message.len());
}
