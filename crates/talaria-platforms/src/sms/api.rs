//! Twilio's REST API: creating a message, reading the account, and
//! fetching the media of an inbound MMS.
//!
//! Requests authenticate with HTTP basic auth (account SID and auth
//! token), which reqwest sends in a header; errors are scrubbed of the
//! token anyway, in case a proxy echoes it back.

use std::time::Duration;

use serde::Deserialize;
use talaria_adapter::{Download, DownloadError};
use talaria_core::Secret;

use crate::http::{Http, HttpError, Service};

/// The host Twilio names media at (`MediaUrl{N}`); the configured API
/// base is the only other one trusted with the credentials.
pub(crate) const MEDIA_HOST: &str = "api.twilio.com";

/// How errors name Twilio.
pub(crate) const TWILIO: Service = Service {
    name: "Twilio",
    request: "the Twilio request",
    code_label: Some("error"),
};

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

/// What a failed call looked like; the code is Twilio's.
pub(crate) type ApiError = HttpError;

/// Twilio's numeric error code of a failed call.
pub(crate) fn twilio_code(e: &ApiError) -> Option<u32> {
    e.code().and_then(|c| c.parse().ok())
}

/// A created message (`201`), as far as the adapter reads it.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct CreatedMessage {
    pub sid: String,
    #[serde(default)]
    pub status: String,
}

/// What `GET /Accounts/{sid}.json` says of the account.
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct Account {
    #[serde(default)]
    pub sid: String,
    #[serde(default)]
    pub friendly_name: String,
    /// `active`, `suspended` or `closed`.
    #[serde(default)]
    pub status: String,
}

/// A REST client for one account.
#[derive(Debug, Clone)]
pub(crate) struct Api {
    http: Http,
    base: String,
    account_sid: String,
    auth_token: Secret,
}

impl Api {
    /// `base` is the API root (`https://api.twilio.com`).
    pub(crate) fn new(base: &str, account_sid: &str, auth_token: &Secret) -> Result<Api, String> {
        Ok(Api {
            http: Http::new(TWILIO)?.hiding(auth_token, "<auth token>"),
            base: base.trim_end_matches('/').to_owned(),
            account_sid: account_sid.to_owned(),
            auth_token: auth_token.clone(),
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
            .http
            .client()
            .post(format!("{}/Messages.json", self.account_url()))
            .form(&form);
        self.call(request, timeout).await
    }

    /// Whether `url` (from an inbound webhook) is where Twilio keeps
    /// media: `https://api.twilio.com`, or the configured API base (same
    /// scheme, host and port). The credentials go with the request, so
    /// nowhere else is fetched.
    pub(crate) fn is_media_address(&self, url: &reqwest::Url) -> bool {
        let ours = reqwest::Url::parse(&self.base).ok().is_some_and(|base| {
            base.scheme() == url.scheme()
                && base.host_str() == url.host_str()
                && base.port_or_known_default() == url.port_or_known_default()
        });
        let twilio = url.scheme() == "https" && url.host_str() == Some(MEDIA_HOST);
        ours || twilio
    }

    /// `GET {MediaUrl}` with the account's basic auth (needed when the
    /// account enforces HTTP auth on media), streamed. Twilio answers with
    /// a redirect to a short-lived URL on its CDN, which is followed
    /// (reqwest drops the credentials when the host changes).
    pub(crate) async fn fetch_media(
        &self,
        url: reqwest::Url,
        timeout: Duration,
    ) -> Result<Download, DownloadError> {
        let request = self
            .http
            .client()
            .get(url)
            .basic_auth(&self.account_sid, Some(self.auth_token.expose()));
        self.http.download(request, timeout).await
    }

    /// `GET /2010-04-01/Accounts/{sid}.json`: checks the credentials and
    /// says whose they are.
    pub(crate) async fn account(&self, timeout: Duration) -> Result<Account, ApiError> {
        let request = self
            .http
            .client()
            .get(format!("{}.json", self.account_url()));
        self.call::<Account>(request, timeout).await
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let request = request.basic_auth(&self.account_sid, Some(self.auth_token.expose()));
        let answer = self.http.send(request, timeout).await?;
        if answer.is_success() {
            return self.http.decode(&answer);
        }
        let error: TwilioError = serde_json::from_slice(&answer.body).unwrap_or_default();
        Err(self.http.refused(
            answer.status,
            error.code.map(|c| c.to_string()),
            &error.message,
            answer.retry_after(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{Failure, retry_after};
    use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};

    #[test]
    fn retry_hint() {
        let secs = |h: &HeaderMap| retry_after(h).map(|d| d.as_secs());
        let mut h = HeaderMap::new();
        assert_eq!(secs(&h), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static("2"));
        assert_eq!(secs(&h), Some(2));
        h.insert(RETRY_AFTER, HeaderValue::from_static("0.3"));
        assert_eq!(secs(&h), Some(1));
        h.insert(RETRY_AFTER, HeaderValue::from_static("later"));
        assert_eq!(secs(&h), None);
    }

    #[test]
    fn error_bodies_are_read_and_shown() {
        let body = r#"{"code": 21610, "message": "Attempt to send to unsubscribed recipient", "more_info": "https://www.twilio.com/docs/errors/21610", "status": 400}"#;
        let error: TwilioError = serde_json::from_str(body).unwrap();
        assert_eq!(error.code, Some(21610));
        let e = HttpError::new(
            TWILIO,
            Failure::Status {
                status: 400,
                code: error.code.map(|c| c.to_string()),
                message: error.message,
                retry_after: None,
            },
        );
        assert_eq!(
            e.to_string(),
            "Twilio answered 400 (error 21610): Attempt to send to unsubscribed recipient"
        );
    }
}
