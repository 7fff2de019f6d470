//! A fake BlueBubbles server, for adapter and end-to-end tests, written
//! from the BlueBubbles server's REST API documentation
//! (docs.bluebubbles.app, "REST API" and "Webhooks").
//!
//! Every route needs the server password as the `guid` (or `password`)
//! query parameter, else 401. Answers are `{status, message, data}`,
//! errors `{status, message, error: {type, message}}`:
//!
//! - `GET /api/v1/ping`, `GET /api/v1/server/info` (`server_version`,
//!   `os_version`, `detected_icloud`: the signed-in iCloud account,
//!   [`ICLOUD_ACCOUNT`]; `private_api`, `helper_connected`: on unless
//!   [`FakeBlueBubbles::set_private_api`]);
//! - `GET`/`POST /api/v1/webhook`, `DELETE /api/v1/webhook/{id}`: the
//!   registrations, kept across gateway restarts as the server keeps them;
//! - `POST /api/v1/message/text` `{chatGuid, tempGuid, message, method,
//!   selectedMessageGuid?, partIndex?}`: the chat must exist (else 400),
//!   `method: private-api` needs the Private API (else 400); the sent
//!   message joins the server's list with `isFromMe: true`, as Messages
//!   records it;
//! - `POST /api/v1/message/attachment` (multipart: `attachment`,
//!   `chatGuid`, `name`, `tempGuid`, `isAudioMessage`);
//! - `POST /api/v1/message/query` `{after, limit, sort, with}`: the
//!   messages created after `after`, oldest first;
//! - `POST /api/v1/chat/query`, `POST /api/v1/chat/new`;
//! - `POST /api/v1/chat/{guid}/typing`, `POST /api/v1/chat/{guid}/read`;
//! - `GET /api/v1/attachment/{guid}/download`.
//!
//! [`FakeBlueBubbles::receive`] is a message arriving in Messages: it
//! joins the list the query endpoint reads, and the `new-message` payload
//! the server posts to its webhooks is returned for the kit to post.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Multipart, Query, State};
use axum::http::{Method, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::fake::{Core, Faults, bind, started};
use crate::json_response;

/// The iCloud account the fake server's Mac is signed in to.
pub const ICLOUD_ACCOUNT: &str = "talaria.test@icloud.com";

/// A failure the next text send gets.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// An error envelope with this status and message.
    Status(u16, String),
}

/// One text the server sent for the bot.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// The new message's guid.
    pub guid: String,
    /// The chat guid.
    pub chat: String,
    /// The text.
    pub text: String,
    /// `apple-script` or `private-api`.
    pub method: String,
    /// The message replied to (Private API only).
    pub selected: Option<String>,
    /// The client's `tempGuid`.
    pub temp_guid: String,
    /// When it was accepted.
    pub at: Instant,
}

/// One attachment the bot sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Upload {
    /// The chat guid.
    pub chat: String,
    /// The `name` field.
    pub name: String,
    /// Sent as a voice message.
    pub is_audio: bool,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// Any request, recorded as it arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path.
    pub path: String,
    /// The JSON body (`null` when none).
    pub body: Value,
    /// The password was right.
    pub authorized: bool,
}

#[derive(Default)]
struct Book {
    next: u64,
    webhooks: Vec<(u64, String, Vec<String>)>,
    chats: Vec<Value>,
    messages: Vec<Value>,
    sent: Vec<Sent>,
    uploads: Vec<Upload>,
    files: HashMap<String, (Vec<u8>, String)>,
    typing: Vec<String>,
    reads: Vec<String>,
    failures: Faults<Failure>,
    send_attempts: Vec<Instant>,
    no_private_api: bool,
    last_ms: i64,
}

impl Book {
    fn id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// A creation time after every one given before (the clock, or one
    /// millisecond past the last).
    fn now_ms(&mut self) -> i64 {
        let clock = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        self.last_ms = clock.max(self.last_ms + 1);
        self.last_ms
    }

    fn chat(&mut self, guid: &str, display_name: &str) -> Value {
        if let Some(c) = self.chats.iter().find(|c| c["guid"] == guid) {
            return c.clone();
        }
        let identifier = guid.rsplit(';').next().unwrap_or(guid);
        let chat = json!({"guid": guid, "chatIdentifier": identifier,
                          "displayName": display_name, "style": if guid.contains(";+;") { 43 } else { 45 }});
        self.chats.push(chat.clone());
        chat
    }
}

struct Shared {
    password: String,
    core: Core<Book, Request>,
}

