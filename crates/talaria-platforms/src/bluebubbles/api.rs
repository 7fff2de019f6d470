//! The BlueBubbles server's REST calls, and what their errors mean.
//!
//! Every call carries the server password as the `guid` query parameter
//! (the server's own scheme; the password is scrubbed from every error
//! text). Answers are `{status, message, data}`, errors
//! `{status, message, error: {type, message}}`.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use talaria_adapter::{Download, DownloadError, SendError};
use talaria_core::Secret;

use crate::http::{Answer, Failure, Http, HttpError, Service};

/// How errors name the server.
pub(crate) const BLUEBUBBLES: Service = Service {
    name: "the BlueBubbles server",
    request: "the BlueBubbles request",
    code_label: None,
};

/// A failed call.
pub(crate) type ApiError = HttpError;

/// The events the adapter's webhook asks for.
pub(crate) const EVENTS: [&str; 2] = ["new-message", "updated-message"];

/// Maps a failed call to what the gateway's ledger understands.
pub(crate) fn classify(e: &ApiError) -> SendError {
    match &e.failure {
        Failure::Status { status: 401, .. } => SendError::Unavailable(format!(
            "the BlueBubbles server refused the password; check BLUEBUBBLES_PASSWORD ({e})"
        )),
        // The server answers 500 when Messages could not send (the Mac
        // asleep, iMessage signed out): worth another try later.
        Failure::Status { status, .. } if *status >= 500 => SendError::Transient(e.to_string()),
        Failure::Status { status: 429, .. } => {
            SendError::RateLimited(e.retry_after().unwrap_or(Duration::from_secs(1)))
        }
        Failure::Status { .. } => SendError::Rejected(e.to_string()),
        Failure::Connect(m) => {
            SendError::Unavailable(format!("cannot connect to the BlueBubbles server: {m}"))
        }
        Failure::Timeout(_) | Failure::Other(_) => e.clone().classify(),
    }
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    data: Value,
}

#[derive(Deserialize)]
struct ErrorEnvelope {
    #[serde(default)]
    message: String,
    #[serde(default)]
    error: Option<ErrorBody>,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    message: String,
}

/// What `GET /api/v1/server/info` says of the Private API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServerInfo {
    /// The Private API is on and its helper connected: threaded replies,
    /// typing and read receipts work.
    pub private_api: bool,
    /// The server's version, when it says.
    pub version: Option<String>,
    /// The iCloud account the Mac is signed in to, when it says.
    pub icloud: Option<String>,
}

/// A client of one server.
#[derive(Debug, Clone)]
pub(crate) struct Api {
    http: Http,
    base: reqwest::Url,
    password: Secret,
}

impl Api {
    /// A client of `base` (an http(s) URL) with `password`.
    pub(crate) fn new(base: reqwest::Url, password: &Secret) -> Result<Api, String> {
        Ok(Api {
            http: Http::new(BLUEBUBBLES)?.hiding(password, "<password>"),
            base,
            password: password.clone(),
        })
    }

