//! The embedded SQLite backend.
//!
//! One file per profile, in WAL mode so readers never wait for the writer.
//! Every trait method runs on tokio's blocking pool: SQLite calls block (on
//! disk, and on other processes' locks), and must not stall the runtime.

mod cluster;
mod conn;
mod copy;
mod cron;
mod gateway;
mod health;
mod ledger;
mod owed;
pub mod probe;
mod rows;
mod schema;
mod search;
mod spend;
mod upkeep;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Transaction, params};
use talaria_core::ids::validate_path_component;
use talaria_core::{Message, Usage};

pub use self::health::{Health, inspect};
// Tuning of the connections, which `conn` owns; public as `SqliteOptions`.
pub use self::conn::SqliteOptions;
use self::conn::{Connections, OpResult, configure, set_cache_kib, with_retry};
use self::rows::{
    MESSAGE_COLUMNS, SESSION_COLUMNS, from_sql_count, insert_message, load_session, now,
    query_messages, require_session, session_exists, session_from_row, to_sql_count,
};
use crate::{
    ImportedSession, NewSession, Result, SearchHit, SearchQuery, SessionFilter, SessionRecord,
    SessionStore, StoreError, StoredMessage,
};

/// The SQLite-backed [`crate::SessionStore`].
///
/// Cloning is cheap and clones share the same connections.
///
/// Conventions beyond the trait's documentation:
/// - `message_count` counts every row stored for the session (it is
///   counted from them), so [`SessionStore::replace_active`] adds the
///   replacement rows to it;
/// - a [`SessionFilter`] with `limit: 0` lists every match;
/// - a [`SearchQuery`] with `limit: 0` returns up to ten sessions;
/// - search covers inactive (compressed-away) rows too;
/// - methods that name a missing session fail with
///   [`StoreError::NoSuchSession`], except [`SessionStore::session`] and
///   [`SessionStore::last_answered_session`], which return `None`, and
///   [`SessionStore::set_title_if_unset`] and
///   [`SessionStore::active_message_counts`] (`false`, 0).
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Connections>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` with default
    /// options, and migrates it to the current schema.
    ///
    /// The parent directory must exist. Blocks while opening; call it from
    /// `spawn_blocking` if the file may be locked by another process.
    ///
    /// # Errors
    /// [`StoreError::Io`] if the parent directory is missing,
    /// [`StoreError::Database`] if the file is not a usable database or was
    /// written by a newer Talaria, [`StoreError::Busy`] if another process
    /// kept it locked throughout.
    pub fn open(path: &Path) -> Result<SqliteStore> {
        SqliteStore::open_with_options(path, SqliteOptions::default())
    }

    /// [`SqliteStore::open`] with explicit tuning.
    ///
    /// # Errors
    /// As for [`SqliteStore::open`].
    pub fn open_with_options(path: &Path, opts: SqliteOptions) -> Result<SqliteStore> {
        if let Some(parent) = path.parent()
            && !parent.as_os_str().is_empty()
            && !parent.is_dir()
        {
            return Err(StoreError::Io(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "cannot open {}: directory {} does not exist",
                    path.display(),
                    parent.display()
                ),
            )));
        }
        let path = path.to_path_buf();
        let writer = with_retry(&opts, &path, || open_writer(&path, &opts))?;
        Ok(SqliteStore {
            inner: Arc::new(Connections::new(path, opts, writer)),
        })
    }

    /// The database file this store uses.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    async fn write<T, F>(&self, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(&rusqlite::Transaction<'_>) -> OpResult<T> + Send + 'static,
    {
        let (reply, outcome) = tokio::sync::oneshot::channel();
        // If the caller is cancelled the operation still runs and commits;
        // that is fine, because each operation is atomic on its own.
        self.inner.write(op, reply);
        outcome.await.unwrap_or_else(|_| {
            Err(StoreError::Database(
                "the database writer stopped before answering".to_owned(),
            ))
        })
    }

    async fn read<T, F>(&self, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(&rusqlite::Transaction<'_>) -> OpResult<T> + Send + 'static,
    {
        let (reply, outcome) = tokio::sync::oneshot::channel();
        self.inner.read(op, reply);
        outcome.await.unwrap_or_else(|_| {
            Err(StoreError::Database(
                "the database readers stopped before answering".to_owned(),
            ))
        })
    }
}

fn join<T>(joined: std::result::Result<Result<T>, tokio::task::JoinError>) -> Result<T> {
    joined.unwrap_or_else(|e| {
        Err(StoreError::Database(format!(
            "a database task did not finish: {e}"
        )))
    })
}

/// The page size of new databases. Every commit writes each page it
/// changed to the WAL whole, and a stored message changes a few pages
/// (its table and index leaves, the session row, the id sequence): with
/// SQLite's default of 4096 bytes a turn wrote about 35 kB for 5 kB of
/// data, with 2048 about half. Smaller pages would write less still but
/// make every B-tree deeper and split full-text index blobs further.
pub const PAGE_SIZE: i64 = 2048;

/// WAL pages written before the writer copies them back into the database
/// (SQLite's default is 1,000). Each checkpoint writes every page changed
/// since the last one, and the pages every commit touches (the newest
/// leaves, the session rows, the header) are changed again between any two
/// checkpoints: the longer the interval, the fewer of those writes. 4,000
/// pages of 2 KiB cut the bytes written per turn by about 7 % for a WAL of
/// at most 8 MB.
pub const CHECKPOINT_PAGES: i64 = 4000;

fn open_writer(path: &Path, opts: &SqliteOptions) -> OpResult<Connection> {
    // No URI flag (rusqlite's default has it): a profile path that happens
    // to start with `file:` must stay a plain path.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = Connection::open_with_flags(path, flags)?;
    configure(&conn, opts)?;
    set_cache_kib(&conn, opts.writer_cache_kib)?;
    // Takes effect only while the file is new (an existing database keeps
    // its page size), so it must come before anything creates a table.
    conn.pragma_update(None, "page_size", PAGE_SIZE)?;
    conn.pragma_update(None, "wal_autocheckpoint", CHECKPOINT_PAGES)?;
    // The first statement that reads the file; a non-database fails here.
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!(path = %path.display(), mode, "could not switch database to WAL");
    }
    schema::migrate(&mut conn)?;
    Ok(conn)
}

/// Inserts one message row of an existing session.
pub(crate) fn append_row(
    tx: &Transaction<'_>,
    id: &str,
    message: &Message,
    timestamp: f64,
) -> OpResult<i64> {
    require_session(tx, id)?;
    insert_message(tx, id, message, timestamp)
}

/// Adds `usage` to a session's token counters.
pub(crate) fn add_usage_row(tx: &Transaction<'_>, id: &str, usage: &Usage) -> OpResult<()> {
    // Read, add in Rust with saturation, write back: SQLite would silently
    // turn an overflowing integer sum into a float.
    let current = tx
        .prepare_cached(
            "SELECT input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, \
             reasoning_tokens FROM sessions WHERE id = ?1",
        )?
        .query_row(params![id], |r| {
            Ok(Usage {
                input_tokens: from_sql_count(r.get(0)?),
                output_tokens: from_sql_count(r.get(1)?),
                cache_read_tokens: from_sql_count(r.get(2)?),
                cache_write_tokens: from_sql_count(r.get(3)?),
                reasoning_tokens: from_sql_count(r.get(4)?),
            })
        })
        .optional()?
        .ok_or_else(|| StoreError::NoSuchSession(id.to_owned()))?;
    let total = Usage {
        input_tokens: current.input_tokens.saturating_add(usage.input_tokens),
        output_tokens: current.output_tokens.saturating_add(usage.output_tokens),
        cache_read_tokens: current
            .cache_read_tokens
            .saturating_add(usage.cache_read_tokens),
        cache_write_tokens: current
            .cache_write_tokens
            .saturating_add(usage.cache_write_tokens),
        reasoning_tokens: current
            .reasoning_tokens
            .saturating_add(usage.reasoning_tokens),
    };
    tx.prepare_cached(
        "UPDATE sessions SET input_tokens = ?2, output_tokens = ?3, \
         cache_read_tokens = ?4, cache_write_tokens = ?5, reasoning_tokens = ?6 \
         WHERE id = ?1",
    )?
    .execute(params![
        id,
        to_sql_count(total.input_tokens),
        to_sql_count(total.output_tokens),
        to_sql_count(total.cache_read_tokens),
        to_sql_count(total.cache_write_tokens),
        to_sql_count(total.reasoning_tokens),
    ])?;
    Ok(())
}

/// Fails with [`StoreError::NoSuchSession`] unless exactly one row changed.
fn changed_one(changed: usize, id: &str) -> OpResult<()> {
    if changed == 0 {
        Err(StoreError::NoSuchSession(id.to_string()).into())
    } else {
        Ok(())
    }
}

fn sql_len(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[async_trait]
impl SessionStore for SqliteStore {
    async fn create_session(&self, session: NewSession) -> Result<()> {
        validate_path_component(&session.id)?;
        if let Some(parent) = &session.parent_session_id {
            validate_path_component(parent)?;
        }
        let started_at = now();
        self.write(move |tx| {
            if session_exists(tx, &session.id)? {
                return Err(StoreError::Database(format!(
                    "session `{}` already exists",
                    session.id
                ))
                .into());
            }
            tx.prepare_cached(
                "INSERT INTO sessions (id, source, session_key, chat_id, user_id, thread_id, \
                 model, system_prompt, parent_session_id, started_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )?
            .execute(params![
                session.id,
                session.source,
                session.session_key,
                session.chat_id,
                session.user_id,
                session.thread_id,
                session.model,
                session.system_prompt,
                session.parent_session_id,
                started_at,
            ])?;
            Ok(())
        })
        .await
    }

    async fn session(&self, id: &str) -> Result<Option<SessionRecord>> {
        let id = id.to_string();
        self.read(move |tx| load_session(tx, &id)).await
    }

    async fn set_title(&self, id: &str, title: &str) -> Result<()> {
        let (id, title) = (id.to_string(), title.to_string());
        self.write(move |tx| {
            let n = tx
                .prepare_cached("UPDATE sessions SET title = ?2 WHERE id = ?1")?
                .execute(params![id, title])?;
            changed_one(n, &id)
        })
        .await
    }

    async fn set_title_if_unset(&self, id: &str, title: &str) -> Result<bool> {
        let (id, title) = (id.to_string(), title.to_string());
        self.write(move |tx| {
            let n = tx
                .prepare_cached("UPDATE sessions SET title = ?2 WHERE id = ?1 AND title IS NULL")?
                .execute(params![id, title])?;
            Ok(n == 1)
        })
        .await
    }

    async fn set_model_choice(&self, id: &str, choice: Option<&str>) -> Result<()> {
        let (id, choice) = (id.to_string(), choice.map(str::to_owned));
        self.write(move |tx| {
            let n = tx
                .prepare_cached("UPDATE sessions SET model_choice = ?2 WHERE id = ?1")?
                .execute(params![id, choice])?;
            changed_one(n, &id)
        })
        .await
    }

    async fn set_system_prompt(&self, id: &str, prompt: &str) -> Result<()> {
        let (id, prompt) = (id.to_string(), prompt.to_string());
        self.write(move |tx| {
            let n = tx
                .prepare_cached("UPDATE sessions SET system_prompt = ?2 WHERE id = ?1")?
                .execute(params![id, prompt])?;
            changed_one(n, &id)
        })
        .await
    }

    async fn end_session(&self, id: &str, reason: &str) -> Result<()> {
        let (id, reason) = (id.to_string(), reason.to_string());
        let ended_at = now();
        self.write(move |tx| {
            let n = tx
                .prepare_cached("UPDATE sessions SET ended_at = ?2, end_reason = ?3 WHERE id = ?1")?
                .execute(params![id, ended_at, reason])?;
            changed_one(n, &id)
        })
        .await
    }

    async fn append_message(&self, session_id: &str, message: &Message) -> Result<i64> {
        let (id, message) = (session_id.to_string(), message.clone());
        let timestamp = now();
        self.write(move |tx| append_row(tx, &id, &message, timestamp))
            .await
    }

    async fn add_usage(&self, session_id: &str, usage: &Usage) -> Result<()> {
        let (id, usage) = (session_id.to_string(), *usage);
        self.write(move |tx| add_usage_row(tx, &id, &usage)).await
    }

    async fn append_message_with_usage(
        &self,
        session_id: &str,
        message: &Message,
        usage: &Usage,
    ) -> Result<i64> {
        let (id, message, usage) = (session_id.to_string(), message.clone(), *usage);
        let timestamp = now();
        self.write(move |tx| {
            let row = append_row(tx, &id, &message, timestamp)?;
            if usage != Usage::default() {
                add_usage_row(tx, &id, &usage)?;
            }
            Ok(row)
        })
        .await
    }

    async fn add_calls(&self, session_id: &str, calls: &[crate::ModelCall]) -> Result<()> {
        let (id, calls) = (session_id.to_string(), calls.to_vec());
        let at = now();
        self.write(move |tx| spend::record_calls(tx, &id, &calls, at))
            .await
    }

    async fn append_message_with_calls(
        &self,
        session_id: &str,
        message: &Message,
        calls: &[crate::ModelCall],
    ) -> Result<i64> {
        let (id, message, calls) = (session_id.to_string(), message.clone(), calls.to_vec());
        let timestamp = now();
        self.write(move |tx| {
            let row = append_row(tx, &id, &message, timestamp)?;
            spend::record_calls(tx, &id, &calls, timestamp)?;
            Ok(row)
        })
        .await
    }

    async fn session_cost_micros(&self, session_id: &str) -> Result<u64> {
        let id = session_id.to_string();
        self.read(move |tx| spend::session_cost(tx, &id)).await
    }

    async fn spend_since(&self, since: f64, scope: &crate::SpendScope) -> Result<u64> {
        let scope = scope.clone();
        self.read(move |tx| spend::spend_since(tx, since, &scope))
            .await
    }

    async fn usage_report(&self, since: f64, top: usize) -> Result<crate::UsageReport> {
        self.read(move |tx| spend::usage_report(tx, since, top))
            .await
    }

    async fn messages(&self, session_id: &str) -> Result<Vec<StoredMessage>> {
        let id = session_id.to_string();
        self.read(move |tx| {
            require_session(tx, &id)?;
            query_messages(
                tx,
                &format!(
                    "SELECT {MESSAGE_COLUMNS} FROM messages \
                     WHERE session_id = ?1 AND active = 1 ORDER BY id"
                ),
                params![id],
            )
        })
        .await
    }

    async fn messages_page(
        &self,
        session_id: &str,
        after_id: i64,
        limit: usize,
    ) -> Result<Vec<StoredMessage>> {
        let id = session_id.to_string();
        self.read(move |tx| {
            require_session(tx, &id)?;
            query_messages(
                tx,
                &format!(
                    "SELECT {MESSAGE_COLUMNS} FROM messages \
                     WHERE session_id = ?1 AND active = 1 AND id > ?2 ORDER BY id LIMIT ?3"
                ),
                params![id, after_id, sql_len(limit)],
            )
        })
        .await
    }

    async fn delete_session(&self, id: &str) -> Result<bool> {
        let id = id.to_string();
        self.write(move |tx| upkeep::delete_session(tx, &id)).await
    }

    async fn delete_session_if_idle(
        &self,
        id: &str,
        idle_before: crate::Timestamp,
    ) -> Result<crate::IdleDeletion> {
        let id = id.to_string();
        self.write(move |tx| upkeep::delete_if_idle(tx, &id, idle_before))
            .await
    }

    async fn session_page(&self, page: crate::SessionPage) -> Result<Vec<crate::SessionActivity>> {
        self.read(move |tx| upkeep::page(tx, &page)).await
    }

    async fn session_stats(&self) -> Result<crate::StoreStats> {
        let path = self.inner.path.clone();
        self.read(move |tx| upkeep::stats(tx, &path)).await
    }

    async fn import_session(&self, session: ImportedSession) -> Result<bool> {
        validate_path_component(&session.record.id)?;
        self.write(move |tx| {
            let r = &session.record;
            if session_exists(tx, &r.id)? {
                return Ok(false);
            }
            tx.prepare_cached(
                "INSERT INTO sessions (id, source, session_key, chat_id, user_id, thread_id, \
                 title, model, system_prompt, parent_session_id, started_at, ended_at, \
                 end_reason, input_tokens, output_tokens, cache_read_tokens, \
                 cache_write_tokens, reasoning_tokens) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, \
                 ?16, ?17, ?18)",
            )?
            .execute(params![
                r.id,
                r.source,
                r.session_key,
                r.chat_id,
                r.user_id,
                r.thread_id,
                r.title,
                r.model,
                r.system_prompt,
                r.parent_session_id,
                r.started_at,
                r.ended_at,
                r.end_reason,
                to_sql_count(r.input_tokens),
                to_sql_count(r.output_tokens),
                to_sql_count(r.cache_read_tokens),
                to_sql_count(r.cache_write_tokens),
                to_sql_count(r.reasoning_tokens),
            ])?;
            for row in &session.messages {
                let id = insert_message(tx, &r.id, &row.message, row.timestamp)?;
                if !row.active {
                    tx.prepare_cached("UPDATE messages SET active = 0 WHERE id = ?1")?
                        .execute(params![id])?;
                }
            }
            Ok(true)
        })
        .await
    }

    async fn message_window(
        &self,
        session_id: &str,
        around_id: i64,
        before: usize,
        after: usize,
    ) -> Result<Vec<StoredMessage>> {
        let id = session_id.to_string();
        self.read(move |tx| {
            require_session(tx, &id)?;
            let mut earlier = query_messages(
                tx,
                &format!(
                    "SELECT {MESSAGE_COLUMNS} FROM messages \
                     WHERE session_id = ?1 AND id < ?2 ORDER BY id DESC LIMIT ?3"
                ),
                params![id, around_id, sql_len(before)],
            )?;
            earlier.reverse();
            let rest = query_messages(
                tx,
                &format!(
                    "SELECT {MESSAGE_COLUMNS} FROM messages \
                     WHERE session_id = ?1 AND id >= ?2 ORDER BY id LIMIT ?3"
                ),
                // The anchor itself plus `after` rows; if the anchor id is
                // not in this session, this is simply the next rows.
                params![id, around_id, sql_len(after).saturating_add(1)],
            )?;
            earlier.extend(rest);
            Ok(earlier)
        })
        .await
    }

    async fn replace_active(&self, session_id: &str, replacement: &[Message]) -> Result<()> {
        let (id, replacement) = (session_id.to_string(), replacement.to_vec());
        let timestamp = now();
        self.write(move |tx| {
            require_session(tx, &id)?;
            tx.prepare_cached(
                "UPDATE messages SET active = 0 WHERE session_id = ?1 AND active = 1",
            )?
            .execute(params![id])?;
            for message in &replacement {
                insert_message(tx, &id, message, timestamp)?;
            }
            Ok(())
        })
        .await
    }

    async fn list_sessions(&self, filter: SessionFilter) -> Result<Vec<SessionRecord>> {
        self.read(move |tx| {
            // Built per call so each filter shape can use its own index.
            let mut sql = format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE 1 = 1");
            let mut values: Vec<rusqlite::types::Value> = Vec::new();
            if let Some(source) = &filter.source {
                sql.push_str(" AND source = ?");
                values.push(source.clone().into());
            }
            if let Some(key) = &filter.session_key {
                sql.push_str(" AND session_key = ?");
                values.push(key.clone().into());
            }
            sql.push_str(" ORDER BY started_at DESC, rowid DESC LIMIT ? OFFSET ?");
            // SQLite reads a negative LIMIT as "no limit".
            let limit = if filter.limit == 0 {
                -1
            } else {
                sql_len(filter.limit)
            };
            values.push(limit.into());
            values.push(sql_len(filter.offset).into());
            let sessions = tx
                .prepare_cached(&sql)?
                .query_map(rusqlite::params_from_iter(values), session_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(sessions)
        })
        .await
    }

    async fn last_answered_session(&self, sources: &[&str]) -> Result<Option<SessionRecord>> {
        let sources: Vec<String> = sources.iter().map(|s| (*s).to_owned()).collect();
        self.read(move |tx| {
            use rusqlite::OptionalExtension;
            if sources.is_empty() {
                return Ok(None);
            }
            let marks = vec!["?"; sources.len()].join(", ");
            // Newest rows first: the answer sought is usually among the
            // last few rows written.
            let sql = format!(
                "SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ( \
                   SELECT m.session_id FROM messages m JOIN sessions s ON s.id = m.session_id \
                   WHERE s.source IN ({marks}) AND m.role = 'assistant' AND m.active = 1 \
                   ORDER BY m.id DESC LIMIT 1)"
            );
            Ok(tx
                .prepare_cached(&sql)?
                .query_row(rusqlite::params_from_iter(&sources), session_from_row)
                .optional()?)
        })
        .await
    }

    async fn session_sources(&self) -> Result<Vec<(String, u64)>> {
        self.read(|tx| {
            let sources = tx
                .prepare_cached(
                    "SELECT source, count(*) AS n FROM sessions GROUP BY source \
                     ORDER BY n DESC, source",
                )?
                .query_map([], |row| {
                    let n: i64 = row.get(1)?;
                    Ok((row.get::<_, String>(0)?, u64::try_from(n).unwrap_or(0)))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(sources)
        })
        .await
    }

    async fn active_message_counts(&self, ids: &[String]) -> Result<Vec<u64>> {
        let ids = ids.to_vec();
        self.read(move |tx| {
            let mut count = tx.prepare_cached(
                "SELECT count(*) FROM messages WHERE session_id = ?1 AND active = 1",
            )?;
            ids.iter()
                .map(|id| {
                    let n: i64 = count.query_row(params![id], |row| row.get(0))?;
                    Ok(u64::try_from(n).unwrap_or(0))
                })
                .collect()
        })
        .await
    }

    async fn search(&self, query: SearchQuery) -> Result<Vec<SearchHit>> {
        // Rows written since the last batch are indexed first, so a search
        // sees every stored message. Usually nothing or a few rows.
        self.write(|tx| rows::index_pending(tx)).await?;
        self.read(move |tx| search::search(tx, &query)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache_size(tx: &rusqlite::Transaction<'_>) -> OpResult<i64> {
        Ok(tx.query_row("PRAGMA cache_size", [], |r| r.get(0))?)
    }

    #[tokio::test]
    async fn each_connection_gets_its_bounded_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let opts = SqliteOptions {
            writer_cache_kib: 3000,
            reader_cache_kib: 300,
            ..SqliteOptions::default()
        };
        let store = SqliteStore::open_with_options(&dir.path().join("s.db"), opts).unwrap();
        assert_eq!(store.write(cache_size).await.unwrap(), -3000);
        assert_eq!(store.read(cache_size).await.unwrap(), -300);
    }
}
