//! The Open Platform's REST calls: the tenant access token and every call
//! made with it, and what their errors mean to the ledger.
//!
//! Every answer is `{code, msg, data}`; `code` 0 is success. The token is
//! cached until ten minutes before it expires, and fetched again once
//! when a call says it is invalid.

use std::fmt;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use talaria_adapter::SendError;
use talaria_core::Secret;
use tokio::sync::Mutex;

/// The token is renewed this long before Feishu says it expires.
const REFRESH_EARLY: Duration = Duration::from_secs(600);

/// Codes that mean the tenant access token is invalid or expired.
const TOKEN_INVALID: &[i64] = &[99_991_663, 99_991_661, 99_991_668];

/// Feishu's rate-limit code (with HTTP 429, or 400 on older APIs).
pub(crate) const RATE_LIMITED: i64 = 99_991_400;

/// The message replied to was withdrawn.
pub(crate) const WITHDRAWN: i64 = 230_011;
/// The message replied to does not exist.
pub(crate) const NOT_FOUND: i64 = 231_003;
/// The comment thread takes no replies (whole or solved comment).
pub(crate) const NO_THREAD_REPLY: i64 = 1_069_302;

/// A failed call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApiError {
    /// Feishu answered with an error code (or a bad status).
    Refused {
        status: u16,
        code: i64,
        msg: String,
        /// `x-ogw-ratelimit-reset`, when given.
        reset: Option<Duration>,
    },
    /// No connection was made: nothing was sent.
    Connect(String),
    /// The request timed out after it was sent: it may have arrived.
    Timeout(String),
    /// Anything else after the request left.
    Other(String),
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiError::Refused {
                status, code, msg, ..
            } => write!(f, "Feishu answered {status} (code {code}): {msg}"),
            ApiError::Connect(e) => write!(f, "cannot connect to Feishu: {e}"),
            ApiError::Timeout(e) => write!(f, "a Feishu request timed out: {e}"),
            ApiError::Other(e) => write!(f, "a Feishu request failed: {e}"),
        }
    }
}

impl ApiError {
    /// Feishu's own code, when it answered.
    pub(crate) fn code(&self) -> Option<i64> {
        match self {
            ApiError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether this is a rate limit, and how long Feishu asked to wait.
    pub(crate) fn rate_limit(&self) -> Option<Option<Duration>> {
        match self {
            ApiError::Refused {
                status,
                code,
                reset,
                ..
            } if *status == 429 || *code == RATE_LIMITED => Some(*reset),
            _ => None,
        }
    }

    /// What the ledger makes of it.
    pub(crate) fn classify(&self, wait: Duration) -> SendError {
        match self {
            ApiError::Refused { .. } if self.rate_limit().is_some() => SendError::RateLimited(wait),
            ApiError::Refused { status, .. } if *status >= 500 => {
                SendError::Transient(self.to_string())
            }
            ApiError::Refused { code, .. } if TOKEN_INVALID.contains(code) => {
                SendError::Unavailable(self.to_string())
            }
            ApiError::Refused { .. } => SendError::Rejected(self.to_string()),
            ApiError::Connect(e) => SendError::Unavailable(e.clone()),
            ApiError::Timeout(e) => SendError::Ambiguous(e.clone()),
            ApiError::Other(e) => SendError::Transient(e.clone()),
        }
    }
}

struct Token {
    value: Secret,
    renew_at: Instant,
}

/// The client of one base URL and one app.
pub(crate) struct Api {
    http: reqwest::Client,
    base: String,
    app_id: String,
    app_secret: Secret,
    token: Mutex<Option<Token>>,
    timeout: Duration,
}

impl fmt::Debug for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Api")
            .field("base", &self.base)
            .field("app_id", &self.app_id)
            .finish_non_exhaustive()
    }
}

