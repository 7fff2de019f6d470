//! WeCom's intelligent robot (智能机器人) in API mode over the long
//! connection (platform `wecom`).
//!
//! [`WecomBotAdapter::run`] opens WeCom's WebSocket, subscribes with the
//! robot's id and secret (`aibot_subscribe`) and then keeps it alive with
//! a `ping` every 30 s; two unanswered pings, and the connection is given
//! up for the supervisor to rebuild (and subscribe again). Every frame is
//! JSON: `{cmd, headers: {req_id}, body}`; WeCom answers a request with
//! the same `req_id`, no `cmd`, and an `errcode`.
//!
//! Inbound, `aibot_msg_callback` carries one message: text, a voice
//! message's transcript, images and files (each with its own `aeskey`,
//! fetched and decrypted when the turn runs), or a mix. Groups deliver
//! only messages that @mention the robot, so a mention is inherent; the
//! leading `@name` is stripped. Repeats are dropped by `msgid`.
//! `aibot_event_callback` brings `enter_chat` (answered with the
//! configured welcome, if any) and `disconnected_event`: another client
//! subscribed the same robot and WeCom handed it the connection. The
//! adapter then stops for good (shown in `gateway status`) rather than
//! fight over the robot; a restart takes it back.
//!
//! Outbound, an answer is bound to the message it answers:
//! `aibot_respond_msg` carries that message frame's `req_id` (markdown).
//! A DM with no live `req_id` (after a reconnect or a restart, or a
//! scheduled job) goes proactively with `aibot_send_msg`; a robot cannot
//! start a group conversation, so a group is answered only through the
//! last message it sent on this connection, and otherwise the send is
//! refused for the ledger to record. Files are uploaded on the socket in
//! three steps (`aibot_upload_media_init`, `_chunk` of 512 KiB, `_finish`,
//! named by the file's MD5) and sent as an image, video or file message.
//!
//! # Layout
//!
//! - this file: settings, the connection, sending.
//! - `inbound`: message callbacks as events, the DM and group policies.
//! - `media`: files decrypted as they stream in, and the upload's chunks.
//! - `config`: the section and its environment variables.

mod config;
mod inbound;
mod media;

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Capabilities, Download, DownloadError, LengthUnit,
    Liveness, Markup, MediaKind, MessageLimits, OutboundFile, OutboundMessage, SendError,
    SentMessage,
};
use talaria_core::config::{secret_or_env, text_or_env};
use talaria_core::{Env, Secret};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

use super::crypto::Key;
use crate::registry::{BuildError, Built, Platform, Setup};
use crate::ws;
use inbound::{Inbound, parse_locator};
use media::{Decrypting, Upload};

pub use crate::access::{Access, Policy};
pub use config::{ENV, WecomBotConfig};

/// The platform name in session keys, allowlists (`WECOM_ALLOWED_USERS`)
/// and targets.
pub const PLATFORM: &str = "wecom";

/// The longest message sent, in characters: the ancestor's cut. WeCom's
/// own cap on markdown is about 20 KB, which 4,000 characters fit even
/// when each is three bytes of CJK.
pub const MAX_MESSAGE_LEN: usize = 4_000;

/// WeCom's "API frequency out of limit".
const TOO_FAST: i64 = 45_009;

/// WeCom's "system busy, try again".
const BUSY: i64 = -1;

/// Retries after "too fast" before a send reports rate limiting.
const RATE_LIMIT_RETRIES: u32 = 3;

/// Message ids remembered to drop repeats.
const SEEN_CAPACITY: usize = 1000;

/// Chats whose live `req_id` (and kind) is held in memory.
const CHAT_CAPACITY: usize = 1000;

/// Requests awaiting WeCom's answer at once.
const MAX_PENDING: usize = 256;

/// How long opening the WebSocket may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a file download may take.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(120);

/// What the adapter needs, resolved from `platforms.wecom` and the
/// environment.
#[derive(Debug, Clone)]
pub struct WecomBotSettings {
    /// The robot's Bot ID.
    pub bot_id: String,
    /// The long-connection secret. Never logged.
    pub secret: Secret,
    /// The long connection's address.
    pub websocket_url: String,
    /// The DM and group policies.
    pub access: Access,
    /// Hosts files may be fetched from.
    pub media_hosts: Vec<String>,
    /// Said on `enter_chat`.
    pub welcome: Option<String>,
    /// Time between pings.
    pub ping_interval: Duration,
    /// How long a request waits for its answer.
    pub request_timeout: Duration,
    /// The wait after "too fast".
    pub rate_limit_wait: Duration,
}

