//! A fake Telegram Bot API on 127.0.0.1, for adapter and end-to-end tests.
//!
//! [`FakeTelegram`] answers `POST|GET /bot{token}/{method}` with real JSON
//! for `getMe`, `getUpdates` (long polling with Telegram's offset rules),
//! `sendMessage`, `editMessageText`, `sendChatAction` and `deleteWebhook`,
//! and files both ways: `getFile` with the download at
//! `GET /file/bot{token}/{file_path}`, and uploads to `sendPhoto`,
//! `sendVoice`, `sendAudio`, `sendVideo` and `sendDocument` as
//! `multipart/form-data`. Parameters are read from the query string and
//! from a JSON, form-encoded or multipart body, as Telegram does.
//!
//! The server runs on its own thread with its own runtime, so it keeps
//! answering while the test thread blocks (for example on a child gateway
//! process) and whatever runtime the test uses. It stops when the
//! [`FakeTelegram`] is dropped.
//!
//! Tests push updates (`push_private_text`, `push_group_text`,
//! `push_private_file` after `add_file`, `push_update`), inspect what the
//! bot did (`sent`, `uploads`, `edits`, `chat_actions`,
//! `get_updates_calls`, `requests`) and inject failures
//! (`fail_next_send_with_429`, `reject_entities_next`, `hang_send`,
//! `block_chat`, `fail_next_get_updates`, `expire_file`).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, header};
use serde_json::{Map, Value, json};

use crate::fake::{Core, Faults, bind, started};
use handlers::handle;

mod handlers;

/// The bot's `@username` as `getMe` reports it.
pub const BOT_USERNAME: &str = "talaria_test_bot";

/// The largest file `getFile` hands to bots; larger ones are "too big".
pub const MAX_DOWNLOAD_BYTES: usize = 20 * 1024 * 1024;

/// The largest upload the fake accepts (Telegram's limit for bots).
pub const MAX_UPLOAD_BYTES: usize = 50 * 1024 * 1024;

/// The largest photo `sendPhoto` accepts.
pub const MAX_PHOTO_BYTES: usize = 10 * 1024 * 1024;

/// What kind of file an inbound message carries: the message field it
/// goes in, and the object Telegram describes it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// `photo`: an array of `PhotoSize`, a thumbnail and the full size.
    Photo,
    /// `voice`: a voice note (`Voice`).
    Voice,
    /// `audio`: a music file (`Audio`).
    Audio,
    /// `video`: a video (`Video`).
    Video,
    /// `document`: any other file (`Document`).
    Document,
}

impl FileKind {
    /// The message field (and upload field) of this kind.
    pub fn field(self) -> &'static str {
        match self {
            FileKind::Photo => "photo",
            FileKind::Voice => "voice",
            FileKind::Audio => "audio",
            FileKind::Video => "video",
            FileKind::Document => "document",
        }
    }
}

/// One file upload (`sendPhoto`, `sendVoice`, `sendAudio`, `sendVideo`,
/// `sendDocument`) the fake accepted, read from its multipart body.
#[derive(Debug, Clone, PartialEq)]
pub struct Upload {
    /// The method (`sendPhoto`, ...), as called.
    pub method: String,
    /// The chat sent to.
    pub chat_id: i64,
    /// The form field that held the file (`photo`, `voice`, ...).
    pub field: String,
    /// Every text field of the form, by name.
    pub fields: BTreeMap<String, String>,
    /// The file part's `filename`, when given.
    pub file_name: Option<String>,
    /// The file part's `Content-Type`, when given.
    pub content_type: Option<String>,
    /// The file's bytes as received.
    pub bytes: Vec<u8>,
    /// `caption`, exactly as sent.
    pub caption: Option<String>,
    /// `parse_mode`, when given.
    pub parse_mode: Option<String>,
    /// `message_thread_id`, when given.
    pub thread_id: Option<i64>,
    /// `reply_to_message_id` or `reply_parameters.message_id`, when given.
    pub reply_to: Option<i64>,
    /// The id the fake assigned to the message.
    pub message_id: i64,
    /// The `file_id` the uploaded file got (fetchable with `getFile`).
    pub file_id: String,
    /// When the fake received it.
    pub at: Instant,
}

