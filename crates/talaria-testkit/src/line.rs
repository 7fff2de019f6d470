//! Both sides of LINE's Messaging API, for adapter and end-to-end tests,
//! written from LINE's API reference (developers.line.biz, "Messaging API
//! reference" and "Retry failed API requests").
//!
//! [`FakeLine`] is the API on 127.0.0.1 over real HTTP, as far as a bot
//! uses it. Every call needs `Authorization: Bearer <channel access
//! token>` (else 401 `{"message": "Authentication failed. ..."}`):
//!
//! - `POST /v2/bot/message/reply` `{replyToken, messages}`: 1 to 5
//!   messages; a reply token is single-use and valid for a minute from its
//!   event ([`FakeLine::set_reply_token_validity`]); a used, expired or
//!   unknown one gets 400 `{"message": "Invalid reply token"}`. Answered
//!   `{"sentMessages": [{"id", "quoteToken"}]}`.
//! - `POST /v2/bot/message/push` `{to, messages}`: `to` a user, group or
//!   room id; the optional `X-Line-Retry-Key` must be a hex UUID (else
//!   400), and a key accepted before gets 409 with
//!   `x-line-accepted-request-id` and the first request's
//!   `sentMessages`, sending nothing. A spent monthly quota
//!   ([`FakeLine::set_push_quota`]) gets 429 `{"message": "You have
//!   reached your monthly limit."}`.
//! - Text messages: `text` of 1 to 5000 characters (UTF-16 units), an
//!   optional `quoteToken` that must be one LINE issued in that chat
//!   (else 400), an optional `quickReply` of at most 13 items whose
//!   `message` actions have a label of at most 20 characters.
//! - `POST /v2/bot/chat/loading/start` `{chatId, loadingSeconds}`: a
//!   user id only, 5 to 60 seconds in steps of 5; answered 202 `{}`.
//! - `GET /v2/bot/info`: the bot's `userId`, `basicId`, `displayName`.
//! - `GET /v2/bot/message/{id}/content` (LINE serves it from
//!   api-data.line.me; here the same server): the bytes of a file a test
//!   registered, 404 for any other id.
//!
//! Tests queue failures for the next reply or push
//! ([`FakeLine::fail_next_send`]) and hang sends. The webhook side is the
//! event builders ([`FakeLine::text_event`], [`FakeLine::file_event`]),
//! [`webhook_body`] and [`sign`] (`x-line-signature`: base64 of the
//! HMAC-SHA256 of the raw body under the channel secret).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::fake::{Core, Faults, bind, started};
use crate::json_response;

/// LINE's longest text message, in UTF-16 code units.
pub const MAX_TEXT_LEN: usize = 5000;

/// A failure the next reply or push gets instead of being accepted.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// An error in LINE's shape: `{"message": ...}`.
    Status {
        /// The HTTP status.
        status: u16,
        /// LINE's `message`.
        message: String,
    },
    /// 429 "The API rate limit has been exceeded", with `Retry-After`
    /// when given (LINE's own carries none; a proxy's may).
    TooManyRequests {
        /// The `Retry-After` header, in seconds.
        retry_after: Option<u64>,
    },
    /// The request is carried out (the message sent, the token used),
    /// then the answer is lost: a 500 comes back, as from a proxy that
    /// lost LINE's answer.
    LostAnswer,
}

/// How a message was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// With a reply token.
    Reply,
    /// Pushed.
    Push,
}

/// One message the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// The id assigned.
    pub id: String,
    /// The chat it went to: a user, group or room id.
    pub to: String,
    /// The text exactly as sent.
    pub text: String,
    /// Reply or push.
    pub via: Via,
    /// The message its `quoteToken` quotes.
    pub quoted: Option<String>,
    /// The quick-reply buttons: (label, text sent when tapped).
    pub quick_replies: Vec<(String, String)>,
    /// The push's `X-Line-Retry-Key`.
    pub retry_key: Option<String>,
    /// When the fake accepted it.
    pub at: Instant,
}

