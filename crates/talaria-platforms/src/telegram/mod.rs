//! The Telegram Bot API adapter, over long polling.
//!
//! [`TelegramAdapter::run`] polls `getUpdates` and hands each message to the
//! gateway's inbox; the update offset it sends Telegram advances only after
//! the inbox accepted the update, so a crash before hand-over means the
//! update is delivered again. [`TelegramAdapter`] sends with
//! `parse_mode: "HTML"` (a conservative markdown subset converted, all else
//! escaped) and falls back to plain text when Telegram rejects the markup.
//!
//! Files: an inbound attachment's locator is its `file_id`; [`Adapter::download`]
//! asks `getFile` for its path and streams `{base_url}/file/bot{token}/{path}`.
//! [`Adapter::send_file`] uploads with `sendPhoto`, `sendVoice`, `sendAudio`,
//! `sendVideo` or `sendDocument` (multipart, the file streamed from disk).

mod api;
mod config;
mod format;
mod mapping;

use crate::registry::{BuildError, Built, Platform, Setup, token_switch};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Download, DownloadError, Liveness, MediaKind,
    MessageLimits, OutboundFile, OutboundMessage, SendError, SentMessage,
};
use talaria_adapter::{Capabilities, LengthUnit, Markup};
use talaria_core::{Env, Secret};
use talaria_store::CursorStore;

use api::{Api, ApiError, File, SentResult, Update, User};
use mapping::{GENERAL_TOPIC, Me};

pub use config::{ENV, TelegramConfig};

/// Telegram's message limit, in UTF-16 code units.
pub const MAX_MESSAGE_LEN: usize = 4096;

/// Consecutive failed polls before `run` gives up and lets the supervisor
/// reconnect.
const MAX_POLL_FAILURES: u32 = 5;

/// Retries after a 429 before a send reports [`SendError::RateLimited`].
const MAX_RATE_LIMIT_RETRIES: u32 = 3;

/// Longer `retry_after` waits are not worth blocking a send for.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// How long a send, edit or chat action may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest file a bot may fetch through `getFile`.
pub const MAX_DOWNLOAD_BYTES: u64 = 20 * 1024 * 1024;

/// The largest file a bot may upload (multipart).
pub const MAX_UPLOAD_BYTES: u64 = 50 * 1024 * 1024;

/// The largest photo `sendPhoto` takes; a larger one goes as a document.
pub const MAX_PHOTO_BYTES: u64 = 10 * 1024 * 1024;

/// A caption's limit, in UTF-16 code units after the markup is parsed.
pub const MAX_CAPTION_LEN: usize = 1024;

/// How long fetching a file may take, body included (20 MB on a slow
/// link).
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(180);

/// How long an upload may take, body included (50 MB on a slow link).
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// Image types `sendPhoto` takes; others (GIF, HEIC, ...) go as documents
/// so they arrive as sent rather than recompressed or refused.
const PHOTO_TYPES: &[&str] = &["image/jpeg", "image/png", "image/webp"];

/// Voice-note types `sendVoice` plays as a voice message.
const VOICE_TYPES: &[&str] = &["audio/ogg", "audio/opus"];

/// Audio types `sendAudio` puts in the music player (MP3 and M4A).
const AUDIO_TYPES: &[&str] = &[
    "audio/mpeg",
    "audio/mp3",
    "audio/mp4",
    "audio/m4a",
    "audio/x-m4a",
];

/// Video types `sendVideo` plays inline (MPEG-4).
const VIDEO_TYPES: &[&str] = &["video/mp4"];

/// What the adapter needs to connect.
#[derive(Debug, Clone)]
pub struct TelegramSettings {
    /// The bot token from @BotFather. Never logged.
    pub token: Secret,
    /// The Bot API root; requests go to `{base_url}/bot{token}/{method}`.
    pub base_url: String,
    /// In groups, submit only messages that mention the bot, start with a
    /// command, or reply to the bot.
    pub require_mention: bool,
    /// How long each `getUpdates` long poll waits on the server.
    pub poll_timeout: Duration,
    /// Show answers growing by editing one message while they stream.
    pub streaming_edits: bool,
}

