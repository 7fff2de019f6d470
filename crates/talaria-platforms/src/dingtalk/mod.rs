//! The DingTalk adapter: Stream mode in, session webhooks and the robot
//! send API out.
//!
//! [`DingTalkAdapter::run`] asks `connections/open` for an endpoint and a
//! one-use ticket, dials it, and answers every frame with an
//! acknowledgement carrying the frame's `messageId` (DingTalk re-delivers
//! what is not acknowledged). `SYSTEM` frames are the server's liveness
//! probe (`ping`, acknowledged echoing its data) and its notice that it
//! will drop the connection (`disconnect`: a new ticket and connection at
//! once). Robot messages are acknowledged only after the inbox took them,
//! so a crash before hand-over loses nothing; repeats are dropped by
//! `msgId`.
//!
//! Each message carries a session webhook, good for about ninety minutes,
//! which is where its answer goes. When there is none (it expired, the
//! gateway restarted and owes an answer, a scheduled job) the robot send
//! API is used instead, with the app's access token: to the user for a
//! 1:1 chat, to the conversation for a group. How each chat is reached is
//! kept in the cursor store, so a restarted gateway can still answer.
//! The chat `webhook` is the operator's custom robot
//! (`DINGTALK_WEBHOOK_URL`), signed when a secret is configured.
//!
//! Files go out through the robot send API after an upload (`media`);
//! with a card template configured, answers stream into AI cards
//! (`card`).
//!
//! DingTalk has no threads, no typing indicator, and no edits outside AI
//! cards.

mod api;
mod card;
mod config;
mod format;
mod mapping;
mod media;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Capabilities, Download, DownloadError, LengthUnit,
    Liveness, Markup, MediaKind, MessageLimits, OutboundFile, OutboundMessage, SendError,
    SentMessage,
};
use talaria_core::config::{secret_or_env, text_or_env};
use talaria_core::{Env, Secret};
use talaria_store::CursorStore;
use tokio_tungstenite::tungstenite::Message;

use crate::http::HttpError;
use crate::registry::{BuildError, Built, Platform, Setup};
use crate::ws::{self, Beat, Watched};
use api::{Api, BOT_TOPIC};
use mapping::{BotMessage, Route};

pub use config::{DingTalkConfig, ENV};

/// The longest message sent, in characters. DingTalk takes 20,000
/// characters through a session webhook but only about 15,000 bytes of
/// `msgParam` through the robot send API, which a re-sent answer may
/// take: 4,000 characters fit that even when every one is CJK.
pub const MAX_MESSAGE_LEN: usize = 4_000;

/// The chat id that means the operator's custom robot webhook.
pub const CUSTOM_ROBOT_CHAT: &str = "webhook";

/// "Sending too fast" from DingTalk.
const TOO_FAST: &str = "130101";

/// Codes DingTalk answers when busy; a later try may pass.
const TRANSIENT: &[&str] = &["-1", "88", "410100"];

/// Retries after "too fast" before a send reports
/// [`SendError::RateLimited`].
const MAX_RATE_LIMIT_RETRIES: u32 = 3;

/// A session webhook counts as dead this long before its stated expiry.
const WEBHOOK_MARGIN_MS: i64 = 5 * 60 * 1000;

/// Message ids remembered to drop re-deliveries.
const SEEN_CAPACITY: usize = 1000;

/// Chats whose session webhook and route are held in memory.
const CHAT_CAPACITY: usize = 500;

/// How long opening the WebSocket may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// What the adapter needs to connect.
#[derive(Debug, Clone)]
pub struct DingTalkSettings {
    /// The app's Client ID (AppKey).
    pub client_id: String,
    /// The app's Client Secret (AppSecret). Never logged.
    pub client_secret: Secret,
    /// The robot code for the robot send API.
    pub robot_code: String,
    /// The OpenAPI root.
    pub api_base: String,
    /// The old OpenAPI root files are uploaded to.
    pub media_base: String,
    /// The AI card template answers stream into, when set.
    pub card_template_id: Option<String>,
    /// URL prefixes a session webhook must start with.
    pub webhook_hosts: Vec<String>,
    /// In groups, submit only messages that @mention the robot.
    pub require_mention: bool,
    /// Send markdown (else plain text).
    pub markdown: bool,
    /// The title of markdown messages.
    pub markdown_title: String,
    /// The wait after "sending too fast".
    pub rate_limit_wait: Duration,
    /// Time between WebSocket pings.
    pub ping_interval: Duration,
    /// The custom robot's webhook.
    pub webhook_url: Option<Secret>,
    /// The custom robot's signing secret.
    pub webhook_secret: Option<Secret>,
}

