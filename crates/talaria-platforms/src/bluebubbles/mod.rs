//! The BlueBubbles adapter: iMessage (one-to-one and group chats) through
//! a BlueBubbles server running on a Mac signed in to Messages.
//!
//! The server posts new messages to a webhook the adapter registers on it
//! (`POST /bluebubbles-webhook` on the shared listener, [`crate::ingress`]),
//! and answers go out through its REST API.
//!
//! # Layout
//!
//! - this file: [`BlueBubblesSettings`] (from `platforms.bluebubbles` and
//!   the environment), [`BlueBubblesAdapter`] and its [`Adapter`] impl:
//!   `run` checks the server, registers the webhook once and catches up;
//!   sends, files, typing and read receipts.
//! - `server`: the webhook handler, in processing order.
//! - `mapping`: a BlueBubbles message and what it becomes.
//! - `api`: the REST calls and what their errors mean to the ledger.
//!
//! # Invariants
//!
//! - Nothing a caller posts is acted on before the server password in it
//!   is checked; without it a caller only gets 401.
//! - Nothing is lost while the gateway is away or busy: the server posts
//!   each message once and never again, so the adapter also reads back,
//!   every `catch_up_secs` and at each start, the messages created since
//!   its saved position, oldest first, and moves the position only past
//!   messages the runner took (or decided on). The runner drops what the
//!   webhook already delivered by message guid.
//! - The webhook is registered once: an existing registration for the
//!   same URL is reused, never duplicated.
//! - The password is never logged nor part of an error message.

mod api;
mod config;
mod mapping;
mod server;

use crate::registry::{BuildError, Built, Platform, Setup};
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use regex::Regex;
use serde_json::json;
use sha2::{Digest, Sha256};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Capabilities, Download, DownloadError, Inbox,
    LengthUnit, Liveness, MediaKind, MessageLimits, OutboundFile, OutboundMessage, SendError,
    SentMessage,
};
use talaria_core::config::{secret_or_env, text_or_env};
use talaria_core::{Env, Secret};
use talaria_store::CursorStore;

use crate::ingress::{InboxSlot, Mount};
use api::Api;
use mapping::Mapped;

pub use config::{BlueBubblesConfig, ENV};
pub use server::WEBHOOK_PATH;

/// The platform name in session keys, config and allowlists
/// (`BLUEBUBBLES_ALLOWED_USERS`).
pub const PLATFORM: &str = "bluebubbles";

/// Answers are split at this many characters (iMessage takes more, but a
/// wall of text reads badly in a bubble).
pub const MAX_TEXT_CHARS: usize = 4000;

/// The cursor's name in the cursor store.
const CURSOR: &str = "after_ms";

/// Messages read back per catch-up call.
const CATCH_UP_PAGE: usize = 100;

/// How long one file may take, body included.
const MEDIA_TIMEOUT: Duration = Duration::from_secs(300);

/// Typing is shown again at most this often per chat, by default.
const TYPING_REFRESH: Duration = Duration::from_secs(10);

/// Chats whose typing time is remembered; when full, the memory starts
/// over.
const MAX_TYPING_CHATS: usize = 10_000;

/// What the adapter needs, resolved from `platforms.bluebubbles` and the
/// environment.
#[derive(Debug, Clone)]
pub struct BlueBubblesSettings {
    /// The server's address.
    pub server_url: String,
    /// The server password.
    pub password: Secret,
    /// The URL the server posts to (without the password, which is
    /// added).
    pub webhook_url: String,
    /// Group chats need a wake word.
    pub require_mention: bool,
    /// The wake words (case-insensitive regular expressions).
    pub mention_patterns: Vec<String>,
    /// Mark chats read when an answer starts.
    pub send_read_receipts: bool,
    /// Larger webhook bodies get 413.
    pub max_body_bytes: usize,
    /// How often the adapter reads back what the webhook may have missed.
    pub catch_up_every: Duration,
    /// Typing (and the read receipt) is shown again at most this often
    /// per chat.
    pub typing_every: Duration,
    /// How long one REST call may take.
    pub send_timeout: Duration,
}

