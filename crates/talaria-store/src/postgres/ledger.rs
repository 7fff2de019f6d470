//! The delivery ledger on PostgreSQL: a transactional outbox several nodes
//! drain together.
//!
//! A sweep's claim is one transaction: it picks claimable rows with
//! `FOR UPDATE SKIP LOCKED` (rows another node is claiming this instant are
//! passed over, not waited for), then, holding their locks, re-decides each
//! from what is committed and moves it to the claimer, so a row another
//! sweep won a moment earlier no longer qualifies. Settling an attempt is
//! an update guarded on the attempt number: a node that lost the row (its
//! lease ran out, another node claimed it) can report late without effect.

use std::collections::BTreeMap;

use async_trait::async_trait;
use talaria_core::{Message, Usage};
use tokio_postgres::Row;

use super::{NOW, PostgresStore};
use crate::cluster::NodeId;
use crate::gateway::{
    ClaimedObligation, GAVE_UP_AGE, GAVE_UP_ATTEMPTS, LedgerStore, MAX_ERROR_CHARS, NewObligation,
    OPEN_STATES_SQL, Obligation, ObligationState, OwedBatch, OwedClaim, OwedCursor, truncate_chars,
};
use crate::{Result, StoreError, Timestamp};

/// The ledger's table. Open rows are found through a partial index, so
/// delivered history costs a sweep nothing.
pub(super) const SCHEMA: &str = r#"
CREATE TABLE delivery_obligations (
    id          text PRIMARY KEY,
    session_key text NOT NULL,
    platform    text NOT NULL,
    chat_id     text NOT NULL,
    thread_id   text,
    reply_to    text,
    content     text NOT NULL,
    state       text NOT NULL
                CHECK (state IN ('pending', 'attempting', 'delivered', 'failed', 'abandoned')),
    attempts    integer NOT NULL DEFAULT 0,
    created_at  double precision NOT NULL,
    updated_at  double precision NOT NULL,
    owner_node  text,
    lease_until double precision,
    last_error  text
);
CREATE INDEX delivery_obligations_open ON delivery_obligations (created_at, id)
    WHERE state IN ('pending', 'attempting', 'failed');
CREATE INDEX delivery_obligations_settled ON delivery_obligations (updated_at)
    WHERE state IN ('delivered', 'abandoned');
"#;

/// How many parts of a reply were confirmed sent (schema step 4, with
/// `messages.media`; SQLite's version 10).
pub(super) const PARTS_SCHEMA: &str = r#"
ALTER TABLE delivery_obligations
    ADD COLUMN parts_sent integer NOT NULL DEFAULT 0 CHECK (parts_sent >= 0);
"#;

/// Obligation columns in the order [`obligation_from_row`] reads them.
const COLUMNS: &str = "id, session_key, platform, chat_id, thread_id, reply_to, content, state, \
     attempts, created_at, updated_at, owner_node, lease_until, last_error, parts_sent";

/// [`COLUMNS`] qualified with the alias `d`.
const D_COLUMNS: &str = "d.id, d.session_key, d.platform, d.chat_id, d.thread_id, d.reply_to, \
     d.content, d.state, d.attempts, d.created_at, d.updated_at, d.owner_node, d.lease_until, \
     d.last_error, d.parts_sent";

