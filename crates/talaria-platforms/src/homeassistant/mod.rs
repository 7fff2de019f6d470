//! Home Assistant: Talaria as a conversation agent, and tools that read
//! and control the house.
//!
//! - The adapter serves `POST /homeassistant/conversation` on the shared
//!   webhook listener ([`crate::ingress`]). Home Assistant (a
//!   `rest_command`, or a custom conversation integration) posts the
//!   user's sentence with `Authorization: Bearer <conversation token>`;
//!   the sentence becomes a turn of the conversation's session through the
//!   normal runner path, and the HTTP response carries the answer in the
//!   shape of Home Assistant's conversation result.
//! - The `ha_*` tools (in `talaria-tools`, so this crate never links the
//!   agent) use this module's REST client with a long-lived token
//!   (`HASS_URL`, `HASS_TOKEN`).
//!
//! # Layout
//!
//! - this file: [`HomeAssistantSettings`] (from `platforms.homeassistant`
//!   and the environment) and [`HomeAssistantAdapter`].
//! - `server`: the conversation handler, in processing order.
//! - `waiting`: requests waiting for their answer, answers kept for
//!   retries, split answers being put back together.
//! - `api`: the REST client, shared with the `ha_*` tools.
//!
//! # Invariants
//!
//! - Nothing runs for a request without the right bearer secret (compared
//!   in constant time): 401, and the body is not even read.
//! - An answer goes to the request it answers (by the event's message id,
//!   which the runner gives as `reply_to`), whole: a split answer is
//!   collected part by part and joined back exactly. An answer nobody waits
//!   for any more becomes a persistent notification, so nothing is lost.
//! - A retried request (same `id` or `Idempotency-Key`) never starts a
//!   second turn: it waits for the same answer, or gets it again.

mod api;
mod config;
mod server;
mod waiting;

use crate::registry::{BuildError, Built, Platform, Setup};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use sha2::{Digest, Sha256};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, MessageLimits, OutboundMessage, SendError, SentMessage,
};
use talaria_adapter::{Capabilities, LengthUnit};
use talaria_core::config::{secret_or_env, text_or_env};
use talaria_core::{Env, Secret};

use crate::ingress::{InboxSlot, Mount};
pub use api::{ApiError, HassApi};
use waiting::{Part, Waiting};

pub use config::{ENV, HomeAssistantConfig};

/// The platform name in session keys, logs and `gateway status`.
pub const PLATFORM: &str = "homeassistant";

/// The largest message part the gateway hands the adapter (the ancestor's
/// limit); longer answers are split and joined back here.
pub const MAX_MESSAGE_CHARS: usize = 4096;

/// How long one REST request to Home Assistant may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// The title of the notifications that carry late answers.
const NOTIFICATION_TITLE: &str = "Talaria";

/// Why Home Assistant cannot be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HomeAssistantError {
    /// `HASS_URL` or `HASS_TOKEN` is unusable.
    #[error("Home Assistant: {0}")]
    Api(String),
    /// `reply_timeout_secs: 0` would answer every request "still working".
    #[error("platforms.homeassistant.reply_timeout_secs must be at least 1")]
    ZeroTimeout,
}

/// How Home Assistant is used, resolved from `platforms.homeassistant` and
/// the environment.
#[derive(Debug, Clone)]
pub struct HomeAssistantSettings {
    /// Home Assistant's root URL (`HASS_URL`), for the tools and for
    /// notifications.
    pub url: Option<String>,
    /// The long-lived access token (`HASS_TOKEN`). Never logged.
    pub token: Option<Secret>,
    /// The bearer secret of the conversation endpoint
    /// (`HASS_CONVERSATION_TOKEN`); `None` serves no endpoint.
    pub conversation_token: Option<Secret>,
    /// `domain.service` patterns `ha_call_service` runs without asking.
    pub allowed_services: Vec<String>,
    /// How long a conversation request waits for its answer.
    pub reply_timeout: Duration,
    /// How long one REST request may take.
    pub request_timeout: Duration,
}

