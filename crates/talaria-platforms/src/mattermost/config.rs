//! `platforms.mattermost`: Mattermost's section of the configuration, its defaults, its
//! checks, and the environment variables that fill its keys.

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::PlatformSection;
use talaria_core::effective::{EnvKey, fills};

/// `platforms.mattermost:`. The server root may instead come from
/// `MATTERMOST_URL` and the token from `MATTERMOST_TOKEN`; a token set
/// either way enables the platform unless `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MattermostConfig {
    /// `None` means "enabled when a token is set".
    pub enabled: Option<bool>,
    /// The server root, e.g. `https://chat.example.com` (no `/api/v4`).
    pub url: Option<String>,
    /// A bot account's or a personal access token.
    pub token: Option<Secret>,
    /// In channels and group messages, answer only posts that mention the
    /// bot (or continue a thread it answered in).
    pub require_mention: bool,
    /// Seconds between application-level pings on the WebSocket; a socket
    /// silent for two of these is rebuilt.
    pub ping_interval_secs: u64,
}

impl Default for MattermostConfig {
    fn default() -> MattermostConfig {
        MattermostConfig {
            enabled: None,
            url: None,
            token: None,
            require_mention: true,
            ping_interval_secs: 30,
        }
    }
}

impl PlatformSection for MattermostConfig {
    const NAME: &'static str = "mattermost";
}

/// The keys of `platforms.mattermost` that environment variables fill when the
/// file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("token", "MATTERMOST_TOKEN"),
    fills("url", "MATTERMOST_URL"),
];
