//! The delivery ledger's policy: obligation ids, the sweep, and pruning.
//! The atomic parts (the claim, the fenced settlement) are the store's.
//!
//! Every final reply is recorded before it is sent, owned by this node, and
//! settled when the send ends. Each send is a numbered attempt, and only
//! the latest attempt may settle the row. If the node dies in between, its
//! lease in the store runs out (or, on the same host, its process is seen
//! to be gone) and a sweep on any node (at boot, whenever an adapter
//! reconnects, and periodically) claims the row and sends it again, first
//! line saying it may be a duplicate unless the row was never handed to the
//! platform. Two nodes sweeping at once never claim one row twice, and a
//! node that lost a row can report on it late without effect.
//!
//! The ledger is best effort by design: a failure to record or settle a
//! row is logged and the reply goes out anyway.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use talaria_store::{
    ClaimedObligation, GatewayStore, NewObligation, NodeId, Obligation, ObligationState, OwedClaim,
    StoreError,
};

use crate::adapter::SendError;
use crate::node;

/// Sends allowed per obligation, counting the first.
pub const MAX_ATTEMPTS: u32 = 5;

/// How long a failed send rests before a sweep tries it again: with
/// [`MAX_ATTEMPTS`], a platform may fail for several minutes without a
/// reply being given up.
pub const RETRY_FAILED_AFTER: Duration = Duration::from_secs(60);

/// An obligation older than this is abandoned instead of sent: a reply a
/// day late is more confusing than useful.
pub const STALE_AFTER: Duration = Duration::from_secs(24 * 3600);

/// Delivered and abandoned rows are kept this long, for `gateway status`
/// and post-mortems.
pub const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The first line of a reply sent again after a crash during its delivery.
pub const RECOVERY_MARKER: &str =
    "♻️ Recovered reply: the gateway restarted while sending this, so it may be a duplicate.\n\n";

/// The obligation id: first 24 hex of sha256(`session_key|message_ref|content`).
///
/// The same turn recording the same text twice gets the same row; two
/// threads of one chat never collide because the key names the thread.
pub fn obligation_id(session_key: &str, message_ref: &str, content: &str) -> String {
    let digest = Sha256::digest(format!("{session_key}|{message_ref}|{content}").as_bytes());
    digest.iter().take(12).map(|b| format!("{b:02x}")).collect()
}

/// How long one send attempt is its sender's. A send still unsettled then
/// is presumed stuck, and another sweep may claim the row (its late report
/// is fenced out).
pub const ATTEMPT_LEASE: Duration = Duration::from_secs(120);

/// An obligation this node won in a sweep and must now send.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    /// The row as claimed: its `attempts` is this attempt's number.
    pub obligation: Obligation,
    /// The earlier send may have reached the user: say it may be a duplicate.
    pub needs_marker: bool,
}

impl Claimed {
    /// The text to send.
    pub fn text(&self) -> String {
        if self.needs_marker {
            format!("{RECOVERY_MARKER}{}", self.obligation.content)
        } else {
            self.obligation.content.clone()
        }
    }

    /// The attempt number that settles it.
    pub fn attempt(&self) -> u32 {
        self.obligation.attempts
    }
}

impl From<ClaimedObligation> for Claimed {
    fn from(c: ClaimedObligation) -> Claimed {
        Claimed {
            needs_marker: c.previous != ObligationState::Pending,
            obligation: c.obligation,
        }
    }
}

/// Where a turn's answer goes, for the obligation its outbox records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyTo {
    /// The session key of the chat the turn ran for.
    pub session_key: String,
    /// The inbound message answered ("" when there is none).
    pub message_ref: String,
    /// The platform the answer is sent on.
    pub platform: String,
    /// The chat it goes to.
    pub chat_id: String,
    /// The thread within the chat, when any.
    pub thread_id: Option<String>,
    /// The message the first part answers, when the platform threads replies.
    pub reply_to: Option<String>,
    /// The owed turns this answer settles (see `talaria_store::owed`).
    pub settles: Vec<String>,
}

/// [`Ledger::outbox`].
struct ReplyOutbox {
    ledger: Ledger,
    reply: ReplyTo,
}

#[async_trait::async_trait]
impl talaria_agent::Outbox for ReplyOutbox {
    async fn append_answer(
        &self,
        session_id: &str,
        message: &talaria_core::Message,
        usage: &talaria_core::Usage,
        answer: &str,
    ) -> Result<i64, StoreError> {
        let obligation = self.obligation(answer);
        self.ledger
            .store
            .append_reply(session_id, message, usage, obligation)
            .await
    }

    async fn append_answer_with_calls(
        &self,
        session_id: &str,
        message: &talaria_core::Message,
        calls: &[talaria_store::ModelCall],
        answer: &str,
    ) -> Result<i64, StoreError> {
        let obligation = self.obligation(answer);
        self.ledger
            .store
            .append_reply_with_calls(session_id, message, calls, obligation)
            .await
    }
}

