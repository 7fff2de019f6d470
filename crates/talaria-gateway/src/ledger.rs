//! The delivery ledger's policy: obligation ids, the dead-owner rule, the
//! sweep, and pruning. The atomic parts (the guarded claim) are the
//! store's.
//!
//! Every final reply is recorded before it is sent and marked when the send
//! ends. If the process dies in between, the row keeps a dead owner; the
//! next gateway (at boot, and whenever an adapter reconnects) claims it and
//! sends it again, first line saying it may be a duplicate unless the row
//! was never handed to the platform. Two gateways sweeping at once cannot
//! both claim a row: the claim is an update guarded on the owner read
//! before it. Nor can two sweeps of one process (two adapters reconnecting
//! together) both re-claim its own failed row, where the owner read is the
//! owner written: the store refuses a claim of a row already `attempting`
//! under the claimer.
//!
//! The ledger is best effort by design: a failure to record or mark a row
//! is logged and the reply goes out anyway.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use talaria_store::{LedgerStore, NewObligation, Obligation, ObligationState, Owner, StoreError};

use crate::adapter::SendError;
use crate::owner;

/// Sends allowed per obligation, counting the first.
pub const MAX_ATTEMPTS: u32 = 3;

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

/// An obligation this process won in a sweep and must now send.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
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
}

/// Rows claimed per transaction by a sweep.
const CLAIM_CHUNK: usize = 1000;

/// Decides whether an owner is alive. A trait so tests can stage owners
/// that are alive or dead without real processes.
pub trait Liveness: Send + Sync {
    fn is_alive(&self, owner: &Owner) -> bool;
}

/// The real rule: the process exists and has the recorded start time.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessLiveness;

impl Liveness for ProcessLiveness {
    fn is_alive(&self, owner: &Owner) -> bool {
        owner::is_alive(owner)
    }
}

/// The ledger, as this process uses it.
#[derive(Clone)]
pub struct Ledger {
    store: Arc<dyn LedgerStore>,
    me: Owner,
    liveness: Arc<dyn Liveness>,
}

impl Ledger {
    /// A ledger owned by this process.
    pub fn new(store: Arc<dyn LedgerStore>) -> Ledger {
        Ledger::with_owner(store, owner::current(), Arc::new(ProcessLiveness))
    }

    /// A ledger with an explicit owner identity and liveness rule (tests
    /// that play several gateways in one process).
    pub fn with_owner(
        store: Arc<dyn LedgerStore>,
        me: Owner,
        liveness: Arc<dyn Liveness>,
    ) -> Ledger {
        Ledger {
            store,
            me,
            liveness,
        }
    }

    pub fn owner(&self) -> Owner {
        self.me
    }

