//! HTTP plumbing shared by the providers: timeouts, error construction and
//! secret hygiene.

use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use talaria_core::config::url_secrets;
use talaria_core::config::{AgentConfig, ToolCallParser, VisionMode};
use talaria_core::{Redactor, Secret};

use crate::classify::{classify, classify_transport};
use crate::{ErrorKind, LlmError};

/// How much of a server's error body is kept in a message.
const ERROR_BODY_CHARS: usize = 500;
/// How much of an error body is read at all (they are small; a huge one is
/// not worth the memory).
const ERROR_BODY_READ_LIMIT: usize = 64 * 1024;

/// Per-provider HTTP settings.
#[derive(Clone, PartialEq)]
pub struct HttpOptions {
    /// Time allowed to establish a connection.
    pub connect_timeout: Duration,
    /// A streaming response that sends no byte for this long is dropped
    /// (also the limit on waiting for a streaming response's head).
    pub stale_timeout: Duration,
    /// Total time allowed for a non-streaming request.
    pub request_timeout: Duration,
    /// Ask for a streamed response (a provider that refuses is switched to
    /// non-streaming automatically).
    pub stream: bool,
    /// `max_tokens` when the request does not set one.
    pub default_max_tokens: Option<u32>,
    /// `temperature` when the request does not set one.
    pub default_temperature: Option<f32>,
    /// Extra exact values to scrub from error messages (besides the key).
    pub secrets: Vec<String>,
    /// Whether the model is sent images (`model.vision`); `auto` asks
    /// [`crate::vision::sees_images`] about the model's name.
    pub vision: VisionMode,
    /// Which tool calls written as text in an answer become real calls
    /// (`model.tool_call_parser`; see [`crate::text_calls`]).
    pub tool_call_parser: ToolCallParser,
    /// Cache breakpoints for Claude models (`model.prompt_caching`).
    pub prompt_caching: talaria_core::config::PromptCachingConfig,
    /// OpenRouter's routing preferences (`model.openrouter`).
    pub openrouter: talaria_core::config::OpenRouterConfig,
}

impl Default for HttpOptions {
    fn default() -> HttpOptions {
        HttpOptions::from_agent(&AgentConfig::default())
    }
}

impl std::fmt::Debug for HttpOptions {
    // Hand-written so that logging the options never prints the secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOptions")
            .field("connect_timeout", &self.connect_timeout)
            .field("stale_timeout", &self.stale_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("stream", &self.stream)
            .field("default_max_tokens", &self.default_max_tokens)
            .field("default_temperature", &self.default_temperature)
            .field("secrets", &format_args!("[{} hidden]", self.secrets.len()))
            .field("vision", &self.vision)
            .field("tool_call_parser", &self.tool_call_parser)
            .field("prompt_caching", &self.prompt_caching)
            .field("openrouter", &self.openrouter)
            .finish()
    }
}

impl HttpOptions {
    /// The timeouts and streaming preference configured under `agent:`.
    pub fn from_agent(agent: &AgentConfig) -> HttpOptions {
        HttpOptions {
            connect_timeout: Duration::from_secs(agent.connect_timeout_secs.max(1)),
            stale_timeout: Duration::from_secs(agent.stream_stale_timeout_secs.max(1)),
            request_timeout: Duration::from_secs(agent.request_timeout_secs.max(1)),
            stream: agent.stream,
            default_max_tokens: None,
            default_temperature: None,
            secrets: Vec::new(),
            vision: VisionMode::Auto,
            tool_call_parser: ToolCallParser::Auto,
            prompt_caching: Default::default(),
            openrouter: Default::default(),
        }
    }
}

/// The HTTP side of one provider.
pub(crate) struct Http {
    /// Building a client only fails when the TLS backend cannot initialise;
    /// that is reported on first use instead of panicking at startup.
    client: Result<reqwest::Client, String>,
    pub(crate) opts: HttpOptions,
    redactor: Redactor,
    /// The exact key, scrubbed even when it is too short for the redactor.
    key: Option<String>,
    /// `provider:model`, for error messages.
    pub(crate) label: String,
}

impl Http {
    /// `base_url` is the endpoint's: credentials written into it (a
    /// `?api-key=...`, a `user:password@`) are scrubbed like the key, since
    /// a transport error names the URL.
    pub(crate) fn new(
        label: String,
        key: Option<&Secret>,
        base_url: &str,
        opts: HttpOptions,
    ) -> Http {
        let client = reqwest::Client::builder()
            .connect_timeout(opts.connect_timeout)
            .user_agent(concat!("talaria/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"));
        let key = key.map(|k| k.expose().to_owned()).filter(|k| !k.is_empty());
        let redactor = Redactor::new(
            opts.secrets
                .iter()
                .cloned()
                .chain(key.clone())
                .chain(url_secrets(base_url)),
        );
        Http {
            client,
            opts,
            redactor,
            key,
            label,
        }
    }

