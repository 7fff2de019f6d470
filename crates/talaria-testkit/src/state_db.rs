//! Moving a session back in time in a home's `state.db`, for tests of
//! what happens to old sessions (`talaria sessions prune`): the store
//! stamps every write with the current time and has no way to write
//! another, so the test changes the stored times here.

use std::path::Path;

/// Moves session `id`'s start, end and every row `days` days back.
///
/// # Panics
/// When the database cannot be opened or the session is not in it.
pub fn age_session(db: &Path, id: &str, days: f64) {
    let conn = match rusqlite::Connection::open(db) {
        Ok(conn) => conn,
        Err(e) => panic!("cannot open {}: {e}", db.display()),
    };
    let secs = days * 86_400.0;
    let moved = conn
        .execute(
            "UPDATE sessions SET started_at = started_at - ?2, ended_at = ended_at - ?2 \
             WHERE id = ?1",
            rusqlite::params![id, secs],
        )
        .unwrap_or_else(|e| panic!("cannot age session {id}: {e}"));
    assert_eq!(moved, 1, "no session {id} in {}", db.display());
    conn.execute(
        "UPDATE messages SET timestamp = timestamp - ?2 WHERE session_id = ?1",
        rusqlite::params![id, secs],
    )
    .unwrap_or_else(|e| panic!("cannot age the rows of session {id}: {e}"));
}
