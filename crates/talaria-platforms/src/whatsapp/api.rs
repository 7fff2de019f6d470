//! The Graph API calls the adapter makes, and what their errors mean.
//!
//! Everything goes to `POST {graph_base}/{api_version}/{phone_number_id}/messages`
//! with `Authorization: Bearer <token>`: sending a text, and marking an
//! inbound message read (with the typing indicator). Graph answers errors
//! as `{"error": {"message", "type", "code", "error_subcode", "error_data",
//! "fbtrace_id"}}`; [`classify`] turns them into what the delivery ledger
//! understands. The token never appears in a URL, and error texts are
//! scrubbed of it in case something echoes it back.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, RETRY_AFTER};
use serde::Deserialize;
use serde_json::Value;
use talaria_adapter::SendError;

/// Graph's code for a message sent outside the 24-hour customer service
/// window ("Re-engagement message").
pub(crate) const OUTSIDE_WINDOW: i64 = 131047;

/// Graph's code for an invalid or expired access token.
pub(crate) const BAD_TOKEN: i64 = 190;

/// Graph's rate-limit codes: too many messages from this number (130429),
/// too many to one user in a short time (131056), too many API calls
/// (80007).
pub(crate) const RATE_LIMIT_CODES: [i64; 3] = [130429, 131056, 80007];

/// What a failed call looked like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApiError {
    /// Graph answered with an error status.
    Status {
        status: u16,
        /// Graph's `error.code`, when the body had one.
        code: Option<i64>,
        /// `error.message` and `error_data.details`, or a description of
        /// the body.
        message: String,
        /// `error.fbtrace_id`, for Meta's support.
        trace: Option<String>,
        /// Seconds from `Retry-After`, when present.
        retry_after: Option<u64>,
    },
    /// No connection was made: nothing was sent.
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
                status,
                code,
                message,
                trace,
                ..
            } => {
                write!(f, "the Graph API answered {status}")?;
                if let Some(code) = code {
                    write!(f, " (code {code})")?;
                }
                write!(f, ": {message}")?;
                if let Some(trace) = trace {
                    write!(f, " [fbtrace_id {trace}]")?;
                }
                Ok(())
            }
            ApiError::Connect(e) => write!(f, "cannot connect to the Graph API: {e}"),
            ApiError::Timeout(e) => write!(f, "the Graph API request timed out: {e}"),
            ApiError::Other(e) => write!(f, "the Graph API request failed: {e}"),
        }
    }
}

impl ApiError {
    /// Graph's error code, if it sent one.
    pub(crate) fn code(&self) -> Option<i64> {
        match self {
            ApiError::Status { code, .. } => *code,
            _ => None,
        }
    }

    /// Whether Graph asked us to slow down.
    pub(crate) fn is_rate_limit(&self) -> bool {
        match self {
            ApiError::Status { status, code, .. } => {
                *status == 429 || code.is_some_and(|c| RATE_LIMIT_CODES.contains(&c))
            }
            _ => false,
        }
    }

    /// The wait Graph named, if any.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            ApiError::Status {
                retry_after: Some(s),
                ..
            } => Some(Duration::from_secs(*s)),
            _ => None,
        }
    }
}

/// What the user is told when a reply falls outside the 24-hour window
/// (also the ledger's reason).
pub(crate) const OUTSIDE_WINDOW_TEXT: &str = "WhatsApp refused the message: more than 24 hours have \
     passed since the user last wrote, so the customer service window is closed (Graph error \
     131047). Free-form replies are only allowed within 24 hours of the user's last message: \
     the user must write to the bot first; starting a conversation needs an approved message \
     template, which Talaria does not send";

/// Maps a failed call to what the gateway's ledger understands. `wait` is
/// the wait to report for a rate limit that named none.
pub(crate) fn classify(e: &ApiError, wait: Duration) -> SendError {
    match e {
        _ if e.code() == Some(OUTSIDE_WINDOW) => {
            SendError::Rejected(format!("{OUTSIDE_WINDOW_TEXT} ({e})"))
        }
        // An expired token is the operator's to fix; the reply stays owed
        // meanwhile instead of being spent on attempts that cannot pass.
        _ if e.code() == Some(BAD_TOKEN) => SendError::Unavailable(format!(
            "WhatsApp Cloud: the access token is invalid or expired; replace \
             WHATSAPP_CLOUD_TOKEN ({e})"
        )),
        _ if e.is_rate_limit() => SendError::RateLimited(e.retry_after().unwrap_or(wait)),
        ApiError::Status { status, .. } if *status >= 500 => SendError::Transient(e.to_string()),
        ApiError::Status { .. } => SendError::Rejected(e.to_string()),
        ApiError::Connect(m) => SendError::Unavailable(format!("cannot connect to Graph: {m}")),
        ApiError::Timeout(m) | ApiError::Other(m) => SendError::Ambiguous(m.clone()),
    }
}

/// A client bound to one number's `/messages` endpoint and token.
#[derive(Clone)]
pub(crate) struct Api {
    client: reqwest::Client,
    /// `{graph_base}/{api_version}/{phone_number_id}/messages`.
    messages_url: String,
    token: String,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("messages_url", &self.messages_url)
            .finish_non_exhaustive()
    }
}

