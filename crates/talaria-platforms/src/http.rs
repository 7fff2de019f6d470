//! The HTTP plumbing every REST-speaking adapter shares: one client
//! wrapper that sends a request and reads its answer, one error type
//! ([`HttpError`]) with the default reading of a failure for the delivery
//! ledger ([`HttpError::classify`]), and `Retry-After` parsing.
//!
//! Adapters keep only what is theirs: how their service's error body
//! reads, and the few failures their ledger policy treats apart (a revoked
//! token, a closed messaging window). Credentials are held as [`Secret`],
//! so a `Debug` print never shows one, and every error text leaving here
//! is scrubbed of the credential in case a server or proxy echoes it.

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, RETRY_AFTER};
use serde::de::DeserializeOwned;
use futures::StreamExt;
use talaria_adapter::{Download, DownloadError, SendError};
use talaria_core::Secret;

/// How a connection may take before a request counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Who a client talks to, as its errors name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Service {
    /// The service as the subject of a sentence: `Telegram`, `the
    /// homeserver`.
    pub name: &'static str,
    /// One request to it: `Telegram request`, `a Signal REST API request`.
    pub request: &'static str,
    /// How the service's own error code follows the status: `None` puts
    /// it after a space (`403 M_FORBIDDEN`), `Some(label)` in brackets
    /// (`400 (error 21610)`).
    pub code_label: Option<&'static str>,
}

/// What went wrong with one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The service answered, and refused.
    Status {
        status: u16,
        /// The service's own error code (`M_FORBIDDEN`, `21610`,
        /// `channel_not_found`), when it gave one.
        code: Option<String>,
        /// What it said, scrubbed of the credential; may be empty.
        message: String,
        /// How long it asked us to wait, when it did.
        retry_after: Option<Duration>,
    },
    /// No connection was made (refused, DNS): nothing was sent.
    Connect(String),
    /// The request timed out; it may have been processed.
    Timeout(String),
    /// Anything else after the request left (reset, unreadable body).
    Other(String),
}

/// A failed call to a service, naming the service when shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HttpError {
    pub service: Service,
    pub failure: Failure,
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Service { name, request, .. } = self.service;
        match &self.failure {
            Failure::Status {
                status, message, ..
            } => {
                write!(f, "{name} answered {status}")?;
                self.write_code(f)?;
                if !message.is_empty() {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            Failure::Connect(e) => write!(f, "cannot connect to {name}: {e}"),
            Failure::Timeout(e) => write!(f, "{request} timed out: {e}"),
            Failure::Other(e) => write!(f, "{request} failed: {e}"),
        }
    }
}

impl HttpError {
    /// A failure of `service` (for adapters that find one in a success
    /// answer, and for tests).
    pub(crate) fn new(service: Service, failure: Failure) -> HttpError {
        HttpError { service, failure }
    }

    /// The HTTP status the service answered with.
    pub(crate) fn status(&self) -> Option<u16> {
        match &self.failure {
            Failure::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The service's own error code.
    pub(crate) fn code(&self) -> Option<&str> {
        match &self.failure {
            Failure::Status { code, .. } => code.as_deref(),
            _ => None,
        }
    }

    /// What the service said (empty for failures without an answer).
    pub(crate) fn message(&self) -> &str {
        match &self.failure {
            Failure::Status { message, .. } => message,
            _ => "",
        }
    }

    /// The wait the service asked for.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match &self.failure {
            Failure::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The refusal in a few words for the ledger: `404: Unknown Channel`,
    /// `403 M_FORBIDDEN: ...`, `HTTP 502` when the service said nothing.
    pub(crate) fn reason(&self) -> String {
        match &self.failure {
            Failure::Status {
                status,
                code,
                message,
                ..
            } => {
                let code = code.as_deref().map(|c| format!(" {c}")).unwrap_or_default();
                if message.is_empty() {
                    format!("HTTP {status}{code}")
                } else {
                    format!("{status}{code}: {message}")
                }
            }
            Failure::Connect(m) | Failure::Timeout(m) | Failure::Other(m) => m.clone(),
        }
    }

    /// The default reading for the delivery ledger: a 429 waits (a second
    /// when no wait was named), 5xx may pass later, any other refusal will
    /// not; nothing sent when no connection was made, and a timeout may
    /// have delivered. Adapters match their special cases first.
    pub(crate) fn classify(self) -> SendError {
        match &self.failure {
            Failure::Status {
                status: 429,
                retry_after,
                ..
            } => SendError::RateLimited(retry_after.unwrap_or(Duration::from_secs(1))),
            Failure::Status { status, .. } if *status >= 500 => SendError::Transient(self.reason()),
            Failure::Status { .. } => SendError::Rejected(self.reason()),
            Failure::Connect(m) => SendError::Unavailable(m.clone()),
            Failure::Timeout(m) | Failure::Other(m) => SendError::Ambiguous(m.clone()),
        }
    }

    fn write_code(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code(), self.service.code_label) {
            (Some(code), None) => write!(f, " {code}"),
            (Some(code), Some(label)) => write!(f, " ({label} {code})"),
            (None, _) => Ok(()),
        }
    }
}

/// One answer, read whole.
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// A 2xx status.
    pub(crate) fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// `Retry-After` in seconds (whole or fractional, rounded up).
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        retry_after(&self.headers)
    }
}

