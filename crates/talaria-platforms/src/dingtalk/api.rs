//! DingTalk's HTTP side: opening a Stream mode connection, the app's
//! access token, the robot send API, session webhooks and the custom
//! robot's signed webhook.

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use talaria_core::Secret;

use crate::http::{Failure, Http, HttpError, Service};

/// Who the errors name.
pub(crate) const DINGTALK: Service = Service {
    name: "DingTalk",
    request: "a DingTalk request",
    code_label: None,
};

/// The topic robot messages arrive on in Stream mode.
pub(crate) const BOT_TOPIC: &str = "/v1.0/im/bot/messages/get";

/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one file upload may take.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// A token is refreshed this long before DingTalk says it expires.
const TOKEN_MARGIN: Duration = Duration::from_secs(300);

/// The OpenAPI client of one app.
#[derive(Debug)]
pub(crate) struct Api {
    http: Http,
    base: String,
    client_id: String,
    client_secret: Secret,
    /// The access token and when it must be refreshed.
    token: tokio::sync::Mutex<Option<(Secret, Instant)>>,
}

impl Api {
    /// A client of `base` (no trailing slash) for the app's credentials.
    pub(crate) fn new(base: &str, client_id: &str, client_secret: &Secret) -> Result<Api, String> {
        Ok(Api {
            http: Http::new(DINGTALK)?.hiding(client_secret, "<client secret>"),
            base: base.to_owned(),
            client_id: client_id.to_owned(),
            client_secret: client_secret.clone(),
            token: tokio::sync::Mutex::new(None),
        })
    }

    /// Asks for a Stream mode connection: the WebSocket endpoint and the
    /// one-use ticket to dial it with.
    pub(crate) async fn open_connection(&self) -> Result<(String, Secret), HttpError> {
        let body = json!({
            "clientId": self.client_id,
            "clientSecret": self.client_secret.expose(),
            "subscriptions": [{ "type": "CALLBACK", "topic": BOT_TOPIC }],
            "ua": concat!("talaria/", env!("CARGO_PKG_VERSION")),
            "localIp": "127.0.0.1",
        });
        let url = format!("{}/v1.0/gateway/connections/open", self.base);
        let answer = self.post(&url, &body, None).await?;
        let endpoint = answer.get("endpoint").and_then(Value::as_str);
        let ticket = answer.get("ticket").and_then(Value::as_str);
        match (endpoint, ticket) {
            (Some(e), Some(t)) if !t.is_empty() => Ok((e.to_owned(), Secret::new(t))),
            _ => Err(self.http.fail(Failure::Other(
                "connections/open answered without an endpoint and ticket".into(),
            ))),
        }
    }

    /// Whether DingTalk takes the app's key and secret: an access token
    /// is fetched (or the cached one is still good).
    pub(crate) async fn check_credentials(&self) -> Result<(), HttpError> {
        self.access_token().await.map(drop)
    }

    /// The app's access token, fetched or refreshed when due.
    async fn access_token(&self) -> Result<Secret, HttpError> {
        let mut cached = self.token.lock().await;
        if let Some((token, refresh_at)) = cached.as_ref()
            && Instant::now() < *refresh_at
        {
            return Ok(token.clone());
        }
        let body = json!({
            "appKey": self.client_id,
            "appSecret": self.client_secret.expose(),
        });
        let url = format!("{}/v1.0/oauth2/accessToken", self.base);
        let answer = self.post(&url, &body, None).await?;
        let Some(token) = answer.get("accessToken").and_then(Value::as_str) else {
            return Err(self.http.fail(Failure::Other(
                "oauth2/accessToken answered without an accessToken".into(),
            )));
        };
        let lifetime =
            Duration::from_secs(answer.get("expireIn").and_then(Value::as_u64).unwrap_or(0));
        let token = Secret::new(token);
        *cached = Some((
            token.clone(),
            Instant::now() + lifetime.saturating_sub(TOKEN_MARGIN),
        ));
        Ok(token)
    }

    /// Calls `path` (below `/v1.0/`) with the access token; a token
    /// DingTalk no longer takes is fetched anew once.
    pub(crate) async fn call(&self, path: &str, body: &Value) -> Result<Value, HttpError> {
        self.call_with(reqwest::Method::POST, path, body).await
    }

    /// [`Api::call`] with another method (the card API streams with `PUT`).
    pub(crate) async fn call_with(
        &self,
        method: reqwest::Method,
        path: &str,
        body: &Value,
    ) -> Result<Value, HttpError> {
        let url = format!("{}/v1.0/{path}", self.base);
        let token = self.access_token().await?;
        match self.request(method.clone(), &url, body, Some(&token)).await {
            Err(e) if e.status() == Some(401) => {
                *self.token.lock().await = None;
                let token = self.access_token().await?;
                self.request(method, &url, body, Some(&token)).await
            }
            other => other,
        }
    }

