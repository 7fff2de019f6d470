use std::sync::Mutex;

use serde_json::json;

use super::*;

type Assembled = Result<(Message, Usage), (ErrorKind, String)>;

fn run(chunks: &[Value]) -> (Assembled, Vec<StreamEvent>) {
    let seen = Mutex::new(Vec::new());
    let sink = |e: StreamEvent| seen.lock().unwrap().push(e);
    let mut acc = ChunkAccumulator::new();
    for c in chunks {
        acc.apply(c, &sink);
    }
    acc.done = true;
    let r = acc.into_response();
    (r, seen.into_inner().unwrap())
}

fn delta(d: Value) -> Value {
    json!({"choices": [{"index": 0, "delta": d, "finish_reason": null}]})
}

fn tc(v: Value) -> Value {
    delta(json!({"tool_calls": [v]}))
}

#[test]
fn name_is_assigned_and_arguments_appended() {
    let (r, events) = run(&[
        tc(json!({"index": 0, "id": "c1", "function": {"name": "termi", "arguments": ""}})),
        tc(json!({"index": 0, "function": {"name": "terminal", "arguments": "{\"cmd\":"}})),
        tc(json!({"index": 0, "function": {"arguments": "\"ls\"}"}})),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
    ]);
    let (m, _) = r.unwrap();
    assert_eq!(m.tool_calls.len(), 1);
    assert_eq!(m.tool_calls[0].name, "terminal");
    assert_eq!(m.tool_calls[0].arguments, r#"{"cmd":"ls"}"#);
    assert_eq!(m.finish_reason.as_deref(), Some("tool_calls"));
    // Announced once, with the first name seen.
    assert_eq!(
        events,
        vec![StreamEvent::ToolCallStarted {
            name: "termi".into()
        }]
    );
}

#[test]
fn same_index_with_new_id_opens_a_new_slot() {
    let (r, _) = run(&[
        tc(json!({"index": 0, "id": "a", "function": {"name": "one", "arguments": "{}"}})),
        tc(json!({"index": 0, "id": "b", "function": {"name": "two", "arguments": "{\"x\":"}})),
        tc(json!({"index": 0, "function": {"arguments": "1}"}})),
        tc(json!({"index": 1, "id": "c", "function": {"name": "three", "arguments": "{}"}})),
    ]);
    let (m, _) = r.unwrap();
    let got: Vec<_> = m
        .tool_calls
        .iter()
        .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("a", "one", "{}"),
            ("b", "two", "{\"x\":1}"),
            ("c", "three", "{}")
        ]
    );
}

#[test]
fn integer_ids_missing_index_and_last_id_wins() {
    let (r, _) = run(&[
        tc(json!({"id": 7, "function": {"name": "f", "arguments": "{"}})),
        tc(json!({"id": "", "function": {"arguments": "}"}})),
    ]);
    let (m, _) = r.unwrap();
    assert_eq!(m.tool_calls[0].id, "7");
    assert_eq!(m.tool_calls[0].arguments, "{}");
}

#[test]
fn reasoning_text_usage_and_last_finish_reason() {
    let (r, events) = run(&[
        delta(json!({"reasoning_content": "think "})),
        delta(json!({"reasoning": "more"})),
        delta(json!({"content": "Hel"})),
        delta(json!({"content": "lo"})),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": ""}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3,
               "prompt_tokens_details": {"cached_tokens": 2},
               "completion_tokens_details": {"reasoning_tokens": 1}}}),
    ]);
    let (m, u) = r.unwrap();
    assert_eq!(m.content, "Hello");
    assert_eq!(m.reasoning.as_deref(), Some("think more"));
    assert_eq!(m.finish_reason.as_deref(), Some("stop"));
    assert_eq!(
        u,
        Usage {
            input_tokens: 10,
            output_tokens: 3,
            cache_read_tokens: 2,
            cache_write_tokens: 0,
            reasoning_tokens: 1
        }
    );
    assert_eq!(events[0], StreamEvent::Reasoning("think ".into()));
    assert_eq!(events[2], StreamEvent::Text("Hel".into()));
}

#[test]
fn broken_arguments_are_repaired_or_kept_raw() {
    let (r, _) = run(&[
        tc(json!({"index": 0, "id": "a", "function": {"name": "f", "arguments": "{\"a\": [1,"}})),
        tc(json!({"index": 1, "id": "b", "function": {"name": "g", "arguments": "oops"}})),
    ]);
    let (m, _) = r.unwrap();
    assert_eq!(m.tool_calls[0].arguments, "{\"a\": [1]}");
    assert_eq!(m.tool_calls[1].arguments, "oops");
}

#[test]
fn a_dropped_stream_mid_call_is_retryable() {
    let mut acc = ChunkAccumulator::new();
    acc.apply(
        &tc(json!({"id": "a", "function": {"name": "f", "arguments": "nope"}})),
        &|_| {},
    );
    let e = acc.into_response().unwrap_err();
    assert_eq!(e.0, ErrorKind::Network);
}

#[test]
fn an_empty_stream_is_an_error() {
    assert_eq!(
        ChunkAccumulator::new().into_response().unwrap_err().0,
        ErrorKind::ServerError
    );
}

#[test]
fn transcript_conversion() {
    let msgs = vec![
        Message::system("sys"),
        Message::user("hi"),
        Message {
            reasoning: Some("secret thoughts".into()),
            ..Message::assistant_tool_calls(
                "",
                vec![ToolCall {
                    id: "c1".into(),
                    name: "ls".into(),
                    arguments: "{}".into(),
                }],
            )
        },
        Message::tool_result("c1", "ls", "a b"),
    ];
    let out = to_openai_messages(&msgs);
    assert_eq!(out[2]["content"], Value::Null);
    assert_eq!(out[2]["tool_calls"][0]["type"], "function");
    assert_eq!(out[2]["tool_calls"][0]["function"]["name"], "ls");
    assert!(!out[2].to_string().contains("secret thoughts"));
    assert_eq!(
        out[3],
        json!({"role": "tool", "tool_call_id": "c1", "content": "a b"})
    );
}

#[test]
fn the_request_body_has_the_chat_completions_shape() {
    let endpoint = Endpoint {
        provider: ProviderKind::Custom,
        model: "m-1".into(),
        base_url: "http://127.0.0.1:9/v1".into(),
        api_key: None,
    };
    let p = OpenAiProvider::new(&endpoint, HttpOptions::default());
    let req = ChatRequest {
        messages: vec![Message::system("be brief"), Message::user("hi")],
        tools: vec![ToolSpec {
            name: "terminal".into(),
            description: "Run a command.".into(),
            parameters: json!({"type": "object", "properties": {"command": {"type": "string"}}}),
        }],
        max_tokens: Some(64),
        temperature: None,
    };
    let body = serde_json::to_value(p.request_body(&req, true)).unwrap();
    assert_eq!(
        body,
        json!({
            "model": "m-1",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
            ],
            "tools": [{"type": "function", "function": {
                "name": "terminal",
                "description": "Run a command.",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            }}],
            "max_tokens": 64,
            "stream": true,
            "stream_options": {"include_usage": true},
        })
    );
    let plain = ChatRequest {
        tools: Vec::new(),
        max_tokens: None,
        ..req
    };
    let body = serde_json::to_value(p.request_body(&plain, false)).unwrap();
    let keys: Vec<&String> = body.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["messages", "model"], "nothing unset is sent");
}