/// A client of one service, holding the credential its errors are
/// scrubbed of.
#[derive(Debug, Clone)]
pub(crate) struct Http {
    client: reqwest::Client,
    service: Service,
    /// Never shown; replaced by `placeholder` in every error text.
    secret: Option<Secret>,
    placeholder: &'static str,
}

impl Http {
    /// A client for `service` with the usual connect timeout.
    pub(crate) fn new(service: Service) -> Result<Http, String> {
        Http::with(service, reqwest::Client::builder())
    }

    /// A client from `builder` (for a user agent of the service's liking).
    pub(crate) fn with(service: Service, builder: reqwest::ClientBuilder) -> Result<Http, String> {
        let client = builder
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| e.without_url().to_string())?;
        Ok(Http {
            client,
            service,
            secret: None,
            placeholder: "<token>",
        })
    }

    /// Scrubs `secret` from every error, shown as `placeholder` instead.
    pub(crate) fn hiding(mut self, secret: &Secret, placeholder: &'static str) -> Http {
        self.secret = Some(secret.clone()).filter(|s| !s.expose().is_empty());
        self.placeholder = placeholder;
        self
    }

    /// The underlying client, to build requests with.
    pub(crate) fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// Sends `request` within `timeout` and reads the whole answer, of
    /// any status.
    pub(crate) async fn send(
        &self,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<Answer, HttpError> {
        let response = request
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| self.network_error(e))?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.bytes().await.map_err(|e| self.network_error(e))?;
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// Starts fetching a file: the status is checked, the body is handed
    /// over as a stream (never read whole here). `timeout` bounds the
    /// whole transfer, body included.
    pub(crate) async fn download(
        &self,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<Download, DownloadError> {
        let response = request.timeout(timeout).send().await.map_err(|e| {
            DownloadError::Unavailable(self.network_error(e).to_string())
        })?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            // The body may explain; a short piece of it is enough.
            let body = response.bytes().await.unwrap_or_default();
            let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
            let why = self.refused(status, None, text.trim(), None).to_string();
            return Err(match status {
                403 | 404 | 410 => DownloadError::Gone(why),
                413 => DownloadError::TooLarge(why),
                _ => DownloadError::Unavailable(why),
            });
        }
        let length = response.content_length();
        let this = self.clone();
        let body = response.bytes_stream().map(move |chunk| {
            chunk.map_err(|e| std::io::Error::other(this.network_error(e).to_string()))
        });
        Ok(Download {
            reader: Box::pin(tokio_util::io::StreamReader::new(body)),
            length,
        })
    }

    /// Decodes a success answer. A success status with a garbled body may
    /// still mean the request took effect: ambiguous, never retried as
    /// transient.
    pub(crate) fn decode<T: DeserializeOwned>(&self, answer: &Answer) -> Result<T, HttpError> {
        serde_json::from_slice(&answer.body).map_err(|e| {
            self.fail(Failure::Other(format!(
                "HTTP {} with an unreadable body: {e}",
                answer.status
            )))
        })
    }

    /// A refusal, its code and message scrubbed of the credential.
    pub(crate) fn refused(
        &self,
        status: u16,
        code: Option<String>,
        message: &str,
        retry_after: Option<Duration>,
    ) -> HttpError {
        self.fail(Failure::Status {
            status,
            code: code.map(|c| self.redact(&c)),
            message: self.redact(message),
            retry_after,
        })
    }

    /// `failure`, as this service's.
    pub(crate) fn fail(&self, failure: Failure) -> HttpError {
        HttpError::new(self.service, failure)
    }

    /// A transport failure: which kind, and its text without the URL
    /// (which may carry the credential) but with the whole source chain,
    /// scrubbed in case a layer below repeats it.
    pub(crate) fn network_error(&self, e: reqwest::Error) -> HttpError {
        let connect = e.is_connect();
        let timeout = e.is_timeout();
        let e = e.without_url();
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        let text = self.redact(&text);
        self.fail(if connect {
            Failure::Connect(text)
        } else if timeout {
            Failure::Timeout(text)
        } else {
            Failure::Other(text)
        })
    }

    /// `text` with the credential replaced.
    pub(crate) fn redact(&self, text: &str) -> String {
        match &self.secret {
            Some(s) => text.replace(s.expose(), self.placeholder),
            None => text.to_owned(),
        }
    }
}