impl TelegramSettings {
    /// Settings from `platforms.telegram` and the environment, or `None`
    /// when Telegram is off: `enabled: false`, or no token in
    /// `platforms.telegram.token` nor `TELEGRAM_BOT_TOKEN`.
    /// `TELEGRAM_REQUIRE_MENTION=true` also turns on `require_mention`.
    pub fn from_config(config: &TelegramConfig, env: &Env) -> Option<TelegramSettings> {
        let token = token_switch(
            config.enabled,
            config.token.as_ref(),
            env,
            "platforms.telegram.token",
            "TELEGRAM_BOT_TOKEN",
        )?;
        let env_mention = env.flag("TELEGRAM_REQUIRE_MENTION") == Some(true);
        Some(TelegramSettings {
            token,
            base_url: config.base_url.clone(),
            require_mention: config.require_mention || env_mention,
            poll_timeout: Duration::from_secs(config.poll_timeout_secs),
            streaming_edits: config.streaming_edits,
        })
    }
}

/// Why the adapter could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TelegramError {
    /// The token is empty or cannot be part of a URL path.
    #[error("the Telegram bot token is malformed (expected something like 123456:ABC-DEF...)")]
    BadToken,
    /// `base_url` is not an http(s) URL.
    #[error("platforms.telegram.base_url is not an http(s) URL: {0}")]
    BadBaseUrl(String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// The platform's name: its adapter's, its section's and its cursors'.
const PLATFORM: &str = "telegram";

/// The Telegram connector (see the module docs).
#[derive(Debug)]
pub struct TelegramAdapter {
    api: Api,
    token: Secret,
    require_mention: bool,
    poll_timeout: Duration,
    streaming_edits: bool,
    /// The next `getUpdates` offset (last handed-over update id + 1), kept
    /// across `run` calls so a reconnect does not replay; 0 = none yet.
    offset: AtomicI64,
    /// The bot's identity, once `getMe` answered.
    me: Mutex<Option<Me>>,
    /// Where the offset is kept between processes: with a shared store,
    /// the node that takes the connector over starts where the last one
    /// stopped, instead of at what Telegram still holds unconfirmed.
    cursors: Option<Cursors>,
}

/// The store the offset is kept in; shown in debug output by name only.
#[derive(Clone)]
struct Cursors(Arc<dyn CursorStore>);

impl std::fmt::Debug for Cursors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CursorStore")
    }
}

