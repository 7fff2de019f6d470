//! The QQ Bot adapter: QQ's official API v2, the gateway WebSocket in and
//! the OpenAPI out.
//!
//! [`QqbotAdapter::run`] fetches an access token with the AppID and
//! AppSecret, asks `GET /gateway` where to connect, identifies with the
//! intents for C2C and group @-messages, guild @-messages and guild DMs
//! (or resumes the previous session), heartbeats, and hands each message
//! to the gateway's inbox (see [`mapping`] for how chats are named). The
//! session and the last handled sequence number live in the adapter, not
//! in one `run` call, so a reconnect resumes and QQ replays what was
//! missed; a message id seen before is not handed over twice.
//!
//! Sends are *passive replies* where QQ allows them: the message carries
//! the `msg_id` of the user's message it answers (every part of a split
//! answer does, each with the next `msg_seq`, since QQ refuses a repeated
//! `(msg_id, msg_seq)`), within QQ's window and per-message cap. Anything
//! else (a cron job's delivery, a home channel's notice, an answer past
//! the window) goes out without `msg_id` as a *proactive* message, which
//! QQ allows only a few times a month per user or group: a refusal is
//! reported, never retried blindly.
//!
//! Files: what users attach (images, voice, video, files) becomes
//! attachments fetched, with the bot's token, from QQ's media hosts only
//! (`media_hosts`; the address comes from the chat, so nowhere else); a
//! voice message QQ transcribed (`asr_refer_text`) arrives as its words.
//! A file sent to a user or a group is uploaded to `/v2/.../files` as
//! base64 `file_data` streamed from disk, then sent as a media message
//! (`msg_type` 7) with the `file_info` QQ answered, passively when it
//! can. Guild channels and guild DMs get a line naming the file instead:
//! their API takes files only as a multipart image form.

mod api;
mod config;
mod format;
mod gateway;
mod mapping;

use crate::registry::{BuildError, Built, Platform, Setup};
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;
use serde_json::{Value, json};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Download, DownloadError, Liveness, LivenessReporter,
    MediaKind, MessageEvent, MessageLimits, OutboundFile, OutboundMessage, SendError, SentMessage,
};
use talaria_adapter::{Capabilities, LengthUnit, Markup};
use talaria_core::config::{secret_or_env, text_or_env};
use talaria_core::{Env, Secret};
use tokio::time::Instant;

use api::{Api, ApiError, DUPLICATE_SEQ};
use gateway::End;
use mapping::Target;

pub use config::{DEFAULT_MEDIA_HOSTS, ENV, QqbotConfig};

/// The platform's name in keys and configuration.
pub const PLATFORM: &str = "qqbot";

/// The longest message sent, in characters: the ancestor splits at 4000.
pub const MAX_MESSAGE_LEN: usize = 4000;

/// How long a send or token request may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections in a row that QQ ends by asking for another (op 7, op 9)
/// before `run` lets the supervisor back off instead.
const MAX_QUICK_RECONNECTS: u32 = 3;

/// Message ids remembered against a second delivery.
const SEEN_CAP: usize = 1000;

/// Chats whose latest message is remembered for passive replies.
const PASSIVE_CAP: usize = 1000;

/// A typing notice lasts 60 s; it is renewed at most this often [anc].
const TYPING_EVERY: Duration = Duration::from_secs(50);

/// Retries of a reply QQ de-duplicated, each with the next `msg_seq`.
const MAX_SEQ_RETRIES: u32 = 3;

/// How long fetching one file may take, body included.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(120);

/// How long uploading one file may take.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// The largest file sent inline as `file_data` [?]. QQ's own limits are
/// higher (images 30 MB, video and files 100 MB per the community's
/// notes), but past this QQ wants its chunked upload, which this adapter
/// does not speak: such a file is refused with a reason.
pub const MAX_INLINE_UPLOAD: u64 = 20 * 1024 * 1024;

/// Timings, configurable so tests need not wait for QQ's real ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QqbotTimings {
    /// Opening the WebSocket (and fetching the token and URL first), and
    /// waiting for Hello after it.
    pub connect_timeout: Duration,
    /// After a non-resumable Invalid Session, identify again after this.
    pub reidentify_delay: Duration,
    /// After QQ closed the gateway as rate-limited (4008) [anc]: 60 s.
    pub rate_limited_pause: Duration,
}

