//! Talaria's persistence: sessions and their transcripts.
//!
//! # Layout
//!
//! - this file: the backend-neutral types and the [`SessionStore`] trait.
//! - [`gateway`]: what the gateway keeps (routes, the delivery ledger,
//!   pairing), as traits the backends implement.
//! - [`owed`]: messages accepted and not yet answered (owed turns).
//! - [`cluster`]: the nodes of a deployment and the leases they hold.
//! - [`cron`]: scheduled jobs and the claimed record of their runs.
//! - [`copy`]: copying everything a store holds into another backend.
//! - [`hermes`]: reading the session database of hermes-agent, the
//!   Python ancestor, for `talaria import hermes`.
//! - [`snapshot`]: a consistent copy of a live SQLite file (SQLite's
//!   online backup API), for `talaria backup`.
//! - [`sqlite`]: the embedded backend (bundled SQLite, WAL, FTS5).
//! - [`postgres`]: the shared backend for several nodes (PostgreSQL, a
//!   connection pool, `tsvector` search, `SKIP LOCKED` claims).
//! - [`fts`]: turning user text into a safe FTS5 query.
//! - [`shared`]: the memory files and skills every node of a multi-node
//!   deployment shares (PostgreSQL only).
//! - [`upkeep`]: sessions a page at a time with their last activity,
//!   deleting idle ones, and counts of what is stored.
//! - `media`: the `messages.media` column (attachments by reference).
//!
//! # Invariant
//!
//! No SQL and no rusqlite type leaves this crate: callers see only the types
//! below, so a Postgres backend can sit behind the same trait.
#![forbid(unsafe_code)]

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use talaria_core::Message;

pub mod cluster;
pub mod copy;
pub mod cron;
pub mod fts;
pub mod gateway;
pub mod hermes;
mod media;
pub mod owed;
pub mod postgres;
pub mod shared;
pub mod snapshot;
pub mod spend;
pub mod sqlite;
mod thinking;
pub mod upkeep;

pub use gateway::{
    ApprovalNotice, ApproveOutcome, ApprovedUser, ClaimedObligation, CursorStore, GatewayStore,
    InboundStore, LedgerStore, NewObligation, Obligation, ObligationState, OfferOutcome, OwedBatch,
    OwedClaim, OwedCursor, PairingLimits, PairingSnapshot, PairingStore, PendingPairing, Route,
    RouteStore,
};

pub use owed::{NewOwedTurn, OwedTurn, OwedTurnStore};

pub use cluster::{ClusterStore, LeaseGrant, LeaseRecord, NodeAnnouncement, NodeId, NodeRecord};

pub use copy::{CopyError, CopyOptions, CopyReport, StoreCopy, copy_store};

pub use cron::{
    Advance, CronJob, CronStore, JobOrigin, JobState, Misfire, NewCronJob, Occurrence,
    OccurrenceClaim, OccurrenceEnd, OccurrenceStatus, Trigger,
};
pub use postgres::{PostgresOptions, PostgresStore};
pub use shared::{
    Expect, SharedConflict, SharedFile, SharedFileInfo, SharedFileStore, SharedWrite,
};
pub use spend::{ModelCall, SpendScope, UsageGroup, UsageReport, UsageTotals};
pub use sqlite::{SqliteOptions, SqliteStore};
pub use upkeep::{IdleDeletion, SessionActivity, SessionPage, SourceStats, StoreSize, StoreStats};

/// Most matching messages one search ranks (the newest).
pub const MAX_RANKED_MATCHES: usize = 2000;

