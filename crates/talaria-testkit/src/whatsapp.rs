//! Both sides of the WhatsApp Cloud API, for adapter and end-to-end tests.
//!
//! [`FakeGraph`] is the Graph API on 127.0.0.1 over real HTTP, as far as a
//! WhatsApp bot uses it: `POST /{version}/{phone_number_id}/messages`,
//! requiring `Authorization: Bearer <token>`, for
//!
//! - text messages (`messaging_product: whatsapp`, `type: text`, `to`,
//!   `text.body` of at most 4096 characters, optional `context.message_id`),
//!   answered `{"messaging_product", "contacts": [{"input", "wa_id"}],
//!   "messages": [{"id": "wamid...."}]}`;
//! - read receipts (`status: read`, `message_id`, optionally
//!   `typing_indicator`), answered `{"success": true}`;
//! - media messages (`type` one of `image`, `audio`, `video`, `document`,
//!   the object of that name holding the `id` of an uploaded file, an
//!   optional `caption` (not on audio) and a `filename` on documents),
//!   recorded as [`SentFile`]s;
//! - `POST /{version}/{phone_number_id}/media`, a multipart form with
//!   `messaging_product=whatsapp`, `type` and the `file` part, answered
//!   `{"id": "<media id>"}` and recorded as an [`Upload`];
//! - `GET /{version}/{phone_number_id}`: the business number
//!   (`verified_name`, `display_phone_number`, `quality_rating`, `id`, ...);
//! - `GET /{version}/{media_id}` for a file a test registered
//!   ([`FakeGraph::add_media`]) or uploaded, answered `{"messaging_product",
//!   "url", "mime_type", "sha256", "file_size", "id"}`, the URL pointing
//!   at `/whatsapp_business/attachments/?mid=...` on this server (Meta's
//!   is on lookaside.fbsbx.com), which serves the bytes to the bearer of
//!   the token. An unknown media id gets 400 with code 100, as on Graph.
//!
//! Errors come in Graph's shape, `{"error": {"message", "type", "code",
//! "error_subcode", "error_data": {"messaging_product", "details"},
//! "fbtrace_id"}}`: a bad token gets 401 with code 190, a wrong phone
//! number id 400 with code 100, a recipient whose 24-hour window is
//! [closed](FakeGraph::close_window) 400 with code 131047, and tests can
//! queue any failure, bare 429s included ([`FakeGraph::fail_next_send`]).
//! The server runs on its own thread and stops when dropped.
//!
//! [`MetaWebhook`] is Meta's side of the webhook: it signs deliveries with
//! the app secret (`X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the
//! raw body>`) and posts them, and makes the verification handshake. The
//! payload builders ([`text`], [`delivery`], [`failed_status`], ...) write
//! the JSON Meta sends.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Multipart, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, Uri, header};
use axum::response::Response;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::fake::{Core, Faults, bind, started};
use crate::json_response;

/// The Graph API version tests configure.
pub const API_VERSION: &str = "v21.0";
/// WhatsApp's largest text body, in characters.
pub const MAX_TEXT_CHARS: usize = 4096;

/// A failure the next send gets instead of being accepted.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// An error in Graph's shape.
    Graph {
        /// The HTTP status.
        status: u16,
        /// Graph's `error.code`.
        code: i64,
        /// Graph's `error.error_subcode`, when set.
        subcode: Option<i64>,
        /// Graph's `error.message`.
        message: String,
        /// Graph's `error.error_data.details`, when set.
        details: Option<String>,
    },
    /// A bare HTTP 429 (as a proxy in front of Graph sends), with
    /// `Retry-After` when given.
    TooManyRequests {
        /// The `Retry-After` header, in seconds.
        retry_after: Option<u64>,
    },
}

impl Failure {
    /// An error in Graph's shape.
    pub fn graph(status: u16, code: i64, message: &str) -> Failure {
        Failure::Graph {
            status,
            code,
            subcode: None,
            message: message.to_owned(),
            details: None,
        }
    }

