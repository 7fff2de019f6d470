//! The router and the delivery handler.
//!
//! `POST /webhooks/<route>` runs these steps in order, each answering on
//! its own when it refuses:
//!
//! 1. unknown route → 404; disabled route → 403
//! 2. body over `max_body_bytes` → 413 (read no further than the limit)
//! 3. signature → 401, the same answer whatever was wrong
//! 4. the route's rate limit → 429 with `Retry-After`
//! 5. the body as JSON → 400
//! 6. event type not in the route's `events` → 200 `ignored`
//! 7. delivery id seen within the hour → 200 `duplicate`
//! 8. render the prompt, hand the event to the inbox → 202 `accepted`
//!    (503 when the gateway is stopping or does not take it in time)
//!
//! The signature comes before the rate limit so that only authentic
//! deliveries spend a route's budget: a stranger hammering a route cannot
//! get the real sender's deliveries refused.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header::{CONTENT_LENGTH, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use talaria_core::config::WebhookScheme;
use talaria_gateway::{ChatType, Inbox, MessageEvent, SessionSource};
use tokio_util::sync::CancellationToken;

use super::guard::{RateLimiter, ReplayCache};
use super::signature::{Verifier, encode_hex};
use super::{Clock, MAX_REMEMBERED_DELIVERIES, PLATFORM, REPLAY_TTL_SECS, RouteSettings};

/// How long a delivery may wait for a saturated inbox before it is answered
/// 503. Senders time out after about ten seconds (GitHub: 10) and retry.
const SUBMIT_TIMEOUT: Duration = Duration::from_secs(8);

/// Headers that carry a delivery id, most specific first.
const DELIVERY_ID_HEADERS: [&str; 6] = [
    "X-GitHub-Delivery",
    "svix-id",
    "webhook-id",
    "X-Gitlab-Event-UUID",
    "X-Request-Id",
    "X-Webhook-Id",
];

/// Longest delivery id used as given; longer ones (or ones with other
/// characters) are replaced by their hash, which is this long.
const MAX_DELIVERY_ID_LEN: usize = 64;

/// Longest event type kept.
const MAX_EVENT_TYPE_LEN: usize = 100;

/// One served route.
pub(crate) struct Route {
    pub(crate) settings: RouteSettings,
    pub(crate) verifier: Verifier,
}

/// What outlives a `run`: the routes and the two guards, so a restart by
/// the supervisor neither resets the rate limit nor forgets delivery ids.
pub(crate) struct Shared {
    routes: BTreeMap<String, Route>,
    max_body_bytes: usize,
    clock: Arc<dyn Clock>,
    limiter: RateLimiter,
    replays: ReplayCache,
}

impl Shared {
    pub(crate) fn new(
        routes: BTreeMap<String, Route>,
        max_body_bytes: usize,
        rate_limit_per_minute: u32,
        clock: Arc<dyn Clock>,
    ) -> Shared {
        Shared {
            routes,
            max_body_bytes,
            clock,
            limiter: RateLimiter::new(rate_limit_per_minute),
            replays: ReplayCache::new(REPLAY_TTL_SECS, MAX_REMEMBERED_DELIVERIES),
        }
    }

    pub(crate) fn route_names(&self) -> Vec<&str> {
        self.routes.keys().map(String::as_str).collect()
    }
}

/// What the handlers of one `run` share.
struct RunState {
    shared: Arc<Shared>,
    inbox: Inbox,
    shutdown: CancellationToken,
}

pub(crate) fn router(shared: Arc<Shared>, inbox: Inbox, shutdown: CancellationToken) -> Router {
    let state = Arc::new(RunState {
        shared,
        inbox,
        shutdown,
    });
    Router::new()
        .route("/health", get(health))
        .route("/webhooks/{route}", post(receive))
        .fallback(not_found)
        .with_state(state)
}

async fn health() -> Response {
    axum::Json(json!({"status": "ok", "platform": PLATFORM})).into_response()
}

async fn not_found() -> Response {
    refuse(StatusCode::NOT_FOUND, "not found")
}

fn refuse(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({"error": message}))).into_response()
}

