//! The Yuanbao (腾讯元宝) adapter: a signed token, then one WebSocket of
//! protobuf frames that carries pushes in and requests out.
//!
//! The bot API is not publicly documented; the shapes follow Tencent's own
//! connector for the platform and the protocol sheet. [`YuanbaoAdapter::run`]
//! signs a token (`sign`), opens the socket and binds it (`auth-bind`),
//! then pings every 30 s and hands each `inbound_message` push to the
//! gateway's inbox, acknowledging a push that asks for it only after the
//! inbox took its event: an unacknowledged push comes again on the next
//! connection, so a crash before hand-over loses nothing, and the `msg_id`
//! dedupe keeps a re-delivery from being answered twice.
//!
//! Sends are requests on the same socket (`send_c2c_message`,
//! `send_group_message`), each with an id its response echoes. The
//! platform's reply heartbeat (RUNNING while working, FINISH once sent)
//! stands for "typing".
//!
//! Chat ids are `direct:<account>` and `group:<group_code>`; in groups the
//! bot answers only when mentioned (the owner's commands excepted).
//!
//! Files: `media` fetches what users send (only from the API or the
//! configured media hosts) and uploads what the agent sends to Tencent COS
//! before posting an element that points at it. `link` is the socket's
//! request channel, which the `yb_*` group tools share with the adapter.

mod config;
mod link;
mod mapping;
mod media;
pub mod proto;
mod sign;

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use futures::{SinkExt, StreamExt};
use prost::Message as _;
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Capabilities, Download, DownloadError, LengthUnit,
    Liveness, Markup, MediaKind, MessageLimits, OutboundFile, OutboundMessage, SendError,
    SentMessage,
};
use talaria_core::config::{secret_or_env, text_or_env};
use talaria_core::{Env, Secret};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::registry::{BuildError, Built, Platform, Setup};
use crate::ws;
use mapping::{Chat, Inbound};
use proto::{CONN_MODULE, ConnMsg, Head};
use sign::{SignError, Signer, Token};

pub use crate::access::{Access, Policy};
pub use config::{ENV, YuanbaoConfig};
pub use link::{GroupMember, GroupSummary, LinkError, MemberList, Role, YuanbaoLink};

/// Yuanbao messages are cut at 4000 characters, as the ancestor does.
pub const MAX_MESSAGE_LEN: usize = 4000;

/// The instance kind bots present (`X-Instance-Id`, the auth-bind's
/// `instance_id`).
const INSTANCE_ID: &str = "17";

/// How long opening the WebSocket may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Retries of a send the platform refused, and the waits before them.
const SEND_BACKOFF: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
];

/// How many handed-over message ids are remembered, and for how long.
const SEEN_CAPACITY: usize = 1000;
const SEEN_TTL: Duration = Duration::from_secs(300);

/// Auth-bind codes: bound, or bound already.
const BIND_OK: [i32; 2] = [0, 41101];
/// Auth-bind codes saying the token expired: sign again and retry.
const BIND_EXPIRED: [i32; 3] = [41103, 41104, 41108];

/// Close codes after which reconnecting cannot help (kicked out, the bot
/// removed or banned) until the operator acts.
const NO_RECONNECT: [u16; 6] = [4012, 4013, 4014, 4018, 4019, 4021];
/// Close codes saying the credentials were refused.
const AUTH_FAILED: [u16; 3] = [4001, 4002, 4003];

/// What the adapter needs to connect.
#[derive(Debug, Clone)]
pub struct YuanbaoSettings {
    /// The app key. Never logged.
    pub app_key: Secret,
    /// The app secret that signs token requests. Never logged.
    pub app_secret: Secret,
    /// The bot's account id, when configured; otherwise sign-token's.
    pub bot_id: Option<String>,
    /// The socket's address.
    pub ws_url: String,
    /// The REST root (sign-token).
    pub api_domain: String,
    /// `X-Route-Env` / the auth-bind's `env_name`.
    pub route_env: Option<String>,
    /// The DM and group policies.
    pub access: Access,
    /// Time between pings.
    pub ping_interval: Duration,
    /// How long a ping waits for its pong.
    pub pong_timeout: Duration,
    /// How long a request waits for its response.
    pub request_timeout: Duration,
    /// Where uploads go (`{bucket}` and `{region}` filled in).
    pub cos_endpoint: String,
    /// Hosts files may be fetched from besides the API domain.
    pub media_hosts: Vec<String>,
}

