//! Scheduled jobs on SQLite.
//!
//! Conventions beyond the trait's documentation:
//! - list fields (`skills`, `deliver`) and the origin are stored as JSON
//!   text; a row whose JSON does not parse fails the read naming the job,
//!   rather than running a job with half its targets;
//! - a claim is one `IMMEDIATE` transaction: the occurrence insert (`OR
//!   IGNORE` on the primary key) and the guarded update of the job commit
//!   together or not at all, so a claim that loses either race changes
//!   nothing;
//! - error texts are kept to 2,000 chars.

use async_trait::async_trait;
use rusqlite::types::Type;
use rusqlite::{OptionalExtension, Row, Transaction, params};

use super::SqliteStore;
use super::conn::OpResult;
use super::rows::{from_sql_small_count, now};
use crate::cron::{
    CronJob, CronStore, JobOrigin, JobState, Misfire, NewCronJob, Occurrence, OccurrenceClaim,
    OccurrenceEnd, OccurrenceStatus, Trigger,
};
use crate::{Result, StoreError, Timestamp};

/// Longest error text kept, in chars.
const MAX_ERROR_CHARS: usize = 2000;

/// Job columns in the order [`job_from_row`] reads them.
const JOB_COLUMNS: &str = "id, name, prompt, skills, schedule, deliver, origin, repeat, \
     completed, state, misfire, next_run_at, created_at, updated_at, last_run_at, last_status, \
     last_error";

/// Occurrence columns in the order [`occurrence_from_row`] reads them.
const OCCURRENCE_COLUMNS: &str = "job_id, scheduled_at, trigger, status, session_id, \
     started_at, finished_at, error, output_path, delivery_error";

fn bad_column(column: usize, ty: Type, what: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(column, ty, Box::new(StoreError::Database(what)))
}

fn json_column<T: serde::de::DeserializeOwned>(
    row: &Row<'_>,
    column: usize,
    job: &str,
) -> rusqlite::Result<T> {
    let text: String = row.get(column)?;
    serde_json::from_str(&text).map_err(|e| {
        bad_column(
            column,
            Type::Text,
            format!("cron job `{job}` has an unreadable column {column}: {e}"),
        )
    })
}

fn job_from_row(row: &Row<'_>) -> rusqlite::Result<CronJob> {
    let id: String = row.get(0)?;
    let origin: Option<String> = row.get(6)?;
    let origin = match origin {
        None => None,
        Some(text) => Some(serde_json::from_str::<JobOrigin>(&text).map_err(|e| {
            bad_column(
                6,
                Type::Text,
                format!("cron job `{id}` has an unreadable origin: {e}"),
            )
        })?),
    };
    let repeat: Option<i64> = row.get(7)?;
    let state: String = row.get(9)?;
    let misfire: String = row.get(10)?;
    let last_status: Option<String> = row.get(15)?;
    Ok(CronJob {
        name: row.get(1)?,
        prompt: row.get(2)?,
        skills: json_column(row, 3, &id)?,
        schedule: row.get(4)?,
        deliver: json_column(row, 5, &id)?,
        origin,
        repeat: repeat.map(from_sql_small_count),
        completed: from_sql_small_count(row.get(8)?),
        state: JobState::parse(&state)
            .ok_or_else(|| bad_column(9, Type::Text, format!("unknown job state `{state}`")))?,
        misfire: Misfire::parse(&misfire).ok_or_else(|| {
            bad_column(
                10,
                Type::Text,
                format!("unknown misfire policy `{misfire}`"),
            )
        })?,
        next_run_at: row.get(11)?,
        created_at: row.get(12)?,
        updated_at: row.get(13)?,
        last_run_at: row.get(14)?,
        last_status: last_status.as_deref().and_then(OccurrenceStatus::parse),
        last_error: row.get(16)?,
        id,
    })
}

fn occurrence_from_row(row: &Row<'_>) -> rusqlite::Result<Occurrence> {
    let trigger: String = row.get(2)?;
    let status: String = row.get(3)?;
    Ok(Occurrence {
        job_id: row.get(0)?,
        scheduled_at: row.get(1)?,
        trigger: Trigger::parse(&trigger)
            .ok_or_else(|| bad_column(2, Type::Text, format!("unknown trigger `{trigger}`")))?,
        status: OccurrenceStatus::parse(&status)
            .ok_or_else(|| bad_column(3, Type::Text, format!("unknown status `{status}`")))?,
        session_id: row.get(4)?,
        started_at: row.get(5)?,
        finished_at: row.get(6)?,
        error: row.get(7)?,
        output_path: row.get(8)?,
        delivery_error: row.get(9)?,
    })
}

fn to_json<T: serde::Serialize>(value: &T) -> OpResult<String> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::Database(format!("cannot encode a cron job field: {e}")).into())
}

fn origin_json(origin: &Option<JobOrigin>) -> OpResult<Option<String>> {
    origin.as_ref().map(to_json).transpose()
}

fn truncate(s: Option<&str>) -> Option<String> {
    s.map(|s| match s.char_indices().nth(MAX_ERROR_CHARS) {
        Some((end, _)) => s[..end].to_owned(),
        None => s.to_owned(),
    })
}

