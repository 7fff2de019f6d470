//! The Discord adapter: the gateway WebSocket (API v10, JSON) for inbound
//! messages, REST for sending.
//!
//! [`DiscordAdapter::run`] connects, identifies (or resumes the previous
//! session), heartbeats, and hands each `MESSAGE_CREATE` to the gateway's
//! inbox. The session id, resume URL and last handled sequence number live
//! in the adapter, not in one `run` call, so when the supervisor reconnects
//! after a drop Discord replays what was missed instead of losing it.
//! Liveness is `Live` only once `READY` or `RESUMED` arrived.
//!
//! With a store ([`DiscordAdapter::keeping_session_in`]) the session, and
//! the thread map a resumed session gets no `GUILD_CREATE` for, are kept
//! there too (see `stored`), so a restarted process, or another node
//! taking the connector over, resumes with op 6 instead of identifying
//! afresh and losing what arrived meanwhile.
//!
//! Sends go to `POST /channels/{id}/messages` (a thread is its own
//! channel), honouring Discord's per-bucket limits and 429 `retry_after`.
//!
//! Files: an inbound attachment's locator is its CDN address, fetched
//! only from Discord's file hosts ([`rest::is_file_url`]); a file sent is
//! one message with `payload_json` and `files[0]` as multipart, streamed.

mod config;
mod format;
mod gateway;
mod mapping;
mod rest;
mod stored;

use crate::kept::Kept;
use crate::registry::{BuildError, Built, Platform, Setup, token_switch};
use std::fmt;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;
use serde_json::{Value, json};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Download, DownloadError, Liveness, LivenessReporter,
    MediaKind, MessageLimits, OutboundFile, OutboundMessage, SendError, SentMessage,
};
use talaria_adapter::{Capabilities, LengthUnit, Markup};
use talaria_core::{Env, Secret};

use gateway::End;
use rest::{FileUpload, Rest, RestError};

pub use config::{DiscordConfig, ENV};

/// Discord's message limit, in characters.
pub const MAX_MESSAGE_LEN: usize = 2000;

/// Beyond this no Discord account may upload a file (Nitro's 500 MiB): a
/// larger one is not tried. Below it, the channel's own limit (10 MiB
/// unless the server is boosted) is Discord's to enforce, and a file it
/// refuses as too large becomes a text line.
pub const MAX_UPLOAD_BYTES: u64 = 500 * 1024 * 1024;

/// How long fetching an attachment may take, body included.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(180);

/// How long an upload may take, body included.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// Connections in a row that Discord ends by asking for another (op 7,
/// op 9) before `run` lets the supervisor back off instead.
const MAX_QUICK_RECONNECTS: u32 = 3;

/// How long a send or typing request may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// Timings, configurable so tests need not wait for Discord's real ones.
/// The heartbeat interval is not here: Discord's Hello sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscordTimings {
    /// Opening the WebSocket, and waiting for Hello after it.
    pub connect_timeout: Duration,
    /// After a non-resumable Invalid Session, identify again after a
    /// random wait of up to this long (Discord asks for 1-5 seconds).
    pub reidentify_delay: Duration,
}

impl Default for DiscordTimings {
    fn default() -> DiscordTimings {
        DiscordTimings {
            connect_timeout: Duration::from_secs(20),
            reidentify_delay: Duration::from_secs(5),
        }
    }
}

/// What the adapter needs to connect.
#[derive(Debug, Clone)]
pub struct DiscordSettings {
    /// The bot token from the Developer Portal. Never logged.
    pub token: Secret,
    /// The REST root, `https://discord.com/api/v10` unless testing.
    pub api_base: String,
    /// The gateway WebSocket URL; `None` asks `GET {api_base}/gateway/bot`.
    pub gateway_url: Option<String>,
    /// In guild channels, submit only messages that mention the bot.
    pub require_mention: bool,
    /// Connect and re-identify waits (tests shorten them).
    pub timings: DiscordTimings,
}

