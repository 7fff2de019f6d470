//! `platforms.feishu`: Feishu/Lark's section of the configuration, its
//! defaults, and the environment variables that fill its keys.

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::{PlatformSection, SectionError, is_http_url};
use talaria_core::effective::{EnvKey, fills};

/// `platforms.feishu:`, a Feishu (China) or Lark (international) custom
/// app with the bot capability. The credentials may instead come from
/// `FEISHU_APP_ID` and `FEISHU_APP_SECRET`; setting either enables the
/// platform unless `enabled: false`. Events arrive over the long
/// connection, or on the shared webhook listener at `webhook_path`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FeishuConfig {
    /// `None` means "enabled when the app id or secret is set".
    pub enabled: Option<bool>,
    /// The app's id (`cli_…`).
    pub app_id: Option<String>,
    /// The app's secret.
    pub app_secret: Option<Secret>,
    /// `feishu` (open.feishu.cn) or `lark` (open.larksuite.com).
    pub domain: String,
    /// Overrides the host `domain` selects (a proxy, or a test's fake).
    pub base_url: Option<String>,
    /// `websocket` (the long connection, no public URL needed; the
    /// default) or `webhook` (the event subscription on the shared
    /// listener).
    pub connection_mode: String,
    /// The console's Encrypt Key: bodies are AES-encrypted and signed.
    pub encrypt_key: Option<Secret>,
    /// The console's Verification Token, carried in every event.
    pub verification_token: Option<Secret>,
    /// Where the shared listener takes this app's events.
    pub webhook_path: String,
    /// In group chats, answer only messages that @mention the bot.
    pub require_mention: bool,
    /// The bot's own open id (`ou_…`); asked of `GET /open-apis/bot/v3/info`
    /// when unset.
    pub bot_open_id: Option<String>,
    /// Signed requests older (or newer) than this many seconds are refused.
    pub max_clock_skew_secs: u64,
    /// Larger webhook bodies get 413 without being read further.
    pub max_body_bytes: usize,
    /// Show an answer growing in a card while it streams (patched about
    /// once per `gateway.stream_edit_interval_ms`); otherwise it is sent
    /// whole when done. `FEISHU_STREAMING_CARDS` overrides it.
    pub streaming_cards: bool,
}

impl Default for FeishuConfig {
    fn default() -> FeishuConfig {
        FeishuConfig {
            enabled: None,
            app_id: None,
            app_secret: None,
            domain: "feishu".to_owned(),
            base_url: None,
            connection_mode: "websocket".to_owned(),
            encrypt_key: None,
            verification_token: None,
            webhook_path: "/feishu/webhook".to_owned(),
            require_mention: true,
            bot_open_id: None,
            max_clock_skew_secs: 300,
            max_body_bytes: 1024 * 1024,
            streaming_cards: false,
        }
    }
}

impl PlatformSection for FeishuConfig {
    const NAME: &'static str = super::PLATFORM;

    fn validate(&self) -> Result<(), SectionError> {
        if self.base_url.as_deref().is_some_and(|u| !is_http_url(u)) {
            return Err(SectionError::new(
                "base_url",
                "must be an http(s) URL such as https://open.feishu.cn",
            ));
        }
        if !matches!(self.domain.trim(), "feishu" | "lark") {
            return Err(SectionError::new("domain", "must be feishu or lark"));
        }
        if !self.webhook_path.starts_with('/') {
            return Err(SectionError::new("webhook_path", "must start with /"));
        }
        Ok(())
    }
}

/// The keys of `platforms.feishu` that environment variables fill when the
/// file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("app_id", "FEISHU_APP_ID"),
    fills("app_secret", "FEISHU_APP_SECRET"),
    fills("encrypt_key", "FEISHU_ENCRYPT_KEY"),
    fills("verification_token", "FEISHU_VERIFICATION_TOKEN"),
    fills("bot_open_id", "FEISHU_BOT_OPEN_ID"),
];