fn answer(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

async fn receive(
    State(state): State<Arc<RunState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let shared = &state.shared;
    let Some(route) = shared.routes.get(&name) else {
        return refuse(StatusCode::NOT_FOUND, "unknown webhook route");
    };
    if !route.settings.enabled {
        return refuse(StatusCode::FORBIDDEN, "this webhook route is disabled");
    }
    let body = match read_limited(body, &headers, shared.max_body_bytes).await {
        Ok(b) => b,
        Err(BodyError::TooLarge) => {
            tracing::info!(route = %name, limit = shared.max_body_bytes, "webhook body too large");
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("the body is larger than {} bytes", shared.max_body_bytes),
            );
        }
        Err(BodyError::Broken) => {
            return refuse(StatusCode::BAD_REQUEST, "the body could not be read");
        }
    };
    let now = shared.clock.unix_now();
    if let Err(why) = route.verifier.verify(&headers, &body, now) {
        // Info, not warn: anyone can make these, and a misconfigured sender
        // shows up here with its reason.
        tracing::info!(route = %name, reason = %why, "webhook delivery refused");
        return refuse(StatusCode::UNAUTHORIZED, "missing or invalid signature");
    }
    if let Err(wait) = shared.limiter.admit(&name, now) {
        tracing::warn!(route = %name, "webhook rate limit reached");
        let mut response = refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "too many deliveries on this route; retry later",
        );
        if let Ok(v) = HeaderValue::from_str(&wait.to_string()) {
            response.headers_mut().insert(RETRY_AFTER, v);
        }
        return response;
    }
    let payload: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            tracing::info!(route = %name, error = %e, "webhook body is not JSON");
            return refuse(StatusCode::BAD_REQUEST, "the body is not valid JSON");
        }
    };
    let event = event_type(&headers, &payload);
    let events = &route.settings.events;
    if !events.is_empty() && !events.contains(&event) {
        tracing::debug!(route = %name, %event, "webhook event not subscribed; ignored");
        return answer(
            StatusCode::OK,
            json!({"status": "ignored", "route": name, "event": event}),
        );
    }
    let delivery_id = delivery_id(&headers, &body, route.settings.scheme);
    let claims = replay_keys(&name, &delivery_id, &body, route.settings.scheme);
    if !claim_all(&shared.replays, &claims, now) {
        tracing::info!(route = %name, %delivery_id, "webhook delivery already seen");
        return answer(
            StatusCode::OK,
            json!({"status": "duplicate", "route": name, "delivery_id": delivery_id}),
        );
    }
    let text = prompt(&route.settings.prompt, &payload, &event, &name);
    let message = MessageEvent {
        message_id: Some(delivery_id.clone()),
        reply_target: Some(route.settings.deliver.clone()),
        ..MessageEvent::text(source(&name, &delivery_id), text)
    };
    let handed = tokio::select! {
        biased;
        _ = state.shutdown.cancelled() => false,
        r = tokio::time::timeout(SUBMIT_TIMEOUT, state.inbox.submit(message)) => {
            matches!(r, Ok(Ok(())))
        }
    };
    if !handed {
        for key in &claims {
            shared.replays.release(key);
        }
        tracing::warn!(route = %name, %delivery_id, "the gateway did not take a webhook delivery");
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is not taking deliveries right now; retry later",
        );
    }
    tracing::info!(route = %name, %event, %delivery_id, "webhook delivery accepted");
    answer(
        StatusCode::ACCEPTED,
        json!({
            "status": "accepted",
            "route": name,
            "event": event,
            "delivery_id": delivery_id,
        }),
    )
}

enum BodyError {
    TooLarge,
    Broken,
}

