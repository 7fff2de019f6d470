//! The Feishu / Lark adapter: a custom app's bot receiving events over
//! the long connection (the default) or the event subscription (webhook
//! on the shared listener), answering through the Open Platform's REST
//! API, with document comments answered in their threads.
//!
//! # Layout
//!
//! - this file: [`FeishuSettings`] (from `platforms.feishu` and the
//!   environment), [`FeishuAdapter`] and its [`Adapter`] impl: replies,
//!   creates, rate-limit retries, the typing reaction.
//! - `server`: the webhook route, in processing order, and the dispatch
//!   of an authentic event both modes share.
//! - `longconn`: the long connection (protobuf frames over a WebSocket).
//! - `crypto`: the `X-Lark-Signature` check and AES-256-CBC decryption.
//! - `mapping`: the event envelope and what it becomes.
//! - `comments`: `drive.notice.comment_add_v1` and replies in a comment
//!   thread.
//! - `api`: the tenant access token and the REST calls, one client per
//!   app in the process ([`FeishuClient`] lends it to the `feishu_*`
//!   tools).
//! - `media`: attachments in (message resources) and files out (image
//!   and file uploads).
//! - `format`: `text` or a `post` with an `md` element.
//! - `card`: interactive cards: streamed answers (created, then patched)
//!   and messages whose choices are buttons.
//! - `callback`: `card.action.trigger`, a click, and the message it
//!   becomes.
//!
//! # Invariants
//!
//! - With an encrypt key, a delivery's signature is checked on the raw
//!   body before anything in it is acted on; a stale timestamp is refused
//!   as a replay, and an `event_id` seen before is ignored.
//! - An answer to a message is a reply to it (`reply_in_thread` inside a
//!   topic thread), carrying a `uuid` derived from what is sent, so the
//!   ledger's re-send of a reply whose answer was lost posts it once.
//!   A reply to a withdrawn or missing message becomes a plain create.
//!   Cards are sent the same way.
//! - A card callback is checked exactly as an event is, and a click is
//!   taken once (its event id) and only on a card this adapter sent with
//!   that choice.
//! - Secrets (app secret, encrypt key, verification token, tenant token)
//!   are never logged nor part of an error message; `Debug` masks them.

mod api;
mod callback;
mod card;
mod comments;
mod config;
mod crypto;
mod format;
mod longconn;
mod mapping;
mod media;
mod server;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Capabilities, Download, DownloadError, LengthUnit,
    Markup, MediaKind, MessageLimits, OutboundFile, OutboundMessage, SendError, SentMessage,
};
use talaria_core::config::{secret_or_env, text_or_env};
use talaria_core::{Env, Secret};

use crate::ingress::{InboxSlot, Mount};
use crate::registry::{BuildError, Built, Platform, Setup};
use api::{Api, ApiError};

pub use api::ApiError as FeishuApiError;
pub use config::{ENV, FeishuConfig};

/// The platform name in session keys, config and allowlists
/// (`FEISHU_ALLOWED_USERS`).
pub const PLATFORM: &str = "feishu";

/// The longest text sent in one message or comment reply, in characters:
/// the ancestor's comment-reply limit, well under a message's 150 KB.
pub const MAX_TEXT_CHARS: usize = 4000;

/// Feishu's host in China.
pub const FEISHU_BASE: &str = "https://open.feishu.cn";

/// Lark's host, internationally.
pub const LARK_BASE: &str = "https://open.larksuite.com";

/// Waits longer than this are not worth holding a send for.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(60);

/// How long one file download may take, body included.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// How long one upload (at most 30 MB) may take.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// How many ids of events seen are remembered against re-deliveries.
const SEEN_EVENTS: usize = 2048;

/// How events reach the adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionMode {
    /// The long connection the adapter opens (no public URL needed).
    Websocket,
    /// The event subscription posting to the shared listener.
    Webhook,
}

/// What the adapter needs, resolved from `platforms.feishu` and the
/// environment.
#[derive(Debug, Clone)]
pub struct FeishuSettings {
    /// The app's id.
    pub app_id: String,
    /// The app's secret.
    pub app_secret: Secret,
    /// The Open Platform root (by domain, or overridden).
    pub base_url: String,
    /// Long connection or webhook.
    pub mode: ConnectionMode,
    /// The Encrypt Key, when the console has one.
    pub encrypt_key: Option<Secret>,
    /// The Verification Token, when the console has one.
    pub verification_token: Option<Secret>,
    /// The route on the shared listener.
    pub webhook_path: String,
    /// In groups, answer only @mentions.
    pub require_mention: bool,
    /// The bot's open id, when known without asking.
    pub bot_open_id: Option<String>,
    /// The allowed clock skew of signed requests, in seconds.
    pub max_clock_skew_secs: u64,
    /// Larger webhook bodies get 413.
    pub max_body_bytes: usize,
    /// How long one API call may take.
    pub send_timeout: Duration,
    /// Retries after a rate limit before a send reports
    /// [`SendError::RateLimited`].
    pub rate_limit_retries: u32,
    /// The first wait after a rate limit that names none; doubled each time.
    pub rate_limit_wait: Duration,
    /// Show answers growing in a card while they stream.
    pub streaming_cards: bool,
}

