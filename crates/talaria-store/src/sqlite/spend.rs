//! The per-call ledger on SQLite (see `crate::spend`).

use rusqlite::{OptionalExtension, Transaction, params};

use super::add_usage_row;
use super::conn::OpResult;
use super::rows::{from_sql_count, to_sql_count};
use crate::spend::CHAT_EXPR;
use crate::{ModelCall, SpendScope, StoreError, Timestamp, UsageGroup, UsageReport, UsageTotals};

/// Adds `calls` to session `id`: its counters, its cost and a ledger row
/// each, inside the caller's transaction.
pub(super) fn record_calls(
    tx: &Transaction<'_>,
    id: &str,
    calls: &[ModelCall],
    at: Timestamp,
) -> OpResult<()> {
    if calls.is_empty() {
        return Ok(());
    }
    let usage = ModelCall::total_usage(calls);
    if usage != talaria_core::Usage::default() {
        add_usage_row(tx, id, &usage)?;
    }
    let cost = calls
        .iter()
        .fold(0u64, |sum, c| sum.saturating_add(c.cost_micros));
    // Read, add with saturation, write back, as the token counters do.
    let current: i64 = tx
        .prepare_cached("SELECT cost_micros FROM sessions WHERE id = ?1")?
        .query_row(params![id], |r| r.get(0))
        .optional()?
        .ok_or_else(|| StoreError::NoSuchSession(id.to_owned()))?;
    let total = from_sql_count(current).saturating_add(cost);
    tx.prepare_cached("UPDATE sessions SET cost_micros = ?2 WHERE id = ?1")?
        .execute(params![id, to_sql_count(total)])?;
    let mut insert = tx.prepare_cached(
        "INSERT INTO model_calls (session_id, at, platform, session_key, chat_id, provider, \
         model, kind, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, \
         reasoning_tokens, cost_micros, tool_calls, turns) \
         SELECT id, ?2, source, session_key, chat_id, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, \
         ?12, ?13 FROM sessions WHERE id = ?1",
    )?;
    for c in calls {
        insert.execute(params![
            id,
            at,
            c.provider,
            c.model,
            c.kind,
            to_sql_count(c.usage.input_tokens),
            to_sql_count(c.usage.output_tokens),
            to_sql_count(c.usage.cache_read_tokens),
            to_sql_count(c.usage.cache_write_tokens),
            to_sql_count(c.usage.reasoning_tokens),
            to_sql_count(c.cost_micros),
            i64::from(c.tool_calls),
            i64::from(c.starts_turn),
        ])?;
    }
    Ok(())
}

/// The session's running cost (0 when there is no such session).
pub(super) fn session_cost(tx: &Transaction<'_>, id: &str) -> OpResult<u64> {
    let cost: Option<i64> = tx
        .prepare_cached("SELECT cost_micros FROM sessions WHERE id = ?1")?
        .query_row(params![id], |r| r.get(0))
        .optional()?;
    Ok(cost.map_or(0, from_sql_count))
}

/// The cost of the calls in `scope` since `since`, over the indexes on
/// `(at)`, `(session_key, at)` and `(platform, chat_id, at)`.
pub(super) fn spend_since(
    tx: &Transaction<'_>,
    since: Timestamp,
    scope: &SpendScope,
) -> OpResult<u64> {
    // TOTAL() is a float and never overflows; the micro-dollars of any
    // real spend are far below 2^53, where it is exact.
    let sum: f64 = match scope {
        SpendScope::All => tx
            .prepare_cached("SELECT TOTAL(cost_micros) FROM model_calls WHERE at >= ?1")?
            .query_row(params![since], |r| r.get(0))?,
        SpendScope::SessionKey(key) => tx
            .prepare_cached(
                "SELECT TOTAL(cost_micros) FROM model_calls WHERE session_key = ?1 AND at >= ?2",
            )?
            .query_row(params![key, since], |r| r.get(0))?,
        SpendScope::Chat { platform, chat_id } => tx
            .prepare_cached(
                "SELECT TOTAL(cost_micros) FROM model_calls \
                 WHERE platform = ?1 AND chat_id = ?2 AND at >= ?3",
            )?
            .query_row(params![platform, chat_id, since], |r| r.get(0))?,
    };
    Ok(float_count(sum))
}

fn float_count(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 {
        v.round() as u64
    } else {
        0
    }
}

const SUMS: &str = "COUNT(*), TOTAL(turns), TOTAL(tool_calls), TOTAL(input_tokens), \
     TOTAL(output_tokens), TOTAL(cache_read_tokens), TOTAL(cache_write_tokens), \
     TOTAL(reasoning_tokens), TOTAL(cost_micros)";

fn totals_at(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<UsageTotals> {
    let n = |i: usize| -> rusqlite::Result<u64> { Ok(float_count(r.get(at + i)?)) };
    Ok(UsageTotals {
        calls: from_sql_count(r.get(at)?),
        turns: n(1)?,
        tool_calls: n(2)?,
        input_tokens: n(3)?,
        output_tokens: n(4)?,
        cache_read_tokens: n(5)?,
        cache_write_tokens: n(6)?,
        reasoning_tokens: n(7)?,
        cost_micros: n(8)?,
    })
}

fn groups(
    tx: &Transaction<'_>,
    expr: &str,
    order: &str,
    since: Timestamp,
    limit: usize,
) -> OpResult<Vec<UsageGroup>> {
    let sql = format!(
        "SELECT {expr} AS name, {SUMS} FROM model_calls WHERE at >= ?1 \
         GROUP BY name ORDER BY {order} LIMIT ?2"
    );
    let mut statement = tx.prepare_cached(&sql)?;
    let rows = statement.query_map(params![since, to_sql_count(limit as u64)], |r| {
        Ok(UsageGroup {
            name: r.get::<_, Option<String>>(0)?.unwrap_or_default(),
            totals: totals_at(r, 1)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// The report `talaria insights` prints.
pub(super) fn usage_report(
    tx: &Transaction<'_>,
    since: Timestamp,
    top: usize,
) -> OpResult<UsageReport> {
    let total = tx
        .prepare_cached(&format!("SELECT {SUMS} FROM model_calls WHERE at >= ?1"))?
        .query_row(params![since], |r| totals_at(r, 0))?;
    let costliest = "TOTAL(cost_micros) DESC, COUNT(*) DESC, name";
    Ok(UsageReport {
        total,
        // A day per row: as many as the window has days, so no `top`.
        by_day: groups(tx, "date(at, 'unixepoch')", "name", since, 10_000)?,
        by_model: groups(tx, "model", costliest, since, top)?,
        by_platform: groups(tx, "platform", costliest, since, top)?,
        by_chat: groups(tx, CHAT_EXPR, costliest, since, top)?,
    })
}
