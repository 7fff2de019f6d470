//! A fake Matrix homeserver on 127.0.0.1, for adapter and end-to-end tests.
//!
//! [`FakeMatrix`] speaks the parts of the client-server API the adapter
//! uses, as real HTTP with real JSON under `/_matrix/client/v3/`:
//! `account/whoami`, `profile/{user}/displayname`, `sync` (long polling;
//! `next_batch` tokens are positions in one event log, so a `since`
//! returns exactly what came after it), `join/{room}` and
//! `rooms/{room}/join`, `rooms/{room}/send/{type}/{txn}` (idempotent per
//! transaction id, as the spec requires), `rooms/{room}/typing/{user}`,
//! `rooms/{room}/joined_members` and `user/{user}/account_data/{type}`.
//! Every request needs `Authorization: Bearer <token>`.
//!
//! Its media repository: `POST /_matrix/media/v3/upload` (raw body, type in
//! `Content-Type`, name in `?filename=`) answers an `mxc://localhost/...`
//! `content_uri`, and files are served at the authenticated
//! `GET /_matrix/client/v1/media/download/{server}/{id}[/{name}]`. As on a
//! Synapse with authenticated media, the older unauthenticated
//! `GET /_matrix/media/v3/download/...` answers 404 `M_NOT_FOUND`; after
//! [`FakeMatrix::legacy_media_only`] it is the other way round, as on a
//! homeserver older than Matrix 1.11 (404 `M_UNRECOGNIZED` for the new
//! endpoint). Uploads are refused past [`FakeMatrix::set_max_upload`]
//! with 413 `M_TOO_LARGE`.
//!
//! Where the adapter depends on it, the fake answers as Synapse does: a
//! sync carries no `summary.m.joined_member_count` (Synapse sends it only
//! with lazy-loaded members), a room's state comes only with the first
//! sync and when the bot newly joined it, a fresh join's timeline is
//! `limited` and holds the bot's own join event, and every timeline event
//! says the bot's membership when it was written (`unsigned.membership`).
//!
//! Like the fake Telegram server it runs on its own thread and runtime, so
//! it keeps answering while a test blocks, and stops when dropped.
//!
//! Tests create rooms and push events (`create_room`, `create_dm`,
//! `push_text`, `push_event`, `invite`, `add_file`), inspect what the bot
//! did (`sent`, `send_attempts`, `typing`, `joins`, `sync_calls`,
//! `requests`, `uploads`) and
//! inject failures (`fail_next_send_with_429`, `hang_send`,
//! `fail_next_syncs`, `fail_next_joined_members`, `drop_next_sync`,
//! `drop_next_send_answer`, `revoke_token`).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::fake::{Core, Faults, bind, started};
use axum::Router;
use handlers::handle;
use serde_json::{Value, json};

mod handlers;

/// The bot's user id, as `whoami` reports it.
pub const BOT_USER_ID: &str = "@talaria:localhost";

/// The bot's display name, as its profile reports it.
pub const BOT_DISPLAY_NAME: &str = "Talaria";

/// The fake's server name, in its `mxc://` addresses.
pub const SERVER_NAME: &str = "localhost";

/// The largest upload accepted unless a test sets another
/// ([`FakeMatrix::set_max_upload`]); Synapse's default `max_upload_size`.
pub const DEFAULT_MAX_UPLOAD: usize = 50 * 1024 * 1024;

/// The largest event content the fake accepts, in bytes of JSON (the
/// spec's limit is for the whole event; the fake checks the content).
pub const MAX_EVENT_BYTES: usize = 65_536;

/// One message event the fake accepted from the bot.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// The room the event went to.
    pub room_id: String,
    /// The client's transaction id from the path (repeats on a retried send).
    pub txn_id: String,
    /// The event content exactly as sent.
    pub content: Value,
    /// The id the fake assigned.
    pub event_id: String,
    /// When the fake received it.
    pub at: Instant,
}

impl Sent {
    /// The plain `body`.
    pub fn body(&self) -> String {
        self.content
            .get("body")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    }