    /// Uploads one file to `{media_base}/media/upload` as `type` (`image`,
    /// `voice`, `video` or `file`); DingTalk's media id for it. The old
    /// API takes the same app access token, in the query, and answers 200
    /// with an `errcode`. The token is never part of an error: transport
    /// errors are stripped of the URL.
    pub(crate) async fn upload_media(
        &self,
        media_base: &str,
        kind: &str,
        part: reqwest::multipart::Part,
    ) -> Result<String, HttpError> {
        let token = self.access_token().await?;
        // The documentation names `type` a form field and advises it in
        // the URL as well, where some clients' forms lose it.
        let form = reqwest::multipart::Form::new()
            .text("type", kind.to_owned())
            .part("media", part);
        let request = self
            .http
            .client()
            .post(format!("{media_base}/media/upload"))
            .query(&[("access_token", token.expose()), ("type", kind)])
            .multipart(form);
        let answer = self.http.send(request, UPLOAD_TIMEOUT).await?;
        let parsed: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        let errcode = parsed.get("errcode").and_then(Value::as_i64);
        let media_id = parsed
            .get("media_id")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty());
        match (answer.is_success(), errcode, media_id) {
            (true, Some(0), Some(id)) => Ok(id.to_owned()),
            (true, Some(0), None) => Err(self.http.fail(Failure::Other(
                "media/upload answered without a media_id".into(),
            ))),
            _ => {
                let message = parsed.get("errmsg").and_then(Value::as_str).unwrap_or("");
                Err(self.http.refused(
                    answer.status,
                    errcode.map(|c| c.to_string()),
                    message,
                    answer.retry_after(),
                ))
            }
        }
    }

    /// Posts `body` to an OpenAPI `url` and reads its JSON answer; a
    /// refusal carries DingTalk's `code` and `message`.
    async fn post(
        &self,
        url: &str,
        body: &Value,
        token: Option<&Secret>,
    ) -> Result<Value, HttpError> {
        self.request(reqwest::Method::POST, url, body, token).await
    }

    /// Sends `body` to an OpenAPI `url` with `method` and reads its JSON
    /// answer (an empty one reads as `null`).
    async fn request(
        &self,
        method: reqwest::Method,
        url: &str,
        body: &Value,
        token: Option<&Secret>,
    ) -> Result<Value, HttpError> {
        let mut request = self.http.client().request(method, url).json(body);
        if let Some(token) = token {
            request = request.header("x-acs-dingtalk-access-token", token.expose());
        }
        let answer = self.http.send(request, CALL_TIMEOUT).await?;
        if answer.is_success() {
            if answer.body.iter().all(u8::is_ascii_whitespace) {
                return Ok(Value::Null);
            }
            return self.http.decode(&answer);
        }
        let parsed: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        let code = parsed
            .get("code")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let message = parsed.get("message").and_then(Value::as_str).unwrap_or("");
        Err(self
            .http
            .refused(answer.status, code, message, answer.retry_after()))
    }

    /// Posts `body` to a webhook (a session webhook, a custom robot's): the
    /// URL itself authorises. DingTalk answers 200 with an `errcode`, and
    /// anything but 0 is a refusal carrying that code.
    pub(crate) async fn post_webhook(&self, url: &str, body: &Value) -> Result<(), HttpError> {
        let request = self.http.client().post(url).json(body);
        let answer = self.http.send(request, CALL_TIMEOUT).await?;
        let parsed: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        let errcode = parsed.get("errcode").and_then(Value::as_i64);
        if answer.is_success() && errcode == Some(0) {
            return Ok(());
        }
        let message = parsed.get("errmsg").and_then(Value::as_str).unwrap_or("");
        Err(self.http.refused(
            answer.status,
            errcode.map(|c| c.to_string()),
            message,
            answer.retry_after(),
        ))
    }

    /// Asks where a file of a message can be fetched: a short-lived URL.
    pub(crate) async fn download_url(
        &self,
        code: &str,
        robot_code: &str,
    ) -> Result<String, HttpError> {
        let body = json!({ "downloadCode": code, "robotCode": robot_code });
        let answer = self.call("robot/messageFiles/download", &body).await?;
        answer
            .get("downloadUrl")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| {
                self.http.fail(Failure::Other(
                    "messageFiles/download answered without a URL".into(),
                ))
            })
    }

    /// The shared client, for fetching a file's bytes.
    pub(crate) fn http(&self) -> &Http {
        &self.http
    }
}

/// A custom robot's signature for `timestamp_ms`: HMAC-SHA256 keyed with
/// the secret over `"<timestamp>\n<secret>"`, in base64 (URL-encoded when
/// it is put in the query).
pub(crate) fn sign(secret: &str, timestamp_ms: i64) -> String {
    let mut mac = match <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()) {
        Ok(m) => m,
        // HMAC takes keys of any length; this arm cannot be reached.
        Err(_) => return String::new(),
    };
    mac.update(format!("{timestamp_ms}\n{secret}").as_bytes());
    BASE64.encode(mac.finalize().into_bytes())
}

/// `url` with the custom robot's `timestamp` and `sign` appended.
pub(crate) fn signed_url(url: &str, secret: &str, timestamp_ms: i64) -> Result<String, String> {
    let mut parsed = reqwest::Url::parse(url)
        .map_err(|e| format!("the custom robot webhook URL is invalid: {e}"))?;
    parsed
        .query_pairs_mut()
        .append_pair("timestamp", &timestamp_ms.to_string())
        .append_pair("sign", &sign(secret, timestamp_ms));
    Ok(parsed.into())
}
