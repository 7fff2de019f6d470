//! Prompt caching and signed reasoning on the Messages API, against the
//! mock server (issue 26).
//!
//! The request shapes follow Anthropic's prompt-caching documentation: a
//! breakpoint is a `cache_control: {"type": "ephemeral"}` object (with
//! `"ttl": "1h"` for the hour-long cache) on a content block, a system
//! prompt given as a list of text blocks, or a tool definition; the prefix
//! is rendered tools, then system, then messages; at most four breakpoints
//! per request. The reasoning shapes follow its extended-thinking
//! documentation: `thinking` blocks carry a `signature` (streamed as a
//! `signature_delta` after the `thinking_delta`s), `redacted_thinking`
//! blocks carry `data`, and both must come back unchanged, first in the
//! assistant turn, while a tool-use loop continues.

use crate::common;

use common::{endpoint, opts};
use serde_json::{Value, json};
use talaria_core::config::{CacheTtl, PromptCachingConfig};
use talaria_core::{Message, ProviderKind, Role, ThinkingBlock, ToolCall};
use talaria_llm::{AnthropicProvider, ChatRequest, HttpOptions, Provider, ToolSpec};
use talaria_testkit::{MockAnthropic, Reply, ToolCallReply};
use tokio_util::sync::CancellationToken;

const KEY: &str = "sk-ant-test-0123456789abcdefghij";

fn provider_with(mock: &MockAnthropic, opts: HttpOptions) -> AnthropicProvider {
    AnthropicProvider::new(
        &endpoint(
            ProviderKind::Anthropic,
            "claude-mock",
            mock.base_url(),
            Some(KEY),
        ),
        opts,
    )
}

fn provider(mock: &MockAnthropic, stream: bool) -> AnthropicProvider {
    provider_with(mock, opts(stream))
}

fn tools() -> Vec<ToolSpec> {
    ["terminal", "read_file"]
        .into_iter()
        .map(|name| ToolSpec {
            name: name.into(),
            description: format!("the {name} tool"),
            parameters: json!({"type": "object", "properties": {"arg": {"type": "string"}}}),
        })
        .collect()
}

fn call(id: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: "terminal".into(),
        arguments: r#"{"arg":"ls"}"#.into(),
    }
}

/// A conversation long enough that most of it is outside the tail:
/// system, then six user/assistant exchanges, two of them with tools.
fn long_conversation() -> Vec<Message> {
    let mut m = vec![Message::system("You are the long-lived system prompt.")];
    for i in 0..4 {
        m.push(Message::user(format!("question {i}")));
        m.push(Message::assistant(format!("answer {i}")));
    }
    m.push(Message::user("run something"));
    m.push(Message::assistant_tool_calls("running", vec![call("t1")]));
    m.push(Message::tool_result("t1", "terminal", "a b c"));
    m.push(Message::assistant_tool_calls("", vec![call("t2")]));
    m.push(Message::tool_result("t2", "terminal", "d e f"));
    m
}

async fn send(p: &AnthropicProvider, req: &ChatRequest) -> talaria_llm::ChatResponse {
    p.chat(req, &|_| {}, &CancellationToken::new())
        .await
        .unwrap()
}