impl DingTalkSettings {
    /// Settings from `platforms.dingtalk` and the environment, or `None`
    /// when DingTalk is off: `enabled: false`, or the client id or secret
    /// missing from both. `DINGTALK_REQUIRE_MENTION` (true/false) overrides
    /// `require_mention`.
    pub fn from_config(config: &DingTalkConfig, env: &Env) -> Option<DingTalkSettings> {
        if config.enabled == Some(false) {
            return None;
        }
        let id = text_or_env(config.client_id.as_deref(), env, "DINGTALK_CLIENT_ID");
        let secret = secret_or_env(config.client_secret.as_ref(), env, "DINGTALK_CLIENT_SECRET");
        let (Some(client_id), Some(client_secret)) = (id.clone(), secret.clone()) else {
            if config.enabled == Some(true) || id.is_some() || secret.is_some() {
                tracing::warn!(
                    "DingTalk needs both DINGTALK_CLIENT_ID and DINGTALK_CLIENT_SECRET \
                     (or platforms.dingtalk.client_id / client_secret); DingTalk stays off"
                );
            }
            return None;
        };
        let client_id = client_id.trim().to_owned();
        let robot_code = config
            .robot_code
            .as_deref()
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .unwrap_or(&client_id)
            .to_owned();
        Some(DingTalkSettings {
            robot_code,
            client_id,
            client_secret,
            api_base: config.api_base.trim().trim_end_matches('/').to_owned(),
            media_base: config.media_base.trim().trim_end_matches('/').to_owned(),
            card_template_id: text_or_env(
                config.card_template_id.as_deref(),
                env,
                "DINGTALK_CARD_TEMPLATE_ID",
            )
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty()),
            webhook_hosts: config.webhook_hosts.clone(),
            require_mention: env
                .flag("DINGTALK_REQUIRE_MENTION")
                .unwrap_or(config.require_mention),
            markdown: config.markdown,
            markdown_title: config.markdown_title.clone(),
            rate_limit_wait: Duration::from_millis(config.rate_limit_wait_ms.max(1)),
            ping_interval: Duration::from_millis(config.ping_interval_ms.max(1)),
            webhook_url: secret_or_env(config.webhook_url.as_ref(), env, "DINGTALK_WEBHOOK_URL"),
            webhook_secret: secret_or_env(
                config.webhook_secret.as_ref(),
                env,
                "DINGTALK_WEBHOOK_SECRET",
            ),
        })
    }
}

/// Why the adapter could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DingTalkError {
    /// The client id or secret is empty or cannot be sent.
    #[error("the DingTalk client id or secret is malformed")]
    BadCredentials,
    /// `api_base` is not an http(s) URL.
    #[error("platforms.dingtalk.api_base is not an http(s) URL: {0}")]
    BadApiBase(String),
    /// `media_base` is not an http(s) URL.
    #[error("platforms.dingtalk.media_base is not an http(s) URL: {0}")]
    BadMediaBase(String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// What is known of one chat.
#[derive(Debug, Clone, Default)]
struct Chat {
    /// The latest session webhook and its expiry (ms since the epoch).
    webhook: Option<(String, i64)>,
    /// How the robot send API reaches it.
    route: Option<Route>,
}

/// The DingTalk connector (see the module docs).
pub struct DingTalkAdapter {
    api: Api,
    settings: DingTalkSettings,
    cursors: Option<Arc<dyn CursorStore>>,
    seen: Mutex<crate::seen::Seen>,
    chats: Mutex<HashMap<String, Chat>>,
    cards: Mutex<card::OpenCards>,
}

impl std::fmt::Debug for DingTalkAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DingTalkAdapter")
            .field("client_id", &self.settings.client_id)
            .finish_non_exhaustive()
    }
}

