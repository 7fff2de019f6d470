//! Test servers for Talaria, bound to 127.0.0.1 on an ephemeral port.
//!
//! [`MockOpenAi`] speaks the OpenAI Chat Completions API and [`MockAnthropic`]
//! the Anthropic Messages API, both over real HTTP with real JSON and SSE, so
//! the code under test exercises its actual HTTP client, parser and timeouts.
//!
//! Each mock answers from a FIFO script of [`Reply`] values pushed by the
//! test; every request is recorded (path, headers, JSON body, arrival time)
//! and can be inspected with `requests()`.
//!
//! A request with `"stream": true` gets an SSE response: text split into
//! several chunks, tool-call arguments split across several deltas, and (for
//! OpenAI, when `stream_options.include_usage` is set) a usage-only chunk.
//! Any other request gets one JSON object.
//!
//! Beside the fakes: `wait`, the one waiting policy every fake and suite
//! shares; `fake` (crate-private), the base every fake server is built on
//! (its book and the waiters it wakes, its request log, its fault queues
//! and hang switch); and `kit`, each platform's fake behind one interface
//! for the adapter contract suite and the crash tests.
#![forbid(unsafe_code)]

pub mod bluebubbles;
pub mod dingtalk;
pub mod discord;
pub mod docker;
pub mod email;
mod fake;
pub mod feishu;
pub mod google_chat;
pub mod homeassistant;
pub mod ircd;
pub mod kit;
pub mod line;
pub mod matrix;
pub mod matrix_e2ee;
pub mod mattermost;
pub mod msgraph;
pub mod openai_media;
pub mod pdf;
pub mod postgres;
pub mod python;
pub mod qqbot;
pub mod recorder;
pub mod signal;
pub mod slack;
pub mod sshd;
pub mod state_db;
pub mod suite;
pub mod synapse;
pub mod telegram;
pub mod twilio;
pub mod wait;
pub mod web_pages;
pub mod web_search;
pub mod wecom;
pub mod wecom_bot;
pub mod weixin;
pub mod whatsapp;
mod wire;
pub use dingtalk::FakeDingTalk;
pub mod yuanbao;
pub use discord::FakeDiscord;
pub use email::MailServer;
pub use homeassistant::FakeHomeAssistant;
pub use line::FakeLine;
pub use matrix::FakeMatrix;
pub use mattermost::FakeMattermost;
pub use qqbot::FakeQq;
pub use signal::FakeSignal;
pub use slack::FakeSlack;
pub use telegram::FakeTelegram;
pub use twilio::FakeTwilio;
pub use wecom::FakeWecom;
pub use wecom_bot::FakeWecomBot;
pub use weixin::FakeWeixin;
pub use whatsapp::FakeGraph;
pub use yuanbao::FakeYuanbao;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use wire::{
    Frame, anthropic_json, anthropic_stream, content, control, data_frame, openai_json,
    openai_stream, sse_response,
};

/// One request as the mock received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The request path, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Header names lowercased, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The JSON body; `Value::Null` when there was none or it was not JSON.
    pub body: Value,
    /// When the request arrived (before any scripted delay).
    pub at: Instant,
}

impl Recorded {
    /// The first value of a header (name matched case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One tool call the mock model makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallReply {
    /// The call id the model assigns.
    pub id: String,
    /// The tool name.
    pub name: String,
    /// The raw JSON argument text (sent as-is, so invalid JSON is possible).
    pub arguments: String,
}