/// Every JSON path holding a `cache_control` object, in document order.
fn breakpoints(v: &Value, at: String, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                if k == "cache_control" {
                    out.push((at.clone(), x.clone()));
                } else {
                    breakpoints(x, format!("{at}/{k}"), out);
                }
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                breakpoints(x, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

fn paths(body: &Value) -> Vec<String> {
    let mut out = Vec::new();
    breakpoints(body, String::new(), &mut out);
    out.into_iter().map(|(p, _)| p).collect()
}

#[tokio::test]
async fn breakpoints_sit_on_the_system_prompt_and_the_last_three_messages() {
    let mock = MockAnthropic::start().await;
    mock.push(Reply::text("done"));
    let p = provider(&mock, false);
    let req = ChatRequest {
        messages: long_conversation(),
        tools: tools(),
        ..ChatRequest::default()
    };
    send(&p, &req).await;
    let body = &mock.requests()[0].body;
    let messages = body["messages"].as_array().unwrap();
    let n = messages.len();
    assert!(n > 6, "{n}");
    // The system prompt as one block, marked; the tools before it are in
    // its prefix, so none of them carries a marker of its own.
    assert_eq!(
        body["system"],
        json!([{"type": "text", "text": "You are the long-lived system prompt.",
                "cache_control": {"type": "ephemeral"}}])
    );
    let last_block = |i: usize| {
        let blocks = messages[i]["content"].as_array().unwrap();
        format!("/messages/{i}/content/{}", blocks.len() - 1)
    };
    let mut expected = vec![
        last_block(n - 3),
        last_block(n - 2),
        last_block(n - 1),
        "/system/0".to_owned(),
    ];
    expected.sort();
    let mut found = paths(body);
    found.sort();
    assert_eq!(found, expected, "four breakpoints, nowhere else");
    // The newest is the tool result the model is answering.
    let newest = messages[n - 1]["content"]
        .as_array()
        .unwrap()
        .last()
        .unwrap();
    assert_eq!(newest["type"], "tool_result");
    assert_eq!(newest["cache_control"], json!({"type": "ephemeral"}));
    // The assistant turn before it is marked on its tool_use block.
    let prev = messages[n - 2]["content"]
        .as_array()
        .unwrap()
        .last()
        .unwrap();
    assert_eq!(prev["type"], "tool_use");
    assert!(prev.get("cache_control").is_some());
}

#[tokio::test]
async fn the_hour_ttl_is_sent_and_caching_can_be_turned_off() {
    let mock = MockAnthropic::start().await;
    mock.push(Reply::text("one"));
    mock.push(Reply::text("two"));
    let req = ChatRequest {
        messages: long_conversation(),
        tools: tools(),
        ..ChatRequest::default()
    };
    let hour = provider_with(
        &mock,
        HttpOptions {
            prompt_caching: PromptCachingConfig {
                enabled: true,
                ttl: CacheTtl::OneHour,
            },
            ..opts(false)
        },
    );
    send(&hour, &req).await;
    let off = provider_with(
        &mock,
        HttpOptions {
            prompt_caching: PromptCachingConfig {
                enabled: false,
                ..PromptCachingConfig::default()
            },
            ..opts(false)
        },
    );
    send(&off, &req).await;
    let recorded = mock.requests();
    let (hour_body, off_body) = (&recorded[0].body, &recorded[1].body);
    let mut marks = Vec::new();
    breakpoints(hour_body, String::new(), &mut marks);
    assert_eq!(marks.len(), 4);
    for (_, m) in &marks {
        assert_eq!(m, &json!({"type": "ephemeral", "ttl": "1h"}));
    }
    assert!(paths(off_body).is_empty(), "{off_body}");
    assert_eq!(off_body["system"], "You are the long-lived system prompt.");
}

#[tokio::test]
async fn without_a_system_prompt_the_last_tool_closes_the_cached_head() {
    let mock = MockAnthropic::start().await;
    mock.push(Reply::text("ok"));
    let p = provider(&mock, false);
    let req = ChatRequest {
        messages: long_conversation().split_off(1),
        tools: tools(),
        ..ChatRequest::default()
    };
    send(&p, &req).await;
    let body = &mock.requests()[0].body;
    assert!(body.get("system").is_none());
    let found = paths(body);
    assert_eq!(found.len(), 4, "{found:?}");
    assert!(found.contains(&"/tools/1".to_owned()), "{found:?}");
    assert!(!found.contains(&"/tools/0".to_owned()), "{found:?}");
}

/// `body` with every `cache_control` removed.
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

/// The prompt as the API renders it for caching (tools, then system, then
/// the messages up to and including `through`), without the markers
/// (which are not part of the cached content), as bytes.
fn rendered_prefix(body: &Value, through: usize) -> String {
    let messages = body["messages"].as_array().unwrap();
    let head = json!({
        "tools": unmarked(&body["tools"]),
        "system": unmarked(&body["system"]),
        "messages": unmarked(&Value::Array(messages[..=through].to_vec())),
    });
    serde_json::to_string(&head).unwrap()
}

/// The index of the newest message carrying a breakpoint.
fn last_marked_message(body: &Value) -> usize {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rposition(|m| {
            m["content"]
                .as_array()
                .is_some_and(|b| b.iter().any(|x| x.get("cache_control").is_some()))
        })
        .unwrap()
}

/// Requests of a growing conversation, made the way the agent makes them
/// (a tool-use loop, then a second turn): each one's prompt, up to the
/// previous request's newest breakpoint, is byte for byte the previous
/// one's, so the cache entry written there is read; and that block is
/// still marked, so the read needs no lookback.
#[tokio::test]
async fn successive_requests_share_the_prefix_up_to_the_earlier_breakpoint() {
    let mock = MockAnthropic::start().await;
    let p = provider(&mock, true);
    let mut transcript = vec![
        Message::system("You are the long-lived system prompt."),
        Message::user("tidy the folder"),
    ];
    let script = [
        Reply::tool_calls(vec![ToolCallReply::new(
            "t1",
            "terminal",
            r#"{"arg":"ls"}"#,
        )])
        .with_text("Looking first."),
        Reply::tool_calls(vec![ToolCallReply::new(
            "t2",
            "terminal",
            r#"{"arg":"rm x"}"#,
        )]),
        Reply::text("Tidied."),
        Reply::text("You're welcome."),
    ];
    for (i, reply) in script.into_iter().enumerate() {
        mock.push(reply);
        let req = ChatRequest {
            messages: transcript.clone(),
            tools: tools(),
            ..ChatRequest::default()
        };
        let r = send(&p, &req).await;
        let calls = r.message.tool_calls.clone();
        transcript.push(r.message);
        for c in calls {
            transcript.push(Message::tool_result(&c.id, &c.name, format!("ran {i}")));
        }
        if i == 2 {
            transcript.push(Message::user("thanks"));
        }
    }
    let bodies: Vec<Value> = mock.requests().into_iter().map(|r| r.body).collect();
    assert_eq!(bodies.len(), 4);
    for pair in bodies.windows(2) {
        let (earlier, later) = (&pair[0], &pair[1]);
        let k = last_marked_message(earlier);
        assert_eq!(k, earlier["messages"].as_array().unwrap().len() - 1);
        assert_eq!(rendered_prefix(earlier, k), rendered_prefix(later, k));
        let block = later["messages"][k]["content"]
            .as_array()
            .unwrap()
            .last()
            .unwrap();
        assert_eq!(block["cache_control"], json!({"type": "ephemeral"}));
        assert!(paths(later).len() <= 4);
    }
    // The request bodies themselves are stable: the same transcript gives
    // the same bytes.
    let req = ChatRequest {
        messages: transcript.clone(),
        tools: tools(),
        ..ChatRequest::default()
    };
    let a = serde_json::to_string(&p.request_body(&req, true)).unwrap();
    let b = serde_json::to_string(&p.request_body(&req.clone(), true)).unwrap();
    assert_eq!(a, b);
}

/// An SSE `data:` payload.
fn ev(v: Value) -> String {
    v.to_string()
}

const SIGNATURE: &str = "EqQBCgIYAhIMa1b2c3d4e5f6g7h8GgwxYzIzNDU2Nzg5MDEi+/==";
const REDACTED: &str = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP";
const THOUGHT: &str = "The user wants the files; \"ls\" lists them.\nI'll call the tool.";

/// A streamed tool-use answer opening with a signed thinking block (its
/// text in two deltas, its signature in two) and a redacted one, with
/// cache usage in `message_start`.
fn thinking_stream() -> Vec<String> {
    let (a, b) = THOUGHT.split_at(20);
    let (s1, s2) = SIGNATURE.split_at(10);
    vec![
        ev(json!({"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-mock",
            "content": [], "stop_reason": null,
            "usage": {"input_tokens": 12, "output_tokens": 1,
                      "cache_creation_input_tokens": 2048, "cache_read_input_tokens": 4096}}})),
        ev(json!({"type": "content_block_start", "index": 0,
                  "content_block": {"type": "thinking", "thinking": "", "signature": ""}})),
        ev(json!({"type": "content_block_delta", "index": 0,
                  "delta": {"type": "thinking_delta", "thinking": a}})),
        ev(json!({"type": "content_block_delta", "index": 0,
                  "delta": {"type": "thinking_delta", "thinking": b}})),
        ev(json!({"type": "content_block_delta", "index": 0,
                  "delta": {"type": "signature_delta", "signature": s1}})),
        ev(json!({"type": "content_block_delta", "index": 0,
                  "delta": {"type": "signature_delta", "signature": s2}})),
        ev(json!({"type": "content_block_stop", "index": 0})),
        ev(json!({"type": "content_block_start", "index": 1,
                  "content_block": {"type": "redacted_thinking", "data": REDACTED}})),
        ev(json!({"type": "content_block_stop", "index": 1})),
        ev(json!({"type": "content_block_start", "index": 2,
                  "content_block": {"type": "tool_use", "id": "toolu_9", "name": "terminal", "input": {}}})),
        ev(json!({"type": "content_block_delta", "index": 2,
                  "delta": {"type": "input_json_delta", "partial_json": "{\"arg\": \"ls\"}"}})),
        ev(json!({"type": "content_block_stop", "index": 2})),
        ev(
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                  "usage": {"output_tokens": 40}}),
        ),
        ev(json!({"type": "message_stop"})),
    ]
}