    /// Records a reply about to be sent; returns its id, or `None` when the
    /// ledger is unavailable (the reply is sent anyway).
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
    ) -> Option<String> {
        let id = obligation_id(session_key, message_ref, content);
        let row = NewObligation {
            id: id.clone(),
            session_key: session_key.to_owned(),
            platform: platform.to_owned(),
            chat_id: chat_id.to_owned(),
            thread_id: thread_id.map(str::to_owned),
            reply_to: reply_to.map(str::to_owned),
            content: content.to_owned(),
            owner: self.me,
        };
        match self.store.record_obligation(row).await {
            Ok(()) => Some(id),
            Err(e) => {
                tracing::warn!(error = %e, "could not record the reply in the delivery ledger; sending it anyway");
                None
            }
        }
    }

    pub async fn attempting(&self, id: &str) {
        log_failure("mark attempting", self.store.mark_attempting(id).await);
    }

    pub async fn delivered(&self, id: &str) {
        log_failure("mark delivered", self.store.mark_delivered(id).await);
    }

    pub async fn failed(&self, id: &str, error: &str) {
        log_failure("mark failed", self.store.mark_failed(id, error).await);
    }

    /// Records a send the platform refused for good (an unknown chat, a
    /// recipient who opted out, WhatsApp's 24-hour rule): trying again
    /// cannot help, so the row is abandoned at once with the reason
    /// rather than retried by later sweeps.
    pub async fn refused(&self, id: &str, error: &str) {
        log_failure(
            "mark refused",
            self.store.abandon_obligation(id, error).await,
        );
    }

    /// Records how a send ended.
    pub async fn settle(&self, id: &str, result: &Result<(), SendError>) {
        match result {
            Ok(()) => self.delivered(id).await,
            Err(e @ SendError::Rejected(_)) => self.refused(id, &e.to_string()).await,
            Err(e) => self.failed(id, &e.to_string()).await,
        }
    }

    /// Claims what this process should (re)send on the `deliverable`
    /// platforms, abandoning what is over budget.
    ///
    /// Considered: open rows whose owner is dead, and this process's own
    /// failed rows (a send that failed while the platform was down is tried
    /// again when it comes back). Rows of live owners, including this
    /// process's pending and attempting ones, are in someone's hands and are
    /// skipped. Over-budget rows are abandoned whatever their platform;
    /// rows of platforms not connected now are left untouched, so no
    /// attempt is spent while a platform is down.
    pub async fn sweep(&self, deliverable: &HashSet<String>) -> Result<Vec<Claimed>, StoreError> {
        let now = talaria_core::unix_now();
        let mut candidates = Vec::new();
        for row in self.store.open_obligations().await? {
            let mine = row.owner == Some(self.me);
            let orphaned = match &row.owner {
                None => true,
                Some(_) if mine => row.state == ObligationState::Failed,
                Some(o) => !self.liveness.is_alive(o),
            };
            if !orphaned {
                continue;
            }
            if row.attempts >= MAX_ATTEMPTS || now - row.created_at > STALE_AFTER.as_secs_f64() {
                let reason = if row.attempts >= MAX_ATTEMPTS {
                    "gave up after the maximum number of attempts"
                } else {
                    "older than 24 hours"
                };
                tracing::warn!(id = %row.id, platform = %row.platform, reason, "abandoning an undelivered reply");
                self.store.abandon_obligation(&row.id, reason).await?;
                continue;
            }
            if deliverable.contains(&row.platform) {
                candidates.push(row);
            }
        }
        // Claimed in chunks, each one transaction: after a crash with many
        // owed replies, a claim per transaction would take seconds per
        // thousand rows. Each row is still guarded on its own owner.
        let mut claimed = Vec::new();
        let mut rows = candidates.into_iter().peekable();
        while rows.peek().is_some() {
            let chunk: Vec<Obligation> = rows.by_ref().take(CLAIM_CHUNK).collect();
            let claims: Vec<(String, Option<Owner>)> =
                chunk.iter().map(|r| (r.id.clone(), r.owner)).collect();
            let won = self.store.claim_obligations(&claims, self.me).await?;
            for (row, won) in chunk.into_iter().zip(won) {
                if !won {
                    continue;
                }
                let needs_marker = row.state != ObligationState::Pending;
                claimed.push(Claimed {
                    obligation: Obligation {
                        attempts: row.attempts + 1,
                        owner: Some(self.me),
                        ..row
                    },
                    needs_marker,
                });
            }
        }
        Ok(claimed)
    }

    /// Deletes delivered and abandoned rows past the retention period.
    pub async fn prune(&self) -> Result<u64, StoreError> {
        self.store
            .prune_obligations(talaria_core::unix_now() - RETENTION.as_secs_f64())
            .await
    }

    /// Rows per state, for `gateway status`.
    pub async fn counts(&self) -> Result<BTreeMap<ObligationState, u64>, StoreError> {
        self.store.obligation_counts().await
    }
}

fn log_failure(what: &str, result: Result<(), StoreError>) {
    if let Err(e) = result {
        tracing::warn!(error = %e, "delivery ledger: could not {what}");
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