    /// 131047: the 24-hour customer service window is closed.
    pub fn outside_window() -> Failure {
        Failure::Graph {
            status: 400,
            code: 131047,
            subcode: None,
            message: "(#131047) Re-engagement message".to_owned(),
            details: Some(
                "Message failed to send because more than 24 hours have passed since the \
                 customer last replied to this number."
                    .to_owned(),
            ),
        }
    }

    /// 130429, 131056 or 80007: a Graph rate limit.
    pub fn rate_limited(code: i64) -> Failure {
        let message = match code {
            130429 => "(#130429) Rate limit hit",
            131056 => "(#131056) (Business Account, Consumer Account) pair rate limit hit",
            _ => "(#80007) Rate limit issues",
        };
        Failure::graph(400, code, message)
    }

    /// 190: the access token expired.
    pub fn token_expired() -> Failure {
        Failure::Graph {
            status: 401,
            code: 190,
            subcode: Some(463),
            message: "Error validating access token: Session has expired.".to_owned(),
            details: None,
        }
    }

    /// A 500 with Graph's "unknown error" (code 1).
    pub fn server_error() -> Failure {
        Failure::graph(500, 1, "An unknown error has occurred.")
    }
}

/// One text message the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// The wamid assigned.
    pub id: String,
    /// The recipient's WhatsApp id (phone number).
    pub to: String,
    /// The text exactly as sent.
    pub body: String,
    /// The `preview_url` flag, when given.
    pub preview_url: Option<bool>,
    /// `context.message_id`: the message quoted.
    pub context: Option<String>,
    /// When the fake received it.
    pub at: Instant,
}

/// One read receipt the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct Read {
    /// The wamid marked as read.
    pub message_id: String,
    /// Whether it asked for the typing indicator.
    pub typing: bool,
}

/// Any request, recorded when it arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The HTTP method (`GET`, `POST`, ...).
    pub method: String,
    /// The request path.
    pub path: String,
    /// The JSON body (`null` when there was none or it did not parse).
    pub body: Value,
    /// The bearer token was the right one.
    pub authorized: bool,
}

/// One file uploaded to `POST /{version}/{number}/media`.
#[derive(Debug, Clone, PartialEq)]
pub struct Upload {
    /// The media id assigned.
    pub id: String,
    /// The `messaging_product` field.
    pub messaging_product: String,
    /// The `type` field (the file's MIME type).
    pub mime: String,
    /// The `file` part's file name.
    pub file_name: Option<String>,
    /// The `file` part's `Content-Type`.
    pub content_type: Option<String>,
    /// The bytes uploaded.
    pub bytes: Vec<u8>,
}

/// One media message the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct SentFile {
    /// The wamid assigned.
    pub id: String,
    /// The recipient's WhatsApp id.
    pub to: String,
    /// `image`, `audio`, `video` or `document`.
    pub kind: String,
    /// The uploaded media's id.
    pub media_id: String,
    /// The caption, when given.
    pub caption: Option<String>,
    /// The document's file name, when given.
    pub filename: Option<String>,
    /// `context.message_id`: the message quoted.
    pub context: Option<String>,
}

/// A file Graph keeps: registered by a test or uploaded.
struct Media {
    bytes: Vec<u8>,
    mime: String,
    /// Set by [`FakeGraph::expire_media`]: its URL answers 404.
    expired: bool,
    /// A URL named instead of this server's (a foreign host, for tests).
    url: Option<String>,
}

#[derive(Default)]
struct Book {
    next_id: u64,
    media: HashMap<String, Media>,
    uploads: Vec<Upload>,
    sent_files: Vec<SentFile>,
    sent: Vec<Sent>,
    reads: Vec<Read>,
    failures: Faults<Failure>,
    closed: Vec<String>,
    expired: bool,
    /// When each text send arrived, answered or not.
    send_attempts: Vec<Instant>,
}

/// The business name the fake's number is verified under.
pub const VERIFIED_NAME: &str = "Talaria Test Business";

/// The fake's number as WhatsApp shows it.
pub const DISPLAY_PHONE_NUMBER: &str = "+1 555-010-0199";

