//! Adapter supervision: each adapter runs as its own task, reconnecting
//! with backoff when its connection ends, with its liveness on a shared
//! board. A connector whose credential allows one reader runs only while
//! this process holds the credential: a lock file on one machine, a lease
//! in the shared store across a deployment ([`Leadership`]). Whenever an adapter becomes live (at boot and after every
//! reconnect) the ledger is swept for that platform, so replies owed to it
//! go out as soon as it can take them.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use talaria_store::{ClusterStore, LeaseGrant, NodeId};
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
    /// Where the connection stands.
    pub liveness: Liveness,
    /// Seconds since the epoch when it entered this state.
    pub since: f64,
    /// The error that ended the last connection, if any.
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
    /// Wakes whoever waits for a platform to go live (the recovery of
    /// owed turns), with the same one-permit guarantee.
    went_live: Notify,
}

impl StatusBoard {
    /// Records `platform`'s state; `error` replaces the last error only when
    /// given. A change wakes [`StatusBoard::changed`], and going live wakes
    /// [`StatusBoard::went_live`].
    pub fn set(&self, platform: &str, liveness: Liveness, error: Option<String>) {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        let rose = liveness == Liveness::Live
            && states.get(platform).map(|s| s.liveness) != Some(Liveness::Live);
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
            talaria_core::metrics::adapter_connected(platform, liveness == Liveness::Live);
            self.touch();
        }
        if rose {
            self.went_live.notify_one();
        }
    }

    /// Resolves the next time a platform goes live (or at once if one did
    /// since the last call).
    pub async fn went_live(&self) {
        self.went_live.notified().await;
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

    /// Every adapter's state, by platform name.
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

/// Who may run a connector whose credential allows one reader.
#[derive(Clone)]
pub enum Leadership {
    /// One machine: an exclusive lock file per credential in this
    /// directory (`None`: the per-user default), held while the adapter
    /// runs.
    MachineLock(Option<std::path::PathBuf>),
    /// A deployment sharing one store: a lease per credential in the store,
    /// held by one node at a time and renewed while it runs the connector;
    /// the other nodes stand by and take over when the lease lapses.
    StoreLease {
        /// The store the leases live in.
        store: Arc<dyn ClusterStore>,
        /// This node: the holder named in the leases it takes.
        node: NodeId,
    },
}

/// How long a connector lease lasts without renewal: after its holder
/// dies, another node takes the connector over within about this long.
pub const CONNECTOR_LEASE: Duration = Duration::from_secs(10);

/// How often the holder renews its connector lease.
const LEASE_RENEW: Duration = Duration::from_secs(2);

/// How often a standby node asks for the lease.
const LEASE_POLL: Duration = Duration::from_secs(1);

/// The holder stops its connector when its lease is this close to lapsing
/// unrenewed, so it is off the platform before anyone else may take over.
const LEASE_MARGIN: Duration = Duration::from_secs(3);

/// The lease of one credential: named by a hash, so the credential itself
/// never reaches the database.
pub fn connector_lease_name(scope: &str, credential: &str) -> String {
    let digest = Sha256::digest(credential.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("connector:{scope}:{hex}")
}

/// Runs one adapter until `shutdown`: takes its credential (a lock file or
/// a lease, per `leadership`), runs it, reconnects with jittered exponential
/// backoff, keeps the board current and sweeps the ledger each time it
/// goes live.
pub async fn supervise(
    adapter: Arc<dyn Adapter>,
    inbox: Inbox,
    board: Arc<StatusBoard>,
    delivery: Delivery,
    leadership: Leadership,
    shutdown: CancellationToken,
) {
    let platform = adapter.platform();
    let Some((scope, credential)) = adapter.credential() else {
        run_connected(adapter, inbox, board, delivery, shutdown).await;
        return;
    };
    match leadership {
        Leadership::MachineLock(lock_dir) => {
            // Held for as long as the adapter runs; released on return.
            let _lock = loop {
                // Taking a contended lock retries with short sleeps: keep
                // that off the async workers.
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
                    Ok(lock) => break lock,
                    Err(e) => {
                        tracing::error!(platform, error = %e, "cannot start the adapter");
                        board.set(platform, Liveness::Backoff, Some(e));
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = tokio::time::sleep(BACKOFF_MAX) => continue,
                        }
                    }
                }
            };
            run_connected(adapter, inbox, board, delivery, shutdown).await;
        }
        Leadership::StoreLease { store, node } => {
            let name = connector_lease_name(scope, &credential);
            loop {
                let Some(held) =
                    await_lease(store.as_ref(), &name, &node, platform, &board, &shutdown).await
                else {
                    return;
                };
                tracing::info!(platform, lease = %name, fence = held.fence, "this node now runs the connector");
                let run = shutdown.child_token();
                let keeper = tokio::spawn(keep_lease(
                    store.clone(),
                    name.clone(),
                    node.clone(),
                    held,
                    run.clone(),
                ));
                run_connected(
                    adapter.clone(),
                    inbox.clone(),
                    board.clone(),
                    delivery.clone(),
                    run.clone(),
                )
                .await;
                run.cancel();
                let _ = keeper.await;
                if shutdown.is_cancelled() {
                    if let Err(e) = store.release_lease(&name, &node).await {
                        tracing::debug!(platform, error = %e, "could not release the connector lease; it lapses on its own");
                    }
                    return;
                }
                tracing::warn!(platform, "lost the connector lease; standing by");
            }
        }
    }
}