fn non_empty(s: Option<&str>) -> Option<String> {
    s.map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

impl HomeAssistantSettings {
    /// Settings with the defaults and these credentials (tests, embedding).
    pub fn new(
        url: Option<&str>,
        token: Option<&str>,
        conversation_token: Option<&str>,
    ) -> HomeAssistantSettings {
        HomeAssistantSettings {
            url: non_empty(url),
            token: non_empty(token).map(Secret::new),
            conversation_token: non_empty(conversation_token).map(Secret::new),
            allowed_services: Vec::new(),
            reply_timeout: Duration::from_secs(HomeAssistantConfig::default().reply_timeout_secs),
            request_timeout: REQUEST_TIMEOUT,
        }
    }

    /// Resolves `platforms.homeassistant` (each key falling back to its
    /// environment variable), or `None` when Home Assistant is off:
    /// `enabled: false`, or neither a conversation token nor a URL and
    /// token set.
    pub fn from_config(config: &HomeAssistantConfig, env: &Env) -> Option<HomeAssistantSettings> {
        if config.enabled == Some(false) {
            return None;
        }
        let settings = HomeAssistantSettings {
            url: text_or_env(config.url.as_deref(), env, "HASS_URL"),
            token: secret_or_env(config.token.as_ref(), env, "HASS_TOKEN"),
            conversation_token: secret_or_env(
                config.conversation_token.as_ref(),
                env,
                "HASS_CONVERSATION_TOKEN",
            ),
            allowed_services: config
                .allowed_services
                .iter()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect(),
            reply_timeout: Duration::from_secs(config.reply_timeout_secs),
            request_timeout: REQUEST_TIMEOUT,
        };
        if settings.conversation_token.is_none() && settings.api_credentials().is_none() {
            if config.enabled == Some(true) {
                tracing::warn!(
                    "platforms.homeassistant.enabled is true but neither HASS_CONVERSATION_TOKEN \
                     nor HASS_URL and HASS_TOKEN are set"
                );
            }
            return None;
        }
        Some(settings)
    }

    /// The URL and token, when both are set.
    fn api_credentials(&self) -> Option<(&str, &str)> {
        Some((self.url.as_deref()?, self.token.as_ref()?.expose()))
    }

    /// The REST client, when `HASS_URL` and `HASS_TOKEN` are set.
    ///
    /// # Errors
    /// A URL that is not http(s).
    pub fn api(&self) -> Result<Option<HassApi>, HomeAssistantError> {
        match self.api_credentials() {
            None => Ok(None),
            Some((url, token)) => HassApi::new(url, token, self.request_timeout)
                .map(Some)
                .map_err(HomeAssistantError::Api),
        }
    }
}

/// The conversation endpoint's adapter (see the module docs).
pub struct HomeAssistantAdapter {
    shared: Arc<server::Shared>,
    slot: InboxSlot,
}

impl fmt::Debug for HomeAssistantAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HomeAssistantAdapter")
            .field("notifications", &self.shared.api.is_some())
            .finish_non_exhaustive()
    }
}

impl HomeAssistantAdapter {
    /// The adapter, or `None` when no conversation token is set (the tools
    /// may still be on).
    ///
    /// # Errors
    /// An unusable `HASS_URL`, or a zero reply timeout.
    pub fn new(
        settings: &HomeAssistantSettings,
    ) -> Result<Option<HomeAssistantAdapter>, HomeAssistantError> {
        let Some(secret) = settings.conversation_token.clone() else {
            return Ok(None);
        };
        if settings.reply_timeout.is_zero() {
            return Err(HomeAssistantError::ZeroTimeout);
        }
        let api = settings.api()?;
        if api.is_none() {
            tracing::warn!(
                "HASS_URL and HASS_TOKEN are not set: answers that arrive after the reply \
                 timeout cannot be shown as notifications and are dropped"
            );
        }
        Ok(Some(HomeAssistantAdapter {
            shared: Arc::new(server::Shared {
                secret,
                reply_timeout: settings.reply_timeout,
                api,
                waiting: Waiting::default(),
                stopping: std::sync::Mutex::new(None),
            }),
            slot: InboxSlot::new(),
        }))
    }

    /// `POST /homeassistant/conversation` and `GET /homeassistant/health`,
    /// to mount on the shared listener.
    pub fn mount(&self) -> Mount {
        Mount {
            platform: PLATFORM,
            slot: self.slot.clone(),
            routes: server::router(self.shared.clone(), self.slot.clone()),
        }
    }

    /// Passes a whole message on: to the request it answers, else to a
    /// persistent notification.
    async fn pass_on(
        &self,
        chat: &str,
        reply_to: Option<&str>,
        text: &str,
    ) -> Result<SentMessage, SendError> {
        if self.shared.waiting.answer(chat, reply_to, text) {
            return Ok(SentMessage::default());
        }
        let Some(api) = &self.shared.api else {
            tracing::warn!(%chat, "an answer nobody waits for is dropped: HASS_URL and HASS_TOKEN are not set");
            return Err(SendError::Rejected(
                "no request waits for this answer, and without HASS_URL and HASS_TOKEN it \
                 cannot become a notification"
                    .to_owned(),
            ));
        };
        let id = notification_id(chat, reply_to, text);
        let body = json!({
            "title": NOTIFICATION_TITLE,
            "message": text,
            "notification_id": id,
        });
        api.post("services/persistent_notification/create", &body)
            .await
            .map_err(|e| e.to_send_error())?;
        tracing::info!(%chat, notification_id = %id, "answer shown as a Home Assistant notification");
        Ok(SentMessage {
            message_id: Some(id),
        })
    }
}

/// The same answer always gets the same id, so a resend replaces the
/// notification instead of adding a second one.
fn notification_id(chat: &str, reply_to: Option<&str>, text: &str) -> String {
    let mut h = Sha256::new();
    for piece in [chat, reply_to.unwrap_or(""), text] {
        h.update(piece.as_bytes());
        h.update([0]);
    }
    let hex: String = h
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("talaria_{hex}")
}

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    // Every request carries the conversation secret: that is the
    // caller's authentication (Home Assistant decides who may talk to
    // its agent), so user allowlists do not apply.
    verifies_senders: true,
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_MESSAGE_CHARS,
        unit: LengthUnit::Chars,
    })
};

