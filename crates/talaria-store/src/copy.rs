//! Copying everything one store holds into another, whatever the two
//! backends: `talaria store migrate` moving a home's SQLite file into a
//! shared PostgreSQL database.
//!
//! # What is copied
//!
//! Every row of every table in [`Table::ALL`], column for column, with its
//! identity: sessions keep their ids, counters, titles and system
//! prompts; messages keep their ids (so their order), their active flag,
//! tool calls and reasoning; the ledger, pairing (codes as their salted
//! hashes), inbound ids, owed turns, cursors, cron jobs and occurrences keep every
//! column. What describes running processes (nodes, leases) or is derived
//! from the rows (full-text indexes) is not copied: [`LEFT_OUT`] lists it,
//! and a test checks that every table a backend holds is in one list or
//! the other.
//!
//! # How
//!
//! The source is read through a [`Dump`]: one consistent snapshot, in
//! pages in key order, each bounded in rows and bytes, so a database of
//! millions of messages is copied in constant memory. The target writes
//! each page through a [`Load`] in one transaction, keeping ids; after the
//! last page it moves its id sequence past the highest copied id and brings
//! its search index up to date. [`copy_store`] runs the whole thing, in an
//! order that respects the foreign keys (sessions before messages, jobs
//! before occurrences), and verifies at the end that every table holds as
//! many rows on both sides.
//!
//! # Safety
//!
//! A copy writes only into an empty target. It leaves a marker there (the
//! table [`MARKER_TABLE`]) naming its source, finished once the counts
//! were verified. A copy that stopped halfway (a lost connection, Ctrl-C)
//! can be run again: the target holds the marker of an unfinished copy of
//! the same source, so the copy resumes, writing every page again as an
//! upsert (rows already there are left alone when unchanged and brought up
//! to date when not), and the final verification tells whether the result
//! is whole. Anything else already in the target (any row, a finished
//! copy, a half copy of another source) is refused, with how to start
//! over. A copy also refuses while a gateway node holds a live lease on
//! either side: a running gateway would write behind its back.

use std::fmt;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::cluster::ClusterStore;
use crate::{Result, StoreError, Timestamp};

/// The table a copy leaves in its target, naming its source and whether it
/// finished. Not part of either backend's versioned schema: only a copy
/// creates, reads and writes it.
pub const MARKER_TABLE: &str = "talaria_copy";

/// What a column holds, as both backends can store it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `TEXT` / `text`.
    Text,
    /// `INTEGER` / `bigint` or `integer`.
    Int,
    /// `REAL` / `double precision` (times).
    Real,
    /// `INTEGER` 0 or 1 / `boolean`.
    Bool,
}

/// One copied column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// Its name in both backends.
    pub name: &'static str,
    /// What it holds.
    pub kind: Kind,
}

const fn text(name: &'static str) -> Column {
    Column {
        name,
        kind: Kind::Text,
    }
}

const fn int(name: &'static str) -> Column {
    Column {
        name,
        kind: Kind::Int,
    }
}

const fn real(name: &'static str) -> Column {
    Column {
        name,
        kind: Kind::Real,
    }
}

const fn boolean(name: &'static str) -> Column {
    Column {
        name,
        kind: Kind::Bool,
    }
}

const SESSIONS_COLUMNS: &[Column] = &[
    text("id"),
    text("source"),
    text("session_key"),
    text("chat_id"),
    text("user_id"),
    text("thread_id"),
    text("title"),
    text("model"),
    text("system_prompt"),
    text("parent_session_id"),
    real("started_at"),
    real("ended_at"),
    text("end_reason"),
    int("message_count"),
    int("input_tokens"),
    int("output_tokens"),
    int("cache_read_tokens"),
    int("cache_write_tokens"),
    int("reasoning_tokens"),
];

const MESSAGES_COLUMNS: &[Column] = &[
    int("id"),
    text("session_id"),
    text("role"),
    text("content"),
    text("tool_call_id"),
    text("tool_calls"),
    text("tool_name"),
    real("timestamp"),
    int("token_count"),
    text("finish_reason"),
    text("reasoning"),
    boolean("active"),
];

const ROUTES_COLUMNS: &[Column] = &[
    text("session_key"),
    text("session_id"),
    real("created_at"),
    real("updated_at"),
];

