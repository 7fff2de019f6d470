//! The WhatsApp Cloud API adapter: a WhatsApp Business number through
//! Meta's webhook (in) and the Graph API (out).
//!
//! Deliveries arrive on the shared webhook listener ([`crate::ingress`]) at
//! `GET`/`POST /whatsapp/webhook`; [`WhatsappAdapter::run`] only attaches
//! the gateway's inbox. Every conversation is a DM: the chat and the user
//! are the sender's `wa_id` (their phone number, digits only).
//!
//! # Layout
//!
//! - this file: [`WhatsappSettings`] (from `platforms.whatsapp_cloud` and
//!   the environment), [`WhatsappAdapter`] and its [`Adapter`] impl:
//!   sending with rate-limit retries, the typing indicator.
//! - `server`: the handshake and the delivery handler, in processing order.
//! - `mapping`: Meta's payload and what it becomes.
//! - `api`: the Graph calls and what their errors mean to the ledger.
//! - `format`: Markdown to WhatsApp's `*bold*`, `_italic_`, `~strike~`.
//! - `media`: which message type carries a file, and what a failed fetch
//!   means.
//!
//! # Invariants
//!
//! - A delivery's signature is checked on the raw body before anything in
//!   it is parsed, logged or handed on; a bad or missing one gets 401.
//! - A delivery is answered 200 only after every message in it was handed
//!   to the inbox; the message id is the wamid, so Meta's re-deliveries are
//!   dropped by the runner's inbound dedupe and start no second turn.
//! - Only `wa_id`s of ASCII letters and digits become chat ids; anything
//!   else is skipped and logged, never hashed into a key nobody can answer.
//! - Secrets (token, app secret, verify token) are never logged nor part
//!   of an error message; `Debug` masks them.
//! - A reply outside the 24-hour customer service window is refused by
//!   WhatsApp; the adapter reports it as [`SendError::Rejected`] with a
//!   text that says so and what to do, and the ledger keeps that reason.

mod api;
mod config;
mod format;
mod mapping;
mod media;
mod server;

use crate::registry::{BuildError, Built, Platform, Setup};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use hmac::Mac;
use serde_json::json;
use sha2::{Digest, Sha256};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Download, DownloadError, MediaKind, MessageLimits,
    OutboundFile, OutboundMessage, SendError, SentMessage,
};
use talaria_adapter::{Capabilities, LengthUnit, SenderIds};
use talaria_core::config::{platform_var, secret_or_env, text_or_env};
use talaria_core::{Env, Secret};

use crate::ingress::{InboxSlot, Mount};
use api::{Api, ApiError};

pub use server::WEBHOOK_PATH;

pub use config::{ENV, WhatsappCloudConfig};

/// The platform name in session keys, config and allowlists
/// (`WHATSAPP_CLOUD_ALLOWED_USERS`).
pub const PLATFORM: &str = "whatsapp_cloud";

/// The longest text body WhatsApp accepts, in characters.
pub const MAX_TEXT_CHARS: usize = 4096;

/// A typing indicator lasts 25 seconds or until the reply; showing it
/// again sooner than this only costs API calls.
const TYPING_REFRESH: Duration = Duration::from_secs(20);

/// How long moving one file (up or down) may take, body included.
const MEDIA_TIMEOUT: Duration = Duration::from_secs(300);

/// Waits longer than this are not worth holding a send for.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(60);

/// What the adapter needs, resolved from `platforms.whatsapp_cloud` and
/// the environment.
#[derive(Debug, Clone)]
pub struct WhatsappSettings {
    /// The access token for the Graph API.
    pub token: Secret,
    /// The business phone number's id.
    pub phone_number_id: String,
    /// The app secret that signs deliveries.
    pub app_secret: Secret,
    /// The token of the verification handshake.
    pub verify_token: Secret,
    /// The Graph API root, e.g. `https://graph.facebook.com`.
    pub graph_base: String,
    /// The Graph API version, e.g. `v21.0`.
    pub api_version: String,
    /// Larger deliveries get 413.
    pub max_body_bytes: usize,
    /// How long a send (or typing call) may take.
    pub send_timeout: Duration,
    /// Retries after a rate limit before a send reports
    /// [`SendError::RateLimited`].
    pub rate_limit_retries: u32,
    /// The first wait after a rate limit that names none; doubled each
    /// time. Graph's limits are per second or so (one message every six
    /// seconds to the same user, at most).
    pub rate_limit_wait: Duration,
}