/// Why the adapter cannot be configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlueBubblesError {
    /// On, but a setting is missing; each is named as its environment
    /// variable and its config key.
    #[error(
        "BlueBubbles is missing {}; set them in the environment or .env (or under \
         platforms.bluebubbles in config.yaml), or turn it off with \
         platforms.bluebubbles.enabled: false",
        .0.join(", ")
    )]
    Missing(Vec<&'static str>),
    /// A setting is there but unusable; the message names it.
    #[error("BlueBubbles: {0}")]
    Invalid(String),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

impl BlueBubblesSettings {
    /// Settings with the defaults for everything but these three.
    pub fn new(
        server_url: impl Into<String>,
        password: impl Into<Secret>,
        webhook_url: impl Into<String>,
    ) -> BlueBubblesSettings {
        let d = BlueBubblesConfig::default();
        BlueBubblesSettings {
            server_url: server_url.into(),
            password: password.into(),
            webhook_url: webhook_url.into(),
            require_mention: d.require_mention,
            mention_patterns: d.mention_patterns,
            send_read_receipts: d.send_read_receipts,
            max_body_bytes: d.max_body_bytes,
            catch_up_every: Duration::from_secs(30),
            typing_every: TYPING_REFRESH,
            send_timeout: Duration::from_secs(30),
        }
    }

    /// The settings, or `None` when BlueBubbles is off: `enabled: false`,
    /// or no `enabled` and neither the server nor the password set.
    /// `listener_port` is the shared listener's, for the default webhook
    /// URL. `BLUEBUBBLES_REQUIRE_MENTION`, `BLUEBUBBLES_MENTION_PATTERNS`
    /// (comma-separated) and `BLUEBUBBLES_SEND_READ_RECEIPTS` override
    /// their keys.
    ///
    /// # Errors
    /// [`BlueBubblesError::Missing`] naming what is missing when it is on.
    pub fn from_config(
        config: &BlueBubblesConfig,
        env: &Env,
        listener_port: u16,
    ) -> Result<Option<BlueBubblesSettings>, BlueBubblesError> {
        if config.enabled == Some(false) {
            return Ok(None);
        }
        let url = text_or_env(config.server_url.as_deref(), env, "BLUEBUBBLES_SERVER_URL");
        let password = secret_or_env(config.password.as_ref(), env, "BLUEBUBBLES_PASSWORD");
        if config.enabled.is_none() && url.is_none() && password.is_none() {
            return Ok(None);
        }
        let (Some(url), Some(password)) = (url.clone(), password.clone()) else {
            return Err(BlueBubblesError::Missing(
                [
                    (
                        url.is_none(),
                        "BLUEBUBBLES_SERVER_URL (platforms.bluebubbles.server_url)",
                    ),
                    (
                        password.is_none(),
                        "BLUEBUBBLES_PASSWORD (platforms.bluebubbles.password)",
                    ),
                ]
                .into_iter()
                .filter_map(|(missing, name)| missing.then_some(name))
                .collect(),
            ));
        };
        let webhook_url = text_or_env(
            config.webhook_url.as_deref(),
            env,
            "BLUEBUBBLES_WEBHOOK_URL",
        )
        .unwrap_or_else(|| format!("http://127.0.0.1:{listener_port}{WEBHOOK_PATH}"));
        let mention_patterns = match env.get("BLUEBUBBLES_MENTION_PATTERNS") {
            Some(list) if !list.trim().is_empty() => list
                .split(',')
                .map(|p| p.trim().to_owned())
                .filter(|p| !p.is_empty())
                .collect(),
            _ => config.mention_patterns.clone(),
        };
        Ok(Some(BlueBubblesSettings {
            require_mention: env
                .flag("BLUEBUBBLES_REQUIRE_MENTION")
                .unwrap_or(config.require_mention),
            mention_patterns,
            send_read_receipts: env
                .flag("BLUEBUBBLES_SEND_READ_RECEIPTS")
                .unwrap_or(config.send_read_receipts),
            max_body_bytes: config.max_body_bytes,
            catch_up_every: Duration::from_secs(config.catch_up_secs),
            ..BlueBubblesSettings::new(url, password, webhook_url)
        }))
    }
}

/// The BlueBubbles connector (see the module docs).
pub struct BlueBubblesAdapter {
    api: Api,
    hook: Arc<server::Hook>,
    /// Where the server is told to post, the password included.
    registered_url: Secret,
    cursors: Arc<dyn CursorStore>,
    catch_up_every: Duration,
    typing_every: Duration,
    send_timeout: Duration,
    send_read_receipts: bool,
    /// The server's Private API helper is connected (threaded replies,
    /// typing, read receipts), as last checked.
    private_api: AtomicBool,
    typed: Mutex<HashMap<String, Instant>>,
}

impl fmt::Debug for BlueBubblesAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlueBubblesAdapter")
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

fn parse_http(url: &str, what: &str) -> Result<reqwest::Url, BlueBubblesError> {
    let url = url.trim();
    let with_scheme = if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    };
    match reqwest::Url::parse(&with_scheme) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Ok(u),
        _ => Err(BlueBubblesError::Invalid(format!(
            "{what} must be an http(s) URL; got {url:?}"
        ))),
    }
}

