//! The runs this process knows: each run's status, its numbered event log
//! and its pending approval, and the table that forgets finished runs.
//!
//! Everything here is bounded: a run keeps at most [`MAX_EVENTS`] events
//! (text deltas are merged into larger ones once the log fills up), the
//! table keeps finished runs for [`RETENTION`] and at most
//! [`MAX_FINISHED`] of them, and refuses a run beyond [`MAX_LIVE`] live
//! ones.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use serde_json::{Map, Value, json};
use talaria_agent::interaction::ApprovalDecision;
use talaria_core::Usage;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;

/// Events one run keeps. Past this the oldest are dropped (a client
/// replaying from before them is told how many it missed).
pub(crate) const MAX_EVENTS: usize = 1000;

/// Once the log holds this many events, text deltas are held back and
/// sent merged, at least [`MERGED_TEXT_BYTES`] at a time, so a long answer
/// cannot push out the tool and approval events.
const MERGE_TEXT_AFTER: usize = 800;

/// The size of a merged text delta.
const MERGED_TEXT_BYTES: usize = 4096;

/// How long a finished run can still be read and replayed.
pub(crate) const RETENTION: Duration = Duration::from_secs(3600);

/// Finished runs kept at most; the oldest are forgotten first.
pub(crate) const MAX_FINISHED: usize = 200;

/// Runs queued or running at once, whatever `max_concurrent_runs` says
/// (0 there means no cap, but the table is still bounded).
pub(crate) const MAX_LIVE: usize = 1000;

/// Characters of a tool's arguments or result shown in its events.
pub(crate) const PREVIEW_CHARS: usize = 500;

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Waiting for its session (another turn runs there).
    Queued,
    Running,
    /// A dangerous command waits for `POST /approval`.
    WaitingForApproval,
    Completed,
    Failed,
    /// Stopped by `POST /stop` (or the server shutting down).
    Stopped,
}

impl Status {
    /// The name clients see.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Running => "running",
            Status::WaitingForApproval => "waiting_for_approval",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Stopped => "stopped",
        }
    }

    /// Whether the run has ended (nothing follows its last event).
    pub(crate) fn is_terminal(self) -> bool {
        matches!(self, Status::Completed | Status::Failed | Status::Stopped)
    }
}

/// One event as sent: its sequence number and its JSON, serialized once.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) seq: u64,
    pub(crate) data: Arc<str>,
}

/// A dangerous command waiting for an answer.
pub(crate) struct Pending {
    pub(crate) id: String,
    pub(crate) command: String,
    pub(crate) reason: String,
    pub(crate) choices: Vec<&'static str>,
    pub(crate) answer: oneshot::Sender<ApprovalDecision>,
}

/// How a run ended, as [`Run::finish`] records it.
pub(crate) struct Ending {
    pub(crate) status: Status,
    pub(crate) output: Option<String>,
    pub(crate) usage: Option<Usage>,
    pub(crate) error: Option<String>,
}

/// One asynchronous turn.
pub(crate) struct Run {
    pub(crate) id: String,
    pub(crate) session_id: String,
    pub(crate) model: String,
    /// Unix seconds.
    pub(crate) created: u64,
    /// Cancelled by `POST /stop` (and by the server's shutdown, whose
    /// token is its parent).
    pub(crate) stop: CancellationToken,
    state: Mutex<RunState>,
    /// The last sequence number written, for streams waiting for more.
    latest: watch::Sender<u64>,
}

struct RunState {
    status: Status,
    events: VecDeque<Stored>,
    /// The number the next event gets; the first is 1.
    next_seq: u64,
    /// Text deltas held back while the log is nearly full.
    held_text: String,
    output: Option<String>,
    usage: Option<Usage>,
    error: Option<String>,
    pending: Option<Pending>,
}

/// What a stream reads after the event it saw last.
pub(crate) struct Read {
    pub(crate) events: Vec<Stored>,
    /// Events after the one asked for that were dropped before it came.
    pub(crate) missed: u64,
    /// The run has ended and `events` reaches its last event.
    pub(crate) ended: bool,
}

