//! The Bot API over HTTP: one JSON request per method call, and the payload
//! types the adapter reads.
//!
//! Requests go to `{base_url}/bot{token}/{method}`. The token is part of
//! the URL, so every error leaving this module has the URL stripped and the
//! token replaced.

use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use talaria_adapter::{Download, DownloadError};
use talaria_core::Secret;

use crate::http::{Failure, Http, HttpError, Service};

/// How errors name the Bot API.
pub(crate) const TELEGRAM: Service = Service {
    name: "Telegram",
    request: "Telegram request",
    code_label: None,
};

/// What a failed call looked like.
pub(crate) type ApiError = HttpError;

/// A Bot API client bound to one token.
#[derive(Debug, Clone)]
pub(crate) struct Api {
    http: Http,
    base_url: String,
    token: Secret,
}

#[derive(Deserialize)]
struct Envelope {
    ok: bool,
    #[serde(default)]
    result: Value,
    error_code: Option<u16>,
    description: Option<String>,
    parameters: Option<ResponseParameters>,
}

#[derive(Deserialize)]
struct ResponseParameters {
    retry_after: Option<u64>,
}

impl Api {
    pub(crate) fn new(base_url: &str, token: &Secret) -> Result<Api, String> {
        Ok(Api {
            // The token is part of every URL: errors must never show it.
            http: Http::new(TELEGRAM)?.hiding(token, "<token>"),
            base_url: base_url.trim_end_matches('/').to_owned(),
            token: token.clone(),
        })
    }

    /// Calls `method` with a JSON body and decodes `result`.
    pub(crate) async fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        params: &Value,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let request = self
            .http
            .client()
            .post(self.method_url(method))
            .json(params);
        self.answer(method, request, timeout).await
    }

    /// Calls `method` with a multipart body (a file upload) and decodes
    /// `result`. The form is built by the caller, its file part streamed
    /// from disk.
    pub(crate) async fn upload<T: DeserializeOwned>(
        &self,
        method: &str,
        form: reqwest::multipart::Form,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let request = self
            .http
            .client()
            .post(self.method_url(method))
            .multipart(form);
        self.answer(method, request, timeout).await
    }

    /// Starts fetching a file `getFile` named by its `file_path`, streamed.
    /// The path is checked first: it must stay under the bot's file root on
    /// the configured server, never name another host or climb out.
    pub(crate) async fn download_file(
        &self,
        file_path: &str,
        timeout: Duration,
    ) -> Result<Download, DownloadError> {
        if !is_relative_file_path(file_path) {
            return Err(DownloadError::Gone(
                "Telegram gave a file path that is not a Telegram file address".to_owned(),
            ));
        }
        let url = format!(
            "{}/file/bot{}/{}",
            self.base_url,
            self.token.expose(),
            file_path
        );
        self.http
            .download(self.http.client().get(url), timeout)
            .await
    }

    fn method_url(&self, method: &str) -> String {
        format!("{}/bot{}/{}", self.base_url, self.token.expose(), method)
    }

    /// Sends `request` and reads the Bot API's envelope.
    async fn answer<T: DeserializeOwned>(
        &self,
        method: &str,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let answer = self.http.send(request, timeout).await?;
        let status = answer.status;
        let envelope: Envelope = match serde_json::from_slice(&answer.body) {
            Ok(e) => e,
            // A success status with a garbled body may still mean the
            // message went out: ambiguous, never retried as transient.
            Err(_) if answer.is_success() => {
                return Err(self.http.fail(Failure::Other(format!(
                    "HTTP {status} without a readable Bot API answer"
                ))));
            }
            Err(_) => {
                let description = format!("HTTP {status} without a Bot API answer");
                return Err(self.http.refused(status, None, &description, None));
            }
        };
        if !envelope.ok {
            return Err(self.http.refused(
                envelope.error_code.unwrap_or(status),
                None,
                &envelope.description.unwrap_or_default(),
                envelope
                    .parameters
                    .and_then(|p| p.retry_after)
                    .map(Duration::from_secs),
            ));
        }
        serde_json::from_value(envelope.result).map_err(|e| {
            self.http
                .fail(Failure::Other(format!("unexpected {method} result: {e}")))
        })
    }
}

/// Whether `path` is a plain relative path (`photos/file_1.jpg`): no
/// scheme, no leading slash, no `.` or `..` segment, no query, fragment
/// or backslash. A local Bot API server in `--local` mode answers with an
/// absolute path on its own disk, which this adapter cannot fetch over
/// HTTP; that is refused too.
fn is_relative_file_path(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= 1024
        && !path.starts_with('/')
        && !path.contains(['\\', '?', '#', '%', ':'])
        && !path.chars().any(char::is_control)
        && path
            .split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
}

/// What `getFile` answers: where the bytes can be fetched for the next
/// hour.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct File {
    pub file_size: Option<u64>,
    pub file_path: Option<String>,
}

/// `getMe`, and the sender of messages.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct User {
    pub id: i64,
    #[serde(default)]
    pub is_bot: bool,
    #[serde(default)]
    pub first_name: String,
    pub username: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Chat {
    pub id: i64,
    #[serde(rename = "type")]
    pub kind: String,
    pub title: Option<String>,
    pub username: Option<String>,
    pub first_name: Option<String>,
    pub last_name: Option<String>,
    pub is_forum: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Entity {
    #[serde(rename = "type")]
    pub kind: String,
    pub user: Option<User>,
}

/// Any of Telegram's file objects (`PhotoSize`, `Document`, `Voice`,
/// `Audio`, `Video`): the fields they share that a download needs.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct FileRef {
    pub file_id: String,
    pub file_name: Option<String>,
    pub mime_type: Option<String>,
    pub file_size: Option<u64>,
    /// Photos only: the sizes come smallest first; the largest is taken.
    pub width: Option<u32>,
    pub height: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Message {
    pub message_id: i64,
    pub message_thread_id: Option<i64>,
    pub is_topic_message: Option<bool>,
    pub from: Option<User>,
    pub chat: Chat,
    pub author_signature: Option<String>,
    pub text: Option<String>,
    pub caption: Option<String>,
    pub entities: Option<Vec<Entity>>,
    pub caption_entities: Option<Vec<Entity>>,
    pub reply_to_message: Option<Box<Message>>,
    pub photo: Option<Vec<FileRef>>,
    pub document: Option<FileRef>,
    pub video: Option<FileRef>,
    pub voice: Option<FileRef>,
    pub audio: Option<FileRef>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Update {
    pub message: Option<Message>,
    pub channel_post: Option<Message>,
}

/// The part of a sent message the adapter needs.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct SentResult {
    pub message_id: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::is_relative_file_path;

    #[test]
    fn file_paths_stay_under_the_file_root() {
        for ok in ["photos/file_1.jpg", "voice/file_2.oga", "documents/a b.pdf"] {
            assert!(is_relative_file_path(ok), "{ok}");
        }
        for bad in [
            "",
            "/var/lib/telegram-bot-api/x.jpg",
            "../bot1:other/x",
            "photos/../../x",
            "https://evil.example/x",
            "//evil.example/x",
            "photos/./x",
            "a?b",
            "a%2e%2e/b",
            "a\\b",
            "photos//x",
        ] {
            assert!(!is_relative_file_path(bad), "{bad}");
        }
    }
}
