//! A fake Mattermost server on 127.0.0.1, for adapter and end-to-end tests.
//!
//! [`FakeMattermost`] speaks API v4 over real HTTP and the event stream
//! over a real WebSocket:
//!
//! - `GET /api/v4/users/me`, `POST /api/v4/posts` and
//!   `POST /api/v4/users/{user_id}/typing`, each requiring
//!   `Authorization: Bearer <token>` (else 401 with Mattermost's error
//!   body);
//! - `GET /api/v4/websocket`, authenticated by the same header *or* by an
//!   `authentication_challenge` action as the first frame (both are
//!   accepted; [`Connection`] records which came). A new connection gets
//!   `hello` (`data.connection_id`) at sequence 0, then events at 1, 2, ...
//!   Reconnecting with `?connection_id=<id>&sequence_number=<n>` resumes
//!   when the server still holds event `n` (or `n` is the next one):
//!   the missed events are replayed and, as Mattermost does, no new
//!   `hello` is sent. Otherwise the client gets a new connection, a new id
//!   and a new `hello`. The `ping` action is answered with
//!   `{"status":"OK","seq_reply":n,"data":{"text":"pong"}}`.
//!
//! Files: `POST /api/v4/files` takes `multipart/form-data` with
//! `channel_id` before the `files` parts (as the server's streaming reader
//! requires; a file before the channel is refused with 400), stores each
//! file and answers `file_infos`; `GET /api/v4/files/{file_id}` serves a
//! file's bytes (404 for an unknown id); a post may carry up to
//! [`MAX_FILES_PER_POST`] `file_ids` of files uploaded to its channel and
//! not attached yet, and then its message may be empty. Posts with files
//! carry their `FileInfo`s in `metadata.files`, as the server adds them.
//! Tests register files others posted with [`FakeMattermost::add_file`]
//! and attach them with [`NewPost::with_files`].
//!
//! Posts the bot creates come back on the socket as `posted` events, as
//! they do from a real server. The server runs on its own thread with its
//! own runtime (so it keeps answering while a test blocks on a child
//! process) and stops when the [`FakeMattermost`] is dropped.
//!
//! Tests push posts ([`FakeMattermost::push`]), inspect what the bot did
//! ([`posts`](FakeMattermost::posts), [`typing`](FakeMattermost::typing),
//! [`connections`](FakeMattermost::connections)) and break things
//! ([`drop_connection`](FakeMattermost::drop_connection),
//! [`expire_connection`](FakeMattermost::expire_connection),
//! [`go_silent`](FakeMattermost::go_silent),
//! [`fail_next_posts_with_429`](FakeMattermost::fail_next_posts_with_429),
//! [`hang_posts`](FakeMattermost::hang_posts)).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::fake::{Core, Faults, bind, started};

use handlers::{rest, upload, websocket};

mod handlers;

/// The bot's user id (`GET /users/me`).
pub const BOT_USER_ID: &str = "talariabot0000000000000000";
/// The bot's username, without `@`.
pub const BOT_USERNAME: &str = "talaria-bot";
/// Mattermost's default largest post, in characters.
pub const MAX_POST_CHARS: usize = 16383;
/// The most files one post may carry.
pub const MAX_FILES_PER_POST: usize = 10;
/// The default largest file the server takes (`FileSettings.MaxFileSize`,
/// 100 MB).
pub const DEFAULT_MAX_FILE_SIZE: usize = 100 * 1024 * 1024;
/// How many events the server keeps for resuming.
const REPLAY_CAPACITY: usize = 256;

