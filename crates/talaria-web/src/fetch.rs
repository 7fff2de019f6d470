//! Fetching a URL a chat named, through the [`UrlGuard`], within limits:
//! redirects, bytes and time.

use std::fmt;
use std::time::Duration;

use futures::StreamExt;
use reqwest::Url;
use talaria_core::config::WebConfig;

use crate::guard::{GuardError, RedirectError, UrlGuard};

/// How much one fetch may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest body read, in bytes.
    pub max_bytes: u64,
    /// The whole fetch, redirects and body included.
    pub timeout: Duration,
    /// Redirects followed.
    pub max_redirects: usize,
}

impl Limits {
    /// The limits `web:` sets.
    pub fn from_config(web: &WebConfig) -> Limits {
        Limits {
            max_bytes: web.max_bytes,
            timeout: Duration::from_secs(web.timeout_secs),
            max_redirects: web.max_redirects,
        }
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits::from_config(&WebConfig::default())
    }
}

/// What a fetch brought back.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// Where the body came from, after redirects.
    pub url: Url,
    /// The response's `Content-Type`, if any.
    pub content_type: Option<String>,
    /// The body, at most [`Limits::max_bytes`].
    pub body: Vec<u8>,
    /// The body was longer and this is its beginning (only with
    /// [`Oversize::Truncate`]).
    pub truncated: bool,
}

impl Fetched {
    /// The media type without parameters, lower case (`text/html`).
    pub fn mime(&self) -> Option<String> {
        self.content_type.as_deref().map(|c| {
            c.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
    }
}

/// What to do with a body larger than the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Oversize {
    /// Refuse it ([`FetchError::TooLarge`]).
    Refuse,
    /// Keep its beginning, up to the limit.
    Truncate,
}

/// Why a fetch failed, in words fit for the model.
#[derive(Debug)]
pub enum FetchError {
    /// Not a URL.
    BadUrl(String),
    /// The guard refused the URL, a redirect, or what a name resolved to.
    Guard(GuardError),
    /// A redirect not followed (a loop, or too many).
    Redirect(String),
    /// The body is larger than the limit.
    TooLarge {
        /// The limit, in bytes.
        limit: u64,
    },
    /// The fetch took longer than the limit.
    Timeout(Duration),
    /// The server answered with an error status.
    Status {
        /// The status code.
        code: u16,
        /// The URL that answered it.
        url: String,
    },
    /// The connection or the transfer failed.
    Network(String),
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchError::BadUrl(e) => write!(f, "not a URL: {e}"),
            FetchError::Guard(e) => e.fmt(f),
            FetchError::Redirect(e) => write!(f, "redirect not followed: {e}"),
            FetchError::TooLarge { limit } => write!(
                f,
                "the response is larger than {} (web.max_bytes)",
                human_bytes(*limit)
            ),
            FetchError::Timeout(d) => write!(
                f,
                "no complete answer within {} s (web.timeout_secs)",
                d.as_secs()
            ),
            FetchError::Status { code, url } => write!(f, "{url} answered HTTP {code}"),
            FetchError::Network(e) => write!(f, "the fetch failed: {e}"),
        }
    }
}

impl std::error::Error for FetchError {}

/// `10 MB`, `512 kB`, `100 bytes`.
pub fn human_bytes(n: u64) -> String {
    if n >= 1024 * 1024 && n.is_multiple_of(1024 * 1024) {
        format!("{} MB", n / (1024 * 1024))
    } else if n >= 1024 && n.is_multiple_of(1024) {
        format!("{} kB", n / 1024)
    } else {
        format!("{n} bytes")
    }
}

/// Fetches URLs through the guard. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Fetcher {
    guard: UrlGuard,
    client: reqwest::Client,
    limits: Limits,
}

impl Fetcher {
    /// A fetcher with `guard`'s policy and `limits`.
    ///
    /// # Errors
    /// When the TLS backend cannot start.
    pub fn new(guard: UrlGuard, limits: Limits) -> Result<Fetcher, FetchError> {
        let client = guard
            .client(limits.max_redirects)
            .map_err(|e| FetchError::Network(e.to_string()))?;
        Ok(Fetcher {
            guard,
            client,
            limits,
        })
    }

    /// The guard this fetcher applies.
    pub fn guard(&self) -> &UrlGuard {
        &self.guard
    }

    /// The limits this fetcher applies.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// GETs `url`, with `accept` as the `Accept` header.
    ///
    /// # Errors
    /// [`FetchError`], each with a sentence for the model.
    pub async fn get(
        &self,
        url: &str,
        accept: &str,
        oversize: Oversize,
    ) -> Result<Fetched, FetchError> {
        let url = Url::parse(url.trim()).map_err(|e| FetchError::BadUrl(format!("{url}: {e}")))?;
        self.guard.check_url(&url).map_err(FetchError::Guard)?;
        let deadline = self.limits.timeout;
        tokio::time::timeout(deadline, self.get_checked(url, accept, oversize))
            .await
            .map_err(|_| FetchError::Timeout(deadline))?
    }

    async fn get_checked(
        &self,
        url: Url,
        accept: &str,
        oversize: Oversize,
    ) -> Result<Fetched, FetchError> {
        let response = self
            .client
            .get(url)
            .header(reqwest::header::ACCEPT, accept)
            .send()
            .await
            .map_err(classify)?;
        let status = response.status();
        let final_url = response.url().clone();
        if !status.is_success() {
            return Err(FetchError::Status {
                code: status.as_u16(),
                url: final_url.to_string(),
            });
        }
        let limit = self.limits.max_bytes;
        if oversize == Oversize::Refuse && response.content_length().is_some_and(|n| n > limit) {
            return Err(FetchError::TooLarge { limit });
        }
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let mut body = Vec::new();
        let mut truncated = false;
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(classify)?;
            let room = usize::try_from(limit)
                .unwrap_or(usize::MAX)
                .saturating_sub(body.len());
            if chunk.len() > room {
                if oversize == Oversize::Refuse {
                    return Err(FetchError::TooLarge { limit });
                }
                body.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Fetched {
            url: final_url,
            content_type,
            body,
            truncated,
        })
    }
}

/// A reqwest error as what it means: the guard's refusal and redirect
/// errors are found in its chain of causes.
fn classify(e: reqwest::Error) -> FetchError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        if let Some(g) = s.downcast_ref::<GuardError>() {
            return FetchError::Guard(g.clone());
        }
        if let Some(r) = s.downcast_ref::<RedirectError>() {
            return FetchError::Redirect(r.0.clone());
        }
        source = s.source();
    }
    if e.is_timeout() {
        return FetchError::Network("the server did not answer in time".to_owned());
    }
    // Without the URL: it is the one the caller passed, and a query can
    // carry what the log should not.
    FetchError::Network(e.without_url().to_string())
}