impl ToolCallReply {
    /// Convenience constructor.
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> ToolCallReply {
        ToolCallReply {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }
}

#[derive(Debug, Clone)]
enum Kind {
    Answer,
    Error { status: u16, body: String },
    RawSse(Vec<String>),
}

/// A scripted answer to one request.
#[derive(Debug, Clone)]
pub struct Reply {
    what: Kind,
    text: String,
    tool_calls: Vec<ToolCallReply>,
    reasoning: Option<String>,
    retry_after: Option<u64>,
    delay: Option<Duration>,
    stall_after: Option<usize>,
    chunk_pause: Option<Duration>,
    usage: (u64, u64),
}

/// Usage reported when a reply does not set its own.
const DEFAULT_USAGE: (u64, u64) = (10, 5);

impl Reply {
    fn base(what: Kind) -> Reply {
        Reply {
            what,
            text: String::new(),
            tool_calls: Vec::new(),
            reasoning: None,
            retry_after: None,
            delay: None,
            stall_after: None,
            chunk_pause: None,
            usage: DEFAULT_USAGE,
        }
    }

    /// A plain text answer (finish reason `stop` / `end_turn`).
    pub fn text(s: impl Into<String>) -> Reply {
        Reply {
            text: s.into(),
            ..Reply::base(Kind::Answer)
        }
    }

    /// An answer that calls tools (finish reason `tool_calls` / `tool_use`).
    pub fn tool_calls(calls: Vec<ToolCallReply>) -> Reply {
        Reply {
            tool_calls: calls,
            ..Reply::base(Kind::Answer)
        }
    }

    /// An HTTP error with this status and body, sent verbatim.
    pub fn error(status: u16, body: impl Into<String>) -> Reply {
        Reply::base(Kind::Error {
            status,
            body: body.into(),
        })
    }

    /// OpenAI mock: an SSE response whose `data:` payloads are exactly these
    /// strings, followed by `data: [DONE]`, whatever the request asked for.
    /// The Anthropic mock sends them as `data:` events too, without `[DONE]`.
    pub fn raw_sse(events: Vec<String>) -> Reply {
        Reply::base(Kind::RawSse(events))
    }

    /// Sets the answer text (leading text for a tool-call answer).
    pub fn with_text(mut self, s: impl Into<String>) -> Reply {
        self.text = s.into();
        self
    }

    /// Adds a `Retry-After: secs` header to the response.
    pub fn with_retry_after(mut self, secs: u64) -> Reply {
        self.retry_after = Some(secs);
        self
    }

    /// Waits this long before sending the response head.
    pub fn with_delay(mut self, d: Duration) -> Reply {
        self.delay = Some(d);
        self
    }

    /// Streaming only: send `chunks` content chunks (text, reasoning or
    /// tool-call deltas; framing events such as `message_start` do not
    /// count), then hang without finishing until the client goes away or the
    /// mock shuts down. `raw_sse` events all count as content.
    pub fn stall_after(mut self, chunks: usize) -> Reply {
        self.stall_after = Some(chunks);
        self
    }

    /// Streaming only: wait this long after each content chunk, so a client
    /// sees the answer arrive over time (streaming previews).
    pub fn with_chunk_pause(mut self, d: Duration) -> Reply {
        self.chunk_pause = Some(d);
        self
    }

    /// The token usage to report (default 10 prompt, 5 completion).
    pub fn with_usage(mut self, prompt: u64, completion: u64) -> Reply {
        self.usage = (prompt, completion);
        self
    }