impl TelegramAdapter {
    /// Checks the settings and builds the HTTP client; does not connect.
    pub fn new(settings: TelegramSettings) -> Result<TelegramAdapter, TelegramError> {
        let token = Secret::new(settings.token.expose().trim());
        let token_ok = !token.expose().is_empty()
            && token
                .expose()
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '_' | '-'));
        if !token_ok {
            return Err(TelegramError::BadToken);
        }
        let base_url = settings.base_url.trim().trim_end_matches('/').to_owned();
        match reqwest::Url::parse(&base_url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {}
            _ => return Err(TelegramError::BadBaseUrl(base_url)),
        }
        let api = Api::new(&base_url, &token).map_err(TelegramError::Client)?;
        Ok(TelegramAdapter {
            api,
            token,
            require_mention: settings.require_mention,
            poll_timeout: settings.poll_timeout,
            streaming_edits: settings.streaming_edits,
            offset: AtomicI64::new(0),
            me: Mutex::new(None),
            cursors: None,
        })
    }

    /// Keeps the `getUpdates` offset in `cursors` (under `telegram`,
    /// `offset:<bot id>`) as well as in memory.
    pub fn keeping_offset_in(mut self, cursors: Arc<dyn CursorStore>) -> TelegramAdapter {
        self.cursors = Some(Cursors(cursors));
        self
    }

    fn offset_cursor(me: &Me) -> String {
        // Per bot: another token's offsets mean nothing to this one.
        format!("offset:{}", me.id)
    }

    /// Takes the stored offset when it is ahead of the one in memory (a
    /// new process, or another node that ran the bot meanwhile).
    async fn load_offset(&self, me: &Me) {
        let Some(Cursors(cursors)) = &self.cursors else {
            return;
        };
        match cursors.cursor(PLATFORM, &Self::offset_cursor(me)).await {
            Ok(Some(stored)) => match stored.parse::<i64>() {
                Ok(offset) => {
                    self.offset.fetch_max(offset, Ordering::SeqCst);
                }
                Err(_) => {
                    tracing::warn!(%stored, "ignoring a stored Telegram offset that is not a number")
                }
            },
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the stored Telegram offset; starting from Telegram's")
            }
        }
    }

    /// Stores the offset after a batch was handed over. A failure costs
    /// at most a re-read after a takeover, which the gateway's duplicate
    /// check absorbs: it is logged, not fatal.
    async fn save_offset(&self, me: &Me) {
        let (Some(Cursors(cursors)), Some(offset)) = (&self.cursors, self.next_offset()) else {
            return;
        };
        if let Err(e) = cursors
            .set_cursor(PLATFORM, &Self::offset_cursor(me), &offset.to_string())
            .await
        {
            tracing::warn!(error = %e, "cannot store the Telegram offset");
        }
    }

    /// The bot's `@username`, once `run` has called `getMe`.
    pub fn bot_username(&self) -> Option<String> {
        self.me
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|m| m.username.clone())
    }

    fn next_offset(&self) -> Option<i64> {
        match self.offset.load(Ordering::SeqCst) {
            0 => None,
            o => Some(o),
        }
    }

    async fn get_me(&self) -> Result<Me, AdapterError> {
        let user: User = self
            .api
            .call("getMe", &json!({}), Duration::from_secs(30))
            .await
            .map_err(|e| match e.status() {
                Some(401 | 404) => AdapterError::Fatal(format!(
                    "Telegram rejected the bot token ({e}); check TELEGRAM_BOT_TOKEN"
                )),
                _ => AdapterError::Disconnected(e.to_string()),
            })?;
        let me = Me {
            id: user.id,
            username: user.username.unwrap_or_default(),
        };
        *self.me.lock().unwrap_or_else(|p| p.into_inner()) = Some(me.clone());
        Ok(me)
    }

    async fn poll(&self) -> Result<Vec<Value>, ApiError> {
        let mut params = json!({
            "timeout": self.poll_timeout.as_secs(),
            // Edits would re-run a turn; everything else has no text.
            "allowed_updates": ["message", "channel_post"],
        });
        if let Some(o) = self.next_offset() {
            params["offset"] = json!(o);
        }
        // The server holds the request for up to `timeout`; allow for that.
        let http_timeout = self.poll_timeout + Duration::from_secs(10);
        self.api.call("getUpdates", &params, http_timeout).await
    }

    /// Hands over one update. `Ok(false)` means stop (shutdown or the
    /// runner is gone) without confirming it.
    async fn hand_over(&self, raw: Value, me: &Me, ctx: &AdapterContext) -> bool {
        let Some(id) = raw.get("update_id").and_then(Value::as_i64) else {
            tracing::warn!("skipping a Telegram update without update_id");
            return true;
        };
        if self.next_offset().is_some_and(|o| id < o) {
            // Already handed over (a poll that raced a reconnect).
            return true;
        }
        match serde_json::from_value::<Update>(raw) {
            Err(e) => tracing::warn!(update_id = id, "skipping a malformed Telegram update: {e}"),
            Ok(update) => match update.message.as_ref().or(update.channel_post.as_ref()) {
                None => tracing::debug!(update_id = id, "skipping a non-message update"),
                Some(msg) => match mapping::map_message(msg, me, self.require_mention) {
                    Err(why) => tracing::debug!(update_id = id, "skipping message: {why}"),
                    Ok(event) => {
                        tokio::select! {
                            biased;
                            _ = ctx.shutdown.cancelled() => return false,
                            r = ctx.inbox.submit(event) => {
                                if r.is_err() {
                                    return false;
                                }
                            }
                        }
                    }
                },
            },
        }
        // Confirm only now: Telegram forgets it once a later offset is sent.
        self.offset.fetch_max(id + 1, Ordering::SeqCst);
        true
    }

    /// One Bot API call for sending, with the 429 and markup fallbacks.
    /// `plain` is the text to send without `parse_mode` when Telegram
    /// cannot parse the HTML.
    async fn call_send(
        &self,
        method: &str,
        params: Value,
        plain: &str,
    ) -> Result<Value, SendError> {
        let markup = params.get("parse_mode").is_some();
        let api = &self.api;
        self.retrying(method, markup, |as_plain| {
            let mut params = params.clone();
            if as_plain && let Some(obj) = params.as_object_mut() {
                obj.remove("parse_mode");
                obj.insert("text".into(), json!(plain));
            }
            async move { Ok(api.call::<Value>(method, &params, SEND_TIMEOUT).await) }
        })
        .await
    }

    /// Runs `attempt` until it is answered, waiting out 429s (a few times,
    /// briefly) and trying once more without markup when Telegram cannot
    /// parse it (`attempt(true)`). An attempt's own `Err` (a local failure
    /// before anything was sent) ends it as is.
    async fn retrying<F, Fut>(
        &self,
        method: &str,
        markup: bool,
        mut attempt: F,
    ) -> Result<Value, SendError>
    where
        F: FnMut(bool) -> Fut,
        Fut: std::future::Future<Output = Result<Result<Value, ApiError>, SendError>>,
    {
        let mut rate_retries = 0;
        let mut fell_back = false;
        loop {
            match attempt(fell_back).await? {
                Ok(v) => return Ok(v),
                Err(e) if e.status() == Some(429) => {
                    let wait = e
                        .retry_after()
                        .unwrap_or_default()
                        .max(Duration::from_secs(1));
                    if rate_retries >= MAX_RATE_LIMIT_RETRIES || wait > MAX_RETRY_AFTER {
                        return Err(SendError::RateLimited(wait));
                    }
                    rate_retries += 1;
                    tracing::info!(method, ?wait, "Telegram rate limit; waiting");
                    tokio::time::sleep(wait).await;
                }
                Err(e)
                    if e.status() == Some(400)
                        && !fell_back
                        && markup
                        && e.message().contains("can't parse entities") =>
                {
                    tracing::warn!(
                        method,
                        "Telegram rejected the markup ({}); sending plain text",
                        e.message()
                    );
                    fell_back = true;
                }
                Err(e) => return Err(classify(e)),
            }
        }
    }

    /// Uploads `file` with `upload`'s method, streamed from disk (a new
    /// stream for each attempt). `caption` is sent as HTML, or as written
    /// when Telegram cannot parse the HTML.
    async fn upload(
        &self,
        file: &OutboundFile,
        upload: Upload,
        caption: Option<&str>,
    ) -> Result<SentMessage, SendError> {
        let api = &self.api;
        let result = self
            .retrying(upload.method, caption.is_some(), |as_plain| async move {
                let part = crate::http::file_part(&file.path, &file.name, &file.mime)
                    .await
                    .map_err(|e| unreadable(file, &e))?;
                let mut form =
                    reqwest::multipart::Form::new().text("chat_id", file.chat_id.trim().to_owned());
                if let Some(t) = topic_param(file.thread_id.as_deref()) {
                    form = form.text("message_thread_id", t.to_string());
                }
                if let Some(r) = reply_param(file.reply_to.as_deref()) {
                    form = form
                        .text("reply_to_message_id", r.to_string())
                        // The anchor may have been deleted meanwhile.
                        .text("allow_sending_without_reply", "true");
                }
                if let Some(c) = caption {
                    form = if as_plain {
                        form.text("caption", c.to_owned())
                    } else {
                        form.text("caption", format::to_html(c))
                            .text("parse_mode", "HTML")
                    };
                }
                form = form.part(upload.field, part);
                Ok(api
                    .upload::<Value>(upload.method, form, UPLOAD_TIMEOUT)
                    .await)
            })
            .await?;
        let message_id = serde_json::from_value::<SentResult>(result)
            .ok()
            .and_then(|r| r.message_id)
            .map(|id| id.to_string());
        Ok(SentMessage { message_id })
    }

    /// The text line in place of a file Telegram cannot carry.
    async fn send_fallback(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        self.send(&OutboundMessage {
            chat_id: file.chat_id.clone(),
            thread_id: file.thread_id.clone(),
            reply_to: file.reply_to.clone(),
            text: file.fallback_text(self.platform()),
            choices: Vec::new(),
        })
        .await
    }
}