impl DiscordSettings {
    /// Settings from `platforms.discord` and the environment, or `None`
    /// when Discord is off: `enabled: false`, or no token in
    /// `platforms.discord.token` nor `DISCORD_BOT_TOKEN`.
    pub fn from_config(config: &DiscordConfig, env: &Env) -> Option<DiscordSettings> {
        let token = token_switch(
            config.enabled,
            config.token.as_ref(),
            env,
            "platforms.discord.token",
            "DISCORD_BOT_TOKEN",
        )?;
        Some(DiscordSettings {
            token,
            api_base: config.api_base.clone(),
            gateway_url: config.gateway_url.clone().filter(|u| !u.trim().is_empty()),
            require_mention: config.require_mention,
            timings: DiscordTimings::default(),
        })
    }
}

/// Why the adapter could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscordError {
    /// The token is empty or has characters a header cannot carry.
    #[error("the Discord bot token is malformed")]
    BadToken,
    /// `api_base` is not an http(s) URL.
    #[error("platforms.discord.api_base is not an http(s) URL: {0}")]
    BadApiBase(String),
    /// `gateway_url` is not a ws(s) URL.
    #[error("platforms.discord.gateway_url is not a ws:// or wss:// URL: {0}")]
    BadGatewayUrl(String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// A gateway session that can be resumed.
#[derive(Debug, Clone)]
struct Session {
    id: String,
    resume_url: String,
    /// The last dispatch handled (handed to the inbox, or skipped).
    seq: u64,
}

#[derive(Debug, Default)]
struct State {
    session: Option<Session>,
    /// Counts the changes to `session`, for the copy in the store.
    revision: u64,
    /// The bot's user id, from READY (or `GET /users/@me`).
    bot_id: Option<String>,
    threads: mapping::Threads,
    /// The running connection's reporter, so sends can mark it degraded.
    liveness: Option<LivenessReporter>,
}

impl State {
    /// Replaces the session (a new one, or none when it cannot be
    /// resumed).
    fn set_session(&mut self, session: Option<Session>) {
        self.session = session;
        self.revision += 1;
    }
}

/// The Discord connector (see the module docs).
pub struct DiscordAdapter {
    rest: Rest,
    /// The REST root, whose host may serve files too (a test server, a
    /// proxy in front of Discord).
    api_url: reqwest::Url,
    token: Secret,
    gateway_url: Option<String>,
    require_mention: bool,
    timings: DiscordTimings,
    state: Mutex<State>,
    /// Where the session is kept between processes, when anywhere.
    kept: Option<Kept>,
}

impl fmt::Debug for DiscordAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiscordAdapter")
            .field("rest", &self.rest)
            .field("gateway_url", &self.gateway_url)
            .field("require_mention", &self.require_mention)
            .finish_non_exhaustive()
    }
}

