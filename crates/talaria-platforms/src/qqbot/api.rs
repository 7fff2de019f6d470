//! QQ's OpenAPI: the access token (fetched with the AppID and AppSecret,
//! refreshed before it runs out) and JSON requests carrying
//! `Authorization: QQBot <token>`.
//!
//! QQ answers a refusal with an HTTP 4xx/5xx and a body
//! `{code, message, err_code, trace_id}`. A 401 means the token is no
//! longer good: it is fetched anew and the request tried once more. A
//! rate-limit answer (HTTP 429, or the business codes QQ uses for "too
//! frequent") is waited out, no sooner than `Retry-After` says (a second
//! when it says nothing), a bounded number of times.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use talaria_core::Secret;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::http::{Failure, Http, HttpError, Service};

/// How errors name QQ.
pub(crate) const QQ: Service = Service {
    name: "QQ",
    request: "QQ API request",
    code_label: Some("code"),
};

/// Fetch a new token this long before the old one runs out (QQ hands out
/// a new one during the last 60 s while the old one still works).
const REFRESH_MARGIN: Duration = Duration::from_secs(60);

/// Tokens are never trusted for longer than this, whatever QQ says.
const MAX_TOKEN_LIFE: Duration = Duration::from_secs(7200);

/// Retries after a rate-limit answer before the caller hears about it.
const MAX_RATE_LIMIT_RETRIES: u32 = 3;

/// Longer waits than this are not worth blocking a send for.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Business codes QQ answers when a bot sends too fast [?]: 22009
/// ("msg limit exceed") and 20028 (the per-channel frequency limit).
const RATE_LIMIT_CODES: &[i64] = &[22009, 20028];

/// The business code of a repeated `(msg_id, msg_seq)` [doc]: the reply
/// was de-duplicated.
pub(crate) const DUPLICATE_SEQ: i64 = 40054005;

#[derive(Debug, Clone)]
struct Token {
    value: Secret,
    /// When to fetch the next one.
    refresh_at: Instant,
}

/// A client of one bot's OpenAPI.
#[derive(Debug)]
pub(crate) struct Api {
    http: Http,
    api_base: String,
    token_url: String,
    app_id: String,
    secret: Secret,
    /// The current token; the lock also makes concurrent callers wait for
    /// one refresh instead of each fetching its own.
    token: Mutex<Option<Token>>,
}

/// What a failed call looked like.
pub(crate) type ApiError = HttpError;

impl Api {
    pub(crate) fn new(
        api_base: &str,
        token_url: &str,
        app_id: &str,
        secret: &Secret,
    ) -> Result<Api, String> {
        Ok(Api {
            http: Http::new(QQ)?.hiding(secret, "<secret>"),
            api_base: api_base.trim_end_matches('/').to_owned(),
            token_url: token_url.trim().to_owned(),
            app_id: app_id.to_owned(),
            secret: secret.clone(),
            token: Mutex::new(None),
        })
    }

    /// The current access token, fetched when there is none or it is due.
    pub(crate) async fn token(&self, timeout: Duration) -> Result<Secret, ApiError> {
        let mut held = self.token.lock().await;
        if let Some(t) = held.as_ref().filter(|t| Instant::now() < t.refresh_at) {
            return Ok(t.value.clone());
        }
        let fresh = self.fetch_token(timeout).await?;
        let value = fresh.value.clone();
        *held = Some(fresh);
        Ok(value)
    }

    /// The client, for fetching files from QQ's media hosts.
    pub(crate) fn http(&self) -> &Http {
        &self.http
    }

    /// Forgets the token (QQ refused it): the next call fetches another.
    pub(crate) async fn forget_token(&self) {
        *self.token.lock().await = None;
    }

