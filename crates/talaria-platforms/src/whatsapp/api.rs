//! The Graph API calls the adapter makes, and what their errors mean.
//!
//! Messages go to `POST {graph_base}/{api_version}/{phone_number_id}/messages`
//! with `Authorization: Bearer <token>`: sending a text or a file, and
//! marking an inbound message read (with the typing indicator). Files go
//! up through `POST .../{phone_number_id}/media` (multipart) and come down
//! in two steps: `GET .../{media_id}` names a short-lived URL, fetched with
//! the same token from the Graph host or Meta's file host. Graph answers errors
//! as `{"error": {"message", "type", "code", "error_subcode", "error_data",
//! "fbtrace_id"}}`; [`classify`] turns them into what the delivery ledger
//! understands. The token never appears in a URL, and error texts are
//! scrubbed of it in case something echoes it back.

use std::time::Duration;

use reqwest::header::AUTHORIZATION;
use serde::Deserialize;
use serde_json::Value;
use talaria_adapter::{Download, DownloadError, SendError};
use talaria_core::Secret;

use crate::http::{Failure, Http, HttpError, Service};

/// Graph's code for a message sent outside the 24-hour customer service
/// window ("Re-engagement message").
pub(crate) const OUTSIDE_WINDOW: i64 = 131047;

/// Graph's code for an invalid or expired access token.
pub(crate) const BAD_TOKEN: i64 = 190;

/// Graph's rate-limit codes: too many messages from this number (130429),
/// too many to one user in a short time (131056), too many API calls
/// (80007).
pub(crate) const RATE_LIMIT_CODES: [i64; 3] = [130429, 131056, 80007];

/// How errors name the Graph API.
pub(crate) const GRAPH: Service = Service {
    name: "the Graph API",
    request: "the Graph API request",
    code_label: Some("code"),
};

/// What a failed call looked like; the code is Graph's `error.code`, and
/// the message carries `error_data.details`, the subcode and the
/// `fbtrace_id` Meta's support asks for.
pub(crate) type ApiError = HttpError;

/// Graph's error code, if it sent one.
pub(crate) fn graph_code(e: &ApiError) -> Option<i64> {
    e.code().and_then(|c| c.parse().ok())
}

/// Whether Graph asked us to slow down.
pub(crate) fn is_rate_limit(e: &ApiError) -> bool {
    e.status() == Some(429) || graph_code(e).is_some_and(|c| RATE_LIMIT_CODES.contains(&c))
}

/// What the user is told when a reply falls outside the 24-hour window
/// (also the ledger's reason).
pub(crate) const OUTSIDE_WINDOW_TEXT: &str = "WhatsApp refused the message: more than 24 hours have \
     passed since the user last wrote, so the customer service window is closed (Graph error \
     131047). Free-form replies are only allowed within 24 hours of the user's last message: \
     the user must write to the bot first; starting a conversation needs an approved message \
     template, which Talaria does not send";

/// Maps a failed call to what the gateway's ledger understands. `wait` is
/// the wait to report for a rate limit that named none.
pub(crate) fn classify(e: &ApiError, wait: Duration) -> SendError {
    let code = graph_code(e);
    match &e.failure {
        _ if code == Some(OUTSIDE_WINDOW) => {
            SendError::Rejected(format!("{OUTSIDE_WINDOW_TEXT} ({e})"))
        }
        // An expired token is the operator's to fix; the reply stays owed
        // meanwhile instead of being spent on attempts that cannot pass.
        _ if code == Some(BAD_TOKEN) => SendError::Unavailable(format!(
            "WhatsApp Cloud: the access token is invalid or expired; replace \
             WHATSAPP_CLOUD_TOKEN ({e})"
        )),
        _ if is_rate_limit(e) => SendError::RateLimited(e.retry_after().unwrap_or(wait)),
        // Graph's reasons are read whole, with the code and trace id.
        Failure::Status { status, .. } if *status >= 500 => SendError::Transient(e.to_string()),
        Failure::Status { .. } => SendError::Rejected(e.to_string()),
        Failure::Connect(m) => SendError::Unavailable(format!("cannot connect to Graph: {m}")),
        Failure::Timeout(_) | Failure::Other(_) => e.clone().classify(),
    }
}

/// The host Meta serves media files from (the URL `GET /{media_id}`
/// names); the configured Graph host is the only other one trusted.
pub(crate) const FILE_HOST: &str = "lookaside.fbsbx.com";

/// A client bound to one number's endpoints and token.
#[derive(Debug, Clone)]
pub(crate) struct Api {
    http: Http,
    /// `{graph_base}/{api_version}`.
    root: String,
    /// `{root}/{phone_number_id}/messages`.
    messages_url: String,
    phone_number_id: String,
    token: Secret,
}