/// A unique-constraint failure as [`StoreError::Conflict`], anything else
/// as itself.
fn conflict_on_unique(e: rusqlite::Error, what: String) -> super::conn::OpError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::ConstraintViolation) => StoreError::Conflict(what).into(),
        _ => e.into(),
    }
}

fn load_job(tx: &Transaction<'_>, id_or_name: &str) -> OpResult<Option<CronJob>> {
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM cron_jobs WHERE id = ?1 \
         UNION ALL SELECT {JOB_COLUMNS} FROM cron_jobs WHERE name = ?1 AND id <> ?1 LIMIT 1"
    );
    Ok(tx
        .prepare_cached(&sql)?
        .query_row(params![id_or_name], job_from_row)
        .optional()?)
}

fn sql_limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[async_trait]
impl CronStore for SqliteStore {
    async fn create_job(&self, job: NewCronJob) -> Result<()> {
        talaria_core::ids::validate_path_component(&job.id)?;
        self.write(move |tx| {
            let at = now();
            let state = if job.next_run_at.is_some() {
                JobState::Scheduled
            } else {
                JobState::Completed
            };
            tx.prepare_cached(
                "INSERT INTO cron_jobs (id, name, prompt, skills, schedule, deliver, origin, \
                 repeat, completed, state, misfire, next_run_at, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 0, ?9, ?10, ?11, ?12, ?12)",
            )?
            .execute(params![
                job.id,
                job.name,
                job.prompt,
                to_json(&job.skills)?,
                job.schedule,
                to_json(&job.deliver)?,
                origin_json(&job.origin)?,
                job.repeat.map(i64::from),
                state.as_str(),
                job.misfire.as_str(),
                job.next_run_at,
                at,
            ])
            .map_err(|e| {
                conflict_on_unique(e, format!("a cron job named `{}` already exists", job.name))
            })?;
            Ok(())
        })
        .await
    }

    async fn job(&self, id_or_name: &str) -> Result<Option<CronJob>> {
        let key = id_or_name.to_owned();
        self.read(move |tx| load_job(tx, &key)).await
    }

