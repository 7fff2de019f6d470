//! Scheduled jobs on PostgreSQL.
//!
//! The semantics are the SQLite backend's: list fields and the origin are
//! JSON text, and a row whose JSON does not parse fails the read naming the
//! job; error texts are kept to 2,000 chars; a name or id already taken is
//! [`StoreError::Conflict`] saying the name is taken.
//!
//! A claim is one READ COMMITTED transaction: the guarded update of the job
//! (when the claim advances it) and the occurrence insert (`ON CONFLICT DO
//! NOTHING` on its primary key) commit together or are rolled back
//! together. A second claimer's update waits on the first's row lock and
//! then finds `next_run_at` moved; a second insert of one occurrence waits
//! on the first's key and then finds it taken. Either way it changes
//! nothing and is told `false`, however many schedulers race.
//!
//! Where this backend differs:
//! - a job's occurrences go with it through the foreign key's cascade,
//!   which PostgreSQL always enforces, rather than a second delete;
//! - `repeat` is a `bigint` (every `u32` fits), and a `completed` or
//!   `repeat` read back that does not fit a `u32` fails the read instead of
//!   being clamped.

use async_trait::async_trait;
use deadpool_postgres::Object;
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;

use super::step::{Step, StepError, column, count_u32, settle, sql_limit};
use super::{NOW, PostgresStore};
use crate::cron::{
    CronJob, CronStore, JobOrigin, JobState, Misfire, NewCronJob, Occurrence, OccurrenceClaim,
    OccurrenceEnd, OccurrenceStatus, Trigger,
};
use crate::{Result, StoreError, Timestamp};

/// Jobs and the record of their runs: the tables of SQLite schema step 3.
pub(super) const SCHEMA: &str = r#"
CREATE TABLE cron_jobs (
    id          text COLLATE "C" PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    prompt      text,
    skills      text NOT NULL DEFAULT '[]',  -- JSON array of skill names
    schedule    text NOT NULL,
    deliver     text NOT NULL DEFAULT '[]',  -- JSON array of delivery targets
    origin      text,                        -- JSON {platform, chat_id, thread_id}
    -- A u32 limit: bigint holds every one.
    repeat      bigint,
    completed   integer NOT NULL DEFAULT 0,
    state       text NOT NULL CHECK (state IN ('scheduled', 'paused', 'completed')),
    misfire     text NOT NULL CHECK (misfire IN ('run_once', 'skip')),
    -- Unix seconds, an integer so that equality (what a claim compares) is
    -- exact.
    next_run_at bigint,
    created_at  double precision NOT NULL,
    updated_at  double precision NOT NULL,
    last_run_at double precision,
    last_status text,
    last_error  text
);
CREATE INDEX cron_jobs_due ON cron_jobs (state, next_run_at);

-- One row per run, inserted before the run starts: the primary key is what
-- makes an occurrence fire at most once, whichever scheduler claims it.
CREATE TABLE cron_occurrences (
    job_id         text COLLATE "C" NOT NULL REFERENCES cron_jobs (id) ON DELETE CASCADE,
    scheduled_at   bigint NOT NULL,
    trigger        text NOT NULL,
    status         text NOT NULL,
    session_id     text,
    started_at     double precision NOT NULL,
    finished_at    double precision,
    error          text,
    output_path    text,
    delivery_error text,
    PRIMARY KEY (job_id, scheduled_at)
);
CREATE INDEX cron_occurrences_status ON cron_occurrences (status, started_at);
"#;

/// Longest error text kept, in chars.
const MAX_ERROR_CHARS: usize = 2000;

/// Job columns in the order [`job_from_row`] reads them.
const JOB_COLUMNS: &str = "id, name, prompt, skills, schedule, deliver, origin, repeat, \
     completed, state, misfire, next_run_at, created_at, updated_at, last_run_at, last_status, \
     last_error";

/// Occurrence columns in the order [`occurrence_from_row`] reads them.
const OCCURRENCE_COLUMNS: &str = "job_id, scheduled_at, trigger, status, session_id, \
     started_at, finished_at, error, output_path, delivery_error";