/// Why the adapter cannot be configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WhatsappError {
    /// Enabled, but some credentials are not set (their config keys).
    #[error("{}", missing_message(.0))]
    Missing(Vec<&'static str>),
    /// The phone number id is not a Graph object id (digits).
    #[error(
        "platforms.whatsapp_cloud.phone_number_id (WHATSAPP_CLOUD_PHONE_NUMBER_ID) must be the \
         number's id from the WhatsApp Manager (digits), not the phone number"
    )]
    BadPhoneNumberId,
    /// The token cannot be sent in a header.
    #[error("the WhatsApp Cloud access token is malformed (whitespace or non-ASCII characters)")]
    BadToken,
    /// `graph_base` is not an http(s) URL, or `api_version` is not `vN.N`.
    #[error("platforms.whatsapp_cloud.{0}")]
    BadEndpoint(String),
    /// `max_body_bytes` is 0.
    #[error("platforms.whatsapp_cloud.max_body_bytes must be at least 1")]
    ZeroBodyLimit,
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// Names every missing credential both ways it can be set.
fn missing_message(keys: &[&str]) -> String {
    let vars: Vec<String> = keys
        .iter()
        .map(|k| talaria_core::config::platform_var(PLATFORM, &k.to_ascii_uppercase()))
        .collect();
    let paths: Vec<String> = keys
        .iter()
        .map(|k| format!("platforms.whatsapp_cloud.{k}"))
        .collect();
    format!(
        "WhatsApp Cloud is enabled but {} not set: {} (or {}). All four credentials are \
         needed: the access token, the phone number id, the app secret and the verify token \
         (see docs/platforms/whatsapp.md)",
        if keys.len() == 1 {
            "this is"
        } else {
            "these are"
        },
        vars.join(", "),
        paths.join(", ")
    )
}

impl WhatsappSettings {
    /// Settings with these credentials and every default (tests and
    /// embedding; the gateway uses [`Self::from_config`]).
    pub fn new(
        token: &str,
        phone_number_id: &str,
        app_secret: &str,
        verify_token: &str,
    ) -> WhatsappSettings {
        let defaults = WhatsappCloudConfig::default();
        WhatsappSettings {
            token: Secret::new(token),
            phone_number_id: phone_number_id.to_owned(),
            app_secret: Secret::new(app_secret),
            verify_token: Secret::new(verify_token),
            graph_base: defaults.graph_base,
            api_version: defaults.api_version,
            max_body_bytes: defaults.max_body_bytes,
            send_timeout: Duration::from_secs(30),
            rate_limit_retries: 2,
            rate_limit_wait: Duration::from_secs(2),
        }
    }

