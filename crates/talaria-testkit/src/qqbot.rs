//! A fake QQ open platform on 127.0.0.1: the token endpoint, the OpenAPI
//! (v2 messages) and the gateway WebSocket, built from QQ's API v2
//! documentation and the fact sheet's checklist.
//!
//! - `POST /app/getAppAccessToken` `{appId, clientSecret}` answers
//!   `{access_token, expires_in}`, `expires_in` as a string by default
//!   (QQ has sent both). Tokens can be revoked ([`FakeQq::revoke_tokens`]).
//! - `GET /gateway` (with `Authorization: QQBot <token>`) answers the
//!   WebSocket URL `ws://.../websocket`.
//! - The WebSocket: op 10 Hello; op 2 Identify (a wrong token is closed
//!   with 4004, an intent the bot may not have with 4014, a wrong shard
//!   with 4010) answered by READY; op 6 Resume replaying every dispatch of
//!   the session after the client's `seq`, then RESUMED (op 9 for a
//!   session the fake does not know); op 1 answered by op 11. A dispatch
//!   goes only to a session whose intents include its event's.
//! - Messages: `POST /v2/users/{openid}/messages`,
//!   `/v2/groups/{group_openid}/messages`, `/channels/{id}/messages`,
//!   `/dms/{guild_id}/messages`. A `msg_id` must name a message the fake
//!   delivered in that same chat, within QQ's passive window (60 minutes
//!   in C2C, 5 elsewhere) and cap (4 replies in C2C, 5 elsewhere; input
//!   notices not counted); a repeated `(msg_id, msg_seq)` is refused with
//!   code 40054005. Without `msg_id` a message is proactive and counted
//!   against a monthly quota per chat. `msg_type` 6 in C2C is an input
//!   notice (typing), recorded apart. Errors are `{code, message}` with a
//!   4xx status; a rate limit is HTTP 429, code 22009 and `Retry-After`.
//!
//! - Files [doc]: `POST /v2/{users|groups}/{id}/files` `{file_type,
//!   file_data (base64) | url, srv_send_msg, file_name}` answers
//!   `{file_uuid, file_info, ttl}`. The fake takes `file_data` only (it
//!   fetches no URLs) and `srv_send_msg: false` only, and checks the
//!   bytes are what `file_type` says (1 PNG/JPEG, 2 MP4, 3 SILK, 4
//!   anything). A `msg_type` 7 message must carry `media.file_info` the
//!   fake gave for that same chat; it is recorded as [`MediaSent`].
//! - Files users send are served at `GET /media/<name>` to requests
//!   carrying the bot's `QQBot` token.
//!
//! Codes the fake gives that QQ's public docs do not pin down (the passive
//! window, cap and quota refusals) are named as constants here.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequest, State};
use axum::http::{HeaderValue, Method, header};
use axum::response::Response;
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::fake::{Core, Faults, bind, started};

/// The bot's user id in READY (guild mentions name it).
pub const BOT_ID: &str = "11586990140073229091";

/// The bot's name, as a group @-mention shows it at the start of content.
pub const BOT_NAME: &str = "Talaria";

/// `GROUP_AND_C2C_EVENT`.
pub const GROUP_AND_C2C: u64 = 1 << 25;
/// `PUBLIC_GUILD_MESSAGES`.
pub const PUBLIC_GUILD_MESSAGES: u64 = 1 << 30;
/// `DIRECT_MESSAGE`.
pub const DIRECT_MESSAGE: u64 = 1 << 12;
/// `GUILD_MESSAGES` (private-domain bots).
pub const GUILD_MESSAGES: u64 = 1 << 9;
/// `INTERACTION`.
pub const INTERACTION: u64 = 1 << 26;

/// A repeated `(msg_id, msg_seq)` [doc].
pub const CODE_DUPLICATE_SEQ: i64 = 40054005;
/// The fake's code for a `msg_id` it never delivered in that chat.
pub const CODE_BAD_MSG_ID: i64 = 40034006;
/// The fake's code for a passive reply past its window.
pub const CODE_REPLY_EXPIRED: i64 = 40034024;
/// The fake's code for a message replied to too often.
pub const CODE_REPLY_CAP: i64 = 40034025;
/// The fake's code for a proactive message over the quota.
pub const CODE_PROACTIVE_QUOTA: i64 = 40034040;
/// The rate-limit business code the fake answers with HTTP 429.
pub const CODE_RATE_LIMITED: i64 = 22009;
/// A refused access token.
pub const CODE_BAD_TOKEN: i64 = 11244;

/// One message the fake accepted (input notices are [`Typing`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// `users`, `groups`, `channels` or `dms`.
    pub scope: String,
    /// The openid, group openid, channel id or guild id posted to.
    pub target: String,
    /// The text: `content`, or `markdown.content` for `msg_type` 2.
    pub text: String,
    /// Whether it went as Markdown (`msg_type` 2).
    pub markdown: bool,
    /// The `msg_id` it replies to (passive), or `None` (proactive).
    pub msg_id: Option<String>,
    /// Its `msg_seq`.
    pub msg_seq: Option<u64>,
    /// The id the fake assigned.
    pub id: String,
    /// When the fake accepted it.
    pub at: Instant,
}

