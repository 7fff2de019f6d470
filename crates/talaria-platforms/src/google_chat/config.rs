//! `platforms.google_chat`: Google Chat's section of the configuration,
//! its defaults, its checks, and the environment variables that fill its
//! keys (the names the system this one descends from used).

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::{PlatformSection, SectionError};
use talaria_core::effective::{EnvKey, fills};

/// `platforms.google_chat:`, a Google Chat app whose connection is an
/// HTTP endpoint: Google posts each event to the shared webhook listener
/// (`/google_chat/events`), and answers go through the Chat API as the
/// app's service account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GoogleChatConfig {
    /// `None` means "enabled when the service account or audience is set".
    pub enabled: Option<bool>,
    /// The service account's JSON key: the file's path, or its JSON.
    pub service_account_key: Option<Secret>,
    /// The app's authentication audience, as set in the Chat API's
    /// configuration: the project number, or the endpoint URL.
    pub audience: Option<String>,
    /// The e-mail an ID token must carry when the audience is the URL.
    pub service_account_emails: Vec<String>,
    /// Where Google's signing keys are published (JWK sets).
    pub jwks_urls: Vec<String>,
    /// The Chat API root.
    pub api_base: String,
    /// Larger event bodies get 413 without being read further.
    pub max_body_bytes: usize,
}

impl Default for GoogleChatConfig {
    fn default() -> GoogleChatConfig {
        GoogleChatConfig {
            enabled: None,
            service_account_key: None,
            audience: None,
            service_account_emails: vec![super::jwt::CHAT_ISSUER.to_owned()],
            jwks_urls: vec![
                "https://www.googleapis.com/service_accounts/v1/jwk/chat@system.gserviceaccount.com"
                    .to_owned(),
                "https://www.googleapis.com/oauth2/v3/certs".to_owned(),
            ],
            api_base: "https://chat.googleapis.com".to_owned(),
            max_body_bytes: 1024 * 1024,
        }
    }
}

impl PlatformSection for GoogleChatConfig {
    const NAME: &'static str = super::PLATFORM;

    fn validate(&self) -> Result<(), SectionError> {
        if self.jwks_urls.is_empty() {
            return Err(SectionError::new("jwks_urls", "expected at least one URL"));
        }
        if self.max_body_bytes == 0 {
            return Err(SectionError::new("max_body_bytes", "expected at least 1"));
        }
        Ok(())
    }
}

/// The keys of `platforms.google_chat` that environment variables fill
/// when the file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("service_account_key", "GOOGLE_CHAT_SERVICE_ACCOUNT_JSON"),
    fills("audience", "GOOGLE_CHAT_HTTP_EVENTS_AUDIENCE"),
];