/// Why an approval answer was refused.
pub(crate) enum AnswerError {
    NothingPending,
    OtherApproval(String),
    NotOffered(&'static str),
}

impl From<AnswerError> for ApiError {
    fn from(e: AnswerError) -> ApiError {
        match e {
            AnswerError::NothingPending => ApiError::new(
                StatusCode::CONFLICT,
                "This run is not waiting for an approval",
                "invalid_request_error",
                Some("no_pending_approval"),
            ),
            AnswerError::OtherApproval(pending) => ApiError::new(
                StatusCode::CONFLICT,
                format!("That approval is no longer pending; the run waits for approval {pending}"),
                "invalid_request_error",
                Some("approval_mismatch"),
            ),
            AnswerError::NotOffered(decision) => ApiError::bad_request(
                format!("'{decision}' is not offered for this command (see the request's choices)"),
                "invalid_decision",
            ),
        }
    }
}

/// Seconds since the Unix epoch, with a fraction.
fn timestamp() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The run's `usage` object.
pub(crate) fn usage_json(usage: &Usage) -> Value {
    json!({
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
    })
}

/// The word a decision is sent and shown as.
pub(crate) fn decision_name(decision: ApprovalDecision) -> &'static str {
    match decision {
        ApprovalDecision::Once => "once",
        ApprovalDecision::Session => "session",
        ApprovalDecision::Always => "always",
        ApprovalDecision::Deny => "deny",
        ApprovalDecision::TimedOut => "timeout",
    }
}

impl Run {
    pub(crate) fn new(
        id: String,
        session_id: String,
        model: String,
        stop: CancellationToken,
    ) -> Run {
        Run {
            id,
            session_id,
            model,
            created: crate::chat::unix_now(),
            stop,
            state: Mutex::new(RunState {
                status: Status::Queued,
                events: VecDeque::new(),
                next_seq: 1,
                held_text: String::new(),
                output: None,
                usage: None,
                error: None,
                pending: None,
            }),
            latest: watch::Sender::new(0),
        }
    }

