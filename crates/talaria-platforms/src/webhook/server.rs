//! The router and the delivery handler.
//!
//! `POST /webhooks/<route>` runs these steps in order, each answering on
//! its own when it refuses:
//!
//! 1. unknown route → 404; disabled route → 403
//! 2. body over `max_body_bytes` → 413 (read no further than the limit)
//! 3. signature → 401, the same answer whatever was wrong
//! 4. the body as JSON → 400
//! 5. event type not in the route's `events` → 200 `ignored`
//! 6. delivery in this process's replay cache → 200 `duplicate`
//! 7. the route's rate limit → 429 with `Retry-After`
//! 8. render the prompt, hand the event to the gateway, which answers
//!    with its [`Admission`]: taken → 202 `accepted`; already taken
//!    before (by this process, an earlier one or another node) → 200
//!    `duplicate`; refused → 200 `refused`; not taken because the gateway
//!    is stopping or did not answer in time → 503
//!
//! The signature comes before the rate limit so that only authentic
//! deliveries spend a route's budget: a stranger hammering a route cannot
//! get the real sender's deliveries refused. The event filter and the
//! replay check come before it too, so that only deliveries that would
//! become turns spend it: a chatty sender's unsubscribed events or retries
//! do not crowd out the ones it acts on. A delivery that does not become a
//! turn after all (a duplicate the gateway caught, a 503) gives its unit of
//! the rate limit back; one that was not taken is also forgotten by the
//! replay cache again, so its retry is not called a duplicate.
//!
//! # Replays
//!
//! What makes a delivery "the same" is what its signature covers, never a
//! header the signature leaves out (see [`identify`]). That signed
//! material names the event: its `message_id` and its session's chat id
//! derive from it, so the gateway's inbound dedupe, which is in the store
//! and survives restarts (kept a week), refuses a captured delivery resent
//! after a restart, under a new `X-GitHub-Delivery` or none. The replay
//! cache here is only a fast path in front of it: it answers a repeat
//! without a trip through the store, and it also catches an honest sender
//! retrying under the same (unsigned) id header.
//!
//! Repeats are answered 2xx on purpose: every sender reads anything else
//! as a failed delivery and retries it (Svix for days), and GitLab
//! disables a hook after four failures in a row.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::WebhookScheme;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use talaria_adapter::{Admission, ChatType, MessageEvent, SessionSource};

use super::guard::{RateLimiter, ReplayCache};
use super::signature::{Signed, Verifier, encode_hex};
use super::{Clock, MAX_REMEMBERED_DELIVERIES, PLATFORM, REPLAY_TTL_SECS, RouteSettings};
use crate::ingress::{InboxSlot, json_refusal, read_body};

/// How long a delivery may wait for a saturated inbox before it is answered
/// 503. Senders time out after about ten seconds (GitHub: 10) and retry.
const SUBMIT_TIMEOUT: Duration = Duration::from_secs(8);

// The delivery id header of each scheme whose id is not signed; Svix's id
// is signed, so it comes from the verifier instead (see `identify`).
/// GitHub's delivery GUID.
const GITHUB_ID_HEADER: &str = "X-GitHub-Delivery";
/// GitLab's event UUID.
const GITLAB_ID_HEADER: &str = "X-Gitlab-Event-UUID";
/// The generic scheme's optional id.
const HMAC_ID_HEADER: &str = "X-Webhook-Id";

/// Longest delivery id used as given; longer ones (or ones with other
/// characters) are replaced by their hash, which is this long (as is a
/// delivery's key, see [`identify`]).
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

/// What the handlers share.
struct RunState {
    shared: Arc<Shared>,
    slot: InboxSlot,
}