#[async_trait]
impl Adapter for HomeAssistantAdapter {
    fn platform(&self) -> &'static str {
        PLATFORM
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    /// `GET /api/` with `HASS_TOKEN`, when one is set: Home Assistant
    /// answers it only to a token it accepts. The conversation token is
    /// Home Assistant's to present, so there is nothing to ask about it.
    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        let api = self.shared.api.as_ref()?;
        Some(match api.get("").await {
            Ok(_) => Ok(format!(
                "a user of the Home Assistant at {} (HASS_TOKEN)",
                api.base()
            )),
            Err(e @ ApiError::Unauthorized(_)) => Err(AdapterError::Fatal(e.to_string())),
            Err(e) => Err(AdapterError::Disconnected(e.to_string())),
        })
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        // Requests still waiting when the gateway stops are answered
        // "pending" at once rather than holding the listener's shutdown.
        *self
            .shared
            .stopping
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(ctx.shutdown.clone());
        self.slot.attach(&ctx).await
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let chat = message.chat_id.as_str();
        let number = talaria_adapter::split::part_number(&message.text);
        match self
            .shared
            .waiting
            .part(chat, message.reply_to.as_deref(), &message.text, number)
        {
            Part::Collected => Ok(SentMessage::default()),
            Part::Whole {
                reply_to,
                text,
                assembled,
            } => {
                let result = self.pass_on(chat, reply_to.as_deref(), &text).await;
                if assembled {
                    match &result {
                        Ok(_) => self.shared.waiting.close(chat),
                        Err(_) => self.shared.waiting.reopen_last(chat),
                    }
                }
                result
            }
        }
    }
}

/// The registry's entry for Home Assistant.
pub const ENTRY: Platform = Platform {
    name: PLATFORM,
    title: "Home Assistant",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<HomeAssistantConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = HomeAssistantSettings::from_config(&setup.section()?, setup.env) else {
        return Ok(None);
    };
    let Some(adapter) = HomeAssistantAdapter::new(&settings).map_err(BuildError::set_up)? else {
        return Ok(None);
    };
    let mount = adapter.mount();
    Ok(Some(Built {
        adapter: Arc::new(adapter),
        mount: Some(mount),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> HomeAssistantConfig {
        let (c, _) =
            talaria_core::Config::parse(yaml, std::path::Path::new("config.yaml")).unwrap();
        c.section().unwrap()
    }

    #[test]
    fn off_without_credentials_and_env_fills_in() {
        let none = Env::from_pairs(Vec::<(String, String)>::new());
        assert!(HomeAssistantSettings::from_config(&config(""), &none).is_none());
        let env = Env::from_pairs([
            ("HASS_URL", "http://ha.local:8123"),
            ("HASS_TOKEN", "long-lived-token"),
        ]);
        let s = HomeAssistantSettings::from_config(&config(""), &env).unwrap();
        assert_eq!(s.url.as_deref(), Some("http://ha.local:8123"));
        assert!(s.conversation_token.is_none());
        assert!(HomeAssistantAdapter::new(&s).unwrap().is_none());
        assert!(!format!("{s:?}").contains("long-lived-token"));

        let c = config(
            "platforms:\n  homeassistant:\n    conversation_token: conv-secret\n    \
             allowed_services: ['light.*', ' ']\n    reply_timeout_secs: 5\n",
        );
        let s = HomeAssistantSettings::from_config(&c, &env).unwrap();
        assert_eq!(s.allowed_services, vec!["light.*".to_owned()]);
        assert_eq!(s.reply_timeout, Duration::from_secs(5));
        assert!(HomeAssistantAdapter::new(&s).unwrap().is_some());

        let off = config("platforms:\n  homeassistant:\n    enabled: false\n");
        assert!(HomeAssistantSettings::from_config(&off, &env).is_none());
    }

    #[test]
    fn bad_settings_refuse_to_start() {
        let mut s = HomeAssistantSettings::new(Some("ftp://x"), Some("t"), Some("c"));
        assert!(matches!(
            HomeAssistantAdapter::new(&s),
            Err(HomeAssistantError::Api(_))
        ));
        s.url = Some("http://ha.local".into());
        s.reply_timeout = Duration::ZERO;
        assert!(matches!(
            HomeAssistantAdapter::new(&s),
            Err(HomeAssistantError::ZeroTimeout)
        ));
    }

    #[test]
    fn notification_ids_are_stable_per_answer() {
        let a = notification_id("c", Some("m"), "hello");
        assert_eq!(a, notification_id("c", Some("m"), "hello"));
        assert_ne!(a, notification_id("c", Some("m"), "hello!"));
        assert!(a.starts_with("talaria_") && a.len() == 24, "{a}");
    }
}
