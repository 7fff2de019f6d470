//! Nodes and leases on SQLite: the gateways of one machine sharing one
//! file. Each change is one statement in the writer's transaction.

use async_trait::async_trait;
use rusqlite::types::Type;
use rusqlite::{OptionalExtension, Row, params};

use super::SqliteStore;
use super::rows::{from_sql_count, now};
use crate::cluster::{ClusterStore, LeaseGrant, LeaseRecord, NodeAnnouncement, NodeId, NodeRecord};
use crate::{Result, StoreError, Timestamp};

fn bad(column: usize, ty: Type, what: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(column, ty, Box::new(StoreError::Database(what)))
}

fn node_id(row: &Row<'_>, column: usize) -> rusqlite::Result<NodeId> {
    NodeId::new(row.get::<_, String>(column)?).map_err(|e| bad(column, Type::Text, e.to_string()))
}

const NODE_COLUMNS: &str =
    "id, host, pid, started_at, version, joined_at, heartbeat_at, lease_until";

fn node_from_row(row: &Row<'_>) -> rusqlite::Result<NodeRecord> {
    let pid: i64 = row.get(2)?;
    Ok(NodeRecord {
        id: node_id(row, 0)?,
        host: row.get(1)?,
        pid: u32::try_from(pid).map_err(|_| bad(2, Type::Integer, format!("pid {pid}")))?,
        // Stored bit for bit as SQLite's signed integer; the round trip
        // is exact.
        started_at: row.get::<_, Option<i64>>(3)?.map(|t| t as u64),
        version: row.get(4)?,
        joined_at: row.get(5)?,
        heartbeat_at: row.get(6)?,
        lease_until: row.get(7)?,
    })
}

#[async_trait]
impl ClusterStore for SqliteStore {
    async fn heartbeat(&self, node: &NodeAnnouncement, ttl: f64) -> Result<Timestamp> {
        let node = node.clone();
        self.write(move |tx| {
            let at = now();
            tx.prepare_cached(
                "INSERT INTO cluster_nodes (id, host, pid, started_at, version, joined_at, \
                 heartbeat_at, lease_until) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?6 + ?7) \
                 ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid, \
                 started_at = excluded.started_at, version = excluded.version, \
                 heartbeat_at = excluded.heartbeat_at, lease_until = excluded.lease_until",
            )?
            .execute(params![
                node.id.as_str(),
                node.host,
                node.pid,
                node.started_at.map(|t| t as i64),
                node.version,
                at,
                ttl
            ])?;
            Ok(at)
        })
        .await
    }

    async fn leave(&self, node: &NodeId) -> Result<()> {
        let node = node.as_str().to_owned();
        self.write(move |tx| {
            let at = now();
            tx.prepare_cached(
                "UPDATE cluster_leases SET lease_until = ?2 WHERE holder = ?1 AND lease_until > ?2",
            )?
            .execute(params![node, at])?;
            tx.prepare_cached("DELETE FROM cluster_nodes WHERE id = ?1")?
                .execute(params![node])?;
            Ok(())
        })
        .await
    }

    async fn expire_node(&self, node: &NodeId) -> Result<bool> {
        let node = node.as_str().to_owned();
        self.write(move |tx| {
            let at = now();
            let was_alive = tx
                .prepare_cached(
                    "UPDATE cluster_nodes SET lease_until = ?2 WHERE id = ?1 AND lease_until > ?2",
                )?
                .execute(params![node, at])?
                == 1;
            tx.prepare_cached(
                "UPDATE cluster_leases SET lease_until = ?2 WHERE holder = ?1 AND lease_until > ?2",
            )?
            .execute(params![node, at])?;
            Ok(was_alive)
        })
        .await
    }

