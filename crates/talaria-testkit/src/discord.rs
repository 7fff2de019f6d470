//! A fake Discord on 127.0.0.1: the REST API (v10) over HTTP and the
//! gateway over a real WebSocket, for adapter and end-to-end tests.
//!
//! REST: `GET /api/v10/gateway/bot`, `POST /api/v10/channels/{id}/messages`
//! (JSON, or `multipart/form-data` with `payload_json` and `files[n]`)
//! and `POST /api/v10/channels/{id}/typing`, all requiring
//! `Authorization: Bot <token>`, with `X-RateLimit-*` headers on answers.
//!
//! Files: the fake is its own CDN. [`FakeDiscord::add_file`] stores a file
//! and answers an attachment object whose `url` is
//! `http://127.0.0.1:PORT/attachments/{channel}/{id}/{name}?ex=..&is=..&hm=..`,
//! served without authorization, as Discord's signed CDN addresses are,
//! and only with the right signature.
//!
//! Gateway (`/gateway` as `/gateway/bot` names it, `/resume` as READY's
//! `resume_gateway_url`): op 10 Hello, op 2 Identify (a wrong token is
//! closed with 4004), op 1 Heartbeat answered by op 11, op 6 Resume
//! replaying every dispatch of the session after the client's sequence
//! number, then `RESUMED`. Each session keeps its dispatch log with
//! sequence numbers; dispatches pushed while no connection is attached
//! wait in the log for a resume.
//!
//! Tests push messages (`push_dm`, `push_guild_message`,
//! `push_thread_message`, `push_message`), drive the connection
//! (`drop_connection`, `close_connection`, `send_reconnect`,
//! `invalidate_session`, `request_heartbeat`, `ack_heartbeats`), inject
//! REST failures (`fail_next_send_with_429`, `exhaust_bucket_next`,
//! `fail_next_send_with_status`, `hang_send`, `expire_file`) and inspect
//! what the bot did (`sent`, `uploads`, `file_fetches`, `typing`,
//! `requests`, `frames`, `connections`).
//!
//! The server runs on its own thread with its own runtime, so it keeps
//! answering while the test thread blocks, and stops when dropped.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::routing::get;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::fake::{Core, Faults, bind, started};

use handlers::{rest, upgrade};

mod handlers;

/// The bot's username in READY.
pub const BOT_USERNAME: &str = "talaria-test";

/// The rate-limit bucket the fake names for sends.
pub const SEND_BUCKET: &str = "fake-messages-bucket";

/// The largest file a message may carry in a server without boosts.
pub const MAX_UPLOAD_BYTES: usize = 10 * 1024 * 1024;

/// One file of an upload, read from its multipart part.
#[derive(Debug, Clone, PartialEq)]
pub struct UploadedFile {
    /// The form field (`files[0]`, ...).
    pub field: String,
    /// The part's `filename`.
    pub file_name: Option<String>,
    /// The part's `Content-Type`, when given.
    pub content_type: Option<String>,
    /// The bytes as received.
    pub bytes: Vec<u8>,
}

