//! Both sides of Feishu / Lark's Open Platform, for adapter and end-to-end
//! tests, written from Feishu's documentation.
//!
//! [`FakeFeishu`] is the Open Platform on 127.0.0.1 over real HTTP, as far
//! as a bot uses it. Every answer is `{code, msg, data}` (code 0 is
//! success); every call but the token's needs `Authorization: Bearer
//! <tenant_access_token>`, else HTTP 400 with code 99991663.
//!
//! - `POST /open-apis/auth/v3/tenant_access_token/internal` `{app_id,
//!   app_secret}` → `{code, msg, tenant_access_token, expire}`; a test can
//!   make the current token invalid ([`FakeFeishu::invalidate_token`]).
//! - `GET /open-apis/bot/v3/info` → `{code, msg, bot: {open_id, app_name}}`.
//! - `POST /open-apis/im/v1/messages?receive_id_type=chat_id|open_id|thread_id`
//!   and `POST /open-apis/im/v1/messages/:id/reply` (`reply_in_thread`),
//!   each with `msg_type` `text`, `post` or `interactive` and `content` a
//!   JSON string; a `uuid` seen before gets the first message back and
//!   posts nothing. A card (`interactive`, card JSON 1.0 `elements` or 2.0
//!   `body.elements`) must be an object whose elements all have a `tag`,
//!   else 230099; a card request over 30 KB is refused with 230025.
//! - `PATCH /open-apis/im/v1/messages/:id` `{content}` replaces a card
//!   ([`FakeFeishu::card`], [`FakeFeishu::patches`]). As Feishu: only a
//!   card can be patched (anything else 400, 230001 "This message is NOT a
//!   card"), only a shared one (`config.update_multi: true` in the card
//!   sent and in its replacement, else 230001), a request over 30 KB is
//!   230025, a sixth patch of one card within a second 230020 (the
//!   frequency limit), a withdrawn message 230011.
//!   A withdrawn parent ([`FakeFeishu::withdraw`]) answers 230011, an
//!   unknown one 231003. Queued failures ([`FakeFeishu::fail_next_send`])
//!   answer the next sends, e.g. 429 with code 99991400 and
//!   `x-ogw-ratelimit-reset`.
//! - `POST/DELETE /open-apis/im/v1/messages/:id/reactions[/:reaction_id]`.
//! - Drive comments: `POST /open-apis/drive/v1/files/:token/comments/batch_query`,
//!   `POST /open-apis/drive/v1/metas/batch_query`,
//!   `POST …/comments/:comment_id/replies` (1069302 for a comment that
//!   takes no replies), `POST …/files/:token/new_comments`, and the paged
//!   lists `GET …/files/:token/comments` (`file_type` required; `is_whole`,
//!   `page_size` ≤ 100, default 50; `page_token`) and
//!   `GET …/comments/:comment_id/replies`, each answering `{items,
//!   has_more, page_token}`.
//! - `GET /open-apis/docx/v1/documents/:id/raw_content` → `{content}`; an
//!   unknown document 404 with code 1770002, one the app may not read
//!   ([`FakeFeishu::forbid_document`]) 403 with code 1770032.
//! - Uploads, multipart: `POST /open-apis/im/v1/images` needs
//!   `image_type=message` and a non-empty `image` part of at most 10 MB
//!   (→ `{image_key}`); `POST /open-apis/im/v1/files` needs `file_type`
//!   (opus, mp4, pdf, doc, xls, ppt or stream), `file_name` and a
//!   non-empty `file` part of at most 30 MB (→ `{file_key}`). Anything
//!   else is 400 with code 234001; every accepted upload is recorded
//!   ([`FakeFeishu::uploads`]). A message of type `image` must carry a key
//!   the image upload gave, `file` / `audio` / `media` one the file upload
//!   gave (`audio` only an opus one, `media` only an mp4 one).
//! - `GET /open-apis/im/v1/messages/:id/resources/:key?type=image|file`
//!   serves a resource a test registered on a message
//!   ([`FakeFeishu::add_resource`]) with its type and length; a wrong or
//!   missing `type` is 400 (234001), an unknown message or key 404
//!   (234003).
//!
//! The long connection: `POST /callback/ws/endpoint` `{AppID, AppSecret}`
//! (no token; 514 for wrong credentials) names `ws://…/ws?device_id=…&
//! service_id=…`; every WebSocket message there is a binary protobuf
//! `pbbp2.Frame`. A pushed event ([`FakeFeishu::push_event`]) goes out as
//! a data frame (`type: event`), in two parts (`sum`/`seq`) when its JSON
//! is longer than 300 bytes; it counts as delivered only once the client
//! answers the frame with the payload `{"code":200}`, and everything not
//! delivered is sent again on the next connection. A `type: ping` control
//! frame is answered with a `type: pong` frame carrying a ClientConfig.
//!
//! A card callback ([`card_action`], a click on a button) goes out over
//! the long connection as a data frame of type `card`
//! ([`FakeFeishu::push_card_action`]); the client's answer frame carries
//! `{"code":200,"data":<base64 of the answer's JSON>}`, read back with
//! [`FakeFeishu::wait_for_card_answer`].
//!
//! [`event`], [`sign`] and [`encrypt`] build what Feishu posts to a webhook:
//! the v2 envelope, `X-Lark-Signature` and the `{"encrypt": …}` body.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aes::cipher::{BlockEncryptMut, KeyIvInit, block_padding::Pkcs7};
use axum::Router;
use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{DefaultBodyLimit, Multipart, State};
use axum::http::{HeaderMap, HeaderValue, Method, Uri, header};
use axum::response::IntoResponse;
use axum::response::Response;
use base64::Engine;
use prost::Message as _;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::fake::{Core, Faults, bind, started};
use crate::json_response;

/// The code of an invalid tenant access token.
pub const TOKEN_INVALID: i64 = 99_991_663;

/// Feishu's largest image upload.
pub const MAX_IMAGE_BYTES: usize = 10 * 1024 * 1024;

/// Feishu's largest file upload.
pub const MAX_FILE_BYTES: usize = 30 * 1024 * 1024;

/// Request bodies the fake reads: a largest file with its form around it.
const UPLOAD_BODY_LIMIT: usize = MAX_FILE_BYTES + 1024 * 1024;

/// The upload's `file_type`s.
const FILE_TYPES: &[&str] = &["opus", "mp4", "pdf", "doc", "xls", "ppt", "stream"];

/// Feishu's largest card request (create, reply or patch).
pub const MAX_CARD_REQUEST_BYTES: usize = 30 * 1024;

/// Patches one card may take within a second.
const PATCHES_PER_SECOND: usize = 5;

/// A button on a card.
#[derive(Debug, Clone, PartialEq)]
pub struct Button {
    /// What it says.
    pub label: String,
    /// What a click sends back in the callback's `action.value`.
    pub value: Value,
}

/// A card as a user sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CardView {
    /// Its Markdown and text elements, one a line.
    pub text: String,
    /// Its `note` elements' texts.
    pub notes: Vec<String>,
    /// Its buttons, in order.
    pub buttons: Vec<Button>,
}

/// One accepted patch of a card.
#[derive(Debug, Clone, PartialEq)]
pub struct Patch {
    /// The card's message.
    pub message_id: String,
    /// The card as it now shows.
    pub card: CardView,
    /// When it was accepted.
    pub at: Instant,
}

