//! Sessions a page at a time, idle ones deleted, and the counts of what
//! is stored, on SQLite (see `crate::upkeep`).

use std::path::Path;

use rusqlite::{OptionalExtension, Transaction, params};

use super::conn::OpResult;
use super::rows::{SESSION_COLUMNS, from_sql_count, now, session_from_row};
use crate::upkeep::merge_sources;
use crate::{IdleDeletion, SessionActivity, SessionPage, StoreSize, StoreStats, Timestamp};

/// A session's last activity, over `sessions`: its newest row is found
/// through the `messages_session` index rather than by reading them all.
const LAST_ACTIVE: &str = "max(sessions.started_at, \
     coalesce(sessions.ended_at, sessions.started_at), \
     coalesce((SELECT m.timestamp FROM messages m WHERE m.session_id = sessions.id \
               ORDER BY m.id DESC LIMIT 1), sessions.started_at))";

/// Whether a gateway owes session `id` (an SQL expression) a turn: an
/// accepted message of a chat routed to it, or a live turn lease of such
/// a chat, measured against `now` (an SQL expression).
fn turn_owed(id: &str, now: &str) -> String {
    format!(
        "(EXISTS (SELECT 1 FROM gateway_routes r \
           JOIN owed_turns o ON o.session_key = r.session_key WHERE r.session_id = {id}) \
         OR EXISTS (SELECT 1 FROM gateway_routes r \
           JOIN cluster_leases l ON l.name = 'turn:' || r.session_key \
           WHERE r.session_id = {id} AND l.lease_until > {now}))"
    )
}

/// Deletes session `id`, its transcript and the routes to it, inside the
/// caller's transaction; whether it existed.
pub(super) fn delete_session(tx: &Transaction<'_>, id: &str) -> OpResult<bool> {
    // Rows first, explicitly: their delete trigger takes them out of the
    // full-text indexes.
    tx.prepare_cached("DELETE FROM messages WHERE session_id = ?1")?
        .execute(params![id])?;
    tx.prepare_cached("DELETE FROM gateway_routes WHERE session_id = ?1")?
        .execute(params![id])?;
    let n = tx
        .prepare_cached("DELETE FROM sessions WHERE id = ?1")?
        .execute(params![id])?;
    Ok(n > 0)
}

/// See [`crate::SessionStore::delete_session_if_idle`]. Runs on the
/// writer, whose transactions are serialized with every append.
pub(super) fn delete_if_idle(
    tx: &Transaction<'_>,
    id: &str,
    idle_before: Timestamp,
) -> OpResult<IdleDeletion> {
    let last: Option<f64> = tx
        .prepare_cached(&format!(
            "SELECT {LAST_ACTIVE} FROM sessions WHERE sessions.id = ?1"
        ))?
        .query_row(params![id], |row| row.get(0))
        .optional()?;
    let Some(last) = last else {
        return Ok(IdleDeletion::Missing);
    };
    if last >= idle_before {
        return Ok(IdleDeletion::ActiveSince(last));
    }
    let owed: bool = tx
        .prepare_cached(&format!("SELECT {}", turn_owed("?1", "?2")))?
        .query_row(params![id, now()], |row| row.get(0))?;
    if owed {
        return Ok(IdleDeletion::TurnRunning);
    }
    delete_session(tx, id)?;
    Ok(IdleDeletion::Deleted)
}

/// See [`crate::SessionStore::session_page`].
pub(super) fn page(tx: &Transaction<'_>, page: &SessionPage) -> OpResult<Vec<SessionActivity>> {
    // Values in the order their `?` appear in the text.
    let mut inner = format!(
        "SELECT {SESSION_COLUMNS}, {LAST_ACTIVE} AS last_active, {} AS turn_owed \
         FROM sessions WHERE id > ?",
        turn_owed("sessions.id", "?")
    );
    let mut values: Vec<rusqlite::types::Value> = vec![
        now().into(),
        page.after_id.clone().unwrap_or_default().into(),
    ];
    if let Some(source) = &page.source {
        inner.push_str(" AND source = ?");
        values.push(source.clone().into());
    }
    // The outer query filters on the computed column, which SQLite does
    // not let a WHERE name at the level it is computed.
    let mut sql = format!("SELECT * FROM ({inner})");
    if let Some(before) = page.idle_before {
        sql.push_str(" WHERE last_active < ?");
        values.push(before.into());
    }
    sql.push_str(" ORDER BY id LIMIT ?");
    values.push(i64::try_from(page.limit.max(1)).unwrap_or(i64::MAX).into());
    let rows = tx
        .prepare_cached(&sql)?
        .query_map(rusqlite::params_from_iter(values), |row| {
            Ok(SessionActivity {
                session: session_from_row(row)?,
                last_active: row.get(20)?,
                turn_owed: row.get(21)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// See [`crate::SessionStore::session_stats`]; `path` is the database
/// file, measured beside the counts.
pub(super) fn stats(tx: &Transaction<'_>, path: &Path) -> OpResult<StoreStats> {
    let sessions = tx
        .prepare_cached(
            "SELECT source, count(*), min(started_at), max(max(started_at, coalesce(ended_at, 0))) \
             FROM sessions GROUP BY source",
        )?
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, Option<f64>>(2)?,
                row.get::<_, Option<f64>>(3)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let sessions = sessions
        .into_iter()
        .map(|(source, n, first, last)| {
            let n = from_sql_count(n);
            (source, n, first, last)
        })
        .collect();
    let rows = tx
        .prepare_cached(
            "SELECT s.source, count(*), coalesce(sum(m.active), 0), max(m.timestamp) \
             FROM messages m JOIN sessions s ON s.id = m.session_id GROUP BY s.source",
        )?
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, i64>(2)?,
                row.get::<_, Option<f64>>(3)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let rows = rows
        .into_iter()
        .map(|(source, all, active, newest)| {
            (source, from_sql_count(all), from_sql_count(active), newest)
        })
        .collect();
    Ok(StoreStats {
        sources: merge_sources(sessions, rows),
        size: size(path),
    })
}

/// The database file's size and its write-ahead log's; `None` when the
/// file cannot be read (the counts are still worth having).
fn size(path: &Path) -> Option<StoreSize> {
    let bytes = std::fs::metadata(path).ok()?.len();
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let log_bytes = std::fs::metadata(Path::new(&wal)).ok().map(|m| m.len());
    Some(StoreSize {
        what: path.display().to_string(),
        bytes,
        log_bytes,
    })
}
