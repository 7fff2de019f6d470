//! Pairing, inbound dedupe and adapter cursors on PostgreSQL.
//!
//! The semantics are the SQLite backend's (its gateway module lists its
//! conventions: codes normalised before hashing, one pending code per
//! user, refusals stamped, an approval removing every pending code of the
//! user). Where this backend differs, and why:
//! - every pairing step that checks a limit and then writes
//!   ([`PairingStore::pairing_offer`], [`PairingStore::pairing_approve`])
//!   first takes a transaction-scoped advisory lock on
//!   `pairing:<platform>`, so the steps for one platform run one at a time
//!   across every node: what SQLite's single writer gives for free;
//! - such a step reads the server's clock once, after it holds the lock,
//!   and compares everything against that one time, so steps that ran one
//!   after the other never see time go backwards;
//! - those steps drop the expired codes, ended locks and old offer stamps
//!   of their own platform only (SQLite drops every platform's): a step
//!   never touches rows another platform's step may be writing, so steps
//!   for different platforms neither wait for nor deadlock with each
//!   other. Reads filter by time, so nothing changes through the traits
//!   except that [`PairingStore::pairing_clear_pending`] may count codes
//!   that expired on a platform nobody has asked about since (SQLite can
//!   count such codes too, for those expired since the last step on any
//!   platform);
//! - [`PairingStore::pairing_snapshot`] reads at REPEATABLE READ, so its
//!   three lists come from one snapshot, as SQLite's read transaction
//!   gives;
//! - a counter read back that does not fit the trait's type (a negative
//!   count, written by hand) fails the call with a clear error instead of
//!   being clamped.

use async_trait::async_trait;
use deadpool_postgres::{Object, Transaction};

use super::step::{Step, column, count_u32, count_u64, settle};
use super::{NOW, PostgresStore};
use crate::gateway::{
    ApprovalNotice, ApproveOutcome, ApprovedUser, CursorStore, InboundStore, OfferOutcome,
    PairingLimits, PairingSnapshot, PairingStore, PendingPairing, code_hash,
    normalize_pairing_code, random_hex,
};
use crate::{Result, Timestamp};

/// Pairing codes and approvals, their rate-limit stamps, inbound dedupe and
/// adapter cursors: the tables of SQLite schema steps 2 and 4.
///
/// Keys that are sorted on use the "C" collation, so listings come out in
/// the byte order SQLite uses whatever the database's default collation.
pub(super) const SCHEMA: &str = r#"
-- Codes waiting for approval. Only a salted hash is kept: the code itself
-- is shown to the user once and never written anywhere.
CREATE TABLE pairing_pending (
    entry_id   text COLLATE "C" PRIMARY KEY,
    platform   text COLLATE "C" NOT NULL,
    user_id    text COLLATE "C" NOT NULL,
    user_name  text,
    salt       text NOT NULL,
    code_hash  text NOT NULL,
    created_at double precision NOT NULL
);
CREATE INDEX pairing_pending_platform ON pairing_pending (platform, created_at);

CREATE TABLE pairing_approved (
    platform    text COLLATE "C" NOT NULL,
    user_id     text COLLATE "C" NOT NULL,
    user_name   text,
    approved_at double precision NOT NULL,
    PRIMARY KEY (platform, user_id)
);

-- Rate-limit stamps, one table for both scopes:
--   kind 'offer':    subject = user id,  stamp = when the user was last
--                    answered (a code or a refusal);
--   kind 'failures': subject = '',       count = failed approvals so far;
--   kind 'lockout':  subject = '',       stamp = when the lock ends.
CREATE TABLE pairing_stamps (
    platform text COLLATE "C" NOT NULL,
    kind     text NOT NULL CHECK (kind IN ('offer', 'failures', 'lockout')),
    subject  text NOT NULL DEFAULT '',
    stamp    double precision,
    count    integer NOT NULL DEFAULT 0,
    PRIMARY KEY (platform, kind, subject)
);

-- One row per inbound event taken; the primary key is the dedupe.
CREATE TABLE inbound_seen (
    platform   text NOT NULL,
    inbound_id text NOT NULL,
    seen_at    double precision NOT NULL,
    PRIMARY KEY (platform, inbound_id)
);
CREATE INDEX inbound_seen_at ON inbound_seen (seen_at);

