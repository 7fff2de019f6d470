//! What the gateway keeps: session routes, the delivery ledger and DM
//! pairing. Backend-neutral types and traits; the policy (when to reset,
//! who is alive, what a code looks like) lives in the gateway crate, the
//! atomicity (claims, limits checked and applied in one transaction) here.

use std::collections::BTreeMap;
use talaria_core::ids::to_hex;

use async_trait::async_trait;
use rand::Rng;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cluster::NodeId;
use crate::{Result, SessionStore, Timestamp};

/// A session key's current conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Route {
    /// The key, computed once per inbound event.
    pub session_key: String,
    /// The session its messages go to now.
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
    /// Sent: the platform accepted it.
    Delivered,
    /// The last send failed; a sweep may try again.
    Failed,
    /// Given up: too many attempts or too old.
    Abandoned,
}

impl ObligationState {
    /// The state's name as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            ObligationState::Pending => "pending",
            ObligationState::Attempting => "attempting",
            ObligationState::Delivered => "delivered",
            ObligationState::Failed => "failed",
            ObligationState::Abandoned => "abandoned",
        }
    }

    /// The state named `s` (as [`ObligationState::as_str`] writes it).
    pub fn parse(s: &str) -> Option<ObligationState> {
        [
            ObligationState::Pending,
            ObligationState::Attempting,
            ObligationState::Delivered,
            ObligationState::Failed,
            ObligationState::Abandoned,
        ]
        .into_iter()
        .find(|state| state.as_str() == s)
    }

    /// Pending, attempting and failed rows are still owed.
    pub fn is_open(self) -> bool {
        matches!(
            self,
            ObligationState::Pending | ObligationState::Attempting | ObligationState::Failed
        )
    }
}

/// A reply about to be sent, with everything needed to send it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewObligation {
    /// First 24 hex of sha256(`session_key|inbound message id|content`).
    pub id: String,
    /// The session key of the conversation answered.
    pub session_key: String,
    /// The platform to send on.
    pub platform: String,
    /// The chat to send to.
    pub chat_id: String,
    /// The thread or topic within it.
    pub thread_id: Option<String>,
    /// The message answered, when the platform can show replies.
    pub reply_to: Option<String>,
    /// The text to send, already what the user will read.
    pub content: String,
    /// The node that will send it.
    pub owner: NodeId,
    /// Owed turns (see [`crate::owed`]) this reply answers: settled in the
    /// transaction that stores it, so an answered message is never run
    /// again and an unanswered one is never forgotten.
    pub settles: Vec<String>,
}

/// A stored obligation.
#[derive(Debug, Clone, PartialEq)]
pub struct Obligation {
    /// First 24 hex of sha256(`session_key|inbound message id|content`).
    pub id: String,
    /// The session key of the conversation answered.
    pub session_key: String,
    /// The platform to send on.
    pub platform: String,
    /// The chat to send to.
    pub chat_id: String,
    /// The thread or topic within it.
    pub thread_id: Option<String>,
    /// The message answered.
    pub reply_to: Option<String>,
    /// The text to send.
    pub content: String,
    /// Where it stands: pending, attempting, delivered, failed, abandoned.
    pub state: ObligationState,
    /// Sends started so far. Each start (the owner's first send, a sweep's
    /// claim) adds one, and its number fences the send's completion: only
    /// the latest attempt may mark the row.
    pub attempts: u32,
    /// When it was recorded.
    pub created_at: Timestamp,
    /// When its state last changed.
    pub updated_at: Timestamp,
    /// The node responsible for it; `None` when unknown.
    pub owner: Option<NodeId>,
    /// While `attempting`: until when the attempt is its sender's. A send
    /// still unsettled then is presumed stuck and may be claimed.
    pub lease_until: Option<Timestamp>,
    /// Why the last attempt failed, or why it was abandoned.
    pub last_error: Option<String>,
    /// How many parts of the reply (its text chunks and files, in the
    /// order they are sent) were confirmed sent, by any attempt. A sender
    /// taking the row over after a crash starts after them, so the user
    /// does not get those parts twice. Only grows
    /// ([`LedgerStore::mark_parts_sent`]); recording the row again starts
    /// it over at 0.
    pub parts_sent: u32,
}

