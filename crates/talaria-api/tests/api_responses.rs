//! The Responses API over HTTP against a real SQLite store and the mock
//! model: errors in OpenAI's shape, unknown ids, `store: false`,
//! continuation and branching, the event stream, and stored responses
//! surviving a restart.

use crate::api_support;

use api_support::{KEY, Rig, conversation, parse_sse, rig};
use serde_json::{Value, json};
use talaria_testkit::Reply;

async fn post(rig: &Rig, body: &Value) -> reqwest::Response {
    rig.client
        .post(rig.url("/v1/responses"))
        .bearer_auth(KEY)
        .json(body)
        .send()
        .await
        .unwrap()
}

/// A successful non-streamed response's body.
async fn respond(rig: &Rig, body: Value) -> Value {
    let resp = post(rig, &body).await;
    assert_eq!(resp.status(), 200, "{body}");
    resp.json().await.unwrap()
}

async fn get(rig: &Rig, id: &str) -> reqwest::Response {
    rig.client
        .get(rig.url(&format!("/v1/responses/{id}")))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(r, c)| ((*r).to_owned(), (*c).to_owned()))
        .collect()
}

/// The OpenAI error body's code, after checking its shape.
async fn error_code(resp: reqwest::Response, status: u16) -> String {
    assert_eq!(resp.status(), status);
    let body: Value = resp.json().await.unwrap();
    let error = &body["error"];
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(error["type"].is_string(), "{body}");
    error["code"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn bad_requests_are_400_in_openais_shape_and_reach_no_model() {
    let rig = rig(0).await;
    for (body, code) in [
        (json!({"model": "m"}), "missing_input"),
        (json!({"input": ""}), "missing_input"),
        (
            json!({"input": [{"role": "assistant", "content": "x"}]}),
            "no_user_message",
        ),
        (
            json!({"input": [{"role": "user", "content": {"x": 1}}]}),
            "invalid_message",
        ),
        (json!({"input": "x", "stream": "yes"}), "invalid_stream"),
        (json!({"input": "x", "store": "no"}), "invalid_store"),
        (
            json!({"input": "x", "metadata": {"k": 5}}),
            "invalid_metadata",
        ),
        (
            json!({"input": "x", "previous_response_id": 5}),
            "invalid_previous_response_id",
        ),
    ] {
        assert_eq!(
            error_code(post(&rig, &body).await, 400).await,
            code,
            "{body}"
        );
    }
    let resp = rig
        .client
        .post(rig.url("/v1/responses"))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(resp, 400).await, "invalid_json");
    let resp = rig
        .client
        .post(rig.url("/v1/responses"))
        .json(&json!({"input": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(resp, 401).await, "invalid_api_key");
    let resp = rig
        .client
        .get(rig.url("/v1/responses/resp_1"))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(resp, 401).await, "invalid_api_key");
    assert!(rig.mock.requests().is_empty());
    rig.stop().await;
}

#[tokio::test]
async fn unknown_ids_are_404() {
    let rig = rig(0).await;
    for id in ["resp_0123", "nope", "resp_..", "resp_%2e%2e%2fx"] {
        assert_eq!(
            error_code(get(&rig, id).await, 404).await,
            "response_not_found"
        );
        let resp = rig
            .client
            .delete(rig.url(&format!("/v1/responses/{id}")))
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(error_code(resp, 404).await, "response_not_found");
    }
    let resp = post(
        &rig,
        &json!({"input": "go on", "previous_response_id": "resp_0123"}),
    )
    .await;
    assert_eq!(error_code(resp, 404).await, "response_not_found");
    assert!(rig.mock.requests().is_empty());
    rig.stop().await;
}

#[tokio::test]
async fn a_response_is_shaped_as_openai_has_it_and_kept_until_deleted() {
    let rig = rig(0).await;
    rig.mock.push(Reply::text("Hello."));
    let body = respond(
        &rig,
        json!({"model": "test-model", "input": "hi", "instructions": "be brief",
               "metadata": {"k": "v"}, "tools": [], "temperature": 0.5}),
    )
    .await;
    let id = body["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("resp_"), "{id}");
    assert_eq!(body["object"], "response");
    assert_eq!(body["status"], "completed");
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["instructions"], "be brief");
    // The instructions steer the turn: they follow the system prompt.
    let sent = rig.mock.requests().last().unwrap().body["messages"].clone();
    let system = sent[0]["content"].as_str().unwrap();
    assert!(system.ends_with("be brief"), "{system}");
    assert_eq!(body["metadata"], json!({"k": "v"}));
    assert_eq!(body["store"], true);
    assert_eq!(body["previous_response_id"], Value::Null);
    assert_eq!(body["output"][0]["type"], "message");
    assert_eq!(body["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(body["output"][0]["content"][0]["text"], "Hello.");
    assert_eq!(body["output"][0]["content"][0]["annotations"], json!([]));
    for field in ["input_tokens", "output_tokens", "total_tokens"] {
        assert!(body["usage"][field].is_u64(), "{field}: {body}");
    }
    assert!(body["usage"]["input_tokens_details"]["cached_tokens"].is_u64());
    assert!(body["usage"]["output_tokens_details"]["reasoning_tokens"].is_u64());
    for field in ["parallel_tool_calls", "tool_choice", "tools", "created_at"] {
        assert!(!body[field].is_null(), "{field}: {body}");
    }

    let got = get(&rig, &id).await;
    assert_eq!(got.status(), 200);
    assert_eq!(got.json::<Value>().await.unwrap(), body);

    let deleted = rig
        .client
        .delete(rig.url(&format!("/v1/responses/{id}")))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    assert_eq!(
        deleted.json::<Value>().await.unwrap(),
        json!({"id": id, "object": "response.deleted", "deleted": true})
    );
    assert_eq!(
        error_code(get(&rig, &id).await, 404).await,
        "response_not_found"
    );
    rig.stop().await;
}

#[tokio::test]
async fn a_response_not_stored_can_be_neither_retrieved_nor_continued() {
    let rig = rig(0).await;
    rig.mock.push(Reply::text("Gone."));
    let body = respond(&rig, json!({"input": "hi", "store": false})).await;
    assert_eq!(body["store"], false);
    let id = body["id"].as_str().unwrap();
    assert_eq!(
        error_code(get(&rig, id).await, 404).await,
        "response_not_found"
    );
    let resp = post(&rig, &json!({"input": "more", "previous_response_id": id})).await;
    assert_eq!(error_code(resp, 404).await, "response_not_found");
    assert_eq!(rig.mock.requests().len(), 1);
    rig.stop().await;
}

#[tokio::test]
async fn continuations_of_one_response_branch_apart() {
    let rig = rig(0).await;
    rig.mock.push(Reply::text("Root."));
    rig.mock.push(Reply::text("A."));
    rig.mock.push(Reply::text("B."));
    rig.mock.push(Reply::text("A2."));
    let root = respond(&rig, json!({"input": "root"})).await;
    let root_id = root["id"].as_str().unwrap();
    let a = respond(
        &rig,
        json!({"input": "to a", "previous_response_id": root_id}),
    )
    .await;
    let b = respond(
        &rig,
        json!({"input": "to b", "previous_response_id": root_id}),
    )
    .await;
    assert_eq!(b["previous_response_id"], root_id);
    // Each branch goes on with its own conversation.
    respond(
        &rig,
        json!({"input": "a again", "previous_response_id": a["id"]}),
    )
    .await;
    let root_turn = [("user", "root"), ("assistant", "Root.")];
    assert_eq!(
        conversation(&rig.sent_messages(1)),
        pairs(&[root_turn[0], root_turn[1], ("user", "to a")])
    );
    assert_eq!(
        conversation(&rig.sent_messages(2)),
        pairs(&[root_turn[0], root_turn[1], ("user", "to b")])
    );
    assert_eq!(
        conversation(&rig.sent_messages(3)),
        pairs(&[
            root_turn[0],
            root_turn[1],
            ("user", "to a"),
            ("assistant", "A."),
            ("user", "a again"),
        ])
    );
    // A request without previous_response_id is a new conversation, even
    // when it opens as another did.
    rig.mock.push(Reply::text("Fresh."));
    respond(&rig, json!({"input": "root"})).await;
    assert_eq!(
        conversation(&rig.sent_messages(4)),
        pairs(&[("user", "root")])
    );
    rig.stop().await;
}

#[tokio::test]
async fn input_items_seed_the_conversation_and_follow_a_previous_response() {
    let rig = rig(0).await;
    rig.mock.push(Reply::text("One."));
    rig.mock.push(Reply::text("Two."));
    let first = respond(
        &rig,
        json!({"input": [
            {"role": "system", "content": "ignored by the model"},
            {"role": "user", "content": "earlier q"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "earlier a"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "now"}]},
        ]}),
    )
    .await;
    assert_eq!(
        conversation(&rig.sent_messages(0)),
        pairs(&[
            ("user", "earlier q"),
            ("assistant", "earlier a"),
            ("user", "now")
        ])
    );
    respond(
        &rig,
        json!({"previous_response_id": first["id"], "input": [
            {"role": "user", "content": "aside"},
            {"role": "assistant", "content": "noted"},
            {"role": "user", "content": "next"},
        ]}),
    )
    .await;
    assert_eq!(
        conversation(&rig.sent_messages(1)),
        pairs(&[
            ("user", "earlier q"),
            ("assistant", "earlier a"),
            ("user", "now"),
            ("assistant", "One."),
            ("user", "aside"),
            ("assistant", "noted"),
            ("user", "next"),
        ])
    );
    rig.stop().await;
}

#[tokio::test]
async fn stored_responses_survive_a_restart() {
    let rig = rig(0).await;
    rig.mock.push(Reply::text("Before."));
    rig.mock.push(Reply::text("After."));
    let first = respond(&rig, json!({"input": "before"})).await;
    let id = first["id"].as_str().unwrap().to_owned();
    let rig = rig.restart().await;
    assert_eq!(get(&rig, &id).await.json::<Value>().await.unwrap(), first);
    respond(&rig, json!({"input": "after", "previous_response_id": id})).await;
    assert_eq!(
        conversation(&rig.sent_messages(1)),
        pairs(&[
            ("user", "before"),
            ("assistant", "Before."),
            ("user", "after")
        ])
    );
    rig.stop().await;
}

#[tokio::test]
async fn the_stream_names_and_numbers_openais_events() {
    let rig = rig(0).await;
    rig.mock.push(Reply::text("Streamed answer."));
    let resp = post(&rig, &json!({"input": "hi", "stream": true})).await;
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = resp.text().await.unwrap();
    let frames: Vec<_> = parse_sse(&text)
        .into_iter()
        .filter(|f| f.data.is_some())
        .collect();
    let mut kinds = Vec::new();
    let mut deltas = String::new();
    for (n, frame) in frames.iter().enumerate() {
        let data = frame.json();
        assert_eq!(frame.event.as_deref(), data["type"].as_str(), "{data}");
        assert_eq!(data["sequence_number"], n, "{data}");
        if data["type"] == "response.output_text.delta" {
            deltas.push_str(data["delta"].as_str().unwrap());
        } else {
            kinds.push(data["type"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    assert_eq!(deltas, "Streamed answer.");
    let completed = frames.last().unwrap().json();
    let response = &completed["response"];
    assert_eq!(response["status"], "completed");
    assert_eq!(
        response["output"][0]["content"][0]["text"],
        "Streamed answer."
    );
    let kept = get(&rig, response["id"].as_str().unwrap()).await;
    assert_eq!(kept.json::<Value>().await.unwrap(), *response);
    rig.stop().await;
}

#[tokio::test]
async fn a_failed_streamed_turn_ends_with_response_failed() {
    let rig = rig(0).await;
    rig.mock.push(Reply::error(
        400,
        r#"{"error":{"message":"bad model request","type":"invalid_request_error"}}"#,
    ));
    let text = post(&rig, &json!({"input": "hi", "stream": true}))
        .await
        .text()
        .await
        .unwrap();
    let last = parse_sse(&text)
        .into_iter()
        .rfind(|f| f.data.is_some())
        .unwrap()
        .json();
    assert_eq!(last["type"], "response.failed", "{text}");
    assert_eq!(last["response"]["status"], "failed");
    assert_eq!(last["response"]["error"]["code"], "server_error");
    assert!(last["response"]["error"]["message"].is_string());
    let id = last["response"]["id"].as_str().unwrap();
    assert_eq!(
        error_code(get(&rig, id).await, 404).await,
        "response_not_found"
    );
    rig.stop().await;
}

fn compressing() -> impl FnOnce(&mut talaria_core::Config) {
    |c| {
        c.model.context_length = 4096;
        c.compression.threshold = 0.5;
        c.compression.protect_first_n = 1;
        c.compression.protect_last_n = 2;
    }
}

/// A response whose turn compressed its session is continued in place;
/// once a later turn has compressed the conversation again, the response
/// can no longer be branched from (the new summary may hold what came
/// after it), which is said rather than guessed at.
#[tokio::test(flavor = "multi_thread")]
async fn compressed_responses_continue_and_refuse_to_branch_across_a_compression() {
    let rig = api_support::rig_with(0, compressing()).await;
    let summary = || Reply::text("## Goal\nChat.\n## Progress\nA long answer was given.");
    rig.mock.push(summary());
    rig.mock.push(Reply::text("answer three"));
    let root = respond(
        &rig,
        json!({"input": [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "y".repeat(10_000)},
            {"role": "user", "content": "two"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "three"},
        ]}),
    )
    .await;
    // The first request was the summary: the turn compressed.
    assert!(rig.mock.requests()[0].body.get("tools").is_none());

    // This config compresses every turn, the next one too.
    rig.mock.push(summary());
    rig.mock.push(Reply::text("answer four"));
    respond(
        &rig,
        json!({"input": "four", "previous_response_id": root["id"]}),
    )
    .await;
    assert!(rig.mock.requests()[2].body.get("tools").is_none());
    let four = conversation(&rig.sent_messages(3));
    assert_eq!(
        four[four.len() - 2..],
        pairs(&[("assistant", "answer three"), ("user", "four")])
    );
    assert!(four.iter().all(|(_, c)| c.len() < 5_000));

    let before = rig.mock.requests().len();
    let resp = post(
        &rig,
        &json!({"input": "five", "previous_response_id": root["id"]}),
    )
    .await;
    assert_eq!(error_code(resp, 409).await, "conversation_compressed");
    assert_eq!(rig.mock.requests().len(), before);
    rig.stop().await;
}