/// Why the adapter cannot be configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeishuError {
    /// Enabled, but the app id or secret is not set.
    #[error(
        "Feishu is enabled but {0} is not set (FEISHU_APP_ID and FEISHU_APP_SECRET, or \
         platforms.feishu.app_id / app_secret; see docs/platforms/feishu.md)"
    )]
    Missing(&'static str),
    /// Webhook mode without a way to authenticate events.
    #[error(
        "Feishu's webhook mode needs FEISHU_ENCRYPT_KEY or FEISHU_VERIFICATION_TOKEN (from the \
         console's Events & callbacks page), or anyone could post events"
    )]
    Unauthenticated,
    /// An unknown connection mode.
    #[error("FEISHU_CONNECTION_MODE must be websocket or webhook, not {0:?}")]
    Mode(String),
    /// `FEISHU_DOMAIN` is neither `feishu` nor `lark`.
    #[error("FEISHU_DOMAIN must be feishu or lark, not {0:?}")]
    Domain(String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

impl FeishuSettings {
    /// Settings with these credentials and every default (tests and
    /// embedding; the gateway uses [`Self::from_config`]).
    pub fn new(app_id: &str, app_secret: &str, base_url: &str) -> FeishuSettings {
        let d = FeishuConfig::default();
        FeishuSettings {
            app_id: app_id.to_owned(),
            app_secret: Secret::new(app_secret),
            base_url: base_url.to_owned(),
            mode: ConnectionMode::Webhook,
            encrypt_key: None,
            verification_token: None,
            webhook_path: d.webhook_path,
            require_mention: d.require_mention,
            bot_open_id: None,
            max_clock_skew_secs: d.max_clock_skew_secs,
            max_body_bytes: d.max_body_bytes,
            send_timeout: Duration::from_secs(30),
            rate_limit_retries: 3,
            rate_limit_wait: Duration::from_secs(1),
            streaming_cards: d.streaming_cards,
        }
    }

    /// Resolves the settings, or `None` when Feishu is off: `enabled:
    /// false`, or no `enabled` and neither the app id nor secret set.
    ///
    /// # Errors
    /// A missing credential, an unknown domain or mode, or webhook mode
    /// with neither an encrypt key nor a verification token.
    pub fn from_config(
        config: &FeishuConfig,
        env: &Env,
    ) -> Result<Option<FeishuSettings>, FeishuError> {
        let app_id = text_or_env(config.app_id.as_deref(), env, "FEISHU_APP_ID");
        let secret = secret_or_env(config.app_secret.as_ref(), env, "FEISHU_APP_SECRET");
        if !config
            .enabled
            .unwrap_or(app_id.is_some() || secret.is_some())
        {
            return Ok(None);
        }
        let app_id = app_id.ok_or(FeishuError::Missing("the app id"))?;
        let secret = secret.ok_or(FeishuError::Missing("the app secret"))?;
        let mode = env
            .get("FEISHU_CONNECTION_MODE")
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .unwrap_or(config.connection_mode.trim())
            .to_ascii_lowercase();
        let mode = match mode.as_str() {
            "websocket" | "ws" => ConnectionMode::Websocket,
            "webhook" => ConnectionMode::Webhook,
            _ => return Err(FeishuError::Mode(mode)),
        };
        let domain = env
            .get("FEISHU_DOMAIN")
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .unwrap_or(config.domain.trim())
            .to_ascii_lowercase();
        let by_domain = match domain.as_str() {
            "feishu" => FEISHU_BASE,
            "lark" => LARK_BASE,
            _ => return Err(FeishuError::Domain(domain)),
        };
        let base_url = text_or_env(config.base_url.as_deref(), env, "FEISHU_BASE_URL")
            .unwrap_or_else(|| by_domain.to_owned());
        let encrypt_key = secret_or_env(config.encrypt_key.as_ref(), env, "FEISHU_ENCRYPT_KEY");
        let verification_token = secret_or_env(
            config.verification_token.as_ref(),
            env,
            "FEISHU_VERIFICATION_TOKEN",
        );
        if mode == ConnectionMode::Webhook && encrypt_key.is_none() && verification_token.is_none()
        {
            return Err(FeishuError::Unauthenticated);
        }
        let webhook_path = text_or_env(None, env, "FEISHU_WEBHOOK_PATH")
            .unwrap_or_else(|| config.webhook_path.clone());
        Ok(Some(FeishuSettings {
            mode,
            encrypt_key,
            verification_token,
            webhook_path,
            require_mention: env
                .flag("FEISHU_REQUIRE_MENTION")
                .unwrap_or(config.require_mention),
            bot_open_id: text_or_env(config.bot_open_id.as_deref(), env, "FEISHU_BOT_OPEN_ID"),
            max_clock_skew_secs: config.max_clock_skew_secs,
            max_body_bytes: config.max_body_bytes.max(1),
            streaming_cards: env
                .flag("FEISHU_STREAMING_CARDS")
                .unwrap_or(config.streaming_cards),
            ..FeishuSettings::new(&app_id, secret.expose(), &base_url)
        }))
    }
}

/// The Feishu / Lark connector (see the module docs).
pub struct FeishuAdapter {
    api: Arc<Api>,
    mode: ConnectionMode,
    app_id: String,
    app_secret: Secret,
    hook: Arc<server::Hook>,
    rate_limit_retries: u32,
    rate_limit_wait: Duration,
    streaming_cards: bool,
}

impl fmt::Debug for FeishuAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FeishuAdapter")
            .field("api", &self.api)
            .field("path", &self.hook.path)
            .finish_non_exhaustive()
    }
}

