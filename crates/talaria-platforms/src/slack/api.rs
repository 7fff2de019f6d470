//! The Slack Web API over HTTP: one JSON `POST {api_base}/{method}` per
//! call with a bearer token, and the answer's `ok`/`error` decoded.
//!
//! Slack reports most failures as HTTP 200 with `{"ok": false, "error":
//! "..."}`; rate limits come as HTTP 429 with `Retry-After` in seconds.
//! Tokens travel only in the `Authorization` header, never in a URL, so no
//! error text can carry one.

use std::time::Duration;

use serde_json::Value;
use talaria_adapter::{Download, DownloadError};
use talaria_core::Secret;

use crate::http::{Http, HttpError, Service, file_part};

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

/// A Web API call's parameters: most methods take JSON, a few only a form.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Params<'a> {
    /// `application/json`.
    Json(&'a Value),
    /// `application/x-www-form-urlencoded`.
    Form(&'a [(&'a str, String)]),
}

/// The host Slack serves files and uploads from.
pub(crate) const FILES_HOST: &str = "files.slack.com";

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
        self.call_with(method, token, Params::Json(params), timeout)
            .await
    }

    /// [`Self::call`] with the parameters in either encoding.
    pub(crate) async fn call_with(
        &self,
        method: &str,
        token: &Secret,
        params: Params<'_>,
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        let url = format!("{}/{method}", self.base);
        let request = self.http.client().post(url).bearer_auth(token.expose());
        let request = match params {
            Params::Json(v) => request.json(v),
            Params::Form(pairs) => request.form(pairs),
        };
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

impl Api {
    /// Whether `url` is where Slack serves files: `https://files.slack.com`,
    /// or the configured API root's own origin (a proxy, a test server).
    /// A URL from an event goes nowhere else, with the token least of all.
    pub(crate) fn is_file_url(&self, url: &str) -> bool {
        let Ok(u) = reqwest::Url::parse(url) else {
            return false;
        };
        if !u.username().is_empty() || u.password().is_some() {
            return false;
        }
        if u.scheme() == "https"
            && u.host_str() == Some(FILES_HOST)
            && u.port_or_known_default() == Some(443)
        {
            return true;
        }
        match reqwest::Url::parse(&self.base) {
            Ok(base) => {
                base.scheme() == u.scheme()
                    && base.host_str().is_some()
                    && base.host_str() == u.host_str()
                    && base.port_or_known_default() == u.port_or_known_default()
            }
            Err(_) => false,
        }
    }

    /// Fetches a private file with the bot token (Slack's `url_private`
    /// needs it in the header), streamed. The caller checked the host.
    pub(crate) async fn download(
        &self,
        url: &str,
        token: &Secret,
        timeout: Duration,
    ) -> Result<Download, DownloadError> {
        let request = self.http.client().get(url).bearer_auth(token.expose());
        self.http.download(request, timeout).await
    }

    /// Posts a file's bytes to the address `files.getUploadURLExternal`
    /// gave, as a multipart form streamed from disk. That address carries
    /// its own authorization: no token goes with it.
    pub(crate) async fn upload(
        &self,
        url: &str,
        path: &std::path::Path,
        name: &str,
        mime: &str,
        timeout: Duration,
    ) -> Result<(), UploadError> {
        let part = file_part(path, name, mime)
            .await
            .map_err(UploadError::File)?;
        let form = reqwest::multipart::Form::new().part("filename", part);
        let request = self.http.client().post(url).multipart(form);
        let answer = self
            .http
            .send(request, timeout)
            .await
            .map_err(UploadError::Http)?;
        if answer.is_success() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)]).into_owned();
        Err(UploadError::Http(self.http.refused(
            answer.status,
            None,
            text.trim(),
            answer.retry_after(),
        )))
    }
}

/// Why posting a file's bytes failed.
#[derive(Debug)]
pub(crate) enum UploadError {
    /// The file could not be read.
    File(std::io::Error),
    /// The upload service refused or could not be reached.
    Http(ApiError),
}
