//! Twilio's REST API: creating a message and reading the account.
//!
//! Requests authenticate with HTTP basic auth (account SID and auth
//! token), which reqwest sends in a header; errors are scrubbed of the
//! token anyway, in case a proxy echoes it back.

use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};
use serde::Deserialize;

/// Twilio's error body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub(crate) struct TwilioError {
    /// Twilio's error code (`21610`, `20003`, ...).
    #[serde(default)]
    pub code: Option<u32>,
    #[serde(default)]
    pub message: String,
    /// A link to the code's documentation.
    #[serde(default)]
    pub more_info: Option<String>,
}

/// What a failed call looked like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApiError {
    /// Twilio answered with an error status.
    Status {
        status: u16,
        error: TwilioError,
        /// Seconds to wait, from `Retry-After`.
        retry_after: Option<u64>,
    },
    /// No connection was made (refused, DNS): nothing was sent.
    Connect(String),
    /// The request timed out; Twilio may have taken it.
    Timeout(String),
    /// Anything else after the request left (reset, unreadable body).
    Other(String),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Status { status, error, .. } => {
                write!(f, "Twilio answered {status}")?;
                if let Some(code) = error.code {
                    write!(f, " (error {code})")?;
                }
                if !error.message.is_empty() {
                    write!(f, ": {}", error.message)?;
                }
                Ok(())
            }
            ApiError::Connect(e) => write!(f, "cannot connect to Twilio: {e}"),
            ApiError::Timeout(e) => write!(f, "the Twilio request timed out: {e}"),
            ApiError::Other(e) => write!(f, "the Twilio request failed: {e}"),
        }
    }
}

/// A created message (`201`), as far as the adapter reads it.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct CreatedMessage {
    pub sid: String,
    #[serde(default)]
    pub status: String,
}

/// A REST client for one account.
#[derive(Clone)]
pub(crate) struct Api {
    client: reqwest::Client,
    base: String,
    account_sid: String,
    auth_token: String,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("base", &self.base)
            .field("account_sid", &self.account_sid)
            .finish_non_exhaustive()
    }
}

impl Api {
    /// `base` is the API root (`https://api.twilio.com`).
    pub(crate) fn new(base: &str, account_sid: &str, auth_token: &str) -> Result<Api, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.without_url().to_string())?;
        Ok(Api {
            client,
            base: base.trim_end_matches('/').to_owned(),
            account_sid: account_sid.to_owned(),
            auth_token: auth_token.to_owned(),
        })
    }

    fn account_url(&self) -> String {
        format!("{}/2010-04-01/Accounts/{}", self.base, self.account_sid)
    }

    /// `POST /2010-04-01/Accounts/{sid}/Messages.json`.
    pub(crate) async fn create_message(
        &self,
        to: &str,
        from: &str,
        body: &str,
        timeout: Duration,
    ) -> Result<CreatedMessage, ApiError> {
        let form = [("To", to), ("From", from), ("Body", body)];
        let request = self
            .client
            .post(format!("{}/Messages.json", self.account_url()))
            .form(&form);
        self.call(request, timeout).await
    }

    /// `GET /2010-04-01/Accounts/{sid}.json`: checks the credentials.
    pub(crate) async fn account(&self, timeout: Duration) -> Result<(), ApiError> {
        let request = self.client.get(format!("{}.json", self.account_url()));
        self.call::<serde_json::Value>(request, timeout)
            .await
            .map(drop)
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let response = request
            .basic_auth(&self.account_sid, Some(&self.auth_token))
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| self.network_error(e))?;
        let status = response.status().as_u16();
        let retry_after = retry_after(response.headers());
        let body = response.bytes().await.map_err(|e| self.network_error(e))?;
        if (200..300).contains(&status) {
            // A success with a garbled body may still have made the
            // message: ambiguous, never retried as transient.
            return serde_json::from_slice(&body).map_err(|e| {
                ApiError::Other(format!("HTTP {status} with an unreadable body: {e}"))
            });
        }
        let mut error: TwilioError = serde_json::from_slice(&body).unwrap_or_default();
        error.message = self.redact(&error.message);
        Err(ApiError::Status {
            status,
            error,
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
        if self.auth_token.is_empty() {
            text.to_owned()
        } else {
            text.replace(&self.auth_token, "<auth token>")
        }
    }
}

/// `Retry-After` in whole seconds (rounded up), when present and sane.
fn retry_after(headers: &HeaderMap) -> Option<u64> {
    crate::net::header_secs(headers, RETRY_AFTER.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn retry_hint() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h), Some(2));
        h.insert(RETRY_AFTER, HeaderValue::from_static("0.3"));
        assert_eq!(retry_after(&h), Some(1));
        h.insert(RETRY_AFTER, HeaderValue::from_static("later"));
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn error_bodies_are_read_and_shown() {
        let body = r#"{"code": 21610, "message": "Attempt to send to unsubscribed recipient", "more_info": "https://www.twilio.com/docs/errors/21610", "status": 400}"#;
        let error: TwilioError = serde_json::from_str(body).unwrap();
        assert_eq!(error.code, Some(21610));
        let e = ApiError::Status {
            status: 400,
            error,
            retry_after: None,
        };
        assert_eq!(
            e.to_string(),
            "Twilio answered 400 (error 21610): Attempt to send to unsubscribed recipient"
        );
    }
}