fn policy(configured: &str, env: &Env, var: &str) -> Result<Policy, WecomBotError> {
    let name = env.get(var).unwrap_or(configured);
    Policy::parse(name).ok_or_else(|| WecomBotError::BadPolicy(var.to_owned(), name.to_owned()))
}

impl WecomBotSettings {
    /// Settings from `platforms.wecom` and the environment; `Ok(None)`
    /// when the robot is off (`enabled: false`, or the bot id or secret
    /// missing from both the file and the environment).
    pub fn from_config(
        config: &WecomBotConfig,
        env: &Env,
    ) -> Result<Option<WecomBotSettings>, WecomBotError> {
        if config.enabled == Some(false) {
            return Ok(None);
        }
        let id = text_or_env(config.bot_id.as_deref(), env, "WECOM_BOT_ID");
        let secret = secret_or_env(config.secret.as_ref(), env, "WECOM_SECRET");
        let (Some(bot_id), Some(secret)) = (id.clone(), secret.clone()) else {
            if config.enabled == Some(true) || id.is_some() || secret.is_some() {
                tracing::warn!(
                    "the WeCom robot needs both WECOM_BOT_ID and WECOM_SECRET (or \
                     platforms.wecom.bot_id / secret); it stays off"
                );
            }
            return Ok(None);
        };
        let allowed_users = env
            .get("WECOM_ALLOWED_USERS")
            .unwrap_or("")
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        let access = Access {
            dm: policy(&config.dm_policy, env, "WECOM_DM_POLICY")?,
            dm_allow_from: allowed_users,
            allow_all: env.flag("WECOM_ALLOW_ALL_USERS").unwrap_or(false),
            group: policy(&config.group_policy, env, "WECOM_GROUP_POLICY")?,
            group_allow_from: config
                .group_allow_from
                .iter()
                .map(|g| g.trim().to_owned())
                .collect(),
        };
        Ok(Some(WecomBotSettings {
            bot_id: bot_id.trim().to_owned(),
            secret: Secret::new(secret.expose().trim()),
            websocket_url: env
                .get("WECOM_WEBSOCKET_URL")
                .unwrap_or(&config.websocket_url)
                .trim()
                .to_owned(),
            access,
            media_hosts: config
                .media_hosts
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .collect(),
            welcome: config.welcome.clone().filter(|w| !w.trim().is_empty()),
            ping_interval: Duration::from_millis(config.ping_interval_ms.max(1)),
            request_timeout: Duration::from_millis(config.request_timeout_ms.max(1)),
            rate_limit_wait: Duration::from_millis(config.rate_limit_wait_ms),
        }))
    }
}

/// Why the adapter could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WecomBotError {
    /// The bot id or secret is empty.
    #[error("the WeCom robot's bot id or secret is empty")]
    BadCredentials,
    /// The address is not a WebSocket URL.
    #[error("WECOM_WEBSOCKET_URL is not a ws:// or wss:// URL: {0}")]
    BadUrl(String),
    /// A policy variable names no policy.
    #[error("{0} is {1:?}: expected open, allowlist, pairing or disabled")]
    BadPolicy(String, String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// WeCom's answer to one request.
#[derive(Debug)]
struct Answer {
    errcode: i64,
    errmsg: String,
    body: Value,
}

/// Why a request on the socket got no good answer.
#[derive(Debug)]
enum Failure {
    /// No connection: nothing was sent.
    Offline,
    /// Sent, but the connection closed or the wait ran out first.
    Lost(String),
    /// WeCom refused it.
    Refused(i64, String),
}

/// What is known of one chat.
#[derive(Debug, Clone, Default)]
struct Chat {
    /// The `req_id` of the last message it sent on the live connection.
    req_id: Option<String>,
    /// Whether it is a group (which cannot be written to proactively).
    group: bool,
    /// When it was last written in, to forget the stalest first.
    touched: u64,
}

/// How one connection ended.
enum Ended {
    Shutdown,
    Superseded,
    Failed(AdapterError),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The WeCom robot connector (see the module docs).
pub struct WecomBotAdapter {
    settings: WecomBotSettings,
    http: reqwest::Client,
    /// The live socket's writer, while there is one.
    link: Mutex<Option<mpsc::Sender<String>>>,
    /// Requests awaiting their answer, by `req_id`.
    pending: Mutex<HashMap<String, oneshot::Sender<Answer>>>,
    /// Answers share their `req_id` with the message they answer, so two
    /// at once could not be told apart: one at a time.
    replies: tokio::sync::Mutex<()>,
    chats: Mutex<HashMap<String, Chat>>,
    seen: Mutex<crate::seen::Seen>,
    next_id: AtomicU64,
    /// Another client took the robot's connection.
    superseded: AtomicBool,
}

impl std::fmt::Debug for WecomBotAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WecomBotAdapter")
            .field("bot_id", &self.settings.bot_id)
            .finish_non_exhaustive()
    }
}