impl BlueBubblesAdapter {
    /// Checks the settings and builds the HTTP client; contacts nobody.
    ///
    /// # Errors
    /// An unusable URL, an empty password, a wake word that is not a
    /// regular expression.
    pub fn new(
        settings: BlueBubblesSettings,
        cursors: Arc<dyn CursorStore>,
    ) -> Result<BlueBubblesAdapter, BlueBubblesError> {
        let base = parse_http(
            &settings.server_url,
            "the server URL (BLUEBUBBLES_SERVER_URL)",
        )?;
        let password = settings.password.expose().trim();
        if password.is_empty() {
            return Err(BlueBubblesError::Invalid(
                "the server password (BLUEBUBBLES_PASSWORD) is empty".to_owned(),
            ));
        }
        let mut hook_url = parse_http(
            &settings.webhook_url,
            "the webhook URL (BLUEBUBBLES_WEBHOOK_URL)",
        )?;
        hook_url.query_pairs_mut().append_pair("password", password);
        let wake_words = settings
            .mention_patterns
            .iter()
            .map(|p| {
                regex::RegexBuilder::new(p)
                    .case_insensitive(true)
                    .build()
                    .map_err(|e| {
                        BlueBubblesError::Invalid(format!(
                            "the wake word {p:?} is not a regular expression: {e}"
                        ))
                    })
            })
            .collect::<Result<Vec<Regex>, _>>()?;
        if settings.max_body_bytes == 0 {
            return Err(BlueBubblesError::Invalid(
                "platforms.bluebubbles.max_body_bytes must be at least 1".to_owned(),
            ));
        }
        let password = Secret::new(password);
        let api = Api::new(base, &password).map_err(BlueBubblesError::Client)?;
        Ok(BlueBubblesAdapter {
            api,
            hook: Arc::new(server::Hook {
                password_digest: Sha256::digest(password.expose().as_bytes()).into(),
                max_body_bytes: settings.max_body_bytes,
                require_mention: settings.require_mention,
                wake_words,
                slot: InboxSlot::new(),
            }),
            registered_url: Secret::new(hook_url.to_string()),
            cursors,
            catch_up_every: settings.catch_up_every.max(Duration::from_millis(50)),
            typing_every: settings.typing_every,
            send_timeout: settings.send_timeout,
            send_read_receipts: settings.send_read_receipts,
            private_api: AtomicBool::new(false),
            typed: Mutex::new(HashMap::new()),
        })
    }

    /// `POST /bluebubbles-webhook`, to mount on the shared listener.
    pub fn mount(&self) -> Mount {
        Mount {
            platform: PLATFORM,
            slot: self.hook.slot.clone(),
            routes: server::router(self.hook.clone()),
        }
    }

    /// Hands over the messages created since the saved position, oldest
    /// first, moving the position past each one the runner decided on.
    /// Returns how many it handed over.
    async fn catch_up(&self, inbox: &Inbox) -> Result<usize, String> {
        let saved = self
            .cursors
            .cursor(PLATFORM, CURSOR)
            .await
            .map_err(|e| format!("cannot read the catch-up position: {e}"))?;
        let Some(mut after) = saved.and_then(|s| s.parse::<i64>().ok()) else {
            self.start_position().await?;
            return Ok(0);
        };
        let mut handed = 0;
        loop {
            let page = self
                .api
                .messages_after(after, CATCH_UP_PAGE, self.send_timeout)
                .await
                .map_err(|e| format!("cannot read recent messages back: {e}"))?;
            let full = page.len() == CATCH_UP_PAGE;
            let start = after;
            for message in &page {
                let Some(created) = mapping::created_ms(message) else {
                    continue;
                };
                if let Mapped::Event(event) = mapping::map_message(message, &self.hook.rules()) {
                    inbox
                        .submit(*event)
                        .await
                        .map_err(|_| "the gateway is stopping".to_owned())?;
                    handed += 1;
                }
                if created > after {
                    after = created;
                    self.save(after).await?;
                }
            }
            if !full || after == start {
                return Ok(handed);
            }
        }
    }

