//! The signal-cli REST API over HTTP (`bbernhard/signal-cli-rest-api`),
//! and the payload types the adapter reads.
//!
//! The API has no authentication of its own (it is meant to sit on a
//! private network or behind a proxy), so no secret travels here; the
//! account number does, and errors never leave the process unredacted
//! anyway since they only reach logs.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use talaria_adapter::{Download, DownloadError};

use crate::http::{Answer, Http, HttpError, Service};
use crate::rest::{Refusal, Rest};

/// How errors name the server.
pub(crate) const SIGNAL: Service = Service {
    name: "the Signal REST API",
    request: "a Signal REST API request",
    code_label: None,
};

/// What a failed call looked like.
pub(crate) type ApiError = HttpError;

/// The server's error text, lower-cased, for the checks that can only go
/// by it (signal-cli reports most failures as a 400 with a text).
pub(crate) fn error_text(e: &ApiError) -> String {
    e.message().to_lowercase()
}

/// A client bound to one server.
pub(crate) type Api = Rest;

/// `base_url` is the server root.
pub(crate) fn client(base_url: &str) -> Result<Api, String> {
    Rest::new(SIGNAL, base_url, None, refusal)
}

/// Fetches the files signal-cli keeps (`GET /v1/attachments/{id}`), as
/// a stream: [`Rest`] reads answers whole, which a file must not be.
#[derive(Debug, Clone)]
pub(crate) struct Files {
    http: Http,
    root: String,
}

impl Files {
    /// `base_url` is the server root.
    pub(crate) fn new(base_url: &str) -> Result<Files, String> {
        Ok(Files {
            http: Http::new(SIGNAL)?,
            root: base_url.trim_end_matches('/').to_owned(),
        })
    }

    /// `GET /v1/attachments/{id}`, streamed. `id` is checked to be one
    /// path segment first ([`is_attachment_id`]).
    pub(crate) async fn download(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<Download, DownloadError> {
        let url = format!("{}/v1/attachments/{}", self.root, path_segment(id));
        self.http
            .download(self.http.client().get(url), timeout)
            .await
    }
}

/// Whether `id` looks like a signal-cli attachment id (letters, digits,
/// `-`, `_` and a `.` before an extension, never `..`): the locator only
/// ever names a file under the server's attachment directory.
pub(crate) fn is_attachment_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 200
        && !id.starts_with('.')
        && !id.contains("..")
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// One file as `POST /v2/send` takes it in `base64_attachments`:
/// `data:<mime>;filename=<name>;base64,<data>`. The name loses the
/// characters that would end a field of that line (`;`, `,`).
pub(crate) fn data_uri(mime: &str, name: &str, bytes: &[u8]) -> String {
    use base64::Engine;
    let name: String = name
        .chars()
        .filter(|c| !matches!(c, ';' | ',') && !c.is_control())
        .collect();
    let mime: String = mime
        .chars()
        .filter(|c| !matches!(c, ';' | ',') && !c.is_whitespace())
        .collect();
    let data = base64::engine::general_purpose::STANDARD.encode(bytes);
    format!("data:{mime};filename={name};base64,{data}")
}

/// The error body every endpoint uses: `{"error": "..."}`.
#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error: String,
}

fn refusal(answer: &Answer) -> Refusal {
    let message = match serde_json::from_slice::<ErrorBody>(&answer.body) {
        Ok(e) => clip(e.error.trim()),
        Err(_) => String::new(),
    };
    Refusal {
        code: None,
        message,
        retry_after: answer.retry_after(),
    }
}

/// `GET /v1/about`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct About {
    /// `normal`, `native` or `json-rpc`; missing on old servers.
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
}

/// The answer to `POST /v2/send`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct SendResponse {
    /// The new message's timestamp, as a decimal string (some versions
    /// give a number).
    #[serde(default)]
    pub timestamp: Value,
}

/// Server error texts can quote whole stack traces: one line, bounded.
fn clip(text: &str) -> String {
    let line = text.lines().next().unwrap_or("");
    let mut out: String = line.chars().take(300).collect();
    if out.len() < line.len() {
        out.push('…');
    }
    out
}

/// Percent-encodes one path segment (an account number keeps its `+`,
/// which paths carry as is).
pub(crate) fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'+') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::retry_after;
    use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};

    #[test]
    fn retry_hints_and_paths() {
        let secs = |h: &HeaderMap| retry_after(h).map(|d| d.as_secs());
        let mut h = HeaderMap::new();
        assert_eq!(secs(&h), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static("0.2"));
        assert_eq!(secs(&h), Some(1));
        h.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(secs(&h), None);
        assert_eq!(path_segment("+4915112345678"), "+4915112345678");
        assert_eq!(path_segment("a b/c"), "a%20b%2Fc");
    }

    #[test]
    fn attachment_ids_and_data_uris() {
        assert!(is_attachment_id("yLQ1Ddk_8e-x.png"));
        for bad in ["", "../etc", "a/b", ".hidden", "a..b", "a b"] {
            assert!(!is_attachment_id(bad), "{bad}");
        }
        assert_eq!(
            data_uri("image/png", "a;b,c.png", b"hi"),
            "data:image/png;filename=abc.png;base64,aGk="
        );
    }

    #[test]
    fn error_texts_are_one_bounded_line() {
        assert_eq!(clip("first\nsecond"), "first");
        assert_eq!(clip(&"x".repeat(400)).chars().count(), 301);
    }
}
