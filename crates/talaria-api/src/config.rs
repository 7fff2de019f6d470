//! `platforms.api_server`: the API server's section of the configuration.
//! The server is a front end, not a platform, so its section lives here;
//! it stays under `platforms:` in the file, where it has always been.

use serde::{Deserialize, Serialize};
use talaria_core::Secret;
use talaria_core::config::PlatformSection;
use talaria_core::effective::{EnvKey, fills};

/// `platforms.api_server:`, the OpenAI-compatible HTTP endpoint. The key
/// may instead come from `API_SERVER_KEY`, host and port from
/// `API_SERVER_HOST` and `API_SERVER_PORT`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ApiServerConfig {
    /// `None` means "enabled when a key is set".
    pub enabled: Option<bool>,
    /// The address to listen on; else `API_SERVER_HOST`, then loopback.
    pub host: Option<String>,
    /// The port; else `API_SERVER_PORT`, then 8642.
    pub port: Option<u16>,
    /// The bearer key clients send; else `API_SERVER_KEY`.
    pub key: Option<Secret>,
    /// Turns running at once; more get 429. 0 means no cap.
    pub max_concurrent_runs: usize,
    /// Seconds a client may take to send a request head (also the most a
    /// kept-alive connection idles); then the connection is closed.
    pub header_timeout_secs: u64,
    /// Seconds a request waits for its session while another node of a
    /// shared store runs a turn of it; then 429 with `Retry-After`, so a
    /// client is never held indefinitely by a long turn elsewhere.
    pub busy_wait_secs: u64,
    /// Seconds a client may take to send a request body; then the
    /// request fails and the connection is closed.
    pub body_timeout_secs: u64,
}

impl Default for ApiServerConfig {
    fn default() -> ApiServerConfig {
        ApiServerConfig {
            enabled: None,
            host: None,
            port: None,
            key: None,
            max_concurrent_runs: 10,
            header_timeout_secs: 10,
            body_timeout_secs: 30,
            busy_wait_secs: 60,
        }
    }
}

impl PlatformSection for ApiServerConfig {
    const NAME: &'static str = "api_server";
}

/// The keys of `platforms.api_server` that environment variables fill
/// when the file leaves them empty.
pub const ENV: &[EnvKey] = &[
    fills("key", "API_SERVER_KEY"),
    fills("host", "API_SERVER_HOST"),
    fills("port", "API_SERVER_PORT"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use talaria_core::Config;

    #[test]
    fn defaults_and_the_environment_keys() {
        // Moved from core's `webhook_defaults_and_routes`.
        let api = ApiServerConfig::read(&Config::default()).unwrap();
        assert_eq!((api.header_timeout_secs, api.body_timeout_secs), (10, 30));
        assert_eq!(api.max_concurrent_runs, 10);
        let shown = serde_json::to_value(&api).unwrap();
        assert_eq!(talaria_core::effective::missing_env_key(&shown, ENV), None);

        // The key is a `Secret` (was in core's credential walk): shown
        // masked, found by the redaction walk of the file as written.
        let mut config = Config::default();
        config
            .platforms
            .set("api_server.key", "api-key-planted-0123456789");
        let api = ApiServerConfig::read(&config).unwrap();
        let shown = serde_json::to_string(&api).unwrap();
        assert!(!shown.contains("api-key-planted"), "{shown}");
        assert!(!format!("{api:?}").contains("api-key-planted"));
        assert!(
            config
                .secret_values()
                .contains(&"api-key-planted-0123456789".to_owned())
        );
    }
}
