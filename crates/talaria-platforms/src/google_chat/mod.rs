//! The Google Chat adapter: a Chat app whose connection is an HTTP
//! endpoint. Google posts each event, signed, to the shared webhook
//! listener (`POST /google_chat/events`, [`crate::ingress`]); answers go
//! through the Chat API as the app's service account.
//!
//! Direct messages are keyed by their space (`spaces/…`); in a space,
//! each thread is a conversation of its own and the answer lands in the
//! thread. Senders are known by their e-mail address, which Google
//! vouches for, so `GOOGLE_CHAT_ALLOWED_USERS` lists addresses.
//!
//! # Layout
//!
//! - this file: [`GoogleChatSettings`], [`GoogleChatAdapter`] and its
//!   [`Adapter`] impl.
//! - `server`: the event handler and what an event becomes.
//! - `jwt`: checking Google's tokens, signing the service account's.
//! - `api`: the access token and the message calls.
//!
//! # Invariants
//!
//! - Nothing in an event is acted on before its bearer token is checked
//!   against Google's keys, issuer, this app's audience and the clock.
//! - Every message is created with a client-assigned id derived from the
//!   message, so the ledger's re-send of one Chat already has is refused
//!   (409) and counted as sent, never shown twice.
//! - The service account's key is never logged nor part of an error.

mod api;
mod config;
mod jwt;
mod server;

use crate::registry::{BuildError, Built, Platform, Setup};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use sha2::{Digest, Sha256};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Capabilities, LengthUnit, Liveness, MessageLimits,
    OutboundMessage, SendError, SenderIds, SentMessage,
};
use talaria_core::config::{secret_or_env, text_or_env};
use talaria_core::{Env, Secret};

use crate::ingress::{InboxSlot, Mount};
use api::{Api, Created};
use jwt::{ServiceAccount, Verifier};

pub use config::{ENV, GoogleChatConfig};
pub use server::EVENTS_PATH;

/// The platform name in session keys, config and allowlists
/// (`GOOGLE_CHAT_ALLOWED_USERS`).
pub const PLATFORM: &str = "google_chat";

/// Answers are split at this many characters (Chat takes 4,096).
pub const MAX_TEXT_CHARS: usize = 4000;

/// What the adapter needs, resolved from `platforms.google_chat` and the
/// environment.
#[derive(Debug, Clone)]
pub struct GoogleChatSettings {
    /// The service account's JSON key (the JSON itself).
    pub service_account_key: Secret,
    /// The app's authentication audience.
    pub audience: String,
    /// The e-mails an ID token may carry.
    pub service_account_emails: Vec<String>,
    /// Where Google's signing keys are published.
    pub jwks_urls: Vec<String>,
    /// The Chat API root.
    pub api_base: String,
    /// Larger events get 413.
    pub max_body_bytes: usize,
    /// How long one call may take.
    pub send_timeout: Duration,
    /// Retries after a 429 before a send reports
    /// [`SendError::RateLimited`].
    pub rate_limit_retries: u32,
}

/// Why the adapter cannot be configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GoogleChatError {
    /// On, but settings are missing; each is named both ways.
    #[error(
        "Google Chat is missing {}; set them in the environment or .env (or under \
         platforms.google_chat in config.yaml), or turn it off with \
         platforms.google_chat.enabled: false",
        .0.join(", ")
    )]
    Missing(Vec<&'static str>),
    /// A setting is there but unusable; the message names it.
    #[error("Google Chat: {0}")]
    Invalid(String),
}

