//! The WeCom server API a self-built app sends through: the corp access
//! token (`cgi-bin/gettoken`, cached until a minute before it expires),
//! `cgi-bin/message/send`, and temporary media: `cgi-bin/media/upload`
//! (multipart, field `media`) and `cgi-bin/media/get` (the bytes, or a
//! JSON `errcode` body instead of them).
//!
//! WeCom answers HTTP 200 with an `errcode` for nearly every failure, so
//! errors are read from the body. The access token rides in the query
//! string: every error leaving here is built without the URL, so neither
//! the token nor the secret can appear in a log.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Deserialize;
use serde_json::Value;
use talaria_adapter::{Download, DownloadError};
use talaria_core::Secret;
use tokio::sync::Mutex;

/// Error codes the adapter tells apart.
pub(crate) mod code {
    /// The access token is invalid.
    pub(crate) const INVALID_TOKEN: i64 = 40014;
    /// The secret is wrong, or the token no longer matches it.
    pub(crate) const INVALID_CREDENTIAL: i64 = 40001;
    /// The access token expired.
    pub(crate) const TOKEN_EXPIRED: i64 = 42001;
    /// The corp id is wrong.
    pub(crate) const INVALID_CORP_ID: i64 = 40013;
    /// The agent id is wrong.
    pub(crate) const INVALID_AGENT_ID: i64 = 40056;
    /// API calls too frequent.
    pub(crate) const TOO_FREQUENT: i64 = 45009;
    /// Too many messages to one member (per minute, hour or day).
    pub(crate) const TOO_MANY_MESSAGES: i64 = 45033;
    /// The calling server's IP is not on the app's trusted list.
    pub(crate) const IP_NOT_TRUSTED: i64 = 60020;
    /// WeCom is busy.
    pub(crate) const BUSY: i64 = -1;
    /// The media id is unknown (or expired: media live three days).
    pub(crate) const INVALID_MEDIA_ID: i64 = 40007;
}

/// Whether WeCom refused the token used (invalid or expired), so a fresh
/// one may pass.
fn token_refused(code: Option<i64>) -> bool {
    matches!(
        code,
        Some(code::INVALID_TOKEN | code::INVALID_CREDENTIAL | code::TOKEN_EXPIRED)
    )
}

/// How long a whole media transfer may take, body included.
const MEDIA_TIMEOUT: Duration = Duration::from_secs(300);

/// The most of an error body read in place of a file.
const MAX_ERROR_BODY: usize = 4096;

/// Tokens this close to expiry are refreshed before use (the ancestor's
/// margin).
const REFRESH_EARLY: Duration = Duration::from_secs(60);

/// How a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ApiError {
    /// WeCom answered and refused.
    #[error("WeCom refused the request: errcode {errcode} ({errmsg})")]
    Code {
        /// WeCom's error code.
        errcode: i64,
        /// What it said.
        errmsg: String,
    },
    /// Not a WeCom answer (a proxy's error page, a status WeCom never
    /// uses).
    #[error("WeCom answered HTTP {0}")]
    Status(u16),
    /// No connection was made: nothing was sent.
    #[error("cannot reach WeCom: {0}")]
    Connect(String),
    /// The request timed out after it was sent.
    #[error("WeCom did not answer in time: {0}")]
    Timeout(String),
    /// Anything else after the request left.
    #[error("the WeCom request failed: {0}")]
    Other(String),
}

impl ApiError {
    /// WeCom's error code, when it gave one.
    pub(crate) fn errcode(&self) -> Option<i64> {
        match self {
            ApiError::Code { errcode, .. } => Some(*errcode),
            _ => None,
        }
    }

    fn from_reqwest(e: reqwest::Error) -> ApiError {
        let (connect, timeout) = (e.is_connect(), e.is_timeout());
        let text = e.without_url().to_string();
        if connect {
            ApiError::Connect(text)
        } else if timeout {
            ApiError::Timeout(text)
        } else {
            ApiError::Other(text)
        }
    }
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    errcode: i64,
    #[serde(default)]
    errmsg: String,
    #[serde(default)]
    access_token: Option<String>,
    #[serde(default)]
    expires_in: Option<u64>,
    #[serde(default)]
    msgid: Option<String>,
    #[serde(default)]
    invaliduser: Option<String>,
    #[serde(default)]
    media_id: Option<String>,
}

