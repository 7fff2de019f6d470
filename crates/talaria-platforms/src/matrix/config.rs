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
    /// End-to-end encryption: `off`, `optional` (the default) or
    /// `required`; else `MATRIX_E2EE_MODE` (or the legacy
    /// `MATRIX_ENCRYPTION=true`, which means `required`).
    pub encryption: Option<E2eeMode>,
    /// The device the access token must belong to (`MATRIX_DEVICE_ID`):
    /// a check that the token is the one whose keys this home holds.
    pub device_id: Option<String>,
    /// Which devices get room keys and are read from: `all` (the
    /// default) or `cross-signed` (`MATRIX_DEVICE_TRUST`).
    pub device_trust: Option<DeviceTrust>,
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
            encryption: None,
            device_id: None,
            device_trust: None,
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
    fills("encryption", "MATRIX_E2EE_MODE"),
    fills("device_id", "MATRIX_DEVICE_ID"),
    fills("device_trust", "MATRIX_DEVICE_TRUST"),
];

/// Whether the adapter encrypts: `MATRIX_E2EE_MODE`, as the ancestor has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum E2eeMode {
    /// Encrypted rooms are ignored (with a warning); nothing is uploaded.
    Off,
    /// Encrypted rooms work when the device's keys can be set up; when
    /// they cannot, the adapter goes on with unencrypted rooms only.
    #[default]
    Optional,
    /// The adapter does not connect without working encryption.
    Required,
}

impl E2eeMode {
    /// Reads `off`, `optional` or `required` (any case).
    pub fn parse(text: &str) -> Option<E2eeMode> {
        match text.trim().to_ascii_lowercase().as_str() {
            "off" | "false" | "no" => Some(E2eeMode::Off),
            "optional" => Some(E2eeMode::Optional),
            "required" | "true" | "yes" => Some(E2eeMode::Required),
            _ => None,
        }
    }
}

/// Which devices the bot trusts with room keys and reads messages from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceTrust {
    /// Every device of the room's members, verified or not.
    #[default]
    All,
    /// Only devices their owner's cross-signing identity signed.
    CrossSigned,
}

impl DeviceTrust {
    /// Reads `all` or `cross-signed` (any case).
    pub fn parse(text: &str) -> Option<DeviceTrust> {
        match text.trim().to_ascii_lowercase().as_str() {
            "all" => Some(DeviceTrust::All),
            "cross-signed" | "cross_signed" => Some(DeviceTrust::CrossSigned),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_trust_read_as_documented() {
        assert_eq!(E2eeMode::parse("Required"), Some(E2eeMode::Required));
        assert_eq!(E2eeMode::parse("true"), Some(E2eeMode::Required));
        assert_eq!(E2eeMode::parse(" off "), Some(E2eeMode::Off));
        assert_eq!(E2eeMode::parse("optional"), Some(E2eeMode::Optional));
        assert_eq!(E2eeMode::parse("sometimes"), None);
        assert_eq!(
            DeviceTrust::parse("cross-signed"),
            Some(DeviceTrust::CrossSigned)
        );
        assert_eq!(DeviceTrust::parse("ALL"), Some(DeviceTrust::All));
        assert_eq!(DeviceTrust::parse("verified"), None);
    }

    #[test]
    fn the_section_reads_encryption_settings() {
        let c: MatrixConfig = serde_json::from_value(serde_json::json!({
            "encryption": "required", "device_trust": "cross-signed", "device_id": "ABC"
        }))
        .unwrap();
        assert_eq!(c.encryption, Some(E2eeMode::Required));
        assert_eq!(c.device_trust, Some(DeviceTrust::CrossSigned));
        assert_eq!(c.device_id.as_deref(), Some("ABC"));
        assert!(
            serde_json::from_value::<MatrixConfig>(serde_json::json!({"encryption": "maybe"}))
                .is_err()
        );
    }
}
