//! `platforms.discord`: Discord's section of the configuration, its defaults, its
//! checks, and the environment variables that fill its keys.

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::PlatformSection;
use talaria_core::effective::{EnvKey, fills};

/// `platforms.discord:`. The token may instead come from
/// `DISCORD_BOT_TOKEN`; setting it either way enables the platform unless
/// `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DiscordConfig {
    /// `None` means "enabled when a token is set".
    pub enabled: Option<bool>,
    /// The bot token; else `DISCORD_BOT_TOKEN`.
    pub token: Option<Secret>,
    /// The REST API root (`{api_base}/channels/{id}/messages`, ...).
    pub api_base: String,
    /// The gateway WebSocket URL; `None` asks `{api_base}/gateway/bot`.
    pub gateway_url: Option<String>,
    /// In guild channels, answer only messages that mention the bot.
    pub require_mention: bool,
}

impl Default for DiscordConfig {
    fn default() -> DiscordConfig {
        DiscordConfig {
            enabled: None,
            token: None,
            api_base: "https://discord.com/api/v10".to_owned(),
            gateway_url: None,
            require_mention: true,
        }
    }
}

impl PlatformSection for DiscordConfig {
    const NAME: &'static str = "discord";
}

/// The keys of `platforms.discord` that environment variables fill when the
/// file leaves them empty.
pub const ENV: &[EnvKey] = &[fills("token", "DISCORD_BOT_TOKEN")];