impl DiscordAdapter {
    /// Checks the settings and builds the HTTP client; does not connect.
    pub fn new(settings: DiscordSettings) -> Result<DiscordAdapter, DiscordError> {
        let given = settings.token.expose().trim();
        let token = Secret::new(given.strip_prefix("Bot ").unwrap_or(given).trim());
        if token.expose().is_empty() || !token.expose().chars().all(|c| c.is_ascii_graphic()) {
            return Err(DiscordError::BadToken);
        }
        let api_base = settings.api_base.trim().trim_end_matches('/').to_owned();
        let api_url = match reqwest::Url::parse(&api_base) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => u,
            _ => return Err(DiscordError::BadApiBase(api_base)),
        };
        let gateway_url = settings.gateway_url.map(|u| u.trim().to_owned());
        if let Some(u) = &gateway_url {
            match reqwest::Url::parse(u) {
                Ok(p) if matches!(p.scheme(), "ws" | "wss") => {}
                _ => return Err(DiscordError::BadGatewayUrl(u.clone())),
            }
        }
        let rest = Rest::new(&api_base, &token).map_err(DiscordError::Client)?;
        Ok(DiscordAdapter {
            rest,
            api_url,
            token,
            gateway_url,
            require_mention: settings.require_mention,
            timings: settings.timings,
            state: Mutex::new(State::default()),
            kept: None,
        })
    }

    /// The bot's user id, once a session was READY (or, with a store,
    /// once `run` asked for it).
    pub fn bot_id(&self) -> Option<String> {
        self.state().bot_id.clone()
    }

    /// `GET /users/@me`: with a bot token, the bot's own user, as its id
    /// and username.
    async fn me(&self) -> Result<(String, String), AdapterError> {
        let answer = self
            .rest
            .request(
                Method::GET,
                "/users/@me",
                "GET /users/@me",
                "",
                None,
                Duration::from_secs(15),
            )
            .await;
        match answer {
            Ok(user) => {
                let id = user.get("id").and_then(Value::as_str).unwrap_or("");
                if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
                    return Err(AdapterError::Disconnected(
                        "Discord answered GET /users/@me without a user id".to_owned(),
                    ));
                }
                let name = user.get("username").and_then(Value::as_str).unwrap_or("?");
                Ok((id.to_owned(), name.to_owned()))
            }
            Err(e) if matches!(e.status(), Some(401 | 403)) => Err(AdapterError::Fatal(format!(
                "Discord rejected the bot token ({e}); check DISCORD_BOT_TOKEN"
            ))),
            Err(e) => Err(AdapterError::Disconnected(e.to_string())),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the connection degraded after a failed request, and live
    /// again after a good one (when a session is up).
    fn note_request(&self, ok: bool) {
        let state = self.state();
        if let Some(l) = &state.liveness {
            match (ok, l.get()) {
                (false, Liveness::Live) => l.set(Liveness::Degraded),
                (true, Liveness::Degraded) if state.session.is_some() => l.set(Liveness::Live),
                _ => {}
            }
        }
    }

    async fn post(
        &self,
        channel: &str,
        what: &str,
        body: Option<&Value>,
    ) -> Result<Value, SendError> {
        check_channel(channel)?;
        let result = self
            .rest
            .request(
                Method::POST,
                &format!("/channels/{channel}/{what}"),
                &format!("POST /channels/{{id}}/{what}"),
                channel,
                body,
                SEND_TIMEOUT,
            )
            .await;
        let result = result.map_err(RestError::classify);
        self.note_request(!matches!(
            result,
            Err(SendError::Transient(_) | SendError::Unavailable(_))
        ));
        result
    }

    /// Posts one message with `file` attached. `Ok(None)` when Discord
    /// refused the file as larger than the channel takes.
    async fn post_file(
        &self,
        channel: &str,
        payload: &Value,
        file: FileUpload<'_>,
    ) -> Result<Option<Value>, SendError> {
        check_channel(channel)?;
        let result = self
            .rest
            .upload(
                &format!("/channels/{channel}/messages"),
                "POST /channels/{id}/messages",
                channel,
                payload,
                file,
                UPLOAD_TIMEOUT,
            )
            .await;
        match result {
            // 413 (Discord's code 40005): over the channel's limit.
            Err(e) if e.status() == Some(413) => {
                self.note_request(true);
                Ok(None)
            }
            other => {
                let result = other.map_err(RestError::classify);
                self.note_request(!matches!(
                    result,
                    Err(SendError::Transient(_) | SendError::Unavailable(_))
                ));
                result.map(Some)
            }
        }
    }
}