/// What a sweep asks for: the owed rows one node should (re)send now.
#[derive(Debug, Clone, PartialEq)]
pub struct OwedClaim {
    /// The node claiming.
    pub claimer: NodeId,
    /// Platforms the claimer can deliver to now; rows of others are left
    /// alone (no attempt is spent while a platform is down).
    pub platforms: Vec<String>,
    /// Most rows claimed (and most abandoned) by one call.
    pub limit: usize,
    /// Seconds a claimed row stays the claimer's before it counts as stuck.
    pub lease: f64,
    /// A row with this many attempts is abandoned instead of claimed.
    pub max_attempts: u32,
    /// A row created before this is abandoned instead of claimed.
    pub stale_before: Timestamp,
    /// Seconds a `failed` row rests after its failure before it may be
    /// claimed again, so a platform that is failing is not retried (and
    /// the attempt budget spent) every sweep.
    pub retry_failed_after: f64,
    /// Only rows after this one in claim order: the previous call's
    /// [`OwedBatch::last`], so a sweep of many calls reads each row once
    /// instead of passing over every row it already claimed on each call.
    pub after: Option<OwedCursor>,
}

/// A place in claim order (oldest first, then by id).
#[derive(Debug, Clone, PartialEq)]
pub struct OwedCursor {
    /// When the row was recorded.
    pub created_at: Timestamp,
    /// The row's id, which breaks ties.
    pub id: String,
}

/// A row a sweep won.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedObligation {
    /// The row as it is now: `attempting`, owned by the claimer, its
    /// `attempts` the fence of this attempt.
    pub obligation: Obligation,
    /// Its state before the claim: anything but `pending` means an earlier
    /// send may have reached the user.
    pub previous: ObligationState,
}

/// What one [`LedgerStore::claim_owed`] did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OwedBatch {
    /// Rows this call claimed, to be sent now.
    pub claimed: Vec<ClaimedObligation>,
    /// Rows given up (over the attempt budget or too old), as they are now.
    pub abandoned: Vec<Obligation>,
    /// The last row this call decided on, for the next call's
    /// [`OwedClaim::after`]; `None` when it found none.
    pub last: Option<OwedCursor>,
}

