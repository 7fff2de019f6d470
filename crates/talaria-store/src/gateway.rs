//! What the gateway keeps: session routes, the delivery ledger and DM
//! pairing. Backend-neutral types and traits; the policy (when to reset,
//! who is alive, what a code looks like) lives in the gateway crate, the
//! atomicity (claims, limits checked and applied in one transaction) here.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{Result, SessionStore, Timestamp};

/// A session key's current conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Route {
    pub session_key: String,
    pub session_id: String,
    /// When the key was pointed at this session.
    pub created_at: Timestamp,
    /// The last message routed through it (reset policies read this).
    pub updated_at: Timestamp,
}

/// Session key → current session id, persisted so a chat continues across
/// restarts.
#[async_trait]
pub trait RouteStore: Send + Sync {
    /// The key's route, if it has one.
    async fn route(&self, session_key: &str) -> Result<Option<Route>>;
    /// Points `session_key` at `session_id` (creating or replacing the
    /// route), stamping both times with now.
    async fn set_route(&self, session_key: &str, session_id: &str) -> Result<()>;
    /// Records activity on the key: `updated_at` = now.
    async fn touch_route(&self, session_key: &str) -> Result<()>;
    /// Routes last updated before `before` whose session is still open,
    /// oldest first (ties by key), at most `limit`: the candidates for an
    /// expiry pass.
    ///
    /// "Open" means not ended since the route's last activity. A route is
    /// kept after its session ends (so the key's next message can tell it
    /// expired), and leaving such routes out is what lets a caller that
    /// ends what it is given get through the list instead of being handed
    /// the same dormant chats on every pass. A session ended before the
    /// route last moved (one brought back by `/resume`) counts as open. A
    /// route whose session row is gone has nothing to end and is left out.
    async fn stale_routes(&self, before: Timestamp, limit: usize) -> Result<Vec<Route>>;
    /// Ends the session `route` points at, for `reason`, unless it was
    /// already ended at or after the route's `updated_at` (by another
    /// caller acting on the same expiry). One guarded statement: of two
    /// callers racing to end one session for the same route state, exactly
    /// one wins. Returns whether this caller ended it; `false` too when the
    /// session does not exist.
    async fn end_route_session(&self, route: &Route, reason: &str) -> Result<bool>;
}

/// Where a delivery obligation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ObligationState {
    /// Recorded, not yet handed to the platform.
    Pending,
    /// A send is in progress (or was, when its process died).
    Attempting,
    Delivered,
    /// The last send failed; a sweep may try again.
    Failed,
    /// Given up: too many attempts or too old.
    Abandoned,
}

impl ObligationState {
    pub fn as_str(self) -> &'static str {
        match self {
            ObligationState::Pending => "pending",
            ObligationState::Attempting => "attempting",
            ObligationState::Delivered => "delivered",
            ObligationState::Failed => "failed",
            ObligationState::Abandoned => "abandoned",
        }
    }

    /// Pending, attempting and failed rows are still owed.
    pub fn is_open(self) -> bool {
        matches!(
            self,
            ObligationState::Pending | ObligationState::Attempting | ObligationState::Failed
        )
    }
}

/// The process that owns an obligation: its pid and its start time (clock
/// ticks since boot, from `/proc/<pid>/stat`), so a recycled pid is not
/// mistaken for the owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    pub pid: u32,
    /// `None` where the start time could not be read.
    pub started_at: Option<u64>,
}

/// A reply about to be sent, with everything needed to send it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewObligation {
    /// First 24 hex of sha256(`session_key|inbound message id|content`).
    pub id: String,
    pub session_key: String,
    pub platform: String,
    pub chat_id: String,
    pub thread_id: Option<String>,
    pub reply_to: Option<String>,
    pub content: String,
    pub owner: Owner,
}

/// A stored obligation.
#[derive(Debug, Clone, PartialEq)]
pub struct Obligation {
    pub id: String,
    pub session_key: String,
    pub platform: String,
    pub chat_id: String,
    pub thread_id: Option<String>,
    pub reply_to: Option<String>,
    pub content: String,
    pub state: ObligationState,
    /// Sends tried so far (a sweep's claim counts one).
    pub attempts: u32,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub owner: Option<Owner>,
    pub last_error: Option<String>,
}