/// Any request, recorded as it arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The request path.
    pub path: String,
    /// The JSON body (`null` when none or unparsable).
    pub body: Value,
    /// The bearer token was the right one.
    pub authorized: bool,
}

/// Where an inbound event comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A one-to-one chat with this user.
    User(String),
    /// A group, and the member who wrote.
    Group {
        /// `C…`.
        group: String,
        /// `U…`.
        user: String,
    },
    /// A multi-person chat, and the member who wrote.
    Room {
        /// `R…`.
        room: String,
        /// `U…`.
        user: String,
    },
}

impl Source {
    /// The chat an answer goes to.
    pub fn chat(&self) -> &str {
        match self {
            Source::User(u) => u,
            Source::Group { group, .. } => group,
            Source::Room { room, .. } => room,
        }
    }

    fn json(&self) -> Value {
        match self {
            Source::User(u) => json!({"type": "user", "userId": u}),
            Source::Group { group, user } => {
                json!({"type": "group", "groupId": group, "userId": user})
            }
            Source::Room { room, user } => json!({"type": "room", "roomId": room, "userId": user}),
        }
    }
}

struct ReplyToken {
    chat: String,
    issued: Instant,
    used: bool,
}

struct Content {
    bytes: Vec<u8>,
    mime: String,
}

#[derive(Default)]
struct Book {
    next_id: u64,
    reply_tokens: HashMap<String, ReplyToken>,
    /// quote token → (message id, chat).
    quote_tokens: HashMap<String, (String, String)>,
    /// retry key → the ids its push sent.
    accepted_keys: HashMap<String, Vec<String>>,
    content: HashMap<String, Content>,
    sent: Vec<Sent>,
    loading: Vec<(String, u64)>,
    failures: Faults<Failure>,
    send_attempts: Vec<Instant>,
    push_quota: Option<usize>,
    token_validity: Option<Duration>,
}

impl Book {
    fn next(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// A message id, its reply token and its quote token, issued for `chat`.
    fn issue(&mut self, chat: &str) -> (String, String, String) {
        let n = self.next();
        let id = format!("{}", 480_000_000_000_000_000u64 + n);
        let reply = format!("rt{n:030x}");
        let quote = format!("qt-{n}");
        self.reply_tokens.insert(
            reply.clone(),
            ReplyToken {
                chat: chat.to_owned(),
                issued: Instant::now(),
                used: false,
            },
        );
        self.quote_tokens
            .insert(quote.clone(), (id.clone(), chat.to_owned()));
        (id, reply, quote)
    }
}

struct Shared {
    token: String,
    bot_user_id: String,
    core: Core<Book, Request>,
}

/// A fake LINE Messaging API (see the module docs).
pub struct FakeLine {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

/// One inbound event built by the fake, with what it issued.
#[derive(Debug, Clone)]
pub struct Event {
    /// The event as LINE posts it (one item of `events`).
    pub json: Value,
    /// The message id.
    pub message_id: String,
    /// Its reply token.
    pub reply_token: String,
}

/// A mention of someone in a text: where, and whom.
#[derive(Debug, Clone)]
pub struct Mentionee {
    /// Start, in UTF-16 code units.
    pub index: usize,
    /// Length, in UTF-16 code units.
    pub length: usize,
    /// Who is mentioned.
    pub user_id: String,
    /// Whether it is the bot receiving the event.
    pub is_self: bool,
}

impl FakeLine {
    /// Starts the server on 127.0.0.1 with an ephemeral port, accepting
    /// `token` for the bot `bot_user_id`.
    ///
    /// # Panics
    /// When no local port can be bound (a broken test environment).
    pub fn start(token: &str, bot_user_id: &str) -> FakeLine {
        started("the fake LINE API", Self::try_start(token, bot_user_id))
    }

    /// Like [`Self::start`], returning the error instead of panicking.
    pub fn try_start(token: &str, bot_user_id: &str) -> std::io::Result<FakeLine> {
        let (listener, addr) = bind()?;
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            bot_user_id: bot_user_id.to_owned(),
            core: Core::new(Book::default()),
        });
        let app = Router::new()
            .route("/v2/bot/message/{id}/content", axum::routing::get(content))
            .fallback(handle)
            .with_state(shared.clone());
        shared.core.serve("fake-line", listener, app)?;
        Ok(FakeLine { addr, shared })
    }