impl Default for QqbotTimings {
    fn default() -> QqbotTimings {
        QqbotTimings {
            connect_timeout: Duration::from_secs(20),
            reidentify_delay: Duration::from_secs(2),
            rate_limited_pause: Duration::from_secs(60),
        }
    }
}

/// What the adapter needs to connect.
#[derive(Debug, Clone)]
pub struct QqbotSettings {
    /// The bot's AppID.
    pub app_id: String,
    /// The bot's AppSecret. Never logged.
    pub client_secret: Secret,
    /// The OpenAPI root.
    pub api_base: String,
    /// Where access tokens are fetched (`{bots_base}/app/getAppAccessToken`).
    pub token_url: String,
    /// The gateway URL; `None` asks `GET {api_base}/gateway`.
    pub gateway_url: Option<String>,
    /// Send C2C and group answers as Markdown.
    pub markdown: bool,
    /// Subscribe to every guild message (`GUILD_MESSAGES`).
    pub all_guild_messages: bool,
    /// Hosts (and their subdomains) attachments are fetched from.
    pub media_hosts: Vec<String>,
    /// Connect and reconnect waits (tests shorten them).
    pub timings: QqbotTimings,
}

/// Why the adapter could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QqbotError {
    /// Only one of AppID and AppSecret is set.
    #[error("QQ Bot needs both the AppID and the AppSecret; missing: {0}")]
    Missing(&'static str),
    /// The AppID or secret has characters a request cannot carry.
    #[error("the QQ AppID or AppSecret is malformed")]
    BadCredentials,
    /// A URL is not an http(s) (or, for the gateway, ws(s)) URL.
    #[error("platforms.qqbot.{0} is not a valid URL: {1}")]
    BadUrl(&'static str, String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

impl QqbotSettings {
    /// Settings from `platforms.qqbot` and the environment; `Ok(None)`
    /// when QQ Bot is off (`enabled: false`, or neither credential set).
    pub fn from_config(
        config: &QqbotConfig,
        env: &Env,
    ) -> Result<Option<QqbotSettings>, QqbotError> {
        let app_id = text_or_env(config.app_id.as_deref(), env, "QQ_APP_ID");
        let secret = secret_or_env(config.client_secret.as_ref(), env, "QQ_CLIENT_SECRET");
        if !config
            .enabled
            .unwrap_or(app_id.is_some() || secret.is_some())
        {
            return Ok(None);
        }
        let app_id = app_id.ok_or(QqbotError::Missing("app_id (QQ_APP_ID)"))?;
        let client_secret =
            secret.ok_or(QqbotError::Missing("client_secret (QQ_CLIENT_SECRET)"))?;
        Ok(Some(QqbotSettings {
            app_id,
            client_secret,
            api_base: config.api_base.trim().to_owned(),
            token_url: format!(
                "{}/app/getAppAccessToken",
                config.bots_base.trim().trim_end_matches('/')
            ),
            gateway_url: config.gateway_url.clone().filter(|u| !u.trim().is_empty()),
            markdown: config.markdown_support,
            all_guild_messages: config.all_guild_messages,
            media_hosts: config.media_hosts.clone(),
            timings: QqbotTimings::default(),
        }))
    }
}

/// A gateway session that can be resumed.
#[derive(Debug, Clone)]
struct Session {
    id: String,
    /// The last dispatch handled.
    seq: u64,
}

/// The latest user message of a chat, which answers can reply to
/// passively.
#[derive(Debug, Clone)]
struct Passive {
    msg_id: String,
    at: Instant,
    /// The next `msg_seq` to use with it.
    next_seq: u32,
    /// Replies sent with it (typing notices not counted).
    used: u32,
}

/// Ids handed over, oldest first, bounded.
#[derive(Debug, Default)]
struct Seen {
    order: VecDeque<String>,
    set: HashSet<String>,
}

impl Seen {
    fn contains(&self, id: &str) -> bool {
        self.set.contains(id)
    }

    fn insert(&mut self, id: String) {
        if self.set.insert(id.clone()) {
            self.order.push_back(id);
            while self.order.len() > SEEN_CAP {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }
}

#[derive(Debug, Default)]
struct State {
    session: Option<Session>,
    /// The bot's user id, from READY.
    bot_id: Option<String>,
    seen: Seen,
    /// Chat id -> its latest message, for passive replies.
    passive: HashMap<String, Passive>,
    /// Chat id -> when a typing notice last went out.
    typed: HashMap<String, Instant>,
    liveness: Option<LivenessReporter>,
}

/// The QQ Bot connector (see the module docs).
pub struct QqbotAdapter {
    api: Api,
    app_id: String,
    gateway_url: Option<String>,
    markdown: bool,
    intents: u64,
    media_hosts: Vec<String>,
    timings: QqbotTimings,
    state: Mutex<State>,
}

impl fmt::Debug for QqbotAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QqbotAdapter")
            .field("app_id", &self.app_id)
            .field("gateway_url", &self.gateway_url)
            .field("markdown", &self.markdown)
            .finish_non_exhaustive()
    }
}

fn http_url(key: &'static str, url: &str) -> Result<(), QqbotError> {
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") => Ok(()),
        _ => Err(QqbotError::BadUrl(key, url.to_owned())),
    }
}

impl QqbotAdapter {
    /// Checks the settings and builds the HTTP client; does not connect.
    pub fn new(settings: QqbotSettings) -> Result<QqbotAdapter, QqbotError> {
        let app_id = settings.app_id.trim().to_owned();
        let secret = Secret::new(settings.client_secret.expose().trim());
        let printable = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_graphic());
        if !printable(&app_id) || !printable(secret.expose()) {
            return Err(QqbotError::BadCredentials);
        }
        let api_base = settings.api_base.trim_end_matches('/').to_owned();
        http_url("api_base", &api_base)?;
        http_url("bots_base", &settings.token_url)?;
        if let Some(u) = &settings.gateway_url {
            match reqwest::Url::parse(u.trim()) {
                Ok(p) if matches!(p.scheme(), "ws" | "wss") => {}
                _ => return Err(QqbotError::BadUrl("gateway_url", u.clone())),
            }
        }
        let api = Api::new(&api_base, &settings.token_url, &app_id, &secret)
            .map_err(QqbotError::Client)?;
        let mut intents =
            gateway::GROUP_AND_C2C | gateway::PUBLIC_GUILD_MESSAGES | gateway::DIRECT_MESSAGE;
        if settings.all_guild_messages {
            intents |= gateway::GUILD_MESSAGES;
        }
        Ok(QqbotAdapter {
            api,
            app_id,
            gateway_url: settings.gateway_url.map(|u| u.trim().to_owned()),
            markdown: settings.markdown,
            intents,
            media_hosts: settings
                .media_hosts
                .iter()
                .map(|h| h.trim().trim_start_matches('.').to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect(),
            timings: settings.timings,
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers `ev` as its chat's latest message, to reply to passively.
    fn remember_inbound(&self, ev: &MessageEvent) {
        let Some(id) = ev.message_id.clone() else {
            return;
        };
        let mut state = self.state();
        // A message delivered again keeps the seqs its replies used.
        if state
            .passive
            .get(&ev.source.chat_id)
            .is_some_and(|p| p.msg_id == id)
        {
            return;
        }
        state.passive.insert(
            ev.source.chat_id.clone(),
            Passive {
                msg_id: id,
                at: Instant::now(),
                next_seq: 1,
                used: 0,
            },
        );
        if state.passive.len() > PASSIVE_CAP {
            let oldest = state
                .passive
                .iter()
                .min_by_key(|(_, p)| p.at)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                state.passive.remove(&k);
            }
        }
    }

    /// The `(msg_id, msg_seq)` to send a reply in `chat` with, when a
    /// passive reply is still allowed; `count` spends one of the
    /// message's replies (typing notices do not).
    fn passive_for(
        &self,
        chat: &str,
        target: &Target,
        reply_to: Option<&str>,
        count: bool,
    ) -> Option<(String, u32)> {
        let mut state = self.state();
        let now = Instant::now();
        let known = state.passive.get(chat).cloned();
        let entry = match (known, reply_to) {
            (Some(p), Some(r)) if p.msg_id != r => Passive {
                msg_id: r.to_owned(),
                at: now,
                next_seq: 1,
                used: 0,
            },
            (Some(p), _) => p,
            (None, Some(r)) => Passive {
                msg_id: r.to_owned(),
                at: now,
                next_seq: 1,
                used: 0,
            },
            (None, None) => return None,
        };
        if now.duration_since(entry.at) >= target.passive_window()
            || (count && entry.used >= target.passive_cap())
        {
            return None;
        }
        let picked = (entry.msg_id.clone(), entry.next_seq);
        let mut entry = entry;
        entry.next_seq += 1;
        if count {
            entry.used += 1;
        }
        state.passive.insert(chat.to_owned(), entry);
        Some(picked)
    }

    /// A `msg_seq` QQ said it had already seen: the next one is tried.
    fn next_seq(&self, chat: &str) -> Option<u32> {
        let mut state = self.state();
        let p = state.passive.get_mut(chat)?;
        let seq = p.next_seq;
        p.next_seq += 1;
        Some(seq)
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

    async fn post(&self, path: &str, body: &Value) -> Result<Value, ApiError> {
        let result = self
            .api
            .request(Method::POST, path, Some(body), SEND_TIMEOUT)
            .await;
        let failed_to_reach = matches!(
            &result,
            Err(e) if e.status().is_none() || e.status().is_some_and(|s| s >= 500)
        );
        self.note_request(!failed_to_reach);
        result
    }
    /// Whether `url` is on one of the media hosts (or a subdomain).
    fn media_host_allowed(&self, url: &reqwest::Url) -> bool {
        let Some(host) = url.host_str().map(str::to_ascii_lowercase) else {
            return false;
        };
        matches!(url.scheme(), "http" | "https")
            && self
                .media_hosts
                .iter()
                .any(|h| host == *h || host.ends_with(&format!(".{h}")))
    }

    /// Posts a message `body` to `chat`: passively (with the `msg_id` and
    /// the next `msg_seq`) while QQ allows, else proactively.
    async fn deliver(
        &self,
        chat: &str,
        target: &Target,
        reply_to: Option<&str>,
        mut body: Value,
    ) -> Result<SentMessage, SendError> {
        let passive = self.passive_for(chat, target, reply_to, true);
        if let Some((id, seq)) = &passive {
            body["msg_id"] = json!(id);
            if target.is_v2() {
                body["msg_seq"] = json!(seq);
            }
        } else {
            tracing::debug!(
                chat,
                "no passive reply possible; sending a proactive message"
            );
        }
        let path = target.messages_path();
        let mut tries = 0;
        loop {
            match self.post(&path, &body).await {
                Ok(sent) => {
                    return Ok(SentMessage {
                        message_id: sent.get("id").and_then(Value::as_str).map(str::to_owned),
                    });
                }
                Err(e) if is_duplicate_seq(&e) && passive.is_some() && tries < MAX_SEQ_RETRIES => {
                    // Another reply (a typing notice, a process before a
                    // restart) took that msg_seq.
                    tries += 1;
                    match self.next_seq(chat) {
                        Some(seq) => body["msg_seq"] = json!(seq),
                        None => return Err(classify(e)),
                    }
                }
                Err(e) => {
                    if passive.is_none() {
                        tracing::warn!(
                            chat,
                            "QQ refused a proactive message (QQ allows few per month): {e}"
                        );
                    }
                    return Err(classify(e));
                }
            }
        }
    }
}

/// QQ's `file_type` for a file: 1 image (PNG/JPEG), 2 video (MP4), 3
/// voice (SILK only), 4 any file. Other images, videos and all other
/// audio go as files.
fn file_type(file: &OutboundFile) -> u8 {
    let mime = file.mime.to_ascii_lowercase();
    match file.kind {
        MediaKind::Image if matches!(mime.as_str(), "image/png" | "image/jpeg" | "image/jpg") => 1,
        MediaKind::Video if mime == "video/mp4" => 2,
        MediaKind::Voice | MediaKind::Audio
            if mime.contains("silk") || file.name.to_ascii_lowercase().ends_with(".silk") =>
        {
            3
        }
        _ => 4,
    }
}

/// How a refusal reads for the ledger.
fn classify(e: ApiError) -> SendError {
    e.classify()
}

/// Whether `e` is QQ's "this `(msg_id, msg_seq)` was sent already".
fn is_duplicate_seq(e: &ApiError) -> bool {
    e.code()
        .and_then(|c| c.parse::<i64>().ok())
        .is_some_and(|c| c == DUPLICATE_SEQ)
}

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    markup: Markup::Markdown,
    receives: &[
        MediaKind::Image,
        MediaKind::Voice,
        MediaKind::Video,
        MediaKind::Document,
    ],
    sends: &[
        MediaKind::Image,
        MediaKind::Voice,
        MediaKind::Audio,
        MediaKind::Video,
        MediaKind::Document,
    ],
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_MESSAGE_LEN,
        unit: LengthUnit::Chars,
    })
};

#[async_trait]
impl Adapter for QqbotAdapter {
    fn platform(&self) -> &'static str {
        PLATFORM
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn credential(&self) -> Option<(&'static str, String)> {
        // The ancestor's scoped lock is per AppID: one gateway per bot.
        Some(("qqbot-appid", self.app_id.clone()))
    }

    /// `POST /app/getAppAccessToken` with the AppID and AppSecret, as the
    /// gateway makes it: QQ refuses credentials it does not know with a
    /// 4xx (`invalid appid or secret`), which is [`AdapterError::Fatal`].
    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        Some(match self.api.token(SEND_TIMEOUT).await {
            Ok(_) => Ok(format!("the bot with AppID {}", self.app_id)),
            Err(e) if matches!(e.status(), Some(400..=403)) => Err(AdapterError::Fatal(format!(
                "QQ refused the AppID/AppSecret ({e}); check QQ_APP_ID and QQ_CLIENT_SECRET"
            ))),
            Err(e) => Err(AdapterError::Disconnected(e.to_string())),
        })
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        ctx.liveness.set(Liveness::Connecting);
        self.state().liveness = Some(ctx.liveness.clone());
        let mut quick = 0;
        let result = loop {
            match self.session(&ctx).await {
                Ok(End::Shutdown) => break Ok(()),
                Ok(End::Again { was_live, why }) => {
                    quick = if was_live { 1 } else { quick + 1 };
                    tracing::info!("{why}; reconnecting");
                    if quick > MAX_QUICK_RECONNECTS {
                        break Err(AdapterError::Disconnected(why));
                    }
                    ctx.liveness.set(Liveness::Connecting);
                }
                Err(e) => {
                    if let AdapterError::Fatal(m) = &e {
                        tracing::error!("QQ Bot stopped: {m}");
                    }
                    break Err(e);
                }
            }
        };
        self.state().liveness = None;
        result
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let target = Target::parse(&message.chat_id).map_err(SendError::Rejected)?;
        let markdown = self.markdown && target.is_v2();
        let text = if markdown {
            message.text.clone()
        } else {
            let plain = format::to_plain(&message.text);
            if plain.chars().count() <= MAX_MESSAGE_LEN {
                plain
            } else {
                message.text.clone()
            }
        };
        let body = match (target.is_v2(), markdown) {
            (true, true) => json!({"markdown": {"content": text}, "msg_type": 2}),
            (true, false) => json!({"content": text, "msg_type": 0}),
            (false, _) => json!({"content": text}),
        };
        self.deliver(
            message.chat_id.trim(),
            &target,
            message.reply_to.as_deref(),
            body,
        )
        .await
    }

    async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        let url = reqwest::Url::parse(locator)
            .map_err(|_| DownloadError::Gone("not a QQ attachment address".to_owned()))?;
        if !self.media_host_allowed(&url) {
            // The address came from the chat: only QQ's own hosts get
            // the bot's token, or a request at all.
            return Err(DownloadError::Gone(format!(
                "{} is not one of QQ's media hosts (platforms.qqbot.media_hosts)",
                url.host_str().unwrap_or("that address")
            )));
        }
        let token = self
            .api
            .token(SEND_TIMEOUT)
            .await
            .map_err(|e| DownloadError::Unavailable(e.to_string()))?;
        let http = self.api.http().clone().hiding(&token, "<token>");
        let request = http.client().get(url).header(
            reqwest::header::AUTHORIZATION,
            format!("QQBot {}", token.expose()),
        );
        http.download(request, DOWNLOAD_TIMEOUT).await
    }

    async fn send_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        let target = Target::parse(&file.chat_id).map_err(SendError::Rejected)?;
        let Some(files_path) = target.files_path() else {
            // Guild channels and DMs: no v2 files endpoint.
            let line = OutboundMessage {
                chat_id: file.chat_id.clone(),
                thread_id: file.thread_id.clone(),
                reply_to: file.reply_to.clone(),
                text: file.fallback_text(PLATFORM),
                choices: Vec::new(),
            };
            return self.send(&line).await;
        };
        let size = tokio::fs::metadata(&file.path)
            .await
            .map_err(|e| SendError::Rejected(format!("cannot read {}: {e}", file.name)))?
            .len();
        if size > MAX_INLINE_UPLOAD {
            return Err(SendError::Rejected(format!(
                "{} is {size} bytes; QQ Bot sends files up to {MAX_INLINE_UPLOAD} bytes",
                file.name
            )));
        }
        let fields = json!({
            "file_type": file_type(file),
            "srv_send_msg": false,
            "file_name": file.name,
        });
        let uploaded = self
            .api
            .post_file_data(&files_path, &fields, &file.path, UPLOAD_TIMEOUT)
            .await;
        self.note_request(!matches!(&uploaded, Err(e) if e.status().is_none_or(|s| s >= 500)));
        let uploaded = uploaded.map_err(classify)?;
        let info = uploaded
            .get("file_info")
            .and_then(Value::as_str)
            .filter(|i| !i.is_empty())
            .ok_or_else(|| {
                SendError::Transient("QQ took the file but answered no file_info".to_owned())
            })?;
        let mut body = json!({"msg_type": 7, "media": {"file_info": info}});
        if let Some(caption) = file.caption.as_deref().filter(|c| !c.trim().is_empty()) {
            body["content"] = json!(caption);
        }
        self.deliver(file.chat_id.trim(), &target, file.reply_to.as_deref(), body)
            .await
    }

    async fn typing(&self, chat_id: &str, _thread_id: Option<&str>) -> Result<(), SendError> {
        // Only C2C has an input notice.
        let Ok(target @ Target::User(_)) = Target::parse(chat_id) else {
            return Ok(());
        };
        let chat = chat_id.trim();
        {
            let state = self.state();
            if state
                .typed
                .get(chat)
                .is_some_and(|at| at.elapsed() < TYPING_EVERY)
            {
                return Ok(());
            }
        }
        // It needs the message it is about: without one there is nothing
        // to show typing for.
        let Some((id, seq)) = self.passive_for(chat, &target, None, false) else {
            return Ok(());
        };
        {
            let mut state = self.state();
            state.typed.insert(chat.to_owned(), Instant::now());
            if state.typed.len() > PASSIVE_CAP {
                state.typed.retain(|_, at| at.elapsed() < TYPING_EVERY);
            }
        }
        let body = json!({"msg_type": 6, "msg_id": id, "msg_seq": seq,
            "input_notify": {"input_type": 1, "input_second": 60}});
        self.post(&target.messages_path(), &body)
            .await
            .map(|_| ())
            .map_err(classify)
    }
}