    /// On the very first start, the position is the server's newest
    /// message (in the server's clock, not ours): history is not
    /// replayed, only what arrives from here on.
    async fn start_position(&self) -> Result<(), String> {
        let saved = self
            .cursors
            .cursor(PLATFORM, CURSOR)
            .await
            .map_err(|e| format!("cannot read the catch-up position: {e}"))?;
        if saved.is_some() {
            return Ok(());
        }
        let newest = self
            .api
            .newest_message_ms(self.send_timeout)
            .await
            .map_err(|e| format!("cannot read the newest message: {e}"))?;
        self.save(newest.unwrap_or(0)).await
    }

    async fn save(&self, after_ms: i64) -> Result<(), String> {
        self.cursors
            .set_cursor(PLATFORM, CURSOR, &after_ms.to_string())
            .await
            .map_err(|e| format!("cannot save the catch-up position: {e}"))
    }

    /// Catches up now and then every `catch_up_every`, until shutdown.
    async fn keep_catching_up(&self, ctx: &AdapterContext) {
        loop {
            match self.catch_up(&ctx.inbox).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(messages = n, "BlueBubbles catch-up handed messages over"),
                Err(e) => tracing::warn!("BlueBubbles catch-up: {e}"),
            }
            tokio::select! {
                _ = ctx.shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.catch_up_every) => {}
            }
        }
    }

    /// The chat guid for a target: a guid as it is, an address (phone
    /// number or e-mail) through the server's chats.
    async fn chat_guid(&self, target: &str) -> Result<Option<String>, SendError> {
        if target.contains(';') {
            return Ok(Some(target.to_owned()));
        }
        self.api
            .find_chat(target, self.send_timeout)
            .await
            .map_err(|e| api::classify(&e))
    }
}

/// A `tempGuid` for a message: the same message to the same place always
/// gets the same one (the server matches its echo by it).
fn temp_guid(chat: &str, reply_to: Option<&str>, text: &str) -> String {
    let mut d = Sha256::new();
    for part in [chat, reply_to.unwrap_or(""), text] {
        d.update(part.as_bytes());
        d.update([0]);
    }
    let hex: String = d.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("talaria-{hex}")
}

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
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
    group_chat_allowlist: true,
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_TEXT_CHARS,
        unit: LengthUnit::Chars,
    })
};