    async fn jobs(&self) -> Result<Vec<CronJob>> {
        self.read(|tx| {
            let sql = format!("SELECT {JOB_COLUMNS} FROM cron_jobs ORDER BY created_at, id");
            Ok(tx
                .prepare_cached(&sql)?
                .query_map([], job_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    async fn update_job(&self, job: &CronJob) -> Result<bool> {
        let job = job.clone();
        self.write(move |tx| {
            let changed = tx
                .prepare_cached(
                    // A run already claimed is never the next one (see
                    // the trait): the claim's advance stands.
                    "UPDATE cron_jobs SET name = ?2, prompt = ?3, skills = ?4, schedule = ?5, \
                     deliver = ?6, origin = ?7, repeat = ?8, misfire = ?9, \
                     state = CASE WHEN ?10 = 'scheduled' AND EXISTS (SELECT 1 FROM \
                     cron_occurrences o WHERE o.job_id = ?1 AND o.scheduled_at = ?11) \
                     THEN state ELSE ?10 END, \
                     next_run_at = CASE WHEN EXISTS (SELECT 1 FROM cron_occurrences o \
                     WHERE o.job_id = ?1 AND o.scheduled_at = ?11) THEN next_run_at ELSE ?11 END, \
                     updated_at = ?12 WHERE id = ?1",
                )?
                .execute(params![
                    job.id,
                    job.name,
                    job.prompt,
                    to_json(&job.skills)?,
                    job.schedule,
                    to_json(&job.deliver)?,
                    origin_json(&job.origin)?,
                    job.repeat.map(i64::from),
                    job.misfire.as_str(),
                    job.state.as_str(),
                    job.next_run_at,
                    now(),
                ])
                .map_err(|e| {
                    conflict_on_unique(e, format!("a cron job named `{}` already exists", job.name))
                })?;
            Ok(changed > 0)
        })
        .await
    }

    async fn delete_job(&self, id: &str) -> Result<bool> {
        let id = id.to_owned();
        self.write(move |tx| {
            // Explicit, so the records go even where foreign keys are off.
            tx.prepare_cached("DELETE FROM cron_occurrences WHERE job_id = ?1")?
                .execute(params![id])?;
            let deleted = tx
                .prepare_cached("DELETE FROM cron_jobs WHERE id = ?1")?
                .execute(params![id])?;
            Ok(deleted > 0)
        })
        .await
    }

    async fn due_jobs(&self, now_secs: i64, limit: usize) -> Result<Vec<CronJob>> {
        self.read(move |tx| {
            let sql = format!(
                "SELECT {JOB_COLUMNS} FROM cron_jobs WHERE state = 'scheduled' \
                 AND next_run_at IS NOT NULL AND next_run_at <= ?1 \
                 ORDER BY next_run_at, id LIMIT ?2"
            );
            Ok(tx
                .prepare_cached(&sql)?
                .query_map(params![now_secs, sql_limit(limit)], job_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    async fn claim_occurrence(&self, claim: OccurrenceClaim) -> Result<bool> {
        self.write(move |tx| {
            if let Some(advance) = &claim.advance {
                // The job must still be where this claimer saw it: a
                // scheduler that claimed first has moved `next_run_at`.
                let moved = tx
                    .prepare_cached(
                        "UPDATE cron_jobs SET next_run_at = ?3, \
                         completed = completed + ?4, \
                         state = CASE WHEN ?3 IS NULL THEN 'completed' ELSE state END, \
                         updated_at = ?5 \
                         WHERE id = ?1 AND state = 'scheduled' AND next_run_at = ?2",
                    )?
                    .execute(params![
                        claim.job_id,
                        advance.expected_next,
                        advance.next_run_at,
                        i64::from(advance.counts),
                        now(),
                    ])?;
                if moved == 0 {
                    return Ok(false);
                }
            } else {
                let exists: Option<i64> = tx
                    .prepare_cached("SELECT 1 FROM cron_jobs WHERE id = ?1")?
                    .query_row(params![claim.job_id], |r| r.get(0))
                    .optional()?;
                if exists.is_none() {
                    return Ok(false);
                }
            }
            let inserted = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO cron_occurrences (job_id, scheduled_at, trigger, \
                     status, session_id, started_at, finished_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, \
                     CASE WHEN ?4 = 'running' THEN NULL ELSE ?6 END)",
                )?
                .execute(params![
                    claim.job_id,
                    claim.scheduled_at,
                    claim.trigger.as_str(),
                    claim.status.as_str(),
                    claim.session_id,
                    now(),
                ])?;
            if inserted == 0 {
                // Someone holds this occurrence: undo the advance with the
                // rest of the transaction.
                return Err(super::conn::OpError::Store(StoreError::Conflict(
                    "occurrence already claimed".into(),
                )));
            }
            Ok(true)
        })
        .await
        .or_else(|e| match e {
            StoreError::Conflict(_) => Ok(false),
            e => Err(e),
        })
    }

    async fn finish_occurrence(
        &self,
        job_id: &str,
        scheduled_at: i64,
        end: OccurrenceEnd,
    ) -> Result<()> {
        let job_id = job_id.to_owned();
        self.write(move |tx| {
            let at = now();
            let error = truncate(end.error.as_deref());
            let delivery_error = truncate(end.delivery_error.as_deref());
            tx.prepare_cached(
                "UPDATE cron_occurrences SET status = ?3, finished_at = ?4, error = ?5, \
                 output_path = ?6, delivery_error = ?7 WHERE job_id = ?1 AND scheduled_at = ?2",
            )?
            .execute(params![
                job_id,
                scheduled_at,
                end.status.as_str(),
                at,
                error,
                end.output_path,
                delivery_error,
            ])?;
            let last_error = error.or(delivery_error);
            tx.prepare_cached(
                "UPDATE cron_jobs SET last_run_at = ?2, last_status = ?3, last_error = ?4 \
                 WHERE id = ?1",
            )?
            .execute(params![job_id, at, end.status.as_str(), last_error])?;
            Ok(())
        })
        .await
    }

    async fn occurrences(&self, job_id: &str, limit: usize) -> Result<Vec<Occurrence>> {
        let job_id = job_id.to_owned();
        self.read(move |tx| {
            let sql = format!(
                "SELECT {OCCURRENCE_COLUMNS} FROM cron_occurrences WHERE job_id = ?1 \
                 ORDER BY scheduled_at DESC LIMIT ?2"
            );
            Ok(tx
                .prepare_cached(&sql)?
                .query_map(params![job_id, sql_limit(limit)], occurrence_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    async fn recent_occurrences(&self, limit: usize) -> Result<Vec<Occurrence>> {
        self.read(move |tx| {
            let sql = format!(
                "SELECT {OCCURRENCE_COLUMNS} FROM cron_occurrences \
                 ORDER BY started_at DESC, scheduled_at DESC, job_id LIMIT ?1"
            );
            Ok(tx
                .prepare_cached(&sql)?
                .query_map(params![sql_limit(limit)], occurrence_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    async fn prune_occurrences(&self, job_id: &str, keep: usize) -> Result<u64> {
        let job_id = job_id.to_owned();
        self.write(move |tx| {
            let deleted = tx
                .prepare_cached(
                    "DELETE FROM cron_occurrences WHERE job_id = ?1 AND scheduled_at NOT IN \
                     (SELECT scheduled_at FROM cron_occurrences WHERE job_id = ?1 \
                      ORDER BY scheduled_at DESC LIMIT ?2)",
                )?
                .execute(params![job_id, sql_limit(keep)])?;
            Ok(deleted as u64)
        })
        .await
    }

    async fn interrupt_stale_occurrences(&self, cutoff: Timestamp) -> Result<u64> {
        self.write(move |tx| {
            let changed = tx
                .prepare_cached(
                    "UPDATE cron_occurrences SET status = 'interrupted', finished_at = ?2, \
                     error = 'the process running it stopped before it finished' \
                     WHERE status = 'running' AND started_at < ?1",
                )?
                .execute(params![cutoff, now()])?;
            Ok(changed as u64)
        })
        .await
    }
}