/// The `uuid` of a send: the same message to the same place always gets
/// the same one, so Feishu posts a re-send (the ledger's, after a lost
/// answer or a crash) once within its hour of deduplication. `kind` sets
/// apart messages of another kind with the same text (a streaming
/// preview's card); plain sends give none.
fn idempotency_key(message: &OutboundMessage, kind: &str) -> String {
    let mut digest = Sha256::new();
    for part in [
        message.chat_id.as_str(),
        message.thread_id.as_deref().unwrap_or(""),
        message.reply_to.as_deref().unwrap_or(""),
        message.text.as_str(),
    ] {
        digest.update(part.as_bytes());
        digest.update([0]);
    }
    if !kind.is_empty() {
        digest.update(kind.as_bytes());
        digest.update([0]);
    }
    for choice in &message.choices {
        for part in [&choice.label, &choice.command] {
            digest.update(part.as_bytes());
            digest.update([0]);
        }
    }
    digest
        .finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Where a message goes: the chat, its topic thread, the message answered.
struct Destination<'a> {
    chat_id: &'a str,
    thread_id: Option<&'a str>,
    reply_to: Option<&'a str>,
}

/// The `uuid` of a file's message: from where it goes and the file's
/// bytes (streamed through the digest, never held whole), so a re-sent
/// file is posted once and a different file under the same name is not
/// taken for it.
async fn file_idempotency_key(file: &OutboundFile) -> std::io::Result<String> {
    use tokio::io::AsyncReadExt;
    let mut digest = Sha256::new();
    for part in [
        file.chat_id.as_str(),
        file.thread_id.as_deref().unwrap_or(""),
        file.reply_to.as_deref().unwrap_or(""),
        file.name.as_str(),
    ] {
        digest.update(part.as_bytes());
        digest.update([0]);
    }
    let mut reader = tokio::fs::File::open(&file.path).await?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = reader.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        digest.update(&buf[..n]);
    }
    Ok(digest
        .finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// The app's client, shared by everything in the process that uses it.
fn shared_api(settings: &FeishuSettings) -> Result<Arc<Api>, FeishuError> {
    if settings.app_id.trim().is_empty() {
        return Err(FeishuError::Missing("the app id"));
    }
    if settings.app_secret.expose().trim().is_empty() {
        return Err(FeishuError::Missing("the app secret"));
    }
    Api::shared(
        &settings.base_url,
        settings.app_id.trim(),
        Secret::new(settings.app_secret.expose().trim()),
        settings.send_timeout,
    )
    .map_err(FeishuError::Client)
}

/// The Open Platform as the app's tenant, for the `feishu_*` tools: the
/// same client (and tenant token) the adapter uses, when both run.
#[derive(Clone)]
pub struct FeishuClient {
    api: Arc<Api>,
}

impl fmt::Debug for FeishuClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FeishuClient")
            .field("api", &self.api)
            .finish()
    }
}

impl FeishuClient {
    /// The app's client.
    ///
    /// # Errors
    /// An empty credential, or a client that cannot be built.
    pub fn new(settings: &FeishuSettings) -> Result<FeishuClient, FeishuError> {
        Ok(FeishuClient {
            api: shared_api(settings)?,
        })
    }

