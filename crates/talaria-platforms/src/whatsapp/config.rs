//! `platforms.whatsapp_cloud`: WhatsApp Cloud's section of the configuration, its defaults, its
//! checks, and the environment variables that fill its keys.

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::PlatformSection;
use talaria_core::effective::{EnvKey, fills};

/// `platforms.whatsapp_cloud:`, a WhatsApp Business number through Meta's
/// Cloud API. Each secret may instead come from `WHATSAPP_CLOUD_TOKEN`,
/// `WHATSAPP_CLOUD_PHONE_NUMBER_ID`, `WHATSAPP_CLOUD_APP_SECRET` and
/// `WHATSAPP_CLOUD_VERIFY_TOKEN`; setting any of them enables the platform
/// unless `enabled: false`, and then all four are required. Deliveries
/// arrive on the shared webhook listener (`platforms.webhook.host`/`port`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WhatsappCloudConfig {
    /// `None` means "enabled when any of the four credentials is set".
    pub enabled: Option<bool>,
    /// A system user's access token with `whatsapp_business_messaging`.
    pub token: Option<Secret>,
    /// The business phone number's id (not the phone number itself).
    pub phone_number_id: Option<String>,
    /// The Meta app's secret, which signs every webhook delivery.
    pub app_secret: Option<Secret>,
    /// The token Meta echoes in the webhook verification handshake.
    pub verify_token: Option<Secret>,
    /// The Graph API root; sends go to
    /// `{graph_base}/{api_version}/{phone_number_id}/messages`.
    pub graph_base: String,
    /// The Graph API version, e.g. `v21.0`.
    pub api_version: String,
    /// Larger webhook bodies get 413 without being read further.
    pub max_body_bytes: usize,
}

impl Default for WhatsappCloudConfig {
    fn default() -> WhatsappCloudConfig {
        WhatsappCloudConfig {
            enabled: None,
            token: None,
            phone_number_id: None,
            app_secret: None,
            verify_token: None,
            graph_base: "https://graph.facebook.com".to_owned(),
            api_version: "v21.0".to_owned(),
            max_body_bytes: 1024 * 1024,
        }
    }
}

impl PlatformSection for WhatsappCloudConfig {
    const NAME: &'static str = super::PLATFORM;
}

/// The keys of `platforms.whatsapp_cloud` that environment variables fill when the
/// file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("token", "WHATSAPP_CLOUD_TOKEN"),
    fills("phone_number_id", "WHATSAPP_CLOUD_PHONE_NUMBER_ID"),
    fills("app_secret", "WHATSAPP_CLOUD_APP_SECRET"),
    fills("verify_token", "WHATSAPP_CLOUD_VERIFY_TOKEN"),
];