/// A file on disk as one part of a multipart upload, streamed from the
/// disk as the request is sent rather than read into memory first.
pub(crate) async fn file_part(
    path: &std::path::Path,
    name: &str,
    mime: &str,
) -> std::io::Result<reqwest::multipart::Part> {
    let file = tokio::fs::File::open(path).await?;
    let len = file.metadata().await?.len();
    let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(file));
    reqwest::multipart::Part::stream_with_length(body, len)
        .file_name(name.to_owned())
        .mime_str(mime)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))
}

/// A header holding a number of seconds (`Retry-After` and its kin),
/// rounded up; fractions and spaces are handled, negative, non-finite and
/// nonsense values ignored.
pub(crate) fn header_secs(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| s.ceil() as u64)
}

/// `Retry-After` as a wait.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    header_secs(headers, RETRY_AFTER.as_str()).map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST: Service = Service {
        name: "the service",
        request: "a service request",
        code_label: None,
    };

    fn status(status: u16, code: Option<&str>, message: &str) -> HttpError {
        HttpError::new(
            TEST,
            Failure::Status {
                status,
                code: code.map(str::to_owned),
                message: message.to_owned(),
                retry_after: None,
            },
        )
    }

    #[test]
    fn header_seconds_round_up_and_refuse_nonsense() {
        let mut h = HeaderMap::new();
        for (value, want) in [
            ("2", Some(2)),
            (" 1.2 ", Some(2)),
            ("-1", None),
            ("soon", None),
        ] {
            h.insert("retry-after", value.parse().unwrap());
            assert_eq!(header_secs(&h, "retry-after"), want, "{value}");
        }
        assert_eq!(header_secs(&h, "x-absent"), None);
    }

    #[test]
    fn errors_name_the_service_and_its_code() {
        assert_eq!(
            status(403, Some("M_FORBIDDEN"), "no").to_string(),
            "the service answered 403 M_FORBIDDEN: no"
        );
        let labelled = HttpError {
            service: Service {
                code_label: Some("error"),
                ..TEST
            },
            ..status(400, Some("21610"), "")
        };
        assert_eq!(
            labelled.to_string(),
            "the service answered 400 (error 21610)"
        );
        let timeout = HttpError::new(TEST, Failure::Timeout("slow".into()));
        assert_eq!(timeout.to_string(), "a service request timed out: slow");
    }

    #[test]
    fn the_default_classification() {
        let limited = HttpError::new(
            TEST,
            Failure::Status {
                status: 429,
                code: None,
                message: String::new(),
                retry_after: Some(Duration::from_secs(7)),
            },
        );
        assert_eq!(
            limited.classify(),
            SendError::RateLimited(Duration::from_secs(7))
        );
        assert_eq!(
            status(429, None, "").classify(),
            SendError::RateLimited(Duration::from_secs(1))
        );
        assert_eq!(
            status(502, None, "").classify(),
            SendError::Transient("HTTP 502".into())
        );
        assert_eq!(
            status(404, None, "Unknown Channel").classify(),
            SendError::Rejected("404: Unknown Channel".into())
        );
        assert_eq!(
            HttpError::new(TEST, Failure::Connect("refused".into())).classify(),
            SendError::Unavailable("refused".into())
        );
        assert_eq!(
            HttpError::new(TEST, Failure::Other("reset".into())).classify(),
            SendError::Ambiguous("reset".into())
        );
    }

    #[test]
    fn the_credential_is_scrubbed() {
        let http = Http::new(TEST)
            .unwrap()
            .hiding(&Secret::new("s3cret-value"), "<token>");
        let e = http.refused(401, None, "bad token s3cret-value", None);
        assert_eq!(e.message(), "bad token <token>");
        assert!(!format!("{http:?}").contains("s3cret-value"));
    }
}
