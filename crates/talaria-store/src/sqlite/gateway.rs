//! The gateway's stores on SQLite: routes, the delivery ledger and pairing.
//!
//! Conventions beyond the traits' documentation:
//! - [`RouteStore::touch_route`] on a key without a route does nothing;
//! - [`RouteStore::stale_routes`] walks the `updated_at` index (schema
//!   step 3) and joins each candidate to its session by primary key;
//! - the ledger's state changes by id ([`LedgerStore::mark_attempting`] and
//!   friends) succeed without effect on an unknown id: the ledger exists to
//!   make replies survive crashes and must never be the reason one is lost;
//! - [`LedgerStore::mark_attempting`] does not count an attempt; only a
//!   claim does (a first send is not a retry);
//! - [`LedgerStore::abandon_obligation`] keeps `reason` in `last_error`,
//!   truncated like a send error;
//! - [`LedgerStore::obligation_counts`] lists only states that have rows;
//! - pairing codes go through [`normalize_pairing_code`] before hashing,
//!   both when offered and when approved, so approval is case-insensitive;
//! - an offer deletes the user's pending code on the platform before
//!   counting the platform's pending codes, so a user holds at most one and
//!   a replacement is never refused for lack of room;
//! - a refused offer (locked out, too many pending) stamps the user's offer
//!   time in the same transaction, so the refusal is said once per
//!   interval;
//! - an approval removes every pending code of the approved user, not just
//!   the one that matched (at most one since offers replace, but a row
//!   written before that rule must not outlive the approval either).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use async_trait::async_trait;
use rand::Rng;
use rusqlite::types::Type;
use rusqlite::{OptionalExtension, Row, Transaction, params};
use sha2::{Digest, Sha256};

use super::SqliteStore;
use super::conn::OpResult;
use super::rows::{from_sql_count, from_sql_small_count, now, to_sql_count};
use crate::gateway::{
    ApproveOutcome, ApprovedUser, CursorStore, InboundStore, LedgerStore, NewObligation,
    Obligation, ObligationState, OfferOutcome, Owner, PairingLimits, PairingSnapshot, PairingStore,
    PendingPairing, Route, RouteStore, normalize_pairing_code,
};
use crate::{Result, StoreError, Timestamp};

/// Longest error text kept on an obligation, in chars.
const MAX_ERROR_CHARS: usize = 500;

// ---------------------------------------------------------------- routes

/// Route columns are read in the order `session_key, session_id,
/// created_at, updated_at`.
fn route_from_row(r: &Row<'_>) -> rusqlite::Result<Route> {
    Ok(Route {
        session_key: r.get(0)?,
        session_id: r.get(1)?,
        created_at: r.get(2)?,
        updated_at: r.get(3)?,
    })
}

#[async_trait]
impl RouteStore for SqliteStore {
    async fn route(&self, session_key: &str) -> Result<Option<Route>> {
        let key = session_key.to_string();
        self.read(move |tx| {
            Ok(tx
                .prepare_cached(
                    "SELECT session_key, session_id, created_at, updated_at \
                     FROM gateway_routes WHERE session_key = ?1",
                )?
                .query_row(params![key], route_from_row)
                .optional()?)
        })
        .await
    }

    async fn set_route(&self, session_key: &str, session_id: &str) -> Result<()> {
        let key = session_key.to_string();
        let id = session_id.to_string();
        self.write(move |tx| {
            let at = now();
            tx.prepare_cached(
                "INSERT INTO gateway_routes (session_key, session_id, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?3) \
                 ON CONFLICT (session_key) DO UPDATE SET session_id = excluded.session_id, \
                 created_at = excluded.created_at, updated_at = excluded.updated_at",
            )?
            .execute(params![key, id, at])?;
            Ok(())
        })
        .await
    }

    async fn touch_route(&self, session_key: &str) -> Result<()> {
        let key = session_key.to_string();
        self.write(move |tx| {
            tx.prepare_cached("UPDATE gateway_routes SET updated_at = ?2 WHERE session_key = ?1")?
                .execute(params![key, now()])?;
            Ok(())
        })
        .await
    }

