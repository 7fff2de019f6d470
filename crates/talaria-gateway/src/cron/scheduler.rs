//! The scheduler: finds due jobs, claims each occurrence before running
//! it, runs it as an isolated agent session, saves the output and delivers
//! it through the ledger.
//!
//! Time is always passed in ([`Scheduler::tick`] takes `now`), so tests
//! drive the scheduler with an injected clock; the gateway's ticker passes
//! the wall clock.
//!
//! # What a tick does with a due job
//!
//! The occurrence due is the job's stored `next_run_at`. If it is later
//! than its grace ([`Schedule::grace`]) it is a misfire: with
//! [`Misfire::Skip`] it is recorded as missed and the job moves to its next
//! occurrence after now; with [`Misfire::RunOnce`] it runs (once, however
//! many were missed) and the job moves on the same way. The claim inserts
//! the occurrence row and moves `next_run_at` in one transaction guarded on
//! the `next_run_at` read, so of two schedulers on one database exactly one
//! starts the run.
//!
//! # A run
//!
//! Each run is a session of its own, `cron_<job>_<YYYYMMDD_HHMMSS>`, with
//! source `cron`: nothing is written into any chat's history, and the turn
//! runs without the `memory` and `cronjob` tools, so a job never changes
//! memory or schedules more jobs. Nobody can answer approvals, so
//! dangerous commands are refused. The answer is saved under
//! `cron/output/<job>/`; an answer of `[SILENT]` is kept there and
//! delivered nowhere; a failure delivers a short error instead.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::Registry;
use talaria_agent::{Agent, NullObserver, TurnExit, TurnOptions};
use talaria_core::{Config, Home};
use talaria_store::{
    Advance, CronJob, GatewayStore, Misfire, NewSession, OccurrenceClaim, OccurrenceEnd,
    OccurrenceStatus, StoreError, Trigger,
};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::jobs::{self, CronError};
use super::schedule::{Schedule, Zone};
use crate::delivery::{Address, Delivery};
use crate::hooks::{Hooks, events};
use crate::target::Target;

/// The source of cron sessions.
pub const SOURCE: &str = "cron";

/// The tools a run goes without: memory stays as the user's conversations
/// left it, and a job cannot schedule jobs.
pub const WITHHELD_TOOLS: &[&str] = &["memory", "cronjob"];

/// Due jobs looked at per tick; the rest wait for the next tick.
const DUE_PER_TICK: usize = 100;

/// Occurrence records kept per job (output files are counted separately,
/// by `cron.output_retention`).
const OCCURRENCES_KEPT: usize = 200;

/// The longest error text delivered to a chat, in chars.
const DELIVERED_ERROR_CHARS: usize = 300;

/// Everything a scheduler is built from.
pub struct SchedulerParts {
    /// The loaded configuration (the `cron` section, the model).
    pub config: Arc<Config>,
    /// The Talaria home: run outputs are written under it.
    pub home: Home,
    /// Runs each job's turn.
    pub agent: Arc<Agent>,
    /// Holds the jobs and their occurrences.
    pub store: Arc<dyn GatewayStore>,
    /// Sends run results to the job's targets.
    pub delivery: Delivery,
    /// Fires `cron:run` after each run.
    pub hooks: Arc<Hooks>,
    /// Wait for `cron:run` hooks after each run (a short-lived process such
    /// as `talaria cron run`, which would otherwise exit under them).
    pub await_hooks: bool,
    /// Where runs' commands run, shared with the gateway's conversations;
    /// `None` makes the scheduler its own from the configuration.
    pub backends: Option<Arc<talaria_exec::Backends>>,
}

/// What a tick did with one due job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The job claimed.
    pub job_id: String,
    /// The occurrence, as Unix seconds.
    pub scheduled_at: i64,
    /// `Running` for a run started, `Missed` for one skipped.
    pub status: OccurrenceStatus,
}

/// How a run went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    /// The job run.
    pub job_id: String,
    /// Its name at the time of the run.
    pub job_name: String,
    /// The occurrence run, as Unix seconds.
    pub scheduled_at: i64,
    /// How the occurrence ended.
    pub status: OccurrenceStatus,
    /// The session the run's turn was recorded in.
    pub session_id: String,
    /// The model's answer (empty when the run failed).
    pub answer: String,
    /// Why the run failed, when it did.
    pub error: Option<String>,
    /// The file the run's output was saved to, when saving worked.
    pub output_path: Option<PathBuf>,
    /// Targets delivered to.
    pub delivered: Vec<String>,
    /// Targets that could not be delivered to, with why.
    pub delivery_errors: Vec<String>,
}

