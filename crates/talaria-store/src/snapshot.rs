//! A consistent copy of a live SQLite database, for backups.
//!
//! SQLite's online backup API copies every page of the database in one
//! step under a read transaction, so the copy is the database as of one
//! moment even while a gateway writes to it (WAL mode lets the writer go
//! on meanwhile). The copy is then checked (`PRAGMA integrity_check`) and
//! switched out of WAL, so it is one self-contained file.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::backup::{Backup, StepResult};
use rusqlite::{Connection, OpenFlags};

use crate::{Result, StoreError};

/// How long the copy waits for a writer's lock before giving up.
const BUSY_WAIT: Duration = Duration::from_secs(30);

fn db(e: rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(
                f.code,
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
            ) =>
        {
            StoreError::Busy
        }
        other => StoreError::Database(other.to_string()),
    }
}

/// Copies the database at `src` into a new file `dest` (which must not
/// exist), as of one moment, and checks the copy.
///
/// # Errors
/// `src` is not a database, `dest` exists or cannot be written, or the
/// copy fails its integrity check.
pub fn snapshot_sqlite(src: &Path, dest: &Path) -> Result<()> {
    if dest.exists() {
        return Err(StoreError::Conflict(format!(
            "{} exists already",
            dest.display()
        )));
    }
    let source = Connection::open_with_flags(
        src,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(db)?;
    source.busy_timeout(BUSY_WAIT).map_err(db)?;
    let mut copy = Connection::open(dest).map_err(db)?;
    {
        let backup = Backup::new(&source, &mut copy).map_err(db)?;
        let started = Instant::now();
        // -1: every page in one step, so no writer can come in between.
        loop {
            match backup.step(-1).map_err(db)? {
                StepResult::Done => break,
                StepResult::More => {}
                _ if started.elapsed() > BUSY_WAIT => return Err(StoreError::Busy),
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
    copy.pragma_update(None, "journal_mode", "DELETE")
        .map_err(db)?;
    check_sqlite_conn(&copy)
}

/// Checks the database file at `path` (`PRAGMA integrity_check`).
///
/// # Errors
/// It is not a database, or the check finds damage.
pub fn check_sqlite(path: &Path) -> Result<()> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(db)?;
    check_sqlite_conn(&conn)
}

fn check_sqlite_conn(conn: &Connection) -> Result<()> {
    let verdict: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(db)?;
    if verdict == "ok" {
        Ok(())
    } else {
        Err(StoreError::Database(format!(
            "the database failed its integrity check: {verdict}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_holds_what_was_committed_and_checks_clean() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("a.db");
        let live = Connection::open(&src).unwrap();
        live.pragma_update(None, "journal_mode", "WAL").unwrap();
        live.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1), (2);")
            .unwrap();
        // An open write transaction is not part of the copy.
        live.execute_batch("BEGIN; INSERT INTO t VALUES (3);")
            .unwrap();
        let dest = dir.path().join("copy.db");
        snapshot_sqlite(&src, &dest).unwrap();
        live.execute_batch("COMMIT;").unwrap();
        let copy = Connection::open(&dest).unwrap();
        let n: i64 = copy
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2);
        let mode: String = copy
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "delete");
        check_sqlite(&dest).unwrap();
        assert!(matches!(
            snapshot_sqlite(&src, &dest),
            Err(StoreError::Conflict(_))
        ));
        std::fs::write(dir.path().join("junk.db"), b"not a database at all, no").unwrap();
        assert!(check_sqlite(&dir.path().join("junk.db")).is_err());
    }
}
