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
//! `push_text`, `push_event`, `invite`), inspect what the bot did (`sent`,
//! `send_attempts`, `typing`, `joins`, `sync_calls`, `requests`) and
//! inject failures (`fail_next_send_with_429`, `hang_send`,
//! `fail_next_syncs`, `fail_next_joined_members`, `drop_next_sync`,
//! `drop_next_send_answer`, `revoke_token`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::Response;
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::{json_response, lock};

/// The bot's user id, as `whoami` reports it.
pub const BOT_USER_ID: &str = "@talaria:localhost";

/// The bot's display name, as its profile reports it.
pub const BOT_DISPLAY_NAME: &str = "Talaria";

/// The largest event content the fake accepts, in bytes of JSON (the
/// spec's limit is for the whole event; the fake checks the content).
pub const MAX_EVENT_BYTES: usize = 65_536;

/// One message event the fake accepted from the bot.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    pub room_id: String,
    pub txn_id: String,
    /// The event content exactly as sent.
    pub content: Value,
    /// The id the fake assigned.
    pub event_id: String,
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

/// One `/sync` request, recorded when it arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncCall {
    pub since: Option<String>,
    pub timeout_ms: Option<u64>,
    pub filter: Option<String>,
    pub at: Instant,
}

/// One typing notice.
#[derive(Debug, Clone, PartialEq)]
pub struct Typing {
    pub room_id: String,
    pub user_id: String,
    pub typing: bool,
    pub timeout_ms: Option<u64>,
    pub at: Instant,
}

/// Any request, recorded when it arrived (before injected failures or
/// hangs), with its decoded path below `/_matrix/client/v3/`.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub body: Value,
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
    requests: Vec<Request>,
    typing: Vec<Typing>,
    joins: Vec<String>,
    direct: Option<Value>,
    fail_429: VecDeque<u64>,
    fail_syncs: usize,
    fail_joined_members: usize,
    drop_syncs: usize,
    drop_send_answers: usize,
    revoked: bool,
}

struct Shared {
    token: String,
    state: Mutex<Book>,
    version: watch::Sender<u64>,
    hang: watch::Sender<bool>,
    stop: watch::Sender<bool>,
}