impl WecomBotAdapter {
    /// Checks the settings and builds the HTTP client; does not connect.
    pub fn new(settings: WecomBotSettings) -> Result<WecomBotAdapter, WecomBotError> {
        if settings.bot_id.is_empty() || settings.secret.expose().is_empty() {
            return Err(WecomBotError::BadCredentials);
        }
        match reqwest::Url::parse(&settings.websocket_url) {
            Ok(u) if matches!(u.scheme(), "ws" | "wss") => {}
            _ => return Err(WecomBotError::BadUrl(settings.websocket_url.clone())),
        }
        // A file's URL is checked against the media hosts; a redirect
        // could lead anywhere, so none is followed.
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| WecomBotError::Client(e.to_string()))?;
        Ok(WecomBotAdapter {
            settings,
            http,
            link: Mutex::new(None),
            pending: Mutex::new(HashMap::new()),
            replies: tokio::sync::Mutex::new(()),
            chats: Mutex::new(HashMap::new()),
            seen: Mutex::new(crate::seen::Seen::new(SEEN_CAPACITY)),
            next_id: AtomicU64::new(1),
            superseded: AtomicBool::new(false),
        })
    }

    fn req_id(&self, prefix: &str) -> String {
        format!("{prefix}_{}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    fn frame(cmd: &str, req_id: &str, body: Value) -> String {
        json!({ "cmd": cmd, "headers": { "req_id": req_id }, "body": body }).to_string()
    }

    /// Opens the socket and subscribes.
    async fn connect(&self) -> Result<ws::WsStream, AdapterError> {
        let mut stream = ws::connect(&self.settings.websocket_url, &[], CONNECT_TIMEOUT)
            .await
            .map_err(AdapterError::Disconnected)?;
        let id = self.req_id("sub");
        let subscribe = Self::frame(
            "aibot_subscribe",
            &id,
            json!({ "bot_id": self.settings.bot_id, "secret": self.settings.secret.expose() }),
        );
        stream
            .send(Message::Text(subscribe.into()))
            .await
            .map_err(|e| AdapterError::Disconnected(format!("cannot subscribe: {e}")))?;
        let answer = tokio::time::timeout(self.settings.request_timeout, async {
            while let Some(frame) = stream.next().await {
                let text = match frame {
                    Ok(Message::Text(t)) => t,
                    Ok(Message::Close(_)) | Err(_) => break,
                    Ok(_) => continue,
                };
                let Ok(v) = serde_json::from_str::<Value>(text.as_str()) else {
                    continue;
                };
                if v.pointer("/headers/req_id").and_then(Value::as_str) == Some(id.as_str()) {
                    return Some(v);
                }
            }
            None
        })
        .await
        .map_err(|_| AdapterError::Disconnected("WeCom did not answer the subscription".into()))?
        .ok_or_else(|| {
            AdapterError::Disconnected("the connection closed before the subscription".into())
        })?;
        let code = answer.get("errcode").and_then(Value::as_i64).unwrap_or(-1);
        if code != 0 {
            let msg = answer.get("errmsg").and_then(Value::as_str).unwrap_or("");
            return Err(AdapterError::Fatal(format!(
                "WeCom refused the robot's subscription (errcode {code}: {msg}); check \
                 WECOM_BOT_ID and WECOM_SECRET and that the robot is in API long-connection mode"
            )));
        }
        Ok(stream)
    }

    /// Serves one subscribed connection until it ends.
    async fn serve(&self, stream: ws::WsStream, ctx: &AdapterContext) -> Ended {
        let (mut sink, mut stream) = stream.split();
        let (tx, mut rx) = mpsc::channel::<String>(64);
        // Answers bound to the last connection's frames may be refused:
        // DMs go proactively until they write again.
        for chat in lock(&self.chats).values_mut() {
            chat.req_id = None;
        }
        *lock(&self.link) = Some(tx);
        ctx.liveness.set(Liveness::Live);
        tracing::info!("connected to WeCom (intelligent robot)");
        let interval = self.settings.ping_interval;
        let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut unanswered = 0u32;
        let mut last_ping = String::new();
        let ended = loop {
            tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => {
                    let close = sink.send(Message::Close(None));
                    let _ = tokio::time::timeout(Duration::from_secs(1), close).await;
                    break Ended::Shutdown;
                }
                frame = rx.recv() => {
                    let Some(frame) = frame else { continue };
                    if let Err(e) = sink.send(Message::Text(frame.into())).await {
                        break Ended::Failed(AdapterError::Disconnected(format!("cannot write to WeCom: {e}")));
                    }
                }
                _ = ping.tick() => {
                    if unanswered >= 2 {
                        ctx.liveness.set(Liveness::Degraded);
                        break Ended::Failed(AdapterError::Disconnected("two pings to WeCom went unanswered".into()));
                    }
                    unanswered += 1;
                    last_ping = self.req_id("ping");
                    let frame = json!({ "cmd": "ping", "headers": { "req_id": last_ping } }).to_string();
                    if let Err(e) = sink.send(Message::Text(frame.into())).await {
                        break Ended::Failed(AdapterError::Disconnected(format!("cannot ping WeCom: {e}")));
                    }
                }
                next = stream.next() => {
                    let text = match next {
                        None => break Ended::Failed(AdapterError::Disconnected("WeCom closed the connection".into())),
                        Some(Err(e)) => break Ended::Failed(AdapterError::Disconnected(format!("the WeCom connection failed: {e}"))),
                        Some(Ok(Message::Text(t))) => t,
                        Some(Ok(Message::Close(frame))) => {
                            let why = frame.map(|f| format!(": {} {}", f.code, f.reason)).unwrap_or_default();
                            break Ended::Failed(AdapterError::Disconnected(format!("WeCom closed the connection{why}")));
                        }
                        Some(Ok(_)) => continue,
                    };
                    let Ok(frame) = serde_json::from_str::<Value>(text.as_str()) else {
                        tracing::warn!("ignoring a WeCom frame that is not JSON");
                        continue;
                    };
                    let req_id = frame.pointer("/headers/req_id").and_then(Value::as_str).unwrap_or("").to_owned();
                    match frame.get("cmd").and_then(Value::as_str).unwrap_or("") {
                        "" => {
                            if req_id == last_ping {
                                unanswered = 0;
                            } else if let Some(waiter) = lock(&self.pending).remove(&req_id) {
                                let _ = waiter.send(Answer {
                                    errcode: frame.get("errcode").and_then(Value::as_i64).unwrap_or(0),
                                    errmsg: frame.get("errmsg").and_then(Value::as_str).unwrap_or("").to_owned(),
                                    body: frame.get("body").cloned().unwrap_or(Value::Null),
                                });
                            }
                        }
                        "aibot_msg_callback" | "aibot_callback" => {
                            if !self.on_message(&req_id, frame.get("body"), ctx).await {
                                break Ended::Shutdown;
                            }
                        }
                        "aibot_event_callback" => {
                            let kind = frame.pointer("/body/event/eventtype").and_then(Value::as_str).unwrap_or("");
                            match kind {
                                "disconnected_event" => break Ended::Superseded,
                                "enter_chat" => {
                                    if let Some(welcome) = &self.settings.welcome {
                                        // Not waited for: the answer comes on
                                        // this very loop.
                                        let body = json!({ "msgtype": "text", "text": { "content": welcome } });
                                        let frame = Self::frame("aibot_respond_welcome_msg", &req_id, body);
                                        if let Err(e) = sink.send(Message::Text(frame.into())).await {
                                            break Ended::Failed(AdapterError::Disconnected(format!("cannot write to WeCom: {e}")));
                                        }
                                    }
                                }
                                other => tracing::debug!(event = other, "ignoring a WeCom event"),
                            }
                        }
                        other => tracing::debug!(cmd = other, "ignoring a WeCom frame"),
                    }
                }
            }
        };
        *lock(&self.link) = None;
        // Their answers cannot come on another connection.
        lock(&self.pending).clear();
        ended
    }

    /// Hands one message to the inbox unless it is a repeat or not for
    /// the robot; `false` means stop (shutdown, or the runner is gone).
    async fn on_message(&self, req_id: &str, body: Option<&Value>, ctx: &AdapterContext) -> bool {
        let callback = match body.map(|b| serde_json::from_value::<inbound::Callback>(b.clone())) {
            Some(Ok(c)) => c,
            _ => {
                tracing::warn!("skipping a malformed WeCom message callback");
                return true;
            }
        };
        let event = match inbound::map(&callback, &self.settings.access) {
            Inbound::Message(e) => e,
            Inbound::Skip(why) => {
                tracing::debug!(msgid = %callback.msgid, why, "skipping a WeCom message");
                return true;
            }
        };
        let chat_id = event.source.chat_id.clone();
        let group = event.source.chat_type.is_shared();
        self.remember(&chat_id, group, req_id);
        let id = callback.msgid.trim().to_owned();
        if lock(&self.seen).contains(&id) {
            tracing::debug!(msgid = %id, "dropping a WeCom message already handed over");
            return true;
        }
        let taken = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return false,
            r = ctx.inbox.submit(*event) => r.is_ok(),
        };
        if taken {
            lock(&self.seen).first(&id);
        }
        taken
    }

    /// Records that `chat` can be answered through `req_id` now.
    fn remember(&self, chat: &str, group: bool, req_id: &str) {
        let mut chats = lock(&self.chats);
        let touched = self.next_id.fetch_add(1, Ordering::Relaxed);
        if !chats.contains_key(chat)
            && chats.len() >= CHAT_CAPACITY
            && let Some(stalest) = chats
                .iter()
                .min_by_key(|(_, c)| c.touched)
                .map(|(k, _)| k.clone())
        {
            chats.remove(&stalest);
        }
        let entry = chats.entry(chat.to_owned()).or_default();
        entry.group = group;
        entry.touched = touched;
        entry.req_id = Some(req_id.to_owned()).filter(|r| !r.is_empty());
    }

    fn chat(&self, chat: &str) -> Chat {
        lock(&self.chats).get(chat).cloned().unwrap_or_default()
    }

    fn forget_req_id(&self, chat: &str) {
        if let Some(c) = lock(&self.chats).get_mut(chat) {
            c.req_id = None;
        }
    }

    /// Sends one request and waits for WeCom's answer.
    async fn request(&self, cmd: &str, req_id: &str, body: Value) -> Result<Answer, Failure> {
        let Some(link) = lock(&self.link).clone() else {
            return Err(Failure::Offline);
        };
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = lock(&self.pending);
            if pending.len() >= MAX_PENDING {
                return Err(Failure::Offline);
            }
            pending.insert(req_id.to_owned(), tx);
        }
        if link.send(Self::frame(cmd, req_id, body)).await.is_err() {
            lock(&self.pending).remove(req_id);
            return Err(Failure::Offline);
        }
        match tokio::time::timeout(self.settings.request_timeout, rx).await {
            Ok(Ok(answer)) if answer.errcode == 0 => Ok(answer),
            Ok(Ok(answer)) => Err(Failure::Refused(answer.errcode, answer.errmsg)),
            Ok(Err(_)) => Err(Failure::Lost(format!(
                "the connection closed before WeCom answered {cmd}"
            ))),
            Err(_) => {
                lock(&self.pending).remove(req_id);
                Err(Failure::Lost(format!("WeCom did not answer {cmd} in time")))
            }
        }
    }

    /// Delivers `body` (a message of any type) to `chat_id`: as the
    /// answer to its live message (for a user only when `answer_dms`),
    /// else proactively to a user; never proactively to a group.
    async fn deliver(&self, chat_id: &str, body: Value, answer_dms: bool) -> Result<(), SendError> {
        let mut retries = 0;
        loop {
            let mut chat = self.chat(chat_id);
            if !answer_dms && !chat.group {
                chat.req_id = None;
            }
            let replying = chat.req_id.is_some();
            let result = match &chat.req_id {
                Some(req_id) => {
                    let _one = self.replies.lock().await;
                    self.request("aibot_respond_msg", req_id, body.clone())
                        .await
                }
                None if chat.group => {
                    return Err(SendError::Rejected(format!(
                        "WeCom group {chat_id} has no message on this connection to answer, and a \
                         robot cannot start a group conversation"
                    )));
                }
                None => {
                    let mut proactive = body.clone();
                    if let Some(map) = proactive.as_object_mut() {
                        map.insert("chatid".into(), Value::String(chat_id.to_owned()));
                    }
                    self.request("aibot_send_msg", &self.req_id("send"), proactive)
                        .await
                }
            };
            match result {
                Ok(_) => return Ok(()),
                Err(Failure::Offline) => return Err(SendError::Unavailable("WeCom".into())),
                Err(Failure::Lost(why)) => return Err(SendError::Ambiguous(why)),
                Err(Failure::Refused(TOO_FAST, _)) => {
                    let wait = self.settings.rate_limit_wait;
                    if retries >= RATE_LIMIT_RETRIES {
                        return Err(SendError::RateLimited(wait));
                    }
                    retries += 1;
                    tracing::info!(?wait, "WeCom says sending too fast; waiting");
                    tokio::time::sleep(wait).await;
                }
                Err(Failure::Refused(BUSY, msg)) => {
                    return Err(SendError::Transient(format!("WeCom is busy: {msg}")));
                }
                Err(Failure::Refused(code, msg)) if replying && !chat.group => {
                    // The message's req_id is no longer good: a DM can
                    // still be written to directly.
                    tracing::info!(code, %msg, "WeCom refused the answer's req_id; sending directly");
                    self.forget_req_id(chat_id);
                }
                Err(Failure::Refused(code, msg)) => {
                    return Err(SendError::Rejected(format!(
                        "WeCom refused the message (errcode {code}: {msg})"
                    )));
                }
            }
        }
    }

    /// Uploads `file` in WeCom's three steps; its `media_id`.
    async fn upload(
        &self,
        file: &OutboundFile,
        kind: Upload,
        size: u64,
        md5: String,
    ) -> Result<String, SendError> {
        let refused = |step: &str, f: Failure| match f {
            Failure::Offline => SendError::Unavailable("WeCom".into()),
            Failure::Lost(why) => SendError::Transient(why),
            Failure::Refused(code, msg) => SendError::Rejected(format!(
                "WeCom refused the upload's {step} (errcode {code}: {msg})"
            )),
        };
        let chunks = media::chunk_count(size);
        let init = self
            .request(
                "aibot_upload_media_init",
                &self.req_id("upload"),
                json!({
                    "type": kind.name(), "filename": file.name, "total_size": size,
                    "total_chunks": chunks, "md5": md5,
                }),
            )
            .await
            .map_err(|f| refused("init", f))?;
        let upload_id = init
            .body
            .get("upload_id")
            .and_then(Value::as_str)
            .filter(|u| !u.is_empty())
            .ok_or_else(|| SendError::Transient("WeCom's upload init named no upload_id".into()))?
            .to_owned();
        let mut reader = tokio::fs::File::open(&file.path)
            .await
            .map_err(|e| SendError::Rejected(format!("cannot read {}: {e}", file.name)))?;
        for index in 0..chunks {
            let chunk = media::next_chunk(&mut reader)
                .await
                .map_err(|e| SendError::Rejected(format!("cannot read {}: {e}", file.name)))?;
            if chunk.is_empty() {
                return Err(SendError::Rejected(format!(
                    "{} shrank while it was sent",
                    file.name
                )));
            }
            let data = base64::engine::general_purpose::STANDARD.encode(&chunk);
            self.request(
                "aibot_upload_media_chunk",
                &self.req_id("upload"),
                json!({ "upload_id": upload_id, "chunk_index": index, "base64_data": data }),
            )
            .await
            .map_err(|f| refused("chunk", f))?;
        }
        let done = self
            .request(
                "aibot_upload_media_finish",
                &self.req_id("upload"),
                json!({ "upload_id": upload_id }),
            )
            .await
            .map_err(|f| refused("finish", f))?;
        done.body
            .get("media_id")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| SendError::Transient("WeCom's upload finish named no media_id".into()))
    }

    /// Whether a file URL from a message may be fetched.
    fn media_allowed(&self, url: &reqwest::Url) -> bool {
        if !matches!(url.scheme(), "https" | "http") || !url.username().is_empty() {
            return false;
        }
        let Some(host) = url.host_str().map(str::to_ascii_lowercase) else {
            return false;
        };
        self.settings
            .media_hosts
            .iter()
            .any(|h| host == *h || host.ends_with(&format!(".{h}")))
    }
}