/// A post for [`FakeMattermost::push`] to deliver as a `posted` event.
#[derive(Debug, Clone, PartialEq)]
pub struct NewPost {
    /// The post id; one is assigned when `None`.
    pub id: Option<String>,
    /// The channel the post is in.
    pub channel_id: String,
    /// `D`, `G`, `O` or `P`.
    pub channel_type: String,
    /// The author's user id.
    pub user_id: String,
    /// The post's text.
    pub message: String,
    /// The thread's root post, for a reply in a thread.
    pub root_id: Option<String>,
    /// Empty for ordinary posts (`system_join_channel`, ...).
    pub kind: String,
    /// Mentioned user ids; computed from `@username`s when `None`.
    pub mentions: Option<Vec<String>>,
    /// Ids of files (from [`FakeMattermost::add_file`]) attached to it.
    pub file_ids: Vec<String>,
}

impl NewPost {
    /// A direct message from `user_id`; its channel is `dm<user_id>`.
    pub fn dm(user_id: &str, message: &str) -> NewPost {
        NewPost {
            id: None,
            channel_id: format!("dm{user_id}"),
            channel_type: "D".into(),
            user_id: user_id.into(),
            message: message.into(),
            root_id: None,
            kind: String::new(),
            mentions: None,
            file_ids: Vec::new(),
        }
    }

    /// A post in the public channel `channel_id`.
    pub fn channel(channel_id: &str, user_id: &str, message: &str) -> NewPost {
        NewPost {
            channel_type: "O".into(),
            channel_id: channel_id.into(),
            ..NewPost::dm(user_id, message)
        }
    }

    /// The same post in the thread under `root_id`.
    pub fn in_thread(mut self, root_id: &str) -> NewPost {
        self.root_id = Some(root_id.into());
        self
    }

    /// The same post with a fixed id (to deliver one post twice).
    pub fn with_id(mut self, id: &str) -> NewPost {
        self.id = Some(id.into());
        self
    }

    /// The same post in a channel of another type (`G`, `P`).
    pub fn of_channel_type(mut self, channel_type: &str) -> NewPost {
        self.channel_type = channel_type.into();
        self
    }

    /// The same post with these files attached.
    pub fn with_files(mut self, file_ids: &[&str]) -> NewPost {
        self.file_ids = file_ids.iter().map(|f| (*f).to_owned()).collect();
        self
    }

    /// The same post as a system message of `kind`.
    pub fn of_kind(mut self, kind: &str) -> NewPost {
        self.kind = kind.into();
        self
    }
}

/// One post the fake accepted from the bot.
#[derive(Debug, Clone, PartialEq)]
pub struct CreatedPost {
    /// The id the fake assigned.
    pub id: String,
    /// The channel posted to.
    pub channel_id: String,
    /// The text exactly as sent.
    pub message: String,
    /// The thread's root post, for a reply in a thread.
    pub root_id: Option<String>,
    /// The attached files' ids, as sent.
    pub file_ids: Vec<String>,
    /// When the fake received it.
    pub at: Instant,
}

/// One file the bot uploaded with `POST /files`.
#[derive(Debug, Clone, PartialEq)]
pub struct Upload {
    /// The form's field names in the order they came (`channel_id`,
    /// `files`, ...).
    pub fields: Vec<String>,
    /// The `channel_id` field.
    pub channel_id: String,
    /// The file part's file name.
    pub filename: String,
    /// The file part's `Content-Type`.
    pub content_type: Option<String>,
    /// The file's bytes, exactly as received.
    pub bytes: Vec<u8>,
    /// The id the fake assigned.
    pub file_id: String,
}

/// A file the server holds.
#[derive(Debug, Clone)]
struct StoredFile {
    channel_id: String,
    name: String,
    mime: String,
    bytes: Vec<u8>,
    /// The post it is attached to, once it is.
    post_id: Option<String>,
}

/// One typing call.
#[derive(Debug, Clone, PartialEq)]
pub struct Typing {
    /// The user from the path (the bot).
    pub user_id: String,
    /// The channel the bot shows typing in.
    pub channel_id: String,
    /// The thread's root post, when typing in a thread.
    pub parent_id: Option<String>,
    /// When the fake received it.
    pub at: Instant,
}

