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

//!
//! # Layout
//!
//! - this file: [`copy_store`], its options, report and errors;
//! - `tables`: what is copied (tables, their columns, values);
//! - `backend`: the traits a backend implements to be read out
//!   ([`Dump`]) and written into ([`Load`]);
//! - `sql`: the SQL both backends build from the table descriptions.

mod backend;
mod sql;
mod tables;

use std::fmt;
use std::time::{Duration, Instant};

pub use backend::{Dump, Load, Page, PageKey, PageLimit, StoreCopy, TargetState};
pub(crate) use sql::{column_list, quoted, upsert_clause, upsert_clause_of, wrong_kind};
pub use tables::{Column, Kind, LEFT_OUT, MARKER_TABLE, Row, Table, Value};

use crate::cluster::ClusterStore;
use crate::{StoreError, Timestamp};

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

#[cfg(test)]
mod tests {
    use super::*;

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