/// One message the bot posted.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// The new message's id.
    pub message_id: String,
    /// The chat it landed in.
    pub chat: String,
    /// The topic thread it landed in.
    pub thread: Option<String>,
    /// The message it replies to (replies only).
    pub parent: Option<String>,
    /// `text`, `post`, `interactive`, or a file message's type.
    pub msg_type: String,
    /// The text: a text's `text`, a post's `md`/`text` elements joined, a
    /// card's Markdown as sent.
    pub text: String,
    /// A card's notes and buttons as sent.
    pub card: Option<CardView>,
    /// The `uuid` given.
    pub uuid: Option<String>,
    /// The `image_key` or `file_key` a file message carries.
    pub key: Option<String>,
    /// When it was accepted.
    pub at: Instant,
}

/// A file the bot uploaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    /// `None` for the image upload, else the `file_type` given.
    pub file_type: Option<String>,
    /// The `file_name` field (file upload) or the part's file name.
    pub name: Option<String>,
    /// The key handed back.
    pub key: String,
    /// The bytes received.
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone)]
struct StoredResource {
    /// `image` or `file`: the `type` the download must name.
    kind: &'static str,
    content_type: String,
    bytes: Vec<u8>,
}

#[derive(Debug, Clone)]
enum Document {
    Readable(String),
    Forbidden,
}

/// One reply the bot posted in a comment thread (or a new comment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommentReply {
    /// The document's token.
    pub file_token: String,
    /// The `file_type` query parameter (or body field).
    pub file_type: String,
    /// The thread's comment id; `None` for a new whole-document comment.
    pub comment_id: Option<String>,
    /// The text of its elements.
    pub text: String,
}

/// A reaction the bot added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reaction {
    /// The message it is on.
    pub message_id: String,
    /// Its emoji type (`Typing`).
    pub emoji: String,
    /// Its id.
    pub reaction_id: String,
    /// Whether the bot removed it again.
    pub removed: bool,
}

/// A failure the next send takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The HTTP status.
    pub status: u16,
    /// Feishu's code.
    pub code: i64,
    /// `x-ogw-ratelimit-reset`, seconds.
    pub reset: Option<u64>,
}

impl Failure {
    /// A rate limit asking to wait `secs` seconds.
    pub fn rate_limited(secs: u64) -> Failure {
        Failure {
            status: 429,
            code: 99_991_400,
            reset: Some(secs),
        }
    }
}

#[derive(Debug, Clone)]
struct Known {
    chat: String,
    thread: Option<String>,
    /// A card the bot sent, as it shows now, and its JSON.
    card: Option<(CardView, Value)>,
    /// When it was patched, the last second's worth.
    patched_at: Vec<Instant>,
}

impl Known {
    fn new(chat: &str, thread: Option<&str>) -> Known {
        Known {
            chat: chat.to_owned(),
            thread: thread.map(str::to_owned),
            card: None,
            patched_at: Vec::new(),
        }
    }
}

#[derive(Debug, Clone)]
struct Comment {
    file_token: String,
    /// Insertion order: lists are in it.
    seq: u64,
    is_whole: bool,
    quote: String,
    replies: Vec<(String, String)>,
    /// Calls to batch_query that still find nothing (reads lag writes).
    lag: usize,
    closed: bool,
}

/// One header of a [`Frame`] (`pbbp2.Header`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct FrameHeader {
    /// `key` = 1.
    #[prost(string, required, tag = "1")]
    pub key: String,
    /// `value` = 2.
    #[prost(string, required, tag = "2")]
    pub value: String,
}

/// `pbbp2.Frame`, as Feishu's SDKs define it (proto2).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Frame {
    /// `SeqID` = 1.
    #[prost(uint64, required, tag = "1")]
    pub seq_id: u64,
    /// `LogID` = 2.
    #[prost(uint64, required, tag = "2")]
    pub log_id: u64,
    /// `service` = 3.
    #[prost(int32, required, tag = "3")]
    pub service: i32,
    /// `method` = 4: 0 control, 1 data.
    #[prost(int32, required, tag = "4")]
    pub method: i32,
    /// `headers` = 5.
    #[prost(message, repeated, tag = "5")]
    pub headers: Vec<FrameHeader>,
    /// `payload_encoding` = 6.
    #[prost(string, optional, tag = "6")]
    pub payload_encoding: Option<String>,
    /// `payload_type` = 7.
    #[prost(string, optional, tag = "7")]
    pub payload_type: Option<String>,
    /// `payload` = 8.
    #[prost(bytes = "vec", optional, tag = "8")]
    pub payload: Option<Vec<u8>>,
    /// `LogIDNew` = 9.
    #[prost(string, optional, tag = "9")]
    pub log_id_new: Option<String>,
}

fn frame_header<'a>(f: &'a Frame, key: &str) -> Option<&'a str> {
    f.headers
        .iter()
        .find(|h| h.key == key)
        .map(|h| h.value.as_str())
}

/// The service id the fake's socket URL names.
pub const SERVICE_ID: i32 = 7;

/// An event (or card callback) pushed over the long connection.
#[derive(Debug, Clone)]
struct Pushed {
    frame_id: String,
    /// The frame's `type` header: `event` or `card`.
    kind: &'static str,
    payload: Vec<u8>,
    delivered: bool,
    /// The payload of the client's answer frame.
    answer: Option<Value>,
}

enum Command {
    Frame(Vec<u8>),
    Drop,
}

#[derive(Default)]
struct Book {
    pushed: Vec<Pushed>,
    socket_connections: usize,
    live: Option<mpsc::UnboundedSender<Command>>,
    pings: usize,
    tokens_issued: usize,
    token: String,
    sent: Vec<Sent>,
    patches: Vec<Patch>,
    send_attempts: Vec<Instant>,
    by_uuid: HashMap<String, String>,
    messages: HashMap<String, Known>,
    withdrawn: HashSet<String>,
    reactions: Vec<Reaction>,
    failures: Faults<Failure>,
    comments: HashMap<String, Comment>,
    titles: HashMap<String, String>,
    comment_replies: Vec<CommentReply>,
    next: u64,
    unauthorized: usize,
    uploads: Vec<Upload>,
    /// message id → key → the resource.
    resources: HashMap<String, HashMap<String, StoredResource>>,
    documents: HashMap<String, Document>,
    /// `METHOD path?query` of every authorized call.
    calls: Vec<String>,
}

struct Shared {
    app_id: String,
    app_secret: String,
    bot_open_id: String,
    core: Core<Book>,
}

/// The fake Open Platform (see the module docs).
pub struct FakeFeishu {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Drop for FakeFeishu {
    fn drop(&mut self) {
        self.shared.core.stop();
    }
}

impl FakeFeishu {
    /// Starts the fake for one app whose bot has `bot_open_id`.
    ///
    /// # Panics
    /// When no local port can be bound.
    pub async fn start(app_id: &str, app_secret: &str, bot_open_id: &str) -> FakeFeishu {
        started(
            "the fake Feishu Open Platform",
            Self::try_start(app_id, app_secret, bot_open_id),
        )
    }