impl UploadedFile {
    /// The file's SHA-256, in lowercase hex.
    pub fn sha256(&self) -> String {
        use sha2::Digest;
        sha2::Sha256::digest(&self.bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// One message with files the fake accepted (`multipart/form-data`).
#[derive(Debug, Clone, PartialEq)]
pub struct Upload {
    /// The channel posted to.
    pub channel_id: String,
    /// `payload_json`, parsed.
    pub payload: Value,
    /// `content`, when given.
    pub content: Option<String>,
    /// `message_reference.message_id`, when given.
    pub reply_to: Option<String>,
    /// The files, in form order.
    pub files: Vec<UploadedFile>,
    /// The id the fake assigned to the message.
    pub id: String,
    /// The attachment objects of the message created (with their CDN
    /// addresses, fetchable).
    pub attachments: Vec<Value>,
    /// When the fake received it.
    pub at: Instant,
}

/// A file on the fake's CDN.
#[derive(Debug, Clone)]
struct CdnFile {
    bytes: Bytes,
    /// `/attachments/{channel}/{id}/{name}`.
    path: String,
    /// The `hm` signature the address must carry.
    signature: String,
    expired: bool,
    /// Answered with a `302 Found` to this address instead of the bytes.
    redirect: Option<String>,
}

/// One message the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// The channel posted to (a thread's own id for thread replies).
    pub channel_id: String,
    /// The message text exactly as sent.
    pub content: String,
    /// `message_reference.message_id`, when given.
    pub reply_to: Option<String>,
    /// The request's `allowed_mentions`.
    pub allowed_mentions: Value,
    /// The id the fake assigned.
    pub id: String,
    /// When the fake received it.
    pub at: Instant,
}

/// One typing request.
#[derive(Debug, Clone, PartialEq)]
pub struct Typing {
    /// The channel the bot shows typing in.
    pub channel_id: String,
    /// When the fake received it.
    pub at: Instant,
}

/// Any REST request, recorded when it arrived (before injected failures
/// or hangs).
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The HTTP method (`GET`, `POST`, ...).
    pub method: String,
    /// The path without `/api/v10`.
    pub path: String,
    /// The JSON body (`null` when there was none or it did not parse).
    pub body: Value,
    /// `Authorization` was `Bot <the token>`.
    pub authorized: bool,
    /// When the fake received it.
    pub at: Instant,
}

/// A gateway payload the client sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// The gateway opcode.
    pub op: u64,
    /// The payload's `d` field.
    pub d: Value,
    /// Which connection (1, 2, ...) it came on.
    pub connection: u64,
    /// When the fake received it.
    pub at: Instant,
}

/// A WebSocket connection the client opened.
#[derive(Debug, Clone, PartialEq)]
pub struct Connection {
    /// `/gateway` or `/resume`.
    pub path: String,
    /// The raw query string (`v=10&encoding=json`, ...).
    pub query: String,
    /// When the fake accepted it.
    pub at: Instant,
}

enum Control {
    Send(Value),
    /// Close with this code, or (`None`) drop the TCP connection without
    /// a close frame.
    Close(Option<u16>),
}

struct Attached {
    id: u64,
    tx: mpsc::UnboundedSender<Control>,
    /// The session this connection identified or resumed.
    session: Option<String>,
}

#[derive(Default)]
struct SessionLog {
    /// Every dispatch payload, in sequence order.
    events: Vec<Value>,
    next_seq: u64,
}

#[derive(Default)]
struct Book {
    heartbeat_interval_ms: u64,
    ack_heartbeats: bool,
    next_id: u64,
    next_session: u64,
    next_connection: u64,
    sessions: HashMap<String, SessionLog>,
    /// The session new dispatches go to.
    current: Option<String>,
    attached: Option<Attached>,
    /// Dispatches pushed before any session existed.
    backlog: Vec<(String, Value)>,
    /// Guild id -> its active threads (channel objects).
    guilds: BTreeMap<String, Vec<Value>>,
    sent: Vec<Sent>,
    typing: Vec<Typing>,
    frames: Vec<Frame>,
    connections: Vec<Connection>,
    readies: usize,
    resumed: usize,
    /// (`retry_after`, `global`) of each 429 the next sends get.
    fail_429: Faults<(f64, bool)>,
    fail_status: Faults<u16>,
    exhaust_next: Option<f64>,
    /// CDN files by attachment id.
    files: HashMap<String, CdnFile>,
    uploads: Vec<Upload>,
    /// CDN paths asked for (served or not), in order.
    fetches: Vec<String>,
}

struct Shared {
    token: String,
    bot_id: String,
    addr: SocketAddr,
    core: Core<Book, Request>,
}

/// A fake Discord (see the module docs).
pub struct FakeDiscord {
    shared: Arc<Shared>,
}

impl FakeDiscord {
    /// Starts the server on 127.0.0.1 with an ephemeral port, accepting
    /// `token`, with a heartbeat interval of 45 s (see
    /// [`Self::start_with_heartbeat`]).
    ///
    /// # Panics
    /// When no local port can be bound (a broken test environment).
    pub async fn start(token: &str) -> FakeDiscord {
        Self::start_blocking(token, Duration::from_millis(45_000))
    }