/// The registry's entry for QQ Bot.
pub const ENTRY: Platform = Platform {
    name: PLATFORM,
    title: "QQ Bot",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<QqbotConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = QqbotSettings::from_config(&setup.section()?, setup.env)
        .map_err(BuildError::misconfigured)?
    else {
        return Ok(None);
    };
    let adapter = QqbotAdapter::new(settings).map_err(BuildError::set_up)?;
    Ok(Some(Built::connected(adapter)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> QqbotSettings {
        QqbotSettings {
            app_id: "1024".into(),
            client_secret: Secret::new("SECRETSECRET"),
            api_base: "http://127.0.0.1:1".into(),
            token_url: "http://127.0.0.1:1/app/getAppAccessToken".into(),
            gateway_url: None,
            markdown: true,
            all_guild_messages: false,
            media_hosts: DEFAULT_MEDIA_HOSTS
                .iter()
                .map(|h| (*h).to_owned())
                .collect(),
            timings: QqbotTimings::default(),
        }
    }

    #[test]
    fn from_config_reads_the_ancestors_variables() {
        let none = Env::from_pairs(Vec::<(String, String)>::new());
        let cfg = QqbotConfig::default();
        assert!(QqbotSettings::from_config(&cfg, &none).unwrap().is_none());
        let env = Env::from_pairs([("QQ_APP_ID", " 1024 "), ("QQ_CLIENT_SECRET", "s3")]);
        let s = QqbotSettings::from_config(&cfg, &env).unwrap().unwrap();
        assert_eq!(
            (s.app_id.as_str(), s.client_secret.expose()),
            ("1024", "s3")
        );
        assert_eq!(s.api_base, "https://api.sgroup.qq.com");
        assert_eq!(s.token_url, "https://bots.qq.com/app/getAppAccessToken");
        assert!(s.markdown);
        let half = Env::from_pairs([("QQ_APP_ID", "1024")]);
        assert!(matches!(
            QqbotSettings::from_config(&cfg, &half),
            Err(QqbotError::Missing(_))
        ));
        let off = QqbotConfig {
            enabled: Some(false),
            ..QqbotConfig::default()
        };
        assert!(QqbotSettings::from_config(&off, &env).unwrap().is_none());
    }

    #[test]
    fn new_validates_and_debug_hides_the_secret() {
        let a = QqbotAdapter::new(settings()).unwrap();
        assert!(!format!("{a:?}").contains("SECRETSECRET"));
        assert_eq!(a.intents, (1 << 25) | (1 << 30) | (1 << 12));
        let mut s = settings();
        s.client_secret = Secret::new("a b");
        assert_eq!(QqbotAdapter::new(s).err(), Some(QqbotError::BadCredentials));
        let mut s = settings();
        s.gateway_url = Some("http://x".into());
        assert!(matches!(QqbotAdapter::new(s), Err(QqbotError::BadUrl(..))));
        let mut s = settings();
        s.all_guild_messages = true;
        assert_eq!(QqbotAdapter::new(s).unwrap().intents & (1 << 9), 1 << 9);
    }

    #[test]
    fn passive_replies_count_seq_and_cap() {
        let a = QqbotAdapter::new(settings()).unwrap();
        let user = Target::User("U".into());
        assert_eq!(a.passive_for("U", &user, None, true), None);
        let ev = MessageEvent {
            message_id: Some("m1".into()),
            ..MessageEvent::text(
                talaria_adapter::SessionSource {
                    platform: PLATFORM.into(),
                    chat_id: "U".into(),
                    chat_name: None,
                    chat_type: talaria_adapter::ChatType::Dm,
                    user_id: Some("U".into()),
                    user_name: None,
                    thread_id: None,
                    is_bot: false,
                },
                "hi",
            )
        };
        a.remember_inbound(&ev);
        // A typing notice takes a seq but not one of the replies.
        assert_eq!(
            a.passive_for("U", &user, None, false),
            Some(("m1".into(), 1))
        );
        for seq in 2..=5 {
            assert_eq!(
                a.passive_for("U", &user, None, true),
                Some(("m1".into(), seq))
            );
        }
        // C2C allows four replies to one message; then proactive.
        assert_eq!(a.passive_for("U", &user, None, true), None);
        // Another message named explicitly starts again.
        assert_eq!(
            a.passive_for("U", &user, Some("m2"), true),
            Some(("m2".into(), 1))
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_unavailable_and_bad_chats_rejected() {
        let a = QqbotAdapter::new(settings()).unwrap();
        let msg = |chat: &str| OutboundMessage {
            chat_id: chat.into(),
            thread_id: None,
            reply_to: None,
            text: "hi".into(),
            choices: Vec::new(),
        };
        let err = a.send(&msg("U1")).await.unwrap_err();
        assert!(matches!(err, SendError::Unavailable(_)), "{err:?}");
        assert!(!err.to_string().contains("SECRETSECRET"), "{err}");
        assert!(matches!(
            a.send(&msg("group:../x")).await,
            Err(SendError::Rejected(_))
        ));
    }
}
