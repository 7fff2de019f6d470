//! Mattermost's REST API v4 over HTTP, and the payload types the adapter
//! reads.
//!
//! Every request carries `Authorization: Bearer <token>`. The token never
//! appears in a URL, but errors are still scrubbed of it in case a server
//! or proxy echoes the header back.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use talaria_core::Secret;

use crate::http::{Http, HttpError, Service, header_secs, retry_after as retry_after_header};

/// How errors name the server.
pub(crate) const MATTERMOST: Service = Service {
    name: "Mattermost",
    request: "Mattermost request",
    code_label: None,
};

/// What a failed call looked like.
pub(crate) type ApiError = HttpError;

/// A REST client bound to one server and token.
#[derive(Debug, Clone)]
pub(crate) struct Api {
    http: Http,
    base_url: String,
    token: Secret,
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
    pub(crate) fn new(base_url: &str, token: &Secret) -> Result<Api, String> {
        Ok(Api {
            http: Http::new(MATTERMOST)?.hiding(token, "<token>"),
            base_url: base_url.trim_end_matches('/').to_owned(),
            token: token.clone(),
        })
    }

    /// `GET {base}/api/v4{path}`.
    pub(crate) async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let request = self.http.client().get(self.url(path));
        self.call(request, timeout).await
    }

    /// `POST {base}/api/v4{path}` with a JSON body.
    pub(crate) async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let request = self.http.client().post(self.url(path)).json(body);
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
        let request = request.header(AUTHORIZATION, format!("Bearer {}", self.token.expose()));
        let answer = self.http.send(request, timeout).await?;
        if answer.is_success() {
            return self.http.decode(&answer);
        }
        let status = answer.status;
        let message = match serde_json::from_slice::<AppError>(&answer.body) {
            Ok(e) if !e.message.is_empty() && e.id.is_empty() => e.message,
            Ok(e) if !e.message.is_empty() => format!("{} ({})", e.message, e.id),
            _ => format!("HTTP {status}"),
        };
        Err(self
            .http
            .refused(status, None, &message, retry_after(&answer.headers)))
    }
}

/// The wait a 429 asks for: `Retry-After`, else `X-Ratelimit-Reset`
/// (Mattermost's: seconds until the quota resets), whichever is present.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    retry_after_header(headers)
        .or_else(|| header_secs(headers, "x-ratelimit-reset").map(Duration::from_secs))
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
    use reqwest::header::{HeaderValue, RETRY_AFTER};

    #[test]
    fn retry_hints() {
        let secs = |h: &HeaderMap| retry_after(h).map(|d| d.as_secs());
        let mut h = HeaderMap::new();
        assert_eq!(secs(&h), None);
        h.insert("x-ratelimit-reset", HeaderValue::from_static("3"));
        assert_eq!(secs(&h), Some(3));
        h.insert(RETRY_AFTER, HeaderValue::from_static("0.2"));
        assert_eq!(secs(&h), Some(1));
        h.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(secs(&h), Some(3));
    }
}