#[async_trait]
impl Adapter for BlueBubblesAdapter {
    fn platform(&self) -> &'static str {
        PLATFORM
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    /// Checks the server and the password, learns whether the Private API
    /// works, registers the webhook (once), then takes deliveries and
    /// catches up until the gateway stops.
    /// `GET /api/v1/server/info` with the password: the server's version
    /// and the iCloud account of its Mac, or [`AdapterError::Fatal`] when
    /// the server refuses the password (401).
    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        let answer = self.api.server_info(self.send_timeout).await;
        Some(match answer {
            Ok(info) => {
                let server = match &info.version {
                    Some(v) => format!("the BlueBubbles server {v}"),
                    None => "the BlueBubbles server".to_owned(),
                };
                Ok(match &info.icloud {
                    Some(account) => format!("{server} signed in to iCloud as {account}"),
                    None => server,
                })
            }
            Err(e) if matches!(e.status(), Some(401 | 403)) => Err(AdapterError::Fatal(format!(
                "the BlueBubbles server refused the password (BLUEBUBBLES_PASSWORD): {e}"
            ))),
            Err(e) => Err(AdapterError::Disconnected(e.to_string())),
        })
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        ctx.liveness.set(Liveness::Connecting);
        let prepared = async {
            self.api.ping(self.send_timeout).await?;
            let info = self.api.server_info(self.send_timeout).await?;
            // Before the webhook exists: a message is then either posted
            // or read back, never neither.
            self.start_position()
                .await
                .map_err(|e| self.api.other_error(e))?;
            let id = self
                .api
                .ensure_webhook(self.registered_url.expose(), self.send_timeout)
                .await?;
            Ok::<_, api::ApiError>((info, id))
        };
        let prepared = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = prepared => r,
        };
        match prepared {
            Ok((info, id)) => {
                self.private_api.store(info.private_api, Ordering::Relaxed);
                tracing::info!(
                    webhook = %id,
                    private_api = info.private_api,
                    "BlueBubbles server reached; webhook registered"
                );
                if !info.private_api {
                    tracing::info!(
                        "the BlueBubbles Private API helper is not connected: answers are not \
                         threaded, and typing and read receipts are off"
                    );
                }
            }
            Err(e) if e.status() == Some(401) => {
                return Err(AdapterError::Fatal(
                    "the BlueBubbles server refused the password (BLUEBUBBLES_PASSWORD)".to_owned(),
                ));
            }
            Err(e) => return Err(AdapterError::Disconnected(e.to_string())),
        }
        let attached = self.hook.slot.attach(&ctx);
        tokio::pin!(attached);
        tokio::select! {
            r = &mut attached => r,
            () = self.keep_catching_up(&ctx) => attached.await,
        }
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let target = message.chat_id.trim();
        if target.is_empty() || target.len() > 256 {
            return Err(SendError::Rejected(format!("`{target}` is not a chat")));
        }
        let mut text = crate::plain::to_plain(&message.text);
        if text.trim().is_empty() {
            text = message.text.clone();
        }
        if text.trim().is_empty() {
            return Ok(SentMessage::default());
        }
        let temp = temp_guid(target, message.reply_to.as_deref(), &text);
        let Some(chat) = self.chat_guid(target).await? else {
            // No chat with this address yet: creating one sends the text.
            let guid = self
                .api
                .new_chat(target, &text, &temp, self.send_timeout)
                .await
                .map_err(|e| api::classify(&e))?;
            return Ok(SentMessage { message_id: guid });
        };
        let mut body = json!({ "chatGuid": chat, "tempGuid": temp, "message": text });
        match message.reply_to.as_deref() {
            Some(quoted) if self.private_api.load(Ordering::Relaxed) => {
                body["method"] = json!("private-api");
                body["selectedMessageGuid"] = json!(quoted);
                body["partIndex"] = json!(0);
            }
            _ => body["method"] = json!("apple-script"),
        }
        let guid = self
            .api
            .send_text(&body, self.send_timeout)
            .await
            .map_err(|e| api::classify(&e))?;
        Ok(SentMessage { message_id: guid })
    }

    /// Uploads the file as an attachment of the chat; a caption follows
    /// as a text, since iMessage attachments carry none.
    async fn send_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        let target = file.chat_id.trim();
        let Some(chat) = self.chat_guid(target).await? else {
            return self
                .send(&OutboundMessage {
                    chat_id: file.chat_id.clone(),
                    thread_id: None,
                    reply_to: file.reply_to.clone(),
                    text: file.fallback_text(PLATFORM),
                    choices: Vec::new(),
                })
                .await;
        };
        let part = crate::http::file_part(&file.path, &file.name, &file.mime)
            .await
            .map_err(|e| SendError::Rejected(format!("cannot read {}: {e}", file.name)))?;
        let mut form = reqwest::multipart::Form::new()
            .part("attachment", part)
            .text("chatGuid", chat.clone())
            .text("name", file.name.clone())
            .text("tempGuid", temp_guid(&chat, None, &file.name))
            .text("method", "apple-script");
        if file.kind == MediaKind::Voice {
            form = form.text("isAudioMessage", "true");
        }
        let guid = self
            .api
            .send_attachment(form, MEDIA_TIMEOUT)
            .await
            .map_err(|e| api::classify(&e))?;
        if let Some(caption) = file.caption.as_deref().filter(|c| !c.trim().is_empty()) {
            // The file is out: a failed caption must not make the ledger
            // send the file again, so it is only logged.
            let text = OutboundMessage {
                chat_id: chat,
                thread_id: None,
                reply_to: None,
                text: caption.to_owned(),
                choices: Vec::new(),
            };
            if let Err(e) = self.send(&text).await {
                tracing::warn!(error = %e, "the caption after a BlueBubbles file was not sent");
            }
        }
        Ok(SentMessage { message_id: guid })
    }

    /// `locator` is the attachment's guid.
    async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        if locator.is_empty() || locator.len() > 256 || locator.contains(['/', '?', '#']) {
            return Err(DownloadError::Gone(format!(
                "{locator:?} is not a BlueBubbles attachment guid"
            )));
        }
        self.api.download(locator, MEDIA_TIMEOUT).await
    }

    /// Marks the chat read and shows typing, when the Private API helper
    /// is connected (both need it); at most every few seconds per chat,
    /// so each turn's messages are marked read as it starts.
    async fn typing(&self, chat_id: &str, _thread_id: Option<&str>) -> Result<(), SendError> {
        if !self.private_api.load(Ordering::Relaxed) || !chat_id.contains(';') {
            return Ok(());
        }
        {
            let mut map = self.typed.lock().unwrap_or_else(|p| p.into_inner());
            if map
                .get(chat_id)
                .is_some_and(|at| at.elapsed() < self.typing_every)
            {
                return Ok(());
            }
            if map.len() >= MAX_TYPING_CHATS {
                map.clear();
            }
            map.insert(chat_id.to_owned(), Instant::now());
        }
        // Whatever arrived since the last receipt is being answered now:
        // marked read with each typing refresh, so every turn's messages
        // are.
        if self.send_read_receipts
            && let Err(e) = self.api.mark_read(chat_id, self.send_timeout).await
        {
            tracing::debug!(error = %e, "BlueBubbles read receipt not sent");
        }
        self.api
            .typing(chat_id, self.send_timeout)
            .await
            .map_err(|e| api::classify(&e))
    }
}