fn obligation_from_row(row: &Row) -> Result<Obligation> {
    let bad = |what: String| StoreError::Database(format!("delivery ledger: {what}"));
    let state: String = row.try_get(7).map_err(|e| bad(e.to_string()))?;
    let state =
        ObligationState::parse(&state).ok_or_else(|| bad(format!("unknown state `{state}`")))?;
    let attempts: i32 = row.try_get(8).map_err(|e| bad(e.to_string()))?;
    let parts_sent: i32 = row.try_get(14).map_err(|e| bad(e.to_string()))?;
    let owner: Option<String> = row.try_get(11).map_err(|e| bad(e.to_string()))?;
    let get =
        |i: usize| -> Result<Option<String>> { row.try_get(i).map_err(|e| bad(e.to_string())) };
    let text = |i: usize| -> Result<String> { row.try_get(i).map_err(|e| bad(e.to_string())) };
    let time = |i: usize| -> Result<f64> { row.try_get(i).map_err(|e| bad(e.to_string())) };
    Ok(Obligation {
        id: text(0)?,
        session_key: text(1)?,
        platform: text(2)?,
        chat_id: text(3)?,
        thread_id: get(4)?,
        reply_to: get(5)?,
        content: text(6)?,
        state,
        // Clamped rather than failing a sweep over one odd row.
        attempts: u32::try_from(attempts).unwrap_or(0),
        created_at: time(9)?,
        updated_at: time(10)?,
        owner: owner.map(NodeId::new).transpose()?,
        lease_until: row.try_get(12).map_err(|e| bad(e.to_string()))?,
        last_error: get(13)?,
        // The column refuses negative values.
        parts_sent: u32::try_from(parts_sent).unwrap_or(0),
    })
}