/// One accepted WebSocket connection.
#[derive(Debug, Clone, PartialEq)]
pub struct Connection {
    /// `connection_id` and `sequence_number` from the query, if given.
    pub asked_id: Option<String>,
    /// The `sequence_number` the client asked to resume from, if given.
    pub asked_seq: Option<i64>,
    /// Whether the asked connection was resumed (no new hello).
    pub resumed: bool,
    /// The connection id in effect.
    pub connection_id: String,
    /// Authenticated by the `Authorization` header.
    pub header_auth: bool,
    /// When the fake accepted it.
    pub at: Instant,
}

/// Any REST request, recorded when it arrived (before failures or hangs).
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The HTTP method (`GET`, `POST`, ...).
    pub method: String,
    /// The path below `/api/v4/`.
    pub path: String,
    /// The JSON body (`null` when there was none or it did not parse).
    pub body: Value,
    /// The bearer token was the right one.
    pub authorized: bool,
    /// When the fake received it.
    pub at: Instant,
}

/// What the connection task is told to do.
enum Outgoing {
    Frame(String),
    /// Cut the TCP connection without a close frame.
    Drop,
    /// Stop reading and writing, as a hung server or a dead NAT would.
    Silence,
}

struct Session {
    id: String,
    next_seq: i64,
    buffer: VecDeque<(i64, String)>,
    /// The connection serving it: its number and its queue.
    live: Option<(u64, mpsc::UnboundedSender<Outgoing>)>,
}

#[derive(Default)]
struct Book {
    next_id: u64,
    session: Option<Session>,
    /// Events pushed before any connection, delivered after the first hello.
    backlog: Vec<(String, Value, Value)>,
    /// Channel id -> type, from pushed posts and `add_channel`.
    channels: HashMap<String, String>,
    /// Every post id the server knows (pushed or created).
    known_posts: HashMap<String, String>,
    posts: Vec<CreatedPost>,
    typing: Vec<Typing>,
    connections: Vec<Connection>,
    pings: usize,
    next_conn: u64,
    /// New connections are accepted and then say nothing.
    mute: bool,
    /// (`X-Ratelimit-Reset`, `Retry-After`) of each 429 the next posts get.
    fail_429: Faults<(u64, Option<u64>)>,
    fail_status: Faults<u16>,
    files: HashMap<String, StoredFile>,
    uploads: Vec<Upload>,
    max_file_size: usize,
}

struct Shared {
    token: String,
    core: Core<Book, Request>,
}

/// A fake Mattermost server (see the module docs).
pub struct FakeMattermost {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl FakeMattermost {
    /// Starts the server on 127.0.0.1 with an ephemeral port, accepting
    /// `token`.
    ///
    /// # Panics
    /// When no local port can be bound (a broken test environment).
    pub async fn start(token: &str) -> FakeMattermost {
        Self::start_blocking(token)
    }

    /// Like [`Self::start`], for tests without a runtime.
    ///
    /// # Panics
    /// When no local port can be bound.
    pub fn start_blocking(token: &str) -> FakeMattermost {
        started("the fake Mattermost server", Self::try_start(token))
    }