/// Errors from a store backend.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database stayed busy or locked through every retry.
    #[error("the database is busy (another process holds a lock); try again")]
    Busy,
    /// The named session is not in the store.
    #[error("session `{0}` does not exist")]
    NoSuchSession(String),
    /// An id that could escape a directory or is otherwise malformed.
    #[error("invalid id: {0}")]
    InvalidId(#[from] talaria_core::ids::IdError),
    /// The file is not a database we can use (corrupt, newer schema, ...).
    #[error("database error: {0}")]
    Database(String),
    /// A unique name or id is already taken.
    #[error("{0}")]
    Conflict(String),
    /// The file system refused (missing directory, permissions, ...).
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The caller asked for something no backend could do (an empty write,
    /// a path outside what the store holds).
    #[error("{0}")]
    Invalid(String),
}

/// The result of a store operation.
pub type Result<T> = std::result::Result<T, StoreError>;

/// Seconds since the Unix epoch, with sub-second precision.
pub type Timestamp = f64;

/// What a new session is created with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NewSession {
    /// `YYYYMMDD_HHMMSS_<hex>`; must be a valid path component.
    pub id: String,
    /// Where the session came from: `cli`, `telegram`, `api`, `cron`, ...
    pub source: String,
    /// The gateway's routing key, when there is one.
    pub session_key: Option<String>,
    /// The platform's chat the session talks in (gateway sessions).
    pub chat_id: Option<String>,
    /// The platform's id of the person talking.
    pub user_id: Option<String>,
    /// The thread or topic within the chat, when there is one.
    pub thread_id: Option<String>,
    /// The model the session started with, for listings.
    pub model: Option<String>,
    /// The system prompt, stored so later turns replay it byte-identical.
    pub system_prompt: Option<String>,
    /// The session this one continues (compression rotation, /resume).
    pub parent_session_id: Option<String>,
}

/// A stored session. `Default` is an empty record, for building one in
/// tests and fakes.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SessionRecord {
    /// `YYYYMMDD_HHMMSS_<hex>`: the session's id, and its files' names.
    pub id: String,
    /// Where the session came from: `cli`, `telegram`, `api`, `cron`, ...
    pub source: String,
    /// The gateway's routing key, when there is one.
    pub session_key: Option<String>,
    /// The platform's chat the session talks in.
    pub chat_id: Option<String>,
    /// The platform's id of the person talking.
    pub user_id: Option<String>,
    /// The thread or topic within the chat.
    pub thread_id: Option<String>,
    /// A short title: set from the first message, or by `/title`.
    pub title: Option<String>,
    /// The model the session started with.
    pub model: Option<String>,
    /// The model `/model` chose for this session (`name` or
    /// `provider:name`); `None` follows the configured default.
    pub model_choice: Option<String>,
    /// The system prompt every turn replays unchanged.
    pub system_prompt: Option<String>,
    /// The session this one continues (compression rotation, /resume).
    pub parent_session_id: Option<String>,
    /// When the session was created.
    pub started_at: Timestamp,
    /// When it was ended (`/new`, expiry), if it was.
    pub ended_at: Option<Timestamp>,
    /// Why it ended (`new`, `expired`, ...).
    pub end_reason: Option<String>,
    /// Every row ever stored for the session, replaced ones included: it
    /// changes with every append, so it tells whether a session moved on.
    /// People are shown [`SessionStore::active_message_counts`].
    pub message_count: u64,
    /// Prompt tokens processed afresh, summed over the session's requests.
    pub input_tokens: u64,
    /// Tokens generated, summed.
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's cache, summed.
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's cache, summed.
    pub cache_write_tokens: u64,
    /// Generated tokens spent on reasoning, summed.
    pub reasoning_tokens: u64,
}

/// A stored transcript row.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredMessage {
    /// Autoincrement id; orders the transcript.
    pub id: i64,
    /// The session the row belongs to.
    pub session_id: String,
    /// The row itself, as the agent wrote it.
    pub message: Message,
    /// When it was stored.
    pub timestamp: Timestamp,
    /// The provider's token count for the row, when it reported one.
    pub token_count: Option<u64>,
    /// False once compression replaced the row; inactive rows stay searchable.
    pub active: bool,
}