/// What `GET /{phone_number_id}` says of the business number.
#[derive(Debug, Deserialize)]
pub(crate) struct PhoneNumber {
    #[serde(default)]
    pub id: String,
    /// The number as people see it (`+1 555-010-0100`).
    #[serde(default)]
    pub display_phone_number: String,
    /// The business name WhatsApp verified for it.
    #[serde(default)]
    pub verified_name: String,
}

/// What `GET /{media_id}` says of a file.
#[derive(Debug, Deserialize)]
pub(crate) struct MediaInfo {
    /// Where to fetch it, with the token, for the next five minutes.
    pub url: String,
    /// Its size: Graph writes it as a number or as a string.
    #[serde(default)]
    pub file_size: Option<Value>,
}

impl MediaInfo {
    /// The size Graph claims, whichever way it wrote it.
    pub(crate) fn size(&self) -> Option<u64> {
        match self.file_size.as_ref()? {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        }
    }
}

/// Graph's error envelope.
#[derive(Deserialize)]
struct Envelope {
    error: GraphError,
}

#[derive(Deserialize)]
struct GraphError {
    #[serde(default)]
    message: String,
    #[serde(default)]
    code: Option<i64>,
    #[serde(default)]
    error_subcode: Option<i64>,
    #[serde(default)]
    error_data: Option<Value>,
    #[serde(default)]
    fbtrace_id: Option<String>,
}

impl Api {
    /// A client of `{root}/{phone_number_id}/...`, `root` being
    /// `{graph_base}/{api_version}`.
    pub(crate) fn new(root: String, phone_number_id: &str, token: &Secret) -> Result<Api, String> {
        Ok(Api {
            http: Http::new(GRAPH)?.hiding(token, "<token>"),
            messages_url: format!("{root}/{phone_number_id}/messages"),
            root,
            phone_number_id: phone_number_id.to_owned(),
            token: token.clone(),
        })
    }

    fn bearer(&self) -> String {
        format!("Bearer {}", self.token.expose())
    }

    /// `POST .../messages` with `body`; Graph's JSON answer.
    pub(crate) async fn post(&self, body: &Value, timeout: Duration) -> Result<Value, ApiError> {
        let request = self
            .http
            .client()
            .post(&self.messages_url)
            .header(AUTHORIZATION, self.bearer())
            .json(body);
        self.read(request, timeout).await
    }

    /// `POST .../media`: uploads `file` (a part streamed from disk) of
    /// type `mime`; the media id to send it with.
    pub(crate) async fn upload(
        &self,
        file: reqwest::multipart::Part,
        mime: &str,
        timeout: Duration,
    ) -> Result<String, ApiError> {
        let form = reqwest::multipart::Form::new()
            .text("messaging_product", "whatsapp")
            .text("type", mime.to_owned())
            .part("file", file);
        let request = self
            .http
            .client()
            .post(format!("{}/{}/media", self.root, self.phone_number_id))
            .header(AUTHORIZATION, self.bearer())
            .multipart(form);
        let answer = self.read(request, timeout).await?;
        answer
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| {
                self.http.fail(Failure::Other(
                    "the Graph API accepted the upload without a media id".to_owned(),
                ))
            })
    }

    /// `GET /{phone_number_id}`: the business number the token sends
    /// from, as WhatsApp shows it.
    pub(crate) async fn phone_number(&self, timeout: Duration) -> Result<PhoneNumber, ApiError> {
        let request = self
            .http
            .client()
            .get(format!("{}/{}", self.root, self.phone_number_id))
            .header(AUTHORIZATION, self.bearer());
        let answer = self.read(request, timeout).await?;
        serde_json::from_value(answer).map_err(|e| {
            self.http.fail(Failure::Other(format!(
                "the Graph API described the phone number in a way not understood: {e}"
            )))
        })
    }

    /// `GET /{media_id}?phone_number_id=`: where the file is for the next
    /// minutes (Graph checks it belongs to this number).
    pub(crate) async fn media_info(
        &self,
        media_id: &str,
        timeout: Duration,
    ) -> Result<MediaInfo, ApiError> {
        let request = self
            .http
            .client()
            .get(format!("{}/{media_id}", self.root))
            .query(&[("phone_number_id", self.phone_number_id.as_str())])
            .header(AUTHORIZATION, self.bearer());
        let answer = self.read(request, timeout).await?;
        serde_json::from_value(answer).map_err(|e| {
            self.http.fail(Failure::Other(format!(
                "the Graph API described the file without a usable URL: {e}"
            )))
        })
    }

    /// Whether `url` (named by Graph) is on a host WhatsApp serves files
    /// from: the configured Graph origin, or Meta's file host over https.
    /// The token goes with the request, so nowhere else is fetched.
    pub(crate) fn is_file_address(&self, url: &reqwest::Url) -> bool {
        let ours = reqwest::Url::parse(&self.root).ok().is_some_and(|root| {
            root.scheme() == url.scheme()
                && root.host_str() == url.host_str()
                && root.port_or_known_default() == url.port_or_known_default()
        });
        let meta = url.scheme() == "https" && url.host_str() == Some(FILE_HOST);
        ours || meta
    }

    /// Fetches the file at `url` (checked with [`Self::is_file_address`]
    /// first), streamed.
    pub(crate) async fn fetch(
        &self,
        url: reqwest::Url,
        timeout: Duration,
    ) -> Result<Download, DownloadError> {
        let request = self
            .http
            .client()
            .get(url)
            .header(AUTHORIZATION, self.bearer());
        self.http.download(request, timeout).await
    }

    /// Sends `request` and reads Graph's JSON answer or its error.
    async fn read(
        &self,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        let answer = self.http.send(request, timeout).await?;
        if answer.is_success() {
            return self.http.decode(&answer);
        }
        let status = answer.status;
        let (code, mut message) = match serde_json::from_slice::<Envelope>(&answer.body) {
            Ok(Envelope { error }) => {
                let details = error
                    .error_data
                    .as_ref()
                    .and_then(|d| d.get("details"))
                    .and_then(Value::as_str)
                    .filter(|d| !d.is_empty() && *d != error.message);
                let mut message = match details {
                    Some(d) if !error.message.is_empty() => format!("{} ({d})", error.message),
                    Some(d) => d.to_owned(),
                    None => error.message,
                };
                if let Some(sub) = error.error_subcode {
                    message.push_str(&format!(" [subcode {sub}]"));
                }
                if let Some(trace) = error.fbtrace_id {
                    message.push_str(&format!(" [fbtrace_id {trace}]"));
                }
                (error.code, message)
            }
            Err(_) => (None, format!("HTTP {status}")),
        };
        if message.is_empty() {
            message = format!("HTTP {status}");
        }
        Err(self.http.refused(
            status,
            code.map(|c| c.to_string()),
            &message,
            answer.retry_after(),
        ))
    }
}