    pub(crate) fn client(&self) -> Result<&reqwest::Client, LlmError> {
        self.client
            .as_ref()
            .map_err(|m| self.error(ErrorKind::Unknown, None, m))
    }

    /// Removes the key and anything credential-shaped from text that may
    /// reach a message or log.
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut t = text.to_owned();
        // Keys below the redactor's minimum length are still replaced here;
        // very short values would shred ordinary words, so 4 is the floor.
        if let Some(k) = &self.key
            && k.len() >= 4
        {
            t = t.replace(k.as_str(), "[REDACTED]");
        }
        self.redactor.redact(&t)
    }

    pub(crate) fn error(&self, kind: ErrorKind, status: Option<u16>, message: &str) -> LlmError {
        LlmError {
            kind,
            status,
            // Scrub before cutting: a cut through the middle of a key would leave
            // a prefix no exact-value match can find.
            message: truncate(&self.scrub(message), ERROR_BODY_CHARS),
            retry_after: None,
            provider: self.label.clone(),
        }
    }

    pub(crate) fn interrupted(&self) -> LlmError {
        self.error(ErrorKind::Interrupted, None, "the request was interrupted")
    }

    pub(crate) fn transport(&self, e: &reqwest::Error) -> LlmError {
        // reqwest's own Display hides the cause ("error sending request");
        // the chain says what actually happened (refused, reset, ...).
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(e);
        while let Some(s) = src {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            src = s.source();
        }
        self.error(classify_transport(e), None, &msg)
    }

    /// Sends a request with the timeouts that fit its mode.
    pub(crate) async fn send(
        &self,
        rb: reqwest::RequestBuilder,
        streaming: bool,
    ) -> Result<reqwest::Response, LlmError> {
        if streaming {
            match tokio::time::timeout(self.opts.stale_timeout, rb.send()).await {
                Ok(r) => r.map_err(|e| self.transport(&e)),
                Err(_) => Err(self.stale()),
            }
        } else {
            rb.timeout(self.opts.request_timeout)
                .send()
                .await
                .map_err(|e| self.transport(&e))
        }
    }

    fn stale(&self) -> LlmError {
        self.error(
            ErrorKind::Timeout,
            None,
            &format!(
                "no data from the server for {:.1}s (stale stream)",
                self.opts.stale_timeout.as_secs_f64()
            ),
        )
    }

    /// The next chunk of a streaming body, or a Timeout error when the server
    /// has gone quiet for too long.
    pub(crate) async fn next_chunk<S>(&self, stream: &mut S) -> Result<Option<Bytes>, LlmError>
    where
        S: Stream<Item = reqwest::Result<Bytes>> + Unpin,
    {
        match tokio::time::timeout(self.opts.stale_timeout, stream.next()).await {
            Err(_) => Err(self.stale()),
            Ok(None) => Ok(None),
            Ok(Some(Ok(b))) => Ok(Some(b)),
            Ok(Some(Err(e))) => Err(self.transport(&e)),
        }
    }

    /// Reads a whole JSON body.
    pub(crate) async fn json(
        &self,
        resp: reqwest::Response,
    ) -> Result<serde_json::Value, LlmError> {
        let bytes = resp.bytes().await.map_err(|e| self.transport(&e))?;
        serde_json::from_slice(&bytes).map_err(|e| {
            self.error(
                ErrorKind::FormatError,
                None,
                &format!(
                    "the server answered with invalid JSON ({e}): {}",
                    String::from_utf8_lossy(&bytes)
                ),
            )
        })
    }

    /// Builds the classified error for a non-success response.
    pub(crate) async fn status_error(&self, resp: reqwest::Response) -> LlmError {
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let body = self.read_limited(resp).await;
        let kind = classify(status, &body);
        let mut err = self.error(kind, Some(status), &error_message(&body));
        err.retry_after = retry_after;
        err
    }

    async fn read_limited(&self, resp: reqwest::Response) -> String {
        let mut stream = resp.bytes_stream();
        let mut buf = Vec::new();
        while buf.len() < ERROR_BODY_READ_LIMIT {
            match tokio::time::timeout(self.opts.stale_timeout, stream.next()).await {
                Ok(Some(Ok(b))) => buf.extend_from_slice(&b),
                _ => break,
            }
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

/// `base` with `path` (which starts with `/`) appended to its path. A
/// query string in `base` (`.../v1?api-version=...&api-key=...`, as
/// Azure-style endpoints are written) stays at the end, where it belongs,
/// instead of swallowing the path.
pub(crate) fn join_url(base: &str, path: &str) -> String {
    let (head, query) = base.split_at(base.find(['?', '#']).unwrap_or(base.len()));
    format!("{}{path}{query}", head.trim_end_matches('/'))
}

/// `Retry-After` in seconds (fractions allowed); HTTP dates are ignored
/// because model servers do not send them and the backoff covers it.
pub(crate) fn parse_retry_after(v: &str) -> Option<Duration> {
    let secs: f64 = v.trim().parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(86_400.0)))
}