fn unreadable(job: &str, what: &str, e: serde_json::Error) -> StoreError {
    StoreError::Database(format!("cron job `{job}` has an unreadable {what}: {e}"))
}

fn job_from_row(row: &Row) -> Result<CronJob> {
    let id: String = column(row, 0)?;
    let skills: String = column(row, 3)?;
    let deliver: String = column(row, 5)?;
    let origin: Option<String> = column(row, 6)?;
    let origin = match origin {
        None => None,
        Some(text) => Some(
            serde_json::from_str::<JobOrigin>(&text).map_err(|e| unreadable(&id, "origin", e))?,
        ),
    };
    let repeat: Option<i64> = column(row, 7)?;
    let repeat = match repeat {
        None => None,
        Some(n) => Some(u32::try_from(n).map_err(|_| {
            StoreError::Database(format!(
                "cron job `{id}` has a repeat count of {n}, beyond what a job may have"
            ))
        })?),
    };
    let state: String = column(row, 9)?;
    let misfire: String = column(row, 10)?;
    let last_status: Option<String> = column(row, 15)?;
    Ok(CronJob {
        name: column(row, 1)?,
        prompt: column(row, 2)?,
        skills: serde_json::from_str(&skills).map_err(|e| unreadable(&id, "skills list", e))?,
        schedule: column(row, 4)?,
        deliver: serde_json::from_str(&deliver).map_err(|e| unreadable(&id, "delivery list", e))?,
        origin,
        repeat,
        completed: count_u32(column(row, 8)?, "a cron job's run count")?,
        state: JobState::parse(&state)
            .ok_or_else(|| StoreError::Database(format!("unknown job state `{state}`")))?,
        misfire: Misfire::parse(&misfire)
            .ok_or_else(|| StoreError::Database(format!("unknown misfire policy `{misfire}`")))?,
        next_run_at: column(row, 11)?,
        created_at: column(row, 12)?,
        updated_at: column(row, 13)?,
        last_run_at: column(row, 14)?,
        // As in SQLite: a status this build does not know reads as none
        // rather than hiding the job.
        last_status: last_status.as_deref().and_then(OccurrenceStatus::parse),
        last_error: column(row, 16)?,
        id,
    })
}

fn occurrence_from_row(row: &Row) -> Result<Occurrence> {
    let trigger: String = column(row, 2)?;
    let status: String = column(row, 3)?;
    Ok(Occurrence {
        job_id: column(row, 0)?,
        scheduled_at: column(row, 1)?,
        trigger: Trigger::parse(&trigger)
            .ok_or_else(|| StoreError::Database(format!("unknown trigger `{trigger}`")))?,
        status: OccurrenceStatus::parse(&status)
            .ok_or_else(|| StoreError::Database(format!("unknown status `{status}`")))?,
        session_id: column(row, 4)?,
        started_at: column(row, 5)?,
        finished_at: column(row, 6)?,
        error: column(row, 7)?,
        output_path: column(row, 8)?,
        delivery_error: column(row, 9)?,
    })
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::Database(format!("cannot encode a cron job field: {e}")))
}

fn origin_json(origin: &Option<JobOrigin>) -> Result<Option<String>> {
    origin.as_ref().map(to_json).transpose()
}

fn truncate(s: Option<&str>) -> Option<String> {
    s.map(|s| match s.char_indices().nth(MAX_ERROR_CHARS) {
        Some((end, _)) => s[..end].to_owned(),
        None => s.to_owned(),
    })
}

/// A unique violation on writing job `name` as the conflict SQLite
/// reports (an id or a name taken), anything else as itself.
fn name_taken(e: tokio_postgres::Error, name: &str) -> StepError {
    if e.code() == Some(&SqlState::UNIQUE_VIOLATION) {
        StepError::Store(StoreError::Conflict(format!(
            "a cron job named `{name}` already exists"
        )))
    } else {
        StepError::Pg(e)
    }
}