    /// The HTML `formatted_body`, when sent.
    pub fn html(&self) -> Option<String> {
        self.content
            .get("formatted_body")
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    /// The thread root, for a message sent in a thread.
    pub fn thread_root(&self) -> Option<String> {
        let rel = self.content.get("m.relates_to")?;
        (rel.get("rel_type").and_then(Value::as_str) == Some("m.thread"))
            .then(|| rel.get("event_id").and_then(Value::as_str))
            .flatten()
            .map(str::to_owned)
    }

    /// `m.relates_to.m.in_reply_to.event_id`, when present.
    pub fn in_reply_to(&self) -> Option<String> {
        self.content
            .pointer("/m.relates_to/m.in_reply_to/event_id")
            .and_then(Value::as_str)
            .map(str::to_owned)
    }
}

/// One file the bot uploaded to the media repository.
#[derive(Debug, Clone, PartialEq)]
pub struct Upload {
    /// The `filename` query parameter, when given.
    pub filename: Option<String>,
    /// The `Content-Type` header, when given.
    pub content_type: Option<String>,
    /// The bytes, exactly as received.
    pub bytes: Vec<u8>,
    /// The `content_uri` the fake answered.
    pub content_uri: String,
}

/// A file in the fake's media repository.
#[derive(Debug, Clone)]
struct Stored {
    bytes: Vec<u8>,
    content_type: String,
    filename: Option<String>,
}

/// One `/sync` request, recorded when it arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncCall {
    /// The `since` token, absent on an initial sync.
    pub since: Option<String>,
    /// The long-poll `timeout`, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// The `filter` parameter (an id or inline JSON), when given.
    pub filter: Option<String>,
    /// When the fake received it.
    pub at: Instant,
}

/// One typing notice.
#[derive(Debug, Clone, PartialEq)]
pub struct Typing {
    /// The room the notice is for.
    pub room_id: String,
    /// The user from the path (the bot).
    pub user_id: String,
    /// `true` to show the indicator, `false` to clear it.
    pub typing: bool,
    /// How long the indicator should last, when shown.
    pub timeout_ms: Option<u64>,
    /// When the fake received it.
    pub at: Instant,
}

/// Any request, recorded when it arrived (before injected failures or
/// hangs), with its decoded path below `/_matrix/client/v3/` (media
/// requests keep their whole path: `_matrix/media/v3/upload`).
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The HTTP method (`GET`, `PUT`, ...).
    pub method: String,
    /// The decoded path below `/_matrix/client/v3/`, or the whole path
    /// without its leading `/` for a media request.
    pub path: String,
    /// The JSON body (`null` when there was none or it did not parse).
    pub body: Value,
    /// When the fake received it.
    pub at: Instant,
    /// The bearer token was the right one.
    pub authorized: bool,
}

enum Entry {
    Timeline { room_id: String, event: Value },
    Invite { room_id: String },
}

struct Room {
    name: Option<String>,
    /// Joined users, the bot included once it joined.
    members: Vec<String>,
    bot_joined: bool,
    /// (inviter, is_direct) of a pending invite for the bot.
    invite: Option<(String, bool)>,
    /// The log position from which the bot was invited, and joined.
    invited_at: Option<usize>,
    joined_at: Option<usize>,
}

#[derive(Default)]
struct Book {
    log: Vec<Entry>,
    rooms: BTreeMap<String, Room>,
    next_event: u64,
    /// txn id -> event id, for idempotent sends.
    txns: HashMap<String, String>,
    sent: Vec<Sent>,
    syncs: Vec<SyncCall>,
    typing: Vec<Typing>,
    joins: Vec<String>,
    direct: Option<Value>,
    /// `retry_after_ms` of each 429 the next sends get.
    fail_429: Faults<u64>,
    fail_syncs: Faults<()>,
    fail_joined_members: Faults<()>,
    drop_syncs: Faults<()>,
    drop_send_answers: Faults<()>,
    revoked: bool,
    /// media id -> the file.
    media: HashMap<String, Stored>,
    next_media: u64,
    uploads: Vec<Upload>,
    legacy_media_only: bool,
    max_upload: usize,
    /// `retry_after_ms` of each 429 the next uploads get.
    fail_upload_429: Faults<u64>,
}

struct Shared {
    token: String,
    core: Core<Book, Request>,
}

/// A fake Matrix homeserver (see the module docs).
pub struct FakeMatrix {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl FakeMatrix {
    /// Starts the server on 127.0.0.1 with an ephemeral port, accepting
    /// `token` as the bot's access token.
    ///
    /// # Panics
    /// When no local port can be bound (a broken test environment).
    pub async fn start(token: &str) -> FakeMatrix {
        Self::start_blocking(token)
    }

