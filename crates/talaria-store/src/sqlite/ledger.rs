//! The delivery ledger on SQLite.
//!
//! Every change runs in the single writer's transaction, which also holds
//! the file's write lock against other processes, so a claim's read and
//! its updates cannot interleave with another gateway's.
//!
//! Conventions beyond the trait's documentation:
//! - state changes on an unknown id return `false` and are not errors: the
//!   ledger exists to make replies survive crashes and must never be the
//!   reason one is lost;
//! - [`LedgerStore::abandon_obligation`] keeps `reason` in `last_error`,
//!   truncated like a send error;
//! - [`LedgerStore::obligation_counts`] lists only states that have rows.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use rusqlite::types::Type;
use rusqlite::{OptionalExtension, Row, Transaction, params};

use talaria_core::{Message, Usage};

use super::SqliteStore;
use super::conn::OpResult;
use super::rows::{from_sql_count, from_sql_small_count, now};
use super::{add_usage_row, append_row};
use crate::cluster::NodeId;
use crate::gateway::{
    ClaimedObligation, GAVE_UP_AGE, GAVE_UP_ATTEMPTS, LedgerStore, MAX_ERROR_CHARS, NewObligation,
    OPEN_STATES_SQL, Obligation, ObligationState, OwedBatch, OwedClaim, OwedCursor, truncate_chars,
};
use crate::{Result, StoreError, Timestamp};

/// Obligation columns in the order [`obligation_from_row`] reads them.
const COLUMNS: &str = "id, session_key, platform, chat_id, thread_id, reply_to, content, state, \
     attempts, created_at, updated_at, owner_node, lease_until, last_error, parts_sent";

fn conversion_error(column: usize, ty: Type, what: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(column, ty, Box::new(StoreError::Database(what)))
}

fn obligation_from_row(row: &Row<'_>) -> rusqlite::Result<Obligation> {
    let state: String = row.get(7)?;
    let state = ObligationState::parse(&state)
        .ok_or_else(|| conversion_error(7, Type::Text, format!("unknown state `{state}`")))?;
    let attempts: i64 = row.get(8)?;
    let owner = match row.get::<_, Option<String>>(11)? {
        None => None,
        Some(id) => {
            Some(NodeId::new(id).map_err(|e| conversion_error(11, Type::Text, e.to_string()))?)
        }
    };
    Ok(Obligation {
        id: row.get(0)?,
        session_key: row.get(1)?,
        platform: row.get(2)?,
        chat_id: row.get(3)?,
        thread_id: row.get(4)?,
        reply_to: row.get(5)?,
        content: row.get(6)?,
        state,
        // Clamped rather than failing a sweep over one odd row.
        attempts: from_sql_small_count(attempts),
        created_at: row.get(9)?,
        updated_at: row.get(10)?,
        owner,
        lease_until: row.get(12)?,
        last_error: row.get(13)?,
        parts_sent: from_sql_small_count(row.get(14)?),
    })
}

fn load(tx: &Transaction<'_>, id: &str) -> OpResult<Option<Obligation>> {
    let sql = format!("SELECT {COLUMNS} FROM delivery_obligations WHERE id = ?1");
    Ok(tx
        .prepare_cached(&sql)?
        .query_row(params![id], obligation_from_row)
        .optional()?)
}

/// Ends attempt `attempt` of row `id` in `state`; `false` when that is not
/// the row's current attempt.
fn settle(
    tx: &Transaction<'_>,
    id: &str,
    attempt: Option<u32>,
    state: ObligationState,
    error: Option<&str>,
) -> OpResult<bool> {
    let error = error.map(|e| truncate_chars(e, MAX_ERROR_CHARS));
    let changed = match attempt {
        Some(attempt) => tx
            .prepare_cached(
                "UPDATE delivery_obligations SET state = ?2, updated_at = ?3, \
                 lease_until = NULL, last_error = COALESCE(?4, last_error) \
                 WHERE id = ?1 AND attempts = ?5 AND state = 'attempting'",
            )?
            .execute(params![id, state.as_str(), now(), error, attempt])?,
        None => tx
            .prepare_cached(&format!(
                "UPDATE delivery_obligations SET state = ?2, updated_at = ?3, \
                 lease_until = NULL, last_error = COALESCE(?4, last_error) \
                 WHERE id = ?1 AND state IN {OPEN_STATES_SQL}"
            ))?
            .execute(params![id, state.as_str(), now(), error])?,
    };
    Ok(changed == 1)
}

