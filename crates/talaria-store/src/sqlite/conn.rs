//! Connections, the retry loop and error mapping.
//!
//! SQLite allows one writer at a time per database file, across processes.
//! Inside this process the writer connection belongs to one thread that
//! takes write operations from a queue and commits whatever is waiting
//! together (group commit, see [`Writer`]); other processes (a second
//! gateway, the CLI) can still hold the lock, which is why every
//! transaction runs under a bounded, jittered retry on `SQLITE_BUSY` /
//! `SQLITE_LOCKED`.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::Rng;
use rusqlite::{Connection, ErrorCode, OpenFlags, Transaction, TransactionBehavior};

use crate::StoreError;

/// Tuning for [`SqliteStore`](super::SqliteStore); the defaults suit an
/// interactive agent.
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// How long one SQLite call waits on another connection's lock before
    /// reporting busy (SQLite's own `busy_timeout`).
    pub busy_timeout: Duration,
    /// Most attempts per operation when the database stays busy.
    pub max_attempts: u32,
    /// Total time one operation may spend retrying before it fails with
    /// [`StoreError::Busy`].
    pub retry_budget: Duration,
    /// Threads that run reads, each with a connection of its own (at
    /// least one). Reads beyond them wait their turn.
    pub readers: usize,
    /// Page cache of the writer connection, in KiB. It holds the pages
    /// every commit touches (the newest leaves, the index roots).
    pub writer_cache_kib: u32,
    /// Page cache of each read connection, in KiB. Reads mostly touch a
    /// session's newest pages, which the operating system caches anyway;
    /// SQLite's default of about 2 MB per connection let the memory of a
    /// long-running gateway grow with its database.
    pub reader_cache_kib: u32,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            busy_timeout: Duration::from_secs(1),
            max_attempts: 10,
            retry_budget: Duration::from_secs(5),
            readers: 4,
            writer_cache_kib: 2048,
            reader_cache_kib: 512,
        }
    }
}

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

/// Bounds a connection's page cache (a negative `cache_size` is in KiB).
pub(crate) fn set_cache_kib(conn: &Connection, kib: u32) -> rusqlite::Result<()> {
    conn.pragma_update(None, "cache_size", -i64::from(kib.max(64)))
}

/// The writer thread plus a fixed set of reader threads. WAL lets the
/// readers run while the writer commits, so searches never wait for
/// appends.
pub(crate) struct Connections {
    pub(crate) path: PathBuf,
    pub(crate) opts: SqliteOptions,
    writer: Writer,
    readers: Readers,
}

impl Connections {
    pub(crate) fn new(path: PathBuf, opts: SqliteOptions, writer: Connection) -> Self {
        Connections {
            writer: Writer::start(writer, path.clone(), opts.clone()),
            readers: Readers::start(&path, &opts),
            path,
            opts,
        }
    }

