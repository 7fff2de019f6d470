//! `platforms.bluebubbles`: BlueBubbles' section of the configuration, its
//! defaults, its checks, and the environment variables that fill its keys
//! (the names the system this one descends from used).

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::{PlatformSection, SectionError};
use talaria_core::effective::{EnvKey, fills};

/// `platforms.bluebubbles:`, iMessage through a BlueBubbles server on a
/// Mac. The server's address and password may instead come from
/// `BLUEBUBBLES_SERVER_URL` and `BLUEBUBBLES_PASSWORD`; setting either
/// enables the platform unless `enabled: false`, and then both are
/// required.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BlueBubblesConfig {
    /// `None` means "enabled when the server or password is set".
    pub enabled: Option<bool>,
    /// The server's address (`http://` is assumed without a scheme).
    pub server_url: Option<String>,
    /// The server password; it authenticates every call and every webhook.
    pub password: Option<Secret>,
    /// The URL the server posts new messages to: the shared listener's
    /// `/bluebubbles-webhook`, as the Mac reaches it. Defaults to
    /// `http://127.0.0.1:<listener port>/bluebubbles-webhook` (the gateway
    /// on the same Mac).
    pub webhook_url: Option<String>,
    /// Group chats are answered only when a wake word matches.
    pub require_mention: bool,
    /// The wake words, as case-insensitive regular expressions.
    pub mention_patterns: Vec<String>,
    /// Mark a chat read once its message is being answered (needs the
    /// server's Private API helper).
    pub send_read_receipts: bool,
    /// How often the messages created since the last one handed over are
    /// read back from the server, for any the webhook did not deliver.
    pub catch_up_secs: u64,
    /// Larger webhook bodies get 413 without being read further.
    pub max_body_bytes: usize,
}

impl Default for BlueBubblesConfig {
    fn default() -> BlueBubblesConfig {
        BlueBubblesConfig {
            enabled: None,
            server_url: None,
            password: None,
            webhook_url: None,
            require_mention: false,
            mention_patterns: vec![r"\btalaria\b".to_owned()],
            send_read_receipts: true,
            catch_up_secs: 30,
            max_body_bytes: 1024 * 1024,
        }
    }
}

impl PlatformSection for BlueBubblesConfig {
    const NAME: &'static str = super::PLATFORM;

    fn validate(&self) -> Result<(), SectionError> {
        for p in &self.mention_patterns {
            if let Err(e) = regex::RegexBuilder::new(p).case_insensitive(true).build() {
                return Err(SectionError::new(
                    "mention_patterns",
                    format!("{p:?} is not a regular expression: {e}"),
                ));
            }
        }
        if self.catch_up_secs == 0 {
            return Err(SectionError::new(
                "catch_up_secs",
                "expected at least 1 second",
            ));
        }
        if self.max_body_bytes == 0 {
            return Err(SectionError::new("max_body_bytes", "expected at least 1"));
        }
        Ok(())
    }
}

/// The keys of `platforms.bluebubbles` that environment variables fill
/// when the file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("server_url", "BLUEBUBBLES_SERVER_URL"),
    fills("password", "BLUEBUBBLES_PASSWORD"),
    fills("webhook_url", "BLUEBUBBLES_WEBHOOK_URL"),
];