    /// `GET path?query`; the answer's `data`.
    ///
    /// # Errors
    /// Feishu's refusal, or a transport failure (secrets scrubbed).
    pub async fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<Value, FeishuApiError> {
        self.api.call(Method::GET, path, query, None).await
    }

    /// `POST path?query` with a JSON body; the answer's `data`.
    ///
    /// # Errors
    /// Feishu's refusal, or a transport failure (secrets scrubbed).
    pub async fn post(
        &self,
        path: &str,
        query: &[(&str, &str)],
        body: &Value,
    ) -> Result<Value, FeishuApiError> {
        self.api.call(Method::POST, path, query, Some(body)).await
    }
}

impl FeishuAdapter {
    /// Checks the settings and builds the HTTP client; serves nothing
    /// until [`FeishuAdapter::mount`] is mounted on the shared listener.
    ///
    /// # Errors
    /// An empty credential, or a client that cannot be built.
    pub fn new(settings: FeishuSettings) -> Result<FeishuAdapter, FeishuError> {
        if settings.app_id.trim().is_empty() {
            return Err(FeishuError::Missing("the app id"));
        }
        if settings.app_secret.expose().trim().is_empty() {
            return Err(FeishuError::Missing("the app secret"));
        }
        let api = shared_api(&settings)?;
        let hook = server::Hook {
            path: settings.webhook_path.clone(),
            encrypt_key: settings
                .encrypt_key
                .filter(|k| !k.expose().trim().is_empty()),
            token_digest: settings
                .verification_token
                .filter(|t| !t.expose().trim().is_empty())
                .map(|t| Sha256::digest(t.expose().trim().as_bytes()).into()),
            max_skew: settings.max_clock_skew_secs,
            max_body_bytes: settings.max_body_bytes,
            require_mention: settings.require_mention,
            bot_open_id: RwLock::new(settings.bot_open_id.clone()),
            slot: InboxSlot::new(),
            api: api.clone(),
            seen_events: Mutex::new(crate::seen::Seen::new(SEEN_EVENTS)),
            last_inbound: Mutex::new(HashMap::new()),
            last_comment: Mutex::new(HashMap::new()),
            chat_types: Mutex::new(HashMap::new()),
            cards: Mutex::new(card::Cards::default()),
            card_sends: tokio::sync::RwLock::new(()),
        };
        Ok(FeishuAdapter {
            api,
            mode: settings.mode,
            app_id: settings.app_id.trim().to_owned(),
            app_secret: Secret::new(settings.app_secret.expose().trim()),
            hook: Arc::new(hook),
            rate_limit_retries: settings.rate_limit_retries,
            rate_limit_wait: settings.rate_limit_wait,
            streaming_cards: settings.streaming_cards,
        })
    }

    /// `POST {webhook_path}`, to mount on the shared listener (webhook
    /// mode; in websocket mode nothing is served).
    pub fn mount(&self) -> Mount {
        Mount {
            platform: PLATFORM,
            slot: self.hook.slot.clone(),
            routes: server::router(self.hook.clone()),
        }
    }

    /// One call, waiting out rate limits a bounded number of times.
    async fn call_with_retries(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: &Value,
    ) -> Result<Value, ApiError> {
        let mut retries = 0;
        let mut backoff = self.rate_limit_wait;
        loop {
            match self.api.call(method.clone(), path, query, Some(body)).await {
                Err(e) if e.rate_limit().is_some() => {
                    let wait = e.rate_limit().flatten().unwrap_or(backoff);
                    if retries >= self.rate_limit_retries || wait > MAX_RETRY_WAIT {
                        return Err(e);
                    }
                    retries += 1;
                    backoff = backoff.saturating_mul(2);
                    tracing::info!(?wait, error = %e, "Feishu rate limit; waiting");
                    tokio::time::sleep(wait).await;
                }
                other => return other,
            }
        }
    }

    fn classify(&self, e: &ApiError) -> SendError {
        let wait = e.rate_limit().flatten().unwrap_or(self.rate_limit_wait);
        e.classify(wait)
    }