impl Shared {
    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }
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
        match Self::try_start(token) {
            Ok(f) => f,
            Err(e) => panic!("cannot start the fake Matrix server on 127.0.0.1: {e}"),
        }
    }

    /// Like [`Self::start`], returning the error instead of panicking.
    pub fn try_start(token: &str) -> std::io::Result<FakeMatrix> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            state: Mutex::new(Book {
                next_event: 1,
                ..Book::default()
            }),
            version: watch::channel(0).0,
            hang: watch::channel(false).0,
            stop: watch::channel(false).0,
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        crate::serve_on_own_thread("fake-matrix", listener, app, shared.stop.subscribe())?;
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
        let mut st = lock(&self.shared.state);
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
        self.shared.bump();
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
        lock(&self.shared.state).direct = Some(by_user);
        self.shared.bump();
    }

    /// An invite for the bot into a new room that has `inviter` in it.
    pub fn invite(&self, room_id: &str, inviter: &str, is_direct: bool) {
        self.invite_into(room_id, inviter, &[], is_direct);
    }

    /// An invite for the bot from `inviter` into a room with `inviter` and
    /// `others` in it, new or existing (made with [`Self::room_without_bot`]).
    pub fn invite_into(&self, room_id: &str, inviter: &str, others: &[&str], is_direct: bool) {
        {
            let mut st = lock(&self.shared.state);
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
        self.shared.bump();
    }

    /// A room the bot is not in (yet), with `members`: its messages reach
    /// the bot only once it joined, as history.
    pub fn room_without_bot(&self, room_id: &str, name: Option<&str>, members: &[&str]) {
        lock(&self.shared.state).rooms.insert(
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
        self.shared.bump();
    }

    /// `user` joins `room_id`: a membership event in its timeline.
    pub fn add_member(&self, room_id: &str, user: &str) {
        {
            let mut st = lock(&self.shared.state);
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
        self.shared.bump();
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
        let id = {
            let mut st = lock(&self.shared.state);
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
        };
        self.shared.bump();
        id
    }

    /// Every message the bot sent, in order (each transaction once).
    pub fn sent(&self) -> Vec<Sent> {
        lock(&self.shared.state).sent.clone()
    }

    /// Every `/sync` call so far.
    pub fn sync_calls(&self) -> Vec<SyncCall> {
        lock(&self.shared.state).syncs.clone()
    }

    /// Every request so far, including failed and hung ones.
    pub fn requests(&self) -> Vec<Request> {
        lock(&self.shared.state).requests.clone()
    }

    /// The send requests so far, answered or not.
    pub fn send_attempts(&self) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(|r| is_send_path(&r.path))
            .collect()
    }

    /// Every typing notice so far.
    pub fn typing(&self) -> Vec<Typing> {
        lock(&self.shared.state).typing.clone()
    }

    /// The rooms the bot joined on invite, in order.
    pub fn joins(&self) -> Vec<String> {
        lock(&self.shared.state).joins.clone()
    }

    /// The `next_batch` a sync would return now.
    pub fn current_token(&self) -> String {
        token_at(lock(&self.shared.state).log.len())
    }

    /// Waits until at least `n` messages were sent and returns them all.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_sent(&self, n: usize, timeout: Duration) -> Vec<Sent> {
        self.wait_until(timeout, |st| st.sent.len() >= n).await;
        let sent = self.sent();
        assert!(
            sent.len() >= n,
            "waited {timeout:?} for {n} sent messages, got {}: {sent:#?}",
            sent.len()
        );
        sent
    }

    /// Waits until at least `n` send requests arrived (answered or not).
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_send_attempts(&self, n: usize, timeout: Duration) -> Vec<Request> {
        self.wait_until(timeout, |st| {
            st.requests.iter().filter(|r| is_send_path(&r.path)).count() >= n
        })
        .await;
        let got = self.send_attempts();
        assert!(
            got.len() >= n,
            "waited {timeout:?} for {n} send requests, got {}",
            got.len()
        );
        got
    }

    /// Waits until at least `n` `/sync` calls arrived and returns them.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_sync_calls(&self, n: usize, timeout: Duration) -> Vec<SyncCall> {
        self.wait_until(timeout, |st| st.syncs.len() >= n).await;
        let got = self.sync_calls();
        assert!(
            got.len() >= n,
            "waited {timeout:?} for {n} sync calls, got {}: {got:#?}",
            got.len()
        );
        got
    }

    /// Waits until a `/sync` arrives whose `since` is the current end of
    /// the log: the bot has taken everything pushed so far.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_until_caught_up(&self, timeout: Duration) {
        let token = self.current_token();
        self.wait_until(timeout, |st| {
            st.syncs.iter().any(|s| s.since.as_deref() == Some(&token))
        })
        .await;
        assert!(
            self.sync_calls()
                .iter()
                .any(|s| s.since.as_deref() == Some(&token)),
            "waited {timeout:?} for a sync from {token}: {:#?}",
            self.sync_calls()
        );
    }

    /// Waits until at least `n` typing notices arrived.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_typing(&self, n: usize, timeout: Duration) -> Vec<Typing> {
        self.wait_until(timeout, |st| st.typing.len() >= n).await;
        let got = self.typing();
        assert!(got.len() >= n, "waited {timeout:?} for {n} typing notices");
        got
    }

    /// Waits until the bot joined at least `n` rooms on invite.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_joins(&self, n: usize, timeout: Duration) -> Vec<String> {
        self.wait_until(timeout, |st| st.joins.len() >= n).await;
        let got = self.joins();
        assert!(got.len() >= n, "waited {timeout:?} for {n} joins: {got:?}");
        got
    }

    async fn wait_until(&self, timeout: Duration, done: impl Fn(&Book) -> bool) {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.shared.version.subscribe();
        loop {
            rx.borrow_and_update();
            if done(&lock(&self.shared.state)) {
                return;
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// The next send gets 429 `M_LIMIT_EXCEEDED` with `retry_after_ms`
    /// (and a `Retry-After` header). Calls queue up.
    pub fn fail_next_send_with_429(&self, retry_after_ms: u64) {
        lock(&self.shared.state).fail_429.push_back(retry_after_ms);
    }

    /// While set, sends are recorded as attempts but hang unanswered and
    /// are never delivered; clearing it (or stopping the server) answers
    /// them with a 502.
    pub fn hang_send(&self, hang: bool) {
        self.shared.hang.send_replace(hang);
    }

    /// The next `n` `/sync` calls get a 502 from "a proxy" (no Matrix body).
    pub fn fail_next_syncs(&self, n: usize) {
        lock(&self.shared.state).fail_syncs = n;
    }

    /// The next `n` `joined_members` requests get a 502 from "a proxy".
    pub fn fail_next_joined_members(&self, n: usize) {
        lock(&self.shared.state).fail_joined_members = n;
    }

    /// The next `/sync` that has something to return is cut off mid-body:
    /// the connection drops after part of the answer went out.
    pub fn drop_next_sync(&self) {
        lock(&self.shared.state).drop_syncs += 1;
    }

    /// The next send that is accepted (recorded, its event in the log)
    /// loses its answer: the connection drops before the client learns the
    /// event id, as when a response is lost on the way back.
    pub fn drop_next_send_answer(&self) {
        lock(&self.shared.state).drop_send_answers += 1;
    }

    /// From now on the token is refused with `M_UNKNOWN_TOKEN`.
    pub fn revoke_token(&self) {
        lock(&self.shared.state).revoked = true;
        self.shared.bump();
    }

    /// Stops the server (also on drop). Open connections are cut.
    pub fn shutdown(&self) {
        self.shared.stop.send_replace(true);
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

fn token_at(position: usize) -> String {
    format!("s{position}")
}

fn is_send_path(path: &str) -> bool {
    path.starts_with("rooms/") && path.contains("/send/")
}

fn error(status: u16, errcode: &str, message: &str) -> Response {
    json_response(status, &json!({ "errcode": errcode, "error": message }))
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(rest) = uri.path().strip_prefix("/_matrix/client/v3/") else {
        return error(404, "M_UNRECOGNIZED", "Unrecognized request");
    };
    let segments: Vec<String> = rest.split('/').map(|s| percent_decode(s, false)).collect();
    let path = segments.join("/");
    let query = query_pairs(uri.query());
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned)
        .or_else(|| query.get("access_token").cloned());
    let json_body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let hung = *shared.hang.borrow();
    let revoked = {
        let mut st = lock(&shared.state);
        st.requests.push(Request {
            method: method.to_string(),
            path: path.clone(),
            body: json_body.clone(),
            at: Instant::now(),
            authorized: given.as_deref() == Some(shared.token.as_str()),
        });
        st.revoked
    };
    shared.bump();
    match given {
        None => return error(401, "M_MISSING_TOKEN", "Missing access token"),
        Some(t) if t != shared.token || revoked => {
            return error(401, "M_UNKNOWN_TOKEN", "Unrecognised access token");
        }
        Some(_) => {}
    }
    let parts: Vec<&str> = segments.iter().map(String::as_str).collect();
    match (&method, parts.as_slice()) {
        (&Method::GET, ["account", "whoami"]) => json_response(
            200,
            &json!({ "user_id": BOT_USER_ID, "device_id": "FAKEDEVICE" }),
        ),
        (&Method::GET, ["profile", user, "displayname"]) => {
            if *user == BOT_USER_ID {
                json_response(200, &json!({ "displayname": BOT_DISPLAY_NAME }))
            } else {
                error(404, "M_NOT_FOUND", "Profile was not found")
            }
        }
        (&Method::GET, ["sync"]) => sync(&shared, &query).await,
        (&Method::GET, ["rooms", room, "joined_members"]) => {
            let mut st = lock(&shared.state);
            if st.fail_joined_members > 0 {
                st.fail_joined_members -= 1;
                let mut r = Response::new(Body::from("<html><body>502 Bad Gateway</body></html>"));
                *r.status_mut() = StatusCode::BAD_GATEWAY;
                return r;
            }
            match st.rooms.get(*room) {
                Some(r) if r.bot_joined => {
                    let joined: Map<String, Value> = r
                        .members
                        .iter()
                        .map(|m| {
                            (
                                m.clone(),
                                json!({ "display_name": null, "avatar_url": null }),
                            )
                        })
                        .collect();
                    json_response(200, &json!({ "joined": joined }))
                }
                _ => error(
                    403,
                    "M_FORBIDDEN",
                    "User not in room and not an admin of the room",
                ),
            }
        }
        (&Method::GET, ["user", user, "account_data", kind]) => {
            if *user != BOT_USER_ID {
                return error(
                    403,
                    "M_FORBIDDEN",
                    "Cannot get account data for other users.",
                );
            }
            match (&lock(&shared.state).direct, *kind) {
                (Some(d), "m.direct") => json_response(200, d),
                _ => error(404, "M_NOT_FOUND", "Account data not found"),
            }
        }
        (&Method::POST, ["join", room]) | (&Method::POST, ["rooms", room, "join"]) => {
            join(&shared, room)
        }
        (&Method::PUT, ["rooms", room, "send", kind, txn]) => {
            send(&shared, room, kind, txn, &body, json_body, hung).await
        }
        (&Method::PUT, ["rooms", room, "typing", user]) => {
            if *user != BOT_USER_ID {
                return error(403, "M_FORBIDDEN", "Cannot set another user's typing state");
            }
            lock(&shared.state).typing.push(Typing {
                room_id: (*room).to_owned(),
                user_id: (*user).to_owned(),
                typing: json_body.get("typing").and_then(Value::as_bool) == Some(true),
                timeout_ms: json_body.get("timeout").and_then(Value::as_u64),
                at: Instant::now(),
            });
            shared.bump();
            json_response(200, &json!({}))
        }
        _ => error(404, "M_UNRECOGNIZED", "Unrecognized request"),
    }
}

fn join(shared: &Shared, room_id: &str) -> Response {
    let response = {
        let mut st = lock(&shared.state);
        let Some(room) = st.rooms.get_mut(room_id) else {
            return error(404, "M_NOT_FOUND", "No known servers");
        };
        let mut fresh = false;
        if !room.bot_joined {
            if room.invite.take().is_none() {
                return error(403, "M_FORBIDDEN", "You are not invited to this room.");
            }
            room.bot_joined = true;
            room.members.push(BOT_USER_ID.to_owned());
            fresh = true;
        }
        st.joins.push(room_id.to_owned());
        if fresh {
            // The homeserver's join event, seen by the bot's next sync.
            let position = st.log.len();
            if let Some(room) = st.rooms.get_mut(room_id) {
                room.joined_at = Some(position);
            }
            let mut event = member_event(room_id, BOT_USER_ID, "join");
            event["unsigned"] = json!({ "prev_content": { "membership": "invite" } });
            st.log.push(Entry::Timeline {
                room_id: room_id.to_owned(),
                event,
            });
        }
        json_response(200, &json!({ "room_id": room_id }))
    };
    shared.bump();
    response
}

async fn send(
    shared: &Shared,
    room_id: &str,
    kind: &str,
    txn: &str,
    raw: &Bytes,
    content: Value,
    hung: bool,
) -> Response {
    if hung {
        let mut hang = shared.hang.subscribe();
        let mut stop = shared.stop.subscribe();
        tokio::select! {
            _ = hang.wait_for(|h| !*h) => {}
            _ = stop.wait_for(|s| *s) => {}
        }
        // Lost on the way, never delivered: a crash test kills the client
        // meanwhile, and a late delivery would look like the dead one's.
        return error(502, "", "Bad Gateway: the request was lost");
    }
    let response = {
        let mut st = lock(&shared.state);
        if let Some(ms) = st.fail_429.pop_front() {
            let mut r = json_response(
                429,
                &json!({ "errcode": "M_LIMIT_EXCEEDED", "error": "Too many requests", "retry_after_ms": ms }),
            );
            if let Ok(v) = HeaderValue::from_str(&ms.div_ceil(1000).to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
            return r;
        }
        if let Some(event_id) = st.txns.get(txn) {
            // The spec: a repeated transaction id answers the first event.
            return json_response(200, &json!({ "event_id": event_id }));
        }
        if !content.is_object() {
            return error(400, "M_NOT_JSON", "Content not JSON.");
        }
        if raw.len() > MAX_EVENT_BYTES {
            return error(413, "M_TOO_LARGE", "event too large");
        }
        match st.rooms.get(room_id) {
            Some(room) if room.bot_joined => {}
            _ => {
                return error(
                    403,
                    "M_FORBIDDEN",
                    "User is not in the room or the room does not exist",
                );
            }
        }
        let event_id = format!("$ev{}", st.next_event);
        st.next_event += 1;
        st.txns.insert(txn.to_owned(), event_id.clone());
        st.sent.push(Sent {
            room_id: room_id.to_owned(),
            txn_id: txn.to_owned(),
            content: content.clone(),
            event_id: event_id.clone(),
            at: Instant::now(),
        });
        // The homeserver echoes the bot's own events in its sync stream.
        st.log.push(Entry::Timeline {
            room_id: room_id.to_owned(),
            event: json!({
                "type": kind, "sender": BOT_USER_ID, "event_id": event_id,
                "origin_server_ts": now_ms(), "content": content,
                "unsigned": { "transaction_id": txn },
            }),
        });
        if st.drop_send_answers > 0 {
            st.drop_send_answers -= 1;
            broken_body()
        } else {
            json_response(200, &json!({ "event_id": event_id }))
        }
    };
    shared.bump();
    response
}

/// A 200 whose body breaks off: the client sees the connection drop.
fn broken_body() -> Response {
    let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
        Ok(Bytes::from_static(b"{\"event_id\":\"$")),
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "dropped by the fake",
        )),
    ];
    let mut r = Response::new(Body::from_stream(futures::stream::iter(chunks)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

async fn sync(shared: &Shared, query: &HashMap<String, String>) -> Response {
    let since = query.get("since").cloned();
    let timeout_ms = query.get("timeout").and_then(|t| t.parse::<u64>().ok());
    let start = match since.as_deref() {
        None => 0,
        Some(s) => match s.strip_prefix('s').and_then(|n| n.parse::<usize>().ok()) {
            Some(n) => n,
            None => return error(400, "M_INVALID_PARAM", "Invalid since token"),
        },
    };
    {
        let mut st = lock(&shared.state);
        st.syncs.push(SyncCall {
            since: since.clone(),
            timeout_ms,
            filter: query.get("filter").cloned(),
            at: Instant::now(),
        });
        if st.fail_syncs > 0 {
            st.fail_syncs -= 1;
            drop(st);
            shared.bump();
            let mut r = Response::new(Body::from("<html><body>502 Bad Gateway</body></html>"));
            *r.status_mut() = StatusCode::BAD_GATEWAY;
            return r;
        }
    }
    shared.bump();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms.unwrap_or(0));
    let mut changes = shared.version.subscribe();
    let mut stop = shared.stop.subscribe();
    loop {
        changes.borrow_and_update();
        let ready = {
            let st = lock(&shared.state);
            since.is_none() || st.log.len() > start
        };
        if ready || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = changes.changed() => {}
            _ = stop.wait_for(|s| *s) => return error(502, "", "shutting down"),
        }
    }
    let answer = {
        let mut st = lock(&shared.state);
        let has_news = st.log.len() > start;
        if st.drop_syncs > 0 && has_news {
            st.drop_syncs -= 1;
            None
        } else {
            Some(sync_body(&st, start, since.is_none()))
        }
    };
    match answer {
        Some(v) => json_response(200, &v),
        // Headers and part of a body, then the connection breaks.
        None => broken_body(),
    }
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

fn sync_body(st: &Book, start: usize, initial: bool) -> Value {
    let start = start.min(st.log.len());
    let mut join: Map<String, Value> = Map::new();
    let mut invite: Map<String, Value> = Map::new();
    let mut timelines: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    if initial {
        for (id, room) in &st.rooms {
            if room.bot_joined {
                timelines.entry(id.as_str()).or_default();
            }
        }
    }
    // A room the bot joined on invite since `start` comes with its recent
    // history, from before `start` too, as Synapse hands a fresh join.
    let fresh_join = |room: &Room| {
        !initial && room.invited_at.is_some() && room.joined_at.is_some_and(|j| j >= start)
    };
    let first = if st.rooms.values().any(|r| r.bot_joined && fresh_join(r)) {
        0
    } else {
        start
    };
    for (position, entry) in st.log.iter().enumerate().skip(first) {
        match entry {
            Entry::Timeline { room_id, event } => {
                if let Some(room) = st
                    .rooms
                    .get(room_id)
                    .filter(|r| r.bot_joined && (position >= start || fresh_join(r)))
                {
                    // Synapse's `unsigned.membership`: the reader's
                    // membership when the event was written.
                    let membership = if room.joined_at.is_some_and(|j| position >= j) {
                        "join"
                    } else if room.invited_at.is_some_and(|i| position >= i) {
                        "invite"
                    } else {
                        "leave"
                    };
                    let mut event = event.clone();
                    // A test's malformed event is passed on as it is.
                    if let Some(obj) = event.as_object_mut() {
                        let unsigned = obj.entry("unsigned").or_insert_with(|| json!({}));
                        if let Some(unsigned) = unsigned.as_object_mut() {
                            unsigned.insert("membership".into(), json!(membership));
                        }
                    }
                    timelines.entry(room_id.as_str()).or_default().push(event);
                }
            }
            Entry::Invite { room_id } if position >= start => {
                if let Some(room) = st.rooms.get(room_id)
                    && let Some((inviter, is_direct)) = &room.invite
                {
                    let mut own = member_event(room_id, BOT_USER_ID, "invite");
                    own["sender"] = json!(inviter);
                    own["content"]["is_direct"] = json!(is_direct);
                    invite.insert(
                        room_id.clone(),
                        json!({ "invite_state": { "events": [
                            { "type": "m.room.create", "state_key": "", "sender": inviter, "content": {} },
                            own,
                        ] } }),
                    );
                }
            }
            Entry::Invite { .. } => {}
        }
    }
    for (room_id, events) in timelines {
        let Some(room) = st.rooms.get(room_id) else {
            continue;
        };
        // Synapse sends a room's state with the first sync and when the
        // bot newly joined it (or it appeared: `create_room` after the
        // start); an ordinary incremental sync has only the timeline.
        let fresh = room.joined_at.is_some_and(|j| j >= start) && !initial;
        let mut state: Vec<Value> = Vec::new();
        if initial || fresh {
            state.extend(
                room.members
                    .iter()
                    .map(|m| member_event(room_id, m, "join")),
            );
            if let Some(n) = &room.name {
                state.push(json!({
                    "type": "m.room.name", "state_key": "", "sender": BOT_USER_ID,
                    "event_id": format!("$name-{room_id}"), "origin_server_ts": 0,
                    "content": { "name": n },
                }));
            }
        }
        // A fresh join's timeline is always marked limited by Synapse.
        let joined_in_range = room.invited_at.is_some() && fresh;
        join.insert(
            room_id.to_owned(),
            json!({
                // Without lazy-loaded members Synapse sends an empty one.
                "summary": {},
                "state": { "events": state },
                "timeline": { "events": events, "limited": joined_in_range, "prev_batch": token_at(start) },
                "ephemeral": { "events": [] },
                "account_data": { "events": [] },
            }),
        );
    }
    let mut body = json!({
        "next_batch": token_at(st.log.len()),
        "rooms": { "join": join, "invite": invite, "leave": {} },
    });
    if let Some(d) = &st.direct {
        body["account_data"] = json!({ "events": [ { "type": "m.direct", "content": d } ] });
    }
    body
}

fn query_pairs(q: Option<&str>) -> HashMap<String, String> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k, true), percent_decode(v, true))
        })
        .collect()
}

fn percent_decode(s: &str, plus_is_space: bool) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' if plus_is_space => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