/// The delivery ledger: final replies recorded before they are sent.
///
/// State changes by id are unconditional; only [`LedgerStore::claim_obligation`]
/// is guarded, because it is the one that can race another process.
#[async_trait]
pub trait LedgerStore: Send + Sync {
    /// Records (or re-records, idempotently by id) an obligation as
    /// `pending` with no attempts, owned by `owner`, created now.
    async fn record_obligation(&self, obligation: NewObligation) -> Result<()>;
    async fn mark_attempting(&self, id: &str) -> Result<()>;
    async fn mark_delivered(&self, id: &str) -> Result<()>;
    /// Records a failed send; the error text is kept (at most 500 chars).
    async fn mark_failed(&self, id: &str, error: &str) -> Result<()>;
    /// Gives up on an obligation, saying why.
    async fn abandon_obligation(&self, id: &str, reason: &str) -> Result<()>;
    async fn obligation(&self, id: &str) -> Result<Option<Obligation>>;
    /// Every open (pending, attempting, failed) obligation, oldest first.
    async fn open_obligations(&self) -> Result<Vec<Obligation>>;
    /// Takes over an open obligation: re-stamps the owner to `new_owner`,
    /// moves it to `attempting` and adds one attempt, all in one guarded
    /// statement, only if the stored owner still equals
    /// `expected` (pid and start time, `None` matching a missing owner) and
    /// the row is still open. A row already `attempting` under `new_owner`
    /// itself is refused: a process re-claiming its own failed row expects
    /// the owner it is about to write, so without this two sweeps of one
    /// process could both win. Returns whether this caller won the claim.
    async fn claim_obligation(
        &self,
        id: &str,
        expected: Option<Owner>,
        new_owner: Owner,
    ) -> Result<bool>;
    /// [`LedgerStore::claim_obligation`] for many rows at once, each
    /// guarded on its own expected owner; returns one result per claim, in
    /// order. Backends that can do it in one transaction should: a sweep
    /// after a crash may claim thousands of rows.
    async fn claim_obligations(
        &self,
        claims: &[(String, Option<Owner>)],
        new_owner: Owner,
    ) -> Result<Vec<bool>> {
        let mut won = Vec::with_capacity(claims.len());
        for (id, expected) in claims {
            won.push(self.claim_obligation(id, *expected, new_owner).await?);
        }
        Ok(won)
    }
    /// Deletes delivered and abandoned rows last updated before `cutoff`;
    /// returns how many.
    async fn prune_obligations(&self, cutoff: Timestamp) -> Result<u64>;
    /// How many rows are in each state.
    async fn obligation_counts(&self) -> Result<BTreeMap<ObligationState, u64>>;
}

/// The pairing rules, passed in so the store applies them atomically.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairingLimits {
    /// Seconds a code stays valid.
    pub code_ttl: f64,
    /// Codes pending at once per platform (a user holds at most one).
    pub max_pending: usize,
    /// Seconds between two offers to the same user.
    pub offer_interval: f64,
    /// Failed approvals that lock a platform.
    pub max_failures: u32,
    /// Seconds a lock lasts.
    pub lockout: f64,
}

impl Default for PairingLimits {
    fn default() -> PairingLimits {
        PairingLimits {
            code_ttl: 3600.0,
            max_pending: 3,
            offer_interval: 600.0,
            max_failures: 5,
            lockout: 3600.0,
        }
    }
}

/// What happened to a request for a code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OfferOutcome {
    /// The code was stored (as a salted hash) and may be shown to the user.
    Created,
    /// This user was offered a code (or refused) within the interval: say
    /// nothing.
    RateLimited,
    /// The platform has too many codes pending. The user's offer time is
    /// stamped, so this is reported at most once per interval.
    TooManyPending,
    /// The platform's approvals are locked after failed attempts. Stamped
    /// like [`OfferOutcome::TooManyPending`].
    LockedOut,
}

/// A user who may talk to the bot because an operator approved their code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovedUser {
    pub platform: String,
    pub user_id: String,
    pub user_name: Option<String>,
    pub approved_at: Timestamp,
}

/// A code waiting for approval (the code itself is never stored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingPairing {
    pub platform: String,
    pub user_id: String,
    pub user_name: Option<String>,
    pub created_at: Timestamp,
}

/// What happened to an approval attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum ApproveOutcome {
    Approved(ApprovedUser),
    /// No pending code matched; `failures` counts toward the lock.
    NoMatch {
        failures: u32,
    },
    /// Approvals on this platform are locked until the given time.
    LockedOut {
        until: Timestamp,
    },
}