CREATE TABLE adapter_cursors (
    platform   text NOT NULL,
    name       text NOT NULL,
    value      text NOT NULL,
    updated_at double precision NOT NULL,
    PRIMARY KEY (platform, name)
);
"#;

/// Approval notices (SQLite schema step 9): the chat a pairing code was
/// shown in, and on an approval the chat still owed the news (NULL once
/// told, or when the code came from a release that did not record it).
pub(super) const NOTICE_SCHEMA: &str = r#"
ALTER TABLE pairing_pending ADD COLUMN chat_id text;
ALTER TABLE pairing_approved ADD COLUMN notice_chat text;
"#;

// ---------------------------------------------------------------- pairing

/// Serializes the pairing steps of `platform` across nodes until the
/// transaction ends, then reads the server's clock: the one "now" the step
/// compares against.
async fn lock_platform(tx: &Transaction<'_>, platform: &str) -> Step<Timestamp> {
    let lock = tx
        .prepare_cached("SELECT pg_advisory_xact_lock(hashtext('pairing:' || $1::text))")
        .await?;
    tx.execute(&lock, &[&platform]).await?;
    let clock = tx.prepare_cached(&format!("SELECT {NOW}")).await?;
    let row = tx.query_one(&clock, &[]).await?;
    Ok(column(&row, 0)?)
}

/// Drops what can no longer matter on `platform` (see the module docs for
/// why only there): expired codes, an ended lock with the failure count
/// that led to it (a lock's end starts the count afresh) and offer stamps
/// older than the interval.
async fn drop_expired(
    tx: &Transaction<'_>,
    platform: &str,
    at: Timestamp,
    limits: &PairingLimits,
) -> Step<()> {
    // Its own statement, before the lock row goes: a data-modifying CTE
    // would not see the other's deletions.
    let failures = tx
        .prepare_cached(
            "DELETE FROM pairing_stamps WHERE platform = $1 AND kind = 'failures' \
             AND EXISTS (SELECT 1 FROM pairing_stamps \
             WHERE platform = $1 AND kind = 'lockout' AND stamp <= $2)",
        )
        .await?;
    tx.execute(&failures, &[&platform, &at]).await?;
    let statement = tx
        .prepare_cached(
            "WITH codes AS (\
                 DELETE FROM pairing_pending WHERE platform = $1 AND created_at < $2) \
             DELETE FROM pairing_stamps WHERE platform = $1 \
             AND ((kind = 'lockout' AND stamp <= $3) OR (kind = 'offer' AND stamp < $4))",
        )
        .await?;
    tx.execute(
        &statement,
        &[
            &platform,
            &(at - limits.code_ttl),
            &at,
            &(at - limits.offer_interval),
        ],
    )
    .await?;
    Ok(())
}

/// The end of the platform's lock, if one is in force at `at`.
async fn active_lockout(
    tx: &Transaction<'_>,
    platform: &str,
    at: Timestamp,
) -> Step<Option<Timestamp>> {
    let statement = tx
        .prepare_cached(
            "SELECT stamp FROM pairing_stamps \
             WHERE platform = $1 AND kind = 'lockout' AND subject = '' AND stamp > $2",
        )
        .await?;
    match tx.query_opt(&statement, &[&platform, &at]).await? {
        Some(row) => Ok(column(&row, 0)?),
        None => Ok(None),
    }
}

/// Records that the user was answered at `at` (with a code or a refusal),
/// which starts their offer interval.
async fn stamp_offer(
    tx: &Transaction<'_>,
    platform: &str,
    user_id: &str,
    at: Timestamp,
) -> Step<()> {
    let statement = tx
        .prepare_cached(
            "INSERT INTO pairing_stamps (platform, kind, subject, stamp) \
             VALUES ($1, 'offer', $2, $3) \
             ON CONFLICT (platform, kind, subject) DO UPDATE SET stamp = excluded.stamp",
        )
        .await?;
    tx.execute(&statement, &[&platform, &user_id, &at]).await?;
    Ok(())
}

