//! `platforms.wecom`: the WeCom intelligent robot's section of the
//! configuration, its defaults, its checks, and the environment variables
//! (the ancestor's names) that fill or override its keys.

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::{PlatformSection, SectionError};
use talaria_core::effective::{EnvKey, fills, overrides};

/// `platforms.wecom:`, an intelligent robot (智能机器人) in API mode over
/// WeCom's long connection. The robot's id and secret may instead come
/// from `WECOM_BOT_ID` and `WECOM_SECRET`; both set either way enable the
/// platform unless `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WecomBotConfig {
    /// `None` means "enabled when the bot id and the secret are set".
    pub enabled: Option<bool>,
    /// The robot's Bot ID, from its API-mode settings.
    pub bot_id: Option<String>,
    /// The robot's long-connection Secret.
    pub secret: Option<Secret>,
    /// The long connection's address (`wss://`).
    pub websocket_url: String,
    /// Who may write to the robot directly: `open`, `allowlist` (only
    /// `WECOM_ALLOWED_USERS`), `pairing` (strangers are offered a pairing
    /// code by the gateway) or `disabled`.
    pub dm_policy: String,
    /// Which groups the robot answers in: `open`, `allowlist` (the chat
    /// ids in `group_allow_from`), or `pairing`/`disabled` (none).
    pub group_policy: String,
    /// Group chat ids a group `allowlist` admits.
    pub group_allow_from: Vec<String>,
    /// The hosts an image or file may be fetched from (a host or any of
    /// its subdomains). A message names its file's URL itself, so nothing
    /// else is fetched.
    pub media_hosts: Vec<String>,
    /// Said when someone opens a one-to-one chat with the robot for the
    /// first time (WeCom's `enter_chat` event); nothing when unset.
    pub welcome: Option<String>,
    /// Milliseconds between heartbeats (`ping`); two unanswered ones and
    /// the connection is rebuilt.
    pub ping_interval_ms: u64,
    /// Milliseconds a request on the socket waits for WeCom's answer.
    pub request_timeout_ms: u64,
    /// Milliseconds to wait after WeCom refuses a send as too frequent
    /// (errcode 45009), which names no wait of its own.
    pub rate_limit_wait_ms: u64,
}

/// The access policy names the ancestor uses.
pub(super) const POLICIES: &[&str] = &["open", "allowlist", "pairing", "disabled"];

impl Default for WecomBotConfig {
    fn default() -> WecomBotConfig {
        WecomBotConfig {
            enabled: None,
            bot_id: None,
            secret: None,
            websocket_url: "wss://openws.work.weixin.qq.com".to_owned(),
            dm_policy: "pairing".to_owned(),
            group_policy: "pairing".to_owned(),
            group_allow_from: Vec::new(),
            // WeCom does not document where it keeps the robot's files;
            // these are Tencent's own domains and its object storage.
            media_hosts: vec![
                "work.weixin.qq.com".to_owned(),
                "qpic.cn".to_owned(),
                "myqcloud.com".to_owned(),
            ],
            welcome: None,
            ping_interval_ms: 30_000,
            request_timeout_ms: 15_000,
            rate_limit_wait_ms: 2_000,
        }
    }
}

impl PlatformSection for WecomBotConfig {
    const NAME: &'static str = super::PLATFORM;

    fn validate(&self) -> Result<(), SectionError> {
        let url = self.websocket_url.trim();
        if !(url.starts_with("wss://") || url.starts_with("ws://")) {
            return Err(SectionError::new(
                "websocket_url",
                "expected a ws:// or wss:// URL",
            ));
        }
        for (key, value) in [
            ("dm_policy", &self.dm_policy),
            ("group_policy", &self.group_policy),
        ] {
            if !POLICIES.contains(&value.trim().to_ascii_lowercase().as_str()) {
                return Err(SectionError::new(
                    key,
                    "expected open, allowlist, pairing or disabled",
                ));
            }
        }
        if let Some(bad) = self
            .media_hosts
            .iter()
            .find(|h| h.trim().is_empty() || h.contains(['/', ':', '@', ' ']))
        {
            return Err(SectionError::new(
                "media_hosts",
                format!("expected bare host names, found {bad:?}"),
            ));
        }
        if self.ping_interval_ms == 0 || self.request_timeout_ms == 0 {
            return Err(SectionError::new(
                "ping_interval_ms",
                "the ping interval and the request timeout must be above zero",
            ));
        }
        if self.rate_limit_wait_ms > 60_000 {
            return Err(SectionError::new(
                "rate_limit_wait_ms",
                "expected at most 60000 milliseconds",
            ));
        }
        Ok(())
    }
}

/// The keys of `platforms.wecom` that environment variables fill when the
/// file leaves them empty, or override.
pub const ENV: &[EnvKey] = &[
    fills("bot_id", "WECOM_BOT_ID"),
    fills("secret", "WECOM_SECRET"),
    overrides("websocket_url", "WECOM_WEBSOCKET_URL"),
    overrides("dm_policy", "WECOM_DM_POLICY"),
    overrides("group_policy", "WECOM_GROUP_POLICY"),
];