impl DiscordAdapter {
    /// Connects again and again while Discord asks for it; each
    /// connection's end is written to the store before the next.
    async fn connections(&self, ctx: &AdapterContext) -> Result<(), AdapterError> {
        tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = self.restore() => r?,
        }
        let mut quick = 0;
        loop {
            let ended = self.session(ctx).await;
            self.save(true).await;
            match ended {
                Ok(End::Shutdown) => return Ok(()),
                Ok(End::Again { was_live, why }) => {
                    quick = if was_live { 1 } else { quick + 1 };
                    tracing::info!("{why}; reconnecting");
                    if quick > MAX_QUICK_RECONNECTS {
                        return Err(AdapterError::Disconnected(why));
                    }
                    ctx.liveness.set(Liveness::Connecting);
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// A channel id is a snowflake: digits only, so it is safe in a path.
fn check_channel(channel: &str) -> Result<(), SendError> {
    if channel.is_empty() || !channel.chars().all(|c| c.is_ascii_digit()) {
        return Err(SendError::Rejected(format!(
            "not a Discord channel id: {channel:?}"
        )));
    }
    Ok(())
}

/// The channel a message goes to: its thread (a channel of its own), else
/// the chat.
fn target_channel<'a>(chat_id: &'a str, thread_id: Option<&'a str>) -> &'a str {
    thread_id
        .filter(|t| !t.is_empty())
        .unwrap_or(chat_id)
        .trim()
}

/// `text` in Discord's markdown when that still fits one message, as
/// written when only that fits, `None` when neither does.
fn content_within_limit(text: &str) -> Option<String> {
    let formatted = format::to_discord(text);
    if formatted.chars().count() <= MAX_MESSAGE_LEN {
        Some(formatted)
    } else if text.chars().count() <= MAX_MESSAGE_LEN {
        Some(text.to_owned())
    } else {
        None
    }
}

/// Every kind, both ways: Discord carries any file as an attachment (and
/// marks voice messages recorded in its app with a flag).
const ALL_KINDS: &[MediaKind] = &[
    MediaKind::Image,
    MediaKind::Voice,
    MediaKind::Audio,
    MediaKind::Video,
    MediaKind::Document,
];

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    threads: true,
    markup: Markup::Markdown,
    receives: ALL_KINDS,
    sends: ALL_KINDS,
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_MESSAGE_LEN,
        unit: LengthUnit::Chars,
    })
};

#[async_trait]
impl Adapter for DiscordAdapter {
    fn platform(&self) -> &'static str {
        "discord"
    }

    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        Some(
            self.me()
                .await
                .map(|(id, username)| format!("{username} ({id})")),
        )
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn credential(&self) -> Option<(&'static str, String)> {
        Some(("discord-bot-token", self.token.expose().to_owned()))
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        ctx.liveness.set(Liveness::Connecting);
        self.state().liveness = Some(ctx.liveness.clone());
        let result = self.connections(&ctx).await;
        self.state().liveness = None;
        result
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        // A thread is a channel of its own.
        let channel = target_channel(&message.chat_id, message.thread_id.as_deref());
        let formatted = format::to_discord(&message.text);
        // The gateway split the plain text to fit; a conversion that grew
        // it past the limit is sent as written instead.
        let content = if formatted.chars().count() <= MAX_MESSAGE_LEN {
            formatted
        } else {
            message.text.clone()
        };
        let mut body = json!({
            "content": content,
            // Answers may quote @everyone or a role; they never ping it.
            "allowed_mentions": {"parse": ["users"], "replied_user": true},
        });
        if let Some(r) = message.reply_to.as_deref().filter(|r| !r.is_empty()) {
            // The anchor may have been deleted meanwhile; answer anyway.
            body["message_reference"] = json!({"message_id": r, "fail_if_not_exists": false});
        }
        let sent = self.post(channel, "messages", Some(&body)).await?;
        Ok(SentMessage {
            message_id: sent.get("id").and_then(Value::as_str).map(str::to_owned),
        })
    }

