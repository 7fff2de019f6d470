//! A fake WeCom intelligent robot (智能机器人) long connection on
//! 127.0.0.1, written from WeCom's description of the protocol (the
//! platform sheet's §4B), for the `wecom` adapter's tests.
//!
//! `GET /` upgrades to the WebSocket. Every frame is JSON text,
//! `{cmd, headers: {req_id}, body}`; the fake answers a request with the
//! same `req_id`, no `cmd`, an `errcode` and an `errmsg` (and a `body` for
//! the upload steps). What it checks, so a test can fail:
//!
//! - `aibot_subscribe` first, with this robot's `bot_id` and `secret`;
//!   anything else before it, or a wrong pair, is refused
//!   ([`NOT_SUBSCRIBED`], [`BAD_SECRET`]). A second subscription for the
//!   robot takes the connection: the older one gets an
//!   `aibot_event_callback` whose event is `disconnected_event`, and is
//!   closed.
//! - `ping` is answered (unless the fake is told to go deaf).
//! - `aibot_respond_msg` must carry the `req_id` of a message frame
//!   pushed on **this** connection ([`UNKNOWN_REQ_ID`]), and a message
//!   body: `markdown.content` (≤ 20,480 bytes, not empty), `text.content`,
//!   a `stream`, or an image, video or file naming a `media_id` an upload
//!   here produced ([`BAD_MESSAGE`]). `aibot_respond_welcome_msg` must
//!   answer an `enter_chat` event.
//! - `aibot_send_msg` (proactive) must name a `chatid` of a user who wrote
//!   to the robot directly; a group is refused ([`GROUP_PROACTIVE`]), as
//!   a robot cannot start a group conversation.
//! - The upload: `aibot_upload_media_init` (`type`, `filename`,
//!   `total_size`, `total_chunks` of 1..=100, a 32-hex `md5`) →
//!   `upload_id`; `aibot_upload_media_chunk` (`upload_id`, `chunk_index`
//!   from 0, `base64_data` of at most 512 KiB, each index once);
//!   `aibot_upload_media_finish` checks every chunk arrived, the size and
//!   the MD5 (computed here) → `media_id` ([`BAD_UPLOAD`]).
//!
//! Tests push `aibot_msg_callback` frames (DMs and groups: text, mixed,
//! voice, image and file), `aibot_event_callback` frames, re-deliveries
//! of a `msgid`, queue refusals (45009 is WeCom's "too frequent"), hang
//! sends, and cut the connection; frames pushed while no client is
//! connected wait for the next one. Files a message names are served
//! from `GET /media/{name}` as given, already encrypted: the test (or the
//! kit, with [`seal`]) computes the ciphertext with the `openssl` command
//! line, never the adapter's code.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write as _;
use std::net::SocketAddr;
use std::process::{Command as Process, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use md5::{Digest, Md5};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::fake::{Core, Faults, bind, started};

/// The fake's errcode for a request before `aibot_subscribe` succeeded.
pub const NOT_SUBSCRIBED: i64 = 846_001;
/// The fake's errcode for a wrong bot id or secret.
pub const BAD_SECRET: i64 = 846_002;
/// The fake's errcode for an answer whose `req_id` is no message frame of
/// this connection.
pub const UNKNOWN_REQ_ID: i64 = 846_003;
/// The fake's errcode for a message body it cannot send.
pub const BAD_MESSAGE: i64 = 846_004;
/// The fake's errcode for a proactive send to a group or a stranger.
pub const GROUP_PROACTIVE: i64 = 846_005;
/// The fake's errcode for a malformed upload step.
pub const BAD_UPLOAD: i64 = 846_006;
/// WeCom's "API frequency out of limit".
pub const TOO_FAST: i64 = 45_009;
/// The largest upload chunk, decoded.
pub const CHUNK_BYTES: usize = 512 * 1024;
/// The largest markdown message, in UTF-8 bytes.
pub const MAX_MARKDOWN_BYTES: usize = 20_480;

/// One request as it arrived (before refusals and hangs).
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The command.
    pub cmd: String,
    /// The frame's `req_id`.
    pub req_id: String,
    /// The body.
    pub body: Value,
    /// When it arrived.
    pub at: Instant,
}