/// Runs scheduled jobs. Cheap to clone; clones share the runs.
#[derive(Clone)]
pub struct Scheduler {
    inner: Arc<Inner>,
}

struct Inner {
    config: Arc<Config>,
    home: Home,
    agent: Arc<Agent>,
    store: Arc<dyn GatewayStore>,
    delivery: Delivery,
    hooks: Arc<Hooks>,
    await_hooks: bool,
    zone: Zone,
    /// The agent's tools minus [`WITHHELD_TOOLS`].
    registry: Arc<Registry>,
    /// Where runs' commands run: a job made in a chat is untrusted.
    backends: Arc<talaria_exec::Backends>,
    /// Jobs with a run under way in this process: a job never overlaps
    /// itself here.
    running: Mutex<HashSet<String>>,
    /// `cron.max_parallel` runs at once.
    permits: Arc<Semaphore>,
    tracker: TaskTracker,
    /// Fires when the scheduler stops for good: runs are interrupted.
    stop: CancellationToken,
}

impl Scheduler {
    /// A scheduler over these parts. Fails when `cron.timezone` is not a
    /// zone (a checked config never has that).
    pub fn new(parts: SchedulerParts) -> Result<Scheduler, String> {
        let zone = Zone::from_config(&parts.config.cron)?;
        let registry = Arc::new(parts.agent.parts().registry.without(WITHHELD_TOOLS));
        let backends = parts.backends.unwrap_or_else(|| {
            Arc::new(talaria_exec::Backends::new(
                &parts.config.terminal,
                &parts.home,
                parts.agent.parts().workdir.clone(),
            ))
        });
        Ok(Scheduler {
            inner: Arc::new(Inner {
                permits: Arc::new(Semaphore::new(parts.config.cron.max_parallel.max(1))),
                config: parts.config,
                home: parts.home,
                agent: parts.agent,
                store: parts.store,
                delivery: parts.delivery,
                hooks: parts.hooks,
                await_hooks: parts.await_hooks,
                zone,
                registry,
                backends,
                running: Mutex::new(HashSet::new()),
                tracker: TaskTracker::new(),
                stop: CancellationToken::new(),
            }),
        })
    }

    /// Claims every occurrence due at `now` and starts its run in the
    /// background (see the module documentation); returns what it claimed.
    pub async fn tick(&self, now: DateTime<Utc>) -> Result<Vec<Claimed>, StoreError> {
        let inner = &self.inner;
        let mut claimed = Vec::new();
        if inner.stop.is_cancelled() {
            return Ok(claimed);
        }
        for job in inner.store.due_jobs(now.timestamp(), DUE_PER_TICK).await? {
            if self.is_running(&job.id) {
                continue;
            }
            let Some(next_at) = job.next_run_at else {
                continue;
            };
            let Some(scheduled) = DateTime::from_timestamp(next_at, 0) else {
                continue;
            };
            let schedule = match Schedule::from_stored(&job.schedule) {
                Ok(s) => s,
                Err(e) => {
                    self.suspend(&job, &format!("its stored schedule is unreadable: {e}"))
                        .await;
                    continue;
                }
            };
            let grace = chrono::Duration::from_std(schedule.grace(scheduled, inner.zone))
                .unwrap_or_default();
            let late = now - scheduled > grace;
            let following = schedule
                .following(scheduled, now, inner.zone)
                .map(|t| t.timestamp());
            if late && job.misfire == Misfire::Skip {
                let claim = OccurrenceClaim {
                    job_id: job.id.clone(),
                    scheduled_at: next_at,
                    trigger: Trigger::Schedule,
                    status: OccurrenceStatus::Missed,
                    session_id: None,
                    advance: Some(Advance {
                        expected_next: next_at,
                        next_run_at: following,
                        counts: false,
                    }),
                };
                if inner.store.claim_occurrence(claim).await? {
                    talaria_core::metrics::cron_ran("missed");
                    tracing::info!(job = %job.name, due = %inner.zone.format(scheduled), "cron job missed its time; skipped as its misfire policy says");
                    let end = OccurrenceEnd {
                        status: OccurrenceStatus::Missed,
                        error: Some(format!(
                            "missed: nothing was running at {}",
                            inner.zone.format(scheduled)
                        )),
                        output_path: None,
                        delivery_error: None,
                    };
                    inner.store.finish_occurrence(&job.id, next_at, end).await?;
                    claimed.push(Claimed {
                        job_id: job.id.clone(),
                        scheduled_at: next_at,
                        status: OccurrenceStatus::Missed,
                    });
                }
                continue;
            }
            let exhausted = job
                .repeat
                .is_some_and(|r| job.completed.saturating_add(1) >= r);
            let session_id = session_id(&job.id, scheduled);
            let claim = OccurrenceClaim {
                job_id: job.id.clone(),
                scheduled_at: next_at,
                trigger: Trigger::Schedule,
                status: OccurrenceStatus::Running,
                session_id: Some(session_id.clone()),
                advance: Some(Advance {
                    expected_next: next_at,
                    next_run_at: if exhausted { None } else { following },
                    counts: true,
                }),
            };
            if !inner.store.claim_occurrence(claim).await? {
                tracing::debug!(job = %job.name, "another scheduler claimed this occurrence");
                continue;
            }
            claimed.push(Claimed {
                job_id: job.id.clone(),
                scheduled_at: next_at,
                status: OccurrenceStatus::Running,
            });
            self.mark_running(&job.id);
            let this = self.clone();
            inner.tracker.spawn(async move {
                let _permit = this.inner.permits.clone().acquire_owned().await;
                let report = this
                    .execute(&job, scheduled, Trigger::Schedule, session_id, late)
                    .await;
                this.unmark_running(&job.id);
                log_report(&report);
            });
        }
        Ok(claimed)
    }