    /// Like [`Self::start`] with Hello's `heartbeat_interval`.
    ///
    /// # Panics
    /// When no local port can be bound.
    pub async fn start_with_heartbeat(token: &str, interval: Duration) -> FakeDiscord {
        Self::start_blocking(token, interval)
    }

    /// Like [`Self::start_with_heartbeat`], for tests without a runtime.
    ///
    /// # Panics
    /// When no local port can be bound.
    pub fn start_blocking(token: &str, interval: Duration) -> FakeDiscord {
        started("the fake Discord server", Self::try_start(token, interval))
    }

    /// Like [`Self::start_blocking`], returning the error instead.
    pub fn try_start(token: &str, interval: Duration) -> std::io::Result<FakeDiscord> {
        let (listener, addr) = bind()?;
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            bot_id: "900000000000000001".to_owned(),
            addr,
            core: Core::new(Book {
                heartbeat_interval_ms: u64::try_from(interval.as_millis()).unwrap_or(45_000).max(1),
                ack_heartbeats: true,
                next_id: 1_200_000_000_000_000_000,
                ..Book::default()
            }),
        });
        let app = Router::new()
            .route("/gateway", get(upgrade))
            .route("/resume", get(upgrade))
            .fallback(rest)
            // Uploads over the 2 MB axum stops at by default; the fake
            // answers 413 past Discord's own limit itself.
            .layer(DefaultBodyLimit::max(4 * MAX_UPLOAD_BYTES))
            .with_state(shared.clone());
        shared.core.serve("fake-discord", listener, app)?;
        Ok(FakeDiscord { shared })
    }

    /// `http://127.0.0.1:PORT/api/v10`: the adapter's `api_base`.
    pub fn api_base(&self) -> String {
        format!("http://{}/api/v10", self.shared.addr)
    }

    /// `ws://127.0.0.1:PORT/gateway`: what `/gateway/bot` answers.
    pub fn gateway_url(&self) -> String {
        format!("ws://{}/gateway", self.shared.addr)
    }

    /// The accepted token.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The bot's user id (READY's `user.id`).
    pub fn bot_id(&self) -> &str {
        &self.shared.bot_id
    }

    /// `<@bot id>`: what a user's mention of the bot looks like.
    pub fn mention(&self) -> String {
        format!("<@{}>", self.shared.bot_id)
    }

    /// The DM channel the fake uses for `user_id`.
    pub fn dm_channel(user_id: &str) -> String {
        format!("77{user_id}")
    }

    fn next_id(&self) -> String {
        let mut st = self.shared.core.change();
        st.next_id += 1;
        st.next_id.to_string()
    }

    /// Pushes a DM from `user_id` (in [`Self::dm_channel`]); returns the
    /// message id.
    pub fn push_dm(&self, user_id: &str, text: &str) -> String {
        let d = json!({"channel_id": Self::dm_channel(user_id), "author": author(user_id), "content": text});
        self.push_message(d)
    }

    /// Pushes a message in a guild channel; returns the message id.
    pub fn push_guild_message(
        &self,
        guild_id: &str,
        channel_id: &str,
        user_id: &str,
        text: &str,
    ) -> String {
        let d = json!({"guild_id": guild_id, "channel_id": channel_id, "author": author(user_id), "content": text});
        self.push_message(d)
    }

    /// Pushes a message in thread `thread_id` of `parent_id`, announcing
    /// the thread first (`THREAD_CREATE`) when it is new; returns the
    /// message id.
    pub fn push_thread_message(
        &self,
        guild_id: &str,
        parent_id: &str,
        thread_id: &str,
        user_id: &str,
        text: &str,
    ) -> String {
        let thread = json!({"id": thread_id, "parent_id": parent_id, "guild_id": guild_id,
            "type": 11, "name": format!("thread {thread_id}")});
        let new = {
            let mut st = self.shared.core.change();
            let threads = st.guilds.entry(guild_id.to_owned()).or_default();
            let known = threads.iter().any(|t| t["id"] == thread_id);
            if !known {
                threads.push(thread.clone());
            }
            !known
        };
        if new {
            self.push_dispatch("THREAD_CREATE", thread);
        }
        let d = json!({"guild_id": guild_id, "channel_id": thread_id, "author": author(user_id), "content": text});
        self.push_message(d)
    }

    /// Stores a file on the fake CDN as if a user had attached it in
    /// `channel_id`, and returns its attachment object (`id`, `filename`,
    /// `size`, `url`, `proxy_url`, `content_type` when given) for a pushed
    /// message's `attachments`.
    pub fn add_file(
        &self,
        channel_id: &str,
        bytes: impl Into<Vec<u8>>,
        filename: &str,
        content_type: Option<&str>,
    ) -> Value {
        let mut st = self.shared.core.change();
        cdn_file(
            &mut st,
            self.shared.addr,
            channel_id,
            Bytes::from(bytes.into()),
            filename,
            content_type,
        )
    }

    /// The CDN address of attachment `id` stops working (404), as an
    /// expired signed address or a deleted message's does.
    pub fn expire_file(&self, id: &str) {
        if let Some(f) = self.shared.core.change().files.get_mut(id) {
            f.expired = true;
        }
    }

    /// A CDN address (an attachment object, as [`Self::add_file`]'s) that
    /// answers `302 Found` to `location`, to test where the bot follows.
    pub fn add_redirect(&self, channel_id: &str, filename: &str, location: &str) -> Value {
        let mut st = self.shared.core.change();
        let object = cdn_file(
            &mut st,
            self.shared.addr,
            channel_id,
            Bytes::new(),
            filename,
            None,
        );
        if let Some(f) = object["id"].as_str().and_then(|id| st.files.get_mut(id)) {
            f.redirect = Some(location.to_owned());
        }
        object
    }

    /// Pushes a DM from `user_id` with `attachments` (from
    /// [`Self::add_file`]); `voice` flags it as a voice message recorded
    /// in the app (`IS_VOICE_MESSAGE`). Returns the message id.
    pub fn push_dm_with_files(
        &self,
        user_id: &str,
        text: &str,
        attachments: &[Value],
        voice: bool,
    ) -> String {
        let mut d = json!({"channel_id": Self::dm_channel(user_id), "author": author(user_id),
            "content": text, "attachments": attachments});
        if voice {
            d["flags"] = json!(1 << 13);
        }
        self.push_message(d)
    }

    /// Every message with files accepted so far, in order.
    pub fn uploads(&self) -> Vec<Upload> {
        self.shared.core.read().uploads.clone()
    }

    /// Waits until at least `n` messages with files were accepted and
    /// returns them all.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_uploads(&self, n: usize, timeout: Duration) -> Vec<Upload> {
        self.shared
            .core
            .wait_len("uploads", n, timeout, |st| &st.uploads)
            .await
    }

    /// The CDN paths asked for so far (served or not), in order.
    pub fn file_fetches(&self) -> Vec<String> {
        self.shared.core.read().fetches.clone()
    }

    /// Pushes a `MESSAGE_CREATE` with `d`, adding an id, timestamp and the
    /// `mentions` Discord derives from `<@id>` in the content unless
    /// present. Returns the message id.
    pub fn push_message(&self, mut d: Value) -> String {
        let id = match d.get("id").and_then(Value::as_str) {
            Some(id) => id.to_owned(),
            None => self.next_id(),
        };
        if let Some(obj) = d.as_object_mut() {
            obj.insert("id".into(), json!(id));
            obj.entry("type").or_insert(json!(0));
            obj.entry("timestamp")
                .or_insert(json!("2024-01-01T00:00:00.000000+00:00"));
            obj.entry("attachments").or_insert(json!([]));
            let content = obj
                .get("content")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            obj.entry("mentions")
                .or_insert_with(|| Value::Array(mentions(&content, &self.shared.bot_id)));
        }
        self.push_dispatch("MESSAGE_CREATE", d);
        id
    }

    /// Pushes any dispatch to the current session (sent at once when a
    /// connection is attached to it, else kept for a resume). Before any
    /// session exists it waits for the first READY.
    pub fn push_dispatch(&self, kind: &str, d: Value) {
        let mut st = self.shared.core.change();
        match st.current.clone() {
            Some(session) => {
                let payload = log_dispatch(&mut st, &session, kind, d);
                if let Some(a) = &st.attached
                    && a.session.as_deref() == Some(session.as_str())
                {
                    let _ = a.tx.send(Control::Send(payload));
                }
            }
            None => st.backlog.push((kind.to_owned(), d)),
        }
    }

    fn control(&self, c: Control) -> bool {
        let st = self.shared.core.read();
        st.attached.as_ref().is_some_and(|a| a.tx.send(c).is_ok())
    }

    /// Cuts the attached connection without a close frame. Returns whether
    /// one was attached.
    pub fn drop_connection(&self) -> bool {
        self.control(Control::Close(None))
    }

    /// Closes the attached connection with `code`.
    pub fn close_connection(&self, code: u16) -> bool {
        self.control(Control::Close(Some(code)))
    }

    /// Sends op 7 Reconnect.
    pub fn send_reconnect(&self) -> bool {
        self.control(Control::Send(json!({"op": 7, "d": null})))
    }

    /// Sends op 1: the client must heartbeat at once.
    pub fn request_heartbeat(&self) -> bool {
        self.control(Control::Send(json!({"op": 1, "d": null})))
    }

    /// Sends op 9 Invalid Session. When not `resumable`, the session is
    /// forgotten: a later Resume of it gets op 9 again.
    pub fn invalidate_session(&self, resumable: bool) -> bool {
        if !resumable {
            let mut st = self.shared.core.change();
            if let Some(s) = st.current.take() {
                st.sessions.remove(&s);
            }
        }
        self.control(Control::Send(json!({"op": 9, "d": resumable})))
    }

    /// Whether heartbeats get op 11 (default yes).
    pub fn ack_heartbeats(&self, ack: bool) {
        self.shared.core.change().ack_heartbeats = ack;
    }

    /// The next send gets 429 with `retry_after` seconds (and `global`).
    /// Calls queue up.
    pub fn fail_next_send_with_429(&self, retry_after: f64, global: bool) {
        self.shared
            .core
            .change()
            .fail_429
            .push((retry_after, global));
    }

    /// The next send gets this HTTP status. Calls queue up.
    pub fn fail_next_send_with_status(&self, status: u16) {
        self.shared.core.change().fail_status.push(status);
    }

    /// The next successful send says `X-RateLimit-Remaining: 0` with this
    /// `Reset-After`.
    pub fn exhaust_bucket_next(&self, reset_after: f64) {
        self.shared.core.change().exhaust_next = Some(reset_after);
    }

    /// While set, message sends are recorded as attempts but hang
    /// unanswered and are never delivered; clearing it (or stopping the
    /// server) answers them with a 502.
    pub fn hang_send(&self, hang: bool) {
        self.shared.core.set_hang(hang);
    }

    /// Every message sent so far.
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.core.read().sent.clone()
    }

    /// Every typing request so far.
    pub fn typing(&self) -> Vec<Typing> {
        self.shared.core.read().typing.clone()
    }

    /// Every REST request so far, including failed and hung ones.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.core.requests()
    }

    /// The message sends so far, answered or not.
    pub fn send_attempts(&self) -> Vec<Request> {
        self.shared.core.requests_where(is_send)
    }

    /// Every gateway payload the client sent.
    pub fn frames(&self) -> Vec<Frame> {
        self.shared.core.read().frames.clone()
    }

    /// The client's payloads with opcode `op`.
    pub fn frames_with_op(&self, op: u64) -> Vec<Frame> {
        self.frames().into_iter().filter(|f| f.op == op).collect()
    }

    /// Every WebSocket connection opened so far.
    pub fn connections(&self) -> Vec<Connection> {
        self.shared.core.read().connections.clone()
    }

    /// How many READY and RESUMED dispatches were sent.
    pub fn ready_and_resumed(&self) -> (usize, usize) {
        let st = self.shared.core.read();
        (st.readies, st.resumed)
    }

    /// Whether a connection is attached to a session right now.
    pub fn attached(&self) -> bool {
        self.shared
            .core
            .read()
            .attached
            .as_ref()
            .is_some_and(|a| a.session.is_some())
    }

    /// Waits until READY + RESUMED were sent at least `n` times in total,
    /// that is, until the client's `n`-th session start.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_sessions(&self, n: usize, timeout: Duration) {
        let what = format!("{n} session starts");
        self.shared
            .core
            .wait(
                &what,
                timeout,
                |st| (st.readies + st.resumed >= n).then_some(()),
                |st| format!("{} READY and {} RESUMED", st.readies, st.resumed),
            )
            .await;
    }

    /// Waits until at least `n` messages were sent and returns them all.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_sent(&self, n: usize, timeout: Duration) -> Vec<Sent> {
        self.shared
            .core
            .wait_len("sent messages", n, timeout, |st| &st.sent)
            .await
    }

    /// Waits until at least `n` message sends arrived (answered or not).
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_send_attempts(&self, n: usize, timeout: Duration) -> Vec<Request> {
        self.shared
            .core
            .wait_requests("send attempts", n, timeout, is_send)
            .await
    }

    /// Waits until the client sent at least `n` payloads with opcode `op`.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_frames(&self, op: u64, n: usize, timeout: Duration) -> Vec<Frame> {
        let with_op = |st: &Book| -> Vec<Frame> {
            st.frames.iter().filter(|f| f.op == op).cloned().collect()
        };
        let what = format!("{n} op {op} payloads");
        self.shared
            .core
            .wait(
                &what,
                timeout,
                |st| {
                    let got = with_op(st);
                    (got.len() >= n).then_some(got)
                },
                |st| with_op(st).len(),
            )
            .await
    }

    /// Waits until no connection is attached (the client went away).
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_detached(&self, timeout: Duration) {
        self.shared
            .core
            .wait(
                "no connection attached",
                timeout,
                |st| st.attached.is_none().then_some(()),
                |st| st.attached.as_ref().map(|a| a.id),
            )
            .await;
    }

    /// Stops the server (also on drop). Open connections are cut.
    pub fn shutdown(&self) {
        self.shared.core.stop();
    }
}