const LEDGER_COLUMNS: &[Column] = &[
    text("id"),
    text("session_key"),
    text("platform"),
    text("chat_id"),
    text("thread_id"),
    text("reply_to"),
    text("content"),
    text("state"),
    int("attempts"),
    real("created_at"),
    real("updated_at"),
    text("owner_node"),
    real("lease_until"),
    text("last_error"),
];

const PAIRING_PENDING_COLUMNS: &[Column] = &[
    text("entry_id"),
    text("platform"),
    text("user_id"),
    text("user_name"),
    text("salt"),
    text("code_hash"),
    real("created_at"),
    text("chat_id"),
];

const PAIRING_APPROVED_COLUMNS: &[Column] = &[
    text("platform"),
    text("user_id"),
    text("user_name"),
    real("approved_at"),
    text("notice_chat"),
];

const PAIRING_STAMPS_COLUMNS: &[Column] = &[
    text("platform"),
    text("kind"),
    text("subject"),
    real("stamp"),
    int("count"),
];

const INBOUND_SEEN_COLUMNS: &[Column] = &[text("platform"), text("inbound_id"), real("seen_at")];

const OWED_TURNS_COLUMNS: &[Column] = &[
    text("id"),
    text("session_key"),
    text("platform"),
    text("event"),
    text("owner_node"),
    real("accepted_at"),
    int("claims"),
];

const ADAPTER_CURSORS_COLUMNS: &[Column] = &[
    text("platform"),
    text("name"),
    text("value"),
    real("updated_at"),
];

const CRON_JOBS_COLUMNS: &[Column] = &[
    text("id"),
    text("name"),
    text("prompt"),
    text("skills"),
    text("schedule"),
    text("deliver"),
    text("origin"),
    int("repeat"),
    int("completed"),
    text("state"),
    text("misfire"),
    int("next_run_at"),
    real("created_at"),
    real("updated_at"),
    real("last_run_at"),
    text("last_status"),
    text("last_error"),
];

const CRON_OCCURRENCES_COLUMNS: &[Column] = &[
    text("job_id"),
    int("scheduled_at"),
    text("trigger"),
    text("status"),
    text("session_id"),
    real("started_at"),
    real("finished_at"),
    text("error"),
    text("output_path"),
    text("delivery_error"),
];

/// A table a copy carries over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// `sessions`: one row per conversation, with its counters.
    Sessions,
    /// `messages`: every transcript row, active or compressed away.
    Messages,
    /// `gateway_routes`: session key → current session.
    Routes,
    /// `delivery_obligations`: the delivery ledger.
    Ledger,
    /// `pairing_pending`: codes waiting for approval (salted hashes).
    PairingPending,
    /// `pairing_approved`: users who may talk to the bot.
    PairingApproved,
    /// `pairing_stamps`: offer times, failure counts, lockouts.
    PairingStamps,
    /// `inbound_seen`: inbound event ids already taken.
    InboundSeen,
    /// `owed_turns`: messages accepted and not yet answered.
    OwedTurns,
    /// `adapter_cursors`: adapters' saved positions.
    AdapterCursors,
    /// `cron_jobs`: scheduled jobs.
    CronJobs,
    /// `cron_occurrences`: the record of their runs.
    CronOccurrences,
}

impl Table {
    /// Every copied table, in the order a copy writes them: a table comes
    /// after the ones its foreign keys point at.
    pub const ALL: [Table; 12] = [
        Table::Sessions,
        Table::Messages,
        Table::Routes,
        Table::Ledger,
        Table::PairingPending,
        Table::PairingApproved,
        Table::PairingStamps,
        Table::InboundSeen,
        Table::OwedTurns,
        Table::AdapterCursors,
        Table::CronJobs,
        Table::CronOccurrences,
    ];