/// The human part of an error body: `error.message` from the usual JSON
/// shapes, else the body itself.
pub(crate) fn error_message(body: &str) -> String {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(body) {
        let msg = v
            .pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("error").filter(|e| e.is_string()))
            .and_then(|m| m.as_str());
        if let Some(m) = msg {
            let kind = v
                .pointer("/error/type")
                .or_else(|| v.pointer("/error/code"))
                .and_then(|t| t.as_str());
            return match kind {
                Some(k) => format!("{m} ({k})"),
                None => m.to_owned(),
            };
        }
    }
    let t = body.trim();
    if t.is_empty() {
        "(empty body)".to_owned()
    } else {
        t.to_owned()
    }
}

/// At most `max` characters, marked when cut.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// Whether a rejected streaming request was rejected *because* it streamed.
pub(crate) fn rejects_streaming(err: &LlmError) -> bool {
    matches!(err.status, Some(400 | 422 | 501))
        && err.message.to_ascii_lowercase().contains("stream")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_forms() {
        assert_eq!(parse_retry_after("1"), Some(Duration::from_secs(1)));
        assert_eq!(parse_retry_after(" 0.5 "), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-3"), None);
    }

    #[test]
    fn error_message_prefers_the_json_message() {
        assert_eq!(
            error_message(r#"{"error":{"message":"bad key","type":"invalid_request_error"}}"#),
            "bad key (invalid_request_error)"
        );
        assert_eq!(error_message("plain"), "plain");
        assert_eq!(error_message(""), "(empty body)");
    }

    #[test]
    fn truncation_respects_characters() {
        assert_eq!(truncate("ééé", 2), "éé…");
        assert_eq!(truncate("ab", 2), "ab");
    }

    #[test]
    fn paths_go_before_the_query() {
        assert_eq!(
            join_url("http://h/v1?api-key=abc", "/chat/completions"),
            "http://h/v1/chat/completions?api-key=abc"
        );
        assert_eq!(
            join_url("http://h/v1/", "/chat/completions"),
            "http://h/v1/chat/completions"
        );
    }

    #[test]
    fn credentials_in_the_base_url_are_scrubbed() {
        let h = Http::new(
            "p:m".into(),
            None,
            "http://bot:pw-0123456789@127.0.0.1:9/v1?api-version=1",
            HttpOptions::default(),
        );
        let e = h.error(
            ErrorKind::Network,
            None,
            "error sending request for url (http://bot:pw-0123456789@127.0.0.1:9/v1/chat/completions?api-key=in-query-0123456789)",
        );
        let shown = e.to_string();
        assert!(!shown.contains("pw-0123456789"), "{shown}");
        assert!(!shown.contains("in-query-0123456789"), "{shown}");
        assert!(shown.contains("127.0.0.1:9/v1/chat/completions"), "{shown}");
    }

    #[test]
    fn options_debug_hides_secrets() {
        let o = HttpOptions {
            secrets: vec!["hunter2-very-secret".into()],
            ..HttpOptions::default()
        };
        assert!(!format!("{o:?}").contains("hunter2"));
    }

    #[test]
    fn short_keys_are_scrubbed_too() {
        let h = Http::new(
            "p:m".into(),
            Some(&Secret::new("k3y!")),
            "http://127.0.0.1:9/v1",
            HttpOptions::default(),
        );
        assert_eq!(h.scrub("got k3y! here"), "got [REDACTED] here");
        let e = h.error(
            ErrorKind::Auth,
            Some(401),
            "sk-abcdefghijklmnopqrstu is wrong",
        );
        assert!(!e.to_string().contains("sk-abcdefghijklmnopqrstu"));
    }
}
