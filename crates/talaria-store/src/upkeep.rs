//! Looking after what is stored: reading every session a page at a time
//! (`talaria sessions export`), deleting the ones nobody has used for a
//! while (`talaria sessions prune`) and counting what there is
//! (`talaria sessions stats`).
//!
//! A session's *last activity* is the newest of its start, its end and
//! its newest transcript row (replaced rows included: `/undo` is use too).

use crate::{SessionRecord, Timestamp};

/// A session with when it was last used.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionActivity {
    /// The session, as [`crate::SessionStore::session`] returns it.
    pub session: SessionRecord,
    /// Its last activity (see the module documentation).
    pub last_active: Timestamp,
    /// Whether a gateway owes it a turn now, which keeps it from
    /// [`crate::SessionStore::delete_session_if_idle`].
    pub turn_owed: bool,
}

/// Which sessions one call of [`crate::SessionStore::session_page`]
/// returns. Pages follow the session ids, so sessions created or deleted
/// while a caller pages through neither shift nor repeat the others.
#[derive(Debug, Clone, Default)]
pub struct SessionPage {
    /// Only sessions from this source.
    pub source: Option<String>,
    /// Only sessions whose last activity is before this.
    pub idle_before: Option<Timestamp>,
    /// Only ids after this one: the last id of the previous page.
    pub after_id: Option<String>,
    /// Most sessions to return; 0 is read as 1.
    pub limit: usize,
}

/// What [`crate::SessionStore::delete_session_if_idle`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum IdleDeletion {
    /// The session and its transcript are gone.
    Deleted,
    /// There was no such session (deleted meanwhile).
    Missing,
    /// Kept: it was used at this time, not before the cutoff.
    ActiveSince(Timestamp),
    /// Kept: a gateway has accepted a message whose turn runs in it and
    /// has not answered yet, or holds its turn lease.
    TurnRunning,
}

/// What [`crate::SessionStore::session_stats`] counts for one source.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SourceStats {
    /// Where the sessions came from: `cli`, `telegram`, ...
    pub source: String,
    /// How many sessions.
    pub sessions: u64,
    /// Rows of their transcripts as they stand (what listings count).
    pub messages: u64,
    /// Every row stored, replaced ones included (what the file holds).
    pub rows: u64,
    /// When the first of them started.
    pub first_started: Option<Timestamp>,
    /// The newest last activity among them.
    pub last_active: Option<Timestamp>,
}

/// How much room the store takes.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreSize {
    /// What was measured, for people: the database file, or the schema.
    pub what: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// SQLite's write-ahead log beside the file, when there is one.
    pub log_bytes: Option<u64>,
}

/// What [`crate::SessionStore::session_stats`] returns.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StoreStats {
    /// One entry per source, most sessions first.
    pub sources: Vec<SourceStats>,
    /// The room the store takes, when the backend can say.
    pub size: Option<StoreSize>,
}

impl StoreStats {
    /// Every source together.
    pub fn total(&self) -> SourceStats {
        let mut total = SourceStats {
            source: "total".to_owned(),
            ..SourceStats::default()
        };
        for s in &self.sources {
            total.sessions += s.sessions;
            total.messages += s.messages;
            total.rows += s.rows;
            total.first_started = min_opt(total.first_started, s.first_started);
            total.last_active = max_opt(total.last_active, s.last_active);
        }
        total
    }
}

/// The earlier of two optional times.
pub(crate) fn min_opt(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The later of two optional times.
pub(crate) fn max_opt(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// The stats of every source, most sessions first, from per-source
/// session figures and per-source row figures as the backends query them.
pub(crate) fn merge_sources(
    sessions: Vec<(String, u64, Option<Timestamp>, Option<Timestamp>)>,
    rows: Vec<(String, u64, u64, Option<Timestamp>)>,
) -> Vec<SourceStats> {
    let mut sources: Vec<SourceStats> = sessions
        .into_iter()
        .map(|(source, n, first, last)| SourceStats {
            source,
            sessions: n,
            first_started: first,
            last_active: last,
            ..SourceStats::default()
        })
        .collect();
    for (source, all, active, newest) in rows {
        if let Some(s) = sources.iter_mut().find(|s| s.source == source) {
            s.rows = all;
            s.messages = active;
            s.last_active = max_opt(s.last_active, newest);
        }
    }
    sources.sort_by(|a, b| {
        b.sessions
            .cmp(&a.sessions)
            .then_with(|| a.source.cmp(&b.source))
    });
    sources
}