    /// Like [`Self::start`], returning the error instead of panicking.
    pub fn try_start(
        app_id: &str,
        app_secret: &str,
        bot_open_id: &str,
    ) -> std::io::Result<FakeFeishu> {
        let (listener, addr) = bind()?;
        let shared = Arc::new(Shared {
            app_id: app_id.to_owned(),
            app_secret: app_secret.to_owned(),
            bot_open_id: bot_open_id.to_owned(),
            core: Core::new(Book::default()),
        });
        let app = Router::new()
            .route("/ws", axum::routing::get(socket))
            .route("/open-apis/im/v1/images", axum::routing::post(upload_image))
            .route("/open-apis/im/v1/files", axum::routing::post(upload_file))
            .fallback(handle)
            .layer(DefaultBodyLimit::max(UPLOAD_BODY_LIMIT))
            .with_state(shared.clone());
        shared.core.serve("fake-feishu", listener, app)?;
        Ok(FakeFeishu { addr, shared })
    }

    /// `http://127.0.0.1:PORT`: the base URL to configure.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Pushes an event envelope over the long connection (now, or on the
    /// next connection).
    pub fn push_event(&self, envelope: &Value) {
        self.push(envelope, "event");
    }

    /// Pushes a card callback over the long connection (a frame of type
    /// `card`); returns its frame id, for [`Self::wait_for_card_answer`].
    pub fn push_card_action(&self, envelope: &Value) -> String {
        self.push(envelope, "card")
    }

    fn push(&self, envelope: &Value, kind: &'static str) -> String {
        let mut st = self.shared.core.change();
        st.next += 1;
        let pushed = Pushed {
            frame_id: format!("frame_{}", st.next),
            kind,
            payload: envelope.to_string().into_bytes(),
            delivered: false,
            answer: None,
        };
        if let Some(live) = &st.live {
            for f in data_frames(&pushed) {
                let _ = live.send(Command::Frame(f));
            }
        }
        let id = pushed.frame_id.clone();
        st.pushed.push(pushed);
        id
    }

    /// Waits for the client's answer to frame `frame_id` with code 200 and
    /// returns what its `data` holds: the JSON the clicker is shown
    /// (`Value::Null` when it holds none).
    ///
    /// # Panics
    /// When no such answer comes within `timeout`, or its `data` is not
    /// base64 of JSON.
    pub async fn wait_for_card_answer(&self, frame_id: &str, timeout: Duration) -> Value {
        let answer = self
            .shared
            .core
            .wait(
                &format!("the answer to card callback frame {frame_id}"),
                timeout,
                |b| {
                    b.pushed
                        .iter()
                        .find(|p| p.frame_id == frame_id && p.delivered)
                        .and_then(|p| p.answer.clone())
                },
                |b| {
                    b.pushed
                        .iter()
                        .find(|p| p.frame_id == frame_id)
                        .map(|p| p.answer.clone())
                },
            )
            .await;
        match answer.get("data").and_then(Value::as_str) {
            None => Value::Null,
            Some(data) => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .unwrap_or_else(|e| panic!("the answer's data is not base64: {e}"));
                serde_json::from_slice(&bytes)
                    .unwrap_or_else(|e| panic!("the answer's data is not JSON: {e}"))
            }
        }
    }

    /// How many long connections were opened.
    pub fn socket_connections(&self) -> usize {
        self.shared.core.read().socket_connections
    }

    /// Waits until `n` long connections were opened.
    pub async fn wait_for_socket_connections(&self, n: usize, timeout: Duration) {
        self.shared
            .core
            .wait(
                &format!("{n} Feishu long connections"),
                timeout,
                |b| (b.socket_connections >= n).then_some(()),
                |b| b.socket_connections,
            )
            .await;
    }

    /// Pushed events not yet answered with `{"code":200}`.
    pub fn undelivered(&self) -> usize {
        self.shared
            .core
            .read()
            .pushed
            .iter()
            .filter(|p| !p.delivered)
            .count()
    }

    /// Waits until every pushed event was answered with `{"code":200}`.
    pub async fn wait_for_all_delivered(&self, timeout: Duration) {
        self.shared
            .core
            .wait(
                "every Feishu event answered with code 200",
                timeout,
                |b| b.pushed.iter().all(|p| p.delivered).then_some(()),
                |b| b.pushed.iter().filter(|p| !p.delivered).count(),
            )
            .await;
    }

    /// Pings received over the long connection.
    pub fn pings(&self) -> usize {
        self.shared.core.read().pings
    }

    /// Closes the live long connection.
    pub fn drop_connection(&self) {
        if let Some(live) = self.shared.core.change().live.take() {
            let _ = live.send(Command::Drop);
        }
    }

    /// Registers a message a user posted, so replies to it can land.
    pub fn add_message(&self, message_id: &str, chat: &str, thread: Option<&str>) {
        self.shared
            .core
            .change()
            .messages
            .insert(message_id.to_owned(), Known::new(chat, thread));
    }

    /// A card the bot sent, as it shows now (after its patches).
    pub fn card(&self, message_id: &str) -> Option<CardView> {
        self.shared
            .core
            .read()
            .messages
            .get(message_id)
            .and_then(|k| k.card.as_ref())
            .map(|(view, _)| view.clone())
    }

    /// Every patch accepted, in order.
    pub fn patches(&self) -> Vec<Patch> {
        self.shared.core.read().patches.clone()
    }

    /// Waits until a card the bot sent shows what `done` looks for, and
    /// returns it.
    pub async fn wait_for_card(
        &self,
        message_id: &str,
        timeout: Duration,
        done: impl Fn(&CardView) -> bool,
    ) -> CardView {
        self.shared
            .core
            .wait(
                &format!("card {message_id} to show what the test waits for"),
                timeout,
                |b| {
                    b.messages
                        .get(message_id)
                        .and_then(|k| k.card.as_ref())
                        .map(|(view, _)| view)
                        .filter(|v| done(v))
                        .cloned()
                },
                |b| {
                    b.messages
                        .get(message_id)
                        .and_then(|k| k.card.as_ref())
                        .map(|(view, _)| view.clone())
                },
            )
            .await
    }

    /// The message is withdrawn: replies to it answer 230011.
    pub fn withdraw(&self, message_id: &str) {
        self.shared
            .core
            .change()
            .withdrawn
            .insert(message_id.to_owned());
    }

    /// Registers a comment on a document (its quote and its replies as
    /// `(reply_id, text)`); batch_query finds nothing the first `lag` times.
    pub fn add_comment(
        &self,
        file_token: &str,
        title: &str,
        comment_id: &str,
        quote: &str,
        replies: &[(&str, &str)],
        lag: usize,
    ) {
        let mut st = self.shared.core.change();
        st.titles.insert(file_token.to_owned(), title.to_owned());
        st.next += 1;
        let seq = st.next;
        st.comments.insert(
            comment_id.to_owned(),
            Comment {
                file_token: file_token.to_owned(),
                seq,
                is_whole: quote.is_empty(),
                quote: quote.to_owned(),
                replies: replies
                    .iter()
                    .map(|(i, t)| ((*i).to_owned(), (*t).to_owned()))
                    .collect(),
                lag,
                closed: false,
            },
        );
    }

