//! The webhook adapter: signed HTTP deliveries from other services (GitHub,
//! GitLab, Svix senders, anything that can sign with HMAC) become agent
//! turns, each in a session of its own, whose answer goes to the route's
//! delivery target.
//!
//! Deliveries arrive at `POST /webhooks/<route>` on the shared webhook
//! listener ([`crate::ingress`]; 8644 by default, loopback unless
//! configured otherwise).
//!
//! # Layout
//!
//! - this file: [`WebhookSettings`] (from `platforms.webhook` and the
//!   environment), the injectable [`Clock`], and [`WebhookAdapter`] (every
//!   route check, the routes to mount, and [`Adapter::run`] attaching the
//!   inbox).
//! - `server`: the router and the delivery handler, in processing order.
//! - `signature`: the four signature schemes, compared in constant time.
//! - `guard`: the per-route rate limit and the replay cache, both bounded.
//! - `template`: prompt rendering from the payload.
//!
//! # Invariants
//!
//! - Nothing a caller sends is parsed, counted or remembered before its
//!   signature is checked: an unauthenticated caller can only get 401, and
//!   cannot spend a route's rate limit or poison the replay cache. The
//!   route lookup, the enabled flag and the body limit come first because
//!   they need no secret and bound the work a signature check costs.
//! - Only deliveries that would be handed over spend the rate limit:
//!   ignored events and duplicates are answered before it is consulted.
//! - Replays are caught on what the signature covers (Svix's id, the
//!   generic scheme's timestamp and body, GitHub's and GitLab's body), so
//!   adding or changing an unsigned id header does not make a captured
//!   delivery new. The event's `message_id` and chat id derive from that
//!   signed material, so the gateway's inbound dedupe in the store catches
//!   a replay after a restart (or on another node) too; the in-memory
//!   replay cache is only the fast path in front of it.
//! - Memory is bounded: bodies are read up to `max_body_bytes` and no
//!   further, the rate limit keeps at most its limit of timestamps per
//!   route, and the replay cache at most [`MAX_REMEMBERED_DELIVERIES`] ids.
//! - A delivery is answered 202 only after the gateway took it as a new
//!   turn; one it had taken before is answered 200 `duplicate` (2xx, so
//!   the sender neither retries nor counts a failure). If the inbox is
//!   closed or stays full, or the rate limit refuses it, the answer is 503
//!   or 429 and the delivery is forgotten again, so the sender's retry is
//!   not called a duplicate.
//! - Every check of the settings is made once, in [`WebhookAdapter::new`]
//!   (which the settings cannot skip, since it builds what is served);
//!   [`WebhookSettings::from_config`] only resolves config and environment.
//! - Secrets are never logged and never part of an error message.

mod config;
mod guard;
mod server;
mod signature;
mod template;

use crate::registry::{BuildError, Built, Platform, Setup};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use talaria_adapter::target::{Target, TargetError};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, MessageLimits, OutboundMessage, SendError, SentMessage,
};
use talaria_adapter::{Capabilities, LengthUnit};
use talaria_core::{Env, Secret};

use crate::ingress::{InboxSlot, Mount};
use template::MAX_PROMPT_CHARS;

pub use signature::TOLERANCE_SECS;

pub use config::{ENV, WebhookConfig, WebhookRouteConfig, WebhookScheme};

/// The platform name in session keys, logs and `gateway status`.
pub const PLATFORM: &str = "webhook";

/// How long this process's replay cache remembers a delivery (the
/// gateway's inbound dedupe in the store keeps it for a week).
pub const REPLAY_TTL_SECS: i64 = 3600;

/// The most deliveries the replay cache remembers at once; the oldest go
/// first.
pub const MAX_REMEMBERED_DELIVERIES: usize = 10_000;

/// The time, in unix seconds. Injected so tests of timestamp windows, the
/// rate limit and the replay cache move time instead of sleeping.
pub trait Clock: Send + Sync + 'static {
    /// Seconds since the unix epoch.
    fn unix_now(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn unix_now(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
    }
}

impl<F: Fn() -> i64 + Send + Sync + 'static> Clock for F {
    fn unix_now(&self) -> i64 {
        self()
    }
}

