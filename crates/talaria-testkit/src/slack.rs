//! A fake Slack on 127.0.0.1: the Web API methods the adapter calls and a
//! Socket Mode WebSocket, for adapter and end-to-end tests.
//!
//! [`FakeSlack`] answers `POST /api/{method}` for `auth.test` (bot token),
//! `apps.connections.open` (app token; returns a `ws://` URL on this same
//! server), `chat.postMessage`, `reactions.add` and `reactions.remove`,
//! with Slack's `{"ok": ...}` answers. Parameters are read from a JSON or
//! form-encoded body.
//!
//! Files: tests register a file others shared ([`FakeSlack::add_file`]),
//! which returns the file object an event carries; its `url_private` and
//! `url_private_download` are on this server under `/files-pri/` and need
//! the bot token as a bearer (without it Slack answers 200 with its
//! sign-in page, and so does the fake). Uploads follow the external flow:
//! `files.getUploadURLExternal` (`filename` and `length` required, a form
//! body only, as its documentation lists) answers an `upload_url` on this
//! server and a `file_id`; the bytes are posted there, raw or as a
//! multipart form (parsed for real); `files.completeUploadExternal` shares
//! uploaded files (`files`, `channel_id`, `thread_ts`, `initial_comment`),
//! refusing ids that were never uploaded. [`FakeSlack::uploads`] and
//! [`FakeSlack::shares`] record each step.
//!
//! The WebSocket sends `hello`, then every envelope tests push. Envelopes
//! stay pending until the client acknowledges them (`{"envelope_id"}`);
//! pending ones are sent again, with `retry_attempt` raised, on the next
//! connection or when a test calls [`FakeSlack::redeliver_pending`]. Tests
//! can also ask for a `disconnect` message, cut the connection, or make
//! the server go silent (it stops reading, so pings go unanswered, and
//! sends nothing) to exercise the client's watchdog.
//!
//! Like the other fakes, the server runs on its own thread and runtime and
//! stops when the [`FakeSlack`] is dropped.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::{any, get, post};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::fake::{Core, Faults, bind, started};

use handlers::{api, file_private, socket, upload};

mod handlers;

/// The bot's user id as `auth.test` reports it.
pub const BOT_USER_ID: &str = "UTALARIA";
/// The bot's bot id.
pub const BOT_ID: &str = "BTALARIA";

/// One `chat.postMessage` the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct Posted {
    /// The channel posted to.
    pub channel: String,
    /// The text exactly as sent (mrkdwn).
    pub text: String,
    /// The thread's root ts, for a reply in a thread.
    pub thread_ts: Option<String>,
    /// The `mrkdwn` flag, when given.
    pub mrkdwn: Option<bool>,
    /// The ts the fake assigned.
    pub ts: String,
    /// When the fake received it.
    pub at: Instant,
}

impl Posted {
    /// The text as a user would see it: Slack's three entities decoded.
    pub fn rendered(&self) -> String {
        self.text
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&")
    }
}

/// One `reactions.add` or `reactions.remove`.
#[derive(Debug, Clone, PartialEq)]
pub struct Reaction {
    /// `true` for `reactions.add`.
    pub added: bool,
    /// The channel of the message reacted to.
    pub channel: String,
    /// The ts of the message reacted to.
    pub timestamp: String,
    /// The emoji name, without colons.
    pub name: String,
}

/// Any Web API request, recorded when it arrived (before injected failures
/// or hangs).
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The Web API method (`chat.postMessage`, ...).
    pub method: String,
    /// The parameters, from the JSON or form body.
    pub params: Value,
    /// The bearer token was the right one for the method.
    pub authorized: bool,
    /// When the fake received it.
    pub at: Instant,
}

/// One file whose bytes were posted to its upload address.
#[derive(Debug, Clone, PartialEq)]
pub struct Upload {
    /// The id `files.getUploadURLExternal` gave.
    pub file_id: String,
    /// The `filename` given to `files.getUploadURLExternal`.
    pub filename: String,
    /// The `length` given to `files.getUploadURLExternal`.
    pub length: u64,
    /// The multipart field the bytes came in (`None` for a raw body).
    pub field: Option<String>,
    /// The multipart part's file name.
    pub part_filename: Option<String>,
    /// The part's (or raw body's) `Content-Type`.
    pub content_type: Option<String>,
    /// The bytes, exactly as received.
    pub bytes: Vec<u8>,
    /// An `Authorization` header came along (the address needs none).
    pub had_authorization: bool,
}