/// Waits, standing by, until this node holds the lease `name`; `None` on
/// shutdown.
async fn await_lease(
    store: &dyn ClusterStore,
    name: &str,
    node: &NodeId,
    platform: &'static str,
    board: &StatusBoard,
    shutdown: &CancellationToken,
) -> Option<Held> {
    let mut announced = false;
    loop {
        let asked = Instant::now();
        match store
            .acquire_lease(name, node, CONNECTOR_LEASE.as_secs_f64())
            .await
        {
            Ok(Some(grant)) => return Some(Held::from_grant(asked, grant)),
            Ok(None) => {
                if !announced {
                    tracing::info!(platform, "another node runs this connector; standing by");
                    announced = true;
                }
                board.set(platform, Liveness::Standby, None);
            }
            Err(e) => {
                tracing::warn!(platform, error = %e, "cannot ask the store for the connector lease");
                board.set(platform, Liveness::Backoff, Some(e.to_string()));
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(LEASE_POLL) => {}
        }
    }
}

/// A lease this node holds, and until when it may act on it by its own
/// clock: the store's expiry carried over to a local instant, measured
/// from when the request was sent (so the store answering late only makes
/// the node more careful), less a margin.
#[derive(Debug, Clone, Copy)]
struct Held {
    fence: u64,
    act_until: Instant,
}

impl Held {
    fn from_grant(asked: Instant, grant: LeaseGrant) -> Held {
        let left = Duration::try_from_secs_f64(grant.until - grant.now).unwrap_or_default();
        Held {
            fence: grant.fence,
            act_until: asked + left.saturating_sub(LEASE_MARGIN),
        }
    }
}

/// Renews the lease while the connector runs; cancels `run` as soon as
/// the lease is lost or can no longer be known to be held.
async fn keep_lease(
    store: Arc<dyn ClusterStore>,
    name: String,
    node: NodeId,
    mut held: Held,
    run: CancellationToken,
) {
    loop {
        let deadline = tokio::time::Instant::from_std(held.act_until);
        tokio::select! {
            _ = run.cancelled() => return,
            _ = tokio::time::sleep_until(deadline) => {
                tracing::warn!(lease = %name, "could not renew the connector lease in time; stopping the connector");
                run.cancel();
                return;
            }
            _ = tokio::time::sleep(LEASE_RENEW) => {}
        }
        let asked = Instant::now();
        match store
            .acquire_lease(&name, &node, CONNECTOR_LEASE.as_secs_f64())
            .await
        {
            Ok(Some(grant)) if grant.fence == held.fence => {
                held = Held::from_grant(asked, grant);
            }
            Ok(Some(_)) => {
                // Granted anew: it lapsed in between, and another node may
                // have held it meanwhile. Start over as a new tenure.
                tracing::warn!(lease = %name, "the connector lease lapsed before it was renewed");
                run.cancel();
                return;
            }
            Ok(None) => {
                tracing::warn!(lease = %name, "another node took the connector lease");
                run.cancel();
                return;
            }
            Err(e) => {
                // Keep trying until the deadline: a short outage of the
                // store must not drop a healthy connector.
                tracing::warn!(lease = %name, error = %e, "cannot renew the connector lease");
            }
        }
    }
}

/// Runs the adapter, reconnecting with backoff, until `stop`.
async fn run_connected(
    adapter: Arc<dyn Adapter>,
    inbox: Inbox,
    board: Arc<StatusBoard>,
    delivery: Delivery,
    stop: CancellationToken,
) {
    let platform = adapter.platform();
    let mut failures: u32 = 0;
    loop {
        board.set(platform, Liveness::Connecting, None);
        let (reporter, watcher) = LivenessReporter::new();
        let ctx = AdapterContext {
            inbox: inbox.clone(),
            liveness: reporter,
            shutdown: stop.clone(),
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
        if stop.is_cancelled() {
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
        talaria_core::metrics::adapter_reconnect(platform);
        board.set(platform, Liveness::Backoff, Some(error));
        tokio::select! {
            _ = stop.cancelled() => return,
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
