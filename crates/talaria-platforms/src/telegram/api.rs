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

/// What a failed call looked like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApiError {
    /// Telegram answered `ok: false` (or a non-JSON error page).
    Api {
        status: u16,
        description: String,
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
            ApiError::Api {
                status,
                description,
                ..
            } => write!(f, "Telegram answered {status}: {description}"),
            ApiError::Connect(e) => write!(f, "cannot connect to Telegram: {e}"),
            ApiError::Timeout(e) => write!(f, "Telegram request timed out: {e}"),
            ApiError::Other(e) => write!(f, "Telegram request failed: {e}"),
        }
    }
}

impl ApiError {
    pub(crate) fn status(&self) -> Option<u16> {
        match self {
            ApiError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A Bot API client bound to one token.
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

    /// Calls `method` with a JSON body and decodes `result`.
    pub(crate) async fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        params: &Value,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let url = format!("{}/bot{}/{}", self.base_url, self.token, method);
        let response = self
            .client
            .post(url)
            .json(params)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| self.network_error(e))?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(|e| self.network_error(e))?;
        let envelope: Envelope = match serde_json::from_slice(&body) {
            Ok(e) => e,
            // A success status with a garbled body may still mean the
            // message went out: ambiguous, never retried as transient.
            Err(_) if (200..300).contains(&status) => {
                return Err(ApiError::Other(format!(
                    "HTTP {status} without a readable Bot API answer"
                )));
            }
            Err(_) => {
                return Err(ApiError::Api {
                    status,
                    description: format!("HTTP {status} without a Bot API answer"),
                    retry_after: None,
                });
            }
        };
        if !envelope.ok {
            return Err(ApiError::Api {
                status: envelope.error_code.unwrap_or(status),
                description: self.redact(&envelope.description.unwrap_or_default()),
                retry_after: envelope.parameters.and_then(|p| p.retry_after),
            });
        }
        serde_json::from_value(envelope.result)
            .map_err(|e| ApiError::Other(format!("unexpected {method} result: {e}")))
    }

    fn network_error(&self, e: reqwest::Error) -> ApiError {
        let connect = e.is_connect();
        let timeout = e.is_timeout();
        // Display includes the URL, and so the token: strip it, and scrub
        // the whole source chain in case a layer below repeats it.
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

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Document {
    pub file_name: Option<String>,
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
    pub photo: Option<Vec<Value>>,
    pub document: Option<Document>,
    pub video: Option<Value>,
    pub voice: Option<Value>,
    pub audio: Option<Value>,
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