/// An attempt number or a count of parts as the `integer` columns hold
/// them: beyond `i32::MAX` is not a real count, so it clamps.
fn integer_sql(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

impl PostgresStore {
    /// Ends attempt `attempt` (or, with `None`, whatever open state the
    /// row is in) in `state`.
    async fn settle(
        &self,
        id: &str,
        attempt: Option<u32>,
        state: ObligationState,
        error: Option<&str>,
    ) -> Result<bool> {
        let client = self.client().await?;
        let error = error.map(|e| truncate_chars(e, MAX_ERROR_CHARS));
        let changed = match attempt {
            Some(attempt) => {
                let sql = format!(
                    "UPDATE delivery_obligations SET state = $2, updated_at = {NOW}, \
                     lease_until = NULL, last_error = COALESCE($3, last_error) \
                     WHERE id = $1 AND attempts = $4 AND state = 'attempting'"
                );
                let statement = client.prepare_cached(&sql).await;
                let statement = statement.map_err(|e| self.error(e))?;
                client
                    .execute(
                        &statement,
                        &[&id, &state.as_str(), &error, &integer_sql(attempt)],
                    )
                    .await
            }
            None => {
                let sql = format!(
                    "UPDATE delivery_obligations SET state = $2, updated_at = {NOW}, \
                     lease_until = NULL, last_error = COALESCE($3, last_error) \
                     WHERE id = $1 AND state IN {OPEN_STATES_SQL}"
                );
                let statement = client.prepare_cached(&sql).await;
                let statement = statement.map_err(|e| self.error(e))?;
                client
                    .execute(&statement, &[&id, &state.as_str(), &error])
                    .await
            }
        };
        Ok(changed.map_err(|e| self.error(e))? == 1)
    }
}

/// Inserts (or starts over) an obligation row, pending, owned by its
/// recorder.
fn record_sql() -> String {
    format!(
        "INSERT INTO delivery_obligations (id, session_key, platform, chat_id, thread_id, \
             reply_to, content, state, attempts, created_at, updated_at, owner_node, parts_sent) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', 0, {NOW}, {NOW}, $8, 0) \
             ON CONFLICT (id) DO UPDATE SET session_key = excluded.session_key, \
             platform = excluded.platform, chat_id = excluded.chat_id, \
             thread_id = excluded.thread_id, reply_to = excluded.reply_to, \
             content = excluded.content, state = 'pending', created_at = excluded.created_at, \
             updated_at = excluded.updated_at, owner_node = excluded.owner_node, \
             lease_until = NULL, last_error = NULL, parts_sent = 0"
    )
}

impl PostgresStore {
    /// Records `o` on `client` (a pooled connection or a transaction).
    async fn record_on(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        o: &NewObligation,
    ) -> Result<()> {
        let statement = client
            .prepare_cached(&record_sql())
            .await
            .map_err(|e| self.error(e))?;
        client
            .execute(
                &statement,
                &[
                    &o.id,
                    &o.session_key,
                    &o.platform,
                    &o.chat_id,
                    &o.thread_id,
                    &o.reply_to,
                    &o.content,
                    &o.owner.as_str(),
                ],
            )
            .await
            .map_err(|e| self.error(e))?;
        Ok(())
    }
}

#[async_trait]
impl LedgerStore for PostgresStore {
    async fn append_reply(
        &self,
        session_id: &str,
        message: &Message,
        usage: &Usage,
        obligation: NewObligation,
    ) -> Result<i64> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        let row = self.append_row_on(&tx, session_id, message, usage).await?;
        self.record_on(&tx, &obligation).await?;
        self.settle_turns_on(&tx, &obligation.settles).await?;
        tx.commit().await.map_err(|e| self.error(e))?;
        Ok(row)
    }

    async fn append_reply_with_calls(
        &self,
        session_id: &str,
        message: &Message,
        calls: &[crate::ModelCall],
        obligation: NewObligation,
    ) -> Result<i64> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        let row = self
            .append_row_on(&tx, session_id, message, &Usage::default())
            .await?;
        self.record_calls_on(&tx, session_id, calls).await?;
        self.record_on(&tx, &obligation).await?;
        self.settle_turns_on(&tx, &obligation.settles).await?;
        tx.commit().await.map_err(|e| self.error(e))?;
        Ok(row)
    }

    async fn record_obligation(&self, o: NewObligation) -> Result<()> {
        if o.settles.is_empty() {
            let client = self.client().await?;
            return self.record_on(&client, &o).await;
        }
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        self.record_on(&tx, &o).await?;
        self.settle_turns_on(&tx, &o.settles).await?;
        tx.commit().await.map_err(|e| self.error(e))
    }

    async fn begin_attempt(&self, id: &str, owner: &NodeId, lease: f64) -> Result<Option<u32>> {
        let client = self.client().await?;
        let sql = format!(
            "UPDATE delivery_obligations SET state = 'attempting', attempts = attempts + 1, \
             updated_at = {NOW}, lease_until = {NOW} + $3 \
             WHERE id = $1 AND owner_node = $2 AND state = 'pending' RETURNING attempts"
        );
        let statement = client
            .prepare_cached(&sql)
            .await
            .map_err(|e| self.error(e))?;
        let row = client
            .query_opt(&statement, &[&id, &owner.as_str(), &lease])
            .await
            .map_err(|e| self.error(e))?;
        Ok(row.map(|r| u32::try_from(r.get::<_, i32>(0)).unwrap_or(0)))
    }

    async fn mark_delivered(&self, id: &str, attempt: u32) -> Result<bool> {
        self.settle(id, Some(attempt), ObligationState::Delivered, None)
            .await
    }

    async fn mark_failed(&self, id: &str, attempt: u32, error: &str) -> Result<bool> {
        self.settle(id, Some(attempt), ObligationState::Failed, Some(error))
            .await
    }

    async fn mark_parts_sent(&self, id: &str, attempt: u32, parts_sent: u32) -> Result<bool> {
        let client = self.client().await?;
        // GREATEST: a late or reordered report of fewer parts must not
        // make a later sender repeat parts the user already has.
        let statement = client
            .prepare_cached(
                "UPDATE delivery_obligations SET parts_sent = GREATEST(parts_sent, $3) \
                 WHERE id = $1 AND attempts = $2 AND state = 'attempting'",
            )
            .await
            .map_err(|e| self.error(e))?;
        let changed = client
            .execute(
                &statement,
                &[&id, &integer_sql(attempt), &integer_sql(parts_sent)],
            )
            .await
            .map_err(|e| self.error(e))?;
        Ok(changed == 1)
    }

    async fn abandon_obligation(
        &self,
        id: &str,
        attempt: Option<u32>,
        reason: &str,
    ) -> Result<bool> {
        self.settle(id, attempt, ObligationState::Abandoned, Some(reason))
            .await
    }

    async fn obligation(&self, id: &str) -> Result<Option<Obligation>> {
        let client = self.client().await?;
        let sql = format!("SELECT {COLUMNS} FROM delivery_obligations WHERE id = $1");
        let statement = client
            .prepare_cached(&sql)
            .await
            .map_err(|e| self.error(e))?;
        let row = client
            .query_opt(&statement, &[&id])
            .await
            .map_err(|e| self.error(e))?;
        row.as_ref().map(obligation_from_row).transpose()
    }

    async fn open_obligations(&self, limit: usize) -> Result<Vec<Obligation>> {
        let client = self.client().await?;
        let limit: Option<i64> = (limit > 0).then(|| i64::try_from(limit).unwrap_or(i64::MAX));
        let sql = format!(
            "SELECT {COLUMNS} FROM delivery_obligations WHERE state IN {OPEN_STATES_SQL} \
             ORDER BY created_at, id LIMIT $1"
        );
        let statement = client
            .prepare_cached(&sql)
            .await
            .map_err(|e| self.error(e))?;
        let rows = client
            .query(&statement, &[&limit])
            .await
            .map_err(|e| self.error(e))?;
        rows.iter().map(obligation_from_row).collect()
    }

    async fn claim_owed(&self, claim: &OwedClaim) -> Result<OwedBatch> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        // Two statements. The first picks and locks candidates, passing
        // over rows another node holds locked. It cannot be the last word:
        // when a row it waited for was changed meanwhile, PostgreSQL
        // re-checks only that row's own new version, not the node row
        // joined to it, so a row another sweep just claimed could still
        // look orphaned. The second statement, with the rows now locked
        // and a fresh snapshot, decides each row's fate from what is
        // committed and applies it. `give_up` rows are abandoned in place
        // (owner and attempts kept, for the post-mortem).
        let claimable = format!(
            "o.state IN {OPEN_STATES_SQL} \
             AND ((o.owner_node IS NOT DISTINCT FROM $1 \
                   AND (o.state = 'failed' \
                        OR (o.state = 'attempting' AND o.lease_until < {NOW}))) \
                  OR (o.owner_node IS DISTINCT FROM $1 \
                   AND (o.owner_node IS NULL OR n.id IS NULL OR n.lease_until < {NOW} \
                        OR (o.state = 'attempting' AND o.lease_until < {NOW})))) \
             AND (o.state <> 'failed' OR o.updated_at < {NOW} - $6) \
             AND (o.attempts >= $3 OR o.created_at < $4 OR o.platform = ANY($2))"
        );
        // From the previous call's last row on (`claim.after`).
        let pick = format!(
            "SELECT o.id, o.created_at FROM delivery_obligations o \
             LEFT JOIN cluster_nodes n ON n.id = o.owner_node \
             WHERE {claimable} \
               AND ($7::float8 IS NULL OR (o.created_at, o.id) > ($7::float8, $8::text)) \
             ORDER BY o.created_at, o.id LIMIT $5 \
             FOR UPDATE OF o SKIP LOCKED"
        );
        let apply = format!(
            "WITH c AS ( \
                 SELECT o.id, o.state AS previous, \
                        (o.attempts >= $3 OR o.created_at < $4) AS give_up, \
                        o.attempts >= $3 AS spent \
                 FROM delivery_obligations o \
                 LEFT JOIN cluster_nodes n ON n.id = o.owner_node \
                 WHERE o.id = ANY($5) AND {claimable}) \
             UPDATE delivery_obligations d SET \
                 state = CASE WHEN c.give_up THEN 'abandoned' ELSE 'attempting' END, \
                 attempts = CASE WHEN c.give_up THEN d.attempts ELSE d.attempts + 1 END, \
                 owner_node = CASE WHEN c.give_up THEN d.owner_node ELSE $1 END, \
                 lease_until = CASE WHEN c.give_up THEN NULL ELSE {NOW} + $7 END, \
                 last_error = CASE WHEN NOT c.give_up THEN d.last_error \
                                   WHEN c.spent THEN $8 ELSE $9 END, \
                 updated_at = {NOW} \
             FROM c WHERE d.id = c.id \
             RETURNING {D_COLUMNS}, c.previous, c.give_up"
        );
        let limit = i64::try_from(claim.limit.max(1)).unwrap_or(i64::MAX);
        let max_attempts = integer_sql(claim.max_attempts);
        let me = claim.claimer.as_str();
        let pick = tx.prepare_cached(&pick).await.map_err(|e| self.error(e))?;
        let picked_rows = tx
            .query(
                &pick,
                &[
                    &me,
                    &claim.platforms,
                    &max_attempts,
                    &claim.stale_before,
                    &limit,
                    &claim.retry_failed_after,
                    &claim.after.as_ref().map(|a| a.created_at),
                    &claim.after.as_ref().map(|a| a.id.as_str()),
                ],
            )
            .await
            .map_err(|e| self.error(e))?;
        let last = picked_rows.last().map(|r| OwedCursor {
            id: r.get(0),
            created_at: r.get(1),
        });
        let picked: Vec<String> = picked_rows.iter().map(|r| r.get(0)).collect();
        if picked.is_empty() {
            tx.commit().await.map_err(|e| self.error(e))?;
            return Ok(OwedBatch::default());
        }
        let apply = tx.prepare_cached(&apply).await.map_err(|e| self.error(e))?;
        let rows = tx
            .query(
                &apply,
                &[
                    &me,
                    &claim.platforms,
                    &max_attempts,
                    &claim.stale_before,
                    &picked,
                    &claim.retry_failed_after,
                    &claim.lease,
                    &GAVE_UP_ATTEMPTS,
                    &GAVE_UP_AGE,
                ],
            )
            .await
            .map_err(|e| self.error(e))?;
        tx.commit().await.map_err(|e| self.error(e))?;
        let mut batch = OwedBatch {
            last,
            ..OwedBatch::default()
        };
        for row in &rows {
            let obligation = obligation_from_row(row)?;
            let previous: String = row.get(15);
            let gave_up: bool = row.get(16);
            if gave_up {
                batch.abandoned.push(obligation);
            } else {
                let previous = ObligationState::parse(&previous).ok_or_else(|| {
                    StoreError::Database(format!(
                        "delivery ledger has an unknown state `{previous}`"
                    ))
                })?;
                batch.claimed.push(ClaimedObligation {
                    obligation,
                    previous,
                });
            }
        }
        // RETURNING gives no order: oldest first, as the sweep sends them.
        let key = |o: &Obligation| (o.created_at, o.id.clone());
        batch.claimed.sort_by(|a, b| {
            key(&a.obligation)
                .partial_cmp(&key(&b.obligation))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        batch.abandoned.sort_by(|a, b| {
            key(a)
                .partial_cmp(&key(b))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        Ok(batch)
    }

    async fn prune_obligations(&self, cutoff: Timestamp) -> Result<u64> {
        let client = self.client().await?;
        client
            .execute(
                "DELETE FROM delivery_obligations \
                 WHERE state IN ('delivered', 'abandoned') AND updated_at < $1",
                &[&cutoff],
            )
            .await
            .map_err(|e| self.error(e))
    }

    async fn obligation_counts(&self) -> Result<BTreeMap<ObligationState, u64>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT state, count(*) FROM delivery_obligations GROUP BY state",
                &[],
            )
            .await
            .map_err(|e| self.error(e))?;
        let mut counts = BTreeMap::new();
        for row in rows {
            let state: String = row.get(0);
            let n: i64 = row.get(1);
            let state = ObligationState::parse(&state).ok_or_else(|| {
                StoreError::Database(format!("delivery ledger has an unknown state `{state}`"))
            })?;
            counts.insert(state, u64::try_from(n).unwrap_or(0));
        }
        Ok(counts)
    }
}