/// How one connection ended.
enum Ended {
    Shutdown,
    /// DingTalk said it will drop the connection: dial a new one.
    Refresh,
    Failed(AdapterError),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The acknowledgement of frame `message_id`.
fn ack(message_id: &str, code: u16, data: &str) -> Message {
    let frame = json!({
        "code": code,
        "headers": { "messageId": message_id, "contentType": "application/json" },
        "message": if code == 200 { "OK" } else { "error" },
        "data": data,
    });
    Message::Text(frame.to_string().into())
}

impl DingTalkAdapter {
    /// Checks the settings and builds the HTTP client; does not connect.
    /// `cursors` keeps how each chat is reached across restarts.
    pub fn new(
        settings: DingTalkSettings,
        cursors: Option<Arc<dyn CursorStore>>,
    ) -> Result<DingTalkAdapter, DingTalkError> {
        let header_safe = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_graphic());
        if !header_safe(&settings.client_id) || !header_safe(settings.client_secret.expose().trim())
        {
            return Err(DingTalkError::BadCredentials);
        }
        match reqwest::Url::parse(&settings.api_base) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {}
            _ => return Err(DingTalkError::BadApiBase(settings.api_base.clone())),
        }
        match reqwest::Url::parse(&settings.media_base) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {}
            _ => return Err(DingTalkError::BadMediaBase(settings.media_base.clone())),
        }
        let secret = Secret::new(settings.client_secret.expose().trim());
        let api = Api::new(&settings.api_base, &settings.client_id, &secret)
            .map_err(DingTalkError::Client)?;
        Ok(DingTalkAdapter {
            api,
            settings,
            cursors,
            seen: Mutex::new(crate::seen::Seen::new(SEEN_CAPACITY)),
            chats: Mutex::new(HashMap::new()),
            cards: Mutex::new(card::OpenCards::default()),
        })
    }

    /// Whether `url` may be posted to as a session webhook.
    fn webhook_allowed(&self, url: &str) -> bool {
        !url.contains('@')
            && self
                .settings
                .webhook_hosts
                .iter()
                .any(|prefix| url.starts_with(prefix.as_str()))
    }

    async fn open(&self) -> Result<String, AdapterError> {
        let (endpoint, ticket) = self.api.open_connection().await.map_err(|e| {
            if matches!(e.status(), Some(400 | 401 | 403)) {
                AdapterError::Fatal(format!(
                    "DingTalk refused the app's credentials ({e}); check DINGTALK_CLIENT_ID \
                     and DINGTALK_CLIENT_SECRET and that the robot uses Stream mode"
                ))
            } else {
                AdapterError::Disconnected(format!("connections/open failed: {e}"))
            }
        })?;
        let mut url = reqwest::Url::parse(&endpoint)
            .ok()
            .filter(|u| matches!(u.scheme(), "ws" | "wss"))
            .ok_or_else(|| {
                AdapterError::Disconnected(
                    "connections/open answered a non-WebSocket endpoint".into(),
                )
            })?;
        url.query_pairs_mut().append_pair("ticket", ticket.expose());
        Ok(url.into())
    }

    async fn serve(&self, stream: ws::WsStream, ctx: &AdapterContext) -> Ended {
        let mut socket = Watched::new(
            stream,
            "the DingTalk stream",
            "DingTalk",
            self.settings.ping_interval,
        );
        loop {
            let beat = match socket.next(ctx).await {
                Ok(Some(beat)) => beat,
                Ok(None) => return Ended::Shutdown,
                Err(e) => return Ended::Failed(e),
            };
            let text = match beat {
                Beat::PingDue => {
                    if let Err(e) = socket.send(Message::Ping(Vec::new().into())).await {
                        return Ended::Failed(e);
                    }
                    continue;
                }
                Beat::Text(text) => text,
            };
            let Ok(frame) = serde_json::from_str::<Value>(text.as_str()) else {
                tracing::warn!("ignoring a DingTalk frame that is not JSON");
                continue;
            };
            let header = |k: &str| {
                frame
                    .pointer(&format!("/headers/{k}"))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned()
            };
            let (id, topic) = (header("messageId"), header("topic"));
            let data = frame.get("data").and_then(Value::as_str).unwrap_or("");
            let kind = frame.get("type").and_then(Value::as_str).unwrap_or("");
            let (reply, ended) = match (kind, topic.as_str()) {
                ("SYSTEM", "ping") => (ack(&id, 200, data), None),
                ("SYSTEM", "disconnect") => {
                    tracing::info!("DingTalk asked for a new connection");
                    (ack(&id, 200, "{}"), Some(Ended::Refresh))
                }
                ("SYSTEM", _) => (ack(&id, 200, "{}"), None),
                ("CALLBACK", BOT_TOPIC) => match self.hand_over(data, ctx).await {
                    Ok(code) => (ack(&id, code, r#"{"response":null}"#), None),
                    Err(()) => return Ended::Shutdown,
                },
                ("EVENT", _) => (
                    ack(&id, 200, r#"{"status":"SUCCESS","message":"ok"}"#),
                    None,
                ),
                _ => (ack(&id, 404, "{}"), None),
            };
            if id.is_empty() {
                tracing::debug!(kind, "a DingTalk frame without a messageId");
            } else if let Err(e) = socket.send(reply).await {
                return Ended::Failed(e);
            }
            if let Some(ended) = ended {
                return ended;
            }
        }
    }

    /// Hands a robot message to the inbox unless it was handed over before
    /// or is not for the bot; answers the acknowledgement's code. `Err`
    /// means stop without acknowledging (shutdown, the runner is gone).
    async fn hand_over(&self, data: &str, ctx: &AdapterContext) -> Result<u16, ()> {
        let message = match serde_json::from_str::<BotMessage>(data) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!("skipping a malformed DingTalk robot message: {e}");
                return Ok(400);
            }
        };
        let mapped = match mapping::map_message(&message, self.settings.require_mention) {
            Ok(m) => m,
            Err(why) => {
                tracing::debug!(msg_id = %message.msg_id, "skipping: {why}");
                return Ok(200);
            }
        };
        let chat_id = mapped.event.source.chat_id.clone();
        self.remember(&chat_id, mapped.webhook, mapped.route).await;
        if lock(&self.seen).contains(&message.msg_id) {
            tracing::debug!(msg_id = %message.msg_id, "dropping a message already handed over");
            return Ok(200);
        }
        let taken = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => false,
            r = ctx.inbox.submit(mapped.event) => r.is_ok(),
        };
        if !taken {
            return Err(());
        }
        lock(&self.seen).first(&message.msg_id);
        Ok(200)
    }

    /// Keeps a chat's session webhook (when its URL is allowed) and route;
    /// a route not known before is also written to the cursor store, so a
    /// restarted gateway can still reach the chat.
    async fn remember(&self, chat_id: &str, webhook: Option<(String, i64)>, route: Option<Route>) {
        let webhook = webhook.filter(|(url, _)| {
            let ok = self.webhook_allowed(url);
            if !ok {
                tracing::warn!(
                    chat_id,
                    "ignoring a session webhook outside platforms.dingtalk.webhook_hosts"
                );
            }
            ok
        });
        let new_route = {
            let mut chats = lock(&self.chats);
            if chats.len() >= CHAT_CAPACITY && !chats.contains_key(chat_id) {
                // Forget the chats whose webhooks are oldest; their routes
                // are in the cursor store.
                let mut by_expiry: Vec<(String, i64)> = chats
                    .iter()
                    .map(|(k, c)| (k.clone(), c.webhook.as_ref().map_or(0, |w| w.1)))
                    .collect();
                by_expiry.sort_by_key(|(_, e)| *e);
                for (k, _) in by_expiry.into_iter().take(CHAT_CAPACITY / 10 + 1) {
                    chats.remove(&k);
                }
            }
            let chat = chats.entry(chat_id.to_owned()).or_default();
            if webhook.is_some() {
                chat.webhook = webhook;
            }
            match route {
                Some(r) if chat.route.as_ref() != Some(&r) => {
                    chat.route = Some(r.clone());
                    Some(r)
                }
                _ => None,
            }
        };
        if let (Some(route), Some(cursors)) = (new_route, &self.cursors)
            && let Err(e) = cursors
                .set_cursor("dingtalk", &format!("route:{chat_id}"), &route.encode())
                .await
        {
            tracing::warn!(chat_id, "cannot keep how to reach a DingTalk chat: {e}");
        }
    }

    /// The chat's session webhook, unless it is about to expire.
    fn live_webhook(&self, chat_id: &str) -> Option<String> {
        let chats = lock(&self.chats);
        let (url, expires) = chats.get(chat_id)?.webhook.as_ref()?;
        (*expires - WEBHOOK_MARGIN_MS > now_ms()).then(|| url.clone())
    }

    fn forget_webhook(&self, chat_id: &str) {
        if let Some(chat) = lock(&self.chats).get_mut(chat_id) {
            chat.webhook = None;
        }
    }

    /// How the robot send API reaches `chat_id`: what a message said,
    /// what the cursor store kept, or the id's own form (`user:<staff
    /// id>` for a person, an open conversation id `cid...` for a group).
    async fn route(&self, chat_id: &str) -> Option<Route> {
        if let Some(route) = lock(&self.chats).get(chat_id).and_then(|c| c.route.clone()) {
            return Some(route);
        }
        if let Some(cursors) = &self.cursors {
            match cursors
                .cursor("dingtalk", &format!("route:{chat_id}"))
                .await
            {
                Ok(Some(text)) => {
                    if let Some(route) = Route::decode(&text) {
                        return Some(route);
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(chat_id, "cannot read how to reach a DingTalk chat: {e}"),
            }
        }
        if let Some(staff) = chat_id.strip_prefix("user:").filter(|s| !s.is_empty()) {
            return Some(Route::Dm(staff.to_owned()));
        }
        chat_id.starts_with("cid").then_some(Route::Group)
    }

    /// A session or custom robot webhook's body for `text`.
    fn webhook_body(&self, text: &str) -> Value {
        if self.settings.markdown {
            json!({
                "msgtype": "markdown",
                "markdown": {
                    "title": format::title(&self.settings.markdown_title, text),
                    "text": format::to_markdown(text),
                },
            })
        } else {
            json!({ "msgtype": "text", "text": { "content": text } })
        }
    }

    /// The robot send API's `msgKey` and `msgParam` for `text`.
    fn robot_message(&self, text: &str) -> (&'static str, String) {
        if self.settings.markdown {
            let param = json!({
                "title": format::title(&self.settings.markdown_title, text),
                "text": format::to_markdown(text),
            });
            ("sampleMarkdown", param.to_string())
        } else {
            ("sampleText", json!({ "content": text }).to_string())
        }
    }

    /// Why `chat_id` cannot be sent to.
    fn unreachable(&self, chat_id: &str) -> SendError {
        SendError::Rejected(format!(
            "no session webhook for DingTalk chat {chat_id} and no way to reach it through \
             the robot send API (it sent no message the gateway saw)"
        ))
    }

    /// One send attempt through the robot send API.
    async fn robot_send(&self, chat_id: &str, text: &str) -> Result<(), Attempt> {
        let (key, param) = self.robot_message(text);
        self.robot_send_as(chat_id, key, &param).await
    }

    /// One attempt to send the robot message `key` with `param` (a JSON
    /// document as a string) to `chat_id`.
    async fn robot_send_as(&self, chat_id: &str, key: &str, param: &str) -> Result<(), Attempt> {
        let Some(route) = self.route(chat_id).await else {
            return Err(Attempt::Failed(self.unreachable(chat_id)));
        };
        let (path, body) = match route {
            Route::Dm(staff) => (
                "robot/oToMessages/batchSend",
                json!({
                    "robotCode": self.settings.robot_code, "userIds": [staff],
                    "msgKey": key, "msgParam": param,
                }),
            ),
            Route::Group => (
                "robot/groupMessages/send",
                json!({
                    "robotCode": self.settings.robot_code, "openConversationId": chat_id,
                    "msgKey": key, "msgParam": param,
                }),
            ),
        };
        self.api
            .call(path, &body)
            .await
            .map(|_| ())
            .map_err(|e| self.read_failure(e, false))
    }

    /// What a failed call means for the send loop.
    fn read_failure(&self, e: HttpError, webhook: bool) -> Attempt {
        let code = e.code().map(str::to_owned);
        if code.as_deref() == Some(TOO_FAST) || e.status() == Some(429) {
            let wait = e
                .retry_after()
                .unwrap_or_default()
                .max(self.settings.rate_limit_wait);
            return Attempt::TooFast(wait);
        }
        if let Some(code) = &code
            && TRANSIENT.contains(&code.as_str())
        {
            return Attempt::Failed(SendError::Transient(e.reason()));
        }
        // A session webhook refusing with a code of its own has expired or
        // was revoked: the robot send API may still reach the chat.
        if webhook && code.is_some() && e.status().is_some_and(|s| s < 500) {
            return Attempt::WebhookDead(e.reason());
        }
        Attempt::Failed(e.classify())
    }

    /// One send attempt to the operator's custom robot.
    async fn custom_robot_send(&self, text: &str) -> Result<(), Attempt> {
        let Some(url) = &self.settings.webhook_url else {
            return Err(Attempt::Failed(SendError::Rejected(
                "no custom robot webhook is configured (DINGTALK_WEBHOOK_URL)".into(),
            )));
        };
        let url = match &self.settings.webhook_secret {
            Some(secret) => api::signed_url(url.expose(), secret.expose(), now_ms())
                .map_err(|e| Attempt::Failed(SendError::Rejected(e)))?,
            None => url.expose().to_owned(),
        };
        self.api
            .post_webhook(&url, &self.webhook_body(text))
            .await
            .map_err(|e| self.read_failure(e, false))
    }
}

/// How one send attempt failed.
enum Attempt {
    /// "Sending too fast": wait this long and try again.
    TooFast(Duration),
    /// The session webhook no longer works: try the robot send API.
    WebhookDead(String),
    /// For the ledger.
    Failed(SendError),
}

/// Images, voice notes, audio, video and files come in; images and
/// office files go out (see `media` for the formats DingTalk takes).
const RECEIVES: &[MediaKind] = &[
    MediaKind::Image,
    MediaKind::Voice,
    MediaKind::Video,
    MediaKind::Document,
];

/// Kinds sent as files; others go as the fallback line.
const SENDS: &[MediaKind] = &[MediaKind::Image, MediaKind::Document];

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    markup: Markup::Markdown,
    receives: RECEIVES,
    sends: SENDS,
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_MESSAGE_LEN,
        unit: LengthUnit::Chars,
    })
};

