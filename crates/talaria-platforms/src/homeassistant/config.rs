//! `platforms.homeassistant`: Home Assistant's section of the configuration, its defaults, its
//! checks, and the environment variables that fill its keys.

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::PlatformSection;
use talaria_core::effective::{EnvKey, fills};

/// `platforms.homeassistant:`. The URL and token may instead come from
/// `HASS_URL` and `HASS_TOKEN` (they enable the `ha_*` tools), and the
/// conversation secret from `HASS_CONVERSATION_TOKEN` (it enables the
/// conversation endpoint); `enabled: false` turns both off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HomeAssistantConfig {
    /// `None` means "on when the credentials are set".
    pub enabled: Option<bool>,
    /// Home Assistant's root URL, e.g. `http://homeassistant.local:8123`.
    pub url: Option<String>,
    /// A long-lived access token (a user's profile page in Home Assistant).
    pub token: Option<Secret>,
    /// The bearer secret Home Assistant sends to
    /// `POST /homeassistant/conversation`.
    pub conversation_token: Option<Secret>,
    /// Services `ha_call_service` may call without asking, as
    /// `domain.service` patterns (`light.*`, `media_player.volume_set`);
    /// empty: every call asks.
    pub allowed_services: Vec<String>,
    /// How long a conversation request waits for the answer before it is
    /// answered "still working" (the answer then becomes a notification).
    pub reply_timeout_secs: u64,
}

impl Default for HomeAssistantConfig {
    fn default() -> HomeAssistantConfig {
        HomeAssistantConfig {
            enabled: None,
            url: None,
            token: None,
            conversation_token: None,
            allowed_services: Vec::new(),
            reply_timeout_secs: 60,
        }
    }
}

impl PlatformSection for HomeAssistantConfig {
    const NAME: &'static str = super::PLATFORM;
}

/// The keys of `platforms.homeassistant` that environment variables fill when the
/// file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("url", "HASS_URL"),
    fills("token", "HASS_TOKEN"),
    fills("conversation_token", "HASS_CONVERSATION_TOKEN"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::read_section;

    #[test]
    fn homeassistant_keys_are_read_and_their_tokens_redacted() {
        // Moved from core's config tests, with the section now read by
        // its own type.
        let (ha, w, c) = read_section::<HomeAssistantConfig>(
            "platforms:\n  homeassistant:\n    url: http://ha.local:8123\n    token: ha-token-0123456789\n    conversation_token: conv-secret-0123456789\n    allowed_services: [light.*]\n    reply_timeout_secs: 30\n",
        )
        .unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(ha.url.as_deref(), Some("http://ha.local:8123"));
        assert_eq!(ha.allowed_services, ["light.*"]);
        assert_eq!(ha.reply_timeout_secs, 30);
        assert_eq!(HomeAssistantConfig::default().reply_timeout_secs, 60);
        let secrets = c.secret_values();
        assert!(secrets.contains(&"ha-token-0123456789".to_owned()));
        assert!(secrets.contains(&"conv-secret-0123456789".to_owned()));
        assert!(!format!("{ha:?}").contains("ha-token-0123456789"));
        assert!(!format!("{c:?}").contains("ha-token-0123456789"));
    }
}