    /// Resolves the settings, or `None` when WhatsApp Cloud is off:
    /// `enabled: false`, or no `enabled` and none of the four credentials
    /// set. Each credential is the config key, else its environment
    /// variable (`WHATSAPP_CLOUD_TOKEN`, `WHATSAPP_CLOUD_PHONE_NUMBER_ID`,
    /// `WHATSAPP_CLOUD_APP_SECRET`, `WHATSAPP_CLOUD_VERIFY_TOKEN`).
    ///
    /// # Errors
    /// [`WhatsappError::Missing`] naming every credential that is not set
    /// when the platform is on.
    pub fn from_config(
        config: &WhatsappCloudConfig,
        env: &Env,
    ) -> Result<Option<WhatsappSettings>, WhatsappError> {
        let var = |key| platform_var(PLATFORM, key);
        let token = secret_or_env(config.token.as_ref(), env, &var("TOKEN"));
        let number = text_or_env(
            config.phone_number_id.as_deref(),
            env,
            &var("PHONE_NUMBER_ID"),
        );
        let app_secret = secret_or_env(config.app_secret.as_ref(), env, &var("APP_SECRET"));
        let verify = secret_or_env(config.verify_token.as_ref(), env, &var("VERIFY_TOKEN"));
        let any = token.is_some() || number.is_some() || app_secret.is_some() || verify.is_some();
        if !config.enabled.unwrap_or(any) {
            return Ok(None);
        }
        let missing: Vec<&'static str> = [
            ("token", token.is_none()),
            ("phone_number_id", number.is_none()),
            ("app_secret", app_secret.is_none()),
            ("verify_token", verify.is_none()),
        ]
        .into_iter()
        .filter_map(|(name, absent)| absent.then_some(name))
        .collect();
        let (Some(token), Some(number), Some(app_secret), Some(verify)) =
            (token, number, app_secret, verify)
        else {
            return Err(WhatsappError::Missing(missing));
        };
        Ok(Some(WhatsappSettings {
            graph_base: config.graph_base.trim().to_owned(),
            api_version: config.api_version.trim().to_owned(),
            max_body_bytes: config.max_body_bytes,
            ..WhatsappSettings::new(
                token.expose(),
                &number,
                app_secret.expose(),
                verify.expose(),
            )
        }))
    }
}

/// The WhatsApp Cloud connector (see the module docs).
pub struct WhatsappAdapter {
    api: Api,
    hook: Arc<server::Hook>,
    send_timeout: Duration,
    rate_limit_retries: u32,
    rate_limit_wait: Duration,
}

impl fmt::Debug for WhatsappAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WhatsappAdapter")
            .field("api", &self.api)
            .field("phone_number_id", &self.hook.phone_number_id)
            .finish_non_exhaustive()
    }
}

