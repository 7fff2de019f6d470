//! Work that outlives its turn: a background process, a delegated task run
//! detached, a prompt run with `/background`. The turn that starts it has
//! ended by the time it finishes, so its report needs somewhere to go.
//!
//! [`Reports`] is that somewhere, implemented by the front end: the gateway
//! records an obligation in the store when the job opens and delivers the
//! report through its delivery ledger (once, even across a restart), the
//! terminal prints it. The agent knows nothing about chats: a job is
//! addressed by the session it belongs to.
//!
//! Tools are built before the front end that delivers (the gateway binds
//! its delivery after the agent exists), so they hold a [`ReportsSlot`]
//! that is bound later.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;

/// What kind of work a job is (for `/status` and the notices).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobKind {
    /// A command started with `terminal(background=true)`.
    Process,
    /// A `delegate_task` call run with `background: true`.
    Delegation,
    /// A prompt run with `/background`.
    Prompt,
}

impl JobKind {
    /// The name stored and shown (`process`, `delegation`, `prompt`).
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Process => "process",
            JobKind::Delegation => "delegation",
            JobKind::Prompt => "prompt",
        }
    }

    /// The kind named `s` (as [`JobKind::as_str`] writes it).
    pub fn parse(s: &str) -> Option<JobKind> {
        match s {
            "process" => Some(JobKind::Process),
            "delegation" => Some(JobKind::Delegation),
            "prompt" => Some(JobKind::Prompt),
            _ => None,
        }
    }
}

/// A job as it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobStart {
    /// Unique in the deployment (a process id like `proc_…`, a delegation
    /// id): the key of its obligation.
    pub id: String,
    /// The session whose chat is owed the report.
    pub session_id: String,
    /// What it is.
    pub kind: JobKind,
    /// One line saying what it does (the command, the task's goal), already
    /// redacted; quoted in the notices.
    pub title: String,
}

/// What a finished job reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobReport {
    /// The notice for the person (a line and the end of the output).
    pub text: String,
    /// When the job asked for it: text for a new turn of the session, so
    /// the agent can act on the result (the front end decides whether it
    /// runs one; see `background.follow_up_turns`).
    pub follow_up: Option<String>,
}

/// Where jobs report. See the module documentation.
#[async_trait]
pub trait Reports: Send + Sync {
    /// Records that `job` owes its session a report, before the job starts.
    /// `Err` says why no report can be promised; the caller then refuses
    /// to start the job detached rather than start it and lose its end.
    async fn opened(&self, job: &JobStart) -> Result<(), String>;

    /// Something worth telling while the job runs (a watched pattern
    /// matched). Best effort: not an obligation.
    async fn progress(&self, job: &JobStart, text: &str);

    /// The job ended: delivers `report` once and settles the obligation.
    async fn closed(&self, job: &JobStart, report: JobReport);

    /// The job will not report (killed on purpose, its session reset):
    /// settles the obligation without a message.
    async fn dropped(&self, job: &JobStart);
}

/// What holds work a session started (its background commands): told when
/// the session is reset, so the work ends with it.
pub trait SessionWork: Send + Sync {
    /// Ends the work `session_id` started (without a report: the person
    /// asked for a fresh start).
    fn end_session(&self, session_id: &str);

    /// What `session_id` has running now, as (id, what it does, seconds
    /// since it started), oldest first: for `/status`.
    fn running(&self, _session_id: &str) -> Vec<(String, String, u64)> {
        Vec::new()
    }
}

/// A [`Reports`] bound after the tools holding it were built.
#[derive(Clone, Default)]
pub struct ReportsSlot(Arc<OnceLock<Arc<dyn Reports>>>);

impl ReportsSlot {
    /// An unbound slot.
    pub fn new() -> ReportsSlot {
        ReportsSlot::default()
    }

    /// Binds where reports go; a second call changes nothing.
    pub fn bind(&self, reports: Arc<dyn Reports>) {
        let _ = self.0.set(reports);
    }

    /// Where reports go, once bound.
    pub fn get(&self) -> Option<&Arc<dyn Reports>> {
        self.0.get()
    }
}

impl std::fmt::Debug for ReportsSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ReportsSlot")
            .field(&self.0.get().is_some())
            .finish()
    }
}