/// One message the fake accepted from the robot.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// The chat: the user id of a DM, the `chatid` of a group.
    pub chat: String,
    /// Whether it went to a group.
    pub group: bool,
    /// `Some(req_id)` for an answer (`aibot_respond_msg`), `None` for a
    /// proactive `aibot_send_msg`.
    pub answering: Option<String>,
    /// `markdown`, `text`, `stream`, `image`, `video` or `file`.
    pub msgtype: String,
    /// The text (markdown's or text's content); empty for a file.
    pub text: String,
    /// The uploaded file it carries.
    pub media_id: Option<String>,
    /// When the fake accepted it.
    pub at: Instant,
}

/// One upload the fake finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    /// `image`, `voice`, `video` or `file`.
    pub kind: String,
    /// The file name given.
    pub filename: String,
    /// The bytes, reassembled.
    pub bytes: Vec<u8>,
    /// The id it was given.
    pub media_id: String,
}

/// One refusal the fake answered, for tests that expect one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The command refused.
    pub cmd: String,
    /// The errcode answered.
    pub errcode: i64,
    /// Why, in words.
    pub why: String,
}

#[derive(Debug)]
enum Command {
    Frame(String),
    /// Tells the connection it was superseded, then closes it.
    Supersede,
    Drop,
}

#[derive(Debug, Clone)]
struct Origin {
    /// The connection it went out on, once it did.
    conn: Option<u64>,
    chat: String,
    group: bool,
    enter_chat: bool,
}

struct Partial {
    kind: String,
    filename: String,
    total_size: u64,
    total_chunks: u64,
    md5: String,
    chunks: BTreeMap<u64, Vec<u8>>,
}

#[derive(Default)]
struct Book {
    next: u64,
    connections: usize,
    subscriptions: Vec<(String, i64)>,
    live: Option<(u64, mpsc::UnboundedSender<Command>)>,
    /// Frames pushed while no client was connected, by `req_id`.
    queued: Vec<(String, String)>,
    origins: HashMap<String, Origin>,
    /// Bodies pushed, by `msgid`, for re-delivery.
    bodies: HashMap<String, Value>,
    users: HashSet<String>,
    groups: HashSet<String>,
    sent: Vec<Sent>,
    welcomes: Vec<(String, String)>,
    failures: Faults<i64>,
    partial: HashMap<String, Partial>,
    uploads: Vec<Upload>,
    media: HashMap<String, Vec<u8>>,
    media_fetches: Vec<String>,
    refusals: Vec<Refusal>,
    pings: usize,
    deaf: bool,
}

struct Shared {
    bot_id: String,
    secret: String,
    addr: SocketAddr,
    core: Core<Book, Request>,
}

/// A fake WeCom robot connection (see the module docs).
pub struct FakeWecomBot {
    shared: Arc<Shared>,
}

impl Drop for FakeWecomBot {
    fn drop(&mut self) {
        self.shared.core.stop();
    }
}

/// A DM's message callback body: `msgtype` and its part, from `user`.
pub fn dm_body(msgid: &str, user: &str, msgtype: &str, part: Value) -> Value {
    let mut body = json!({
        "msgid": msgid, "aibotid": "", "chattype": "single",
        "from": { "userid": user }, "msgtype": msgtype,
    });
    body[msgtype] = part;
    body
}

/// A group's message callback body: `msgtype` and its part, from `user`
/// in `chatid`.
pub fn group_body(msgid: &str, user: &str, chatid: &str, msgtype: &str, part: Value) -> Value {
    let mut body = dm_body(msgid, user, msgtype, part);
    body["chattype"] = json!("group");
    body["chatid"] = json!(chatid);
    body
}

