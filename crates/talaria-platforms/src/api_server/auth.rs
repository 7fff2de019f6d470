//! The bearer-key check in front of every `/v1` route.

use std::sync::Arc;

use axum::extract::{Request, State};
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
    let presented = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    let ok = presented.is_some_and(|k| keys_match(k.as_bytes(), state.key.expose().as_bytes()));
    if !ok {
        tracing::debug!(
            path = %request.uri().path(),
            had_header = presented.is_some(),
            "API request refused: bad or missing key"
        );
        return ApiError::invalid_key().into_response();
    }
    next.run(request).await
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

/// Compares two keys without stopping at the first differing byte, so the
/// time taken says nothing about how much of a guess was right. The length
/// is not secret (it is checked first and may leak).
pub(crate) fn keys_match(presented: &[u8], expected: &[u8]) -> bool {
    if presented.len() != expected.len() {
        return false;
    }
    let diff = presented
        .iter()
        .zip(expected)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    // Keeps the optimiser from turning the fold back into an early exit.
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_only_when_equal() {
        assert!(keys_match(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!keys_match(b"0123456789abcdeX", b"0123456789abcdef"));
        assert!(!keys_match(b"X123456789abcdef", b"0123456789abcdef"));
        assert!(!keys_match(b"0123456789abcde", b"0123456789abcdef"));
        assert!(!keys_match(b"", b"0123456789abcdef"));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearer   "), None);
    }
}