/// A fake BlueBubbles server (see the module docs).
pub struct FakeBlueBubbles {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

/// A file a user sends.
#[derive(Debug, Clone)]
pub struct File {
    /// Its type.
    pub mime: String,
    /// Its name.
    pub name: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

impl FakeBlueBubbles {
    /// Starts the server on 127.0.0.1 with an ephemeral port.
    ///
    /// # Panics
    /// When no local port can be bound.
    pub fn start(password: &str) -> FakeBlueBubbles {
        started("the fake BlueBubbles server", Self::try_start(password))
    }

    /// Like [`Self::start`], returning the error.
    pub fn try_start(password: &str) -> std::io::Result<FakeBlueBubbles> {
        let (listener, addr) = bind()?;
        let shared = Arc::new(Shared {
            password: password.to_owned(),
            core: Core::new(Book::default()),
        });
        let app = Router::new()
            .route(
                "/api/v1/message/attachment",
                axum::routing::post(attachment_upload),
            )
            .fallback(handle)
            .with_state(shared.clone());
        shared.core.serve("fake-bluebubbles", listener, app)?;
        Ok(FakeBlueBubbles { addr, shared })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Turns the Private API helper on or off.
    pub fn set_private_api(&self, on: bool) {
        self.shared.core.change().no_private_api = !on;
    }

    /// A message from `sender` arrives in the chat `chat` (created if
    /// new), with `files`; returns its guid and the `new-message` payload
    /// the server posts to its webhooks.
    pub fn receive(&self, chat: &str, sender: &str, text: &str, files: &[File]) -> (String, Value) {
        let mut book = self.shared.core.change();
        let n = book.id();
        let guid = format!("p:0/FAKE-{n:06}");
        let chat_json = book.chat(chat, "");
        let mut attachments = Vec::new();
        for f in files {
            let id = format!("at_{}_{n}", book.id());
            book.files
                .insert(id.clone(), (f.bytes.clone(), f.mime.clone()));
            attachments.push(
                json!({"guid": id, "mimeType": f.mime, "transferName": f.name,
                                    "totalBytes": f.bytes.len(), "uti": "public.data"}),
            );
        }
        let message = json!({
            "guid": guid, "text": text, "isFromMe": false,
            "handle": {"address": sender, "service": "iMessage"},
            "chats": [chat_json], "attachments": attachments,
            "associatedMessageType": null, "associatedMessageGuid": null,
            "threadOriginatorGuid": null, "dateCreated": book.now_ms(),
        });
        book.messages.push(message.clone());
        (guid, json!({"type": "new-message", "data": message}))
    }

    /// The message `guid` as the server holds it.
    pub fn message(&self, guid: &str) -> Option<Value> {
        self.shared
            .core
            .read()
            .messages
            .iter()
            .find(|m| m["guid"] == guid)
            .cloned()
    }

    /// The URLs the server posts to (its webhook registrations).
    pub fn webhook_urls(&self) -> Vec<String> {
        self.shared
            .core
            .read()
            .webhooks
            .iter()
            .map(|(_, url, _)| url.clone())
            .collect()
    }

    /// Every text sent, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.core.read().sent.clone()
    }

    /// Every attachment sent, in order.
    pub fn uploads(&self) -> Vec<Upload> {
        self.shared.core.read().uploads.clone()
    }

    /// Chats typing was shown in.
    pub fn typing(&self) -> Vec<String> {
        self.shared.core.read().typing.clone()
    }

    /// Chats marked read.
    pub fn reads(&self) -> Vec<String> {
        self.shared.core.read().reads.clone()
    }

    /// When each text send arrived.
    pub fn send_attempts(&self) -> Vec<Instant> {
        self.shared.core.read().send_attempts.clone()
    }

    /// Every request.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.core.requests()
    }

    /// The next text send gets `failure`.
    pub fn fail_next_send(&self, failure: Failure) {
        self.shared.core.change().failures.push(failure);
    }

    /// While on, text sends hang and send nothing; off, the held ones get
    /// 502.
    pub fn hang_sends(&self, on: bool) {
        self.shared.core.set_hang(on);
    }

    /// Waits until `n` texts were sent.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_sent(&self, n: usize, timeout: Duration) -> Vec<Sent> {
        self.shared
            .core
            .wait_len("BlueBubbles texts", n, timeout, |b| &b.sent)
            .await
    }