    /// Its name in both backends' schemas.
    pub fn name(self) -> &'static str {
        match self {
            Table::Sessions => "sessions",
            Table::Messages => "messages",
            Table::Routes => "gateway_routes",
            Table::Ledger => "delivery_obligations",
            Table::PairingPending => "pairing_pending",
            Table::PairingApproved => "pairing_approved",
            Table::PairingStamps => "pairing_stamps",
            Table::InboundSeen => "inbound_seen",
            Table::OwedTurns => "owed_turns",
            Table::AdapterCursors => "adapter_cursors",
            Table::CronJobs => "cron_jobs",
            Table::CronOccurrences => "cron_occurrences",
        }
    }

    /// The copied columns, in the order a [`Row`] holds their values.
    /// Columns one backend computes itself (PostgreSQL's creation order of
    /// sessions and its search vector) are not among them.
    pub fn columns(self) -> &'static [Column] {
        match self {
            Table::Sessions => SESSIONS_COLUMNS,
            Table::Messages => MESSAGES_COLUMNS,
            Table::Routes => ROUTES_COLUMNS,
            Table::Ledger => LEDGER_COLUMNS,
            Table::PairingPending => PAIRING_PENDING_COLUMNS,
            Table::PairingApproved => PAIRING_APPROVED_COLUMNS,
            Table::PairingStamps => PAIRING_STAMPS_COLUMNS,
            Table::InboundSeen => INBOUND_SEEN_COLUMNS,
            Table::OwedTurns => OWED_TURNS_COLUMNS,
            Table::AdapterCursors => ADAPTER_CURSORS_COLUMNS,
            Table::CronJobs => CRON_JOBS_COLUMNS,
            Table::CronOccurrences => CRON_OCCURRENCES_COLUMNS,
        }
    }

    /// The primary key's columns: what identifies a row on both sides.
    pub fn key(self) -> &'static [&'static str] {
        match self {
            Table::Sessions
            | Table::Messages
            | Table::Ledger
            | Table::CronJobs
            | Table::OwedTurns => &["id"],
            Table::Routes => &["session_key"],
            Table::PairingPending => &["entry_id"],
            Table::PairingApproved => &["platform", "user_id"],
            Table::PairingStamps => &["platform", "kind", "subject"],
            Table::InboundSeen => &["platform", "inbound_id"],
            Table::AdapterCursors => &["platform", "name"],
            Table::CronOccurrences => &["job_id", "scheduled_at"],
        }
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Tables (or name prefixes, ending in `*`) a backend holds that a copy
/// deliberately leaves out, with why.
pub const LEFT_OUT: &[(&str, &str)] = &[
    (
        "cluster_nodes",
        "the gateway processes running now, which re-announce themselves",
    ),
    ("cluster_leases", "held by running processes"),
    (
        "messages_fts*",
        "SQLite's full-text indexes, rebuilt from the messages",
    ),
    (
        "fts_progress",
        "how far SQLite's indexes have got, kept by the target",
    ),
    ("talaria_schema", "the target's own schema version"),
    (MARKER_TABLE, "the copy's own marker"),
];

/// One stored value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL `NULL`, in a column of any kind.
    Null,
    /// For [`Kind::Int`].
    Int(i64),
    /// For [`Kind::Real`].
    Real(f64),
    /// For [`Kind::Text`].
    Text(String),
    /// For [`Kind::Bool`].
    Bool(bool),
}

impl Value {
    /// Bytes this value holds, for bounding a page's size.
    pub fn size(&self) -> usize {
        match self {
            Value::Text(s) => s.len(),
            _ => 8,
        }
    }
}

/// One row: a value per column of [`Table::columns`], in that order.
pub type Row = Vec<Value>;

/// Where a page ended, so the next one starts after it. What it holds is
/// the source backend's business (a row id, a key).
#[derive(Debug, Clone, PartialEq)]
pub struct PageKey(pub(crate) Vec<Value>);

/// Rows read in one go, and where to continue.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// At least one row.
    pub rows: Vec<Row>,
    /// Pass this to read the next page.
    pub next: PageKey,
}

/// How much one page may hold. A page stops at whichever limit it reaches
/// first, but always holds at least one row (so one huge message still
/// moves).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageLimit {
    /// Most rows in a page.
    pub rows: usize,
    /// The sum of the text in the page, roughly its memory.
    pub bytes: usize,
}

impl Default for PageLimit {
    fn default() -> PageLimit {
        PageLimit {
            rows: 1000,
            bytes: 8 << 20,
        }
    }
}