/// Why the webhook adapter cannot be configured or started.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// A route has no secret, or an empty one.
    #[error(
        "webhook route `{route}` has no secret: set platforms.webhook.routes.{route}.secret \
         (or secret_env naming an environment variable); unsigned deliveries are never accepted"
    )]
    MissingSecret {
        /// The route's name.
        route: String,
    },
    /// `secret_env` names a variable that is not set (or empty).
    #[error("webhook route `{route}`: secret_env names {var}, which is not set")]
    SecretEnvUnset {
        /// The route's name.
        route: String,
        /// The variable's name.
        var: String,
    },
    /// Both `secret` and `secret_env` are set, so which one the sender uses
    /// is unclear.
    #[error("webhook route `{route}` sets both secret and secret_env; keep one")]
    TwoSecrets {
        /// The route's name.
        route: String,
    },
    /// The secret cannot be used by the route's scheme (a `whsec_` secret
    /// that is not base64).
    #[error("webhook route `{route}`: {reason}")]
    BadSecret {
        /// The route's name.
        route: String,
        /// What is wrong, without the secret.
        reason: String,
    },
    /// A route's `deliver` is not a target, or names the webhook platform,
    /// which cannot take messages.
    #[error("webhook route `{route}`: unusable deliver target: {reason}")]
    BadDeliver {
        /// The route's name.
        route: String,
        /// What is wrong with the target.
        reason: String,
    },
    /// A route name is not a strict id.
    #[error("webhook route name `{route}` is not usable in a URL path: {reason}")]
    BadRouteName {
        /// The name as configured.
        route: String,
        /// What the validator said.
        reason: String,
    },
    /// `max_body_bytes` is 0, which would refuse every delivery.
    #[error("platforms.webhook.max_body_bytes must be at least 1")]
    ZeroBodyLimit,
}

/// One route, resolved: its secret read, its defaults applied.
#[derive(Debug, Clone)]
pub struct RouteSettings {
    /// Which signature check applies.
    pub scheme: WebhookScheme,
    /// The shared secret (never logged: its `Debug` is masked).
    pub secret: Secret,
    /// The prompt template; empty gives the default.
    pub prompt: String,
    /// The delivery target the answer goes to (`local`, `telegram:42`, ...).
    pub deliver: String,
    /// Accepted event types; empty accepts every event.
    pub events: Vec<String>,
    /// `false` answers every delivery with 403.
    pub enabled: bool,
}

impl RouteSettings {
    /// A route with `scheme` and `secret`, the default prompt, delivering
    /// to `local`, accepting every event.
    pub fn new(scheme: WebhookScheme, secret: impl Into<String>) -> RouteSettings {
        RouteSettings {
            scheme,
            secret: Secret::new(secret),
            prompt: String::new(),
            deliver: "local".to_owned(),
            events: Vec::new(),
            enabled: true,
        }
    }
}

/// How the webhook adapter runs, resolved from `platforms.webhook` and the
/// environment.
#[derive(Clone)]
pub struct WebhookSettings {
    /// Larger bodies get 413.
    pub max_body_bytes: usize,
    /// Accepted deliveries per route per minute; 0 means no limit.
    pub rate_limit_per_minute: u32,
    /// The routes by name (each a strict id).
    pub routes: BTreeMap<String, RouteSettings>,
    /// The time source for signature windows, the rate limit and the replay
    /// cache.
    pub clock: Arc<dyn Clock>,
}

impl fmt::Debug for WebhookSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookSettings")
            .field("max_body_bytes", &self.max_body_bytes)
            .field("rate_limit_per_minute", &self.rate_limit_per_minute)
            .field("routes", &self.routes)
            .finish_non_exhaustive()
    }
}

impl WebhookSettings {
    /// Settings with the defaults of `platforms.webhook` and these routes
    /// (for tests and embedding; the gateway uses [`Self::from_config`]).
    pub fn new(routes: BTreeMap<String, RouteSettings>) -> WebhookSettings {
        let defaults = WebhookConfig::default();
        WebhookSettings {
            max_body_bytes: defaults.max_body_bytes,
            rate_limit_per_minute: defaults.rate_limit_per_minute,
            routes,
            clock: Arc::new(SystemClock),
        }
    }