/// A cached access token.
struct Cached {
    token: Secret,
    refresh_at: Instant,
}

/// The API client of one app (see the module docs).
pub(crate) struct Api {
    client: reqwest::Client,
    base: String,
    corp_id: String,
    secret: Secret,
    timeout: Duration,
    token: Mutex<Option<Cached>>,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("base", &self.base)
            .field("corp_id", &self.corp_id)
            .finish_non_exhaustive()
    }
}

/// What a successful send returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sent {
    /// WeCom's id of the message.
    pub(crate) msgid: Option<String>,
    /// Recipients WeCom could not deliver to (`a|b`), when any.
    pub(crate) invalid_user: Option<String>,
}

impl Api {
    pub(crate) fn new(
        base: &str,
        corp_id: &str,
        secret: &Secret,
        timeout: Duration,
    ) -> Result<Api, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.without_url().to_string())?;
        Ok(Api {
            client,
            base: base.trim_end_matches('/').to_owned(),
            corp_id: corp_id.to_owned(),
            secret: secret.clone(),
            timeout,
            token: Mutex::new(None),
        })
    }

    /// The corp the app belongs to.
    pub(crate) fn corp_id(&self) -> &str {
        &self.corp_id
    }

    /// One call, WeCom's `errcode` read from the body.
    async fn call(&self, request: reqwest::RequestBuilder) -> Result<Envelope, ApiError> {
        self.call_within(request, self.timeout).await
    }

    /// [`Api::call`] within `timeout`.
    async fn call_within(
        &self,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<Envelope, ApiError> {
        let response = request
            .timeout(timeout)
            .send()
            .await
            .map_err(ApiError::from_reqwest)?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(ApiError::from_reqwest)?;
        let envelope: Envelope = match serde_json::from_slice(&body) {
            Ok(e) => e,
            Err(_) => return Err(ApiError::Status(status)),
        };
        if envelope.errcode != 0 {
            return Err(ApiError::Code {
                errcode: envelope.errcode,
                errmsg: envelope.errmsg.chars().take(200).collect(),
            });
        }
        if status != 200 {
            return Err(ApiError::Status(status));
        }
        Ok(envelope)
    }

    /// A valid access token: the cached one, or a new one when there is
    /// none, it is about to expire, or `fresh` asks (WeCom said the one
    /// used was invalid).
    pub(crate) async fn token(&self, fresh: bool) -> Result<Secret, ApiError> {
        let mut cached = self.token.lock().await;
        if !fresh
            && let Some(c) = cached.as_ref()
            && Instant::now() < c.refresh_at
        {
            return Ok(c.token.clone());
        }
        let request = self
            .client
            .get(format!("{}/cgi-bin/gettoken", self.base))
            .query(&[
                ("corpid", self.corp_id.as_str()),
                ("corpsecret", self.secret.expose()),
            ]);
        let answer = self.call(request).await?;
        let token = answer
            .access_token
            .filter(|t| !t.is_empty())
            .ok_or_else(|| ApiError::Other("gettoken returned no access_token".to_owned()))?;
        let lifetime = Duration::from_secs(answer.expires_in.unwrap_or(7200));
        let token = Secret::new(token);
        *cached = Some(Cached {
            token: token.clone(),
            refresh_at: Instant::now() + lifetime.saturating_sub(REFRESH_EARLY),
        });
        Ok(token)
    }

    /// `POST cgi-bin/message/send` with `body`; an invalid or expired
    /// token is refreshed and the send tried once more.
    pub(crate) async fn send(&self, body: &Value) -> Result<Sent, ApiError> {
        let mut fresh = false;
        loop {
            let token = self.token(fresh).await?;
            let request = self
                .client
                .post(format!("{}/cgi-bin/message/send", self.base))
                .query(&[("access_token", token.expose())])
                .json(body);
            match self.call(request).await {
                Ok(answer) => {
                    return Ok(Sent {
                        msgid: answer.msgid,
                        invalid_user: answer.invaliduser.filter(|u| !u.is_empty()),
                    });
                }
                Err(e) if !fresh && token_refused(e.errcode()) => {
                    tracing::info!("the WeCom access token was refused; fetching a new one");
                    fresh = true;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// `POST cgi-bin/media/upload?type=<kind>` with the file at `path`
    /// streamed as the multipart field `media`; WeCom's media id. The file
    /// is opened again for the retry after a refused token.
    pub(crate) async fn upload(
        &self,
        kind: &str,
        path: &std::path::Path,
        name: &str,
        mime: &str,
    ) -> Result<String, ApiError> {
        let mut fresh = false;
        loop {
            let token = self.token(fresh).await?;
            let part = crate::http::file_part(path, name, mime)
                .await
                .map_err(|e| ApiError::Other(format!("cannot read {name}: {e}")))?;
            let request = self
                .client
                .post(format!("{}/cgi-bin/media/upload", self.base))
                .query(&[("access_token", token.expose()), ("type", kind)])
                .multipart(reqwest::multipart::Form::new().part("media", part));
            // A large file on a slow link takes longer than a message.
            match self.call_within(request, MEDIA_TIMEOUT).await {
                Ok(answer) => {
                    return answer.media_id.filter(|m| !m.is_empty()).ok_or_else(|| {
                        ApiError::Other("media/upload returned no media_id".into())
                    });
                }
                Err(e) if !fresh && token_refused(e.errcode()) => {
                    tracing::info!("the WeCom access token was refused; fetching a new one");
                    fresh = true;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// `GET cgi-bin/media/get?media_id=`: the file, streamed. WeCom answers
    /// a refusal with a JSON `errcode` body in place of the bytes; that is
    /// read (bounded) and reported, after one retry with a fresh token
    /// when the token was what it refused.
    pub(crate) async fn media(&self, media_id: &str) -> Result<Download, DownloadError> {
        let mut fresh = false;
        loop {
            let token = self.token(fresh).await.map_err(|e| match e {
                ApiError::Code { .. } => DownloadError::Gone(e.to_string()),
                _ => DownloadError::Unavailable(e.to_string()),
            })?;
            let response = self
                .client
                .get(format!("{}/cgi-bin/media/get", self.base))
                .query(&[("access_token", token.expose()), ("media_id", media_id)])
                .timeout(MEDIA_TIMEOUT)
                .send()
                .await
                .map_err(|e| DownloadError::Unavailable(ApiError::from_reqwest(e).to_string()))?;
            let status = response.status().as_u16();
            if !(200..300).contains(&status) {
                let why = ApiError::Status(status).to_string();
                return Err(match status {
                    403 | 404 | 410 => DownloadError::Gone(why),
                    _ => DownloadError::Unavailable(why),
                });
            }
            let textual = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(|t| t.to_ascii_lowercase())
                .is_some_and(|t| t.starts_with("application/json") || t.starts_with("text/"));
            if !textual {
                let length = response.content_length();
                let body = response.bytes_stream().map(|chunk| {
                    chunk.map_err(|e| std::io::Error::other(ApiError::from_reqwest(e).to_string()))
                });
                return Ok(Download {
                    reader: Box::pin(tokio_util::io::StreamReader::new(body)),
                    length,
                });
            }
            let refusal = read_refusal(response).await;
            match refusal {
                ApiError::Code { errcode, .. } if !fresh && token_refused(Some(errcode)) => {
                    tracing::info!("the WeCom access token was refused; fetching a new one");
                    fresh = true;
                }
                ApiError::Code {
                    errcode: code::INVALID_MEDIA_ID,
                    ..
                } => return Err(DownloadError::Gone(refusal.to_string())),
                e => return Err(DownloadError::Unavailable(e.to_string())),
            }
        }
    }
}

/// The `errcode` of a JSON body sent in place of a file, reading no more
/// than [`MAX_ERROR_BODY`] bytes of it.
async fn read_refusal(mut response: reqwest::Response) -> ApiError {
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => break,
            Err(e) => return ApiError::from_reqwest(e),
        }
    }
    body.truncate(MAX_ERROR_BODY);
    match serde_json::from_slice::<Envelope>(&body) {
        Ok(e) if e.errcode != 0 => ApiError::Code {
            errcode: e.errcode,
            errmsg: e.errmsg.chars().take(200).collect(),
        },
        _ => ApiError::Other("media/get answered text instead of the file".into()),
    }
}