#[tokio::test]
async fn a_streamed_tool_loop_replays_the_signed_thinking_unchanged() {
    let mock = MockAnthropic::start().await;
    mock.push(Reply::raw_sse(thinking_stream()));
    mock.push(Reply::text("There are two files."));
    let p = provider(&mock, true);
    let mut transcript = vec![
        Message::system("sys"),
        Message::user("what files are here?"),
    ];
    let req = ChatRequest {
        messages: transcript.clone(),
        tools: tools(),
        ..ChatRequest::default()
    };
    let first = send(&p, &req).await;
    assert_eq!(
        first.message.thinking,
        vec![
            ThinkingBlock::Thinking {
                thinking: THOUGHT.into(),
                signature: SIGNATURE.into(),
            },
            ThinkingBlock::RedactedThinking {
                data: REDACTED.into()
            },
        ]
    );
    assert_eq!(first.message.reasoning.as_deref(), Some(THOUGHT));
    assert_eq!(first.message.tool_calls.len(), 1);
    assert_eq!(
        (
            first.usage.cache_write_tokens,
            first.usage.cache_read_tokens
        ),
        (2048, 4096)
    );

    // The loop goes on: the assistant row (as stored, through serde, the
    // way the transcript keeps it) and the tool's result.
    let stored: Message =
        serde_json::from_str(&serde_json::to_string(&first.message).unwrap()).unwrap();
    assert_eq!(stored, first.message);
    transcript.push(stored);
    transcript.push(Message::tool_result("toolu_9", "terminal", "a.txt b.txt"));
    let req = ChatRequest {
        messages: transcript,
        tools: tools(),
        ..ChatRequest::default()
    };
    let second = send(&p, &req).await;
    assert_eq!(second.message.content, "There are two files.");

    let body = &mock.requests()[1].body;
    let assistant = &body["messages"][1];
    assert_eq!(assistant["role"], "assistant");
    let blocks = assistant["content"].as_array().unwrap();
    // First and unchanged, byte for byte: the thinking text and signature
    // as streamed, the redacted payload as sent, then the call.
    assert_eq!(
        blocks[0],
        json!({"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE})
    );
    assert_eq!(
        blocks[0].to_string(),
        json!({"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE}).to_string()
    );
    assert_eq!(
        blocks[1],
        json!({"type": "redacted_thinking", "data": REDACTED})
    );
    assert_eq!(blocks[2]["type"], "tool_use");
    assert_eq!(blocks[2]["id"], "toolu_9");
    assert_eq!(blocks.len(), 3);
}

#[tokio::test]
async fn a_whole_answer_keeps_its_signed_thinking_too() {
    let mock = MockAnthropic::start().await;
    // The mock's non-streamed thinking block is signed `mock-signature`.
    mock.push(
        Reply::tool_calls(vec![ToolCallReply::new("toolu_1", "terminal", "{}")])
            .with_reasoning("think first"),
    );
    mock.push(Reply::text("done"));
    let p = provider(&mock, false);
    let mut transcript = vec![Message::user("go")];
    let first = send(
        &p,
        &ChatRequest {
            messages: transcript.clone(),
            tools: tools(),
            ..ChatRequest::default()
        },
    )
    .await;
    assert_eq!(
        first.message.thinking,
        vec![ThinkingBlock::Thinking {
            thinking: "think first".into(),
            signature: "mock-signature".into(),
        }]
    );
    transcript.push(first.message);
    transcript.push(Message::tool_result("toolu_1", "terminal", "ok"));
    send(
        &p,
        &ChatRequest {
            messages: transcript,
            tools: tools(),
            ..ChatRequest::default()
        },
    )
    .await;
    let sent = &mock.requests()[1].body["messages"][1]["content"][0];
    assert_eq!(
        sent,
        &json!({"type": "thinking", "thinking": "think first", "signature": "mock-signature"})
    );
}

#[tokio::test]
async fn unsigned_thinking_is_read_but_not_replayed() {
    let mock = MockAnthropic::start().await;
    // The streaming mock sends thinking without a signature, as some
    // compatible servers do; sending it back would be refused.
    mock.push(Reply::text("hi").with_reasoning("musing"));
    let p = provider(&mock, true);
    let r = send(
        &p,
        &ChatRequest {
            messages: vec![Message::user("hello")],
            ..ChatRequest::default()
        },
    )
    .await;
    assert_eq!(r.message.reasoning.as_deref(), Some("musing"));
    assert!(r.message.thinking.is_empty());
    assert_eq!(r.message.role, Role::Assistant);
}
