//! Scheduled jobs and their occurrences, backend-neutral.
//!
//! The scheduling policy (parsing schedules, computing the next run,
//! misfires) lives in the gateway crate; this module owns the one thing
//! that must be atomic across processes: claiming an occurrence. Each run
//! of a job is a row keyed by `(job_id, scheduled_at)`, inserted before the
//! run starts, so two schedulers on one database can never both start the
//! same occurrence.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{Result, Timestamp};

/// Whether a job is waiting for its next run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Runs at `next_run_at`.
    Scheduled,
    /// Kept, but not run until resumed.
    Paused,
    /// Its schedule or repeat count is used up.
    Completed,
}

impl JobState {
    /// The state's name as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Scheduled => "scheduled",
            JobState::Paused => "paused",
            JobState::Completed => "completed",
        }
    }

    /// The state named `s`, if it is one.
    pub fn parse(s: &str) -> Option<JobState> {
        [JobState::Scheduled, JobState::Paused, JobState::Completed]
            .into_iter()
            .find(|state| state.as_str() == s)
    }
}

/// What to do about runs missed while no scheduler was running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Misfire {
    /// Run once, late, for everything missed; then continue on schedule.
    #[default]
    RunOnce,
    /// Record the missed run and wait for the next one on schedule.
    Skip,
}

impl Misfire {
    /// The policy's name as stored and written in jobs.
    pub fn as_str(self) -> &'static str {
        match self {
            Misfire::RunOnce => "run_once",
            Misfire::Skip => "skip",
        }
    }

    /// The policy named `s`, if it is one.
    pub fn parse(s: &str) -> Option<Misfire> {
        match s {
            "run_once" => Some(Misfire::RunOnce),
            "skip" => Some(Misfire::Skip),
            _ => None,
        }
    }
}

/// The chat a job was created from, which the `origin` target means.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobOrigin {
    /// The platform the job was created on.
    pub platform: String,
    /// The chat on it.
    pub chat_id: String,
    /// The thread or topic within the chat, if any.
    pub thread_id: Option<String>,
}

/// A job as it is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCronJob {
    /// 12 lower-case hex digits; also names the job's output folder.
    pub id: String,
    /// Unique among jobs; how people refer to it.
    pub name: String,
    /// What each run asks the agent; `None` when the skills say it all.
    pub prompt: Option<String>,
    /// Skills whose instructions are loaded into each run.
    pub skills: Vec<String>,
    /// The schedule as written in its canonical form (`every 30m`,
    /// `0 9 * * 1-5`, an RFC 3339 time).
    pub schedule: String,
    /// Delivery targets, in order.
    pub deliver: Vec<String>,
    /// The chat the job was made in, for the `origin` target.
    pub origin: Option<JobOrigin>,
    /// Runs allowed in all; `None` is unlimited.
    pub repeat: Option<u32>,
    /// What to do about runs missed while nothing was running.
    pub misfire: Misfire,
    /// The first run, as Unix seconds; `None` creates the job completed.
    pub next_run_at: Option<i64>,
}

/// A stored job.
#[derive(Debug, Clone, PartialEq)]
pub struct CronJob {
    /// 12 lower-case hex digits; also names the job's output folder.
    pub id: String,
    /// Unique among jobs; how people refer to it.
    pub name: String,
    /// What each run asks the agent.
    pub prompt: Option<String>,
    /// Skills whose instructions are loaded into each run.
    pub skills: Vec<String>,
    /// The schedule in its canonical form.
    pub schedule: String,
    /// Delivery targets, in order.
    pub deliver: Vec<String>,
    /// The chat the job was made in, for the `origin` target.
    pub origin: Option<JobOrigin>,
    /// Runs allowed in all; `None` is unlimited.
    pub repeat: Option<u32>,
    /// Scheduled runs claimed so far (manual runs and misses not counted).
    pub completed: u32,
    /// Scheduled, paused or completed.
    pub state: JobState,
    /// What to do about missed runs.
    pub misfire: Misfire,
    /// The occurrence due next, as Unix seconds.
    pub next_run_at: Option<i64>,
    /// When the job was created.
    pub created_at: Timestamp,
    /// When it last changed (edit, claim, pause).
    pub updated_at: Timestamp,
    /// When its latest run started.
    pub last_run_at: Option<Timestamp>,
    /// How its latest run ended.
    pub last_status: Option<OccurrenceStatus>,
    /// Its latest run's error, if it failed.
    pub last_error: Option<String>,
}

