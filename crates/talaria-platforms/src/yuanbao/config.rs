//! `platforms.yuanbao`: Yuanbao's section of the configuration, its
//! defaults, its checks, and the environment variables that fill its keys.

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::{PlatformSection, SectionError, is_http_url};
use talaria_core::effective::{EnvKey, fills, overrides};

/// `platforms.yuanbao:`. The app key and secret may instead come from
/// `YUANBAO_APP_ID` (or `YUANBAO_APP_KEY`) and `YUANBAO_APP_SECRET`;
/// setting both either way enables the platform unless `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct YuanbaoConfig {
    /// `None` means "enabled when the app key and secret are set".
    pub enabled: Option<bool>,
    /// The bot's app key, from the Yuanbao bot console.
    pub app_key: Option<Secret>,
    /// The bot's app secret: it signs the token requests.
    pub app_secret: Option<Secret>,
    /// The bot's account id; by default the one sign-token returns.
    pub bot_id: Option<String>,
    /// The socket's address (`wss://`; `https://` is read as `wss://`).
    pub ws_url: String,
    /// The REST root that sign-token is under.
    pub api_domain: String,
    /// A route environment (Tencent's test deployments), sent as
    /// `X-Route-Env` and in the auth-bind.
    pub route_env: Option<String>,
    /// Who may write to the bot directly: `open`, `allowlist`, `pairing`
    /// (strangers get a pairing code) or `disabled`.
    pub dm_policy: String,
    /// Accounts a DM `allowlist` admits.
    pub dm_allow_from: Vec<String>,
    /// Which groups the bot answers in: `open`, `allowlist` (group codes in
    /// `group_allow_from`), or `pairing`/`disabled` (none).
    pub group_policy: String,
    /// Group codes a group `allowlist` admits.
    pub group_allow_from: Vec<String>,
    /// Milliseconds between pings on the socket.
    pub ping_interval_ms: u64,
    /// Milliseconds a ping waits for its pong; two missed pongs and the
    /// socket is rebuilt.
    pub pong_timeout_ms: u64,
    /// Milliseconds a send waits for the platform's answer.
    pub request_timeout_ms: u64,
    /// Where uploads go: Tencent COS's address for the bucket
    /// `genUploadInfo` names, `{bucket}` and `{region}` filled in.
    pub cos_endpoint: String,
    /// Hosts (and their subdomains) files are fetched from over https,
    /// besides the API domain itself: where Yuanbao serves what users send.
    pub media_hosts: Vec<String>,
}

impl Default for YuanbaoConfig {
    fn default() -> YuanbaoConfig {
        YuanbaoConfig {
            enabled: None,
            app_key: None,
            app_secret: None,
            bot_id: None,
            ws_url: "wss://bot-wss.yuanbao.tencent.com/wss/connection".to_owned(),
            api_domain: "https://bot.yuanbao.tencent.com".to_owned(),
            route_env: None,
            dm_policy: "pairing".to_owned(),
            dm_allow_from: Vec::new(),
            group_policy: "pairing".to_owned(),
            group_allow_from: Vec::new(),
            ping_interval_ms: 30_000,
            pong_timeout_ms: 10_000,
            request_timeout_ms: 30_000,
            cos_endpoint: "https://{bucket}.cos.accelerate.myqcloud.com".to_owned(),
            media_hosts: vec![
                "myqcloud.com".to_owned(),
                "yuanbao.tencent.com".to_owned(),
                "hunyuan.tencent.com".to_owned(),
            ],
        }
    }
}

/// The access policy names the ancestor uses.
pub(super) const POLICIES: &[&str] = &["open", "allowlist", "pairing", "disabled"];

impl PlatformSection for YuanbaoConfig {
    const NAME: &'static str = "yuanbao";

    fn validate(&self) -> Result<(), SectionError> {
        if !is_http_url(&self.api_domain) {
            return Err(SectionError::new(
                "api_domain",
                "expected an http:// or https:// URL",
            ));
        }
        let ws = &self.ws_url;
        if !(ws.starts_with("ws://") || ws.starts_with("wss://") || is_http_url(ws)) {
            return Err(SectionError::new(
                "ws_url",
                "expected a ws:// or wss:// URL",
            ));
        }
        let cos = self
            .cos_endpoint
            .replace("{bucket}", "bucket")
            .replace("{region}", "region");
        if !is_http_url(&cos) {
            return Err(SectionError::new(
                "cos_endpoint",
                "expected an http:// or https:// URL ({bucket} and {region} are filled in)",
            ));
        }
        if let Some(bad) = self
            .media_hosts
            .iter()
            .find(|h| h.trim().is_empty() || h.contains(['/', ':', ' ', '*']))
        {
            return Err(SectionError::new(
                "media_hosts",
                format!("{bad:?} is not a host name (write example.com; subdomains are included)"),
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
        Ok(())
    }
}

/// The keys of `platforms.yuanbao` that environment variables fill when
/// the file leaves them empty, or override (`YUANBAO_APP_KEY` is read as
/// an alias of `YUANBAO_APP_ID`).
pub const ENV: &[EnvKey] = &[
    fills("app_key", "YUANBAO_APP_ID"),
    fills("app_secret", "YUANBAO_APP_SECRET"),
    fills("bot_id", "YUANBAO_BOT_ID"),
    overrides("ws_url", "YUANBAO_WS_URL"),
    overrides("api_domain", "YUANBAO_API_DOMAIN"),
    fills("route_env", "YUANBAO_ROUTE_ENV"),
    overrides("dm_policy", "YUANBAO_DM_POLICY"),
    overrides("dm_allow_from", "YUANBAO_DM_ALLOW_FROM"),
    overrides("group_policy", "YUANBAO_GROUP_POLICY"),
    overrides("group_allow_from", "YUANBAO_GROUP_ALLOW_FROM"),
];