    /// Reasoning text sent before the answer (`reasoning_content` for
    /// OpenAI, a `thinking` block for Anthropic).
    pub fn with_reasoning(mut self, s: impl Into<String>) -> Reply {
        self.reasoning = Some(s.into());
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavor {
    OpenAi,
    Anthropic,
}

struct Shared {
    flavor: Flavor,
    /// What `GET /v1/models` lists.
    models: Mutex<Vec<String>>,
    script: Mutex<VecDeque<Reply>>,
    /// Replies reserved for the first request whose body holds the text
    /// (see `push_when`), tried before the script.
    keyed: Mutex<Vec<(String, Reply)>>,
    recorded: Mutex<Vec<Recorded>>,
    /// Fixed JSON answers by method and path (see `set_route`), tried
    /// before the built-in routes.
    routes: Mutex<Vec<(Method, String, u16, Value)>>,
    /// Requests from Talaria's server probe (user agent `talaria-probe`),
    /// kept apart so they do not shift the API requests tests count.
    probes: Mutex<Vec<Recorded>>,
    /// Chat requests whose client went away before the reply went out
    /// (see [`Pending`]).
    hung_up: AtomicUsize,
    shutdown: watch::Receiver<bool>,
}

/// A chat request whose reply has not gone out yet. Dropped before
/// [`Pending::answered`], it counts as hung up: the server drops a
/// handler, or a stream's body, when the client closes its connection, so
/// a drop while a reply is held back (a delay, a stall) is the client
/// giving up, which a test can wait for instead of guessing how long an
/// interrupt takes.
pub(crate) struct Pending {
    shared: Arc<Shared>,
    answered: bool,
}

impl Pending {
    fn new(shared: Arc<Shared>) -> Pending {
        Pending {
            shared,
            answered: false,
        }
    }

    /// The whole reply was handed to the server to send.
    pub(crate) fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.answered {
            self.shared.hung_up.fetch_add(1, Ordering::SeqCst);
        }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test thread must not make every later assertion panic too.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The server shared by both mocks.
struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Server {
    async fn start(flavor: Flavor) -> std::io::Result<Server> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (stop, shutdown) = watch::channel(false);
        let shared = Arc::new(Shared {
            flavor,
            models: Mutex::new(vec!["mock-model".to_owned()]),
            script: Mutex::new(VecDeque::new()),
            keyed: Mutex::new(Vec::new()),
            recorded: Mutex::new(Vec::new()),
            routes: Mutex::new(Vec::new()),
            probes: Mutex::new(Vec::new()),
            hung_up: AtomicUsize::new(0),
            shutdown: shutdown.clone(),
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let mut until = shutdown;
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = until.wait_for(|s| *s).await;
            });
            if let Err(e) = serve.await {
                tracing::warn!("mock server stopped: {e}");
            }
        });
        Ok(Server {
            addr,
            shared,
            stop,
            task: Mutex::new(Some(task)),
        })
    }

    fn push(&self, reply: Reply) {
        lock(&self.shared.script).push_back(reply);
    }

    fn push_when(&self, needle: &str, reply: Reply) {
        lock(&self.shared.keyed).push((needle.to_owned(), reply));
    }

    fn requests(&self) -> Vec<Recorded> {
        lock(&self.shared.recorded).clone()
    }

    fn pending(&self) -> usize {
        lock(&self.shared.script).len() + lock(&self.shared.keyed).len()
    }

