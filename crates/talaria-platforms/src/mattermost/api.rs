//! Mattermost's REST API v4 over HTTP, and the payload types the adapter
//! reads.
//!
//! Every request carries `Authorization: Bearer <token>`. The token never
//! appears in a URL, but errors are still scrubbed of it in case a server
//! or proxy echoes the header back.

use std::time::Duration;

use reqwest::header::HeaderMap;
use serde::Deserialize;
use serde_json::Value;
use talaria_core::Secret;

use crate::http::{Answer, HttpError, Service, header_secs, retry_after as retry_after_header};
use crate::rest::{Refusal, Rest};

/// How errors name the server.
pub(crate) const MATTERMOST: Service = Service {
    name: "Mattermost",
    request: "Mattermost request",
    code_label: None,
};

/// What a failed call looked like.
pub(crate) type ApiError = HttpError;

/// A REST client bound to one server and token: `{base}/api/v4{path}`.
pub(crate) type Api = Rest;

/// `base_url` is the server root, without `/api/v4`.
pub(crate) fn client(base_url: &str, token: &Secret) -> Result<Api, String> {
    Rest::new(
        MATTERMOST,
        &format!("{}/api/v4", base_url.trim_end_matches('/')),
        Some(token),
        refusal,
    )
}

/// Mattermost's error body (`AppError`).
#[derive(Deserialize)]
struct AppError {
    #[serde(default)]
    message: String,
    #[serde(default)]
    id: String,
}

/// The message of an `AppError` body, its id in brackets.
pub(crate) fn refusal(answer: &Answer) -> Refusal {
    let message = match serde_json::from_slice::<AppError>(&answer.body) {
        Ok(e) if !e.message.is_empty() && e.id.is_empty() => e.message,
        Ok(e) if !e.message.is_empty() => format!("{} ({})", e.message, e.id),
        _ => String::new(),
    };
    Refusal {
        code: None,
        message,
        retry_after: retry_after(&answer.headers),
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
    /// What the server adds for clients: the attached files' infos.
    #[serde(default)]
    pub metadata: Option<Metadata>,
}

/// A post's `metadata`, as far as the adapter reads it.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Metadata {
    #[serde(default)]
    pub files: Vec<FileInfo>,
}

/// A file's `FileInfo`: in a post's metadata, and what `POST /files`
/// answers for each upload.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct FileInfo {
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub mime_type: Option<String>,
    #[serde(default)]
    pub size: Option<u64>,
}

/// `POST /files`: the stored files, in the order sent.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Uploaded {
    #[serde(default)]
    pub file_infos: Vec<FileInfo>,
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