/// The delivery ledger: final replies recorded before they are sent.
///
/// A row is owed while it is open (pending, attempting, failed). Its owner
/// node sends it; if that node dies (its lease in the [`crate::ClusterStore`]
/// runs out, or it has no node row at all) or an attempt outlives its
/// lease, a sweep on any node may claim it. Every attempt has a number,
/// and only the latest may settle the row, so a late report from a node
/// that lost the row changes nothing.
#[async_trait]
pub trait LedgerStore: Send + Sync {
    /// The transactional outbox: appends the final answer `message` to
    /// `session_id` (adding `usage`, as
    /// [`crate::SessionStore::append_message_with_usage`] does) and records
    /// `obligation` for it, in one transaction. Either both are stored or
    /// neither, so a reply in the transcript is always a reply owed.
    /// Returns the message's row id.
    async fn append_reply(
        &self,
        session_id: &str,
        message: &talaria_core::Message,
        usage: &talaria_core::Usage,
        obligation: NewObligation,
    ) -> Result<i64>;
    /// [`LedgerStore::append_reply`] with the model calls that led to the
    /// answer: their counters, cost and ledger rows go in the same
    /// transaction (as [`crate::SessionStore::append_message_with_calls`]).
    /// The default stores only their usage.
    async fn append_reply_with_calls(
        &self,
        session_id: &str,
        message: &talaria_core::Message,
        calls: &[crate::ModelCall],
        obligation: NewObligation,
    ) -> Result<i64> {
        let usage = crate::ModelCall::total_usage(calls);
        self.append_reply(session_id, message, &usage, obligation)
            .await
    }
    /// Records an obligation as `pending`, owned by `owner`, created now,
    /// and settles the owed turns it names, in one transaction.
    /// Recording an id again starts the row over (pending, new owner,
    /// no error, no part sent) but keeps its attempt count, so fences
    /// stay unique.
    async fn record_obligation(&self, obligation: NewObligation) -> Result<()>;
    /// The owner starts sending its pending row: `attempting`, one more
    /// attempt, leased for `lease` seconds. Returns the attempt number, or
    /// `None` (changing nothing) when the row is not `owner`'s pending row.
    async fn begin_attempt(&self, id: &str, owner: &NodeId, lease: f64) -> Result<Option<u32>>;
    /// Marks attempt `attempt` delivered. `false`, changing nothing, when
    /// that is not the row's current attempt or it is not `attempting`.
    async fn mark_delivered(&self, id: &str, attempt: u32) -> Result<bool>;
    /// Marks attempt `attempt` failed (a sweep may try again), keeping the
    /// error (at most 500 chars). Fenced like [`LedgerStore::mark_delivered`].
    async fn mark_failed(&self, id: &str, attempt: u32, error: &str) -> Result<bool>;
    /// Records that attempt `attempt` has had the first `parts_sent` parts
    /// of the reply confirmed by the platform, so a later attempt (after a
    /// crash, or a sweep's claim) resumes after them. Fenced like
    /// [`LedgerStore::mark_delivered`]: `false`, changing nothing, when
    /// that is not the row's current attempt or it is not `attempting`.
    /// Never lowers the count (a smaller number than stored leaves it,
    /// and still returns `true`), nor changes the row's state or times.
    async fn mark_parts_sent(&self, id: &str, attempt: u32, parts_sent: u32) -> Result<bool>;
    /// Gives up on a row, saying why: with `Some(attempt)`, fenced like
    /// [`LedgerStore::mark_delivered`] (a send the platform refused); with
    /// `None`, whatever open state it is in (an operator's decision).
    async fn abandon_obligation(
        &self,
        id: &str,
        attempt: Option<u32>,
        reason: &str,
    ) -> Result<bool>;
    /// The row `id`, if it exists.
    async fn obligation(&self, id: &str) -> Result<Option<Obligation>>;
    /// Open rows, oldest first, at most `limit` (0: all).
    async fn open_obligations(&self, limit: usize) -> Result<Vec<Obligation>>;
    /// Claims what `claim.claimer` should send now, in one atomic step per
    /// row, oldest first. An open row is claimable when its attempt
    /// outlived its lease, when it is the claimer's own `failed` row, or
    /// when another node owns it and that node is missing or dead (never
    /// the claimer's own pending row: the claimer is about to send it).
    /// A `failed` row waits [`OwedClaim::retry_failed_after`] first. Claimable rows over budget are
    /// abandoned, whatever their platform; the others of the claimer's
    /// platforms are claimed: `attempting`, owned by the claimer, one more
    /// attempt, leased. Two nodes sweeping together never claim one row
    /// twice, and neither waits for the other.
    async fn claim_owed(&self, claim: &OwedClaim) -> Result<OwedBatch>;
    /// Deletes delivered and abandoned rows last updated before `cutoff`;
    /// returns how many.
    async fn prune_obligations(&self, cutoff: Timestamp) -> Result<u64>;
    /// How many rows are in each state.
    async fn obligation_counts(&self) -> Result<BTreeMap<ObligationState, u64>>;
}

/// The states [`ObligationState::is_open`] accepts, as an SQL list (a test
/// keeps the two in step).
pub(crate) const OPEN_STATES_SQL: &str = "('pending', 'attempting', 'failed')";

/// Longest error text kept on an obligation, in chars.
pub(crate) const MAX_ERROR_CHARS: usize = 500;

