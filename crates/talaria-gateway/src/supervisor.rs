//! Adapter supervision: each adapter runs as its own task, reconnecting
//! with backoff when its connection ends, with its liveness on a shared
//! board. Whenever an adapter becomes live (at boot and after every
//! reconnect) the ledger is swept for that platform, so replies owed to it
//! go out as soon as it can take them.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::adapter::{Adapter, AdapterContext, AdapterError, Inbox, Liveness, LivenessReporter};
use crate::delivery::Delivery;
use crate::token_lock::TokenLock;

/// Reconnect delays grow from this...
const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// ...to this.
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// A connection that stayed up this long resets the backoff.
const HEALTHY_AFTER: Duration = Duration::from_secs(60);

/// One adapter's state as shown by `gateway status` and `/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterState {
    pub liveness: Liveness,
    /// Seconds since the epoch when it entered this state.
    pub since: f64,
    pub last_error: Option<String>,
}

/// Every adapter's state, shared by the supervisors, the runner and the
/// status writer.
#[derive(Debug, Default)]
pub struct StatusBoard {
    states: Mutex<BTreeMap<String, AdapterState>>,
    /// Wakes the status writer, so `gateway status` shows a change within
    /// moments instead of at the next periodic rewrite. A `Notify` keeps one
    /// permit, so a change made while the writer is busy is not lost.
    changed: Notify,
}

impl StatusBoard {
    pub fn set(&self, platform: &str, liveness: Liveness, error: Option<String>) {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        let mut changed = false;
        let entry = states.entry(platform.to_owned()).or_insert_with(|| {
            changed = true;
            AdapterState {
                liveness,
                since: talaria_core::unix_now(),
                last_error: None,
            }
        });
        if entry.liveness != liveness {
            entry.liveness = liveness;
            entry.since = talaria_core::unix_now();
            changed = true;
        }
        if error.is_some() && entry.last_error != error {
            entry.last_error = error;
            changed = true;
        }
        drop(states);
        if changed {
            self.touch();
        }
    }

    /// Says that something `gateway status` shows (a turn, a delivery)
    /// changed.
    pub fn touch(&self) {
        self.changed.notify_one();
    }

    /// Resolves at the next [`StatusBoard::touch`] (or at once if one came
    /// since the last call).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    pub fn snapshot(&self) -> BTreeMap<String, AdapterState> {
        self.states
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Platforms that are live now: the ones a sweep may deliver to.
    pub fn live(&self) -> HashSet<String> {
        self.snapshot()
            .into_iter()
            .filter(|(_, s)| s.liveness == Liveness::Live)
            .map(|(p, _)| p)
            .collect()
    }
}

/// Runs one adapter until `shutdown`: takes its credential lock, runs it,
/// reconnects with jittered exponential backoff, keeps the board current
/// and sweeps the ledger each time it goes live.
pub async fn supervise(
    adapter: Arc<dyn Adapter>,
    inbox: Inbox,
    board: Arc<StatusBoard>,
    delivery: Delivery,
    lock_dir: Option<std::path::PathBuf>,
    shutdown: CancellationToken,
) {
    let platform = adapter.platform();
    // Held for as long as the adapter runs; released when this returns.
    let _lock = match adapter.credential() {
        Some((scope, credential)) => loop {
            // Taking a contended lock retries with short sleeps: keep that
            // off the async workers.
            let (dir, cred) = (lock_dir.clone(), credential.clone());
            let lock = tokio::task::spawn_blocking(move || match &dir {
                Some(dir) => TokenLock::acquire_in(dir, scope, &cred),
                None => TokenLock::acquire(scope, &cred),
            })
            .await;
            let lock = match lock {
                Ok(result) => result.map_err(|e| e.to_string()),
                Err(e) => Err(format!("the credential lock task failed: {e}")),
            };
            match lock {
                Ok(lock) => break Some(lock),
                Err(e) => {
                    tracing::error!(platform, error = %e, "cannot start the adapter");
                    board.set(platform, Liveness::Backoff, Some(e));
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(BACKOFF_MAX) => continue,
                    }
                }
            }
        },
        None => None,
    };
    let mut failures: u32 = 0;
    loop {
        board.set(platform, Liveness::Connecting, None);
        let (reporter, watcher) = LivenessReporter::new();
        let ctx = AdapterContext {
            inbox: inbox.clone(),
            liveness: reporter,
            shutdown: shutdown.clone(),
        };
        let follower = tokio::spawn(follow_liveness(
            platform,
            watcher,
            board.clone(),
            delivery.clone(),
        ));
        let started = std::time::Instant::now();
        let result = adapter.run(ctx).await;
        follower.abort();
        if shutdown.is_cancelled() {
            return;
        }
        if started.elapsed() >= HEALTHY_AFTER {
            failures = 0;
        }
        failures = failures.saturating_add(1);
        let (delay, error) = match result {
            Ok(()) => (BACKOFF_MIN, "the connection ended".to_owned()),
            Err(AdapterError::Disconnected(e)) => (backoff(failures), e),
            Err(AdapterError::Fatal(e)) => (BACKOFF_MAX, e),
        };
        tracing::warn!(platform, error = %error, retry_in = ?delay, "adapter disconnected");
        board.set(platform, Liveness::Backoff, Some(error));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// Mirrors an adapter's liveness onto the board; sweeps on every rise to
/// live.
async fn follow_liveness(
    platform: &'static str,
    mut watcher: watch::Receiver<Liveness>,
    board: Arc<StatusBoard>,
    delivery: Delivery,
) {
    loop {
        let state = *watcher.borrow_and_update();
        board.set(platform, state, None);
        if state == Liveness::Live {
            sweep(platform, &delivery).await;
        }
        if watcher.changed().await.is_err() {
            return;
        }
    }
}

/// Claims and re-sends what is owed to `platform`.
pub async fn sweep(platform: &str, delivery: &Delivery) {
    sweep_platforms([platform.to_owned()].into(), delivery).await;
}

/// Claims and re-sends what is owed to any of `platforms`, oldest first.
pub async fn sweep_platforms(platforms: HashSet<String>, delivery: &Delivery) {
    let Some(ledger) = delivery.ledger() else {
        return;
    };
    if platforms.is_empty() {
        return;
    }
    match ledger.sweep(&platforms).await {
        Ok(claimed) => {
            if !claimed.is_empty() {
                tracing::info!(
                    count = claimed.len(),
                    "redelivering replies owed by a failed send or a stopped gateway"
                );
            }
            for row in &claimed {
                let _ = delivery.redeliver(row).await;
            }
        }
        Err(e) => tracing::warn!(error = %e, "delivery ledger sweep failed"),
    }
}

/// 1 s, 2 s, 4 s ... up to a minute, each with up to 25% random jitter so
/// that many gateways do not reconnect in lockstep.
fn backoff(failures: u32) -> Duration {
    let base = BACKOFF_MIN.saturating_mul(1 << failures.saturating_sub(1).min(6));
    let base = base.min(BACKOFF_MAX);
    let jitter = rand::rng().random_range(0.0..0.25);
    base.mul_f64(1.0 + jitter).min(BACKOFF_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        assert!(backoff(1) >= Duration::from_secs(1) && backoff(1) < Duration::from_secs(2));
        assert!(backoff(3) >= Duration::from_secs(4));
        assert_eq!(backoff(30), BACKOFF_MAX);
    }
}
