//! Backoff between attempts, and waits the user can interrupt.

use std::time::Duration;

use rand::Rng;
use talaria_core::config::AgentConfig;
use tokio_util::sync::CancellationToken;

use crate::LlmError;

/// How hard [`crate::LlmClient`] tries one provider before moving on.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts per provider for retryable failures (at least 1). This is
    /// `agent.api_max_retries`: with 3, a provider is asked three times.
    pub max_attempts: u32,
    /// First backoff step; doubles per attempt.
    pub base: Duration,
    /// Ceiling of the doubling (before jitter).
    pub max: Duration,
    /// Ceiling on a server's `Retry-After`, so a hostile or confused header
    /// cannot park the agent for hours.
    pub retry_after_cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 3,
            base: Duration::from_secs(2),
            max: Duration::from_secs(60),
            retry_after_cap: Duration::from_secs(600),
        }
    }
}

impl RetryPolicy {
    /// The policy configured under `agent:`.
    pub fn from_agent(agent: &AgentConfig) -> RetryPolicy {
        RetryPolicy {
            max_attempts: agent.api_max_retries.max(1),
            ..RetryPolicy::default()
        }
    }

    /// The deterministic part of the wait after failed attempt `n` (1-based):
    /// `min(base * 2^(n-1), max)`.
    pub fn step(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(30);
        self.base.saturating_mul(1u32 << exp).min(self.max)
    }

    /// The jittered wait after failed attempt `n`: the step plus a uniform
    /// share of up to half of it, so clients that failed together do not
    /// come back together.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let step = self.step(attempt);
        let jitter = step.as_secs_f64() * 0.5 * rand::rng().random_range(0.0..=1.0);
        step + Duration::from_secs_f64(jitter)
    }

    /// How long to wait before asking again after `err`: the server's
    /// `Retry-After` (capped) when it sent one, the jittered backoff otherwise.
    pub fn wait_for(&self, attempt: u32, err: &LlmError) -> Duration {
        match err.retry_after {
            Some(d) => d.min(self.retry_after_cap),
            None => self.backoff(attempt),
        }
    }
}

/// Sleeps for `d` unless `cancel` fires first; returns `false` when cancelled.
pub async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn backoff_doubles_caps_and_jitters_within_half() {
        let p = RetryPolicy {
            base: Duration::from_millis(100),
            max: Duration::from_millis(500),
            ..RetryPolicy::default()
        };
        assert_eq!(p.step(1), Duration::from_millis(100));
        assert_eq!(p.step(2), Duration::from_millis(200));
        assert_eq!(p.step(3), Duration::from_millis(400));
        assert_eq!(p.step(4), Duration::from_millis(500));
        assert_eq!(p.step(u32::MAX), Duration::from_millis(500));
        for n in 1..6 {
            let d = p.backoff(n);
            assert!(d >= p.step(n) && d <= p.step(n).mul_f64(1.5), "{d:?}");
        }
    }

    #[test]
    fn retry_after_is_honoured_but_capped() {
        let p = RetryPolicy {
            retry_after_cap: Duration::from_secs(5),
            ..RetryPolicy::default()
        };
        let mut e = LlmError {
            kind: ErrorKind::RateLimit,
            status: Some(429),
            message: String::new(),
            retry_after: Some(Duration::from_secs(2)),
            provider: "p".into(),
        };
        assert_eq!(p.wait_for(1, &e), Duration::from_secs(2));
        e.retry_after = Some(Duration::from_secs(3600));
        assert_eq!(p.wait_for(1, &e), Duration::from_secs(5));
    }

    #[tokio::test]
    async fn waits_end_when_cancelled() {
        let c = CancellationToken::new();
        let c2 = c.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            c2.cancel();
        });
        let t = std::time::Instant::now();
        assert!(!sleep_or_cancel(Duration::from_secs(30), &c).await);
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
