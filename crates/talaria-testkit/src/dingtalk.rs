//! A fake DingTalk on 127.0.0.1: Stream mode (`connections/open` and the
//! WebSocket it hands a ticket for), session webhooks, the OpenAPI's
//! access token, robot send API and file downloads, and a custom robot
//! webhook that checks its signature.
//!
//! Built from DingTalk's documentation of the same endpoints:
//!
//! - `POST /v1.0/gateway/connections/open` checks `clientId` and
//!   `clientSecret` (a 401 error body otherwise) and that the robot topic
//!   is subscribed, and answers `{endpoint, ticket}`. The endpoint
//!   (`/connect`) takes each ticket once.
//! - Frames are JSON text with `type`, `headers` (`messageId`, `topic`,
//!   ...) and `data`, a JSON document as a string. A robot message stays
//!   pending until acknowledged with its `messageId` and code 200, and is
//!   sent again on the next connection. Tests can send `SYSTEM` frames
//!   (`ping`, whose acknowledgement must echo its data; `disconnect`,
//!   after which the server closes the socket), cut the connection or
//!   re-deliver a message under a new frame.
//! - Every conversation gets a session webhook (`/robot/sendBySession`)
//!   that expires; after expiry (or [`FakeDingTalk::expire_sessions`]) it
//!   answers an `errcode` other than 0.
//! - `POST /v1.0/oauth2/accessToken` issues tokens; the robot send API
//!   (`oToMessages/batchSend`, `groupMessages/send`) and
//!   `messageFiles/download` need one in `x-acs-dingtalk-access-token`.
//! - `POST /robot/send` is a custom robot: its `access_token` must match
//!   and, when a signing secret is set, `timestamp` (ms, within an hour)
//!   and `sign` (base64 of HMAC-SHA256 over `timestamp\nsecret`).
//! - Sends can be made to hang, or to be refused once as too fast
//!   (`errcode` 130101 on a webhook, HTTP 429 on the robot API).
//! - `POST /media/upload?access_token=&type=` (the old OpenAPI) takes one
//!   `multipart/form-data` file in the field `media`, as the documentation
//!   limits it: `image` JPG/GIF/PNG/BMP, `voice` AMR/MP3/WAV up to 2 MB,
//!   `video` MP4, `file` DOC(X)/XLS(X)/PPT(X)/ZIP/PDF/RAR, each else up to
//!   20 MB; it answers `{errcode: 0, type, media_id, created_at}`. The
//!   robot send API then takes `sampleImageMsg` (`photoURL`: an uploaded
//!   image's media id or an http(s) URL) and `sampleFile` (`mediaId` of an
//!   uploaded file, `fileName`, `fileType`).
//! - AI cards: `POST /v1.0/card/instances` (a `cardTemplateId`, a new
//!   `outTrackId`, `cardData.cardParamMap`), `POST
//!   /v1.0/card/instances/deliver` (an `openSpaceId` of
//!   `dtv1.card//IM_GROUP.<conversation>` with `imGroupOpenDeliverModel.robotCode`,
//!   or `dtv1.card//IM_ROBOT.<staff id>` with `imRobotOpenDeliverModel`)
//!   and `PUT /v1.0/card/streaming` (`outTrackId`, `guid`, `key`,
//!   `content`, `isFull`, `isFinalize`, `isError`), refused after the card
//!   was finalized.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::multipart::MultipartRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Multipart, Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post, put};
use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use tokio::sync::mpsc;

use crate::fake::{Core, Faults, bind, started};
use crate::json_response;

/// The robot message topic.
pub const BOT_TOPIC: &str = "/v1.0/im/bot/messages/get";
/// The robot's user id in conversations.
pub const BOT_USER_ID: &str = "$:LWCP_v1:$robot0000";
/// How long a session webhook lives (about ninety minutes, as DingTalk's).
const SESSION_LIFETIME_MS: i64 = 90 * 60 * 1000;

/// Which way a message reached the fake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A conversation's session webhook.
    Session,
    /// The robot send API.
    Robot,
    /// The custom robot webhook.
    Custom,
}

/// One message the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// How it came.
    pub via: Via,
    /// The conversation it went to (`custom` for the custom robot).
    pub conversation: String,
    /// `markdown` or `text`.
    pub msgtype: String,
    /// The markdown title, for markdown.
    pub title: Option<String>,
    /// The text (markdown source or plain).
    pub text: String,
    /// When it arrived.
    pub at: Instant,
}

/// Any HTTP request, logged when it arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The path, without the query.
    pub path: String,
    /// The JSON body (`null` when not JSON).
    pub body: Value,
    /// The access token header matched an issued token.
    pub authorized: bool,
    /// When it arrived.
    pub at: Instant,
}

/// An acknowledgement a client sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Ack {
    /// The `messageId` it names.
    pub message_id: String,
    /// Its `code`.
    pub code: i64,
    /// Its `data`, as sent.
    pub data: String,
}

/// A file uploaded to `media/upload`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    /// The `type` it was uploaded as: `image`, `voice`, `video`, `file`.
    pub kind: String,
    /// The file name of the `media` part.
    pub file_name: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// The media id given.
    pub media_id: String,
}

/// A file or image message the robot send API accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMessage {
    /// The conversation it went to.
    pub conversation: String,
    /// `sampleImageMsg` or `sampleFile`.
    pub msg_key: String,
    /// The media id (or the image URL) it named.
    pub media: String,
    /// `fileName`, for a file.
    pub file_name: Option<String>,
    /// `fileType`, for a file.
    pub file_type: Option<String>,
}