    /// `http://127.0.0.1:PORT`: the `api_base` and `data_base` to
    /// configure.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A text message event from `source`, with `mentions`.
    pub fn text_event(&self, source: &Source, text: &str, mentions: &[Mentionee]) -> Event {
        let (id, reply, quote) = self.shared.core.change().issue(source.chat());
        let mut message = json!({"id": id, "type": "text", "text": text, "quoteToken": quote});
        if !mentions.is_empty() {
            let list: Vec<Value> = mentions
                .iter()
                .map(|m| {
                    json!({"index": m.index, "length": m.length, "type": "user",
                           "userId": m.user_id, "isSelf": m.is_self})
                })
                .collect();
            message["mention"] = json!({ "mentionees": list });
        }
        self.event(source, message, id, reply)
    }

    /// A file message event from `source`: `kind` is `image`, `video`,
    /// `audio` or `file`; the bytes are served as its content.
    pub fn file_event(
        &self,
        source: &Source,
        kind: &str,
        bytes: &[u8],
        mime: &str,
        name: Option<&str>,
    ) -> Event {
        let (id, reply, quote) = {
            let mut book = self.shared.core.change();
            let issued = book.issue(source.chat());
            book.content.insert(
                issued.0.clone(),
                Content {
                    bytes: bytes.to_vec(),
                    mime: mime.to_owned(),
                },
            );
            issued
        };
        let mut message = json!({"id": id, "type": kind,
                                 "contentProvider": {"type": "line"}});
        if kind == "image" || kind == "video" {
            message["quoteToken"] = json!(quote);
        }
        if kind == "audio" || kind == "video" {
            message["duration"] = json!(1000);
        }
        if kind == "file" {
            message["fileName"] = json!(name.unwrap_or("file"));
            message["fileSize"] = json!(bytes.len());
        }
        self.event(source, message, id, reply)
    }

    fn event(&self, source: &Source, message: Value, id: String, reply: String) -> Event {
        let n = self.shared.core.change().next();
        Event {
            json: json!({
                "type": "message",
                "message": message,
                "webhookEventId": format!("01FAKE{n:020}"),
                "deliveryContext": {"isRedelivery": false},
                "timestamp": 1_700_000_000_000u64 + n,
                "source": source.json(),
                "replyToken": reply,
                "mode": "active",
            }),
            message_id: id,
            reply_token: reply,
        }
    }

    /// The bot's user id (a body's `destination`).
    pub fn bot_user_id(&self) -> &str {
        &self.shared.bot_user_id
    }

    /// Every message accepted, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.core.read().sent.clone()
    }

    /// Every loading animation started: (chat, seconds).
    pub fn loading(&self) -> Vec<(String, u64)> {
        self.shared.core.read().loading.clone()
    }

    /// When each reply or push arrived, answered or not.
    pub fn send_attempts(&self) -> Vec<Instant> {
        self.shared.core.read().send_attempts.clone()
    }

    /// Every request, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.core.requests()
    }

    /// The next reply or push gets `failure`. Calls queue up.
    pub fn fail_next_send(&self, failure: Failure) {
        self.shared.core.change().failures.push(failure);
    }

    /// While on, replies and pushes hang unanswered and send nothing;
    /// turned off, the held ones get 502.
    pub fn hang_sends(&self, on: bool) {
        self.shared.core.set_hang(on);
    }

    /// `n` more pushes this month; `None` for no limit (the default).
    pub fn set_push_quota(&self, n: Option<usize>) {
        self.shared.core.change().push_quota = n;
    }

    /// How long a reply token stays valid (a minute unless set).
    pub fn set_reply_token_validity(&self, validity: Duration) {
        self.shared.core.change().token_validity = Some(validity);
    }

    /// Waits until at least `n` messages were accepted; returns them all.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_sent(&self, n: usize, timeout: Duration) -> Vec<Sent> {
        self.shared
            .core
            .wait_len("LINE messages", n, timeout, |b| &b.sent)
            .await
    }

    /// Waits until at least `n` replies or pushes arrived.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_send_attempts(&self, n: usize, timeout: Duration) {
        self.shared
            .core
            .wait_len("LINE send attempts", n, timeout, |b| &b.send_attempts)
            .await;
    }

    /// Waits until at least `n` requests matching `matches` arrived.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_requests(
        &self,
        what: &str,
        n: usize,
        timeout: Duration,
        matches: impl Fn(&Request) -> bool,
    ) -> Vec<Request> {
        self.shared
            .core
            .wait_requests(what, n, timeout, matches)
            .await
    }
}