    /// Posts one message where an answer goes: a reply to the message
    /// answered (in its topic thread when there is one), else, and when
    /// that message is withdrawn or gone, a new message in the thread or
    /// chat.
    async fn post(
        &self,
        to: &Destination<'_>,
        msg_type: &str,
        content: &str,
        uuid: &str,
    ) -> Result<SentMessage, ApiError> {
        let message_id = |data: &Value| SentMessage {
            message_id: data
                .get("message_id")
                .and_then(Value::as_str)
                .map(str::to_owned),
        };
        if let Some(parent) = to.reply_to.filter(|p| p.starts_with("om_")) {
            let body = json!({
                "content": content,
                "msg_type": msg_type,
                "reply_in_thread": to.thread_id.is_some(),
                "uuid": uuid,
            });
            let path = format!("/open-apis/im/v1/messages/{parent}/reply");
            match self
                .call_with_retries(Method::POST, &path, &[], &body)
                .await
            {
                Ok(data) => {
                    self.clear_typing(to.chat_id, parent);
                    return Ok(message_id(&data));
                }
                Err(e) if matches!(e.code(), Some(api::WITHDRAWN | api::NOT_FOUND)) => {
                    tracing::info!(
                        error = %e,
                        "the Feishu message answered is gone; sending the answer on its own"
                    );
                }
                Err(e) => return Err(e),
            }
        }
        let (id_type, receive_id) = match to.thread_id {
            Some(thread) if thread.starts_with("omt_") => ("thread_id", thread),
            _ if to.chat_id.starts_with("ou_") => ("open_id", to.chat_id),
            _ => ("chat_id", to.chat_id),
        };
        let body = json!({
            "receive_id": receive_id,
            "msg_type": msg_type,
            "content": content,
            "uuid": uuid,
        });
        let data = self
            .call_with_retries(
                Method::POST,
                "/open-apis/im/v1/messages",
                &[("receive_id_type", id_type)],
                &body,
            )
            .await?;
        Ok(message_id(&data))
    }

    /// Uploads a file as `plan` says and returns its `image_key` or
    /// `file_key`, waiting out rate limits a bounded number of times.
    async fn upload(&self, file: &OutboundFile, plan: &media::Plan) -> Result<String, SendError> {
        let (path, key_name) = match plan.file_type {
            None => ("/open-apis/im/v1/images", "image_key"),
            Some(_) => ("/open-apis/im/v1/files", "file_key"),
        };
        let form = || async {
            let part = crate::http::file_part(&file.path, &file.name, &file.mime).await?;
            Ok(match plan.file_type {
                None => reqwest::multipart::Form::new()
                    .text("image_type", "message")
                    .part("image", part),
                Some(file_type) => reqwest::multipart::Form::new()
                    .text("file_type", file_type)
                    .text("file_name", file.name.clone())
                    .part("file", part),
            })
        };
        let mut retries = 0;
        let data = loop {
            match self.api.upload(path, UPLOAD_TIMEOUT, form).await {
                Err(e) if e.rate_limit().is_some() && retries < self.rate_limit_retries => {
                    let wait = e.rate_limit().flatten().unwrap_or(self.rate_limit_wait);
                    if wait > MAX_RETRY_WAIT {
                        return Err(self.classify(&e));
                    }
                    retries += 1;
                    tokio::time::sleep(wait).await;
                }
                // An upload that timed out stored at most an unused key:
                // trying again sends nothing twice.
                Err(ApiError::Timeout(e)) => return Err(SendError::Transient(e)),
                Err(e) => return Err(self.classify(&e)),
                Ok(data) => break data,
            }
        };
        data.get(key_name)
            .and_then(Value::as_str)
            .filter(|k| !k.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| {
                SendError::Ambiguous(format!("Feishu's upload answer holds no {key_name}"))
            })
    }

    /// Answers in a document's comment thread.
    async fn send_comment(
        &self,
        message: &OutboundMessage,
        file_type: &str,
        file_token: &str,
    ) -> Result<SentMessage, SendError> {
        let comment = message
            .reply_to
            .as_deref()
            .and_then(comments::parse_message)
            .map(str::to_owned)
            .or_else(|| self.hook.last_comment(&message.chat_id));
        let mut retries = 0;
        loop {
            match comments::reply(
                &self.api,
                file_type,
                file_token,
                comment.as_deref(),
                &message.text,
            )
            .await
            {
                Ok(id) => return Ok(SentMessage { message_id: id }),
                Err(e) if e.rate_limit().is_some() && retries < self.rate_limit_retries => {
                    retries += 1;
                    let wait = e.rate_limit().flatten().unwrap_or(self.rate_limit_wait);
                    if wait > MAX_RETRY_WAIT {
                        return Err(self.classify(&e));
                    }
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err(self.classify(&e)),
            }
        }
    }

    /// Removes the typing reaction once the answer to `message_id` is out.
    fn clear_typing(&self, chat_id: &str, message_id: &str) {
        let reaction = {
            let mut map = self
                .hook
                .last_inbound
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match map.get_mut(chat_id) {
                Some((id, reaction)) if id == message_id => reaction.take(),
                _ => None,
            }
        };
        if let Some(reaction) = reaction {
            let api = self.api.clone();
            let path = format!("/open-apis/im/v1/messages/{message_id}/reactions/{reaction}");
            tokio::spawn(async move {
                if let Err(e) = api.call(Method::DELETE, &path, &[], None).await {
                    tracing::debug!(error = %e, "the Feishu typing reaction was not removed");
                }
            });
        }
    }

    /// Asks Feishu who the bot is.
    async fn discover_bot(&self) -> Result<(), AdapterError> {
        if self.hook.bot().is_some() {
            return Ok(());
        }
        let info = self
            .api
            .call(Method::GET, "/open-apis/bot/v3/info", &[], None)
            .await
            .map_err(|e| match e {
                ApiError::Refused { .. } => AdapterError::Fatal(format!(
                    "Feishu refused the app's credentials or the bot info: {e} (check \
                     FEISHU_APP_ID / FEISHU_APP_SECRET and that the bot capability is on)"
                )),
                other => AdapterError::Disconnected(other.to_string()),
            })?;
        let open_id = info
            .pointer("/bot/open_id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                AdapterError::Fatal(
                    "Feishu's bot info names no open_id; set FEISHU_BOT_OPEN_ID".to_owned(),
                )
            })?;
        *self
            .hook
            .bot_open_id
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(open_id.to_owned());
        Ok(())
    }
}

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    threads: true,
    markup: Markup::Markdown,
    receives: &[
        MediaKind::Image,
        MediaKind::Voice,
        MediaKind::Audio,
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
        max_len: MAX_TEXT_CHARS,
        unit: LengthUnit::Chars,
    })
};