/// One `card/streaming` update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardUpdate {
    /// The content streamed.
    pub content: String,
    /// `isFull`.
    pub full: bool,
    /// `isFinalize`.
    pub finalize: bool,
    /// `isError`.
    pub error: bool,
}

/// An AI card instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Card {
    /// Its `outTrackId`.
    pub out_track_id: String,
    /// The template it was made from.
    pub template: String,
    /// The `openSpaceId` it was delivered to, once delivered.
    pub space: Option<String>,
    /// Its streamed updates, in order.
    pub updates: Vec<CardUpdate>,
}

impl Card {
    /// Whether an update finalized it.
    pub fn finalized(&self) -> bool {
        self.updates.iter().any(|u| u.finalize)
    }

    /// The content last streamed.
    pub fn content(&self) -> Option<&str> {
        self.updates.last().map(|u| u.content.as_str())
    }
}

/// A failure the next send takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendFault {
    /// "Sending too fast".
    TooFast,
}

#[derive(Debug)]
enum Command {
    Text(String),
    /// Close the socket politely (after a `disconnect`).
    Close,
    /// Cut it without a close frame.
    Drop,
}

#[derive(Debug, Clone)]
struct Frame {
    message_id: String,
    frame: Value,
    acked: bool,
    sent: u64,
    /// Robot messages are kept until acknowledged; system frames are not.
    keep: bool,
}

#[derive(Debug, Clone)]
struct Session {
    conversation: String,
    expires_ms: i64,
}

#[derive(Default)]
struct Book {
    next: u64,
    /// Issued tickets: whether each was used.
    tickets: HashMap<String, bool>,
    /// Rejected dials (a reused or unknown ticket).
    refused_dials: usize,
    connections: usize,
    live: Option<mpsc::UnboundedSender<Command>>,
    frames: Vec<Frame>,
    acks: Vec<Ack>,
    tokens: Vec<String>,
    sessions: HashMap<String, Session>,
    /// The session webhook of each conversation.
    session_of: HashMap<String, String>,
    /// The DM conversation of each staff id.
    dm_of: HashMap<String, String>,
    sent: Vec<Sent>,
    faults: Faults<SendFault>,
    files: HashMap<String, Vec<u8>>,
    downloads: usize,
    /// Session webhooks answer as expired from the start.
    sessions_expired: bool,
    uploads: Vec<Upload>,
    file_messages: Vec<FileMessage>,
    cards: Vec<Card>,
}

struct Shared {
    client_id: String,
    client_secret: String,
    custom_token: String,
    custom_secret: Option<String>,
    addr: SocketAddr,
    core: Core<Book, Request>,
}

/// The fake (see the module docs).
pub struct FakeDingTalk {
    shared: Arc<Shared>,
}

/// A message a user sends the robot.
#[derive(Debug, Clone)]
pub struct Incoming<'a> {
    /// The conversation id.
    pub conversation: &'a str,
    /// A group (`conversationType` 2) rather than a 1:1 chat.
    pub group: bool,
    /// The sender's staff id.
    pub staff_id: &'a str,
    /// Whether the robot is @mentioned (`isInAtList`).
    pub at_robot: bool,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The custom robot signature for `timestamp` (base64, not URL-encoded).
pub fn custom_robot_sign(secret: &str, timestamp: &str) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
    mac.update(format!("{timestamp}\n{secret}").as_bytes());
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

impl FakeDingTalk {
    /// Starts the fake for an app with these credentials; the custom robot
    /// takes `custom_token`, signed with `custom_secret` when given.
    ///
    /// # Panics
    /// When no local port can be bound.
    pub async fn start(
        client_id: &str,
        client_secret: &str,
        custom_token: &str,
        custom_secret: Option<&str>,
    ) -> FakeDingTalk {
        started(
            "the fake DingTalk",
            Self::try_start(client_id, client_secret, custom_token, custom_secret),
        )
    }

    /// Like [`Self::start`], returning the error instead of panicking.
    pub fn try_start(
        client_id: &str,
        client_secret: &str,
        custom_token: &str,
        custom_secret: Option<&str>,
    ) -> std::io::Result<FakeDingTalk> {
        let (listener, addr) = bind()?;
        let shared = Arc::new(Shared {
            client_id: client_id.to_owned(),
            client_secret: client_secret.to_owned(),
            custom_token: custom_token.to_owned(),
            custom_secret: custom_secret.map(str::to_owned),
            addr,
            core: Core::new(Book {
                next: 1,
                ..Book::default()
            }),
        });
        let app = Router::new()
            .route("/v1.0/gateway/connections/open", post(open))
            .route("/connect", any(connect))
            .route("/v1.0/oauth2/accessToken", post(access_token))
            .route("/v1.0/robot/{*method}", post(robot))
            .route("/robot/sendBySession", post(session_send))
            .route("/robot/send", post(custom_send))
            .route("/files/{code}", get(file))
            .route("/media/upload", post(media_upload))
            .route("/v1.0/card/instances", post(card_create))
            .route("/v1.0/card/instances/deliver", post(card_deliver))
            .route("/v1.0/card/streaming", put(card_stream))
            .with_state(shared.clone());
        shared.core.serve("fake-dingtalk", listener, app)?;
        Ok(FakeDingTalk { shared })
    }

