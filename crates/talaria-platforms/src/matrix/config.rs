//! `platforms.matrix`: Matrix's section of the configuration, its defaults, its
//! checks, and the environment variables that fill its keys.

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::{PlatformSection, SectionError, is_http_url};
use talaria_core::effective::{EnvKey, fills};

/// `platforms.matrix:`. The homeserver, access token and user id may
/// instead come from `MATRIX_HOMESERVER`, `MATRIX_ACCESS_TOKEN` and
/// `MATRIX_USER_ID`; a homeserver and a token enable the platform unless
/// `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MatrixConfig {
    /// `None` means "enabled when a homeserver and a token are set".
    pub enabled: Option<bool>,
    /// The homeserver's client-server API root (`https://matrix.example.org`).
    pub homeserver: Option<String>,
    /// The account's access token; else `MATRIX_ACCESS_TOKEN`.
    pub access_token: Option<Secret>,
    /// The bot's own user id (`@talaria:example.org`); asked from the
    /// homeserver (`whoami`) when unset.
    pub user_id: Option<String>,
    /// In rooms with more than two members, answer only messages that
    /// mention the bot (or reply to it, or continue a thread it is in).
    pub require_mention: bool,
    /// Milliseconds a `/sync` long poll waits on the server.
    pub sync_timeout_ms: u64,
}

impl Default for MatrixConfig {
    fn default() -> MatrixConfig {
        MatrixConfig {
            enabled: None,
            homeserver: None,
            access_token: None,
            user_id: None,
            require_mention: true,
            sync_timeout_ms: 30_000,
        }
    }
}

impl PlatformSection for MatrixConfig {
    const NAME: &'static str = super::PLATFORM;

    fn validate(&self) -> Result<(), SectionError> {
        if self.homeserver.as_deref().is_some_and(|u| !is_http_url(u)) {
            return Err(SectionError::new(
                "homeserver",
                "expected an http:// or https:// URL",
            ));
        }
        Ok(())
    }
}

/// The keys of `platforms.matrix` that environment variables fill when the
/// file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("homeserver", "MATRIX_HOMESERVER"),
    fills("access_token", "MATRIX_ACCESS_TOKEN"),
    fills("user_id", "MATRIX_USER_ID"),
];