    async fn fetch_token(&self, timeout: Duration) -> Result<Token, ApiError> {
        let body = json!({"appId": self.app_id, "clientSecret": self.secret.expose()});
        let request = self.http.client().post(&self.token_url).json(&body);
        let answer = self.http.send(request, timeout).await?;
        let v: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        let token = v.get("access_token").and_then(Value::as_str).unwrap_or("");
        if !answer.is_success() || token.is_empty() {
            let (code, message) = refusal(&v);
            let message = if message.is_empty() {
                "no access_token in the answer".to_owned()
            } else {
                message
            };
            let status = if answer.is_success() {
                401
            } else {
                answer.status
            };
            return Err(self.http.refused(status, code, &message, None));
        }
        // QQ has sent `expires_in` both as a number and as a string.
        let secs = match v.get("expires_in") {
            Some(Value::Number(n)) => n.as_u64(),
            Some(Value::String(s)) => s.trim().parse::<u64>().ok(),
            _ => None,
        }
        .unwrap_or(7200);
        let life = Duration::from_secs(secs).min(MAX_TOKEN_LIFE);
        // A very short life is refreshed at half-time instead.
        let early = if life > REFRESH_MARGIN * 2 {
            life - REFRESH_MARGIN
        } else {
            life / 2
        };
        tracing::debug!(secs, "fetched a QQ access token");
        Ok(Token {
            value: Secret::new(token),
            refresh_at: Instant::now() + early,
        })
    }

    /// `method {api_base}{path}` with the token; the answer decoded
    /// (`null` when empty). A refused token is fetched anew once; rate
    /// limits are waited out (see the module docs).
    pub(crate) async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        self.request_with(method, path, timeout, |req| async move {
            Ok(match body {
                Some(b) => req.json(b),
                None => req,
            })
        })
        .await
    }

    /// `POST {api_base}{path}` with a JSON body of `fields` plus
    /// `"file_data"`: the file at `file`, base64, streamed from the disk
    /// as it is sent (built afresh for each try) rather than held whole.
    pub(crate) async fn post_file_data(
        &self,
        path: &str,
        fields: &Value,
        file: &std::path::Path,
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        self.request_with(Method::POST, path, timeout, |req| async move {
            let (body, len) = file_data_body(fields, file).await.map_err(|e| {
                self.http
                    .fail(Failure::Other(format!("cannot read the file: {e}")))
            })?;
            Ok(req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header(reqwest::header::CONTENT_LENGTH, len)
                .body(reqwest::Body::wrap_stream(body)))
        })
        .await
    }

    /// The request loop: `attach` puts the body on each try.
    async fn request_with<F, Fut>(
        &self,
        method: Method,
        path: &str,
        timeout: Duration,
        attach: F,
    ) -> Result<Value, ApiError>
    where
        F: Fn(reqwest::RequestBuilder) -> Fut,
        Fut: std::future::Future<Output = Result<reqwest::RequestBuilder, ApiError>>,
    {
        let mut retries = 0;
        let mut refreshed = false;
        loop {
            let token = self.token(timeout).await?;
            let http = self.http.clone().hiding(&token, "<token>");
            let req = http
                .client()
                .request(method.clone(), format!("{}{path}", self.api_base))
                .header(
                    reqwest::header::AUTHORIZATION,
                    format!("QQBot {}", token.expose()),
                );
            let req = attach(req).await?;
            let answer = http.send(req, timeout).await?;
            let json: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
            if answer.is_success() {
                if answer.body.iter().all(u8::is_ascii_whitespace) {
                    return Ok(Value::Null);
                }
                if json.is_null() {
                    return Err(http.fail(Failure::Other(format!(
                        "HTTP {} without a readable answer",
                        answer.status
                    ))));
                }
                return Ok(json);
            }
            let (code, message) = refusal(&json);
            let numeric = code.as_deref().and_then(|c| c.parse::<i64>().ok());
            if answer.status == 401 && !refreshed {
                refreshed = true;
                tracing::info!("QQ refused the access token; fetching a new one");
                self.forget_token().await;
                continue;
            }
            let limited =
                answer.status == 429 || numeric.is_some_and(|c| RATE_LIMIT_CODES.contains(&c));
            if limited {
                let wait = answer.retry_after().unwrap_or(Duration::from_secs(1));
                if retries >= MAX_RATE_LIMIT_RETRIES || wait > MAX_WAIT {
                    return Err(http.refused(429, code, &message, Some(wait)));
                }
                retries += 1;
                tracing::info!(path, ?wait, "QQ rate limit; waiting");
                tokio::time::sleep(wait).await;
                continue;
            }
            let message = if message.is_empty() {
                format!("HTTP {}", answer.status)
            } else {
                message
            };
            return Err(http.refused(answer.status, code, &message, None));
        }
    }
}