#[async_trait]
impl Adapter for DingTalkAdapter {
    fn platform(&self) -> &'static str {
        "dingtalk"
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn credential(&self) -> Option<(&'static str, String)> {
        // One stream per app: DingTalk hands each message to one of them.
        Some(("dingtalk-client-id", self.settings.client_id.clone()))
    }

    /// `POST /v1.0/oauth2/accessToken` with the app's key and secret:
    /// DingTalk answers 400 (`invalid.client`) to credentials it does not
    /// know, which is [`AdapterError::Fatal`].
    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        Some(match self.api.check_credentials().await {
            Ok(()) => Ok(match self.settings.robot_code.trim() {
                "" => format!("the app {}", self.settings.client_id),
                robot => format!("the app {} (robot {robot})", self.settings.client_id),
            }),
            Err(e) if matches!(e.status(), Some(400 | 401 | 403)) => {
                Err(AdapterError::Fatal(format!(
                    "DingTalk refused the app's credentials ({e}); check DINGTALK_CLIENT_ID \
                     and DINGTALK_CLIENT_SECRET"
                )))
            }
            Err(e) => Err(AdapterError::Disconnected(e.to_string())),
        })
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        loop {
            ctx.liveness.set(Liveness::Connecting);
            let url = tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => return Ok(()),
                r = self.open() => r?,
            };
            let stream = tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => return Ok(()),
                r = ws::connect(&url, &[], CONNECT_TIMEOUT) => {
                    r.map_err(AdapterError::Disconnected)?
                }
            };
            tracing::info!("connected to DingTalk (Stream mode)");
            ctx.liveness.set(Liveness::Live);
            match self.serve(stream, &ctx).await {
                Ended::Shutdown => return Ok(()),
                Ended::Failed(e) => return Err(e),
                // Unacknowledged frames come again on the new connection.
                Ended::Refresh => {}
            }
        }
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let chat_id = message.chat_id.as_str();
        let mut retries = 0;
        let mut webhook_dead = false;
        loop {
            let attempt = if chat_id == CUSTOM_ROBOT_CHAT {
                self.custom_robot_send(&message.text).await
            } else {
                match self.live_webhook(chat_id).filter(|_| !webhook_dead) {
                    Some(url) => self
                        .api
                        .post_webhook(&url, &self.webhook_body(&message.text))
                        .await
                        .map_err(|e| self.read_failure(e, true)),
                    None => self.robot_send(chat_id, &message.text).await,
                }
            };
            match attempt {
                Ok(()) => return Ok(SentMessage::default()),
                Err(Attempt::TooFast(wait)) => {
                    if retries >= MAX_RATE_LIMIT_RETRIES {
                        return Err(SendError::RateLimited(wait));
                    }
                    retries += 1;
                    tracing::info!(?wait, "DingTalk says sending too fast; waiting");
                    tokio::time::sleep(wait).await;
                }
                Err(Attempt::WebhookDead(why)) => {
                    tracing::info!(chat_id, %why, "the session webhook is gone; using the robot API");
                    self.forget_webhook(chat_id);
                    webhook_dead = true;
                }
                Err(Attempt::Failed(e)) => return Err(e),
            }
        }
    }

    async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        let url = self
            .api
            .download_url(locator, &self.settings.robot_code)
            .await
            .map_err(|e| match e.status() {
                Some(400 | 403 | 404) => DownloadError::Gone(e.to_string()),
                _ => DownloadError::Unavailable(e.to_string()),
            })?;
        let http = self.api.http();
        http.download(http.client().get(url), Duration::from_secs(120))
            .await
    }

    async fn send_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        self.post_file(file).await
    }

    /// Answers stream into AI cards when a card template is configured.
    fn streaming_edits(&self) -> bool {
        self.settings.card_template_id.is_some()
    }

    async fn start_preview(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        match &self.settings.card_template_id {
            Some(template) if message.chat_id != CUSTOM_ROBOT_CHAT => {
                self.open_card(template, message).await
            }
            _ => self.send(message).await,
        }
    }

    async fn edit(&self, chat_id: &str, message_id: &str, text: &str) -> Result<(), SendError> {
        self.stream_card(chat_id, message_id, text, false, false)
            .await
    }

    async fn finish_preview(
        &self,
        chat_id: &str,
        message_id: &str,
        text: &str,
        failed: bool,
    ) -> Result<(), SendError> {
        self.stream_card(chat_id, message_id, text, true, failed)
            .await
    }
}