    /// Registers a file a user sent in message `message_id` under `key`
    /// (an `image_key` when `image`, else a `file_key`).
    pub fn add_resource(
        &self,
        message_id: &str,
        key: &str,
        image: bool,
        content_type: &str,
        bytes: &[u8],
    ) {
        self.shared
            .core
            .change()
            .resources
            .entry(message_id.to_owned())
            .or_default()
            .insert(
                key.to_owned(),
                StoredResource {
                    kind: if image { "image" } else { "file" },
                    content_type: content_type.to_owned(),
                    bytes: bytes.to_vec(),
                },
            );
    }

    /// Registers a docx document and its plain text.
    pub fn add_document(&self, document_id: &str, text: &str) {
        self.shared
            .core
            .change()
            .documents
            .insert(document_id.to_owned(), Document::Readable(text.to_owned()));
    }

    /// The document exists but is not shared with the app: 403, 1770032.
    pub fn forbid_document(&self, document_id: &str) {
        self.shared
            .core
            .change()
            .documents
            .insert(document_id.to_owned(), Document::Forbidden);
    }

    /// Every file uploaded, in order.
    pub fn uploads(&self) -> Vec<Upload> {
        self.shared.core.read().uploads.clone()
    }

    /// `METHOD path?query` of every call made with a valid token, in order.
    pub fn calls(&self) -> Vec<String> {
        self.shared.core.read().calls.clone()
    }

    /// The comment takes no replies (solved, or whole-document): 1069302.
    pub fn close_comment(&self, comment_id: &str) {
        if let Some(c) = self.shared.core.change().comments.get_mut(comment_id) {
            c.closed = true;
        }
    }

    /// Every message posted, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.core.read().sent.clone()
    }

    /// Waits until `n` messages were posted.
    pub async fn wait_for_sent(&self, n: usize, timeout: Duration) -> Vec<Sent> {
        self.shared
            .core
            .wait_len("sent Feishu messages", n, timeout, |b| &b.sent)
            .await
    }

    /// When each send (create or reply) arrived.
    pub fn send_attempts(&self) -> Vec<Instant> {
        self.shared.core.read().send_attempts.clone()
    }

    /// Waits until `n` sends arrived.
    pub async fn wait_for_send_attempts(&self, n: usize, timeout: Duration) {
        self.shared
            .core
            .wait_len("Feishu send attempts", n, timeout, |b| &b.send_attempts)
            .await;
    }

    /// While set, sends hang unanswered and post nothing.
    pub fn hang_send(&self, on: bool) {
        self.shared.core.set_hang(on);
    }

    /// The next send fails with `failure`.
    pub fn fail_next_send(&self, failure: Failure) {
        self.shared.core.change().failures.push(failure);
    }

    /// The current tenant token stops working (as at its expiry).
    pub fn invalidate_token(&self) {
        self.shared.core.change().token = String::new();
    }

    /// How many tenant tokens were issued.
    pub fn tokens_issued(&self) -> usize {
        self.shared.core.read().tokens_issued
    }

    /// How many calls were refused for a bad token.
    pub fn unauthorized(&self) -> usize {
        self.shared.core.read().unauthorized
    }

    /// Reactions the bot added.
    pub fn reactions(&self) -> Vec<Reaction> {
        self.shared.core.read().reactions.clone()
    }

    /// The chat a registered message is in.
    pub fn chat_of(&self, message_id: &str) -> Option<String> {
        self.shared
            .core
            .read()
            .messages
            .get(message_id)
            .map(|k| k.chat.clone())
    }

    /// Replies and comments posted on documents, in order.
    pub fn comment_replies(&self) -> Vec<CommentReply> {
        self.shared.core.read().comment_replies.clone()
    }

    /// Waits until `n` comment replies were posted.
    pub async fn wait_for_comment_replies(&self, n: usize, timeout: Duration) -> Vec<CommentReply> {
        self.shared
            .core
            .wait_len("Feishu comment replies", n, timeout, |b| &b.comment_replies)
            .await
    }
}

/// Checks the bearer token and records the call; the refusal (like
/// Feishu's: 400, 99991663) when the token is wrong.
fn authorize(shared: &Shared, headers: &HeaderMap, method: &Method, uri: &Uri) -> Option<Response> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let mut st = shared.core.change();
    if st.token.is_empty() || presented != st.token {
        st.unauthorized += 1;
        return Some(err(
            400,
            TOKEN_INVALID,
            "Invalid access token for authorization",
        ));
    }
    st.calls.push(format!("{method} {uri}"));
    None
}

/// One comment as the comment APIs answer it.
fn comment_json(id: &str, c: &Comment, bot: &str) -> Value {
    let replies: Vec<Value> = c.replies.iter().map(|r| reply_json(r, bot)).collect();
    json!({"comment_id": id, "is_whole": c.is_whole, "is_solved": c.closed && !c.is_whole,
        "quote": c.quote, "has_more": false, "reply_list": {"replies": replies}})
}

/// One reply: the bot mentioned, then the text.
fn reply_json((rid, text): &(String, String), bot: &str) -> Value {
    json!({"reply_id": rid, "user_id": "ou_commenter", "content": {"elements": [
        {"type": "person", "person": {"user_id": bot}},
        {"type": "text_run", "text_run": {"text": text}},
    ]}})
}

/// One page of `items`: `page_size` (default 50, 1..=100) from the
/// offset `page_token` names.
fn page(uri: &Uri, items: Vec<Value>) -> Response {
    let size = match query_param(uri, "page_size") {
        None => 50,
        Some(s) => match s.parse::<usize>() {
            Ok(n) if (1..=100).contains(&n) => n,
            _ => return err(400, 1_069_301, "invalid page_size"),
        },
    };
    let start = match query_param(uri, "page_token") {
        None => 0,
        Some(t) => match t.parse::<usize>() {
            Ok(n) if n <= items.len() => n,
            _ => return err(400, 1_069_301, "invalid page_token"),
        },
    };
    let end = (start + size).min(items.len());
    let has_more = end < items.len();
    let mut data = json!({"items": items[start..end].to_vec(), "has_more": has_more});
    if has_more {
        data["page_token"] = json!(end.to_string());
    }
    ok(data)
}

/// A multipart form read whole: its text fields and its file parts
/// (part name → file name and bytes).
type Form = (
    HashMap<String, String>,
    HashMap<String, (Option<String>, Vec<u8>)>,
);

async fn read_form(mut form: Multipart) -> Result<Form, Response> {
    let mut fields = HashMap::new();
    let mut files = HashMap::new();
    loop {
        match form.next_field().await {
            Ok(Some(field)) => {
                let name = field.name().unwrap_or("").to_owned();
                let file_name = field.file_name().map(str::to_owned);
                let is_file = file_name.is_some() || field.content_type().is_some();
                let Ok(bytes) = field.bytes().await else {
                    return Err(err(400, 234_001, "Invalid request param: unreadable form"));
                };
                if is_file {
                    files.insert(name, (file_name, bytes.to_vec()));
                } else {
                    fields.insert(name, String::from_utf8_lossy(&bytes).into_owned());
                }
            }
            Ok(None) => return Ok((fields, files)),
            Err(_) => return Err(err(400, 234_001, "Invalid request param: not a form")),
        }
    }
}

