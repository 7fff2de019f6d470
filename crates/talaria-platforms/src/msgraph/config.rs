//! `platforms.msgraph`: the Microsoft Graph section of the configuration,
//! its defaults, its checks, and the environment variables that fill its
//! keys (the names the system this one descends from used, plus the
//! delegated sender's).

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::{PlatformSection, SectionError};
use talaria_core::effective::{EnvKey, fills};

/// The longest `clientState` Graph takes.
pub const MAX_CLIENT_STATE: usize = 128;

/// `platforms.msgraph:`, Microsoft Graph change notifications for Teams
/// chats and channels and Outlook mail. Notifications arrive on the shared
/// webhook listener (`platforms.webhook.host`/`port`) at
/// `/msgraph/webhook`, lifecycle notifications at `/msgraph/lifecycle`;
/// `public_url` is the origin Graph reaches that listener at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MsGraphConfig {
    /// `None` means "enabled when `MSGRAPH_WEBHOOK_ENABLED` says so, or
    /// when the client state is set".
    pub enabled: Option<bool>,
    /// The secret Graph repeats in every notification
    /// (`MSGRAPH_WEBHOOK_CLIENT_STATE`); required.
    pub client_state: Option<Secret>,
    /// The Entra ID tenant (`MSGRAPH_TENANT_ID`).
    pub tenant_id: Option<String>,
    /// The app registration's client id (`MSGRAPH_CLIENT_ID`).
    pub client_id: Option<String>,
    /// The app registration's client secret (`MSGRAPH_CLIENT_SECRET`).
    pub client_secret: Option<Secret>,
    /// The app token's scope (`MSGRAPH_SCOPE`).
    pub scope: String,
    /// The token authority (`MSGRAPH_AUTHORITY_URL`).
    pub authority_url: String,
    /// The Graph API root.
    pub graph_url: String,
    /// The public origin (`https://bot.example.com`) at which Graph
    /// reaches the shared listener (`MSGRAPH_WEBHOOK_PUBLIC_URL`).
    pub public_url: Option<String>,
    /// What to subscribe to: `/chats/getAllMessages`,
    /// `/teams/getAllMessages`, `/chats/{id}/messages`,
    /// `/teams/{id}/channels/{id}/messages`,
    /// `/users/{id}/mailFolders('Inbox')/messages`.
    pub resources: Vec<String>,
    /// Notifications for other resources are refused; prefixes, a
    /// trailing `*` allowed (`MSGRAPH_WEBHOOK_ACCEPTED_RESOURCES`, comma
    /// separated). Empty accepts all.
    pub accepted_resources: Vec<String>,
    /// How long a subscription is made to last, in minutes (Teams
    /// messages allow at most 4320, Outlook mail about 4230).
    pub subscription_minutes: u64,
    /// A subscription is renewed when it has fewer minutes than this
    /// left.
    pub renew_before_minutes: u64,
    /// Subscriptions are deleted when the gateway stops; off, they are
    /// kept and renewed at the next start.
    pub delete_on_shutdown: bool,
    /// Group chat and channel messages are answered only when they
    /// mention the app or its sending user (`MSGRAPH_REQUIRE_MENTION`).
    pub require_mention: bool,
    /// A delegated refresh token for the user the app posts into chats
    /// and channels as (`MSGRAPH_DELEGATED_REFRESH_TOKEN`).
    pub delegated_refresh_token: Option<Secret>,
    /// Or a delegated access token as is (`MSGRAPH_DELEGATED_ACCESS_TOKEN`),
    /// for tests and short runs: it is not refreshed.
    pub delegated_access_token: Option<Secret>,
    /// The scope asked for with the refresh token.
    pub delegated_scope: String,
    /// Larger notification bodies get 413.
    pub max_body_bytes: usize,
    /// Notification ids and message ids remembered against repeats.
    pub max_seen: usize,
}

impl Default for MsGraphConfig {
    fn default() -> MsGraphConfig {
        MsGraphConfig {
            enabled: None,
            client_state: None,
            tenant_id: None,
            client_id: None,
            client_secret: None,
            scope: "https://graph.microsoft.com/.default".to_owned(),
            authority_url: "https://login.microsoftonline.com".to_owned(),
            graph_url: "https://graph.microsoft.com/v1.0".to_owned(),
            public_url: None,
            resources: Vec::new(),
            accepted_resources: Vec::new(),
            subscription_minutes: 24 * 60,
            renew_before_minutes: 6 * 60,
            delete_on_shutdown: true,
            require_mention: true,
            delegated_refresh_token: None,
            delegated_access_token: None,
            delegated_scope: "https://graph.microsoft.com/ChatMessage.Send \
                              https://graph.microsoft.com/ChannelMessage.Send offline_access"
                .to_owned(),
            max_body_bytes: 1024 * 1024,
            max_seen: 5000,
        }
    }
}

impl PlatformSection for MsGraphConfig {
    const NAME: &'static str = super::PLATFORM;

    fn validate(&self) -> Result<(), SectionError> {
        if self.subscription_minutes < 45 || self.subscription_minutes > 4320 {
            return Err(SectionError::new(
                "subscription_minutes",
                "expected 45 to 4320 minutes: Graph raises shorter ones and refuses longer ones",
            ));
        }
        if self.renew_before_minutes == 0 || self.renew_before_minutes >= self.subscription_minutes
        {
            return Err(SectionError::new(
                "renew_before_minutes",
                "expected at least 1 and less than subscription_minutes",
            ));
        }
        if self.max_body_bytes == 0 {
            return Err(SectionError::new("max_body_bytes", "expected at least 1"));
        }
        if self.max_seen == 0 {
            return Err(SectionError::new("max_seen", "expected at least 1"));
        }
        if self
            .client_state
            .as_ref()
            .is_some_and(|s| s.expose().chars().count() > MAX_CLIENT_STATE)
        {
            return Err(SectionError::new(
                "client_state",
                "expected at most 128 characters, as Graph allows",
            ));
        }
        Ok(())
    }
}

/// The keys of `platforms.msgraph` that environment variables fill when
/// the file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("client_state", "MSGRAPH_WEBHOOK_CLIENT_STATE"),
    fills("tenant_id", "MSGRAPH_TENANT_ID"),
    fills("client_id", "MSGRAPH_CLIENT_ID"),
    fills("client_secret", "MSGRAPH_CLIENT_SECRET"),
    fills("scope", "MSGRAPH_SCOPE"),
    fills("authority_url", "MSGRAPH_AUTHORITY_URL"),
    fills("public_url", "MSGRAPH_WEBHOOK_PUBLIC_URL"),
    fills("accepted_resources", "MSGRAPH_WEBHOOK_ACCEPTED_RESOURCES"),
    fills("delegated_refresh_token", "MSGRAPH_DELEGATED_REFRESH_TOKEN"),
    fills("delegated_access_token", "MSGRAPH_DELEGATED_ACCESS_TOKEN"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::read_section;

    #[test]
    fn the_msgraph_section_is_read_and_checked() {
        let (s, warnings, _) = read_section::<MsGraphConfig>(
            "platforms:\n  msgraph:\n    resources: [\"/chats/getAllMessages\"]\n    \
             graph_url: http://127.0.0.1:9/v1.0\n",
        )
        .unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(s.resources, ["/chats/getAllMessages"]);
        assert_eq!(s.graph_url, "http://127.0.0.1:9/v1.0");
        assert!(s.require_mention && s.delete_on_shutdown);
        let e = read_section::<MsGraphConfig>(
            "platforms:\n  msgraph:\n    subscription_minutes: 9000\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("subscription_minutes"), "{e}");
    }
}