    /// Like [`Self::start`], for tests without a runtime.
    ///
    /// # Panics
    /// When no local port can be bound.
    pub fn start_blocking(token: &str) -> FakeMatrix {
        started("the fake Matrix server", Self::try_start(token))
    }

    /// Like [`Self::start`], returning the error instead of panicking.
    pub fn try_start(token: &str) -> std::io::Result<FakeMatrix> {
        let (listener, addr) = bind()?;
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            core: Core::new(Book {
                next_event: 1,
                max_upload: DEFAULT_MAX_UPLOAD,
                ..Book::default()
            }),
        });
        // Uploads up to the largest a test may allow, not axum's 2 MB.
        let app = Router::new()
            .fallback(handle)
            .layer(axum::extract::DefaultBodyLimit::max(2 * DEFAULT_MAX_UPLOAD))
            .with_state(shared.clone());
        shared.core.serve("fake-matrix", listener, app)?;
        Ok(FakeMatrix { addr, shared })
    }

    /// `http://127.0.0.1:PORT`: the homeserver URL.
    pub fn homeserver(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The accepted access token.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The bot's user id.
    pub fn bot_user_id(&self) -> &'static str {
        BOT_USER_ID
    }

    /// A room the bot has joined, with `members` (the bot is added).
    pub fn create_room(&self, room_id: &str, name: Option<&str>, members: &[&str]) {
        let mut all: Vec<String> = members.iter().map(|m| (*m).to_owned()).collect();
        all.push(BOT_USER_ID.to_owned());
        let mut st = self.shared.core.change();
        let now = st.log.len();
        st.rooms.insert(
            room_id.to_owned(),
            Room {
                name: name.map(str::to_owned),
                members: all,
                bot_joined: true,
                invite: None,
                invited_at: None,
                joined_at: Some(now),
            },
        );
        drop(st);
    }

    /// A joined two-member room with `user`; returns its id.
    pub fn create_dm(&self, user: &str) -> String {
        let local = user
            .trim_start_matches('@')
            .split(':')
            .next()
            .unwrap_or("user");
        let room_id = format!("!dm-{local}:localhost");
        self.create_room(&room_id, None, &[user]);
        room_id
    }

    /// Marks rooms as direct chats in the account's `m.direct` data
    /// (sent with every sync from now on).
    pub fn set_direct(&self, by_user: Value) {
        self.shared.core.change().direct = Some(by_user);
    }

    /// An invite for the bot into a new room that has `inviter` in it.
    pub fn invite(&self, room_id: &str, inviter: &str, is_direct: bool) {
        self.invite_into(room_id, inviter, &[], is_direct);
    }

    /// An invite for the bot from `inviter` into a room with `inviter` and
    /// `others` in it, new or existing (made with [`Self::room_without_bot`]).
    pub fn invite_into(&self, room_id: &str, inviter: &str, others: &[&str], is_direct: bool) {
        let mut st = self.shared.core.change();
        let now = st.log.len();
        let room = st.rooms.entry(room_id.to_owned()).or_insert_with(|| Room {
            name: None,
            members: Vec::new(),
            bot_joined: false,
            invite: None,
            invited_at: None,
            joined_at: None,
        });
        for m in std::iter::once(inviter).chain(others.iter().copied()) {
            if !room.members.iter().any(|x| x == m) {
                room.members.push(m.to_owned());
            }
        }
        room.invite = Some((inviter.to_owned(), is_direct));
        room.invited_at = Some(now);
        st.log.push(Entry::Invite {
            room_id: room_id.to_owned(),
        });
    }

    /// A room the bot is not in (yet), with `members`: its messages reach
    /// the bot only once it joined, as history.
    pub fn room_without_bot(&self, room_id: &str, name: Option<&str>, members: &[&str]) {
        self.shared.core.change().rooms.insert(
            room_id.to_owned(),
            Room {
                name: name.map(str::to_owned),
                members: members.iter().map(|m| (*m).to_owned()).collect(),
                bot_joined: false,
                invite: None,
                invited_at: None,
                joined_at: None,
            },
        );
    }

    /// `user` joins `room_id`: a membership event in its timeline.
    pub fn add_member(&self, room_id: &str, user: &str) {
        let mut st = self.shared.core.change();
        if let Some(room) = st.rooms.get_mut(room_id)
            && !room.members.iter().any(|m| m == user)
        {
            room.members.push(user.to_owned());
        }
        let mut event = member_event(room_id, user, "join");
        event["event_id"] = json!(format!("$ev{}", st.next_event));
        st.next_event += 1;
        st.log.push(Entry::Timeline {
            room_id: room_id.to_owned(),
            event,
        });
    }

    /// An `m.text` message from `sender`; returns its event id.
    pub fn push_text(&self, room_id: &str, sender: &str, body: &str) -> String {
        self.push_event(
            room_id,
            sender,
            json!({ "msgtype": "m.text", "body": body }),
        )
    }

    /// An `m.text` message in the thread rooted at `root`.
    pub fn push_thread_text(&self, room_id: &str, sender: &str, root: &str, body: &str) -> String {
        self.push_event(
            room_id,
            sender,
            json!({
                "msgtype": "m.text", "body": body,
                "m.relates_to": { "rel_type": "m.thread", "event_id": root,
                    "is_falling_back": true, "m.in_reply_to": { "event_id": root } },
            }),
        )
    }

    /// An `m.room.message` with `content`; returns its event id.
    pub fn push_event(&self, room_id: &str, sender: &str, content: Value) -> String {
        self.push_raw(
            room_id,
            json!({ "type": "m.room.message", "sender": sender, "content": content }),
        )
    }

    /// Any timeline event. An `event_id`, `origin_server_ts` and
    /// `unsigned` are added when missing, so a test can push the same
    /// event id twice (a re-delivery). Returns the event id.
    pub fn push_raw(&self, room_id: &str, mut event: Value) -> String {
        let mut st = self.shared.core.change();
        let id = match event.get("event_id").and_then(Value::as_str) {
            Some(id) => id.to_owned(),
            None => {
                let id = format!("$ev{}", st.next_event);
                st.next_event += 1;
                id
            }
        };
        if let Some(obj) = event.as_object_mut() {
            obj.insert("event_id".into(), json!(id));
            obj.entry("origin_server_ts")
                .or_insert_with(|| json!(now_ms()));
            obj.entry("unsigned").or_insert_with(|| json!({ "age": 1 }));
        }
        st.log.push(Entry::Timeline {
            room_id: room_id.to_owned(),
            event,
        });
        id
    }

    /// A file in the media repository, as if another user had uploaded
    /// it; returns its `mxc://` address for an event's `url`.
    pub fn add_file(&self, bytes: &[u8], content_type: &str, filename: Option<&str>) -> String {
        let mut st = self.shared.core.change();
        store_file(&mut st, bytes.to_vec(), content_type, filename)
    }

    /// Every upload so far, in order.
    pub fn uploads(&self) -> Vec<Upload> {
        self.shared.core.read().uploads.clone()
    }

    /// Serve media as a homeserver older than Matrix 1.11 does: only the
    /// unauthenticated `/_matrix/media/v3/download`, the authenticated
    /// endpoint unknown (404 `M_UNRECOGNIZED`).
    pub fn legacy_media_only(&self, legacy: bool) {
        self.shared.core.change().legacy_media_only = legacy;
    }

    /// The next upload gets 429 `M_LIMIT_EXCEEDED` with `retry_after_ms`.
    pub fn fail_next_upload_with_429(&self, retry_after_ms: u64) {
        self.shared
            .core
            .change()
            .fail_upload_429
            .push(retry_after_ms);
    }

    /// Uploads larger than `bytes` are refused with 413 `M_TOO_LARGE`.
    pub fn set_max_upload(&self, bytes: usize) {
        self.shared.core.change().max_upload = bytes;
    }

    /// Every message the bot sent, in order (each transaction once).
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.core.read().sent.clone()
    }

    /// Every `/sync` call so far.
    pub fn sync_calls(&self) -> Vec<SyncCall> {
        self.shared.core.read().syncs.clone()
    }

    /// Every request so far, including failed and hung ones.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.core.requests()
    }

    /// The send requests so far, answered or not.
    pub fn send_attempts(&self) -> Vec<Request> {
        self.shared.core.requests_where(|r| is_send_path(&r.path))
    }

    /// Every typing notice so far.
    pub fn typing(&self) -> Vec<Typing> {
        self.shared.core.read().typing.clone()
    }

    /// The rooms the bot joined on invite, in order.
    pub fn joins(&self) -> Vec<String> {
        self.shared.core.read().joins.clone()
    }

    /// The `next_batch` a sync would return now.
    pub fn current_token(&self) -> String {
        token_at(self.shared.core.read().log.len())
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

    /// Waits until at least `n` send requests arrived (answered or not).
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_send_attempts(&self, n: usize, timeout: Duration) -> Vec<Request> {
        self.shared
            .core
            .wait_requests("send requests", n, timeout, |r| is_send_path(&r.path))
            .await
    }

    /// Waits until at least `n` `/sync` calls arrived and returns them.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_sync_calls(&self, n: usize, timeout: Duration) -> Vec<SyncCall> {
        self.shared
            .core
            .wait_len("sync calls", n, timeout, |st| &st.syncs)
            .await
    }

    /// Waits until a `/sync` arrives whose `since` is the current end of
    /// the log: the bot has taken everything pushed so far.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_until_caught_up(&self, timeout: Duration) {
        let token = self.current_token();
        let what = format!("a sync from {token}");
        self.shared
            .core
            .wait(
                &what,
                timeout,
                |st| {
                    st.syncs
                        .iter()
                        .any(|s| s.since.as_deref() == Some(&token))
                        .then_some(())
                },
                |st| st.syncs.clone(),
            )
            .await;
    }

    /// Waits until at least `n` typing notices arrived.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_typing(&self, n: usize, timeout: Duration) -> Vec<Typing> {
        self.shared
            .core
            .wait_len("typing notices", n, timeout, |st| &st.typing)
            .await
    }

    /// Waits until the bot joined at least `n` rooms on invite.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_joins(&self, n: usize, timeout: Duration) -> Vec<String> {
        self.shared
            .core
            .wait_len("joins", n, timeout, |st| &st.joins)
            .await
    }

    /// The next send gets 429 `M_LIMIT_EXCEEDED` with `retry_after_ms`
    /// (and a `Retry-After` header). Calls queue up.
    pub fn fail_next_send_with_429(&self, retry_after_ms: u64) {
        self.shared.core.change().fail_429.push(retry_after_ms);
    }

    /// While set, sends are recorded as attempts but hang unanswered and
    /// are never delivered; clearing it (or stopping the server) answers
    /// them with a 502.
    pub fn hang_send(&self, hang: bool) {
        self.shared.core.set_hang(hang);
    }

    /// The next `n` `/sync` calls get a 502 from "a proxy" (no Matrix body).
    pub fn fail_next_syncs(&self, n: usize) {
        self.shared.core.change().fail_syncs.arm(n);
    }

    /// The next `n` `joined_members` requests get a 502 from "a proxy".
    pub fn fail_next_joined_members(&self, n: usize) {
        self.shared.core.change().fail_joined_members.arm(n);
    }

    /// The next `/sync` that has something to return is cut off mid-body:
    /// the connection drops after part of the answer went out.
    pub fn drop_next_sync(&self) {
        self.shared.core.change().drop_syncs.push(());
    }

    /// The next send that is accepted (recorded, its event in the log)
    /// loses its answer: the connection drops before the client learns the
    /// event id, as when a response is lost on the way back.
    pub fn drop_next_send_answer(&self) {
        self.shared.core.change().drop_send_answers.push(());
    }

    /// From now on the token is refused with `M_UNKNOWN_TOKEN`.
    pub fn revoke_token(&self) {
        self.shared.core.change().revoked = true;
    }

    /// Stops the server (also on drop). Open connections are cut.
    pub fn shutdown(&self) {
        self.shared.core.stop();
    }
}

impl Drop for FakeMatrix {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn store_file(st: &mut Book, bytes: Vec<u8>, content_type: &str, filename: Option<&str>) -> String {
    let id = format!("media{:06}", st.next_media);
    st.next_media += 1;
    st.media.insert(
        id.clone(),
        Stored {
            bytes,
            content_type: content_type.to_owned(),
            filename: filename.map(str::to_owned),
        },
    );
    format!("mxc://{SERVER_NAME}/{id}")
}

fn token_at(position: usize) -> String {
    format!("s{position}")
}

fn is_send_path(path: &str) -> bool {
    path.starts_with("rooms/") && path.contains("/send/")
}

fn member_event(room_id: &str, user: &str, membership: &str) -> Value {
    let local = user
        .trim_start_matches('@')
        .split(':')
        .next()
        .unwrap_or(user);
    let mut name = local.to_owned();
    if let Some(first) = name.get_mut(..1) {
        first.make_ascii_uppercase();
    }
    json!({
        "type": "m.room.member", "state_key": user, "sender": user,
        "event_id": format!("$member-{local}-{room_id}"),
        "origin_server_ts": 0,
        "content": { "membership": membership, "displayname": name },
    })
}
