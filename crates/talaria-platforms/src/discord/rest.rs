//! Discord's REST API: JSON requests with `Authorization: Bot <token>`, and
//! the rate-limit bookkeeping Discord asks clients to do.
//!
//! Discord announces limits per bucket in `X-RateLimit-*` headers. When a
//! response says `Remaining: 0`, the next request in that bucket (for the
//! same channel) waits `Reset-After` seconds instead of earning a 429. A
//! 429 still happens (shared and global limits), and then its
//! `retry_after` is honoured a bounded number of times.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::{Method, Url};
use serde_json::Value;
use talaria_adapter::{Download, DownloadError};
use talaria_core::Secret;
use tokio::time::Instant;

use crate::http::{Failure, Http, HttpError, Service};

/// Retries after a 429 before the caller hears about it.
const MAX_RATE_LIMIT_RETRIES: u32 = 3;

/// Longer waits than this are not worth blocking a send for.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Hosts Discord serves attachments from (besides the API's own host).
pub(crate) const FILE_HOSTS: &[&str] = &["cdn.discordapp.com", "media.discordapp.net"];

/// Redirects followed while fetching, each to a Discord file address.
const MAX_REDIRECTS: usize = 5;

/// Whether `url` is one Discord serves files from: HTTPS on its CDN
/// hosts, or the configured API base's own scheme, host and port. Nothing
/// else is fetched, so an address in a message cannot point the bot at
/// another machine (or one inside its network).
pub(crate) fn is_file_url(url: &Url, api: &Url) -> bool {
    let no_credentials = url.username().is_empty() && url.password().is_none();
    let host_ok = match url.host_str() {
        Some(h) if FILE_HOSTS.contains(&h) => {
            url.scheme() == "https" && url.port_or_known_default() == Some(443)
        }
        Some(h) => {
            Some(h) == api.host_str()
                && url.scheme() == api.scheme()
                && url.port_or_known_default() == api.port_or_known_default()
        }
        None => false,
    };
    no_credentials && host_ok
}

/// A file to upload with a message: where it is on disk, and the name and
/// type it is sent under.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FileUpload<'a> {
    pub path: &'a std::path::Path,
    pub name: &'a str,
    pub mime: &'a str,
}

/// How errors name Discord.
pub(crate) const DISCORD: Service = Service {
    name: "Discord",
    request: "Discord request",
    code_label: None,
};

/// What a failed request looked like; a rate limit still in force after
/// the retries (or asking too long a wait) is a 429 naming its wait.
pub(crate) type RestError = HttpError;

#[derive(Debug, Default)]
struct Limits {
    /// Route (method and path template) -> the bucket Discord named for it.
    buckets: HashMap<String, String>,
    /// Bucket and major parameter -> when it has requests again.
    exhausted: HashMap<String, Instant>,
    /// A global 429 blocks every request until then.
    global: Option<Instant>,
}

/// A REST client bound to one bot token.
#[derive(Debug)]
pub(crate) struct Rest {
    http: Http,
    api_base: String,
    /// `Bot <token>`, the `Authorization` header.
    auth: Secret,
    limits: Mutex<Limits>,
}

