//! The gateway's stores on SQLite: routes, pairing, inbound dedupe and
//! adapter cursors (the delivery ledger is in `ledger`).
//!
//! Conventions beyond the traits' documentation:
//! - [`RouteStore::touch_route`] on a key without a route does nothing;
//! - [`RouteStore::stale_routes`] walks the `updated_at` index (schema
//!   step 3) and joins each candidate to its session by primary key;
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

use async_trait::async_trait;
use rusqlite::{OptionalExtension, Row, Transaction, params};

use super::SqliteStore;
use super::conn::OpResult;
use super::rows::{from_sql_small_count, now, to_sql_count};
use crate::gateway::{
    ApprovalNotice, ApproveOutcome, ApprovedUser, CursorStore, InboundStore, OfferOutcome,
    PairingLimits, PairingSnapshot, PairingStore, PendingPairing, Route, RouteStore, code_hash,
    normalize_pairing_code, random_hex,
};
use crate::{Result, Timestamp};

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

// ---------------------------------------------------------------- pairing

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

/// Drops what can no longer matter: expired codes, ended locks with the
/// failure counts that led to them (a lock's end starts the count afresh)
/// and offer stamps older than the interval.
fn drop_expired(tx: &Transaction<'_>, at: Timestamp, limits: &PairingLimits) -> OpResult<()> {
    tx.prepare_cached("DELETE FROM pairing_pending WHERE created_at < ?1")?
        .execute(params![at - limits.code_ttl])?;
    tx.prepare_cached(
        "DELETE FROM pairing_stamps WHERE kind = 'failures' AND platform IN \
         (SELECT platform FROM pairing_stamps WHERE kind = 'lockout' AND stamp <= ?1)",
    )?
    .execute(params![at])?;
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

/// The platform's failed approvals since its count was last reset.
fn failure_count(tx: &Transaction<'_>, platform: &str) -> OpResult<u32> {
    let count: Option<i64> = tx
        .prepare_cached(
            "SELECT count FROM pairing_stamps \
             WHERE platform = ?1 AND kind = 'failures' AND subject = ''",
        )?
        .query_row(params![platform], |r| r.get(0))
        .optional()?;
    Ok(count.map_or(0, from_sql_small_count))
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
    chat_id: Option<String>,
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
        chat_id: &str,
        code: &str,
        limits: PairingLimits,
    ) -> Result<OfferOutcome> {
        let platform = platform.to_string();
        let user_id = user_id.to_string();
        let user_name = user_name.map(str::to_string);
        let chat_id = chat_id.to_string();
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
            if limits.max_pending == 0 {
                stamp_offer(tx, &platform, &user_id, at)?;
                return Ok(OfferOutcome::TooManyPending);
            }
            // A full platform makes room by dropping its oldest codes, so
            // a few strangers cannot hold every slot (see the trait).
            let pending: i64 = tx
                .prepare_cached("SELECT COUNT(*) FROM pairing_pending WHERE platform = ?1")?
                .query_row(params![platform], |r| r.get(0))?;
            let max = i64::try_from(limits.max_pending).unwrap_or(i64::MAX);
            if pending >= max {
                tx.prepare_cached(
                    "DELETE FROM pairing_pending WHERE entry_id IN (SELECT entry_id \
                     FROM pairing_pending WHERE platform = ?1 \
                     ORDER BY created_at, entry_id LIMIT ?2)",
                )?
                .execute(params![platform, pending - max + 1])?;
            }
            let salt = random_hex(16);
            let hash = code_hash(&salt, &code);
            tx.prepare_cached(
                "INSERT INTO pairing_pending (entry_id, platform, user_id, user_name, salt, \
                 code_hash, created_at, chat_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![
                random_hex(8),
                platform,
                user_id,
                user_name,
                salt,
                hash,
                at,
                chat_id
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
            // A lock stops guessing, not the operator: while it holds,
            // codes are still compared (a match is no guess), until the
            // lock's guess budget is spent too.
            let locked = active_lockout(tx, &platform, at)?;
            if let Some(until) = locked
                && failure_count(tx, &platform)? >= limits.guess_budget()
            {
                return Ok(ApproveOutcome::LockedOut { until });
            }
            let rows = tx
                .prepare_cached(
                    "SELECT user_id, user_name, salt, code_hash, chat_id FROM pairing_pending \
                     WHERE platform = ?1 AND created_at >= ?2 ORDER BY created_at, entry_id",
                )?
                .query_map(params![platform, at - limits.code_ttl], |r| {
                    Ok(PendingRow {
                        user_id: r.get(0)?,
                        user_name: r.get(1)?,
                        salt: r.get(2)?,
                        code_hash: r.get(3)?,
                        chat_id: r.get(4)?,
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
                // The count goes on during a lock, toward its guess budget;
                // it starts afresh when the lock ends.
                let failures = add_failure(tx, &platform)?;
                if let Some(until) = locked {
                    return Ok(ApproveOutcome::LockedOut { until });
                }
                if failures >= limits.max_failures.max(1) {
                    let until = at + limits.lockout;
                    tx.prepare_cached(
                        "INSERT INTO pairing_stamps (platform, kind, subject, stamp) \
                         VALUES (?1, 'lockout', '', ?2) \
                         ON CONFLICT (platform, kind, subject) DO UPDATE SET stamp = excluded.stamp",
                    )?
                    .execute(params![platform, until])?;
                    return Ok(ApproveOutcome::LockedOut { until });
                }
                return Ok(ApproveOutcome::NoMatch { failures });
            };
            tx.prepare_cached("DELETE FROM pairing_pending WHERE platform = ?1 AND user_id = ?2")?
                .execute(params![platform, row.user_id])?;
            // Approving someone already approved refreshes the stamp; a
            // known name is not forgotten because this code lacked one.
            // The user is owed word of it in the chat the code was shown in.
            let user_name: Option<String> = tx
                .prepare_cached(
                    "INSERT INTO pairing_approved \
                     (platform, user_id, user_name, approved_at, notice_chat) \
                     VALUES (?1, ?2, ?3, ?4, ?5) \
                     ON CONFLICT (platform, user_id) DO UPDATE SET \
                     user_name = COALESCE(excluded.user_name, user_name), \
                     approved_at = excluded.approved_at, \
                     notice_chat = COALESCE(excluded.notice_chat, notice_chat) \
                     RETURNING user_name",
                )?
                .query_row(
                    params![platform, row.user_id, row.user_name, at, row.chat_id],
                    |r| r.get(0),
                )?;
            // A success clears the count, except during a lock: the misses
            // that caused it keep counting toward its guess budget.
            if locked.is_none() {
                reset_failures(tx, &platform)?;
            }
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

    async fn pairing_take_notices(
        &self,
        platforms: &[String],
        limit: usize,
    ) -> Result<Vec<ApprovalNotice>> {
        let platforms = platforms.to_vec();
        // The read and the clearing share the single writer's
        // transaction, so no two callers take the same notice.
        self.write(move |tx| {
            let owed = tx
                .prepare_cached(
                    "SELECT platform, user_id, user_name, notice_chat FROM pairing_approved \
                     WHERE notice_chat IS NOT NULL ORDER BY approved_at, platform, user_id",
                )?
                .query_map([], |r| {
                    Ok(ApprovalNotice {
                        platform: r.get(0)?,
                        user_id: r.get(1)?,
                        user_name: r.get(2)?,
                        chat_id: r.get(3)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let taken: Vec<ApprovalNotice> = owed
                .into_iter()
                .filter(|n| platforms.contains(&n.platform))
                .take(limit)
                .collect();
            for notice in &taken {
                tx.prepare_cached(
                    "UPDATE pairing_approved SET notice_chat = NULL \
                     WHERE platform = ?1 AND user_id = ?2",
                )?
                .execute(params![notice.platform, notice.user_id])?;
            }
            Ok(taken)
        })
        .await
    }

    async fn pairing_grant(
        &self,
        platform: &str,
        user_id: &str,
        user_name: Option<&str>,
        approved_at: f64,
    ) -> Result<bool> {
        let platform = platform.to_string();
        let user_id = user_id.to_string();
        let user_name = user_name.map(str::to_string);
        self.write(move |tx| {
            let inserted = tx
                .prepare_cached(
                    "INSERT INTO pairing_approved (platform, user_id, user_name, approved_at) \
                     VALUES (?1, ?2, ?3, ?4) ON CONFLICT (platform, user_id) DO NOTHING",
                )?
                .execute(params![platform, user_id, user_name, approved_at])?;
            Ok(inserted > 0)
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

    async fn pairing_deny(&self, platform: &str, user_id: &str) -> Result<bool> {
        let platform = platform.to_string();
        let user_id = user_id.to_string();
        self.write(move |tx| {
            let deleted = tx
                .prepare_cached("DELETE FROM pairing_pending WHERE platform = ?1 AND user_id = ?2")?
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

    async fn delete_cursor(&self, platform: &str, name: &str) -> Result<bool> {
        let (platform, name) = (platform.to_owned(), name.to_owned());
        self.write(move |tx| {
            let gone = tx
                .prepare_cached("DELETE FROM adapter_cursors WHERE platform = ?1 AND name = ?2")?
                .execute(params![platform, name])?;
            Ok(gone == 1)
        })
        .await
    }

    async fn set_cursor(&self, platform: &str, name: &str, value: &str) -> Result<()> {
        let (platform, name, value) = (platform.to_owned(), name.to_owned(), value.to_owned());
        self.write(move |tx| upsert_cursor(tx, &platform, &name, &value))
            .await
    }

    async fn move_cursor(&self, platform: &str, from: &str, to: &str, value: &str) -> Result<()> {
        let (platform, from, to, value) = (
            platform.to_owned(),
            from.to_owned(),
            to.to_owned(),
            value.to_owned(),
        );
        self.write(move |tx| {
            if from != to {
                tx.prepare_cached("DELETE FROM adapter_cursors WHERE platform = ?1 AND name = ?2")?
                    .execute(params![platform, from])?;
            }
            upsert_cursor(tx, &platform, &to, &value)
        })
        .await
    }
}

fn upsert_cursor(tx: &Transaction<'_>, platform: &str, name: &str, value: &str) -> OpResult<()> {
    tx.prepare_cached(
        "INSERT INTO adapter_cursors (platform, name, value, updated_at) \
         VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (platform, name) DO UPDATE SET \
         value = excluded.value, updated_at = excluded.updated_at",
    )?
    .execute(params![platform, name, value, now()])?;
    Ok(())
}