/// A store that can be read out whole and written into with every row's
/// identity kept.
#[async_trait]
pub trait StoreCopy: Send + Sync {
    /// Starts reading everything: one consistent snapshot, until the dump
    /// is closed or dropped. Reads only.
    async fn dump(&self) -> Result<Box<dyn Dump>>;
    /// Starts writing a copy into this store. On PostgreSQL this holds a
    /// lock until the load is dropped, so two copies into one schema
    /// cannot run at once (the second waits a few seconds, then fails
    /// with [`StoreError::Conflict`]).
    async fn load(&self) -> Result<Box<dyn Load>>;
}

/// Reading one store out, table by table, in pages.
#[async_trait]
pub trait Dump: Send {
    /// What is read, for people and for the target's marker (a file path,
    /// a URL without its password and a schema).
    fn source(&self) -> &str;
    /// Rows in `table`, in the dump's snapshot.
    async fn count(&mut self, table: Table) -> Result<u64>;
    /// The rows of `table` after `after` (from the start with `None`), in
    /// the backend's order for the table, within `limit`; `None` once no
    /// row is left.
    async fn page(
        &mut self,
        table: Table,
        after: Option<&PageKey>,
        limit: PageLimit,
    ) -> Result<Option<Page>>;
    /// Ends the snapshot.
    async fn close(self: Box<Self>) -> Result<()>;
}

/// What a target held when a copy began.
#[derive(Debug, Clone, PartialEq)]
pub enum TargetState {
    /// Nothing: the copy starts, and its marker is written.
    Empty,
    /// An unfinished copy of the same source: the copy resumes.
    Resuming {
        /// When the unfinished copy began.
        started_at: Timestamp,
    },
    /// An unfinished copy of another source; nothing was changed.
    PartialCopyOf {
        /// What that copy reads from.
        source: String,
        /// When it began.
        started_at: Timestamp,
    },
    /// A finished copy; nothing was changed.
    CopyOf {
        /// What was copied.
        source: String,
        /// When the copy was verified and marked finished.
        finished_at: Timestamp,
    },
    /// Rows not written by a copy (a database in use); nothing was changed.
    InUse {
        /// The tables holding rows, and how many.
        rows: Vec<(Table, u64)>,
    },
}

impl TargetState {
    /// What a target's marker says to a copy of `source`: the copy
    /// `marked` began at `started_at` and, if it finished, at
    /// `finished_at`.
    pub(crate) fn from_marker(
        source: &str,
        marked: String,
        started_at: Timestamp,
        finished_at: Option<Timestamp>,
    ) -> TargetState {
        match finished_at {
            Some(finished_at) => TargetState::CopyOf {
                source: marked,
                finished_at,
            },
            None if marked == source => TargetState::Resuming { started_at },
            None => TargetState::PartialCopyOf {
                source: marked,
                started_at,
            },
        }
    }
}

/// Writing a copy into one store.
#[async_trait]
pub trait Load: Send {
    /// What is written into, for people (a URL without its password and a
    /// schema, a file path).
    fn target(&self) -> &str;
    /// How to empty this target so a refused copy can start over.
    fn start_over(&self) -> String;
    /// Looks at what the target holds and, when it is empty or holds an
    /// unfinished copy of `source`, claims it for this copy (writing the
    /// marker), atomically.
    async fn begin(&mut self, source: &str) -> Result<TargetState>;
    /// Writes `rows` of `table` in one transaction, keeping every value
    /// (ids included). A row whose key is already there is brought up to
    /// date, so writing a page again changes nothing.
    async fn write(&mut self, table: Table, rows: &[Row]) -> Result<()>;
    /// After the last page: new rows get ids above the copied ones, and
    /// search sees every copied message.
    async fn finish(&mut self) -> Result<()>;
    /// Rows in `table` now.
    async fn count(&mut self, table: Table) -> Result<u64>;
    /// Marks the copy finished (after it was verified); a later copy into
    /// this target is refused.
    async fn seal(&mut self) -> Result<()>;
}

/// How [`copy_store`] pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyOptions {
    /// The size of each page read and written.
    pub page: PageLimit,
}

/// Where a copy stands, after each page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The table being copied.
    pub table: Table,
    /// Rows of the table written so far.
    pub copied: u64,
    /// Rows of the table in the source.
    pub total: u64,
}

