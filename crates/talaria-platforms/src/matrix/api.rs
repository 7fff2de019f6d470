//! The Matrix client-server API over HTTP: JSON requests under
//! `{homeserver}/_matrix/client/v3/`, authenticated with a bearer token,
//! and the error shape the spec gives every endpoint
//! (`{"errcode": "M_...", "error": "...", "retry_after_ms": N}`).
//!
//! The token travels in a header, never in the URL, so errors may show
//! paths; they are still scrubbed of the token in case a server echoes it.

use std::time::Duration;

use serde_json::Value;
use talaria_core::Secret;

use crate::http::{Answer, HttpError, Service};
use crate::rest::{Refusal, Rest};

/// How errors name the homeserver.
pub(crate) const HOMESERVER: Service = Service {
    name: "the homeserver",
    request: "homeserver request",
    code_label: None,
};

/// What a failed request looked like; the code is the spec's `errcode`
/// (`M_FORBIDDEN`, `M_LIMIT_EXCEEDED`, ...), absent when the body was not
/// a Matrix error (a proxy's 502 page).
pub(crate) type ApiError = HttpError;

/// Whether the homeserver no longer accepts the access token.
pub(crate) fn is_bad_token(e: &ApiError) -> bool {
    e.status() == Some(401) || matches!(e.code(), Some("M_UNKNOWN_TOKEN" | "M_MISSING_TOKEN"))
}

/// Whether the homeserver asked us to slow down.
pub(crate) fn is_rate_limit(e: &ApiError) -> bool {
    e.status() == Some(429) || e.code() == Some("M_LIMIT_EXCEEDED")
}

/// A client bound to one homeserver and access token; paths are under
/// `{homeserver}/_matrix/client/v3`.
pub(crate) type Api = Rest;

/// A client of `homeserver` with `token`.
pub(crate) fn client(homeserver: &str, token: &Secret) -> Result<Api, String> {
    let root = format!("{}/_matrix/client/v3", homeserver.trim_end_matches('/'));
    Rest::new(HOMESERVER, &root, Some(token), refusal)
}

/// The spec's error body, its wait in the body preferred over the header.
pub(super) fn refusal(answer: &Answer) -> Refusal {
    let parsed: Option<Value> = serde_json::from_slice(&answer.body).ok();
    let field = |name: &str| {
        parsed
            .as_ref()
            .and_then(|v| v.get(name))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let retry_body = parsed
        .as_ref()
        .and_then(|v| v.get("retry_after_ms"))
        .and_then(Value::as_u64)
        .map(Duration::from_millis);
    Refusal {
        code: field("errcode"),
        message: field("error").unwrap_or_default(),
        retry_after: retry_body.or(answer.retry_after()),
    }
}

/// Percent-encodes one path segment: room ids (`!a:b`), event ids (`$x`),
/// user ids (`@u:s`) and transaction ids all carry characters a path
/// cannot take raw.
pub(crate) fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_encoded() {
        assert_eq!(segment("!room:example.org"), "%21room%3Aexample.org");
        assert_eq!(segment("$ev/x?y"), "%24ev%2Fx%3Fy");
        assert_eq!(segment("a-b_c.d~e"), "a-b_c.d~e");
        assert_eq!(segment("é"), "%C3%A9");
    }

    #[test]
    fn bad_tokens_and_rate_limits_are_recognised() {
        let e = |status, errcode: &str| {
            HttpError::new(
                HOMESERVER,
                crate::http::Failure::Status {
                    status,
                    code: Some(errcode.to_owned()).filter(|c| !c.is_empty()),
                    message: String::new(),
                    retry_after: None,
                },
            )
        };
        assert!(is_bad_token(&e(401, "M_UNKNOWN_TOKEN")));
        assert!(is_bad_token(&e(403, "M_UNKNOWN_TOKEN")));
        assert!(!is_bad_token(&e(403, "M_FORBIDDEN")));
        assert!(is_rate_limit(&e(429, "")));
        assert!(is_rate_limit(&e(400, "M_LIMIT_EXCEEDED")));
        assert!(!is_rate_limit(&e(500, "")));
    }
}