/// Graph's error envelope.
#[derive(Deserialize)]
struct Envelope {
    error: GraphError,
}

#[derive(Deserialize)]
struct GraphError {
    #[serde(default)]
    message: String,
    #[serde(default)]
    code: Option<i64>,
    #[serde(default)]
    error_subcode: Option<i64>,
    #[serde(default)]
    error_data: Option<Value>,
    #[serde(default)]
    fbtrace_id: Option<String>,
}

impl Api {
    pub(crate) fn new(messages_url: String, token: &str) -> Result<Api, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.without_url().to_string())?;
        Ok(Api {
            client,
            messages_url,
            token: token.to_owned(),
        })
    }

    /// `POST .../messages` with `body`; Graph's JSON answer.
    pub(crate) async fn post(&self, body: &Value, timeout: Duration) -> Result<Value, ApiError> {
        let response = self
            .client
            .post(&self.messages_url)
            .header(AUTHORIZATION, format!("Bearer {}", self.token))
            .json(body)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| self.network_error(e))?;
        let status = response.status().as_u16();
        let retry_after = retry_after(response.headers());
        let body = response.bytes().await.map_err(|e| self.network_error(e))?;
        if (200..300).contains(&status) {
            // A success status with a garbled body may still mean the
            // message went out: ambiguous, never retried as transient.
            return serde_json::from_slice(&body).map_err(|e| {
                ApiError::Other(format!("HTTP {status} with an unreadable body: {e}"))
            });
        }
        let (code, message, trace) = match serde_json::from_slice::<Envelope>(&body) {
            Ok(Envelope { error }) => {
                let details = error
                    .error_data
                    .as_ref()
                    .and_then(|d| d.get("details"))
                    .and_then(Value::as_str)
                    .filter(|d| !d.is_empty() && *d != error.message);
                let mut message = match details {
                    Some(d) if !error.message.is_empty() => format!("{} ({d})", error.message),
                    Some(d) => d.to_owned(),
                    None => error.message,
                };
                if let Some(sub) = error.error_subcode {
                    message.push_str(&format!(" [subcode {sub}]"));
                }
                (error.code, message, error.fbtrace_id)
            }
            Err(_) => (None, format!("HTTP {status}"), None),
        };
        Err(ApiError::Status {
            status,
            code,
            message: self.redact(&message),
            trace,
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

/// `Retry-After` in whole seconds (Graph rarely sends one; proxies do).
fn retry_after(headers: &HeaderMap) -> Option<u64> {
    crate::net::header_secs(headers, RETRY_AFTER.as_str())
}

/// The id of the sent message in Graph's answer (`messages[0].id`).
pub(crate) fn sent_id(answer: &Value) -> Option<String> {
    answer
        .get("messages")
        .and_then(|m| m.get(0))
        .and_then(|m| m.get("id"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16, code: Option<i64>) -> ApiError {
        ApiError::Status {
            status,
            code,
            message: "m".into(),
            trace: Some("Atrace".into()),
            retry_after: None,
        }
    }

    #[test]
    fn graph_errors_are_classified() {
        let wait = Duration::from_millis(5);
        let window = classify(&status(400, Some(OUTSIDE_WINDOW)), wait);
        assert!(
            matches!(&window, SendError::Rejected(m) if m.contains("24 hours") && m.contains("template")),
            "{window:?}"
        );
        for code in RATE_LIMIT_CODES {
            assert_eq!(
                classify(&status(400, Some(code)), wait),
                SendError::RateLimited(wait)
            );
        }
        assert_eq!(
            classify(&status(429, None), wait),
            SendError::RateLimited(wait)
        );
        let hinted = ApiError::Status {
            status: 429,
            code: None,
            message: "slow down".into(),
            trace: None,
            retry_after: Some(7),
        };
        assert_eq!(
            classify(&hinted, wait),
            SendError::RateLimited(Duration::from_secs(7))
        );
        assert!(matches!(
            classify(&status(401, Some(BAD_TOKEN)), wait),
            SendError::Unavailable(m) if m.contains("WHATSAPP_CLOUD_TOKEN")
        ));
        assert!(matches!(
            classify(&status(500, Some(1)), wait),
            SendError::Transient(_)
        ));
        assert!(matches!(
            classify(&status(503, None), wait),
            SendError::Transient(_)
        ));
        for s in [400, 403, 404] {
            assert!(matches!(
                classify(&status(s, Some(100)), wait),
                SendError::Rejected(m) if m.contains("Atrace")
            ));
        }
        assert!(matches!(
            classify(&ApiError::Connect("x".into()), wait),
            SendError::Unavailable(_)
        ));
        assert!(matches!(
            classify(&ApiError::Timeout("x".into()), wait),
            SendError::Ambiguous(_)
        ));
    }

    #[test]
    fn the_sent_id_is_read_from_the_answer() {
        let answer = serde_json::json!({"messaging_product": "whatsapp",
            "contacts": [{"input": "1", "wa_id": "1"}], "messages": [{"id": "wamid.OUT"}]});
        assert_eq!(sent_id(&answer).as_deref(), Some("wamid.OUT"));
        assert_eq!(sent_id(&serde_json::json!({})), None);
    }
}
