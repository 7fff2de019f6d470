//! Nodes and leases on PostgreSQL. Every change is one statement; a lease
//! is granted by an upsert whose conflict branch is guarded, so of nodes
//! racing for a free lease the row lock lets exactly one through.

use async_trait::async_trait;
use tokio_postgres::Row;

use super::{NOW, PostgresStore};
use crate::cluster::{ClusterStore, LeaseGrant, LeaseRecord, NodeAnnouncement, NodeId, NodeRecord};
use crate::{Result, StoreError, Timestamp};

/// The nodes and the leases. A released or expired lease keeps its row, so
/// the fence of the next holder is higher than every earlier one.
pub(super) const SCHEMA: &str = r#"
CREATE TABLE cluster_nodes (
    id           text PRIMARY KEY,
    host         text NOT NULL,
    pid          bigint NOT NULL,
    started_at   bigint,
    version      text NOT NULL,
    joined_at    double precision NOT NULL,
    heartbeat_at double precision NOT NULL,
    lease_until  double precision NOT NULL
);
CREATE TABLE cluster_leases (
    name        text PRIMARY KEY,
    holder      text NOT NULL,
    fence       bigint NOT NULL,
    acquired_at double precision NOT NULL,
    lease_until double precision NOT NULL,
    wanted_at   double precision
);
"#;

fn node_from_row(row: &Row) -> Result<NodeRecord> {
    let bad = |e: tokio_postgres::Error| StoreError::Database(format!("cluster_nodes: {e}"));
    let pid: i64 = row.try_get(2).map_err(bad)?;
    let started_at: Option<i64> = row.try_get(3).map_err(bad)?;
    Ok(NodeRecord {
        id: NodeId::new(row.try_get::<_, String>(0).map_err(bad)?)?,
        host: row.try_get(1).map_err(bad)?,
        pid: u32::try_from(pid)
            .map_err(|_| StoreError::Database(format!("cluster_nodes: pid {pid} out of range")))?,
        // Stored bit for bit in a signed column; the round trip is exact.
        started_at: started_at.map(|t| t as u64),
        version: row.try_get(4).map_err(bad)?,
        joined_at: row.try_get(5).map_err(bad)?,
        heartbeat_at: row.try_get(6).map_err(bad)?,
        lease_until: row.try_get(7).map_err(bad)?,
    })
}

#[async_trait]
impl ClusterStore for PostgresStore {
    async fn heartbeat(&self, node: &NodeAnnouncement, ttl: f64) -> Result<Timestamp> {
        let client = self.client().await?;
        let sql = format!(
            "INSERT INTO cluster_nodes (id, host, pid, started_at, version, joined_at, \
             heartbeat_at, lease_until) VALUES ($1, $2, $3, $4, $5, {NOW}, {NOW}, {NOW} + $6) \
             ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid, \
             started_at = excluded.started_at, version = excluded.version, \
             heartbeat_at = excluded.heartbeat_at, lease_until = excluded.lease_until \
             RETURNING heartbeat_at"
        );
        let statement = client
            .prepare_cached(&sql)
            .await
            .map_err(|e| self.error(e))?;
        let row = client
            .query_one(
                &statement,
                &[
                    &node.id.as_str(),
                    &node.host,
                    &i64::from(node.pid),
                    &node.started_at.map(|t| t as i64),
                    &node.version,
                    &ttl,
                ],
            )
            .await
            .map_err(|e| self.error(e))?;
        Ok(row.get(0))
    }