    async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        let not_discord =
            || DownloadError::Gone("the attachment is not a Discord file address".to_owned());
        let url = reqwest::Url::parse(locator.trim()).map_err(|_| not_discord())?;
        if !rest::is_file_url(&url, &self.api_url) {
            return Err(not_discord());
        }
        self.rest.fetch(url, DOWNLOAD_TIMEOUT).await
    }

    async fn send_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        let channel = target_channel(&file.chat_id, file.thread_id.as_deref());
        check_channel(channel)?;
        let size = tokio::fs::metadata(&file.path)
            .await
            .map_err(|e| {
                SendError::Rejected(format!(
                    "cannot read the file {} to send it: {e}",
                    file.name
                ))
            })?
            .len();
        let fallback = || OutboundMessage {
            chat_id: file.chat_id.clone(),
            thread_id: file.thread_id.clone(),
            reply_to: file.reply_to.clone(),
            text: file.fallback_text(self.platform()),
            choices: Vec::new(),
        };
        if size > MAX_UPLOAD_BYTES {
            return self.send(&fallback()).await;
        }
        let caption = file.caption.as_deref().filter(|c| !c.trim().is_empty());
        let content = caption.and_then(content_within_limit);
        let mut payload = json!({
            "allowed_mentions": {"parse": ["users"], "replied_user": true},
            "attachments": [{"id": 0, "filename": file.name}],
        });
        if let Some(c) = &content {
            payload["content"] = json!(c);
        }
        if let Some(r) = file.reply_to.as_deref().filter(|r| !r.is_empty()) {
            // The anchor may have been deleted meanwhile; answer anyway.
            payload["message_reference"] = json!({"message_id": r, "fail_if_not_exists": false});
        }
        let upload = FileUpload {
            path: &file.path,
            name: &file.name,
            mime: &file.mime,
        };
        let Some(sent) = self.post_file(channel, &payload, upload).await? else {
            tracing::info!(
                size,
                "Discord refused a file as too large; sending a line instead"
            );
            return self.send(&fallback()).await;
        };
        let sent = SentMessage {
            message_id: sent.get("id").and_then(Value::as_str).map(str::to_owned),
        };
        if let (Some(text), None) = (caption, &content) {
            // Too long to go with the file: it follows, answering it. The
            // file is out, so a part that fails is logged, not returned
            // (returning would have the file sent twice).
            let reply_to = sent.message_id.clone().or_else(|| file.reply_to.clone());
            for part in talaria_adapter::split::split_message(text, CAPABILITIES.limits) {
                let message = OutboundMessage {
                    chat_id: file.chat_id.clone(),
                    thread_id: file.thread_id.clone(),
                    reply_to: reply_to.clone(),
                    text: part,
                    choices: Vec::new(),
                };
                if let Err(e) = self.send(&message).await {
                    tracing::warn!("the caption after a file could not be sent: {e}");
                    break;
                }
            }
        }
        Ok(sent)
    }

    async fn typing(&self, chat_id: &str, thread_id: Option<&str>) -> Result<(), SendError> {
        let channel = thread_id
            .filter(|t| !t.is_empty())
            .unwrap_or(chat_id)
            .trim();
        self.post(channel, "typing", None).await.map(|_| ())
    }
}