/// `POST /open-apis/im/v1/images`.
async fn upload_image(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    form: Multipart,
) -> Response {
    if let Some(refused) = authorize(&shared, &headers, &method, &uri) {
        return refused;
    }
    let (fields, mut files) = match read_form(form).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    if fields.get("image_type").map(String::as_str) != Some("message") {
        return err(400, 234_001, "Invalid request param: image_type");
    }
    let Some((name, bytes)) = files.remove("image") else {
        return err(400, 234_001, "Invalid request param: image");
    };
    if bytes.is_empty() || bytes.len() > MAX_IMAGE_BYTES {
        return err(400, 234_006, "The image size exceeds the limit or is empty");
    }
    let mut st = shared.core.change();
    st.next += 1;
    let key = format!("img_v3_kit{}", st.next);
    st.uploads.push(Upload {
        file_type: None,
        name,
        key: key.clone(),
        bytes,
    });
    ok(json!({"image_key": key}))
}

/// `POST /open-apis/im/v1/files`.
async fn upload_file(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    form: Multipart,
) -> Response {
    if let Some(refused) = authorize(&shared, &headers, &method, &uri) {
        return refused;
    }
    let (fields, mut files) = match read_form(form).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    let Some(file_type) = fields
        .get("file_type")
        .filter(|t| FILE_TYPES.contains(&t.as_str()))
    else {
        return err(400, 234_001, "Invalid request param: file_type");
    };
    let Some(file_name) = fields.get("file_name").filter(|n| !n.is_empty()) else {
        return err(400, 234_001, "Invalid request param: file_name");
    };
    if fields
        .get("duration")
        .is_some_and(|d| d.parse::<u64>().is_err())
    {
        return err(400, 234_001, "Invalid request param: duration");
    }
    let Some((_, bytes)) = files.remove("file") else {
        return err(400, 234_001, "Invalid request param: file");
    };
    if bytes.is_empty() || bytes.len() > MAX_FILE_BYTES {
        return err(400, 234_006, "The file size exceeds the limit or is empty");
    }
    let mut st = shared.core.change();
    st.next += 1;
    let key = format!("file_v3_kit{}", st.next);
    st.uploads.push(Upload {
        file_type: Some(file_type.clone()),
        name: Some(file_name.clone()),
        key: key.clone(),
        bytes,
    });
    ok(json!({"file_key": key}))
}

fn ok(data: Value) -> Response {
    json_response(200, &json!({"code": 0, "msg": "success", "data": data}))
}

fn err(status: u16, code: i64, msg: &str) -> Response {
    json_response(status, &json!({"code": code, "msg": msg}))
}

fn query_param(uri: &Uri, name: &str) -> Option<String> {
    uri.query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| v.to_owned())
    })
}

/// The key a file message carries, when an upload gave it and it fits
/// the message type.
fn file_key(st: &Book, msg_type: &str, content: &str) -> Option<String> {
    let v: Value = serde_json::from_str(content).ok()?;
    let field = if msg_type == "image" {
        "image_key"
    } else {
        "file_key"
    };
    let key = v.get(field)?.as_str()?;
    let upload = st.uploads.iter().find(|u| u.key == key)?;
    let fits = matches!(
        (msg_type, upload.file_type.as_deref()),
        ("image", None) | ("file", Some(_)) | ("audio", Some("opus")) | ("media", Some("mp4"))
    );
    fits.then(|| key.to_owned())
}

/// The text a user reads of a `text` or `post` content.
fn read_content(msg_type: &str, content: &str) -> Option<String> {
    let v: Value = serde_json::from_str(content).ok()?;
    match msg_type {
        "text" => v.get("text")?.as_str().map(str::to_owned),
        "post" => {
            let body = v.as_object()?.values().next()?;
            let rows = body.get("content")?.as_array()?;
            let lines: Vec<String> = rows
                .iter()
                .map(|row| {
                    row.as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|el| el.get("text").and_then(Value::as_str))
                        .collect::<String>()
                })
                .collect();
            Some(lines.join("\n"))
        }
        _ => None,
    }
}

/// A card's JSON (1.0 `elements`, or 2.0 `body.elements`) as a user sees
/// it; `None` when Feishu could not render it.
fn read_card(content: &str) -> Option<(CardView, Value)> {
    let card: Value = serde_json::from_str(content).ok()?;
    let elements = card
        .get("elements")
        .or_else(|| card.pointer("/body/elements"))?
        .as_array()?;
    let mut view = CardView::default();
    let mut lines = Vec::new();
    for el in elements {
        read_element(el, &mut view, &mut lines)?;
    }
    view.text = lines.join("\n");
    Some((view, card))
}

/// Reads one element (and those inside it) into `view`; `None` for one
/// without a `tag`.
fn read_element(el: &Value, view: &mut CardView, lines: &mut Vec<String>) -> Option<()> {
    let text_of = |v: &Value| v.get("content").and_then(Value::as_str).map(str::to_owned);
    match el.get("tag")?.as_str()? {
        "markdown" => lines.push(text_of(el)?),
        "div" => lines.push(el.get("text").and_then(text_of)?),
        "note" => {
            for inner in el.get("elements")?.as_array()? {
                view.notes.extend(text_of(inner));
            }
        }
        "action" => {
            for inner in el.get("actions")?.as_array()? {
                read_element(inner, view, lines)?;
            }
        }
        "button" => {
            // 1.0 carries the callback's value on the button, 2.0 in a
            // `callback` behavior.
            let value = el.get("value").cloned().or_else(|| {
                el.get("behaviors")?
                    .as_array()?
                    .iter()
                    .find(|b| b["type"] == "callback")?
                    .get("value")
                    .cloned()
            });
            view.buttons.push(Button {
                label: el.get("text").and_then(text_of)?,
                value: value.unwrap_or(Value::Null),
            });
        }
        _ => {}
    }
    Some(())
}

/// Whether a card is shared (`config.update_multi`), which Feishu needs
/// of a card before and after a patch.
fn shared_card(card: &Value) -> bool {
    card.pointer("/config/update_multi") == Some(&Value::Bool(true))
}