/// How much of a file is read at a time while encoding it: a multiple
/// of 3, so each piece encodes to base64 without padding.
const FILE_CHUNK: usize = 3 * 16 * 1024;

/// A body being streamed.
type BodyStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static>>;

/// `fields` as a JSON object with `"file_data":"<base64 of file>"` added
/// at its end, as a streamed body, and the body's exact length.
async fn file_data_body(
    fields: &Value,
    file: &std::path::Path,
) -> std::io::Result<(BodyStream, u64)> {
    use base64::Engine;
    use futures::StreamExt;
    use tokio::io::AsyncReadExt;
    let mut head = serde_json::to_string(fields).map_err(std::io::Error::other)?;
    if !head.ends_with('}') {
        return Err(std::io::Error::other(
            "the upload's fields are not an object",
        ));
    }
    head.pop();
    if head.len() > 1 {
        head.push(',');
    }
    head.push_str("\"file_data\":\"");
    let tail = "\"}";
    let reader = tokio::fs::File::open(file).await?;
    let size = reader.metadata().await?.len();
    let len = head.len() as u64 + size.div_ceil(3) * 4 + tail.len() as u64;
    let encoded = futures::stream::unfold(Some(reader), |state| async move {
        let mut reader = state?;
        let mut buf = vec![0u8; FILE_CHUNK];
        let mut filled = 0;
        // Fill the whole piece (reads may return less) so only the last
        // one carries padding.
        while filled < FILE_CHUNK {
            match reader.read(&mut buf[filled..]).await {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) => return Some((Err(e), None)),
            }
        }
        if filled == 0 {
            return None;
        }
        let text = base64::engine::general_purpose::STANDARD.encode(&buf[..filled]);
        let next = (filled == FILE_CHUNK).then_some(reader);
        Some((Ok(bytes::Bytes::from(text)), next))
    });
    let body = futures::stream::once(async move { Ok(bytes::Bytes::from(head)) })
        .chain(encoded)
        .chain(futures::stream::once(async move {
            Ok(bytes::Bytes::from_static(tail.as_bytes()))
        }));
    Ok((Box::pin(body), len))
}

/// QQ's `{code, message}` (or `{err_code, msg}`) from an error body.
fn refusal(v: &Value) -> (Option<String>, String) {
    let code = ["code", "err_code"].iter().find_map(|k| match v.get(*k) {
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    });
    let message = ["message", "msg"]
        .iter()
        .find_map(|k| v.get(*k).and_then(Value::as_str))
        .unwrap_or("")
        .to_owned();
    (code, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn file_data_bodies_are_json_with_the_file_in_base64() {
        use base64::Engine;
        use futures::StreamExt;
        let dir = tempfile::tempdir().unwrap();
        for len in [
            0usize,
            1,
            2,
            3,
            FILE_CHUNK - 1,
            FILE_CHUNK,
            FILE_CHUNK * 2 + 1,
        ] {
            let bytes: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
            let path = dir.path().join("f");
            std::fs::write(&path, &bytes).unwrap();
            let fields = json!({"file_type": 1, "file_name": "a \"b\".png"});
            let (mut stream, declared) = file_data_body(&fields, &path).await.unwrap();
            let mut all = Vec::new();
            while let Some(c) = stream.next().await {
                all.extend_from_slice(&c.unwrap());
            }
            assert_eq!(all.len() as u64, declared, "len {len}");
            let v: Value = serde_json::from_slice(&all).unwrap();
            assert_eq!(v["file_type"], 1);
            assert_eq!(v["file_name"], "a \"b\".png");
            let data = base64::engine::general_purpose::STANDARD
                .decode(v["file_data"].as_str().unwrap())
                .unwrap();
            assert_eq!(data, bytes, "len {len}");
        }
    }

    #[test]
    fn refusals_read_code_and_message() {
        assert_eq!(
            refusal(&json!({"code": 40054005, "message": "dup", "trace_id": "t"})),
            (Some("40054005".into()), "dup".into())
        );
        assert_eq!(
            refusal(&json!({"err_code": "11241", "msg": "bad"})),
            (Some("11241".into()), "bad".into())
        );
        assert_eq!(refusal(&Value::Null), (None, String::new()));
    }
}