/// The whole body, or [`BodyError::TooLarge`] as soon as it is known to be
/// over `limit` (from `Content-Length`, or once that many bytes arrived),
/// so no more than `limit` bytes are ever buffered.
async fn read_limited(body: Body, headers: &HeaderMap, limit: usize) -> Result<Bytes, BodyError> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > u64::try_from(limit).unwrap_or(u64::MAX)) {
        return Err(BodyError::TooLarge);
    }
    let mut stream = body.into_data_stream();
    let mut buf = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| BodyError::Broken)?;
        if buf.len().saturating_add(chunk.len()) > limit {
            return Err(BodyError::TooLarge);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// `X-GitHub-Event`, `X-Gitlab-Event`, the payload's `event_type` or
/// `type`, else `unknown`; printable and short, since it is shown to the
/// model and echoed back.
fn event_type(headers: &HeaderMap, payload: &Value) -> String {
    let from_header = ["X-GitHub-Event", "X-Gitlab-Event"]
        .iter()
        .find_map(|h| headers.get(*h).and_then(|v| v.to_str().ok()));
    let from_payload = || {
        ["event_type", "type"]
            .iter()
            .find_map(|k| payload.get(*k).and_then(Value::as_str))
    };
    let raw = from_header
        .filter(|v| !v.trim().is_empty())
        .or_else(|| from_payload().filter(|v| !v.trim().is_empty()))
        .unwrap_or("unknown");
    let clean: String = raw
        .trim()
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_EVENT_TYPE_LEN)
        .collect();
    if clean.is_empty() {
        "unknown".to_owned()
    } else {
        clean
    }
}

/// The delivery's id: the first id header present, kept as is when it is
/// short and made of `[A-Za-z0-9._-]`, else its SHA-256. Without a header,
/// the SHA-256 of what was signed (for the generic scheme the timestamp is
/// part of it, so the same body sent twice on purpose is not a duplicate).
/// Always safe in a session key.
fn delivery_id(headers: &HeaderMap, body: &[u8], scheme: WebhookScheme) -> String {
    let from_header = DELIVERY_ID_HEADERS.iter().find_map(|h| {
        headers
            .get(*h)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    });
    if let Some(raw) = from_header {
        let clean = raw.len() <= MAX_DELIVERY_ID_LEN
            && !raw.contains("..")
            && raw
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        return if clean {
            raw.to_owned()
        } else {
            encode_hex(&Sha256::digest(raw.as_bytes()))
        };
    }
    let mut hasher = Sha256::new();
    if scheme == WebhookScheme::Hmac
        && let Some(ts) = headers
            .get("X-Webhook-Timestamp")
            .and_then(|v| v.to_str().ok())
    {
        hasher.update(ts.trim().as_bytes());
        hasher.update(b".");
    }
    hasher.update(body);
    encode_hex(&hasher.finalize())
}

/// What a delivery claims in the replay cache. GitHub and GitLab do not
/// sign their delivery id (nor a timestamp), so whoever captured a delivery
/// could resend it under a fresh id; for them the body's digest is claimed
/// too. Svix and the generic scheme sign a timestamp, which bounds replays
/// to the tolerance window, and Svix signs its id.
fn replay_keys(route: &str, delivery_id: &str, body: &[u8], scheme: WebhookScheme) -> Vec<String> {
    let mut keys = vec![format!("{route}:{delivery_id}")];
    if matches!(scheme, WebhookScheme::Github | WebhookScheme::Gitlab) {
        let digest = encode_hex(&Sha256::digest(body));
        if digest != delivery_id {
            keys.push(format!("{route}:body:{digest}"));
        }
    }
    keys
}

/// Claims every key, or none: when one was already seen, the ones just
/// claimed are released again.
fn claim_all(cache: &ReplayCache, keys: &[String], now: i64) -> bool {
    for (i, key) in keys.iter().enumerate() {
        if !cache.claim(key, now) {
            for done in &keys[..i] {
                cache.release(done);
            }
            return false;
        }
    }
    true
}

/// The rendered prompt, never a slash command: a payload field (a commit
/// message, an issue title) written by someone other than the sender must
/// not be able to run `/stop` or `/approve` in the gateway.
fn prompt(template: &str, payload: &Value, event: &str, route: &str) -> String {
    let text = super::template::render(template, payload, event, route);
    if talaria_core::commands::Invocation::parse(&text).is_some() {
        super::template::truncate(
            &format!("Webhook event {event} on route {route}:\n{text}"),
            super::template::MAX_PROMPT_CHARS,
        )
    } else {
        text
    }
}