/// Why [`LedgerStore::claim_owed`] gave a row up.
pub(crate) const GAVE_UP_ATTEMPTS: &str = "gave up after the maximum number of attempts";
pub(crate) const GAVE_UP_AGE: &str = "too old to send (older than the ledger's cutoff)";

/// At most `max` chars of `s`, cut on a char boundary.
pub(crate) fn truncate_chars(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((end, _)) => &s[..end],
        None => s,
    }
}

/// `len_bytes` random bytes as hex: a pairing code's salt. The generator
/// lives only inside this call, so no future holds it across an await.
pub(crate) fn random_hex(len_bytes: usize) -> String {
    let mut bytes = vec![0u8; len_bytes];
    rand::rng().fill(bytes.as_mut_slice());
    to_hex(&bytes)
}

/// How a pairing code is stored: hex sha256 of the salt (as its hex text)
/// followed by the code. Both backends hash alike, so a database copied
/// from one to the other keeps working codes.
pub(crate) fn code_hash(salt_hex: &str, code: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(salt_hex.as_bytes());
    hasher.update(code.as_bytes());
    to_hex(&hasher.finalize())
}

/// The pairing rules, passed in so the store applies them atomically.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairingLimits {
    /// Seconds a code stays valid.
    pub code_ttl: f64,
    /// Codes pending at once per platform (a user holds at most one). A
    /// new offer on a full platform drops the oldest code; 0 refuses
    /// every offer.
    pub max_pending: usize,
    /// Seconds between two offers to the same user.
    pub offer_interval: f64,
    /// Failed approvals that lock a platform.
    pub max_failures: u32,
    /// Seconds a lock lasts.
    pub lockout: f64,
}

/// How many times [`PairingLimits::max_failures`] a platform's failed
/// approvals may reach, counting those during its lock, before the lock
/// refuses even a correct code (see [`PairingLimits::guess_budget`]).
pub const LOCKED_GUESS_FACTOR: u32 = 20;

impl PairingLimits {
    /// Failed approvals after which a locked platform compares no code at
    /// all until its lock ends: `max_failures` × [`LOCKED_GUESS_FACTOR`]
    /// (100 by default).
    ///
    /// Why a lock still compares codes below this: the lock is there to
    /// stop guessing, and a correct code is no guess, so the operator
    /// approving a genuinely pending user is not refused because someone
    /// (or a typo) spent the failures first. What bounds guessing is this
    /// budget: a guess hits one of at most `max_pending` codes of 32^8
    /// (3 / 2^40 ≈ 2.7e-12 by default), so 100 guesses per lock (an hour)
    /// leave a chance of about 3e-10 an hour. Only an active guesser who
    /// spends the whole budget gets a correct code refused, until the lock
    /// ends.
    pub fn guess_budget(&self) -> u32 {
        self.max_failures.max(1).saturating_mul(LOCKED_GUESS_FACTOR)
    }
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
    /// The platform takes no codes at all (`max_pending` is 0; a full
    /// platform drops its oldest code instead). The user's offer time is
    /// stamped, so this is reported at most once per interval.
    TooManyPending,
    /// The platform's approvals are locked after failed attempts. Stamped
    /// like [`OfferOutcome::TooManyPending`].
    LockedOut,
}

/// A user who may talk to the bot because an operator approved their code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovedUser {
    /// The platform they talk on.
    pub platform: String,
    /// Their id there.
    pub user_id: String,
    /// Their display name when they asked, for people.
    pub user_name: Option<String>,
    /// When the code was approved.
    pub approved_at: Timestamp,
}

/// An approved user who has not been told yet, and the chat where they
/// asked for their code: the gateway says so there (see
/// [`PairingStore::pairing_take_notices`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalNotice {
    /// The platform they talk on.
    pub platform: String,
    /// Their id there.
    pub user_id: String,
    /// Their display name when they asked.
    pub user_name: Option<String>,
    /// The chat they asked in, where they are told.
    pub chat_id: String,
}

