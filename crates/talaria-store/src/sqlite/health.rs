//! What `talaria doctor` learns about a SQLite file without changing it:
//! whether it is ours and at which schema version, how large it and its
//! write-ahead log are, whether its pages are sound, and whether this
//! process could write to it.
//!
//! Nothing here migrates: a doctor that upgraded the file it was asked to
//! examine would hide the very mismatch it should report.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::schema::{APPLICATION_ID, LATEST};
use crate::{Result, StoreError};

/// How long the write probe waits for a gateway's write to finish.
const BUSY_WAIT: Duration = Duration::from_secs(5);

/// The findings about one database file.
#[derive(Debug, Clone)]
pub struct Health {
    /// `PRAGMA user_version`: the schema steps applied.
    pub schema_version: i64,
    /// The schema version this build migrates to.
    pub latest: i64,
    /// The file carries another application's id.
    pub foreign: bool,
    /// `PRAGMA journal_mode` (`wal` for a file Talaria opened).
    pub journal_mode: String,
    /// The main file's size.
    pub bytes: u64,
    /// The write-ahead log's size (0 when there is none).
    pub wal_bytes: u64,
    /// `PRAGMA integrity_check`: `Ok` or the damage it lists.
    pub integrity: std::result::Result<(), String>,
    /// Whether a write transaction can begin: `Ok`, or why not.
    pub writable: std::result::Result<(), String>,
}

/// Examines the database at `path`.
///
/// # Errors
/// The file is missing or is not a SQLite database at all.
pub fn inspect(path: &Path) -> Result<Health> {
    let meta = std::fs::metadata(path)?;
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let wal_bytes = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(db)?;
    conn.busy_timeout(BUSY_WAIT).map_err(db)?;
    let schema_version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(db)?;
    let app_id: i32 = conn
        .pragma_query_value(None, "application_id", |r| r.get(0))
        .map_err(db)?;
    let journal_mode: String = conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .map_err(db)?;
    let integrity = integrity(&conn);
    drop(conn);
    Ok(Health {
        schema_version,
        latest: LATEST,
        foreign: app_id != 0 && app_id != APPLICATION_ID,
        journal_mode,
        bytes: meta.len(),
        wal_bytes,
        integrity,
        writable: writable(path, &meta),
    })
}

/// Up to ten findings of `PRAGMA integrity_check`, or `Ok` for a sound file.
fn integrity(conn: &Connection) -> std::result::Result<(), String> {
    let mut stmt = conn
        .prepare("PRAGMA integrity_check(10)")
        .map_err(|e| e.to_string())?;
    let findings: Vec<String> = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .and_then(|rows| rows.collect())
        .map_err(|e| e.to_string())?;
    match findings.as_slice() {
        [one] if one == "ok" => Ok(()),
        _ => Err(findings.join("; ")),
    }
}

/// Whether the file could be written. The permission bits are read first:
/// root may write a file whose mode says read-only, but the gateway is
/// often not run as root, and the operator who set the mode meant it.
fn writable(path: &Path, meta: &std::fs::Metadata) -> std::result::Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o200 == 0 {
        return Err(format!(
            "the file's mode is {mode:o}: its owner may not write it"
        ));
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    if let Ok(dir_meta) = std::fs::metadata(dir)
        && dir_meta.permissions().mode() & 0o200 == 0
    {
        return Err(format!(
            "its directory {} is read-only, and SQLite keeps its log beside the file",
            dir.display()
        ));
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| e.to_string())?;
    conn.busy_timeout(BUSY_WAIT).map_err(|e| e.to_string())?;
    match conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK;") {
        Ok(()) => Ok(()),
        Err(rusqlite::Error::SqliteFailure(f, _))
            if matches!(
                f.code,
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
            ) =>
        {
            // Another process is writing: the file is writable.
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}

fn db(e: rusqlite::Error) -> StoreError {
    StoreError::Database(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_fresh_store_is_sound_current_and_writable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        drop(crate::SqliteStore::open(&path).unwrap());
        let health = inspect(&path).unwrap();
        assert_eq!(health.schema_version, health.latest);
        assert!(!health.foreign);
        assert_eq!(health.journal_mode, "wal");
        assert!(health.bytes > 0);
        assert_eq!(health.integrity, Ok(()));
        assert_eq!(health.writable, Ok(()));
    }

    #[test]
    fn a_file_without_write_permission_is_reported_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        drop(crate::SqliteStore::open(&path).unwrap());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
        let health = inspect(&path).unwrap();
        let why = health.writable.unwrap_err();
        assert!(why.contains("444"), "{why}");
    }

    #[test]
    fn a_file_that_is_not_a_database_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        std::fs::write(&path, vec![b'x'; 4096]).unwrap();
        assert!(inspect(&path).is_err());
    }
}