/// One `files.completeUploadExternal` the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    /// `files`, as (id, title).
    pub files: Vec<(String, Option<String>)>,
    /// `channel_id`, when given.
    pub channel_id: Option<String>,
    /// `thread_ts`, when given.
    pub thread_ts: Option<String>,
    /// `initial_comment`, when given.
    pub initial_comment: Option<String>,
}

/// A file the fake holds.
#[derive(Debug, Clone)]
struct StoredFile {
    name: String,
    mime: String,
    /// Set once uploaded (or at once for a file a test added).
    bytes: Option<Vec<u8>>,
    /// The `length` promised, for an upload.
    length: u64,
    /// The secret part of its upload address.
    upload_key: String,
}

/// A failure the next `chat.postMessage` answers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostFailure {
    /// HTTP 429 with `Retry-After: secs` and `error: ratelimited`.
    RateLimited(u64),
    /// HTTP 200 with `{"ok": false, "error": code}`.
    Error(String),
    /// This HTTP status with an empty body.
    Status(u16),
}

/// One envelope the fake sent or will send.
#[derive(Debug, Clone)]
struct Envelope {
    id: String,
    payload: Value,
    /// How many times it was sent so far.
    sent: u64,
    acked: bool,
}

/// What a test asks the live connection to do.
#[derive(Debug)]
enum Command {
    Text(String),
    Drop,
    Silence,
}

#[derive(Default)]
struct Book {
    next_ts: u64,
    next_envelope: u64,
    envelopes: Vec<Envelope>,
    acks: Vec<String>,
    posted: Vec<Posted>,
    reactions: Vec<Reaction>,
    post_failures: Faults<PostFailure>,
    open_failures: Faults<String>,
    /// Socket Mode connections accepted so far.
    connections: usize,
    /// `ping` frames received from clients.
    pings: usize,
    send_hello: bool,
    /// The live connection's command channel.
    live: Option<mpsc::UnboundedSender<Command>>,
    /// Frames the server sent, in order (hello, envelopes, disconnects).
    frames: Vec<Value>,
    next_file: u64,
    files: std::collections::HashMap<String, StoredFile>,
    uploads: Vec<Upload>,
    shares: Vec<Share>,
    /// File downloads: (path, the bot token came along).
    downloads: Vec<(String, bool)>,
}

struct Shared {
    bot_token: String,
    app_token: String,
    addr: SocketAddr,
    core: Core<Book, Request>,
}

/// A fake Slack (see the module docs).
pub struct FakeSlack {
    shared: Arc<Shared>,
}

impl FakeSlack {
    /// Starts the server on 127.0.0.1 with an ephemeral port, accepting
    /// `bot_token` for the Web API and `app_token` for Socket Mode.
    ///
    /// # Panics
    /// When no local port can be bound (a broken test environment).
    pub async fn start(bot_token: &str, app_token: &str) -> FakeSlack {
        Self::start_blocking(bot_token, app_token)
    }

    /// Like [`Self::start`], for tests without a runtime.
    ///
    /// # Panics
    /// When no local port can be bound.
    pub fn start_blocking(bot_token: &str, app_token: &str) -> FakeSlack {
        started(
            "the fake Slack server",
            Self::try_start(bot_token, app_token),
        )
    }

    /// Like [`Self::start`], returning the error instead of panicking.
    pub fn try_start(bot_token: &str, app_token: &str) -> std::io::Result<FakeSlack> {
        let (listener, addr) = bind()?;
        let shared = Arc::new(Shared {
            bot_token: bot_token.to_owned(),
            app_token: app_token.to_owned(),
            addr,
            core: Core::new(Book {
                next_ts: 1,
                next_envelope: 1,
                send_hello: true,
                ..Book::default()
            }),
        });
        let app = Router::new()
            .route("/api/{method}", post(api))
            .route("/socket", any(socket))
            .route("/files-pri/{key}/{name}", get(file_private))
            .route("/files-pri/{key}/download/{name}", get(file_private))
            // Files of any size a test sends, not axum's 2 MB.
            .route(
                "/upload/v1/{key}",
                post(upload).layer(axum::extract::DefaultBodyLimit::max(64 << 20)),
            )
            .with_state(shared.clone());
        shared.core.serve("fake-slack", listener, app)?;
        Ok(FakeSlack { shared })
    }

    /// `http://127.0.0.1:PORT/api`: the Web API root.
    pub fn api_base(&self) -> String {
        format!("http://{}/api", self.shared.addr)
    }