    /// Queues `op` for the writer thread; it runs inside an `IMMEDIATE`
    /// transaction (in its own savepoint, so its failure undoes only its
    /// own changes) and `reply` gets the outcome once that transaction
    /// committed.
    pub(crate) fn write<T, F>(
        &self,
        op: F,
        reply: tokio::sync::oneshot::Sender<Result<T, StoreError>>,
    ) where
        T: Send + 'static,
        F: Fn(&Transaction<'_>) -> OpResult<T> + Send + 'static,
    {
        self.writer.submit(Box::new(Job {
            op,
            outcome: None,
            reply: Some(reply),
        }));
    }

    /// Queues `op` for a reader thread; it runs in one read transaction,
    /// so every statement in it sees the same snapshot, and `reply` gets
    /// the outcome.
    pub(crate) fn read<T, F>(
        &self,
        op: F,
        reply: tokio::sync::oneshot::Sender<Result<T, StoreError>>,
    ) where
        T: Send + 'static,
        F: Fn(&Transaction<'_>) -> OpResult<T> + Send + 'static,
    {
        self.readers.submit(Box::new(ReadOp { op, reply }));
    }
}

/// The threads that run read operations, each on a connection of its own
/// that it keeps for life.
///
/// Reads used to run on tokio's blocking pool with connections borrowed
/// from a pool: under load that meant dozens of short-lived threads, each
/// given its own malloc arena that kept what it freed, and connections
/// opened (schema parsed, cache refilled) and closed whenever more reads
/// ran at once than the pool kept. The memory of a gateway grew by
/// megabytes over a long run. A fixed set of threads bounds both; reads
/// beyond it wait in the queue, which at this size costs less than the
/// thread hand-offs it saves.
struct Readers {
    /// `None` when no thread could start, and once dropping.
    queue: Option<mpsc::Sender<Box<dyn ReadJob>>>,
    threads: Vec<JoinHandle<()>>,
}

impl Readers {
    fn start(path: &Path, opts: &SqliteOptions) -> Readers {
        let (tx, rx) = mpsc::channel::<Box<dyn ReadJob>>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::new();
        for i in 0..opts.readers.max(1) {
            let (rx, path, opts) = (Arc::clone(&rx), path.to_path_buf(), opts.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("talaria-db-reader-{i}"))
                .spawn(move || read_loop(&rx, &path, &opts));
            match spawned {
                Ok(handle) => threads.push(handle),
                Err(e) => tracing::error!(error = %e, "cannot start a database reader thread"),
            }
        }
        Readers {
            queue: (!threads.is_empty()).then_some(tx),
            threads,
        }
    }

    fn submit(&self, job: Box<dyn ReadJob>) {
        let rejected = match &self.queue {
            Some(queue) => queue.send(job).err().map(|e| e.0),
            None => Some(job),
        };
        if let Some(job) = rejected {
            job.refuse(StoreError::Database(
                "the database readers have stopped".to_owned(),
            ));
        }
    }
}

impl Drop for Readers {
    /// Closes the queue and waits for the threads, so their connections
    /// are closed with the last store handle.
    fn drop(&mut self) {
        self.queue.take();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn read_loop(queue: &Mutex<mpsc::Receiver<Box<dyn ReadJob>>>, path: &Path, opts: &SqliteOptions) {
    let mut conn: Option<Connection> = None;
    loop {
        // One thread waits on the queue at a time, the others for the lock.
        let Ok(job) = lock(queue).recv() else {
            return;
        };
        // Opened at the first read, and again after a failed open.
        let ready = match conn {
            Some(ref mut c) => Ok(c),
            None => open_reader(path, opts).map(|c| conn.insert(c)),
        };
        match ready {
            Ok(c) => job.run(c, path, opts),
            Err(e) => job.refuse(e),
        }
    }
}

fn open_reader(path: &Path, opts: &SqliteOptions) -> Result<Connection, StoreError> {
    with_retry(opts, path, || {
        // No CREATE flag: if the file vanished, fail instead of quietly
        // reading a fresh empty database.
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags)?;
        configure(&conn, opts)?;
        set_cache_kib(&conn, opts.reader_cache_kib)?;
        // Readers must never write; this turns a bug into an error.
        conn.pragma_update(None, "query_only", true)?;
        Ok(conn)
    })
}

/// A queued read operation and its reply.
trait ReadJob: Send {
    fn run(self: Box<Self>, conn: &mut Connection, path: &Path, opts: &SqliteOptions);
    /// Replies with `error` without running.
    fn refuse(self: Box<Self>, error: StoreError);
}

struct ReadOp<T, F> {
    op: F,
    reply: tokio::sync::oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> ReadJob for ReadOp<T, F>
where
    T: Send + 'static,
    F: Fn(&Transaction<'_>) -> OpResult<T> + Send + 'static,
{
    fn run(self: Box<Self>, conn: &mut Connection, path: &Path, opts: &SqliteOptions) {
        // A panicking operation is a bug; it must cost only its own read,
        // not a thread every later read depends on.
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            with_retry(opts, path, || {
                let tx = conn.transaction()?;
                let value = (self.op)(&tx)?;
                // Ending a read transaction only releases the snapshot.
                tx.commit()?;
                Ok(value)
            })
        }))
        .unwrap_or_else(|_| Err(StoreError::Database("a database read panicked".to_owned())));
        // The caller may have gone away.
        let _ = self.reply.send(result);
    }

    fn refuse(self: Box<Self>, error: StoreError) {
        let _ = self.reply.send(Err(error));
    }
}

/// Most operations committed in one transaction. Bounds how long the first
/// of them waits for the others to run.
const MAX_BATCH: usize = 64;

/// The thread that owns the write connection.
///
/// Operations arrive on a queue. The thread takes the first, then whatever
/// else is already waiting (up to [`MAX_BATCH`]), runs them one after
/// another in one `IMMEDIATE` transaction, each in its own savepoint, and
/// commits once. An idle writer therefore commits a lone operation at once,
/// while a busy one (concurrent turns) writes the pages they share (the
/// message table's last page, the full-text index's new segment, the
/// sessions row) once per batch instead of once per operation: fewer bytes
/// to disk and less work per turn, with no added wait.
///
/// `IMMEDIATE` takes the write lock up front: a deferred transaction that
/// reads first and upgrades later can hit a busy error that the busy
/// handler cannot wait out.
struct Writer {
    /// `None` when the thread could not start, and once dropping.
    queue: Option<mpsc::Sender<Box<dyn WriteJob>>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    fn start(conn: Connection, path: PathBuf, opts: SqliteOptions) -> Writer {
        let (tx, rx) = mpsc::channel::<Box<dyn WriteJob>>();
        let spawned = std::thread::Builder::new()
            .name("talaria-db-writer".to_owned())
            .spawn(move || write_loop(conn, rx, &path, &opts));
        let thread = match spawned {
            Ok(handle) => Some(handle),
            Err(e) => {
                // Without its thread every write reports the failure below.
                tracing::error!(error = %e, "cannot start the database writer thread");
                None
            }
        };
        Writer {
            queue: thread.is_some().then_some(tx),
            thread,
        }
    }

    fn submit(&self, job: Box<dyn WriteJob>) {
        let rejected = match &self.queue {
            Some(queue) => queue.send(job).err().map(|e| e.0),
            None => Some(job),
        };
        if let Some(job) = rejected {
            job.finish(Err(StoreError::Database(
                "the database writer has stopped".to_owned(),
            )));
        }
    }
}

impl Drop for Writer {
    /// Closes the queue and waits for the thread, so the connection is
    /// closed (and the WAL checkpointed) when the last store handle is gone.
    fn drop(&mut self) {
        self.queue.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn write_loop(
    mut conn: Connection,
    queue: mpsc::Receiver<Box<dyn WriteJob>>,
    path: &Path,
    opts: &SqliteOptions,
) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let committed = with_retry(opts, path, || {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            for job in &mut batch {
                job.run(&tx, path)?;
            }
            tx.commit()?;
            Ok(())
        });
        let committed = committed.map_err(Arc::new);
        for job in batch {
            job.finish(match &committed {
                Ok(()) => Ok(()),
                Err(e) => Err(same_error(e)),
            });
        }
    }
}

/// One batch failure told to each of its operations.
fn same_error(e: &StoreError) -> StoreError {
    match e {
        StoreError::Busy => StoreError::Busy,
        other => StoreError::Database(other.to_string()),
    }
}

/// A queued write operation with its outcome and its reply.
trait WriteJob: Send {
    /// Runs the operation inside the batch's transaction and keeps its
    /// outcome. Returns an error only when the whole batch must be retried
    /// (the database was busy).
    fn run(&mut self, tx: &Transaction<'_>, path: &Path) -> OpResult<()>;
    /// Replies: the kept outcome if the batch committed, else `failed`.
    fn finish(self: Box<Self>, committed: Result<(), StoreError>);
}

struct Job<T, F> {
    op: F,
    outcome: Option<Result<T, StoreError>>,
    reply: Option<tokio::sync::oneshot::Sender<Result<T, StoreError>>>,
}

impl<T, F> WriteJob for Job<T, F>
where
    T: Send + 'static,
    F: Fn(&Transaction<'_>) -> OpResult<T> + Send + 'static,
{
    fn run(&mut self, tx: &Transaction<'_>, path: &Path) -> OpResult<()> {
        tx.execute_batch("SAVEPOINT op")?;
        // A panicking operation is a bug; it must cost only its own write,
        // not the writer thread every later write depends on.
        let result =
            std::panic::catch_unwind(AssertUnwindSafe(|| (self.op)(tx))).unwrap_or_else(|_| {
                Err(OpError::Store(StoreError::Database(
                    "a database operation panicked".to_owned(),
                )))
            });
        match result {
            Ok(value) => {
                tx.execute_batch("RELEASE op")?;
                self.outcome = Some(Ok(value));
            }
            Err(e) if is_busy(&e) => return Err(e),
            Err(e) => {
                tx.execute_batch("ROLLBACK TO op; RELEASE op")?;
                self.outcome = Some(Err(match e {
                    OpError::Store(e) => e,
                    sql => to_store_error(sql, path),
                }));
            }
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>, committed: Result<(), StoreError>) {
        let result = match committed {
            Ok(()) => self.outcome.take().unwrap_or_else(|| {
                Err(StoreError::Database(
                    "a database operation did not run".to_owned(),
                ))
            }),
            Err(e) => Err(e),
        };
        if let Some(reply) = self.reply.take() {
            // The caller may have gone away; its write stands regardless.
            let _ = reply.send(result);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connections(dir: &Path) -> Connections {
        let path = dir.join("w.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (v TEXT UNIQUE);")
            .unwrap();
        Connections::new(path, SqliteOptions::default(), conn)
    }

    fn insert(v: &'static str) -> impl Fn(&Transaction<'_>) -> OpResult<usize> + Send + 'static {
        move |tx| {
            tx.execute("INSERT INTO t (v) VALUES (?1)", [v])?;
            Ok(1)
        }
    }

    fn read_now<T: Send + 'static>(
        conns: &Connections,
        op: impl Fn(&Transaction<'_>) -> OpResult<T> + Send + 'static,
    ) -> tokio::sync::oneshot::Receiver<Result<T, StoreError>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        conns.read(op, tx);
        rx
    }

    /// However many reads arrive at once, they run on the reader threads
    /// and nowhere else: the number of threads touching SQLite (and their
    /// allocator arenas) stays fixed.
    #[tokio::test]
    async fn reads_run_on_the_fixed_reader_threads() {
        let dir = tempfile::tempdir().unwrap();
        let conns = connections(dir.path());
        let pending: Vec<_> = (0..64)
            .map(|_| {
                read_now(&conns, |tx| {
                    std::thread::sleep(Duration::from_millis(1));
                    let n: i64 = tx.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?;
                    Ok((std::thread::current().name().map(str::to_owned), n))
                })
            })
            .collect();
        let mut threads = std::collections::HashSet::new();
        for reply in pending {
            let (name, n) = reply.await.unwrap().unwrap();
            assert_eq!(n, 0);
            threads.insert(name.unwrap_or_default());
        }
        assert!(
            !threads.is_empty() && threads.len() <= SqliteOptions::default().readers,
            "{threads:?}"
        );
        assert!(
            threads.iter().all(|t| t.starts_with("talaria-db-reader-")),
            "{threads:?}"
        );
    }

    /// A read that panics (a bug) fails alone; the thread it ran on goes
    /// on serving reads.
    #[tokio::test]
    async fn a_panicking_read_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let conns = connections(dir.path());
        let failed = read_now(&conns, |_tx| -> OpResult<()> { panic!("a bug in a read") })
            .await
            .unwrap();
        match failed {
            Err(StoreError::Database(msg)) => assert!(msg.contains("panicked"), "{msg}"),
            other => panic!("expected a database error, got {other:?}"),
        }
        for _ in 0..2 * SqliteOptions::default().readers {
            let n = read_now(&conns, |tx| {
                Ok(tx.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))?)
            })
            .await
            .unwrap()
            .unwrap();
            assert_eq!(n, 0);
        }
    }

    /// Four operations queued while a fifth holds the writer are taken as
    /// one batch: the last of them looks from another connection and sees
    /// the fifth's row (committed) but not the first of the four's (not
    /// committed yet), which it would if each operation were committed
    /// alone. The good ones are committed; the failing and the panicking
    /// one are undone, alone.
    #[tokio::test]
    async fn one_batch_commits_the_good_operations_and_undoes_only_the_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        let conns = connections(dir.path());
        // The first operation holds the writer until the others are
        // queued, so they are taken as one batch behind it.
        let (started_tx, started) = std::sync::mpsc::channel::<()>();
        let (queued_tx, queued) = std::sync::mpsc::channel::<()>();
        let (slow_tx, slow) = tokio::sync::oneshot::channel();
        conns.write(
            move |tx: &Transaction<'_>| {
                let _ = started_tx.send(());
                let _ = queued.recv_timeout(Duration::from_secs(30));
                tx.execute("INSERT INTO t (v) VALUES ('slow')", [])?;
                Ok(())
            },
            slow_tx,
        );
        // Its batch is closed once it runs: the rest make the next one.
        started.recv_timeout(Duration::from_secs(30)).unwrap();
        let path = dir.path().join("w.db");
        let mut replies = Vec::new();
        for op in 0..4 {
            let (tx, rx) = tokio::sync::oneshot::channel();
            match op {
                0 => conns.write(insert("a"), tx),
                // Writes a row, then fails: its row must not survive.
                1 => conns.write(
                    |tx: &Transaction<'_>| -> OpResult<usize> {
                        tx.execute("INSERT INTO t (v) VALUES ('half')", [])?;
                        tx.execute("INSERT INTO t (v) VALUES ('a')", [])?;
                        Ok(2)
                    },
                    tx,
                ),
                2 => conns.write(
                    |_: &Transaction<'_>| -> OpResult<usize> { panic!("a bug in an operation") },
                    tx,
                ),
                // Writes, then counts as another connection sees them the
                // slow row (tens) and the batch's first row (units).
                _ => {
                    let path = path.clone();
                    conns.write(
                        move |tx: &Transaction<'_>| -> OpResult<usize> {
                            tx.execute("INSERT INTO t (v) VALUES ('b')", [])?;
                            let outside = Connection::open(&path)?;
                            let seen: i64 = outside.query_row(
                                "SELECT 10 * count(*) FILTER (WHERE v = 'slow') \
                                        + count(*) FILTER (WHERE v = 'a') FROM t",
                                [],
                                |r| r.get(0),
                            )?;
                            Ok(usize::try_from(seen).unwrap_or(usize::MAX))
                        },
                        tx,
                    )
                }
            }
            replies.push(rx);
        }
        queued_tx.send(()).unwrap();
        slow.await.unwrap().unwrap();
        let mut outcomes = Vec::new();
        for r in replies {
            outcomes.push(r.await.unwrap().ok());
        }
        // `b` saw the slow row, committed in its own batch, and not `a`:
        // `a` and `b` were in one transaction, not yet committed.
        assert_eq!(outcomes, vec![Some(1), None, None, Some(10)]);
        let (rx_tx, rx) = tokio::sync::oneshot::channel();
        conns.write(
            |tx: &Transaction<'_>| -> OpResult<Vec<String>> {
                let mut stmt = tx.prepare("SELECT v FROM t ORDER BY v")?;
                let rows = stmt.query_map([], |r| r.get(0))?;
                Ok(rows.collect::<rusqlite::Result<Vec<String>>>()?)
            },
            rx_tx,
        );
        assert_eq!(rx.await.unwrap().unwrap(), vec!["a", "b", "slow"]);
    }

    #[tokio::test]
    async fn dropping_the_last_handle_closes_the_connection() {
        let dir = tempfile::tempdir().unwrap();
        let conns = connections(dir.path());
        let (tx, rx) = tokio::sync::oneshot::channel();
        conns.write(insert("x"), tx);
        rx.await.unwrap().unwrap();
        drop(conns);
        // The writer closed the file: SQLite removed the WAL on close.
        assert!(!dir.path().join("w.db-wal").exists());
    }
}