impl Drop for FakeLine {
    fn drop(&mut self) {
        self.shared.core.stop();
    }
}

/// A webhook body for the bot `destination`.
pub fn webhook_body(destination: &str, events: &[Value]) -> Vec<u8> {
    json!({"destination": destination, "events": events})
        .to_string()
        .into_bytes()
}

/// `x-line-signature` for `body` under the channel secret.
pub fn sign(channel_secret: &str, body: &[u8]) -> String {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(channel_secret.as_bytes()) else {
        unreachable!("HMAC takes keys of any length");
    };
    mac.update(body);
    BASE64.encode(mac.finalize().into_bytes())
}

fn line_error(status: u16, message: &str) -> Response {
    json_response(status, &json!({ "message": message }))
}

fn body_error(property: &str, message: &str) -> Response {
    json_response(
        400,
        &json!({"message": "The request body has 1 error(s)",
                "details": [{"message": message, "property": property}]}),
    )
}

fn is_hex_uuid(key: &str) -> bool {
    let parts: Vec<&str> = key.split('-').collect();
    parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
        && parts
            .iter()
            .all(|p| p.chars().all(|c| c.is_ascii_hexdigit()))
}

fn is_line_id(id: &str, kinds: &[char]) -> bool {
    id.len() == 33
        && id.chars().next().is_some_and(|c| kinds.contains(&c))
        && id[1..]
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
}

async fn content(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let authorized = bearer_ok(&shared, &headers);
    shared.core.record(Request {
        method: "GET".into(),
        path: format!("/v2/bot/message/{id}/content"),
        body: Value::Null,
        authorized,
    });
    if !authorized {
        return unauthorized();
    }
    let book = shared.core.read();
    match book.content.get(&id) {
        Some(c) => ([(header::CONTENT_TYPE, c.mime.clone())], c.bytes.clone()).into_response(),
        None => line_error(404, "Not found"),
    }
}

fn bearer_ok(shared: &Shared, headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t == shared.token)
}

fn unauthorized() -> Response {
    line_error(
        401,
        "Authentication failed. Confirm that the access token in the authorization header is valid.",
    )
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
    let authorized = bearer_ok(&shared, &headers);
    let sending = method == Method::POST
        && matches!(
            path.as_str(),
            "/v2/bot/message/reply" | "/v2/bot/message/push"
        );
    // Decided before the request is logged: a test that sees it may clear
    // the hang at once, and this one must stay lost.
    let hung = sending && shared.core.hanging();
    shared.core.record(Request {
        method: method.to_string(),
        path: path.clone(),
        body: body.clone(),
        authorized,
    });
    if sending {
        shared.core.change().send_attempts.push(Instant::now());
        if hung {
            shared.core.held().await;
            return line_error(502, "Bad Gateway");
        }
    }
    if !authorized {
        return unauthorized();
    }
    let retry_key = headers
        .get("x-line-retry-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    match (method.as_str(), path.as_str()) {
        ("POST", "/v2/bot/message/reply") => {
            if retry_key.is_some() {
                return line_error(400, "The retry key is not supported for this API");
            }
            reply(&shared, &body)
        }
        ("POST", "/v2/bot/message/push") => push(&shared, &body, retry_key),
        ("POST", "/v2/bot/chat/loading/start") => loading(&shared, &body),
        ("GET", "/v2/bot/info") => json_response(
            200,
            &json!({"userId": shared.bot_user_id, "basicId": "@123fakeb",
                    "displayName": "Talaria", "chatMode": "bot", "markAsReadMode": "auto"}),
        ),
        _ => line_error(404, "Not found"),
    }
}

