//! Owed turns: every message the gateway accepted and has not yet answered.
//!
//! A message becomes an obligation the moment the runner takes it (before
//! the adapter acknowledges it to its platform) and stays one until its
//! answer is stored (the outbox transaction settles it together with the
//! reply's ledger row), the user is told it failed, or the user stopped it.
//! A row whose node dies (killed, or stopped before the turn finished) is
//! claimed by the next node that sweeps, which runs the turn again or tells
//! the user it was lost: never silence, never a second answer.

use async_trait::async_trait;

use crate::cluster::NodeId;
use crate::{Result, Timestamp};

/// A message just accepted, to be recorded as owed a turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOwedTurn {
    /// Unique per message: the platform's inbound id when it has one.
    pub id: String,
    /// The session key whose turn answers it.
    pub session_key: String,
    /// The platform it came from; claimed only where that platform is live.
    pub platform: String,
    /// The inbound event as the gateway serialized it (opaque here).
    pub event: String,
    /// The node running its turn.
    pub owner: NodeId,
}

/// A recorded owed turn.
#[derive(Debug, Clone, PartialEq)]
pub struct OwedTurn {
    /// Unique per message: the platform's inbound id when it has one.
    pub id: String,
    /// The session key whose turn answers it.
    pub session_key: String,
    /// The platform it came from.
    pub platform: String,
    /// The inbound event as the gateway serialized it, to run it again.
    pub event: String,
    /// The node responsible for it now.
    pub owner: Option<NodeId>,
    /// When the runner accepted it (the store's clock).
    pub accepted_at: Timestamp,
    /// Times a node took it over after its owner died; each claim adds
    /// one, so a message whose turn kills its process is not retried
    /// forever.
    pub claims: u32,
}

/// Messages owed a turn. See the module documentation.
#[async_trait]
pub trait OwedTurnStore: Send + Sync {
    /// Takes an inbound message in one atomic step: when `inbound_id` is
    /// given, records it in the inbound dedupe (as
    /// [`crate::InboundStore::first_delivery`] does, under `turn.platform`)
    /// and, only if it is new there, records `turn` as owed, owned by
    /// `turn.owner`. Returns `false`, recording nothing, for a repeat.
    async fn accept_turn(&self, inbound_id: Option<&str>, turn: NewOwedTurn) -> Result<bool>;
    /// The turns are over (answered, failed and said so, stopped by the
    /// user): forgets them. Unknown ids are ignored. Returns how many rows
    /// went.
    async fn settle_turns(&self, ids: &[String]) -> Result<u64>;
    /// Takes over, for `claimer`, the owed turns of nodes that are missing
    /// or dead (their heartbeat lease ran out), oldest first, at most
    /// `limit`, on `platforms` only (a turn is only useful where its
    /// answer can be sent): owner becomes `claimer` and `claims` grows by
    /// one. Never the claimer's own rows: it is running those. Two nodes
    /// claiming together never take one row twice.
    async fn claim_owed_turns(
        &self,
        claimer: &NodeId,
        platforms: &[String],
        limit: usize,
    ) -> Result<Vec<OwedTurn>>;
    /// How many turns are owed now, on every node.
    async fn owed_turn_count(&self) -> Result<u64>;
}
