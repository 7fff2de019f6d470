//! The one waiting policy every fake and every suite shares.
//!
//! A test waits for something that should happen; on a loaded machine it
//! can take a while, so the patience is generous ([`WAIT`]) and the failure
//! says what was awaited and what was seen instead. Fakes wake their
//! waiters through a [`Changes`] counter instead of polling, so a wait ends
//! the moment its condition turns true.

use std::fmt::Debug;
use std::time::Duration;

use tokio::sync::watch;

/// How long a test waits for something that should happen.
pub const WAIT: Duration = Duration::from_secs(20);

/// A counter a fake bumps on every change a test may be waiting for.
#[derive(Debug)]
pub struct Changes(watch::Sender<u64>);

impl Default for Changes {
    fn default() -> Changes {
        Changes(watch::channel(0).0)
    }
}

impl Changes {
    /// Wakes every waiter.
    pub fn bump(&self) {
        self.0.send_modify(|v| *v += 1);
    }

    /// A receiver that sees every later bump, for a server-side wait (a
    /// long poll) that must also watch other things than a deadline.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }

    /// Waits up to `timeout` until `probe` answers; `None` when it never did.
    /// The probe runs at once and after every change.
    pub async fn until<T>(
        &self,
        timeout: Duration,
        mut probe: impl FnMut() -> Option<T>,
    ) -> Option<T> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.0.subscribe();
        loop {
            rx.borrow_and_update();
            if let Some(v) = probe() {
                return Some(v);
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return None;
            }
        }
    }

    /// Waits until `probe` answers, or panics after `timeout` saying what
    /// was awaited and what `seen` shows then.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn expect<T, S: Debug>(
        &self,
        what: &str,
        timeout: Duration,
        probe: impl FnMut() -> Option<T>,
        seen: impl FnOnce() -> S,
    ) -> T {
        match self.until(timeout, probe).await {
            Some(v) => v,
            None => panic!("waited {timeout:?} for {what}; saw {:#?}", seen()),
        }
    }
}

/// Waits until `probe` answers, polling (for state no fake bumps: a
/// database, a file, a process), or panics after [`WAIT`] with `what` and
/// the last value `probe` saw.
///
/// # Panics
/// When [`WAIT`] passes first.
pub async fn wait_for<T, S: Debug>(what: &str, probe: impl AsyncProbe<T, S>) -> T {
    wait_within(what, WAIT, probe).await
}

/// Like [`wait_for`], with the patience a caller was given instead of
/// [`WAIT`].
///
/// # Panics
/// When `timeout` passes first.
pub async fn wait_within<T, S: Debug>(
    what: &str,
    timeout: Duration,
    mut probe: impl AsyncProbe<T, S>,
) -> T {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match probe.check().await {
            Ok(v) => return v,
            Err(seen) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "waited {timeout:?} for {what}; saw {seen:#?}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A condition [`wait_for`] checks: `Ok` with the awaited value, or `Err`
/// with what it saw instead.
pub trait AsyncProbe<T, S> {
    /// One check.
    fn check(&mut self) -> impl std::future::Future<Output = Result<T, S>>;
}

impl<T, S, F, Fut> AsyncProbe<T, S> for F
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, S>>,
{
    fn check(&mut self) -> impl std::future::Future<Output = Result<T, S>> {
        self()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[tokio::test]
    async fn a_poll_returns_once_its_probe_answers() {
        let calls = Cell::new(0);
        let got = wait_within("the third poll", Duration::from_secs(5), || async {
            calls.set(calls.get() + 1);
            if calls.get() >= 3 {
                Ok(calls.get())
            } else {
                Err(calls.get())
            }
        })
        .await;
        assert_eq!(got, 3);
    }

    #[tokio::test]
    #[should_panic(expected = "waited 50ms for nothing; saw \"still nothing\"")]
    async fn a_poll_that_never_answers_panics_with_what_it_saw() {
        wait_within("nothing", Duration::from_millis(50), || async {
            Err::<(), _>("still nothing")
        })
        .await;
    }
}
