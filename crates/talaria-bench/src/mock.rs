//! An OpenAI-compatible model that answers at once: the benchmark measures
//! Talaria, so the model must cost as close to nothing as a real HTTP
//! server can.
//!
//! Every request is answered from its own content, with no script:
//! - the last message is a tool result: a short text answer;
//! - the last user message contains [`TOOL_MARKER`]: one call of the
//!   `todo` tool (cheap, in memory, offered in every turn);
//! - anything else: a short text answer.
//!
//! `"stream": true` gets server-sent events (a role chunk, the text in
//! three pieces, a finish chunk, a usage chunk and `[DONE]`), anything else
//! one `chat.completion` object.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use axum::serve::ListenerExt;
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// A user message containing this asks for a turn with one tool call.
pub const TOOL_MARKER: &str = "#tool";

/// The answer's text.
const ANSWER: &str = "Done: noted.";

/// What the mock saw, for the report.
#[derive(Debug, Default)]
pub struct MockStats {
    /// Requests answered.
    pub requests: AtomicU64,
    /// Size of the most recent request that opened a turn (its last
    /// message is the user's), in bytes.
    pub last_turn_request_bytes: AtomicUsize,
    /// The largest such request.
    pub max_turn_request_bytes: AtomicUsize,
    /// The smallest such request (0 = none yet).
    pub min_turn_request_bytes: AtomicUsize,
    /// The most recent such request itself, to replay against the mock
    /// alone.
    pub last_turn_request: Mutex<Option<Bytes>>,
}

/// A running mock.
pub struct Mock {
    pub addr: SocketAddr,
    pub stats: Arc<MockStats>,
}

impl Mock {
    /// Binds 127.0.0.1 on an ephemeral port and serves on the current
    /// runtime until the process ends.
    pub async fn start() -> anyhow::Result<Mock> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(MockStats::default());
        let app = Router::new()
            .route("/v1/chat/completions", post(completions))
            .route("/v1/audio/transcriptions", post(transcription))
            // Photo turns send images (a few hundred kB each, up to four in
            // a request): far past axum's 2 MB default.
            .layer(axum::extract::DefaultBodyLimit::max(64 * 1024 * 1024))
            .with_state(stats.clone());
        tokio::spawn(async move {
            let listener = listener.tap_io(|tcp: &mut tokio::net::TcpStream| {
                let _ = tcp.set_nodelay(true);
            });
            let _ = axum::serve(listener, app).await;
        });
        Ok(Mock { addr, stats })
    }

    /// The base URL a client is given (`http://127.0.0.1:port/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }
}

async fn completions(State(stats): State<Arc<MockStats>>, body: Bytes) -> Response {
    stats.requests.fetch_add(1, Ordering::Relaxed);
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return Response::builder()
                .status(StatusCode::BAD_REQUEST)
                .body(Body::from(format!("bad JSON: {e}")))
                .unwrap_or_default();
        }
    };
    let messages = request["messages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let last_role = messages.last().and_then(|m| m["role"].as_str());
    if last_role == Some("user") {
        let n = body.len();
        if let Ok(mut last) = stats.last_turn_request.lock() {
            *last = Some(body.clone());
        }
        stats.last_turn_request_bytes.store(n, Ordering::Relaxed);
        stats.max_turn_request_bytes.fetch_max(n, Ordering::Relaxed);
        let _ =
            stats
                .min_turn_request_bytes
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                    (m == 0 || n < m).then_some(n)
                });
    }
    let wants_tool = last_role == Some("user")
        && messages
            .last()
            .and_then(|m| m["content"].as_str())
            .is_some_and(|t| t.contains(TOOL_MARKER))
        && offers_todo(&request);
    let stream = request["stream"].as_bool().unwrap_or(false);
    match (stream, wants_tool) {
        (false, false) => json_response(&text_completion()),
        (false, true) => json_response(&tool_completion()),
        (true, false) => sse_response(text_chunks()),
        (true, true) => sse_response(tool_chunks()),
    }
}

/// Speech to text that hears the same sentence in every file: the voice
/// turn measures the gateway, not a recogniser.
async fn transcription(State(stats): State<Arc<MockStats>>, body: Bytes) -> Response {
    stats.requests.fetch_add(1, Ordering::Relaxed);
    if body.is_empty() {
        return Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .body(Body::from("no file"))
            .unwrap_or_default();
    }
    json_response(&json!({"text": "Please note that the build passed."}))
}

fn offers_todo(request: &Value) -> bool {
    request["tools"]
        .as_array()
        .is_some_and(|tools| tools.iter().any(|t| t["function"]["name"] == "todo"))
}

fn usage() -> Value {
    json!({"prompt_tokens": 900, "completion_tokens": 4, "total_tokens": 904})
}

fn text_completion() -> Value {
    json!({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "bench",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": ANSWER}}],
        "usage": usage(),
    })
}

const TOOL_ARGS: &str = r#"{"todos":[{"id":"1","content":"bench","status":"pending"}]}"#;

fn tool_completion() -> Value {
    json!({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "bench",
        "choices": [{"index": 0, "finish_reason": "tool_calls",
                     "message": {"role": "assistant", "content": null, "tool_calls": [
                         {"id": "call_1", "type": "function",
                          "function": {"name": "todo", "arguments": TOOL_ARGS}}]}}],
        "usage": usage(),
    })
}

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "bench",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    })
}

fn usage_chunk() -> Value {
    json!({
        "id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "bench",
        "choices": [], "usage": usage(),
    })
}

fn text_chunks() -> Vec<Value> {
    let mut out = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    let (a, rest) = ANSWER.split_at(4);
    let (b, c) = rest.split_at(4);
    for piece in [a, b, c] {
        out.push(chunk(json!({"content": piece}), None));
    }
    out.push(chunk(json!({}), Some("stop")));
    out.push(usage_chunk());
    out
}

fn tool_chunks() -> Vec<Value> {
    let (a, b) = TOOL_ARGS.split_at(TOOL_ARGS.len() / 2);
    vec![
        chunk(json!({"role": "assistant", "content": null}), None),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                   "function": {"name": "todo", "arguments": a}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": b}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
        usage_chunk(),
    ]
}

fn json_response(body: &Value) -> Response {
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap_or_default()
}

fn sse_response(chunks: Vec<Value>) -> Response {
    let mut text = String::new();
    for c in chunks {
        text.push_str("data: ");
        text.push_str(&c.to_string());
        text.push_str("\n\n");
    }
    text.push_str("data: [DONE]\n\n");
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from(text))
        .unwrap_or_default()
}