    /// Waits until `n` text sends arrived.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_send_attempts(&self, n: usize, timeout: Duration) {
        self.shared
            .core
            .wait_len("BlueBubbles send attempts", n, timeout, |b| {
                &b.send_attempts
            })
            .await;
    }

    /// Waits until `n` requests matching `matches` arrived.
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

impl Drop for FakeBlueBubbles {
    fn drop(&mut self) {
        self.shared.core.stop();
    }
}

fn envelope(data: Value) -> Response {
    json_response(
        200,
        &json!({"status": 200, "message": "Success", "data": data}),
    )
}

fn error(status: u16, message: &str) -> Response {
    let kind = match status {
        401 => "Authentication Error",
        400 => "Validation Error",
        404 => "Not Found",
        _ => "Server Error",
    };
    json_response(
        status,
        &json!({"status": status, "message": message, "error": {"type": kind, "message": message}}),
    )
}

fn authorized(shared: &Shared, query: &HashMap<String, String>) -> bool {
    ["guid", "password"]
        .iter()
        .any(|k| query.get(*k).is_some_and(|p| *p == shared.password))
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    method: Method,
    uri: Uri,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let ok = authorized(&shared, &query);
    let sending = method == Method::POST && path == "/api/v1/message/text";
    let hung = sending && shared.core.hanging();
    shared.core.record(Request {
        method: method.to_string(),
        path: path.clone(),
        body: body.clone(),
        authorized: ok,
    });
    if sending {
        shared.core.change().send_attempts.push(Instant::now());
        if hung {
            shared.core.held().await;
            return error(502, "Bad Gateway");
        }
    }
    if !ok {
        return error(401, "You are not authorized to access this resource");
    }
    let segments: Vec<String> = path
        .trim_start_matches("/api/v1/")
        .split('/')
        .map(percent_decode)
        .collect();
    let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
    match (method.as_str(), segs.as_slice()) {
        ("GET", ["ping"]) => envelope(json!("pong")),
        ("GET", ["server", "info"]) => {
            let on = !shared.core.read().no_private_api;
            envelope(json!({"server_version": "1.9.9", "private_api": on,
                            "helper_connected": on, "os_version": "14.5",
                            "detected_icloud": ICLOUD_ACCOUNT}))
        }
        ("GET", ["webhook"]) => {
            let hooks: Vec<Value> = shared
                .core
                .read()
                .webhooks
                .iter()
                .map(|(id, url, events)| json!({"id": id, "url": url, "events": events}))
                .collect();
            envelope(json!(hooks))
        }
        ("POST", ["webhook"]) => {
            let Some(url) = body["url"].as_str() else {
                return error(400, "A URL is required");
            };
            let events: Vec<String> = body["events"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e.as_str().map(str::to_owned))
                .collect();
            let mut book = shared.core.change();
            let id = book.id();
            book.webhooks.push((id, url.to_owned(), events.clone()));
            envelope(json!({"id": id, "url": url, "events": events}))
        }
        ("DELETE", ["webhook", id]) => {
            let mut book = shared.core.change();
            let before = book.webhooks.len();
            book.webhooks.retain(|(w, _, _)| w.to_string() != *id);
            if book.webhooks.len() == before {
                error(404, "Webhook does not exist")
            } else {
                envelope(Value::Null)
            }
        }
        ("POST", ["message", "text"]) => send_text(&shared, &body),
        ("POST", ["message", "query"]) => {
            let after = body["after"].as_i64().unwrap_or(0);
            let limit = body["limit"].as_u64().unwrap_or(100) as usize;
            let book = shared.core.read();
            let mut found: Vec<Value> = book
                .messages
                .iter()
                .filter(|m| m["dateCreated"].as_i64().unwrap_or(0) > after)
                .cloned()
                .collect();
            found.sort_by_key(|m| m["dateCreated"].as_i64().unwrap_or(0));
            if body["sort"] == "DESC" {
                found.reverse();
            }
            found.truncate(limit);
            envelope(json!(found))
        }
        ("POST", ["chat", "query"]) => envelope(json!(shared.core.read().chats.clone())),
        ("POST", ["chat", "new"]) => {
            let Some(address) = body["addresses"][0].as_str() else {
                return error(400, "No addresses provided");
            };
            let guid = format!("iMessage;-;{address}");
            let mut book = shared.core.change();
            let chat = book.chat(&guid, "");
            if let Some(text) = body["message"].as_str().filter(|t| !t.is_empty()) {
                let temp = body["tempGuid"].as_str().unwrap_or_default().to_owned();
                record_text(&mut book, &guid, text, "apple-script", None, temp);
            }
            envelope(chat)
        }
        ("POST", ["chat", chat, "typing"]) => {
            shared.core.change().typing.push((*chat).to_owned());
            envelope(Value::Null)
        }
        ("POST", ["chat", chat, "read"]) => {
            shared.core.change().reads.push((*chat).to_owned());
            envelope(Value::Null)
        }
        ("GET", ["attachment", guid, "download"]) => match shared.core.read().files.get(*guid) {
            Some((bytes, mime)) => {
                ([(header::CONTENT_TYPE, mime.clone())], bytes.clone()).into_response()
            }
            None => error(404, "Attachment does not exist"),
        },
        _ => error(404, "Route not found"),
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn record_text(
    book: &mut Book,
    chat: &str,
    text: &str,
    method: &str,
    selected: Option<String>,
    temp_guid: String,
) -> Value {
    let n = book.id();
    let guid = format!("p:0/SENT-{n:06}");
    let message = json!({
        "guid": guid, "text": text, "isFromMe": true, "tempGuid": temp_guid,
        "handle": null, "chats": [book.chat(chat, "")], "attachments": [],
        "associatedMessageType": null, "threadOriginatorGuid": selected,
        "dateCreated": book.now_ms(),
    });
    book.messages.push(message.clone());
    book.sent.push(Sent {
        guid,
        chat: chat.to_owned(),
        text: text.to_owned(),
        method: method.to_owned(),
        selected,
        temp_guid,
        at: Instant::now(),
    });
    message
}

fn send_text(shared: &Shared, body: &Value) -> Response {
    let mut book = shared.core.change();
    if let Some(Failure::Status(status, message)) = book.failures.take() {
        return error(status, &message);
    }
    let chat = body["chatGuid"].as_str().unwrap_or_default();
    let text = body["message"].as_str().unwrap_or_default();
    let temp = body["tempGuid"].as_str().unwrap_or_default();
    if temp.is_empty() {
        return error(400, "A tempGuid is required");
    }
    if text.is_empty() {
        return error(400, "A message is required");
    }
    if !book.chats.iter().any(|c| c["guid"] == chat) {
        return error(400, "Chat does not exist!");
    }
    let method = body["method"].as_str().unwrap_or("apple-script");
    let selected = body["selectedMessageGuid"].as_str().map(str::to_owned);
    if method == "private-api" && book.no_private_api {
        return error(400, "iMessage Private API is not enabled!");
    }
    if selected.is_some() && method != "private-api" {
        return error(400, "Replies require the Private API method");
    }
    let message = record_text(&mut book, chat, text, method, selected, temp.to_owned());
    envelope(message)
}

async fn attachment_upload(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    mut form: Multipart,
) -> Response {
    let ok = authorized(&shared, &query);
    shared.core.record(Request {
        method: "POST".into(),
        path: "/api/v1/message/attachment".into(),
        body: Value::Null,
        authorized: ok,
    });
    if !ok {
        return error(401, "You are not authorized to access this resource");
    }
    let mut fields: HashMap<String, String> = HashMap::new();
    let mut bytes = None;
    while let Ok(Some(field)) = form.next_field().await {
        let name = field.name().unwrap_or_default().to_owned();
        if name == "attachment" {
            bytes = field.bytes().await.ok().map(|b| b.to_vec());
        } else if let Ok(text) = field.text().await {
            fields.insert(name, text);
        }
    }
    let (Some(bytes), Some(chat)) = (bytes, fields.get("chatGuid")) else {
        return error(400, "An attachment and a chatGuid are required");
    };
    let mut book = shared.core.change();
    if !book.chats.iter().any(|c| c["guid"] == chat.as_str()) {
        return error(400, "Chat does not exist!");
    }
    book.uploads.push(Upload {
        chat: chat.clone(),
        name: fields.get("name").cloned().unwrap_or_default(),
        is_audio: fields.get("isAudioMessage").is_some_and(|v| v == "true"),
        bytes,
    });
    let n = book.id();
    envelope(json!({"guid": format!("p:0/FILE-{n:06}"), "isFromMe": true}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_percent_decoded() {
        assert_eq!(percent_decode("iMessage%3B%2B%3Bchat1"), "iMessage;+;chat1");
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("plain"), "plain");
    }

    #[test]
    fn creation_times_only_go_forward() {
        let mut b = Book::default();
        let (x, y) = (b.now_ms(), b.now_ms());
        assert!(y > x);
    }
}
