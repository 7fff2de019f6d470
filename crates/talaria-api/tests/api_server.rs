//! End-to-end tests of the OpenAI-compatible API server: a real HTTP client
//! against the server on 127.0.0.1, the real agent and SQLite store, and
//! the mock model server.

use crate::api_support;

use std::time::{Duration, Instant};

use api_support::{KEY, conversation, parse_sse, rig, rig_with};
use futures::StreamExt;
use serde_json::{Value, json};
use talaria_api::ApiServerConfig;
use talaria_api::{ApiServerError, ApiServerSettings};
use talaria_core::{Env, Role, Secret};
use talaria_testkit::wait::wait_for;
use talaria_testkit::{Reply, ToolCallReply};

fn user(text: &str) -> Value {
    json!({"model": "test-model", "messages": [{"role": "user", "content": text}]})
}

/// Asks until the one run slot admits a request (429 while the previous
/// run holds it); the answer's JSON.
async fn admitted(rig: &api_support::Rig) -> Value {
    wait_for("a request admitted once the slot is free", || async {
        let resp = rig.chat(&user("are you there?"), &[]).await;
        match resp.status().as_u16() {
            200 => Ok(resp.json::<Value>().await.unwrap()),
            429 => Err(429),
            other => panic!("neither admitted nor refused as busy: {other}"),
        }
    })
    .await
}

fn session_header(resp: &reqwest::Response) -> Option<String> {
    resp.headers()
        .get("x-talaria-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread")]
