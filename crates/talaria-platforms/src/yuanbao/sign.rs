//! The sign-token call: the app key and secret buy a token (and the bot's
//! account id) that the socket's auth-bind presents.
//!
//! The request carries a nonce, a timestamp in Beijing time and
//! `signature = hex(HMAC-SHA256(key = app_secret, nonce + timestamp +
//! app_key + app_secret))`. Code 10099 asks for a retry; the token is good
//! for `duration` seconds.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::json;
use sha2::Sha256;
use talaria_core::Secret;

/// Where sign-token lives under the API domain.
pub(super) const PATH: &str = "/api/v5/robotLogic/sign-token";

/// The code asking the caller to sign again shortly.
const RETRY_CODE: i64 = 10099;
/// Retries after [`RETRY_CODE`] before giving up.
const RETRIES: u32 = 3;
/// The wait between those retries.
const RETRY_DELAY: Duration = Duration::from_secs(1);
/// How long before its end a token is replaced.
const MARGIN: Duration = Duration::from_secs(60);
/// A token's life when the answer leaves `duration` out.
const DEFAULT_DURATION: u64 = 3600;
/// The largest sign-token answer read.
const MAX_BODY: usize = 64 << 10;

/// A signed token and what came with it.
#[derive(Debug, Clone)]
pub(super) struct Token {
    /// Presented in the auth-bind. Never logged.
    pub token: Secret,
    /// The bot's account id.
    pub bot_id: String,
    /// The `source` to present beside the token.
    pub source: String,
    /// When to sign again.
    pub renew_at: Instant,
}

impl Token {
    /// Still good for more than the renewal margin.
    pub fn fresh(&self) -> bool {
        Instant::now() < self.renew_at
    }
}

/// Why no token was had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum SignError {
    /// The endpoint could not be reached or answered nonsense.
    #[error("Yuanbao sign-token failed: {0}")]
    Unreachable(String),
    /// The platform refused the credentials (wrong key or secret, a bad
    /// signature): nothing helps until the operator fixes them.
    #[error("Yuanbao refused to sign a token (code {code}): {message}")]
    Refused {
        /// The platform's code.
        code: i64,
        /// Its message.
        message: String,
    },
}

#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    code: i64,
    #[serde(default)]
    msg: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    data: Option<Data>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(default)]
    token: String,
    #[serde(default)]
    bot_id: String,
    #[serde(default)]
    duration: Option<u64>,
    #[serde(default)]
    source: Option<String>,
}

/// `hex(HMAC-SHA256(app_secret, nonce + timestamp + app_key + app_secret))`.
pub(super) fn signature(app_key: &str, app_secret: &str, nonce: &str, timestamp: &str) -> String {
    // HMAC takes a key of any length; this cannot fail.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(app_secret.as_bytes()) else {
        return String::new();
    };
    for part in [nonce, timestamp, app_key, app_secret] {
        mac.update(part.as_bytes());
    }
    talaria_core::ids::to_hex(&mac.finalize().into_bytes())
}