async fn reset_failures(tx: &Transaction<'_>, platform: &str) -> Step<()> {
    let statement = tx
        .prepare_cached(
            "DELETE FROM pairing_stamps WHERE platform = $1 AND kind = 'failures' AND subject = ''",
        )
        .await?;
    tx.execute(&statement, &[&platform]).await?;
    Ok(())
}

/// The platform's failed approvals since its count was last reset.
async fn failure_count(tx: &Transaction<'_>, platform: &str) -> Step<u32> {
    let statement = tx
        .prepare_cached(
            "SELECT count FROM pairing_stamps \
             WHERE platform = $1 AND kind = 'failures' AND subject = ''",
        )
        .await?;
    match tx.query_opt(&statement, &[&platform]).await? {
        Some(row) => Ok(count_u32(column(&row, 0)?, "the failed-approval count")?),
        None => Ok(0),
    }
}

/// Counts one failed approval; returns the new count.
async fn add_failure(tx: &Transaction<'_>, platform: &str) -> Step<u32> {
    let statement = tx
        .prepare_cached(
            "INSERT INTO pairing_stamps (platform, kind, subject, count) \
             VALUES ($1, 'failures', '', 1) \
             ON CONFLICT (platform, kind, subject) \
             DO UPDATE SET count = pairing_stamps.count + 1 \
             RETURNING count",
        )
        .await?;
    let row = tx.query_one(&statement, &[&platform]).await?;
    Ok(count_u32(column(&row, 0)?, "the failed-approval count")?)
}

