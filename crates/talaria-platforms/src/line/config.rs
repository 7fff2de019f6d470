//! `platforms.line`: LINE's section of the configuration, its defaults,
//! its checks, and the environment variables that fill its keys (the
//! names the system this one descends from used).

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::{PlatformSection, SectionError};
use talaria_core::effective::{EnvKey, fills};

/// `platforms.line:`, a LINE Official Account through the Messaging API.
/// The channel access token and channel secret may instead come from
/// `LINE_CHANNEL_ACCESS_TOKEN` and `LINE_CHANNEL_SECRET`; setting either
/// enables the platform unless `enabled: false`, and then both are
/// required. Deliveries arrive on the shared webhook listener
/// (`platforms.webhook.host`/`port`) at `/line/webhook`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LineConfig {
    /// `None` means "enabled when a credential is set".
    pub enabled: Option<bool>,
    /// The channel access token (long-lived, or one issued for a
    /// channel access token v2.1 key).
    pub channel_access_token: Option<Secret>,
    /// The channel secret, which signs every webhook delivery.
    pub channel_secret: Option<Secret>,
    /// Group and room messages are answered only when they mention the
    /// bot; `LINE_REQUIRE_MENTION` overrides.
    pub require_mention: bool,
    /// The Messaging API root (`https://api.line.me`).
    pub api_base: String,
    /// Where message content (photos, voice, files) is fetched from
    /// (`https://api-data.line.me`).
    pub data_base: String,
    /// How long after its event a reply token is still used. LINE keeps
    /// one valid for about a minute; past this the answer is pushed.
    pub reply_token_secs: u64,
    /// Larger webhook bodies get 413 without being read further.
    pub max_body_bytes: usize,
}

impl Default for LineConfig {
    fn default() -> LineConfig {
        LineConfig {
            enabled: None,
            channel_access_token: None,
            channel_secret: None,
            require_mention: true,
            api_base: "https://api.line.me".to_owned(),
            data_base: "https://api-data.line.me".to_owned(),
            reply_token_secs: 50,
            max_body_bytes: 1024 * 1024,
        }
    }
}

impl PlatformSection for LineConfig {
    const NAME: &'static str = super::PLATFORM;

    fn validate(&self) -> Result<(), SectionError> {
        if self.reply_token_secs > 60 {
            return Err(SectionError::new(
                "reply_token_secs",
                "expected at most 60 seconds: LINE refuses older reply tokens",
            ));
        }
        if self.max_body_bytes == 0 {
            return Err(SectionError::new("max_body_bytes", "expected at least 1"));
        }
        Ok(())
    }
}

/// The keys of `platforms.line` that environment variables fill when the
/// file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("channel_access_token", "LINE_CHANNEL_ACCESS_TOKEN"),
    fills("channel_secret", "LINE_CHANNEL_SECRET"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::read_section;

    #[test]
    fn the_line_section_is_read_and_checked() {
        let (s, warnings, _) = read_section::<LineConfig>(
            "platforms:\n  line:\n    require_mention: false\n    api_base: http://127.0.0.1:9\n",
        )
        .unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert!(!s.require_mention);
        assert_eq!(s.api_base, "http://127.0.0.1:9");
        assert_eq!(s.data_base, "https://api-data.line.me");
        assert_eq!(s.reply_token_secs, 50);
        let e = read_section::<LineConfig>("platforms:\n  line:\n    reply_token_secs: 90\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("reply_token_secs"), "{e}");
    }
}