    /// Resolves the settings, or `None` when webhooks are off: `enabled:
    /// false`, or no `enabled` and no route configured. The resolved routes
    /// are checked by [`WebhookAdapter::new`], which settings built in code go
    /// through as well.
    ///
    /// # Errors
    /// A route whose secret cannot be found (none, empty, `secret_env`
    /// unset, both forms at once). Every message names the route.
    pub fn from_config(
        config: &WebhookConfig,
        env: &Env,
    ) -> Result<Option<WebhookSettings>, WebhookError> {
        if !config.enabled.unwrap_or(!config.routes.is_empty()) {
            return Ok(None);
        }
        if config.routes.is_empty() {
            tracing::warn!(
                "platforms.webhook is enabled but has no routes; every delivery will get 404"
            );
        }
        let mut routes = BTreeMap::new();
        for (name, route) in &config.routes {
            let settings = RouteSettings {
                scheme: route.scheme,
                secret: resolve_secret(name, route, env)?,
                prompt: route.prompt.clone(),
                deliver: match route.deliver.trim() {
                    "" => "local".to_owned(),
                    target => target.to_owned(),
                },
                events: route
                    .events
                    .iter()
                    .map(|e| e.trim().to_owned())
                    .filter(|e| !e.is_empty())
                    .collect(),
                enabled: route.enabled,
            };
            routes.insert(name.clone(), settings);
        }
        Ok(Some(WebhookSettings {
            max_body_bytes: config.max_body_bytes,
            rate_limit_per_minute: config.rate_limit_per_minute,
            routes,
            clock: Arc::new(SystemClock),
        }))
    }

    /// Replaces the clock (tests move time with it).
    pub fn with_clock(mut self, clock: impl Clock) -> WebhookSettings {
        self.clock = Arc::new(clock);
        self
    }
}

fn resolve_secret(
    name: &str,
    route: &WebhookRouteConfig,
    env: &Env,
) -> Result<Secret, WebhookError> {
    let inline = route
        .secret
        .as_ref()
        .filter(|s| !s.expose().trim().is_empty());
    let var = route
        .secret_env
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty());
    match (inline, var) {
        (Some(_), Some(_)) => Err(WebhookError::TwoSecrets {
            route: name.to_owned(),
        }),
        (Some(secret), None) => Ok(secret.clone()),
        (None, Some(var)) => env
            .get(var)
            .filter(|v| !v.trim().is_empty())
            .map(Secret::new)
            .ok_or_else(|| WebhookError::SecretEnvUnset {
                route: name.to_owned(),
                var: var.to_owned(),
            }),
        (None, None) => Err(WebhookError::MissingSecret {
            route: name.to_owned(),
        }),
    }
}

/// Everything about one route that can be wrong before serving, so a
/// misconfiguration stops the gateway at startup rather than turning into
/// a 401 for every delivery or answers that quietly land elsewhere.
fn check_route(name: &str, route: &RouteSettings) -> Result<signature::Verifier, WebhookError> {
    talaria_core::ids::validate_path_component(name).map_err(|e| WebhookError::BadRouteName {
        route: name.to_owned(),
        reason: e.to_string(),
    })?;
    check_deliver(&route.deliver).map_err(|reason| WebhookError::BadDeliver {
        route: name.to_owned(),
        reason,
    })?;
    if route.secret.expose().trim().is_empty() {
        return Err(WebhookError::MissingSecret {
            route: name.to_owned(),
        });
    }
    signature::Verifier::new(route.scheme, route.secret.expose()).map_err(|reason| {
        WebhookError::BadSecret {
            route: name.to_owned(),
            reason,
        }
    })
}

/// Refuses a `deliver` that the gateway could not use: at delivery time an
/// unusable target only falls back to a local file with a warning, which
/// is easy to miss. The webhook platform takes no messages (its `send`
/// drops them), so a target naming it would lose every answer.
fn check_deliver(deliver: &str) -> Result<(), String> {
    let target: Target = deliver.parse().map_err(|e: TargetError| e.to_string())?;
    if target.platform() == Some(PLATFORM) {
        return Err(format!(
            "`{target}` names the {PLATFORM} platform, which cannot take messages"
        ));
    }
    Ok(())
}

/// The webhook connector (see the module docs).
pub struct WebhookAdapter {
    shared: Arc<server::Shared>,
    /// Where the handlers find the inbox of the current run.
    slot: InboxSlot,
}

impl fmt::Debug for WebhookAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookAdapter")
            .field("routes", &self.shared.route_names())
            .finish_non_exhaustive()
    }
}

