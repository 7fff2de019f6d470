//! The seam between [`copy_store`](super::copy_store) and a backend: a
//! store is read out through a [`Dump`] and written into through a
//! [`Load`], page by page, so the copy itself never sees SQL.

use async_trait::async_trait;

use super::tables::{Row, Table, Value};
use crate::{Result, Timestamp};

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
    /// with [`crate::StoreError::Conflict`]).
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
