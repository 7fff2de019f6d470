//! Sessions a page at a time, idle ones deleted, and the counts of what
//! is stored, on PostgreSQL (see `crate::upkeep`). As in
//! `src/sqlite/upkeep.rs`.

use tokio_postgres::types::ToSql;

use super::rows::{SESSION_COLUMNS, clean, sql_len};
use super::{NOW, PostgresStore};
use crate::upkeep::merge_sources;
use crate::{IdleDeletion, Result, SessionActivity, SessionPage, StoreSize, StoreStats, Timestamp};

/// A session's last activity, over `sessions s` (NULLs are skipped by
/// `GREATEST`); the newest row through the `messages_session` index.
const LAST_ACTIVE: &str = "GREATEST(s.started_at, s.ended_at, \
     (SELECT m.\"timestamp\" FROM messages m WHERE m.session_id = s.id \
      ORDER BY m.id DESC LIMIT 1))";

/// Whether a gateway owes session `id` (an SQL expression) a turn: an
/// accepted message of a chat routed to it, or a live turn lease of such
/// a chat.
fn turn_owed(id: &str) -> String {
    format!(
        "(EXISTS (SELECT 1 FROM gateway_routes r \
           JOIN owed_turns o ON o.session_key = r.session_key WHERE r.session_id = {id}) \
         OR EXISTS (SELECT 1 FROM gateway_routes r \
           JOIN cluster_leases l ON l.name = 'turn:' || r.session_key \
           WHERE r.session_id = {id} AND l.lease_until > {NOW}))"
    )
}