fn failure_response(failure: Failure) -> Response {
    match failure {
        Failure::LostAnswer => line_error(500, "Internal server error"),
        Failure::Status { status, message } => line_error(status, &message),
        Failure::TooManyRequests { retry_after } => {
            let mut r = line_error(
                429,
                "The API rate limit has been exceeded. Try again later.",
            );
            if let Some(secs) = retry_after
                && let Ok(v) = HeaderValue::from_str(&secs.to_string())
            {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
            r
        }
    }
}

/// One message of a reply or push, as checked.
struct Checked {
    text: String,
    quoted: Option<String>,
    quick_replies: Vec<(String, String)>,
}

/// Why LINE refuses a request body: the property and what is wrong.
struct Refusal(String, &'static str);

impl Refusal {
    fn at(property: impl Into<String>, message: &'static str) -> Refusal {
        Refusal(property.into(), message)
    }

    fn response(&self) -> Response {
        body_error(&self.0, self.1)
    }
}

/// The messages of a reply or push, checked as LINE checks them.
fn check_messages(book: &Book, body: &Value, chat: Option<&str>) -> Result<Vec<Checked>, Refusal> {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Err(Refusal::at("messages", "Must not be null"));
    };
    if messages.is_empty() || messages.len() > 5 {
        return Err(Refusal::at("messages", "Size must be between 1 and 5"));
    }
    let mut out = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        if m.get("type").and_then(Value::as_str) != Some("text") {
            return Err(Refusal::at(
                format!("messages[{i}].type"),
                "The fake accepts text messages only",
            ));
        }
        let text = m.get("text").and_then(Value::as_str).unwrap_or_default();
        let len = text.encode_utf16().count();
        if len == 0 || len > MAX_TEXT_LEN {
            return Err(Refusal::at(
                format!("messages[{i}].text"),
                "Length must be between 0 and 5000",
            ));
        }
        let quoted = match m.get("quoteToken").and_then(Value::as_str) {
            None => None,
            Some(q) => match book.quote_tokens.get(q) {
                Some((id, c)) if chat.is_none_or(|chat| chat == c) => Some(id.clone()),
                _ => {
                    return Err(Refusal::at(
                        format!("messages[{i}].quoteToken"),
                        "Invalid quote token",
                    ));
                }
            },
        };
        let mut quick = Vec::new();
        if let Some(items) = m.get("quickReply").and_then(|q| q.get("items")) {
            let items = items.as_array().cloned().unwrap_or_default();
            if items.is_empty() || items.len() > 13 {
                return Err(Refusal::at(
                    format!("messages[{i}].quickReply.items"),
                    "Size must be between 1 and 13",
                ));
            }
            for (j, item) in items.iter().enumerate() {
                let action = &item["action"];
                let label = action["label"].as_str().unwrap_or_default();
                let said = action["text"].as_str().unwrap_or_default();
                if item["type"] != "action"
                    || action["type"] != "message"
                    || label.is_empty()
                    || label.chars().count() > 20
                    || said.is_empty()
                    || said.chars().count() > 300
                {
                    return Err(Refusal::at(
                        format!("messages[{i}].quickReply.items[{j}]"),
                        "Invalid quick reply item",
                    ));
                }
                quick.push((label.to_owned(), said.to_owned()));
            }
        }
        out.push(Checked {
            text: text.to_owned(),
            quoted,
            quick_replies: quick,
        });
    }
    Ok(out)
}