    fn state(&self) -> MutexGuard<'_, RunState> {
        // Every change below leaves the state whole before it can panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn status(&self) -> Status {
        self.state().status
    }

    /// Moves a live run to `status`; an ended run stays ended.
    pub(crate) fn set_status(&self, status: Status) {
        let mut state = self.state();
        if !state.status.is_terminal() {
            state.status = status;
        }
    }

    /// A stream that waits for events: it wakes when one is written.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.latest.subscribe()
    }

    /// Appends the event `name` with `fields`.
    pub(crate) fn push(&self, name: &str, fields: Value) {
        let mut state = self.state();
        if state.status.is_terminal() {
            return;
        }
        self.flush_text(&mut state);
        self.append(&mut state, name, fields);
    }

    /// Appends a piece of the answer as it streams.
    pub(crate) fn push_text(&self, delta: &str) {
        if delta.is_empty() {
            return;
        }
        let mut state = self.state();
        if state.status.is_terminal() {
            return;
        }
        if state.events.len() < MERGE_TEXT_AFTER && state.held_text.is_empty() {
            self.append(&mut state, "message.delta", json!({"delta": delta}));
            return;
        }
        state.held_text.push_str(delta);
        if state.held_text.len() >= MERGED_TEXT_BYTES {
            self.flush_text(&mut state);
        }
    }

    fn flush_text(&self, state: &mut RunState) {
        if !state.held_text.is_empty() {
            let delta = std::mem::take(&mut state.held_text);
            self.append(state, "message.delta", json!({"delta": delta}));
        }
    }

    fn append(&self, state: &mut RunState, name: &str, fields: Value) {
        let seq = state.next_seq;
        state.next_seq += 1;
        let mut object = Map::new();
        object.insert("event".to_owned(), Value::from(name));
        object.insert("run_id".to_owned(), Value::from(self.id.as_str()));
        object.insert("seq".to_owned(), Value::from(seq));
        object.insert("timestamp".to_owned(), Value::from(timestamp()));
        if let Value::Object(fields) = fields {
            object.extend(fields);
        }
        let data: Arc<str> = Value::Object(object).to_string().into();
        state.events.push_back(Stored { seq, data });
        while state.events.len() > MAX_EVENTS {
            state.events.pop_front();
        }
        self.latest.send_replace(seq);
    }

    /// The events after number `after`, at most `max` of them.
    pub(crate) fn read_after(&self, after: u64, max: usize) -> Read {
        let state = self.state();
        let first = state.events.front().map_or(state.next_seq, |e| e.seq);
        let missed = first.saturating_sub(after.saturating_add(1));
        let skip =
            usize::try_from(after.saturating_add(1).saturating_sub(first)).unwrap_or(usize::MAX);
        let events: Vec<Stored> = state.events.iter().skip(skip).take(max).cloned().collect();
        let last = events.last().map_or(after, |e| e.seq);
        Read {
            ended: state.status.is_terminal() && last.saturating_add(1) >= state.next_seq,
            events,
            missed,
        }
    }

    /// Records the end: the final event (`run.completed`, `run.failed` or
    /// `run.cancelled`), then the status, so a stream that sees the status
    /// has already been given the event.
    pub(crate) fn finish(&self, ending: Ending) {
        let mut state = self.state();
        if state.status.is_terminal() {
            return;
        }
        self.flush_text(&mut state);
        let (name, fields) = match ending.status {
            Status::Completed => (
                "run.completed",
                json!({
                    "output": ending.output,
                    "usage": ending.usage.as_ref().map(usage_json),
                }),
            ),
            Status::Stopped => (
                "run.cancelled",
                json!({"output": ending.output, "error": ending.error}),
            ),
            _ => ("run.failed", json!({"error": ending.error})),
        };
        self.append(&mut state, name, fields);
        state.pending = None;
        state.status = ending.status;
        state.output = ending.output;
        state.usage = ending.usage;
        state.error = ending.error;
        // Wakes the streams again now that the status says the end.
        let seq = state.next_seq - 1;
        self.latest.send_replace(seq);
    }

    /// Waits for an answer to `pending`: records it, tells the streams,
    /// and marks the run as waiting.
    pub(crate) fn ask(&self, pending: Pending) {
        let mut state = self.state();
        if state.status.is_terminal() {
            return;
        }
        self.flush_text(&mut state);
        let fields = json!({
            "approval_id": pending.id,
            "command": pending.command,
            "reason": pending.reason,
            "choices": pending.choices,
        });
        self.append(&mut state, "approval.request", fields);
        state.pending = Some(pending);
        state.status = Status::WaitingForApproval;
    }

    /// Answers the pending approval (the one named, if `id` is given).
    ///
    /// # Errors
    /// When nothing waits, another approval waits, or the decision was not
    /// offered.
    pub(crate) fn answer(
        &self,
        id: Option<&str>,
        decision: ApprovalDecision,
    ) -> Result<String, AnswerError> {
        let mut state = self.state();
        let Some(pending) = &state.pending else {
            return Err(AnswerError::NothingPending);
        };
        if let Some(id) = id
            && id != pending.id
        {
            return Err(AnswerError::OtherApproval(pending.id.clone()));
        }
        let name = decision_name(decision);
        if !pending.choices.contains(&name) {
            return Err(AnswerError::NotOffered(name));
        }
        let Some(pending) = state.pending.take() else {
            return Err(AnswerError::NothingPending);
        };
        self.answered(&mut state, &pending.id, name);
        // Sent after the event, so `approval.responded` always comes
        // before whatever the command does.
        let _ = pending.answer.send(decision);
        Ok(pending.id)
    }

    /// Drops approval `id` if it still waits (no answer in time: `why` is
    /// `timeout`; the turn stopped: `cancelled`).
    pub(crate) fn expire(&self, id: &str, why: &str) {
        let mut state = self.state();
        if state.pending.as_ref().is_some_and(|p| p.id == id) {
            state.pending = None;
            if !state.status.is_terminal() {
                self.answered(&mut state, id, why);
            }
        }
    }

    fn answered(&self, state: &mut RunState, id: &str, decision: &str) {
        self.append(
            state,
            "approval.responded",
            json!({"approval_id": id, "decision": decision}),
        );
        if state.status == Status::WaitingForApproval {
            state.status = Status::Running;
        }
    }

    /// The run as `GET /v1/runs/{id}` shows it.
    pub(crate) fn snapshot(&self) -> Value {
        let state = self.state();
        let pending = state.pending.as_ref().map(|p| {
            json!({
                "approval_id": p.id,
                "command": p.command,
                "reason": p.reason,
                "choices": p.choices,
            })
        });
        json!({
            "object": "run",
            "run_id": self.id,
            "id": self.id,
            "status": state.status.as_str(),
            "session_id": self.session_id,
            "model": self.model,
            "created_at": self.created,
            "output": state.output,
            "usage": state.usage.as_ref().map(usage_json),
            "error": state.error,
            "pending_approval": pending,
            "last_event_id": state.next_seq - 1,
        })
    }
}

