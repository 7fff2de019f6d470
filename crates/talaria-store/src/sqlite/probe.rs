//! Asking a home's `state.db` what an import would find there, without
//! writing: `talaria import --dry-run` must leave the file byte for byte
//! as it was, and opening the store would migrate it and checkpoint its
//! log.

use std::collections::HashSet;
use std::path::Path;

use rusqlite::{Connection, OpenFlags, params};

use crate::{Result, StoreError};

/// What of an import the database holds already.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Present {
    /// Session ids.
    pub sessions: HashSet<String>,
    /// Cron job names.
    pub jobs: HashSet<String>,
    /// Approved users, as (platform, user id).
    pub approvals: HashSet<(String, String)>,
}

/// Opens `path` for reading without changing any file. A read-only
/// connection to a database in WAL mode still creates its `-wal` and
/// `-shm` files, and leaves them behind: when there is no log (no process
/// has the database open, nothing waits to be copied back), the file is
/// opened `immutable`, which creates nothing. When there is one, the
/// files exist already and a plain read-only connection reads the log.
fn open_untouched(path: &Path) -> rusqlite::Result<Connection> {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if Path::new(&wal).exists() {
        return Connection::open_with_flags(path, flags);
    }
    // A URI, so characters it gives a meaning to are escaped.
    let escaped = path
        .to_string_lossy()
        .replace('%', "%25")
        .replace('?', "%3f")
        .replace('#', "%23");
    Connection::open_with_flags(
        format!("file:{escaped}?immutable=1"),
        flags | OpenFlags::SQLITE_OPEN_URI,
    )
}

/// Which of `sessions`, `jobs` (by name) and `approvals` the database at
/// `path` holds, read through a read-only connection.
pub fn present(
    path: &Path,
    sessions: &[String],
    jobs: &[String],
    approvals: &[(String, String)],
) -> Result<Present> {
    let failed =
        |e: rusqlite::Error| StoreError::Database(format!("cannot read {}: {e}", path.display()));
    let conn = open_untouched(path).map_err(failed)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(failed)?;
    let mut found = Present::default();
    let mut stmt = conn
        .prepare("SELECT 1 FROM sessions WHERE id = ?1")
        .map_err(failed)?;
    for id in sessions {
        if stmt.exists(params![id]).map_err(failed)? {
            found.sessions.insert(id.clone());
        }
    }
    let mut stmt = conn
        .prepare("SELECT 1 FROM cron_jobs WHERE name = ?1")
        .map_err(failed)?;
    for name in jobs {
        if stmt.exists(params![name]).map_err(failed)? {
            found.jobs.insert(name.clone());
        }
    }
    let mut stmt = conn
        .prepare("SELECT 1 FROM pairing_approved WHERE platform = ?1 AND user_id = ?2")
        .map_err(failed)?;
    for (platform, user) in approvals {
        if stmt.exists(params![platform, user]).map_err(failed)? {
            found.approvals.insert((platform.clone(), user.clone()));
        }
    }
    Ok(found)
}
