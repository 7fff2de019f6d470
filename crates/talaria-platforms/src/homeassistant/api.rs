//! A small client of Home Assistant's REST API (`/api/...`), authenticated
//! with a long-lived access token: what the tools read and call, and the
//! persistent notifications that carry answers nobody waits for.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use talaria_adapter::SendError;

/// Largest response body read from Home Assistant; `/api/states` of a big
/// installation is a few megabytes, more is not worth holding.
const MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;

/// Why a request to Home Assistant failed. Messages never contain the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// 401 or 403: the token is wrong, revoked or lacks the right.
    #[error("HASS_TOKEN was refused by Home Assistant (HTTP {0})")]
    Unauthorized(u16),
    /// 404: the entity, service or path does not exist.
    #[error("not found")]
    NotFound,
    /// Any other refusal (400: bad service data).
    #[error("Home Assistant refused the request (HTTP {status}): {message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// Home Assistant's message, or the body.
        message: String,
    },
    /// 5xx: Home Assistant failed; a retry may pass.
    #[error("Home Assistant failed (HTTP {status}): {message}")]
    Server {
        /// The HTTP status.
        status: u16,
        /// Home Assistant's message, or the body.
        message: String,
    },
    /// No connection could be made: nothing was sent.
    #[error("cannot reach Home Assistant: {0}")]
    Unreachable(String),
    /// The request went out but no answer came in time: it may have run.
    #[error("Home Assistant did not answer in time; the request may have run")]
    TimedOut,
    /// The answer was not the JSON expected, or too large.
    #[error("unexpected answer from Home Assistant: {0}")]
    BadAnswer(String),
}

impl ApiError {
    /// What the delivery ledger should make of this failure.
    pub fn to_send_error(&self) -> SendError {
        match self {
            ApiError::Unauthorized(_) | ApiError::Unreachable(_) => {
                SendError::Unavailable(self.to_string())
            }
            ApiError::Server { .. } => SendError::Transient(self.to_string()),
            ApiError::TimedOut => SendError::Ambiguous(self.to_string()),
            ApiError::NotFound | ApiError::Refused { .. } | ApiError::BadAnswer(_) => {
                SendError::Rejected(self.to_string())
            }
        }
    }
}

/// Home Assistant's REST API at one base URL, with one token.
#[derive(Debug, Clone)]
pub struct HassApi {
    http: reqwest::Client,
    base: String,
    token: talaria_core::Secret,
}

impl HassApi {
    /// A client of `base` (`http://homeassistant.local:8123`, without
    /// `/api`); every request gives up after `timeout`.
    ///
    /// # Errors
    /// A base that is not an http(s) URL, or an empty token.
    pub fn new(base: &str, token: &str, timeout: Duration) -> Result<HassApi, String> {
        let base = base.trim().trim_end_matches('/');
        let parsed = reqwest::Url::parse(base)
            .map_err(|e| format!("HASS_URL `{base}` is not a URL: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!(
                "HASS_URL `{base}` must start with http:// or https://"
            ));
        }
        if token.trim().is_empty() {
            return Err("HASS_TOKEN is empty".to_owned());
        }
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(HassApi {
            http,
            base: base.to_owned(),
            token: talaria_core::Secret::new(token.trim()),
        })
    }

    /// The root URL, without `/api`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// `GET /api/<path>`. `path` is built from validated parts only.
    pub async fn get(&self, path: &str) -> Result<Value, ApiError> {
        let request = self.http.get(format!("{}/api/{path}", self.base));
        self.send(request).await
    }

    /// `POST /api/<path>` with a JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, ApiError> {
        let request = self
            .http
            .post(format!("{}/api/{path}", self.base))
            .json(body);
        self.send(request).await
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value, ApiError> {
        let response = request
            .bearer_auth(self.token.expose())
            .send()
            .await
            .map_err(|e| transport(&e))?;
        let status = response.status();
        let bytes = read_bounded(response).await?;
        if status.is_success() {
            if bytes.is_empty() {
                return Ok(Value::Null);
            }
            return serde_json::from_slice(&bytes)
                .map_err(|e| ApiError::BadAnswer(format!("not JSON: {e}")));
        }
        let message = error_message(&bytes);
        Err(match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                ApiError::Unauthorized(status.as_u16())
            }
            StatusCode::NOT_FOUND => ApiError::NotFound,
            s if s.is_server_error() => ApiError::Server {
                status: s.as_u16(),
                message,
            },
            s => ApiError::Refused {
                status: s.as_u16(),
                message,
            },
        })
    }
}

/// A transport failure: before the request left (unreachable) or after
/// (timed out, so it may have run).
fn transport(e: &reqwest::Error) -> ApiError {
    if e.is_connect() {
        ApiError::Unreachable(without_url(e))
    } else if e.is_timeout() {
        ApiError::TimedOut
    } else {
        ApiError::Unreachable(without_url(e))
    }
}

/// reqwest's message without the URL it appends (harmless, but noisy).
fn without_url(e: &reqwest::Error) -> String {
    let mut e = e.to_string();
    if let Some(at) = e.find(" for url (") {
        e.truncate(at);
    }
    e
}

async fn read_bounded(mut response: reqwest::Response) -> Result<Vec<u8>, ApiError> {
    let mut out = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| transport(&e))? {
        if out.len() + chunk.len() > MAX_RESPONSE_BYTES {
            return Err(ApiError::BadAnswer(format!(
                "the answer is larger than {MAX_RESPONSE_BYTES} bytes"
            )));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Home Assistant's error body is `{"message": ".."}` (or plain text);
/// kept short, since it ends up in tool results and logs.
fn error_message(body: &[u8]) -> String {
    let text = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let clean: String = text.chars().filter(|c| !c.is_control()).take(300).collect();
    if clean.trim().is_empty() {
        "no details".to_owned()
    } else {
        clean.trim().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_map_to_what_the_ledger_needs() {
        assert!(matches!(
            ApiError::Unauthorized(401).to_send_error(),
            SendError::Unavailable(_)
        ));
        let server = ApiError::Server {
            status: 502,
            message: "x".into(),
        };
        assert!(matches!(server.to_send_error(), SendError::Transient(_)));
        assert!(matches!(
            ApiError::TimedOut.to_send_error(),
            SendError::Ambiguous(_)
        ));
        let bad = ApiError::Refused {
            status: 400,
            message: "x".into(),
        };
        assert!(matches!(bad.to_send_error(), SendError::Rejected(_)));
    }

    #[test]
    fn bases_are_checked() {
        let t = Duration::from_secs(1);
        assert!(HassApi::new("http://ha.local:8123/", "t", t).is_ok());
        assert!(HassApi::new("ftp://ha.local", "t", t).is_err());
        assert!(HassApi::new("not a url", "t", t).is_err());
        assert!(HassApi::new("http://ha.local", " ", t).is_err());
        let api = HassApi::new("http://ha.local:8123/", "secret-token-123", t).unwrap();
        assert_eq!(api.base, "http://ha.local:8123");
        assert!(!format!("{api:?}").contains("secret-token-123"));
    }

    #[test]
    fn error_messages_are_short_and_clean() {
        assert_eq!(error_message(br#"{"message": "Bad\nthing"}"#), "Badthing");
        assert_eq!(error_message(b""), "no details");
        assert_eq!(error_message(&[b'x'; 1000]).len(), 300);
    }
}
