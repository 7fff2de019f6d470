//! Owed turns on PostgreSQL (see [`crate::owed`]).
//!
//! A claim picks rows with `FOR UPDATE SKIP LOCKED`, so nodes sweeping
//! together pass over each other's rows instead of waiting, and re-checks
//! the owner's liveness under the row lock in the same statement that
//! moves the row (as the ledger's claim does, for the same reason: the
//! pick's view of the joined node row may be older than the lock).

use async_trait::async_trait;
use deadpool_postgres::Transaction;

use super::{NOW, PostgresStore};
use crate::owed::{NewOwedTurn, OwedTurn, OwedTurnStore};
use crate::{NodeId, Result};

/// The step of the schema that adds owed turns.
pub(super) const SCHEMA: &str = r#"
CREATE TABLE owed_turns (
    id          text PRIMARY KEY,
    session_key text NOT NULL,
    platform    text NOT NULL,
    event       text NOT NULL,
    owner_node  text,
    accepted_at float8 NOT NULL,
    claims      integer NOT NULL DEFAULT 0
);
CREATE INDEX owed_turns_accepted ON owed_turns (accepted_at);
"#;

impl PostgresStore {
    /// Removes the owed turns `ids` inside `tx` (the outbox's transaction).
    pub(super) async fn settle_turns_on(
        &self,
        tx: &Transaction<'_>,
        ids: &[String],
    ) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let statement = tx
            .prepare_cached("DELETE FROM owed_turns WHERE id = ANY($1)")
            .await
            .map_err(|e| self.error(e))?;
        tx.execute(&statement, &[&ids])
            .await
            .map_err(|e| self.error(e))
    }
}

#[async_trait]
impl OwedTurnStore for PostgresStore {
    async fn accept_turn(&self, inbound_id: Option<&str>, turn: NewOwedTurn) -> Result<bool> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        if let Some(inbound_id) = inbound_id {
            let seen = tx
                .prepare_cached(&format!(
                    "INSERT INTO inbound_seen (platform, inbound_id, seen_at) \
                     VALUES ($1, $2, {NOW}) ON CONFLICT (platform, inbound_id) DO NOTHING"
                ))
                .await
                .map_err(|e| self.error(e))?;
            let new = tx
                .execute(&seen, &[&turn.platform, &inbound_id])
                .await
                .map_err(|e| self.error(e))?;
            if new == 0 {
                tx.commit().await.map_err(|e| self.error(e))?;
                return Ok(false);
            }
        }
        let insert = tx
            .prepare_cached(&format!(
                "INSERT INTO owed_turns (id, session_key, platform, event, owner_node, \
                 accepted_at, claims) VALUES ($1, $2, $3, $4, $5, {NOW}, 0) \
                 ON CONFLICT (id) DO NOTHING"
            ))
            .await
            .map_err(|e| self.error(e))?;
        tx.execute(
            &insert,
            &[
                &turn.id,
                &turn.session_key,
                &turn.platform,
                &turn.event,
                &turn.owner.as_str(),
            ],
        )
        .await
        .map_err(|e| self.error(e))?;
        tx.commit().await.map_err(|e| self.error(e))?;
        Ok(true)
    }

    async fn settle_turns(&self, ids: &[String]) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        let gone = self.settle_turns_on(&tx, ids).await?;
        tx.commit().await.map_err(|e| self.error(e))?;
        Ok(gone)
    }

    async fn claim_owed_turns(
        &self,
        claimer: &NodeId,
        platforms: &[String],
        limit: usize,
    ) -> Result<Vec<OwedTurn>> {
        if platforms.is_empty() {
            return Ok(Vec::new());
        }
        let orphaned = format!(
            "t.owner_node IS DISTINCT FROM $1 \
             AND (t.owner_node IS NULL OR n.id IS NULL OR n.lease_until < {NOW}) \
             AND t.platform = ANY($2)"
        );
        // Two statements in one transaction, as the ledger's claim: the
        // pick locks candidates (passing over rows another node is
        // claiming), but its re-check of a row it waited for does not see
        // the node row joined to it anew, so a row another node claimed a
        // moment ago could still look orphaned. The second statement runs
        // on a fresh snapshot with the rows locked and decides from what is
        // committed.
        let pick = format!(
            "SELECT t.id FROM owed_turns t \
             LEFT JOIN cluster_nodes n ON n.id = t.owner_node \
             WHERE {orphaned} \
             ORDER BY t.accepted_at, t.id LIMIT $3 \
             FOR UPDATE OF t SKIP LOCKED"
        );
        let apply = format!(
            "UPDATE owed_turns t SET owner_node = $1, claims = t.claims + 1 \
             WHERE t.id = ANY($3) AND t.owner_node IS DISTINCT FROM $1 \
               AND t.platform = ANY($2) \
               AND NOT EXISTS (SELECT 1 FROM cluster_nodes n \
                               WHERE n.id = t.owner_node AND n.lease_until >= {NOW}) \
             RETURNING t.id, t.session_key, t.platform, t.event, t.owner_node, \
                       t.accepted_at, t.claims"
        );
        let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        let pick = tx.prepare_cached(&pick).await.map_err(|e| self.error(e))?;
        let picked: Vec<String> = tx
            .query(&pick, &[&claimer.as_str(), &platforms, &limit])
            .await
            .map_err(|e| self.error(e))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if picked.is_empty() {
            tx.commit().await.map_err(|e| self.error(e))?;
            return Ok(Vec::new());
        }
        let apply = tx.prepare_cached(&apply).await.map_err(|e| self.error(e))?;
        let rows = tx
            .query(&apply, &[&claimer.as_str(), &platforms, &picked])
            .await
            .map_err(|e| self.error(e))?;
        tx.commit().await.map_err(|e| self.error(e))?;
        let mut turns: Vec<OwedTurn> = rows
            .iter()
            .map(|r| OwedTurn {
                id: r.get(0),
                session_key: r.get(1),
                platform: r.get(2),
                event: r.get(3),
                owner: r
                    .get::<_, Option<String>>(4)
                    .and_then(|id| NodeId::new(id).ok()),
                accepted_at: r.get(5),
                claims: u32::try_from(r.get::<_, i32>(6)).unwrap_or(0),
            })
            .collect();
        turns.sort_by(|a, b| {
            a.accepted_at
                .total_cmp(&b.accepted_at)
                .then(a.id.cmp(&b.id))
        });
        Ok(turns)
    }

    async fn owed_turn_count(&self) -> Result<u64> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached("SELECT count(*) FROM owed_turns")
            .await
            .map_err(|e| self.error(e))?;
        let row = client
            .query_one(&statement, &[])
            .await
            .map_err(|e| self.error(e))?;
        Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
    }
}
