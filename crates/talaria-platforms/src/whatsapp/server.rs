//! The webhook routes on the shared listener: Meta's verification
//! handshake and its signed deliveries.
//!
//! `GET /whatsapp/webhook` answers the handshake Meta makes when the
//! callback URL is saved: `hub.mode=subscribe` and `hub.verify_token`
//! equal to ours get `hub.challenge` back as `text/plain`; anything else
//! gets 403.
//!
//! `POST /whatsapp/webhook` runs these steps in order, each answering on
//! its own when it refuses:
//!
//! 1. body over `max_body_bytes` → 413 (read no further than the limit)
//! 2. `X-Hub-Signature-256` missing or not the HMAC-SHA256 of the raw body
//!    under the app secret → 401, the same answer whatever was wrong
//! 3. the body as JSON → 400; not a WhatsApp delivery → 200, ignored
//! 4. receipts are logged (failures at warn; the 24-hour rule by name),
//!    other numbers' changes skipped
//! 5. every message handed to the inbox → 200; no inbox, a closed one or
//!    one that stays full → 503, and Meta delivers the whole batch again
//!    (the runner drops the messages it already took, by wamid)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::mapping::{self, NotWhatsapp};
use crate::ingress::{InboxSlot, json_refusal, read_body};

type HmacSha256 = Hmac<Sha256>;

/// The path Meta is given as the callback URL (behind the operator's
/// public origin).
pub const WEBHOOK_PATH: &str = "/whatsapp/webhook";

/// How long one delivery may wait for a saturated inbox, for all its
/// messages together, before it is answered 503. Meta waits a few seconds
/// for an answer and retries.
const SUBMIT_TIMEOUT: Duration = Duration::from_secs(8);

/// The longest `hub.challenge` echoed back. Meta's are short numbers.
const MAX_CHALLENGE_LEN: usize = 512;

/// Chats whose last inbound message is remembered for read receipts and
/// the typing indicator; when full, the memory starts over.
const MAX_REMEMBERED_CHATS: usize = 10_000;

/// The last inbound message of a chat: what a typing indicator (and read
/// receipt) attaches to.
#[derive(Debug, Clone)]
pub(crate) struct LastInbound {
    pub message_id: String,
    /// When a typing indicator was last shown for it.
    pub typed_at: Option<Instant>,
}

/// What the handlers share with the adapter.
pub(crate) struct Hook {
    pub phone_number_id: String,
    /// Keyed with the app secret, nothing fed yet; cloned per delivery.
    pub mac: HmacSha256,
    /// SHA-256 of the verify token: comparing digests keeps the comparison
    /// constant-time and of fixed length, so not even the length leaks.
    pub verify_digest: [u8; 32],
    pub max_body_bytes: usize,
    pub slot: InboxSlot,
    pub last_inbound: Mutex<HashMap<String, LastInbound>>,
}

impl Hook {
    fn remember(&self, chat_id: &str, message_id: &str) {
        let mut map = self.last_inbound.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_REMEMBERED_CHATS && !map.contains_key(chat_id) {
            map.clear();
        }
        map.insert(
            chat_id.to_owned(),
            LastInbound {
                message_id: message_id.to_owned(),
                typed_at: None,
            },
        );
    }
}

pub(crate) fn router(hook: Arc<Hook>) -> Router {
    Router::new()
        .route(WEBHOOK_PATH, get(handshake).post(receive))
        .with_state(hook)
}