/// Every run of this process, live or recently finished.
#[derive(Default)]
pub(crate) struct Registry {
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    runs: HashMap<String, Arc<Run>>,
    /// Finished runs, oldest first, with when they finished.
    finished: VecDeque<(Instant, String)>,
    live: usize,
}

impl Table {
    /// Forgets finished runs past their retention or beyond the count.
    /// Costs one step per run forgotten.
    fn prune(&mut self, now: Instant) {
        while let Some((at, id)) = self.finished.front() {
            let expired = now.saturating_duration_since(*at) >= RETENTION;
            if !expired && self.finished.len() <= MAX_FINISHED {
                break;
            }
            self.runs.remove(id);
            self.finished.pop_front();
        }
    }
}

impl Registry {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a new, live run.
    ///
    /// # Errors
    /// 429 when [`MAX_LIVE`] runs are live.
    pub(crate) fn insert(&self, run: Arc<Run>) -> Result<(), ApiError> {
        let mut table = self.table();
        table.prune(Instant::now());
        if table.live >= MAX_LIVE {
            return Err(ApiError::too_many_runs());
        }
        table.live += 1;
        table.runs.insert(run.id.clone(), run);
        Ok(())
    }

    /// The run with this id, if it is live or kept.
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Run>> {
        let mut table = self.table();
        table.prune(Instant::now());
        table.runs.get(id).cloned()
    }

