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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::read_section;
    use talaria_core::config::ConfigError;

    fn parse(text: &str) -> Result<SignalConfig, ConfigError> {
        read_section::<SignalConfig>(text).map(|(s, w, _)| {
            assert!(w.is_empty(), "{w:?}");
            s
        })
    }

    #[test]
    fn the_signal_section_is_read_and_checked() {
        // Moved from core's config tests.
        let s = parse(
            "platforms:\n  signal:\n    http_url: http://127.0.0.1:8080\n    account: \"+4915112345678\"\n    receive_mode: poll\n    poll_interval_secs: 5\n    require_mention: false\n",
        )
        .unwrap();
        assert_eq!(s.http_url.as_deref(), Some("http://127.0.0.1:8080"));
        assert_eq!(s.account.as_deref(), Some("+4915112345678"));
        assert_eq!(s.receive_mode, SignalReceiveMode::Poll);
        assert_eq!((s.poll_interval_secs, s.require_mention), (5, false));
        // Unquoted, YAML reads a number; it comes back with its `+`.
        let s = parse("platforms:\n  signal:\n    account: +4915112345678\n").unwrap();
        assert_eq!(s.account.as_deref(), Some("+4915112345678"));
        let s = parse("platforms:\n  signal: {}\n").unwrap();
        assert_eq!(s, SignalConfig::default());
        assert_eq!(s.receive_mode, SignalReceiveMode::Websocket);
        match parse("platforms:\n  signal:\n    http_url: localhost:8080\n") {
            Err(ConfigError::Invalid { key, line, .. }) => {
                assert_eq!(key, "platforms.signal.http_url");
                assert_eq!(line, Some(3));
            }
            other => panic!("{other:?}"),
        }
        assert!(parse("platforms:\n  signal:\n    receive_mode: sse\n").is_err());
    }
}