/// How an occurrence came about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// Its time came.
    Schedule,
    /// Someone asked for a run now (`talaria cron run`, the `cronjob` tool).
    Manual,
}

impl Trigger {
    /// The trigger's name as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Schedule => "schedule",
            Trigger::Manual => "manual",
        }
    }

    /// The trigger named `s`, if it is one.
    pub fn parse(s: &str) -> Option<Trigger> {
        match s {
            "schedule" => Some(Trigger::Schedule),
            "manual" => Some(Trigger::Manual),
            _ => None,
        }
    }
}

/// Where an occurrence stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OccurrenceStatus {
    /// Claimed and under way (or its process died: see `Interrupted`).
    Running,
    /// Answered and delivered (or written).
    Ok,
    /// Answered `[SILENT]`: kept, not delivered.
    Silent,
    /// The run failed; a short error was delivered instead.
    Failed,
    /// Missed while nothing was running, and skipped by the misfire policy.
    Missed,
    /// Still `running` long after any run could last: its process died.
    Interrupted,
}

impl OccurrenceStatus {
    /// The status's name as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            OccurrenceStatus::Running => "running",
            OccurrenceStatus::Ok => "ok",
            OccurrenceStatus::Silent => "silent",
            OccurrenceStatus::Failed => "failed",
            OccurrenceStatus::Missed => "missed",
            OccurrenceStatus::Interrupted => "interrupted",
        }
    }

    /// The status named `s`, if it is one.
    pub fn parse(s: &str) -> Option<OccurrenceStatus> {
        [
            OccurrenceStatus::Running,
            OccurrenceStatus::Ok,
            OccurrenceStatus::Silent,
            OccurrenceStatus::Failed,
            OccurrenceStatus::Missed,
            OccurrenceStatus::Interrupted,
        ]
        .into_iter()
        .find(|status| status.as_str() == s)
    }
}

/// Moving a job's schedule forward as part of a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advance {
    /// The claim holds only if the job is still scheduled with this
    /// `next_run_at`: another scheduler that got there first has moved it.
    pub expected_next: i64,
    /// The new `next_run_at`; `None` completes the job.
    pub next_run_at: Option<i64>,
    /// Whether this occurrence counts toward the job's repeat limit.
    pub counts: bool,
}

/// A request to start (or record as missed) one occurrence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OccurrenceClaim {
    /// The job it is an occurrence of.
    pub job_id: String,
    /// Unix seconds; with the job id, the occurrence's identity.
    pub scheduled_at: i64,
    /// Its schedule or a manual request.
    pub trigger: Trigger,
    /// `Running` for a run about to start, `Missed` for a skipped one.
    pub status: OccurrenceStatus,
    /// The session the run will use.
    pub session_id: Option<String>,
    /// For scheduled occurrences, the schedule step taken with the claim;
    /// `None` for manual runs, which leave the schedule alone.
    pub advance: Option<Advance>,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OccurrenceEnd {
    /// `Ok` or `Failed`.
    pub status: OccurrenceStatus,
    /// What went wrong, for a failed run.
    pub error: Option<String>,
    /// The saved output file.
    pub output_path: Option<String>,
    /// Targets that could not be delivered to, and why.
    pub delivery_error: Option<String>,
}

