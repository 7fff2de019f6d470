//! Session routes on PostgreSQL: session key → current session, shared by
//! every node.
//!
//! Semantics are the SQLite backend's (`src/sqlite/gateway.rs`): touching
//! a key without a route does nothing, and the expiry scan walks the
//! `updated_at` index. Every stamp is the server's clock, so the expiry
//! guard compares times from one clock whichever node wrote them.

use async_trait::async_trait;
use tokio_postgres::Row;

use super::rows::{clean, sql_len};
use super::{NOW, PostgresStore};
use crate::gateway::{Route, RouteStore};
use crate::{Result, Timestamp};

/// DDL for routes (part of schema step 1).
pub(super) const SCHEMA: &str = r#"
CREATE TABLE gateway_routes (
    session_key text PRIMARY KEY,
    session_id  text NOT NULL,
    created_at  double precision NOT NULL,
    updated_at  double precision NOT NULL
);
-- The expiry scan's order, so it reads the oldest routes first and stops.
CREATE INDEX gateway_routes_updated ON gateway_routes (updated_at, session_key);
"#;

/// Route columns, in the order [`PostgresStore::route_from_row`] reads them.
const ROUTE_COLUMNS: &str = "r.session_key, r.session_id, r.created_at, r.updated_at";

impl PostgresStore {
    fn route_from_row(&self, row: &Row) -> Result<Route> {
        Ok(Route {
            session_key: self.column(row, 0)?,
            session_id: self.column(row, 1)?,
            created_at: self.column(row, 2)?,
            updated_at: self.column(row, 3)?,
        })
    }
}

#[async_trait]
impl RouteStore for PostgresStore {
    async fn route(&self, session_key: &str) -> Result<Option<Route>> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&format!(
                "SELECT {ROUTE_COLUMNS} FROM gateway_routes r WHERE r.session_key = $1"
            ))
            .await
            .map_err(|e| self.error(e))?;
        let row = client
            .query_opt(&statement, &[&clean(session_key).as_ref()])
            .await
            .map_err(|e| self.error(e))?;
        row.map(|row| self.route_from_row(&row)).transpose()
    }

    async fn set_route(&self, session_key: &str, session_id: &str) -> Result<()> {
        let client = self.client().await?;
        // The clock is read once, so both stamps are the same instant.
        let statement = client
            .prepare_cached(&format!(
                "INSERT INTO gateway_routes (session_key, session_id, created_at, updated_at) \
                 SELECT $1, $2, t.at, t.at FROM (SELECT {NOW} AS at) t \
                 ON CONFLICT (session_key) DO UPDATE SET session_id = excluded.session_id, \
                 created_at = excluded.created_at, updated_at = excluded.updated_at"
            ))
            .await
            .map_err(|e| self.error(e))?;
        client
            .execute(
                &statement,
                &[&clean(session_key).as_ref(), &clean(session_id).as_ref()],
            )
            .await
            .map_err(|e| self.error(e))?;
        Ok(())
    }

    async fn touch_route(&self, session_key: &str) -> Result<()> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&format!(
                "UPDATE gateway_routes SET updated_at = {NOW} WHERE session_key = $1"
            ))
            .await
            .map_err(|e| self.error(e))?;
        client
            .execute(&statement, &[&clean(session_key).as_ref()])
            .await
            .map_err(|e| self.error(e))?;
        Ok(())
    }

    async fn stale_routes(&self, before: Timestamp, limit: usize) -> Result<Vec<Route>> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&format!(
                "SELECT {ROUTE_COLUMNS} \
                 FROM gateway_routes r JOIN sessions s ON s.id = r.session_id \
                 WHERE r.updated_at < $1 \
                 AND (s.ended_at IS NULL OR s.ended_at < r.updated_at) \
                 ORDER BY r.updated_at, r.session_key LIMIT $2"
            ))
            .await
            .map_err(|e| self.error(e))?;
        let rows = client
            .query(&statement, &[&before, &sql_len(limit)])
            .await
            .map_err(|e| self.error(e))?;
        rows.iter().map(|row| self.route_from_row(row)).collect()
    }

    /// One `UPDATE` whose `WHERE` is the guard. Under READ COMMITTED a
    /// second caller blocks on the first one's row lock, then re-checks
    /// the guard against the committed row, finds the new `ended_at` and
    /// changes nothing: of racing callers on any nodes, exactly one wins.
    async fn end_route_session(&self, route: &Route, reason: &str) -> Result<bool> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&format!(
                "UPDATE sessions SET ended_at = {NOW}, end_reason = $3 \
                 WHERE id = $1 AND (ended_at IS NULL OR ended_at < $2)"
            ))
            .await
            .map_err(|e| self.error(e))?;
        let changed = client
            .execute(
                &statement,
                &[
                    &clean(&route.session_id).as_ref(),
                    &route.updated_at,
                    &clean(reason).as_ref(),
                ],
            )
            .await
            .map_err(|e| self.error(e))?;
        Ok(changed > 0)
    }
}