    fn shutdown(&self) {
        let _ = self.stop.send(true);
        // Graceful shutdown would wait for stalled streams; those watch the
        // same signal, but abort anyway so a stuck connection cannot keep the
        // accept loop alive.
        if let Some(t) = lock(&self.task).take() {
            t.abort();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

macro_rules! mock_api {
    ($name:ident, $flavor:expr, $suffix:expr, $doc_url:expr) => {
        impl $name {
            /// Starts the server on 127.0.0.1 with an ephemeral port.
            ///
            /// # Panics
            /// When no local port can be bound (a broken test environment).
            pub async fn start() -> $name {
                match $name::try_start().await {
                    Ok(m) => m,
                    Err(e) => panic!("cannot start mock server on 127.0.0.1: {e}"),
                }
            }

            /// Like [`Self::start`], returning the bind error instead of panicking.
            pub async fn try_start() -> std::io::Result<$name> {
                Ok($name {
                    server: Server::start($flavor).await?,
                })
            }

            #[doc = $doc_url]
            pub fn base_url(&self) -> String {
                format!("http://{}{}", self.server.addr, $suffix)
            }

            /// The bound socket address.
            pub fn addr(&self) -> SocketAddr {
                self.server.addr
            }

            /// Appends a reply to the script. An empty script answers
            /// `Reply::text("(mock: script empty)")`.
            pub fn push(&self, reply: Reply) {
                self.server.push(reply);
            }

            /// Reserves `reply` for the first request whose JSON body
            /// contains `needle` (plain text: quotes inside the body are
            /// escaped), ahead of the script: concurrent clients (subagents)
            /// then each get their own answer whatever order they ask in.
            /// Reserved replies are tried in the order they were added.
            pub fn push_when(&self, needle: &str, reply: Reply) {
                self.server.push_when(needle, reply);
            }

            /// Every request received so far, in arrival order, except
            /// those of Talaria's server probe (see [`Self::probe_requests`]).
            pub fn requests(&self) -> Vec<Recorded> {
                self.server.requests()
            }

            /// The requests of Talaria's server probe (user agent
            /// `talaria-probe/…`), in arrival order.
            pub fn probe_requests(&self) -> Vec<Recorded> {
                lock(&self.server.shared.probes).clone()
            }

            /// Sets the models `GET /v1/models` lists (`mock-model` until
            /// set).
            pub fn set_models(&self, ids: &[&str]) {
                *lock(&self.server.shared.models) = ids.iter().map(|m| (*m).to_owned()).collect();
            }

            /// Answers `method path` with `status` and the JSON `body` from
            /// now on, ahead of the built-in routes: a model server's own
            /// endpoints (llama.cpp's `GET /props`, Ollama's
            /// `POST /api/show`, a vLLM `GET /v1/models`) beside the chat
            /// API. A later call for the same route replaces the answer.
            pub fn set_route(&self, method: &str, path: &str, status: u16, body: Value) {
                let method = Method::from_bytes(method.as_bytes()).unwrap_or(Method::GET);
                let mut routes = lock(&self.server.shared.routes);
                routes.retain(|(m, p, _, _)| !(*m == method && p == path));
                routes.push((method, path.to_owned(), status, body));
            }

            /// Scripted replies not yet consumed.
            pub fn pending(&self) -> usize {
                self.server.pending()
            }

            /// Chat requests whose client went away while their reply was
            /// held back ([`Reply::with_delay`], [`Reply::stall_after`]):
            /// the connection closed before the reply went out. What a
            /// test waits for to know an interrupted client really
            /// stopped waiting, rather than sleeping and hoping.
            pub fn hung_up(&self) -> usize {
                self.server.shared.hung_up.load(Ordering::SeqCst)
            }

            /// Stops accepting connections and ends stalled streams. Also
            /// happens on drop.
            pub fn shutdown(&self) {
                self.server.shutdown();
            }
        }
    };
}

/// A mock OpenAI-compatible server: `POST /v1/chat/completions` and
/// `GET /v1/models`.
pub struct MockOpenAi {
    server: Server,
}

mock_api!(
    MockOpenAi,
    Flavor::OpenAi,
    "/v1",
    "`http://127.0.0.1:PORT/v1`, the base URL an OpenAI client expects."
);

/// A mock Anthropic server: `POST /v1/messages`.
pub struct MockAnthropic {
    server: Server,
}

mock_api!(
    MockAnthropic,
    Flavor::Anthropic,
    "",
    "`http://127.0.0.1:PORT` (no `/v1`: the client appends `/v1/messages`)."
);

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let at = Instant::now();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let recorded = Recorded {
        path: uri.path().to_owned(),
        headers: headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_ascii_lowercase(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: body.clone(),
        at,
    };
    let probing = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ua| ua.starts_with("talaria-probe"));
    if probing {
        lock(&shared.probes).push(recorded);
    } else {
        lock(&shared.recorded).push(recorded);
    }

    let path = uri.path();
    let fixed = lock(&shared.routes)
        .iter()
        .find(|(m, p, _, _)| *m == method && p == path)
        .map(|(_, _, status, body)| (*status, body.clone()));
    if let Some((status, body)) = fixed {
        return json_response(status, &body);
    }
    match (shared.flavor, &method, path) {
        (Flavor::OpenAi, &Method::GET, "/v1/models") => {
            let data: Vec<Value> = lock(&shared.models)
                .iter()
                .map(|id| json!({"id": id, "object": "model", "owned_by": "talaria-testkit"}))
                .collect();
            return json_response(200, &json!({"object": "list", "data": data}));
        }
        (Flavor::OpenAi, &Method::POST, "/v1/chat/completions")
        | (Flavor::Anthropic, &Method::POST, "/v1/messages") => {}
        _ => {
            return json_response(
                404,
                &json!({"error": {"message": format!("mock: no route for {method} {path}"), "type": "not_found"}}),
            );
        }
    }

    let reserved = {
        let mut keyed = lock(&shared.keyed);
        if keyed.is_empty() {
            None
        } else {
            let text = body.to_string();
            keyed
                .iter()
                .position(|(needle, _)| text.contains(needle.as_str()))
                .map(|i| keyed.remove(i).1)
        }
    };
    let reply = reserved
        .or_else(|| lock(&shared.script).pop_front())
        .unwrap_or_else(|| Reply::text("(mock: script empty)"));
    // From here a closed connection drops this future (or the stream's
    // task below), and with it `pending`.
    let pending = Pending::new(shared.clone());
    if let Some(d) = reply.delay {
        tokio::time::sleep(d).await;
    }
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("mock-model")
        .to_owned();
    let stream = body.get("stream").and_then(Value::as_bool) == Some(true);
    let include_usage = body
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        == Some(true);

    let mut response = match (&reply.what, shared.flavor) {
        (Kind::Error { status, body }, _) => {
            let ctype = if serde_json::from_str::<Value>(body).is_ok() {
                "application/json"
            } else {
                "text/plain; charset=utf-8"
            };
            let mut r = Response::new(Body::from(body.clone()));
            *r.status_mut() = StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_REQUEST);
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
            pending.answered();
            r
        }
        (Kind::RawSse(events), flavor) => {
            let mut frames: Vec<Frame> = events
                .iter()
                .map(|e| content(data_frame(None, e)))
                .collect();
            if flavor == Flavor::OpenAi {
                frames.push(control(data_frame(None, "[DONE]")));
            }
            sse_response(frames, &reply, shared.shutdown.clone(), pending)
        }
        (Kind::Answer, Flavor::OpenAi) if stream => sse_response(
            openai_stream(&reply, &model, include_usage),
            &reply,
            shared.shutdown.clone(),
            pending,
        ),
        (Kind::Answer, Flavor::OpenAi) => {
            pending.answered();
            json_response(200, &openai_json(&reply, &model))
        }
        (Kind::Answer, Flavor::Anthropic) if stream => sse_response(
            anthropic_stream(&reply, &model),
            &reply,
            shared.shutdown.clone(),
            pending,
        ),
        (Kind::Answer, Flavor::Anthropic) => {
            pending.answered();
            json_response(200, &anthropic_json(&reply, &model))
        }
    };
    if let Some(secs) = reply.retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        response.headers_mut().insert(header::RETRY_AFTER, v);
    }
    response
}

pub(crate) fn json_response(status: u16, v: &Value) -> Response {
    let mut r = Response::new(Body::from(v.to_string()));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Serves `app` on `listener` from a thread with its own runtime, so a fake
/// keeps answering whatever the test's runtime is doing (blocked in a
/// synchronous wait, shutting down). `stop` turning true ends it at once:
/// not gracefully, since hung requests and long polls must not keep the
/// thread alive once the test is done.
pub(crate) fn serve_on_own_thread(
    name: &str,
    listener: std::net::TcpListener,
    app: Router,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let label = name.to_owned();
    let port = listener.local_addr()?.port();
    std::thread::Builder::new()
        .name(format!("{name}-{port}"))
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::warn!("{label} cannot listen: {e}");
                        return;
                    }
                };
                tokio::select! {
                    r = axum::serve(listener, app) => {
                        if let Err(e) = r {
                            tracing::warn!("{label} stopped: {e}");
                        }
                    }
                    _ = stop.wait_for(|s| *s) => {}
                }
            });
        })?;
    Ok(())
}