/// `PATCH /open-apis/im/v1/messages/:id`.
fn patch(shared: &Shared, message_id: &str, raw_len: usize, body: &Value) -> Response {
    let mut st = shared.core.change();
    if st.withdrawn.contains(message_id) {
        return err(400, 230_011, "the message was withdrawn");
    }
    let Some(known) = st.messages.get_mut(message_id) else {
        return err(400, 231_003, "the message is not found");
    };
    let Some((_, before)) = known.card.as_ref() else {
        return err(
            400,
            230_001,
            "Your request contains an invalid request parameter, ext=This message is NOT a card",
        );
    };
    if raw_len > MAX_CARD_REQUEST_BYTES {
        return err(
            400,
            230_025,
            "The length of the message content reaches its limit",
        );
    }
    let Some((view, card)) = body["content"].as_str().and_then(read_card) else {
        return err(400, 230_099, "Failed to create card content");
    };
    if !shared_card(before) || !shared_card(&card) {
        return err(
            400,
            230_001,
            "Your request contains an invalid request parameter, ext=the card is not shared \
             (config.update_multi)",
        );
    }
    let now = Instant::now();
    known
        .patched_at
        .retain(|at| now.duration_since(*at) < Duration::from_secs(1));
    if known.patched_at.len() >= PATCHES_PER_SECOND {
        return err(400, 230_020, "This operation triggers the frequency limit");
    }
    known.patched_at.push(now);
    known.card = Some((view.clone(), card));
    st.patches.push(Patch {
        message_id: message_id.to_owned(),
        card: view,
        at: now,
    });
    ok(json!({}))
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let raw_len = body.len();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if path == "/callback/ws/endpoint" && method == Method::POST {
        if body["AppID"] != shared.app_id.as_str()
            || body["AppSecret"] != shared.app_secret.as_str()
        {
            return json_response(200, &json!({"code": 514, "msg": "auth failed"}));
        }
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("127.0.0.1");
        return json_response(
            200,
            &json!({"code": 0, "msg": "ok", "data": {
                "URL": format!("ws://{host}/ws?device_id=dev_kit&service_id={SERVICE_ID}"),
                "ClientConfig": {"ReconnectCount": -1, "ReconnectInterval": 120,
                    "ReconnectNonce": 30, "PingInterval": 120},
            }}),
        );
    }
    if path == "/open-apis/auth/v3/tenant_access_token/internal" && method == Method::POST {
        if body["app_id"] != shared.app_id.as_str()
            || body["app_secret"] != shared.app_secret.as_str()
        {
            return err(400, 10_014, "app secret invalid");
        }
        let mut st = shared.core.change();
        st.tokens_issued += 1;
        st.token = format!("t-kit-{}", st.tokens_issued);
        return json_response(
            200,
            &json!({"code": 0, "msg": "ok", "tenant_access_token": st.token, "expire": 7200}),
        );
    }
    if let Some(refused) = authorize(&shared, &headers, &method, &uri) {
        return refused;
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method.as_str(), segments.as_slice()) {
        (
            "GET",
            [
                "open-apis",
                "im",
                "v1",
                "messages",
                message_id,
                "resources",
                key,
            ],
        ) => {
            let st = shared.core.read();
            let Some(found) = st.resources.get(*message_id).and_then(|r| r.get(*key)) else {
                return err(404, 234_003, "the resource is not found in the message");
            };
            if query_param(&uri, "type").as_deref() != Some(found.kind) {
                return err(400, 234_001, "Invalid request param: type");
            }
            let mut r = Response::new(axum::body::Body::from(found.bytes.clone()));
            if let Ok(v) = HeaderValue::from_str(&found.content_type) {
                r.headers_mut().insert(header::CONTENT_TYPE, v);
            }
            r.headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(found.bytes.len()));
            r
        }
        ("GET", ["open-apis", "docx", "v1", "documents", id, "raw_content"]) => {
            match shared.core.read().documents.get(*id) {
                Some(Document::Readable(text)) => ok(json!({"content": text})),
                Some(Document::Forbidden) => err(403, 1_770_032, "forbidden"),
                None => err(404, 1_770_002, "not found"),
            }
        }
        ("GET", ["open-apis", "drive", "v1", "files", token, "comments"]) => {
            if query_param(&uri, "file_type").is_none() {
                return err(400, 1_069_301, "file_type is required");
            }
            let whole = query_param(&uri, "is_whole");
            let st = shared.core.read();
            let mut found: Vec<(&String, &Comment)> = st
                .comments
                .iter()
                .filter(|(_, c)| c.file_token == *token)
                .filter(|(_, c)| match whole.as_deref() {
                    Some("true") => c.is_whole,
                    Some("false") => !c.is_whole,
                    _ => true,
                })
                .collect();
            found.sort_by_key(|(_, c)| c.seq);
            let items = found
                .into_iter()
                .map(|(id, c)| comment_json(id, c, &shared.bot_open_id))
                .collect();
            page(&uri, items)
        }
        (
            "GET",
            [
                "open-apis",
                "drive",
                "v1",
                "files",
                token,
                "comments",
                comment_id,
                "replies",
            ],
        ) => {
            if query_param(&uri, "file_type").is_none() {
                return err(400, 1_069_301, "file_type is required");
            }
            let st = shared.core.read();
            let Some(c) = st
                .comments
                .get(*comment_id)
                .filter(|c| c.file_token == *token)
            else {
                return err(404, 1_069_303, "comment not found");
            };
            let items = c
                .replies
                .iter()
                .map(|r| reply_json(r, &shared.bot_open_id))
                .collect();
            page(&uri, items)
        }
        ("GET", ["open-apis", "bot", "v3", "info"]) => json_response(
            200,
            &json!({"code": 0, "msg": "ok", "bot": {
                "open_id": shared.bot_open_id, "app_name": "Talaria", "activate_status": 2,
            }}),
        ),
        ("POST", ["open-apis", "im", "v1", "messages"]) => {
            let id_type = query_param(&uri, "receive_id_type").unwrap_or_default();
            send(&shared, None, Some(id_type), raw_len, &body).await
        }
        ("POST", ["open-apis", "im", "v1", "messages", parent, "reply"]) => {
            send(&shared, Some((*parent).to_owned()), None, raw_len, &body).await
        }
        ("PATCH", ["open-apis", "im", "v1", "messages", id]) => patch(&shared, id, raw_len, &body),
        ("POST", ["open-apis", "im", "v1", "messages", id, "reactions"]) => {
            let mut st = shared.core.change();
            if !st.messages.contains_key(*id) {
                return err(400, 231_003, "message not found");
            }
            st.next += 1;
            let reaction_id = format!("r_{}", st.next);
            let emoji = body
                .pointer("/reaction_type/emoji_type")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            st.reactions.push(Reaction {
                message_id: (*id).to_owned(),
                emoji: emoji.clone(),
                reaction_id: reaction_id.clone(),
                removed: false,
            });
            ok(json!({"reaction_id": reaction_id, "reaction_type": {"emoji_type": emoji}}))
        }
        ("DELETE", ["open-apis", "im", "v1", "messages", id, "reactions", rid]) => {
            let mut st = shared.core.change();
            match st
                .reactions
                .iter_mut()
                .find(|r| r.message_id == *id && r.reaction_id == *rid)
            {
                Some(r) => {
                    r.removed = true;
                    ok(json!({"reaction_id": rid}))
                }
                None => err(400, 231_003, "reaction not found"),
            }
        }
        ("POST", ["open-apis", "drive", "v1", "metas", "batch_query"]) => {
            let st = shared.core.read();
            let metas: Vec<Value> = body["request_docs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|d| {
                    let token = d["doc_token"].as_str()?;
                    let title = st.titles.get(token)?;
                    Some(
                        json!({"doc_token": token, "doc_type": d["doc_type"], "title": title,
                        "url": format!("https://example.feishu.cn/docx/{token}")}),
                    )
                })
                .collect();
            ok(json!({"metas": metas, "failed_list": []}))
        }
        (
            "POST",
            [
                "open-apis",
                "drive",
                "v1",
                "files",
                _token,
                "comments",
                "batch_query",
            ],
        ) => {
            let mut st = shared.core.change();
            let mut items = Vec::new();
            for id in body["comment_ids"].as_array().into_iter().flatten() {
                let Some(id) = id.as_str() else { continue };
                let Some(c) = st.comments.get_mut(id) else {
                    continue;
                };
                if c.lag > 0 {
                    c.lag -= 1;
                    continue;
                }
                items.push(comment_json(id, c, &shared.bot_open_id));
            }
            ok(json!({"items": items}))
        }
        (
            "POST",
            [
                "open-apis",
                "drive",
                "v1",
                "files",
                token,
                "comments",
                comment_id,
                "replies",
            ],
        ) => {
            let mut st = shared.core.change();
            match st.comments.get(*comment_id) {
                None => return err(404, 1_069_303, "comment not found"),
                Some(c) if c.closed => return err(400, 1_069_302, "comment cannot be replied"),
                Some(_) => {}
            }
            let text: String = body
                .pointer("/content/elements")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|e| e.pointer("/text_run/text").and_then(Value::as_str))
                .collect();
            st.next += 1;
            let reply_id = format!("reply_{}", st.next);
            if let Some(c) = st.comments.get_mut(*comment_id) {
                c.replies.push((reply_id.clone(), text.clone()));
            }
            st.comment_replies.push(CommentReply {
                file_token: (*token).to_owned(),
                file_type: query_param(&uri, "file_type").unwrap_or_default(),
                comment_id: Some((*comment_id).to_owned()),
                text,
            });
            ok(json!({"reply_id": reply_id}))
        }
        ("POST", ["open-apis", "drive", "v1", "files", token, "new_comments"]) => {
            let mut st = shared.core.change();
            let text: String = body["reply_elements"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e.get("text").and_then(Value::as_str))
                .collect();
            let Some(file_type) = body["file_type"].as_str().filter(|t| !t.is_empty()) else {
                return err(400, 1_069_301, "file_type is required");
            };
            if text.is_empty() {
                return err(400, 1_069_301, "reply_elements is empty");
            }
            st.next += 1;
            let seq = st.next;
            let comment_id = format!("comment_{seq}");
            st.comments.insert(
                comment_id.clone(),
                Comment {
                    file_token: (*token).to_owned(),
                    seq,
                    is_whole: true,
                    quote: String::new(),
                    replies: vec![(format!("reply_{seq}"), text.clone())],
                    lag: 0,
                    closed: true,
                },
            );
            st.comment_replies.push(CommentReply {
                file_token: (*token).to_owned(),
                file_type: file_type.to_owned(),
                comment_id: None,
                text,
            });
            ok(json!({"comment_id": comment_id}))
        }
        _ => err(404, 404, "not found"),
    }
}

