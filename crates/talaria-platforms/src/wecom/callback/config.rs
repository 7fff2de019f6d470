//! `platforms.wecom_callback`: the WeCom self-built app's section of the
//! configuration, its defaults, its checks, and the environment variables
//! (the ancestor's names) that fill its keys.

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::{PlatformSection, SectionError, is_http_url};
use talaria_core::effective::{EnvKey, fills};

/// How answers are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageFormat {
    /// `msgtype: text`: shown everywhere, Markdown as typed.
    #[default]
    Text,
    /// `msgtype: markdown`: rendered, but only in the WeCom client (the
    /// WeChat plug-in shows a notice instead).
    Markdown,
}

/// `platforms.wecom_callback:`, a WeCom self-built application receiving
/// messages on the shared webhook listener. Each credential may instead
/// come from the environment: `WECOM_CALLBACK_CORP_ID`,
/// `WECOM_CALLBACK_CORP_SECRET`, `WECOM_CALLBACK_AGENT_ID`,
/// `WECOM_CALLBACK_TOKEN` and `WECOM_CALLBACK_ENCODING_AES_KEY`. A corp id
/// and a corp secret set either way enable the platform unless
/// `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WecomCallbackConfig {
    /// `None` means "enabled when a corp id and a corp secret are set".
    pub enabled: Option<bool>,
    /// The company's corp id (`ww…`): the receive id inside every
    /// ciphertext.
    pub corp_id: Option<String>,
    /// The application's secret, for the access token.
    pub corp_secret: Option<Secret>,
    /// The application's numeric AgentId.
    pub agent_id: Option<String>,
    /// The callback Token that signs every delivery.
    pub token: Option<Secret>,
    /// The 43-character EncodingAESKey that encrypts every delivery.
    pub encoding_aes_key: Option<Secret>,
    /// The callback's path on the shared listener.
    pub path: String,
    /// The API root; tokens come from `{api_base}/cgi-bin/gettoken`.
    pub api_base: String,
    /// `text` (default) or `markdown`.
    pub message_format: MessageFormat,
    /// How long to wait after WeCom refuses a send as too frequent
    /// (errcode 45009, which names no wait), in seconds.
    pub rate_limit_wait_secs: u64,
    /// How far a delivery's timestamp may be from now before it is
    /// refused as a replay, in seconds.
    pub max_clock_skew_secs: u64,
}

/// Where the callback is served unless `path` says otherwise (the
/// ancestor's default).
pub const DEFAULT_PATH: &str = "/wecom/callback";

impl Default for WecomCallbackConfig {
    fn default() -> WecomCallbackConfig {
        WecomCallbackConfig {
            enabled: None,
            corp_id: None,
            corp_secret: None,
            agent_id: None,
            token: None,
            encoding_aes_key: None,
            path: DEFAULT_PATH.to_owned(),
            api_base: "https://qyapi.weixin.qq.com".to_owned(),
            message_format: MessageFormat::Text,
            rate_limit_wait_secs: 5,
            max_clock_skew_secs: 300,
        }
    }
}

impl PlatformSection for WecomCallbackConfig {
    const NAME: &'static str = super::PLATFORM;

    fn validate(&self) -> Result<(), SectionError> {
        if !is_http_url(&self.api_base) {
            return Err(SectionError::new(
                "api_base",
                "expected an http:// or https:// URL",
            ));
        }
        let path = self.path.trim();
        if !path.starts_with('/') || path.len() < 2 || path.contains(['?', '#', ' ', '*', ':']) {
            return Err(SectionError::new(
                "path",
                "expected a path of its own on the listener, like /wecom/callback",
            ));
        }
        if self.rate_limit_wait_secs > 60 {
            return Err(SectionError::new(
                "rate_limit_wait_secs",
                "expected at most 60 seconds",
            ));
        }
        Ok(())
    }
}

/// The keys of `platforms.wecom_callback` that environment variables fill
/// when the file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("corp_id", "WECOM_CALLBACK_CORP_ID"),
    fills("corp_secret", "WECOM_CALLBACK_CORP_SECRET"),
    fills("agent_id", "WECOM_CALLBACK_AGENT_ID"),
    fills("token", "WECOM_CALLBACK_TOKEN"),
    fills("encoding_aes_key", "WECOM_CALLBACK_ENCODING_AES_KEY"),
];