fn list(values: &[String], env: &Env, var: &str) -> Vec<String> {
    let from_env = env.get(var).map(|v| {
        v.split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
    });
    from_env.unwrap_or_else(|| values.iter().map(|v| v.trim().to_owned()).collect())
}

fn policy(configured: &str, env: &Env, var: &str) -> Result<Policy, YuanbaoError> {
    let name = env.get(var).unwrap_or(configured);
    Policy::parse(name).ok_or_else(|| YuanbaoError::BadPolicy(var.to_owned(), name.to_owned()))
}

impl YuanbaoSettings {
    /// Settings from `platforms.yuanbao` and the environment; `Ok(None)`
    /// when Yuanbao is off (`enabled: false`, or the app key or secret
    /// missing from both the file and the environment).
    pub fn from_config(
        config: &YuanbaoConfig,
        env: &Env,
    ) -> Result<Option<YuanbaoSettings>, YuanbaoError> {
        if config.enabled == Some(false) {
            return Ok(None);
        }
        let key = secret_or_env(config.app_key.as_ref(), env, "YUANBAO_APP_ID")
            .or_else(|| secret_or_env(None, env, "YUANBAO_APP_KEY"));
        let secret = secret_or_env(config.app_secret.as_ref(), env, "YUANBAO_APP_SECRET");
        let (Some(app_key), Some(app_secret)) = (key.clone(), secret.clone()) else {
            if config.enabled == Some(true) || key.is_some() || secret.is_some() {
                tracing::warn!(
                    "Yuanbao needs an app key (YUANBAO_APP_ID or platforms.yuanbao.app_key) and \
                     an app secret (YUANBAO_APP_SECRET or platforms.yuanbao.app_secret); \
                     Yuanbao stays off"
                );
            }
            return Ok(None);
        };
        let ws_url = env
            .get("YUANBAO_WS_URL")
            .unwrap_or(&config.ws_url)
            .trim()
            .to_owned();
        let api_domain = env
            .get("YUANBAO_API_DOMAIN")
            .unwrap_or(&config.api_domain)
            .trim()
            .trim_end_matches('/')
            .to_owned();
        let access = Access {
            dm: policy(&config.dm_policy, env, "YUANBAO_DM_POLICY")?,
            dm_allow_from: list(&config.dm_allow_from, env, "YUANBAO_DM_ALLOW_FROM"),
            group: policy(&config.group_policy, env, "YUANBAO_GROUP_POLICY")?,
            group_allow_from: list(&config.group_allow_from, env, "YUANBAO_GROUP_ALLOW_FROM"),
            allow_all: env.flag("YUANBAO_ALLOW_ALL_USERS").unwrap_or(false),
        };
        Ok(Some(YuanbaoSettings {
            app_key,
            app_secret,
            bot_id: text_or_env(config.bot_id.as_deref(), env, "YUANBAO_BOT_ID"),
            ws_url,
            api_domain,
            route_env: text_or_env(config.route_env.as_deref(), env, "YUANBAO_ROUTE_ENV"),
            access,
            ping_interval: Duration::from_millis(config.ping_interval_ms.max(1)),
            pong_timeout: Duration::from_millis(config.pong_timeout_ms.max(1)),
            request_timeout: Duration::from_millis(config.request_timeout_ms.max(1)),
            cos_endpoint: config.cos_endpoint.trim().to_owned(),
            media_hosts: config.media_hosts.clone(),
        }))
    }
}