impl Drop for FakeDiscord {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Whether `r` is a message send, answered or not.
/// Stores a CDN file and returns its attachment object.
fn cdn_file(
    st: &mut Book,
    addr: SocketAddr,
    channel_id: &str,
    bytes: Bytes,
    filename: &str,
    content_type: Option<&str>,
) -> Value {
    st.next_id += 1;
    let id = st.next_id.to_string();
    // Discord keeps the name's safe characters; the rest become `_`.
    let name: String = filename
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let path = format!("/attachments/{channel_id}/{id}/{name}");
    let signature = format!("{:016x}", st.next_id.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let url = format!("http://{addr}{path}?ex=6a000000&is=69f00000&hm={signature}&");
    let mut object = json!({
        "id": id, "filename": name, "size": bytes.len(),
        "url": url, "proxy_url": url,
    });
    if let Some(t) = content_type {
        object["content_type"] = json!(t);
    }
    st.files.insert(
        id,
        CdnFile {
            bytes,
            path,
            signature,
            expired: false,
            redirect: None,
        },
    );
    object
}

fn is_send(r: &Request) -> bool {
    r.method == "POST" && r.path.ends_with("/messages")
}

fn author(user_id: &str) -> Value {
    json!({"id": user_id, "username": format!("user{user_id}"),
        "global_name": format!("User {user_id}"), "bot": false})
}

/// The users `<@id>` / `<@!id>` in `content` name, as Discord lists them.
fn mentions(content: &str, bot_id: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut rest = content;
    while let Some(at) = rest.find("<@") {
        rest = &rest[at + 2..];
        let body = rest.strip_prefix('!').unwrap_or(rest);
        if let Some(end) = body.find('>') {
            let id = &body[..end];
            if !id.is_empty() && id.chars().all(|c| c.is_ascii_digit()) {
                let bot = id == bot_id;
                out.push(json!({"id": id, "username": if bot { BOT_USERNAME.to_owned() } else { format!("user{id}") }, "bot": bot}));
            }
        }
    }
    out
}

/// Appends a dispatch to `session`'s log and returns the payload.
fn log_dispatch(st: &mut Book, session: &str, kind: &str, d: Value) -> Value {
    let log = st.sessions.entry(session.to_owned()).or_default();
    log.next_seq += 1;
    let payload = json!({"op": 0, "s": log.next_seq, "t": kind, "d": d});
    log.events.push(payload.clone());
    payload
}