    /// Like [`Self::start`], returning the error instead of panicking.
    pub fn try_start(token: &str) -> std::io::Result<FakeMattermost> {
        let (listener, addr) = bind()?;
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            core: Core::new(Book {
                max_file_size: DEFAULT_MAX_FILE_SIZE,
                ..Book::default()
            }),
        });
        let app = Router::new()
            .route("/api/v4/websocket", get(websocket))
            // Uploads up to the server's limit, not axum's 2 MB.
            .route(
                "/api/v4/files",
                post(upload).layer(axum::extract::DefaultBodyLimit::max(
                    2 * DEFAULT_MAX_FILE_SIZE,
                )),
            )
            .fallback(rest)
            .with_state(shared.clone());
        shared.core.serve("fake-mattermost", listener, app)?;
        Ok(FakeMattermost { addr, shared })
    }

    /// `http://127.0.0.1:PORT`: the server root (`MATTERMOST_URL`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The accepted token.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The bot's user id.
    pub fn bot_id(&self) -> &'static str {
        BOT_USER_ID
    }

    /// The bot's username, without `@`.
    pub fn bot_username(&self) -> &'static str {
        BOT_USERNAME
    }

    /// Makes a channel known (posting to an unknown channel gets 403).
    /// Channels of pushed posts are known already.
    pub fn add_channel(&self, channel_id: &str, channel_type: &str) {
        self.shared
            .core
            .change()
            .channels
            .insert(channel_id.into(), channel_type.into());
    }

    /// Delivers `post` as a `posted` event (buffered for replay; held for
    /// the first connection if none was made yet). Returns the post id.
    pub fn push(&self, post: NewPost) -> String {
        let mut st = self.shared.core.change();
        let id = post.id.clone().unwrap_or_else(|| new_id(&mut st, "p"));
        let infos = attach(&mut st, &post.file_ids, &id);
        st.channels
            .insert(post.channel_id.clone(), post.channel_type.clone());
        st.known_posts.insert(id.clone(), post.channel_id.clone());
        let mentions = post.mentions.clone().unwrap_or_else(|| {
            let lower = post.message.to_ascii_lowercase();
            if lower.contains(&format!("@{BOT_USERNAME}")) {
                vec![BOT_USER_ID.to_owned()]
            } else {
                Vec::new()
            }
        });
        let body = json!({
            "id": id, "create_at": unix_millis(), "update_at": unix_millis(),
            "edit_at": 0, "delete_at": 0, "is_pinned": false,
            "user_id": post.user_id, "channel_id": post.channel_id,
            "root_id": post.root_id.clone().unwrap_or_default(),
            "original_id": "", "message": post.message, "type": post.kind,
            "props": {}, "hashtags": "", "pending_post_id": "",
            "file_ids": post.file_ids, "metadata": metadata(&infos),
        });
        let mut data = json!({
            "channel_display_name": display_name(&post.channel_id, &post.channel_type),
            "channel_name": post.channel_id,
            "channel_type": post.channel_type,
            "post": body.to_string(),
            "sender_name": format!("@user{}", post.user_id),
            "team_id": "team1",
        });
        if !mentions.is_empty() {
            data["mentions"] = json!(json!(mentions).to_string());
        }
        let broadcast = json!({"channel_id": post.channel_id, "omit_users": null,
                               "team_id": "", "user_id": ""});
        emit(&mut st, "posted", data, broadcast);
        id
    }

    /// A file someone uploaded to `channel_id`, for a pushed post to
    /// carry ([`NewPost::with_files`]); returns its id.
    pub fn add_file(&self, channel_id: &str, name: &str, mime: &str, bytes: &[u8]) -> String {
        let mut st = self.shared.core.change();
        store_file(&mut st, channel_id, name, mime, bytes.to_vec())
    }

    /// Every file the bot uploaded, in order.
    pub fn uploads(&self) -> Vec<Upload> {
        self.shared.core.read().uploads.clone()
    }

    /// Files larger than `bytes` are refused with 413.
    pub fn set_max_file_size(&self, bytes: usize) {
        self.shared.core.change().max_file_size = bytes;
    }

    /// Delivers any event (`data` as given), with the next sequence number.
    pub fn push_event(&self, event: &str, data: Value) {
        emit(
            &mut self.shared.core.change(),
            event,
            data,
            json!({"channel_id": "", "team_id": "", "user_id": ""}),
        );
    }

    /// Sends `text` as one frame to the live connection, outside the
    /// sequence (for malformed-frame tests).
    pub fn push_raw_frame(&self, text: &str) {
        let st = self.shared.core.read();
        if let Some((_, tx)) = st.session.as_ref().and_then(|s| s.live.as_ref()) {
            let _ = tx.send(Outgoing::Frame(text.to_owned()));
        }
    }

    /// Sends the buffered events from sequence number `seq` on to the live
    /// connection once more, as a confused proxy or server might.
    pub fn resend_from(&self, seq: i64) {
        let st = self.shared.core.read();
        if let Some(s) = st.session.as_ref()
            && let Some((_, tx)) = s.live.as_ref()
        {
            for (_, frame) in s.buffer.iter().filter(|(q, _)| *q >= seq) {
                let _ = tx.send(Outgoing::Frame(frame.clone()));
            }
        }
    }

    /// Every post the bot made, in order.
    pub fn posts(&self) -> Vec<CreatedPost> {
        self.shared.core.read().posts.clone()
    }

    /// Every `POST /posts` request, answered or not.
    pub fn post_attempts(&self) -> Vec<Request> {
        self.shared.core.requests_where(is_post)
    }

    /// Every typing call.
    pub fn typing(&self) -> Vec<Typing> {
        self.shared.core.read().typing.clone()
    }

    /// Every accepted WebSocket connection.
    pub fn connections(&self) -> Vec<Connection> {
        self.shared.core.read().connections.clone()
    }

    /// Every REST request.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.core.requests()
    }

    /// `ping` actions received.
    pub fn pings(&self) -> usize {
        self.shared.core.read().pings
    }

    /// Whether a WebSocket connection is being served now.
    pub fn is_connected(&self) -> bool {
        self.shared
            .core
            .read()
            .session
            .as_ref()
            .is_some_and(|s| s.live.is_some())
    }

    /// Waits until at least `n` posts were made and returns them all.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_posts(&self, n: usize, timeout: Duration) -> Vec<CreatedPost> {
        self.shared
            .core
            .wait_len("posts", n, timeout, |st| &st.posts)
            .await
    }

    /// Waits until at least `n` `POST /posts` requests arrived.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_post_attempts(&self, n: usize, timeout: Duration) -> Vec<Request> {
        self.shared
            .core
            .wait_requests("post attempts", n, timeout, is_post)
            .await
    }

    /// Waits until at least `n` WebSocket connections were accepted.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_connections(&self, n: usize, timeout: Duration) -> Vec<Connection> {
        self.shared
            .core
            .wait_len("WebSocket connections", n, timeout, |st| &st.connections)
            .await
    }

    /// Waits until at least `n` typing calls arrived.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_typing(&self, n: usize, timeout: Duration) -> Vec<Typing> {
        self.shared
            .core
            .wait_len("typing calls", n, timeout, |st| &st.typing)
            .await
    }

    /// The next `POST /posts` gets 429 with `X-Ratelimit-Reset:
    /// reset_secs` (and `Retry-After` when given). Calls queue up.
    pub fn fail_next_posts_with_429(&self, reset_secs: u64, retry_after: Option<u64>) {
        self.shared
            .core
            .change()
            .fail_429
            .push((reset_secs, retry_after));
    }

    /// The next `POST /posts` gets `status` with an error body. Calls
    /// queue up (after any queued 429s).
    pub fn fail_next_post_with(&self, status: u16) {
        self.shared.core.change().fail_status.push(status);
    }

    /// While set, `POST /posts` requests are recorded as attempts but hang
    /// and are never delivered, like requests lost on the way; clearing it
    /// (or stopping the server) answers them with a 502.
    pub fn hang_posts(&self, hang: bool) {
        self.shared.core.set_hang(hang);
    }

    /// Cuts the live WebSocket without a close frame. The connection can
    /// be resumed.
    pub fn drop_connection(&self) {
        let mut st = self.shared.core.change();
        if let Some(s) = st.session.as_mut()
            && let Some((_, tx)) = s.live.take()
        {
            let _ = tx.send(Outgoing::Drop);
        }
    }

    /// Cuts the live WebSocket and forgets its buffered events, so the
    /// next connection cannot resume and gets a new connection id; events
    /// pushed until then are lost, as on a real server.
    pub fn expire_connection(&self) {
        let mut st = self.shared.core.change();
        let fresh = new_id(&mut st, "expired");
        if let Some(s) = st.session.as_mut() {
            if let Some((_, tx)) = s.live.take() {
                let _ = tx.send(Outgoing::Drop);
            }
            s.id = fresh;
            s.buffer.clear();
        }
    }

    /// The live WebSocket stops reading and writing (no pongs, no events)
    /// while staying open. Events pushed meanwhile are kept for a resume.
    pub fn go_silent(&self) {
        let st = self.shared.core.read();
        if let Some((_, tx)) = st.session.as_ref().and_then(|s| s.live.as_ref()) {
            let _ = tx.send(Outgoing::Silence);
        }
    }

    /// While set, new WebSocket connections are accepted (and recorded)
    /// but get no hello, no replayed events and no pongs.
    pub fn mute_new_connections(&self, mute: bool) {
        self.shared.core.change().mute = mute;
    }

    /// Stops the server (also on drop). Open connections are cut.
    pub fn shutdown(&self) {
        self.shared.core.stop();
    }
}