impl WebhookAdapter {
    /// Checks the settings and every route, so a bad secret or an unusable
    /// `deliver` stops the gateway at startup. The routes are served once
    /// [`WebhookAdapter::routes`] is mounted on the shared listener.
    ///
    /// # Errors
    /// `max_body_bytes: 0`, or a route that cannot be served (a name that
    /// is not a strict id, an empty or malformed secret, an unusable
    /// `deliver`; every message names the route).
    pub fn new(settings: WebhookSettings) -> Result<WebhookAdapter, WebhookError> {
        if settings.max_body_bytes == 0 {
            return Err(WebhookError::ZeroBodyLimit);
        }
        let mut routes = BTreeMap::new();
        for (name, route) in settings.routes {
            let verifier = check_route(&name, &route)?;
            routes.insert(
                name,
                server::Route {
                    settings: route,
                    verifier,
                },
            );
        }
        let shared = server::Shared::new(
            routes,
            settings.max_body_bytes,
            settings.rate_limit_per_minute,
            settings.clock,
        );
        Ok(WebhookAdapter {
            shared: Arc::new(shared),
            slot: InboxSlot::new(),
        })
    }

    /// `POST /webhooks/<route>`, to mount on the shared listener.
    pub fn mount(&self) -> Mount {
        Mount {
            platform: PLATFORM,
            slot: self.slot.clone(),
            routes: server::router(self.shared.clone(), self.slot.clone()),
        }
    }
}

/// What [`Adapter::send`] logs of a message at most.
const MAX_LOGGED_CHARS: usize = 500;

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    // Each delivery's checked signature is its sender's
    // authentication, so user allowlists do not apply; its answer goes
    // to the route's target, never back to a chat.
    chat: false,
    verifies_senders: true,
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_PROMPT_CHARS,
        unit: LengthUnit::Chars,
    })
};

#[async_trait]
impl Adapter for WebhookAdapter {
    fn platform(&self) -> &'static str {
        PLATFORM
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        self.slot.attach(&ctx).await
    }

    /// A webhook source cannot take a reply: answers go to the route's
    /// `deliver` target. Something that replies here anyway is logged and
    /// dropped, not failed, so it is not retried forever.
    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        tracing::info!(
            chat_id = %message.chat_id,
            text = %template::truncate(&message.text, MAX_LOGGED_CHARS),
            "reply to a webhook delivery (not sent anywhere)"
        );
        Ok(SentMessage::default())
    }
}