impl Upload {
    /// The file's length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the file was empty (the fake refuses those, so never).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The file's SHA-256, in lowercase hex.
    pub fn sha256(&self) -> String {
        sha256_hex(&self.bytes)
    }

    /// The caption as a user would see it (see [`Sent::rendered`]).
    pub fn rendered_caption(&self) -> Option<String> {
        self.caption
            .as_deref()
            .map(|c| rendered(c, self.parse_mode.as_deref()))
    }
}

/// A file the fake holds, fetchable by its `file_id`.
#[derive(Debug, Clone)]
struct StoredFile {
    bytes: Bytes,
    /// Where `GET /file/bot{token}/{path}` finds it.
    path: String,
    unique_id: String,
    name: Option<String>,
    mime: Option<String>,
    /// `getFile` still answers, but the download link no longer works.
    expired: bool,
}

/// One `sendMessage` the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// The chat sent to.
    pub chat_id: i64,
    /// The text exactly as sent (HTML markup included when `parse_mode` is set).
    pub text: String,
    /// The `parse_mode` (`HTML`), when given.
    pub parse_mode: Option<String>,
    /// `message_thread_id`, when given.
    pub thread_id: Option<i64>,
    /// `reply_to_message_id` or `reply_parameters.message_id`, when given.
    pub reply_to: Option<i64>,
    /// The id the fake assigned.
    pub message_id: i64,
    /// When the fake received it.
    pub at: Instant,
}

impl Sent {
    /// The text as a user would see it: HTML tags removed and entities
    /// decoded when `parse_mode` is `HTML`, else the text itself.
    pub fn rendered(&self) -> String {
        rendered(&self.text, self.parse_mode.as_deref())
    }
}

/// One `editMessageText` the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct Edit {
    /// The chat of the message edited.
    pub chat_id: i64,
    /// The message edited.
    pub message_id: i64,
    /// The new text exactly as sent.
    pub text: String,
    /// The `parse_mode` (`HTML`), when given.
    pub parse_mode: Option<String>,
    /// When the fake received it.
    pub at: Instant,
}

impl Edit {
    /// The new text as a user would see it (see [`Sent::rendered`]).
    pub fn rendered(&self) -> String {
        rendered(&self.text, self.parse_mode.as_deref())
    }
}

/// `text` as a user would see it under `parse_mode`.
fn rendered(text: &str, parse_mode: Option<&str>) -> String {
    match parse_mode {
        Some(m) if m.eq_ignore_ascii_case("html") => render_html(text),
        _ => text.to_owned(),
    }
}

/// One `sendChatAction`.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatAction {
    /// The chat the action shows in.
    pub chat_id: i64,
    /// The action (`typing`, ...).
    pub action: String,
    /// `message_thread_id`, when given.
    pub thread_id: Option<i64>,
    /// When the fake received it.
    pub at: Instant,
}

/// One `getUpdates` call, recorded when it arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct GetUpdatesCall {
    /// The `offset` asked for: updates below it are confirmed.
    pub offset: Option<i64>,
    /// The long-poll `timeout`, in seconds.
    pub timeout: Option<u64>,
    /// The `allowed_updates` filter, when given.
    pub allowed_updates: Option<Vec<String>>,
    /// When the fake received it.
    pub at: Instant,
}

/// Any request, recorded when it arrived (before injected failures or
/// hangs), with the token-free method name and the merged parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The Bot API method (`sendMessage`, ...).
    pub method: String,
    /// The parameters, merged from the query string and the body.
    pub params: Value,
    /// When the fake received it.
    pub at: Instant,
    /// The token in the URL was the right one.
    pub authorized: bool,
}