/// Why the adapter could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum YuanbaoError {
    /// The app key or secret is empty or has characters no request carries.
    #[error("the Yuanbao app key or secret is malformed")]
    BadCredentials,
    /// `ws_url` is not a WebSocket (or http) URL.
    #[error("the Yuanbao socket address is not a ws:// or wss:// URL: {0}")]
    BadWsUrl(String),
    /// `api_domain` is not an http(s) URL.
    #[error("the Yuanbao API domain is not an http(s) URL: {0}")]
    BadApiDomain(String),
    /// A policy variable names no policy.
    #[error("{0} is {1:?}: expected open, allowlist, pairing or disabled")]
    BadPolicy(String, String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// Recently handed-over (or recalled) message ids, oldest first out,
/// each forgotten after [`SEEN_TTL`].
#[derive(Debug, Default)]
struct Seen {
    order: VecDeque<(String, Instant)>,
    set: HashSet<String>,
}

impl Seen {
    fn expire(&mut self) {
        let now = Instant::now();
        while let Some((id, at)) = self.order.front() {
            if self.order.len() <= SEEN_CAPACITY && now.duration_since(*at) < SEEN_TTL {
                break;
            }
            self.set.remove(id);
            self.order.pop_front();
        }
    }

    fn contains(&mut self, id: &str) -> bool {
        self.expire();
        self.set.contains(id)
    }

    fn insert(&mut self, id: String) {
        if self.set.insert(id.clone()) {
            self.order.push_back((id, Instant::now()));
        }
        self.expire();
    }
}

/// The Yuanbao connector (see the module docs).
#[derive(Debug)]
pub struct YuanbaoAdapter {
    settings: YuanbaoSettings,
    http: reqwest::Client,
    token: tokio::sync::Mutex<Option<Token>>,
    /// The bot's account: configured, or learnt from sign-token.
    bot_id: Mutex<Option<String>>,
    /// The socket's request channel, shared with the group tools.
    link: YuanbaoLink,
    /// Handed over, kept across connections so a re-delivery is dropped.
    seen: Mutex<Seen>,
    /// Taken back by their senders before they were handed over.
    recalled: Mutex<Seen>,
    /// Chats shown a RUNNING heartbeat that still owe a FINISH.
    working: Mutex<HashSet<String>>,
    /// Where files may be fetched from.
    guard: media::HostGuard,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn header_safe(value: &str) -> bool {
    !value.is_empty() && value.chars().all(|c| c.is_ascii_graphic())
}

/// How one connection ended.
enum Ended {
    Shutdown,
    Failed(AdapterError),
}

impl YuanbaoAdapter {
    /// Checks the settings and builds the HTTP client; does not connect.
    pub fn new(settings: YuanbaoSettings) -> Result<YuanbaoAdapter, YuanbaoError> {
        YuanbaoAdapter::with_link(settings, YuanbaoLink::new())
    }

    /// [`YuanbaoAdapter::new`] on `link`, the request channel the group
    /// tools of this process share.
    pub fn with_link(
        settings: YuanbaoSettings,
        link: YuanbaoLink,
    ) -> Result<YuanbaoAdapter, YuanbaoError> {
        let mut settings = settings;
        settings.app_key = Secret::new(settings.app_key.expose().trim());
        settings.app_secret = Secret::new(settings.app_secret.expose().trim());
        if !header_safe(settings.app_key.expose()) || !header_safe(settings.app_secret.expose()) {
            return Err(YuanbaoError::BadCredentials);
        }
        // An http(s) address is read as the socket's ws(s) one.
        let ws_url = match settings.ws_url.split_once("://") {
            Some(("https", rest)) => format!("wss://{rest}"),
            Some(("http", rest)) => format!("ws://{rest}"),
            Some(("ws" | "wss", _)) => settings.ws_url.clone(),
            _ => return Err(YuanbaoError::BadWsUrl(settings.ws_url.clone())),
        };
        settings.ws_url = ws_url;
        match reqwest::Url::parse(&settings.api_domain) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {}
            _ => return Err(YuanbaoError::BadApiDomain(settings.api_domain.clone())),
        }
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| YuanbaoError::Client(e.to_string()))?;
        let bot_id = settings.bot_id.clone();
        link.attach(settings.request_timeout);
        if let Some(id) = &bot_id {
            link.set_bot(id);
        }
        let guard = media::HostGuard::new(&settings.api_domain, &settings.media_hosts);
        Ok(YuanbaoAdapter {
            guard,
            settings,
            http,
            token: tokio::sync::Mutex::new(None),
            bot_id: Mutex::new(bot_id),
            link,
            seen: Mutex::new(Seen::default()),
            recalled: Mutex::new(Seen::default()),
            working: Mutex::new(HashSet::new()),
        })
    }

    /// The bot's account id, once known.
    pub fn bot_id(&self) -> Option<String> {
        lock(&self.bot_id).clone()
    }

    /// A token: the cached one while fresh, else a newly signed one.
    async fn token(&self, renew: bool) -> Result<Token, SignError> {
        let mut cached = self.token.lock().await;
        if !renew && let Some(t) = cached.as_ref().filter(|t| t.fresh()) {
            return Ok(t.clone());
        }
        let signer = Signer {
            client: &self.http,
            api_domain: &self.settings.api_domain,
            app_key: &self.settings.app_key,
            app_secret: &self.settings.app_secret,
            route_env: self.settings.route_env.as_deref(),
            timeout: self.settings.request_timeout,
        };
        let token = signer.sign().await?;
        let mut bot = lock(&self.bot_id);
        if bot.is_none() && !token.bot_id.is_empty() {
            *bot = Some(token.bot_id.clone());
            self.link.set_bot(&token.bot_id);
        }
        drop(bot);
        *cached = Some(token.clone());
        Ok(token)
    }

    /// The request channel this adapter's socket serves.
    pub fn link(&self) -> &YuanbaoLink {
        &self.link
    }

    fn next_request_id(&self, prefix: &str) -> String {
        self.link.next_id(prefix)
    }

    fn frame(
        &self,
        cmd_type: u32,
        cmd: &str,
        module: &str,
        msg_id: &str,
        data: Vec<u8>,
    ) -> Vec<u8> {
        self.link.frame(cmd_type, cmd, module, msg_id, data)
    }

    fn auth_bind_frame(&self, token: &Token, bot_id: &str, msg_id: &str) -> Vec<u8> {
        let req = proto::AuthBindReq {
            biz_id: "ybBot".into(),
            auth_info: Some(proto::AuthInfo {
                uid: bot_id.to_owned(),
                source: token.source.clone(),
                token: token.token.expose().to_owned(),
            }),
            device_info: Some(proto::DeviceInfo {
                app_version: env!("CARGO_PKG_VERSION").into(),
                app_operation_system: std::env::consts::OS.into(),
                instance_id: INSTANCE_ID.into(),
                bot_version: env!("CARGO_PKG_VERSION").into(),
            }),
            env_name: self.settings.route_env.clone().unwrap_or_default(),
        };
        self.frame(
            proto::REQUEST,
            "auth-bind",
            CONN_MODULE,
            msg_id,
            req.encode_to_vec(),
        )
    }

    /// Opens the socket and binds it; re-signs once when the token has
    /// expired.
    async fn connect(&self) -> Result<ws::WsStream, AdapterError> {
        let mut renew = false;
        for _ in 0..2 {
            let token = self.token(renew).await.map_err(|e| match e {
                SignError::Refused { code, .. } if code != 10099 => {
                    AdapterError::Fatal(e.to_string())
                }
                _ => AdapterError::Disconnected(e.to_string()),
            })?;
            let Some(bot_id) = self.bot_id() else {
                return Err(AdapterError::Fatal(
                    "Yuanbao's sign-token named no bot id; set YUANBAO_BOT_ID".into(),
                ));
            };
            let mut stream = ws::connect(&self.settings.ws_url, &[], CONNECT_TIMEOUT)
                .await
                .map_err(AdapterError::Disconnected)?;
            let id = self.next_request_id("auth");
            stream
                .send(Message::Binary(
                    self.auth_bind_frame(&token, &bot_id, &id).into(),
                ))
                .await
                .map_err(|e| {
                    AdapterError::Disconnected(format!("cannot send the auth-bind: {e}"))
                })?;
            let code =
                tokio::time::timeout(self.settings.request_timeout, bind_answer(&mut stream, &id))
                    .await
                    .map_err(|_| {
                        AdapterError::Disconnected("the auth-bind went unanswered".into())
                    })??;
            if BIND_OK.contains(&code.code) {
                return Ok(stream);
            }
            if BIND_EXPIRED.contains(&code.code) && !renew {
                tracing::info!(
                    code = code.code,
                    "Yuanbao says the token expired; signing again"
                );
                renew = true;
                let _ = stream.close(None).await;
                continue;
            }
            return Err(AdapterError::Fatal(format!(
                "Yuanbao refused the auth-bind (code {}): {}",
                code.code, code.message
            )));
        }
        Err(AdapterError::Disconnected(
            "Yuanbao refused a freshly signed token as expired".into(),
        ))
    }

    /// Serves one bound connection until it ends.
    async fn serve(&self, stream: ws::WsStream, ctx: &AdapterContext) -> Ended {
        let (mut sink, mut stream) = stream.split();
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(64);
        self.link.connected(tx);
        ctx.liveness.set(Liveness::Live);
        tracing::info!("connected to Yuanbao");
        let interval = self.settings.ping_interval;
        let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pong_due: Option<tokio::time::Instant> = None;
        let mut missed = 0u32;
        let ended = loop {
            let deadline = pong_due;
            tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => {
                    let _ = tokio::time::timeout(Duration::from_secs(1), sink.send(Message::Close(None))).await;
                    break Ended::Shutdown;
                }
                frame = rx.recv() => {
                    let Some(frame) = frame else { continue };
                    if let Err(e) = sink.send(Message::Binary(frame.into())).await {
                        break Ended::Failed(AdapterError::Disconnected(format!("cannot write to the Yuanbao socket: {e}")));
                    }
                }
                _ = async { if let Some(d) = deadline { tokio::time::sleep_until(d).await } else { std::future::pending::<()>().await } } => {
                    missed += 1;
                    if missed >= 2 {
                        ctx.liveness.set(Liveness::Degraded);
                        break Ended::Failed(AdapterError::Disconnected("two pings to Yuanbao went unanswered".into()));
                    }
                    let frame = self.frame(proto::REQUEST, "ping", CONN_MODULE, &self.next_request_id("ping"), Vec::new());
                    if let Err(e) = sink.send(Message::Binary(frame.into())).await {
                        break Ended::Failed(AdapterError::Disconnected(format!("cannot ping Yuanbao: {e}")));
                    }
                    pong_due = Some(tokio::time::Instant::now() + self.settings.pong_timeout);
                }
                _ = ping.tick() => {
                    if pong_due.is_none() {
                        let frame = self.frame(proto::REQUEST, "ping", CONN_MODULE, &self.next_request_id("ping"), Vec::new());
                        if let Err(e) = sink.send(Message::Binary(frame.into())).await {
                            break Ended::Failed(AdapterError::Disconnected(format!("cannot ping Yuanbao: {e}")));
                        }
                        pong_due = Some(tokio::time::Instant::now() + self.settings.pong_timeout);
                    }
                }
                next = stream.next() => {
                    let message = match next {
                        None => break Ended::Failed(AdapterError::Disconnected("the Yuanbao socket closed".into())),
                        Some(Err(e)) => break Ended::Failed(AdapterError::Disconnected(format!("the Yuanbao socket failed: {e}"))),
                        Some(Ok(m)) => m,
                    };
                    match message {
                        Message::Binary(bytes) => {
                            let Ok(frame) = ConnMsg::decode(bytes.as_ref()) else {
                                tracing::warn!(bytes = bytes.len(), "skipping a Yuanbao frame that is not a ConnMsg");
                                continue;
                            };
                            let head = frame.head.clone().unwrap_or_default();
                            match head.cmd_type {
                                proto::RESPONSE if head.cmd == "ping" => {
                                    pong_due = None;
                                    missed = 0;
                                }
                                proto::RESPONSE => {
                                    self.link.answer(&head.msg_id, (head.status, frame.data));
                                }
                                proto::PUSH => {
                                    if head.cmd == "kickout" {
                                        break Ended::Failed(AdapterError::Disconnected("Yuanbao kicked this connection out (another one bound the bot)".into()));
                                    }
                                    if !self.on_push(&head, &frame.data, ctx).await {
                                        break Ended::Shutdown;
                                    }
                                    if head.need_ack {
                                        let ack = self.frame(proto::PUSH_ACK, &head.cmd, &head.module, &head.msg_id, Vec::new());
                                        if let Err(e) = sink.send(Message::Binary(ack.into())).await {
                                            break Ended::Failed(AdapterError::Disconnected(format!("cannot acknowledge a Yuanbao push: {e}")));
                                        }
                                    }
                                }
                                _ => {}
                            }
                        }
                        Message::Close(frame) => break Ended::Failed(closed(frame.map(|f| (f.code, f.reason.to_string())))),
                        // Pings are answered by the library; text frames
                        // are not part of this protocol.
                        _ => {}
                    }
                }
            }
        };
        // Answers cannot come on another socket: the waiters see the
        // connection gone.
        self.link.disconnected();
        ended
    }

    /// Handles one push; `false` means stop without acknowledging it
    /// (shutdown, or the runner is gone).
    async fn on_push(&self, head: &Head, data: &[u8], ctx: &AdapterContext) -> bool {
        if head.cmd != "inbound_message" {
            tracing::debug!(cmd = %head.cmd, "ignoring a Yuanbao push");
            return true;
        }
        let push = match proto::InboundMessagePush::decode(data) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("skipping a malformed Yuanbao inbound message: {e}");
                return true;
            }
        };
        let bot_id = self.bot_id().unwrap_or_default();
        match mapping::map_push(&push, &bot_id, &self.settings.access) {
            Inbound::Skip(why) => {
                tracing::debug!(why, "skipping a Yuanbao message");
                true
            }
            Inbound::Recall(ids) => {
                // A message already handed over is the runner's; one
                // recalled before it arrived (or re-delivered) is dropped.
                let mut recalled = lock(&self.recalled);
                for id in ids {
                    recalled.insert(id);
                }
                true
            }
            Inbound::Message(event) => {
                let Some(id) = event.message_id.clone() else {
                    return true;
                };
                if lock(&self.seen).contains(&id) {
                    tracing::debug!("dropping a Yuanbao message already handed over");
                    return true;
                }
                if lock(&self.recalled).contains(&id) {
                    tracing::debug!("dropping a recalled Yuanbao message");
                    return true;
                }
                tokio::select! {
                    biased;
                    _ = ctx.shutdown.cancelled() => return false,
                    r = ctx.inbox.submit(*event) => {
                        if r.is_err() {
                            return false;
                        }
                    }
                }
                lock(&self.seen).insert(id);
                true
            }
        }
    }

    /// Sends one business request and waits for its `{code, message}`
    /// response.
    async fn request(
        &self,
        cmd: &str,
        prefix: &str,
        data: Vec<u8>,
    ) -> Result<proto::CodeRsp, SendError> {
        let answer = self
            .link
            .request(cmd, prefix, data)
            .await
            .map_err(|e| match e {
                LinkError::NoAdapter | LinkError::Down => SendError::Unavailable("Yuanbao".into()),
                LinkError::Busy => {
                    SendError::Unavailable("Yuanbao (too many requests in flight)".into())
                }
                LinkError::Closed(_) | LinkError::Timeout(_) => SendError::Ambiguous(e.to_string()),
                LinkError::Refused { .. } => SendError::Transient(e.to_string()),
            })?;
        proto::CodeRsp::decode(answer.as_slice())
            .map_err(|e| SendError::Transient(format!("{cmd}: unreadable response: {e}")))
    }

    /// Sends one message of `body` to `chat`, retrying refusals a few
    /// times with growing waits, as the ancestor does.
    async fn send_body(
        &self,
        chat: &Chat,
        body: Vec<proto::MsgBodyElement>,
        reply_to: Option<&str>,
    ) -> Result<(), SendError> {
        let from = self.my_account()?;
        // One random per message, kept across retries, so the platform
        // can tell a retry from a second message.
        let random: u32 = rand::random();
        let mut attempt = 0;
        loop {
            let (cmd, prefix, data) = match chat {
                Chat::Direct(to) => (
                    "send_c2c_message",
                    "c2c",
                    proto::SendC2cMessageReq {
                        msg_id: self.next_request_id("c2c_body"),
                        to_account: to.clone(),
                        from_account: from.clone(),
                        msg_random: random,
                        msg_body: body.clone(),
                    }
                    .encode_to_vec(),
                ),
                Chat::Group(group) => (
                    "send_group_message",
                    "grp",
                    proto::SendGroupMessageReq {
                        msg_id: self.next_request_id("grp_body"),
                        group_code: group.clone(),
                        from_account: from.clone(),
                        to_account: String::new(),
                        random: random.to_string(),
                        msg_body: body.clone(),
                        ref_msg_id: reply_to.unwrap_or_default().to_owned(),
                    }
                    .encode_to_vec(),
                ),
            };
            let rsp = self.request(cmd, prefix, data).await?;
            if rsp.code == 0 {
                return Ok(());
            }
            // The platform documents no codes: every refusal is retried.
            let Some(wait) = SEND_BACKOFF.get(attempt) else {
                return Err(SendError::Transient(format!(
                    "{cmd} refused (code {}): {}",
                    rsp.code, rsp.message
                )));
            };
            tracing::info!(code = rsp.code, ?wait, "Yuanbao refused a send; retrying");
            attempt += 1;
            tokio::time::sleep(*wait).await;
        }
    }

    /// Ends the reply heartbeat of a chat shown one.
    async fn finish_work(&self, chat_id: &str, chat: &Chat) {
        if lock(&self.working).remove(chat_id)
            && let Err(e) = self.heartbeat(chat, proto::FINISH).await
        {
            tracing::debug!("cannot end the Yuanbao reply heartbeat: {e}");
        }
    }

    fn my_account(&self) -> Result<String, SendError> {
        self.bot_id()
            .ok_or_else(|| SendError::Unavailable("Yuanbao (not signed in yet)".into()))
    }

    async fn heartbeat(&self, chat: &Chat, beat: i32) -> Result<(), SendError> {
        let from = self.my_account()?;
        let (cmd, data) = match chat {
            Chat::Direct(to) => (
                "send_private_heartbeat",
                proto::PrivateHeartbeatReq {
                    from_account: from,
                    to_account: to.clone(),
                    heartbeat: beat,
                }
                .encode_to_vec(),
            ),
            Chat::Group(group) => (
                "send_group_heartbeat",
                proto::GroupHeartbeatReq {
                    from_account: from,
                    to_account: String::new(),
                    group_code: group.clone(),
                    send_time: SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map(|d| d.as_millis() as i64)
                        .unwrap_or(0),
                    heartbeat: beat,
                }
                .encode_to_vec(),
            ),
        };
        let rsp = self.request(cmd, "hb", data).await?;
        if rsp.code != 0 {
            return Err(SendError::Transient(format!(
                "{cmd}: code {} {}",
                rsp.code, rsp.message
            )));
        }
        Ok(())
    }
}