impl WhatsappAdapter {
    /// Checks the settings and builds the HTTP client; serves nothing
    /// until [`WhatsappAdapter::mount`] is mounted on the shared listener.
    ///
    /// # Errors
    /// An empty or malformed credential, a phone number id that is not
    /// digits, an unusable `graph_base` or `api_version`, or
    /// `max_body_bytes: 0`.
    pub fn new(settings: WhatsappSettings) -> Result<WhatsappAdapter, WhatsappError> {
        let mut missing = Vec::new();
        for (name, value) in [
            ("token", settings.token.expose()),
            ("phone_number_id", settings.phone_number_id.as_str()),
            ("app_secret", settings.app_secret.expose()),
            ("verify_token", settings.verify_token.expose()),
        ] {
            if value.trim().is_empty() {
                missing.push(name);
            }
        }
        if !missing.is_empty() {
            return Err(WhatsappError::Missing(missing));
        }
        let token = settings.token.expose().trim();
        if !token.chars().all(|c| c.is_ascii_graphic()) {
            return Err(WhatsappError::BadToken);
        }
        let number = settings.phone_number_id.trim();
        if !number.chars().all(|c| c.is_ascii_digit()) {
            return Err(WhatsappError::BadPhoneNumberId);
        }
        let base = settings.graph_base.trim().trim_end_matches('/');
        match reqwest::Url::parse(base) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
            _ => {
                return Err(WhatsappError::BadEndpoint(format!(
                    "graph_base must be an http(s) URL such as https://graph.facebook.com, \
                     not {base:?}"
                )));
            }
        }
        let version = settings.api_version.trim().trim_matches('/');
        let version_ok = version
            .strip_prefix('v')
            .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.'));
        if !version_ok {
            return Err(WhatsappError::BadEndpoint(format!(
                "api_version must look like v21.0, not {version:?}"
            )));
        }
        if settings.max_body_bytes == 0 {
            return Err(WhatsappError::ZeroBodyLimit);
        }
        let api = Api::new(format!("{base}/{version}"), number, &Secret::new(token))
            .map_err(WhatsappError::Client)?;
        let mac = <hmac::Hmac<Sha256> as Mac>::new_from_slice(
            settings.app_secret.expose().trim().as_bytes(),
        )
        .map_err(|e| WhatsappError::Client(format!("the app secret cannot key HMAC: {e}")))?;
        let hook = server::Hook {
            phone_number_id: number.to_owned(),
            mac,
            verify_digest: Sha256::digest(settings.verify_token.expose().trim().as_bytes()).into(),
            max_body_bytes: settings.max_body_bytes,
            slot: InboxSlot::new(),
            last_inbound: Mutex::new(HashMap::new()),
        };
        Ok(WhatsappAdapter {
            api,
            hook: Arc::new(hook),
            send_timeout: settings.send_timeout,
            rate_limit_retries: settings.rate_limit_retries,
            rate_limit_wait: settings.rate_limit_wait,
        })
    }

    /// `GET` and `POST /whatsapp/webhook`, to mount on the shared listener.
    pub fn mount(&self) -> Mount {
        Mount {
            platform: PLATFORM,
            slot: self.hook.slot.clone(),
            routes: server::router(self.hook.clone()),
        }
    }

    /// `POST /messages`, waiting out rate limits a bounded number of times.
    async fn post_with_retries(&self, body: &serde_json::Value) -> Result<String, SendError> {
        let mut retries = 0;
        let mut backoff = self.rate_limit_wait;
        loop {
            match self.api.post(body, self.send_timeout).await {
                Ok(answer) => {
                    return api::sent_id(&answer).ok_or_else(|| {
                        // Accepted, but not in the shape we know: it may
                        // well have gone out, so never send it again.
                        SendError::Ambiguous(
                            "the Graph API accepted the message without a message id".to_owned(),
                        )
                    });
                }
                Err(e) if api::is_rate_limit(&e) => {
                    let wait = e.retry_after().unwrap_or(backoff);
                    if retries >= self.rate_limit_retries || wait > MAX_RETRY_WAIT {
                        tracing::warn!(error = %e, "WhatsApp rate limit; giving up for now");
                        return Err(api::classify(&e, wait));
                    }
                    retries += 1;
                    backoff = backoff.saturating_mul(2);
                    tracing::info!(?wait, error = %e, "WhatsApp rate limit; waiting");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err(self.report(e)),
            }
        }
    }

    /// Classifies a failed send and logs what the operator must know.
    fn report(&self, e: ApiError) -> SendError {
        let classified = api::classify(&e, self.rate_limit_wait);
        match api::graph_code(&e) {
            Some(api::OUTSIDE_WINDOW) => tracing::warn!(
                error = %e,
                "WhatsApp refused a reply: the 24-hour customer service window is closed; \
                 the user must write first (starting a conversation needs a template)"
            ),
            Some(api::BAD_TOKEN) => tracing::error!(
                error = %e,
                "the WhatsApp Cloud access token is invalid or expired: replace \
                 WHATSAPP_CLOUD_TOKEN (a system user token does not expire); replies are \
                 kept until then"
            ),
            _ => {}
        }
        classified
    }
}

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    sender_ids: SenderIds::Phone,
    // Stickers arrive as images.
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
impl Adapter for WhatsappAdapter {
    fn platform(&self) -> &'static str {
        PLATFORM
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        self.hook.slot.attach(&ctx).await
    }

    /// `GET /{phone_number_id}`: the business number and its verified
    /// name, or [`AdapterError::Fatal`] when Graph refuses the token
    /// (401, code 190) or does not let it see the number (the wrong id,
    /// or a token of another business: 400 with code 100, or 403).
    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        let answer = self.api.phone_number(self.send_timeout).await;
        Some(match answer {
            Ok(n) => Ok(
                match (n.verified_name.as_str(), n.display_phone_number.as_str()) {
                    ("", "") => format!("phone number id {}", n.id),
                    (name, "") => format!("{name} (phone number id {})", n.id),
                    ("", number) => format!("{number} (phone number id {})", n.id),
                    (name, number) => format!("{name}, {number} (phone number id {})", n.id),
                },
            ),
            Err(e) if e.status() == Some(401) || api::graph_code(&e) == Some(api::BAD_TOKEN) => {
                Err(AdapterError::Fatal(format!(
                    "WhatsApp Cloud refused the access token (WHATSAPP_CLOUD_TOKEN): {e}"
                )))
            }
            Err(e) if matches!(e.status(), Some(400 | 403 | 404)) => {
                Err(AdapterError::Fatal(format!(
                    "the access token cannot reach the phone number id \
                     (WHATSAPP_CLOUD_PHONE_NUMBER_ID): {e}"
                )))
            }
            Err(e) => Err(AdapterError::Disconnected(e.to_string())),
        })
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let mut text = format::to_whatsapp(&message.text);
        if text.chars().count() > MAX_TEXT_CHARS || text.trim().is_empty() {
            // The gateway split the original to fit; keep that if the
            // conversion ever made it longer (or emptied it).
            text = message.text.clone();
        }
        let mut body = json!({
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": message.chat_id,
            "type": "text",
            "text": { "body": text, "preview_url": false },
        });
        // Only quote what WhatsApp can find: its own message ids.
        if let Some(quoted) = message
            .reply_to
            .as_deref()
            .filter(|id| id.starts_with("wamid."))
        {
            body["context"] = json!({ "message_id": quoted });
        }
        let id = self.post_with_retries(&body).await?;
        Ok(SentMessage {
            message_id: Some(id),
        })
    }

    /// `locator` is the media id from the webhook: `GET /{media_id}` names
    /// a URL valid for five minutes, fetched with the same token, only
    /// from the Graph host or Meta's file host.
    async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        if !media::is_media_id(locator) {
            return Err(DownloadError::Gone(format!(
                "{locator:?} is not a WhatsApp media id"
            )));
        }
        let info = self
            .api
            .media_info(locator, self.send_timeout)
            .await
            .map_err(|e| media::lookup_failed(&e))?;
        let url = reqwest::Url::parse(&info.url)
            .ok()
            .filter(|u| self.api.is_file_address(u))
            .ok_or_else(|| {
                DownloadError::Gone(
                    "the media URL Graph named is not a WhatsApp file address".into(),
                )
            })?;
        let mut download = self.api.fetch(url, MEDIA_TIMEOUT).await?;
        download.length = download.length.or(info.size());
        Ok(download)
    }

    /// Uploads the file (`POST /media`, streamed from disk), then sends a
    /// message of the type that carries it. Audio has no caption on
    /// WhatsApp, so a caption follows it as a text.
    async fn send_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        let size = tokio::fs::metadata(&file.path)
            .await
            .map_err(|e| SendError::Rejected(format!("cannot read {}: {e}", file.name)))?
            .len();
        let Some(kind) = media::message_type(file.kind, &file.mime, size) else {
            let text = file.fallback_text(PLATFORM);
            return self
                .send(&OutboundMessage {
                    chat_id: file.chat_id.clone(),
                    thread_id: file.thread_id.clone(),
                    reply_to: file.reply_to.clone(),
                    text,
                    choices: Vec::new(),
                })
                .await;
        };
        let part = crate::http::file_part(&file.path, &file.name, &file.mime)
            .await
            .map_err(|e| SendError::Rejected(format!("cannot read {}: {e}", file.name)))?;
        let media_id = self
            .api
            .upload(part, &file.mime, MEDIA_TIMEOUT)
            .await
            .map_err(|e| self.report(e))?;
        let mut content = json!({ "id": media_id });
        let caption = file.caption.as_deref().filter(|c| !c.trim().is_empty());
        if let Some(caption) = caption.filter(|_| media::has_caption(kind)) {
            content["caption"] = json!(format::to_whatsapp(caption));
        }
        if kind == "document" {
            content["filename"] = json!(file.name);
        }
        let mut body = json!({
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": file.chat_id,
            "type": kind,
        });
        body[kind] = content;
        if let Some(quoted) = file
            .reply_to
            .as_deref()
            .filter(|id| id.starts_with("wamid."))
        {
            body["context"] = json!({ "message_id": quoted });
        }
        let id = self.post_with_retries(&body).await?;
        if let Some(caption) = caption.filter(|_| !media::has_caption(kind)) {
            // The file is out: a failed caption must not make the ledger
            // send the file again, so it is only logged.
            let text = OutboundMessage {
                chat_id: file.chat_id.clone(),
                thread_id: None,
                reply_to: None,
                text: caption.to_owned(),
                choices: Vec::new(),
            };
            if let Err(e) = self.send(&text).await {
                tracing::warn!(error = %e, "the caption after a WhatsApp audio was not sent");
            }
        }
        Ok(SentMessage {
            message_id: Some(id),
        })
    }

    /// Marks the chat's last message read and shows the typing indicator
    /// on it (one Graph call). Only messages the runner took get here, so
    /// a stranger's messages are never marked read.
    async fn typing(&self, chat_id: &str, _thread_id: Option<&str>) -> Result<(), SendError> {
        let message_id = {
            let mut map = self
                .hook
                .last_inbound
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let Some(last) = map.get_mut(chat_id) else {
                return Ok(());
            };
            if last
                .typed_at
                .is_some_and(|at| at.elapsed() < TYPING_REFRESH)
            {
                return Ok(());
            }
            last.typed_at = Some(Instant::now());
            last.message_id.clone()
        };
        let body = json!({
            "messaging_product": "whatsapp",
            "status": "read",
            "message_id": message_id,
            "typing_indicator": { "type": "text" },
        });
        self.api
            .post(&body, self.send_timeout)
            .await
            .map(|_| ())
            .map_err(|e| api::classify(&e, self.rate_limit_wait))
    }
}

