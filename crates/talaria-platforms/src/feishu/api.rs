//! The Open Platform's REST calls: the tenant access token and every call
//! made with it, and what their errors mean to the ledger.
//!
//! Every answer is `{code, msg, data}`; `code` 0 is success. The token is
//! cached until ten minutes before it expires, and fetched again once
//! when a call says it is invalid.

use std::fmt;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use talaria_adapter::SendError;
use talaria_core::Secret;
use tokio::sync::Mutex;

/// How much of an error answer to a download is read.
const ERROR_BODY_BYTES: usize = 16 * 1024;

/// The token is renewed this long before Feishu says it expires.
const REFRESH_EARLY: Duration = Duration::from_secs(600);

/// Codes that mean the tenant access token is invalid or expired.
pub(crate) const TOKEN_INVALID: &[i64] = &[99_991_663, 99_991_661, 99_991_668];

/// Feishu's rate-limit code (with HTTP 429, or 400 on older APIs).
pub(crate) const RATE_LIMITED: i64 = 99_991_400;

/// The messaging API's own frequency limit ("This operation triggers the
/// frequency limit"): five messages a second to one chat, five patches a
/// second of one card.
pub(crate) const MESSAGE_RATE_LIMITED: i64 = 230_020;

/// The message replied to was withdrawn.
pub(crate) const WITHDRAWN: i64 = 230_011;
/// The message replied to does not exist.
pub(crate) const NOT_FOUND: i64 = 231_003;
/// The comment thread takes no replies (whole or solved comment).
pub(crate) const NO_THREAD_REPLY: i64 = 1_069_302;

/// A failed call to the Open Platform (re-exported as
/// `FeishuApiError` for the `feishu_*` tools).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// Feishu answered with an error code (or a bad status).
    Refused {
        /// The HTTP status.
        status: u16,
        /// Feishu's `code` (-1 when the answer had none).
        code: i64,
        /// Feishu's `msg`, scrubbed of the app secret.
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
    pub fn code(&self) -> Option<i64> {
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
            } if *status == 429 || *code == RATE_LIMITED || *code == MESSAGE_RATE_LIMITED => {
                Some(*reset)
            }
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

    /// The one client of this app in this process: the adapter and the
    /// `feishu_*` tools share it, so they share one tenant token (Feishu
    /// hands out a new one per request otherwise, and each is a call).
    pub(crate) fn shared(
        base: &str,
        app_id: &str,
        app_secret: Secret,
        timeout: Duration,
    ) -> Result<Arc<Api>, String> {
        static CLIENTS: StdMutex<Vec<Weak<Api>>> = StdMutex::new(Vec::new());
        let mut clients = CLIENTS.lock().unwrap_or_else(|p| p.into_inner());
        // Only live clients are kept: one per app configured, at most.
        clients.retain(|c| c.strong_count() > 0);
        let base = base.trim_end_matches('/');
        let found = clients.iter().filter_map(Weak::upgrade).find(|c| {
            c.base == base
                && c.app_id == app_id
                && c.timeout == timeout
                && c.app_secret.expose() == app_secret.expose()
        });
        if let Some(found) = found {
            return Ok(found);
        }
        let api = Arc::new(Api::new(base, app_id, app_secret, timeout)?);
        clients.push(Arc::downgrade(&api));
        Ok(api)
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
        let mut request = self.request(method, path, query, token);
        if let Some(body) = body {
            request = request.json(body);
        }
        let answer = request.send().await.map_err(|e| self.transport(&e))?;
        self.read_answer(answer).await
    }

    /// A request to `path` with the call timeout and, when given, the token.
    fn request(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        token: Option<&Secret>,
    ) -> reqwest::RequestBuilder {
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
        request
    }

    /// What a transport failure means: nothing sent, maybe sent, or broken.
    fn transport(&self, e: &reqwest::Error) -> ApiError {
        let text = self.scrub(&e.to_string());
        if e.is_connect() {
            ApiError::Connect(text)
        } else if e.is_timeout() {
            ApiError::Timeout(text)
        } else {
            ApiError::Other(text)
        }
    }

    /// Reads a `{code, msg, data}` answer: `data` on code 0, else the
    /// refusal.
    async fn read_answer(&self, answer: reqwest::Response) -> Result<Value, ApiError> {
        let status = answer.status().as_u16();
        let reset = reset_of(&answer);
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
            _ => Err(self.refusal(status, &value, reset)),
        }
    }

    fn refusal(&self, status: u16, value: &Value, reset: Option<Duration>) -> ApiError {
        ApiError::Refused {
            status,
            code: value.get("code").and_then(Value::as_i64).unwrap_or(-1),
            msg: self.scrub(
                value
                    .get("msg")
                    .and_then(Value::as_str)
                    .unwrap_or("no message"),
            ),
            reset,
        }
    }

    /// Opens a binary resource (`GET`, tenant token): the answer is handed
    /// back unread so its body can be streamed. Feishu answers a refusal
    /// in JSON, which is read (a bounded piece of it) into the error.
    pub(crate) async fn fetch(
        &self,
        path: &str,
        query: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<reqwest::Response, ApiError> {
        let mut fresh = false;
        loop {
            let token = self.token(fresh).await?;
            let answer = self
                .request(Method::GET, path, query, Some(&token))
                .timeout(timeout)
                .send()
                .await
                .map_err(|e| self.transport(&e))?;
            let status = answer.status().as_u16();
            let json = answer
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("application/json"));
            if status < 400 && !json {
                return Ok(answer);
            }
            let reset = reset_of(&answer);
            let head = read_head(answer, ERROR_BODY_BYTES).await;
            let value: Value = serde_json::from_slice(&head).unwrap_or(Value::Null);
            let error = self.refusal(status, &value, reset);
            match error.code() {
                Some(c) if TOKEN_INVALID.contains(&c) && !fresh => {
                    tracing::info!(
                        "the Feishu tenant access token was refused; fetching a new one"
                    );
                    fresh = true;
                }
                _ => return Err(error),
            }
        }
    }

    /// A multipart upload (`POST`, tenant token). `form` builds the form
    /// afresh for each attempt, since a streamed part is spent once sent.
    pub(crate) async fn upload<F, Fut>(
        &self,
        path: &str,
        timeout: Duration,
        form: F,
    ) -> Result<Value, ApiError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = std::io::Result<reqwest::multipart::Form>>,
    {
        let mut fresh = false;
        loop {
            let token = self.token(fresh).await?;
            let form = form()
                .await
                .map_err(|e| ApiError::Other(format!("cannot read the file to upload: {e}")))?;
            let answer = self
                .request(Method::POST, path, &[], Some(&token))
                .timeout(timeout)
                .multipart(form)
                .send()
                .await
                .map_err(|e| self.transport(&e))?;
            match self.read_answer(answer).await {
                Err(e) if !fresh && e.code().is_some_and(|c| TOKEN_INVALID.contains(&c)) => {
                    tracing::info!(
                        "the Feishu tenant access token was refused; fetching a new one"
                    );
                    fresh = true;
                }
                other => return other,
            }
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

/// `x-ogw-ratelimit-reset`, when given.
fn reset_of(answer: &reqwest::Response) -> Option<Duration> {
    answer
        .headers()
        .get("x-ogw-ratelimit-reset")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// The first `cap` bytes of a body (an error's explanation), never more.
async fn read_head(mut answer: reqwest::Response, cap: usize) -> Vec<u8> {
    let mut head = Vec::new();
    while head.len() < cap {
        match answer.chunk().await {
            Ok(Some(chunk)) => {
                let room = cap - head.len();
                head.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            _ => break,
        }
    }
    head
}