/// One media message (`msg_type` 7) accepted, with its file.
#[derive(Debug, Clone, PartialEq)]
pub struct MediaSent {
    /// `users` or `groups`.
    pub scope: String,
    /// The openid or group openid.
    pub target: String,
    /// The upload's `file_type`: 1 image, 2 video, 3 voice, 4 file.
    pub file_type: u64,
    /// The upload's `file_name`.
    pub name: Option<String>,
    /// The file's bytes.
    pub bytes: Vec<u8>,
    /// The message's `content` (a caption), when it had one.
    pub content: Option<String>,
    /// The `msg_id` it replies to, or `None` (proactive).
    pub msg_id: Option<String>,
    /// Its `msg_seq`.
    pub msg_seq: Option<u64>,
    /// When the fake accepted it.
    pub at: Instant,
}

struct FileUpload {
    chat: String,
    file_type: u64,
    name: Option<String>,
    bytes: Vec<u8>,
}

/// One input notice (`msg_type` 6) accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct Typing {
    /// The user's openid.
    pub openid: String,
    /// The message it is about.
    pub msg_id: String,
    /// When the fake accepted it.
    pub at: Instant,
}

/// Any OpenAPI request, recorded when it arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The HTTP method.
    pub method: String,
    /// The path.
    pub path: String,
    /// The JSON body (`null` when none or unreadable).
    pub body: Value,
    /// `Authorization` was `QQBot <a valid token>`.
    pub authorized: bool,
    /// When the fake received it.
    pub at: Instant,
}

/// A gateway payload the client sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// The opcode.
    pub op: u64,
    /// The payload's `d`.
    pub d: Value,
    /// Which connection (1, 2, ...) it came on.
    pub connection: u64,
}

enum Control {
    Send(Value),
    /// Close with this code, or (`None`) drop without a close frame.
    Close(Option<u16>),
}

struct Attached {
    id: u64,
    tx: mpsc::UnboundedSender<Control>,
    session: Option<String>,
}

#[derive(Default)]
struct SessionLog {
    events: Vec<Value>,
    next_seq: u64,
    intents: u64,
}

/// A user message the fake delivered, which replies may name.
struct Delivered {
    /// `users/<openid>`, `groups/<id>`, `channels/<id>`, `dms/<guild>`.
    chat: String,
    at: Instant,
    seqs: HashSet<u64>,
    replies: u32,
}

struct Book {
    heartbeat_interval_ms: u64,
    expires_in_as_string: bool,
    tokens: Vec<String>,
    token_fetches: usize,
    next_token: u64,
    next_id: u64,
    next_session: u64,
    next_connection: u64,
    sessions: HashMap<String, SessionLog>,
    current: Option<String>,
    attached: Option<Attached>,
    backlog: Vec<(String, Value)>,
    permitted_intents: u64,
    delivered: HashMap<String, Delivered>,
    /// Overrides QQ's passive windows (for tests of expiry).
    passive_window: Option<Duration>,
    proactive: HashMap<String, u32>,
    proactive_quota: u32,
    sent: Vec<Sent>,
    typing: Vec<Typing>,
    frames: Vec<Frame>,
    readies: usize,
    resumed: usize,
    identified_intents: Vec<u64>,
    fail_429: Faults<f64>,
    fail_status: Faults<(u16, i64)>,
    /// Files users sent, by the name they are served under.
    served: HashMap<String, Vec<u8>>,
    /// Uploads by the `file_info` answered.
    files: HashMap<String, FileUpload>,
    next_file: u64,
    media_sent: Vec<MediaSent>,
}

struct Shared {
    app_id: String,
    secret: String,
    addr: SocketAddr,
    core: Core<Book, Request>,
}

/// A fake QQ open platform (see the module docs).
pub struct FakeQq {
    shared: Arc<Shared>,
}

impl FakeQq {
    /// Starts the fake for the bot `app_id` / `secret`, with Hello's
    /// heartbeat interval `heartbeat`.
    ///
    /// # Panics
    /// When no local port can be bound.
    pub async fn start(app_id: &str, secret: &str, heartbeat: Duration) -> FakeQq {
        started(
            "the fake QQ server",
            Self::try_start(app_id, secret, heartbeat),
        )
    }

    /// Like [`Self::start`], returning the error instead.
    pub fn try_start(app_id: &str, secret: &str, heartbeat: Duration) -> std::io::Result<FakeQq> {
        let (listener, addr) = bind()?;
        let shared = Arc::new(Shared {
            app_id: app_id.to_owned(),
            secret: secret.to_owned(),
            addr,
            core: Core::new(Book {
                heartbeat_interval_ms: u64::try_from(heartbeat.as_millis())
                    .unwrap_or(41_250)
                    .max(1),
                expires_in_as_string: true,
                tokens: Vec::new(),
                token_fetches: 0,
                next_token: 0,
                next_id: 0,
                next_session: 0,
                next_connection: 0,
                sessions: HashMap::new(),
                current: None,
                attached: None,
                backlog: Vec::new(),
                permitted_intents: GROUP_AND_C2C
                    | PUBLIC_GUILD_MESSAGES
                    | DIRECT_MESSAGE
                    | GUILD_MESSAGES
                    | INTERACTION,
                delivered: HashMap::new(),
                passive_window: None,
                proactive: HashMap::new(),
                proactive_quota: 4,
                sent: Vec::new(),
                typing: Vec::new(),
                frames: Vec::new(),
                readies: 0,
                resumed: 0,
                identified_intents: Vec::new(),
                fail_429: Faults::default(),
                fail_status: Faults::default(),
                served: HashMap::new(),
                files: HashMap::new(),
                next_file: 0,
                media_sent: Vec::new(),
            }),
        });
        let app = Router::new()
            .route("/app/getAppAccessToken", post(token))
            .route("/websocket", get(upgrade))
            .fallback(rest)
            .with_state(shared.clone());
        shared.core.serve("fake-qq", listener, app)?;
        Ok(FakeQq { shared })
    }

