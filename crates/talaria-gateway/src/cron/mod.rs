//! Scheduled jobs: prompts (and skills) that run by themselves on a
//! schedule, each as an isolated agent session whose answer is delivered
//! through the ledger.
//!
//! # Layout
//!
//! - [`schedule`]: what a schedule may say, the next occurrence, the grace
//!   before a late occurrence is a misfire (pure; time passed in).
//! - [`jobs`]: creating, changing, pausing and removing jobs, with the
//!   checks shared by `talaria cron` and the `cronjob` tool.
//! - [`scheduler`]: the tick (claim, then run), a run from start to end,
//!   output files, delivery.
//! - [`tool`]: the agent's `cronjob` tool.
//!
//! # Invariants
//!
//! - **An occurrence fires at most once.** Its row `(job_id,
//!   scheduled_at)` is inserted, together with the move of the job's
//!   `next_run_at`, before the run starts; a second scheduler's claim of the
//!   same occurrence changes nothing.
//! - **A run is its own session** with source `cron` and without the
//!   `memory` tool: it never changes memory and is never mirrored into a
//!   chat's history.

pub mod jobs;
pub mod schedule;
pub mod scheduler;
pub mod tool;

pub use jobs::{CronError, JobChanges, JobSpec};
pub use schedule::{Schedule, Zone};
pub use scheduler::{Claimed, RunReport, Scheduler, SchedulerParts};
pub use tool::CronTool;
