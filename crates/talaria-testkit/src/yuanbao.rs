//! A fake Yuanbao (腾讯元宝) bot platform on 127.0.0.1: the sign-token
//! endpoint and the bot socket of protobuf frames, for adapter and
//! end-to-end tests.
//!
//! `POST /api/v5/robotLogic/sign-token` checks the app key, the nonce (32
//! hex characters, never seen before: a replayed request is refused), the
//! Beijing-time timestamp's shape and the signature, `hex(HMAC-SHA256(key
//! = app_secret, nonce + timestamp + app_key + app_secret))`, computed
//! here with the HMAC crate; it answers `{code: 0, data: {token, bot_id,
//! duration, product, source}}`, or a queued failure code (10099 asks the
//! client to retry).
//!
//! `/wss/connection` speaks `ConnMsg{head, data}` frames, binary. The
//! first request must be `auth-bind` (module `conn_access`) with a token
//! this fake issued and the bot's id; it answers code 0 (or a queued code,
//! such as 41103 for an expired token). Then: `ping` is answered (unless
//! the fake is told to go deaf), business requests of module
//! `yuanbao_openclaw_proxy` are recorded and answered by their `msg_id`
//! (`send_c2c_message`, `send_group_message`, the two heartbeats,
//! `query_group_info`, `get_group_member_list`), and pushes tests queue
//! go out as `inbound_message` with `need_ack`. A push stays pending until
//! its push-ack (cmd_type 3, same `msg_id`) arrives; pending ones are sent
//! again on the next connection. Tests can cut the connection or close it
//! with a code.
//!
//! `get_group_member_list` pages by `offset` and `limit` (at most 200),
//! as the platform does. Files (see `files`): resources users sent are
//! exchanged at `GET /api/resource/v1/download` (an issued token in
//! `X-Token`, else 401) for a direct address; `genUploadInfo` hands out a
//! location and temporary credentials, a stand-in COS takes the signed
//! `PUT`, and a sent image or file element must point at an upload taken.
//!
//! The message shapes are the fake's own prost structs (see `wire`),
//! written from the protocol sheet, not shared with the adapter.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post, put};
use hmac::{Hmac, Mac};
use prost::Message as _;
use serde_json::{Value, json};
use sha2::Sha256;
use tokio::sync::mpsc;

use crate::fake::{Core, Faults, bind, started};
use crate::json_response;

mod files;
pub mod wire;

pub use files::{CosPut, DownloadCall, SentMedia, cos_signature};
use wire::{ConnMsg, Head};

/// The bot's account id sign-token reports.
pub const BOT_ID: &str = "yb_bot_talaria";
/// The bot owner's account (may give commands in groups unmentioned).
pub const OWNER_ID: &str = "yb_owner";

/// One sign-token request, as received.
#[derive(Debug, Clone, PartialEq)]
pub struct SignRequest {
    /// The JSON body.
    pub body: Value,
    /// `X-Instance-Id`, `X-Route-Env`, ... (lower-cased names).
    pub headers: Vec<(String, String)>,
    /// The code answered (0 = a token was issued).
    pub code: i64,
}

/// One message the bot sent (`send_c2c_message` or `send_group_message`)
/// that the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// `direct:<account>` or `group:<group_code>`, as the adapter's chat
    /// ids spell it.
    pub chat: String,
    /// The text elements, joined.
    pub text: String,
    /// The quoted message (groups).
    pub ref_msg_id: Option<String>,
    /// The sender account given.
    pub from: String,
    /// The message's random value.
    pub random: String,
    /// Its image and file elements, each checked against the uploads.
    pub media: Vec<SentMedia>,
    /// When the fake received it.
    pub at: Instant,
}

/// One business request as it arrived (before failures and hangs).
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The command.
    pub cmd: String,
    /// The request id.
    pub msg_id: String,
    /// When it arrived.
    pub at: Instant,
}

/// One heartbeat the bot sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    /// The chat, as the adapter's chat ids spell it.
    pub chat: String,
    /// 1 RUNNING, 2 FINISH.
    pub beat: i32,
}

/// One auth-bind the fake received.
#[derive(Debug, Clone, PartialEq)]
pub struct Bind {
    /// The uid presented.
    pub uid: String,
    /// The token presented was issued here.
    pub known_token: bool,
    /// `env_name`.
    pub env_name: String,
    /// The code answered.
    pub code: i32,
}

