//! The Messaging API calls the adapter makes, and what their errors mean.
//!
//! Every call carries `Authorization: Bearer <channel access token>`:
//!
//! - `POST /v2/bot/message/reply` `{replyToken, messages}`: free, once per
//!   reply token, within about a minute of the event;
//! - `POST /v2/bot/message/push` `{to, messages}` with `X-Line-Retry-Key`,
//!   counted against the monthly message quota; a repeat of an accepted
//!   key is refused with 409, which means "already sent";
//! - `POST /v2/bot/chat/loading/start` `{chatId, loadingSeconds}`: the
//!   loading animation, in one-to-one chats only;
//! - `GET /v2/bot/info`: the bot's own user id;
//! - `GET {data_base}/v2/bot/message/{id}/content`: a photo, video, voice
//!   message or file a user sent.
//!
//! LINE answers errors as `{"message", "details": [{"message",
//! "property"}]}`; the message is what tells a spent reply token or an
//! exhausted quota apart, since both share their status with other
//! refusals.

use std::time::Duration;

use reqwest::header::AUTHORIZATION;
use serde::Deserialize;
use serde_json::Value;
use talaria_adapter::{Download, DownloadError, SendError};
use talaria_core::Secret;

use crate::http::{Answer, Failure, Http, HttpError, Service};

/// How errors name the Messaging API.
pub(crate) const LINE: Service = Service {
    name: "the LINE Messaging API",
    request: "the LINE API request",
    code_label: None,
};

/// A failed call; the message carries LINE's `message` and `details`.
pub(crate) type ApiError = HttpError;

/// The header that makes a push idempotent.
const RETRY_KEY: &str = "X-Line-Retry-Key";

/// What LINE says of a reply token it will not take: used already, or
/// expired.
pub(crate) fn is_spent_token(e: &ApiError) -> bool {
    e.status() == Some(400)
        && e.message()
            .to_ascii_lowercase()
            .contains("invalid reply token")
}

/// LINE's 429 for the monthly message quota, as opposed to the rate
/// limit: waiting seconds does not help, a new month (or plan) does.
pub(crate) fn is_quota(e: &ApiError) -> bool {
    e.status() == Some(429) && e.message().to_ascii_lowercase().contains("monthly limit")
}

/// Maps a failed call to what the gateway's ledger understands. `wait`
/// is the wait to report for a rate limit that named none.
pub(crate) fn classify(e: &ApiError, wait: Duration) -> SendError {
    match &e.failure {
        _ if is_quota(e) => SendError::Unavailable(format!(
            "LINE's monthly message quota is used up, so answers that cannot use a reply token \
             wait until it renews or the plan is raised ({e})"
        )),
        Failure::Status { status: 429, .. } => {
            SendError::RateLimited(e.retry_after().unwrap_or(wait))
        }
        // A revoked or mistyped token is the operator's to fix; the reply
        // stays owed meanwhile rather than spending its attempts.
        Failure::Status { status: 401, .. } => SendError::Unavailable(format!(
            "LINE refused the channel access token; replace LINE_CHANNEL_ACCESS_TOKEN ({e})"
        )),
        Failure::Status { status, .. } if *status >= 500 => SendError::Transient(e.to_string()),
        Failure::Status { .. } => SendError::Rejected(e.to_string()),
        Failure::Connect(m) => SendError::Unavailable(format!("cannot connect to LINE: {m}")),
        Failure::Timeout(_) | Failure::Other(_) => e.clone().classify(),
    }
}

/// LINE's error body.
#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: String,
    #[serde(default)]
    details: Vec<Detail>,
}

#[derive(Deserialize)]
struct Detail {
    #[serde(default)]
    message: String,
    #[serde(default)]
    property: String,
}

/// What a reply or push answered: the ids of the messages it sent.
#[derive(Debug, Deserialize)]
struct Sent {
    #[serde(default, rename = "sentMessages")]
    sent_messages: Vec<SentOne>,
}

#[derive(Debug, Deserialize)]
struct SentOne {
    id: String,
}

/// What `GET /v2/bot/info` says of the bot.
#[derive(Debug, Deserialize)]
pub(crate) struct BotInfo {
    #[serde(rename = "userId")]
    pub user_id: String,
    /// `@` and the account's basic id.
    #[serde(rename = "basicId", default)]
    pub basic_id: String,
    #[serde(rename = "displayName", default)]
    pub display_name: String,
}

/// How a push ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Sent now; the new message's id, when LINE named it.
    Sent(Option<String>),
    /// LINE took this retry key before: an earlier attempt went out.
    AlreadySent,
}

/// A client of one channel's endpoints.
#[derive(Debug, Clone)]
pub(crate) struct Api {
    http: Http,
    api_base: String,
    data_base: String,
    token: Secret,
}

impl Api {
    /// A client of `api_base` and `data_base` (no trailing slash).
    pub(crate) fn new(api_base: &str, data_base: &str, token: &Secret) -> Result<Api, String> {
        Ok(Api {
            http: Http::new(LINE)?.hiding(token, "<token>"),
            api_base: api_base.to_owned(),
            data_base: data_base.to_owned(),
            token: token.clone(),
        })
    }

    fn bearer(&self) -> String {
        format!("Bearer {}", self.token.expose())
    }

    fn post(&self, path: &str, body: &Value) -> reqwest::RequestBuilder {
        self.http
            .client()
            .post(format!("{}{path}", self.api_base))
            .header(AUTHORIZATION, self.bearer())
            .json(body)
    }

