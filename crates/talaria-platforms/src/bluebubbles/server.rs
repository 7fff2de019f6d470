//! The webhook route on the shared listener.
//!
//! `POST /bluebubbles-webhook` runs these steps in order, each answering
//! on its own when it refuses:
//!
//! 1. body over `max_body_bytes` → 413 (read no further than the limit)
//! 2. the server password, as the `password` or `guid` query parameter or
//!    an `x-password`, `x-guid` or `x-bluebubbles-guid` header, missing or
//!    wrong → 401 (BlueBubbles signs nothing; the password in the URL it
//!    was given is the proof)
//! 3. the body as JSON, or a form whose `payload`, `data` or `message`
//!    field holds it → 400
//! 4. a `new-message` or `updated-message` mapped and handed to the inbox
//!    → 200; other events → 200, ignored; no inbox, a closed one or one
//!    that stays full → 503. The server does not post again, but the
//!    adapter's catch-up reads the message back from the server.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use regex::Regex;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::mapping::{self, Mapped, Rules};
use crate::ingress::{InboxSlot, json_refusal, read_body};

/// The path the server is told to post to.
pub const WEBHOOK_PATH: &str = "/bluebubbles-webhook";

/// How long one message may wait for a saturated inbox.
const SUBMIT_TIMEOUT: Duration = Duration::from_secs(8);

/// What the handler shares with the adapter.
pub(crate) struct Hook {
    /// SHA-256 of the password: comparing digests keeps the comparison
    /// constant-time and of fixed length.
    pub password_digest: [u8; 32],
    pub max_body_bytes: usize,
    pub require_mention: bool,
    pub wake_words: Vec<Regex>,
    pub slot: InboxSlot,
}

impl Hook {
    pub(crate) fn rules(&self) -> Rules<'_> {
        Rules {
            require_mention: self.require_mention,
            wake_words: &self.wake_words,
        }
    }

    fn authentic(&self, query: &HashMap<String, String>, headers: &HeaderMap) -> bool {
        let presented = ["password", "guid"]
            .iter()
            .find_map(|k| query.get(*k).map(String::as_str))
            .or_else(|| {
                ["x-password", "x-guid", "x-bluebubbles-guid"]
                    .iter()
                    .find_map(|h| headers.get(*h).and_then(|v| v.to_str().ok()))
            });
        presented.is_some_and(|p| {
            let digest: [u8; 32] = Sha256::digest(p.as_bytes()).into();
            talaria_core::constant_time_eq(&digest, &self.password_digest)
        })
    }
}

pub(crate) fn router(hook: Arc<Hook>) -> Router {
    Router::new()
        .route(WEBHOOK_PATH, post(receive))
        .with_state(hook)
}

async fn receive(
    State(hook): State<Arc<Hook>>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let body = match read_body(body, &headers, hook.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => {
            tracing::info!("BlueBubbles webhook body refused: {e}");
            return json_refusal(e.status(), &e.to_string());
        }
    };
    if !hook.authentic(&query, &headers) {
        tracing::info!("a BlueBubbles webhook without the server password; refused");
        return json_refusal(StatusCode::UNAUTHORIZED, "missing or wrong password");
    }
    let Some(payload) = parse(&body) else {
        return json_refusal(
            StatusCode::BAD_REQUEST,
            "the body is not a BlueBubbles event",
        );
    };
    let kind = payload["type"].as_str().unwrap_or_default();
    if !matches!(kind, "new-message" | "updated-message") {
        tracing::debug!(event = kind, "BlueBubbles event ignored");
        return ok("ignored");
    }
    let event = match mapping::map_message(&payload["data"], &hook.rules()) {
        Mapped::Event(e) => e,
        Mapped::Skip(why) => {
            tracing::debug!(reason = why, "BlueBubbles message not handed on");
            return ok("skipped");
        }
    };
    let Some(inbox) = hook.slot.inbox() else {
        tracing::warn!(
            "a BlueBubbles message arrived while the gateway is not taking messages; the \
             catch-up reads it back later"
        );
        return json_refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is not taking messages right now",
        );
    };
    match tokio::time::timeout(SUBMIT_TIMEOUT, inbox.submit(*event)).await {
        Ok(Ok(())) => ok("accepted"),
        _ => json_refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is not taking messages right now",
        ),
    }
}

fn ok(status: &str) -> Response {
    (StatusCode::OK, axum::Json(json!({ "status": status }))).into_response()
}

/// The event as JSON, or from the form field that holds it.
fn parse(body: &[u8]) -> Option<Value> {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        return v.is_object().then_some(v);
    }
    let fields: HashMap<String, String> = form_urlencoded::parse(body).into_owned().collect();
    ["payload", "data", "message"]
        .iter()
        .find_map(|k| fields.get(*k))
        .and_then(|v| serde_json::from_str::<Value>(v).ok())
        .filter(Value::is_object)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn hook() -> Hook {
        Hook {
            password_digest: Sha256::digest(b"s3cret").into(),
            max_body_bytes: 1024,
            require_mention: false,
            wake_words: Vec::new(),
            slot: InboxSlot::new(),
        }
    }

    #[test]
    fn the_password_is_taken_from_the_query_or_a_header() {
        let h = hook();
        let q = |k: &str, v: &str| HashMap::from([(k.to_owned(), v.to_owned())]);
        assert!(h.authentic(&q("password", "s3cret"), &HeaderMap::new()));
        assert!(h.authentic(&q("guid", "s3cret"), &HeaderMap::new()));
        assert!(!h.authentic(&q("password", "s3cre"), &HeaderMap::new()));
        assert!(!h.authentic(&HashMap::new(), &HeaderMap::new()));
        let mut headers = HeaderMap::new();
        headers.insert("x-bluebubbles-guid", HeaderValue::from_static("s3cret"));
        assert!(h.authentic(&HashMap::new(), &headers));
    }

    #[test]
    fn bodies_are_json_or_a_form_field_holding_it() {
        assert_eq!(parse(br#"{"type":"x"}"#).unwrap()["type"], "x");
        assert_eq!(
            parse(b"payload=%7B%22type%22%3A%22y%22%7D").unwrap()["type"],
            "y"
        );
        assert!(parse(b"[1]").is_none());
        assert!(parse(b"other=1").is_none());
    }
}