    /// `http://127.0.0.1:PORT`: the OpenAPI root.
    pub fn api_base(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// The custom robot's webhook URL.
    pub fn custom_robot_url(&self) -> String {
        format!(
            "http://{}/robot/send?access_token={}",
            self.shared.addr, self.shared.custom_token
        )
    }

    /// Pushes a text message; returns its `msgId`.
    pub fn push_text(&self, from: &Incoming<'_>, text: &str) -> String {
        self.push_message(
            from,
            json!({ "msgtype": "text", "text": { "content": text } }),
        )
    }

    /// A file others can send: `downloadCode` for it.
    pub fn add_file(&self, bytes: &[u8]) -> String {
        let mut st = self.shared.core.change();
        let code = format!("dl-code-{}", st.next);
        st.next += 1;
        st.files.insert(code.clone(), bytes.to_vec());
        code
    }

    /// Pushes a message whose type-specific fields (`msgtype`, `text`,
    /// `content`) are `body`; returns its `msgId`.
    pub fn push_message(&self, from: &Incoming<'_>, body: Value) -> String {
        let data = {
            let mut st = self.shared.core.change();
            let n = st.next;
            st.next += 1;
            let msg_id = format!("msg{n:06}");
            let session = match st.session_of.get(from.conversation) {
                Some(s) => s.clone(),
                None => {
                    let s = format!("session-{n}-{}", from.conversation);
                    st.session_of
                        .insert(from.conversation.to_owned(), s.clone());
                    s
                }
            };
            let expires_ms = now_ms() + SESSION_LIFETIME_MS;
            let dead = st.sessions_expired;
            st.sessions.insert(
                session.clone(),
                Session {
                    conversation: from.conversation.to_owned(),
                    expires_ms: if dead { 0 } else { expires_ms },
                },
            );
            if !from.group {
                st.dm_of
                    .insert(from.staff_id.to_owned(), from.conversation.to_owned());
            }
            let mut data = json!({
                "msgId": msg_id,
                "conversationId": from.conversation,
                "conversationType": if from.group { "2" } else { "1" },
                "senderId": format!("$:LWCP_v1:${}", from.staff_id),
                "senderStaffId": from.staff_id,
                "senderNick": format!("Nick {}", from.staff_id),
                "senderCorpId": "dingcorp0001",
                "chatbotUserId": BOT_USER_ID,
                "chatbotCorpId": "dingcorp0001",
                "robotCode": self.shared.client_id,
                "isInAtList": from.at_robot,
                "isAdmin": false,
                "createAt": now_ms(),
                "sessionWebhook": format!("http://{}/robot/sendBySession?session={session}", self.shared.addr),
                "sessionWebhookExpiredTime": expires_ms,
            });
            if from.group {
                data["conversationTitle"] = json!("Team room");
                if from.at_robot {
                    data["atUsers"] = json!([{ "dingtalkId": BOT_USER_ID }]);
                }
            }
            if let (Some(d), Some(b)) = (data.as_object_mut(), body.as_object()) {
                for (k, v) in b {
                    d.insert(k.clone(), v.clone());
                }
            }
            data
        };
        let msg_id = data["msgId"].as_str().unwrap_or_default().to_owned();
        self.push_callback(&data);
        msg_id
    }

    /// Delivers the message data `data` in a new frame (a re-delivery when
    /// its `msgId` was seen before).
    pub fn push_callback(&self, data: &Value) {
        {
            let mut st = self.shared.core.change();
            let n = st.next;
            st.next += 1;
            let message_id = format!("frame-{n:06}");
            let frame = json!({
                "specVersion": "1.0",
                "type": "CALLBACK",
                "headers": {
                    "appId": "app-0001", "connectionId": format!("conn-{}", st.connections),
                    "contentType": "application/json", "messageId": message_id,
                    "time": now_ms().to_string(), "topic": BOT_TOPIC,
                },
                "data": data.to_string(),
            });
            st.frames.push(Frame {
                message_id,
                frame,
                acked: false,
                sent: 0,
                keep: true,
            });
        }
        self.flush();
    }

    /// Re-delivers the message `msg_id` exactly as first sent, in a new
    /// frame: what DingTalk does when it thinks a delivery was lost.
    pub fn redeliver(&self, msg_id: &str) {
        let data = self.shared.core.read().frames.iter().find_map(|f| {
            let data: Value = serde_json::from_str(f.frame["data"].as_str()?).ok()?;
            (data["msgId"] == msg_id).then_some(data)
        });
        if let Some(data) = data {
            self.push_callback(&data);
        }
    }

    /// Sends a `SYSTEM` `ping` with `opaque` in its data; returns the
    /// frame's `messageId`.
    pub fn send_ping(&self, opaque: &str) -> String {
        self.send_system("ping", &json!({ "opaque": opaque }).to_string())
    }

    /// Sends a `SYSTEM` `disconnect`, then closes the socket a moment
    /// later, as DingTalk does before it drops a connection.
    pub fn send_disconnect(&self) {
        self.send_system("disconnect", r#"{"reason":"server maintenance"}"#);
        let tx = self.shared.core.change().live.take();
        if let Some(tx) = tx {
            let _ = tx.send(Command::Close);
        }
    }

    fn send_system(&self, topic: &str, data: &str) -> String {
        let mut st = self.shared.core.change();
        let n = st.next;
        st.next += 1;
        let message_id = format!("sys-{n:06}");
        let frame = json!({
            "specVersion": "1.0", "type": "SYSTEM",
            "headers": {
                "contentType": "application/json", "messageId": message_id,
                "time": now_ms().to_string(), "topic": topic,
            },
            "data": data,
        });
        if let Some(tx) = &st.live {
            let _ = tx.send(Command::Text(frame.to_string()));
        }
        st.frames.push(Frame {
            message_id: message_id.clone(),
            frame,
            acked: false,
            sent: 1,
            keep: false,
        });
        message_id
    }

    /// Cuts the live connection without a close frame.
    pub fn drop_connection(&self) {
        if let Some(tx) = self.shared.core.change().live.take() {
            let _ = tx.send(Command::Drop);
        }
    }

    /// Makes every session webhook, issued or to come, answer as expired
    /// (those to come still say they live ninety minutes: what a client
    /// sees when its answer comes late, deterministically).
    pub fn expire_sessions(&self) {
        let mut st = self.shared.core.change();
        st.sessions_expired = true;
        for s in st.sessions.values_mut() {
            s.expires_ms = 0;
        }
    }

    /// The next send fails like this.
    pub fn fail_next_send(&self, fault: SendFault) {
        self.shared.core.change().faults.push(fault);
    }

    /// While set, sends are logged but hang and are never delivered.
    pub fn hang_sends(&self, hang: bool) {
        self.shared.core.set_hang(hang);
    }

    /// Every message accepted, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.core.read().sent.clone()
    }

    /// Every file uploaded so far.
    pub fn uploads(&self) -> Vec<Upload> {
        self.shared.core.read().uploads.clone()
    }

    /// Every image or file message accepted so far.
    pub fn file_messages(&self) -> Vec<FileMessage> {
        self.shared.core.read().file_messages.clone()
    }

    /// Waits until at least `n` image or file messages were accepted.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_file_messages(&self, n: usize, timeout: Duration) -> Vec<FileMessage> {
        self.shared
            .core
            .wait_len("file messages", n, timeout, |st| &st.file_messages)
            .await
    }