async fn offer(
    client: &mut Object,
    platform: &str,
    user_id: &str,
    user_name: Option<&str>,
    chat_id: &str,
    code: &str,
    limits: PairingLimits,
) -> Step<OfferOutcome> {
    let tx = client.transaction().await?;
    let at = lock_platform(&tx, platform).await?;
    drop_expired(&tx, platform, at, &limits).await?;
    // The user's interval first: whatever else holds (a lockout
    // included), someone answered within it hears nothing more.
    let last_offer = tx
        .prepare_cached(
            "SELECT stamp FROM pairing_stamps \
             WHERE platform = $1 AND kind = 'offer' AND subject = $2",
        )
        .await?;
    let last_offer: Option<f64> = match tx.query_opt(&last_offer, &[&platform, &user_id]).await? {
        Some(row) => column(&row, 0)?,
        None => None,
    };
    if last_offer.is_some_and(|t| at - t < limits.offer_interval) {
        // What was dropped as expired stays dropped.
        tx.commit().await?;
        return Ok(OfferOutcome::RateLimited);
    }
    if active_lockout(&tx, platform, at).await?.is_some() {
        stamp_offer(&tx, platform, user_id, at).await?;
        tx.commit().await?;
        return Ok(OfferOutcome::LockedOut);
    }
    // One code per user: the new one replaces theirs, and theirs does not
    // count against the platform's limit.
    let drop_own = tx
        .prepare_cached("DELETE FROM pairing_pending WHERE platform = $1 AND user_id = $2")
        .await?;
    tx.execute(&drop_own, &[&platform, &user_id]).await?;
    if limits.max_pending == 0 {
        stamp_offer(&tx, platform, user_id, at).await?;
        tx.commit().await?;
        return Ok(OfferOutcome::TooManyPending);
    }
    // A full platform makes room by dropping its oldest codes, so a few
    // strangers cannot hold every slot (see the trait).
    let count = tx
        .prepare_cached("SELECT COUNT(*) FROM pairing_pending WHERE platform = $1")
        .await?;
    let row = tx.query_one(&count, &[&platform]).await?;
    let pending = count_u64(column(&row, 0)?, "the count of pending codes")?;
    let max = u64::try_from(limits.max_pending).unwrap_or(u64::MAX);
    if pending >= max {
        let excess = i64::try_from(pending - max + 1).unwrap_or(i64::MAX);
        let evict = tx
            .prepare_cached(
                "DELETE FROM pairing_pending WHERE entry_id IN (SELECT entry_id \
                 FROM pairing_pending WHERE platform = $1 \
                 ORDER BY created_at, entry_id LIMIT $2)",
            )
            .await?;
        tx.execute(&evict, &[&platform, &excess]).await?;
    }
    let salt = random_hex(16);
    let hash = code_hash(&salt, code);
    let insert = tx
        .prepare_cached(
            "INSERT INTO pairing_pending (entry_id, platform, user_id, user_name, salt, \
             code_hash, created_at, chat_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .await?;
    tx.execute(
        &insert,
        &[
            &random_hex(8),
            &platform,
            &user_id,
            &user_name,
            &salt,
            &hash,
            &at,
            &chat_id,
        ],
    )
    .await?;
    stamp_offer(&tx, platform, user_id, at).await?;
    tx.commit().await?;
    Ok(OfferOutcome::Created)
}

/// A pending code's row as approval needs it.
struct PendingRow {
    user_id: String,
    user_name: Option<String>,
    chat_id: Option<String>,
    salt: String,
    code_hash: String,
}

async fn approve(
    client: &mut Object,
    platform: &str,
    code: &str,
    limits: PairingLimits,
) -> Step<ApproveOutcome> {
    let tx = client.transaction().await?;
    let at = lock_platform(&tx, platform).await?;
    drop_expired(&tx, platform, at, &limits).await?;
    // A lock stops guessing, not the operator: while it holds, codes are
    // still compared (a match is no guess), until the lock's guess budget
    // is spent too.
    let locked = active_lockout(&tx, platform, at).await?;
    if let Some(until) = locked
        && failure_count(&tx, platform).await? >= limits.guess_budget()
    {
        tx.commit().await?;
        return Ok(ApproveOutcome::LockedOut { until });
    }
    let select = tx
        .prepare_cached(
            "SELECT user_id, user_name, salt, code_hash, chat_id FROM pairing_pending \
             WHERE platform = $1 AND created_at >= $2 ORDER BY created_at, entry_id",
        )
        .await?;
    let mut rows = Vec::new();
    for row in tx
        .query(&select, &[&platform, &(at - limits.code_ttl)])
        .await?
    {
        rows.push(PendingRow {
            user_id: column(&row, 0)?,
            user_name: column(&row, 1)?,
            salt: column(&row, 2)?,
            code_hash: column(&row, 3)?,
            chat_id: column(&row, 4)?,
        });
    }
    // Every row is hashed and compared, match or not, so the time taken
    // does not reveal which (or whether an early) row matched.
    let mut found: Option<&PendingRow> = None;
    for row in &rows {
        let candidate = code_hash(&row.salt, code);
        let equal = talaria_core::constant_time_eq(candidate.as_bytes(), row.code_hash.as_bytes());
        if equal && found.is_none() {
            found = Some(row);
        }
    }
    let Some(row) = found else {
        // The count goes on during a lock, toward its guess budget; it
        // starts afresh when the lock ends.
        let failures = add_failure(&tx, platform).await?;
        if let Some(until) = locked {
            tx.commit().await?;
            return Ok(ApproveOutcome::LockedOut { until });
        }
        if failures >= limits.max_failures.max(1) {
            let until = at + limits.lockout;
            let lockout = tx
                .prepare_cached(
                    "INSERT INTO pairing_stamps (platform, kind, subject, stamp) \
                     VALUES ($1, 'lockout', '', $2) \
                     ON CONFLICT (platform, kind, subject) DO UPDATE SET stamp = excluded.stamp",
                )
                .await?;
            tx.execute(&lockout, &[&platform, &until]).await?;
            tx.commit().await?;
            return Ok(ApproveOutcome::LockedOut { until });
        }
        tx.commit().await?;
        return Ok(ApproveOutcome::NoMatch { failures });
    };
    let drop_codes = tx
        .prepare_cached("DELETE FROM pairing_pending WHERE platform = $1 AND user_id = $2")
        .await?;
    tx.execute(&drop_codes, &[&platform, &row.user_id]).await?;
    // Approving someone already approved refreshes the stamp; a known name
    // is not forgotten because this code lacked one. The user is owed word
    // of it in the chat the code was shown in.
    let upsert = tx
        .prepare_cached(
            "INSERT INTO pairing_approved \
             (platform, user_id, user_name, approved_at, notice_chat) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (platform, user_id) DO UPDATE SET \
             user_name = COALESCE(excluded.user_name, pairing_approved.user_name), \
             approved_at = excluded.approved_at, \
             notice_chat = COALESCE(excluded.notice_chat, pairing_approved.notice_chat) \
             RETURNING user_name",
        )
        .await?;
    let approved = tx
        .query_one(
            &upsert,
            &[&platform, &row.user_id, &row.user_name, &at, &row.chat_id],
        )
        .await?;
    let user_name: Option<String> = column(&approved, 0)?;
    // A success clears the count, except during a lock: the misses that
    // caused it keep counting toward its guess budget.
    if locked.is_none() {
        reset_failures(&tx, platform).await?;
    }
    tx.commit().await?;
    Ok(ApproveOutcome::Approved(ApprovedUser {
        platform: platform.to_owned(),
        user_id: row.user_id.clone(),
        user_name,
        approved_at: at,
    }))
}

async fn snapshot(client: &mut Object, limits: PairingLimits) -> Step<PairingSnapshot> {
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let clock = tx.prepare_cached(&format!("SELECT {NOW}")).await?;
    let at: Timestamp = column(&tx.query_one(&clock, &[]).await?, 0)?;
    let select = tx
        .prepare_cached(
            "SELECT platform, user_id, user_name, created_at FROM pairing_pending \
             WHERE created_at >= $1 ORDER BY platform, created_at, entry_id",
        )
        .await?;
    let mut pending = Vec::new();
    for row in tx.query(&select, &[&(at - limits.code_ttl)]).await? {
        pending.push(PendingPairing {
            platform: column(&row, 0)?,
            user_id: column(&row, 1)?,
            user_name: column(&row, 2)?,
            created_at: column(&row, 3)?,
        });
    }
    let select = tx
        .prepare_cached(
            "SELECT platform, user_id, user_name, approved_at FROM pairing_approved \
             ORDER BY platform, approved_at, user_id",
        )
        .await?;
    let mut approved = Vec::new();
    for row in tx.query(&select, &[]).await? {
        approved.push(ApprovedUser {
            platform: column(&row, 0)?,
            user_id: column(&row, 1)?,
            user_name: column(&row, 2)?,
            approved_at: column(&row, 3)?,
        });
    }
    let select = tx
        .prepare_cached(
            "SELECT platform, stamp FROM pairing_stamps \
             WHERE kind = 'lockout' AND subject = '' AND stamp > $1 ORDER BY platform",
        )
        .await?;
    let mut lockouts = Vec::new();
    for row in tx.query(&select, &[&at]).await? {
        lockouts.push((column(&row, 0)?, column(&row, 1)?));
    }
    tx.commit().await?;
    Ok(PairingSnapshot {
        pending,
        approved,
        lockouts,
    })
}

#[async_trait]
impl PairingStore for PostgresStore {
    /// As the trait says, serialized per platform across nodes by an
    /// advisory lock (see the module docs).
    async fn pairing_offer(
        &self,
        platform: &str,
        user_id: &str,
        user_name: Option<&str>,
        chat_id: &str,
        code: &str,
        limits: PairingLimits,
    ) -> Result<OfferOutcome> {
        let code = normalize_pairing_code(code);
        let mut client = self.client().await?;
        let step = offer(
            &mut client,
            platform,
            user_id,
            user_name,
            chat_id,
            &code,
            limits,
        )
        .await;
        settle(self, step)
    }

    /// As the trait says, serialized per platform across nodes by an
    /// advisory lock: of two nodes approving one code at once, one
    /// approves and the other finds no match.
    async fn pairing_approve(
        &self,
        platform: &str,
        code: &str,
        limits: PairingLimits,
    ) -> Result<ApproveOutcome> {
        let code = normalize_pairing_code(code);
        let mut client = self.client().await?;
        let step = approve(&mut client, platform, &code, limits).await;
        settle(self, step)
    }

    async fn pairing_is_approved(&self, platform: &str, user_id: &str) -> Result<bool> {
        let client = self.client().await?;
        let step: Step<bool> = async {
            let statement = client
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM pairing_approved \
                     WHERE platform = $1 AND user_id = $2)",
                )
                .await?;
            let row = client.query_one(&statement, &[&platform, &user_id]).await?;
            Ok(column(&row, 0)?)
        }
        .await;
        settle(self, step)
    }

    /// One `UPDATE` over rows locked `FOR UPDATE SKIP LOCKED`: nodes
    /// asking at once take different notices, and each is cleared in the
    /// statement that returns it.
    async fn pairing_take_notices(
        &self,
        platforms: &[String],
        limit: usize,
    ) -> Result<Vec<ApprovalNotice>> {
        let client = self.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let step: Step<Vec<ApprovalNotice>> = async {
            let statement = client
                .prepare_cached(
                    "UPDATE pairing_approved AS a SET notice_chat = NULL \
                     FROM (SELECT platform, user_id, notice_chat FROM pairing_approved \
                           WHERE notice_chat IS NOT NULL AND platform = ANY($1) \
                           ORDER BY approved_at, platform, user_id LIMIT $2 \
                           FOR UPDATE SKIP LOCKED) AS owed \
                     WHERE a.platform = owed.platform AND a.user_id = owed.user_id \
                     RETURNING a.platform, a.user_id, a.user_name, owed.notice_chat",
                )
                .await?;
            let mut taken = Vec::new();
            for row in client.query(&statement, &[&platforms, &limit]).await? {
                taken.push(ApprovalNotice {
                    platform: column(&row, 0)?,
                    user_id: column(&row, 1)?,
                    user_name: column(&row, 2)?,
                    chat_id: column(&row, 3)?,
                });
            }
            Ok(taken)
        }
        .await;
        settle(self, step)
    }

    async fn pairing_grant(
        &self,
        platform: &str,
        user_id: &str,
        user_name: Option<&str>,
        approved_at: f64,
    ) -> Result<bool> {
        let client = self.client().await?;
        let step: Step<bool> = async {
            let statement = client
                .prepare_cached(
                    "INSERT INTO pairing_approved (platform, user_id, user_name, approved_at) \
                     VALUES ($1, $2, $3, $4) ON CONFLICT (platform, user_id) DO NOTHING",
                )
                .await?;
            Ok(client
                .execute(&statement, &[&platform, &user_id, &user_name, &approved_at])
                .await?
                > 0)
        }
        .await;
        settle(self, step)
    }

    async fn pairing_revoke(&self, platform: &str, user_id: &str) -> Result<bool> {
        let client = self.client().await?;
        let step: Step<bool> = async {
            let statement = client
                .prepare_cached("DELETE FROM pairing_approved WHERE platform = $1 AND user_id = $2")
                .await?;
            Ok(client.execute(&statement, &[&platform, &user_id]).await? > 0)
        }
        .await;
        settle(self, step)
    }

    async fn pairing_deny(&self, platform: &str, user_id: &str) -> Result<bool> {
        let client = self.client().await?;
        let step: Step<bool> = async {
            let statement = client
                .prepare_cached("DELETE FROM pairing_pending WHERE platform = $1 AND user_id = $2")
                .await?;
            Ok(client.execute(&statement, &[&platform, &user_id]).await? > 0)
        }
        .await;
        settle(self, step)
    }

    /// As the trait says; the count may include codes that expired on a
    /// platform not served since (see the module docs).
    async fn pairing_clear_pending(&self, platform: Option<&str>) -> Result<u64> {
        let client = self.client().await?;
        let step: Step<u64> = async {
            Ok(match platform {
                Some(platform) => {
                    let statement = client
                        .prepare_cached("DELETE FROM pairing_pending WHERE platform = $1")
                        .await?;
                    client.execute(&statement, &[&platform]).await?
                }
                None => client.execute("DELETE FROM pairing_pending", &[]).await?,
            })
        }
        .await;
        settle(self, step)
    }

    /// As the trait says, read from one REPEATABLE READ snapshot so the
    /// lists agree with each other.
    async fn pairing_snapshot(&self, limits: PairingLimits) -> Result<PairingSnapshot> {
        let mut client = self.client().await?;
        let step = snapshot(&mut client, limits).await;
        settle(self, step)
    }
}

