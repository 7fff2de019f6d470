//! `platforms.slack`: Slack's section of the configuration, its defaults, its
//! checks, and the environment variables that fill its keys.

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::{PlatformSection, SectionError, is_http_url};
use talaria_core::effective::{EnvKey, fills};

/// `platforms.slack:`. The tokens may instead come from `SLACK_BOT_TOKEN`
/// (`xoxb-...`) and `SLACK_APP_TOKEN` (`xapp-...`, for Socket Mode);
/// setting both either way enables the platform unless `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlackConfig {
    /// `None` means "enabled when both tokens are set".
    pub enabled: Option<bool>,
    /// The bot token (`xoxb-...`), for the Web API.
    pub bot_token: Option<Secret>,
    /// The app-level token (`xapp-...`) with `connections:write`, for
    /// opening Socket Mode connections.
    pub app_token: Option<Secret>,
    /// The Web API root; requests go to `{api_base}/{method}`.
    pub api_base: String,
    /// In channels and group DMs, answer only messages that mention the bot.
    pub require_mention: bool,
    /// The reaction put on a message while its answer is being worked on
    /// (bots cannot show "typing" in Slack); empty for none.
    pub working_reaction: String,
    /// Milliseconds between WebSocket pings on the Socket Mode connection.
    pub ping_interval_ms: u64,
    /// Milliseconds without any answer to a ping after which the connection
    /// counts as dead and is rebuilt.
    pub ping_timeout_ms: u64,
}

impl Default for SlackConfig {
    fn default() -> SlackConfig {
        SlackConfig {
            enabled: None,
            bot_token: None,
            app_token: None,
            api_base: "https://slack.com/api".to_owned(),
            require_mention: true,
            working_reaction: "eyes".to_owned(),
            ping_interval_ms: 10_000,
            ping_timeout_ms: 30_000,
        }
    }
}

impl PlatformSection for SlackConfig {
    const NAME: &'static str = "slack";

    fn validate(&self) -> Result<(), SectionError> {
        if !is_http_url(&self.api_base) {
            return Err(SectionError::new(
                "api_base",
                "expected an http:// or https:// URL",
            ));
        }
        Ok(())
    }
}

/// The keys of `platforms.slack` that environment variables fill when the
/// file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("bot_token", "SLACK_BOT_TOKEN"),
    fills("app_token", "SLACK_APP_TOKEN"),
];