fn answer(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

async fn handshake(
    State(hook): State<Arc<Hook>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let mode = query.get("hub.mode").map(String::as_str);
    let presented = query.get("hub.verify_token").map(String::as_str);
    let matches = presented.is_some_and(|token| {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        talaria_core::constant_time_eq(&digest, &hook.verify_digest)
    });
    if mode != Some("subscribe") || !matches {
        tracing::info!(
            mode = ?mode,
            "WhatsApp webhook verification refused (wrong hub.mode or hub.verify_token)"
        );
        return (StatusCode::FORBIDDEN, "verification failed").into_response();
    }
    let challenge = query.get("hub.challenge").map_or("", String::as_str);
    if challenge.is_empty() || challenge.len() > MAX_CHALLENGE_LEN {
        return (
            StatusCode::BAD_REQUEST,
            "missing or oversized hub.challenge",
        )
            .into_response();
    }
    tracing::info!("WhatsApp webhook verified by Meta");
    (
        StatusCode::OK,
        [(CONTENT_TYPE, "text/plain; charset=utf-8")],
        challenge.to_owned(),
    )
        .into_response()
}

async fn receive(State(hook): State<Arc<Hook>>, headers: HeaderMap, body: Body) -> Response {
    let body = match read_body(body, &headers, hook.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => {
            tracing::info!("WhatsApp webhook body refused: {e}");
            return json_refusal(e.status(), &e.to_string());
        }
    };
    if let Err(why) = check_signature(&hook.mac, &headers, &body) {
        // Info, not warn: anyone can send these. A wrong app secret shows
        // up here, with every delivery refused.
        tracing::info!(reason = why, "WhatsApp webhook delivery refused");
        return json_refusal(StatusCode::UNAUTHORIZED, "missing or invalid signature");
    }
    let payload: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            tracing::info!(error = %e, "WhatsApp webhook body is not JSON");
            return json_refusal(StatusCode::BAD_REQUEST, "the body is not valid JSON");
        }
    };
    let mapped = match mapping::map_delivery(&payload, &hook.phone_number_id) {
        Ok(m) => m,
        Err(NotWhatsapp::Object(object)) => {
            tracing::debug!(%object, "a signed Meta delivery for another product; ignored");
            return answer(StatusCode::OK, json!({"status": "ignored"}));
        }
        Err(NotWhatsapp::Shape(e)) => {
            // Authentic, so retrying it would not help: take it and say so.
            tracing::warn!(error = %e, "a WhatsApp delivery of an unexpected shape; ignored");
            return answer(StatusCode::OK, json!({"status": "ignored"}));
        }
    };
    for failure in &mapped.failures {
        if failure.is_outside_window() {
            tracing::warn!(
                recipient = %failure.recipient,
                message_id = %failure.message_id,
                "WhatsApp did not deliver a reply: the 24-hour customer service window was \
                 closed (error 131047); the user must write first, and starting a conversation \
                 needs an approved template"
            );
        } else {
            tracing::warn!(
                recipient = %failure.recipient,
                message_id = %failure.message_id,
                code = ?failure.code,
                reason = %failure.reason,
                "WhatsApp reports that a message was not delivered"
            );
        }
    }
    if mapped.receipts > 0 {
        tracing::debug!(receipts = mapped.receipts, "WhatsApp delivery receipts");
    }
    if mapped.other_numbers > 0 {
        tracing::debug!(
            changes = mapped.other_numbers,
            "WhatsApp changes for another phone number id; ignored"
        );
    }
    for why in &mapped.skipped {
        tracing::info!(reason = %why, "skipping a WhatsApp message");
    }
    let count = mapped.events.len();
    if count == 0 {
        return answer(StatusCode::OK, json!({"status": "ok", "messages": 0}));
    }
    let Some(inbox) = hook.slot.inbox() else {
        tracing::warn!("a WhatsApp delivery arrived while the gateway is not taking messages");
        return json_refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is not taking deliveries right now; retry later",
        );
    };
    let deadline = tokio::time::Instant::now() + SUBMIT_TIMEOUT;
    for event in mapped.events {
        let message_id = event.message_id.clone().unwrap_or_default();
        // Before the hand-over: the runner may ask for the typing
        // indicator (which needs it) as soon as it has the event.
        hook.remember(&event.source.chat_id, &message_id);
        let handed = matches!(
            tokio::time::timeout_at(deadline, inbox.submit(event)).await,
            Ok(Ok(()))
        );
        if !handed {
            tracing::warn!(
                %message_id,
                "the gateway did not take a WhatsApp message; Meta will deliver it again"
            );
            return json_refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "the gateway is not taking deliveries right now; retry later",
            );
        }
    }
    tracing::debug!(messages = count, "WhatsApp delivery accepted");
    answer(StatusCode::OK, json!({"status": "ok", "messages": count}))
}

/// Checks `X-Hub-Signature-256: sha256=<hex>` against the raw body.
fn check_signature(mac: &HmacSha256, headers: &HeaderMap, body: &[u8]) -> Result<(), &'static str> {
    let value = headers
        .get("x-hub-signature-256")
        .ok_or("no X-Hub-Signature-256 header")?
        .to_str()
        .map_err(|_| "the X-Hub-Signature-256 header is malformed")?
        .trim();
    let hex = value
        .strip_prefix("sha256=")
        .ok_or("the X-Hub-Signature-256 header is malformed")?;
    let presented = decode_hex(hex).ok_or("the X-Hub-Signature-256 header is malformed")?;
    let mut mac = mac.clone();
    mac.update(body);
    // `verify_slice` compares in constant time.
    mac.verify_slice(&presented)
        .map_err(|_| "the signature does not match")
}

/// Decodes hex in either case; `None` for odd lengths or other characters.
fn decode_hex(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    if bytes.is_empty() || !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes
        .chunks_exact(2)
        .map(|pair| {
            let hi = (pair[0] as char).to_digit(16)?;
            let lo = (pair[1] as char).to_digit(16)?;
            u8::try_from(hi * 16 + lo).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn mac(key: &[u8]) -> HmacSha256 {
        <HmacSha256 as Mac>::new_from_slice(key).unwrap()
    }

    fn sign(key: &[u8], body: &[u8]) -> String {
        let mut m = mac(key);
        m.update(body);
        let hex: String = m
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("sha256={hex}")
    }

    fn with_signature(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("X-Hub-Signature-256", HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn signatures_are_checked_on_the_raw_body() {
        let key = b"app-secret";
        let good = sign(key, b"{\"a\":1}");
        assert_eq!(
            check_signature(&mac(key), &with_signature(&good), b"{\"a\":1}"),
            Ok(())
        );
        assert_eq!(
            check_signature(
                &mac(key),
                &with_signature(&good.to_uppercase().replace("SHA256", "sha256")),
                b"{\"a\":1}"
            ),
            Ok(())
        );
        // The same JSON re-serialized is another body.
        assert!(check_signature(&mac(key), &with_signature(&good), b"{\"a\": 1}").is_err());
        assert!(check_signature(&mac(b"other"), &with_signature(&good), b"{\"a\":1}").is_err());
        assert!(check_signature(&mac(key), &with_signature(&good[7..]), b"{\"a\":1}").is_err());
        assert!(check_signature(&mac(key), &with_signature("sha256=zz"), b"").is_err());
        assert!(check_signature(&mac(key), &HeaderMap::new(), b"").is_err());
    }

    #[test]
    fn hex_decoding() {
        assert_eq!(decode_hex("00ffA0"), Some(vec![0, 255, 160]));
        for bad in ["", "0", "zz", "0g"] {
            assert_eq!(decode_hex(bad), None, "{bad:?}");
        }
    }
}