// ---------------------------------------------------------------- inbound

#[async_trait]
impl InboundStore for PostgresStore {
    /// One `INSERT ... ON CONFLICT DO NOTHING`: of callers racing on any
    /// number of nodes, the one whose row went in is the one told `true`.
    async fn first_delivery(&self, platform: &str, inbound_id: &str) -> Result<bool> {
        let client = self.client().await?;
        let step: Step<bool> = async {
            let statement = client
                .prepare_cached(&format!(
                    "INSERT INTO inbound_seen (platform, inbound_id, seen_at) \
                     VALUES ($1, $2, {NOW}) ON CONFLICT (platform, inbound_id) DO NOTHING"
                ))
                .await?;
            Ok(client
                .execute(&statement, &[&platform, &inbound_id])
                .await?
                == 1)
        }
        .await;
        settle(self, step)
    }

    /// As the trait says. Ids are stamped with the server's clock and
    /// `cutoff` is the caller's, so a cutoff from a node whose clock runs
    /// far off moves accordingly.
    async fn prune_inbound(&self, cutoff: Timestamp) -> Result<u64> {
        let client = self.client().await?;
        let step: Step<u64> = async {
            let statement = client
                .prepare_cached("DELETE FROM inbound_seen WHERE seen_at < $1")
                .await?;
            Ok(client.execute(&statement, &[&cutoff]).await?)
        }
        .await;
        settle(self, step)
    }
}