    /// The answer as an error, LINE's message and details read from it.
    fn refusal(&self, answer: &Answer) -> ApiError {
        let (message, details) = match serde_json::from_slice::<ErrorBody>(&answer.body) {
            Ok(body) => (body.message, body.details),
            Err(_) => (
                String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)])
                    .trim()
                    .to_owned(),
                Vec::new(),
            ),
        };
        let mut text = message;
        for d in details.iter().take(5) {
            text.push_str(&format!("; {}: {}", d.property, d.message));
        }
        self.http
            .refused(answer.status, None, &text, answer.retry_after())
    }

    /// `POST /v2/bot/message/reply`; the id of the first message sent.
    pub(crate) async fn reply(
        &self,
        reply_token: &str,
        messages: &[Value],
        timeout: Duration,
    ) -> Result<Option<String>, ApiError> {
        let body = serde_json::json!({ "replyToken": reply_token, "messages": messages });
        let answer = self
            .http
            .send(self.post("/v2/bot/message/reply", &body), timeout)
            .await?;
        if !answer.is_success() {
            return Err(self.refusal(&answer));
        }
        Ok(self.first_id(&answer))
    }

    /// `POST /v2/bot/message/push` under `retry_key`.
    pub(crate) async fn push(
        &self,
        to: &str,
        messages: &[Value],
        retry_key: &str,
        timeout: Duration,
    ) -> Result<Pushed, ApiError> {
        let body = serde_json::json!({ "to": to, "messages": messages });
        let request = self
            .post("/v2/bot/message/push", &body)
            .header(RETRY_KEY, retry_key);
        let answer = self.http.send(request, timeout).await?;
        match answer.status {
            409 => Ok(Pushed::AlreadySent),
            _ if answer.is_success() => Ok(Pushed::Sent(self.first_id(&answer))),
            _ => Err(self.refusal(&answer)),
        }
    }

    /// The first sent message's id. The message is out whatever the body
    /// says, so an unreadable one only loses the id.
    fn first_id(&self, answer: &Answer) -> Option<String> {
        self.http
            .decode::<Sent>(answer)
            .ok()
            .and_then(|s| s.sent_messages.into_iter().next())
            .map(|m| m.id)
    }

    /// `POST /v2/bot/chat/loading/start` for `seconds`.
    pub(crate) async fn loading(
        &self,
        chat_id: &str,
        seconds: u64,
        timeout: Duration,
    ) -> Result<(), ApiError> {
        let body = serde_json::json!({ "chatId": chat_id, "loadingSeconds": seconds });
        let answer = self
            .http
            .send(self.post("/v2/bot/chat/loading/start", &body), timeout)
            .await?;
        if answer.is_success() {
            Ok(())
        } else {
            Err(self.refusal(&answer))
        }
    }

    /// `GET /v2/bot/info`: who the bot is.
    pub(crate) async fn bot_info(&self, timeout: Duration) -> Result<BotInfo, ApiError> {
        let request = self
            .http
            .client()
            .get(format!("{}/v2/bot/info", self.api_base))
            .header(AUTHORIZATION, self.bearer());
        let answer = self.http.send(request, timeout).await?;
        if !answer.is_success() {
            return Err(self.refusal(&answer));
        }
        self.http.decode::<BotInfo>(&answer)
    }

    /// Streams the content of message `id` (digits, checked by the
    /// caller) from the data host.
    pub(crate) async fn content(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<Download, DownloadError> {
        let request = self
            .http
            .client()
            .get(format!("{}/v2/bot/message/{id}/content", self.data_base))
            .header(AUTHORIZATION, self.bearer());
        self.http.download(request, timeout).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16, message: &str, retry_after: Option<u64>) -> ApiError {
        HttpError::new(
            LINE,
            Failure::Status {
                status,
                code: None,
                message: message.to_owned(),
                retry_after: retry_after.map(Duration::from_secs),
            },
        )
    }

    #[test]
    fn refusals_are_classified() {
        let wait = Duration::from_secs(2);
        let spent = status(400, "Invalid reply token", None);
        assert!(is_spent_token(&spent));
        assert!(matches!(classify(&spent, wait), SendError::Rejected(_)));
        let quota = status(429, "You have reached your monthly limit.", None);
        assert!(is_quota(&quota));
        assert!(matches!(classify(&quota, wait), SendError::Unavailable(m) if m.contains("quota")));
        let busy = status(429, "The API rate limit has been exceeded.", Some(3));
        assert!(!is_quota(&busy));
        assert_eq!(
            classify(&busy, wait),
            SendError::RateLimited(Duration::from_secs(3))
        );
        assert_eq!(
            classify(&status(429, "", None), wait),
            SendError::RateLimited(wait)
        );
        assert!(matches!(
            classify(&status(401, "Authentication failed", None), wait),
            SendError::Unavailable(m) if m.contains("LINE_CHANNEL_ACCESS_TOKEN")
        ));
        assert!(matches!(
            classify(&status(500, "", None), wait),
            SendError::Transient(_)
        ));
        assert!(matches!(
            classify(&status(400, "The property, 'to', is invalid", None), wait),
            SendError::Rejected(_)
        ));
        let lost = HttpError::new(LINE, Failure::Timeout("t".into()));
        assert!(matches!(classify(&lost, wait), SendError::Ambiguous(_)));
        let down = HttpError::new(LINE, Failure::Connect("c".into()));
        assert!(matches!(classify(&down, wait), SendError::Unavailable(_)));
    }
}