/// Inserts (or starts over) an obligation row, pending, owned by its
/// recorder.
fn record(tx: &Transaction<'_>, o: &NewObligation) -> OpResult<()> {
    let at = now();
    tx.prepare_cached(
        "INSERT INTO delivery_obligations (id, session_key, platform, chat_id, \
                 thread_id, reply_to, content, state, attempts, created_at, updated_at, \
                 owner_node, lease_until, last_error, parts_sent) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'pending', 0, ?8, ?8, ?9, NULL, NULL, 0) \
                 ON CONFLICT (id) DO UPDATE SET session_key = excluded.session_key, \
                 platform = excluded.platform, chat_id = excluded.chat_id, \
                 thread_id = excluded.thread_id, reply_to = excluded.reply_to, \
                 content = excluded.content, state = 'pending', \
                 created_at = excluded.created_at, updated_at = excluded.updated_at, \
                 owner_node = excluded.owner_node, lease_until = NULL, last_error = NULL, \
                 parts_sent = 0",
    )?
    .execute(params![
        o.id,
        o.session_key,
        o.platform,
        o.chat_id,
        o.thread_id,
        o.reply_to,
        o.content,
        at,
        o.owner.as_str(),
    ])?;
    Ok(())
}

#[async_trait]
impl LedgerStore for SqliteStore {
    async fn append_reply(
        &self,
        session_id: &str,
        message: &Message,
        usage: &Usage,
        obligation: NewObligation,
    ) -> Result<i64> {
        let (id, message, usage) = (session_id.to_owned(), message.clone(), *usage);
        let timestamp = now();
        self.write(move |tx| {
            let row = append_row(tx, &id, &message, timestamp)?;
            if usage != Usage::default() {
                add_usage_row(tx, &id, &usage)?;
            }
            record(tx, &obligation)?;
            super::owed::settle(tx, &obligation.settles)?;
            Ok(row)
        })
        .await
    }

    async fn append_reply_with_calls(
        &self,
        session_id: &str,
        message: &Message,
        calls: &[crate::ModelCall],
        obligation: NewObligation,
    ) -> Result<i64> {
        let (id, message, calls) = (session_id.to_owned(), message.clone(), calls.to_vec());
        let timestamp = now();
        self.write(move |tx| {
            let row = append_row(tx, &id, &message, timestamp)?;
            super::spend::record_calls(tx, &id, &calls, timestamp)?;
            record(tx, &obligation)?;
            super::owed::settle(tx, &obligation.settles)?;
            Ok(row)
        })
        .await
    }

    async fn record_obligation(&self, obligation: NewObligation) -> Result<()> {
        self.write(move |tx| {
            record(tx, &obligation)?;
            super::owed::settle(tx, &obligation.settles)?;
            Ok(())
        })
        .await
    }

    async fn begin_attempt(&self, id: &str, owner: &NodeId, lease: f64) -> Result<Option<u32>> {
        let (id, owner) = (id.to_owned(), owner.as_str().to_owned());
        self.write(move |tx| {
            let at = now();
            let attempts: Option<i64> = tx
                .prepare_cached(
                    "UPDATE delivery_obligations SET state = 'attempting', \
                     attempts = attempts + 1, updated_at = ?3, lease_until = ?3 + ?4 \
                     WHERE id = ?1 AND owner_node = ?2 AND state = 'pending' \
                     RETURNING attempts",
                )?
                .query_row(params![id, owner, at, lease], |r| r.get(0))
                .optional()?;
            Ok(attempts.map(from_sql_small_count))
        })
        .await
    }

    async fn mark_delivered(&self, id: &str, attempt: u32) -> Result<bool> {
        let id = id.to_owned();
        self.write(move |tx| settle(tx, &id, Some(attempt), ObligationState::Delivered, None))
            .await
    }

    async fn mark_failed(&self, id: &str, attempt: u32, error: &str) -> Result<bool> {
        let (id, error) = (id.to_owned(), error.to_owned());
        self.write(move |tx| {
            settle(
                tx,
                &id,
                Some(attempt),
                ObligationState::Failed,
                Some(&error),
            )
        })
        .await
    }