/// Reads frames until the auth-bind's response.
async fn bind_answer(stream: &mut ws::WsStream, id: &str) -> Result<proto::CodeRsp, AdapterError> {
    loop {
        let message = match stream.next().await {
            None => {
                return Err(AdapterError::Disconnected(
                    "the Yuanbao socket closed during the auth-bind".into(),
                ));
            }
            Some(Err(e)) => {
                return Err(AdapterError::Disconnected(format!(
                    "the Yuanbao socket failed during the auth-bind: {e}"
                )));
            }
            Some(Ok(m)) => m,
        };
        match message {
            Message::Binary(bytes) => {
                let Ok(frame) = ConnMsg::decode(bytes.as_ref()) else {
                    continue;
                };
                let head = frame.head.unwrap_or_default();
                if head.cmd_type == proto::RESPONSE && head.cmd == "auth-bind" && head.msg_id == id
                {
                    return proto::CodeRsp::decode(frame.data.as_slice()).map_err(|e| {
                        AdapterError::Disconnected(format!("unreadable auth-bind response: {e}"))
                    });
                }
            }
            Message::Close(frame) => {
                return Err(closed(frame.map(|f| (f.code, f.reason.to_string()))));
            }
            _ => {}
        }
    }
}

/// What a close frame means for reconnecting.
fn closed(frame: Option<(CloseCode, String)>) -> AdapterError {
    let Some((code, reason)) = frame else {
        return AdapterError::Disconnected("Yuanbao closed the socket".into());
    };
    let n = u16::from(code);
    if NO_RECONNECT.contains(&n) {
        AdapterError::Fatal(format!(
            "Yuanbao closed the socket with {n} ({reason}): the bot was kicked out or removed; \
             not reconnecting until it is restored"
        ))
    } else if AUTH_FAILED.contains(&n) {
        AdapterError::Fatal(format!(
            "Yuanbao refused the bot's credentials ({n}: {reason}); check YUANBAO_APP_ID and YUANBAO_APP_SECRET"
        ))
    } else {
        AdapterError::Disconnected(format!("Yuanbao closed the socket with {n} ({reason})"))
    }
}