/// `plain` encrypted as WeCom encrypts a robot's file: AES-256-CBC, the
/// key `aeskey` decoded from base64 (its one `=` of padding restored),
/// the IV the key's first 16 bytes, PKCS#7 padding to a 32-byte block.
/// The cipher runs in the `openssl` command line.
///
/// # Panics
/// When `aeskey` is not 32 bytes of base64 or openssl fails (a broken
/// test environment).
pub fn seal(aeskey: &str, plain: &[u8]) -> Vec<u8> {
    let lenient = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
    );
    let padded_key = if aeskey.len() % 4 == 3 {
        format!("{aeskey}=")
    } else {
        aeskey.to_owned()
    };
    let key = lenient.decode(padded_key).expect("an aeskey is base64");
    assert_eq!(key.len(), 32, "an aeskey decodes to 32 bytes");
    let mut padded = plain.to_vec();
    let pad = 32 - plain.len() % 32;
    padded.extend(std::iter::repeat_n(pad as u8, pad));
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let mut child = Process::new("openssl")
        .args([
            "enc",
            "-aes-256-cbc",
            "-nopad",
            "-K",
            &hex(&key),
            "-iv",
            &hex(&key[..16]),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the openssl command line runs");
    let mut stdin = child.stdin.take().expect("openssl's stdin");
    let writer = std::thread::spawn(move || stdin.write_all(&padded));
    let output = child.wait_with_output().expect("openssl finishes");
    writer
        .join()
        .expect("the writer thread")
        .expect("openssl takes the plaintext");
    assert!(
        output.status.success(),
        "openssl enc failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

impl FakeWecomBot {
    /// Starts the fake for the robot `bot_id` with `secret`.
    ///
    /// # Panics
    /// When no local port can be bound (a broken test environment).
    pub async fn start(bot_id: &str, secret: &str) -> FakeWecomBot {
        started("the fake WeCom robot", Self::try_start(bot_id, secret))
    }

    /// Like [`Self::start`], returning the error instead of panicking.
    pub fn try_start(bot_id: &str, secret: &str) -> std::io::Result<FakeWecomBot> {
        let (listener, addr) = bind()?;
        let shared = Arc::new(Shared {
            bot_id: bot_id.to_owned(),
            secret: secret.to_owned(),
            addr,
            core: Core::new(Book {
                next: 1,
                ..Book::default()
            }),
        });
        let app = Router::new()
            .route("/", any(socket))
            .route("/media/{name}", get(media))
            .with_state(shared.clone());
        shared.core.serve("fake-wecom-bot", listener, app)?;
        Ok(FakeWecomBot { shared })
    }

    /// `ws://127.0.0.1:PORT/`: the long connection.
    pub fn ws_url(&self) -> String {
        format!("ws://{}/", self.shared.addr)
    }

    /// `127.0.0.1`: the host files are served from.
    pub fn media_host(&self) -> String {
        self.shared.addr.ip().to_string()
    }

    /// Serves `ciphertext` (already encrypted) and returns its URL.
    pub fn host_media(&self, ciphertext: Vec<u8>) -> String {
        let mut st = self.shared.core.change();
        let name = format!("f{:05}", st.next);
        st.next += 1;
        st.media.insert(name.clone(), ciphertext);
        format!("http://{}/media/{name}", self.shared.addr)
    }

    /// The names of the files fetched so far.
    pub fn media_fetches(&self) -> Vec<String> {
        self.shared.core.read().media_fetches.clone()
    }

    /// A fresh message id.
    pub fn next_msgid(&self) -> String {
        let mut st = self.shared.core.change();
        let id = format!("msg{:05}", st.next);
        st.next += 1;
        id
    }

    /// Pushes a message callback carrying `body`; returns the frame's
    /// `req_id`.
    pub fn push_message(&self, body: Value) -> String {
        let chat_type = body.get("chattype").and_then(Value::as_str).unwrap_or("");
        let group = chat_type == "group";
        let user = body
            .pointer("/from/userid")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let chat = if group {
            body.get("chatid")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        } else {
            user.clone()
        };
        {
            let mut st = self.shared.core.change();
            if group {
                st.groups.insert(chat.clone());
            } else {
                st.users.insert(user);
            }
            if let Some(id) = body.get("msgid").and_then(Value::as_str) {
                st.bodies.insert(id.to_owned(), body.clone());
            }
        }
        self.push("aibot_msg_callback", body, chat, group, false)
    }

    /// A text DM from `user`; returns its `msgid`.
    pub fn push_text_dm(&self, user: &str, text: &str) -> String {
        let id = self.next_msgid();
        self.push_message(dm_body(&id, user, "text", json!({ "content": text })));
        id
    }

    /// A text message from `user` in group `chatid`, written as WeCom
    /// delivers it: after `@Talaria ` when it mentions the robot. (WeCom
    /// delivers no group message that does not; tests of the adapter's
    /// own handling push such bodies anyway.) Returns its `msgid`.
    pub fn push_text_group(&self, user: &str, chatid: &str, text: &str, mention: bool) -> String {
        let id = self.next_msgid();
        let content = if mention {
            format!("@Talaria {text}")
        } else {
            text.to_owned()
        };
        self.push_message(group_body(
            &id,
            user,
            chatid,
            "text",
            json!({ "content": content }),
        ));
        id
    }

    /// Pushes the message `msgid` again (a new frame, the same body), as
    /// after a delivery WeCom thinks was lost.
    ///
    /// # Panics
    /// When no message `msgid` was pushed.
    pub fn redeliver(&self, msgid: &str) -> String {
        let body = self
            .shared
            .core
            .read()
            .bodies
            .get(msgid)
            .cloned()
            .expect("a message pushed before");
        self.push_message(body)
    }

    /// Pushes an event callback (`enter_chat`, `disconnected_event`, …)
    /// from `user`; returns the frame's `req_id`.
    pub fn push_event(&self, user: &str, eventtype: &str) -> String {
        let id = self.next_msgid();
        let body = json!({
            "msgid": id, "create_time": 1_700_000_000, "aibotid": self.shared.bot_id,
            "chattype": "single", "from": { "userid": user }, "msgtype": "event",
            "event": { "eventtype": eventtype },
        });
        self.shared.core.change().users.insert(user.to_owned());
        self.push(
            "aibot_event_callback",
            body,
            user.to_owned(),
            false,
            eventtype == "enter_chat",
        )
    }

    fn push(&self, cmd: &str, body: Value, chat: String, group: bool, enter_chat: bool) -> String {
        let mut st = self.shared.core.change();
        let req_id = format!("req{:05}", st.next);
        st.next += 1;
        let frame =
            json!({ "cmd": cmd, "headers": { "req_id": req_id }, "body": body }).to_string();
        let live = st.live.clone();
        st.origins.insert(
            req_id.clone(),
            Origin {
                conn: live.as_ref().map(|(c, _)| *c),
                chat,
                group,
                enter_chat,
            },
        );
        match live {
            Some((_, tx)) => {
                let _ = tx.send(Command::Frame(frame));
            }
            None => st.queued.push((req_id.clone(), frame)),
        }
        req_id
    }

    /// Tells the live connection another client took the robot
    /// (`disconnected_event`) and closes it.
    pub fn supersede(&self) {
        self.command(Command::Supersede);
    }

    /// Cuts the live connection.
    pub fn drop_connection(&self) {
        self.command(Command::Drop);
    }

    /// Ends the live connection at once: from here on, pushes wait for
    /// the next one.
    fn command(&self, command: Command) {
        let live = self.shared.core.change().live.take();
        if let Some((_, tx)) = live {
            let _ = tx.send(command);
        }
    }

    /// Whether a subscribed client is connected now.
    pub fn is_connected(&self) -> bool {
        self.shared.core.read().live.is_some()
    }

    /// Successful subscriptions so far.
    pub fn connections(&self) -> usize {
        self.shared.core.read().connections
    }

    /// Every subscription: the bot id given and the errcode answered.
    pub fn subscriptions(&self) -> Vec<(String, i64)> {
        self.shared.core.read().subscriptions.clone()
    }

    /// Waits until `n` subscriptions succeeded in total.
    pub async fn wait_for_connection(&self, n: usize, timeout: Duration) {
        self.shared
            .core
            .wait(
                &format!("{n} subscribed connections"),
                timeout,
                |b| (b.connections >= n).then_some(()),
                |b| b.connections,
            )
            .await;
    }

    /// Pings answered so far.
    pub fn pings(&self) -> usize {
        self.shared.core.read().pings
    }

    /// While set, pings go unanswered.
    pub fn go_deaf(&self, deaf: bool) {
        self.shared.core.change().deaf = deaf;
    }

    /// The next message sends (answers and proactive ones) are refused
    /// with `errcode`, one each.
    pub fn fail_next_send(&self, errcode: i64) {
        self.shared.core.change().failures.push(errcode);
    }

    /// While set, message sends are neither answered nor delivered.
    pub fn hang_sends(&self, hang: bool) {
        self.shared.core.set_hang(hang);
    }

    /// Every message the fake accepted.
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.core.read().sent.clone()
    }

    /// Waits until `n` messages were accepted.
    pub async fn wait_for_sent(&self, n: usize, timeout: Duration) -> Vec<Sent> {
        self.shared
            .core
            .wait_len("sent messages", n, timeout, |b| &b.sent)
            .await
    }

    /// The welcome messages accepted: the event's `req_id` and the text.
    pub fn welcomes(&self) -> Vec<(String, String)> {
        self.shared.core.read().welcomes.clone()
    }

    /// Every finished upload.
    pub fn uploads(&self) -> Vec<Upload> {
        self.shared.core.read().uploads.clone()
    }

    /// Every refusal answered so far.
    pub fn refusals(&self) -> Vec<Refusal> {
        self.shared.core.read().refusals.clone()
    }

    /// Waits until a refusal of `cmd` was answered; returns them all.
    pub async fn wait_for_refusal(&self, cmd: &str, timeout: Duration) -> Vec<Refusal> {
        self.shared
            .core
            .wait(
                &format!("a refusal of {cmd}"),
                timeout,
                |b| {
                    b.refusals
                        .iter()
                        .any(|r| r.cmd == cmd)
                        .then(|| b.refusals.clone())
                },
                |b| b.refusals.clone(),
            )
            .await
    }

    /// Every message send (answer or proactive) as it arrived.
    pub fn send_attempts(&self) -> Vec<Request> {
        self.shared.core.requests_where(|r| is_message_send(&r.cmd))
    }

    /// Waits until `n` message sends arrived.
    pub async fn wait_for_send_attempts(&self, n: usize, timeout: Duration) {
        self.shared
            .core
            .wait_requests("send attempts", n, timeout, |r| is_message_send(&r.cmd))
            .await;
    }

    /// Every request as it arrived.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.core.requests()
    }
}

fn is_message_send(cmd: &str) -> bool {
    matches!(cmd, "aibot_respond_msg" | "aibot_send_msg")
}

fn answer(req_id: &str, errcode: i64, errmsg: &str, body: Option<Value>) -> String {
    let mut frame =
        json!({ "headers": { "req_id": req_id }, "errcode": errcode, "errmsg": errmsg });
    if let Some(body) = body {
        frame["body"] = body;
    }
    frame.to_string()
}

async fn media(State(shared): State<Arc<Shared>>, Path(name): Path<String>) -> Response {
    let bytes = {
        let mut st = shared.core.change();
        st.media_fetches.push(name.clone());
        st.media.get(&name).cloned()
    };
    match bytes {
        Some(b) => (StatusCode::OK, b).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn socket(State(shared): State<Arc<Shared>>, upgrade: WebSocketUpgrade) -> Response {
    upgrade
        .max_message_size(8 << 20)
        .on_upgrade(move |ws| serve_socket(shared, ws))
        .into_response()
}

fn parse(text: &str) -> Option<(String, String, Value)> {
    let v: Value = serde_json::from_str(text).ok()?;
    let cmd = v.get("cmd")?.as_str()?.to_owned();
    let req_id = v.pointer("/headers/req_id")?.as_str()?.to_owned();
    Some((cmd, req_id, v.get("body").cloned().unwrap_or(Value::Null)))
}

async fn serve_socket(shared: Arc<Shared>, mut ws: WebSocket) {
    // Nothing but a good subscription is served until one arrives.
    loop {
        let frame = tokio::select! {
            () = shared.core.stopped() => return,
            f = ws.recv() => f,
        };
        let text = match frame {
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(_)) => continue,
            None | Some(Err(_)) => return,
        };
        let Some((cmd, req_id, body)) = parse(text.as_str()) else {
            continue;
        };
        let code = if cmd != "aibot_subscribe" {
            NOT_SUBSCRIBED
        } else if body.get("bot_id").and_then(Value::as_str) == Some(shared.bot_id.as_str())
            && body.get("secret").and_then(Value::as_str) == Some(shared.secret.as_str())
        {
            0
        } else {
            BAD_SECRET
        };
        if cmd == "aibot_subscribe" {
            let given = body
                .get("bot_id")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            shared.core.change().subscriptions.push((given, code));
        }
        let msg = if code == 0 { "ok" } else { "refused" };
        if ws
            .send(Message::Text(answer(&req_id, code, msg, None).into()))
            .await
            .is_err()
        {
            return;
        }
        if code == 0 {
            break;
        }
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (conn, queued, older) = {
        let mut st = shared.core.change();
        st.connections += 1;
        let conn = st.next;
        st.next += 1;
        let older = st.live.replace((conn, tx.clone()));
        let queued = std::mem::take(&mut st.queued);
        for (req_id, _) in &queued {
            if let Some(o) = st.origins.get_mut(req_id) {
                o.conn = Some(conn);
            }
        }
        (conn, queued, older)
    };
    // One connection per robot: the older one is told and closed.
    if let Some((_, older)) = older {
        let _ = older.send(Command::Supersede);
    }
    for (_, frame) in queued {
        if ws.send(Message::Text(frame.into())).await.is_err() {
            break;
        }
    }
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<String>();
    loop {
        tokio::select! {
            () = shared.core.stopped() => return,
            cmd = rx.recv() => match cmd {
                Some(Command::Frame(f)) => {
                    if ws.send(Message::Text(f.into())).await.is_err() {
                        break;
                    }
                }
                Some(Command::Supersede) => {
                    let event = json!({
                        "cmd": "aibot_event_callback",
                        "headers": { "req_id": format!("kick{conn}") },
                        "body": {
                            "msgid": format!("kick{conn}"), "aibotid": shared.bot_id,
                            "msgtype": "event", "event": { "eventtype": "disconnected_event" },
                        },
                    });
                    let _ = ws.send(Message::Text(event.to_string().into())).await;
                    let _ = ws.send(Message::Close(None)).await;
                    break;
                }
                Some(Command::Drop) | None => break,
            },
            out = out_rx.recv() => {
                if let Some(f) = out
                    && ws.send(Message::Text(f.into())).await.is_err()
                {
                    break;
                }
            }
            frame = ws.recv() => match frame {
                Some(Ok(Message::Text(t))) => on_request(&shared, conn, t.as_str(), &out_tx),
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    let mut st = shared.core.change();
    if st.live.as_ref().is_some_and(|(c, _)| *c == conn) {
        st.live = None;
    }
}

fn on_request(shared: &Arc<Shared>, conn: u64, text: &str, out: &mpsc::UnboundedSender<String>) {
    let Some((cmd, req_id, body)) = parse(text) else {
        return;
    };
    if cmd == "ping" {
        let mut st = shared.core.change();
        if !st.deaf {
            st.pings += 1;
            let _ = out.send(answer(&req_id, 0, "ok", None));
        }
        return;
    }
    shared.core.record(Request {
        cmd: cmd.clone(),
        req_id: req_id.clone(),
        body: body.clone(),
        at: Instant::now(),
    });
    if is_message_send(&cmd) && shared.core.hanging() {
        // Neither answered nor delivered.
        return;
    }
    let result = handle(shared, conn, &cmd, &req_id, &body);
    let frame = match result {
        Ok(body) => answer(&req_id, 0, "ok", body),
        Err((code, why)) => {
            shared.core.change().refusals.push(Refusal {
                cmd: cmd.clone(),
                errcode: code,
                why: why.clone(),
            });
            answer(&req_id, code, &why, None)
        }
    };
    let _ = out.send(frame);
}

type Handled = Result<Option<Value>, (i64, String)>;

fn handle(shared: &Arc<Shared>, conn: u64, cmd: &str, req_id: &str, body: &Value) -> Handled {
    let mut st = shared.core.change();
    match cmd {
        "aibot_subscribe" => Ok(None),
        "aibot_respond_msg" => {
            let origin = st
                .origins
                .get(req_id)
                .filter(|o| o.conn == Some(conn) && !o.enter_chat)
                .cloned()
                .ok_or((
                    UNKNOWN_REQ_ID,
                    "the req_id is no message frame of this connection".to_owned(),
                ))?;
            let message = check_message(&st, body)?;
            if let Some(code) = st.failures.take() {
                return Err((code, "injected refusal".into()));
            }
            st.sent.push(Sent {
                chat: origin.chat,
                group: origin.group,
                answering: Some(req_id.to_owned()),
                msgtype: message.0,
                text: message.1,
                media_id: message.2,
                at: Instant::now(),
            });
            Ok(None)
        }
        "aibot_respond_welcome_msg" => {
            let welcome = st
                .origins
                .get(req_id)
                .is_some_and(|o| o.conn == Some(conn) && o.enter_chat);
            if !welcome {
                return Err((
                    UNKNOWN_REQ_ID,
                    "a welcome answers an enter_chat event".into(),
                ));
            }
            let text = body
                .pointer("/text/content")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            st.welcomes.push((req_id.to_owned(), text));
            Ok(None)
        }
        "aibot_send_msg" => {
            let chat = body
                .get("chatid")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            if st.groups.contains(&chat) {
                return Err((
                    GROUP_PROACTIVE,
                    "a robot cannot start a group conversation".into(),
                ));
            }
            if !st.users.contains(&chat) {
                return Err((
                    GROUP_PROACTIVE,
                    "no such user has written to the robot".into(),
                ));
            }
            let message = check_message(&st, body)?;
            if let Some(code) = st.failures.take() {
                return Err((code, "injected refusal".into()));
            }
            st.sent.push(Sent {
                chat,
                group: false,
                answering: None,
                msgtype: message.0,
                text: message.1,
                media_id: message.2,
                at: Instant::now(),
            });
            Ok(None)
        }
        "aibot_upload_media_init" => {
            let text = |k: &str| body.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
            let number = |k: &str| body.get(k).and_then(Value::as_u64).unwrap_or(0);
            let (kind, filename, md5) = (text("type"), text("filename"), text("md5"));
            let (total_size, total_chunks) = (number("total_size"), number("total_chunks"));
            if !matches!(kind.as_str(), "image" | "voice" | "video" | "file") {
                return Err((BAD_UPLOAD, format!("unknown type {kind:?}")));
            }
            if filename.is_empty() || total_size == 0 {
                return Err((BAD_UPLOAD, "no filename or total_size".into()));
            }
            if !(1..=100).contains(&total_chunks)
                || total_size.div_ceil(CHUNK_BYTES as u64) != total_chunks
            {
                return Err((BAD_UPLOAD, "total_chunks does not fit total_size".into()));
            }
            if md5.len() != 32 || !md5.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err((BAD_UPLOAD, "md5 is not 32 hex digits".into()));
            }
            let upload_id = format!("up{:05}", st.next);
            st.next += 1;
            st.partial.insert(
                upload_id.clone(),
                Partial {
                    kind,
                    filename,
                    total_size,
                    total_chunks,
                    md5: md5.to_ascii_lowercase(),
                    chunks: BTreeMap::new(),
                },
            );
            Ok(Some(json!({ "upload_id": upload_id })))
        }
        "aibot_upload_media_chunk" => {
            let upload_id = body.get("upload_id").and_then(Value::as_str).unwrap_or("");
            let index = body.get("chunk_index").and_then(Value::as_u64);
            let data = body
                .get("base64_data")
                .and_then(Value::as_str)
                .unwrap_or("");
            let partial = st
                .partial
                .get_mut(upload_id)
                .ok_or((BAD_UPLOAD, "unknown upload_id".to_owned()))?;
            let index = index
                .filter(|i| *i < partial.total_chunks)
                .ok_or((BAD_UPLOAD, "chunk_index out of range".to_owned()))?;
            let bytes = BASE64
                .decode(data)
                .map_err(|_| (BAD_UPLOAD, "base64_data is not base64".to_owned()))?;
            if bytes.is_empty() || bytes.len() > CHUNK_BYTES {
                return Err((BAD_UPLOAD, format!("a chunk of {} bytes", bytes.len())));
            }
            if partial.chunks.insert(index, bytes).is_some() {
                return Err((BAD_UPLOAD, format!("chunk {index} sent twice")));
            }
            Ok(None)
        }
        "aibot_upload_media_finish" => {
            let upload_id = body
                .get("upload_id")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            let partial = st
                .partial
                .remove(&upload_id)
                .ok_or((BAD_UPLOAD, "unknown upload_id".to_owned()))?;
            if partial.chunks.len() as u64 != partial.total_chunks {
                return Err((BAD_UPLOAD, "chunks are missing".into()));
            }
            let bytes: Vec<u8> = partial.chunks.into_values().flatten().collect();
            if bytes.len() as u64 != partial.total_size {
                return Err((BAD_UPLOAD, "the size does not match total_size".into()));
            }
            let digest = Md5::digest(&bytes);
            let md5: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            if md5 != partial.md5 {
                return Err((BAD_UPLOAD, "the md5 does not match".into()));
            }
            let media_id = format!("media{:05}", st.next);
            st.next += 1;
            st.uploads.push(Upload {
                kind: partial.kind.clone(),
                filename: partial.filename,
                bytes,
                media_id: media_id.clone(),
            });
            Ok(Some(json!({
                "type": partial.kind, "media_id": media_id, "created_at": "1700000000",
            })))
        }
        other => Err((BAD_MESSAGE, format!("unknown command {other}"))),
    }
}

/// The message type, its text and its media id, or why it cannot be sent.
fn check_message(
    st: &Book,
    body: &Value,
) -> Result<(String, String, Option<String>), (i64, String)> {
    let msgtype = body
        .get("msgtype")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let text_of = |path: &str| {
        body.pointer(path)
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    match msgtype.as_str() {
        "markdown" | "text" => {
            let text = text_of(&format!("/{msgtype}/content"))
                .filter(|t| !t.is_empty())
                .ok_or((BAD_MESSAGE, format!("{msgtype}.content is missing")))?;
            if text.len() > MAX_MARKDOWN_BYTES {
                return Err((BAD_MESSAGE, "the content is too long".into()));
            }
            Ok((msgtype, text, None))
        }
        "stream" => {
            let text = text_of("/stream/content").unwrap_or_default();
            if text_of("/stream/id").is_none_or(|id| id.is_empty()) {
                return Err((BAD_MESSAGE, "stream.id is missing".into()));
            }
            Ok((msgtype, text, None))
        }
        "image" | "video" | "file" => {
            let media_id = text_of(&format!("/{msgtype}/media_id"))
                .filter(|m| st.uploads.iter().any(|u| u.media_id == *m))
                .ok_or((BAD_MESSAGE, format!("{msgtype}.media_id names no upload")))?;
            Ok((msgtype, String::new(), Some(media_id)))
        }
        other => Err((BAD_MESSAGE, format!("unknown msgtype {other:?}"))),
    }
}