impl ReplyOutbox {
    /// What the answer `answer` owes its chat.
    fn obligation(&self, answer: &str) -> NewObligation {
        let r = &self.reply;
        NewObligation {
            id: obligation_id(&r.session_key, &r.message_ref, answer),
            session_key: r.session_key.clone(),
            platform: r.platform.clone(),
            chat_id: r.chat_id.clone(),
            thread_id: r.thread_id.clone(),
            reply_to: r.reply_to.clone(),
            content: answer.to_owned(),
            owner: self.ledger.me.clone(),
            settles: r.settles.clone(),
        }
    }
}

/// Rows claimed per store call by a sweep.
const CLAIM_CHUNK: usize = 1000;

/// The ledger, as this node uses it.
#[derive(Clone)]
pub struct Ledger {
    store: Arc<dyn GatewayStore>,
    /// This node: the owner of what it records.
    me: NodeId,
    /// [`RETRY_FAILED_AFTER`], or what a test chose.
    retry_failed_after: Duration,
}

/// A recorded reply this node is sending: its row and attempt number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The ledger row's id.
    pub id: String,
    /// Which attempt this is (1 for the first send).
    pub number: u32,
}

impl Ledger {
    /// The ledger of node `me`. The node must be announced (see
    /// [`crate::node`]) before it records anything, or other nodes take its
    /// rows for a dead node's.
    pub fn new(store: Arc<dyn GatewayStore>, me: NodeId) -> Ledger {
        Ledger {
            store,
            me,
            retry_failed_after: RETRY_FAILED_AFTER,
        }
    }

    /// The same ledger, letting failed sends rest `pause` before a retry.
    pub fn retrying_failed_after(mut self, pause: Duration) -> Ledger {
        self.retry_failed_after = pause;
        self
    }

    /// The node whose sends this ledger records.
    pub fn node(&self) -> &NodeId {
        &self.me
    }

    /// Records a reply about to be sent (settling the owed turns `settles`
    /// in the same transaction) and starts its first attempt; `None` when
    /// the ledger is unavailable (the reply is sent anyway).
    #[allow(clippy::too_many_arguments)]
    pub async fn record(
        &self,
        session_key: &str,
        message_ref: &str,
        platform: &str,
        chat_id: &str,
        thread_id: Option<&str>,
        reply_to: Option<&str>,
        content: &str,
        settles: &[String],
    ) -> Option<Attempt> {
        let id = obligation_id(session_key, message_ref, content);
        let row = NewObligation {
            id: id.clone(),
            session_key: session_key.to_owned(),
            platform: platform.to_owned(),
            chat_id: chat_id.to_owned(),
            thread_id: thread_id.map(str::to_owned),
            reply_to: reply_to.map(str::to_owned),
            content: content.to_owned(),
            owner: self.me.clone(),
            settles: settles.to_vec(),
        };
        if let Err(e) = self.store.record_obligation(row).await {
            tracing::warn!(error = %e, "could not record the reply in the delivery ledger; sending it anyway");
            return None;
        }
        // Recorded a moment ago as ours and pending: only a sweep that
        // took this node for dead can have moved it, and that node sends it.
        self.begin(&id).await.ok().flatten()
    }

    /// An outbox for one turn's answer: the answer row and this reply's
    /// obligation are stored in one transaction (see
    /// [`talaria_agent::Outbox`]); [`Ledger::begin`] then starts the send.
    pub fn outbox(&self, reply: ReplyTo) -> Arc<dyn talaria_agent::Outbox> {
        Arc::new(ReplyOutbox {
            ledger: self.clone(),
            reply,
        })
    }

    /// Starts the first attempt of a reply the outbox recorded with its
    /// answer. `Err(())` when this node may not send it: another node took
    /// it over (it judged this one dead); that node sends it.
    pub async fn begin(&self, id: &str) -> Result<Option<Attempt>, ()> {
        match self
            .store
            .begin_attempt(id, &self.me, ATTEMPT_LEASE.as_secs_f64())
            .await
        {
            Ok(Some(number)) => {
                tracing::debug!(id, attempt = number, "sending a recorded reply");
                Ok(Some(Attempt {
                    id: id.to_owned(),
                    number,
                }))
            }
            Ok(None) => {
                tracing::warn!(
                    id,
                    "a reply was claimed by another node before it was sent; leaving it to that node"
                );
                Err(())
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not start the reply's delivery in the ledger; sending it anyway");
                Ok(None)
            }
        }
    }