/// Every kind of file: images go as image elements, the rest as files.
const ALL_KINDS: &[MediaKind] = &[
    MediaKind::Image,
    MediaKind::Voice,
    MediaKind::Audio,
    MediaKind::Video,
    MediaKind::Document,
];

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    markup: Markup::Markdown,
    receives: ALL_KINDS,
    sends: ALL_KINDS,
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_MESSAGE_LEN,
        unit: LengthUnit::Chars,
    })
};

fn parse_chat(chat_id: &str) -> Result<Chat, SendError> {
    Chat::parse(chat_id).ok_or_else(|| {
        SendError::Rejected(format!(
            "{chat_id:?} is not a Yuanbao chat (direct:<account> or group:<group_code>)"
        ))
    })
}

fn text_body(text: &str) -> Vec<proto::MsgBodyElement> {
    vec![proto::MsgBodyElement {
        msg_type: "TIMTextElem".into(),
        msg_content: Some(proto::MsgContent {
            text: text.to_owned(),
            ..proto::MsgContent::default()
        }),
    }]
}

#[async_trait]
impl Adapter for YuanbaoAdapter {
    fn platform(&self) -> &'static str {
        "yuanbao"
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn credential(&self) -> Option<(&'static str, String)> {
        Some(("yuanbao-app-key", self.settings.app_key.expose().to_owned()))
    }