    /// `/api/v1/` and `segments`, each percent-encoded, with the password.
    fn url(&self, segments: &[&str]) -> reqwest::Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(["api", "v1"]).extend(segments);
        }
        url.query_pairs_mut()
            .append_pair("guid", self.password.expose());
        url
    }

    fn refusal(&self, answer: &Answer) -> ApiError {
        let text = match serde_json::from_slice::<ErrorEnvelope>(&answer.body) {
            Ok(e) => match e.error {
                Some(b) if !b.message.is_empty() => {
                    format!("{} ({}: {})", e.message, b.kind, b.message)
                }
                _ => e.message,
            },
            Err(_) => String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)])
                .trim()
                .to_owned(),
        };
        self.http
            .refused(answer.status, None, &text, answer.retry_after())
    }

    /// Sends `request` and returns the envelope's `data`.
    async fn call(
        &self,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        let answer = self.http.send(request, timeout).await?;
        if !answer.is_success() {
            return Err(self.refusal(&answer));
        }
        Ok(self.http.decode::<Envelope>(&answer)?.data)
    }

    async fn get(&self, segments: &[&str], timeout: Duration) -> Result<Value, ApiError> {
        self.call(self.http.client().get(self.url(segments)), timeout)
            .await
    }

    async fn post(
        &self,
        segments: &[&str],
        body: &Value,
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        self.call(
            self.http.client().post(self.url(segments)).json(body),
            timeout,
        )
        .await
    }

    /// `GET /api/v1/ping`.
    pub(crate) async fn ping(&self, timeout: Duration) -> Result<(), ApiError> {
        self.get(&["ping"], timeout).await.map(|_| ())
    }

    /// `GET /api/v1/server/info`.
    pub(crate) async fn server_info(&self, timeout: Duration) -> Result<ServerInfo, ApiError> {
        let data = self.get(&["server", "info"], timeout).await?;
        let text = |key: &str| {
            data[key]
                .as_str()
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        Ok(ServerInfo {
            private_api: data["private_api"].as_bool() == Some(true)
                && data["helper_connected"].as_bool() == Some(true),
            version: text("server_version"),
            icloud: text("detected_icloud"),
        })
    }

    /// The id of the webhook registered for `url` (with our events),
    /// registering it when there is none: a blind registration on every
    /// start would pile up duplicates, each delivering every message.
    pub(crate) async fn ensure_webhook(
        &self,
        url: &str,
        timeout: Duration,
    ) -> Result<String, ApiError> {
        let listed = self.get(&["webhook"], timeout).await?;
        let found = listed.as_array().into_iter().flatten().find(|w| {
            w["url"].as_str() == Some(url)
                && EVENTS.iter().all(|e| {
                    w["events"]
                        .as_array()
                        .is_some_and(|evs| evs.iter().any(|v| v == e))
                })
        });
        if let Some(w) = found {
            return Ok(id_text(&w["id"]));
        }
        let made = self
            .post(
                &["webhook"],
                &json!({ "url": url, "events": EVENTS }),
                timeout,
            )
            .await?;
        Ok(id_text(&made["id"]))
    }

    /// `POST /api/v1/message/text`; the new message's guid.
    pub(crate) async fn send_text(
        &self,
        body: &Value,
        timeout: Duration,
    ) -> Result<Option<String>, ApiError> {
        let data = self.post(&["message", "text"], body, timeout).await?;
        Ok(data["guid"].as_str().map(str::to_owned))
    }

    /// `POST /api/v1/message/attachment`, a multipart form.
    pub(crate) async fn send_attachment(
        &self,
        form: reqwest::multipart::Form,
        timeout: Duration,
    ) -> Result<Option<String>, ApiError> {
        let request = self
            .http
            .client()
            .post(self.url(&["message", "attachment"]))
            .multipart(form);
        let data = self.call(request, timeout).await?;
        Ok(data["guid"].as_str().map(str::to_owned))
    }

    /// The guid of the chat whose identifier is `address`, from
    /// `POST /api/v1/chat/query`.
    pub(crate) async fn find_chat(
        &self,
        address: &str,
        timeout: Duration,
    ) -> Result<Option<String>, ApiError> {
        let body = json!({ "limit": 1000, "offset": 0, "with": ["participants"] });
        let chats = self.post(&["chat", "query"], &body, timeout).await?;
        Ok(chats
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["chatIdentifier"].as_str() == Some(address))
            .and_then(|c| c["guid"].as_str().map(str::to_owned)))
    }

    /// `POST /api/v1/chat/new` with `message`: a new one-to-one chat.
    pub(crate) async fn new_chat(
        &self,
        address: &str,
        message: &str,
        temp_guid: &str,
        timeout: Duration,
    ) -> Result<Option<String>, ApiError> {
        let body = json!({
            "addresses": [address], "message": message, "tempGuid": temp_guid,
            "service": "iMessage", "method": "apple-script",
        });
        let data = self.post(&["chat", "new"], &body, timeout).await?;
        Ok(data["guid"].as_str().map(str::to_owned))
    }

    /// `POST /api/v1/chat/{guid}/typing`.
    pub(crate) async fn typing(&self, chat: &str, timeout: Duration) -> Result<(), ApiError> {
        self.post(&["chat", chat, "typing"], &json!({}), timeout)
            .await
            .map(|_| ())
    }

    /// `POST /api/v1/chat/{guid}/read`.
    pub(crate) async fn mark_read(&self, chat: &str, timeout: Duration) -> Result<(), ApiError> {
        self.post(&["chat", chat, "read"], &json!({}), timeout)
            .await
            .map(|_| ())
    }

    /// Messages created after `after_ms` (Unix milliseconds), oldest
    /// first, with their chats, handles and attachments.
    pub(crate) async fn messages_after(
        &self,
        after_ms: i64,
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<Value>, ApiError> {
        let body = json!({
            "limit": limit, "offset": 0, "after": after_ms, "sort": "ASC",
            "with": ["chat", "chat.participants", "handle", "attachment"],
        });
        let data = self.post(&["message", "query"], &body, timeout).await?;
        Ok(data.as_array().cloned().unwrap_or_default())
    }

    /// The creation time of the server's newest message, if it has any.
    pub(crate) async fn newest_message_ms(
        &self,
        timeout: Duration,
    ) -> Result<Option<i64>, ApiError> {
        let body = json!({ "limit": 1, "offset": 0, "sort": "DESC" });
        let data = self.post(&["message", "query"], &body, timeout).await?;
        Ok(data[0]["dateCreated"].as_i64())
    }

    /// A failure that is not the server's answer, as this client's error.
    pub(crate) fn other_error(&self, text: String) -> ApiError {
        self.http.fail(Failure::Other(text))
    }

    /// Streams attachment `guid`.
    pub(crate) async fn download(
        &self,
        guid: &str,
        timeout: Duration,
    ) -> Result<Download, DownloadError> {
        let request = self
            .http
            .client()
            .get(self.url(&["attachment", guid, "download"]));
        self.http.download(request, timeout).await
    }
}

fn id_text(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_encode_segments_and_carry_the_password() {
        let api = Api::new(
            reqwest::Url::parse("http://mac.local:1234/").unwrap(),
            &Secret::new("pw&x"),
        )
        .unwrap();
        let url = api.url(&["chat", "iMessage;+;chat123", "typing"]);
        assert_eq!(
            url.as_str(),
            "http://mac.local:1234/api/v1/chat/iMessage;+;chat123/typing?guid=pw%26x"
        );
        let url = api.url(&["attachment", "a/b", "download"]);
        assert!(url.path().contains("a%2Fb"), "{url}");
    }

    #[test]
    fn refusals_are_classified() {
        let status = |s: u16| {
            HttpError::new(
                BLUEBUBBLES,
                Failure::Status {
                    status: s,
                    code: None,
                    message: "m".into(),
                    retry_after: None,
                },
            )
        };
        assert!(
            matches!(classify(&status(401)), SendError::Unavailable(m) if m.contains("BLUEBUBBLES_PASSWORD"))
        );
        assert!(matches!(classify(&status(500)), SendError::Transient(_)));
        assert!(matches!(classify(&status(400)), SendError::Rejected(_)));
        assert!(matches!(classify(&status(429)), SendError::RateLimited(_)));
    }
}