/// The registry's entry for Discord.
pub const ENTRY: Platform = Platform {
    name: "discord",
    title: "Discord",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<DiscordConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = DiscordSettings::from_config(&setup.section()?, setup.env) else {
        return Ok(None);
    };
    let adapter = DiscordAdapter::new(settings)
        .map_err(BuildError::set_up)?
        .keeping_session_in(setup.cursors.clone());
    Ok(Some(Built::connected(adapter)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Failure;

    fn settings(token: &str) -> DiscordSettings {
        DiscordSettings {
            token: token.into(),
            api_base: "http://127.0.0.1:1/api/v10".into(),
            gateway_url: None,
            require_mention: true,
            timings: DiscordTimings::default(),
        }
    }

    #[test]
    fn from_config_reads_token_and_enabled() {
        let empty = Env::from_pairs(Vec::<(String, String)>::new());
        let env = Env::from_pairs([("DISCORD_BOT_TOKEN", " env.token ")]);
        let mut cfg = DiscordConfig::default();
        assert!(DiscordSettings::from_config(&cfg, &empty).is_none());
        let s = DiscordSettings::from_config(&cfg, &env).unwrap();
        assert_eq!(s.token, "env.token");
        assert_eq!(s.api_base, "https://discord.com/api/v10");
        assert!(s.require_mention);
        assert_eq!(s.gateway_url, None);
        cfg.token = Some(talaria_core::Secret::new("cfg.token"));
        assert_eq!(
            DiscordSettings::from_config(&cfg, &env).unwrap().token,
            "cfg.token"
        );
        cfg.enabled = Some(false);
        assert!(DiscordSettings::from_config(&cfg, &env).is_none());
    }

    #[test]
    fn new_validates_and_debug_hides_the_token() {
        assert_eq!(
            DiscordAdapter::new(settings("")).err(),
            Some(DiscordError::BadToken)
        );
        assert_eq!(
            DiscordAdapter::new(settings("a b")).err(),
            Some(DiscordError::BadToken)
        );
        let mut s = settings("SECRETSECRET.x.y");
        s.api_base = "ftp://x".into();
        assert!(matches!(
            DiscordAdapter::new(s),
            Err(DiscordError::BadApiBase(_))
        ));
        let mut s = settings("SECRETSECRET.x.y");
        s.gateway_url = Some("http://x".into());
        assert!(matches!(
            DiscordAdapter::new(s),
            Err(DiscordError::BadGatewayUrl(_))
        ));
        let s = settings("SECRETSECRET.x.y");
        assert!(!format!("{s:?}").contains("SECRETSECRET"));
        let a = DiscordAdapter::new(s).unwrap();
        assert!(!format!("{a:?}").contains("SECRETSECRET"));
        // A pasted "Bot " prefix is not part of the token.
        let a = DiscordAdapter::new(settings("Bot abc.def")).unwrap();
        assert_eq!(
            a.credential(),
            Some(("discord-bot-token", "abc.def".into()))
        );
    }

    #[test]
    fn errors_are_classified() {
        let failed = |failure| RestError::new(rest::DISCORD, failure);
        let status = |s: u16| {
            failed(Failure::Status {
                status: s,
                code: None,
                message: "x".into(),
                retry_after: None,
            })
        };
        let classify = RestError::classify;
        for s in [400, 401, 403, 404] {
            assert!(matches!(classify(status(s)), SendError::Rejected(_)), "{s}");
        }
        assert!(matches!(classify(status(502)), SendError::Transient(_)));
        assert!(matches!(
            classify(failed(Failure::Connect("refused".into()))),
            SendError::Unavailable(_)
        ));
        assert!(matches!(
            classify(failed(Failure::Timeout("slow".into()))),
            SendError::Ambiguous(_)
        ));
    }

    #[tokio::test]
    async fn a_refused_connection_is_unavailable() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut s = settings("SECRETSECRET.x.y");
        s.api_base = format!("http://127.0.0.1:{port}/api/v10");
        let a = DiscordAdapter::new(s).unwrap();
        let err = a
            .send(&OutboundMessage {
                chat_id: "1".into(),
                thread_id: None,
                reply_to: None,
                text: "hi".into(),
                choices: Vec::new(),
            })
            .await
            .unwrap_err();
        assert!(matches!(err, SendError::Unavailable(_)), "{err:?}");
        assert!(!err.to_string().contains("SECRETSECRET"), "{err}");
        assert!(matches!(
            a.send(&OutboundMessage {
                chat_id: "../x".into(),
                thread_id: None,
                reply_to: None,
                text: "hi".into(),
                choices: Vec::new(),
            })
            .await,
            Err(SendError::Rejected(_))
        ));
    }
}
