//! Owed turns on SQLite (see [`crate::owed`]).

use async_trait::async_trait;
use rusqlite::{Transaction, params};

use super::SqliteStore;
use super::conn::OpResult;
use super::rows::{from_sql_count, from_sql_small_count, now};
use crate::owed::{NewOwedTurn, OwedTurn, OwedTurnStore};
use crate::{NodeId, Result};

/// Removes the owed turns `ids`; the outbox calls this inside the
/// transaction that stores their answer.
pub(crate) fn settle(tx: &Transaction<'_>, ids: &[String]) -> OpResult<u64> {
    let mut statement = tx.prepare_cached("DELETE FROM owed_turns WHERE id = ?1")?;
    let mut gone = 0;
    for id in ids {
        gone += statement.execute(params![id])? as u64;
    }
    Ok(gone)
}

#[async_trait]
impl OwedTurnStore for SqliteStore {
    async fn accept_turn(&self, inbound_id: Option<&str>, turn: NewOwedTurn) -> Result<bool> {
        let inbound_id = inbound_id.map(str::to_owned);
        self.write(move |tx| {
            let at = now();
            if let Some(inbound_id) = &inbound_id {
                let new = tx
                    .prepare_cached(
                        "INSERT INTO inbound_seen (platform, inbound_id, seen_at) \
                         VALUES (?1, ?2, ?3) ON CONFLICT (platform, inbound_id) DO NOTHING",
                    )?
                    .execute(params![turn.platform, inbound_id, at])?;
                if new == 0 {
                    return Ok(false);
                }
            }
            tx.prepare_cached(
                "INSERT INTO owed_turns (id, session_key, platform, event, owner_node, \
                 accepted_at, claims) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0) \
                 ON CONFLICT (id) DO NOTHING",
            )?
            .execute(params![
                turn.id,
                turn.session_key,
                turn.platform,
                turn.event,
                turn.owner.as_str(),
                at
            ])?;
            Ok(true)
        })
        .await
    }

    async fn settle_turns(&self, ids: &[String]) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let ids = ids.to_vec();
        self.write(move |tx| settle(tx, &ids)).await
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
        let claimer = claimer.as_str().to_owned();
        let platforms = serde_json::to_string(platforms)
            .map_err(|e| crate::StoreError::Database(e.to_string()))?;
        let limit = limit.max(1) as i64;
        // One writer transaction: the select and the updates cannot
        // interleave with another claim on this file.
        self.write(move |tx| {
            let at = now();
            let rows = tx
                .prepare_cached(
                    "UPDATE owed_turns SET owner_node = ?1, claims = claims + 1 \
                     WHERE id IN ( \
                         SELECT t.id FROM owed_turns t \
                         LEFT JOIN cluster_nodes n ON n.id = t.owner_node \
                         WHERE t.owner_node IS NOT ?1 \
                           AND (t.owner_node IS NULL OR n.id IS NULL OR n.lease_until < ?2) \
                           AND t.platform IN (SELECT value FROM json_each(?3)) \
                         ORDER BY t.accepted_at, t.id LIMIT ?4) \
                     RETURNING id, session_key, platform, event, owner_node, accepted_at, claims",
                )?
                .query_map(params![claimer, at, platforms, limit], |r| {
                    Ok(OwedTurn {
                        id: r.get(0)?,
                        session_key: r.get(1)?,
                        platform: r.get(2)?,
                        event: r.get(3)?,
                        // Written by this code from a checked id; a foreign
                        // value only loses the owner, which is informational.
                        owner: r
                            .get::<_, Option<String>>(4)?
                            .and_then(|id| NodeId::new(id).ok()),
                        accepted_at: r.get(5)?,
                        claims: from_sql_small_count(r.get(6)?),
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let mut rows = rows;
            // RETURNING gives no order; callers want the oldest first.
            rows.sort_by(|a, b| {
                a.accepted_at
                    .total_cmp(&b.accepted_at)
                    .then(a.id.cmp(&b.id))
            });
            Ok(rows)
        })
        .await
    }

    async fn owed_turn_count(&self) -> Result<u64> {
        self.read(|tx| {
            let n: i64 = tx
                .prepare_cached("SELECT count(*) FROM owed_turns")?
                .query_row([], |r| r.get(0))?;
            Ok(from_sql_count(n))
        })
        .await
    }
}