    /// Every AI card created so far.
    pub fn cards(&self) -> Vec<Card> {
        self.shared.core.read().cards.clone()
    }

    /// Waits until at least `n` cards were finalized; all cards then.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_finalized_cards(&self, n: usize, timeout: Duration) -> Vec<Card> {
        self.shared
            .core
            .wait(
                &format!("{n} finalized cards"),
                timeout,
                |st| {
                    (st.cards.iter().filter(|c| c.finalized()).count() >= n)
                        .then(|| st.cards.clone())
                },
                |st| st.cards.clone(),
            )
            .await
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.core.requests()
    }

    /// Every send request so far (webhooks and robot API), answered or not.
    pub fn send_attempts(&self) -> Vec<Request> {
        self.shared.core.requests_where(is_send)
    }

    /// Every acknowledgement received.
    pub fn acks(&self) -> Vec<Ack> {
        self.shared.core.read().acks.clone()
    }

    /// Robot message frames not acknowledged yet.
    pub fn pending(&self) -> usize {
        let st = self.shared.core.read();
        st.frames.iter().filter(|f| f.keep && !f.acked).count()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.core.read().connections
    }

    /// Dials refused for a missing, unknown or reused ticket.
    pub fn refused_dials(&self) -> usize {
        self.shared.core.read().refused_dials
    }

    /// How many times a file was fetched.
    pub fn downloads(&self) -> usize {
        self.shared.core.read().downloads
    }

    /// Waits until `n` messages were accepted.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_sent(&self, n: usize, timeout: Duration) -> Vec<Sent> {
        self.shared
            .core
            .wait_len("sent messages", n, timeout, |st| &st.sent)
            .await
    }

    /// Waits until `n` send requests arrived.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_send_attempts(&self, n: usize, timeout: Duration) -> Vec<Request> {
        self.shared
            .core
            .wait_requests("send requests", n, timeout, is_send)
            .await
    }

    /// Waits until the frame `message_id` was acknowledged; returns the ack.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_ack(&self, message_id: &str, timeout: Duration) -> Ack {
        let what = format!("an ack of {message_id}");
        self.shared
            .core
            .wait(
                &what,
                timeout,
                |st| st.acks.iter().find(|a| a.message_id == message_id).cloned(),
                |st| st.acks.clone(),
            )
            .await
    }

    /// Waits until every robot message frame is acknowledged.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_for_all_acked(&self, timeout: Duration) {
        self.shared
            .core
            .wait(
                "every robot message acknowledged",
                timeout,
                |st| st.frames.iter().all(|f| !f.keep || f.acked).then_some(()),
                |st| {
                    st.frames
                        .iter()
                        .filter(|f| f.keep && !f.acked)
                        .map(|f| f.message_id.clone())
                        .collect::<Vec<_>>()
                },
            )
            .await;
    }

    /// Waits until `n` connections were made and one is live.
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

    /// Sends frames never sent, when a client is live.
    fn flush(&self) {
        let mut st = self.shared.core.change();
        let Some(tx) = st.live.clone() else {
            return;
        };
        for f in st.frames.iter_mut().filter(|f| f.keep && f.sent == 0) {
            f.sent += 1;
            let _ = tx.send(Command::Text(f.frame.to_string()));
        }
    }

    /// Stops the server (also on drop).
    pub fn shutdown(&self) {
        self.shared.core.stop();
    }
}