/// The id of the sent message in Graph's answer (`messages[0].id`).
pub(crate) fn sent_id(answer: &Value) -> Option<String> {
    answer
        .get("messages")
        .and_then(|m| m.get(0))
        .and_then(|m| m.get("id"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16, code: Option<i64>) -> ApiError {
        HttpError::new(
            GRAPH,
            Failure::Status {
                status,
                code: code.map(|c| c.to_string()),
                message: "m [fbtrace_id Atrace]".into(),
                retry_after: None,
            },
        )
    }

    #[test]
    fn graph_errors_are_classified() {
        let wait = Duration::from_millis(5);
        let window = classify(&status(400, Some(OUTSIDE_WINDOW)), wait);
        assert!(
            matches!(&window, SendError::Rejected(m) if m.contains("24 hours") && m.contains("template")),
            "{window:?}"
        );
        for code in RATE_LIMIT_CODES {
            assert_eq!(
                classify(&status(400, Some(code)), wait),
                SendError::RateLimited(wait)
            );
        }
        assert_eq!(
            classify(&status(429, None), wait),
            SendError::RateLimited(wait)
        );
        let hinted = HttpError::new(
            GRAPH,
            Failure::Status {
                status: 429,
                code: None,
                message: "slow down".into(),
                retry_after: Some(Duration::from_secs(7)),
            },
        );
        assert_eq!(
            classify(&hinted, wait),
            SendError::RateLimited(Duration::from_secs(7))
        );
        assert!(matches!(
            classify(&status(401, Some(BAD_TOKEN)), wait),
            SendError::Unavailable(m) if m.contains("WHATSAPP_CLOUD_TOKEN")
        ));
        assert!(matches!(
            classify(&status(500, Some(1)), wait),
            SendError::Transient(_)
        ));
        assert!(matches!(
            classify(&status(503, None), wait),
            SendError::Transient(_)
        ));
        for s in [400, 403, 404] {
            assert!(matches!(
                classify(&status(s, Some(100)), wait),
                SendError::Rejected(m) if m.contains("Atrace")
            ));
        }
        assert!(matches!(
            classify(&HttpError::new(GRAPH, Failure::Connect("x".into())), wait),
            SendError::Unavailable(_)
        ));
        assert!(matches!(
            classify(&HttpError::new(GRAPH, Failure::Timeout("x".into())), wait),
            SendError::Ambiguous(_)
        ));
    }

    #[test]
    fn the_sent_id_is_read_from_the_answer() {
        let answer = serde_json::json!({"messaging_product": "whatsapp",
            "contacts": [{"input": "1", "wa_id": "1"}], "messages": [{"id": "wamid.OUT"}]});
        assert_eq!(sent_id(&answer).as_deref(), Some("wamid.OUT"));
        assert_eq!(sent_id(&serde_json::json!({})), None);
    }
}
