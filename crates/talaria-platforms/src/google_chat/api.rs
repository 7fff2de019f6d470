//! The Chat API calls the adapter makes, as the app.
//!
//! An access token comes from the service account's JWT bearer grant
//! (`POST token_uri`, `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer`)
//! and is kept until a minute before it expires. Messages go to
//! `POST {api_base}/v1/{space}/messages` with a client-assigned
//! `messageId`, so a re-send of a message Chat already created is refused
//! as `ALREADY_EXISTS` (409) and counted as sent. Chat answers errors as
//! `{"error": {"code", "message", "status"}}`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::header::AUTHORIZATION;
use serde::Deserialize;
use serde_json::Value;
use talaria_adapter::SendError;
use tokio::sync::Mutex;

use super::jwt::ServiceAccount;
use crate::http::{Answer, Failure, Http, HttpError, Service};

/// How errors name the Chat API.
pub(crate) const CHAT: Service = Service {
    name: "the Google Chat API",
    request: "the Google Chat API request",
    code_label: None,
};

/// A failed call.
pub(crate) type ApiError = HttpError;

/// A token is renewed this long before Google says it expires.
const RENEW_BEFORE: Duration = Duration::from_secs(60);

/// Maps a failed call to what the gateway's ledger understands.
pub(crate) fn classify(e: &ApiError) -> SendError {
    match &e.failure {
        Failure::Status { status: 429, .. } => {
            SendError::RateLimited(e.retry_after().unwrap_or(Duration::from_secs(1)))
        }
        Failure::Status { status: 401, .. } => SendError::Unavailable(format!(
            "Google refused the app's credentials; check GOOGLE_CHAT_SERVICE_ACCOUNT_JSON ({e})"
        )),
        Failure::Status { status, .. } if *status >= 500 => SendError::Transient(e.to_string()),
        // 403: the app was removed from the space, or may not post there;
        // 404: the space or thread is gone.
        Failure::Status { .. } => SendError::Rejected(e.to_string()),
        Failure::Connect(m) => SendError::Unavailable(format!("cannot connect to Google: {m}")),
        Failure::Timeout(_) | Failure::Other(_) => e.clone().classify(),
    }
}

#[derive(Deserialize)]
struct ErrorEnvelope {
    error: ErrorBody,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: String,
    #[serde(default)]
    status: String,
}

#[derive(Deserialize)]
struct Token {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

/// How a create ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Created {
    /// The message's resource name.
    New(Option<String>),
    /// Chat has a message with this id already: an earlier attempt went
    /// out.
    Existing,
}

/// A client of the Chat API as one app.
pub(crate) struct Api {
    http: Http,
    api_base: String,
    account: Arc<ServiceAccount>,
    token: Mutex<Option<(String, Instant)>>,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("api_base", &self.api_base)
            .field("account", &self.account)
            .finish_non_exhaustive()
    }
}

impl Api {
    pub(crate) fn new(api_base: String, account: Arc<ServiceAccount>) -> Result<Api, String> {
        Ok(Api {
            http: Http::new(CHAT)?,
            api_base,
            account,
            token: Mutex::new(None),
        })
    }

    fn refusal(&self, answer: &Answer) -> ApiError {
        let (code, text) = match serde_json::from_slice::<ErrorEnvelope>(&answer.body) {
            Ok(e) => (
                Some(e.error.status).filter(|s| !s.is_empty()),
                e.error.message,
            ),
            Err(_) => (
                None,
                String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)])
                    .trim()
                    .to_owned(),
            ),
        };
        self.http
            .refused(answer.status, code, &text, answer.retry_after())
    }

    /// A valid access token, fetched when there is none or it is old.
    async fn token(&self, timeout: Duration) -> Result<String, ApiError> {
        let mut held = self.token.lock().await;
        if let Some((token, until)) = held.as_ref()
            && Instant::now() < *until
        {
            return Ok(token.clone());
        }
        let assertion = self
            .account
            .assertion()
            .map_err(|e| self.http.fail(Failure::Other(e)))?;
        let request = self.http.client().post(&self.account.token_uri).form(&[
            ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
            ("assertion", assertion.as_str()),
        ]);
        let answer = self.http.send(request, timeout).await?;
        if !answer.is_success() {
            // Token endpoint errors are OAuth's `{error, error_description}`.
            let body: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
            let text = format!(
                "the service account's token was refused: {} {}",
                body["error"].as_str().unwrap_or_default(),
                body["error_description"].as_str().unwrap_or_default()
            );
            let status = if answer.status == 400 {
                401
            } else {
                answer.status
            };
            return Err(self.http.refused(status, None, text.trim(), None));
        }
        let token: Token = self.http.decode(&answer)?;
        let life = Duration::from_secs(token.expires_in.unwrap_or(3600));
        let until = Instant::now() + life.saturating_sub(RENEW_BEFORE);
        *held = Some((token.access_token.clone(), until));
        Ok(token.access_token)
    }

    /// Forgets the token (after a 401), so the next call fetches one.
    async fn drop_token(&self) {
        *self.token.lock().await = None;
    }

    /// Creates a message in `space` with the client-assigned `message_id`;
    /// a 401 fetches a new token and tries once more.
    pub(crate) async fn create_message(
        &self,
        space: &str,
        message_id: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<Created, ApiError> {
        let url = format!("{}/v1/{space}/messages", self.api_base);
        for attempt in 0..2 {
            let token = self.token(timeout).await?;
            let request = self
                .http
                .client()
                .post(&url)
                .query(&[
                    ("messageReplyOption", "REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD"),
                    ("messageId", message_id),
                ])
                .header(AUTHORIZATION, format!("Bearer {token}"))
                .json(body);
            let answer = self.http.send(request, timeout).await?;
            match answer.status {
                409 => return Ok(Created::Existing),
                401 if attempt == 0 => {
                    self.drop_token().await;
                    continue;
                }
                _ if answer.is_success() => {
                    let made: Value = self.http.decode(&answer).unwrap_or(Value::Null);
                    return Ok(Created::New(made["name"].as_str().map(str::to_owned)));
                }
                _ => return Err(self.refusal(&answer)),
            }
        }
        Err(self.http.fail(Failure::Other(
            "the Chat API refused two fresh tokens".into(),
        )))
    }

    /// Fetches a token now: the credentials check at startup.
    pub(crate) async fn check(&self, timeout: Duration) -> Result<(), ApiError> {
        self.token(timeout).await.map(|_| ())
    }

    /// The service account the app acts as.
    pub(crate) fn account_email(&self) -> &str {
        &self.account.email
    }
}