    /// Runs the job now, outside its schedule, and waits for the run. The
    /// schedule and repeat count are left alone.
    pub async fn run_now(
        &self,
        id_or_name: &str,
        now: DateTime<Utc>,
    ) -> Result<RunReport, CronError> {
        let job = jobs::find(self.inner.store.as_ref(), id_or_name).await?;
        let scheduled = DateTime::from_timestamp(now.timestamp(), 0).unwrap_or(now);
        let session_id = session_id(&job.id, scheduled);
        let claim = OccurrenceClaim {
            job_id: job.id.clone(),
            scheduled_at: scheduled.timestamp(),
            trigger: Trigger::Manual,
            status: OccurrenceStatus::Running,
            session_id: Some(session_id.clone()),
            advance: None,
        };
        if !self.inner.store.claim_occurrence(claim).await? {
            return Err(CronError::Invalid(format!(
                "`{}` already has a run for this second; try again in a moment",
                job.name
            )));
        }
        self.mark_running(&job.id);
        let _permit = self.inner.permits.clone().acquire_owned().await;
        let report = self
            .execute(&job, scheduled, Trigger::Manual, session_id, false)
            .await;
        self.unmark_running(&job.id);
        Ok(report)
    }

    /// Where runs are delivered: the gateway's adapters.
    pub fn delivery(&self) -> &Delivery {
        &self.inner.delivery
    }

    /// Starts [`Scheduler::run_now`] in the background (the `cronjob`
    /// tool's `run`, which must not hold up the turn that asked).
    pub fn spawn_run_now(&self, id_or_name: String, now: DateTime<Utc>) {
        let this = self.clone();
        self.inner.tracker.spawn(async move {
            match this.run_now(&id_or_name, now).await {
                Ok(report) => log_report(&report),
                Err(e) => {
                    tracing::warn!(job = %id_or_name, error = %e, "could not run the cron job")
                }
            }
        });
    }

    /// Waits until no run is under way (tests, and a stop's drain).
    pub async fn idle(&self) {
        let tracker = &self.inner.tracker;
        tracker.close();
        tracker.wait().await;
        tracker.reopen();
    }