    /// Records how attempt `attempt` of a send ended. A send the platform
    /// refused for good (an unknown chat, a recipient who opted out,
    /// WhatsApp's 24-hour rule) is abandoned at once with the reason: trying
    /// again cannot help.
    pub async fn settle(&self, attempt: &Attempt, result: &Result<(), SendError>) {
        let (id, n) = (attempt.id.as_str(), attempt.number);
        let outcome = match result {
            Ok(()) => self.store.mark_delivered(id, n).await,
            Err(e @ SendError::Rejected(_)) => {
                self.store
                    .abandon_obligation(id, Some(n), &e.to_string())
                    .await
            }
            Err(e) => self.store.mark_failed(id, n, &e.to_string()).await,
        };
        match outcome {
            Ok(true) => tracing::debug!(id, attempt = n, ok = result.is_ok(), "send settled"),
            Ok(false) => tracing::info!(
                id,
                attempt = n,
                "a send ended after another node took the reply over; its report is ignored"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "delivery ledger: could not record how a send ended")
            }
        }
    }

    /// Records that the first `parts_sent` parts of attempt `attempt`'s
    /// reply went out, so a re-send after a crash starts after them. Best
    /// effort like the rest of the ledger: a failure is logged, and at
    /// worst a part is sent again (with the recovery line).
    pub async fn progress(&self, attempt: &Attempt, parts_sent: usize) {
        let n = u32::try_from(parts_sent).unwrap_or(u32::MAX);
        match self
            .store
            .mark_parts_sent(&attempt.id, attempt.number, n)
            .await
        {
            Ok(true) => tracing::debug!(id = %attempt.id, parts_sent = n, "reply part sent"),
            Ok(false) => tracing::info!(
                id = %attempt.id,
                "a part went out after another node took the reply over"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "delivery ledger: could not record a sent part")
            }
        }
    }

    /// Claims what this node should (re)send on the `deliverable`
    /// platforms, abandoning what is over budget.
    ///
    /// First declares dead the nodes of this host whose process is gone,
    /// so a gateway restarted after a crash takes over at once. Then claims,
    /// in chunks: rows of dead or unknown nodes, attempts that outlived
    /// their lease, and this node's own failed rows once they have rested
    /// [`RETRY_FAILED_AFTER`] (a send that failed while the platform was
    /// down is tried again when it is back).
    /// Over-budget rows are abandoned whatever their platform; rows of
    /// platforms not connected here are left for a node that has them.
    pub async fn sweep(&self, deliverable: &HashSet<String>) -> Result<Vec<Claimed>, StoreError> {
        if let Err(e) = node::reap_local(self.store.as_ref(), &self.me).await {
            tracing::warn!(error = %e, "could not check this host's gateways for dead ones");
        }
        let now = self.store.clock().await?;
        let mut claim = OwedClaim {
            claimer: self.me.clone(),
            platforms: deliverable.iter().cloned().collect(),
            limit: CLAIM_CHUNK,
            lease: ATTEMPT_LEASE.as_secs_f64(),
            max_attempts: MAX_ATTEMPTS,
            stale_before: now - STALE_AFTER.as_secs_f64(),
            retry_failed_after: self.retry_failed_after.as_secs_f64(),
            after: None,
        };
        let mut claimed = Vec::new();
        loop {
            let batch = self.store.claim_owed(&claim).await?;
            claim.after.clone_from(&batch.last);
            let done = batch.claimed.len() + batch.abandoned.len() < CLAIM_CHUNK;
            for row in &batch.abandoned {
                tracing::warn!(
                    id = %row.id,
                    platform = %row.platform,
                    reason = row.last_error.as_deref().unwrap_or(""),
                    "abandoning an undelivered reply"
                );
            }
            claimed.extend(batch.claimed.into_iter().map(Claimed::from));
            if done {
                return Ok(claimed);
            }
        }
    }

    /// Deletes delivered and abandoned rows past the retention period.
    pub async fn prune(&self) -> Result<u64, StoreError> {
        let now = self.store.clock().await?;
        self.store
            .prune_obligations(now - RETENTION.as_secs_f64())
            .await
    }

    /// Rows per state, for `gateway status`.
    pub async fn counts(&self) -> Result<BTreeMap<ObligationState, u64>, StoreError> {
        self.store.obligation_counts().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_24_hex_and_depend_on_every_part() {
        let a = obligation_id("agent:main:telegram:dm:1", "10", "hello");
        assert_eq!(a.len(), 24);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a, obligation_id("agent:main:telegram:dm:1", "10", "hello"));
        assert_ne!(
            a,
            obligation_id("agent:main:telegram:dm:1:7", "10", "hello")
        );
        assert_ne!(a, obligation_id("agent:main:telegram:dm:1", "11", "hello"));
        assert_ne!(a, obligation_id("agent:main:telegram:dm:1", "10", "hello!"));
        let expected: String = Sha256::digest(b"agent:main:telegram:dm:1|10|hello")
            .iter()
            .take(12)
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(a, expected);
    }
}