#[derive(Default)]
struct Book {
    next_update_id: i64,
    next_message_id: i64,
    /// Updates not yet confirmed by a later offset, in id order.
    updates: VecDeque<Value>,
    /// Chat id -> Telegram chat object, from pushed updates.
    chats: HashMap<i64, Value>,
    /// (chat, message) -> current text, for edits.
    messages: BTreeMap<(i64, i64), String>,
    sent: Vec<Sent>,
    edits: Vec<Edit>,
    actions: Vec<ChatAction>,
    get_updates: Vec<GetUpdatesCall>,
    /// `retry_after` of each 429 the next sends get.
    fail_429: Faults<u64>,
    /// The next sends and edits with a `parse_mode` refused for it.
    reject_entities: Faults<()>,
    fail_get_updates: Faults<()>,
    blocked: HashSet<i64>,
    /// Files by `file_id`: registered by tests and uploaded by the bot.
    files: HashMap<String, StoredFile>,
    next_file: u64,
    uploads: Vec<Upload>,
    /// Uploads past this many hang until it is cleared, and are then lost
    /// (a crash test kills the gateway between two files of one answer).
    hold_uploads_after: Option<usize>,
    /// `file_path`s fetched, in order.
    downloads: Vec<String>,
    /// The newest long poll; an older one still waiting is ended with a
    /// conflict, as Telegram does when two processes poll one bot.
    current_poll: u64,
    /// Long polls waiting now.
    active_polls: usize,
    /// Polls that started while another was waiting.
    conflicts: usize,
}

struct Shared {
    token: String,
    bot_id: i64,
    core: Core<Book, Request>,
}

/// A fake Telegram Bot API server (see the module docs).
pub struct FakeTelegram {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl FakeTelegram {
    /// Starts the server on 127.0.0.1 with an ephemeral port, accepting
    /// `token` (`"123456:ABC..."`; the number before `:` is the bot's id).
    ///
    /// # Panics
    /// When no local port can be bound (a broken test environment).
    pub async fn start(token: &str) -> FakeTelegram {
        Self::start_blocking(token)
    }

    /// Like [`Self::start`], for tests without a runtime.
    ///
    /// # Panics
    /// When no local port can be bound.
    pub fn start_blocking(token: &str) -> FakeTelegram {
        started("the fake Telegram server", Self::try_start(token))
    }

