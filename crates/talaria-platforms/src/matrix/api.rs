//! The Matrix client-server API over HTTP: JSON requests under
//! `{homeserver}/_matrix/client/v3/`, authenticated with a bearer token,
//! and the error shape the spec gives every endpoint
//! (`{"errcode": "M_...", "error": "...", "retry_after_ms": N}`).
//!
//! The token travels in a header, never in the URL, so errors may show
//! paths; they are still scrubbed of the token in case a server echoes it.

use std::time::Duration;

use reqwest::Method;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// What a failed request looked like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApiError {
    /// The homeserver answered with an error status.
    Api {
        status: u16,
        /// `M_FORBIDDEN`, `M_LIMIT_EXCEEDED`, ...; empty when the body was
        /// not a Matrix error (a proxy's 502 page).
        errcode: String,
        message: String,
        /// From `retry_after_ms` or the `Retry-After` header.
        retry_after: Option<Duration>,
    },
    /// No connection was made (refused, DNS): nothing was sent.
    Connect(String),
    /// The request timed out; it may have been processed.
    Timeout(String),
    /// Anything else after the request left (reset, unreadable body).
    Other(String),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Api {
                status,
                errcode,
                message,
                ..
            } if errcode.is_empty() => write!(f, "the homeserver answered {status}: {message}"),
            ApiError::Api {
                status,
                errcode,
                message,
                ..
            } => write!(f, "the homeserver answered {status} {errcode}: {message}"),
            ApiError::Connect(e) => write!(f, "cannot connect to the homeserver: {e}"),
            ApiError::Timeout(e) => write!(f, "homeserver request timed out: {e}"),
            ApiError::Other(e) => write!(f, "homeserver request failed: {e}"),
        }
    }
}

impl ApiError {
    /// Whether the homeserver no longer accepts the access token.
    pub(crate) fn is_bad_token(&self) -> bool {
        matches!(self, ApiError::Api { status: 401, .. })
            || matches!(self, ApiError::Api { errcode, .. }
                if errcode == "M_UNKNOWN_TOKEN" || errcode == "M_MISSING_TOKEN")
    }

    pub(crate) fn is_rate_limit(&self) -> bool {
        matches!(self, ApiError::Api { status: 429, .. })
            || matches!(self, ApiError::Api { errcode, .. } if errcode == "M_LIMIT_EXCEEDED")
    }

    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            ApiError::Api { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// A client bound to one homeserver and access token.
#[derive(Clone)]
pub(crate) struct Api {
    client: reqwest::Client,
    homeserver: String,
    token: String,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("homeserver", &self.homeserver)
            .finish_non_exhaustive()
    }
}

impl Api {
    pub(crate) fn new(homeserver: &str, token: &str) -> Result<Api, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.without_url().to_string())?;
        Ok(Api {
            client,
            homeserver: homeserver.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
        })
    }

    /// Sends `method` to `/_matrix/client/v3/{path}` (already encoded)
    /// with `query` pairs and an optional JSON body, and decodes the answer.
    pub(crate) async fn request<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let url = format!("{}/_matrix/client/v3/{}", self.homeserver, path);
        let mut request = self
            .client
            .request(method, url)
            .bearer_auth(&self.token)
            .timeout(timeout);
        if !query.is_empty() {
            request = request.query(query);
        }
        if let Some(b) = body {
            request = request.json(b);
        }
        let response = request.send().await.map_err(|e| self.network_error(e))?;
        let status = response.status().as_u16();
        let retry_header = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let bytes = response.bytes().await.map_err(|e| self.network_error(e))?;
        if (200..300).contains(&status) {
            // A success status with a garbled body may still mean the
            // request took effect: ambiguous, never retried as transient.
            return serde_json::from_slice(&bytes).map_err(|e| {
                ApiError::Other(format!("HTTP {status} with an unreadable answer: {e}"))
            });
        }
        let parsed: Option<Value> = serde_json::from_slice(&bytes).ok();
        let field = |name: &str| {
            parsed
                .as_ref()
                .and_then(|v| v.get(name))
                .and_then(Value::as_str)
                .map(|s| self.redact(s))
        };
        let errcode = field("errcode").unwrap_or_default();
        let message = field("error").unwrap_or_else(|| format!("HTTP {status}"));
        let retry_body = parsed
            .as_ref()
            .and_then(|v| v.get("retry_after_ms"))
            .and_then(Value::as_u64)
            .map(Duration::from_millis);
        Err(ApiError::Api {
            status,
            errcode,
            message,
            retry_after: retry_body.or(retry_header),
        })
    }

    fn network_error(&self, e: reqwest::Error) -> ApiError {
        let connect = e.is_connect();
        let timeout = e.is_timeout();
        let e = e.without_url();
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        let text = self.redact(&text);
        if connect {
            ApiError::Connect(text)
        } else if timeout {
            ApiError::Timeout(text)
        } else {
            ApiError::Other(text)
        }
    }

    fn redact(&self, text: &str) -> String {
        if self.token.is_empty() {
            text.to_owned()
        } else {
            text.replace(&self.token, "<token>")
        }
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
        let e = |status, errcode: &str| ApiError::Api {
            status,
            errcode: errcode.into(),
            message: String::new(),
            retry_after: None,
        };
        assert!(e(401, "M_UNKNOWN_TOKEN").is_bad_token());
        assert!(e(403, "M_UNKNOWN_TOKEN").is_bad_token());
        assert!(!e(403, "M_FORBIDDEN").is_bad_token());
        assert!(e(429, "").is_rate_limit());
        assert!(e(400, "M_LIMIT_EXCEEDED").is_rate_limit());
        assert!(!e(500, "").is_rate_limit());
    }
}