/// `now` in Beijing time (UTC+8), as `YYYY-MM-DDTHH:MM:SS+08:00`.
pub(super) fn beijing_timestamp(now: SystemTime) -> String {
    let secs = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
        + 8 * 3600;
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    let (y, m, d) = civil_date(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}+08:00",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (the classic
/// era-based conversion: 400-year eras of 146,097 days, years counted
/// from March so the leap day falls at the end).
fn civil_date(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// 32 lowercase hex characters from the OS's randomness.
fn nonce() -> String {
    let bytes: [u8; 16] = rand::random();
    talaria_core::ids::to_hex(&bytes)
}

/// What sign-token needs.
pub(super) struct Signer<'a> {
    /// The HTTP client.
    pub client: &'a reqwest::Client,
    /// The API root, without a trailing slash.
    pub api_domain: &'a str,
    /// The app key.
    pub app_key: &'a Secret,
    /// The app secret.
    pub app_secret: &'a Secret,
    /// `X-Route-Env`, when set.
    pub route_env: Option<&'a str>,
    /// How long one call may take.
    pub timeout: Duration,
}

impl Signer<'_> {
    /// Signs a token, retrying [`RETRY_CODE`] answers.
    pub async fn sign(&self) -> Result<Token, SignError> {
        let mut attempt = 0;
        loop {
            match self.once().await {
                Err(SignError::Refused { code, .. }) if code == RETRY_CODE && attempt < RETRIES => {
                    attempt += 1;
                    tracing::info!(attempt, "Yuanbao sign-token asked for a retry");
                    tokio::time::sleep(RETRY_DELAY).await;
                }
                other => return other,
            }
        }
    }

    async fn once(&self) -> Result<Token, SignError> {
        let nonce = nonce();
        let timestamp = beijing_timestamp(SystemTime::now());
        let app_key = self.app_key.expose();
        let body = json!({
            "app_key": app_key,
            "nonce": nonce,
            "timestamp": timestamp,
            "signature": signature(app_key, self.app_secret.expose(), &nonce, &timestamp),
        });
        let mut request = self
            .client
            .post(format!("{}{PATH}", self.api_domain))
            .timeout(self.timeout)
            .header("X-AppVersion", env!("CARGO_PKG_VERSION"))
            .header("X-OperationSystem", std::env::consts::OS)
            .header("X-Instance-Id", super::INSTANCE_ID)
            .header("X-Bot-Version", env!("CARGO_PKG_VERSION"))
            .json(&body);
        if let Some(env) = self.route_env {
            request = request.header("X-Route-Env", env);
        }
        // reqwest's errors name the URL, which holds nothing secret here.
        let response = request
            .send()
            .await
            .map_err(|e| SignError::Unreachable(e.without_url().to_string()))?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| SignError::Unreachable(e.without_url().to_string()))?;
        if bytes.len() > MAX_BODY {
            return Err(SignError::Unreachable("the answer is too large".into()));
        }
        if !status.is_success() {
            return Err(SignError::Unreachable(format!("HTTP {status}")));
        }
        let answer: Answer = serde_json::from_slice(&bytes)
            .map_err(|e| SignError::Unreachable(format!("unreadable answer: {e}")))?;
        if answer.code != 0 {
            return Err(SignError::Refused {
                code: answer.code,
                message: answer.msg.or(answer.message).unwrap_or_default(),
            });
        }
        let data = answer
            .data
            .filter(|d| !d.token.is_empty())
            .ok_or_else(|| SignError::Unreachable("the answer holds no token".into()))?;
        let life =
            Duration::from_secs(data.duration.filter(|d| *d > 0).unwrap_or(DEFAULT_DURATION));
        Ok(Token {
            token: Secret::new(data.token),
            bot_id: data.bot_id,
            source: data
                .source
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "bot".into()),
            renew_at: Instant::now() + life.saturating_sub(MARGIN),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beijing_time_is_eight_hours_ahead_and_rolls_the_date() {
        // 2024-02-29T20:30:05Z is 2024-03-01 04:30:05 in Beijing.
        let t = UNIX_EPOCH + Duration::from_secs(1_709_238_605);
        assert_eq!(beijing_timestamp(t), "2024-03-01T04:30:05+08:00");
        assert_eq!(beijing_timestamp(UNIX_EPOCH), "1970-01-01T08:00:00+08:00");
        // The last second of 1999, UTC.
        let t = UNIX_EPOCH + Duration::from_secs(946_684_799);
        assert_eq!(beijing_timestamp(t), "2000-01-01T07:59:59+08:00");
    }

    #[test]
    fn the_signature_matches_python_hmac() {
        // Computed by Python's standard library, not by this module.
        let (key, secret) = ("app-key-1", "s3cr3t/+=");
        let (nonce, ts) = (
            "0123456789abcdef0123456789abcdef",
            "2026-12-07T03:04:05+08:00",
        );
        let script = "import hmac,hashlib,sys;k,s,n,t=sys.argv[1:5];\
                      print(hmac.new(s.encode(),(n+t+k+s).encode(),hashlib.sha256).hexdigest())";
        let out = std::process::Command::new("python3")
            .args(["-c", script, key, secret, nonce, ts])
            .output()
            .expect("python3 runs");
        let expected = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        assert_eq!(expected.len(), 64);
        assert_eq!(signature(key, secret, nonce, ts), expected);
    }

    #[test]
    fn a_nonce_is_32_hex_characters_and_differs_each_time() {
        let (a, b) = (nonce(), nonce());
        assert_eq!(a.len(), 32);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(a, b);
    }
}