pub(crate) fn router(shared: Arc<Shared>, slot: InboxSlot) -> Router {
    let state = Arc::new(RunState { shared, slot });
    Router::new()
        .route("/webhooks/{route}", post(receive))
        .with_state(state)
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
        return json_refusal(StatusCode::NOT_FOUND, "unknown webhook route");
    };
    if !route.settings.enabled {
        return json_refusal(StatusCode::FORBIDDEN, "this webhook route is disabled");
    }
    let body = match read_body(body, &headers, shared.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => {
            tracing::info!(route = %name, "webhook body refused: {e}");
            return json_refusal(e.status(), &e.to_string());
        }
    };
    let now = shared.clock.unix_now();
    let signed = match route.verifier.verify(&headers, &body, now) {
        Ok(signed) => signed,
        Err(why) => {
            // Info, not warn: anyone can make these, and a misconfigured
            // sender shows up here with its reason.
            tracing::info!(route = %name, reason = %why, "webhook delivery refused");
            return json_refusal(StatusCode::UNAUTHORIZED, "missing or invalid signature");
        }
    };
    let payload: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            tracing::info!(route = %name, error = %e, "webhook body is not JSON");
            return json_refusal(StatusCode::BAD_REQUEST, "the body is not valid JSON");
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
    let Identity {
        id: delivery_id,
        key,
        claims,
    } = identify(&name, route.settings.scheme, &headers, &body, signed);
    let duplicate = || {
        answer(
            StatusCode::OK,
            json!({"status": "duplicate", "route": name, "delivery_id": delivery_id}),
        )
    };
    if !claim_all(&shared.replays, &claims, now) {
        tracing::info!(route = %name, %delivery_id, "webhook delivery already seen");
        return duplicate();
    }
    if let Err(wait) = shared.limiter.admit(&name, now) {
        release_all(&shared.replays, &claims);
        tracing::warn!(route = %name, %delivery_id, "webhook rate limit reached");
        let mut response = json_refusal(
            StatusCode::TOO_MANY_REQUESTS,
            "too many deliveries on this route; retry later",
        );
        if let Ok(v) = HeaderValue::from_str(&wait.to_string()) {
            response.headers_mut().insert(RETRY_AFTER, v);
        }
        return response;
    }
    let text = prompt(&route.settings.prompt, &payload, &event, &name);
    // The event's id is the signed key, never the id header: the gateway's
    // persistent dedupe keys on it (with the chat id, which carries it too).
    let message = MessageEvent {
        message_id: Some(key.clone()),
        reply_target: Some(route.settings.deliver.clone()),
        ..MessageEvent::text(source(&name, &key), text)
    };
    let admission = match state.slot.inbox() {
        Some(inbox) => tokio::time::timeout(SUBMIT_TIMEOUT, inbox.admit(message))
            .await
            .ok()
            .and_then(Result::ok),
        None => None,
    };
    match admission {
        Some(Admission::Accepted) => {
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
        Some(Admission::Duplicate) => {
            // Taken before this process's cache remembers: before a
            // restart, or by another node. The claims stay, so the next
            // repeat is answered here.
            shared.limiter.refund(&name, now);
            tracing::info!(route = %name, %delivery_id, "webhook delivery already taken before");
            duplicate()
        }
        Some(Admission::Refused) => {
            // Sending it again cannot change a refusal, so it is answered
            // 2xx (no retries, no disabled hook) and forgotten, so a
            // retry hears the same.
            release_all(&shared.replays, &claims);
            shared.limiter.refund(&name, now);
            tracing::warn!(route = %name, %delivery_id, "the gateway refused a webhook delivery");
            answer(
                StatusCode::OK,
                json!({"status": "refused", "route": name, "delivery_id": delivery_id}),
            )
        }
        None => {
            release_all(&shared.replays, &claims);
            shared.limiter.refund(&name, now);
            tracing::warn!(route = %name, %delivery_id, "the gateway did not take a webhook delivery");
            json_refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "the gateway is not taking deliveries right now; retry later",
            )
        }
    }
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

/// How a delivery is named and what it claims in the replay cache.
#[derive(Debug, PartialEq, Eq)]
struct Identity {
    /// What answers and logs call the delivery: the sender's id (the
    /// scheme's id header, Svix's signed id), else the key. Not trusted
    /// for anything else where it is not signed.
    id: String,
    /// The delivery's identity from what is signed: the event's
    /// `message_id` and the tail of its chat id, so the gateway's
    /// persistent inbound dedupe keys on it.
    key: String,
    /// Replay cache keys: the key, and the id header where there is one.
    claims: Vec<String>,
}