    /// Stops for good: no more ticks start runs; runs under way get `grace`
    /// to finish and are then interrupted (their occurrence ends failed).
    pub async fn stop(&self, grace: Duration) {
        let tracker = &self.inner.tracker;
        tracker.close();
        if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
            tracing::warn!("interrupting scheduled jobs still running at shutdown");
        }
        self.inner.stop.cancel();
        tracker.wait().await;
    }

    /// Marks occurrences left `running` by a process that died as
    /// interrupted: anything running for longer than twice the run timeout.
    pub async fn mark_abandoned_runs(&self, now: DateTime<Utc>) -> Result<u64, StoreError> {
        let timeout = self.inner.config.cron.run_timeout_secs.max(1) as f64;
        let cutoff = now.timestamp() as f64 - 2.0 * timeout - 60.0;
        self.inner.store.interrupt_stale_occurrences(cutoff).await
    }

    fn is_running(&self, job_id: &str) -> bool {
        self.running().contains(job_id)
    }

    fn mark_running(&self, job_id: &str) {
        self.running().insert(job_id.to_owned());
    }

    fn unmark_running(&self, job_id: &str) {
        self.running().remove(job_id);
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.inner.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pauses a job that cannot run, saying why in its record.
    async fn suspend(&self, job: &CronJob, why: &str) {
        tracing::error!(job = %job.name, "cron job paused: {why}");
        let mut paused = job.clone();
        paused.state = talaria_store::JobState::Paused;
        if let Err(e) = self.inner.store.update_job(&paused).await {
            tracing::warn!(job = %job.name, error = %e, "could not pause the cron job");
        }
    }

    /// One run, start to end; never fails: what went wrong is in the
    /// report and the occurrence record.
    async fn execute(
        &self,
        job: &CronJob,
        scheduled: DateTime<Utc>,
        trigger: Trigger,
        session_id: String,
        late: bool,
    ) -> RunReport {
        let inner = &self.inner;
        let outcome = self.turn(job, scheduled, &session_id).await;
        let (status, answer, error) = match outcome {
            Ok(answer) if is_silent(&answer) => (OccurrenceStatus::Silent, answer, None),
            Ok(answer) => (OccurrenceStatus::Ok, answer, None),
            Err(e) => (OccurrenceStatus::Failed, String::new(), Some(e)),
        };
        talaria_core::metrics::cron_ran(match status {
            OccurrenceStatus::Failed => "error",
            OccurrenceStatus::Silent => "silent",
            _ => "ok",
        });
        let output_path = match self
            .save_output(
                job,
                scheduled,
                trigger,
                status,
                &session_id,
                &answer,
                error.as_deref(),
            )
            .await
        {
            Ok(path) => Some(path),
            Err(e) => {
                tracing::warn!(job = %job.name, error = %e, "could not save the cron output");
                None
            }
        };
        let (delivered, delivery_errors) = match status {
            OccurrenceStatus::Silent => (Vec::new(), Vec::new()),
            _ => {
                let text = match &error {
                    None => deliverable(job, &answer, late.then_some((scheduled, inner.zone))),
                    Some(e) => failure_notice(job, e),
                };
                self.deliver(job, scheduled, &text).await
            }
        };
        let end = OccurrenceEnd {
            status,
            error: error.clone(),
            output_path: output_path.as_ref().map(|p| p.display().to_string()),
            delivery_error: (!delivery_errors.is_empty()).then(|| delivery_errors.join("; ")),
        };
        if let Err(e) = inner
            .store
            .finish_occurrence(&job.id, scheduled.timestamp(), end)
            .await
        {
            tracing::warn!(job = %job.name, error = %e, "could not record the end of a cron run");
        }
        if let Err(e) = inner
            .store
            .prune_occurrences(&job.id, OCCURRENCES_KEPT)
            .await
        {
            tracing::debug!(job = %job.name, error = %e, "could not prune old cron run records");
        }
        let event = events::CronRun {
            job_id: &job.id,
            job_name: &job.name,
            scheduled_at: scheduled.timestamp(),
            trigger: trigger.as_str(),
            status: status.as_str(),
            session_id: &session_id,
        };
        if inner.await_hooks {
            inner.hooks.fire_and_wait(&event).await;
        } else {
            inner.hooks.fire(&event);
        }
        RunReport {
            job_id: job.id.clone(),
            job_name: job.name.clone(),
            scheduled_at: scheduled.timestamp(),
            status,
            session_id,
            answer,
            error,
            output_path,
            delivered,
            delivery_errors,
        }
    }

    /// The agent turn: the answer, or why there is none.
    async fn turn(
        &self,
        job: &CronJob,
        scheduled: DateTime<Utc>,
        session_id: &str,
    ) -> Result<String, String> {
        let inner = &self.inner;
        let prompt = self.prompt(job, scheduled)?;
        let handle = inner
            .agent
            .start_session(NewSession {
                id: session_id.to_owned(),
                source: SOURCE.to_owned(),
                session_key: Some(format!("cron:{}", job.id)),
                ..NewSession::default()
            })
            .await
            .map_err(|e| format!("could not start the run's session: {e}"))?;
        let _ = inner
            .store
            .set_title(&handle.id, &format!("cron: {}", job.name))
            .await;
        let cancel = inner.stop.child_token();
        // A job made in a chat runs what that chat's people asked for: it
        // gets the untrusted backend, in a workspace of its own.
        let trust = match job.origin {
            Some(_) => talaria_exec::Trust::Untrusted,
            None => talaria_exec::Trust::Owner,
        };
        let execution = talaria_agent::Execution::for_conversation(
            &inner.backends,
            trust,
            &format!("cron:{}", job.id),
        )
        .await;
        let options = TurnOptions {
            interaction: Some(Arc::new(NoHuman)),
            registry: Some(inner.registry.clone()),
            // A job never feeds or reads the external memory either.
            without_memory: true,
            // Its output may go to several targets (or none), each
            // recorded when it is delivered.
            outbox: None,
            media: Vec::new(),
            execution: Some(execution),
            // Every toolset: a job's tools are chosen by whoever wrote it.
            platform: None,
            max_turns: None,
            // The configured model: a job is nobody's conversation.
            provider: None,
            instructions: None,
        };
        let run =
            inner
                .agent
                .run_turn_with(&handle, &prompt, &NullObserver, cancel.clone(), options);
        tokio::pin!(run);
        let limit = Duration::from_secs(inner.config.cron.run_timeout_secs.max(1));
        let mut timed_out = false;
        let result = tokio::select! {
            r = &mut run => r,
            _ = tokio::time::sleep(limit) => {
                timed_out = true;
                cancel.cancel();
                run.await
            }
        };
        let outcome = result.map_err(|e| e.to_string())?;
        match outcome.exit {
            TurnExit::Completed | TurnExit::BudgetExhausted => Ok(outcome.answer),
            TurnExit::Interrupted if timed_out => Err(format!(
                "it ran longer than {} s (cron.run_timeout_secs) and was stopped",
                limit.as_secs()
            )),
            TurnExit::Interrupted => Err("it was interrupted: the gateway is stopping".into()),
            TurnExit::Failed(reason) => Err(reason),
        }
    }

    /// What the model is asked: a note saying what this is, the skills'
    /// instructions, then the job's prompt.
    fn prompt(&self, job: &CronJob, scheduled: DateTime<Utc>) -> Result<String, String> {
        let targets = job.deliver.join(", ");
        let mut prompt = format!(
            "[This is the scheduled job \"{}\" (id {}), due {}. Nobody is waiting in this \
             conversation: your final answer is delivered as written to {targets}. If there is \
             nothing worth reporting, answer exactly [SILENT] and nothing is sent.]",
            job.name,
            job.id,
            self.inner.zone.format(scheduled),
        );
        for skill in &job.skills {
            let text = jobs::skill_text(&self.inner.home, skill).map_err(|e| e.to_string())?;
            prompt.push_str(&format!(
                "\n\n<skill name=\"{skill}\">\n{}\n</skill>",
                text.trim()
            ));
        }
        prompt.push_str("\n\n");
        match &job.prompt {
            Some(p) => prompt.push_str(p),
            None => prompt.push_str("Follow the skill's instructions now."),
        }
        Ok(prompt)
    }

    /// Writes `cron/output/<job>/<YYYY-MM-DD_HH-MM-SS>.md` and keeps the
    /// newest `cron.output_retention` files.
    #[allow(clippy::too_many_arguments)]
    async fn save_output(
        &self,
        job: &CronJob,
        scheduled: DateTime<Utc>,
        trigger: Trigger,
        status: OccurrenceStatus,
        session_id: &str,
        answer: &str,
        error: Option<&str>,
    ) -> Result<PathBuf, String> {
        talaria_core::ids::validate_path_component(&job.id).map_err(|e| e.to_string())?;
        let dir = self.inner.home.cron_output_dir().join(&job.id);
        let path = dir.join(format!("{}.md", scheduled.format("%Y-%m-%d_%H-%M-%S")));
        let body = format!(
            "# {}\n\n- job: {}\n- due: {}\n- trigger: {}\n- status: {}\n- session: {}\n\n{}\n",
            job.name,
            job.id,
            self.inner.zone.format(scheduled),
            trigger.as_str(),
            status.as_str(),
            session_id,
            match error {
                Some(e) => format!("The run failed: {e}"),
                None => answer.to_owned(),
            }
        );
        let keep = self.inner.config.cron.output_retention.max(1);
        let written = path.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::create_dir_all(&dir)?;
            std::fs::write(&path, body)?;
            prune_outputs(&dir, keep)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
        Ok(written)
    }

    /// Sends `text` to each of the job's targets through the ledger;
    /// `local` is the output file already written.
    async fn deliver(
        &self,
        job: &CronJob,
        scheduled: DateTime<Utc>,
        text: &str,
    ) -> (Vec<String>, Vec<String>) {
        let delivery = &self.inner.delivery;
        let origin = job.origin.as_ref().map(|o| Address {
            platform: o.platform.clone(),
            chat_id: o.chat_id.clone(),
            thread_id: o.thread_id.clone(),
            reply_to: None,
        });
        let key = format!("cron:{}", job.id);
        let reference = scheduled.timestamp().to_string();
        let mut delivered = Vec::new();
        let mut errors = Vec::new();
        for raw in &job.deliver {
            let target: Target = match raw.parse() {
                Ok(t) => t,
                Err(e) => {
                    errors.push(format!("{raw}: {e}"));
                    continue;
                }
            };
            if target == Target::Local {
                delivered.push(raw.clone());
                continue;
            }
            let to = match delivery.resolve(&target, origin.as_ref()) {
                Ok(to) => to,
                Err(e) => {
                    errors.push(format!("{raw}: {e}"));
                    continue;
                }
            };
            if to.platform == crate::delivery::LOCAL {
                delivered.push(raw.clone());
                continue;
            }
            match delivery
                .deliver_reply(&key, &reference, &to, text, None)
                .await
            {
                Ok(()) => delivered.push(raw.clone()),
                Err(e) => errors.push(format!("{raw}: {e}")),
            }
        }
        (delivered, errors)
    }
}