impl Drop for FakeDingTalk {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn is_send(r: &Request) -> bool {
    matches!(
        r.path.as_str(),
        "/robot/sendBySession"
            | "/robot/send"
            | "/v1.0/robot/oToMessages/batchSend"
            | "/v1.0/robot/groupMessages/send"
    )
}

fn error(status: u16, code: &str, message: &str) -> Response {
    json_response(
        status,
        &json!({ "code": code, "message": message, "requestid": "req-fake" }),
    )
}

fn errcode(code: i64, message: &str) -> Response {
    json_response(200, &json!({ "errcode": code, "errmsg": message }))
}

fn log(shared: &Shared, path: &str, headers: &HeaderMap, body: &Bytes) -> (Value, bool) {
    let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let token = headers
        .get("x-acs-dingtalk-access-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let authorized = !token.is_empty() && shared.core.read().tokens.iter().any(|t| t == token);
    shared.core.record(Request {
        path: path.to_owned(),
        body: body.clone(),
        authorized,
        at: Instant::now(),
    });
    (body, authorized)
}

async fn open(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let (body, _) = log(&shared, "/v1.0/gateway/connections/open", &headers, &body);
    if body["clientId"] != shared.client_id.as_str()
        || body["clientSecret"] != shared.client_secret.as_str()
    {
        return error(
            401,
            "InvalidAuthentication",
            "clientId or clientSecret is wrong",
        );
    }
    let subscribed = body["subscriptions"].as_array().is_some_and(|subs| {
        subs.iter()
            .any(|s| s["type"] == "CALLBACK" && s["topic"] == BOT_TOPIC)
    });
    if !subscribed {
        return error(400, "InvalidParameter", "subscriptions must name a topic");
    }
    let mut st = shared.core.change();
    let ticket = format!("ticket-{}-{}", st.next, now_ms());
    st.next += 1;
    st.tickets.insert(ticket.clone(), false);
    json_response(
        200,
        &json!({ "endpoint": format!("ws://{}/connect", shared.addr), "ticket": ticket }),
    )
}

async fn connect(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let fresh = {
        let mut st = shared.core.change();
        let ticket = query.get("ticket").cloned().unwrap_or_default();
        match st.tickets.get_mut(&ticket) {
            Some(used) if !*used => {
                *used = true;
                true
            }
            _ => {
                st.refused_dials += 1;
                false
            }
        }
    };
    if !fresh {
        return error(401, "InvalidTicket", "the ticket is unknown or was used");
    }
    upgrade
        .on_upgrade(move |ws| serve_socket(shared, ws))
        .into_response()
}

async fn serve_socket(shared: Arc<Shared>, mut ws: WebSocket) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let resend = {
        let mut st = shared.core.change();
        st.connections += 1;
        st.live = Some(tx.clone());
        let mut out = Vec::new();
        for f in st.frames.iter_mut().filter(|f| f.keep && !f.acked) {
            f.sent += 1;
            out.push(f.frame.to_string());
        }
        out
    };
    for f in resend {
        let _ = tx.send(Command::Text(f));
    }
    loop {
        tokio::select! {
            () = shared.core.stopped() => return,
            cmd = rx.recv() => match cmd {
                Some(Command::Text(t)) => {
                    if ws.send(Message::Text(t.into())).await.is_err() {
                        break;
                    }
                }
                Some(Command::Close) => {
                    let _ = ws.send(Message::Close(None)).await;
                    break;
                }
                Some(Command::Drop) | None => break,
            },
            frame = ws.recv() => match frame {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break,
                Some(Ok(Message::Text(t))) => {
                    let live = shared.core.read().live.as_ref().is_some_and(|l| l.same_channel(&tx));
                    if live {
                        on_ack(&shared, t.as_str());
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

fn on_ack(shared: &Shared, text: &str) {
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        return;
    };
    let Some(id) = v.pointer("/headers/messageId").and_then(Value::as_str) else {
        return;
    };
    let code = v["code"].as_i64().unwrap_or(0);
    let data = v["data"].as_str().unwrap_or("").to_owned();
    let mut st = shared.core.change();
    st.acks.push(Ack {
        message_id: id.to_owned(),
        code,
        data,
    });
    if code == 200
        && let Some(f) = st.frames.iter_mut().find(|f| f.message_id == id)
    {
        f.acked = true;
    }
}

async fn access_token(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (body, _) = log(&shared, "/v1.0/oauth2/accessToken", &headers, &body);
    if body["appKey"] != shared.client_id.as_str()
        || body["appSecret"] != shared.client_secret.as_str()
    {
        return error(400, "invalidClientId", "appKey or appSecret is wrong");
    }
    let mut st = shared.core.change();
    let token = format!("at-{}-{}", st.next, now_ms());
    st.next += 1;
    st.tokens.push(token.clone());
    json_response(200, &json!({ "accessToken": token, "expireIn": 7200 }))
}

/// A message body's (msgtype, title, text).
fn read_body(msgtype: &str, fields: &Value) -> Option<(String, Option<String>, String)> {
    match msgtype {
        "markdown" | "sampleMarkdown" => Some((
            "markdown".into(),
            fields["title"].as_str().map(str::to_owned),
            fields["text"].as_str()?.to_owned(),
        )),
        "text" | "sampleText" => {
            Some(("text".into(), None, fields["content"].as_str()?.to_owned()))
        }
        _ => None,
    }
}

/// Holds a hung send, or takes the next fault; `Some` answers at once.
async fn gate(shared: &Shared, hung: bool, webhook: bool) -> Option<Response> {
    if hung {
        shared.core.held().await;
        return Some(json_response(502, &json!({})));
    }
    let fault = shared.core.change().faults.take();
    match fault {
        Some(SendFault::TooFast) if webhook => Some(errcode(130101, "send too fast")),
        Some(SendFault::TooFast) => Some(error(429, "Throttling", "send too fast")),
        None => None,
    }
}

fn accept(shared: &Shared, via: Via, conversation: &str, parsed: (String, Option<String>, String)) {
    shared.core.change().sent.push(Sent {
        via,
        conversation: conversation.to_owned(),
        msgtype: parsed.0,
        title: parsed.1,
        text: parsed.2,
        at: Instant::now(),
    });
}

async fn session_send(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let hung = shared.core.hanging();
    let (body, _) = log(&shared, "/robot/sendBySession", &headers, &body);
    if let Some(r) = gate(&shared, hung, true).await {
        return r;
    }
    let session = query.get("session").cloned().unwrap_or_default();
    let Some(s) = shared.core.read().sessions.get(&session).cloned() else {
        return errcode(300001, "invalid session");
    };
    if s.expires_ms <= now_ms() {
        return errcode(300001, "session webhook expired");
    }
    let msgtype = body["msgtype"].as_str().unwrap_or("");
    let Some(parsed) = read_body(msgtype, &body[msgtype]) else {
        return errcode(40035, "missing or unknown msgtype");
    };
    accept(&shared, Via::Session, &s.conversation, parsed);
    errcode(0, "ok")
}

async fn custom_send(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let hung = shared.core.hanging();
    let (body, _) = log(&shared, "/robot/send", &headers, &body);
    if query.get("access_token") != Some(&shared.custom_token) {
        return errcode(300001, "token is not exist");
    }
    if let Some(secret) = &shared.custom_secret {
        let timestamp = query.get("timestamp").cloned().unwrap_or_default();
        let fresh = timestamp
            .parse::<i64>()
            .is_ok_and(|t| (now_ms() - t).abs() <= 3_600_000);
        if !fresh {
            return errcode(310000, "timestamp is not within an hour");
        }
        if query.get("sign") != Some(&custom_robot_sign(secret, &timestamp)) {
            return errcode(310000, "sign not match");
        }
    }
    if let Some(r) = gate(&shared, hung, true).await {
        return r;
    }
    let msgtype = body["msgtype"].as_str().unwrap_or("");
    let Some(parsed) = read_body(msgtype, &body[msgtype]) else {
        return errcode(40035, "missing or unknown msgtype");
    };
    accept(&shared, Via::Custom, "custom", parsed);
    errcode(0, "ok")
}

async fn robot(
    State(shared): State<Arc<Shared>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let hung = shared.core.hanging();
    let path = format!("/v1.0/robot/{method}");
    let (body, authorized) = log(&shared, &path, &headers, &body);
    if !authorized {
        return error(
            401,
            "InvalidAuthentication",
            "the access token is missing or wrong",
        );
    }
    if body["robotCode"] != shared.client_id.as_str() {
        return error(
            400,
            "invalidParameter.robotCode",
            "robotCode does not exist",
        );
    }
    if method == "messageFiles/download" {
        let code = body["downloadCode"].as_str().unwrap_or("");
        if !shared.core.read().files.contains_key(code) {
            return error(
                400,
                "invalidParameter.downloadCode",
                "downloadCode is invalid",
            );
        }
        return json_response(
            200,
            &json!({ "downloadUrl": format!("http://{}/files/{code}", shared.addr) }),
        );
    }
    let conversation = match method.as_str() {
        "oToMessages/batchSend" => {
            let users = body["userIds"].as_array().cloned().unwrap_or_default();
            let st = shared.core.read();
            let found = users
                .first()
                .and_then(Value::as_str)
                .and_then(|u| st.dm_of.get(u).cloned());
            match (users.len(), found) {
                (1..=20, Some(c)) => c,
                _ => return error(400, "invalidParameter.userIds", "userIds are invalid"),
            }
        }
        "groupMessages/send" => match body["openConversationId"].as_str() {
            Some(c) if shared.core.read().session_of.contains_key(c) => c.to_owned(),
            _ => {
                return error(
                    400,
                    "invalidParameter.openConversationId",
                    "unknown conversation",
                );
            }
        },
        _ => return error(404, "NotFound", "no such API"),
    };
    if let Some(r) = gate(&shared, hung, false).await {
        return r;
    }
    let key = body["msgKey"].as_str().unwrap_or("");
    let param: Value = body["msgParam"]
        .as_str()
        .and_then(|p| serde_json::from_str(p).ok())
        .unwrap_or(Value::Null);
    let file = {
        let st = shared.core.read();
        file_message(&st, key, &param, &conversation)
    };
    match file {
        Some(Ok(message)) => {
            shared.core.change().file_messages.push(message);
            return json_response(
                200,
                &json!({ "processQueryKey": format!("pqk-{}", now_ms()) }),
            );
        }
        Some(Err(why)) => return error(400, "invalidParameter.msgParam", why),
        None => {}
    }
    let Some(parsed) = read_body(key, &param) else {
        return error(
            400,
            "invalidParameter.msgParam",
            "msgKey or msgParam is invalid",
        );
    };
    accept(&shared, Via::Robot, &conversation, parsed);
    json_response(
        200,
        &json!({ "processQueryKey": format!("pqk-{}", now_ms()) }),
    )
}

/// An image or file message's fields, checked against the uploads;
/// `None` for other message keys.
fn file_message(
    st: &Book,
    key: &str,
    param: &Value,
    conversation: &str,
) -> Option<Result<FileMessage, &'static str>> {
    let uploaded = |id: &str, kind: &[&str]| {
        st.uploads
            .iter()
            .any(|u| u.media_id == id && kind.contains(&u.kind.as_str()))
    };
    let checked = match key {
        "sampleImageMsg" => match param["photoURL"].as_str() {
            Some(p) if p.starts_with("http://") || p.starts_with("https://") => Ok((p, None, None)),
            Some(p) if uploaded(p, &["image"]) => Ok((p, None, None)),
            _ => Err("photoURL is neither an image URL nor an uploaded image's media id"),
        },
        "sampleFile" => {
            let id = param["mediaId"].as_str().unwrap_or("");
            let name = param["fileName"].as_str().filter(|n| !n.is_empty());
            let kind = param["fileType"].as_str().filter(|t| !t.is_empty());
            match (
                uploaded(id, &["file", "image", "voice", "video"]),
                name,
                kind,
            ) {
                (true, Some(n), Some(t)) => Ok((id, Some(n), Some(t))),
                (false, ..) => Err("mediaId is not an uploaded file"),
                _ => Err("sampleFile needs fileName and fileType"),
            }
        }
        _ => return None,
    };
    Some(checked.map(|(media, name, kind)| FileMessage {
        conversation: conversation.to_owned(),
        msg_key: key.to_owned(),
        media: media.to_owned(),
        file_name: name.map(str::to_owned),
        file_type: kind.map(str::to_owned),
    }))
}

/// The formats and largest size each upload `type` takes.
fn upload_rule(kind: &str) -> Option<(&'static [&'static str], usize)> {
    const MB: usize = 1024 * 1024;
    match kind {
        "image" => Some((&["jpg", "jpeg", "gif", "png", "bmp"], 20 * MB)),
        "voice" => Some((&["amr", "mp3", "wav"], 2 * MB)),
        "video" => Some((&["mp4"], 20 * MB)),
        "file" => Some((
            &[
                "doc", "docx", "xls", "xlsx", "ppt", "pptx", "zip", "pdf", "rar",
            ],
            20 * MB,
        )),
        _ => None,
    }
}

async fn media_upload(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    multipart: Result<Multipart, MultipartRejection>,
) -> Response {
    let token = query.get("access_token").cloned().unwrap_or_default();
    let authorized = !token.is_empty() && shared.core.read().tokens.contains(&token);
    shared.core.record(Request {
        path: "/media/upload".into(),
        body: Value::Null,
        authorized,
        at: Instant::now(),
    });
    if !authorized {
        return errcode(40014, "invalid access_token");
    }
    let Ok(mut multipart) = multipart else {
        return errcode(40035, "not a multipart/form-data body");
    };
    let mut kind = query.get("type").cloned();
    let mut media: Option<(String, Vec<u8>)> = None;
    loop {
        let field = match multipart.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(_) => return errcode(40035, "unreadable multipart body"),
        };
        match field.name().unwrap_or("") {
            "type" => kind = field.text().await.ok(),
            "media" => {
                let name = field.file_name().unwrap_or("").to_owned();
                match field.bytes().await {
                    Ok(b) => media = Some((name, b.to_vec())),
                    Err(_) => return errcode(40035, "unreadable media"),
                }
            }
            _ => {}
        }
    }
    let kind = kind.unwrap_or_default();
    let Some((formats, max)) = upload_rule(&kind) else {
        return errcode(40004, "invalid media type");
    };
    let Some((file_name, bytes)) = media.filter(|(n, _)| !n.is_empty()) else {
        return errcode(41001, "missing media with a filename");
    };
    let ext = file_name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    if !formats.contains(&ext.as_str()) {
        return errcode(40005, "invalid file type");
    }
    if bytes.is_empty() || bytes.len() > max {
        return errcode(40006, "invalid file size");
    }
    let mut st = shared.core.change();
    let media_id = format!("@lAD{}_{kind}", st.next);
    st.next += 1;
    st.uploads.push(Upload {
        kind: kind.clone(),
        file_name,
        bytes,
        media_id: media_id.clone(),
    });
    json_response(
        200,
        &json!({
            "errcode": 0, "errmsg": "ok", "type": kind,
            "media_id": media_id, "created_at": now_ms(),
        }),
    )
}

async fn card_create(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (body, authorized) = log(&shared, "/v1.0/card/instances", &headers, &body);
    if !authorized {
        return error(
            401,
            "InvalidAuthentication",
            "the access token is missing or wrong",
        );
    }
    let template = body["cardTemplateId"].as_str().unwrap_or("");
    let id = body["outTrackId"].as_str().unwrap_or("");
    if template.is_empty() || id.is_empty() || !body["cardData"]["cardParamMap"].is_object() {
        return error(
            400,
            "invalidParameter",
            "cardTemplateId, outTrackId and cardData.cardParamMap are required",
        );
    }
    let mut st = shared.core.change();
    if st.cards.iter().any(|c| c.out_track_id == id) {
        return error(
            400,
            "invalidParameter.outTrackId",
            "outTrackId already exists",
        );
    }
    st.cards.push(Card {
        out_track_id: id.to_owned(),
        template: template.to_owned(),
        space: None,
        updates: Vec::new(),
    });
    json_response(200, &json!({ "success": true, "result": id }))
}

async fn card_deliver(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (body, authorized) = log(&shared, "/v1.0/card/instances/deliver", &headers, &body);
    if !authorized {
        return error(
            401,
            "InvalidAuthentication",
            "the access token is missing or wrong",
        );
    }
    let id = body["outTrackId"].as_str().unwrap_or("");
    let space = body["openSpaceId"].as_str().unwrap_or("");
    let mut st = shared.core.change();
    let reachable = if let Some(group) = space.strip_prefix("dtv1.card//IM_GROUP.") {
        st.session_of.contains_key(group)
            && body["imGroupOpenDeliverModel"]["robotCode"] == shared.client_id.as_str()
    } else if let Some(staff) = space.strip_prefix("dtv1.card//IM_ROBOT.") {
        st.dm_of.contains_key(staff) && body["imRobotOpenDeliverModel"].is_object()
    } else {
        false
    };
    if !reachable {
        return error(
            400,
            "invalidParameter.openSpaceId",
            "openSpaceId or its deliver model is invalid",
        );
    }
    let Some(card) = st.cards.iter_mut().find(|c| c.out_track_id == id) else {
        return error(
            400,
            "invalidParameter.outTrackId",
            "no card with this outTrackId",
        );
    };
    card.space = Some(space.to_owned());
    json_response(
        200,
        &json!({ "success": true, "result": [{ "spaceId": space, "success": true }] }),
    )
}

async fn card_stream(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (body, authorized) = log(&shared, "/v1.0/card/streaming", &headers, &body);
    if !authorized {
        return error(
            401,
            "InvalidAuthentication",
            "the access token is missing or wrong",
        );
    }
    let id = body["outTrackId"].as_str().unwrap_or("");
    let guid = body["guid"].as_str().unwrap_or("");
    let (Some(key), Some(content)) = (body["key"].as_str(), body["content"].as_str()) else {
        return error(400, "invalidParameter", "key and content are required");
    };
    if guid.is_empty() || key != "content" {
        return error(
            400,
            "invalidParameter",
            "a guid and the template's variable are required",
        );
    }
    let mut st = shared.core.change();
    let Some(card) = st.cards.iter_mut().find(|c| c.out_track_id == id) else {
        return error(
            400,
            "invalidParameter.outTrackId",
            "no card with this outTrackId",
        );
    };
    if card.space.is_none() {
        return error(
            400,
            "invalidParameter.outTrackId",
            "the card was not delivered",
        );
    }
    if card.finalized() {
        return error(400, "cardFinalized", "the card's stream was finalized");
    }
    card.updates.push(CardUpdate {
        content: content.to_owned(),
        full: body["isFull"].as_bool().unwrap_or(false),
        finalize: body["isFinalize"].as_bool().unwrap_or(false),
        error: body["isError"].as_bool().unwrap_or(false),
    });
    json_response(200, &json!({ "success": true }))
}

async fn file(State(shared): State<Arc<Shared>>, Path(code): Path<String>) -> Response {
    let mut st = shared.core.change();
    let Some(bytes) = st.files.get(&code).cloned() else {
        return json_response(404, &json!({}));
    };
    st.downloads += 1;
    drop(st);
    bytes.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn post(url: &str, body: Value) -> (u16, Value) {
        let r = reqwest::Client::new()
            .post(url)
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    #[tokio::test]
    async fn open_checks_the_credentials_and_the_subscription() {
        let fake = FakeDingTalk::start("id", "secret", "tok", None).await;
        let url = format!("{}/v1.0/gateway/connections/open", fake.api_base());
        let subs = json!([{ "type": "CALLBACK", "topic": BOT_TOPIC }]);
        let (status, _) = post(
            &url,
            json!({ "clientId": "id", "clientSecret": "nope", "subscriptions": subs }),
        )
        .await;
        assert_eq!(status, 401);
        let (status, _) = post(
            &url,
            json!({ "clientId": "id", "clientSecret": "secret", "subscriptions": [] }),
        )
        .await;
        assert_eq!(status, 400);
        let (status, answer) = post(
            &url,
            json!({ "clientId": "id", "clientSecret": "secret", "subscriptions": subs }),
        )
        .await;
        assert_eq!(status, 200);
        assert!(answer["endpoint"].as_str().unwrap().starts_with("ws://"));
        assert!(answer["ticket"].as_str().is_some_and(|t| !t.is_empty()));
    }

    #[tokio::test]
    async fn the_custom_robot_checks_a_python_computed_signature() {
        // base64.b64encode(hmac.new(b"SECx", b"1700000000000\nSECx",
        // hashlib.sha256).digest()), computed with Python's standard library.
        assert_eq!(
            custom_robot_sign("SECx", "1700000000000"),
            "rgcjbH+yFyES+S0llX+cAPCwVRpsr7sbiX5Lnyo/ocU="
        );
        let fake = FakeDingTalk::start("id", "secret", "tok", Some("SECx")).await;
        let body = json!({ "msgtype": "text", "text": { "content": "hi" } });
        let now = now_ms().to_string();
        let sign = custom_robot_sign("SECx", &now);
        let mut url = reqwest::Url::parse(&fake.custom_robot_url()).unwrap();
        url.query_pairs_mut()
            .append_pair("timestamp", &now)
            .append_pair("sign", &sign);
        let (_, ok) = post(url.as_str(), body.clone()).await;
        assert_eq!(ok["errcode"], 0);
        let (_, tampered) = post(
            &format!("{}&timestamp={now}&sign=AAAA", fake.custom_robot_url()),
            body,
        )
        .await;
        assert_eq!(tampered["errcode"], 310000);
        assert_eq!(fake.sent().len(), 1);
    }
}