/// What a finished copy did.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyReport {
    /// What was read ([`Dump::source`]).
    pub source: String,
    /// What was written ([`Load::target`]).
    pub target: String,
    /// Whether it finished a copy an earlier run had started.
    pub resumed: bool,
    /// Rows per table, the same on both sides (verified).
    pub tables: Vec<(Table, u64)>,
    /// From the first check to the verified end.
    pub elapsed: Duration,
}

/// Which end of a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The store read from.
    Source,
    /// The store written into.
    Target,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Source => "source",
            Side::Target => "target",
        })
    }
}

/// Why a copy did not happen, or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// Opening either side, or reading what it holds, failed before
    /// anything was written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A gateway node is alive on one side.
    #[error(
        "a gateway is running against the {side} (node {node} on {host}, pid {pid}, alive until \
         {until}): stop every gateway that uses it, then run the copy again (a gateway that was \
         killed counts as alive until then)",
        until = when(*.until)
    )]
    GatewayRunning {
        /// Which store it runs against.
        side: Side,
        /// The node's id.
        node: String,
        /// The host it announced.
        host: String,
        /// Its process id there.
        pid: u32,
        /// Until when it counts as alive.
        until: Timestamp,
    },
    /// The target holds rows that no copy wrote.
    #[error(
        "{target} is not empty (rows: {rows}): a copy only goes into an empty database, so nothing was \
         written. To start over: {start_over}",
        rows = describe_rows(rows)
    )]
    TargetInUse {
        /// What was (or would have been) written into.
        target: String,
        /// The tables holding rows, and how many.
        rows: Vec<(Table, u64)>,
        /// How to empty the target ([`Load::start_over`]).
        start_over: String,
    },
    /// The target holds a finished copy.
    #[error(
        "{target} already holds a finished copy of {copy_of} (finished {finished}), so nothing \
         was written. To copy again: {start_over}",
        finished = when(*.finished_at)
    )]
    AlreadyCopied {
        /// What was (or would have been) written into.
        target: String,
        /// What the copy already there reads from.
        copy_of: String,
        /// When that copy finished.
        finished_at: Timestamp,
        /// How to empty the target ([`Load::start_over`]).
        start_over: String,
    },
    /// The target holds half a copy of something else.
    #[error(
        "{target} holds an unfinished copy of {copy_of} (started {started}), not of {this}, so \
         nothing was written. Finish that copy by running it again, or start over: {start_over}",
        started = when(*.started_at)
    )]
    OtherCopyUnfinished {
        /// What was (or would have been) written into.
        target: String,
        /// What the copy already there reads from.
        copy_of: String,
        /// What this copy reads from.
        this: String,
        /// When that copy began.
        started_at: Timestamp,
        /// How to empty the target ([`Load::start_over`]).
        start_over: String,
    },
    /// Every row was written but preparing the target for use (its id
    /// sequence, its search index) or counting its rows failed.
    #[error(
        "the copy stopped after every row was written, while finishing {target}: {error}. Run \
         the same copy again to finish it"
    )]
    Finishing {
        /// What was (or would have been) written into.
        target: String,
        #[source]
        /// What failed.
        error: StoreError,
    },
    /// Writing (or reading a page) failed partway: what was written is kept.
    #[error(
        "the copy stopped in table {table} after {copied} of its rows: {error}. Everything \
         copied so far is kept in {target}; fix the cause and run the same copy again to resume \
         where it stopped (or start over: {start_over})"
    )]
    Interrupted {
        /// The table concerned.
        table: Table,
        /// Its rows written by this run before the failure.
        copied: u64,
        /// What was (or would have been) written into.
        target: String,
        /// How to empty the target ([`Load::start_over`]).
        start_over: String,
        #[source]
        /// What failed.
        error: StoreError,
    },
    /// The counts differ after every page was written.
    #[error(
        "verification failed: {table} has {source_rows} rows in the source but {target_rows} in \
         {target}. The source changed since the copy began (was a gateway or a chat running?); \
         the copy is not marked finished. Start over: {start_over}"
    )]
    Mismatch {
        /// The table concerned.
        table: Table,
        /// Its rows in the source.
        source_rows: u64,
        /// Its rows in the target.
        target_rows: u64,
        /// What was (or would have been) written into.
        target: String,
        /// How to empty the target ([`Load::start_over`]).
        start_over: String,
    },
}