struct Shared {
    addr: SocketAddr,
    token: String,
    phone_number_id: String,
    core: Core<Book, Request>,
}

/// A fake Graph API (see the module docs).
pub struct FakeGraph {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl FakeGraph {
    /// Starts the server on 127.0.0.1 with an ephemeral port, accepting
    /// `token` for the number `phone_number_id`.
    ///
    /// # Panics
    /// When no local port can be bound (a broken test environment).
    pub async fn start(token: &str, phone_number_id: &str) -> FakeGraph {
        started(
            "the fake Graph API",
            Self::try_start(token, phone_number_id),
        )
    }

    /// Like [`Self::start`], returning the error instead of panicking.
    pub fn try_start(token: &str, phone_number_id: &str) -> std::io::Result<FakeGraph> {
        let (listener, addr) = bind()?;
        let shared = Arc::new(Shared {
            addr,
            token: token.to_owned(),
            phone_number_id: phone_number_id.to_owned(),
            core: Core::new(Book::default()),
        });
        let app = Router::new()
            .route("/{version}/{number}/media", axum::routing::post(upload))
            .route(
                "/whatsapp_business/attachments/",
                axum::routing::get(attachment),
            )
            .route("/{version}/{media_id}", axum::routing::get(media_info))
            .fallback(handle)
            .with_state(shared.clone());
        shared.core.serve("fake-graph", listener, app)?;
        Ok(FakeGraph { addr, shared })
    }

    /// `http://127.0.0.1:PORT`: the `graph_base` to configure.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every text message accepted, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.core.read().sent.clone()
    }

    /// Registers a file as WhatsApp holds one a user sent: the media id to
    /// put in a message's `image`/`audio`/`document` object.
    pub fn add_media(&self, bytes: &[u8], mime: &str) -> String {
        self.insert_media(bytes.to_vec(), mime, None)
    }

    /// A media id whose `GET /{media_id}` names `url` (say, on a foreign
    /// host) instead of this server's file address.
    pub fn add_media_at(&self, url: &str, mime: &str) -> String {
        self.insert_media(Vec::new(), mime, Some(url.to_owned()))
    }

    /// From now on the file's URL answers 404, as after it expired.
    pub fn expire_media(&self, media_id: &str) {
        if let Some(m) = self.shared.core.change().media.get_mut(media_id) {
            m.expired = true;
        }
    }

    fn insert_media(&self, bytes: Vec<u8>, mime: &str, url: Option<String>) -> String {
        let mut st = self.shared.core.change();
        let id = next_media_id(&mut st);
        st.media.insert(
            id.clone(),
            Media {
                bytes,
                mime: mime.to_owned(),
                expired: false,
                url,
            },
        );
        id
    }

    /// Every file uploaded, in order.
    pub fn uploads(&self) -> Vec<Upload> {
        self.shared.core.read().uploads.clone()
    }

    /// Every media message accepted, in order.
    pub fn sent_files(&self) -> Vec<SentFile> {
        self.shared.core.read().sent_files.clone()
    }

    /// Every read receipt accepted, in order.
    pub fn reads(&self) -> Vec<Read> {
        self.shared.core.read().reads.clone()
    }

    /// Every request, answered or not.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.core.requests()
    }

    /// The next send gets `failure`. Calls queue up.
    pub fn fail_next_send(&self, failure: Failure) {
        self.shared.core.change().failures.push(failure);
    }

    /// From now on, texts to `wa_id` are refused with 131047, as when the
    /// user last wrote more than 24 hours ago.
    pub fn close_window(&self, wa_id: &str) {
        self.shared.core.change().closed.push(wa_id.to_owned());
    }

    /// From now on every call gets 401 with code 190, as after the token
    /// expired or was revoked.
    pub fn expire_token(&self) {
        self.shared.core.change().expired = true;
    }

    /// Waits until at least `n` texts were accepted and returns them all.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_sent(&self, n: usize, timeout: Duration) -> Vec<Sent> {
        self.shared
            .core
            .wait_len("WhatsApp messages", n, timeout, |b| &b.sent)
            .await
    }

    /// Waits until at least `n` requests arrived and returns them all.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_requests(&self, n: usize, timeout: Duration) -> Vec<Request> {
        self.shared
            .core
            .wait_requests("Graph requests", n, timeout, |_| true)
            .await
    }

    /// Waits until at least `n` read receipts arrived and returns them all.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_reads(&self, n: usize, timeout: Duration) -> Vec<Read> {
        self.shared
            .core
            .wait_len("read receipts", n, timeout, |b| &b.reads)
            .await
    }

    /// Stops the server (also on drop).
    pub fn shutdown(&self) {
        self.shared.core.stop();
    }
}