/// The delivery's key, id and replay claims, per scheme. The key comes from
/// what the signature covers, so a captured delivery resent under a new id
/// header (or none) has the same key and is a duplicate, in this process
/// and after a restart:
///
/// - `github`, `gitlab`: the digest of the route and the body, since
///   neither signs an id or a timestamp;
/// - `hmac`: the digest of the route and the signed `<timestamp>.<body>`,
///   so two identical bodies sent on purpose at different times are not
///   duplicates;
/// - `svix`: the id the signature covers (`svix-id` or `webhook-id`),
///   which cannot be changed without breaking it and which Svix keeps
///   when it retries with a fresh timestamp.
///
/// The route is in the digest so that the same bytes delivered to two
/// routes are two deliveries. Only the scheme's own id header is read:
/// taking the first of a list would let a replayer add a header another
/// scheme reads. That header is claimed in the replay cache besides the
/// key (a sender retrying under the same id is a duplicate even when it
/// signed anew), but it never names the event: being unsigned, it cannot
/// make a delivery new. Claims are namespaced (`id:`, `key:`) so an id
/// header cannot be chosen to collide with another delivery's key.
fn identify(
    route: &str,
    scheme: WebhookScheme,
    headers: &HeaderMap,
    body: &[u8],
    signed: Signed<'_>,
) -> Identity {
    let (header, key) = match scheme {
        WebhookScheme::Github => (
            id_header(headers, GITHUB_ID_HEADER),
            signed_key(route, None, body),
        ),
        WebhookScheme::Gitlab => (
            id_header(headers, GITLAB_ID_HEADER),
            signed_key(route, None, body),
        ),
        WebhookScheme::Hmac => (
            id_header(headers, HMAC_ID_HEADER),
            signed_key(route, signed.timestamp, body),
        ),
        WebhookScheme::Svix => match signed.id {
            Some(id) => {
                let id = clean_id(id);
                return Identity {
                    claims: vec![format!("{route}:key:{id}")],
                    key: id.clone(),
                    id,
                };
            }
            // A passing Svix check always reports its id; should it not,
            // what it signed still names the delivery.
            None => (None, signed_key(route, signed.timestamp, body)),
        },
    };
    let mut claims = vec![format!("{route}:key:{key}")];
    let id = match header {
        Some(raw) => {
            let id = clean_id(raw);
            claims.push(format!("{route}:id:{id}"));
            id
        }
        None => key.clone(),
    };
    Identity { id, key, claims }
}

/// A header's value, trimmed, when present and not empty.
fn id_header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// `raw` as is when it is short and made of `[A-Za-z0-9._-]` (without
/// `..`), else its SHA-256, so the id is always safe in a session key.
fn clean_id(raw: &str) -> String {
    let clean = raw.len() <= MAX_DELIVERY_ID_LEN
        && !raw.contains("..")
        && raw
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if clean {
        raw.to_owned()
    } else {
        sha256(raw.as_bytes())
    }
}

/// The hex SHA-256 of the route and what was signed (`<timestamp>.<body>`,
/// or the body alone when no timestamp was signed). The route comes first,
/// ended by a byte no route name contains.
fn signed_key(route: &str, timestamp: Option<&str>, body: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(route.as_bytes());
    hasher.update([0x1f]);
    if let Some(ts) = timestamp {
        hasher.update(ts.as_bytes());
        hasher.update(b".");
    }
    hasher.update(body);
    encode_hex(&hasher.finalize())
}

fn sha256(bytes: &[u8]) -> String {
    encode_hex(&Sha256::digest(bytes))
}

/// Claims every key, or none: when one was already seen, the ones just
/// claimed are released again.
fn claim_all(cache: &ReplayCache, keys: &[String], now: i64) -> bool {
    for (i, key) in keys.iter().enumerate() {
        if !cache.claim(key, now) {
            release_all(cache, &keys[..i]);
            return false;
        }
    }
    true
}

