//! `platforms.signal`: Signal's section of the configuration, its defaults, its
//! checks, and the environment variables that fill its keys.

use serde::{Deserialize, Deserializer, Serialize};
use talaria_core::config::{PlatformSection, SectionError, is_http_url};
use talaria_core::effective::{EnvKey, fills};

/// `platforms.signal:`, a Signal account served by a signal-cli REST API
/// server (`bbernhard/signal-cli-rest-api`). The server root may instead
/// come from `SIGNAL_HTTP_URL` and the account from `SIGNAL_ACCOUNT`; both
/// set either way enable the platform unless `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SignalConfig {
    /// `None` means "enabled when a server and an account are set".
    pub enabled: Option<bool>,
    /// The REST API root, e.g. `http://127.0.0.1:8080`.
    pub http_url: Option<String>,
    /// The bot's number as registered (or linked) on the server, in
    /// international format (`+4915112345678`). YAML reads an unquoted
    /// `+4915112345678` as a number; that is taken back as the number it
    /// was written as.
    #[serde(deserialize_with = "phone_number")]
    pub account: Option<String>,
    /// How messages are received: `websocket` (the server's `json-rpc`
    /// mode) or `poll` (its `normal` and `native` modes). When the server
    /// says which mode it runs in, that wins.
    pub receive_mode: SignalReceiveMode,
    /// Seconds between two receive calls that found nothing (`poll`).
    pub poll_interval_secs: u64,
    /// In groups, answer only messages that mention the bot or quote it.
    pub require_mention: bool,
}

impl Default for SignalConfig {
    fn default() -> SignalConfig {
        SignalConfig {
            enabled: None,
            http_url: None,
            account: None,
            receive_mode: SignalReceiveMode::Websocket,
            poll_interval_secs: 2,
            require_mention: true,
        }
    }
}

/// A phone number written as text or, unquoted in YAML, as an integer
/// (whose `+` the YAML reader dropped).
fn phone_number<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Number {
        Text(String),
        Integer(u64),
    }
    Ok(match Option::<Number>::deserialize(d)? {
        None => None,
        Some(Number::Text(t)) => Some(t),
        Some(Number::Integer(n)) => Some(format!("+{n}")),
    })
}

/// `platforms.signal.receive_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SignalReceiveMode {
    /// `GET /v1/receive/{account}` as a WebSocket.
    Websocket,
    /// `GET /v1/receive/{account}` as plain requests, one after another.
    Poll,
}

impl PlatformSection for SignalConfig {
    const NAME: &'static str = "signal";

    fn validate(&self) -> Result<(), SectionError> {
        if self.http_url.as_deref().is_some_and(|u| !is_http_url(u)) {
            return Err(SectionError::new(
                "http_url",
                "expected an http:// or https:// URL",
            ));
        }
        Ok(())
    }
}

/// The keys of `platforms.signal` that environment variables fill when the
/// file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("http_url", "SIGNAL_HTTP_URL"),
    fills("account", "SIGNAL_ACCOUNT"),
];