/// The registry's entry for BlueBubbles.
pub const ENTRY: Platform = Platform {
    name: PLATFORM,
    title: "BlueBubbles (iMessage)",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<BlueBubblesConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let port = setup
        .section::<crate::webhook::WebhookConfig>()
        .map_or(crate::ingress::DEFAULT_PORT, |w| w.port);
    let Some(settings) = BlueBubblesSettings::from_config(&setup.section()?, setup.env, port)
        .map_err(BuildError::misconfigured)?
    else {
        return Ok(None);
    };
    let adapter =
        BlueBubblesAdapter::new(settings, setup.cursors.clone()).map_err(BuildError::set_up)?;
    let mount = adapter.mount();
    Ok(Some(Built {
        adapter: Arc::new(adapter),
        mount: Some(mount),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env {
        Env::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn off_unless_set_then_both_needed_and_the_webhook_defaults_to_the_listener() {
        let cfg = BlueBubblesConfig::default();
        assert!(
            BlueBubblesSettings::from_config(&cfg, &env(&[]), 8644)
                .unwrap()
                .is_none()
        );
        let e = BlueBubblesSettings::from_config(
            &cfg,
            &env(&[("BLUEBUBBLES_SERVER_URL", "mac.local:1234")]),
            8644,
        )
        .unwrap_err();
        assert_eq!(
            e,
            BlueBubblesError::Missing(vec![
                "BLUEBUBBLES_PASSWORD (platforms.bluebubbles.password)"
            ])
        );
        let s = BlueBubblesSettings::from_config(
            &cfg,
            &env(&[
                ("BLUEBUBBLES_SERVER_URL", "mac.local:1234"),
                ("BLUEBUBBLES_PASSWORD", "pw"),
                ("BLUEBUBBLES_REQUIRE_MENTION", "true"),
                ("BLUEBUBBLES_MENTION_PATTERNS", r"\bhey bot\b, ^bot"),
            ]),
            9000,
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.webhook_url, "http://127.0.0.1:9000/bluebubbles-webhook");
        assert!(s.require_mention);
        assert_eq!(s.mention_patterns, [r"\bhey bot\b", "^bot"]);
    }

    #[test]
    fn new_checks_the_settings_and_the_password_rides_only_in_the_registered_url() {
        let dir = tempfile::tempdir().unwrap();
        let cursors: Arc<dyn CursorStore> =
            Arc::new(talaria_store::SqliteStore::open(&dir.path().join("state.db")).unwrap());
        let good = || {
            BlueBubblesSettings::new(
                "mac.local:1234",
                "PASSWORDPW",
                "http://gw:8644/bluebubbles-webhook",
            )
        };
        let a = BlueBubblesAdapter::new(good(), cursors.clone()).unwrap();
        assert!(!format!("{a:?}").contains("PASSWORDPW"));
        assert_eq!(
            a.registered_url.expose(),
            "http://gw:8644/bluebubbles-webhook?password=PASSWORDPW"
        );
        for bad in [
            BlueBubblesSettings::new("ftp://x", "pw", "http://gw/x"),
            BlueBubblesSettings::new("mac", " ", "http://gw/x"),
            BlueBubblesSettings {
                mention_patterns: vec!["(".into()],
                ..good()
            },
        ] {
            let e = BlueBubblesAdapter::new(bad, cursors.clone()).unwrap_err();
            assert!(matches!(e, BlueBubblesError::Invalid(_)), "{e:?}");
        }
    }

    #[test]
    fn temp_guids_are_stable_per_message() {
        let a = temp_guid("iMessage;-;+1", Some("m"), "hi");
        assert_eq!(a, temp_guid("iMessage;-;+1", Some("m"), "hi"));
        assert_ne!(a, temp_guid("iMessage;-;+1", None, "hi"));
        assert!(a.starts_with("talaria-") && a.len() == 40, "{a}");
    }
}