    /// `http://127.0.0.1:PORT`: the adapter's `api_base`.
    pub fn api_base(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// The adapter's `token_url`.
    pub fn token_url(&self) -> String {
        format!("http://{}/app/getAppAccessToken", self.shared.addr)
    }

    /// Whether `expires_in` is sent as a string (default) or a number.
    pub fn expires_in_as_string(&self, string: bool) {
        self.shared.core.change().expires_in_as_string = string;
    }

    /// Every token issued so far stops working.
    pub fn revoke_tokens(&self) {
        self.shared.core.change().tokens.clear();
    }

    /// How many tokens were fetched.
    pub fn token_fetches(&self) -> usize {
        self.shared.core.read().token_fetches
    }

    /// Intents the bot may use; identifying with another closes with 4014.
    pub fn permit_intents(&self, intents: u64) {
        self.shared.core.change().permitted_intents = intents;
    }

    /// The intents of every Identify, in order.
    pub fn identified_intents(&self) -> Vec<u64> {
        self.shared.core.read().identified_intents.clone()
    }

    /// Passive replies are allowed this long after the message (instead
    /// of QQ's 60 / 5 minutes).
    pub fn set_passive_window(&self, window: Duration) {
        self.shared.core.change().passive_window = Some(window);
    }

    /// Proactive messages allowed per chat (default 4).
    pub fn set_proactive_quota(&self, n: u32) {
        self.shared.core.change().proactive_quota = n;
    }

    fn next_id(&self) -> String {
        let mut st = self.shared.core.change();
        st.next_id += 1;
        format!("ROBOT1.0_fake{:08}", st.next_id)
    }

    /// A C2C message from the user `openid`; returns its id.
    pub fn push_c2c(&self, openid: &str, text: &str) -> String {
        let id = self.next_id();
        self.push_message(
            "C2C_MESSAGE_CREATE",
            json!({"id": id, "content": text, "author": {"user_openid": openid}}),
        );
        id
    }

    /// Serves `bytes` at `GET /media/<name>` (to the bot's token only);
    /// returns the full URL.
    pub fn serve_media(&self, name: &str, bytes: Vec<u8>) -> String {
        self.shared
            .core
            .change()
            .served
            .insert(name.to_owned(), bytes);
        format!("http://{}/media/{name}", self.shared.addr)
    }

    /// A C2C message from `openid` with `attachments` (their `url`s as
    /// given, e.g. from [`FakeQq::serve_media`]); returns its id.
    pub fn push_c2c_with(&self, openid: &str, text: &str, attachments: Value) -> String {
        let id = self.next_id();
        self.push_message(
            "C2C_MESSAGE_CREATE",
            json!({"id": id, "content": text, "author": {"user_openid": openid},
                "attachments": attachments}),
        );
        id
    }

    /// Every media message accepted.
    pub fn media_sent(&self) -> Vec<MediaSent> {
        self.shared.core.read().media_sent.clone()
    }

    /// Waits until at least `n` media messages were accepted.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_media(&self, n: usize, timeout: Duration) -> Vec<MediaSent> {
        self.shared
            .core
            .wait_len("media messages", n, timeout, |st| &st.media_sent)
            .await
    }

    /// A group message from `member` that @-mentions the bot (the only
    /// kind QQ delivers from groups): `content` starts with the mention
    /// text, as QQ keeps it. Returns its id.
    pub fn push_group_at(&self, group: &str, member: &str, text: &str) -> String {
        let id = self.next_id();
        self.push_message(
            "GROUP_AT_MESSAGE_CREATE",
            json!({"id": id, "content": format!("@{BOT_NAME} {text}"), "group_openid": group,
                "author": {"member_openid": member}}),
        );
        id
    }

    /// A message in a guild channel from `author`: with `mention`, it
    /// starts with `<@!bot>` and goes out as `AT_MESSAGE_CREATE` (to
    /// bots with `PUBLIC_GUILD_MESSAGES`) and as `GUILD_MESSAGE_CREATE`
    /// (to bots with `GUILD_MESSAGES`); without, only as the latter.
    /// Returns its id.
    pub fn push_guild(
        &self,
        guild: &str,
        channel: &str,
        author: &str,
        text: &str,
        mention: bool,
    ) -> String {
        let id = self.next_id();
        let mut d = json!({"id": id, "channel_id": channel, "guild_id": guild,
            "author": {"id": author, "username": format!("user{author}"), "bot": false},
            "member": {"nick": format!("User {author}")}, "content": text});
        if mention {
            d["content"] = json!(format!("<@!{BOT_ID}> {text}"));
            d["mentions"] = json!([{"id": BOT_ID, "username": BOT_NAME, "bot": true}]);
            self.push_message("AT_MESSAGE_CREATE", d.clone());
        }
        self.push_message("GUILD_MESSAGE_CREATE", d);
        id
    }