#[derive(Debug, Clone)]
struct Push {
    id: String,
    data: Vec<u8>,
    acked: bool,
}

#[derive(Debug)]
enum Command {
    Frame(Vec<u8>),
    Drop,
    Close(u16),
}

#[derive(Default)]
struct Book {
    next: u64,
    tokens: Vec<String>,
    nonces: HashSet<String>,
    signs: Vec<SignRequest>,
    sign_failures: Faults<i64>,
    bind_failures: Faults<i32>,
    binds: Vec<Bind>,
    connections: usize,
    pushes: Vec<Push>,
    acks: Vec<String>,
    sent: Vec<Sent>,
    send_failures: Faults<i32>,
    heartbeats: Vec<Heartbeat>,
    pings: usize,
    deaf: bool,
    duration: u64,
    live: Option<mpsc::UnboundedSender<Command>>,
    /// Group members, by group code: (user id, nickname, role).
    members: Vec<(String, String, String, i32)>,
    /// Member-list pages asked for: (offset, limit).
    member_pages: Vec<(u32, u32)>,
    /// Resources and uploads.
    files: files::Files,
}

struct Shared {
    app_key: String,
    app_secret: String,
    addr: SocketAddr,
    core: Core<Book, Request>,
}

/// A fake Yuanbao (see the module docs).
pub struct FakeYuanbao {
    shared: Arc<Shared>,
}

impl Drop for FakeYuanbao {
    fn drop(&mut self) {
        self.shared.core.stop();
    }
}

impl FakeYuanbao {
    /// Starts the server on 127.0.0.1, accepting `app_key` signed with
    /// `app_secret`.
    ///
    /// # Panics
    /// When no local port can be bound (a broken test environment).
    pub async fn start(app_key: &str, app_secret: &str) -> FakeYuanbao {
        started("the fake Yuanbao", Self::try_start(app_key, app_secret))
    }

    /// Like [`Self::start`], returning the error instead of panicking.
    pub fn try_start(app_key: &str, app_secret: &str) -> std::io::Result<FakeYuanbao> {
        let (listener, addr) = bind()?;
        let shared = Arc::new(Shared {
            app_key: app_key.to_owned(),
            app_secret: app_secret.to_owned(),
            addr,
            core: Core::new(Book {
                next: 1,
                duration: 3600,
                ..Book::default()
            }),
        });
        let app = Router::new()
            .route("/api/v5/robotLogic/sign-token", post(sign_token))
            .route("/wss/connection", any(socket))
            .route("/api/resource/genUploadInfo", post(files::upload_info))
            .route("/api/resource/v1/download", get(files::download))
            .route("/yb-res/{id}", get(files::resource))
            .route("/yb-cdn/{n}", get(files::cdn))
            .route(
                "/yb-cos/{*rest}",
                put(files::cos_put).layer(DefaultBodyLimit::max(64 << 20)),
            )
            .with_state(shared.clone());
        shared.core.serve("fake-yuanbao", listener, app)?;
        Ok(FakeYuanbao { shared })
    }

