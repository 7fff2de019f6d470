//! What the clients of OpenAI-compatible media endpoints share: the
//! client, the key, bounded bodies, and a server's error in few words.

use std::time::Duration;

use futures::TryStreamExt;
use talaria_core::{Env, Secret};
use tokio_util::io::StreamReader;

/// OpenAI's root, used when no `base_url` is set.
pub(crate) const OPENAI_BASE: &str = "https://api.openai.com/v1";

/// The most of an error body read: enough for any JSON error.
const ERROR_BODY_MAX: usize = 16 * 1024;

/// The most of a server's message shown.
const MESSAGE_MAX: usize = 300;

/// `base` without a trailing slash, OpenAI's when unset.
pub(crate) fn base_url(configured: Option<&str>) -> String {
    configured
        .map(str::trim)
        .filter(|b| !b.is_empty())
        .unwrap_or(OPENAI_BASE)
        .trim_end_matches('/')
        .to_owned()
}

/// The configured key, else the first of `vars` set in the environment.
pub(crate) fn key(configured: Option<&Secret>, env: &Env, vars: &[&str]) -> Option<Secret> {
    configured
        .filter(|k| !k.expose().trim().is_empty())
        .cloned()
        .or_else(|| vars.iter().find_map(|v| env.get(v)).map(Secret::new))
}

/// A client with an overall deadline per request.
pub(crate) fn client(timeout: Duration) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(30)))
        .build()
        .map_err(|e| format!("cannot set up the HTTP client: {e}"))
}

/// A request error in words, with the key never in them.
pub(crate) fn transport_error(e: &reqwest::Error, key: Option<&Secret>) -> String {
    let what = if e.is_timeout() {
        "the server did not answer in time".to_owned()
    } else if e.is_connect() {
        "cannot connect to the server".to_owned()
    } else {
        // reqwest's text can include the URL; no key is ever in it, but
        // redact anyway so a key put in a base URL stays hidden.
        let mut text = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        text
    };
    redact(&what, key)
}

/// What a server said when it refused: OpenAI's `{"error": {"message"}}`,
/// else the start of the body, with the key redacted (servers echo a
/// wrong key back).
pub(crate) async fn error_message(response: reqwest::Response, key: Option<&Secret>) -> String {
    let status = response.status();
    let body = read_bounded(response, ERROR_BODY_MAX)
        .await
        .unwrap_or_default();
    let from_json = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.get("error").filter(|e| e.is_string()))
                .or_else(|| v.get("detail").filter(|e| e.is_string()))
                .or_else(|| v.get("message"))
                .and_then(|m| m.as_str())
                .map(str::to_owned)
        });
    let message = from_json.unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
    let message: String = message
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(MESSAGE_MAX)
        .collect();
    let message = redact(&message, key);
    if message.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {message}")
    }
}

/// `text` with the key (and any long run of it) replaced.
pub(crate) fn redact(text: &str, key: Option<&Secret>) -> String {
    let Some(key) = key.map(Secret::expose).filter(|k| k.len() >= 4) else {
        return text.to_owned();
    };
    let mut out = text.replace(key, "[redacted]");
    // Servers often echo part of a wrong key (`sk-abc...wxyz`): hide any
    // 8-character piece of it too.
    if key.len() >= 12 && key.is_ascii() {
        for start in 0..=key.len() - 8 {
            let piece = &key[start..start + 8];
            if out.contains(piece) {
                out = out.replace(piece, "[redacted]");
            }
        }
    }
    out
}

/// The body, at most `max` bytes; `None` when it is longer or breaks off.
pub(crate) async fn read_bounded(mut response: reqwest::Response, max: usize) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.ok()? {
        if body.len() + chunk.len() > max {
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    Some(body)
}

/// The body as a reader, for streaming it into the cache.
pub(crate) fn body_reader(response: reqwest::Response) -> impl tokio::io::AsyncRead + Unpin {
    StreamReader::new(response.bytes_stream().map_err(std::io::Error::other))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_pieces_of_them_are_redacted() {
        let key = Secret::new("sk-test-0123456789abcdef");
        let said = "Incorrect API key provided: sk-test-0123456789abcdef. Also sk-test-...9abcdef";
        let shown = redact(said, Some(&key));
        assert!(!shown.contains("0123456789"), "{shown}");
        assert!(!shown.contains("89abcdef"), "{shown}");
        assert!(
            shown.starts_with("Incorrect API key provided: [redacted]"),
            "{shown}"
        );
        assert_eq!(redact("nothing", None), "nothing");
    }

    #[test]
    fn the_key_comes_from_config_then_the_environment() {
        let env = Env::from_pairs([("B", "from-b"), ("C", "from-c")]);
        let configured = Secret::new("from-config");
        assert_eq!(
            key(Some(&configured), &env, &["A", "B"]).map(|k| k.expose().to_owned()),
            Some("from-config".to_owned())
        );
        assert_eq!(
            key(None, &env, &["A", "B", "C"]).map(|k| k.expose().to_owned()),
            Some("from-b".to_owned())
        );
        assert!(key(None, &env, &["A"]).is_none());
        assert_eq!(base_url(None), OPENAI_BASE);
        assert_eq!(base_url(Some("http://x/v1/")), "http://x/v1");
    }
}