    /// The sign-token call with the app key and secret, as the socket's
    /// auth-bind needs it: the bot's account id, or
    /// [`AdapterError::Fatal`] when Yuanbao refuses to sign (wrong key or
    /// signature; any code but the retry code 10099).
    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        Some(match self.token(false).await {
            Ok(token) if !token.bot_id.is_empty() => Ok(format!("the bot {}", token.bot_id)),
            Ok(_) => Ok(match self.bot_id() {
                Some(bot) => format!("the bot {bot}"),
                None => "a bot Yuanbao signed a token for".to_owned(),
            }),
            Err(e @ SignError::Refused { code, .. }) if code != 10099 => Err(AdapterError::Fatal(
                format!("{e}; check YUANBAO_APP_ID, YUANBAO_APP_KEY and YUANBAO_APP_SECRET"),
            )),
            Err(e) => Err(AdapterError::Disconnected(e.to_string())),
        })
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        ctx.liveness.set(Liveness::Connecting);
        let stream = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = self.connect() => r?,
        };
        match self.serve(stream, &ctx).await {
            Ended::Shutdown => Ok(()),
            Ended::Failed(e) => {
                // The next connection signs afresh, as the platform's own
                // client does after a drop.
                *self.token.lock().await = None;
                Err(e)
            }
        }
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let chat = parse_chat(&message.chat_id)?;
        self.send_body(&chat, text_body(&message.text), message.reply_to.as_deref())
            .await?;
        self.finish_work(&message.chat_id, &chat).await;
        Ok(SentMessage { message_id: None })
    }

    async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        self.open_file(locator).await
    }

    async fn send_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        let chat = parse_chat(&file.chat_id)?;
        let upload = self.upload(file).await?;
        self.send_body(
            &chat,
            vec![media::element(file, &upload)],
            file.reply_to.as_deref(),
        )
        .await?;
        // Yuanbao's media elements carry no caption: it follows as text.
        if let Some(caption) = file.caption.as_deref().filter(|c| !c.trim().is_empty()) {
            self.send_body(&chat, text_body(caption), None).await?;
        }
        self.finish_work(&file.chat_id, &chat).await;
        Ok(SentMessage { message_id: None })
    }

    async fn typing(&self, chat_id: &str, _thread_id: Option<&str>) -> Result<(), SendError> {
        let Some(chat) = Chat::parse(chat_id) else {
            return Ok(());
        };
        {
            let mut working = lock(&self.working);
            // Bounded: a chat whose answer never went out is forgotten
            // rather than kept for ever.
            if working.len() >= SEEN_CAPACITY {
                working.clear();
            }
            working.insert(chat_id.to_owned());
        }
        self.heartbeat(&chat, proto::RUNNING).await
    }
}

/// The registry's entry for Yuanbao.
pub const ENTRY: Platform = Platform {
    name: "yuanbao",
    title: "Yuanbao",
    standalone: false,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<YuanbaoConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = YuanbaoSettings::from_config(&setup.section()?, setup.env)
        .map_err(BuildError::misconfigured)?
    else {
        return Ok(None);
    };
    let adapter =
        YuanbaoAdapter::with_link(settings, setup.yuanbao.clone()).map_err(BuildError::set_up)?;
    Ok(Some(Built::connected(adapter)))
}
