//! This gateway as a node of its deployment: its id, its heartbeat, and
//! telling dead neighbours from live ones.
//!
//! Every gateway registers a node in the store it uses, whether that store
//! is a single machine's SQLite file or a database several hosts share.
//! The node's lease, renewed by [`heartbeat`], is what other nodes read as
//! "alive": the ledger's sweep claims the owed replies of nodes whose
//! lease ran out. On the same host there is a faster test than waiting for
//! the lease: the node's process is gone ([`reap_local`]), which is how a
//! gateway restarted after a crash re-sends the dead one's replies at once.

use std::sync::Arc;
use std::time::Duration;

use talaria_store::{ClusterStore, NodeAnnouncement, NodeId, StoreError};
use tokio_util::sync::CancellationToken;

use crate::owner::{self, Owner};

/// How long a node counts as alive after its last heartbeat.
pub const NODE_TTL: Duration = Duration::from_secs(10);

/// How often a node renews its lease: several beats fit in one
/// [`NODE_TTL`], so a slow database call or two does not kill a live node.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(2);

/// Nodes dead this long are forgotten (their rows kept that long for
/// `gateway status` and post-mortems).
pub const FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);

/// This process as a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    announcement: NodeAnnouncement,
}

impl Node {
    /// This process, with a fresh random id.
    pub fn current() -> Node {
        let me = owner::current();
        Node {
            announcement: NodeAnnouncement {
                id: NodeId::random(),
                host: host_name(),
                pid: me.pid,
                started_at: me.started_at,
                version: env!("CARGO_PKG_VERSION").to_owned(),
            },
        }
    }

    /// A node with an explicit identity (tests that play several gateways
    /// in one process).
    pub fn with_announcement(announcement: NodeAnnouncement) -> Node {
        Node { announcement }
    }

    /// This node's id.
    pub fn id(&self) -> &NodeId {
        &self.announcement.id
    }

    /// What this node announces about itself (id, host, pid, version).
    pub fn announcement(&self) -> &NodeAnnouncement {
        &self.announcement
    }

    /// Announces the node once (at start, so it is alive before it records
    /// anything it owns).
    pub async fn announce(&self, store: &dyn ClusterStore) -> Result<(), StoreError> {
        store
            .heartbeat(&self.announcement, NODE_TTL.as_secs_f64())
            .await
            .map(|_| ())
    }
}

/// Overrides the host name a node reports: for containers whose host name
/// changes with every start, or several nodes played on one machine.
pub const NODE_HOST_ENV: &str = "TALARIA_NODE_HOST";

/// This machine's name, for `gateway status` and the same-host test:
/// `TALARIA_NODE_HOST`, else the kernel's host name.
pub fn host_name() -> String {
    if let Ok(host) = std::env::var(NODE_HOST_ENV)
        && !host.trim().is_empty()
    {
        return host.trim().to_owned();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Renews the node's lease every [`HEARTBEAT_INTERVAL`] until `shutdown`,
/// then leaves the cluster, so others take over at once rather than after
/// the lease runs out. A failed beat is logged and retried on the next
/// tick: the lease is long enough to ride out a short outage.
pub async fn heartbeat(store: Arc<dyn ClusterStore>, node: Node, shutdown: CancellationToken) {
    let mut ticks = tokio::time::interval(HEARTBEAT_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = ticks.tick() => {}
        }
        match node.announce(store.as_ref()).await {
            Ok(()) if failing => {
                tracing::info!("node heartbeat recovered");
                failing = false;
            }
            Ok(()) => {}
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "node heartbeat failed; other nodes will take over this one's work if it keeps failing");
                }
                failing = true;
            }
        }
    }
    if let Err(e) = store.leave(node.id()).await {
        tracing::warn!(error = %e, "could not leave the cluster in order; its leases lapse on their own");
    }
}

/// Declares dead the nodes of this host whose process is gone, so their
/// work is taken over now rather than when their lease runs out. Returns
/// how many were declared dead.
pub async fn reap_local(store: &dyn ClusterStore, me: &NodeId) -> Result<usize, StoreError> {
    let host = host_name();
    let mut reaped = 0;
    for node in store.nodes().await? {
        if &node.id == me || node.host != host {
            continue;
        }
        let process = Owner {
            pid: node.pid,
            started_at: node.started_at,
        };
        if !owner::is_alive(&process) && store.expire_node(&node.id).await? {
            tracing::info!(node = %node.id, pid = node.pid, "a gateway on this host died; taking over its work");
            reaped += 1;
        }
    }
    Ok(reaped)
}

/// Forgets nodes dead for longer than [`FORGET_AFTER`].
pub async fn forget_dead(store: &dyn ClusterStore) -> Result<u64, StoreError> {
    let now = store.clock().await?;
    store.prune_nodes(now - FORGET_AFTER.as_secs_f64()).await
}