/// How one file goes to Telegram: the method and the form field that
/// holds the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Upload {
    method: &'static str,
    field: &'static str,
}

impl Upload {
    const PHOTO: Upload = Upload {
        method: "sendPhoto",
        field: "photo",
    };
    const VOICE: Upload = Upload {
        method: "sendVoice",
        field: "voice",
    };
    const AUDIO: Upload = Upload {
        method: "sendAudio",
        field: "audio",
    };
    const VIDEO: Upload = Upload {
        method: "sendVideo",
        field: "video",
    };
    const DOCUMENT: Upload = Upload {
        method: "sendDocument",
        field: "document",
    };

    /// The call for a file of `kind` and `mime` (both from its bytes) of
    /// `size` bytes. Whatever the specialised calls would refuse or
    /// mangle (a GIF, a photo over 10 MB, a WAV) goes as a document,
    /// which carries any file as it is.
    fn choose(kind: MediaKind, mime: &str, size: u64) -> Upload {
        let mime = mime
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let is = |types: &[&str]| types.contains(&mime.as_str());
        match kind {
            MediaKind::Image if is(PHOTO_TYPES) && size <= MAX_PHOTO_BYTES => Upload::PHOTO,
            MediaKind::Voice if is(VOICE_TYPES) => Upload::VOICE,
            MediaKind::Voice | MediaKind::Audio if is(AUDIO_TYPES) => Upload::AUDIO,
            MediaKind::Video if is(VIDEO_TYPES) => Upload::VIDEO,
            _ => Upload::DOCUMENT,
        }
    }
}