/// One session per delivery, named after the route.
fn source(route: &str, delivery_id: &str) -> SessionSource {
    SessionSource {
        platform: PLATFORM.to_owned(),
        chat_id: format!("{route}:{delivery_id}"),
        chat_name: Some(route.to_owned()),
        chat_type: ChatType::Dm,
        user_id: Some(format!("webhook:{route}")),
        user_name: Some(format!("webhook {route}")),
        thread_id: None,
        is_bot: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use talaria_gateway::{KeyPolicy, SessionKey};

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn event_type_precedence() {
        let p = json!({"event_type": "from_payload", "type": "from_type"});
        assert_eq!(
            event_type(&headers(&[("X-GitHub-Event", "push")]), &p),
            "push"
        );
        assert_eq!(
            event_type(&headers(&[("X-Gitlab-Event", "Push Hook")]), &p),
            "Push Hook"
        );
        assert_eq!(event_type(&HeaderMap::new(), &p), "from_payload");
        assert_eq!(event_type(&HeaderMap::new(), &json!({"type": "t"})), "t");
        assert_eq!(
            event_type(&HeaderMap::new(), &json!({"type": 5})),
            "unknown"
        );
        assert_eq!(event_type(&HeaderMap::new(), &json!([1])), "unknown");
        let long = "e".repeat(500);
        assert_eq!(
            event_type(&HeaderMap::new(), &json!({"type": long}))
                .chars()
                .count(),
            MAX_EVENT_TYPE_LEN
        );
    }

    #[test]
    fn delivery_ids_are_safe_in_session_keys() {
        let h = headers(&[("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")]);
        assert_eq!(
            delivery_id(&h, b"{}", WebhookScheme::Github),
            "72d3162e-cc78-11e3-81ab-4c9367dc0958"
        );
        let h = headers(&[("svix-id", "msg_2Lh9"), ("X-Request-Id", "other")]);
        assert_eq!(delivery_id(&h, b"{}", WebhookScheme::Svix), "msg_2Lh9");
        for raw in ["../../etc", "a:b", "a/b", "x y", &"z".repeat(65)] {
            let id = delivery_id(&headers(&[("X-Webhook-Id", raw)]), b"", WebhookScheme::Hmac);
            assert_eq!(id.len(), 64, "{raw}");
            assert!(id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        }
        let body = delivery_id(&HeaderMap::new(), b"{}", WebhookScheme::Github);
        assert_eq!(body, encode_hex(&Sha256::digest(b"{}")));
        // The generic scheme's timestamp tells two identical bodies apart.
        let at = |ts| {
            delivery_id(
                &headers(&[("X-Webhook-Timestamp", ts)]),
                b"{}",
                WebhookScheme::Hmac,
            )
        };
        assert_ne!(at("1"), at("2"));
        for id in ["72d3162e-cc78", "msg_1", &body, "a.b"] {
            let s = source("gh-push", id);
            SessionKey::for_source(&s, KeyPolicy::default()).unwrap();
        }
    }

    #[test]
    fn replay_keys_cover_unsigned_ids() {
        assert_eq!(replay_keys("r", "id", b"{}", WebhookScheme::Svix).len(), 1);
        assert_eq!(replay_keys("r", "id", b"{}", WebhookScheme::Hmac).len(), 1);
        assert_eq!(
            replay_keys("r", "id", b"{}", WebhookScheme::Github).len(),
            2
        );
        let digest = encode_hex(&Sha256::digest(b"{}"));
        assert_eq!(
            replay_keys("r", &digest, b"{}", WebhookScheme::Gitlab),
            vec![format!("r:{digest}")]
        );
        let cache = ReplayCache::new(3600, 100);
        let first = replay_keys("r", "a", b"{}", WebhookScheme::Github);
        assert!(claim_all(&cache, &first, 0));
        let resent = replay_keys("r", "b", b"{}", WebhookScheme::Github);
        assert!(!claim_all(&cache, &resent, 0));
        // The refused claim left nothing behind.
        assert!(cache.claim("r:b", 0));
    }

    #[test]
    fn prompts_never_become_commands() {
        let p = json!({"title": "/approve always"});
        let out = prompt("{payload.title}", &p, "issues", "gh");
        assert!(
            out.starts_with("Webhook event issues on route gh:\n"),
            "{out}"
        );
        assert!(talaria_core::commands::Invocation::parse(&out).is_none());
        assert_eq!(
            prompt("Title: {payload.title}", &p, "e", "r"),
            "Title: /approve always"
        );
    }
}