/// A session made by another agent, brought in whole (`talaria import`):
/// its own id, times, counters and transcript, so it lists, searches and
/// continues like one Talaria recorded.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ImportedSession {
    /// The session row. `message_count` and `model_choice` are ignored:
    /// the count is of the rows below, and no `/model` choice came with it.
    pub record: SessionRecord,
    /// The transcript in order.
    pub messages: Vec<ImportedMessage>,
}

/// One transcript row of an [`ImportedSession`].
#[derive(Debug, Clone, PartialEq)]
pub struct ImportedMessage {
    /// The row.
    pub message: Message,
    /// When it was written, as the other agent recorded it.
    pub timestamp: Timestamp,
    /// False for a row the other agent's compression replaced: kept and
    /// searchable, not replayed.
    pub active: bool,
}

/// Filter for listing sessions, newest first.
#[derive(Debug, Clone, Default)]
pub struct SessionFilter {
    /// Only sessions from this source.
    pub source: Option<String>,
    /// Only sessions with this routing key.
    pub session_key: Option<String>,
    /// Most sessions to return; 0 means no limit.
    pub limit: usize,
    /// Sessions to skip first, for paging.
    pub offset: usize,
}

/// A full-text search over stored messages.
#[derive(Debug, Clone)]
pub struct SearchQuery {
    /// Raw user or model text; the backend sanitises it.
    pub text: String,
    /// Limit to sessions from these sources (empty = all).
    pub sources: Vec<String>,
    /// Leave this session out (the one asking).
    pub exclude_session: Option<String>,
    /// Most sessions to return; each session yields at most one hit. The
    /// SQLite backend reads 0 as its default (10).
    pub limit: usize,
}

/// One matching session with the best hit in it.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchHit {
    /// The session, as [`SessionStore::session`] returns it.
    pub session: SessionRecord,
    /// The id of the best-matching message.
    pub message_id: i64,
    /// Who wrote the best-matching message.
    pub role: talaria_core::Role,
    /// A short excerpt around the match.
    pub snippet: String,
    /// Backend relevance; lower is better (bm25).
    pub rank: f64,
}