    /// Like [`Self::start`], returning the error instead of panicking.
    pub fn try_start(token: &str) -> std::io::Result<FakeTelegram> {
        let (listener, addr) = bind()?;
        let bot_id = token
            .split_once(':')
            .and_then(|(id, _)| id.parse().ok())
            .unwrap_or(1);
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            bot_id,
            core: Core::new(Book {
                next_update_id: 100_000,
                next_message_id: 1,
                ..Book::default()
            }),
        });
        // Uploads up to Telegram's limit (plus the form around them); axum
        // would stop at 2 MB.
        let app = Router::new()
            .fallback(handle)
            .layer(DefaultBodyLimit::max(MAX_UPLOAD_BYTES + 1024 * 1024))
            .with_state(shared.clone());
        shared.core.serve("fake-telegram", listener, app)?;
        Ok(FakeTelegram { addr, shared })
    }

    /// `http://127.0.0.1:PORT`: the Bot API root (requests go to
    /// `{base_url}/bot{token}/{method}`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The accepted token.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The bot's user id (`getMe`).
    pub fn bot_id(&self) -> i64 {
        self.shared.bot_id
    }

    /// The bot's username without `@` (`getMe`).
    pub fn bot_username(&self) -> &'static str {
        BOT_USERNAME
    }

    /// Queues a private-chat text message from user `user_id` (the chat id
    /// of a private chat is the user's id). Returns the update id.
    pub fn push_private_text(&self, user_id: i64, text: &str) -> i64 {
        let from = user(user_id);
        let chat = json!({
            "id": user_id, "type": "private",
            "first_name": from["first_name"], "username": from["username"],
        });
        let message = text_message(chat, Some(from), text);
        self.push_update(json!({ "message": message }))
    }

    /// Queues a supergroup text message. With `is_forum`, the chat is a
    /// forum and a `thread_id` marks a topic message (none: the General
    /// topic); without, `thread_id` is a reply thread, as Telegram sends
    /// for replies in ordinary groups. Returns the update id.
    pub fn push_group_text(
        &self,
        chat_id: i64,
        user_id: i64,
        text: &str,
        thread_id: Option<i64>,
        is_forum: bool,
    ) -> i64 {
        let mut chat =
            json!({ "id": chat_id, "type": "supergroup", "title": format!("Group {chat_id}") });
        if is_forum {
            chat["is_forum"] = json!(true);
        }
        let mut message = text_message(chat, Some(user(user_id)), text);
        if let Some(t) = thread_id {
            message["message_thread_id"] = json!(t);
            if is_forum {
                message["is_topic_message"] = json!(true);
            }
        }
        self.push_update(json!({ "message": message }))
    }

    /// Registers a file the bot may fetch (`getFile`, then the download),
    /// as if a user had sent it; returns its `file_id`. `name` and `mime`
    /// are what messages carrying it will claim.
    pub fn add_file(
        &self,
        bytes: impl Into<Vec<u8>>,
        name: Option<&str>,
        mime: Option<&str>,
    ) -> String {
        let bytes = Bytes::from(bytes.into());
        let mut st = self.shared.core.change();
        store_file(&mut st, bytes, name, mime)
    }

    /// Uploads after the first `n` hang (none is answered) until this is
    /// set to `None`; a held upload is then lost, like a hung send.
    pub fn hold_uploads_after(&self, n: Option<usize>) {
        self.shared.core.change().hold_uploads_after = n;
    }

    /// The download link of `file_id` stops working (404), as Telegram's
    /// do an hour after `getFile`; `getFile` still answers.
    pub fn expire_file(&self, file_id: &str) {
        if let Some(f) = self.shared.core.change().files.get_mut(file_id) {
            f.expired = true;
        }
    }

    /// Queues a private-chat message from `user_id` carrying the file
    /// `file_id` (from [`Self::add_file`]) as `kind`, with an optional
    /// caption. A photo comes as Telegram sends one: a thumbnail and the
    /// full size, the full size last. Returns the update id.
    ///
    /// # Panics
    /// When `file_id` was never added (a broken test).
    pub fn push_private_file(
        &self,
        user_id: i64,
        kind: FileKind,
        file_id: &str,
        caption: Option<&str>,
    ) -> i64 {
        let object = {
            let mut st = self.shared.core.change();
            let Some(file) = st.files.get(file_id).cloned() else {
                panic!("no file {file_id} was added to the fake Telegram server");
            };
            let mut object = json!({
                "file_id": file_id, "file_unique_id": file.unique_id,
                "file_size": file.bytes.len(),
            });
            match kind {
                FileKind::Photo => {
                    object["width"] = json!(1280);
                    object["height"] = json!(960);
                    let thumb = store_file(&mut st, Bytes::from_static(b"thumbnail"), None, None);
                    let thumb_unique = st.files.get(&thumb).map(|f| f.unique_id.clone());
                    json!([
                        { "file_id": thumb, "file_unique_id": thumb_unique, "file_size": 9, "width": 90, "height": 68 },
                        object,
                    ])
                }
                _ => {
                    if matches!(kind, FileKind::Voice | FileKind::Audio | FileKind::Video) {
                        object["duration"] = json!(1);
                    }
                    if kind == FileKind::Video {
                        object["width"] = json!(640);
                        object["height"] = json!(480);
                    }
                    if kind != FileKind::Voice
                        && let Some(name) = &file.name
                    {
                        object["file_name"] = json!(name);
                    }
                    if let Some(mime) = &file.mime {
                        object["mime_type"] = json!(mime);
                    }
                    object
                }
            }
        };
        let from = user(user_id);
        let chat = json!({
            "id": user_id, "type": "private",
            "first_name": from["first_name"], "username": from["username"],
        });
        let mut message = json!({ "chat": chat, "from": from });
        message[kind.field()] = object;
        if let Some(c) = caption {
            message["caption"] = json!(c);
        }
        self.push_update(json!({ "message": message }))
    }

    /// Queues any update. An `update_id` is assigned unless the value has
    /// one; a message without `message_id` or `date` gets them. Returns the
    /// update id.
    pub fn push_update(&self, mut update: Value) -> i64 {
        let mut st = self.shared.core.change();
        let id = match update.get("update_id").and_then(Value::as_i64) {
            Some(id) => {
                st.next_update_id = st.next_update_id.max(id + 1);
                id
            }
            None => {
                let id = st.next_update_id;
                st.next_update_id += 1;
                id
            }
        };
        if let Some(obj) = update.as_object_mut() {
            obj.insert("update_id".into(), json!(id));
            for key in ["message", "channel_post", "edited_message"] {
                if let Some(m) = obj.get_mut(key).and_then(Value::as_object_mut) {
                    if !m.contains_key("message_id") {
                        m.insert("message_id".into(), json!(st.next_message_id));
                        st.next_message_id += 1;
                    }
                    m.entry("date").or_insert_with(|| json!(unix_now()));
                    if let Some(chat) = m.get("chat")
                        && let Some(cid) = chat.get("id").and_then(Value::as_i64)
                    {
                        st.chats.insert(cid, chat.clone());
                    }
                    if let (Some(cid), Some(mid), Some(text)) = (
                        m.get("chat")
                            .and_then(|c| c.get("id"))
                            .and_then(Value::as_i64),
                        m.get("message_id").and_then(Value::as_i64),
                        m.get("text").and_then(Value::as_str),
                    ) {
                        st.messages.insert((cid, mid), text.to_owned());
                    }
                }
            }
        }
        let at = st
            .updates
            .iter()
            .position(|u| u.get("update_id").and_then(Value::as_i64) > Some(id))
            .unwrap_or(st.updates.len());
        st.updates.insert(at, update);
        id
    }

    /// Every message sent so far, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.core.read().sent.clone()
    }

    /// Every file upload accepted so far, in order.
    pub fn uploads(&self) -> Vec<Upload> {
        self.shared.core.read().uploads.clone()
    }

    /// The `file_path`s fetched so far (served or not), in order.
    pub fn downloads(&self) -> Vec<String> {
        self.shared.core.read().downloads.clone()
    }

    /// Waits until at least `n` uploads were accepted and returns them all.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_uploads(&self, n: usize, timeout: Duration) -> Vec<Upload> {
        self.shared
            .core
            .wait_len("uploads", n, timeout, |st| &st.uploads)
            .await
    }

    /// Every edit so far, in order.
    pub fn edits(&self) -> Vec<Edit> {
        self.shared.core.read().edits.clone()
    }

    /// Every `sendChatAction` so far.
    pub fn chat_actions(&self) -> Vec<ChatAction> {
        self.shared.core.read().actions.clone()
    }

    /// Every `getUpdates` call so far, with the offsets requested.
    pub fn get_updates_calls(&self) -> Vec<GetUpdatesCall> {
        self.shared.core.read().get_updates.clone()
    }

    /// Every request so far, including failed and hung ones.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.core.requests()
    }

    /// The `sendMessage` requests so far, answered or not.
    pub fn send_attempts(&self) -> Vec<Request> {
        self.shared.core.requests_where(is_send)
    }

    /// Updates not yet confirmed by the bot.
    /// Long polls that began while another was still waiting: two
    /// processes reading one bot at once. Each ended the older poll with
    /// Telegram's 409 Conflict.
    pub fn poll_conflicts(&self) -> usize {
        self.shared.core.read().conflicts
    }

    /// Updates pushed and not yet confirmed by a later `offset`.
    pub fn pending_updates(&self) -> usize {
        self.shared.core.read().updates.len()
    }

    /// Waits until the bot has confirmed every update (its `getUpdates`
    /// offset passed them all).
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_confirmed_updates(&self, timeout: Duration) {
        self.shared
            .core
            .wait(
                "every update confirmed",
                timeout,
                |st| st.updates.is_empty().then_some(()),
                |st| st.updates.len(),
            )
            .await;
    }

    /// Waits until at least `n` messages were sent and returns them all.
    ///
    /// # Panics
    /// When `timeout` passes first (the message lists what was sent).
    pub async fn wait_for_sent(&self, n: usize, timeout: Duration) -> Vec<Sent> {
        self.shared
            .core
            .wait_len("sent messages", n, timeout, |st| &st.sent)
            .await
    }

    /// Waits until at least `n` `sendMessage` requests arrived (answered or
    /// not) and returns them.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_send_attempts(&self, n: usize, timeout: Duration) -> Vec<Request> {
        self.shared
            .core
            .wait_requests("sendMessage requests", n, timeout, is_send)
            .await
    }

    /// Waits until at least `n` `getUpdates` calls arrived and returns them.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_get_updates_calls(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Vec<GetUpdatesCall> {
        self.shared
            .core
            .wait_len("getUpdates calls", n, timeout, |st| &st.get_updates)
            .await
    }

    /// The next `sendMessage` or upload gets 429 with
    /// `parameters.retry_after`. Calls queue up: two calls fail the next
    /// two sends.
    pub fn fail_next_send_with_429(&self, retry_after_secs: u64) {
        self.shared.core.change().fail_429.push(retry_after_secs);
    }

    /// The next `n` `sendMessage` calls that carry a `parse_mode` get 400
    /// "Bad Request: can't parse entities: ...".
    pub fn reject_entities_next(&self, n: usize) {
        self.shared.core.change().reject_entities.arm(n);
    }

    /// While set, `sendMessage` requests are recorded as attempts but hang
    /// unanswered and are never delivered, like requests lost on the way;
    /// clearing it (or stopping the server) answers them with a 502.
    pub fn hang_send(&self, hang: bool) {
        self.shared.core.set_hang(hang);
    }

    /// Sends to `chat_id` get 403 "Forbidden: bot was blocked by the user".
    pub fn block_chat(&self, chat_id: i64) {
        self.shared.core.change().blocked.insert(chat_id);
    }

    /// The next `n` `getUpdates` calls get 500 Internal Server Error.
    pub fn fail_next_get_updates(&self, n: usize) {
        self.shared.core.change().fail_get_updates.arm(n);
    }

    /// Stops the server (also on drop). Open connections are cut.
    pub fn shutdown(&self) {
        self.shared.core.stop();
    }
}