    /// `http://127.0.0.1:PORT`: the API domain.
    pub fn api_domain(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// `ws://127.0.0.1:PORT/wss/connection`: the socket.
    pub fn ws_url(&self) -> String {
        format!("ws://{}/wss/connection", self.shared.addr)
    }

    /// Every sign-token request so far.
    pub fn sign_requests(&self) -> Vec<SignRequest> {
        self.shared.core.read().signs.clone()
    }

    /// The next sign-token requests answer these codes instead (10099:
    /// retry).
    pub fn fail_next_sign(&self, code: i64) {
        self.shared.core.change().sign_failures.push(code);
    }

    /// The life of the tokens issued from now on, in seconds.
    pub fn set_token_duration(&self, secs: u64) {
        self.shared.core.change().duration = secs;
    }

    /// The next auth-bind answers `code` (41103: the token expired).
    pub fn fail_next_bind(&self, code: i32) {
        self.shared.core.change().bind_failures.push(code);
    }

    /// Every auth-bind so far.
    pub fn binds(&self) -> Vec<Bind> {
        self.shared.core.read().binds.clone()
    }

    /// Connections bound so far.
    pub fn connections(&self) -> usize {
        self.shared.core.read().connections
    }

    /// Waits until `n` connections were bound in total.
    pub async fn wait_for_connection(&self, n: usize, timeout: Duration) {
        self.shared
            .core
            .wait(
                &format!("{n} bound connections"),
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

    /// While set, pings go unanswered (and are not counted).
    pub fn go_deaf(&self, deaf: bool) {
        self.shared.core.change().deaf = deaf;
    }

    /// Queues an `inbound_message` push carrying `push` (encoded), sent at
    /// once when a client is bound. Returns the push's id.
    pub fn push(&self, push: &wire::InboundMessagePush) -> String {
        let (id, frame) = {
            let mut st = self.shared.core.change();
            let id = format!("push-{:05}", st.next);
            st.next += 1;
            let data = push.encode_to_vec();
            st.pushes.push(Push {
                id: id.clone(),
                data: data.clone(),
                acked: false,
            });
            (id.clone(), push_frame(&id, data))
        };
        self.send(Command::Frame(frame));
        id
    }

    /// A fresh message id.
    pub fn next_msg_id(&self) -> String {
        let mut st = self.shared.core.change();
        let id = format!("msg-{:05}", st.next);
        st.next += 1;
        id
    }

    /// A DM from `from` saying `text`; returns its `msg_id`.
    pub fn push_dm(&self, from: &str, text: &str) -> String {
        let id = self.next_msg_id();
        self.push(&wire::dm(from, &id, text));
        id
    }

    /// A message from `from` in group `group_code`, @-mentioning the bot
    /// first when `mention`; returns its `msg_id`.
    pub fn push_group(&self, from: &str, group_code: &str, text: &str, mention: bool) -> String {
        let id = self.next_msg_id();
        let mut body = Vec::new();
        if mention {
            body.push(wire::mention(BOT_ID, "Talaria"));
        }
        body.push(wire::text(&format!(" {text}")));
        self.push(&wire::group(from, group_code, &id, body));
        id
    }

    /// Pushes frames for every push again (the same `msg_id`s): what the
    /// platform does when it thinks an ack was lost.
    pub fn redeliver_all(&self) {
        let frames: Vec<Vec<u8>> = self
            .shared
            .core
            .read()
            .pushes
            .iter()
            .map(|p| push_frame(&p.id, p.data.clone()))
            .collect();
        for f in frames {
            self.send(Command::Frame(f));
        }
    }

    /// Pushes not acknowledged yet.
    pub fn pending(&self) -> usize {
        self.shared
            .core
            .read()
            .pushes
            .iter()
            .filter(|p| !p.acked)
            .count()
    }

    /// Waits until every push was acknowledged.
    pub async fn wait_for_all_acked(&self, timeout: Duration) {
        self.shared
            .core
            .wait(
                "every push acknowledged",
                timeout,
                |b| b.pushes.iter().all(|p| p.acked).then_some(()),
                |b| {
                    b.pushes
                        .iter()
                        .filter(|p| !p.acked)
                        .map(|p| p.id.clone())
                        .collect::<Vec<_>>()
                },
            )
            .await;
    }

    /// Push-acks received, by push id.
    pub fn acks(&self) -> Vec<String> {
        self.shared.core.read().acks.clone()
    }

    /// Cuts the live connection.
    pub fn drop_connection(&self) {
        self.send(Command::Drop);
    }

    /// Closes the live connection with `code`.
    pub fn close_with(&self, code: u16) {
        self.send(Command::Close(code));
    }

    /// Whether a client is bound now.
    pub fn is_connected(&self) -> bool {
        self.shared.core.read().live.is_some()
    }

    /// The next message send answers `code` (non-zero: refused).
    pub fn fail_next_send(&self, code: i32) {
        self.shared.core.change().send_failures.push(code);
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

    /// Every message-send request as it arrived.
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

    /// Every business request as it arrived.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.core.requests()
    }

    /// Every heartbeat received.
    pub fn heartbeats(&self) -> Vec<Heartbeat> {
        self.shared.core.read().heartbeats.clone()
    }

    /// Waits until a heartbeat `probe` accepts arrived; returns them all.
    pub async fn wait_for_heartbeat(
        &self,
        timeout: Duration,
        probe: impl Fn(&Heartbeat) -> bool,
    ) -> Vec<Heartbeat> {
        self.shared
            .core
            .wait(
                "a heartbeat",
                timeout,
                |b| {
                    b.heartbeats
                        .iter()
                        .any(&probe)
                        .then(|| b.heartbeats.clone())
                },
                |b| b.heartbeats.clone(),
            )
            .await
    }

    /// Adds a member to `group_code` (for `get_group_member_list`).
    pub fn add_member(&self, group_code: &str, user_id: &str, nickname: &str, role: i32) {
        self.shared.core.change().members.push((
            group_code.to_owned(),
            user_id.to_owned(),
            nickname.to_owned(),
            role,
        ));
    }

    /// The member-list pages asked for so far: (offset, limit).
    pub fn member_pages(&self) -> Vec<(u32, u32)> {
        self.shared.core.read().member_pages.clone()
    }

    fn send(&self, command: Command) {
        let live = self.shared.core.read().live.clone();
        if let Some(live) = live {
            let _ = live.send(command);
        }
    }
}

fn is_message_send(cmd: &str) -> bool {
    matches!(cmd, "send_c2c_message" | "send_group_message")
}

fn push_frame(id: &str, data: Vec<u8>) -> Vec<u8> {
    ConnMsg {
        head: Some(Head {
            cmd_type: wire::PUSH,
            cmd: "inbound_message".into(),
            seq_no: 0,
            msg_id: id.to_owned(),
            module: wire::BIZ_MODULE.into(),
            need_ack: true,
            status: 0,
        }),
        data,
    }
    .encode_to_vec()
}

fn response(request: &Head, data: Vec<u8>) -> Vec<u8> {
    ConnMsg {
        head: Some(Head {
            cmd_type: wire::RESPONSE,
            cmd: request.cmd.clone(),
            seq_no: request.seq_no,
            msg_id: request.msg_id.clone(),
            module: request.module.clone(),
            need_ack: false,
            status: 0,
        }),
        data,
    }
    .encode_to_vec()
}

fn code(code: i32, message: &str) -> Vec<u8> {
    wire::CodeRsp {
        code,
        message: message.to_owned(),
    }
    .encode_to_vec()
}

/// `hex(HMAC-SHA256(secret, nonce + timestamp + key + secret))`.
fn expected_signature(key: &str, secret: &str, nonce: &str, timestamp: &str) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(format!("{nonce}{timestamp}{key}{secret}").as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `YYYY-MM-DDTHH:MM:SS+08:00`.
fn beijing_shaped(ts: &str) -> bool {
    let b = ts.as_bytes();
    b.len() == 25
        && ts.ends_with("+08:00")
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && [0..4, 5..7, 8..10, 11..13, 14..16, 17..19]
            .iter()
            .all(|r| b[r.clone()].iter().all(u8::is_ascii_digit))
}

async fn sign_token(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let field = |k: &str| body.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let (key, nonce, ts, sig) = (
        field("app_key"),
        field("nonce"),
        field("timestamp"),
        field("signature"),
    );
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let mut st = shared.core.change();
    let (code, msg) = if let Some(c) = st.sign_failures.take() {
        (c, "injected failure")
    } else if key != shared.app_key {
        (10002, "unknown app_key")
    } else if nonce.len() != 32 || !nonce.chars().all(|c| c.is_ascii_hexdigit()) {
        (10004, "bad nonce")
    } else if !beijing_shaped(&ts) {
        (10005, "bad timestamp")
    } else if sig != expected_signature(&key, &shared.app_secret, &nonce, &ts) {
        (10001, "signature mismatch")
    } else if !st.nonces.insert(nonce.clone()) {
        (10003, "nonce replayed")
    } else {
        (0, "ok")
    };
    st.signs.push(SignRequest {
        body: body.clone(),
        headers,
        code,
    });
    if code != 0 {
        return json_response(200, &json!({ "code": code, "msg": msg }));
    }
    let token = format!("tok-{:05}", st.next);
    st.next += 1;
    st.tokens.push(token.clone());
    let duration = st.duration;
    json_response(
        200,
        &json!({
            "code": 0, "msg": "ok",
            "data": {
                "token": token, "bot_id": BOT_ID, "duration": duration,
                "product": "yuanbao", "source": "bot",
            },
        }),
    )
}

async fn socket(State(shared): State<Arc<Shared>>, upgrade: WebSocketUpgrade) -> Response {
    upgrade
        .on_upgrade(move |ws| serve_socket(shared, ws))
        .into_response()
}

async fn serve_socket(shared: Arc<Shared>, mut ws: WebSocket) {
    // Nothing but an auth-bind is answered until one succeeds.
    loop {
        let frame = tokio::select! {
            () = shared.core.stopped() => return,
            f = ws.recv() => f,
        };
        let bytes = match frame {
            Some(Ok(Message::Binary(b))) => b,
            Some(Ok(_)) => continue,
            None | Some(Err(_)) => return,
        };
        let Ok(msg) = ConnMsg::decode(bytes.as_ref()) else {
            continue;
        };
        let head = msg.head.unwrap_or_default();
        if head.cmd_type != wire::REQUEST || head.cmd != "auth-bind" {
            continue;
        }
        let req = wire::AuthBindReq::decode(msg.data.as_slice()).unwrap_or_default();
        let auth = req.auth_info.unwrap_or_default();
        let (answer, bound) = {
            let mut st = shared.core.change();
            let known = st.tokens.contains(&auth.token);
            let c = if let Some(c) = st.bind_failures.take() {
                c
            } else if !known {
                41104
            } else if auth.uid != BOT_ID || req.biz_id != "ybBot" {
                41001
            } else {
                0
            };
            st.binds.push(Bind {
                uid: auth.uid.clone(),
                known_token: known,
                env_name: req.env_name.clone(),
                code: c,
            });
            (
                response(&head, code(c, if c == 0 { "ok" } else { "refused" })),
                c == 0,
            )
        };
        if ws.send(Message::Binary(answer.into())).await.is_err() {
            return;
        }
        if bound {
            break;
        }
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let resend = {
        let mut st = shared.core.change();
        st.connections += 1;
        st.live = Some(tx.clone());
        st.pushes
            .iter()
            .filter(|p| !p.acked)
            .map(|p| push_frame(&p.id, p.data.clone()))
            .collect::<Vec<_>>()
    };
    for f in resend {
        if ws.send(Message::Binary(f.into())).await.is_err() {
            break;
        }
    }
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    loop {
        tokio::select! {
            () = shared.core.stopped() => return,
            cmd = rx.recv() => match cmd {
                Some(Command::Frame(f)) => {
                    if ws.send(Message::Binary(f.into())).await.is_err() {
                        break;
                    }
                }
                Some(Command::Close(code)) => {
                    let _ = ws.send(Message::Close(Some(axum::extract::ws::CloseFrame {
                        code,
                        reason: "closed by the test".into(),
                    }))).await;
                    break;
                }
                Some(Command::Drop) | None => break,
            },
            out = out_rx.recv() => {
                if let Some(f) = out
                    && ws.send(Message::Binary(f.into())).await.is_err()
                {
                    break;
                }
            }
            frame = ws.recv() => match frame {
                Some(Ok(Message::Binary(b))) => on_client_frame(&shared, &b, &out_tx),
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    let mut st = shared.core.change();
    if st.live.as_ref().is_some_and(|l| l.same_channel(&tx)) {
        st.live = None;
    }
}

fn on_client_frame(shared: &Arc<Shared>, bytes: &[u8], out: &mpsc::UnboundedSender<Vec<u8>>) {
    let Ok(msg) = ConnMsg::decode(bytes) else {
        return;
    };
    let head = msg.head.unwrap_or_default();
    match head.cmd_type {
        wire::PUSH_ACK => {
            let mut st = shared.core.change();
            st.acks.push(head.msg_id.clone());
            if let Some(p) = st.pushes.iter_mut().find(|p| p.id == head.msg_id) {
                p.acked = true;
            }
        }
        wire::REQUEST if head.cmd == "ping" && head.module == wire::CONN_MODULE => {
            let mut st = shared.core.change();
            if st.deaf {
                return;
            }
            st.pings += 1;
            let _ = out.send(response(&head, Vec::new()));
        }
        wire::REQUEST if head.module == wire::BIZ_MODULE => {
            shared.core.record(Request {
                cmd: head.cmd.clone(),
                msg_id: head.msg_id.clone(),
                at: Instant::now(),
            });
            if is_message_send(&head.cmd) && shared.core.hanging() {
                // Neither answered nor delivered.
                return;
            }
            let answer = business(shared, &head.cmd, &msg.data);
            let _ = out.send(response(&head, answer));
        }
        _ => {}
    }
}

fn body_text(body: &[wire::MsgBodyElement]) -> String {
    body.iter()
        .filter(|e| e.msg_type == "TIMTextElem")
        .filter_map(|e| e.msg_content.as_ref().map(|c| c.text.clone()))
        .collect()
}

fn business(shared: &Arc<Shared>, cmd: &str, data: &[u8]) -> Vec<u8> {
    let mut st = shared.core.change();
    match cmd {
        "send_c2c_message" | "send_group_message" => {
            let sent = if cmd == "send_c2c_message" {
                let Ok(r) = wire::SendC2cMessageReq::decode(data) else {
                    return code(400, "malformed request");
                };
                let media = match files::sent_media(&st.files, &r.msg_body) {
                    Ok(m) => m,
                    Err(why) => return code(400, &why),
                };
                Sent {
                    chat: format!("direct:{}", r.to_account),
                    text: body_text(&r.msg_body),
                    ref_msg_id: None,
                    from: r.from_account,
                    random: r.msg_random.to_string(),
                    media,
                    at: Instant::now(),
                }
            } else {
                let Ok(r) = wire::SendGroupMessageReq::decode(data) else {
                    return code(400, "malformed request");
                };
                let media = match files::sent_media(&st.files, &r.msg_body) {
                    Ok(m) => m,
                    Err(why) => return code(400, &why),
                };
                Sent {
                    chat: format!("group:{}", r.group_code),
                    text: body_text(&r.msg_body),
                    ref_msg_id: Some(r.ref_msg_id).filter(|s| !s.is_empty()),
                    from: r.from_account,
                    random: r.random,
                    media,
                    at: Instant::now(),
                }
            };
            if let Some(c) = st.send_failures.take() {
                return code(c, "frequency limit");
            }
            if sent.from != BOT_ID {
                return code(403, "from_account is not the bot");
            }
            st.sent.push(sent);
            code(0, "ok")
        }
        "send_private_heartbeat" => {
            let Ok(r) = wire::PrivateHeartbeatReq::decode(data) else {
                return code(400, "malformed request");
            };
            st.heartbeats.push(Heartbeat {
                chat: format!("direct:{}", r.to_account),
                beat: r.heartbeat,
            });
            code(0, "ok")
        }
        "send_group_heartbeat" => {
            let Ok(r) = wire::GroupHeartbeatReq::decode(data) else {
                return code(400, "malformed request");
            };
            st.heartbeats.push(Heartbeat {
                chat: format!("group:{}", r.group_code),
                beat: r.heartbeat,
            });
            code(0, "ok")
        }
        "query_group_info" => {
            let Ok(r) = wire::GroupCodeReq::decode(data) else {
                return code(400, "malformed request");
            };
            let size = st.members.iter().filter(|m| m.0 == r.group_code).count();
            if size == 0 {
                return code(404, "no such group");
            }
            let owner = st
                .members
                .iter()
                .find(|m| m.0 == r.group_code && m.3 == 2)
                .cloned()
                .unwrap_or_default();
            wire::QueryGroupInfoRsp {
                code: 0,
                message: "ok".into(),
                group_info: Some(wire::GroupInfo {
                    group_name: format!("Pai {}", r.group_code),
                    group_owner_user_id: owner.1,
                    group_owner_nickname: owner.2,
                    group_size: size as i32,
                }),
            }
            .encode_to_vec()
        }
        "get_group_member_list" => {
            let Ok(r) = wire::GroupCodeReq::decode(data) else {
                return code(400, "malformed request");
            };
            st.member_pages.push((r.offset, r.limit));
            if r.limit == 0 || r.limit > 200 {
                return code(400, "limit must be 1 to 200");
            }
            let all: Vec<wire::Member> = st
                .members
                .iter()
                .filter(|m| m.0 == r.group_code)
                .map(|m| wire::Member {
                    user_id: m.1.clone(),
                    nickname: m.2.clone(),
                    role: m.3,
                    name_card: String::new(),
                })
                .collect();
            if all.is_empty() {
                return code(404, "no such group");
            }
            let start = (r.offset as usize).min(all.len());
            let end = (start + r.limit as usize).min(all.len());
            wire::GroupMemberListRsp {
                code: 0,
                message: "ok".into(),
                members: all[start..end].to_vec(),
                next_offset: end as u32,
                is_complete: end >= all.len(),
            }
            .encode_to_vec()
        }
        _ => code(404, "unknown command"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timestamp_shape_is_beijing_time_to_the_second() {
        assert!(beijing_shaped("2024-03-01T04:30:05+08:00"));
        assert!(!beijing_shaped("2024-03-01T04:30:05Z"));
        assert!(!beijing_shaped("2024-03-01T04:30:05.123+08:00"));
        assert!(!beijing_shaped("2024-03-01 04:30:05+08:00"));
    }
}