impl GoogleChatSettings {
    /// The settings, or `None` when Google Chat is off. The service
    /// account may be a file's path or its JSON; a path is read here.
    /// `GOOGLE_CHAT_HTTP_EVENTS_SERVICE_ACCOUNT_EMAIL` (comma-separated)
    /// overrides `service_account_emails`.
    ///
    /// # Errors
    /// What is missing, or a key file that cannot be read.
    pub fn from_config(
        config: &GoogleChatConfig,
        env: &Env,
    ) -> Result<Option<GoogleChatSettings>, GoogleChatError> {
        if config.enabled == Some(false) {
            return Ok(None);
        }
        let account = secret_or_env(
            config.service_account_key.as_ref(),
            env,
            "GOOGLE_CHAT_SERVICE_ACCOUNT_JSON",
        );
        let audience = text_or_env(
            config.audience.as_deref(),
            env,
            "GOOGLE_CHAT_HTTP_EVENTS_AUDIENCE",
        );
        if config.enabled.is_none() && account.is_none() && audience.is_none() {
            return Ok(None);
        }
        let (Some(account), Some(audience)) = (account.clone(), audience.clone()) else {
            return Err(GoogleChatError::Missing(
                [
                    (
                        account.is_none(),
                        "GOOGLE_CHAT_SERVICE_ACCOUNT_JSON (platforms.google_chat.service_account_key)",
                    ),
                    (
                        audience.is_none(),
                        "GOOGLE_CHAT_HTTP_EVENTS_AUDIENCE (platforms.google_chat.audience)",
                    ),
                ]
                .into_iter()
                .filter_map(|(missing, name)| missing.then_some(name))
                .collect(),
            ));
        };
        let json = if account.expose().trim_start().starts_with('{') {
            account
        } else {
            let path = account.expose().trim();
            std::fs::read_to_string(path)
                .map(Secret::new)
                .map_err(|e| {
                    GoogleChatError::Invalid(format!(
                        "cannot read the service account key file {path}: {e}"
                    ))
                })?
        };
        let emails = match env.get("GOOGLE_CHAT_HTTP_EVENTS_SERVICE_ACCOUNT_EMAIL") {
            Some(list) if !list.trim().is_empty() => list
                .split(',')
                .map(|e| e.trim().to_owned())
                .filter(|e| !e.is_empty())
                .collect(),
            _ => config.service_account_emails.clone(),
        };
        Ok(Some(GoogleChatSettings {
            service_account_key: json,
            audience,
            service_account_emails: emails,
            jwks_urls: config.jwks_urls.clone(),
            api_base: config.api_base.trim().trim_end_matches('/').to_owned(),
            max_body_bytes: config.max_body_bytes,
            send_timeout: Duration::from_secs(30),
            rate_limit_retries: 2,
        }))
    }
}

/// The Google Chat connector (see the module docs).
#[derive(Debug)]
pub struct GoogleChatAdapter {
    api: Api,
    hook: Arc<server::Hook>,
    send_timeout: Duration,
    rate_limit_retries: u32,
}

impl std::fmt::Debug for server::Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hook").finish_non_exhaustive()
    }
}

impl GoogleChatAdapter {
    /// Reads the key and builds the clients; contacts nobody.
    ///
    /// # Errors
    /// An unusable key or URL, named.
    pub fn new(settings: GoogleChatSettings) -> Result<GoogleChatAdapter, GoogleChatError> {
        let account = ServiceAccount::from_json(settings.service_account_key.expose())
            .map_err(GoogleChatError::Invalid)?;
        for url in settings.jwks_urls.iter().chain([&settings.api_base]) {
            match reqwest::Url::parse(url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                _ => {
                    return Err(GoogleChatError::Invalid(format!(
                        "{url:?} is not an http(s) URL"
                    )));
                }
            }
        }
        let http = crate::http::Http::new(api::CHAT).map_err(GoogleChatError::Invalid)?;
        let verifier = Verifier::new(
            http,
            settings.jwks_urls.clone(),
            settings.audience.trim().to_owned(),
            settings.service_account_emails.clone(),
        );
        let api = Api::new(settings.api_base.clone(), Arc::new(account))
            .map_err(GoogleChatError::Invalid)?;
        Ok(GoogleChatAdapter {
            api,
            hook: Arc::new(server::Hook {
                verifier,
                max_body_bytes: settings.max_body_bytes.max(1),
                slot: InboxSlot::new(),
            }),
            send_timeout: settings.send_timeout,
            rate_limit_retries: settings.rate_limit_retries,
        })
    }

    /// `POST /google_chat/events`, to mount on the shared listener.
    pub fn mount(&self) -> Mount {
        Mount {
            platform: PLATFORM,
            slot: self.hook.slot.clone(),
            routes: server::router(self.hook.clone()),
        }
    }
}

/// The client-assigned id of a message: the same message to the same
/// place always gets the same one.
fn message_id(message: &OutboundMessage) -> String {
    let mut d = Sha256::new();
    for part in [
        message.chat_id.as_str(),
        message.thread_id.as_deref().unwrap_or(""),
        message.reply_to.as_deref().unwrap_or(""),
        message.text.as_str(),
    ] {
        d.update(part.as_bytes());
        d.update([0]);
    }
    let hex: String = d.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("client-{hex}")
}

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    threads: true,
    sender_ids: SenderIds::Email,
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_TEXT_CHARS,
        unit: LengthUnit::Chars,
    })
};