/// A file that vanished or cannot be read before it was sent: nothing
/// went out, and trying again will not help.
fn unreadable(file: &OutboundFile, e: &std::io::Error) -> SendError {
    SendError::Rejected(format!(
        "cannot read the file {} to send it: {e}",
        file.name
    ))
}

/// The `reply_to_message_id` for a reply anchor, when it is a message id.
fn reply_param(reply_to: Option<&str>) -> Option<i64> {
    reply_to.and_then(|r| r.trim().parse::<i64>().ok())
}

/// Whether `locator` can be a Bot API `file_id` (URL-safe base64), so
/// nothing else (a URL, a path) is ever passed on.
fn is_file_id(locator: &str) -> bool {
    !locator.is_empty()
        && locator.len() <= 256
        && locator
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
}

/// What a failed `getFile` means for the file: too big for bots, gone
/// (an unknown or expired file id), or a failure a later try may get past
/// (a revoked token included: nothing is wrong with the file).
fn get_file_error(e: ApiError) -> DownloadError {
    match e.status() {
        Some(400) if e.message().contains("too big") => DownloadError::TooLarge(e.to_string()),
        Some(401 | 404) => {
            DownloadError::Unavailable(format!("Telegram rejected the bot token: {}", e.message()))
        }
        Some(400 | 403) => DownloadError::Gone(e.to_string()),
        _ => DownloadError::Unavailable(e.to_string()),
    }
}

/// Maps a failed call to what the gateway's ledger understands: Telegram
/// answers a bad token with 401 or 404, a message it will never take with
/// 400 or 403 (said in its own words), and anything else may pass later.
fn classify(e: ApiError) -> SendError {
    match e.status() {
        // A revoked token: nothing was sent, and it may work once fixed.
        Some(401 | 404) => {
            SendError::Unavailable(format!("Telegram rejected the bot token: {}", e.message()))
        }
        Some(400 | 403) => SendError::Rejected(e.message().to_owned()),
        Some(status) => SendError::Transient(format!("{status}: {}", e.message())),
        None => e.classify(),
    }
}