impl Drop for FakeGraph {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn graph_error(
    status: u16,
    code: i64,
    subcode: Option<i64>,
    message: &str,
    details: Option<&str>,
) -> Response {
    // Graph calls nearly every error an OAuthException, whatever its cause.
    let mut error = json!({"message": message, "type": "OAuthException", "code": code,
                           "fbtrace_id": "AfakeTraceId0123"});
    if let Some(sub) = subcode {
        error["error_subcode"] = json!(sub);
    }
    if let Some(details) = details {
        error["error_data"] = json!({"messaging_product": "whatsapp", "details": details});
    }
    json_response(status, &json!({ "error": error }))
}

fn failure_response(failure: Failure) -> Response {
    match failure {
        Failure::Graph {
            status,
            code,
            subcode,
            message,
            details,
        } => graph_error(status, code, subcode, &message, details.as_deref()),
        Failure::TooManyRequests { retry_after } => {
            let mut r = json_response(429, &json!({"error": {"message": "Too Many Requests"}}));
            if let Some(secs) = retry_after
                && let Ok(v) = HeaderValue::from_str(&secs.to_string())
            {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
            r
        }
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let authorized = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t == shared.token);
    if is_text_send(&path, &body) {
        // Decided before the attempt is recorded: a test that sees the
        // attempt may clear the hang at once, and this one must stay lost.
        let hung = shared.core.hanging();
        shared.core.change().send_attempts.push(Instant::now());
        if hung {
            return hang_up(&shared).await;
        }
    }
    // Logged once answered, with whatever the answer changed in the book.
    let response = answer(&shared, &method, &path, &body, authorized);
    shared.core.record(Request {
        method: method.to_string(),
        path,
        body,
        authorized,
    });
    response
}

fn answer(
    shared: &Shared,
    method: &Method,
    path: &str,
    body: &Value,
    authorized: bool,
) -> Response {
    let mut st = shared.core.change();
    if !authorized {
        return graph_error(
            401,
            190,
            None,
            "Invalid OAuth access token - Cannot parse access token",
            None,
        );
    }
    if st.expired {
        return failure_response(Failure::token_expired());
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let [version, number, "messages"] = segments.as_slice() else {
        return graph_error(400, 2500, None, "Unknown path components", None);
    };
    if method != Method::POST || !version.starts_with('v') {
        return graph_error(400, 2500, None, "Unknown path components", None);
    }
    if *number != shared.phone_number_id {
        return graph_error(
            400,
            100,
            Some(33),
            &format!(
                "Unsupported post request. Object with ID '{number}' does not exist, cannot be \
                 loaded due to missing permissions, or does not support this operation."
            ),
            None,
        );
    }
    if body.get("messaging_product").and_then(Value::as_str) != Some("whatsapp") {
        return graph_error(
            400,
            100,
            None,
            "(#100) The parameter messaging_product is required.",
            None,
        );
    }
    if body.get("status").and_then(Value::as_str) == Some("read") {
        let Some(id) = body.get("message_id").and_then(Value::as_str) else {
            return graph_error(
                400,
                100,
                None,
                "(#100) The parameter message_id is required.",
                None,
            );
        };
        st.reads.push(Read {
            message_id: id.to_owned(),
            typing: body.get("typing_indicator").is_some(),
        });
        return json_response(200, &json!({"success": true}));
    }
    if let Some(failure) = st.failures.take() {
        return failure_response(failure);
    }
    let to = body.get("to").and_then(Value::as_str).unwrap_or("");
    if to.is_empty() {
        return graph_error(400, 100, None, "(#100) The parameter to is required.", None);
    }
    let kind = body.get("type").and_then(Value::as_str).unwrap_or("");
    if matches!(kind, "image" | "audio" | "video" | "document") {
        return send_file(&mut st, kind, to, body);
    }
    if kind != "text" {
        return graph_error(400, 100, None, "(#100) Invalid parameter", None);
    }
    let text = body
        .get("text")
        .and_then(|t| t.get("body"))
        .and_then(Value::as_str)
        .unwrap_or("");
    if text.trim().is_empty() {
        return graph_error(
            400,
            100,
            None,
            "(#100) The parameter text['body'] is required.",
            None,
        );
    }
    if text.chars().count() > MAX_TEXT_CHARS {
        return graph_error(
            400,
            100,
            None,
            "(#100) Param text['body'] must be at most 4096 characters long.",
            None,
        );
    }
    if st.closed.iter().any(|c| c == to) {
        return failure_response(Failure::outside_window());
    }
    st.next_id += 1;
    let id = format!("wamid.HBgLFAKE{:012}FQIAERgS", st.next_id);
    st.sent.push(Sent {
        id: id.clone(),
        to: to.to_owned(),
        body: text.to_owned(),
        preview_url: body
            .get("text")
            .and_then(|t| t.get("preview_url"))
            .and_then(Value::as_bool),
        context: body
            .get("context")
            .and_then(|c| c.get("message_id"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        at: Instant::now(),
    });
    json_response(
        200,
        &json!({"messaging_product": "whatsapp",
                "contacts": [{"input": to, "wa_id": to}],
                "messages": [{"id": id}]}),
    )
}

fn next_media_id(st: &mut Book) -> String {
    st.next_id += 1;
    format!("{}", 1_037_543_291_543_000 + st.next_id)
}

fn authorized(shared: &Shared, headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t == shared.token)
}

fn unauthorized() -> Response {
    graph_error(
        401,
        190,
        None,
        "Invalid OAuth access token - Cannot parse access token",
        None,
    )
}

fn unknown_object(id: &str, verb: &str) -> Response {
    graph_error(
        400,
        100,
        Some(33),
        &format!(
            "Unsupported {verb} request. Object with ID '{id}' does not exist, cannot be \
             loaded due to missing permissions, or does not support this operation."
        ),
        None,
    )
}

/// A media message: its object must name an uploaded (or registered)
/// media id; audio takes no caption.
fn send_file(st: &mut Book, kind: &str, to: &str, body: &Value) -> Response {
    let Some(object) = body.get(kind) else {
        return graph_error(
            400,
            100,
            None,
            &format!("(#100) The parameter {kind} is required."),
            None,
        );
    };
    let Some(media_id) = object.get("id").and_then(Value::as_str) else {
        return graph_error(400, 100, None, "(#100) Param id or link is required.", None);
    };
    if !st.media.contains_key(media_id) {
        return graph_error(400, 131053, None, "(#131053) Media upload error", None);
    }
    let caption = object
        .get("caption")
        .and_then(Value::as_str)
        .map(str::to_owned);
    if kind == "audio" && caption.is_some() {
        return graph_error(
            400,
            100,
            None,
            "(#100) Param audio['caption'] is not allowed.",
            None,
        );
    }
    if st.closed.iter().any(|c| c == to) {
        return failure_response(Failure::outside_window());
    }
    st.next_id += 1;
    let id = format!("wamid.HBgLFAKE{:012}FQIAERgS", st.next_id);
    st.sent_files.push(SentFile {
        id: id.clone(),
        to: to.to_owned(),
        kind: kind.to_owned(),
        media_id: media_id.to_owned(),
        caption,
        filename: object
            .get("filename")
            .and_then(Value::as_str)
            .map(str::to_owned),
        context: body
            .get("context")
            .and_then(|c| c.get("message_id"))
            .and_then(Value::as_str)
            .map(str::to_owned),
    });
    json_response(
        200,
        &json!({"messaging_product": "whatsapp",
                "contacts": [{"input": to, "wa_id": to}],
                "messages": [{"id": id}]}),
    )
}

/// `POST /{version}/{number}/media`: the multipart upload.
async fn upload(
    State(shared): State<Arc<Shared>>,
    Path((version, number)): Path<(String, String)>,
    headers: HeaderMap,
    mut form: Multipart,
) -> Response {
    let ok = authorized(&shared, &headers);
    let mut fields: HashMap<String, String> = HashMap::new();
    let mut file: Option<(Option<String>, Option<String>, Vec<u8>)> = None;
    loop {
        match form.next_field().await {
            Ok(Some(field)) => {
                let name = field.name().unwrap_or("").to_owned();
                let file_name = field.file_name().map(str::to_owned);
                let content_type = field.content_type().map(str::to_owned);
                let Ok(bytes) = field.bytes().await else {
                    return graph_error(400, 100, None, "(#100) unreadable multipart body", None);
                };
                if name == "file" {
                    file = Some((file_name, content_type, bytes.to_vec()));
                } else {
                    fields.insert(name, String::from_utf8_lossy(&bytes).into_owned());
                }
            }
            Ok(None) => break,
            Err(_) => return graph_error(400, 100, None, "(#100) unreadable multipart body", None),
        }
    }
    shared.core.record(Request {
        method: "POST".to_owned(),
        path: format!("/{version}/{number}/media"),
        body: json!(fields),
        authorized: ok,
    });
    if !ok {
        return unauthorized();
    }
    if number != shared.phone_number_id {
        return unknown_object(&number, "post");
    }
    let product = fields.get("messaging_product").cloned().unwrap_or_default();
    if product != "whatsapp" {
        return graph_error(
            400,
            100,
            None,
            "(#100) The parameter messaging_product is required.",
            None,
        );
    }
    let Some((file_name, content_type, bytes)) = file else {
        return graph_error(
            400,
            100,
            None,
            "(#100) The parameter file is required.",
            None,
        );
    };
    let Some(mime) = fields.get("type").cloned().filter(|t| !t.is_empty()) else {
        return graph_error(
            400,
            100,
            None,
            "(#100) The parameter type is required.",
            None,
        );
    };
    let mut st = shared.core.change();
    let id = next_media_id(&mut st);
    st.media.insert(
        id.clone(),
        Media {
            bytes: bytes.clone(),
            mime: mime.clone(),
            expired: false,
            url: None,
        },
    );
    st.uploads.push(Upload {
        id: id.clone(),
        messaging_product: product,
        mime,
        file_name,
        content_type,
        bytes,
    });
    json_response(200, &json!({ "id": id }))
}

/// `GET /{version}/{media_id}`: where the file is.
async fn media_info(
    State(shared): State<Arc<Shared>>,
    Path((version, media_id)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let ok = authorized(&shared, &headers);
    shared.core.record(Request {
        method: "GET".to_owned(),
        path: format!("/{version}/{media_id}"),
        body: Value::Null,
        authorized: ok,
    });
    if !ok {
        return unauthorized();
    }
    if media_id == shared.phone_number_id {
        return phone_number(&shared);
    }
    let st = shared.core.read();
    let Some(media) = st.media.get(&media_id) else {
        return unknown_object(&media_id, "get");
    };
    if query
        .get("phone_number_id")
        .is_some_and(|n| *n != shared.phone_number_id)
    {
        return unknown_object(&media_id, "get");
    }
    let url = media.url.clone().unwrap_or_else(|| {
        format!(
            "http://{}/whatsapp_business/attachments/?mid={media_id}&ext=1700000000&hash=ATfake",
            shared.addr
        )
    });
    let sha: String = Sha256::digest(&media.bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    json_response(
        200,
        &json!({"messaging_product": "whatsapp", "url": url, "mime_type": media.mime,
                "sha256": sha, "file_size": media.bytes.len().to_string(), "id": media_id}),
    )
}

/// `GET /{phone_number_id}`: the business number, with the fields Graph
/// returns by default.
fn phone_number(shared: &Shared) -> Response {
    json_response(
        200,
        &json!({"verified_name": VERIFIED_NAME, "code_verification_status": "VERIFIED",
                "display_phone_number": DISPLAY_PHONE_NUMBER, "quality_rating": "GREEN",
                "platform_type": "CLOUD_API", "throughput": {"level": "STANDARD"},
                "id": shared.phone_number_id}),
    )
}

/// The file's bytes, to the bearer of the token only.
async fn attachment(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let ok = authorized(&shared, &headers);
    let mid = query.get("mid").cloned().unwrap_or_default();
    shared.core.record(Request {
        method: "GET".to_owned(),
        path: format!("/whatsapp_business/attachments/?mid={mid}"),
        body: Value::Null,
        authorized: ok,
    });
    if !ok {
        return unauthorized();
    }
    let st = shared.core.read();
    match st.media.get(&mid) {
        Some(m) if !m.expired => {
            let mut r = Response::new(axum::body::Body::from(m.bytes.clone()));
            if let Ok(v) = HeaderValue::from_str(&m.mime) {
                r.headers_mut().insert(header::CONTENT_TYPE, v);
            }
            r
        }
        _ => {
            let mut r = Response::new(axum::body::Body::from("Not Found"));
            *r.status_mut() = axum::http::StatusCode::NOT_FOUND;
            r
        }
    }
}

/// `sha256=<hex HMAC-SHA256 of body under app_secret>`, the value of
/// `X-Hub-Signature-256`.
pub fn signature(app_secret: &str, body: &[u8]) -> String {
    let mut mac = match <Hmac<Sha256> as Mac>::new_from_slice(app_secret.as_bytes()) {
        Ok(m) => m,
        Err(e) => panic!("HMAC takes keys of any length: {e}"),
    };
    mac.update(body);
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256={hex}")
}

/// A text message object, as in `value.messages[]`.
pub fn text(from: &str, wamid: &str, body: &str) -> Value {
    json!({"from": from, "id": wamid, "timestamp": unix_now().to_string(), "type": "text",
           "text": {"body": body}})
}

/// A message object of any type: `{"type": kind, kind: content}`.
pub fn message(from: &str, wamid: &str, kind: &str, content: Value) -> Value {
    let mut m =
        json!({"from": from, "id": wamid, "timestamp": unix_now().to_string(), "type": kind});
    m[kind] = content;
    m
}

/// A `delivered` receipt, as in `value.statuses[]`.
pub fn delivered_status(wamid: &str, recipient: &str) -> Value {
    json!({"id": wamid, "status": "delivered", "timestamp": unix_now().to_string(),
           "recipient_id": recipient,
           "conversation": {"id": "CONVERSATION_ID", "origin": {"type": "service"}},
           "pricing": {"billable": true, "pricing_model": "PMP", "category": "service"}})
}

/// A `failed` receipt with one error, as in `value.statuses[]`.
pub fn failed_status(wamid: &str, recipient: &str, code: i64, title: &str, details: &str) -> Value {
    json!({"id": wamid, "status": "failed", "timestamp": unix_now().to_string(),
           "recipient_id": recipient,
           "errors": [{"code": code, "title": title, "message": title,
                       "error_data": {"details": details}}]})
}

/// A whole delivery for `phone_number_id`: one change with these contacts
/// (`(wa_id, profile name)`), messages and statuses.
pub fn delivery(
    phone_number_id: &str,
    contacts: &[(&str, &str)],
    messages: Vec<Value>,
    statuses: Vec<Value>,
) -> Value {
    let contacts: Vec<Value> = contacts
        .iter()
        .map(|(wa_id, name)| json!({"profile": {"name": name}, "wa_id": wa_id}))
        .collect();
    let mut value = json!({
        "messaging_product": "whatsapp",
        "metadata": {"display_phone_number": "15550783881", "phone_number_id": phone_number_id},
    });
    if !contacts.is_empty() {
        value["contacts"] = json!(contacts);
    }
    if !messages.is_empty() {
        value["messages"] = json!(messages);
    }
    if !statuses.is_empty() {
        value["statuses"] = json!(statuses);
    }
    json!({"object": "whatsapp_business_account",
           "entry": [{"id": "102290129340398", "changes": [{"field": "messages", "value": value}]}]})
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// One answer of the webhook listener.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The `Content-Type` header, when set.
    pub content_type: Option<String>,
    /// The body, as text.
    pub body: String,
}

/// Meta's side of the webhook: signs and posts deliveries to
/// `{base}/whatsapp/webhook`, and makes the verification handshake.
#[derive(Debug, Clone)]
pub struct MetaWebhook {
    url: String,
    app_secret: String,
    http: reqwest::Client,
}

impl MetaWebhook {
    /// A sender for the listener at `base` (`http://127.0.0.1:PORT`),
    /// signing with `app_secret`.
    pub fn new(base: &str, app_secret: &str) -> MetaWebhook {
        MetaWebhook {
            url: format!("{}/whatsapp/webhook", base.trim_end_matches('/')),
            app_secret: app_secret.to_owned(),
            http: reqwest::Client::new(),
        }
    }

    /// Posts `payload` signed as Meta signs it.
    pub async fn deliver(&self, payload: &Value) -> Answer {
        let body = payload.to_string().into_bytes();
        let sig = signature(&self.app_secret, &body);
        self.post(&body, Some(&sig)).await
    }

    /// Posts `body` as is, with `signature` as `X-Hub-Signature-256` (none
    /// when `None`).
    pub async fn post(&self, body: &[u8], signature: Option<&str>) -> Answer {
        let mut req = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .body(body.to_vec());
        if let Some(sig) = signature {
            req = req.header("X-Hub-Signature-256", sig);
        }
        Self::read(req).await
    }

    /// The handshake: `GET ...?hub.mode=&hub.verify_token=&hub.challenge=`.
    pub async fn verify(&self, mode: &str, token: &str, challenge: &str) -> Answer {
        let req = self.http.get(&self.url).query(&[
            ("hub.mode", mode),
            ("hub.verify_token", token),
            ("hub.challenge", challenge),
        ]);
        Self::read(req).await
    }

    async fn read(req: reqwest::RequestBuilder) -> Answer {
        let resp = match tokio::time::timeout(Duration::from_secs(15), req.send()).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => panic!("the webhook request failed: {e}"),
            Err(_) => panic!("the webhook listener did not answer within 15 s"),
        };
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = resp.text().await.unwrap_or_default();
        Answer {
            status,
            content_type,
            body,
        }
    }
}

impl FakeGraph {
    /// While set, text sends are recorded as attempts but hang unanswered
    /// and are never delivered; clearing it (or stopping the server)
    /// answers them with a 502, as a proxy that lost the request would.
    pub fn hang_send(&self, hang: bool) {
        self.shared.core.set_hang(hang);
    }

    /// When each text send arrived (read receipts aside), answered or not.
    pub fn send_attempts(&self) -> Vec<Instant> {
        self.shared.core.read().send_attempts.clone()
    }

    /// Waits until at least `n` text sends arrived, answered or not.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_send_attempts(&self, n: usize, timeout: Duration) -> Vec<Instant> {
        self.shared
            .core
            .wait_len("WhatsApp send requests", n, timeout, |b| &b.send_attempts)
            .await
    }
}

/// Whether a request sends a message (rather than marking one read).
fn is_text_send(path: &str, body: &Value) -> bool {
    path.ends_with("/messages") && body.get("status").and_then(Value::as_str) != Some("read")
}

/// Holds a hung send until the hang is cleared or the server stops, then
/// answers as a proxy that lost it.
async fn hang_up(shared: &Shared) -> Response {
    shared.core.held().await;
    json_response(
        502,
        &json!({"error": {"message": "Bad Gateway: the request was lost"}}),
    )
}