async fn health_needs_no_key() {
    let rig = rig(0).await;
    let resp = rig.client.get(rig.url("/health")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["status"], "ok");
    assert_eq!(body["platform"], "talaria");
    assert_eq!(body["version"], env!("CARGO_PKG_VERSION"));
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn models_lists_the_agent_model() {
    let rig = rig(0).await;
    let resp = rig
        .client
        .get(rig.url("/v1/models"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"][0]["id"], "test-model");
    assert_eq!(body["data"][0]["object"], "model");
    assert_eq!(body["data"][0]["owned_by"], "talaria");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_or_missing_key_is_401_and_reaches_no_model() {
    let rig = rig(0).await;
    let expected = json!({"error": {
        "message": "Invalid API key",
        "type": "invalid_request_error",
        "code": "invalid_api_key",
    }});
    let wrong = rig
        .client
        .post(rig.url("/v1/chat/completions"))
        .bearer_auth("test-key-0123456789abcdeX")
        .json(&user("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    assert_eq!(wrong.json::<Value>().await.unwrap(), expected);

    let missing = rig
        .client
        .post(rig.url("/v1/chat/completions"))
        .json(&user("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 401);
    assert_eq!(missing.json::<Value>().await.unwrap(), expected);

    let models = rig
        .client
        .get(rig.url("/v1/models"))
        .bearer_auth("short")
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 401);
    assert!(rig.mock.requests().is_empty());
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn non_streaming_turn_returns_the_answer_usage_and_session_header() {
    let rig = rig(0).await;
    rig.mock
        .push(Reply::text("Hello from the agent.").with_usage(12, 7));
    let resp = rig.chat(&user("say hello"), &[]).await;
    assert_eq!(resp.status(), 200);
    let session = session_header(&resp).expect("session header");
    assert!(session.starts_with("api-"), "{session}");
    assert_eq!(
        resp.headers()
            .get("x-hermes-session-id")
            .and_then(|v| v.to_str().ok()),
        Some(session.as_str())
    );
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["object"], "chat.completion");
    assert!(
        body["id"].as_str().unwrap().starts_with("chatcmpl-"),
        "{body}"
    );
    assert!(body["created"].as_u64().unwrap() > 0);
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Hello from the agent."
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["usage"]["prompt_tokens"], 12);
    assert_eq!(body["usage"]["completion_tokens"], 7);
    assert_eq!(body["usage"]["total_tokens"], 19);

    let stored = rig.stored(&session).await;
    assert_eq!(stored.len(), 2, "{stored:#?}");
    assert_eq!(stored[0].content, "say hello");
    assert_eq!(stored[1].content, "Hello from the agent.");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn array_content_parts_are_joined_into_the_input() {
    let rig = rig(0).await;
    rig.mock.push(Reply::text("ok"));
    let body = json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "first part"},
        {"type": "text", "text": "second part"},
    ]}]});
    let resp = rig.chat(&body, &[]).await;
    assert_eq!(resp.status(), 200);
    let sent = conversation(&rig.sent_messages(0));
    assert_eq!(
        sent,
        vec![("user".to_owned(), "first part\nsecond part".to_owned())]
    );
    // An image part must carry its bytes or an http(s) URL (fetched
    // through the URL guard, tested through the binary in
    // talaria-cli/tests/web.rs): a data URL without base64 content, or
    // another scheme, is refused in words, and no turn runs. So is any
    // file sent to a server without the media services.
    for (url, said) in [
        ("data:,", "data: URL"),
        ("file:///etc/passwd", "data: URL"),
        ("https://example.com/cat.png", "does not take files"),
    ] {
        let body = json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": url}},
        ]}]});
        let resp = rig.chat(&body, &[]).await;
        assert_eq!(resp.status(), 400, "{url}");
        let error: serde_json::Value = resp.json().await.unwrap();
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(said), "{url}: {message}");
    }
    assert_eq!(rig.mock.requests().len(), 1);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn streaming_sends_role_first_then_deltas_then_done() {
    let rig = rig(0).await;
    let answer = "Streaming answers arrive in several small pieces, in order.";
    rig.mock.push(Reply::text(answer).with_usage(20, 9));
    let mut body = user("stream please");
    body["stream"] = json!(true);
    let resp = rig.chat(&body, &[]).await;
    assert_eq!(resp.status(), 200);
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    assert!(
        header("content-type")
            .unwrap_or_default()
            .starts_with("text/event-stream")
    );
    assert_eq!(header("cache-control").as_deref(), Some("no-cache"));
    assert_eq!(header("x-accel-buffering").as_deref(), Some("no"));
    assert!(header("x-talaria-session-id").is_some());

    let text = resp.text().await.unwrap();
    let frames = parse_sse(&text);
    assert!(frames.len() >= 4, "{text}");
    let first = frames[0].json();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"], json!({"role": "assistant"}));
    assert_eq!(first["choices"][0]["finish_reason"], Value::Null);
    assert!(first["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(first["model"], "test-model");

    let last = frames.last().unwrap();
    assert_eq!(last.data.as_deref(), Some("[DONE]"), "{text}");
    let fin = frames[frames.len() - 2].json();
    assert_eq!(fin["choices"][0]["delta"], json!({}));
    assert_eq!(fin["choices"][0]["finish_reason"], "stop");
    assert_eq!(fin["usage"]["prompt_tokens"], 20);
    assert_eq!(fin["usage"]["completion_tokens"], 9);
    assert_eq!(fin["usage"]["total_tokens"], 29);
    assert_eq!(fin["id"], first["id"]);

    let deltas: Vec<String> = frames[1..frames.len() - 2]
        .iter()
        .map(|f| {
            let v = f.json();
            assert_eq!(v["choices"][0]["finish_reason"], Value::Null);
            v["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(deltas.len() > 1, "expected several deltas: {deltas:?}");
    assert_eq!(deltas.concat(), answer);
    rig.stop().await;
}

fn todo_call() -> Reply {
    Reply::tool_calls(vec![ToolCallReply::new(
        "call_1",
        "todo",
        r#"{"todos":[{"id":"1","content":"write the tests","status":"in_progress"}]}"#,
    )])
}

#[tokio::test(flavor = "multi_thread")]
async fn streaming_a_tool_call_reports_tool_progress_to_clients_that_ask() {
    let rig = rig(0).await;
    rig.mock.push(todo_call());
    rig.mock.push(Reply::text("Planned."));
    let mut body = user("plan the work");
    body["stream"] = json!(true);
    let resp = rig
        .chat(&body, &[("X-Talaria-Tool-Progress", "true")])
        .await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let frames = parse_sse(&text);
    let progress: Vec<Value> = frames
        .iter()
        .filter(|f| f.event.as_deref() == Some("talaria.tool.progress"))
        .map(|f| f.json())
        .collect();
    assert_eq!(
        progress,
        vec![
            json!({"tool": "todo", "status": "running"}),
            json!({"tool": "todo", "status": "completed", "ok": true}),
        ],
        "{text}"
    );
    let content: String = frames
        .iter()
        .filter(|f| f.event.is_none() && f.data.as_deref() != Some("[DONE]"))
        .filter_map(|f| {
            f.json()["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(content, "Planned.");
    assert_eq!(frames.last().unwrap().data.as_deref(), Some("[DONE]"));
    assert_eq!(rig.mock.requests().len(), 2);
    rig.stop().await;
}

/// What the official OpenAI SDK found: it turns every named event into a
/// chunk, so a progress event became a chunk with `choices: None` and the
/// standard `chunk.choices[0].delta.content` loop crashed. By default every
/// data frame is a chunk with a choice (or `[DONE]`), and progress travels
/// as comments.
#[tokio::test(flavor = "multi_thread")]
async fn by_default_a_streamed_tool_turn_sends_only_chunks() {
    let rig = rig(0).await;
    rig.mock.push(todo_call());
    rig.mock.push(Reply::text("Planned."));
    let mut body = user("plan the work");
    body["stream"] = json!(true);
    let resp = rig.chat(&body, &[]).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let frames = parse_sse(&text);
    assert!(frames.iter().all(|f| f.event.is_none()), "{text}");
    let mut content = String::new();
    for f in frames.iter().filter(|f| f.data.is_some()) {
        if f.data.as_deref() == Some("[DONE]") {
            continue;
        }
        let chunk = f.json();
        assert_eq!(chunk["object"], "chat.completion.chunk", "{text}");
        let delta = &chunk["choices"][0]["delta"];
        assert!(delta.is_object(), "a chunk without a choice: {text}");
        content.push_str(delta["content"].as_str().unwrap_or(""));
    }
    assert_eq!(content, "Planned.");
    let progress: Vec<Value> = frames
        .iter()
        .filter_map(|f| f.comment.as_deref()?.strip_prefix("talaria.tool.progress "))
        .map(|c| serde_json::from_str(c).unwrap())
        .collect();
    assert_eq!(
        progress,
        vec![
            json!({"tool": "todo", "status": "running"}),
            json!({"tool": "todo", "status": "completed", "ok": true}),
        ],
        "{text}"
    );
    assert_eq!(frames.last().unwrap().data.as_deref(), Some("[DONE]"));
    rig.stop().await;
}

/// A failed stream used to end with `finish_reason: "error"`, which is not
/// one of OpenAI's values. It now ends as OpenAI's does: an error frame,
/// no invented finish reason, no `[DONE]`.
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_whose_model_fails_midway_ends_with_an_error_frame() {
    let rig = rig(0).await;
    rig.mock.push(Reply::raw_sse(vec![
        json!({"choices": [{"index": 0, "delta": {"content": "Half an ans"}}]}).to_string(),
        json!({"error": {"message": "the model fell over", "code": 400}}).to_string(),
    ]));
    let mut body = user("answer me");
    body["stream"] = json!(true);
    let resp = rig.chat(&body, &[]).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let frames = parse_sse(&text);
    let data: Vec<&str> = frames.iter().filter_map(|f| f.data.as_deref()).collect();
    assert!(!data.contains(&"[DONE]"), "{text}");
    assert!(!text.contains(r#""finish_reason":"error""#), "{text}");
    let last = frames
        .iter()
        .rev()
        .find(|f| f.data.is_some())
        .unwrap()
        .json();
    assert_eq!(last["error"]["code"], "agent_incomplete", "{text}");
    assert_eq!(last["error"]["type"], "server_error");
    assert!(last.get("choices").is_none(), "{text}");
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("HTTP 400"),
        "{text}"
    );
    // A short sentence of ours: the server's own text (which may carry a
    // URL or a key) stays in the redacted log.
    assert!(!text.contains("the model fell over"), "{text}");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_is_retrieved_by_id_and_an_unknown_one_is_404() {
    let rig = rig(0).await;
    let get = |id: &str| {
        rig.client
            .get(rig.url(&format!("/v1/models/{id}")))
            .bearer_auth(KEY)
            .send()
    };
    let resp = get("test-model").await.unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["id"], "test-model");
    assert_eq!(body["object"], "model");
    assert_eq!(body["owned_by"], "talaria");
    assert!(body["created"].as_u64().unwrap() > 0);

    let resp = get("gpt-unknown").await.unwrap();
    assert_eq!(resp.status(), 404);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "model_not_found");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("gpt-unknown")
    );
    let unauthorized = rig
        .client
        .get(rig.url("/v1/models/test-model"))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthorized.status(), 401);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn session_header_continues_the_stored_history() {
    let rig = rig(0).await;
    for (header, id) in [
        ("X-Talaria-Session-Id", "s1"),
        ("X-Hermes-Session-Id", "h1"),
    ] {
        let before = rig.mock.requests().len();
        rig.mock.push(Reply::text(format!("first answer {id}")));
        rig.mock.push(Reply::text(format!("second answer {id}")));
        let resp = rig
            .chat(&user(&format!("remember pelican {id}")), &[(header, id)])
            .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(session_header(&resp).as_deref(), Some(id));
        // The client sends only the new message: the history is the store's.
        let resp = rig.chat(&user("which word?"), &[(header, id)]).await;
        assert_eq!(resp.status(), 200);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(
            body["choices"][0]["message"]["content"],
            format!("second answer {id}")
        );
        let sent = conversation(&rig.sent_messages(before + 1));
        assert_eq!(
            sent,
            vec![
                ("user".to_owned(), format!("remember pelican {id}")),
                ("assistant".to_owned(), format!("first answer {id}")),
                ("user".to_owned(), "which word?".to_owned()),
            ]
        );
        let record = rig.store_session(id).await;
        assert_eq!(record.source, "api_server");
        assert!(record.system_prompt.is_some());
    }
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_header_session_starts_from_the_clients_history() {
    let rig = rig(0).await;
    rig.mock.push(Reply::text("third answer"));
    let body = json!({"model": "test-model", "messages": [
        {"role": "user", "content": "my cat is called Miso"},
        {"role": "assistant", "content": "Nice name."},
        {"role": "user", "content": "what is my cat called?"},
    ]});
    let resp = rig
        .chat(&body, &[("X-Talaria-Session-Id", "fresh-1")])
        .await;
    assert_eq!(resp.status(), 200);
    let sent = conversation(&rig.sent_messages(0));
    assert_eq!(
        sent,
        vec![
            ("user".to_owned(), "my cat is called Miso".to_owned()),
            ("assistant".to_owned(), "Nice name.".to_owned()),
            ("user".to_owned(), "what is my cat called?".to_owned()),
        ]
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_session_headers_are_400_and_reach_no_model() {
    let rig = rig(0).await;
    let long = "a".repeat(257);
    for (value, message) in [
        ("../x", "Invalid session ID"),
        ("a/b", "Invalid session ID"),
        ("a\\b", "Invalid session ID"),
        (long.as_str(), "Session ID too long"),
    ] {
        let resp = rig
            .chat(&user("hi"), &[("X-Talaria-Session-Id", value)])
            .await;
        assert_eq!(resp.status(), 400, "{value}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["message"], message, "{value}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }
    let resp = rig
        .chat(&user("hi"), &[("X-Hermes-Session-Id", "..")])
        .await;
    assert_eq!(resp.status(), 400);
    assert!(rig.mock.requests().is_empty());
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_requests_are_400_and_oversized_ones_413() {
    let rig = rig(0).await;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"{not json".to_vec(), "invalid_json"),
        (br#"{"model":"m"}"#.to_vec(), "missing_messages"),
        (br#"{"messages":[]}"#.to_vec(), "missing_messages"),
        (
            br#"{"messages":[{"role":"system","content":"only a system prompt"}]}"#.to_vec(),
            "no_user_message",
        ),
    ];
    for (body, code) in cases {
        let resp = rig
            .client
            .post(rig.url("/v1/chat/completions"))
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{code}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], code);
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }

    let big = json!({"messages": [{"role": "user", "content": "x".repeat(11 * 1024 * 1024)}]});
    let resp = rig
        .client
        .post(rig.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&big)
        .send()
        .await;
    // The server may answer before it has read the whole body; either way
    // the request must not reach the model.
    if let Ok(resp) = resp {
        assert_eq!(resp.status(), 413);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "request_too_large");
    }
    assert!(rig.mock.requests().is_empty());
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resent_history_continues_its_stored_session() {
    let rig = rig(0).await;
    rig.mock.push(Reply::text("answer A"));
    rig.mock.push(Reply::text("answer B"));
    let system = json!({"role": "system", "content": "You are terse."});
    let first = json!({"messages": [system, {"role": "user", "content": "question A"}]});
    let resp = rig.chat(&first, &[]).await;
    assert_eq!(resp.status(), 200);
    let id = session_header(&resp).unwrap();

    let second = json!({"messages": [
        system,
        {"role": "user", "content": "question A"},
        {"role": "assistant", "content": "answer A"},
        {"role": "user", "content": "question B"},
    ]});
    let resp = rig.chat(&second, &[]).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(session_header(&resp), Some(id.clone()));
    // The earlier turns come from the store, once each.
    let sent = conversation(&rig.sent_messages(1));
    assert_eq!(
        sent,
        pairs(&[
            ("user", "question A"),
            ("assistant", "answer A"),
            ("user", "question B"),
        ])
    );
    let stored: Vec<(Role, String)> = rig
        .stored(&id)
        .await
        .into_iter()
        .map(|m| (m.role, m.content))
        .collect();
    assert_eq!(
        stored,
        vec![
            (Role::User, "question A".to_owned()),
            (Role::Assistant, "answer A".to_owned()),
            (Role::User, "question B".to_owned()),
            (Role::Assistant, "answer B".to_owned()),
        ]
    );

    // A conversation the server has never seen is stored before its last
    // message runs, so the model sees all of it.
    rig.mock.push(Reply::text("answer D"));
    let fresh = json!({"messages": [
        {"role": "user", "content": "question C"},
        {"role": "assistant", "content": "answer C"},
        {"role": "user", "content": "question D"},
    ]});
    let resp = rig.chat(&fresh, &[]).await;
    assert_eq!(resp.status(), 200);
    let fresh_id = session_header(&resp).unwrap();
    assert_ne!(fresh_id, id);
    assert_eq!(
        conversation(&rig.sent_messages(2)),
        pairs(&[
            ("user", "question C"),
            ("assistant", "answer C"),
            ("user", "question D"),
        ])
    );
    assert_eq!(rig.stored(&fresh_id).await.len(), 4);

    // A history that continues the first conversation but with an answer
    // we never gave is another conversation: it is not stored in the first.
    rig.mock.push(Reply::text("answer E"));
    let edited = json!({"messages": [
        system,
        {"role": "user", "content": "question A"},
        {"role": "assistant", "content": "an answer the client edited"},
        {"role": "user", "content": "question E"},
    ]});
    let resp = rig.chat(&edited, &[]).await;
    assert_eq!(resp.status(), 200);
    assert_ne!(session_header(&resp), Some(id.clone()));
    assert_eq!(
        conversation(&rig.sent_messages(3)),
        pairs(&[
            ("user", "question A"),
            ("assistant", "an answer the client edited"),
            ("user", "question E"),
        ])
    );
    assert_eq!(rig.stored(&id).await.len(), 4);
    rig.stop().await;
}

/// The session's row count is worked out from the turn, not read back:
/// a turn of several rows (a tool call) on a seeded new session must still
/// leave an index entry the client's resend matches.
#[tokio::test(flavor = "multi_thread")]
async fn a_resent_history_continues_after_a_tool_turn_on_a_seeded_session() {
    let rig = rig(0).await;
    rig.mock.push(todo_call());
    rig.mock.push(Reply::text("planned"));
    let opening = vec![
        json!({"role": "user", "content": "hello"}),
        json!({"role": "assistant", "content": "hi"}),
        json!({"role": "user", "content": "make a plan"}),
    ];
    let resp = rig.chat(&json!({"messages": opening}), &[]).await;
    assert_eq!(resp.status(), 200);
    let id = session_header(&resp).unwrap();
    // Two seeded rows, then user, tool call, tool result, answer.
    assert_eq!(rig.store_session(&id).await.message_count, 6);

    rig.mock.push(Reply::text("done"));
    let mut resend = opening.clone();
    resend.push(json!({"role": "assistant", "content": "planned"}));
    resend.push(json!({"role": "user", "content": "go on"}));
    let resp = rig.chat(&json!({"messages": resend}), &[]).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(session_header(&resp), Some(id.clone()));
    assert_eq!(rig.store_session(&id).await.message_count, 8);
    rig.stop().await;
}

/// A compression rewrites the transcript, adding rows no count of the
/// turn's own knows about: the conversation still continues its session.
#[tokio::test(flavor = "multi_thread")]
async fn a_resent_history_continues_after_its_turn_compressed_the_session() {
    let rig = rig_with(0, |c| {
        c.model.context_length = 4096;
        c.compression.threshold = 0.5;
        c.compression.protect_first_n = 1;
        c.compression.protect_last_n = 2;
    })
    .await;
    rig.mock.push(Reply::text(
        "## Goal\nChat.\n## Progress\nA long answer was given.",
    ));
    rig.mock.push(Reply::text("answer three"));
    let opening = vec![
        json!({"role": "user", "content": "one"}),
        json!({"role": "assistant", "content": "y".repeat(10_000)}),
        json!({"role": "user", "content": "two"}),
        json!({"role": "assistant", "content": "ok"}),
        json!({"role": "user", "content": "three"}),
    ];
    let resp = rig.chat(&json!({"messages": opening}), &[]).await;
    assert_eq!(resp.status(), 200);
    let id = session_header(&resp).unwrap();
    // The first request was the summary: the turn compressed.
    assert!(rig.mock.requests()[0].body.get("tools").is_none());

    rig.mock.push(Reply::text("answer four"));
    let mut resend = opening.clone();
    resend.push(json!({"role": "assistant", "content": "answer three"}));
    resend.push(json!({"role": "user", "content": "four"}));
    let resp = rig.chat(&json!({"messages": resend}), &[]).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(session_header(&resp), Some(id));
    // The model got the compressed transcript, not the long answer again.
    let sent = rig.sent_messages(2);
    assert!(
        sent.iter()
            .all(|m| m["content"].as_str().is_none_or(|c| c.len() < 5_000))
    );
    rig.stop().await;
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(r, c)| ((*r).to_owned(), (*c).to_owned()))
        .collect()
}

/// The privacy bug as found: every header-less request that opened with the
/// same words was mapped to one stored session, so a new client opening
/// with "hi" got another client's whole conversation in its model request.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_client_opening_with_hi_gets_nothing_of_another_clients_conversation() {
    let rig = rig(0).await;
    rig.mock.push(Reply::text("Hello! How can I help?"));
    rig.mock.push(Reply::text("Noted."));
    let first = json!({"messages": [{"role": "user", "content": "hi"}]});
    let resp = rig.chat(&first, &[]).await;
    assert_eq!(resp.status(), 200);
    let alice = session_header(&resp).unwrap();
    let secret = json!({"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "my bank PIN is 4711"},
    ]});
    let resp = rig.chat(&secret, &[]).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(session_header(&resp), Some(alice.clone()));

    // Bob opens the same way.
    rig.mock.push(Reply::text("Hello! How can I help?"));
    let resp = rig.chat(&first, &[]).await;
    assert_eq!(resp.status(), 200);
    let bob = session_header(&resp).unwrap();
    assert_ne!(bob, alice);
    assert_eq!(
        conversation(&rig.sent_messages(2)),
        pairs(&[("user", "hi")])
    );
    let sent = serde_json::to_string(&rig.mock.requests()[2].body).unwrap();
    assert!(!sent.contains("4711"), "{sent}");

    // Carol resends Alice's opening exchange word for word, then goes
    // elsewhere: the stored session has moved on since that answer, so she
    // gets exactly what she sent, not Alice's later turns.
    rig.mock.push(Reply::text("Sunny."));
    let carol = json!({"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "what is the weather?"},
    ]});
    let resp = rig.chat(&carol, &[]).await;
    assert_eq!(resp.status(), 200);
    assert_ne!(session_header(&resp), Some(alice.clone()));
    assert_eq!(
        conversation(&rig.sent_messages(3)),
        pairs(&[
            ("user", "hi"),
            ("assistant", "Hello! How can I help?"),
            ("user", "what is the weather?"),
        ])
    );
    let sent = serde_json::to_string(&rig.mock.requests()[3].body).unwrap();
    assert!(!sent.contains("4711"), "{sent}");
    assert_eq!(rig.stored(&alice).await.len(), 4);
    rig.stop().await;
}

/// The contention as found: 32 clients sending "hello" waited for each
/// other on one session lock. Each client's model request is held by the
/// mock; all of them reaching the mock while none has been answered means
/// they were in flight at once (one at a time, the second would arrive only
/// after the first answer).
#[tokio::test(flavor = "multi_thread")]
async fn identical_openings_run_in_parallel() {
    const CLIENTS: usize = 8;
    let rig = rig(0).await;
    for _ in 0..CLIENTS {
        rig.mock
            .push(Reply::text("Hello there.").with_delay(Duration::from_secs(4)));
    }
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let client = rig.client.clone();
            let url = rig.url("/v1/chat/completions");
            tokio::spawn(async move {
                client
                    .post(url)
                    .bearer_auth(KEY)
                    .json(&json!({"messages": [{"role": "user", "content": "hello"}]}))
                    .send()
                    .await
                    .unwrap()
            })
        })
        .collect();
    wait_for("every client's model request", || async {
        let n = rig.mock.requests().len();
        if n >= CLIENTS { Ok(()) } else { Err(n) }
    })
    .await;
    let answered = tasks.iter().filter(|t| t.is_finished()).count();
    assert_eq!(
        answered, 0,
        "{CLIENTS} model requests were not in flight at once"
    );
    let mut sessions = std::collections::HashSet::new();
    for task in tasks {
        let resp = task.await.unwrap();
        assert_eq!(resp.status(), 200);
        sessions.insert(session_header(&resp).unwrap());
    }
    assert_eq!(sessions.len(), CLIENTS);
    rig.stop().await;
}

/// The cost as found: each "hello" turn carried every earlier "hello"
/// conversation (the model request grew to 93 kB). Unrelated traffic now
/// leaves a new conversation's model request the same size.
#[tokio::test(flavor = "multi_thread")]
async fn the_model_request_does_not_grow_with_unrelated_traffic() {
    let rig = rig(0).await;
    let hello = json!({"messages": [{"role": "user", "content": "hello"}]});
    for i in 0..12 {
        rig.mock.push(Reply::text("Hello! How can I help?"));
        let resp = rig.chat(&hello, &[]).await;
        assert_eq!(resp.status(), 200, "turn {i}");
    }
    let sizes: Vec<usize> = rig
        .mock
        .requests()
        .iter()
        .map(|r| serde_json::to_string(&r.body["messages"]).unwrap().len())
        .collect();
    assert!(sizes.iter().all(|s| *s == sizes[0]), "{sizes:?}");
    for i in 0..12 {
        assert_eq!(
            conversation(&rig.sent_messages(i)),
            pairs(&[("user", "hello")])
        );
    }
    rig.stop().await;
}

/// A resent history continues its session across a restart: the index
/// lives in the store, not in the server's memory.
#[tokio::test(flavor = "multi_thread")]
async fn a_conversation_continues_after_the_server_restarts() {
    let rig = rig(0).await;
    rig.mock.push(Reply::text("first answer"));
    let resp = rig
        .chat(
            &json!({"messages": [{"role": "user", "content": "remember 17"}]}),
            &[],
        )
        .await;
    let id = session_header(&resp).unwrap();
    let rig = rig.restart().await;
    rig.mock.push(Reply::text("second answer"));
    let resp = rig
        .chat(
            &json!({"messages": [
                {"role": "user", "content": "remember 17"},
                {"role": "assistant", "content": "first answer"},
                {"role": "user", "content": "which number?"},
            ]}),
            &[],
        )
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(session_header(&resp), Some(id.clone()));
    assert_eq!(rig.stored(&id).await.len(), 4);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_turn_without_text_is_502() {
    let rig = rig(0).await;
    for _ in 0..3 {
        rig.mock.push(Reply::error(
            400,
            r#"{"error":{"message":"bad model request","type":"invalid_request_error"}}"#,
        ));
    }
    let resp = rig.chat(&user("hi"), &[]).await;
    assert_eq!(resp.status(), 502);
    assert!(session_header(&resp).is_some());
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "agent_incomplete");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrency_cap_refuses_with_429() {
    let rig = rig(1).await;
    rig.mock
        .push(Reply::text("slow answer").with_delay(Duration::from_secs(2)));
    let slow = {
        let client = rig.client.clone();
        let url = rig.url("/v1/chat/completions");
        tokio::spawn(async move {
            client
                .post(url)
                .bearer_auth(KEY)
                .json(&user("take your time"))
                .send()
                .await
                .unwrap()
        })
    };
    wait_for("the first run at the model", || async {
        if rig.mock.requests().is_empty() {
            Err("no request yet")
        } else {
            Ok(())
        }
    })
    .await;
    let resp = rig.chat(&user("me too"), &[]).await;
    assert_eq!(resp.status(), 429);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");

    let slow = slow.await.unwrap();
    assert_eq!(slow.status(), 200);
    // The slot is free again once the first run is over.
    rig.mock.push(Reply::text("fast answer"));
    assert_eq!(rig.chat(&user("now?"), &[]).await.status(), 200);
    assert_eq!(rig.mock.requests().len(), 2);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_disconnect_interrupts_a_stalled_stream() {
    let rig = rig(1).await;
    rig.mock
        .push(Reply::text("this answer starts but never finishes").stall_after(1));
    let mut body = user("tell me something long");
    body["stream"] = json!(true);
    let resp = rig
        .chat(&body, &[("X-Talaria-Session-Id", "stalled")])
        .await;
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.contains("\"content\"") {
        assert!(Instant::now() < deadline, "no content arrived: {seen}");
        match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
            Ok(Some(Ok(bytes))) => seen.push_str(&String::from_utf8_lossy(&bytes)),
            other => panic!("stream ended early: {other:?} after {seen}"),
        }
    }
    drop(stream);

    // The turn hung up on its stalled model stream, and the run slot,
    // freed only when the turn task ends, admits a second request.
    wait_for("the stalled turn to hang up on the model", || async {
        let n = rig.mock.hung_up();
        if n == 1 { Ok(()) } else { Err(n) }
    })
    .await;
    rig.mock.push(Reply::text("still healthy"));
    let v = admitted(&rig).await;
    assert_eq!(v["choices"][0]["message"]["content"], "still healthy");

    let stored = rig.stored("stalled").await;
    assert_eq!(stored[0].content, "tell me something long");
    assert!(
        stored
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .all(|m| m.finish_reason.as_deref() == Some("interrupted")),
        "an answer was stored as complete: {stored:#?}"
    );
    let health = rig.client.get(rig.url("/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_disconnect_interrupts_a_non_streamed_turn() {
    let rig = rig(1).await;
    rig.mock
        .push(Reply::text("this answer starts but never finishes").stall_after(1));
    // A client that gives up after a moment closes its connection.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(700))
        .build()
        .unwrap();
    let gave_up = impatient
        .post(rig.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .header("X-Talaria-Session-Id", "impatient")
        .json(&user("answer slowly"))
        .send()
        .await;
    assert!(gave_up.is_err(), "the stalled turn answered: {gave_up:?}");
    assert_eq!(rig.mock.requests().len(), 1);

    wait_for("the abandoned turn to hang up on the model", || async {
        let n = rig.mock.hung_up();
        if n == 1 { Ok(()) } else { Err(n) }
    })
    .await;
    rig.mock.push(Reply::text("still healthy"));
    let v = admitted(&rig).await;
    assert_eq!(v["choices"][0]["message"]["content"], "still healthy");
    let stored = rig.stored("impatient").await;
    assert!(
        stored
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .all(|m| m.finish_reason.as_deref() == Some("interrupted")),
        "{stored:#?}"
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_interrupts_open_streams() {
    let rig = rig(0).await;
    rig.mock.push(Reply::text("never ends").stall_after(1));
    let mut body = user("hang");
    body["stream"] = json!(true);
    let resp = rig.chat(&body, &[]).await;
    assert_eq!(resp.status(), 200);
    let reader = tokio::spawn(async move { resp.text().await });
    wait_for("the turn at the model", || async {
        if rig.mock.requests().is_empty() {
            Err("no request yet")
        } else {
            Ok(())
        }
    })
    .await;
    // `stop` fails the test if graceful shutdown waits on the stalled turn.
    rig.stop().await;
    let text = reader.await.unwrap().unwrap_or_default();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
}

#[test]
fn settings_refuse_a_short_or_missing_key() {
    let short = ApiServerConfig {
        key: Some(Secret::new("123456789012345")),
        ..ApiServerConfig::default()
    };
    let err = ApiServerSettings::from_config(&short, &Env::default()).unwrap_err();
    assert!(
        matches!(err, ApiServerError::KeyTooShort { len: 15 }),
        "{err}"
    );
    assert!(err.to_string().contains("16"), "{err}");

    let env_short = Env::from_pairs([("API_SERVER_KEY", "too-short")]);
    assert!(matches!(
        ApiServerSettings::from_config(&ApiServerConfig::default(), &env_short),
        Err(ApiServerError::KeyTooShort { len: 9 })
    ));

    let keyless = ApiServerConfig {
        enabled: Some(true),
        ..ApiServerConfig::default()
    };
    let err = ApiServerSettings::from_config(&keyless, &Env::default()).unwrap_err();
    assert!(matches!(err, ApiServerError::MissingKey), "{err}");
    assert!(err.to_string().contains("API_SERVER_KEY"), "{err}");
}

#[test]
fn settings_are_enabled_by_a_key_and_read_the_environment() {
    let none = ApiServerSettings::from_config(&ApiServerConfig::default(), &Env::default());
    assert!(matches!(none, Ok(None)));

    let env = Env::from_pairs([("API_SERVER_KEY", "0123456789abcdef")]);
    let s = ApiServerSettings::from_config(&ApiServerConfig::default(), &env)
        .unwrap()
        .unwrap();
    assert_eq!(s.host, "127.0.0.1");
    assert_eq!(s.port, 8642);
    assert_eq!(s.key.expose(), "0123456789abcdef");
    assert_eq!(s.max_concurrent_runs, 10);

    // A stray space around the key in `.env` does not lock every client out:
    // presented tokens are trimmed, so the key is too.
    let spaced = Env::from_pairs([("API_SERVER_KEY", "  0123456789abcdef \t")]);
    let s = ApiServerSettings::from_config(&ApiServerConfig::default(), &spaced)
        .unwrap()
        .unwrap();
    assert_eq!(s.key.expose(), "0123456789abcdef");

    let disabled = ApiServerConfig {
        enabled: Some(false),
        ..ApiServerConfig::default()
    };
    assert!(matches!(
        ApiServerSettings::from_config(&disabled, &env),
        Ok(None)
    ));

    let env = Env::from_pairs([
        ("API_SERVER_KEY", "0123456789abcdef"),
        ("API_SERVER_HOST", "0.0.0.0"),
        ("API_SERVER_PORT", "9000"),
    ]);
    let s = ApiServerSettings::from_config(&ApiServerConfig::default(), &env)
        .unwrap()
        .unwrap();
    assert_eq!((s.host.as_str(), s.port), ("0.0.0.0", 9000));
    let configured = ApiServerConfig {
        host: Some("localhost".into()),
        port: Some(7000),
        max_concurrent_runs: 0,
        ..ApiServerConfig::default()
    };
    let s = ApiServerSettings::from_config(&configured, &env)
        .unwrap()
        .unwrap();
    assert_eq!((s.host.as_str(), s.port), ("localhost", 7000));
    assert_eq!(s.max_concurrent_runs, 0);

    let bad_port = Env::from_pairs([
        ("API_SERVER_KEY", "0123456789abcdef"),
        ("API_SERVER_PORT", "eighty"),
    ]);
    assert!(matches!(
        ApiServerSettings::from_config(&ApiServerConfig::default(), &bad_port),
        Err(ApiServerError::InvalidPort(_))
    ));
}