#[async_trait]
impl Adapter for GoogleChatAdapter {
    fn platform(&self) -> &'static str {
        PLATFORM
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    /// Fetches an access token (a refused key stops here with a clear
    /// error), then takes events until the gateway stops.
    /// The JWT bearer grant with the service account's key, as the
    /// gateway makes it: Google answers 400 `invalid_grant` to an
    /// assertion it does not accept (a deleted key, another account's
    /// key) and 401 to an unknown client, both [`AdapterError::Fatal`].
    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        Some(match self.api.check(self.send_timeout).await {
            Ok(()) => Ok(format!("the service account {}", self.api.account_email())),
            Err(e) if matches!(e.status(), Some(400 | 401 | 403)) => {
                Err(AdapterError::Fatal(format!(
                    "Google refused the Chat app's service account \
                     (GOOGLE_CHAT_SERVICE_ACCOUNT_JSON): {e}"
                )))
            }
            Err(e) => Err(AdapterError::Disconnected(e.to_string())),
        })
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        ctx.liveness.set(Liveness::Connecting);
        let checked = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = self.api.check(self.send_timeout) => r,
        };
        match checked {
            Ok(()) => tracing::info!("Google accepted the Chat app's service account"),
            Err(e) if matches!(e.status(), Some(401 | 403)) => {
                return Err(AdapterError::Fatal(format!(
                    "Google refused the Chat app's service account \
                     (GOOGLE_CHAT_SERVICE_ACCOUNT_JSON): {e}"
                )));
            }
            Err(e) => tracing::warn!("cannot check the Google Chat credentials: {e}"),
        }
        self.hook.slot.attach(&ctx).await
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let space = message.chat_id.trim();
        if !space.starts_with("spaces/") || space.contains(['?', '#']) {
            return Err(SendError::Rejected(format!(
                "`{space}` is not a Google Chat space (spaces/…)"
            )));
        }
        let mut text = crate::plain::to_plain(&message.text);
        if text.trim().is_empty() {
            text = message.text.clone();
        }
        if text.trim().is_empty() {
            return Ok(SentMessage::default());
        }
        let mut body = json!({ "text": text });
        if let Some(thread) = message.thread_id.as_deref() {
            body["thread"] = json!({ "name": thread });
        }
        let id = message_id(message);
        let mut retries = 0;
        loop {
            match self
                .api
                .create_message(space, &id, &body, self.send_timeout)
                .await
            {
                Ok(Created::New(name)) => return Ok(SentMessage { message_id: name }),
                Ok(Created::Existing) => {
                    tracing::debug!(
                        "Chat had this message already (409 for its id): not sent twice"
                    );
                    return Ok(SentMessage::default());
                }
                Err(e) if e.status() == Some(429) && retries < self.rate_limit_retries => {
                    let wait = e.retry_after().unwrap_or(Duration::from_secs(1));
                    if wait > Duration::from_secs(60) {
                        return Err(api::classify(&e));
                    }
                    retries += 1;
                    tracing::info!(?wait, "Google Chat rate limit; waiting");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err(api::classify(&e)),
            }
        }
    }
}

/// The registry's entry for Google Chat.
pub const ENTRY: Platform = Platform {
    name: PLATFORM,
    title: "Google Chat",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<GoogleChatConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = GoogleChatSettings::from_config(&setup.section()?, setup.env)
        .map_err(BuildError::misconfigured)?
    else {
        return Ok(None);
    };
    let adapter = GoogleChatAdapter::new(settings).map_err(BuildError::set_up)?;
    let mount = adapter.mount();
    Ok(Some(Built {
        adapter: Arc::new(adapter),
        mount: Some(mount),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_unless_set_then_both_needed() {
        let cfg = GoogleChatConfig::default();
        let none = Env::from_pairs(Vec::<(String, String)>::new());
        assert!(
            GoogleChatSettings::from_config(&cfg, &none)
                .unwrap()
                .is_none()
        );
        let env = Env::from_pairs([("GOOGLE_CHAT_HTTP_EVENTS_AUDIENCE", "1234")]);
        let e = GoogleChatSettings::from_config(&cfg, &env).unwrap_err();
        assert!(
            e.to_string().contains("GOOGLE_CHAT_SERVICE_ACCOUNT_JSON"),
            "{e}"
        );
        let env = Env::from_pairs([
            ("GOOGLE_CHAT_HTTP_EVENTS_AUDIENCE", "1234"),
            ("GOOGLE_CHAT_SERVICE_ACCOUNT_JSON", "/nonexistent/key.json"),
        ]);
        let e = GoogleChatSettings::from_config(&cfg, &env).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/key.json"), "{e}");
    }

    #[test]
    fn message_ids_fit_chats_rules_and_are_stable() {
        let m = OutboundMessage {
            chat_id: "spaces/A".into(),
            thread_id: Some("spaces/A/threads/T".into()),
            reply_to: None,
            text: "hi".into(),
            choices: Vec::new(),
        };
        let id = message_id(&m);
        assert_eq!(id, message_id(&m.clone()));
        assert!(id.len() <= 63 && id.starts_with("client-"));
        assert!(
            id.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
    }
}