impl Rest {
    pub(crate) fn new(api_base: &str, token: &Secret) -> Result<Rest, String> {
        let api = Url::parse(api_base).map_err(|e| format!("{api_base}: {e}"))?;
        // A redirect is followed only to another Discord file address: a
        // file host must not hand the bot on to anywhere else.
        let redirects = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() < MAX_REDIRECTS && is_file_url(attempt.url(), &api) {
                attempt.follow()
            } else {
                attempt.stop()
            }
        });
        let builder = reqwest::Client::builder()
            .redirect(redirects)
            .user_agent(concat!(
                "DiscordBot (talaria, ",
                env!("CARGO_PKG_VERSION"),
                ")"
            ));
        Ok(Rest {
            http: Http::with(DISCORD, builder)?.hiding(token, "<token>"),
            api_base: api_base.trim_end_matches('/').to_owned(),
            auth: Secret::new(format!("Bot {}", token.expose())),
            limits: Mutex::new(Limits::default()),
        })
    }

    /// Sends one request and decodes the JSON answer (`Null` for 204).
    ///
    /// `route` names the rate-limit route (`POST /channels/{id}/messages`)
    /// and `major` its major parameter (the channel id), which together
    /// with Discord's bucket decide which requests share a limit.
    pub(crate) async fn request(
        &self,
        method: Method,
        path: &str,
        route: &str,
        major: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<Value, RestError> {
        self.exchange(method, path, route, major, body, None, timeout)
            .await
    }

    /// Posts `payload` with one file as `multipart/form-data`
    /// (`payload_json` and `files[0]`), the file streamed from disk anew
    /// for each attempt; otherwise as [`Self::request`].
    pub(crate) async fn upload(
        &self,
        path: &str,
        route: &str,
        major: &str,
        payload: &Value,
        file: FileUpload<'_>,
        timeout: Duration,
    ) -> Result<Value, RestError> {
        self.exchange(
            Method::POST,
            path,
            route,
            major,
            Some(payload),
            Some(file),
            timeout,
        )
        .await
    }

    /// Starts fetching an attachment from its signed CDN address, streamed.
    /// The caller has checked `url` with [`is_file_url`]. No
    /// `Authorization`: the address carries its own signature, and the
    /// bot's token never goes to a file host.
    pub(crate) async fn fetch(
        &self,
        url: Url,
        timeout: Duration,
    ) -> Result<Download, DownloadError> {
        self.http
            .download(self.http.client().get(url), timeout)
            .await
    }

    #[allow(clippy::too_many_arguments)] // the two public shapes above
    async fn exchange(
        &self,
        method: Method,
        path: &str,
        route: &str,
        major: &str,
        body: Option<&Value>,
        file: Option<FileUpload<'_>>,
        timeout: Duration,
    ) -> Result<Value, RestError> {
        let mut retries = 0;
        loop {
            self.wait_for_bucket(route, major).await?;
            let mut req = self
                .http
                .client()
                .request(method.clone(), format!("{}{path}", self.api_base))
                .header(reqwest::header::AUTHORIZATION, self.auth.expose());
            match (body, file) {
                (Some(b), Some(f)) => {
                    let part = crate::http::file_part(f.path, f.name, f.mime)
                        .await
                        // Nothing was sent: as a connection never made.
                        .map_err(|e| {
                            self.http.fail(Failure::Connect(format!(
                                "cannot read the file {} to send it: {e}",
                                f.name
                            )))
                        })?;
                    let form = reqwest::multipart::Form::new()
                        .text("payload_json", b.to_string())
                        .part("files[0]", part);
                    req = req.multipart(form);
                }
                (Some(b), None) => req = req.json(b),
                (None, _) => {}
            }
            let answer = self.http.send(req, timeout).await?;
            let status = answer.status;
            self.remember_limits(route, major, &answer.headers);
            let headers = answer.headers;
            let bytes = answer.body;
            let json: Option<Value> = serde_json::from_slice(&bytes).ok();
            if status == 429 {
                let wait = retry_after(json.as_ref(), &headers);
                let global = json
                    .as_ref()
                    .and_then(|j| j.get("global"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
                    || headers
                        .get("x-ratelimit-global")
                        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
                if global {
                    self.lock().global = Some(Instant::now() + wait);
                }
                if retries >= MAX_RATE_LIMIT_RETRIES || wait > MAX_WAIT {
                    return Err(self.rate_limited(wait));
                }
                retries += 1;
                tracing::info!(route, ?wait, global, "Discord rate limit; waiting");
                tokio::time::sleep(wait).await;
                continue;
            }
            if (200..300).contains(&status) {
                return match json {
                    Some(v) => Ok(v),
                    None if bytes.is_empty() => Ok(Value::Null),
                    // A success with a garbled body may still mean the
                    // message went out: ambiguous, never transient.
                    None => Err(self.http.fail(Failure::Other(format!(
                        "HTTP {status} without a readable answer"
                    )))),
                };
            }
            let message = json
                .as_ref()
                .and_then(|j| j.get("message"))
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| format!("HTTP {status}"));
            return Err(self.http.refused(status, None, &message, None));
        }
    }

    /// A rate limit the caller hears about, with the wait it asks for.
    fn rate_limited(&self, wait: Duration) -> RestError {
        self.http.refused(429, None, "rate limited", Some(wait))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Limits> {
        self.limits.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sleeps while the route's bucket (or everything) is exhausted.
    async fn wait_for_bucket(&self, route: &str, major: &str) -> Result<(), RestError> {
        let until = {
            let mut limits = self.lock();
            let now = Instant::now();
            let bucket = limits
                .buckets
                .get(route)
                .map(|b| format!("{b}:{major}"))
                .and_then(|key| limits.exhausted.get(&key).copied());
            let global = limits.global.filter(|g| *g > now);
            if global.is_none() {
                limits.global = None;
            }
            bucket.into_iter().chain(global).max()
        };
        if let Some(until) = until {
            let wait = until.saturating_duration_since(Instant::now());
            if wait > MAX_WAIT {
                return Err(self.rate_limited(wait));
            }
            if !wait.is_zero() {
                tracing::debug!(route, ?wait, "Discord bucket exhausted; waiting");
                tokio::time::sleep(wait).await;
            }
        }
        Ok(())
    }

    fn remember_limits(&self, route: &str, major: &str, headers: &HeaderMap) {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let Some(bucket) = header("x-ratelimit-bucket") else {
            return;
        };
        let key = format!("{bucket}:{major}");
        let mut limits = self.lock();
        limits.buckets.insert(route.to_owned(), bucket.to_owned());
        let remaining = header("x-ratelimit-remaining").and_then(|v| v.trim().parse::<u64>().ok());
        let reset_after = header("x-ratelimit-reset-after")
            .and_then(|v| v.trim().parse::<f64>().ok())
            .and_then(seconds);
        match (remaining, reset_after) {
            (Some(0), Some(after)) => {
                limits.exhausted.insert(key, Instant::now() + after);
            }
            _ => {
                limits.exhausted.remove(&key);
            }
        }
    }
}

/// A non-negative, finite number of seconds as a duration.
fn seconds(s: f64) -> Option<Duration> {
    (s.is_finite() && s >= 0.0).then(|| Duration::from_secs_f64(s.min(1e6)))
}

/// How long a 429 asks us to wait: the body's `retry_after`, else the
/// `Retry-After` header, else a second.
fn retry_after(body: Option<&Value>, headers: &HeaderMap) -> Duration {
    body.and_then(|j| j.get("retry_after"))
        .and_then(Value::as_f64)
        .and_then(seconds)
        .or_else(|| {
            headers
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<f64>().ok())
                .and_then(seconds)
        })
        .unwrap_or(Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_discord_file_addresses_are_fetched() {
        let api = Url::parse("http://127.0.0.1:4000/api/v10").unwrap();
        let ok = |u: &str| is_file_url(&Url::parse(u).unwrap(), &api);
        assert!(ok(
            "https://cdn.discordapp.com/attachments/1/2/a.png?ex=1&is=2&hm=3"
        ));
        assert!(ok("https://MEDIA.discordapp.net/attachments/1/2/a.png"));
        assert!(ok("http://127.0.0.1:4000/attachments/1/2/a.png"));
        assert!(!ok("http://cdn.discordapp.com/attachments/1/2/a.png"));
        assert!(!ok("https://cdn.discordapp.com:8443/a.png"));
        assert!(!ok("https://cdn.discordapp.com.evil.example/a.png"));
        assert!(!ok("https://user:pw@cdn.discordapp.com/a.png"));
        assert!(!ok("http://127.0.0.1:4001/attachments/1/2/a.png"));
        assert!(!ok("https://127.0.0.1:4000/attachments/1/2/a.png"));
        assert!(!ok("http://169.254.169.254/latest/meta-data"));
        assert!(!ok("file:///etc/passwd"));
    }

    #[test]
    fn retry_after_prefers_the_body_and_rejects_nonsense() {
        let mut h = HeaderMap::new();
        h.insert(reqwest::header::RETRY_AFTER, "3".parse().unwrap());
        assert_eq!(
            retry_after(Some(&json!({"retry_after": 0.25})), &h),
            Duration::from_millis(250)
        );
        assert_eq!(
            retry_after(Some(&json!({"retry_after": -1.0})), &h),
            Duration::from_secs(3)
        );
        assert_eq!(retry_after(None, &HeaderMap::new()), Duration::from_secs(1));
    }
}
