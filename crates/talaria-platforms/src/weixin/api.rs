//! The iLink bot API as the ancestor and the community ports use it (it
//! is not publicly documented): JSON POSTs under `{base}/ilink/bot/`, each
//! with `AuthorizationType: ilink_bot_token`, the bearer token, a random
//! `X-WECHAT-UIN` and the app headers, each body carrying
//! `base_info.channel_version`. The HTTP status is 200 even for failures;
//! those are in `ret` / `errcode` / `errmsg`.

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use talaria_core::Secret;

use crate::http::{Failure, Http, HttpError, Service};

/// How errors name the service.
pub(crate) const ILINK: Service = Service {
    name: "Weixin (iLink)",
    request: "iLink request",
    code_label: Some("ret"),
};

/// The channel version the ancestor reports, and its packed form
/// (major<<16 | minor<<8 | patch) in `iLink-App-ClientVersion`.
pub(crate) const CHANNEL_VERSION: &str = "2.2.0";
const CLIENT_VERSION: u32 = (2 << 16) | (2 << 8);

/// `ret`/`errcode` of an expired session: a new QR login is needed.
pub(crate) const SESSION_EXPIRED: i64 = -14;
/// `ret`/`errcode` the server answers when the bot sends too fast (and,
/// with the errmsg "unknown error", also for an expired session [anc]).
pub(crate) const RATE_LIMITED: i64 = -2;

/// What one call came back with.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// `ret` 0: the body.
    Ok(Value),
    /// A failure code in the body, with its message.
    Failed { code: i64, message: String },
}

/// A client of one bot account.
#[derive(Debug, Clone)]
pub(crate) struct Api {
    http: Http,
    base: String,
    token: Secret,
}

impl Api {
    pub(crate) fn new(base: &str, token: &Secret) -> Result<Api, String> {
        Ok(Api {
            http: Http::new(ILINK)?.hiding(token, "<token>"),
            base: base.trim_end_matches('/').to_owned(),
            token: token.clone(),
        })
    }

    /// `POST {base}/ilink/bot/{endpoint}` with `body` (to which
    /// `base_info` is added) within `timeout`.
    pub(crate) async fn call(
        &self,
        endpoint: &str,
        mut body: Value,
        timeout: Duration,
    ) -> Result<Outcome, HttpError> {
        body["base_info"] = json!({"channel_version": CHANNEL_VERSION});
        let text = body.to_string();
        let uin = base64::engine::general_purpose::STANDARD
            .encode(rand::random::<u32>().to_string().as_bytes());
        let request = self
            .http
            .client()
            .post(format!("{}/ilink/bot/{endpoint}", self.base))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::CONTENT_LENGTH, text.len())
            .header("AuthorizationType", "ilink_bot_token")
            .header(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {}", self.token.expose()),
            )
            .header("X-WECHAT-UIN", uin)
            .header("iLink-App-Id", "bot")
            .header("iLink-App-ClientVersion", CLIENT_VERSION.to_string())
            .body(text);
        let answer = self.http.send(request, timeout).await?;
        if !answer.is_success() {
            let text = String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)])
                .trim()
                .to_owned();
            return Err(self.http.refused(answer.status, None, &text, None));
        }
        let v: Value = self.http.decode(&answer)?;
        let code = ["ret", "errcode"]
            .iter()
            .filter_map(|k| v.get(*k).and_then(Value::as_i64))
            .find(|c| *c != 0)
            .unwrap_or(0);
        if code == 0 {
            return Ok(Outcome::Ok(v));
        }
        let message = self
            .http
            .redact(v.get("errmsg").and_then(Value::as_str).unwrap_or(""));
        Ok(Outcome::Failed { code, message })
    }

    /// The client, for the media CDN (which takes no iLink headers).
    pub(crate) fn http(&self) -> &Http {
        &self.http
    }

    /// A failure as the shared error type, for the ledger's reading.
    pub(crate) fn failure(&self, code: i64, message: &str) -> HttpError {
        self.http.fail(Failure::Status {
            status: 200,
            code: Some(code.to_string()),
            message: message.to_owned(),
            retry_after: None,
        })
    }
}
