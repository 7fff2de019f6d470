//! The conversation endpoint.
//!
//! `POST /homeassistant/conversation` runs these steps in order, each
//! answering on its own when it refuses:
//!
//! 1. `Authorization: Bearer <conversation token>`, compared in constant
//!    time → 401 (the body is not read)
//! 2. body over [`MAX_BODY_BYTES`] → 413; not the JSON expected → 400;
//!    empty `text` → 400
//! 3. no inbox attached (the gateway is starting or stopping) → 503
//! 4. the request's key (chat from `conversation_id`, message id from `id`
//!    or `Idempotency-Key`): seen before → the same answer (or "still
//!    working" again), no second turn; too many waiting → 503
//! 5. the event goes to the inbox (503 when it is not taken in time) and
//!    the request waits, until its deadline, for the answer `send` hands
//!    over → 200 with Home Assistant's conversation result
//!
//! A request whose answer does not come in time is answered "still
//! working" (200, `"status": "pending"`); the answer, when it comes, is
//! shown as a persistent notification.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use talaria_adapter::{ChatType, MessageEvent, SessionSource};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::PLATFORM;
use super::api::HassApi;
use super::waiting::{Begun, Key, Standing, Waiting};
use crate::ingress::{InboxSlot, json_refusal, read_body};

/// Largest request body read.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Longest sentence taken, in characters.
pub const MAX_TEXT_CHARS: usize = 16_000;

/// How long a request may wait for a saturated inbox before it is answered
/// 503.
const SUBMIT_TIMEOUT: Duration = Duration::from_secs(8);

/// Longest id used as given in a session key; longer ones are hashed.
const MAX_ID_LEN: usize = 64;

/// What is said when the answer is not ready in time.
const PENDING_SPEECH: &str = "I'm still working on that. The answer will appear as a \
                              notification in Home Assistant.";

/// What the handlers share with the adapter.
pub(crate) struct Shared {
    /// The conversation bearer secret. Never logged.
    pub(crate) secret: talaria_core::Secret,
    pub(crate) reply_timeout: Duration,
    /// For notifications; `None` without `HASS_URL`/`HASS_TOKEN`.
    pub(crate) api: Option<HassApi>,
    pub(crate) waiting: Waiting,
    /// The shutdown signal of the adapter's current run.
    pub(crate) stopping: std::sync::Mutex<Option<CancellationToken>>,
}

struct RunState {
    shared: Arc<Shared>,
    slot: InboxSlot,
}

pub(crate) fn router(shared: Arc<Shared>, slot: InboxSlot) -> Router {
    let state = Arc::new(RunState { shared, slot });
    Router::new()
        .route("/homeassistant/conversation", post(converse))
        .route("/homeassistant/health", get(health))
        .with_state(state)
}

/// The request body, as a `rest_command` or an integration sends it.
#[derive(Debug, Deserialize)]
struct Request {
    text: String,
    #[serde(default)]
    conversation_id: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    device_id: Option<String>,
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    id: Option<String>,
}

async fn health(State(state): State<Arc<RunState>>) -> Response {
    if state.slot.inbox().is_some() {
        axum::Json(json!({"status": "ok"})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "starting"})),
        )
            .into_response()
    }
}

async fn converse(State(state): State<Arc<RunState>>, headers: HeaderMap, body: Body) -> Response {
    let shared = &state.shared;
    if !authorized(&headers, shared.secret.expose()) {
        tracing::info!("Home Assistant conversation request refused: bad or missing bearer");
        return json_refusal(StatusCode::UNAUTHORIZED, "missing or invalid bearer token");
    }
    let bytes = match read_body(body, &headers, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => return json_refusal(e.status(), &e.to_string()),
    };
    let request: Request = match serde_json::from_slice(&bytes) {
        Ok(r) => r,
        Err(e) => {
            tracing::info!(error = %e, "Home Assistant conversation body refused");
            return json_refusal(
                StatusCode::BAD_REQUEST,
                "expected JSON with a `text` string (and optionally conversation_id, language, \
                 device_id, user_id, id)",
            );
        }
    };
    let text = request.text.trim();
    if text.is_empty() {
        return json_refusal(StatusCode::BAD_REQUEST, "`text` is empty");
    }
    if text.chars().count() > MAX_TEXT_CHARS {
        return json_refusal(StatusCode::PAYLOAD_TOO_LARGE, "`text` is too long");
    }
    let Some(inbox) = state.slot.inbox() else {
        return json_refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is not taking requests right now; retry later",
        );
    };
    let conversation_id = request
        .conversation_id
        .as_deref()
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map_or_else(|| mint("01"), str::to_owned);
    let chat = safe_id("conv", &conversation_id);
    let idempotency = headers
        .get("Idempotency-Key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let message_id = request
        .id
        .clone()
        .or(idempotency)
        .map(|raw| raw.trim().to_owned())
        .filter(|raw| !raw.is_empty())
        .map_or_else(|| mint("req-"), |raw| safe_id("req", &raw));
    let language = request
        .language
        .as_deref()
        .map(str::trim)
        .filter(|l| !l.is_empty() && l.len() <= 35)
        .unwrap_or("en")
        .to_owned();
    let reply = Reply {
        conversation_id: &conversation_id,
        message_id: &message_id,
        language: &language,
    };
    let key: Key = (chat.clone(), message_id.clone());
    let deadline = Instant::now() + shared.reply_timeout;
    let (answer, deadline) = match shared.waiting.begin(&key, deadline) {
        Begun::Full => {
            tracing::warn!("too many Home Assistant conversation requests waiting");
            return json_refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many requests are waiting for answers; retry later",
            );
        }
        Begun::Seen(Standing::Done(text)) => {
            tracing::info!(%chat, %message_id, "a retried conversation request gets its answer again");
            return reply.answered(&text);
        }
        Begun::Seen(Standing::TimedOut) => return reply.pending(),
        Begun::Seen(Standing::Running { answer, deadline }) => {
            tracing::info!(%chat, %message_id, "a retried conversation request waits for the same answer");
            (answer, deadline)
        }
        Begun::New { answer, deadline } => {
            let event = MessageEvent {
                message_id: Some(message_id.clone()),
                ..MessageEvent::text(source(&chat, &request), text.to_owned())
            };
            let handed = matches!(
                tokio::time::timeout(SUBMIT_TIMEOUT, inbox.submit(event)).await,
                Ok(Ok(()))
            );
            if !handed {
                shared.waiting.abandon(&key);
                tracing::warn!(%chat, "the gateway did not take a Home Assistant request");
                return json_refusal(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the gateway is not taking requests right now; retry later",
                );
            }
            tracing::info!(%chat, %message_id, "Home Assistant conversation request accepted");
            (answer, deadline)
        }
    };
    let stopping = shared
        .stopping
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .unwrap_or_default();
    let mut answer = answer;
    let answered = tokio::select! {
        waited = tokio::time::timeout_at(deadline, answer.wait_for(Option::is_some)) => {
            waited.ok().and_then(|r| r.ok()).and_then(|text| text.clone())
        }
        () = stopping.cancelled() => None,
    };
    if let Some(text) = answered {
        return reply.answered(&text);
    }
    match shared.waiting.time_out(&key) {
        Some(text) => reply.answered(&text),
        None => {
            tracing::info!(%chat, %message_id, "no answer in time; it will be a notification");
            reply.pending()
        }
    }
}