/// The registry's entry for the webhook routes.
pub const ENTRY: Platform = Platform {
    name: PLATFORM,
    title: "the webhook routes",
    standalone: false,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<WebhookConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    // Secrets are resolved from config and environment, then `new` checks
    // every route (secret, name, deliver target), so a bad route stops the
    // start here; each check runs once.
    let Some(settings) = WebhookSettings::from_config(&setup.section()?, setup.env)
        .map_err(BuildError::misconfigured)?
    else {
        return Ok(None);
    };
    let adapter = WebhookAdapter::new(settings).map_err(BuildError::set_up)?;
    let mount = adapter.mount();
    Ok(Some(Built {
        adapter: Arc::new(adapter),
        mount: Some(mount),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> WebhookConfig {
        let (c, _) =
            talaria_core::Config::parse(yaml, std::path::Path::new("config.yaml")).unwrap();
        c.section().unwrap()
    }

    fn no_env() -> Env {
        Env::from_pairs(Vec::<(String, String)>::new())
    }

    /// What starting the gateway with this config says: resolving, then
    /// checking every route.
    fn start(yaml: &str) -> Result<(), WebhookError> {
        let settings =
            WebhookSettings::from_config(&config(yaml), &no_env())?.expect("webhooks are on");
        WebhookAdapter::new(settings).map(drop)
    }

    #[test]
    fn off_without_routes_unless_enabled() {
        assert!(
            WebhookSettings::from_config(&WebhookConfig::default(), &no_env())
                .unwrap()
                .is_none()
        );
        let c = config("platforms:\n  webhook:\n    enabled: true\n");
        let s = WebhookSettings::from_config(&c, &no_env())
            .unwrap()
            .unwrap();
        assert!(s.routes.is_empty());
        let c = config(
            "platforms:\n  webhook:\n    enabled: false\n    routes:\n      a: {secret: s, scheme: github}\n",
        );
        assert!(
            WebhookSettings::from_config(&c, &no_env())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn routes_resolve_secrets_and_defaults() {
        let c = config(
            "platforms:\n  webhook:\n    rate_limit_per_minute: 5\n    routes:\n      a: {secret: inline-secret, scheme: github, events: [' push ', '']}\n      b: {secret_env: B_SECRET, scheme: gitlab, deliver: '  '}\n",
        );
        let env = Env::from_pairs([("B_SECRET", "from-env")]);
        let s = WebhookSettings::from_config(&c, &env).unwrap().unwrap();
        assert_eq!(s.rate_limit_per_minute, 5);
        assert_eq!(s.routes["a"].secret.expose(), "inline-secret");
        assert_eq!(s.routes["a"].events, vec!["push".to_owned()]);
        assert_eq!(s.routes["b"].secret.expose(), "from-env");
        assert_eq!(s.routes["b"].deliver, "local");
        assert!(!format!("{s:?}").contains("inline-secret"));
    }

    #[test]
    fn every_secret_problem_names_the_route() {
        let cases = [
            ("{scheme: github}", "MissingSecret"),
            ("{secret: '  ', scheme: github}", "MissingSecret"),
            ("{secret_env: NOPE, scheme: hmac}", "SecretEnvUnset"),
            ("{secret: x, secret_env: B, scheme: hmac}", "TwoSecrets"),
            ("{secret: 'whsec_@@@', scheme: svix}", "BadSecret"),
        ];
        for (route, kind) in cases {
            let yaml = format!("platforms:\n  webhook:\n    routes:\n      my-route: {route}\n");
            let e = start(&yaml).unwrap_err();
            assert!(format!("{e:?}").starts_with(kind), "{route}: {e:?}");
            assert!(e.to_string().contains("my-route"), "{e}");
        }
    }

    #[test]
    fn an_unusable_deliver_target_refuses_to_start() {
        let route = |deliver: &str| {
            format!(
                "platforms:\n  webhook:\n    routes:\n      my-route: {{secret: s, scheme: hmac, \
                 deliver: '{deliver}'}}\n"
            )
        };
        for bad in [
            "telegram:",
            "telegram:1:2:3",
            "local:x",
            "no such",
            "webhook",
            "WEBHOOK:my-route",
        ] {
            let e = start(&route(bad)).unwrap_err();
            assert!(
                matches!(&e, WebhookError::BadDeliver { route, .. } if route == "my-route"),
                "{bad}: {e:?}"
            );
            assert!(e.to_string().contains("my-route"), "{e}");
        }
        for good in [
            "",
            "local",
            "origin",
            "telegram",
            "telegram:42",
            "Telegram:-100:7",
        ] {
            start(&route(good)).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        // Settings built in code are checked the same way.
        let mut routes = BTreeMap::new();
        routes.insert(
            "r".to_owned(),
            RouteSettings {
                deliver: "webhook:r".to_owned(),
                ..RouteSettings::new(WebhookScheme::Hmac, "k")
            },
        );
        assert!(matches!(
            WebhookAdapter::new(WebhookSettings::new(routes)),
            Err(WebhookError::BadDeliver { .. })
        ));
    }

    #[test]
    fn a_zero_body_limit_refuses_to_start() {
        let e = start("platforms:\n  webhook:\n    enabled: true\n    max_body_bytes: 0\n")
            .unwrap_err();
        assert!(matches!(e, WebhookError::ZeroBodyLimit), "{e:?}");
    }

    #[test]
    fn new_refuses_bad_routes() {
        let mut routes = BTreeMap::new();
        routes.insert(
            "a b".to_owned(),
            RouteSettings::new(WebhookScheme::Hmac, "k"),
        );
        let mut s = WebhookSettings::new(routes);
        assert!(matches!(
            WebhookAdapter::new(s.clone()),
            Err(WebhookError::BadRouteName { .. })
        ));
        s.routes.clear();
        s.routes
            .insert("ok".to_owned(), RouteSettings::new(WebhookScheme::Hmac, ""));
        assert!(matches!(
            WebhookAdapter::new(s.clone()),
            Err(WebhookError::MissingSecret { .. })
        ));
        s.routes.insert(
            "ok".to_owned(),
            RouteSettings::new(WebhookScheme::Hmac, "k"),
        );
        let a = WebhookAdapter::new(s).unwrap();
        assert!(a.verifies_senders());
        assert_eq!(a.platform(), "webhook");
    }
}