/// `rows` as `sessions: 3, messages: 12`.
fn describe_rows(rows: &[(Table, u64)]) -> String {
    rows.iter()
        .map(|(table, n)| format!("{table}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A stored time for a message: UTC, to the second.
fn when(at: Timestamp) -> String {
    let micros = (at * 1_000_000.0) as i64;
    match chrono::DateTime::from_timestamp_micros(micros) {
        Some(t) => t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        None => format!("at {at}"),
    }
}

/// Refuses when a node of `store` is alive now: a gateway writing while a
/// copy reads (or writes) would make the two sides differ.
async fn no_live_gateway<S: ClusterStore + ?Sized>(
    store: &S,
    side: Side,
) -> std::result::Result<(), CopyError> {
    let now = store.clock().await?;
    let nodes = store.nodes().await?;
    match nodes.into_iter().find(|n| n.lease_until > now) {
        Some(node) => Err(CopyError::GatewayRunning {
            side,
            node: node.id.to_string(),
            host: node.host,
            pid: node.pid,
            until: node.lease_until,
        }),
        None => Ok(()),
    }
}

/// Copies everything `source` holds into `target` (see the module docs),
/// calling `progress` after each page, and verifies the result.
///
/// # Errors
/// A refusal (a live gateway on either side, a target that is not empty,
/// already copied into, or half filled from another source) changes
/// nothing. [`CopyError::Interrupted`] keeps what was written, and running
/// the same copy again resumes it. [`CopyError::Mismatch`] leaves the copy
/// unfinished.
pub async fn copy_store<S, T>(
    source: &S,
    target: &T,
    options: &CopyOptions,
    mut progress: impl FnMut(Progress) + Send,
) -> std::result::Result<CopyReport, CopyError>
where
    S: StoreCopy + ClusterStore + ?Sized,
    T: StoreCopy + ClusterStore + ?Sized,
{
    let started = Instant::now();
    no_live_gateway(source, Side::Source).await?;
    no_live_gateway(target, Side::Target).await?;
    let mut dump = source.dump().await?;
    let mut load = target.load().await?;
    let source_name = dump.source().to_owned();
    let target_name = load.target().to_owned();
    let resumed = match load.begin(&source_name).await? {
        TargetState::Empty => false,
        TargetState::Resuming { started_at } => {
            tracing::info!(
                source = %source_name,
                started = %when(started_at),
                "resuming an unfinished copy"
            );
            true
        }
        TargetState::PartialCopyOf { source, started_at } => {
            return Err(CopyError::OtherCopyUnfinished {
                target: target_name,
                copy_of: source,
                this: source_name,
                started_at,
                start_over: load.start_over(),
            });
        }
        TargetState::CopyOf {
            source,
            finished_at,
        } => {
            return Err(CopyError::AlreadyCopied {
                target: target_name,
                copy_of: source,
                finished_at,
                start_over: load.start_over(),
            });
        }
        TargetState::InUse { rows } => {
            return Err(CopyError::TargetInUse {
                target: target_name,
                rows,
                start_over: load.start_over(),
            });
        }
    };

    let mut tables = Vec::with_capacity(Table::ALL.len());
    for table in Table::ALL {
        let interrupted =
            |copied: u64, error: StoreError, load: &dyn Load| CopyError::Interrupted {
                table,
                copied,
                target: load.target().to_owned(),
                start_over: load.start_over(),
                error,
            };
        let total = match dump.count(table).await {
            Ok(n) => n,
            Err(e) => return Err(interrupted(0, e, load.as_ref())),
        };
        let mut copied = 0u64;
        let mut after: Option<PageKey> = None;
        loop {
            let page = match dump.page(table, after.as_ref(), options.page).await {
                Ok(Some(page)) => page,
                Ok(None) => break,
                Err(e) => return Err(interrupted(copied, e, load.as_ref())),
            };
            if let Err(e) = load.write(table, &page.rows).await {
                return Err(interrupted(copied, e, load.as_ref()));
            }
            copied += page.rows.len() as u64;
            after = Some(page.next);
            progress(Progress {
                table,
                copied,
                total,
            });
        }
        tables.push((table, total));
    }
    let finishing = |error: StoreError| CopyError::Finishing {
        target: target_name.clone(),
        error,
    };
    load.finish().await.map_err(finishing)?;
    for (table, source_rows) in &tables {
        let target_rows = load.count(*table).await.map_err(finishing)?;
        if target_rows != *source_rows {
            return Err(CopyError::Mismatch {
                table: *table,
                source_rows: *source_rows,
                target_rows,
                target: target_name.clone(),
                start_over: load.start_over(),
            });
        }
    }
    load.seal().await.map_err(finishing)?;
    // The dump only read; failing to end its snapshot changes nothing.
    if let Err(e) = dump.close().await {
        tracing::warn!(error = %e, "could not close the source after the copy");
    }
    Ok(CopyReport {
        source: source_name,
        target: target_name,
        resumed,
        tables,
        elapsed: started.elapsed(),
    })
}

// ------------------------------------------------- shared by the backends

/// `"name"`: every identifier the copy writes into SQL is quoted, so a
/// column called `timestamp` or `trigger` reads the same in both dialects.
pub(crate) fn quoted(name: &str) -> String {
    format!("\"{name}\"")
}

/// The table's columns, quoted and comma-separated.
pub(crate) fn column_list(table: Table) -> String {
    table
        .columns()
        .iter()
        .map(|c| quoted(c.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `SET c = excluded.c, ...` for the columns outside the key, and the
/// condition that some of them changed (`IS DISTINCT FROM` in PostgreSQL,
/// `IS NOT` in SQLite, both NULL-safe), so writing a page again leaves
/// unchanged rows alone. `None` when every column is in the key.
pub(crate) fn upsert_clause(table: Table, alias: &str, differs: &str) -> Option<(String, String)> {
    let names: Vec<&str> = table.columns().iter().map(|c| c.name).collect();
    upsert_clause_of(table, &names, alias, differs)
}

/// [`upsert_clause`] over some of `table`'s columns (a backend that keeps
/// one of them elsewhere leaves it out).
pub(crate) fn upsert_clause_of(
    table: Table,
    names: &[&str],
    alias: &str,
    differs: &str,
) -> Option<(String, String)> {
    let rest: Vec<&str> = names
        .iter()
        .copied()
        .filter(|name| !table.key().contains(name))
        .collect();
    if rest.is_empty() {
        return None;
    }
    let set = rest
        .iter()
        .map(|c| format!("{q} = excluded.{q}", q = quoted(c)))
        .collect::<Vec<_>>()
        .join(", ");
    let changed = rest
        .iter()
        .map(|c| format!("{alias}.{q} {differs} excluded.{q}", q = quoted(c)))
        .collect::<Vec<_>>()
        .join(" OR ");
    Some((set, changed))
}

/// A value of the wrong kind for its column: a bug, or a row no build of
/// Talaria wrote.
pub(crate) fn wrong_kind(table: Table, column: &Column, value: &Value) -> StoreError {
    StoreError::Database(format!(
        "cannot copy {table}.{}: expected {:?}, found {value:?}",
        column.name, column.kind
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_column_is_a_copied_column() {
        for table in Table::ALL {
            for key in table.key() {
                assert!(
                    table.columns().iter().any(|c| c.name == *key),
                    "{table}.{key}"
                );
            }
        }
    }

    #[test]
    fn tables_come_after_what_they_refer_to() {
        let at = |t: Table| Table::ALL.iter().position(|x| *x == t);
        assert!(at(Table::Sessions) < at(Table::Messages));
        assert!(at(Table::CronJobs) < at(Table::CronOccurrences));
    }

    #[test]
    fn upserts_touch_only_changed_rows_outside_the_key() {
        let (set, changed) = upsert_clause(Table::InboundSeen, "t", "IS NOT").unwrap();
        assert_eq!(set, "\"seen_at\" = excluded.\"seen_at\"");
        assert_eq!(changed, "t.\"seen_at\" IS NOT excluded.\"seen_at\"");
    }

    #[test]
    fn refusals_say_how_to_start_over() {
        let e = CopyError::TargetInUse {
            target: "db".into(),
            rows: vec![(Table::Sessions, 3)],
            start_over: "drop it".into(),
        };
        let text = e.to_string();
        assert!(text.contains("rows: sessions: 3"), "{text}");
        assert!(text.contains("drop it"), "{text}");
        assert!(when(0.0).starts_with("1970-01-01 00:00:00"));
    }
}