/// `cron_<job>_<YYYYMMDD_HHMMSS>` of the occurrence.
pub fn session_id(job_id: &str, scheduled: DateTime<Utc>) -> String {
    format!("cron_{job_id}_{}", scheduled.format("%Y%m%d_%H%M%S"))
}

/// Whether an answer asks for nothing to be delivered: `[SILENT]` (or
/// `SILENT`, `NO_REPLY`, `NO REPLY`) as the whole answer, its first or last
/// line, or a `[SILENT]` prefix.
pub fn is_silent(answer: &str) -> bool {
    fn marker(line: &str) -> bool {
        let line = line.trim().trim_matches(|c| c == '*' || c == '`').trim();
        ["[SILENT]", "SILENT", "NO_REPLY", "NO REPLY"]
            .iter()
            .any(|m| line.eq_ignore_ascii_case(m))
    }
    let trimmed = answer.trim();
    if trimmed.to_ascii_uppercase().starts_with("[SILENT]") {
        return true;
    }
    let mut lines = trimmed.lines().filter(|l| !l.trim().is_empty());
    let first = lines.next();
    let last = lines.next_back().or(first);
    first.is_some_and(marker) || last.is_some_and(marker)
}

/// The delivered text: the job's name, a note when it ran late, the answer.
fn deliverable(job: &CronJob, answer: &str, late: Option<(DateTime<Utc>, Zone)>) -> String {
    match late {
        Some((due, zone)) => format!(
            "⏰ {} (late: it was due {})\n\n{}",
            job.name,
            zone.format(due),
            answer.trim()
        ),
        None => format!("⏰ {}\n\n{}", job.name, answer.trim()),
    }
}