/// A stored occurrence.
#[derive(Debug, Clone, PartialEq)]
pub struct Occurrence {
    /// The job it is an occurrence of.
    pub job_id: String,
    /// Unix seconds it was due; with the job id, its identity.
    pub scheduled_at: i64,
    /// Its schedule or a manual request.
    pub trigger: Trigger,
    /// Running, finished, missed or interrupted.
    pub status: OccurrenceStatus,
    /// The session the run used.
    pub session_id: Option<String>,
    /// When the claim was made.
    pub started_at: Timestamp,
    /// When the run ended.
    pub finished_at: Option<Timestamp>,
    /// What went wrong, for a failed run.
    pub error: Option<String>,
    /// The saved output file.
    pub output_path: Option<String>,
    /// Targets that could not be delivered to, and why.
    pub delivery_error: Option<String>,
}

/// Scheduled jobs and the record of their runs.
#[async_trait]
pub trait CronStore: Send + Sync {
    /// Stores a new job, created now. A name or id already taken fails with
    /// [`crate::StoreError::Conflict`].
    async fn create_job(&self, job: NewCronJob) -> Result<()>;
    /// The job with this id or, failing that, this name.
    async fn job(&self, id_or_name: &str) -> Result<Option<CronJob>>;
    /// Every job, oldest first.
    async fn jobs(&self) -> Result<Vec<CronJob>>;
    /// Writes the job's editable fields (name, prompt, skills, schedule,
    /// deliver, origin, repeat, misfire, state, next_run_at); the run
    /// record (`completed`, `last_*`) is the scheduler's. Returns whether
    /// the job exists. A name taken by another job fails with
    /// [`crate::StoreError::Conflict`].
    ///
    /// A `next_run_at` whose run is already claimed is not written (nor a
    /// `scheduled` state with it): the job keeps what the claim moved it
    /// to. An edit read before a scheduler's claim and written after it
    /// would otherwise put the job back on a run that can never be
    /// claimed again, and it would never run again.
    async fn update_job(&self, job: &CronJob) -> Result<bool>;
    /// Deletes a job and its occurrence records; returns whether it existed.
    async fn delete_job(&self, id: &str) -> Result<bool>;
    /// Scheduled jobs whose `next_run_at` is at or before `now` (Unix
    /// seconds), earliest first, at most `limit`.
    async fn due_jobs(&self, now: i64, limit: usize) -> Result<Vec<CronJob>>;
    /// In one transaction: inserts the occurrence `(job_id, scheduled_at)`
    /// and, with an [`Advance`], checks that the job is still scheduled
    /// with the expected `next_run_at`, moves it on, counts the run and
    /// completes the job when there is no next run. Returns `false`,
    /// changing nothing, when the occurrence exists already, the job is
    /// gone, or (with an advance) another claim moved the job first.
    async fn claim_occurrence(&self, claim: OccurrenceClaim) -> Result<bool>;
    /// Records how a run ended, on the occurrence and as the job's last
    /// run.
    async fn finish_occurrence(
        &self,
        job_id: &str,
        scheduled_at: i64,
        end: OccurrenceEnd,
    ) -> Result<()>;
    /// The job's occurrences, newest scheduled first, at most `limit`.
    async fn occurrences(&self, job_id: &str, limit: usize) -> Result<Vec<Occurrence>>;
    /// Every job's occurrences together, the latest started first (ties:
    /// the latest due first), at most `limit`: the scheduler's recent
    /// work, for `talaria cron status`.
    async fn recent_occurrences(&self, limit: usize) -> Result<Vec<Occurrence>>;
    /// Keeps the job's `keep` newest occurrence records; returns how many
    /// were deleted.
    async fn prune_occurrences(&self, job_id: &str, keep: usize) -> Result<u64>;
    /// Marks occurrences still `running` that started before `cutoff` as
    /// interrupted (their process died); returns how many.
    async fn interrupt_stale_occurrences(&self, cutoff: Timestamp) -> Result<u64>;
}