/// Records the checked messages as sent; the answer's `sentMessages`.
fn record_sent(
    book: &mut Book,
    to: &str,
    via: Via,
    retry_key: Option<String>,
    messages: Vec<Checked>,
) -> Value {
    let mut ids = Vec::new();
    for Checked {
        text,
        quoted,
        quick_replies,
    } in messages
    {
        let n = book.next();
        let id = format!("{}", 590_000_000_000_000_000u64 + n);
        book.quote_tokens
            .insert(format!("qt-bot-{n}"), (id.clone(), to.to_owned()));
        book.sent.push(Sent {
            id: id.clone(),
            to: to.to_owned(),
            text,
            via,
            quoted,
            quick_replies,
            retry_key: retry_key.clone(),
            at: Instant::now(),
        });
        ids.push(json!({"id": id, "quoteToken": format!("qt-bot-{n}")}));
    }
    json!(ids)
}

fn reply(shared: &Shared, body: &Value) -> Response {
    let mut book = shared.core.change();
    let failure = book.failures.take();
    if let Some(f) = failure.clone().filter(|f| *f != Failure::LostAnswer) {
        return failure_response(f);
    }
    let token = body
        .get("replyToken")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let validity = book.token_validity.unwrap_or(Duration::from_secs(60));
    let chat = match book.reply_tokens.get(token) {
        Some(t) if !t.used && t.issued.elapsed() < validity => t.chat.clone(),
        _ => return line_error(400, "Invalid reply token"),
    };
    let messages = match check_messages(&book, body, Some(&chat)) {
        Ok(m) => m,
        Err(r) => return r.response(),
    };
    if let Some(t) = book.reply_tokens.get_mut(token) {
        t.used = true;
    }
    let sent = record_sent(&mut book, &chat, Via::Reply, None, messages);
    if let Some(lost) = failure {
        return failure_response(lost);
    }
    json_response(200, &json!({ "sentMessages": sent }))
}

fn push(shared: &Shared, body: &Value, retry_key: Option<String>) -> Response {
    let mut book = shared.core.change();
    if let Some(key) = &retry_key {
        if !is_hex_uuid(key) {
            return line_error(
                400,
                "The value for the 'X-Line-Retry-Key' header is invalid",
            );
        }
        if let Some(ids) = book.accepted_keys.get(key) {
            let sent: Vec<Value> = ids.iter().map(|id| json!({"id": id})).collect();
            let mut r = json_response(
                409,
                &json!({"message": "The retry key is already accepted", "sentMessages": sent}),
            );
            if let Ok(v) = HeaderValue::from_str(&format!("fake-request-{key}")) {
                r.headers_mut().insert("x-line-accepted-request-id", v);
            }
            return r;
        }
    }
    let failure = book.failures.take();
    if let Some(f) = failure.clone().filter(|f| *f != Failure::LostAnswer) {
        return failure_response(f);
    }
    let to = body.get("to").and_then(Value::as_str).unwrap_or_default();
    if !is_line_id(to, &['U', 'C', 'R']) {
        return line_error(
            400,
            "The property, 'to', in the request body is invalid (line: -, column: -)",
        );
    }
    let messages = match check_messages(&book, body, Some(to)) {
        Ok(m) => m,
        Err(r) => return r.response(),
    };
    match book.push_quota {
        Some(0) => return line_error(429, "You have reached your monthly limit."),
        Some(n) => book.push_quota = Some(n - 1),
        None => {}
    }
    let sent = record_sent(&mut book, to, Via::Push, retry_key.clone(), messages);
    if let Some(key) = retry_key {
        let ids = sent
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|m| m["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        book.accepted_keys.insert(key, ids);
    }
    if let Some(lost) = failure {
        return failure_response(lost);
    }
    json_response(200, &json!({ "sentMessages": sent }))
}

fn loading(shared: &Shared, body: &Value) -> Response {
    let chat = body
        .get("chatId")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let secs = body
        .get("loadingSeconds")
        .and_then(Value::as_u64)
        .unwrap_or(20);
    if !is_line_id(chat, &['U']) {
        return body_error("chatId", "Must be a user ID");
    }
    if !(5..=60).contains(&secs) || !secs.is_multiple_of(5) {
        return body_error("loadingSeconds", "Must be a multiple of 5 between 5 and 60");
    }
    shared.core.change().loading.push((chat.to_owned(), secs));
    json_response(202, &json!({}))
}