    /// A guild direct message from `author` in the DM session of
    /// `guild`; returns its id.
    pub fn push_direct(&self, guild: &str, author: &str, text: &str) -> String {
        let id = self.next_id();
        self.push_message(
            "DIRECT_MESSAGE_CREATE",
            json!({"id": id, "channel_id": "1", "guild_id": guild, "src_guild_id": "7",
                "author": {"id": author, "username": format!("user{author}")}, "content": text}),
        );
        id
    }

    /// Pushes a message dispatch `kind` with `d` (which has its `id`),
    /// remembering the message as one replies may name.
    pub fn push_message(&self, kind: &str, d: Value) {
        let chat = match kind {
            "C2C_MESSAGE_CREATE" => format!(
                "users/{}",
                d["author"]["user_openid"].as_str().unwrap_or("")
            ),
            "GROUP_AT_MESSAGE_CREATE" => {
                format!("groups/{}", d["group_openid"].as_str().unwrap_or(""))
            }
            "DIRECT_MESSAGE_CREATE" => format!("dms/{}", d["guild_id"].as_str().unwrap_or("")),
            _ => format!("channels/{}", d["channel_id"].as_str().unwrap_or("")),
        };
        let mut d = d;
        if let Some(o) = d.as_object_mut() {
            o.entry("timestamp")
                .or_insert(json!("2026-12-06T19:00:00+08:00"));
        }
        if let Some(id) = d["id"].as_str() {
            let mut st = self.shared.core.change();
            st.delivered.entry(id.to_owned()).or_insert(Delivered {
                chat,
                at: Instant::now(),
                seqs: HashSet::new(),
                replies: 0,
            });
        }
        self.push_dispatch(kind, d);
    }

    /// Pushes any dispatch to the current session (sent at once when a
    /// connection is attached, else kept for a resume); before any
    /// session it waits for the first READY.
    pub fn push_dispatch(&self, kind: &str, d: Value) {
        let mut st = self.shared.core.change();
        match st.current.clone() {
            Some(session) => {
                if let Some(payload) = log_dispatch(&mut st, &session, kind, d)
                    && let Some(a) = &st.attached
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

    /// Cuts the connection without a close frame; whether one was open.
    pub fn drop_connection(&self) -> bool {
        self.control(Control::Close(None))
    }

    /// Closes the connection with `code`.
    pub fn close_connection(&self, code: u16) -> bool {
        self.control(Control::Close(Some(code)))
    }

    /// Sends op 7 Reconnect.
    pub fn send_reconnect(&self) -> bool {
        self.control(Control::Send(json!({"op": 7})))
    }

    /// Sends op 9 Invalid Session; when not `resumable` the session is
    /// forgotten.
    pub fn invalidate_session(&self, resumable: bool) -> bool {
        if !resumable {
            let mut st = self.shared.core.change();
            if let Some(s) = st.current.take() {
                st.sessions.remove(&s);
            }
        }
        self.control(Control::Send(json!({"op": 9, "d": resumable})))
    }

    /// The next message send gets HTTP 429 (code 22009) with
    /// `Retry-After: secs`. Calls queue up.
    pub fn rate_limit_next_send(&self, secs: f64) {
        self.shared.core.change().fail_429.push(secs);
    }

    /// The next message send gets `status` with business `code`.
    pub fn fail_next_send(&self, status: u16, code: i64) {
        self.shared.core.change().fail_status.push((status, code));
    }

    /// While set, message sends hang unanswered and are never delivered.
    pub fn hang_send(&self, hang: bool) {
        self.shared.core.set_hang(hang);
    }

    /// Every message accepted, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.core.read().sent.clone()
    }

    /// Every input notice accepted.
    pub fn typing(&self) -> Vec<Typing> {
        self.shared.core.read().typing.clone()
    }

    /// Every OpenAPI request, refused and hung ones too.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.core.requests()
    }

    /// The message sends (input notices not counted), answered or not.
    pub fn send_attempts(&self) -> Vec<Request> {
        self.shared.core.requests_where(is_send)
    }

    /// Every gateway payload the client sent.
    pub fn frames(&self) -> Vec<Frame> {
        self.shared.core.read().frames.clone()
    }

    /// How many READY and RESUMED were sent.
    pub fn ready_and_resumed(&self) -> (usize, usize) {
        let st = self.shared.core.read();
        (st.readies, st.resumed)
    }

    /// Waits until READY + RESUMED were sent at least `n` times.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_sessions(&self, n: usize, timeout: Duration) {
        self.shared
            .core
            .wait(
                &format!("{n} session starts"),
                timeout,
                |st| (st.readies + st.resumed >= n).then_some(()),
                |st| format!("{} READY and {} RESUMED", st.readies, st.resumed),
            )
            .await;
    }

