//! The Slack Web API over HTTP: one JSON `POST {api_base}/{method}` per
//! call with a bearer token, and the answer's `ok`/`error` decoded.
//!
//! Slack reports most failures as HTTP 200 with `{"ok": false, "error":
//! "..."}`; rate limits come as HTTP 429 with `Retry-After` in seconds.
//! Tokens travel only in the `Authorization` header, never in a URL, so no
//! error text can carry one.

use std::time::Duration;

use serde_json::Value;
use talaria_core::Secret;

use crate::http::{Http, HttpError, Service};

/// How errors name Slack.
pub(crate) const SLACK: Service = Service {
    name: "Slack",
    request: "Slack request",
    code_label: None,
};

/// What a failed call looked like: Slack's `ok: false` answers carry its
/// error code (`channel_not_found`); a 429 or another status without a
/// Slack answer carries none.
pub(crate) type ApiError = HttpError;

/// Whether the token itself was refused: reconnecting cannot help.
pub(crate) fn is_auth(e: &ApiError) -> bool {
    matches!(
        e.code(),
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

/// The wait Slack asked for (when it named one), when this is a rate
/// limit: a 429, or an `ok: false` answer saying `ratelimited`.
pub(crate) fn rate_limit(e: &ApiError) -> Option<Option<Duration>> {
    (e.status() == Some(429) || e.code() == Some("ratelimited")).then(|| e.retry_after())
}

/// A Web API client; the token is given per call, since Socket Mode and
/// the Web API use different ones.
#[derive(Debug, Clone)]
pub(crate) struct Api {
    http: Http,
    base: String,
}

impl Api {
    pub(crate) fn new(base: &str) -> Result<Api, String> {
        Ok(Api {
            http: Http::new(SLACK)?,
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    /// Calls `method` with a JSON body and returns the whole answer object
    /// (Slack puts results at the top level, beside `ok`). Tokens travel
    /// only in the `Authorization` header, so no error text can carry one.
    pub(crate) async fn call(
        &self,
        method: &str,
        token: &Secret,
        params: &Value,
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        let url = format!("{}/{method}", self.base);
        let request = self
            .http
            .client()
            .post(url)
            .bearer_auth(token.expose())
            .json(params);
        let answer = self.http.send(request, timeout).await?;
        let status = answer.status;
        let retry_after = answer.retry_after();
        if status == 429 {
            return Err(self.http.refused(status, None, "", retry_after));
        }
        let body: Value = match serde_json::from_slice(&answer.body) {
            Ok(v @ Value::Object(_)) => v,
            // A success status with a garbled body may still mean the
            // message went out: ambiguous, never retried as transient.
            _ if answer.is_success() => {
                return Err(self.http.fail(crate::http::Failure::Other(format!(
                    "HTTP {status} without a readable Slack answer"
                ))));
            }
            _ => return Err(self.http.refused(status, None, "", None)),
        };
        if body.get("ok").and_then(Value::as_bool) == Some(true) {
            return Ok(body);
        }
        let error = body.get("error").and_then(Value::as_str);
        if !answer.is_success() && error.is_none() {
            return Err(self.http.refused(status, None, "", None));
        }
        let error = error.unwrap_or("unknown_error").to_owned();
        Err(self.http.refused(status, Some(error), "", retry_after))
    }
}
