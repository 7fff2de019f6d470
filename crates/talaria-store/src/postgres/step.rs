//! One trait method's body on PostgreSQL, as the modules written in steps
//! (`gateway`, `cron`) run it: the body returns a [`Step`], whose error is
//! either the driver's or one already decided, and [`settle`] turns it
//! into the public error once, naming the server. Beside it, the checked
//! conversions of the columns those bodies read.

use tokio_postgres::Row;
use tokio_postgres::types::FromSql;

use super::PostgresStore;
use crate::{Result, StoreError};

/// What can go wrong inside one trait method: the driver's error (turned
/// into the public type by [`settle`], which knows the server's name) or
/// one already decided (a conflict, an unreadable row).
pub(super) enum StepError {
    Pg(tokio_postgres::Error),
    Store(StoreError),
}

impl From<tokio_postgres::Error> for StepError {
    fn from(e: tokio_postgres::Error) -> StepError {
        StepError::Pg(e)
    }
}

impl From<StoreError> for StepError {
    fn from(e: StoreError) -> StepError {
        StepError::Store(e)
    }
}

/// The result of the body of a trait method.
pub(super) type Step<T> = std::result::Result<T, StepError>;

/// A method body's result in the public type.
pub(super) fn settle<T>(store: &PostgresStore, step: Step<T>) -> Result<T> {
    step.map_err(|e| match e {
        StepError::Pg(e) => store.error(e),
        StepError::Store(e) => e,
    })
}

/// Column `index` of `row`; a type the column cannot hold is a database
/// error rather than the driver's panic.
pub(super) fn column<'a, T: FromSql<'a>>(row: &'a Row, index: usize) -> Result<T> {
    row.try_get(index)
        .map_err(|e| StoreError::Database(format!("cannot read a row from PostgreSQL: {e}")))
}

/// A `bigint` counter as the trait's `u64`.
pub(super) fn count_u64(n: i64, what: &str) -> Result<u64> {
    u64::try_from(n)
        .map_err(|_| StoreError::Database(format!("{what} reads {n}, which is not a count")))
}

/// An `integer` counter as the trait's `u32`.
pub(super) fn count_u32(n: i32, what: &str) -> Result<u32> {
    u32::try_from(n)
        .map_err(|_| StoreError::Database(format!("{what} reads {n}, which is not a count")))
}

/// A caller's `usize` (a limit, a count to keep) as a `bigint` parameter:
/// nothing has more rows than `i64::MAX`, so clamping loses nothing.
pub(super) fn sql_limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_that_do_not_fit_are_errors() {
        assert_eq!(count_u64(7, "x").ok(), Some(7));
        assert!(count_u64(-1, "x").is_err());
        assert_eq!(count_u32(7, "x").ok(), Some(7));
        assert!(count_u32(-1, "x").is_err());
        assert_eq!(sql_limit(usize::MAX), i64::MAX);
    }
}
