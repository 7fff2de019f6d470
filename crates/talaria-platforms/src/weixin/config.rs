//! `platforms.weixin`: Weixin's (personal WeChat through iLink) section of
//! the configuration, its defaults, and the environment variables that
//! fill its keys.

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::PlatformSection;
use talaria_core::effective::{EnvKey, fills};

/// `platforms.weixin:`, a personal WeChat account acting as a bot through
/// Tencent's iLink bot API. The bot token and account id come from a QR
/// login (see the platform's docs page); they may instead be set as
/// `WEIXIN_TOKEN` and `WEIXIN_ACCOUNT_ID` (the ancestor's names). Setting
/// either enables the platform unless `enabled: false`; then both are
/// required.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WeixinConfig {
    /// `None` means "enabled when the token or account id is set".
    pub enabled: Option<bool>,
    /// The bot token from the QR login; else `WEIXIN_TOKEN`.
    pub token: Option<Secret>,
    /// The bot's account id (`ilink_bot_id`); else `WEIXIN_ACCOUNT_ID`.
    pub account_id: Option<String>,
    /// The API root the login named; else `WEIXIN_BASE_URL`, else
    /// `https://ilinkai.weixin.qq.com`.
    pub base_url: Option<String>,
    /// The media CDN files are fetched from and uploaded to; else
    /// `WEIXIN_CDN_BASE_URL`, else `https://novac2c.cdn.weixin.qq.com/c2c`.
    /// Files are only ever fetched from here.
    pub cdn_base_url: Option<String>,
    /// How long the server may hold one `getupdates` (it says so itself
    /// after the first answer).
    pub poll_timeout_secs: u64,
    /// The pause between the parts of a long answer; else
    /// `WEIXIN_SEND_CHUNK_DELAY_SECONDS`, else 1.5.
    pub send_chunk_delay_seconds: Option<f64>,
    /// Retries of a part refused as rate-limited; else
    /// `WEIXIN_SEND_CHUNK_RETRIES`, else 4.
    pub send_chunk_retries: Option<u32>,
    /// The first wait before such a retry (doubling each time); else
    /// `WEIXIN_SEND_CHUNK_RETRY_DELAY_SECONDS`, else 1.0.
    pub send_chunk_retry_delay_seconds: Option<f64>,
}

impl Default for WeixinConfig {
    fn default() -> WeixinConfig {
        WeixinConfig {
            enabled: None,
            token: None,
            account_id: None,
            base_url: None,
            cdn_base_url: None,
            poll_timeout_secs: 35,
            send_chunk_delay_seconds: None,
            send_chunk_retries: None,
            send_chunk_retry_delay_seconds: None,
        }
    }
}

impl PlatformSection for WeixinConfig {
    const NAME: &'static str = super::PLATFORM;
}

/// The keys of `platforms.weixin` that environment variables fill when
/// the file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("token", "WEIXIN_TOKEN"),
    fills("account_id", "WEIXIN_ACCOUNT_ID"),
    fills("base_url", "WEIXIN_BASE_URL"),
    fills("cdn_base_url", "WEIXIN_CDN_BASE_URL"),
];
