//! The nodes of a deployment and the leases they hold, backend-neutral.
//!
//! A node is one running gateway process. It announces itself with a
//! heartbeat that extends its own lease; a node whose lease has run out is
//! dead as far as everyone else is concerned, whatever host it ran on. Named
//! leases give one node at a time the right to do something: read a
//! platform with a credential that allows one reader (`connector:…`), run
//! a turn of one session (`turn:…`).
//!
//! Every time here is the store's clock (the database server's, for a
//! shared backend), so nodes with drifting clocks still agree on who holds
//! what. The policy (how long a lease lasts, how often it is renewed, what a
//! node does when it loses one) is the gateway's.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{Result, StoreError, Timestamp};

/// One gateway process's identity, unique across the deployment: random,
/// chosen at start, never reused.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NodeId(String);

impl NodeId {
    /// Checks `id`: 1 to 64 characters of ASCII letters, digits, `-`, `_`,
    /// `.` and `:`.
    pub fn new(id: impl Into<String>) -> Result<NodeId> {
        let id = id.into();
        let ok = !id.is_empty()
            && id.len() <= 64
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
        if ok {
            Ok(NodeId(id))
        } else {
            Err(StoreError::Database(format!(
                "invalid node id {id:?}: use 1 to 64 letters, digits, '-', '_', '.' or ':'"
            )))
        }
    }

    /// A fresh random id (16 hex digits).
    pub fn random() -> NodeId {
        NodeId(format!("{:016x}", rand::random::<u64>()))
    }

    /// The id as text, as leases and rows store it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for NodeId {
    type Error = StoreError;
    fn try_from(s: String) -> Result<NodeId> {
        NodeId::new(s)
    }
}

impl From<NodeId> for String {
    fn from(id: NodeId) -> String {
        id.0
    }
}

/// What a node says about itself with each heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAnnouncement {
    /// The node's random id, fresh for each process.
    pub id: NodeId,
    /// The host name, for people, and so a node on the same host can tell a
    /// dead process from its pid without waiting for the lease.
    pub host: String,
    /// Its process id on `host`.
    pub pid: u32,
    /// The process's start time (clock ticks since boot), which tells a
    /// recycled pid from the process itself.
    pub started_at: Option<u64>,
    /// The Talaria version the node runs.
    pub version: String,
}

/// A node as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The node's id.
    pub id: NodeId,
    /// The host it announced.
    pub host: String,
    /// Its process id there.
    pub pid: u32,
    /// Its process's start time, as announced.
    pub started_at: Option<u64>,
    /// The Talaria version it runs.
    pub version: String,
    /// The first heartbeat.
    pub joined_at: Timestamp,
    /// The latest heartbeat.
    pub heartbeat_at: Timestamp,
    /// The node counts as alive until then.
    pub lease_until: Timestamp,
}

/// A lease granted to a node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeaseGrant {
    /// Grows each time the lease changes hands (never on a renewal), so an
    /// action stamped with it can be told apart from a later holder's.
    pub fence: u64,
    /// The lease holds until then, unless renewed.
    pub until: Timestamp,
    /// The store's clock when it was granted.
    pub now: Timestamp,
    /// Another node asked for the lease during this tenure: someone is
    /// waiting for it (a turn of the same session on another node).
    pub wanted: bool,
}

/// A lease as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// What is leased (`connector:<scope>:<hash>`, `turn:<key>`, ...).
    pub name: String,
    /// The node holding it.
    pub holder: NodeId,
    /// Grows with every change of holder, so a former holder's late write
    /// can be refused.
    pub fence: u64,
    /// When the current holder took it.
    pub acquired_at: Timestamp,
    /// Until when the holder has it, unless renewed (the store's clock).
    pub lease_until: Timestamp,
}

/// Nodes and named leases.
#[async_trait]
pub trait ClusterStore: Send + Sync {
    /// Registers the node or refreshes it: stamps the heartbeat and extends
    /// the node's lease to `ttl` seconds from now. Returns the store's
    /// clock.
    async fn heartbeat(&self, node: &NodeAnnouncement, ttl: f64) -> Result<Timestamp>;
    /// An orderly stop: removes the node and releases its leases at once,
    /// so others take over without waiting for them to expire.
    async fn leave(&self, node: &NodeId) -> Result<()>;
    /// Declares a node dead now (its process is known to be gone): ends
    /// its lease and releases the leases it held. Returns whether it was
    /// alive until now.
    async fn expire_node(&self, node: &NodeId) -> Result<bool>;
    /// Every node, live or not, longest-running first.
    async fn nodes(&self) -> Result<Vec<NodeRecord>>;
    /// Forgets nodes whose lease ended before `before`; returns how many.
    async fn prune_nodes(&self, before: Timestamp) -> Result<u64>;
    /// Takes the lease `name` for `holder`, or renews it, for `ttl`
    /// seconds: granted when nobody holds it, when its holder's time ran
    /// out, when its holder is a node whose own lease ran out (a dead
    /// node's leases are free before they lapse), or when `holder` holds it
    /// already. `None` while another node
    /// holds it, and the refusal is noted on the lease, so its holder sees
    /// [`LeaseGrant::wanted`] at its next renewal. One atomic step: of
    /// nodes racing for a free lease exactly one gets it.
    async fn acquire_lease(
        &self,
        name: &str,
        holder: &NodeId,
        ttl: f64,
    ) -> Result<Option<LeaseGrant>>;
    /// Gives the lease up if `holder` holds it; returns whether it did.
    async fn release_lease(&self, name: &str, holder: &NodeId) -> Result<bool>;
    /// Leases whose name starts with `prefix`, live or not, by name.
    async fn leases(&self, prefix: &str) -> Result<Vec<LeaseRecord>>;
    /// The store's clock, in Unix seconds.
    async fn clock(&self) -> Result<Timestamp>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_checked() {
        assert!(NodeId::new("a1b2c3d4e5f60718").is_ok());
        assert!(NodeId::new("host-1:4242").is_ok());
        for bad in ["", "a b", "../x", "é", &"x".repeat(65)] {
            assert!(NodeId::new(bad).is_err(), "{bad:?}");
        }
        let random = NodeId::random();
        assert_eq!(random.as_str().len(), 16);
        assert_ne!(random, NodeId::random());
    }

    #[test]
    fn node_ids_round_trip_through_serde_and_refuse_bad_input() {
        let id = NodeId::new("n-1").unwrap();
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, "\"n-1\"");
        assert_eq!(serde_json::from_str::<NodeId>(&json).unwrap(), id);
        assert!(serde_json::from_str::<NodeId>("\"a/b\"").is_err());
    }
}