/// Persistence for sessions and transcripts.
///
/// Implementations must be safe to share between tasks; every method is a
/// short transaction.
#[async_trait]
pub trait SessionStore: Send + Sync {
    /// Records a new session, started now. Fails with
    /// [`StoreError::InvalidId`] if the id is not a safe path component.
    async fn create_session(&self, session: NewSession) -> Result<()>;
    /// The session with this id, if there is one.
    async fn session(&self, id: &str) -> Result<Option<SessionRecord>>;
    /// Sets (or replaces) the session's title.
    async fn set_title(&self, id: &str, title: &str) -> Result<()>;
    /// Sets the session's title unless it has one, returning whether it
    /// did: an automatic title never overwrites one a person chose. The
    /// default reads, then writes; backends do both in one statement.
    async fn set_title_if_unset(&self, id: &str, title: &str) -> Result<bool> {
        match self.session(id).await? {
            Some(record) if record.title.is_none() => {
                self.set_title(id, title).await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
    /// Replaces the stored system prompt.
    async fn set_system_prompt(&self, id: &str, prompt: &str) -> Result<()>;
    /// Sets the model a session uses instead of the configured default
    /// (`/model`, as [`SessionRecord::model_choice`] spells it); `None`
    /// returns it to the default.
    async fn set_model_choice(&self, id: &str, choice: Option<&str>) -> Result<()>;
    /// Marks the session ended now, for `reason`.
    async fn end_session(&self, id: &str, reason: &str) -> Result<()>;
    /// Appends one row and returns its id.
    async fn append_message(&self, session_id: &str, message: &Message) -> Result<i64>;
    /// Adds one request's token usage to the session's counters.
    async fn add_usage(&self, session_id: &str, usage: &talaria_core::Usage) -> Result<()>;
    /// Appends one row and adds `usage` (what the model calls that led to
    /// it cost) to the session's counters, as one write where the backend
    /// can: a turn then costs one write per row instead of two per answer.
    /// The default runs [`SessionStore::append_message`] and then
    /// [`SessionStore::add_usage`] (skipped for zero usage).
    async fn append_message_with_usage(
        &self,
        session_id: &str,
        message: &Message,
        usage: &talaria_core::Usage,
    ) -> Result<i64> {
        let row = self.append_message(session_id, message).await?;
        if *usage != talaria_core::Usage::default() {
            self.add_usage(session_id, usage).await?;
        }
        Ok(row)
    }
    /// Stores model calls: their usage goes to the session's counters,
    /// their cost to its total, and each becomes a row of the per-call
    /// ledger, in one transaction. The default (stores without a ledger)
    /// only adds the usage.
    async fn add_calls(&self, session_id: &str, calls: &[ModelCall]) -> Result<()> {
        let usage = ModelCall::total_usage(calls);
        if usage != talaria_core::Usage::default() {
            self.add_usage(session_id, &usage).await?;
        }
        Ok(())
    }
    /// [`SessionStore::append_message_with_usage`] for model calls: the
    /// row, the counters, the cost and the ledger rows in one
    /// transaction. The default only adds the usage.
    async fn append_message_with_calls(
        &self,
        session_id: &str,
        message: &Message,
        calls: &[ModelCall],
    ) -> Result<i64> {
        self.append_message_with_usage(session_id, message, &ModelCall::total_usage(calls))
            .await
    }
    /// What the session's model calls cost so far, in micro-dollars (0 for
    /// an unknown session, or a store without a ledger).
    async fn session_cost_micros(&self, _session_id: &str) -> Result<u64> {
        Ok(0)
    }
    /// What the calls in `scope` made at or after `since` cost, in
    /// micro-dollars: a sum over an index, for budgets.
    async fn spend_since(&self, _since: Timestamp, _scope: &SpendScope) -> Result<u64> {
        Ok(0)
    }
    /// Usage and cost since `since`, in total and by day, model, platform
    /// and chat (at most `top` groups of each but days).
    async fn usage_report(&self, _since: Timestamp, _top: usize) -> Result<UsageReport> {
        Ok(UsageReport::default())
    }
    /// The active transcript in order.
    async fn messages(&self, session_id: &str) -> Result<Vec<StoredMessage>>;
    /// One page of the active transcript: at most `limit` rows with ids
    /// above `after_id`, in order (0 starts at the beginning). Fails with
    /// [`StoreError::NoSuchSession`] for an unknown session. The default
    /// reads the whole transcript; backends read only the page.
    async fn messages_page(
        &self,
        session_id: &str,
        after_id: i64,
        limit: usize,
    ) -> Result<Vec<StoredMessage>> {
        Ok(self
            .messages(session_id)
            .await?
            .into_iter()
            .filter(|m| m.id > after_id)
            .take(limit)
            .collect())
    }
    /// Deletes the session and what belongs to it, in one transaction: its
    /// transcript (active or not, so it leaves search too) and the gateway
    /// routes pointing at it (the chat's next message starts a new
    /// session). The per-call spend ledger is kept: budgets count what was
    /// spent, whatever was deleted since. Returns whether the session
    /// existed. The default refuses: a store must say how it deletes.
    async fn delete_session(&self, id: &str) -> Result<bool> {
        Err(StoreError::Database(format!(
            "this store cannot delete sessions (asked to delete `{id}`)"
        )))
    }
    /// Deletes the session as [`SessionStore::delete_session`] does, but
    /// only if, when the deletion happens, its last activity (see
    /// [`upkeep`]) is still before `idle_before` and no gateway owes it a
    /// turn: a message accepted and not answered yet for a chat routed to
    /// it, or a live turn lease of such a chat. The check and the deletion
    /// are one transaction, so a turn that starts meanwhile keeps its
    /// session. The default refuses, as `delete_session` does.
    async fn delete_session_if_idle(
        &self,
        id: &str,
        _idle_before: Timestamp,
    ) -> Result<IdleDeletion> {
        Err(StoreError::Database(format!(
            "this store cannot delete sessions (asked to delete `{id}`)"
        )))
    }
    /// One page of sessions in id order, each with its last activity:
    /// every session can be read this way without holding them all. The
    /// default refuses: a store must say how it pages.
    async fn session_page(&self, _page: SessionPage) -> Result<Vec<SessionActivity>> {
        Err(StoreError::Database(
            "this store cannot page through its sessions".to_owned(),
        ))
    }
    /// Counts of sessions and rows by source, first start and last
    /// activity, and the room the store takes. The default refuses.
    async fn session_stats(&self) -> Result<StoreStats> {
        Err(StoreError::Database(
            "this store cannot count its sessions".to_owned(),
        ))
    }
    /// Stores `session` with its transcript in one transaction, keeping
    /// its id, times and counters. Writes nothing and returns false when a
    /// session with that id exists already: importing twice adds nothing,
    /// and a session is never half there. The default refuses: a store
    /// must say how it imports.
    async fn import_session(&self, session: ImportedSession) -> Result<bool> {
        Err(StoreError::Database(format!(
            "this store cannot import sessions (asked to import `{}`)",
            session.record.id
        )))
    }
    /// Messages `[from_id - before, from_id + after]` of one session, by
    /// position, active or not; for showing a search hit in context.
    async fn message_window(
        &self,
        session_id: &str,
        around_id: i64,
        before: usize,
        after: usize,
    ) -> Result<Vec<StoredMessage>>;
    /// Marks the active rows inactive and appends `replacement` as the new
    /// active transcript, atomically (context compression).
    async fn replace_active(&self, session_id: &str, replacement: &[Message]) -> Result<()>;
    /// Sessions matching `filter`, most recently started first.
    async fn list_sessions(&self, filter: SessionFilter) -> Result<Vec<SessionRecord>>;
    /// The session from one of `sources` that was answered last (whose
    /// newest active assistant row is the newest of them all), if any:
    /// where a person left off, skipping sessions started but never used
    /// and exchanges taken back with `/undo`.
    async fn last_answered_session(&self, sources: &[&str]) -> Result<Option<SessionRecord>>;
    /// Every source sessions were recorded from, with how many sessions
    /// each has, most first (for pointing out a mistyped source). The
    /// default lists every session.
    async fn session_sources(&self) -> Result<Vec<(String, u64)>> {
        let mut counts: std::collections::BTreeMap<String, u64> = Default::default();
        for s in self.list_sessions(SessionFilter::default()).await? {
            *counts.entry(s.source).or_default() += 1;
        }
        let mut sources: Vec<(String, u64)> = counts.into_iter().collect();
        sources.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Ok(sources)
    }
    /// How many active rows each session in `ids` holds, in order: the
    /// transcript as it stands, without rows that `/undo`, `/retry` or a
    /// compression replaced ([`SessionRecord::message_count`] counts every
    /// row ever stored). 0 for an unknown id. For lists shown to people,
    /// not for every turn: the default reads each transcript.
    async fn active_message_counts(&self, ids: &[String]) -> Result<Vec<u64>> {
        let mut counts = Vec::with_capacity(ids.len());
        for id in ids {
            counts.push(self.messages(id).await?.len() as u64);
        }
        Ok(counts)
    }
    /// Full-text search: at most one hit per session, best first. Only the
    /// newest [`MAX_RANKED_MATCHES`] matching messages are ranked, so a
    /// query for very common words costs the same however long the
    /// history grows. When more messages than that match, a backend whose
    /// relevance score needs counts over every match (SQLite's bm25)
    /// answers by recency instead: the sessions of the newest matches,
    /// newest first, each with its newest match.
    async fn search(&self, query: SearchQuery) -> Result<Vec<SearchHit>>;
    /// The home files this backend shares between nodes (the memory files
    /// and skills), when it is one several nodes use at once; `None` (the
    /// default) when the home's files are the only copy.
    fn shared_files(&self) -> Option<&dyn SharedFileStore> {
        None
    }
}