    async fn mark_parts_sent(&self, id: &str, attempt: u32, parts_sent: u32) -> Result<bool> {
        let id = id.to_owned();
        self.write(move |tx| {
            // MAX: a late or reordered report of fewer parts must not
            // make a later sender repeat parts the user already has.
            let changed = tx
                .prepare_cached(
                    "UPDATE delivery_obligations SET parts_sent = MAX(parts_sent, ?3) \
                     WHERE id = ?1 AND attempts = ?2 AND state = 'attempting'",
                )?
                .execute(params![id, attempt, parts_sent])?;
            Ok(changed == 1)
        })
        .await
    }

    async fn abandon_obligation(
        &self,
        id: &str,
        attempt: Option<u32>,
        reason: &str,
    ) -> Result<bool> {
        let (id, reason) = (id.to_owned(), reason.to_owned());
        self.write(move |tx| settle(tx, &id, attempt, ObligationState::Abandoned, Some(&reason)))
            .await
    }

    async fn obligation(&self, id: &str) -> Result<Option<Obligation>> {
        let id = id.to_owned();
        self.read(move |tx| load(tx, &id)).await
    }

    async fn open_obligations(&self, limit: usize) -> Result<Vec<Obligation>> {
        let limit = if limit == 0 { -1 } else { limit as i64 };
        self.read(move |tx| {
            let sql = format!(
                "SELECT {COLUMNS} FROM delivery_obligations \
                 WHERE state IN {OPEN_STATES_SQL} ORDER BY created_at, id LIMIT ?1"
            );
            Ok(tx
                .prepare_cached(&sql)?
                .query_map(params![limit], obligation_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    async fn claim_owed(&self, claim: &OwedClaim) -> Result<OwedBatch> {
        let claim = claim.clone();
        let platforms = serde_json::to_string(&claim.platforms)
            .map_err(|e| StoreError::Database(format!("cannot encode platforms: {e}")))?;
        self.write(move |tx| {
            let at = now();
            let me = claim.claimer.as_str();
            let limit = claim.limit.max(1) as i64;
            // Claimable: open, and either the claimer's own row that failed
            // or whose attempt outlived its lease (never its own pending
            // row: it is about to send that), or another's whose owner is
            // missing or dead or whose attempt outlived its lease. Of
            // those, the ones over budget (any platform) and the ones the
            // claimer can deliver.
            // In claim order through `delivery_obligations_owed` (named:
            // left to itself the planner takes the `(state, created_at)`
            // index and sorts every open row on each call), from the
            // previous call's last row on: each call reads about `limit`
            // rows, not every open row again.
            let after = if claim.after.is_some() {
                "AND (o.created_at, o.id) > (?8, ?9)"
            } else {
                "AND ?8 IS NULL AND ?9 IS NULL"
            };
            let sql = format!(
                "SELECT o.id, o.state, \
                     (o.attempts >= ?3 OR o.created_at < ?4) AS give_up, \
                     o.attempts >= ?3 AS spent, o.created_at, o.rowid \
                 FROM delivery_obligations o INDEXED BY delivery_obligations_owed \
                 LEFT JOIN cluster_nodes n ON n.id = o.owner_node \
                 WHERE o.state IN {OPEN_STATES_SQL} {after} \
                   AND ((o.owner_node IS ?2 \
                         AND (o.state = 'failed' \
                              OR (o.state = 'attempting' AND o.lease_until < ?1))) \
                        OR (o.owner_node IS NOT ?2 \
                         AND (o.owner_node IS NULL OR n.id IS NULL OR n.lease_until < ?1 \
                              OR (o.state = 'attempting' AND o.lease_until < ?1)))) \
                   AND (o.state <> 'failed' OR o.updated_at < ?1 - ?7) \
                   AND (o.attempts >= ?3 OR o.created_at < ?4 \
                        OR o.platform IN (SELECT value FROM json_each(?5))) \
                 ORDER BY o.created_at, o.id LIMIT ?6"
            );
            let candidates = tx
                .prepare_cached(&sql)?
                .query_map(
                    params![
                        at,
                        me,
                        claim.max_attempts,
                        claim.stale_before,
                        platforms,
                        limit,
                        claim.retry_failed_after,
                        claim.after.as_ref().map(|a| a.created_at),
                        claim.after.as_ref().map(|a| a.id.as_str()),
                    ],
                    |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            r.get::<_, String>(1)?,
                            r.get::<_, bool>(2)?,
                            r.get::<_, bool>(3)?,
                            r.get::<_, Timestamp>(4)?,
                            r.get::<_, i64>(5)?,
                        ))
                    },
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let mut batch = OwedBatch {
                last: candidates
                    .last()
                    .map(|(id, _, _, _, created_at, _)| OwedCursor {
                        created_at: *created_at,
                        id: id.clone(),
                    }),
                ..OwedBatch::default()
            };
            let mut previous_of = HashMap::new();
            let mut claiming = Vec::new();
            for (id, previous, give_up, spent, _, rowid) in candidates {
                let previous = ObligationState::parse(&previous).ok_or_else(|| {
                    StoreError::Database(format!(
                        "delivery ledger has an unknown state `{previous}`"
                    ))
                })?;
                if give_up {
                    let reason = if spent { GAVE_UP_ATTEMPTS } else { GAVE_UP_AGE };
                    // RETURNING: the row as it is now, without reading it again.
                    let sql = format!(
                        "UPDATE delivery_obligations SET state = 'abandoned', updated_at = ?2, \
                         lease_until = NULL, last_error = ?3 WHERE rowid = ?1 RETURNING {COLUMNS}"
                    );
                    if let Some(row) = tx
                        .prepare_cached(&sql)?
                        .query_row(params![rowid, at, reason], obligation_from_row)
                        .optional()?
                    {
                        batch.abandoned.push(row);
                    }
                } else {
                    previous_of.insert(id, previous);
                    claiming.push(rowid);
                }
            }
            if claiming.is_empty() {
                return Ok(batch);
            }
            // The claimed rows in one statement: a statement per row cost
            // more than the change it made.
            let rowids = serde_json::to_string(&claiming)
                .map_err(|e| StoreError::Database(format!("cannot encode row ids: {e}")))?;
            let sql = format!(
                "UPDATE delivery_obligations SET state = 'attempting', \
                 attempts = attempts + 1, owner_node = ?2, updated_at = ?3, \
                 lease_until = ?3 + ?4 \
                 WHERE rowid IN (SELECT value FROM json_each(?1)) RETURNING {COLUMNS}"
            );
            let mut stmt = tx.prepare_cached(&sql)?;
            let mut rows = stmt.query(params![rowids, me, at, claim.lease])?;
            while let Some(row) = rows.next()? {
                let obligation = obligation_from_row(row)?;
                // Every returned row was a candidate; were one not, calling
                // it attempted before marks its send as possibly repeated,
                // the safe side.
                let previous = previous_of
                    .get(&obligation.id)
                    .copied()
                    .unwrap_or(ObligationState::Attempting);
                batch.claimed.push(ClaimedObligation {
                    obligation,
                    previous,
                });
            }
            // RETURNING gives no order: oldest first, as the sweep sends them.
            batch.claimed.sort_by(|a, b| {
                (a.obligation.created_at, &a.obligation.id)
                    .partial_cmp(&(b.obligation.created_at, &b.obligation.id))
                    .unwrap_or(std::cmp::Ordering::Equal)
            });
            Ok(batch)
        })
        .await
    }

    async fn prune_obligations(&self, cutoff: Timestamp) -> Result<u64> {
        self.write(move |tx| {
            let deleted = tx
                .prepare_cached(
                    "DELETE FROM delivery_obligations \
                     WHERE state IN ('delivered', 'abandoned') AND updated_at < ?1",
                )?
                .execute(params![cutoff])?;
            Ok(deleted as u64)
        })
        .await
    }

    async fn obligation_counts(&self) -> Result<BTreeMap<ObligationState, u64>> {
        self.read(move |tx| {
            let rows = tx
                .prepare_cached("SELECT state, COUNT(*) FROM delivery_obligations GROUP BY state")?
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let mut counts = BTreeMap::new();
            for (state, n) in rows {
                let state = ObligationState::parse(&state).ok_or_else(|| {
                    StoreError::Database(format!("delivery ledger has an unknown state `{state}`"))
                })?;
                counts.insert(state, from_sql_count(n));
            }
            Ok(counts)
        })
        .await
    }
}
