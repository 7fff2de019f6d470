//! `platforms.dingtalk`: DingTalk's section of the configuration, its
//! defaults, its checks, and the environment variables that fill its keys.

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::{PlatformSection, SectionError, is_http_url};
use talaria_core::effective::{EnvKey, fills};

/// `platforms.dingtalk:`. The app's credentials may instead come from
/// `DINGTALK_CLIENT_ID` and `DINGTALK_CLIENT_SECRET`; both set either way
/// enable the platform unless `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DingTalkConfig {
    /// `None` means "enabled when the client id and secret are set".
    pub enabled: Option<bool>,
    /// The enterprise internal app's Client ID (formerly AppKey).
    pub client_id: Option<String>,
    /// The app's Client Secret (formerly AppSecret).
    pub client_secret: Option<Secret>,
    /// The robot's code for the robot send API; the client id when empty,
    /// which is what an internal app's robot uses.
    pub robot_code: Option<String>,
    /// The OpenAPI root (`/v1.0/...` is appended): Stream mode's
    /// connection endpoint, the access token, the robot send API, AI cards.
    pub api_base: String,
    /// The old OpenAPI root that files are uploaded to
    /// (`{media_base}/media/upload`): the media upload has no `/v1.0`
    /// version and lives on the `oapi` host.
    pub media_base: String,
    /// The AI card template whose `content` variable answers stream into
    /// (`DINGTALK_CARD_TEMPLATE_ID`); empty: answers are plain messages.
    pub card_template_id: Option<String>,
    /// The only URL prefixes a session webhook may start with. A session
    /// webhook arrives inside each message and is posted to as it is, so
    /// anything else is refused rather than fetched.
    pub webhook_hosts: Vec<String>,
    /// In group chats, answer only messages that @mention the robot.
    pub require_mention: bool,
    /// Send answers as DingTalk markdown (`false`: plain text).
    pub markdown: bool,
    /// The title of markdown messages (shown in notifications).
    pub markdown_title: String,
    /// Milliseconds to wait after DingTalk answers "sending too fast"
    /// (errcode 130101), which names no wait of its own.
    pub rate_limit_wait_ms: u64,
    /// Milliseconds between WebSocket pings on the stream; a stream silent
    /// for two of these is rebuilt.
    pub ping_interval_ms: u64,
    /// A custom robot's webhook (`https://oapi.dingtalk.com/robot/send?
    /// access_token=...`), for sends to the target `dingtalk:webhook`.
    pub webhook_url: Option<Secret>,
    /// The custom robot's signing secret (`SEC...`), when its security
    /// setting is "signature".
    pub webhook_secret: Option<Secret>,
}

impl Default for DingTalkConfig {
    fn default() -> DingTalkConfig {
        DingTalkConfig {
            enabled: None,
            client_id: None,
            client_secret: None,
            robot_code: None,
            api_base: "https://api.dingtalk.com".to_owned(),
            media_base: "https://oapi.dingtalk.com".to_owned(),
            card_template_id: None,
            webhook_hosts: vec![
                "https://api.dingtalk.com/".to_owned(),
                "https://oapi.dingtalk.com/".to_owned(),
            ],
            require_mention: true,
            markdown: true,
            markdown_title: "Talaria".to_owned(),
            rate_limit_wait_ms: 2_000,
            ping_interval_ms: 30_000,
            webhook_url: None,
            webhook_secret: None,
        }
    }
}

impl PlatformSection for DingTalkConfig {
    const NAME: &'static str = "dingtalk";

    fn validate(&self) -> Result<(), SectionError> {
        if !is_http_url(&self.api_base) {
            return Err(SectionError::new(
                "api_base",
                "expected an http:// or https:// URL",
            ));
        }
        if !is_http_url(&self.media_base) {
            return Err(SectionError::new(
                "media_base",
                "expected an http:// or https:// URL",
            ));
        }
        if let Some(bad) = self
            .webhook_hosts
            .iter()
            .find(|h| !is_http_url(h) || !h.ends_with('/'))
        {
            return Err(SectionError::new(
                "webhook_hosts",
                format!("expected http(s) URL prefixes ending in `/`, found {bad}"),
            ));
        }
        Ok(())
    }
}

/// The keys of `platforms.dingtalk` that environment variables fill when
/// the file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("client_id", "DINGTALK_CLIENT_ID"),
    fills("client_secret", "DINGTALK_CLIENT_SECRET"),
    fills("webhook_url", "DINGTALK_WEBHOOK_URL"),
    fills("webhook_secret", "DINGTALK_WEBHOOK_SECRET"),
    fills("card_template_id", "DINGTALK_CARD_TEMPLATE_ID"),
];