/// Images, videos and files come in (voice arrives as WeCom's transcript,
/// as text); images, videos and files go out.
const MEDIA: &[MediaKind] = &[MediaKind::Image, MediaKind::Video, MediaKind::Document];

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    markup: Markup::Markdown,
    receives: MEDIA,
    sends: MEDIA,
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_MESSAGE_LEN,
        unit: LengthUnit::Chars,
    })
};

#[async_trait]
impl Adapter for WecomBotAdapter {
    fn platform(&self) -> &'static str {
        PLATFORM
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn credential(&self) -> Option<(&'static str, String)> {
        // One connection per robot: a second subscription kicks the first.
        Some(("wecom-bot-id", self.settings.bot_id.clone()))
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        if self.superseded.load(Ordering::Relaxed) {
            // Handed to another client: wait for the operator, who
            // restarts the gateway once the other client is gone.
            ctx.liveness.set(Liveness::Standby);
            ctx.shutdown.cancelled().await;
            return Ok(());
        }
        ctx.liveness.set(Liveness::Connecting);
        let stream = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = self.connect() => r?,
        };
        match self.serve(stream, &ctx).await {
            Ended::Shutdown => Ok(()),
            Ended::Failed(e) => Err(e),
            Ended::Superseded => {
                self.superseded.store(true, Ordering::Relaxed);
                tracing::warn!(
                    "another client subscribed this WeCom robot and WeCom gave it the connection; \
                     not reconnecting until the gateway is restarted"
                );
                Err(AdapterError::Fatal(
                    "the WeCom robot is in use elsewhere: another client subscribed it \
                     (disconnected_event); restart the gateway once that client is stopped"
                        .into(),
                ))
            }
        }
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let body = json!({ "msgtype": "markdown", "markdown": { "content": message.text } });
        self.deliver(&message.chat_id, body, true).await?;
        Ok(SentMessage::default())
    }

    async fn send_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        let chat = self.chat(&file.chat_id);
        if chat.group && chat.req_id.is_none() {
            return Err(SendError::Rejected(format!(
                "WeCom group {} has no message on this connection to answer, and a robot \
                 cannot start a group conversation",
                file.chat_id
            )));
        }
        let (size, md5) = media::measure(&file.path)
            .await
            .map_err(|e| SendError::Rejected(format!("cannot read {}: {e}", file.name)))?;
        let kind = Upload::choose(file.kind, size).map_err(SendError::Rejected)?;
        if media::chunk_count(size) > media::MAX_CHUNKS {
            return Err(SendError::Rejected(format!(
                "{} is too large for WeCom",
                file.name
            )));
        }
        let media_id = self.upload(file, kind, size, md5).await?;
        let mut body = json!({ "msgtype": kind.name() });
        if let Some(map) = body.as_object_mut() {
            map.insert(kind.name().into(), json!({ "media_id": media_id }));
        }
        // A user gets the file directly: proactive messages are where
        // WeCom documents image, video and file types.
        self.deliver(&file.chat_id, body, false).await?;
        if let Some(caption) = file.caption.as_deref().filter(|c| !c.trim().is_empty()) {
            let text = json!({ "msgtype": "markdown", "markdown": { "content": caption } });
            self.deliver(&file.chat_id, text, true).await?;
        }
        Ok(SentMessage::default())
    }

    async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        let (key, url) = parse_locator(locator)
            .ok_or_else(|| DownloadError::Gone("a malformed WeCom file locator".into()))?;
        let key = Key::from_encoding_aes_key(key)
            .ok_or_else(|| DownloadError::Gone("the WeCom file's aeskey is malformed".into()))?;
        let url = reqwest::Url::parse(url)
            .ok()
            .filter(|u| self.media_allowed(u))
            .ok_or_else(|| {
                DownloadError::Gone(
                    "the WeCom file's URL is not on a configured media host \
                     (platforms.wecom.media_hosts)"
                        .into(),
                )
            })?;
        let shown = format!("{}{}", url.host_str().unwrap_or(""), url.path());
        let response = self
            .http
            .get(url)
            .timeout(DOWNLOAD_TIMEOUT)
            .send()
            .await
            .map_err(|e| {
                DownloadError::Unavailable(format!("cannot fetch {shown}: {}", e.without_url()))
            })?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            let why = format!("{shown} answered HTTP {status}");
            return Err(match status {
                403 | 404 | 410 => DownloadError::Gone(why),
                _ => DownloadError::Unavailable(why),
            });
        }
        let body = response
            .bytes_stream()
            .map(|c| c.map_err(|e| std::io::Error::other(e.without_url().to_string())));
        let plain = media::decrypt_stream(Box::pin(body), Decrypting::new(key.decryptor()));
        Ok(Download {
            reader: Box::pin(tokio_util::io::StreamReader::new(plain)),
            // The plaintext is up to 32 bytes shorter than what is sent.
            length: None,
        })
    }
}