async fn send(
    shared: &Shared,
    parent: Option<String>,
    id_type: Option<String>,
    raw_len: usize,
    body: &Value,
) -> Response {
    let hung = shared.core.hanging();
    shared.core.change().send_attempts.push(Instant::now());
    if hung {
        shared.core.held().await;
        return err(502, 1, "the request was lost");
    }
    let mut st = shared.core.change();
    if let Some(f) = st.failures.take() {
        let mut r = err(f.status, f.code, "request trigger frequency limit");
        if let Some(reset) = f.reset
            && let Ok(v) = HeaderValue::from_str(&reset.to_string())
        {
            r.headers_mut().insert("x-ogw-ratelimit-reset", v);
        }
        return r;
    }
    let msg_type = body["msg_type"].as_str().unwrap_or("").to_owned();
    let content = body["content"].as_str().unwrap_or("");
    let mut card = None;
    let (text, key) = match msg_type.as_str() {
        "image" | "file" | "audio" | "media" => match file_key(&st, &msg_type, content) {
            Some(key) => (String::new(), Some(key)),
            None => {
                return err(
                    400,
                    230_001,
                    "invalid message content: unknown or unfit key",
                );
            }
        },
        "interactive" => {
            if raw_len > MAX_CARD_REQUEST_BYTES {
                return err(
                    400,
                    230_025,
                    "The length of the message content reaches its limit",
                );
            }
            match read_card(content) {
                Some((view, json)) => {
                    let text = view.text.clone();
                    card = Some((view, json));
                    (text, None)
                }
                None => return err(400, 230_099, "Failed to create card content"),
            }
        }
        _ => match read_content(&msg_type, content) {
            Some(text) => (text, None),
            None => return err(400, 230_001, "invalid message content"),
        },
    };
    if text.chars().count() > 30_000 {
        return err(400, 230_025, "the message is too long");
    }
    let uuid = body["uuid"].as_str().map(str::to_owned);
    if let Some(u) = &uuid
        && let Some(id) = st.by_uuid.get(u)
    {
        return ok(json!({"message_id": id}));
    }
    let (chat, thread) = match (&parent, id_type.as_deref()) {
        (Some(p), _) => {
            if st.withdrawn.contains(p) {
                return err(400, 230_011, "the message was withdrawn");
            }
            let Some(known) = st.messages.get(p) else {
                return err(400, 231_003, "the message is not found");
            };
            let in_thread = body["reply_in_thread"].as_bool().unwrap_or(false);
            let thread = if in_thread {
                Some(known.thread.clone().unwrap_or_else(|| format!("omt_{p}")))
            } else {
                None
            };
            (known.chat.clone(), thread)
        }
        (None, Some("chat_id" | "open_id")) => {
            (body["receive_id"].as_str().unwrap_or("").to_owned(), None)
        }
        (None, Some("thread_id")) => {
            let thread = body["receive_id"].as_str().unwrap_or("").to_owned();
            let chat = st
                .messages
                .values()
                .find(|k| k.thread.as_deref() == Some(thread.as_str()))
                .map(|k| k.chat.clone());
            let Some(chat) = chat else {
                return err(400, 230_002, "the thread is not found");
            };
            (chat, Some(thread))
        }
        _ => return err(400, 99_992_402, "field validation failed: receive_id_type"),
    };
    if chat.is_empty() {
        return err(400, 230_002, "the chat is not found");
    }
    st.next += 1;
    let message_id = format!("om_bot_{}", st.next);
    if let Some(u) = &uuid {
        st.by_uuid.insert(u.clone(), message_id.clone());
    }
    let mut known = Known::new(&chat, thread.as_deref());
    known.card = card.clone();
    st.messages.insert(message_id.clone(), known);
    st.sent.push(Sent {
        message_id: message_id.clone(),
        chat: chat.clone(),
        thread: thread.clone(),
        parent,
        msg_type,
        text,
        card: card.map(|(view, _)| view),
        uuid,
        key,
        at: Instant::now(),
    });
    ok(json!({"message_id": message_id, "chat_id": chat, "thread_id": thread}))
}

/// A v2 event envelope, as Feishu posts it.
pub fn event(event_id: &str, event_type: &str, token: &str, body: Value) -> Value {
    json!({
        "schema": "2.0",
        "header": {
            "event_id": event_id, "event_type": event_type, "create_time": "1700000000000",
            "token": token, "app_id": "cli_kit", "tenant_key": "tenant_kit",
        },
        "event": body,
    })
}

/// The body of a `card.action.trigger` callback: `operator` clicked a
/// button whose value is `value` on card `message_id` in `chat_id`. Wrap
/// it with [`event`] (event type `card.action.trigger`).
pub fn card_action(operator: &str, message_id: &str, chat_id: &str, value: &Value) -> Value {
    json!({
        "operator": {"tenant_key": "tenant_kit", "user_id": "u_x", "open_id": operator,
            "union_id": "on_x"},
        "token": format!("c-kit-{message_id}"),
        "action": {"tag": "button", "value": value},
        "host": "im_message",
        "context": {"open_message_id": message_id, "open_chat_id": chat_id},
    })
}

