//! One running turn per session across the nodes of a deployment.
//!
//! On one machine the runner's lanes already run at most one turn per
//! session key. When several nodes share a store, two of them can receive
//! messages for the same session (a webhook platform served by every node,
//! a connector handed over mid-conversation). Each turn then first takes
//! the lease `turn:<key>` in the store, renews it while it runs, and gives
//! it up when it ends. A node that finds the lease taken waits for it, and
//! its asking is noted on the lease: in `interrupt` mode the holder sees
//! that and stops its turn, as a second message on one node would stop it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use talaria_store::{ClusterStore, NodeId};
use tokio_util::sync::CancellationToken;

/// How long a turn lease lasts without renewal: a node that dies mid-turn
/// holds its sessions this long.
pub const TURN_LEASE: Duration = Duration::from_secs(30);

/// How often a running turn renews its lease, which is also how soon it
/// notices another node waiting.
const RENEW: Duration = Duration::from_secs(2);

/// How often a waiting node asks again.
const WAIT_POLL: Duration = Duration::from_millis(500);

/// Turn leases for this node.
#[derive(Clone)]
pub struct TurnLeases {
    store: Arc<dyn ClusterStore>,
    node: NodeId,
}

/// What happened while taking a lease.
pub enum Taken {
    /// Held; renewed until dropped.
    Held(HeldTurn),
    /// `cancel` fired while waiting.
    Cancelled,
}

impl TurnLeases {
    /// Turn leases in `store`, taken in the name of `node`.
    pub(crate) fn new(store: Arc<dyn ClusterStore>, node: NodeId) -> TurnLeases {
        TurnLeases { store, node }
    }

    /// Takes the lease of session `key`, waiting while another node runs a
    /// turn of it. `on_wait` is called once, when it turns out a wait is
    /// needed (to tell the user). `interrupt_on_contention`: the held
    /// turn's `interrupted` token fires when another node asks for the
    /// lease while it runs.
    pub async fn take(
        &self,
        key: &str,
        cancel: &CancellationToken,
        interrupt_on_contention: bool,
        on_wait: impl FnOnce(),
    ) -> Taken {
        let name = lease_name(key);
        let mut on_wait = Some(on_wait);
        let mut warned = false;
        loop {
            let asked = Instant::now();
            match self
                .store
                .acquire_lease(&name, &self.node, TURN_LEASE.as_secs_f64())
                .await
            {
                Ok(Some(grant)) => {
                    let left =
                        Duration::try_from_secs_f64(grant.until - grant.now).unwrap_or_default();
                    return Taken::Held(HeldTurn::start(
                        self.clone(),
                        name,
                        grant.fence,
                        asked + left,
                        interrupt_on_contention,
                    ));
                }
                Ok(None) => {
                    if let Some(f) = on_wait.take() {
                        f();
                    }
                }
                Err(e) => {
                    if !warned {
                        tracing::warn!(key, error = %e, "cannot take the session's turn lease; retrying");
                        warned = true;
                    }
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return Taken::Cancelled,
                _ = tokio::time::sleep(WAIT_POLL) => {}
            }
        }
    }
}

/// The store's name for a session's turn lease.
fn lease_name(key: &str) -> String {
    format!("turn:{key}")
}

/// A turn lease this node holds. Dropping it stops the renewals and gives
/// the lease up.
pub struct HeldTurn {
    /// Fires when the turn should stop: another node waits (in interrupt
    /// mode), or the lease was lost and another node may run the session.
    pub interrupted: CancellationToken,
    done: CancellationToken,
}

impl HeldTurn {
    fn start(
        leases: TurnLeases,
        name: String,
        fence: u64,
        valid_until: Instant,
        interrupt_on_contention: bool,
    ) -> HeldTurn {
        let interrupted = CancellationToken::new();
        let done = CancellationToken::new();
        tokio::spawn(keep(
            leases,
            name,
            fence,
            valid_until,
            interrupt_on_contention,
            interrupted.clone(),
            done.clone(),
        ));
        HeldTurn { interrupted, done }
    }
}

impl Drop for HeldTurn {
    fn drop(&mut self) {
        // The keeper releases the lease on its way out.
        self.done.cancel();
    }
}

/// Renews until `done`, then releases. Fires `interrupted` when the lease
/// is lost, cannot be renewed in time, or (with `interrupt_on_contention`)
/// another node is waiting for it.
async fn keep(
    leases: TurnLeases,
    name: String,
    fence: u64,
    mut valid_until: Instant,
    interrupt_on_contention: bool,
    interrupted: CancellationToken,
    done: CancellationToken,
) {
    loop {
        let deadline = tokio::time::Instant::from_std(valid_until);
        tokio::select! {
            _ = done.cancelled() => break,
            _ = tokio::time::sleep_until(deadline) => {
                tracing::warn!(lease = %name, "could not renew the turn lease in time; stopping the turn");
                interrupted.cancel();
                break;
            }
            _ = tokio::time::sleep(RENEW) => {}
        }
        let asked = Instant::now();
        match leases
            .store
            .acquire_lease(&name, &leases.node, TURN_LEASE.as_secs_f64())
            .await
        {
            Ok(Some(grant)) if grant.fence == fence => {
                let left = Duration::try_from_secs_f64(grant.until - grant.now).unwrap_or_default();
                valid_until = asked + left;
                if grant.wanted && interrupt_on_contention && !interrupted.is_cancelled() {
                    tracing::info!(lease = %name, "a message for this session reached another node; interrupting the turn");
                    interrupted.cancel();
                }
            }
            Ok(_) => {
                tracing::warn!(lease = %name, "lost the turn lease; stopping the turn");
                interrupted.cancel();
                break;
            }
            Err(e) => tracing::warn!(lease = %name, error = %e, "cannot renew the turn lease"),
        }
    }
    if let Err(e) = leases.store.release_lease(&name, &leases.node).await {
        tracing::debug!(lease = %name, error = %e, "could not release the turn lease; it lapses on its own");
    }
}
