//! Turns against the mock Anthropic server (issue 26): signed reasoning
//! survives the tool loop, the store and a resume in another process, and
//! every request of a conversation keeps the cached head of the one
//! before it.
//!
//! The streamed shapes follow Anthropic's extended-thinking documentation
//! (`thinking_delta`, then `signature_delta`, in a `thinking` block;
//! `redacted_thinking` with `data`); the breakpoints its prompt-caching
//! documentation (`cache_control` on the last block of a message, tools
//! then system then messages as the cached order).

use crate::turn_common;

use std::sync::Arc;

use serde_json::{Value, json};
use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::{Registry, Tool};
use talaria_agent::{Agent, AgentParts, NullObserver, TurnExit};
use talaria_core::{Config, Endpoint, Home, ProviderKind, Redactor, Secret, ThinkingBlock};
use talaria_llm::HttpOptions;
use talaria_store::SqliteStore;
use talaria_testkit::{MockAnthropic, Reply};
use tokio_util::sync::CancellationToken;
use turn_common::Echo;

const SIGNATURE: &str = "EqQBCgIYAhIMaGVsbG8gdGhlcmUKGgx0aGlzIGlzIGEgc2lnbmF0dXJl";
const REDACTED: &str = "EmwKAhgBEgyRZWRhY3RlZCB0aGlua2luZyBwYXlsb2Fk";
const THOUGHT: &str = "Echo the word, then answer.";

/// An agent speaking the Messages API to `mock`, with `echo`, over the
/// store at `home`.
fn agent(mock: &MockAnthropic, home: &Home, store: Arc<SqliteStore>, tool: Arc<dyn Tool>) -> Agent {
    let mut config = Config::default();
    config.model.default = Some("claude-mock".into());
    config.model.provider = ProviderKind::Anthropic;
    let config = Arc::new(config);
    let endpoint = Endpoint {
        provider: ProviderKind::Anthropic,
        model: "claude-mock".into(),
        base_url: mock.base_url(),
        api_key: Some(Secret::new("sk-ant-test-key-0123456789")),
    };
    let provider = talaria_llm::provider_with(
        &endpoint,
        HttpOptions {
            stream: true,
            ..HttpOptions::from_agent(&config.agent)
        },
    );
    let mut registry = Registry::new();
    registry.register(tool).unwrap();
    Agent::new(AgentParts {
        config,
        home: home.clone(),
        provider,
        store,
        registry: Arc::new(registry),
        interaction: Arc::new(NoHuman),
        redactor: Redactor::default(),
        workdir: home.root().to_path_buf(),
    })
}

fn thinking_then_echo() -> Vec<String> {
    [
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
            "role": "assistant", "model": "claude-mock", "content": [],
            "usage": {"input_tokens": 900, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "thinking", "thinking": ""}}),
        json!({"type": "content_block_delta", "index": 0,
               "delta": {"type": "thinking_delta", "thinking": THOUGHT}}),
        json!({"type": "content_block_delta", "index": 0,
               "delta": {"type": "signature_delta", "signature": SIGNATURE}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1,
               "content_block": {"type": "redacted_thinking", "data": REDACTED}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "content_block_start", "index": 2,
               "content_block": {"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {}}}),
        json!({"type": "content_block_delta", "index": 2,
               "delta": {"type": "input_json_delta", "partial_json": "{\"text\": \"otter\"}"}}),
        json!({"type": "content_block_stop", "index": 2}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"},
               "usage": {"output_tokens": 30}}),
        json!({"type": "message_stop"}),
    ]
    .iter()
    .map(Value::to_string)
    .collect()
}

fn expected_blocks() -> Vec<ThinkingBlock> {
    vec![
        ThinkingBlock::Thinking {
            thinking: THOUGHT.into(),
            signature: SIGNATURE.into(),
        },
        ThinkingBlock::RedactedThinking {
            data: REDACTED.into(),
        },
    ]
}

/// Everything but the markers, which are not part of the cached content.
fn unmarked(v: &Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(k, _)| *k != "cache_control")
                .map(|(k, x)| (k.clone(), unmarked(x)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(unmarked).collect()),
        other => other.clone(),
    }
}

/// Tools, system and messages `..=through` as bytes.
fn head(body: &Value, through: usize) -> String {
    let messages = body["messages"].as_array().unwrap();
    json!({
        "tools": unmarked(&body["tools"]),
        "system": unmarked(&body["system"]),
        "messages": unmarked(&Value::Array(messages[..=through].to_vec())),
    })
    .to_string()
}

#[tokio::test]
async fn signed_thinking_is_replayed_through_the_loop_the_store_and_a_resume() {
    let mock = MockAnthropic::start().await;
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    home.ensure().unwrap();
    let store = Arc::new(SqliteStore::open(&home.state_db()).unwrap());
    let (echo, calls) = Echo::new();

    let first = agent(&mock, &home, store.clone(), echo.clone());
    mock.push(Reply::raw_sse(thinking_then_echo()));
    mock.push(Reply::text("It said otter."));
    let s = first.new_session("test").await.unwrap();
    let out = first
        .run_turn(&s, "echo otter", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.exit, TurnExit::Completed);
    assert_eq!(out.answer, "It said otter.");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);

    // Inside the loop: the call's turn goes back with its blocks first.
    let bodies: Vec<Value> = mock.requests().into_iter().map(|r| r.body).collect();
    let sent = &bodies[1]["messages"][1];
    assert_eq!(sent["role"], "assistant");
    assert_eq!(
        sent["content"][0],
        json!({"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE})
    );
    assert_eq!(
        sent["content"][1],
        json!({"type": "redacted_thinking", "data": REDACTED})
    );
    assert_eq!(sent["content"][2]["type"], "tool_use");

    // The stored row keeps them.
    let rows = talaria_store::SessionStore::messages(&*store, &s.id)
        .await
        .unwrap();
    assert_eq!(rows[1].message.thinking, expected_blocks());

    // Another process resumes the session: its first request replays the
    // blocks read back from the database, and keeps the previous
    // request's head byte for byte up to its newest breakpoint.
    let second = agent(&mock, &home, store.clone(), echo);
    mock.push(Reply::text("You're welcome."));
    let resumed = second.resume_session(&s.id).await.unwrap();
    second
        .run_turn(&resumed, "thanks", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    let bodies: Vec<Value> = mock.requests().into_iter().map(|r| r.body).collect();
    assert_eq!(bodies.len(), 3);
    assert_eq!(
        unmarked(&bodies[2]["messages"][1]),
        unmarked(&bodies[1]["messages"][1])
    );
    assert_eq!(
        bodies[2]["messages"][1]["content"][0]["signature"],
        SIGNATURE
    );
    for pair in bodies.windows(2) {
        let k = pair[0]["messages"].as_array().unwrap().len() - 1;
        assert_eq!(head(&pair[0], k), head(&pair[1], k));
        // The system prompt carries the first breakpoint in both.
        assert_eq!(
            pair[1]["system"][0]["cache_control"],
            json!({"type": "ephemeral"})
        );
    }
}
