//! `platforms.telegram`: Telegram's section of the configuration, its defaults, its
//! checks, and the environment variables that fill its keys.

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::{PlatformSection, SectionError, is_http_url};
use talaria_core::effective::{EnvKey, fills};

/// `platforms.telegram:`. The token may instead come from
/// `TELEGRAM_BOT_TOKEN`; setting it either way enables the platform unless
/// `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TelegramConfig {
    /// `None` means "enabled when a token is set".
    pub enabled: Option<bool>,
    /// The bot token from @BotFather; else `TELEGRAM_BOT_TOKEN`.
    pub token: Option<Secret>,
    /// The Bot API root; requests go to `{base_url}/bot{token}/{method}`.
    pub base_url: String,
    /// In groups, answer only messages that mention the bot or reply to it.
    pub require_mention: bool,
    /// Show the answer growing by editing one message while it streams.
    pub streaming_edits: bool,
    /// Seconds a `getUpdates` long poll waits on the server.
    pub poll_timeout_secs: u64,
}

impl Default for TelegramConfig {
    fn default() -> TelegramConfig {
        TelegramConfig {
            enabled: None,
            token: None,
            base_url: "https://api.telegram.org".to_owned(),
            require_mention: false,
            streaming_edits: false,
            poll_timeout_secs: 30,
        }
    }
}

impl PlatformSection for TelegramConfig {
    const NAME: &'static str = "telegram";

    fn validate(&self) -> Result<(), SectionError> {
        if !is_http_url(&self.base_url) {
            return Err(SectionError::new(
                "base_url",
                "expected an http:// or https:// URL",
            ));
        }
        Ok(())
    }
}

/// The keys of `platforms.telegram` that environment variables fill when the
/// file leaves them empty.
pub const ENV: &[EnvKey] = &[fills("token", "TELEGRAM_BOT_TOKEN")];