/// The registry's entry for WhatsApp Cloud.
pub const ENTRY: Platform = Platform {
    name: PLATFORM,
    title: "WhatsApp Cloud",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<WhatsappCloudConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = WhatsappSettings::from_config(&setup.section()?, setup.env)
        .map_err(BuildError::misconfigured)?
    else {
        return Ok(None);
    };
    let adapter = WhatsappAdapter::new(settings).map_err(BuildError::set_up)?;
    let mount = adapter.mount();
    Ok(Some(Built {
        adapter: std::sync::Arc::new(adapter),
        mount: Some(mount),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env() -> Env {
        Env::from_pairs(Vec::<(String, String)>::new())
    }

    fn all_env() -> Env {
        Env::from_pairs([
            ("WHATSAPP_CLOUD_TOKEN", "EAAG-token-value-0123"),
            ("WHATSAPP_CLOUD_PHONE_NUMBER_ID", "106540352242922"),
            ("WHATSAPP_CLOUD_APP_SECRET", "app-secret-value-0123"),
            ("WHATSAPP_CLOUD_VERIFY_TOKEN", "verify-token-value-0123"),
        ])
    }

    #[test]
    fn off_unless_configured_and_all_four_required() {
        let cfg = WhatsappCloudConfig::default();
        assert!(matches!(
            WhatsappSettings::from_config(&cfg, &no_env()),
            Ok(None)
        ));
        let s = WhatsappSettings::from_config(&cfg, &all_env())
            .unwrap()
            .unwrap();
        assert_eq!(s.phone_number_id, "106540352242922");
        assert_eq!(s.graph_base, "https://graph.facebook.com");
        assert_eq!(s.api_version, "v21.0");
        WhatsappAdapter::new(s).unwrap();

        let partial = Env::from_pairs([("WHATSAPP_CLOUD_TOKEN", "t")]);
        let err = WhatsappSettings::from_config(&cfg, &partial).unwrap_err();
        assert_eq!(
            err,
            WhatsappError::Missing(vec!["phone_number_id", "app_secret", "verify_token"])
        );
        let text = err.to_string();
        assert!(
            text.contains("WHATSAPP_CLOUD_PHONE_NUMBER_ID, WHATSAPP_CLOUD_APP_SECRET, WHATSAPP_CLOUD_VERIFY_TOKEN"),
            "{text}"
        );
        assert!(
            text.contains("platforms.whatsapp_cloud.verify_token"),
            "{text}"
        );

        let on = WhatsappCloudConfig {
            enabled: Some(true),
            ..WhatsappCloudConfig::default()
        };
        assert!(matches!(
            WhatsappSettings::from_config(&on, &no_env()),
            Err(WhatsappError::Missing(m)) if m.len() == 4
        ));
        let off = WhatsappCloudConfig {
            enabled: Some(false),
            ..WhatsappCloudConfig::default()
        };
        assert!(matches!(
            WhatsappSettings::from_config(&off, &all_env()),
            Ok(None)
        ));
    }

    #[test]
    fn config_keys_win_over_the_environment() {
        let cfg = WhatsappCloudConfig {
            token: Some(Secret::new("cfg-token")),
            phone_number_id: Some(" 42 ".into()),
            graph_base: "http://127.0.0.1:9".into(),
            api_version: "v19.0".into(),
            ..WhatsappCloudConfig::default()
        };
        let s = WhatsappSettings::from_config(&cfg, &all_env())
            .unwrap()
            .unwrap();
        assert_eq!(s.token.expose(), "cfg-token");
        assert_eq!(s.phone_number_id, "42");
        assert_eq!(s.app_secret.expose(), "app-secret-value-0123");
        let a = WhatsappAdapter::new(s).unwrap();
        assert!(format!("{a:?}").contains("http://127.0.0.1:9/v19.0/42/messages"));
    }

    #[test]
    fn new_refuses_unusable_settings() {
        let ok = || WhatsappSettings::new("tok", "123", "sec", "ver");
        assert!(WhatsappAdapter::new(ok()).is_ok());
        let bad = [
            (
                WhatsappSettings {
                    phone_number_id: "+1 555".into(),
                    ..ok()
                },
                "phone_number_id",
            ),
            (
                WhatsappSettings {
                    token: Secret::new("a b"),
                    ..ok()
                },
                "token",
            ),
            (
                WhatsappSettings {
                    graph_base: "ftp://x".into(),
                    ..ok()
                },
                "graph_base",
            ),
            (
                WhatsappSettings {
                    api_version: "21".into(),
                    ..ok()
                },
                "api_version",
            ),
            (
                WhatsappSettings {
                    max_body_bytes: 0,
                    ..ok()
                },
                "max_body_bytes",
            ),
            (
                WhatsappSettings {
                    verify_token: Secret::new(" "),
                    ..ok()
                },
                "verify_token",
            ),
        ];
        for (settings, what) in bad {
            let err = WhatsappAdapter::new(settings).unwrap_err().to_string();
            assert!(
                err.contains(what) || (what == "token" && err.contains("token")),
                "{what}: {err}"
            );
        }
    }

    #[test]
    fn secrets_never_show_in_debug() {
        let s = WhatsappSettings::new(
            "TOKENTOKENTOKEN",
            "123",
            "APPSECRETAPPSECRET",
            "VERIFYVERIFYVERIFY",
        );
        let shown = format!("{s:?}");
        for secret in ["TOKENTOKEN", "APPSECRETAPP", "VERIFYVERIFY"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        let a = WhatsappAdapter::new(s).unwrap();
        let shown = format!("{a:?}");
        for secret in ["TOKENTOKEN", "APPSECRETAPP", "VERIFYVERIFY"] {
            assert!(!shown.contains(secret), "{shown}");
        }
    }
}
