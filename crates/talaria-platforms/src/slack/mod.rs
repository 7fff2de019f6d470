//! The Slack adapter: Socket Mode for receiving, the Web API for sending.
//!
//! [`SlackAdapter::run`] checks the bot token (`auth.test`), opens a Socket
//! Mode connection (`apps.connections.open` with the app-level token, then
//! a WebSocket to the URL it returns) and hands each `message` or
//! `app_mention` event to the gateway's inbox. Every envelope is
//! acknowledged, and only after the inbox took its event: Slack re-sends
//! what was not acknowledged, so a crash before hand-over loses nothing.
//! The connection counts as live only once Slack's `hello` arrived, and a
//! ping watchdog rebuilds it when Slack stops answering.
//!
//! Sends go through `chat.postMessage` as mrkdwn ([`format`]); since bots
//! cannot show "typing" in Slack, a reaction on the user's message stands
//! for it while the answer is being worked on.
//!
//! Files come in as links fetched with the bot token and go out through
//! Slack's external upload flow (see `media`).

mod api;
mod config;
mod format;
mod mapping;
mod media;

use crate::registry::{BuildError, Built, Platform, Setup};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Download, DownloadError, Liveness, MediaKind,
    MessageEvent, MessageLimits, OutboundFile, OutboundMessage, SendError, SentMessage,
};
use talaria_adapter::{Capabilities, LengthUnit, Markup};
use talaria_core::config::secret_or_env;
use talaria_core::{Env, Secret};
use tokio_tungstenite::tungstenite::Message;

use crate::ws;
use api::{Api, ApiError};
use mapping::Me;

pub use config::{ENV, SlackConfig};

/// Slack cuts messages at 40,000 characters; the gateway splits below
/// that, leaving room for the part numbers and escaping growth.
pub const MAX_MESSAGE_LEN: usize = 39_000;

/// Retries after a rate limit before a send reports
/// [`SendError::RateLimited`].
const MAX_RATE_LIMIT_RETRIES: u32 = 3;

/// Longer `Retry-After` waits are not worth blocking a send for.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// How long a Web API call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long opening the WebSocket may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// How many handed-over messages and event ids are remembered, to drop
/// Slack's re-deliveries and the `app_mention` twin of a `message`.
const SEEN_CAPACITY: usize = 4096;

/// Messages whose "working on it" reaction may still need removing.
const WORKING_CAPACITY: usize = 1024;

/// What the adapter needs to connect.
#[derive(Debug, Clone)]
pub struct SlackSettings {
    /// The bot token (`xoxb-...`) for the Web API. Never logged.
    pub bot_token: Secret,
    /// The app-level token (`xapp-...`) for Socket Mode. Never logged.
    pub app_token: Secret,
    /// The Web API root; requests go to `{api_base}/{method}`.
    pub api_base: String,
    /// In channels and group DMs, submit only messages that mention the bot.
    pub require_mention: bool,
    /// The reaction standing for "typing"; `None` for none.
    pub working_reaction: Option<String>,
    /// Time between WebSocket pings.
    pub ping_interval: Duration,
    /// Silence after a ping (and before `hello`) that counts as a dead
    /// connection.
    pub ping_timeout: Duration,
}