// ---------------------------------------------------------------- cursors

#[async_trait]
impl CursorStore for PostgresStore {
    async fn cursor(&self, platform: &str, name: &str) -> Result<Option<String>> {
        let client = self.client().await?;
        let step: Step<Option<String>> = async {
            let statement = client
                .prepare_cached(
                    "SELECT value FROM adapter_cursors WHERE platform = $1 AND name = $2",
                )
                .await?;
            match client.query_opt(&statement, &[&platform, &name]).await? {
                Some(row) => Ok(Some(column(&row, 0)?)),
                None => Ok(None),
            }
        }
        .await;
        settle(self, step)
    }

    async fn set_cursor(&self, platform: &str, name: &str, value: &str) -> Result<()> {
        let client = self.client().await?;
        let step: Step<()> = async {
            let statement = client
                .prepare_cached(&format!(
                    "INSERT INTO adapter_cursors (platform, name, value, updated_at) \
                     VALUES ($1, $2, $3, {NOW}) \
                     ON CONFLICT (platform, name) DO UPDATE SET \
                     value = excluded.value, updated_at = excluded.updated_at"
                ))
                .await?;
            client
                .execute(&statement, &[&platform, &name, &value])
                .await?;
            Ok(())
        }
        .await;
        settle(self, step)
    }