async fn create(client: &Object, job: &NewCronJob) -> Step<()> {
    let state = if job.next_run_at.is_some() {
        JobState::Scheduled
    } else {
        JobState::Completed
    };
    // One clock reading for both stamps: a new job was never updated.
    let statement = client
        .prepare_cached(&format!(
            "INSERT INTO cron_jobs (id, name, prompt, skills, schedule, deliver, origin, \
             repeat, completed, state, misfire, next_run_at, created_at, updated_at) \
             SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::text, $7::text, \
             $8::bigint, 0, $9::text, $10::text, $11::bigint, clock.at, clock.at \
             FROM (SELECT {NOW} AS at) AS clock"
        ))
        .await?;
    client
        .execute(
            &statement,
            &[
                &job.id,
                &job.name,
                &job.prompt,
                &to_json(&job.skills)?,
                &job.schedule,
                &to_json(&job.deliver)?,
                &origin_json(&job.origin)?,
                &job.repeat.map(i64::from),
                &state.as_str(),
                &job.misfire.as_str(),
                &job.next_run_at,
            ],
        )
        .await
        .map_err(|e| name_taken(e, &job.name))?;
    Ok(())
}

async fn update(client: &Object, job: &CronJob) -> Step<bool> {
    let statement = client
        .prepare_cached(&format!(
            // A run already claimed is never the next one (see the
            // trait): the claim's advance stands.
            "UPDATE cron_jobs SET name = $2, prompt = $3, skills = $4, schedule = $5, \
             deliver = $6, origin = $7, repeat = $8, misfire = $9, \
             state = CASE WHEN $10 = 'scheduled' AND EXISTS (SELECT 1 FROM cron_occurrences o \
             WHERE o.job_id = $1 AND o.scheduled_at = $11) THEN state ELSE $10 END, \
             next_run_at = CASE WHEN EXISTS (SELECT 1 FROM cron_occurrences o \
             WHERE o.job_id = $1 AND o.scheduled_at = $11) THEN next_run_at ELSE $11 END, \
             updated_at = {NOW} WHERE id = $1"
        ))
        .await?;
    let changed = client
        .execute(
            &statement,
            &[
                &job.id,
                &job.name,
                &job.prompt,
                &to_json(&job.skills)?,
                &job.schedule,
                &to_json(&job.deliver)?,
                &origin_json(&job.origin)?,
                &job.repeat.map(i64::from),
                &job.misfire.as_str(),
                &job.state.as_str(),
                &job.next_run_at,
            ],
        )
        .await
        .map_err(|e| name_taken(e, &job.name))?;
    Ok(changed > 0)
}