impl SlackSettings {
    /// Settings from `platforms.slack` and the environment, or `None` when
    /// Slack is off: `enabled: false`, or either token missing from both
    /// the config and `SLACK_BOT_TOKEN` / `SLACK_APP_TOKEN`.
    /// `SLACK_REQUIRE_MENTION` (true/false) overrides `require_mention`.
    pub fn from_config(config: &SlackConfig, env: &Env) -> Option<SlackSettings> {
        if config.enabled == Some(false) {
            return None;
        }
        let bot = secret_or_env(config.bot_token.as_ref(), env, "SLACK_BOT_TOKEN");
        let app = secret_or_env(config.app_token.as_ref(), env, "SLACK_APP_TOKEN");
        let (Some(bot_token), Some(app_token)) = (bot.clone(), app.clone()) else {
            if config.enabled == Some(true) || bot.is_some() || app.is_some() {
                tracing::warn!(
                    "Slack needs both a bot token (SLACK_BOT_TOKEN or platforms.slack.bot_token) \
                     and an app-level token (SLACK_APP_TOKEN or platforms.slack.app_token); \
                     Slack stays off"
                );
            }
            return None;
        };
        let require_mention = env
            .flag("SLACK_REQUIRE_MENTION")
            .unwrap_or(config.require_mention);
        let reaction = config.working_reaction.trim().trim_matches(':').to_owned();
        Some(SlackSettings {
            bot_token,
            app_token,
            api_base: config.api_base.clone(),
            require_mention,
            working_reaction: (!reaction.is_empty()).then_some(reaction),
            ping_interval: Duration::from_millis(config.ping_interval_ms.max(1)),
            ping_timeout: Duration::from_millis(config.ping_timeout_ms.max(1)),
        })
    }
}