/// Forgets claims whose delivery was not handed over after all.
fn release_all(cache: &ReplayCache, keys: &[String]) {
    for key in keys {
        cache.release(key);
    }
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

/// One session per delivery, named after the route and the delivery's
/// signed key (see [`identify`]).
fn source(route: &str, key: &str) -> SessionSource {
    SessionSource {
        platform: PLATFORM.to_owned(),
        chat_id: format!("{route}:{key}"),
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
    use talaria_adapter::{KeyPolicy, SessionKey};

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

    fn identity(scheme: WebhookScheme, h: &HeaderMap, body: &[u8], signed: Signed) -> Identity {
        identify("r", scheme, h, body, signed)
    }

    const SVIX_SIGNED: Signed<'static> = Signed {
        id: Some("msg_2Lh9"),
        timestamp: Some("1"),
    };

    #[test]
    fn delivery_ids_and_keys_are_safe_in_session_keys() {
        let h = headers(&[("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")]);
        let github = identity(WebhookScheme::Github, &h, b"{}", Signed::default());
        assert_eq!(github.id, "72d3162e-cc78-11e3-81ab-4c9367dc0958");
        assert_eq!(github.key, signed_key("r", None, b"{}"));
        for raw in ["../../etc", "a:b", "a/b", "x y", &"z".repeat(65)] {
            let h = headers(&[("X-Webhook-Id", raw)]);
            let id = identity(WebhookScheme::Hmac, &h, b"", Signed::default()).id;
            assert_eq!(id.len(), 64, "{raw}");
            assert!(id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        }
        // Without an id header, the key names the delivery.
        let bare = identity(
            WebhookScheme::Github,
            &HeaderMap::new(),
            b"{}",
            Signed::default(),
        );
        assert_eq!(bare.id, bare.key);
        // The generic scheme's timestamp tells two identical bodies apart.
        let at = |ts| {
            let signed = Signed {
                id: None,
                timestamp: Some(ts),
            };
            identity(WebhookScheme::Hmac, &HeaderMap::new(), b"{}", signed).key
        };
        assert_ne!(at("1"), at("2"));
        assert_eq!(at("1"), signed_key("r", Some("1"), b"{}"));
        for key in [github.key.as_str(), "msg_1", &at("1")] {
            assert_eq!(key.len().max(64), 64);
            let s = source("gh-push", key);
            SessionKey::for_source(&s, KeyPolicy::default()).unwrap();
        }
    }

    #[test]
    fn keys_come_from_what_is_signed_and_the_route() {
        // The same bytes on two routes are two deliveries.
        assert_ne!(signed_key("a", None, b"{}"), signed_key("b", None, b"{}"));
        // The separator keeps the route and the signed bytes apart.
        assert_ne!(signed_key("a", None, b"b{}"), signed_key("ab", None, b"{}"));
        // (A timestamp is digits, so `<timestamp>.<body>` reads one way;
        // a route has one scheme, so it never meets a key made without.)
        assert_ne!(
            signed_key("r", Some("1"), b"2.{}"),
            signed_key("r", Some("12"), b"{}")
        );
        assert_eq!(signed_key("r", None, b"{}").len(), MAX_DELIVERY_ID_LEN);
        // Changing or adding id headers never changes the key.
        let keys: Vec<String> = [
            headers(&[("X-GitHub-Delivery", "a")]),
            headers(&[("X-GitHub-Delivery", "b")]),
            headers(&[("X-GitHub-Delivery", "b"), ("X-Request-Id", "c")]),
            HeaderMap::new(),
        ]
        .iter()
        .map(|h| identity(WebhookScheme::Github, h, b"{}", Signed::default()).key)
        .collect();
        assert!(keys.iter().all(|k| *k == keys[0]), "{keys:?}");
        // Svix's key is its signed id, whatever else the headers say.
        let noisy = headers(&[("X-GitHub-Delivery", "other"), ("X-Webhook-Id", "x")]);
        let svix = identity(WebhookScheme::Svix, &noisy, b"{}", SVIX_SIGNED);
        assert_eq!(
            (svix.id.as_str(), svix.key.as_str()),
            ("msg_2Lh9", "msg_2Lh9")
        );
    }

    #[test]
    fn each_scheme_reads_only_its_own_id_header() {
        // Every id header at once, as a replayer adding some would send.
        let all = headers(&[
            ("X-GitHub-Delivery", "gh"),
            ("X-Gitlab-Event-UUID", "gl"),
            ("svix-id", "unsigned"),
            ("X-Request-Id", "req"),
            ("X-Webhook-Id", "hm"),
        ]);
        let id = |scheme, signed| identity(scheme, &all, b"{}", signed).id;
        assert_eq!(id(WebhookScheme::Github, Signed::default()), "gh");
        assert_eq!(id(WebhookScheme::Gitlab, Signed::default()), "gl");
        // Svix: the id the signature covered, whatever the headers say.
        assert_eq!(id(WebhookScheme::Svix, SVIX_SIGNED), "msg_2Lh9");
        assert_eq!(id(WebhookScheme::Hmac, Signed::default()), "hm");
        // `X-Request-Id` is nobody's id.
        let h = headers(&[("X-Request-Id", "req")]);
        let signed = Signed {
            id: None,
            timestamp: Some("1"),
        };
        assert_eq!(
            identity(WebhookScheme::Hmac, &h, b"{}", signed).id,
            signed_key("r", Some("1"), b"{}")
        );
    }

    #[test]
    fn replays_are_claimed_on_what_is_signed() {
        let key = signed_key("r", None, b"{}");
        let h = headers(&[("X-GitHub-Delivery", "a")]);
        assert_eq!(
            identity(WebhookScheme::Github, &h, b"{}", Signed::default()).claims,
            vec![format!("r:key:{key}"), "r:id:a".to_owned()]
        );
        assert_eq!(
            identity(
                WebhookScheme::Gitlab,
                &HeaderMap::new(),
                b"{}",
                Signed::default()
            )
            .claims,
            vec![format!("r:key:{key}")]
        );
        // Svix signs its id: that alone is claimed, and headers do not
        // change it.
        let noisy = headers(&[("X-GitHub-Delivery", "other"), ("X-Webhook-Id", "x")]);
        assert_eq!(
            identity(WebhookScheme::Svix, &noisy, b"{}", SVIX_SIGNED).claims,
            vec!["r:key:msg_2Lh9".to_owned()]
        );
        // The generic scheme always claims its signed timestamp and body,
        // with or without an id header.
        let signed = Signed {
            id: None,
            timestamp: Some("1"),
        };
        let signed_claim = format!("r:key:{}", signed_key("r", Some("1"), b"{}"));
        let bare = identity(WebhookScheme::Hmac, &HeaderMap::new(), b"{}", signed);
        assert_eq!(bare.claims, vec![signed_claim.clone()]);
        let named = identity(
            WebhookScheme::Hmac,
            &headers(&[("X-Webhook-Id", "w")]),
            b"{}",
            signed,
        );
        assert_eq!(named.claims, vec![signed_claim, "r:id:w".to_owned()]);

        let cache = ReplayCache::new(3600, 100);
        assert!(claim_all(&cache, &bare.claims, 0));
        // The same signed delivery with an id header added is a duplicate...
        assert!(!claim_all(&cache, &named.claims, 0));
        // ...and the refused claim left nothing behind.
        assert!(cache.claim("r:id:w", 0));
        // A GitHub delivery resent under a fresh id is caught by its key.
        let first = identity(WebhookScheme::Github, &h, b"{}", Signed::default());
        assert!(claim_all(&cache, &first.claims, 0));
        let renamed = headers(&[("X-GitHub-Delivery", "b")]);
        let resent = identity(WebhookScheme::Github, &renamed, b"{}", Signed::default());
        assert!(!claim_all(&cache, &resent.claims, 0));
        // So is one resent without an id at all.
        let bare = identity(
            WebhookScheme::Github,
            &HeaderMap::new(),
            b"{}",
            Signed::default(),
        );
        assert!(!claim_all(&cache, &bare.claims, 0));
        // An id header cannot be picked to collide with a key claim.
        let forged = headers(&[("X-GitHub-Delivery", key.as_str())]);
        let other = identity(WebhookScheme::Github, &forged, b"[]", Signed::default());
        assert!(claim_all(&cache, &other.claims, 0));
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