    /// Starts the retention clock of a run that has ended.
    pub(crate) fn finished(&self, id: &str) {
        let mut table = self.table();
        table.live = table.live.saturating_sub(1);
        let now = Instant::now();
        table.finished.push_back((now, id.to_owned()));
        table.prune(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> Run {
        Run::new(
            "run_1".into(),
            "s".into(),
            "m".into(),
            CancellationToken::new(),
        )
    }

    fn seqs(read: &Read) -> Vec<u64> {
        read.events.iter().map(|e| e.seq).collect()
    }

    #[test]
    fn reads_resume_after_the_last_event_seen() {
        let run = run();
        for i in 0..5 {
            run.push_text(&format!("t{i}"));
        }
        assert_eq!(seqs(&run.read_after(0, 100)), [1, 2, 3, 4, 5]);
        assert_eq!(seqs(&run.read_after(3, 100)), [4, 5]);
        assert_eq!(seqs(&run.read_after(1, 2)), [2, 3]);
        let read = run.read_after(5, 100);
        assert!(read.events.is_empty() && !read.ended);
        run.finish(Ending {
            status: Status::Completed,
            output: Some("t0t1t2t3t4".into()),
            usage: None,
            error: None,
        });
        let read = run.read_after(5, 100);
        assert_eq!(seqs(&read), [6]);
        assert!(read.ended);
        assert!(read.events[0].data.contains("\"run.completed\""));
        // Nothing is written after the end.
        run.push_text("late");
        assert!(run.read_after(6, 100).ended);
        assert_eq!(run.status(), Status::Completed);
    }

    #[test]
    fn the_log_is_bounded_and_says_what_was_dropped() {
        let run = run();
        for _ in 0..MAX_EVENTS + 50 {
            run.push("tool.started", json!({"tool": "x"}));
        }
        let read = run.read_after(0, usize::MAX);
        assert_eq!(read.events.len(), MAX_EVENTS);
        assert_eq!(read.missed, 50);
        assert_eq!(read.events[0].seq, 51);
    }

    #[test]
    fn text_is_merged_once_the_log_fills_up() {
        let run = run();
        for _ in 0..MERGE_TEXT_AFTER {
            run.push("tool.started", json!({}));
        }
        for _ in 0..10_000 {
            run.push_text("ab");
        }
        run.push("tool.completed", json!({}));
        let read = run.read_after(MERGE_TEXT_AFTER as u64, usize::MAX);
        let text: String = read
            .events
            .iter()
            .filter_map(|e| {
                let v: Value = serde_json::from_str(&e.data).ok()?;
                v["delta"].as_str().map(str::to_owned)
            })
            .collect();
        assert_eq!(text.len(), 20_000, "no text is lost");
        assert!(read.events.len() < 10, "{}", read.events.len());
    }

    #[test]
    fn approvals_are_answered_once() {
        let run = run();
        assert!(matches!(
            run.answer(None, ApprovalDecision::Once),
            Err(AnswerError::NothingPending)
        ));
        let (tx, mut rx) = oneshot::channel();
        run.ask(Pending {
            id: "a1".into(),
            command: "rm -r x".into(),
            reason: "recursive delete".into(),
            choices: vec!["once", "session", "deny"],
            answer: tx,
        });
        assert_eq!(run.status(), Status::WaitingForApproval);
        assert!(matches!(
            run.answer(Some("a2"), ApprovalDecision::Once),
            Err(AnswerError::OtherApproval(_))
        ));
        assert!(matches!(
            run.answer(None, ApprovalDecision::Always),
            Err(AnswerError::NotOffered("always"))
        ));
        assert!(run.answer(Some("a1"), ApprovalDecision::Deny).is_ok());
        assert_eq!(rx.try_recv().ok(), Some(ApprovalDecision::Deny));
        assert_eq!(run.status(), Status::Running);
        assert!(matches!(
            run.answer(None, ApprovalDecision::Once),
            Err(AnswerError::NothingPending)
        ));
        // Expiring an answered approval changes nothing.
        run.expire("a1", "timeout");
        let names: Vec<String> = run
            .read_after(0, 100)
            .events
            .iter()
            .map(|e| {
                let v: Value = serde_json::from_str(&e.data).unwrap_or_default();
                v["event"].as_str().unwrap_or_default().to_owned()
            })
            .collect();
        assert_eq!(names, ["approval.request", "approval.responded"]);
    }

    #[test]
    fn finished_runs_are_forgotten_beyond_the_count() {
        let registry = Registry::default();
        for i in 0..MAX_FINISHED + 5 {
            let run = Arc::new(Run::new(
                format!("run_{i}"),
                "s".into(),
                "m".into(),
                CancellationToken::new(),
            ));
            assert!(registry.insert(run).is_ok());
            registry.finished(&format!("run_{i}"));
        }
        assert!(registry.get("run_0").is_none());
        assert!(registry.get("run_4").is_none());
        assert!(registry.get("run_5").is_some());
        assert_eq!(registry.table().runs.len(), MAX_FINISHED);
        assert_eq!(registry.table().live, 0);
    }
}