/// Why the adapter could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlackError {
    /// The bot token is empty or has characters a header cannot carry.
    #[error("the Slack bot token is malformed (expected xoxb-...)")]
    BadBotToken,
    /// The app token is not an app-level token.
    #[error("the Slack app-level token is malformed (expected xapp-..., with connections:write)")]
    BadAppToken,
    /// `api_base` is not an http(s) URL.
    #[error("platforms.slack.api_base is not an http(s) URL: {0}")]
    BadApiBase(String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// The message a "working on it" reaction goes on, per conversation.
#[derive(Debug)]
struct Working {
    ts: String,
    reacted: bool,
}

type Conversation = (String, Option<String>);

/// The Slack connector (see the module docs).
#[derive(Debug)]
pub struct SlackAdapter {
    api: Api,
    bot_token: Secret,
    app_token: Secret,
    require_mention: bool,
    working_reaction: Option<String>,
    ping_interval: Duration,
    ping_timeout: Duration,
    /// The bot's identity, once `auth.test` answered.
    me: Mutex<Option<Me>>,
    /// Kept across `run` calls, so a reconnect's re-deliveries are dropped.
    seen: Mutex<crate::seen::Seen>,
    working: Mutex<HashMap<Conversation, Working>>,
}

/// How one Socket Mode connection ended.
enum Ended {
    /// The gateway is stopping.
    Shutdown,
    /// Slack asked for a fresh connection (`disconnect` after `hello`).
    Refresh(String),
    /// Lost, refused or disabled: `run` returns this.
    Failed(AdapterError),
}

/// The read half and write half of a Socket Mode connection.
type Sink = futures::stream::SplitSink<ws::WsStream, Message>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn header_safe(token: &str) -> bool {
    !token.is_empty() && token.chars().all(|c| c.is_ascii_graphic())
}

impl SlackAdapter {
    /// Checks the settings and builds the HTTP client; does not connect.
    pub fn new(settings: SlackSettings) -> Result<SlackAdapter, SlackError> {
        let bot_token = Secret::new(settings.bot_token.expose().trim());
        if !header_safe(bot_token.expose()) {
            return Err(SlackError::BadBotToken);
        }
        let app_token = Secret::new(settings.app_token.expose().trim());
        if !header_safe(app_token.expose()) || !app_token.expose().starts_with("xapp-") {
            return Err(SlackError::BadAppToken);
        }
        let api_base = settings.api_base.trim().trim_end_matches('/').to_owned();
        match reqwest::Url::parse(&api_base) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {}
            _ => return Err(SlackError::BadApiBase(api_base)),
        }
        let api = Api::new(&api_base).map_err(SlackError::Client)?;
        Ok(SlackAdapter {
            api,
            bot_token,
            app_token,
            require_mention: settings.require_mention,
            working_reaction: settings.working_reaction,
            ping_interval: settings.ping_interval.max(Duration::from_millis(1)),
            ping_timeout: settings.ping_timeout.max(Duration::from_millis(1)),
            me: Mutex::new(None),
            seen: Mutex::new(crate::seen::Seen::new(SEEN_CAPACITY)),
            working: Mutex::new(HashMap::new()),
        })
    }

    /// The bot's user id, once `run` has called `auth.test`.
    pub fn bot_user_id(&self) -> Option<String> {
        lock(&self.me).as_ref().map(|m| m.user_id.clone())
    }

    async fn auth_test(&self) -> Result<Me, AdapterError> {
        let answer = self
            .api
            .call("auth.test", &self.bot_token, &json!({}), CALL_TIMEOUT)
            .await
            .map_err(|e| {
                if api::is_auth(&e) {
                    AdapterError::Fatal(format!(
                        "Slack rejected the bot token ({e}); check SLACK_BOT_TOKEN"
                    ))
                } else {
                    AdapterError::Disconnected(format!("auth.test failed: {e}"))
                }
            })?;
        let Some(user_id) = answer.get("user_id").and_then(Value::as_str) else {
            return Err(AdapterError::Disconnected(
                "auth.test answered without a user_id".into(),
            ));
        };
        let me = Me {
            user_id: user_id.to_owned(),
        };
        *lock(&self.me) = Some(me.clone());
        Ok(me)
    }

    /// A fresh Socket Mode URL from `apps.connections.open`.
    async fn open_url(&self) -> Result<String, AdapterError> {
        let answer = self
            .api
            .call(
                "apps.connections.open",
                &self.app_token,
                &json!({}),
                CALL_TIMEOUT,
            )
            .await
            .map_err(|e| {
                if api::is_auth(&e) {
                    AdapterError::Fatal(format!(
                        "Slack rejected the app-level token ({e}); check SLACK_APP_TOKEN \
                         and that Socket Mode is on for the app"
                    ))
                } else {
                    AdapterError::Disconnected(format!("apps.connections.open failed: {e}"))
                }
            })?;
        match answer.get("url").and_then(Value::as_str) {
            Some(u) if u.starts_with("wss://") || u.starts_with("ws://") => Ok(u.to_owned()),
            _ => Err(AdapterError::Disconnected(
                "apps.connections.open answered without a WebSocket URL".into(),
            )),
        }
    }

    /// Serves one connection until it ends.
    async fn serve(&self, stream: ws::WsStream, me: &Me, ctx: &AdapterContext) -> Ended {
        let (mut sink, mut stream) = stream.split();
        let mut ticker = tokio::time::interval(self.ping_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.reset();
        let opened = Instant::now();
        let mut hello = false;
        // When the first ping since the last frame from Slack went out.
        let mut waiting_since: Option<Instant> = None;
        loop {
            tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(1),
                        sink.send(Message::Close(None)),
                    )
                    .await;
                    return Ended::Shutdown;
                }
                _ = ticker.tick() => {
                    if !hello && opened.elapsed() >= self.ping_timeout {
                        return Ended::Failed(AdapterError::Disconnected(format!(
                            "Slack sent no hello within {:?}",
                            self.ping_timeout
                        )));
                    }
                    if let Some(since) = waiting_since
                        && since.elapsed() >= self.ping_timeout
                    {
                        // A socket that swallows pings is dead however
                        // healthy its TCP connection looks.
                        ctx.liveness.set(Liveness::Degraded);
                        return Ended::Failed(AdapterError::Disconnected(format!(
                            "no answer from Slack for {:?}; reconnecting",
                            since.elapsed()
                        )));
                    }
                    if let Err(e) = self.write(&mut sink, Message::Ping(Vec::new().into())).await {
                        return Ended::Failed(e);
                    }
                    waiting_since.get_or_insert_with(Instant::now);
                }
                frame = stream.next() => {
                    let frame = match frame {
                        None => {
                            return Ended::Failed(AdapterError::Disconnected(
                                "Slack closed the Socket Mode connection".into(),
                            ));
                        }
                        Some(Err(e)) => {
                            return Ended::Failed(AdapterError::Disconnected(format!(
                                "the Socket Mode connection failed: {e}"
                            )));
                        }
                        Some(Ok(frame)) => frame,
                    };
                    waiting_since = None;
                    match frame {
                        Message::Text(text) => {
                            if let Some(ended) =
                                self.on_text(text.as_str(), &mut sink, me, ctx, &mut hello).await
                            {
                                return ended;
                            }
                        }
                        Message::Close(frame) => {
                            let why = frame.map(|f| f.reason.to_string()).unwrap_or_default();
                            return Ended::Failed(AdapterError::Disconnected(format!(
                                "Slack closed the Socket Mode connection {why}"
                            )));
                        }
                        // Pongs and pings only prove the socket is alive.
                        _ => {}
                    }
                }
            }
        }
    }

    async fn write(&self, sink: &mut Sink, message: Message) -> Result<(), AdapterError> {
        match tokio::time::timeout(self.ping_timeout, sink.send(message)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(AdapterError::Disconnected(format!(
                "cannot write to the Socket Mode connection: {e}"
            ))),
            Err(_) => Err(AdapterError::Disconnected(
                "writing to the Socket Mode connection timed out".into(),
            )),
        }
    }

    /// Handles one text frame; `Some` ends the connection.
    async fn on_text(
        &self,
        text: &str,
        sink: &mut Sink,
        me: &Me,
        ctx: &AdapterContext,
        hello: &mut bool,
    ) -> Option<Ended> {
        let frame: Value = match serde_json::from_str(text) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                tracing::warn!(
                    bytes = text.len(),
                    "skipping a Socket Mode frame that is not a JSON object"
                );
                return None;
            }
        };
        match frame.get("type").and_then(Value::as_str) {
            Some("hello") => {
                *hello = true;
                tracing::info!("connected to Slack (Socket Mode)");
                ctx.liveness.set(Liveness::Live);
                None
            }
            Some("disconnect") => {
                let reason = frame
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown")
                    .to_owned();
                if reason == "link_disabled" {
                    return Some(Ended::Failed(AdapterError::Fatal(
                        "Slack disabled Socket Mode for this app (link_disabled); \
                         turn it back on in the app's settings"
                            .into(),
                    )));
                }
                if *hello {
                    Some(Ended::Refresh(reason))
                } else {
                    Some(Ended::Failed(AdapterError::Disconnected(format!(
                        "Slack disconnected before hello ({reason})"
                    ))))
                }
            }
            kind => {
                let Some(envelope_id) = frame.get("envelope_id").and_then(Value::as_str) else {
                    tracing::debug!(?kind, "ignoring a Socket Mode frame without an envelope");
                    return None;
                };
                if kind == Some("events_api") {
                    if !self.hand_over(&frame, me, ctx).await {
                        return Some(Ended::Shutdown);
                    }
                } else {
                    // Slash commands and interactivity are not supported;
                    // acknowledged so Slack does not keep re-sending them.
                    tracing::debug!(?kind, "acknowledging an unsupported envelope");
                }
                let ack = json!({ "envelope_id": envelope_id }).to_string();
                if let Err(e) = self.write(sink, Message::Text(ack.into())).await {
                    return Some(Ended::Failed(e));
                }
                None
            }
        }
    }

    /// Hands the envelope's event to the inbox, unless it was handed over
    /// before. `false` means stop without acknowledging (shutdown, or the
    /// runner is gone).
    async fn hand_over(&self, frame: &Value, me: &Me, ctx: &AdapterContext) -> bool {
        let event_id = frame
            .pointer("/payload/event_id")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let retry = frame
            .get("retry_attempt")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let Some(raw) = frame.pointer("/payload/event") else {
            tracing::warn!("skipping an events_api envelope without an event");
            return true;
        };
        let parsed = match serde_json::from_value::<mapping::Event>(raw.clone()) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!("skipping a malformed Slack event: {e}");
                return true;
            }
        };
        let event = match mapping::map_event(&parsed, me, self.require_mention) {
            Ok(event) => event,
            Err(why) => {
                tracing::debug!(kind = %parsed.kind, "skipping event: {why}");
                return true;
            }
        };
        let mut keys = vec![format!(
            "m\u{1f}{}\u{1f}{}",
            event.source.chat_id,
            event.message_id.as_deref().unwrap_or("")
        )];
        if let Some(id) = &event_id {
            keys.push(format!("e\u{1f}{id}"));
        }
        if keys.iter().any(|k| lock(&self.seen).contains(k)) {
            tracing::debug!(retry, "dropping a message already handed over");
            return true;
        }
        // Noted first: the runner may ask for the typing reaction as soon
        // as it has the event.
        self.note_working(&event);
        tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return false,
            r = ctx.inbox.submit(event) => {
                if r.is_err() {
                    return false;
                }
            }
        }
        let mut seen = lock(&self.seen);
        for key in &keys {
            seen.first(key);
        }
        drop(seen);
        true
    }

    /// Remembers the message a "working" reaction would go on.
    fn note_working(&self, event: &MessageEvent) {
        if self.working_reaction.is_none() {
            return;
        }
        let Some(ts) = event.message_id.clone() else {
            return;
        };
        let mut working = lock(&self.working);
        if working.len() >= WORKING_CAPACITY {
            working.retain(|_, w| w.reacted);
            if working.len() >= WORKING_CAPACITY {
                working.clear();
            }
        }
        working.insert(
            (event.source.chat_id.clone(), event.source.thread_id.clone()),
            Working { ts, reacted: false },
        );
    }

    /// Removes the "working" reaction once the answer went out.
    async fn done_working(&self, chat_id: &str, thread_id: Option<&str>) {
        let Some(name) = &self.working_reaction else {
            return;
        };
        let key = (chat_id.to_owned(), thread_id.map(str::to_owned));
        let Some(w) = lock(&self.working).remove(&key) else {
            return;
        };
        if !w.reacted {
            return;
        }
        let params = json!({ "channel": chat_id, "timestamp": w.ts, "name": name });
        if let Err(e) = self
            .api
            .call("reactions.remove", &self.bot_token, &params, CALL_TIMEOUT)
            .await
        {
            tracing::debug!("cannot remove the working reaction: {e}");
        }
    }

    /// One Web API call with the bot token, waiting out rate limits a
    /// bounded number of times.
    async fn call_with_retries(&self, method: &str, params: &Value) -> Result<Value, SendError> {
        self.call_params_with_retries(method, api::Params::Json(params))
            .await
    }

    /// [`Self::call_with_retries`] with the parameters in either encoding.
    async fn call_params_with_retries(
        &self,
        method: &str,
        params: api::Params<'_>,
    ) -> Result<Value, SendError> {
        let mut retries = 0;
        loop {
            match self
                .api
                .call_with(method, &self.bot_token, params, CALL_TIMEOUT)
                .await
            {
                Ok(v) => return Ok(v),
                Err(e) => match api::rate_limit(&e) {
                    Some(after) => {
                        let wait = after.unwrap_or_default().max(Duration::from_secs(1));
                        if retries >= MAX_RATE_LIMIT_RETRIES || wait > MAX_RETRY_AFTER {
                            return Err(SendError::RateLimited(wait));
                        }
                        retries += 1;
                        tracing::info!(method, ?wait, "Slack rate limit; waiting");
                        tokio::time::sleep(wait).await;
                    }
                    None => return Err(classify(e)),
                },
            }
        }
    }
}

