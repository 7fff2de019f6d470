//! Connections, the retry loop and error mapping.
//!
//! SQLite allows one writer at a time per database file, across processes.
//! Inside this process the writer connection sits behind a mutex, so our own
//! writes queue politely; other processes (a second gateway, the CLI) can
//! still hold the lock, which is why every operation runs under a bounded,
//! jittered retry on `SQLITE_BUSY` / `SQLITE_LOCKED`.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rand::Rng;
use rusqlite::{Connection, ErrorCode, OpenFlags, Transaction, TransactionBehavior};

use super::SqliteOptions;
use crate::StoreError;

/// An error inside an operation: either SQLite's (which may be retried) or
/// one of ours (which never is). Private so no rusqlite type leaks out.
#[derive(Debug)]
pub(crate) enum OpError {
    Sql(rusqlite::Error),
    Store(StoreError),
}

impl From<rusqlite::Error> for OpError {
    fn from(e: rusqlite::Error) -> Self {
        OpError::Sql(e)
    }
}

impl From<StoreError> for OpError {
    fn from(e: StoreError) -> Self {
        OpError::Store(e)
    }
}

pub(crate) type OpResult<T> = std::result::Result<T, OpError>;

fn is_busy(e: &OpError) -> bool {
    matches!(e, OpError::Sql(e) if matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    ))
}

/// Turns a final error into the public type, naming the file when the
/// problem is the file itself.
pub(crate) fn to_store_error(e: OpError, path: &Path) -> StoreError {
    match e {
        OpError::Store(e) => e,
        OpError::Sql(e) => match e.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Busy,
            Some(ErrorCode::NotADatabase) => StoreError::Database(format!(
                "{} is not a database (or is encrypted): {e}",
                path.display()
            )),
            Some(ErrorCode::DatabaseCorrupt) => StoreError::Database(format!(
                "{} is corrupt: {e}; restore it from a backup or move it aside",
                path.display()
            )),
            _ => StoreError::Database(e.to_string()),
        },
    }
}

/// Runs `op` until it succeeds, fails for a reason other than a lock, or
/// the retry budget is spent.
pub(crate) fn with_retry<T>(
    opts: &SqliteOptions,
    path: &Path,
    mut op: impl FnMut() -> OpResult<T>,
) -> Result<T, StoreError> {
    let started = Instant::now();
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        let err = match op() {
            Ok(v) => return Ok(v),
            Err(e) if is_busy(&e) => e,
            Err(e) => return Err(to_store_error(e, path)),
        };
        if attempt >= opts.max_attempts.max(1) || started.elapsed() >= opts.retry_budget {
            tracing::warn!(
                path = %path.display(),
                attempts = attempt,
                error = ?err,
                "database stayed locked; giving up"
            );
            return Err(StoreError::Busy);
        }
        // Exponential backoff from 10ms, capped at 400ms, with the upper
        // half randomised so that several waiters do not retry in lockstep.
        let ceiling_ms = (10u64 << attempt.min(6)).min(400);
        let delay = Duration::from_millis(rand::rng().random_range(ceiling_ms / 2..=ceiling_ms));
        let remaining = opts.retry_budget.saturating_sub(started.elapsed());
        tracing::debug!(attempt, ?delay, "database locked; retrying");
        std::thread::sleep(delay.min(remaining));
    }
}

/// Locks a mutex even if a thread panicked while holding it: the guarded
/// connection is still sound, because an unfinished transaction rolls back
/// when its guard is dropped during unwinding.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Pragmas every connection needs. `journal_mode` is a property of the file
/// and is set once by the writer; `foreign_keys` and `busy_timeout` are per
/// connection.
pub(crate) fn configure(conn: &Connection, opts: &SqliteOptions) -> rusqlite::Result<()> {
    conn.busy_timeout(opts.busy_timeout)?;
    conn.pragma_update(None, "foreign_keys", true)?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(())
}

/// The writer plus a small pool of readers. WAL lets the readers run while
/// the writer commits, so searches never wait for appends.
pub(crate) struct Connections {
    pub(crate) path: PathBuf,
    pub(crate) opts: SqliteOptions,
    writer: Mutex<Connection>,
    idle_readers: Mutex<Vec<Connection>>,
}

impl Connections {
    pub(crate) fn new(path: PathBuf, opts: SqliteOptions, writer: Connection) -> Self {
        Connections {
            path,
            opts,
            writer: Mutex::new(writer),
            idle_readers: Mutex::new(Vec::new()),
        }
    }

    /// Runs `op` in an `IMMEDIATE` transaction on the writer and commits.
    ///
    /// `IMMEDIATE` takes the write lock up front: a deferred transaction
    /// that reads first and upgrades later can hit a busy error that the
    /// busy handler cannot wait out.
    pub(crate) fn write<T>(
        &self,
        op: impl Fn(&Transaction<'_>) -> OpResult<T>,
    ) -> Result<T, StoreError> {
        let mut conn = lock(&self.writer);
        with_retry(&self.opts, &self.path, || {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let value = op(&tx)?;
            tx.commit()?;
            Ok(value)
        })
    }

    /// Runs `op` in a read transaction on a pooled reader, so every
    /// statement in it sees the same snapshot.
    pub(crate) fn read<T>(
        &self,
        op: impl Fn(&Transaction<'_>) -> OpResult<T>,
    ) -> Result<T, StoreError> {
        let mut conn = self.take_reader()?;
        let result = with_retry(&self.opts, &self.path, || {
            let tx = conn.transaction()?;
            let value = op(&tx)?;
            // Ending a read transaction only releases the snapshot.
            tx.commit()?;
            Ok(value)
        });
        self.return_reader(conn);
        result
    }

    fn take_reader(&self) -> Result<Connection, StoreError> {
        if let Some(conn) = lock(&self.idle_readers).pop() {
            return Ok(conn);
        }
        with_retry(&self.opts, &self.path, || {
            // No CREATE flag: if the file vanished, fail instead of quietly
            // reading a fresh empty database.
            let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
            let conn = Connection::open_with_flags(&self.path, flags)?;
            configure(&conn, &self.opts)?;
            // Readers must never write; this turns a bug into an error.
            conn.pragma_update(None, "query_only", true)?;
            Ok(conn)
        })
    }

    fn return_reader(&self, conn: Connection) {
        let mut idle = lock(&self.idle_readers);
        if idle.len() < self.opts.max_idle_readers {
            idle.push(conn);
        }
    }
}