/// A code waiting for approval (the code itself is never stored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingPairing {
    /// The platform the code was asked for on.
    pub platform: String,
    /// The asker's id there.
    pub user_id: String,
    /// Their display name, for people deciding.
    pub user_name: Option<String>,
    /// When the code was issued; it expires [`PairingLimits::code_ttl`] later.
    pub created_at: Timestamp,
}

/// What happened to an approval attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum ApproveOutcome {
    /// The code matched: the user as now approved.
    Approved(ApprovedUser),
    /// No pending code matched; `failures` counts toward the lock.
    NoMatch {
        /// Failed attempts so far in the current window.
        failures: u32,
    },
    /// The platform is locked until the given time after too many wrong
    /// codes: this code matched nothing (or, once the lock's guess budget
    /// is spent, was not compared at all).
    LockedOut {
        /// When approvals open again.
        until: Timestamp,
    },
}

/// Everything pairing holds, for `talaria pairing list`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PairingSnapshot {
    /// Codes waiting for approval.
    pub pending: Vec<PendingPairing>,
    /// Users approved.
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
/// [`PairingLimits::max_pending`] slots.
///
/// Nor can a few users: a new offer on a full platform drops the oldest
/// pending code to make room, so a newcomer always gets a code and nobody
/// can lock strangers out by holding every slot for an hour. Whoever's
/// code was dropped can ask again once their offer interval has passed;
/// pushing a particular code out takes `max_pending` newer offers, each
/// from a user of its own who may ask once per interval. (The ancestor
/// refused newcomers while the slots were full instead.)
///
/// A platform locked after [`PairingLimits::max_failures`] wrong codes
/// refuses new offers and wrong codes, but still approves a correct one
/// until its [`PairingLimits::guess_budget`] is spent: the lock is there
/// to stop guessing, and a correct code is no guess. (The ancestor refused
/// every code during a lock.)
#[async_trait]
pub trait PairingStore: Send + Sync {
    /// In one transaction: drops expired codes; answers
    /// [`OfferOutcome::RateLimited`] when the user was offered (or refused)
    /// within the interval, checked first so a user is answered at most
    /// once per interval whatever else holds; refuses (stamping the user's
    /// offer time) when the platform is locked, or with
    /// [`OfferOutcome::TooManyPending`] when `max_pending` is 0; otherwise
    /// drops the user's own pending code and, while the platform still
    /// holds `max_pending` codes, its oldest (by creation, then entry id),
    /// stores a fresh salt and the salted hash of `code` (never `code`
    /// itself) with the chat it was shown in (`chat_id`, where the user is
    /// told of their approval) and stamps the user's offer time. `code` is
    /// normalised with [`normalize_pairing_code`].
    async fn pairing_offer(
        &self,
        platform: &str,
        user_id: &str,
        user_name: Option<&str>,
        chat_id: &str,
        code: &str,
        limits: PairingLimits,
    ) -> Result<OfferOutcome>;
    /// Approves the user whose pending code matches `code` (normalised with
    /// [`normalize_pairing_code`], then compared in constant time against
    /// every unexpired code of the platform); a miss counts a failure and
    /// the failure that reaches `max_failures` locks the platform
    /// ([`ApproveOutcome::LockedOut`]). During a lock a match still
    /// approves and a miss still counts, answered `LockedOut`; once the
    /// count reaches [`PairingLimits::guess_budget`] nothing is compared
    /// until the lock ends. The count is reset by a success outside a lock
    /// and by the end of a lock. An approval owes the user a notice in the
    /// chat their code was shown in ([`Self::pairing_take_notices`]).
    async fn pairing_approve(
        &self,
        platform: &str,
        code: &str,
        limits: PairingLimits,
    ) -> Result<ApproveOutcome>;
    /// Whether `user_id` on `platform` was approved.
    async fn pairing_is_approved(&self, platform: &str, user_id: &str) -> Result<bool>;
    /// Takes up to `limit` approvals on `platforms` whose user has not been
    /// told yet, oldest first. A notice is handed out once: of callers
    /// racing on any number of nodes, one gets it, and no later call
    /// returns it again. Approvals whose code was offered by a release
    /// that did not record the chat owe no notice.
    async fn pairing_take_notices(
        &self,
        platforms: &[String],
        limit: usize,
    ) -> Result<Vec<ApprovalNotice>>;
    /// Records `user_id` on `platform` as approved at `approved_at`
    /// without a code (an approval brought over from another agent by
    /// `talaria import`); returns false, changing nothing, when they are
    /// approved already. No notice is owed: they were told when they were
    /// approved there.
    async fn pairing_grant(
        &self,
        platform: &str,
        user_id: &str,
        user_name: Option<&str>,
        approved_at: Timestamp,
    ) -> Result<bool>;
    /// Removes an approval; returns whether there was one.
    async fn pairing_revoke(&self, platform: &str, user_id: &str) -> Result<bool>;
    /// Drops `user_id`'s pending code on `platform` (an operator turning
    /// the request down); returns whether there was one. The user may ask
    /// again once their offer interval has passed.
    async fn pairing_deny(&self, platform: &str, user_id: &str) -> Result<bool>;
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
    /// Forgets (`platform`, `name`); returns whether it was there.
    async fn delete_cursor(&self, platform: &str, name: &str) -> Result<bool>;
    /// Saves `value` under (`platform`, `to`) and forgets (`platform`,
    /// `from`) in one transaction: an entry that moves on with every
    /// request (the API server's transcript index) costs one write, not
    /// two.
    async fn move_cursor(&self, platform: &str, from: &str, to: &str, value: &str) -> Result<()> {
        self.set_cursor(platform, to, value).await?;
        if from != to {
            self.delete_cursor(platform, from).await?;
        }
        Ok(())
    }
}