/// A count read back as the API's unsigned type; the columns it comes
/// from cannot be negative.
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl PostgresStore {
    /// Deletes session `id`, its transcript and the routes to it inside
    /// `tx`; whether it existed.
    pub(super) async fn delete_session_in(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        id: &str,
    ) -> Result<bool> {
        // The session row first: its lock waits for appends under way and
        // holds back new ones, which then find no session. The transcript
        // (and with it the search columns) goes by the foreign key's
        // cascade.
        let session = tx
            .prepare_cached("DELETE FROM sessions WHERE id = $1")
            .await
            .map_err(|e| self.error(e))?;
        let deleted = tx
            .execute(&session, &[&id])
            .await
            .map_err(|e| self.error(e))?;
        let routes = tx
            .prepare_cached("DELETE FROM gateway_routes WHERE session_id = $1")
            .await
            .map_err(|e| self.error(e))?;
        tx.execute(&routes, &[&id])
            .await
            .map_err(|e| self.error(e))?;
        Ok(deleted > 0)
    }

    /// See [`crate::SessionStore::delete_session_if_idle`].
    pub(super) async fn delete_if_idle(
        &self,
        id: &str,
        idle_before: Timestamp,
    ) -> Result<IdleDeletion> {
        let id = clean(id);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        // Locking the session row orders this with appends, which lock it
        // first too: a row appended before is seen here, one after finds
        // no session.
        let lock = tx
            .prepare_cached(&format!(
                "SELECT {LAST_ACTIVE} FROM sessions s WHERE s.id = $1 FOR UPDATE OF s"
            ))
            .await
            .map_err(|e| self.error(e))?;
        let Some(row) = tx
            .query_opt(&lock, &[&id.as_ref()])
            .await
            .map_err(|e| self.error(e))?
        else {
            return Ok(IdleDeletion::Missing);
        };
        let last: f64 = self.column(&row, 0)?;
        if last >= idle_before {
            return Ok(IdleDeletion::ActiveSince(last));
        }
        let owed = tx
            .prepare_cached(&format!("SELECT {}", turn_owed("$1")))
            .await
            .map_err(|e| self.error(e))?;
        let row = tx
            .query_one(&owed, &[&id.as_ref()])
            .await
            .map_err(|e| self.error(e))?;
        if self.column::<bool>(&row, 0)? {
            return Ok(IdleDeletion::TurnRunning);
        }
        self.delete_session_in(&tx, &id).await?;
        tx.commit().await.map_err(|e| self.error(e))?;
        Ok(IdleDeletion::Deleted)
    }

    /// See [`crate::SessionStore::session_page`].
    pub(super) async fn page(&self, page: SessionPage) -> Result<Vec<SessionActivity>> {
        let after = clean(page.after_id.as_deref().unwrap_or_default()).into_owned();
        let source = page.source.as_deref().map(clean);
        let source_ref = source.as_deref();
        let limit = sql_len(page.limit.max(1));
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&after];
        let mut inner = format!(
            "SELECT {SESSION_COLUMNS}, {LAST_ACTIVE} AS last_active, {} AS turn_owed \
             FROM sessions s WHERE s.id > $1",
            turn_owed("s.id")
        );
        if source_ref.is_some() {
            params.push(&source_ref);
            inner.push_str(&format!(" AND s.source = ${}", params.len()));
        }
        let mut sql = format!("SELECT * FROM ({inner}) p");
        if let Some(before) = &page.idle_before {
            params.push(before);
            sql.push_str(&format!(" WHERE p.last_active < ${}", params.len()));
        }
        params.push(&limit);
        sql.push_str(&format!(" ORDER BY p.id LIMIT ${}::bigint", params.len()));
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&sql)
            .await
            .map_err(|e| self.error(e))?;
        let rows = client
            .query(&statement, &params)
            .await
            .map_err(|e| self.error(e))?;
        rows.iter()
            .map(|row| {
                Ok(SessionActivity {
                    session: self.session_from_row(row, 0)?,
                    last_active: self.column(row, 20)?,
                    turn_owed: self.column(row, 21)?,
                })
            })
            .collect()
    }

    /// See [`crate::SessionStore::session_stats`]: the size is that of
    /// the schema's tables with their indexes.
    pub(super) async fn stats(&self) -> Result<StoreStats> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(
                "SELECT s.source, count(*), min(s.started_at), \
                   max(GREATEST(s.started_at, s.ended_at)) \
                 FROM sessions s GROUP BY s.source",
            )
            .await
            .map_err(|e| self.error(e))?;
        let mut sessions = Vec::new();
        for row in client
            .query(&statement, &[])
            .await
            .map_err(|e| self.error(e))?
        {
            sessions.push((
                self.column::<String>(&row, 0)?,
                count(self.column(&row, 1)?),
                self.column::<Option<f64>>(&row, 2)?,
                self.column::<Option<f64>>(&row, 3)?,
            ));
        }
        let statement = client
            .prepare_cached(
                "SELECT s.source, count(*), count(*) FILTER (WHERE m.active), \
                   max(m.\"timestamp\") \
                 FROM messages m JOIN sessions s ON s.id = m.session_id GROUP BY s.source",
            )
            .await
            .map_err(|e| self.error(e))?;
        let mut rows = Vec::new();
        for row in client
            .query(&statement, &[])
            .await
            .map_err(|e| self.error(e))?
        {
            rows.push((
                self.column::<String>(&row, 0)?,
                count(self.column(&row, 1)?),
                count(self.column(&row, 2)?),
                self.column::<Option<f64>>(&row, 3)?,
            ));
        }
        let statement = client
            .prepare_cached(
                "SELECT current_schema(), coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = current_schema() AND c.relkind = 'r'",
            )
            .await
            .map_err(|e| self.error(e))?;
        let row = client
            .query_one(&statement, &[])
            .await
            .map_err(|e| self.error(e))?;
        let schema: Option<String> = self.column(&row, 0)?;
        let schema = schema.unwrap_or_default();
        let bytes: i64 = self.column(&row, 1)?;
        Ok(StoreStats {
            sources: merge_sources(sessions, rows),
            size: Some(StoreSize {
                what: format!("PostgreSQL schema `{schema}`"),
                bytes: count(bytes),
                log_bytes: None,
            }),
        })
    }
}
