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

use reqwest::Method;
use reqwest::header::HeaderMap;
use serde_json::Value;
use talaria_core::Secret;
use tokio::time::Instant;

use crate::http::{Failure, Http, HttpError, Service};

/// Retries after a 429 before the caller hears about it.
const MAX_RATE_LIMIT_RETRIES: u32 = 3;

/// Longer waits than this are not worth blocking a send for.
const MAX_WAIT: Duration = Duration::from_secs(60);

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
        let builder = reqwest::Client::builder().user_agent(concat!(
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
        let mut retries = 0;
        loop {
            self.wait_for_bucket(route, major).await?;
            let mut req = self
                .http
                .client()
                .request(method.clone(), format!("{}{path}", self.api_base))
                .header(reqwest::header::AUTHORIZATION, self.auth.expose());
            if let Some(b) = body {
                req = req.json(b);
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
