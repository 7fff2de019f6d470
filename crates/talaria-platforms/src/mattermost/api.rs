//! Mattermost's REST API v4 over HTTP, and the payload types the adapter
//! reads.
//!
//! Every request carries `Authorization: Bearer <token>`. The token never
//! appears in a URL, but errors are still scrubbed of it in case a server
//! or proxy echoes the header back.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, RETRY_AFTER};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// What a failed call looked like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApiError {
    /// The server answered with an error status.
    Status {
        status: u16,
        /// The server's `message` (or a short description of the body).
        message: String,
        /// Seconds to wait, from `Retry-After` or `X-Ratelimit-Reset`.
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
            } => write!(f, "Mattermost answered {status}: {message}"),
            ApiError::Connect(e) => write!(f, "cannot connect to Mattermost: {e}"),
            ApiError::Timeout(e) => write!(f, "Mattermost request timed out: {e}"),
            ApiError::Other(e) => write!(f, "Mattermost request failed: {e}"),
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
}

/// A REST client bound to one server and token.
#[derive(Clone)]
pub(crate) struct Api {
    client: reqwest::Client,
    base_url: String,
    token: String,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

/// Mattermost's error body (`AppError`).
#[derive(Deserialize)]
struct AppError {
    #[serde(default)]
    message: String,
    #[serde(default)]
    id: String,
}

impl Api {
    /// `base_url` is the server root, without `/api/v4`.
    pub(crate) fn new(base_url: &str, token: &str) -> Result<Api, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.without_url().to_string())?;
        Ok(Api {
            client,
            base_url: base_url.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
        })
    }

    /// `GET {base}/api/v4{path}`.
    pub(crate) async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let request = self.client.get(self.url(path));
        self.call(request, timeout).await
    }

    /// `POST {base}/api/v4{path}` with a JSON body.
    pub(crate) async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let request = self.client.post(self.url(path)).json(body);
        self.call(request, timeout).await
    }

    fn url(&self, path: &str) -> String {
        format!("{}/api/v4{path}", self.base_url)
    }

    async fn call<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let response = request
            .header(AUTHORIZATION, format!("Bearer {}", self.token))
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| self.network_error(e))?;
        let status = response.status().as_u16();
        let retry_after = retry_after(response.headers());
        let body = response.bytes().await.map_err(|e| self.network_error(e))?;
        if (200..300).contains(&status) {
            // A success status with a garbled body may still mean the post
            // was made: ambiguous, never retried as transient.
            return serde_json::from_slice(&body).map_err(|e| {
                ApiError::Other(format!("HTTP {status} with an unreadable body: {e}"))
            });
        }
        let message = match serde_json::from_slice::<AppError>(&body) {
            Ok(e) if !e.message.is_empty() && e.id.is_empty() => e.message,
            Ok(e) if !e.message.is_empty() => format!("{} ({})", e.message, e.id),
            _ => format!("HTTP {status}"),
        };
        Err(ApiError::Status {
            status,
            message: self.redact(&message),
            retry_after,
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

/// The wait a 429 asks for: `Retry-After`, else `X-Ratelimit-Reset`
/// (Mattermost's: seconds until the quota resets), whichever is present.
fn retry_after(headers: &HeaderMap) -> Option<u64> {
    crate::net::header_secs(headers, RETRY_AFTER.as_str())
        .or_else(|| crate::net::header_secs(headers, "x-ratelimit-reset"))
}

/// `GET /users/me`: the bot's own account.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct User {
    pub id: String,
    #[serde(default)]
    pub username: String,
}

/// A post, as `posted` events carry it (JSON inside a string) and as
/// `POST /posts` returns it.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Post {
    pub id: String,
    pub channel_id: String,
    #[serde(default)]
    pub root_id: String,
    #[serde(default)]
    pub user_id: String,
    #[serde(default)]
    pub message: String,
    /// Empty for ordinary posts; `system_*` and others for generated ones.
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub file_ids: Vec<String>,
    #[serde(default)]
    pub props: Value,
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn retry_hints() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert("x-ratelimit-reset", HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h), Some(3));
        h.insert(RETRY_AFTER, HeaderValue::from_static("0.2"));
        assert_eq!(retry_after(&h), Some(1));
        h.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h), Some(3));
    }
}