async fn select_jobs(
    client: &Object,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Step<Vec<CronJob>> {
    let statement = client.prepare_cached(sql).await?;
    let mut jobs = Vec::new();
    for row in client.query(&statement, params).await? {
        jobs.push(job_from_row(&row)?);
    }
    Ok(jobs)
}

async fn claim(client: &mut Object, claim: &OccurrenceClaim) -> Step<bool> {
    let tx = client.transaction().await?;
    if let Some(advance) = &claim.advance {
        // The job must still be where this claimer saw it: a scheduler
        // that claimed first has moved `next_run_at` (and this update,
        // having waited for that one's row lock, sees the move).
        let statement = tx
            .prepare_cached(&format!(
                "UPDATE cron_jobs SET next_run_at = $3, \
                 completed = completed + $4, \
                 state = CASE WHEN $3::bigint IS NULL THEN 'completed' ELSE state END, \
                 updated_at = {NOW} \
                 WHERE id = $1 AND state = 'scheduled' AND next_run_at = $2"
            ))
            .await?;
        let moved = tx
            .execute(
                &statement,
                &[
                    &claim.job_id,
                    &advance.expected_next,
                    &advance.next_run_at,
                    &i32::from(advance.counts),
                ],
            )
            .await?;
        if moved == 0 {
            tx.rollback().await?;
            return Ok(false);
        }
    } else {
        // A manual run leaves the job alone but must not outlive it: the
        // key-share lock keeps a concurrent delete from removing the job
        // between this check and the insert.
        let statement = tx
            .prepare_cached("SELECT 1 FROM cron_jobs WHERE id = $1 FOR KEY SHARE")
            .await?;
        if tx.query_opt(&statement, &[&claim.job_id]).await?.is_none() {
            tx.rollback().await?;
            return Ok(false);
        }
    }
    let statement = tx
        .prepare_cached(&format!(
            "INSERT INTO cron_occurrences (job_id, scheduled_at, trigger, status, session_id, \
             started_at, finished_at) \
             SELECT $1::text, $2::bigint, $3::text, $4::text, $5::text, clock.at, \
             CASE WHEN $4::text = 'running' THEN NULL ELSE clock.at END \
             FROM (SELECT {NOW} AS at) AS clock \
             ON CONFLICT (job_id, scheduled_at) DO NOTHING"
        ))
        .await?;
    let inserted = tx
        .execute(
            &statement,
            &[
                &claim.job_id,
                &claim.scheduled_at,
                &claim.trigger.as_str(),
                &claim.status.as_str(),
                &claim.session_id,
            ],
        )
        .await?;
    if inserted == 0 {
        // Someone holds this occurrence: the advance goes with the rest.
        tx.rollback().await?;
        return Ok(false);
    }
    tx.commit().await?;
    Ok(true)
}

#[async_trait]
impl CronStore for PostgresStore {
    async fn create_job(&self, job: NewCronJob) -> Result<()> {
        talaria_core::ids::validate_path_component(&job.id)?;
        let client = self.client().await?;
        let step = create(&client, &job).await;
        settle(self, step)
    }

    async fn job(&self, id_or_name: &str) -> Result<Option<CronJob>> {
        let client = self.client().await?;
        // A job whose id is the key wins over one whose name is.
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM cron_jobs WHERE id = $1 OR name = $1 \
             ORDER BY id = $1 DESC LIMIT 1"
        );
        let step = select_jobs(&client, &sql, &[&id_or_name]).await;
        Ok(settle(self, step)?.into_iter().next())
    }

    async fn jobs(&self) -> Result<Vec<CronJob>> {
        let client = self.client().await?;
        let sql = format!("SELECT {JOB_COLUMNS} FROM cron_jobs ORDER BY created_at, id");
        let step = select_jobs(&client, &sql, &[]).await;
        settle(self, step)
    }

    async fn update_job(&self, job: &CronJob) -> Result<bool> {
        let client = self.client().await?;
        let step = update(&client, job).await;
        settle(self, step)
    }

    /// As the trait says; the occurrences go by the foreign key's cascade.
    async fn delete_job(&self, id: &str) -> Result<bool> {
        let client = self.client().await?;
        let step: Step<bool> = async {
            let statement = client
                .prepare_cached("DELETE FROM cron_jobs WHERE id = $1")
                .await?;
            Ok(client.execute(&statement, &[&id]).await? > 0)
        }
        .await;
        settle(self, step)
    }

    async fn due_jobs(&self, now: i64, limit: usize) -> Result<Vec<CronJob>> {
        let client = self.client().await?;
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM cron_jobs WHERE state = 'scheduled' \
             AND next_run_at IS NOT NULL AND next_run_at <= $1 \
             ORDER BY next_run_at, id LIMIT $2"
        );
        let step = select_jobs(&client, &sql, &[&now, &sql_limit(limit)]).await;
        settle(self, step)
    }

    /// As the trait says, in one transaction that any number of nodes may
    /// run at once for one occurrence: exactly one is told `true`.
    async fn claim_occurrence(&self, occurrence: OccurrenceClaim) -> Result<bool> {
        let mut client = self.client().await?;
        let step = claim(&mut client, &occurrence).await;
        settle(self, step)
    }

    async fn finish_occurrence(
        &self,
        job_id: &str,
        scheduled_at: i64,
        end: OccurrenceEnd,
    ) -> Result<()> {
        let error = truncate(end.error.as_deref());
        let delivery_error = truncate(end.delivery_error.as_deref());
        let last_error = error.clone().or_else(|| delivery_error.clone());
        let client = self.client().await?;
        let step: Step<()> = async {
            // One statement, so the occurrence and the job's last run get
            // one time and are written together.
            let statement = client
                .prepare_cached(&format!(
                    "WITH clock AS (SELECT {NOW} AS at), \
                     occurrence AS (\
                         UPDATE cron_occurrences SET status = $3, \
                         finished_at = (SELECT at FROM clock), error = $4, \
                         output_path = $5, delivery_error = $6 \
                         WHERE job_id = $1 AND scheduled_at = $2) \
                     UPDATE cron_jobs SET last_run_at = (SELECT at FROM clock), \
                     last_status = $3, last_error = $7 WHERE id = $1"
                ))
                .await?;
            client
                .execute(
                    &statement,
                    &[
                        &job_id,
                        &scheduled_at,
                        &end.status.as_str(),
                        &error,
                        &end.output_path,
                        &delivery_error,
                        &last_error,
                    ],
                )
                .await?;
            Ok(())
        }
        .await;
        settle(self, step)
    }

    async fn occurrences(&self, job_id: &str, limit: usize) -> Result<Vec<Occurrence>> {
        let client = self.client().await?;
        let step: Step<Vec<Occurrence>> = async {
            let statement = client
                .prepare_cached(&format!(
                    "SELECT {OCCURRENCE_COLUMNS} FROM cron_occurrences WHERE job_id = $1 \
                     ORDER BY scheduled_at DESC LIMIT $2"
                ))
                .await?;
            let mut occurrences = Vec::new();
            for row in client
                .query(&statement, &[&job_id, &sql_limit(limit)])
                .await?
            {
                occurrences.push(occurrence_from_row(&row)?);
            }
            Ok(occurrences)
        }
        .await;
        settle(self, step)
    }

    async fn recent_occurrences(&self, limit: usize) -> Result<Vec<Occurrence>> {
        let client = self.client().await?;
        let step: Step<Vec<Occurrence>> = async {
            let statement = client
                .prepare_cached(&format!(
                    "SELECT {OCCURRENCE_COLUMNS} FROM cron_occurrences \
                     ORDER BY started_at DESC, scheduled_at DESC, job_id LIMIT $1"
                ))
                .await?;
            let mut occurrences = Vec::new();
            for row in client.query(&statement, &[&sql_limit(limit)]).await? {
                occurrences.push(occurrence_from_row(&row)?);
            }
            Ok(occurrences)
        }
        .await;
        settle(self, step)
    }

    async fn prune_occurrences(&self, job_id: &str, keep: usize) -> Result<u64> {
        let client = self.client().await?;
        let step: Step<u64> = async {
            let statement = client
                .prepare_cached(
                    "DELETE FROM cron_occurrences WHERE job_id = $1 AND scheduled_at NOT IN \
                     (SELECT scheduled_at FROM cron_occurrences WHERE job_id = $1 \
                      ORDER BY scheduled_at DESC LIMIT $2)",
                )
                .await?;
            Ok(client
                .execute(&statement, &[&job_id, &sql_limit(keep)])
                .await?)
        }
        .await;
        settle(self, step)
    }

    /// As the trait says. The cutoff is the caller's clock, the start
    /// times the server's.
    async fn interrupt_stale_occurrences(&self, cutoff: Timestamp) -> Result<u64> {
        let client = self.client().await?;
        let step: Step<u64> = async {
            // The clock read once (an init plan), so every row gets one time.
            let statement = client
                .prepare_cached(&format!(
                    "UPDATE cron_occurrences SET status = 'interrupted', \
                     finished_at = (SELECT {NOW}), \
                     error = 'the process running it stopped before it finished' \
                     WHERE status = 'running' AND started_at < $1"
                ))
                .await?;
            Ok(client.execute(&statement, &[&cutoff]).await?)
        }
        .await;
        settle(self, step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_respects_char_boundaries() {
        let long = "é".repeat(MAX_ERROR_CHARS + 10);
        let cut = truncate(Some(&long)).unwrap_or_default();
        assert_eq!(cut.chars().count(), MAX_ERROR_CHARS);
        assert_eq!(truncate(Some("short")).as_deref(), Some("short"));
        assert_eq!(truncate(None), None);
    }
}