/// Everything the gateway needs from one backend.
pub trait GatewayStore:
    SessionStore
    + RouteStore
    + LedgerStore
    + PairingStore
    + InboundStore
    + crate::OwedTurnStore
    + CursorStore
    + crate::CronStore
    + crate::ClusterStore
{
}

impl<
    T: SessionStore
        + RouteStore
        + LedgerStore
        + PairingStore
        + InboundStore
        + crate::OwedTurnStore
        + CursorStore
        + crate::CronStore
        + crate::ClusterStore,
> GatewayStore for T
{
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [ObligationState; 5] = [
        ObligationState::Pending,
        ObligationState::Attempting,
        ObligationState::Delivered,
        ObligationState::Failed,
        ObligationState::Abandoned,
    ];

    #[test]
    fn every_state_parses_back() {
        for s in ALL {
            assert_eq!(ObligationState::parse(s.as_str()), Some(s));
        }
        assert_eq!(ObligationState::parse("lost"), None);
    }

    #[test]
    fn the_open_states_list_is_what_is_open_means() {
        for s in ALL {
            let listed = OPEN_STATES_SQL.contains(&format!("'{}'", s.as_str()));
            assert_eq!(listed, s.is_open(), "{s:?}");
        }
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate_chars("héllo", 2), "hé");
        assert_eq!(truncate_chars("abc", 10), "abc");
        let long = "é".repeat(600);
        assert_eq!(truncate_chars(&long, 500).chars().count(), 500);
    }

    #[test]
    fn hash_is_sha256_of_salt_text_then_code() {
        // sha256("00ABC") computed independently.
        let expected = to_hex(&Sha256::digest(b"00ABC"));
        assert_eq!(code_hash("00", "ABC"), expected);
        assert_eq!(code_hash("00", "ABC").len(), 64);
        assert_eq!(random_hex(16).len(), 32);
        assert_eq!(to_hex(&[0x00, 0xab, 0x0f]), "00ab0f");
    }
}
