//! Work that outlives its turn, as a chat sees it (see
//! [`talaria_agent::background`]): a background process, a detached
//! delegation, a `/background` prompt.
//!
//! A job owes its chat a report from the moment it opens. The obligation
//! is an owed-turn row ([`talaria_store::owed`]) whose id starts with
//! [`JOB_PREFIX`] and whose payload is a [`JobRecord`]: the same table, the
//! same claims by live nodes, the same settling in the transaction that
//! records the report in the delivery ledger. So a finished job's report
//! is delivered once (the ledger takes it from there, across a restart),
//! and a job whose node died is reported lost by the next node to sweep,
//! never forgotten: a job's work lives in its process and cannot be
//! resumed, so a claimed job row is never run again, only said lost.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use talaria_agent::background::{JobKind, JobStart};

use crate::event::MessageEvent;
use crate::key::SessionKey;

/// Starts the owed-turn id of every job.
pub const JOB_PREFIX: &str = "job\u{1f}";

/// Jobs open at once on one node; past it a new job is refused (each
/// already has its own bound, this keeps the sum bounded).
pub const MAX_OPEN: usize = 1024;

/// Sessions whose last turn's chat is remembered, to address the jobs
/// their tools open.
const MAX_REMEMBERED: usize = 4096;

/// The owed-turn id of job `job_id`.
pub fn owed_id(job_id: &str) -> String {
    format!("{JOB_PREFIX}{job_id}")
}

/// Whether the owed turn `id` is a job's.
pub fn is_job(id: &str) -> bool {
    id.starts_with(JOB_PREFIX)
}

/// What the owed row of a job holds: enough to tell its chat what became
/// of it after the node that ran it is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    /// The job's id.
    pub id: String,
    /// `process`, `delegation` or `prompt`.
    pub kind: String,
    /// What it was doing, as its notices quote it.
    pub title: String,
    /// The message whose turn (or command) started it: where the report
    /// goes.
    pub event: MessageEvent,
}

/// What a chat is told about a job its gateway lost (a crash, or a stop
/// that interrupted it).
pub fn lost_notice(kind: &str, title: &str) -> String {
    let what = match JobKind::parse(kind) {
        Some(JobKind::Process) => "background command",
        Some(JobKind::Delegation) => "delegated task",
        Some(JobKind::Prompt) | None => "background task",
    };
    format!(
        "⚠️ The gateway restarted while your {what} “{}” was running, so its result is lost. Run it again if you still need it.",
        quote(title)
    )
}

/// `text` cut to a length a notice can quote.
pub fn quote(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    let mut out: String = line.chars().take(80).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

/// A job open on this node.
#[derive(Debug, Clone)]
pub struct OpenJob {
    /// The chat's session key.
    pub key: SessionKey,
    /// The message that started it: where its notices go.
    pub event: MessageEvent,
    /// The job as it opened.
    pub start: JobStart,
    /// When it opened.
    pub since: Instant,
}

/// The jobs open on this node, and the chat of each session's latest turn.
#[derive(Default)]
pub struct Jobs {
    open: Mutex<HashMap<String, OpenJob>>,
    turns: Mutex<RecentTurns>,
}

#[derive(Default)]
struct RecentTurns {
    by_session: HashMap<String, (SessionKey, MessageEvent)>,
    order: VecDeque<String>,
}

impl Jobs {
    /// Remembers that `session_id`'s turn is answering `event` in chat
    /// `key`, so a job its tools open knows where to report.
    pub fn remember(&self, session_id: &str, key: &SessionKey, event: &MessageEvent) {
        let mut turns = self.turns.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = turns
            .by_session
            .insert(session_id.to_owned(), (key.clone(), event.clone()))
            .is_none();
        if fresh {
            turns.order.push_back(session_id.to_owned());
        }
        while turns.order.len() > MAX_REMEMBERED {
            if let Some(old) = turns.order.pop_front() {
                turns.by_session.remove(&old);
            }
        }
    }

    /// The chat of `session_id`'s latest turn.
    pub fn chat_of(&self, session_id: &str) -> Option<(SessionKey, MessageEvent)> {
        self.turns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_session
            .get(session_id)
            .cloned()
    }

    /// The sessions of chat `key` whose turns are remembered.
    pub fn sessions_of(&self, key: &SessionKey) -> Vec<String> {
        self.turns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_session
            .iter()
            .filter(|(_, (k, _))| k == key)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Adds an open job; `false` when [`MAX_OPEN`] are open already.
    pub fn insert(&self, job: OpenJob) -> bool {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.len() >= MAX_OPEN && !open.contains_key(&job.start.id) {
            return false;
        }
        open.insert(job.start.id.clone(), job);
        true
    }

    /// The open job `id`.
    pub fn get(&self, id: &str) -> Option<OpenJob> {
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// Removes and returns the open job `id`.
    pub fn remove(&self, id: &str) -> Option<OpenJob> {
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id)
    }

    /// The jobs open for chat `key`, oldest first.
    pub fn of_chat(&self, key: &SessionKey) -> Vec<OpenJob> {
        let mut jobs: Vec<OpenJob> = self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|j| &j.key == key)
            .cloned()
            .collect();
        jobs.sort_by_key(|j| j.since);
        jobs
    }

    /// Removes and returns every open job.
    pub fn drain_all(&self) -> Vec<OpenJob> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.drain().map(|(_, j)| j).collect()
    }

    /// How many jobs are open on this node.
    pub fn len(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether no job is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One `/status` line for background work: its id, kind, age and what
/// it does.
pub fn status_line(id: &str, kind: &str, secs: u64, title: &str) -> String {
    let age = if secs >= 3600 {
        format!("{}h{:02}m", secs / 3600, secs % 3600 / 60)
    } else if secs >= 60 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{secs}s")
    };
    format!("  {id} ({kind}, {age}): {}", quote(title))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_are_told_apart_from_messages() {
        assert!(is_job(&owed_id("proc_1")));
        assert!(!is_job("telegram\u{1f}42"));
    }

    #[test]
    fn the_lost_notice_names_the_work_and_quotes_it_short() {
        let n = lost_notice("process", &format!("sleep 600 && {}", "x".repeat(200)));
        assert!(n.contains("background command"), "{n}");
        assert!(n.contains("sleep 600"), "{n}");
        assert!(n.contains('…'), "{n}");
        assert!(lost_notice("prompt", "research").contains("background task"));
        assert!(lost_notice("delegation", "a").contains("delegated task"));
    }
}