/// The body of an `im.message.receive_v1` text message.
pub fn text_message(
    sender_open_id: &str,
    message_id: &str,
    chat_id: &str,
    chat_type: &str,
    thread_id: Option<&str>,
    text: &str,
    mentions: Value,
) -> Value {
    let mut body = typed_message(
        sender_open_id,
        message_id,
        chat_id,
        chat_type,
        "text",
        &json!({"text": text}),
    );
    body["message"]["mentions"] = mentions;
    if let Some(t) = thread_id {
        body["message"]["thread_id"] = json!(t);
        body["message"]["root_id"] = json!(format!("om_root_{t}"));
    }
    body
}

/// The body of an `im.message.receive_v1` message of any `message_type`
/// (`image`, `file`, `audio`, `media`, `post`), its `content` given as
/// JSON and sent as the string Feishu sends.
pub fn typed_message(
    sender_open_id: &str,
    message_id: &str,
    chat_id: &str,
    chat_type: &str,
    message_type: &str,
    content: &Value,
) -> Value {
    json!({
        "sender": {"sender_id": {"open_id": sender_open_id, "user_id": "u_x", "union_id": "on_x"},
            "sender_type": "user", "tenant_key": "tenant_kit"},
        "message": {
            "message_id": message_id, "chat_id": chat_id, "chat_type": chat_type,
            "message_type": message_type, "create_time": "1700000000000",
            "content": content.to_string(),
            "mentions": [],
        },
    })
}

/// The `X-Lark-Signature` of a body: hex SHA-256 of
/// `timestamp + nonce + encrypt_key + body`.
pub fn sign(timestamp: &str, nonce: &str, encrypt_key: &str, body: &[u8]) -> String {
    let mut d = Sha256::new();
    d.update(timestamp.as_bytes());
    d.update(nonce.as_bytes());
    d.update(encrypt_key.as_bytes());
    d.update(body);
    d.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// `{"encrypt": base64(iv ‖ AES-256-CBC(PKCS#7(plain)))}` under SHA-256 of
/// the encrypt key, with the IV given.
pub fn encrypt(encrypt_key: &str, iv: [u8; 16], plain: &[u8]) -> Value {
    let key: [u8; 32] = Sha256::digest(encrypt_key.as_bytes()).into();
    let cipher = cbc::Encryptor::<aes::Aes256>::new(&key.into(), &iv.into())
        .encrypt_padded_vec_mut::<Pkcs7>(plain);
    let mut blob = iv.to_vec();
    blob.extend_from_slice(&cipher);
    json!({"encrypt": base64::engine::general_purpose::STANDARD.encode(blob)})
}

/// The data frames that carry one pushed event.
fn data_frames(p: &Pushed) -> Vec<Vec<u8>> {
    let chunks: Vec<&[u8]> = if p.payload.len() > 300 {
        let mid = p.payload.len() / 2;
        vec![&p.payload[..mid], &p.payload[mid..]]
    } else {
        vec![&p.payload[..]]
    };
    let sum = chunks.len();
    // The parts go out last first: the client must order them by `seq`.
    chunks
        .iter()
        .enumerate()
        .rev()
        .map(|(seq, chunk)| {
            let headers = [
                ("type", p.kind.to_owned()),
                ("message_id", p.frame_id.clone()),
                ("sum", sum.to_string()),
                ("seq", seq.to_string()),
                ("trace_id", format!("trace_{}", p.frame_id)),
            ];
            Frame {
                seq_id: 0,
                log_id: 0,
                service: SERVICE_ID,
                method: 1,
                headers: headers
                    .into_iter()
                    .map(|(k, v)| FrameHeader {
                        key: k.to_owned(),
                        value: v,
                    })
                    .collect(),
                payload: Some(chunk.to_vec()),
                ..Frame::default()
            }
            .encode_to_vec()
        })
        .collect()
}

async fn socket(State(shared): State<Arc<Shared>>, upgrade: WebSocketUpgrade) -> Response {
    upgrade
        .on_upgrade(move |ws| serve_socket(shared, ws))
        .into_response()
}

async fn serve_socket(shared: Arc<Shared>, mut ws: WebSocket) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let resend: Vec<Vec<u8>> = {
        let mut st = shared.core.change();
        st.socket_connections += 1;
        // A new connection replaces the old one.
        if let Some(old) = st.live.replace(tx.clone()) {
            let _ = old.send(Command::Drop);
        }
        st.pushed
            .iter()
            .filter(|p| !p.delivered)
            .flat_map(data_frames)
            .collect()
    };
    for f in resend {
        if ws.send(Message::Binary(f.into())).await.is_err() {
            return;
        }
    }
    loop {
        tokio::select! {
            () = shared.core.stopped() => return,
            cmd = rx.recv() => match cmd {
                Some(Command::Frame(f)) => {
                    if ws.send(Message::Binary(f.into())).await.is_err() {
                        break;
                    }
                }
                Some(Command::Drop) | None => break,
            },
            incoming = ws.recv() => match incoming {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break,
                Some(Ok(Message::Binary(bytes))) => {
                    let Ok(frame) = Frame::decode(bytes.as_ref()) else { continue };
                    if let Some(pong) = on_client_frame(&shared, &tx, frame)
                        && ws.send(Message::Binary(pong.into())).await.is_err()
                    {
                        break;
                    }
                }
                Some(Ok(_)) => {}
            },
        }
    }
    let mut st = shared.core.change();
    if st.live.as_ref().is_some_and(|l| l.same_channel(&tx)) {
        st.live = None;
    }
}

/// A ping gets a pong; a data frame's answer marks its event delivered
/// when it says code 200 (and only on the live connection).
fn on_client_frame(
    shared: &Shared,
    tx: &mpsc::UnboundedSender<Command>,
    frame: Frame,
) -> Option<Vec<u8>> {
    let mut st = shared.core.change();
    if !st.live.as_ref().is_some_and(|l| l.same_channel(tx)) {
        return None;
    }
    match (frame.method, frame_header(&frame, "type")) {
        (0, Some("ping")) => {
            st.pings += 1;
            let config = json!({"ReconnectCount": -1, "ReconnectInterval": 120,
                "ReconnectNonce": 30, "PingInterval": 120});
            Some(
                Frame {
                    service: frame.service,
                    method: 0,
                    headers: vec![FrameHeader {
                        key: "type".into(),
                        value: "pong".into(),
                    }],
                    payload: Some(config.to_string().into_bytes()),
                    ..Frame::default()
                }
                .encode_to_vec(),
            )
        }
        (1, _) => {
            let answer = frame
                .payload
                .as_deref()
                .and_then(|p| serde_json::from_slice::<Value>(p).ok());
            let ok = answer.as_ref().is_some_and(|v| v["code"] == 200);
            let id = frame_header(&frame, "message_id").unwrap_or("").to_owned();
            if let Some(p) = st.pushed.iter_mut().find(|p| p.frame_id == id) {
                p.delivered |= ok;
                p.answer = answer;
            }
            None
        }
        _ => None,
    }
}
