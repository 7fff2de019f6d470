//! The bearer-key check in front of every `/v1` route.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;

/// Lets the request through only with `Authorization: Bearer <key>`.
pub(crate) async fn require_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    if !has_key(&state, request.headers()) {
        tracing::debug!(
            path = %request.uri().path(),
            had_header = request.headers().contains_key(AUTHORIZATION),
            "API request refused: bad or missing key"
        );
        return ApiError::invalid_key().into_response();
    }
    next.run(request).await
}

/// Whether `headers` carry `Authorization: Bearer <the key>`.
pub(crate) fn has_key(state: &AppState, headers: &HeaderMap) -> bool {
    headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .is_some_and(|k| {
            talaria_core::constant_time_eq(k.as_bytes(), state.key.expose().as_bytes())
        })
}

/// The token of an `Authorization` value; the scheme is case-insensitive
/// (RFC 9110 §11.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearer   "), None);
    }
}
