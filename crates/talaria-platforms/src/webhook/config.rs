//! `platforms.webhook`: Webhooks's section of the configuration, its defaults, its
//! checks, and the environment variables that fill its keys.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use talaria_core::Secret;
use talaria_core::config::PlatformSection;
use talaria_core::effective::EnvKey;

/// `platforms.webhook:`, the HTTP endpoint that turns signed deliveries
/// from other services into agent turns (`POST /webhooks/<route>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WebhookConfig {
    /// `None` means "enabled when at least one route is configured".
    pub enabled: Option<bool>,
    /// The interface to listen on. Loopback by default: put a reverse proxy
    /// with TLS in front rather than exposing the port directly.
    pub host: String,
    /// The shared webhook listener's port (8644 by default).
    pub port: u16,
    /// Larger request bodies get 413 without being read further.
    pub max_body_bytes: usize,
    /// Accepted deliveries per route in any 60 s; more get 429. 0 means no
    /// limit.
    pub rate_limit_per_minute: u32,
    /// Seconds a client may take to send a request head to the listener
    /// (also the most a kept-alive connection idles).
    pub header_timeout_secs: u64,
    /// Seconds a client may take to send a request body.
    pub body_timeout_secs: u64,
    /// The routes by name; each is served at `/webhooks/<name>`. Names pass
    /// the strict id validator, since they become part of a URL path and of
    /// session keys.
    #[serde(deserialize_with = "webhook_routes")]
    pub routes: BTreeMap<String, WebhookRouteConfig>,
}

impl Default for WebhookConfig {
    fn default() -> WebhookConfig {
        WebhookConfig {
            enabled: None,
            host: "127.0.0.1".to_owned(),
            port: 8644,
            max_body_bytes: 1024 * 1024,
            rate_limit_per_minute: 30,
            header_timeout_secs: 10,
            body_timeout_secs: 30,
            routes: BTreeMap::new(),
        }
    }
}

/// Which signature check a webhook route applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WebhookScheme {
    /// `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`.
    Github,
    /// `X-Gitlab-Token` equal to the secret.
    Gitlab,
    /// Svix / Standard Webhooks: `svix-id`, `svix-timestamp`,
    /// `svix-signature` (base64 HMAC-SHA256 of `id.timestamp.body`).
    Svix,
    /// `X-Webhook-Timestamp` and `X-Webhook-Signature: sha256=<hex
    /// HMAC-SHA256 of timestamp.body>`.
    Hmac,
}

/// One entry of `platforms.webhook.routes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookRouteConfig {
    /// The shared secret the sender signs with.
    #[serde(default)]
    pub secret: Option<Secret>,
    /// The environment variable holding the secret, instead of `secret`.
    #[serde(default)]
    pub secret_env: Option<String>,
    /// Which signature check applies; there is no default, so a route
    /// cannot end up checked by a scheme its sender does not use.
    pub scheme: WebhookScheme,
    /// The prompt template: `{payload.a.b}`, `{event_type}`, `{route}`,
    /// `{__raw__}`. Empty gives a default that shows the whole payload.
    #[serde(default)]
    pub prompt: String,
    /// Where the answer goes: `local`, `telegram` (its home channel) or
    /// `telegram:<chat_id>`.
    #[serde(default = "default_webhook_deliver")]
    pub deliver: String,
    /// Event types to act on; others are answered `ignored`. Empty means
    /// every event.
    #[serde(default)]
    pub events: Vec<String>,
    /// `false` answers every delivery with 403.
    #[serde(default = "default_true")]
    pub enabled: bool,
}

fn default_webhook_deliver() -> String {
    "local".to_owned()
}

fn default_true() -> bool {
    true
}

/// Reads the route map, refusing names that are not strict ids.
fn webhook_routes<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, WebhookRouteConfig>, D::Error> {
    let routes = BTreeMap::<String, WebhookRouteConfig>::deserialize(d)?;
    for name in routes.keys() {
        if let Err(e) = talaria_core::ids::validate_path_component(name) {
            return Err(serde::de::Error::custom(format!(
                "route name `{name}` is not usable in a URL path ({e}); use letters, digits, \
                 `_`, `-` and `.`"
            )));
        }
    }
    Ok(routes)
}

impl PlatformSection for WebhookConfig {
    const NAME: &'static str = super::PLATFORM;
}

/// The keys of `platforms.webhook` that environment variables fill when the
/// file leaves them empty.
pub const ENV: &[EnvKey] = &[];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::read_section;

    #[test]
    fn webhook_defaults_and_routes() {
        // Moved from core's config tests (the API server's defaults are
        // checked in talaria-api).
        let (wh, w, _) = read_section::<WebhookConfig>("").unwrap();
        assert!(w.is_empty());
        assert_eq!(wh.enabled, None);
        assert_eq!(wh.host, "127.0.0.1");
        assert_eq!(wh.port, 8644);
        assert_eq!(wh.max_body_bytes, 1024 * 1024);
        assert_eq!(wh.rate_limit_per_minute, 30);
        assert_eq!((wh.header_timeout_secs, wh.body_timeout_secs), (10, 30));
        assert!(wh.routes.is_empty());

        let (wh, w, _) = read_section::<WebhookConfig>(
            "platforms:\n  webhook:\n    routes:\n      gh-push:\n        secret: s3cr3t-value-123\n        scheme: github\n        events: [push]\n      alerts:\n        secret_env: ALERTS_SECRET\n        scheme: svix\n        deliver: telegram:42\n        prompt: 'Alert {payload.title}'\n        enabled: false\n        colour: red\n",
        )
        .unwrap();
        assert!(
            w.iter()
                .any(|l| l.contains("platforms.webhook.routes.alerts.colour")),
            "{w:?}"
        );
        let routes = &wh.routes;
        let gh = &routes["gh-push"];
        assert_eq!(gh.scheme, WebhookScheme::Github);
        assert_eq!(gh.deliver, "local");
        assert_eq!(gh.events, vec!["push".to_owned()]);
        assert!(gh.enabled);
        assert_eq!(gh.prompt, "");
        assert!(!format!("{gh:?}").contains("s3cr3t-value-123"));
        let alerts = &routes["alerts"];
        assert_eq!(alerts.scheme, WebhookScheme::Svix);
        assert_eq!(alerts.secret, None);
        assert_eq!(alerts.secret_env.as_deref(), Some("ALERTS_SECRET"));
        assert_eq!(alerts.deliver, "telegram:42");
        assert!(!alerts.enabled);
    }

    #[test]
    fn webhook_routes_need_a_scheme_and_a_strict_name() {
        // Moved from core's config tests.
        let parse = |text: &str| read_section::<WebhookConfig>(text).map(|_| ());
        let e = parse("platforms:\n  webhook:\n    routes:\n      a:\n        secret: x\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("platforms.webhook.routes") && e.contains("scheme"),
            "{e}"
        );
        let e = parse(
            "platforms:\n  webhook:\n    routes:\n      a:\n        secret: x\n        scheme: md5\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("scheme") && e.contains("github"), "{e}");
        for bad in ["'../x'", "'a b'", "'.hidden'", "'a/b'"] {
            let e = parse(&format!(
                "platforms:\n  webhook:\n    routes:\n      {bad}:\n        secret: x\n        scheme: hmac\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(e.contains("route name"), "{bad}: {e}");
        }
    }
}