/// Maps a failed call to what the gateway's ledger understands: Slack's
/// own error codes say whether a retry can help; everything else reads as
/// the default.
fn classify(e: ApiError) -> SendError {
    match e.code() {
        Some(
            code @ ("internal_error" | "fatal_error" | "service_unavailable" | "request_timeout"),
        ) => SendError::Transient(code.to_owned()),
        // channel_not_found, not_in_channel, invalid_auth, is_archived,
        // msg_too_long, ...: the same request cannot succeed.
        Some(code) => SendError::Rejected(code.to_owned()),
        None => e.classify(),
    }
}

/// Every kind: Slack carries any file, as a file.
const MEDIA: &[MediaKind] = &[
    MediaKind::Image,
    MediaKind::Voice,
    MediaKind::Audio,
    MediaKind::Video,
    MediaKind::Document,
];

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    threads: true,
    markup: Markup::Mrkdwn,
    receives: MEDIA,
    sends: MEDIA,
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_MESSAGE_LEN,
        unit: LengthUnit::Chars,
    })
};

#[async_trait]
impl Adapter for SlackAdapter {
    fn platform(&self) -> &'static str {
        "slack"
    }

    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        Some(
            self.auth_test()
                .await
                .map(|me| format!("bot user {}", me.user_id)),
        )
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn credential(&self) -> Option<(&'static str, String)> {
        Some(("slack-app-token", self.app_token.expose().to_owned()))
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        ctx.liveness.set(Liveness::Connecting);
        let me = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = self.auth_test() => r?,
        };
        loop {
            let url = tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => return Ok(()),
                r = self.open_url() => r?,
            };
            let stream = tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => return Ok(()),
                r = ws::connect(&url, &[], CONNECT_TIMEOUT) => {
                    r.map_err(AdapterError::Disconnected)?
                }
            };
            match self.serve(stream, &me, &ctx).await {
                Ended::Shutdown => return Ok(()),
                Ended::Failed(e) => return Err(e),
                Ended::Refresh(reason) => {
                    // Unacknowledged envelopes come again on the new one.
                    tracing::info!(%reason, "Slack asked for a new connection");
                    ctx.liveness.set(Liveness::Connecting);
                }
            }
        }
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let mut params = json!({
            "channel": message.chat_id,
            "text": format::to_mrkdwn(&message.text),
            "mrkdwn": true,
        });
        if let Some(t) = message.thread_id.as_deref().filter(|t| !t.is_empty()) {
            params["thread_ts"] = json!(t);
        }
        let answer = self.call_with_retries("chat.postMessage", &params).await?;
        self.done_working(&message.chat_id, message.thread_id.as_deref())
            .await;
        Ok(SentMessage {
            message_id: answer.get("ts").and_then(Value::as_str).map(str::to_owned),
        })
    }

    async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        self.fetch_file(locator).await
    }

    async fn send_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        self.share_file(file).await
    }

    async fn typing(&self, chat_id: &str, thread_id: Option<&str>) -> Result<(), SendError> {
        let Some(name) = &self.working_reaction else {
            return Ok(());
        };
        let key = (chat_id.to_owned(), thread_id.map(str::to_owned));
        let ts = {
            let mut working = lock(&self.working);
            match working.get_mut(&key) {
                Some(w) if !w.reacted => {
                    w.reacted = true;
                    w.ts.clone()
                }
                // Already shown, or nothing to put it on.
                _ => return Ok(()),
            }
        };
        let params = json!({ "channel": chat_id, "timestamp": ts, "name": name });
        match self
            .api
            .call("reactions.add", &self.bot_token, &params, CALL_TIMEOUT)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("already_reacted") => Ok(()),
            Err(e) => Err(classify(e)),
        }
    }
}

/// The registry's entry for Slack.
pub const ENTRY: Platform = Platform {
    name: "slack",
    title: "Slack",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<SlackConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = SlackSettings::from_config(&setup.section()?, setup.env) else {
        return Ok(None);
    };
    let adapter = SlackAdapter::new(settings).map_err(BuildError::set_up)?;
    Ok(Some(Built::connected(adapter)))
}

#[cfg(test)]
mod tests;
