//! The signal-cli REST API over HTTP (`bbernhard/signal-cli-rest-api`),
//! and the payload types the adapter reads.
//!
//! The API has no authentication of its own (it is meant to sit on a
//! private network or behind a proxy), so no secret travels here; the
//! account number does, and errors never leave the process unredacted
//! anyway since they only reach logs.

use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// What a failed call looked like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApiError {
    /// The server answered with an error status.
    Status {
        status: u16,
        /// The server's `error` text (or a short description of the body).
        message: String,
        /// Seconds to wait, from `Retry-After`.
        retry_after: Option<u64>,
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
            ApiError::Status {
                status, message, ..
            } => write!(f, "the Signal REST API answered {status}: {message}"),
            ApiError::Connect(e) => write!(f, "cannot connect to the Signal REST API: {e}"),
            ApiError::Timeout(e) => write!(f, "a Signal REST API request timed out: {e}"),
            ApiError::Other(e) => write!(f, "a Signal REST API request failed: {e}"),
        }
    }
}

impl ApiError {
    pub(crate) fn status(&self) -> Option<u16> {
        match self {
            ApiError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The server's error text, lower-cased, for the checks that can only
    /// go by it (signal-cli reports most failures as a 400 with a text).
    pub(crate) fn text(&self) -> String {
        match self {
            ApiError::Status { message, .. } => message.to_lowercase(),
            _ => String::new(),
        }
    }
}

/// A client bound to one server.
#[derive(Clone)]
pub(crate) struct Api {
    client: reqwest::Client,
    base_url: String,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

/// The error body every endpoint uses: `{"error": "..."}`.
#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error: String,
}

/// `GET /v1/about`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct About {
    /// `normal`, `native` or `json-rpc`; missing on old servers.
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
}

/// The answer to `POST /v2/send`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct SendResponse {
    /// The new message's timestamp, as a decimal string (some versions
    /// give a number).
    #[serde(default)]
    pub timestamp: Value,
}

impl Api {
    /// `base_url` is the server root.
    pub(crate) fn new(base_url: &str) -> Result<Api, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.without_url().to_string())?;
        Ok(Api {
            client,
            base_url: base_url.trim_end_matches('/').to_owned(),
        })
    }

    /// `GET {base}{path}`.
    pub(crate) async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let request = self.client.get(self.url(path));
        self.call(request, timeout).await
    }

    /// `POST {base}{path}` with a JSON body.
    pub(crate) async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let request = self.client.post(self.url(path)).json(body);
        self.call(request, timeout).await
    }

    /// `PUT {base}{path}` with a JSON body, ignoring the answer's body.
    pub(crate) async fn put(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<(), ApiError> {
        let request = self.client.put(self.url(path)).json(body);
        self.call::<Value>(request, timeout).await.map(|_| ())
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    async fn call<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let response = request
            .timeout(timeout)
            .send()
            .await
            .map_err(network_error)?;
        let status = response.status().as_u16();
        let retry_after = retry_after(response.headers());
        let body = response.bytes().await.map_err(network_error)?;
        if (200..300).contains(&status) {
            // 204 and empty 201s carry no body: read them as `null`.
            let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
                b"null"
            } else {
                &body
            };
            // A success status with a garbled body may still mean the
            // message went out: ambiguous, never retried as transient.
            return serde_json::from_slice(body).map_err(|e| {
                ApiError::Other(format!("HTTP {status} with an unreadable body: {e}"))
            });
        }
        let message = match serde_json::from_slice::<ErrorBody>(&body) {
            Ok(e) if !e.error.trim().is_empty() => clip(e.error.trim()),
            _ => format!("HTTP {status}"),
        };
        Err(ApiError::Status {
            status,
            message,
            retry_after,
        })
    }
}

fn network_error(e: reqwest::Error) -> ApiError {
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
    if connect {
        ApiError::Connect(text)
    } else if timeout {
        ApiError::Timeout(text)
    } else {
        ApiError::Other(text)
    }
}

/// Server error texts can quote whole stack traces: one line, bounded.
fn clip(text: &str) -> String {
    let line = text.lines().next().unwrap_or("");
    let mut out: String = line.chars().take(300).collect();
    if out.len() < line.len() {
        out.push('…');
    }
    out
}

/// The wait a 429 asks for, from `Retry-After` (whole or fractional
/// seconds, rounded up).
fn retry_after(headers: &HeaderMap) -> Option<u64> {
    crate::net::header_secs(headers, RETRY_AFTER.as_str())
}

/// Percent-encodes one path segment (an account number keeps its `+`,
/// which paths carry as is).
pub(crate) fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'+') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn retry_hints_and_paths() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static("0.2"));
        assert_eq!(retry_after(&h), Some(1));
        h.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h), None);
        assert_eq!(path_segment("+4915112345678"), "+4915112345678");
        assert_eq!(path_segment("a b/c"), "a%20b%2Fc");
    }

    #[test]
    fn error_texts_are_one_bounded_line() {
        assert_eq!(clip("first\nsecond"), "first");
        assert_eq!(clip(&"x".repeat(400)).chars().count(), 301);
    }
}