/// Whether `r` is a `POST /posts`, answered or not.
fn is_post(r: &Request) -> bool {
    r.method == "POST" && r.path == "/api/v4/posts"
}

impl Drop for FakeMattermost {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A 26-character lowercase id, like Mattermost's.
fn new_id(st: &mut Book, prefix: &str) -> String {
    st.next_id += 1;
    let mut id = format!("{prefix}{:x}", st.next_id);
    while id.len() < 26 {
        id.push('0');
    }
    id
}

fn store_file(st: &mut Book, channel_id: &str, name: &str, mime: &str, bytes: Vec<u8>) -> String {
    let id = new_id(st, "f");
    st.files.insert(
        id.clone(),
        StoredFile {
            channel_id: channel_id.to_owned(),
            name: name.to_owned(),
            mime: mime.to_owned(),
            bytes,
            post_id: None,
        },
    );
    id
}

/// A stored file's `FileInfo`, as the API shows it.
fn file_info(id: &str, f: &StoredFile) -> Value {
    let extension = f
        .name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    json!({
        "id": id, "user_id": "", "post_id": f.post_id.clone().unwrap_or_default(),
        "channel_id": f.channel_id, "create_at": unix_millis(), "update_at": unix_millis(),
        "delete_at": 0, "name": f.name, "extension": extension, "size": f.bytes.len(),
        "mime_type": f.mime, "has_preview_image": f.mime.starts_with("image/"),
    })
}

/// Marks `file_ids` as attached to `post_id`; their infos (unknown ids
/// are left out, as the server drops them).
fn attach(st: &mut Book, file_ids: &[String], post_id: &str) -> Vec<Value> {
    let mut infos = Vec::new();
    for id in file_ids {
        if let Some(f) = st.files.get_mut(id) {
            f.post_id = Some(post_id.to_owned());
            infos.push(file_info(id, f));
        }
    }
    infos
}

/// A post's `metadata`: its files, when it has some.
fn metadata(infos: &[Value]) -> Value {
    if infos.is_empty() {
        json!({})
    } else {
        json!({ "files": infos })
    }
}

fn display_name(channel_id: &str, channel_type: &str) -> String {
    match channel_type {
        "D" => String::new(),
        _ => format!("Channel {channel_id}"),
    }
}

/// Sequences an event into the session (and onto the live socket), or
/// holds it for the first connection.
fn emit(st: &mut Book, event: &str, data: Value, broadcast: Value) {
    let Some(session) = st.session.as_mut() else {
        st.backlog.push((event.to_owned(), data, broadcast));
        return;
    };
    let seq = session.next_seq;
    session.next_seq += 1;
    let frame =
        json!({"event": event, "data": data, "broadcast": broadcast, "seq": seq}).to_string();
    session.buffer.push_back((seq, frame.clone()));
    while session.buffer.len() > REPLAY_CAPACITY {
        session.buffer.pop_front();
    }
    if let Some((_, tx)) = &session.live
        && tx.send(Outgoing::Frame(frame)).is_err()
    {
        session.live = None;
    }
}