impl Api {
    pub(crate) fn new(
        base: &str,
        app_id: &str,
        app_secret: Secret,
        timeout: Duration,
    ) -> Result<Api, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Api {
            http,
            base: base.trim_end_matches('/').to_owned(),
            app_id: app_id.to_owned(),
            app_secret,
            token: Mutex::new(None),
            timeout,
        })
    }

    /// The cached token, or a fresh one.
    async fn token(&self, fresh: bool) -> Result<Secret, ApiError> {
        let mut slot = self.token.lock().await;
        if !fresh && let Some(t) = slot.as_ref().filter(|t| Instant::now() < t.renew_at) {
            return Ok(t.value.clone());
        }
        let body = json!({"app_id": self.app_id, "app_secret": self.app_secret.expose()});
        let answer = self
            .raw(
                Method::POST,
                "/open-apis/auth/v3/tenant_access_token/internal",
                &[],
                Some(&body),
                None,
            )
            .await?;
        let value = answer
            .get("tenant_access_token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                ApiError::Other("the token answer holds no tenant_access_token".into())
            })?;
        let expire = answer.get("expire").and_then(Value::as_u64).unwrap_or(7200);
        let life = Duration::from_secs(expire).saturating_sub(REFRESH_EARLY);
        let token = Secret::new(value);
        *slot = Some(Token {
            value: token.clone(),
            renew_at: Instant::now() + life.max(Duration::from_secs(30)),
        });
        Ok(token)
    }

    /// One call with the tenant token; an invalid-token answer fetches a
    /// new token and tries once more.
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<Value, ApiError> {
        let token = self.token(false).await?;
        match self
            .raw(method.clone(), path, query, body, Some(&token))
            .await
        {
            Err(e) if e.code().is_some_and(|c| TOKEN_INVALID.contains(&c)) => {
                tracing::info!("the Feishu tenant access token was refused; fetching a new one");
                let token = self.token(true).await?;
                self.raw(method, path, query, body, Some(&token)).await
            }
            other => other,
        }
    }

    async fn raw(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&Value>,
        token: Option<&Secret>,
    ) -> Result<Value, ApiError> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .timeout(self.timeout);
        if !query.is_empty() {
            request = request.query(query);
        }
        if let Some(token) = token {
            request = request.bearer_auth(token.expose());
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let answer = request.send().await.map_err(|e| {
            let text = self.scrub(&e.to_string());
            if e.is_connect() {
                ApiError::Connect(text)
            } else if e.is_timeout() {
                ApiError::Timeout(text)
            } else {
                ApiError::Other(text)
            }
        })?;
        let status = answer.status().as_u16();
        let reset = answer
            .headers()
            .get("x-ogw-ratelimit-reset")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let text = answer
            .text()
            .await
            .map_err(|e| ApiError::Other(self.scrub(&e.to_string())))?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let code = value.get("code").and_then(Value::as_i64);
        match code {
            Some(0) if status < 400 => Ok(value.get("data").cloned().unwrap_or_else(|| {
                // The token call answers at the top level.
                value.clone()
            })),
            _ => Err(ApiError::Refused {
                status,
                code: code.unwrap_or(-1),
                msg: self.scrub(
                    value
                        .get("msg")
                        .and_then(Value::as_str)
                        .unwrap_or("no message"),
                ),
                reset,
            }),
        }
    }

    /// A POST without the tenant token, answered with the whole JSON body
    /// (the long connection's endpoint call, whose errors are codes in it).
    pub(crate) async fn post_plain(&self, path: &str, body: &Value) -> Result<Value, String> {
        let answer = self
            .http
            .post(format!("{}{path}", self.base))
            .header("locale", "zh")
            .timeout(self.timeout)
            .json(body)
            .send()
            .await
            .map_err(|e| self.scrub(&format!("cannot reach Feishu: {e}")))?;
        let status = answer.status().as_u16();
        let text = answer
            .text()
            .await
            .map_err(|e| self.scrub(&format!("Feishu's answer broke off: {e}")))?;
        serde_json::from_str(&text)
            .map_err(|_| format!("Feishu answered {status} with a body that is not JSON"))
    }

    /// Removes the app secret from text a server may have echoed.
    fn scrub(&self, text: &str) -> String {
        let secret = self.app_secret.expose();
        if secret.is_empty() {
            text.to_owned()
        } else {
            text.replace(secret, "***")
        }
    }
}