/// The registry's entry for the WeCom robot.
pub const ENTRY: Platform = Platform {
    name: PLATFORM,
    title: "WeCom (intelligent robot)",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<WecomBotConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = WecomBotSettings::from_config(&setup.section()?, setup.env)
        .map_err(BuildError::misconfigured)?
    else {
        return Ok(None);
    };
    let adapter = WecomBotAdapter::new(settings).map_err(BuildError::set_up)?;
    Ok(Some(Built::connected(adapter)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(env: &[(&str, &str)]) -> Option<WecomBotSettings> {
        WecomBotSettings::from_config(
            &WecomBotConfig::default(),
            &Env::from_pairs(env.iter().copied()),
        )
        .unwrap()
    }

    #[test]
    fn settings_come_from_the_ancestors_variables() {
        let s = settings(&[
            ("WECOM_BOT_ID", "aib123"),
            ("WECOM_SECRET", " s3cret-value "),
            ("WECOM_ALLOWED_USERS", "ann, bob"),
            ("WECOM_GROUP_POLICY", "open"),
        ])
        .unwrap();
        assert_eq!(s.bot_id, "aib123");
        assert_eq!(s.secret.expose(), "s3cret-value");
        assert_eq!(s.websocket_url, "wss://openws.work.weixin.qq.com");
        assert_eq!(s.access.dm_allow_from, vec!["ann", "bob"]);
        assert_eq!(s.access.dm, Policy::Pairing);
        assert_eq!(s.access.group, Policy::Open);
        assert!(settings(&[("WECOM_BOT_ID", "aib123")]).is_none());
        let bad = WecomBotSettings::from_config(
            &WecomBotConfig::default(),
            &Env::from_pairs([
                ("WECOM_BOT_ID", "a"),
                ("WECOM_SECRET", "b"),
                ("WECOM_DM_POLICY", "maybe"),
            ]),
        );
        assert!(matches!(bad, Err(WecomBotError::BadPolicy(..))));
        let adapter = WecomBotAdapter::new(s).unwrap();
        assert!(!format!("{adapter:?}").contains("s3cret"));
    }

    #[test]
    fn files_are_fetched_only_from_the_media_hosts() {
        let s = settings(&[("WECOM_BOT_ID", "aib123"), ("WECOM_SECRET", "x")]).unwrap();
        let adapter = WecomBotAdapter::new(s).unwrap();
        let ok = |u: &str| adapter.media_allowed(&reqwest::Url::parse(u).unwrap());
        assert!(ok("https://wework.qpic.cn/file/1"));
        assert!(ok("https://bucket-1.cos.ap-guangzhou.myqcloud.com/x"));
        assert!(!ok("https://evilqpic.cn/x"));
        assert!(!ok("https://qpic.cn.evil.example/x"));
        assert!(!ok("https://user@wework.qpic.cn/x"));
        assert!(!ok("file:///etc/passwd"));
        assert!(!ok("http://127.0.0.1/x"));
    }
}