#[async_trait]
impl Adapter for FeishuAdapter {
    fn platform(&self) -> &'static str {
        PLATFORM
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn credential(&self) -> Option<(&'static str, String)> {
        // Feishu hands each event of a long connection to one of the app's
        // connections, so two gateways would each see only some of them.
        // Webhook deliveries go to whichever node the request reaches.
        match self.mode {
            ConnectionMode::Websocket => Some(("feishu-app-id", self.app_id.clone())),
            ConnectionMode::Webhook => None,
        }
    }

    /// `GET /open-apis/bot/v3/info` with a tenant token made from the
    /// app id and secret: the bot's name and open_id, or
    /// [`AdapterError::Fatal`] when Feishu refuses the credentials (the
    /// token call answers `app secret invalid`, code 10014) or the bot
    /// capability is off.
    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        let info = self
            .api
            .call(Method::GET, "/open-apis/bot/v3/info", &[], None)
            .await;
        Some(match info {
            Ok(info) => {
                let field = |key: &str| {
                    info.pointer(&format!("/bot/{key}"))
                        .and_then(Value::as_str)
                        .filter(|s| !s.is_empty())
                };
                match (field("app_name"), field("open_id")) {
                    (Some(name), Some(id)) => Ok(format!("{name} (bot {id})")),
                    (None, Some(id)) => Ok(format!("bot {id}")),
                    (Some(name), None) => Ok(format!("{name} (app {})", self.app_id)),
                    (None, None) => Ok(format!("app {}", self.app_id)),
                }
            }
            Err(e @ ApiError::Refused { status, .. }) if status < 500 && status != 429 => {
                Err(AdapterError::Fatal(format!(
                    "Feishu refused the app's credentials or the bot info: {e} (check \
                     FEISHU_APP_ID / FEISHU_APP_SECRET and that the bot capability is on)"
                )))
            }
            Err(e) => Err(AdapterError::Disconnected(e.to_string())),
        })
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        self.discover_bot().await?;
        match self.mode {
            ConnectionMode::Webhook => self.hook.slot.attach(&ctx).await,
            ConnectionMode::Websocket => {
                longconn::run(&self.hook, &self.app_id, self.app_secret.expose(), &ctx).await
            }
        }
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        if let Some((file_type, file_token)) = comments::parse_chat(&message.chat_id) {
            // A comment thread carries text only; its text names the
            // choices.
            return self.send_comment(message, file_type, file_token).await;
        }
        if !message.choices.is_empty() {
            return self.send_card(message, false).await;
        }
        let (msg_type, content) = format::content(&message.text);
        let uuid = idempotency_key(message, "");
        let to = Destination {
            chat_id: &message.chat_id,
            thread_id: message.thread_id.as_deref(),
            reply_to: message.reply_to.as_deref(),
        };
        self.post(&to, msg_type, &content, &uuid)
            .await
            .map_err(|e| self.classify(&e))
    }

    /// Answers stream into cards when `streaming_cards` is on.
    fn streaming_edits(&self) -> bool {
        self.streaming_cards
    }

    /// Opens the card the answer streams into. Document comments take
    /// no cards: their answer is posted whole.
    async fn start_preview(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        if comments::parse_chat(&message.chat_id).is_some() {
            return Err(SendError::Rejected(
                "a document comment cannot show a streaming card".to_owned(),
            ));
        }
        self.send_card(message, true).await
    }

    /// Patches a streaming card with the text so far.
    async fn edit(&self, chat_id: &str, message_id: &str, text: &str) -> Result<(), SendError> {
        self.patch_card(chat_id, message_id, text, false, false)
            .await
    }

    /// Patches a streaming card one last time: the answer, or what
    /// streamed before a failed turn, marked so.
    async fn finish_preview(
        &self,
        chat_id: &str,
        message_id: &str,
        text: &str,
        failed: bool,
    ) -> Result<(), SendError> {
        self.patch_card(chat_id, message_id, text, failed, true)
            .await
    }

    async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        let Some((resource, message_id, key)) = media::parse_locator(locator) else {
            return Err(DownloadError::Gone(format!(
                "{locator:?} is not a Feishu message resource"
            )));
        };
        let (path, kind) = media::resource_path(resource, message_id, key);
        let answer = self
            .api
            .fetch(&path, &[("type", kind.as_str())], DOWNLOAD_TIMEOUT)
            .await
            .map_err(|e| match &e {
                ApiError::Refused { status, code, .. }
                    if *status < 500
                        && e.rate_limit().is_none()
                        && !api::TOKEN_INVALID.contains(code) =>
                {
                    DownloadError::Gone(e.to_string())
                }
                _ => DownloadError::Unavailable(e.to_string()),
            })?;
        let length = answer.content_length();
        let body = futures::StreamExt::map(answer.bytes_stream(), |chunk| {
            chunk.map_err(|e| std::io::Error::other(format!("the Feishu download broke off: {e}")))
        });
        Ok(Download {
            reader: Box::pin(tokio_util::io::StreamReader::new(body)),
            length,
        })
    }

    /// Uploads the file (image or file upload, by kind and size), then
    /// posts the message that carries its key where a text would go; a
    /// caption follows as a text.
    async fn send_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        if comments::parse_chat(&file.chat_id).is_some() {
            // A comment thread carries text only.
            let message = OutboundMessage {
                chat_id: file.chat_id.clone(),
                thread_id: file.thread_id.clone(),
                reply_to: file.reply_to.clone(),
                text: file.fallback_text(PLATFORM),
                choices: Vec::new(),
            };
            return self.send(&message).await;
        }
        let meta = tokio::fs::metadata(&file.path).await.map_err(|e| {
            SendError::Rejected(format!("cannot read {}: {e}", file.path.display()))
        })?;
        let plan = media::plan(file.kind, &file.mime, &file.name, meta.len())
            .map_err(SendError::Rejected)?;
        let key = self.upload(file, &plan).await?;
        let to = Destination {
            chat_id: &file.chat_id,
            thread_id: file.thread_id.as_deref(),
            reply_to: file.reply_to.as_deref(),
        };
        let uuid = file_idempotency_key(file)
            .await
            .map_err(|e| SendError::Rejected(format!("cannot read {}: {e}", file.name)))?;
        let content = media::content(plan.msg_type, &key);
        let sent = match self.post(&to, plan.msg_type, &content, &uuid).await {
            // The video message wants the video's details right; the same
            // key as a plain file always goes.
            Err(ApiError::Refused { status: 400, .. }) if plan.msg_type == "media" => {
                tracing::info!("Feishu refused the video message; sending the video as a file");
                self.post(&to, "file", &content, &format!("{uuid}f")).await
            }
            other => other,
        }
        .map_err(|e| self.classify(&e))?;
        if let Some(caption) = file.caption.as_deref().filter(|c| !c.trim().is_empty()) {
            let message = OutboundMessage {
                chat_id: file.chat_id.clone(),
                thread_id: file.thread_id.clone(),
                reply_to: file.reply_to.clone(),
                text: caption.to_owned(),
                choices: Vec::new(),
            };
            self.send(&message).await?;
        }
        Ok(sent)
    }

    /// Puts a `Typing` reaction on the chat's last message (once; it is
    /// removed when the answer goes out). Documents show nothing.
    async fn typing(&self, chat_id: &str, _thread_id: Option<&str>) -> Result<(), SendError> {
        let message_id = {
            let map = self
                .hook
                .last_inbound
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match map.get(chat_id) {
                Some((id, None)) => id.clone(),
                _ => return Ok(()),
            }
        };
        let path = format!("/open-apis/im/v1/messages/{message_id}/reactions");
        let body = json!({"reaction_type": {"emoji_type": "Typing"}});
        let data = self
            .api
            .call(Method::POST, &path, &[], Some(&body))
            .await
            .map_err(|e| self.classify(&e))?;
        if let Some(reaction) = data.get("reaction_id").and_then(Value::as_str) {
            let mut map = self
                .hook
                .last_inbound
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some((id, slot)) = map.get_mut(chat_id)
                && *id == message_id
            {
                *slot = Some(reaction.to_owned());
            }
        }
        Ok(())
    }
}

