//! `/api/pairing`: the DM pairing requests waiting for an operator and the
//! users approved, as `talaria pairing` shows and changes them (approving
//! goes through the gateway's `Pairing`, with its lock against guessing).

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use talaria_gateway::pairing::Pairing;
use talaria_platforms::registry::PLATFORMS;
use talaria_store::gateway::normalize_pairing_code;
use talaria_store::{ApproveOutcome, PairingLimits, PairingStore};

use super::{bad_request, error, gateway, json_body, not_found, shown, store_error};
use crate::AppState;
use crate::error::ApiError;

/// Longest user id or code accepted, in chars.
const MAX_FIELD_CHARS: usize = 256;

/// `platform` as pairing stores it, when strangers can be given codes
/// there (its capabilities say so); else 400 naming the ones that can: a
/// typo must not count as a wrong code toward the lock.
fn pairing_platform(platform: &str) -> Result<String, ApiError> {
    let name = platform.trim().to_ascii_lowercase();
    let offering: Vec<&str> = PLATFORMS
        .iter()
        .filter(|p| p.capabilities.offers_pairing())
        .map(|p| p.name)
        .collect();
    if offering.contains(&name.as_str()) {
        Ok(name)
    } else {
        Err(bad_request(
            format!(
                "Unknown platform {:?}: pairing works on {}",
                shown(platform),
                offering.join(", ")
            ),
            "invalid_platform",
        ))
    }
}

/// A required, bounded text field.
fn field(name: &str, value: &str) -> Result<String, ApiError> {
    let value = value.trim();
    if value.is_empty() || value.chars().count() > MAX_FIELD_CHARS || value.contains('\0') {
        return Err(bad_request(
            format!("`{name}` must be given (at most {MAX_FIELD_CHARS} characters)"),
            "invalid_body",
        ));
    }
    Ok(value.to_owned())
}

/// `GET /api/pairing`: unexpired codes (who asked, never the code),
/// approved users and locked platforms.
pub(super) async fn show(State(state): State<Arc<AppState>>) -> Response {
    async {
        let store = &gateway(&state)?.store;
        let limits = PairingLimits::default();
        let snapshot = store.pairing_snapshot(limits).await.map_err(store_error)?;
        let pending: Vec<_> = snapshot
            .pending
            .iter()
            .map(|p| {
                json!({
                    "platform": p.platform,
                    "user_id": p.user_id,
                    "user_name": p.user_name,
                    "created_at": p.created_at,
                    "expires_at": p.created_at + limits.code_ttl,
                })
            })
            .collect();
        let approved: Vec<_> = snapshot
            .approved
            .iter()
            .map(|a| {
                json!({
                    "platform": a.platform,
                    "user_id": a.user_id,
                    "user_name": a.user_name,
                    "approved_at": a.approved_at,
                })
            })
            .collect();
        let lockouts: Vec<_> = snapshot
            .lockouts
            .iter()
            .map(|(platform, until)| json!({"platform": platform, "until": until}))
            .collect();
        Ok::<_, ApiError>(
            Json(json!({
                "object": "talaria.pairing",
                "pending": pending,
                "approved": approved,
                "lockouts": lockouts,
            }))
            .into_response(),
        )
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApproveBody {
    platform: String,
    code: String,
}

/// `POST /api/pairing/approve` with `platform` and `code`: the user who
/// was shown the code may talk to the bot (the gateway tells them).
pub(super) async fn approve(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    async {
        let store = gateway(&state)?.store.clone();
        let body: ApproveBody = json_body(&body)?;
        let platform = pairing_platform(&body.platform)?;
        let code = field("code", &body.code)?;
        let pairing = Pairing::new(store as Arc<dyn PairingStore>);
        match pairing
            .approve(&platform, &code)
            .await
            .map_err(store_error)?
        {
            ApproveOutcome::Approved(user) => Ok(Json(json!({
                "object": "talaria.pairing.approved",
                "platform": user.platform,
                "user_id": user.user_id,
                "user_name": user.user_name,
                "approved_at": user.approved_at,
            }))
            .into_response()),
            ApproveOutcome::NoMatch { failures } => {
                let left = PairingLimits::default()
                    .max_failures
                    .saturating_sub(failures);
                Err(not_found(
                    format!(
                        "No pending code {} on {platform} (it may have expired); {left} more \
                         wrong codes lock approvals for an hour",
                        normalize_pairing_code(&code)
                    ),
                    "pairing_code_not_found",
                ))
            }
            ApproveOutcome::LockedOut { until } => Err(error(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "Approvals on {platform} are locked until {until:.0} (Unix time) after too \
                     many wrong codes"
                ),
                "pairing_locked",
            )),
        }
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UserBody {
    platform: String,
    user_id: String,
}

/// `POST /api/pairing/deny` with `platform` and `user_id`: drops their
/// pending request (they may ask again later).
pub(super) async fn deny(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    async {
        let store = &gateway(&state)?.store;
        let body: UserBody = json_body(&body)?;
        let platform = pairing_platform(&body.platform)?;
        let user_id = field("user_id", &body.user_id)?;
        if !store
            .pairing_deny(&platform, &user_id)
            .await
            .map_err(store_error)?
        {
            return Err(not_found(
                format!(
                    "{:?} has no pending pairing request on {platform}",
                    shown(&user_id)
                ),
                "pairing_request_not_found",
            ));
        }
        Ok(Json(json!({
            "object": "talaria.pairing.denied",
            "platform": platform,
            "user_id": user_id,
            "denied": true,
        }))
        .into_response())
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// `POST /api/pairing/revoke` with `platform` and `user_id`: the user may
/// no longer talk to the bot.
pub(super) async fn revoke(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    async {
        let store = &gateway(&state)?.store;
        let body: UserBody = json_body(&body)?;
        let platform = pairing_platform(&body.platform)?;
        let user_id = field("user_id", &body.user_id)?;
        if !store
            .pairing_revoke(&platform, &user_id)
            .await
            .map_err(store_error)?
        {
            return Err(not_found(
                format!("{:?} is not approved on {platform}", shown(&user_id)),
                "pairing_user_not_found",
            ));
        }
        Ok(Json(json!({
            "object": "talaria.pairing.revoked",
            "platform": platform,
            "user_id": user_id,
            "revoked": true,
        }))
        .into_response())
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}
