//! The webhook route on the shared listener.
//!
//! `POST /line/webhook` runs these steps in order, each answering on its
//! own when it refuses:
//!
//! 1. body over `max_body_bytes` → 413 (read no further than the limit)
//! 2. `x-line-signature` missing or not the base64 HMAC-SHA256 of the raw
//!    body under the channel secret → 401, whatever was wrong
//! 3. the body as LINE's JSON → 400 (the console's "Verify" sends
//!    `events: []`, answered 200)
//! 4. every message event remembered (its reply and quote tokens) and
//!    handed to the inbox → 200; no inbox, a closed one or one that stays
//!    full → 503, and LINE delivers the body again when webhook
//!    redelivery is on (the runner drops the messages it already took,
//!    by message id)

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;

use super::mapping;
use super::tokens::ReplyTokens;
use crate::ingress::{InboxSlot, json_refusal, read_body};

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// The path set as the webhook URL in the LINE Developers console
/// (behind the operator's public origin).
pub const WEBHOOK_PATH: &str = "/line/webhook";

/// How long one delivery may wait for a saturated inbox, for all its
/// messages together, before it is answered 503.
const SUBMIT_TIMEOUT: Duration = Duration::from_secs(8);

/// What the handler shares with the adapter.
pub(crate) struct Hook {
    /// Keyed with the channel secret, nothing fed yet; cloned per body.
    pub mac: HmacSha256,
    pub max_body_bytes: usize,
    pub require_mention: bool,
    pub slot: InboxSlot,
    pub tokens: Arc<ReplyTokens>,
}

pub(crate) fn router(hook: Arc<Hook>) -> Router {
    Router::new()
        .route(WEBHOOK_PATH, post(receive))
        .with_state(hook)
}

async fn receive(State(hook): State<Arc<Hook>>, headers: HeaderMap, body: Body) -> Response {
    let body = match read_body(body, &headers, hook.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => {
            tracing::info!("LINE webhook body refused: {e}");
            return json_refusal(e.status(), &e.to_string());
        }
    };
    if let Err(why) = check_signature(&hook.mac, &headers, &body) {
        // Info, not warn: anyone can post here. A wrong channel secret
        // shows up as every delivery refused.
        tracing::info!(reason = why, "LINE webhook delivery refused");
        return json_refusal(StatusCode::UNAUTHORIZED, "missing or invalid signature");
    }
    let mapped = match mapping::map_delivery(&body, hook.require_mention) {
        Ok(m) => m,
        Err(e) => {
            tracing::info!(error = %e, "a signed LINE webhook body of an unknown shape");
            return json_refusal(StatusCode::BAD_REQUEST, "the body is not a LINE webhook");
        }
    };
    for why in &mapped.skipped {
        tracing::debug!(reason = %why, "LINE event not handed on");
    }
    let count = mapped.messages.len();
    if count == 0 {
        return (StatusCode::OK, axum::Json(json!({"messages": 0}))).into_response();
    }
    let Some(inbox) = hook.slot.inbox() else {
        tracing::warn!("a LINE delivery arrived while the gateway is not taking messages");
        return json_refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is not taking deliveries right now; retry later",
        );
    };
    let deadline = tokio::time::Instant::now() + SUBMIT_TIMEOUT;
    for inbound in mapped.messages {
        let message_id = inbound.event.message_id.clone().unwrap_or_default();
        // Before the hand-over: the answer may be ready before `submit`
        // returns, and it looks its reply token up here.
        hook.tokens.remember(
            &message_id,
            &inbound.event.source.chat_id,
            inbound.reply_token,
            inbound.quote_token,
        );
        let handed = matches!(
            tokio::time::timeout_at(deadline, inbox.submit(inbound.event)).await,
            Ok(Ok(()))
        );
        if !handed {
            tracing::warn!(
                %message_id,
                "the gateway did not take a LINE message; LINE delivers it again if webhook \
                 redelivery is on"
            );
            return json_refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "the gateway is not taking deliveries right now; retry later",
            );
        }
    }
    tracing::debug!(messages = count, "LINE delivery accepted");
    (StatusCode::OK, axum::Json(json!({"messages": count}))).into_response()
}

/// Checks `x-line-signature: base64(HMAC-SHA256(channel secret, body))`.
fn check_signature(mac: &HmacSha256, headers: &HeaderMap, body: &[u8]) -> Result<(), &'static str> {
    let value = headers
        .get("x-line-signature")
        .ok_or("no x-line-signature header")?
        .to_str()
        .map_err(|_| "the x-line-signature header is malformed")?;
    let presented = STANDARD
        .decode(value.trim())
        .map_err(|_| "the x-line-signature header is not base64")?;
    let mut mac = mac.clone();
    mac.update(body);
    // `verify_slice` compares in constant time.
    mac.verify_slice(&presented)
        .map_err(|_| "the signature does not match")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use std::process::Command;

    fn mac(key: &[u8]) -> HmacSha256 {
        <HmacSha256 as Mac>::new_from_slice(key).unwrap()
    }

    fn with_signature(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-line-signature", HeaderValue::from_str(value).unwrap());
        h
    }

    /// The signature as the openssl command line computes it, not our code.
    fn openssl_signature(key: &str, body: &[u8]) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("body");
        std::fs::write(&path, body).unwrap();
        let out = Command::new("sh")
            .arg("-c")
            .arg("openssl dgst -sha256 -hmac \"$1\" -binary \"$2\" | openssl base64 -A")
            .args(["sh", key, path.to_str().unwrap()])
            .output()
            .expect("openssl is installed (scripts/test installs it)");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    #[test]
    fn signatures_are_checked_on_the_raw_body() {
        let body = br#"{"destination":"U1","events":[]}"#;
        let good = openssl_signature("channel-secret", body);
        let key = mac(b"channel-secret");
        assert_eq!(check_signature(&key, &with_signature(&good), body), Ok(()));
        assert!(
            check_signature(
                &key,
                &with_signature(&good),
                b"{\"destination\":\"U1\", \"events\":[]}"
            )
            .is_err()
        );
        assert!(check_signature(&mac(b"other"), &with_signature(&good), body).is_err());
        assert!(check_signature(&key, &with_signature("!!"), body).is_err());
        assert!(check_signature(&key, &HeaderMap::new(), body).is_err());
    }
}