    async fn stale_routes(&self, before: Timestamp, limit: usize) -> Result<Vec<Route>> {
        let limit = to_sql_count(limit as u64);
        self.read(move |tx| {
            Ok(tx
                .prepare_cached(
                    "SELECT r.session_key, r.session_id, r.created_at, r.updated_at \
                     FROM gateway_routes r JOIN sessions s ON s.id = r.session_id \
                     WHERE r.updated_at < ?1 \
                     AND (s.ended_at IS NULL OR s.ended_at < r.updated_at) \
                     ORDER BY r.updated_at, r.session_key LIMIT ?2",
                )?
                .query_map(params![before, limit], route_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    async fn end_route_session(&self, route: &Route, reason: &str) -> Result<bool> {
        let id = route.session_id.clone();
        let since = route.updated_at;
        let reason = reason.to_string();
        self.write(move |tx| {
            // The guard and the stamp in one statement: a second caller
            // acting on the same route state finds the stamp and changes
            // nothing.
            let changed = tx
                .prepare_cached(
                    "UPDATE sessions SET ended_at = ?3, end_reason = ?4 \
                     WHERE id = ?1 AND (ended_at IS NULL OR ended_at < ?2)",
                )?
                .execute(params![id, since, now(), reason])?;
            Ok(changed > 0)
        })
        .await
    }
}

// ---------------------------------------------------------------- ledger

/// The states [`ObligationState::is_open`] accepts, as an SQL list (a unit
/// test keeps the two in step).
const OPEN_STATES: &str = "('pending', 'attempting', 'failed')";

/// Obligation columns in the order [`obligation_from_row`] reads them.
const OBLIGATION_COLUMNS: &str = "id, session_key, platform, chat_id, thread_id, reply_to, \
     content, state, attempts, created_at, updated_at, owner_pid, owner_started_at, last_error";

fn parse_state(s: &str) -> Option<ObligationState> {
    [
        ObligationState::Pending,
        ObligationState::Attempting,
        ObligationState::Delivered,
        ObligationState::Failed,
        ObligationState::Abandoned,
    ]
    .into_iter()
    .find(|state| state.as_str() == s)
}

fn conversion_error(column: usize, ty: Type, what: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(column, ty, Box::new(StoreError::Database(what)))
}

/// Start times are stored bit-for-bit as SQLite's signed integer: the
/// round trip is exact, so equality (all a claim needs) is preserved even
/// for values beyond `i64::MAX`.
fn start_to_sql(started_at: u64) -> i64 {
    started_at as i64
}

fn start_from_sql(started_at: i64) -> u64 {
    started_at as u64
}

/// The owner as the two nullable columns, `None` being "no owner".
fn owner_to_sql(owner: Option<Owner>) -> (Option<i64>, Option<i64>) {
    match owner {
        None => (None, None),
        Some(o) => (Some(i64::from(o.pid)), o.started_at.map(start_to_sql)),
    }
}

fn obligation_from_row(row: &Row<'_>) -> rusqlite::Result<Obligation> {
    let state: String = row.get(7)?;
    let state = parse_state(&state)
        .ok_or_else(|| conversion_error(7, Type::Text, format!("unknown state `{state}`")))?;
    let attempts: i64 = row.get(8)?;
    let pid: Option<i64> = row.get(11)?;
    let started_at: Option<i64> = row.get(12)?;
    let owner = match pid {
        None => None,
        Some(pid) => Some(Owner {
            pid: u32::try_from(pid).map_err(|_| {
                conversion_error(
                    11,
                    Type::Integer,
                    format!("owner pid {pid} is out of range"),
                )
            })?,
            started_at: started_at.map(start_from_sql),
        }),
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
        last_error: row.get(13)?,
    })
}

/// At most `max` chars of `s`, cut on a char boundary.
fn truncate_chars(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((end, _)) => &s[..end],
        None => s,
    }
}

/// Sets a row's state (and optionally its error) by id; an unknown id is
/// not an error (see the module docs).
fn set_state(
    tx: &Transaction<'_>,
    id: &str,
    state: ObligationState,
    error: Option<&str>,
) -> OpResult<()> {
    match error {
        None => tx
            .prepare_cached(
                "UPDATE delivery_obligations SET state = ?2, updated_at = ?3 WHERE id = ?1",
            )?
            .execute(params![id, state.as_str(), now()])?,
        Some(error) => tx
            .prepare_cached(
                "UPDATE delivery_obligations SET state = ?2, updated_at = ?3, last_error = ?4 \
                 WHERE id = ?1",
            )?
            .execute(params![
                id,
                state.as_str(),
                now(),
                truncate_chars(error, MAX_ERROR_CHARS)
            ])?,
    };
    Ok(())
}

impl SqliteStore {
    async fn set_obligation_state(
        &self,
        id: &str,
        state: ObligationState,
        error: Option<&str>,
    ) -> Result<()> {
        let id = id.to_string();
        let error = error.map(str::to_string);
        self.write(move |tx| set_state(tx, &id, state, error.as_deref()))
            .await
    }
}

#[async_trait]
impl LedgerStore for SqliteStore {
    async fn record_obligation(&self, obligation: NewObligation) -> Result<()> {
        self.write(move |tx| {
            let o = &obligation;
            let at = now();
            let (pid, started_at) = owner_to_sql(Some(o.owner));
            // REPLACE: re-recording the same reply starts it over, because
            // the caller is about to send it again from scratch.
            tx.prepare_cached(
                "INSERT OR REPLACE INTO delivery_obligations (id, session_key, platform, \
                 chat_id, thread_id, reply_to, content, state, attempts, created_at, \
                 updated_at, owner_pid, owner_started_at, last_error) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 0, ?9, ?9, ?10, ?11, NULL)",
            )?
            .execute(params![
                o.id,
                o.session_key,
                o.platform,
                o.chat_id,
                o.thread_id,
                o.reply_to,
                o.content,
                ObligationState::Pending.as_str(),
                at,
                pid,
                started_at,
            ])?;
            Ok(())
        })
        .await
    }

    async fn mark_attempting(&self, id: &str) -> Result<()> {
        self.set_obligation_state(id, ObligationState::Attempting, None)
            .await
    }

    async fn mark_delivered(&self, id: &str) -> Result<()> {
        self.set_obligation_state(id, ObligationState::Delivered, None)
            .await
    }

    async fn mark_failed(&self, id: &str, error: &str) -> Result<()> {
        self.set_obligation_state(id, ObligationState::Failed, Some(error))
            .await
    }

    async fn abandon_obligation(&self, id: &str, reason: &str) -> Result<()> {
        self.set_obligation_state(id, ObligationState::Abandoned, Some(reason))
            .await
    }

    async fn obligation(&self, id: &str) -> Result<Option<Obligation>> {
        let id = id.to_string();
        self.read(move |tx| {
            let sql =
                format!("SELECT {OBLIGATION_COLUMNS} FROM delivery_obligations WHERE id = ?1");
            Ok(tx
                .prepare_cached(&sql)?
                .query_row(params![id], obligation_from_row)
                .optional()?)
        })
        .await
    }

    async fn open_obligations(&self) -> Result<Vec<Obligation>> {
        self.read(move |tx| {
            let sql = format!(
                "SELECT {OBLIGATION_COLUMNS} FROM delivery_obligations \
                 WHERE state IN {OPEN_STATES} ORDER BY created_at, rowid"
            );
            Ok(tx
                .prepare_cached(&sql)?
                .query_map([], obligation_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    async fn claim_obligation(
        &self,
        id: &str,
        expected: Option<Owner>,
        new_owner: Owner,
    ) -> Result<bool> {
        let claims = vec![(id.to_string(), expected)];
        let won = self.claim_obligations(&claims, new_owner).await?;
        Ok(won.first().copied().unwrap_or(false))
    }

    async fn claim_obligations(
        &self,
        claims: &[(String, Option<Owner>)],
        new_owner: Owner,
    ) -> Result<Vec<bool>> {
        let claims = claims.to_vec();
        let (new_pid, new_started) = owner_to_sql(Some(new_owner));
        self.write(move |tx| {
            // One guarded statement per row: whichever sweeper's UPDATE
            // runs second no longer sees the owner it expected and changes
            // nothing. `IS` makes NULL (no owner, unknown start time)
            // compare equal. When a process re-claims its own row, expected
            // and new owner are the same, so the owner test alone would let
            // its second claim through; the first claim left the row
            // `attempting` under that owner, which the last condition
            // refuses.
            let sql = format!(
                "UPDATE delivery_obligations SET owner_pid = ?2, owner_started_at = ?3, \
                 state = 'attempting', attempts = attempts + 1, updated_at = ?4 \
                 WHERE id = ?1 AND state IN {OPEN_STATES} \
                 AND owner_pid IS ?5 AND owner_started_at IS ?6 \
                 AND NOT (state = 'attempting' AND owner_pid IS ?2 AND owner_started_at IS ?3)"
            );
            let mut update = tx.prepare_cached(&sql)?;
            let at = now();
            let mut won = Vec::with_capacity(claims.len());
            for (id, expected) in &claims {
                let (old_pid, old_started) = owner_to_sql(*expected);
                let changed =
                    update.execute(params![id, new_pid, new_started, at, old_pid, old_started])?;
                won.push(changed == 1);
            }
            Ok(won)
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
                let state = parse_state(&state).ok_or_else(|| {
                    StoreError::Database(format!("delivery ledger has an unknown state `{state}`"))
                })?;
                counts.insert(state, from_sql_count(n));
            }
            Ok(counts)
        })
        .await
    }
}

// ---------------------------------------------------------------- pairing

fn to_hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out
}

fn random_hex(len_bytes: usize) -> String {
    let mut bytes = vec![0u8; len_bytes];
    rand::rng().fill(bytes.as_mut_slice());
    to_hex(&bytes)
}

/// Hex sha256 of the salt (as its hex text) followed by the code.
fn code_hash(salt_hex: &str, code: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(salt_hex.as_bytes());
    hasher.update(code.as_bytes());
    to_hex(&hasher.finalize())
}

/// The end of the platform's lock, if one is in force at `at`.
fn active_lockout(tx: &Transaction<'_>, platform: &str, at: Timestamp) -> OpResult<Option<f64>> {
    Ok(tx
        .prepare_cached(
            "SELECT stamp FROM pairing_stamps \
             WHERE platform = ?1 AND kind = 'lockout' AND subject = '' AND stamp > ?2",
        )?
        .query_row(params![platform, at], |r| r.get(0))
        .optional()?)
}

/// Drops what can no longer matter: expired codes, ended locks and offer
/// stamps older than the interval.
fn drop_expired(tx: &Transaction<'_>, at: Timestamp, limits: &PairingLimits) -> OpResult<()> {
    tx.prepare_cached("DELETE FROM pairing_pending WHERE created_at < ?1")?
        .execute(params![at - limits.code_ttl])?;
    tx.prepare_cached("DELETE FROM pairing_stamps WHERE kind = 'lockout' AND stamp <= ?1")?
        .execute(params![at])?;
    tx.prepare_cached("DELETE FROM pairing_stamps WHERE kind = 'offer' AND stamp < ?1")?
        .execute(params![at - limits.offer_interval])?;
    Ok(())
}

/// Records that the user was answered at `at` (with a code or a refusal),
/// which starts their offer interval.
fn stamp_offer(tx: &Transaction<'_>, platform: &str, user_id: &str, at: Timestamp) -> OpResult<()> {
    tx.prepare_cached(
        "INSERT INTO pairing_stamps (platform, kind, subject, stamp) \
         VALUES (?1, 'offer', ?2, ?3) \
         ON CONFLICT (platform, kind, subject) DO UPDATE SET stamp = excluded.stamp",
    )?
    .execute(params![platform, user_id, at])?;
    Ok(())
}

fn reset_failures(tx: &Transaction<'_>, platform: &str) -> OpResult<()> {
    tx.prepare_cached(
        "DELETE FROM pairing_stamps WHERE platform = ?1 AND kind = 'failures' AND subject = ''",
    )?
    .execute(params![platform])?;
    Ok(())
}

/// Counts one failed approval; returns the new count.
fn add_failure(tx: &Transaction<'_>, platform: &str) -> OpResult<u32> {
    let count: i64 = tx
        .prepare_cached(
            "INSERT INTO pairing_stamps (platform, kind, subject, count) \
             VALUES (?1, 'failures', '', 1) \
             ON CONFLICT (platform, kind, subject) DO UPDATE SET count = count + 1 \
             RETURNING count",
        )?
        .query_row(params![platform], |r| r.get(0))?;
    Ok(from_sql_small_count(count))
}

/// A pending code's row as approval needs it.
struct PendingRow {
    user_id: String,
    user_name: Option<String>,
    salt: String,
    code_hash: String,
}

#[async_trait]
impl PairingStore for SqliteStore {
    async fn pairing_offer(
        &self,
        platform: &str,
        user_id: &str,
        user_name: Option<&str>,
        code: &str,
        limits: PairingLimits,
    ) -> Result<OfferOutcome> {
        let platform = platform.to_string();
        let user_id = user_id.to_string();
        let user_name = user_name.map(str::to_string);
        let code = normalize_pairing_code(code);
        // Every check, the stamp and the insert share one IMMEDIATE
        // transaction, so two gateways on one database cannot both pass a
        // limit, nor both answer one user.
        self.write(move |tx| {
            let at = now();
            drop_expired(tx, at, &limits)?;
            // The user's interval first: whatever else holds (a lockout
            // included), someone answered within it hears nothing more.
            let last_offer: Option<f64> = tx
                .prepare_cached(
                    "SELECT stamp FROM pairing_stamps \
                     WHERE platform = ?1 AND kind = 'offer' AND subject = ?2",
                )?
                .query_row(params![platform, user_id], |r| r.get(0))
                .optional()?;
            if last_offer.is_some_and(|t| at - t < limits.offer_interval) {
                return Ok(OfferOutcome::RateLimited);
            }
            if active_lockout(tx, &platform, at)?.is_some() {
                stamp_offer(tx, &platform, &user_id, at)?;
                return Ok(OfferOutcome::LockedOut);
            }
            // One code per user: the new one replaces theirs, and theirs
            // does not count against the platform's limit.
            tx.prepare_cached("DELETE FROM pairing_pending WHERE platform = ?1 AND user_id = ?2")?
                .execute(params![platform, user_id])?;
            let pending: i64 = tx
                .prepare_cached("SELECT COUNT(*) FROM pairing_pending WHERE platform = ?1")?
                .query_row(params![platform], |r| r.get(0))?;
            if from_sql_count(pending) >= limits.max_pending as u64 {
                stamp_offer(tx, &platform, &user_id, at)?;
                return Ok(OfferOutcome::TooManyPending);
            }
            let salt = random_hex(16);
            let hash = code_hash(&salt, &code);
            tx.prepare_cached(
                "INSERT INTO pairing_pending (entry_id, platform, user_id, user_name, salt, \
                 code_hash, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                random_hex(8),
                platform,
                user_id,
                user_name,
                salt,
                hash,
                at
            ])?;
            stamp_offer(tx, &platform, &user_id, at)?;
            Ok(OfferOutcome::Created)
        })
        .await
    }

    async fn pairing_approve(
        &self,
        platform: &str,
        code: &str,
        limits: PairingLimits,
    ) -> Result<ApproveOutcome> {
        let platform = platform.to_string();
        let code = normalize_pairing_code(code);
        self.write(move |tx| {
            let at = now();
            drop_expired(tx, at, &limits)?;
            if let Some(until) = active_lockout(tx, &platform, at)? {
                return Ok(ApproveOutcome::LockedOut { until });
            }
            let rows = tx
                .prepare_cached(
                    "SELECT user_id, user_name, salt, code_hash FROM pairing_pending \
                     WHERE platform = ?1 AND created_at >= ?2 ORDER BY created_at, entry_id",
                )?
                .query_map(params![platform, at - limits.code_ttl], |r| {
                    Ok(PendingRow {
                        user_id: r.get(0)?,
                        user_name: r.get(1)?,
                        salt: r.get(2)?,
                        code_hash: r.get(3)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            // Every row is hashed and compared, match or not, so the time
            // taken does not reveal which (or whether an early) row matched.
            let mut found: Option<&PendingRow> = None;
            for row in &rows {
                let candidate = code_hash(&row.salt, &code);
                let equal = talaria_core::constant_time_eq(candidate.as_bytes(), row.code_hash.as_bytes());
                if equal && found.is_none() {
                    found = Some(row);
                }
            }
            let Some(row) = found else {
                let failures = add_failure(tx, &platform)?;
                if failures >= limits.max_failures.max(1) {
                    let until = at + limits.lockout;
                    tx.prepare_cached(
                        "INSERT INTO pairing_stamps (platform, kind, subject, stamp) \
                         VALUES (?1, 'lockout', '', ?2) \
                         ON CONFLICT (platform, kind, subject) DO UPDATE SET stamp = excluded.stamp",
                    )?
                    .execute(params![platform, until])?;
                    reset_failures(tx, &platform)?;
                    return Ok(ApproveOutcome::LockedOut { until });
                }
                return Ok(ApproveOutcome::NoMatch { failures });
            };
            tx.prepare_cached("DELETE FROM pairing_pending WHERE platform = ?1 AND user_id = ?2")?
                .execute(params![platform, row.user_id])?;
            // Approving someone already approved refreshes the stamp; a
            // known name is not forgotten because this code lacked one.
            let user_name: Option<String> = tx
                .prepare_cached(
                    "INSERT INTO pairing_approved (platform, user_id, user_name, approved_at) \
                     VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (platform, user_id) DO UPDATE SET \
                     user_name = COALESCE(excluded.user_name, user_name), \
                     approved_at = excluded.approved_at \
                     RETURNING user_name",
                )?
                .query_row(params![platform, row.user_id, row.user_name, at], |r| {
                    r.get(0)
                })?;
            reset_failures(tx, &platform)?;
            Ok(ApproveOutcome::Approved(ApprovedUser {
                platform: platform.clone(),
                user_id: row.user_id.clone(),
                user_name,
                approved_at: at,
            }))
        })
        .await
    }

    async fn pairing_is_approved(&self, platform: &str, user_id: &str) -> Result<bool> {
        let platform = platform.to_string();
        let user_id = user_id.to_string();
        self.read(move |tx| {
            Ok(tx
                .prepare_cached(
                    "SELECT 1 FROM pairing_approved WHERE platform = ?1 AND user_id = ?2",
                )?
                .exists(params![platform, user_id])?)
        })
        .await
    }

    async fn pairing_revoke(&self, platform: &str, user_id: &str) -> Result<bool> {
        let platform = platform.to_string();
        let user_id = user_id.to_string();
        self.write(move |tx| {
            let deleted = tx
                .prepare_cached(
                    "DELETE FROM pairing_approved WHERE platform = ?1 AND user_id = ?2",
                )?
                .execute(params![platform, user_id])?;
            Ok(deleted > 0)
        })
        .await
    }

    async fn pairing_clear_pending(&self, platform: Option<&str>) -> Result<u64> {
        let platform = platform.map(str::to_string);
        self.write(move |tx| {
            let deleted = match &platform {
                Some(p) => tx
                    .prepare_cached("DELETE FROM pairing_pending WHERE platform = ?1")?
                    .execute(params![p])?,
                None => tx
                    .prepare_cached("DELETE FROM pairing_pending")?
                    .execute([])?,
            };
            Ok(deleted as u64)
        })
        .await
    }

    async fn pairing_snapshot(&self, limits: PairingLimits) -> Result<PairingSnapshot> {
        self.read(move |tx| {
            let at = now();
            let pending = tx
                .prepare_cached(
                    "SELECT platform, user_id, user_name, created_at FROM pairing_pending \
                     WHERE created_at >= ?1 ORDER BY platform, created_at, entry_id",
                )?
                .query_map(params![at - limits.code_ttl], |r| {
                    Ok(PendingPairing {
                        platform: r.get(0)?,
                        user_id: r.get(1)?,
                        user_name: r.get(2)?,
                        created_at: r.get(3)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let approved = tx
                .prepare_cached(
                    "SELECT platform, user_id, user_name, approved_at FROM pairing_approved \
                     ORDER BY platform, approved_at, user_id",
                )?
                .query_map([], |r| {
                    Ok(ApprovedUser {
                        platform: r.get(0)?,
                        user_id: r.get(1)?,
                        user_name: r.get(2)?,
                        approved_at: r.get(3)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let lockouts = tx
                .prepare_cached(
                    "SELECT platform, stamp FROM pairing_stamps \
                     WHERE kind = 'lockout' AND subject = '' AND stamp > ?1 ORDER BY platform",
                )?
                .query_map(params![at], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(PairingSnapshot {
                pending,
                approved,
                lockouts,
            })
        })
        .await
    }
}

// ---------------------------------------------------------------- inbound

#[async_trait]
impl InboundStore for SqliteStore {
    async fn first_delivery(&self, platform: &str, inbound_id: &str) -> Result<bool> {
        let (platform, id) = (platform.to_owned(), inbound_id.to_owned());
        self.write(move |tx| {
            let inserted = tx
                .prepare_cached(
                    "INSERT INTO inbound_seen (platform, inbound_id, seen_at) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (platform, inbound_id) DO NOTHING",
                )?
                .execute(params![platform, id, now()])?;
            Ok(inserted == 1)
        })
        .await
    }

    async fn prune_inbound(&self, cutoff: Timestamp) -> Result<u64> {
        self.write(move |tx| {
            let deleted = tx
                .prepare_cached("DELETE FROM inbound_seen WHERE seen_at < ?1")?
                .execute(params![cutoff])?;
            Ok(deleted as u64)
        })
        .await
    }
}

// ---------------------------------------------------------------- cursors

#[async_trait]
impl CursorStore for SqliteStore {
    async fn cursor(&self, platform: &str, name: &str) -> Result<Option<String>> {
        let (platform, name) = (platform.to_owned(), name.to_owned());
        self.read(move |tx| {
            Ok(tx
                .prepare_cached(
                    "SELECT value FROM adapter_cursors WHERE platform = ?1 AND name = ?2",
                )?
                .query_row(params![platform, name], |r| r.get(0))
                .optional()?)
        })
        .await
    }

    async fn set_cursor(&self, platform: &str, name: &str, value: &str) -> Result<()> {
        let (platform, name, value) = (platform.to_owned(), name.to_owned(), value.to_owned());
        self.write(move |tx| {
            tx.prepare_cached(
                "INSERT INTO adapter_cursors (platform, name, value, updated_at) \
                 VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (platform, name) DO UPDATE SET \
                 value = excluded.value, updated_at = excluded.updated_at",
            )?
            .execute(params![platform, name, value, now()])?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate_chars("héllo", 2), "hé");
        assert_eq!(truncate_chars("abc", 10), "abc");
        let long = "é".repeat(600);
        assert_eq!(truncate_chars(&long, 500).chars().count(), 500);
    }

    #[test]
    fn hash_is_sha256_of_salt_text_then_code() {
        // sha256("00ABC") computed independently.
        let expected = to_hex(&Sha256::digest(b"00ABC"));
        assert_eq!(code_hash("00", "ABC"), expected);
        assert_eq!(code_hash("00", "ABC").len(), 64);
        assert_eq!(random_hex(16).len(), 32);
        assert_eq!(to_hex(&[0x00, 0xab, 0x0f]), "00ab0f");
    }

    #[test]
    fn every_state_parses_back() {
        for s in [
            ObligationState::Pending,
            ObligationState::Attempting,
            ObligationState::Delivered,
            ObligationState::Failed,
            ObligationState::Abandoned,
        ] {
            assert_eq!(parse_state(s.as_str()), Some(s));
        }
        assert_eq!(parse_state("lost"), None);
    }

    #[test]
    fn the_open_states_list_is_what_is_open_means() {
        for s in [
            ObligationState::Pending,
            ObligationState::Attempting,
            ObligationState::Delivered,
            ObligationState::Failed,
            ObligationState::Abandoned,
        ] {
            let listed = OPEN_STATES.contains(&format!("'{}'", s.as_str()));
            assert_eq!(listed, s.is_open(), "{s:?}");
        }
    }

    #[test]
    fn start_times_round_trip_exactly() {
        for t in [0, 1, 123_456, u64::MAX, u64::MAX / 2 + 1] {
            assert_eq!(start_from_sql(start_to_sql(t)), t);
        }
    }
}