/// The registry's entry for Feishu / Lark.
pub const ENTRY: Platform = Platform {
    name: PLATFORM,
    title: "Feishu / Lark",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<FeishuConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = FeishuSettings::from_config(&setup.section()?, setup.env)
        .map_err(BuildError::misconfigured)?
    else {
        return Ok(None);
    };
    let mode = settings.mode;
    let adapter = FeishuAdapter::new(settings).map_err(BuildError::set_up)?;
    let mount = (mode == ConnectionMode::Webhook).then(|| adapter.mount());
    Ok(Some(Built {
        adapter: Arc::new(adapter),
        mount,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env {
        Env::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn off_unless_configured_and_webhook_needs_a_check() {
        let cfg = FeishuConfig::default();
        assert!(matches!(
            FeishuSettings::from_config(&cfg, &env(&[])),
            Ok(None)
        ));
        let base = [("FEISHU_APP_ID", "cli_1"), ("FEISHU_APP_SECRET", "s3cret")];
        let s = FeishuSettings::from_config(&cfg, &env(&base))
            .unwrap()
            .unwrap();
        assert_eq!(s.mode, ConnectionMode::Websocket, "no key or token needed");
        let base = [
            ("FEISHU_APP_ID", "cli_1"),
            ("FEISHU_APP_SECRET", "s3cret"),
            ("FEISHU_CONNECTION_MODE", "webhook"),
        ];
        assert_eq!(
            FeishuSettings::from_config(&cfg, &env(&base)).unwrap_err(),
            FeishuError::Unauthenticated
        );
        let mut pairs = base.to_vec();
        pairs.push(("FEISHU_VERIFICATION_TOKEN", "vt"));
        let s = FeishuSettings::from_config(&cfg, &env(&pairs))
            .unwrap()
            .unwrap();
        assert_eq!(s.base_url, FEISHU_BASE);
        assert!(s.require_mention);
        pairs.push(("FEISHU_DOMAIN", "lark"));
        pairs.push(("FEISHU_REQUIRE_MENTION", "false"));
        let s = FeishuSettings::from_config(&cfg, &env(&pairs))
            .unwrap()
            .unwrap();
        assert_eq!(s.base_url, LARK_BASE);
        assert!(!s.require_mention);
        assert_eq!(s.mode, ConnectionMode::Webhook);
        pairs.retain(|(k, _)| *k != "FEISHU_CONNECTION_MODE");
        pairs.push(("FEISHU_CONNECTION_MODE", "carrier-pigeon"));
        assert!(matches!(
            FeishuSettings::from_config(&cfg, &env(&pairs)),
            Err(FeishuError::Mode(_))
        ));
        let only_id = [("FEISHU_APP_ID", "cli_1")];
        assert_eq!(
            FeishuSettings::from_config(&cfg, &env(&only_id)).unwrap_err(),
            FeishuError::Missing("the app secret")
        );
    }

    #[test]
    fn the_uuid_is_stable_for_a_message_and_differs_between_messages() {
        let m = OutboundMessage {
            chat_id: "oc_1".into(),
            thread_id: None,
            reply_to: Some("om_1".into()),
            text: "hi".into(),
            choices: Vec::new(),
        };
        assert_eq!(idempotency_key(&m, ""), idempotency_key(&m.clone(), ""));
        assert_eq!(idempotency_key(&m, "").len(), 32);
        let other = OutboundMessage {
            text: "hi (2/2)".into(),
            ..m.clone()
        };
        assert_ne!(idempotency_key(&m, ""), idempotency_key(&other, ""));
        assert_ne!(idempotency_key(&m, ""), idempotency_key(&m, "preview"));
        let asking = OutboundMessage {
            choices: vec![talaria_adapter::Choice::new("Yes", "/approve")],
            ..m.clone()
        };
        assert_ne!(idempotency_key(&m, ""), idempotency_key(&asking, ""));
    }

    #[test]
    fn secrets_never_show_in_debug() {
        let mut s = FeishuSettings::new("cli_1", "APPSECRETAPPSECRET", "http://127.0.0.1:9");
        s.encrypt_key = Some(Secret::new("ENCRYPTKEYENCRYPT"));
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("APPSECRETAPP") && !shown.contains("ENCRYPTKEY"),
            "{shown}"
        );
        let a = FeishuAdapter::new(s).unwrap();
        let shown = format!("{a:?}");
        assert!(
            !shown.contains("APPSECRETAPP") && !shown.contains("ENCRYPTKEY"),
            "{shown}"
        );
    }
}