    /// Waits until at least `n` messages were accepted.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_sent(&self, n: usize, timeout: Duration) -> Vec<Sent> {
        self.shared
            .core
            .wait_len("sent messages", n, timeout, |st| &st.sent)
            .await
    }

    /// Waits until at least `n` message sends arrived.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_send_attempts(&self, n: usize, timeout: Duration) -> Vec<Request> {
        self.shared
            .core
            .wait_requests("send attempts", n, timeout, is_send)
            .await
    }

    /// Waits until no connection is attached.
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

    /// Waits until the client sent at least `n` payloads with opcode `op`.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_frames(&self, op: u64, n: usize, timeout: Duration) -> Vec<Frame> {
        let with_op = |st: &Book| -> Vec<Frame> {
            st.frames.iter().filter(|f| f.op == op).cloned().collect()
        };
        self.shared
            .core
            .wait(
                &format!("{n} op {op} payloads"),
                timeout,
                |st| {
                    let got = with_op(st);
                    (got.len() >= n).then_some(got)
                },
                |st| with_op(st).len(),
            )
            .await
    }

    /// Stops the server (also on drop).
    pub fn shutdown(&self) {
        self.shared.core.stop();
    }
}

impl Drop for FakeQq {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn is_send(r: &Request) -> bool {
    r.method == "POST"
        && r.path.ends_with("/messages")
        && r.body.get("msg_type").and_then(Value::as_u64) != Some(6)
}

/// The intent an event needs.
fn intent_of(kind: &str) -> u64 {
    match kind {
        "C2C_MESSAGE_CREATE" | "GROUP_AT_MESSAGE_CREATE" => GROUP_AND_C2C,
        "AT_MESSAGE_CREATE" => PUBLIC_GUILD_MESSAGES,
        "GUILD_MESSAGE_CREATE" => GUILD_MESSAGES,
        "DIRECT_MESSAGE_CREATE" => DIRECT_MESSAGE,
        "INTERACTION_CREATE" => INTERACTION,
        _ => 0,
    }
}

/// Appends a dispatch to `session`'s log when its intents cover it, and
/// returns the payload.
fn log_dispatch(st: &mut Book, session: &str, kind: &str, d: Value) -> Option<Value> {
    let log = st.sessions.entry(session.to_owned()).or_default();
    let needs = intent_of(kind);
    if needs != 0 && log.intents & needs == 0 {
        return None;
    }
    log.next_seq += 1;
    let payload = json!({"op": 0, "s": log.next_seq, "t": kind,
        "id": format!("{kind}:fake-event-{}", log.next_seq), "d": d});
    log.events.push(payload.clone());
    Some(payload)
}

fn error(status: u16, code: i64, message: &str) -> Response {
    crate::json_response(
        status,
        &json!({"code": code, "message": message, "err_code": code, "trace_id": "fake-trace"}),
    )
}

async fn token(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    shared.core.record(Request {
        method: "POST".into(),
        path: "/app/getAppAccessToken".into(),
        body: json!({"appId": v.get("appId")}),
        authorized: false,
        at: Instant::now(),
    });
    if v.get("appId").and_then(Value::as_str) != Some(shared.app_id.as_str())
        || v.get("clientSecret").and_then(Value::as_str) != Some(shared.secret.as_str())
    {
        return error(401, 100016, "invalid appid or secret");
    }
    let mut st = shared.core.change();
    st.next_token += 1;
    st.token_fetches += 1;
    let token = format!("fake-access-token-{:04}", st.next_token);
    st.tokens.push(token.clone());
    let expires = if st.expires_in_as_string {
        json!("7200")
    } else {
        json!(7200)
    };
    crate::json_response(200, &json!({"access_token": token, "expires_in": expires}))
}

fn token_ok(st: &Book, header: Option<&str>) -> bool {
    header
        .and_then(|h| h.strip_prefix("QQBot "))
        .is_some_and(|t| st.tokens.iter().any(|k| k == t))
}

async fn upgrade(ws: WebSocketUpgrade, State(shared): State<Arc<Shared>>) -> Response {
    ws.on_upgrade(move |socket| connection(shared, socket))
}

async fn connection(shared: Arc<Shared>, mut socket: WebSocket) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (id, interval) = {
        let mut st = shared.core.change();
        st.next_connection += 1;
        let id = st.next_connection;
        if let Some(old) = st.attached.replace(Attached {
            id,
            tx,
            session: None,
        }) {
            let _ = old.tx.send(Control::Close(Some(4009)));
        }
        (id, st.heartbeat_interval_ms)
    };
    let hello = json!({"op": 10, "d": {"heartbeat_interval": interval}});
    if send(&mut socket, &hello).await {
        loop {
            tokio::select! {
                msg = socket.recv() => match msg {
                    Some(Ok(Message::Text(t))) => {
                        if !on_payload(&shared, id, &mut socket, t.as_str()).await {
                            break;
                        }
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => {}
                },
                ctl = rx.recv() => match ctl {
                    Some(Control::Send(v)) => {
                        if !send(&mut socket, &v).await {
                            break;
                        }
                    }
                    Some(Control::Close(Some(code))) => {
                        close(&mut socket, code, "").await;
                        break;
                    }
                    Some(Control::Close(None)) | None => break,
                },
                () = shared.core.stopped() => break,
            }
        }
    }
    let mut st = shared.core.change();
    if st.attached.as_ref().is_some_and(|a| a.id == id) {
        st.attached = None;
    }
}

async fn send(socket: &mut WebSocket, v: &Value) -> bool {
    socket
        .send(Message::Text(v.to_string().into()))
        .await
        .is_ok()
}

async fn close(socket: &mut WebSocket, code: u16, reason: &str) {
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code,
            reason: reason.to_owned().into(),
        })))
        .await;
}