/// Chat ids are numbers, or `@username` for public channels.
fn chat_id_value(chat_id: &str) -> Value {
    match chat_id.trim().parse::<i64>() {
        Ok(n) => json!(n),
        Err(_) => json!(chat_id),
    }
}

/// The `message_thread_id` to send for a thread id: none for the General
/// topic, which Telegram addresses by leaving it out.
fn topic_param(thread_id: Option<&str>) -> Option<i64> {
    thread_id
        .filter(|t| *t != GENERAL_TOPIC)
        .and_then(|t| t.trim().parse().ok())
}

/// Telegram carries every kind: photos, voice notes, audio, video and
/// documents, both ways.
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
    edits: true,
    markup: Markup::Html,
    group_chat_allowlist: true,
    receives: ALL_KINDS,
    sends: ALL_KINDS,
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_MESSAGE_LEN,
        unit: LengthUnit::Utf16,
    })
};

#[async_trait]
impl Adapter for TelegramAdapter {
    fn platform(&self) -> &'static str {
        "telegram"
    }

    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        Some(self.get_me().await.map(|me| match me.username.as_str() {
            "" => format!("bot {}", me.id),
            name => format!("@{name} (bot {})", me.id),
        }))
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn credential(&self) -> Option<(&'static str, String)> {
        Some(("telegram-bot-token", self.token.expose().to_owned()))
    }

    fn streaming_edits(&self) -> bool {
        self.streaming_edits
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        ctx.liveness.set(Liveness::Connecting);
        let me = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = self.get_me() => r?,
        };
        tracing::info!(bot = %me.username, "connected to Telegram");
        self.load_offset(&me).await;
        // A webhook left behind by another deployment makes getUpdates fail.
        let no_params = json!({});
        tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = self.api.call::<Value>("deleteWebhook", &no_params, Duration::from_secs(30)) => {
                if let Err(e) = r {
                    tracing::warn!("deleteWebhook failed: {e}");
                }
            }
        }
        let mut failures = 0u32;
        loop {
            let polled = tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => return Ok(()),
                r = self.poll() => r,
            };
            match polled {
                Ok(updates) => {
                    failures = 0;
                    ctx.liveness.set(Liveness::Live);
                    let taken = !updates.is_empty();
                    for raw in updates {
                        if !self.hand_over(raw, &me, &ctx).await {
                            self.save_offset(&me).await;
                            return Ok(());
                        }
                    }
                    if taken {
                        self.save_offset(&me).await;
                    }
                }
                Err(e) if e.status() == Some(401) => {
                    return Err(AdapterError::Fatal(format!(
                        "Telegram rejected the bot token ({e}); check TELEGRAM_BOT_TOKEN"
                    )));
                }
                Err(e) => {
                    failures += 1;
                    ctx.liveness.set(Liveness::Degraded);
                    tracing::warn!(failures, "getUpdates failed: {e}");
                    if failures >= MAX_POLL_FAILURES {
                        return Err(AdapterError::Disconnected(e.to_string()));
                    }
                    let backoff = match e.retry_after() {
                        Some(wait) => wait.min(MAX_RETRY_AFTER),
                        None => Duration::from_millis(250 * (1 << failures.min(4))),
                    };
                    tokio::select! {
                        biased;
                        _ = ctx.shutdown.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                }
            }
        }
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let mut params = json!({
            "chat_id": chat_id_value(&message.chat_id),
            "text": format::to_html(&message.text),
            "parse_mode": "HTML",
        });
        if let Some(t) = topic_param(message.thread_id.as_deref()) {
            params["message_thread_id"] = json!(t);
        }
        if let Some(r) = reply_param(message.reply_to.as_deref()) {
            params["reply_to_message_id"] = json!(r);
            // The anchor may have been deleted meanwhile; answer anyway.
            params["allow_sending_without_reply"] = json!(true);
        }
        let result = self.call_send("sendMessage", params, &message.text).await?;
        let message_id = serde_json::from_value::<SentResult>(result)
            .ok()
            .and_then(|r| r.message_id)
            .map(|id| id.to_string());
        Ok(SentMessage { message_id })
    }

    async fn edit(&self, chat_id: &str, message_id: &str, text: &str) -> Result<(), SendError> {
        let Ok(id) = message_id.trim().parse::<i64>() else {
            return Err(SendError::Rejected(format!(
                "not a Telegram message id: {message_id}"
            )));
        };
        let params = json!({
            "chat_id": chat_id_value(chat_id),
            "message_id": id,
            "text": format::to_html(text),
            "parse_mode": "HTML",
        });
        match self.call_send("editMessageText", params, text).await {
            Ok(_) => Ok(()),
            // The text is already what we want.
            Err(SendError::Rejected(d)) if d.contains("message is not modified") => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn typing(&self, chat_id: &str, thread_id: Option<&str>) -> Result<(), SendError> {
        let mut params = json!({ "chat_id": chat_id_value(chat_id), "action": "typing" });
        if let Some(t) = topic_param(thread_id) {
            params["message_thread_id"] = json!(t);
        }
        self.api
            .call::<Value>("sendChatAction", &params, SEND_TIMEOUT)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        // The locator came from an inbound payload: only ever a file id,
        // fetched through this bot's own server, never an address.
        if !is_file_id(locator) {
            return Err(DownloadError::Gone(
                "the attachment is not a Telegram file address".to_owned(),
            ));
        }
        let params = json!({ "file_id": locator });
        let file: File = self
            .api
            .call("getFile", &params, SEND_TIMEOUT)
            .await
            .map_err(get_file_error)?;
        if let Some(size) = file.file_size.filter(|s| *s > MAX_DOWNLOAD_BYTES) {
            return Err(DownloadError::TooLarge(format!(
                "the file is {size} bytes; Telegram lets bots fetch up to {MAX_DOWNLOAD_BYTES}"
            )));
        }
        let Some(path) = file.file_path else {
            return Err(DownloadError::Gone(
                "Telegram gave no path to fetch the file from".to_owned(),
            ));
        };
        self.api.download_file(&path, DOWNLOAD_TIMEOUT).await
    }

    async fn send_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        let size = tokio::fs::metadata(&file.path)
            .await
            .map_err(|e| unreadable(file, &e))?
            .len();
        if size > MAX_UPLOAD_BYTES {
            tracing::info!(
                size,
                "a file over Telegram's upload limit; sending a line instead"
            );
            return self.send_fallback(file).await;
        }
        let upload = Upload::choose(file.kind, &file.mime, size);
        let caption = file.caption.as_deref().filter(|c| !c.trim().is_empty());
        // A caption over Telegram's limit follows as a message of its own
        // (split to the message limit), answering the file.
        let (inline, after) = match caption {
            Some(c) if c.encode_utf16().count() > MAX_CAPTION_LEN => (None, Some(c)),
            c => (c, None),
        };
        let sent = self.upload(file, upload, inline).await?;
        if let Some(text) = after {
            // The file is out: failing now would have it sent twice, so a
            // part that cannot be sent is logged, not returned.
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
}

/// The registry's entry for Telegram.
pub const ENTRY: Platform = Platform {
    name: "telegram",
    title: "Telegram",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<TelegramConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = TelegramSettings::from_config(&setup.section()?, setup.env) else {
        return Ok(None);
    };
    let adapter = TelegramAdapter::new(settings)
        .map_err(BuildError::set_up)?
        .keeping_offset_in(setup.cursors.clone());
    Ok(Some(Built::connected(adapter)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(token: &str, base_url: &str) -> TelegramSettings {
        TelegramSettings {
            token: token.into(),
            base_url: base_url.into(),
            require_mention: false,
            poll_timeout: Duration::from_secs(1),
            streaming_edits: false,
        }
    }

    #[test]
    fn from_config_reads_token_and_enabled() {
        let empty = Env::from_pairs(Vec::<(String, String)>::new());
        let env = Env::from_pairs([("TELEGRAM_BOT_TOKEN", "1:env")]);
        let mut cfg = TelegramConfig::default();
        assert!(TelegramSettings::from_config(&cfg, &empty).is_none());
        let s = TelegramSettings::from_config(&cfg, &env).unwrap();
        assert_eq!(s.token, "1:env");
        assert_eq!(s.base_url, "https://api.telegram.org");
        assert_eq!(s.poll_timeout, Duration::from_secs(30));
        cfg.token = Some(talaria_core::Secret::new("2:cfg"));
        assert_eq!(
            TelegramSettings::from_config(&cfg, &env).unwrap().token,
            "2:cfg"
        );
        cfg.enabled = Some(false);
        assert!(TelegramSettings::from_config(&cfg, &env).is_none());
    }

    #[test]
    fn debug_never_shows_the_token() {
        let s = settings("123456:SECRETSECRETSECRET", "http://127.0.0.1:1");
        assert!(!format!("{s:?}").contains("SECRETSECRET"));
        let a = TelegramAdapter::new(s).unwrap();
        assert!(!format!("{a:?}").contains("SECRETSECRET"));
    }

    #[test]
    fn new_validates() {
        assert_eq!(
            TelegramAdapter::new(settings("", "http://x")).err(),
            Some(TelegramError::BadToken)
        );
        assert_eq!(
            TelegramAdapter::new(settings("1:a/b", "http://x")).err(),
            Some(TelegramError::BadToken)
        );
        assert!(matches!(
            TelegramAdapter::new(settings("1:a", "ftp://x")),
            Err(TelegramError::BadBaseUrl(_))
        ));
    }

    #[tokio::test]
    async fn connection_refused_is_unavailable_and_redacted() {
        // Bind then drop to get a port nothing listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let a = TelegramAdapter::new(settings(
            "123456:SECRETSECRETSECRET",
            &format!("http://127.0.0.1:{port}"),
        ))
        .unwrap();
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
    }

    #[test]
    fn uploads_are_chosen_by_kind_type_and_size() {
        let choose = Upload::choose;
        assert_eq!(choose(MediaKind::Image, "image/png", 10), Upload::PHOTO);
        assert_eq!(
            choose(MediaKind::Image, "IMAGE/JPEG", MAX_PHOTO_BYTES),
            Upload::PHOTO
        );
        assert_eq!(
            choose(MediaKind::Image, "image/png", MAX_PHOTO_BYTES + 1),
            Upload::DOCUMENT
        );
        assert_eq!(choose(MediaKind::Image, "image/gif", 10), Upload::DOCUMENT);
        assert_eq!(choose(MediaKind::Voice, "audio/ogg", 10), Upload::VOICE);
        assert_eq!(choose(MediaKind::Voice, "audio/mpeg", 10), Upload::AUDIO);
        assert_eq!(choose(MediaKind::Voice, "audio/wav", 10), Upload::DOCUMENT);
        assert_eq!(choose(MediaKind::Audio, "audio/mpeg", 10), Upload::AUDIO);
        assert_eq!(choose(MediaKind::Audio, "audio/ogg", 10), Upload::DOCUMENT);
        assert_eq!(choose(MediaKind::Video, "video/mp4", 10), Upload::VIDEO);
        assert_eq!(choose(MediaKind::Video, "video/webm", 10), Upload::DOCUMENT);
        assert_eq!(
            choose(MediaKind::Document, "image/png", 10),
            Upload::DOCUMENT
        );
    }

    #[test]
    fn file_ids_only() {
        assert!(is_file_id("AgACAgIAAxkBAAIBZ2V-abc_DEF"));
        for bad in ["", "https://evil.example/x", "../x", "a b", "a/b"] {
            assert!(!is_file_id(bad), "{bad}");
        }
    }

    #[test]
    fn topic_params() {
        assert_eq!(topic_param(Some("1")), None);
        assert_eq!(topic_param(Some("17")), Some(17));
        assert_eq!(topic_param(None), None);
    }
}