/// Everything pairing holds, for `talaria pairing list`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PairingSnapshot {
    pub pending: Vec<PendingPairing>,
    pub approved: Vec<ApprovedUser>,
    /// Platforms whose approvals are locked, and until when.
    pub lockouts: Vec<(String, Timestamp)>,
}

/// Codes as compared: an operator may type them in any case, with stray
/// spaces around. [`PairingStore`] implementations apply it to the code
/// both when offered and when approved; callers need not (and, to keep one
/// definition, should not) normalise themselves, except to echo a code back.
pub fn normalize_pairing_code(code: &str) -> String {
    code.trim().to_ascii_uppercase()
}

/// DM pairing: codes (stored only as salted hashes), approved users, and
/// the rate limits around them.
///
/// A user holds at most one pending code per platform: a new offer replaces
/// the user's pending code, so the code they were shown last is the only
/// one that works, and one user cannot fill the platform's
/// [`PairingLimits::max_pending`] slots and lock every other stranger out.
#[async_trait]
pub trait PairingStore: Send + Sync {
    /// In one transaction: drops expired codes; answers
    /// [`OfferOutcome::RateLimited`] when the user was offered (or refused)
    /// within the interval, checked first so a user is answered at most
    /// once per interval whatever else holds; refuses (stamping the user's
    /// offer time) when the platform is locked or, after dropping the
    /// user's own pending code, too many codes are pending; otherwise
    /// replaces the user's pending code with a fresh salt and the salted
    /// hash of `code` (never `code` itself) and stamps the user's offer
    /// time. `code` is normalised with [`normalize_pairing_code`].
    async fn pairing_offer(
        &self,
        platform: &str,
        user_id: &str,
        user_name: Option<&str>,
        code: &str,
        limits: PairingLimits,
    ) -> Result<OfferOutcome>;
    /// Approves the user whose pending code matches `code` (normalised with
    /// [`normalize_pairing_code`], then compared in constant time against
    /// every unexpired code of the platform); a miss
    /// counts a failure and the failure that reaches the limit locks the
    /// platform (and resets the count).
    async fn pairing_approve(
        &self,
        platform: &str,
        code: &str,
        limits: PairingLimits,
    ) -> Result<ApproveOutcome>;
    async fn pairing_is_approved(&self, platform: &str, user_id: &str) -> Result<bool>;
    /// Removes an approval; returns whether there was one.
    async fn pairing_revoke(&self, platform: &str, user_id: &str) -> Result<bool>;
    /// Drops pending codes (of one platform, or all); returns how many.
    async fn pairing_clear_pending(&self, platform: Option<&str>) -> Result<u64>;
    /// Unexpired codes, approvals and active locks.
    async fn pairing_snapshot(&self, limits: PairingLimits) -> Result<PairingSnapshot>;
}

/// Inbound events already taken, so a platform's re-delivery (an
/// unacknowledged Slack envelope, a Matrix sync replayed after a crash, the
/// same update reaching two gateways) never starts a second turn.
#[async_trait]
pub trait InboundStore: Send + Sync {
    /// Records `inbound_id` for `platform` and returns `true`, or returns
    /// `false` when it was recorded before. The check and the record are
    /// one atomic step, so of two racing callers exactly one gets `true`.
    async fn first_delivery(&self, platform: &str, inbound_id: &str) -> Result<bool>;
    /// Forgets ids recorded before `cutoff`; returns how many. Platforms
    /// stop re-delivering long before any sensible cutoff.
    async fn prune_inbound(&self, cutoff: Timestamp) -> Result<u64>;
}

/// Small named values an adapter keeps across restarts: a sync token, a
/// stream position. Kept in the store rather than in files so that, with a
/// shared backend, whichever node takes over a connector resumes where the
/// last one stopped.
#[async_trait]
pub trait CursorStore: Send + Sync {
    /// The value last saved under (`platform`, `name`).
    async fn cursor(&self, platform: &str, name: &str) -> Result<Option<String>>;
    /// Saves `value` under (`platform`, `name`), replacing what was there.
    async fn set_cursor(&self, platform: &str, name: &str, value: &str) -> Result<()>;
}

/// Everything the gateway needs from one backend.
pub trait GatewayStore:
    SessionStore
    + RouteStore
    + LedgerStore
    + PairingStore
    + InboundStore
    + CursorStore
    + crate::CronStore
{
}

impl<
    T: SessionStore
        + RouteStore
        + LedgerStore
        + PairingStore
        + InboundStore
        + CursorStore
        + crate::CronStore,
> GatewayStore for T
{
}