    async fn leave(&self, node: &NodeId) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        tx.execute(
            &format!(
                "UPDATE cluster_leases SET lease_until = {NOW} \
                 WHERE holder = $1 AND lease_until > {NOW}"
            ),
            &[&node.as_str()],
        )
        .await
        .map_err(|e| self.error(e))?;
        tx.execute("DELETE FROM cluster_nodes WHERE id = $1", &[&node.as_str()])
            .await
            .map_err(|e| self.error(e))?;
        tx.commit().await.map_err(|e| self.error(e))
    }

    async fn expire_node(&self, node: &NodeId) -> Result<bool> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        let was_alive = tx
            .execute(
                &format!(
                    "UPDATE cluster_nodes SET lease_until = {NOW} \
                     WHERE id = $1 AND lease_until > {NOW}"
                ),
                &[&node.as_str()],
            )
            .await
            .map_err(|e| self.error(e))?
            == 1;
        tx.execute(
            &format!(
                "UPDATE cluster_leases SET lease_until = {NOW} \
                 WHERE holder = $1 AND lease_until > {NOW}"
            ),
            &[&node.as_str()],
        )
        .await
        .map_err(|e| self.error(e))?;
        tx.commit().await.map_err(|e| self.error(e))?;
        Ok(was_alive)
    }

    async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT id, host, pid, started_at, version, joined_at, heartbeat_at, \
                 lease_until FROM cluster_nodes ORDER BY joined_at, id",
                &[],
            )
            .await
            .map_err(|e| self.error(e))?;
        rows.iter().map(node_from_row).collect()
    }

    async fn prune_nodes(&self, before: Timestamp) -> Result<u64> {
        let client = self.client().await?;
        client
            .execute(
                "DELETE FROM cluster_nodes WHERE lease_until < $1",
                &[&before],
            )
            .await
            .map_err(|e| self.error(e))
    }

    async fn acquire_lease(
        &self,
        name: &str,
        holder: &NodeId,
        ttl: f64,
    ) -> Result<Option<LeaseGrant>> {
        let client = self.client().await?;
        // Granted when free, expired, held by a dead node, or already
        // ours; a new tenure moves
        // the fence, a renewal keeps it. In the conflict branch the bare
        // column names are the existing row, `excluded` the proposed one.
        let sql = format!(
            "INSERT INTO cluster_leases AS l (name, holder, fence, acquired_at, lease_until) \
             VALUES ($1, $2, 1, {NOW}, {NOW} + $3) \
             ON CONFLICT (name) DO UPDATE SET \
               fence = CASE WHEN l.holder = excluded.holder AND l.lease_until >= {NOW} \
                       THEN l.fence ELSE l.fence + 1 END, \
               acquired_at = CASE WHEN l.holder = excluded.holder AND l.lease_until >= {NOW} \
                       THEN l.acquired_at ELSE excluded.acquired_at END, \
               wanted_at = CASE WHEN l.holder = excluded.holder AND l.lease_until >= {NOW} \
                       THEN l.wanted_at ELSE NULL END, \
               holder = excluded.holder, lease_until = excluded.lease_until \
             WHERE l.holder = excluded.holder OR l.lease_until < {NOW} \
                OR EXISTS (SELECT 1 FROM cluster_nodes n \
                           WHERE n.id = l.holder AND n.lease_until < {NOW}) \
             RETURNING fence, lease_until, {NOW}, wanted_at IS NOT NULL"
        );
        let statement = client
            .prepare_cached(&sql)
            .await
            .map_err(|e| self.error(e))?;
        let row = client
            .query_opt(&statement, &[&name, &holder.as_str(), &ttl])
            .await
            .map_err(|e| self.error(e))?;
        let Some(r) = row else {
            // Refused: leave word for the holder, once per tenure (a node
            // standing by asks every second).
            client
                .execute(
                    &format!(
                        "UPDATE cluster_leases SET wanted_at = {NOW} \
                         WHERE name = $1 AND holder <> $2 AND wanted_at IS NULL"
                    ),
                    &[&name, &holder.as_str()],
                )
                .await
                .map_err(|e| self.error(e))?;
            return Ok(None);
        };
        Ok(Some(LeaseGrant {
            fence: u64::try_from(r.get::<_, i64>(0)).unwrap_or(0),
            until: r.get(1),
            now: r.get(2),
            wanted: r.get(3),
        }))
    }

    async fn release_lease(&self, name: &str, holder: &NodeId) -> Result<bool> {
        let client = self.client().await?;
        let changed = client
            .execute(
                &format!(
                    "UPDATE cluster_leases SET lease_until = {NOW} \
                     WHERE name = $1 AND holder = $2 AND lease_until > {NOW}"
                ),
                &[&name, &holder.as_str()],
            )
            .await
            .map_err(|e| self.error(e))?;
        Ok(changed == 1)
    }

    async fn leases(&self, prefix: &str) -> Result<Vec<LeaseRecord>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT name, holder, fence, acquired_at, lease_until FROM cluster_leases \
                 WHERE left(name, length($1)) = $1 ORDER BY name",
                &[&prefix],
            )
            .await
            .map_err(|e| self.error(e))?;
        rows.iter()
            .map(|r| {
                Ok(LeaseRecord {
                    name: r.get(0),
                    holder: NodeId::new(r.get::<_, String>(1))?,
                    fence: u64::try_from(r.get::<_, i64>(2)).unwrap_or(0),
                    acquired_at: r.get(3),
                    lease_until: r.get(4),
                })
            })
            .collect()
    }

    async fn clock(&self) -> Result<Timestamp> {
        self.now().await
    }
}