/// The registry's entry for DingTalk.
pub const ENTRY: Platform = Platform {
    name: "dingtalk",
    title: "DingTalk",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<DingTalkConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = DingTalkSettings::from_config(&setup.section()?, setup.env) else {
        return Ok(None);
    };
    let adapter =
        DingTalkAdapter::new(settings, Some(setup.cursors.clone())).map_err(BuildError::set_up)?;
    Ok(Some(Built::connected(adapter)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_of_timestamp_and_secret_in_base64() {
        // Computed independently with Python's standard library:
        // base64.b64encode(hmac.new(b"SECtest", b"1700000000000\nSECtest",
        // hashlib.sha256).digest())
        let sig = api::sign("SECtest", 1_700_000_000_000);
        assert_eq!(sig, include_str!("testdata/sign_vector.txt").trim());
        let url = api::signed_url(
            "https://oapi.dingtalk.com/robot/send?access_token=abc",
            "SECtest",
            1_700_000_000_000,
        )
        .unwrap();
        assert!(url.starts_with(
            "https://oapi.dingtalk.com/robot/send?access_token=abc&timestamp=1700000000000&sign="
        ));
        assert!(!url.contains('+') && !url.ends_with('='), "{url}");
    }

    #[test]
    fn settings_come_from_the_ancestors_variables() {
        let env = Env::from_pairs([
            ("DINGTALK_CLIENT_ID", "dingabc"),
            ("DINGTALK_CLIENT_SECRET", "s3cret-value"),
            ("DINGTALK_REQUIRE_MENTION", "false"),
        ]);
        let s = DingTalkSettings::from_config(&DingTalkConfig::default(), &env).unwrap();
        assert_eq!(s.client_id, "dingabc");
        assert_eq!(s.robot_code, "dingabc");
        assert!(!s.require_mention);
        let none = Env::from_pairs([("DINGTALK_CLIENT_ID", "dingabc")]);
        assert!(DingTalkSettings::from_config(&DingTalkConfig::default(), &none).is_none());
        let adapter = DingTalkAdapter::new(s, None).unwrap();
        assert!(adapter.webhook_allowed("https://oapi.dingtalk.com/robot/sendBySession?session=x"));
        assert!(!adapter.webhook_allowed("https://evil.example/robot"));
        assert!(!adapter.webhook_allowed("https://api.dingtalk.com.evil.example/x"));
        assert!(!format!("{adapter:?}").contains("s3cret"));
    }
}
