//! `platforms.qqbot`: QQ Bot's section of the configuration, its defaults,
//! its checks, and the environment variables that fill its keys.

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::PlatformSection;
use talaria_core::effective::{EnvKey, fills};

/// `platforms.qqbot:`, a bot of QQ's open platform (q.qq.com) over the
/// official API v2. The AppID and AppSecret may instead come from
/// `QQ_APP_ID` and `QQ_CLIENT_SECRET` (the names the ancestor reads);
/// setting either enables the platform unless `enabled: false`, and then
/// both are required.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct QqbotConfig {
    /// `None` means "enabled when the AppID or the secret is set".
    pub enabled: Option<bool>,
    /// The bot's AppID; else `QQ_APP_ID`.
    pub app_id: Option<String>,
    /// The bot's AppSecret; else `QQ_CLIENT_SECRET`.
    pub client_secret: Option<Secret>,
    /// The OpenAPI root (`https://sandbox.api.sgroup.qq.com` for the
    /// sandbox): `GET {api_base}/gateway`, `POST {api_base}/v2/...`.
    pub api_base: String,
    /// The host access tokens are fetched from:
    /// `POST {bots_base}/app/getAppAccessToken` with `{appId, clientSecret}`.
    pub bots_base: String,
    /// The gateway WebSocket; `None` asks `GET {api_base}/gateway`.
    pub gateway_url: Option<String>,
    /// Send answers in C2C and groups as Markdown (`msg_type: 2`); the bot
    /// needs QQ's Markdown permission for that. Off: plain text.
    pub markdown_support: bool,
    /// Also subscribe to every message in guild channels
    /// (`GUILD_MESSAGES`, a private-domain bot's intent), not only those
    /// that @-mention the bot; the unaddressed ones are still not answered.
    pub all_guild_messages: bool,
    /// The hosts files users send are fetched from (with the bot's
    /// token), each also covering its subdomains. An attachment anywhere
    /// else is not fetched: its address comes from the chat.
    pub media_hosts: Vec<String>,
}

/// QQ's media hosts [?]: attachments come from `multimedia.nt.qq.com.cn`
/// and the `*.qpic.cn` picture hosts.
pub const DEFAULT_MEDIA_HOSTS: &[&str] = &["multimedia.nt.qq.com.cn", "qpic.cn"];

impl Default for QqbotConfig {
    fn default() -> QqbotConfig {
        QqbotConfig {
            enabled: None,
            app_id: None,
            client_secret: None,
            api_base: "https://api.sgroup.qq.com".to_owned(),
            bots_base: "https://bots.qq.com".to_owned(),
            gateway_url: None,
            markdown_support: true,
            all_guild_messages: false,
            media_hosts: DEFAULT_MEDIA_HOSTS
                .iter()
                .map(|h| (*h).to_owned())
                .collect(),
        }
    }
}

impl PlatformSection for QqbotConfig {
    const NAME: &'static str = super::PLATFORM;
}

/// The keys of `platforms.qqbot` that environment variables fill when the
/// file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("app_id", "QQ_APP_ID"),
    fills("client_secret", "QQ_CLIENT_SECRET"),
];