impl Drop for FakeTelegram {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Whether `r` is a `sendMessage`, answered or not.
fn is_send(r: &Request) -> bool {
    r.method.eq_ignore_ascii_case("sendMessage")
}

/// Stores `bytes` as a new file and returns its `file_id`.
fn store_file(st: &mut Book, bytes: Bytes, name: Option<&str>, mime: Option<&str>) -> String {
    st.next_file += 1;
    let n = st.next_file;
    let ext = name
        .and_then(|n| n.rsplit_once('.'))
        .filter(|(_, e)| {
            !e.is_empty() && e.len() <= 8 && e.chars().all(|c| c.is_ascii_alphanumeric())
        })
        .map(|(_, e)| format!(".{e}"))
        .unwrap_or_default();
    // Real file ids are long URL-safe base64; these keep that alphabet.
    let file_id = format!("BQACAgIAAxkBAAI{n:06}-fake_file");
    st.files.insert(
        file_id.clone(),
        StoredFile {
            bytes,
            path: format!("documents/file_{n}{ext}"),
            unique_id: format!("AgAD{n:04}"),
            name: name.map(str::to_owned),
            mime: mime.map(str::to_owned),
            expired: false,
        },
    );
    file_id
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn user(id: i64) -> Value {
    json!({ "id": id, "is_bot": false, "first_name": format!("User{id}"), "username": format!("user{id}") })
}

/// A text message with the entities Telegram would add for a leading
/// command and `@mentions`.
fn text_message(chat: Value, from: Option<Value>, text: &str) -> Value {
    let mut m = json!({ "chat": chat, "text": text });
    if let Some(f) = from {
        m["from"] = f;
    }
    let entities = entities(text);
    if !entities.is_empty() {
        m["entities"] = Value::Array(entities);
    }
    m
}

fn entities(text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut offset = 0usize; // UTF-16, as Telegram counts
    for word in text.split_inclusive(char::is_whitespace) {
        let token = word.trim_end();
        let len: usize = token.encode_utf16().count();
        if offset == 0 && token.starts_with('/') && len > 1 {
            out.push(json!({ "type": "bot_command", "offset": 0, "length": len }));
        } else if token.starts_with('@') && len > 1 {
            out.push(json!({ "type": "mention", "offset": offset, "length": len }));
        }
        offset += word.encode_utf16().count();
    }
    out
}

/// Query-string parameters overlaid by the body's (JSON object or form).
fn params(query: Option<&str>, headers: &HeaderMap, body: &Bytes) -> Map<String, Value> {
    let mut out = Map::new();
    if let Some(q) = query {
        for (k, v) in form_pairs(q) {
            out.insert(k, Value::String(v));
        }
    }
    if body.is_empty() {
        return out;
    }
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ctype.starts_with("application/x-www-form-urlencoded") {
        for (k, v) in form_pairs(&String::from_utf8_lossy(body)) {
            out.insert(k, Value::String(v));
        }
    } else if let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(body) {
        out.extend(m);
    }
    out
}

/// `k=v&...` pairs, decoded as HTML forms are (`+` is a space).
fn form_pairs(s: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(s.as_bytes()).into_owned().collect()
}

fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn int(params: &Map<String, Value>, key: &str) -> Option<i64> {
    params.get(key).and_then(as_int)
}

fn string(params: &Map<String, Value>, key: &str) -> Option<String> {
    match params.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        v => Some(v.to_string()),
    }
}

const HTML_TAGS: &[&str] = &[
    "b",
    "strong",
    "i",
    "em",
    "u",
    "ins",
    "s",
    "strike",
    "del",
    "span",
    "tg-spoiler",
    "a",
    "code",
    "pre",
    "blockquote",
    "tg-emoji",
];

/// Checks Telegram's HTML rules: known tags, properly nested, and every
/// `<`, `>` and `&` outside a tag escaped.
fn check_html(text: &str) -> Result<(), String> {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = text;
    let mut offset = 0;
    while let Some(i) = rest.find(['<', '>', '&']) {
        let at = offset + i;
        let tail = &rest[i..];
        let consumed = if tail.starts_with('>') {
            return Err(format!("unescaped '>' at byte offset {at}"));
        } else if tail.starts_with('&') {
            let end = tail
                .find(';')
                .filter(|&e| e <= 10)
                .ok_or_else(|| format!("unescaped '&' at byte offset {at}"))?;
            let name = &tail[1..end];
            let known = matches!(name, "lt" | "gt" | "amp" | "quot")
                || name
                    .strip_prefix('#')
                    .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
            if !known {
                return Err(format!("unsupported entity at byte offset {at}"));
            }
            end + 1
        } else {
            let end = tail
                .find('>')
                .ok_or_else(|| format!("unclosed start tag at byte offset {at}"))?;
            let inner = &tail[1..end];
            if let Some(name) = inner.strip_prefix('/') {
                match stack.pop() {
                    Some(open) if open == name.trim() => {}
                    _ => return Err(format!("unexpected end tag at byte offset {at}")),
                }
            } else {
                let name = inner.split_whitespace().next().unwrap_or("");
                if !HTML_TAGS.contains(&name) {
                    return Err(format!(
                        "unsupported start tag \"{name}\" at byte offset {at}"
                    ));
                }
                stack.push(name.to_owned());
            }
            end + 1
        };
        rest = &tail[consumed..];
        offset = at + consumed;
    }
    match stack.pop() {
        Some(open) => Err(format!(
            "can't find end tag corresponding to start tag \"{open}\""
        )),
        None => Ok(()),
    }
}

/// Removes tags and decodes entities (best effort; for inspection only).
fn render_html(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find(['<', '&']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with('<') {
            match tail.find('>') {
                Some(e) => rest = &tail[e + 1..],
                None => {
                    out.push_str(tail);
                    rest = "";
                }
            }
        } else {
            let decoded = [
                ("&lt;", '<'),
                ("&gt;", '>'),
                ("&amp;", '&'),
                ("&quot;", '"'),
            ]
            .iter()
            .find(|(e, _)| tail.starts_with(e));
            match decoded {
                Some((e, c)) => {
                    out.push(*c);
                    rest = &tail[e.len()..];
                }
                None => {
                    out.push('&');
                    rest = &tail[1..];
                }
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests;