    async fn move_cursor(&self, platform: &str, from: &str, to: &str, value: &str) -> Result<()> {
        if from == to {
            return self.set_cursor(platform, to, value).await;
        }
        let client = self.client().await?;
        // One statement, so one round trip and one transaction: the old
        // entry goes as the new one is written.
        let step: Step<()> = async {
            let statement = client
                .prepare_cached(&format!(
                    "WITH gone AS (DELETE FROM adapter_cursors WHERE platform = $1 AND name = $2) \
                     INSERT INTO adapter_cursors (platform, name, value, updated_at) \
                     VALUES ($1, $3, $4, {NOW}) \
                     ON CONFLICT (platform, name) DO UPDATE SET \
                     value = excluded.value, updated_at = excluded.updated_at"
                ))
                .await?;
            client
                .execute(&statement, &[&platform, &from, &to, &value])
                .await?;
            Ok(())
        }
        .await;
        settle(self, step)
    }

    async fn delete_cursor(&self, platform: &str, name: &str) -> Result<bool> {
        let client = self.client().await?;
        let step: Step<bool> = async {
            let statement = client
                .prepare_cached("DELETE FROM adapter_cursors WHERE platform = $1 AND name = $2")
                .await?;
            Ok(client.execute(&statement, &[&platform, &name]).await? == 1)
        }
        .await;
        settle(self, step)
    }
}