    /// The bot's user id (`auth.test`).
    pub fn bot_user_id(&self) -> &'static str {
        BOT_USER_ID
    }

    /// Queues an `events_api` envelope carrying `event` (a Slack event
    /// object); `ts` and `event_ts` are filled in when missing. Sent at once
    /// when a client is connected. Returns the envelope id.
    pub fn push_event(&self, mut event: Value) -> String {
        let id = {
            let mut st = self.shared.core.change();
            if let Some(obj) = event.as_object_mut()
                && !obj.contains_key("ts")
                && obj.get("type").and_then(Value::as_str) != Some("reaction_added")
            {
                let ts = format!("1700000000.{:06}", st.next_ts);
                st.next_ts += 1;
                obj.insert("ts".into(), json!(ts));
            }
            let event_ts = event.get("ts").cloned().unwrap_or(Value::Null);
            if let Some(obj) = event.as_object_mut() {
                obj.entry("event_ts").or_insert(event_ts);
            }
            let n = st.next_envelope;
            st.next_envelope += 1;
            let id = format!("env-{n:04}");
            let payload = json!({
                "token": "verification-token-unused",
                "team_id": "T0TALARIA",
                "api_app_id": "A0TALARIA",
                "event": event,
                "type": "event_callback",
                "event_id": format!("Ev{n:08}"),
                "event_time": 1_700_000_000u64 + n,
            });
            st.envelopes.push(Envelope {
                id: id.clone(),
                payload,
                sent: 0,
                acked: false,
            });
            id
        };
        self.flush();
        id
    }

    /// Queues a DM (`channel_type: im`) from `user` in channel `channel`.
    /// Returns (envelope id, message ts).
    pub fn push_dm(&self, channel: &str, user: &str, text: &str) -> (String, String) {
        let ts = self.next_ts();
        let env = self.push_event(json!({
            "type": "message", "channel": channel, "channel_type": "im",
            "user": user, "text": text, "ts": ts, "client_msg_id": format!("cm-{ts}"),
        }));
        (env, ts)
    }

    /// Queues a channel message (`channel_type: channel`), in a thread
    /// when `thread_ts` is given. Returns (envelope id, message ts).
    pub fn push_channel_message(
        &self,
        channel: &str,
        user: &str,
        text: &str,
        thread_ts: Option<&str>,
    ) -> (String, String) {
        let ts = self.next_ts();
        let mut event = json!({
            "type": "message", "channel": channel, "channel_type": "channel",
            "user": user, "text": text, "ts": ts, "client_msg_id": format!("cm-{ts}"),
        });
        if let Some(t) = thread_ts {
            event["thread_ts"] = json!(t);
        }
        (self.push_event(event), ts)
    }

    /// Queues an `app_mention` for a message already pushed (same `ts`), as
    /// Slack sends beside the `message` event when the bot is mentioned.
    pub fn push_app_mention(
        &self,
        channel: &str,
        user: &str,
        text: &str,
        ts: &str,
        thread_ts: Option<&str>,
    ) -> String {
        let mut event = json!({
            "type": "app_mention", "channel": channel, "user": user, "text": text, "ts": ts,
        });
        if let Some(t) = thread_ts {
            event["thread_ts"] = json!(t);
        }
        self.push_event(event)
    }

    /// A fresh message ts.
    pub fn next_ts(&self) -> String {
        let mut st = self.shared.core.change();
        let ts = format!("1700000000.{:06}", st.next_ts);
        st.next_ts += 1;
        ts
    }

    /// Sends every envelope again (acknowledged or not) when `all`, else
    /// only the pending ones, with `retry_attempt` raised: what Slack does
    /// when it thinks an ack was lost.
    pub fn redeliver(&self, all: bool) {
        let frames = {
            let mut st = self.shared.core.change();
            if st.live.is_none() {
                return;
            }
            let mut out = Vec::new();
            for e in st.envelopes.iter_mut().filter(|e| all || !e.acked) {
                if e.sent > 0 {
                    out.push(envelope_frame(e));
                    e.sent += 1;
                }
            }
            out
        };
        for f in frames {
            self.send_frame(f);
        }
    }

    /// Sends the pending (unacknowledged) envelopes again.
    pub fn redeliver_pending(&self) {
        self.redeliver(false);
    }

    /// Sends `{"type": "disconnect", "reason": reason}` on the live
    /// connection (`refresh_requested`, `warning`, `link_disabled`).
    pub fn send_disconnect(&self, reason: &str) {
        self.send_frame(json!({
            "type": "disconnect", "reason": reason,
            "debug_info": {"host": "fake-slack"},
        }));
    }

    /// Sends `text` as it is on the live connection (malformed frames).
    pub fn send_raw(&self, text: &str) {
        if let Some(tx) = &self.shared.core.read().live {
            let _ = tx.send(Command::Text(text.to_owned()));
        }
    }

    /// Cuts the live connection without a close frame.
    pub fn drop_connection(&self) {
        if let Some(tx) = self.shared.core.change().live.take() {
            let _ = tx.send(Command::Drop);
        }
    }

    /// The live connection stops reading and writing but stays open: pings
    /// go unanswered, like a socket that died without telling anyone.
    pub fn go_silent(&self) {
        if let Some(tx) = self.shared.core.change().live.take() {
            let _ = tx.send(Command::Silence);
        }
    }

    /// Whether new connections get `hello` (on by default).
    pub fn set_send_hello(&self, on: bool) {
        self.shared.core.change().send_hello = on;
    }

    /// The next `chat.postMessage` calls fail like this, one per entry.
    pub fn fail_next_post(&self, failure: PostFailure) {
        self.shared.core.change().post_failures.push(failure);
    }

    /// The next `apps.connections.open` answers `ok: false` with `error`.
    pub fn fail_next_open(&self, error: &str) {
        self.shared
            .core
            .change()
            .open_failures
            .push(error.to_owned());
    }

    /// While set, `chat.postMessage` requests are recorded but hang and are
    /// never delivered; clearing it (or stopping) answers them with a 502.
    pub fn hang_post(&self, hang: bool) {
        self.shared.core.set_hang(hang);
    }

    /// Every message posted so far, in order.
    pub fn posted(&self) -> Vec<Posted> {
        self.shared.core.read().posted.clone()
    }

    /// Every reaction added or removed so far.
    pub fn reactions(&self) -> Vec<Reaction> {
        self.shared.core.read().reactions.clone()
    }

    /// Every Web API request so far, including failed and hung ones.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.core.requests()
    }

    /// The `chat.postMessage` requests so far, answered or not.
    pub fn post_attempts(&self) -> Vec<Request> {
        self.shared.core.requests_where(is_post)
    }

    /// Envelope ids acknowledged so far, in order (repeats included).
    pub fn acks(&self) -> Vec<String> {
        self.shared.core.read().acks.clone()
    }

    /// Envelopes not yet acknowledged.
    pub fn pending(&self) -> usize {
        self.shared
            .core
            .read()
            .envelopes
            .iter()
            .filter(|e| !e.acked)
            .count()
    }

    /// A file someone shared, served to the bot token; returns the file
    /// object a `message` event's `files` carries.
    pub fn add_file(&self, name: &str, mime: &str, bytes: &[u8]) -> Value {
        let mut st = self.shared.core.change();
        let id = next_file_id(&mut st);
        st.files.insert(
            id.clone(),
            StoredFile {
                name: name.to_owned(),
                mime: mime.to_owned(),
                bytes: Some(bytes.to_vec()),
                length: bytes.len() as u64,
                upload_key: String::new(),
            },
        );
        drop(st);
        self.file_object(&id, name, mime, bytes.len())
    }

    fn file_object(&self, id: &str, name: &str, mime: &str, size: usize) -> Value {
        let base = format!("http://{}/files-pri/T0TALARIA-{id}", self.shared.addr);
        let filetype = name
            .rsplit_once('.')
            .map(|(_, e)| e.to_ascii_lowercase())
            .unwrap_or_default();
        json!({
            "id": id, "name": name, "title": name, "mimetype": mime, "filetype": filetype,
            "size": size, "mode": "hosted", "is_external": false,
            "url_private": format!("{base}/{name}"),
            "url_private_download": format!("{base}/download/{name}"),
        })
    }

    /// Queues a DM with `files` (from [`Self::add_file`]) as Slack sends
    /// it: a `message` of subtype `file_share`. Returns (envelope id, ts).
    pub fn push_dm_files(
        &self,
        channel: &str,
        user: &str,
        text: &str,
        files: &[Value],
    ) -> (String, String) {
        let ts = self.next_ts();
        let env = self.push_event(json!({
            "type": "message", "subtype": "file_share", "channel": channel,
            "channel_type": "im", "user": user, "text": text, "ts": ts,
            "upload": false, "files": files,
        }));
        (env, ts)
    }

    /// Every upload whose bytes arrived, in order.
    pub fn uploads(&self) -> Vec<Upload> {
        self.shared.core.read().uploads.clone()
    }

    /// Every accepted `files.completeUploadExternal`, in order.
    pub fn shares(&self) -> Vec<Share> {
        self.shared.core.read().shares.clone()
    }

    /// Every file download: (path, whether the bot token came along).
    pub fn downloads(&self) -> Vec<(String, bool)> {
        self.shared.core.read().downloads.clone()
    }

    /// Socket Mode connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.core.read().connections
    }

    /// Whether a connection is live (connected and not silenced or cut).
    pub fn connected(&self) -> bool {
        self.shared.core.read().live.is_some()
    }

    /// WebSocket pings received from clients.
    pub fn pings(&self) -> usize {
        self.shared.core.read().pings
    }

    /// Every frame the server sent, in order.
    pub fn frames(&self) -> Vec<Value> {
        self.shared.core.read().frames.clone()
    }

    /// Waits until at least `n` messages were posted and returns them all.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_posts(&self, n: usize, timeout: Duration) -> Vec<Posted> {
        self.shared
            .core
            .wait_len("posted messages", n, timeout, |st| &st.posted)
            .await
    }

    /// Waits until at least `n` `chat.postMessage` requests arrived.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_post_attempts(&self, n: usize, timeout: Duration) -> Vec<Request> {
        self.shared
            .core
            .wait_requests("chat.postMessage requests", n, timeout, is_post)
            .await
    }

    /// Waits until every envelope pushed so far is acknowledged.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_all_acked(&self, timeout: Duration) {
        self.shared
            .core
            .wait(
                "every envelope acknowledged",
                timeout,
                |st| st.envelopes.iter().all(|e| e.acked).then_some(()),
                |st| st.envelopes.iter().filter(|e| !e.acked).count(),
            )
            .await;
    }

    /// Waits until at least `n` connections were made and the latest one is
    /// live.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_connection(&self, n: usize, timeout: Duration) {
        let what = format!("connection {n}, live");
        self.shared
            .core
            .wait(
                &what,
                timeout,
                |st| (st.connections >= n && st.live.is_some()).then_some(()),
                |st| (st.connections, st.live.is_some()),
            )
            .await;
    }

    /// Waits until at least `n` pings arrived.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_pings(&self, n: usize, timeout: Duration) {
        let what = format!("{n} pings");
        self.shared
            .core
            .wait(
                &what,
                timeout,
                |st| (st.pings >= n).then_some(()),
                |st| st.pings,
            )
            .await;
    }

    /// Waits until `done` holds for the recorded reactions.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_reactions(
        &self,
        timeout: Duration,
        done: impl Fn(&[Reaction]) -> bool,
    ) -> Vec<Reaction> {
        self.shared
            .core
            .wait(
                "the awaited reactions",
                timeout,
                |st| done(&st.reactions).then(|| st.reactions.clone()),
                |st| st.reactions.clone(),
            )
            .await
    }

    /// Sends the envelopes that were never sent, when a client is live.
    fn flush(&self) {
        let frames = {
            let mut st = self.shared.core.change();
            if st.live.is_none() {
                return;
            }
            let mut out = Vec::new();
            for e in st.envelopes.iter_mut().filter(|e| e.sent == 0) {
                out.push(envelope_frame(e));
                e.sent += 1;
            }
            out
        };
        for f in frames {
            self.send_frame(f);
        }
    }

    fn send_frame(&self, frame: Value) {
        send_frame(&self.shared, frame);
    }

    /// Stops the server (also on drop). Open connections are cut.
    pub fn shutdown(&self) {
        self.shared.core.stop();
    }
}

/// Whether `r` is a `chat.postMessage`, answered or not.
fn is_post(r: &Request) -> bool {
    r.method == "chat.postMessage"
}

impl Drop for FakeSlack {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn send_frame(shared: &Shared, frame: Value) {
    let mut st = shared.core.change();
    if let Some(tx) = &st.live
        && tx.send(Command::Text(frame.to_string())).is_ok()
    {
        st.frames.push(frame);
    }
    drop(st);
}

/// The wire form of an envelope on its next sending.
fn envelope_frame(e: &Envelope) -> Value {
    let mut frame = json!({
        "envelope_id": e.id,
        "type": "events_api",
        "payload": e.payload,
        "accepts_response_payload": false,
        "retry_attempt": e.sent,
        "retry_reason": "",
    });
    if e.sent > 0 {
        frame["retry_reason"] = json!("timeout");
    }
    frame
}

#[cfg(test)]
mod tests;

fn next_file_id(st: &mut Book) -> String {
    st.next_file += 1;
    format!("F{:08}", st.next_file)
}