    async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        self.read(move |tx| {
            let sql = format!("SELECT {NODE_COLUMNS} FROM cluster_nodes ORDER BY joined_at, id");
            Ok(tx
                .prepare_cached(&sql)?
                .query_map([], node_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    async fn prune_nodes(&self, before: Timestamp) -> Result<u64> {
        self.write(move |tx| {
            let deleted = tx
                .prepare_cached("DELETE FROM cluster_nodes WHERE lease_until < ?1")?
                .execute(params![before])?;
            Ok(deleted as u64)
        })
        .await
    }

    async fn acquire_lease(
        &self,
        name: &str,
        holder: &NodeId,
        ttl: f64,
    ) -> Result<Option<LeaseGrant>> {
        let (name, holder) = (name.to_owned(), holder.as_str().to_owned());
        self.write(move |tx| {
            let at = now();
            // Granted when free, expired, held by a node that is dead, or
            // already ours. A new tenure
            // (another holder, or ours after it lapsed) moves the fence;
            // a renewal keeps it. Every SET expression reads the row as it
            // was, so `holder = ?2` below compares with the old holder.
            let granted = tx
                .prepare_cached(
                    "INSERT INTO cluster_leases (name, holder, fence, acquired_at, lease_until) \
                     VALUES (?1, ?2, 1, ?3, ?3 + ?4) \
                     ON CONFLICT (name) DO UPDATE SET \
                       fence = CASE WHEN holder = ?2 AND lease_until >= ?3 \
                               THEN fence ELSE fence + 1 END, \
                       acquired_at = CASE WHEN holder = ?2 AND lease_until >= ?3 \
                               THEN acquired_at ELSE ?3 END, \
                       wanted_at = CASE WHEN holder = ?2 AND lease_until >= ?3 \
                               THEN wanted_at ELSE NULL END, \
                       holder = ?2, lease_until = ?3 + ?4 \
                     WHERE holder = ?2 OR lease_until < ?3 \
                        OR EXISTS (SELECT 1 FROM cluster_nodes n \
                                   WHERE n.id = holder AND n.lease_until < ?3) \
                     RETURNING fence, lease_until, wanted_at IS NOT NULL",
                )?
                .query_row(params![name, holder, at, ttl], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, f64>(1)?,
                        r.get::<_, bool>(2)?,
                    ))
                })
                .optional()?;
            let Some((fence, until, wanted)) = granted else {
                // Refused: leave word for the holder, once per tenure (a
                // node standing by asks every second).
                tx.prepare_cached(
                    "UPDATE cluster_leases SET wanted_at = ?3 \
                     WHERE name = ?1 AND holder <> ?2 AND wanted_at IS NULL",
                )?
                .execute(params![name, holder, at])?;
                return Ok(None);
            };
            Ok(Some(LeaseGrant {
                fence: from_sql_count(fence),
                until,
                now: at,
                wanted,
            }))
        })
        .await
    }

    async fn release_lease(&self, name: &str, holder: &NodeId) -> Result<bool> {
        let (name, holder) = (name.to_owned(), holder.as_str().to_owned());
        self.write(move |tx| {
            let at = now();
            // The row stays (expired), so the next holder's fence is higher.
            let changed = tx
                .prepare_cached(
                    "UPDATE cluster_leases SET lease_until = ?3 \
                     WHERE name = ?1 AND holder = ?2 AND lease_until > ?3",
                )?
                .execute(params![name, holder, at])?;
            Ok(changed == 1)
        })
        .await
    }

    async fn leases(&self, prefix: &str) -> Result<Vec<LeaseRecord>> {
        let prefix = prefix.to_owned();
        self.read(move |tx| {
            let rows = tx
                .prepare_cached(
                    "SELECT name, holder, fence, acquired_at, lease_until FROM cluster_leases \
                     WHERE substr(name, 1, length(?1)) = ?1 ORDER BY name",
                )?
                .query_map(params![prefix], |r| {
                    Ok(LeaseRecord {
                        name: r.get(0)?,
                        holder: node_id(r, 1)?,
                        fence: from_sql_count(r.get(2)?),
                        acquired_at: r.get(3)?,
                        lease_until: r.get(4)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
        .await
    }

    async fn clock(&self) -> Result<Timestamp> {
        Ok(now())
    }
}
