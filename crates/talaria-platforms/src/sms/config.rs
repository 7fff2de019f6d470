//! `platforms.sms`: SMS (Twilio)'s section of the configuration, its defaults, its
//! checks, and the environment variables that fill its keys.

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::{PlatformSection, SectionError, is_http_url};
use talaria_core::effective::{EnvKey, fills};

/// `platforms.sms:`, text messages through a Twilio phone number. Each
/// value may instead come from the environment: `TWILIO_ACCOUNT_SID`,
/// `TWILIO_AUTH_TOKEN`, `TWILIO_PHONE_NUMBER` and `SMS_WEBHOOK_URL`. An
/// account SID and an auth token set either way enable the platform unless
/// `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SmsConfig {
    /// `None` means "enabled when an account SID and an auth token are set".
    pub enabled: Option<bool>,
    /// The Twilio account SID (`AC...`).
    pub account_sid: Option<String>,
    /// The account's auth token: it authenticates sends and is the key
    /// Twilio signs webhooks with.
    pub auth_token: Option<Secret>,
    /// The Twilio number answers come from, in E.164 (`+15551234567`).
    pub phone_number: Option<String>,
    /// The public URL Twilio posts incoming messages to (as configured on
    /// the number in Twilio's console); signatures are computed over it.
    pub webhook_url: Option<String>,
    /// The REST API root; sends go to
    /// `{api_base}/2010-04-01/Accounts/{sid}/Messages.json`.
    pub api_base: String,
    /// The most segments one SMS may use; longer ones are shortened to
    /// fit. `None` (or 0) means no cap.
    pub max_segments: Option<u32>,
}

impl Default for SmsConfig {
    fn default() -> SmsConfig {
        SmsConfig {
            enabled: None,
            account_sid: None,
            auth_token: None,
            phone_number: None,
            webhook_url: None,
            api_base: "https://api.twilio.com".to_owned(),
            max_segments: None,
        }
    }
}

impl PlatformSection for SmsConfig {
    const NAME: &'static str = super::PLATFORM;

    fn validate(&self) -> Result<(), SectionError> {
        if !is_http_url(&self.api_base) {
            return Err(SectionError::new(
                "api_base",
                "expected an http:// or https:// URL",
            ));
        }
        Ok(())
    }
}

/// The keys of `platforms.sms` that environment variables fill when the
/// file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("account_sid", "TWILIO_ACCOUNT_SID"),
    fills("auth_token", "TWILIO_AUTH_TOKEN"),
    fills("phone_number", "TWILIO_PHONE_NUMBER"),
    fills("webhook_url", "SMS_WEBHOOK_URL"),
];
