//! The Slack Web API over HTTP: one JSON `POST {api_base}/{method}` per
//! call with a bearer token, and the answer's `ok`/`error` decoded.
//!
//! Slack reports most failures as HTTP 200 with `{"ok": false, "error":
//! "..."}`; rate limits come as HTTP 429 with `Retry-After` in seconds.
//! Tokens travel only in the `Authorization` header, never in a URL, so no
//! error text can carry one.

use std::time::Duration;

use serde_json::Value;

/// What a failed call looked like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApiError {
    /// Slack answered `ok: false` with this error code.
    Slack {
        error: String,
        /// `Retry-After`, when Slack sent one.
        retry_after: Option<u64>,
    },
    /// HTTP 429, with `Retry-After` seconds when given.
    RateLimited(Option<u64>),
    /// Any other non-success status without a Slack answer in the body.
    Status(u16),
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
            ApiError::Slack { error, .. } => write!(f, "Slack answered {error}"),
            ApiError::RateLimited(Some(s)) => write!(f, "Slack rate limit (retry after {s} s)"),
            ApiError::RateLimited(None) => write!(f, "Slack rate limit"),
            ApiError::Status(s) => write!(f, "Slack answered HTTP {s}"),
            ApiError::Connect(e) => write!(f, "cannot connect to Slack: {e}"),
            ApiError::Timeout(e) => write!(f, "Slack request timed out: {e}"),
            ApiError::Other(e) => write!(f, "Slack request failed: {e}"),
        }
    }
}

impl ApiError {
    /// The Slack error code, for `ok: false` answers.
    pub(crate) fn code(&self) -> Option<&str> {
        match self {
            ApiError::Slack { error, .. } => Some(error),
            _ => None,
        }
    }

    /// Whether the token itself was refused: reconnecting cannot help.
    pub(crate) fn is_auth(&self) -> bool {
        matches!(
            self.code(),
            Some(
                "invalid_auth"
                    | "not_authed"
                    | "account_inactive"
                    | "token_revoked"
                    | "token_expired"
                    | "not_allowed_token_type"
                    | "missing_scope"
            )
        )
    }

    /// Seconds Slack asked us to wait, when this is a rate limit.
    pub(crate) fn rate_limit(&self) -> Option<Option<u64>> {
        match self {
            ApiError::RateLimited(after) => Some(*after),
            ApiError::Slack { error, retry_after } if error == "ratelimited" => Some(*retry_after),
            _ => None,
        }
    }
}

/// A Web API client; the token is given per call, since Socket Mode and
/// the Web API use different ones.
#[derive(Clone)]
pub(crate) struct Api {
    client: reqwest::Client,
    base: String,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api").field("base", &self.base).finish()
    }
}

impl Api {
    pub(crate) fn new(base: &str) -> Result<Api, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.without_url().to_string())?;
        Ok(Api {
            client,
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    /// Calls `method` with a JSON body and returns the whole answer object
    /// (Slack puts results at the top level, beside `ok`).
    pub(crate) async fn call(
        &self,
        method: &str,
        token: &str,
        params: &Value,
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        let url = format!("{}/{method}", self.base);
        let response = self
            .client
            .post(url)
            .bearer_auth(token)
            .json(params)
            .timeout(timeout)
            .send()
            .await
            .map_err(network_error)?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let body = response.bytes().await.map_err(network_error)?;
        if status == 429 {
            return Err(ApiError::RateLimited(retry_after));
        }
        let answer: Value = match serde_json::from_slice(&body) {
            Ok(v @ Value::Object(_)) => v,
            // A success status with a garbled body may still mean the
            // message went out: ambiguous, never retried as transient.
            _ if (200..300).contains(&status) => {
                return Err(ApiError::Other(format!(
                    "HTTP {status} without a readable Slack answer"
                )));
            }
            _ => return Err(ApiError::Status(status)),
        };
        if answer.get("ok").and_then(Value::as_bool) == Some(true) {
            return Ok(answer);
        }
        if !(200..300).contains(&status) && answer.get("error").is_none() {
            return Err(ApiError::Status(status));
        }
        let error = answer
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("unknown_error")
            .to_owned();
        Err(ApiError::Slack { error, retry_after })
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