/// Handles one client payload; `false` ends the connection.
async fn on_payload(shared: &Shared, conn: u64, socket: &mut WebSocket, text: &str) -> bool {
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        close(socket, 4002, "invalid payload").await;
        return false;
    };
    let op = v.get("op").and_then(Value::as_u64).unwrap_or(u64::MAX);
    let d = v.get("d").cloned().unwrap_or(Value::Null);
    shared.core.change().frames.push(Frame {
        op,
        d: d.clone(),
        connection: conn,
    });
    let token_ok = token_ok(&shared.core.read(), d.get("token").and_then(Value::as_str));
    let out: Vec<Value> = match op {
        1 => vec![json!({"op": 11})],
        2 | 6 if !token_ok => {
            close(socket, 4004, "invalid token").await;
            return false;
        }
        2 => {
            let intents = d.get("intents").and_then(Value::as_u64).unwrap_or(0);
            let shard_ok = d.get("shard") == Some(&json!([0, 1]));
            let permitted = shared.core.read().permitted_intents;
            shared.core.change().identified_intents.push(intents);
            if !shard_ok {
                close(socket, 4010, "invalid shard").await;
                return false;
            }
            if intents == 0 {
                close(socket, 4013, "invalid intent").await;
                return false;
            }
            if intents & !permitted != 0 {
                close(socket, 4014, "disallowed intent").await;
                return false;
            }
            identify(shared, conn, intents)
        }
        6 => resume(shared, conn, &d),
        _ => {
            close(socket, 4001, "invalid opcode").await;
            return false;
        }
    };
    for payload in &out {
        if !send(socket, payload).await {
            return false;
        }
    }
    true
}

fn identify(shared: &Shared, conn: u64, intents: u64) -> Vec<Value> {
    let mut st = shared.core.change();
    st.next_session += 1;
    let session = format!("fake-qq-session-{}", st.next_session);
    st.sessions.insert(
        session.clone(),
        SessionLog {
            intents,
            ..SessionLog::default()
        },
    );
    st.current = Some(session.clone());
    if let Some(a) = st.attached.as_mut().filter(|a| a.id == conn) {
        a.session = Some(session.clone());
    }
    let ready = json!({"version": 1, "session_id": session,
        "user": {"id": BOT_ID, "username": BOT_NAME, "bot": true}, "shard": [0, 1]});
    let mut out: Vec<Value> = log_dispatch(&mut st, &session, "READY", ready)
        .into_iter()
        .collect();
    st.readies += 1;
    for (kind, d) in std::mem::take(&mut st.backlog) {
        out.extend(log_dispatch(&mut st, &session, &kind, d));
    }
    out
}

fn resume(shared: &Shared, conn: u64, d: &Value) -> Vec<Value> {
    let mut st = shared.core.change();
    let session = d.get("session_id").and_then(Value::as_str).unwrap_or("");
    let seq = d.get("seq").and_then(Value::as_u64).unwrap_or(0);
    if !st.sessions.contains_key(session) {
        return vec![json!({"op": 9, "d": false})];
    }
    st.current = Some(session.to_owned());
    if let Some(a) = st.attached.as_mut().filter(|a| a.id == conn) {
        a.session = Some(session.to_owned());
    }
    let mut out: Vec<Value> = st.sessions[session]
        .events
        .iter()
        .filter(|e| e.get("s").and_then(Value::as_u64).is_some_and(|s| s > seq))
        .cloned()
        .collect();
    out.extend(log_dispatch(&mut st, session, "RESUMED", json!("")));
    st.resumed += 1;
    out
}

async fn rest(State(shared): State<Arc<Shared>>, request: axum::extract::Request) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let auth = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = Bytes::from_request(request, &()).await.unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let authorized = token_ok(&shared.core.read(), auth.as_deref());
    shared.core.record(Request {
        method: method.to_string(),
        path: path.clone(),
        body: body.clone(),
        authorized,
        at: Instant::now(),
    });
    if !authorized {
        return error(401, CODE_BAD_TOKEN, "token not exist or expire");
    }
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method, parts.as_slice()) {
        (Method::GET, ["gateway"]) => crate::json_response(
            200,
            &json!({"url": format!("ws://{}/websocket", shared.addr)}),
        ),
        (Method::POST, ["v2", scope @ ("users" | "groups"), id, "messages"]) => {
            create(&shared, scope, id, &body, true).await
        }
        (Method::POST, [scope @ ("channels" | "dms"), id, "messages"]) => {
            create(&shared, scope, id, &body, false).await
        }
        (Method::POST, ["v2", scope @ ("users" | "groups"), id, "files"]) => {
            upload(&shared, scope, id, &body)
        }
        (Method::GET, ["media", name]) => {
            let bytes = shared.core.read().served.get(*name).cloned();
            match bytes {
                Some(b) => Response::builder()
                    .status(200)
                    .header(header::CONTENT_TYPE, "application/octet-stream")
                    .body(axum::body::Body::from(b))
                    .unwrap_or_else(|_| error(500, 500, "cannot answer")),
                None => error(404, 404, "no such file"),
            }
        }
        _ => error(404, 404, "not found"),
    }
}