/// What every answer names.
struct Reply<'a> {
    conversation_id: &'a str,
    message_id: &'a str,
    language: &'a str,
}

impl Reply<'_> {
    /// Home Assistant's conversation result (`ConversationResult.as_dict`),
    /// so an integration can pass it through as is.
    fn result(&self, speech: &str, status: &str) -> Value {
        json!({
            "response": {
                "speech": {"plain": {"speech": speech, "extra_data": null}},
                "card": {},
                "language": self.language,
                "response_type": "action_done",
                "data": {"targets": [], "success": [], "failed": []},
            },
            "conversation_id": self.conversation_id,
            "continue_conversation": false,
            "id": self.message_id,
            "status": status,
        })
    }

    fn answered(&self, text: &str) -> Response {
        axum::Json(self.result(text, "answered")).into_response()
    }

    fn pending(&self) -> Response {
        axum::Json(self.result(PENDING_SPEECH, "pending")).into_response()
    }
}

/// Whether `Authorization` carries the secret (scheme case-insensitive).
fn authorized(headers: &HeaderMap, secret: &str) -> bool {
    let presented = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .filter(|t| !t.is_empty());
    presented.is_some_and(|t| talaria_core::constant_time_eq(t.as_bytes(), secret.as_bytes()))
}

/// `raw` when it is a short strict id, else `<prefix>_` and its SHA-256, so
/// whatever the caller sends is safe in a session key.
fn safe_id(prefix: &str, raw: &str) -> String {
    if raw.len() <= MAX_ID_LEN && talaria_core::ids::validate_path_component(raw).is_ok() {
        return raw.to_owned();
    }
    let hex: String = Sha256::digest(raw.as_bytes())
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{prefix}_{hex}")
}

/// A fresh random id.
fn mint(prefix: &str) -> String {
    format!("{prefix}{:032x}", rand::random::<u128>())
}

/// One session per conversation; the speaker is the Home Assistant user
/// when given.
fn source(chat: &str, request: &Request) -> SessionSource {
    let user = request
        .user_id
        .as_deref()
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map_or_else(|| "homeassistant".to_owned(), |u| safe_id("user", u));
    SessionSource {
        platform: PLATFORM.to_owned(),
        chat_id: chat.to_owned(),
        chat_name: request
            .device_id
            .as_deref()
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(|d| format!("device {}", safe_id("device", d))),
        chat_type: ChatType::Dm,
        user_id: Some(user),
        user_name: None,
        thread_id: None,
        is_bot: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use talaria_adapter::{KeyPolicy, SessionKey};

    #[test]
    fn the_bearer_must_match_exactly() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(AUTHORIZATION, HeaderValue::from_str(v).unwrap());
            h
        };
        assert!(authorized(&with("Bearer s3cret"), "s3cret"));
        assert!(authorized(&with("bearer  s3cret "), "s3cret"));
        for bad in [
            "Bearer s3cre",
            "Bearer s3cret2",
            "Basic s3cret",
            "Bearer",
            "s3cret",
        ] {
            assert!(!authorized(&with(bad), "s3cret"), "{bad}");
        }
        assert!(!authorized(&HeaderMap::new(), "s3cret"));
    }

    #[test]
    fn ids_are_safe_in_session_keys() {
        assert_eq!(safe_id("conv", "01HXYZ0ABC"), "01HXYZ0ABC");
        for raw in ["../../x", "a/b", "a:b", " x", &"z".repeat(65), ".hidden"] {
            let id = safe_id("conv", raw);
            assert!(id.starts_with("conv_") && id.len() == 37, "{raw}: {id}");
        }
        let minted = mint("01");
        assert_eq!(minted.len(), 34);
        let request: Request =
            serde_json::from_value(json!({"text": "hi", "user_id": "../u"})).unwrap();
        for chat in [minted.as_str(), &safe_id("conv", "a/b")] {
            let s = source(chat, &request);
            SessionKey::for_source(&s, KeyPolicy::default()).unwrap();
            assert!(s.user_id.unwrap().starts_with("user_"));
        }
    }
}