/// What a failed run delivers.
fn failure_notice(job: &CronJob, error: &str) -> String {
    let short: String = error.chars().take(DELIVERED_ERROR_CHARS).collect();
    let more = if error.chars().count() > DELIVERED_ERROR_CHARS {
        "…"
    } else {
        ""
    };
    format!(
        "⚠️ The scheduled job “{}” failed: {short}{more}\n(See `talaria cron logs {}`.)",
        job.name, job.id
    )
}

/// Deletes all but the `keep` newest `.md` files in `dir` (names sort by
/// time).
fn prune_outputs(dir: &std::path::Path, keep: usize) -> std::io::Result<()> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md") && p.is_file())
        .collect();
    files.sort();
    let excess = files.len().saturating_sub(keep);
    for old in files.into_iter().take(excess) {
        std::fs::remove_file(old)?;
    }
    Ok(())
}

fn log_report(report: &RunReport) {
    match &report.error {
        None => tracing::info!(
            job = %report.job_name,
            status = report.status.as_str(),
            delivered = ?report.delivered,
            "cron job ran"
        ),
        Some(e) => tracing::warn!(job = %report.job_name, error = %e, "cron job failed"),
    }
    for e in &report.delivery_errors {
        tracing::warn!(job = %report.job_name, error = %e, "cron output not delivered");
    }
}

#[cfg(test)]
mod tests;