async fn create(shared: &Shared, scope: &str, target: &str, body: &Value, v2: bool) -> Response {
    let msg_type = body.get("msg_type").and_then(Value::as_u64).unwrap_or(0);
    let typing = v2 && msg_type == 6;
    if !typing && shared.core.hanging() {
        shared.core.held().await;
        return error(502, 502, "bad gateway");
    }
    let mut st = shared.core.change();
    if !typing {
        if let Some(secs) = st.fail_429.take() {
            drop(st);
            let mut r = error(429, CODE_RATE_LIMITED, "msg limit exceed");
            if let Ok(v) = HeaderValue::from_str(&format!("{}", secs.ceil() as u64)) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
            return r;
        }
        if let Some((status, code)) = st.fail_status.take() {
            return error(status, code, "injected failure");
        }
    }
    let media = v2 && msg_type == 7;
    let text = match msg_type {
        0 => body.get("content").and_then(Value::as_str),
        2 if v2 => body.pointer("/markdown/content").and_then(Value::as_str),
        6 if typing && scope == "users" => Some(""),
        7 if media => Some(""),
        _ => return error(400, 40034002, "unsupported msg_type"),
    }
    .unwrap_or("")
    .to_owned();
    if text.trim().is_empty() && !typing && !media {
        return error(400, 40034004, "content is empty");
    }
    let chat = format!("{scope}/{target}");
    let file_info = body
        .pointer("/media/file_info")
        .and_then(Value::as_str)
        .unwrap_or("");
    if media && st.files.get(file_info).is_none_or(|f| f.chat != chat) {
        return error(400, 40034007, "media.file_info invalid for this chat");
    }
    let msg_id = body
        .get("msg_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let msg_seq = body.get("msg_seq").and_then(Value::as_u64);
    match &msg_id {
        Some(id) => {
            let window = st.passive_window.unwrap_or(if scope == "users" {
                Duration::from_secs(3600)
            } else {
                Duration::from_secs(300)
            });
            let cap = if scope == "users" { 4 } else { 5 };
            let Some(m) = st.delivered.get_mut(id).filter(|m| m.chat == chat) else {
                return error(400, CODE_BAD_MSG_ID, "msg_id invalid");
            };
            if m.at.elapsed() > window {
                return error(400, CODE_REPLY_EXPIRED, "passive reply window expired");
            }
            // v1 (guild) replies carry no msg_seq; v2 ones default to 1.
            if v2 {
                let seq = msg_seq.unwrap_or(1);
                if !m.seqs.insert(seq) {
                    return error(400, CODE_DUPLICATE_SEQ, "消息被去重，请检查请求msgseq");
                }
            }
            if !typing {
                if m.replies >= cap {
                    return error(400, CODE_REPLY_CAP, "reply count for msg_id exceeded");
                }
                m.replies += 1;
            }
        }
        None if typing => return error(400, CODE_BAD_MSG_ID, "input notify needs msg_id"),
        None => {
            let quota = st.proactive_quota;
            let used = st.proactive.entry(chat.clone()).or_insert(0);
            if *used >= quota {
                return error(
                    400,
                    CODE_PROACTIVE_QUOTA,
                    "proactive message quota exhausted",
                );
            }
            *used += 1;
        }
    }
    st.next_id += 1;
    let id = format!("ROBOT1.0_sent{:08}", st.next_id);
    if media {
        let (file_type, name, bytes) = match st.files.get(file_info) {
            Some(f) => (f.file_type, f.name.clone(), f.bytes.clone()),
            None => return error(400, 40034007, "media.file_info invalid"),
        };
        st.media_sent.push(MediaSent {
            scope: scope.to_owned(),
            target: target.to_owned(),
            file_type,
            name,
            bytes,
            content: body
                .get("content")
                .and_then(Value::as_str)
                .map(str::to_owned),
            msg_id,
            msg_seq,
            at: Instant::now(),
        });
    } else if typing {
        st.typing.push(Typing {
            openid: target.to_owned(),
            msg_id: msg_id.unwrap_or_default(),
            at: Instant::now(),
        });
    } else {
        st.sent.push(Sent {
            scope: scope.to_owned(),
            target: target.to_owned(),
            text,
            markdown: msg_type == 2,
            msg_id,
            msg_seq,
            id: id.clone(),
            at: Instant::now(),
        });
    }
    crate::json_response(
        200,
        &json!({"id": id, "timestamp": "2026-12-06T19:00:01+08:00"}),
    )
}

/// Whether `bytes` are what QQ accepts for `file_type` [doc]: 1 PNG or
/// JPEG, 2 MP4, 3 SILK, 4 anything.
fn format_ok(file_type: u64, bytes: &[u8]) -> bool {
    match file_type {
        1 => bytes.starts_with(b"\x89PNG\r\n\x1a\n") || bytes.starts_with(&[0xff, 0xd8, 0xff]),
        2 => bytes.get(4..8) == Some(b"ftyp"),
        3 => bytes.starts_with(b"#!SILK") || bytes.starts_with(b"\x02#!SILK"),
        4 => true,
        _ => false,
    }
}

fn upload(shared: &Shared, scope: &str, target: &str, body: &Value) -> Response {
    use base64::Engine;
    let file_type = body.get("file_type").and_then(Value::as_u64).unwrap_or(0);
    if !(1..=4).contains(&file_type) {
        return error(400, 40034010, "file_type invalid");
    }
    if body.get("srv_send_msg").and_then(Value::as_bool) == Some(true) {
        return error(400, 40034011, "the fake takes srv_send_msg: false only");
    }
    let data = body.get("file_data").and_then(Value::as_str);
    if body.get("url").is_some() || data.is_none() {
        return error(400, 40034012, "the fake takes file_data only");
    }
    let Some(bytes) = data
        .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok())
        .filter(|b| !b.is_empty())
    else {
        return error(400, 40034013, "file_data is not base64 of a file");
    };
    if !format_ok(file_type, &bytes) {
        return error(400, 40034014, "the file is not of its file_type's format");
    }
    let mut st = shared.core.change();
    st.next_file += 1;
    let n = st.next_file;
    let info = format!("fakeFileInfo{n:06}+/=");
    st.files.insert(
        info.clone(),
        FileUpload {
            chat: format!("{scope}/{target}"),
            file_type,
            name: body
                .get("file_name")
                .and_then(Value::as_str)
                .map(str::to_owned),
            bytes,
        },
    );
    crate::json_response(
        200,
        &json!({"file_uuid": format!("uuid-{n}"), "file_info": info, "ttl": 3600}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn post(url: &str, token: Option<&str>, body: Value) -> (u16, Value) {
        let mut req = reqwest::Client::new().post(url).json(&body);
        if let Some(t) = token {
            req = req.header("Authorization", format!("QQBot {t}"));
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    #[tokio::test]
    async fn replies_need_a_known_msg_id_and_a_fresh_seq() {
        let fake = FakeQq::start("1", "s", Duration::from_secs(40)).await;
        let (status, t) = post(
            &fake.token_url(),
            None,
            json!({"appId": "1", "clientSecret": "s"}),
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(t["expires_in"], "7200");
        let token = t["access_token"].as_str().unwrap().to_owned();
        let (status, _) = post(
            &fake.token_url(),
            None,
            json!({"appId": "1", "clientSecret": "x"}),
        )
        .await;
        assert_eq!(status, 401);
        let id = fake.push_c2c("U", "hi");
        let url = format!("{}/v2/users/U/messages", fake.api_base());
        let body = |seq: u64| json!({"content": "a", "msg_type": 0, "msg_id": id, "msg_seq": seq});
        assert_eq!(post(&url, Some("wrong"), body(1)).await.0, 401);
        assert_eq!(post(&url, Some(&token), body(1)).await.0, 200);
        let (status, e) = post(&url, Some(&token), body(1)).await;
        assert_eq!(
            (status, e["code"].as_i64()),
            (400, Some(CODE_DUPLICATE_SEQ))
        );
        assert_eq!(post(&url, Some(&token), body(2)).await.0, 200);
        // Another chat's message id is no passive reply here.
        let other = format!("{}/v2/groups/G/messages", fake.api_base());
        let (status, e) = post(&other, Some(&token), body(3)).await;
        assert_eq!((status, e["code"].as_i64()), (400, Some(CODE_BAD_MSG_ID)));
        assert_eq!(fake.sent().len(), 2);
    }

    #[tokio::test]
    async fn files_must_be_what_their_type_says_and_sent_in_their_own_chat() {
        use base64::Engine;
        let fake = FakeQq::start("1", "s", Duration::from_secs(40)).await;
        let (_, t) = post(
            &fake.token_url(),
            None,
            json!({"appId": "1", "clientSecret": "s"}),
        )
        .await;
        let token = t["access_token"].as_str().unwrap().to_owned();
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let files = format!("{}/v2/users/U/files", fake.api_base());
        // Text labelled an image is refused; as a file it is taken.
        let (status, _) = post(
            &files,
            Some(&token),
            json!({"file_type": 1, "file_data": b64(b"hello"), "srv_send_msg": false}),
        )
        .await;
        assert_eq!(status, 400);
        let (status, up) = post(
            &files,
            Some(&token),
            json!({"file_type": 4, "file_data": b64(b"hello"), "srv_send_msg": false,
                "file_name": "a.txt"}),
        )
        .await;
        assert_eq!(status, 200);
        let info = up["file_info"].as_str().unwrap();
        // The file_info is good only in the chat it was uploaded for.
        let other = format!("{}/v2/users/V/messages", fake.api_base());
        let body = json!({"msg_type": 7, "media": {"file_info": info}});
        assert_eq!(post(&other, Some(&token), body.clone()).await.0, 400);
        let own = format!("{}/v2/users/U/messages", fake.api_base());
        assert_eq!(post(&own, Some(&token), body).await.0, 200);
        assert_eq!(fake.media_sent()[0].bytes, b"hello");
    }
}
