//! A request that passed admission and the turn it runs: the task that owns
//! the run slot, the session's lock and lease until the turn has really
//! ended, what a header-less conversation records after its answer, and
//! the labels and usage both answers (one object, or the SSE stream in
//! `sse`) are written with.

use std::sync::Arc;

use serde_json::{Value, json};
use talaria_agent::{AgentError, TurnExit, TurnObserver, TurnOutcome};
use talaria_core::{Role, Usage};
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinHandle;
use tokio_util::sync::DropGuard;

use crate::AppState;
use crate::session::{self, Continuation, TranscriptDigest};

/// What the answer and its chunks are labelled with.
#[derive(Debug, Clone)]
pub(crate) struct Labels {
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: String,
}

/// OpenAI's `finish_reason` for how the turn ended; `None` for a failed
/// turn, which OpenAI ends with an error instead (OpenAI has no "error"
/// finish reason, and clients do not expect one).
pub(crate) fn finish_reason(exit: &TurnExit) -> Option<&'static str> {
    match exit {
        TurnExit::Completed | TurnExit::Interrupted => Some("stop"),
        TurnExit::BudgetExhausted => Some("length"),
        TurnExit::Failed(_) => None,
    }
}

/// OpenAI's `usage` object from the turn's summed usage.
pub(crate) fn usage_json(usage: &Usage) -> Value {
    json!({
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
    })
}

/// A request that passed every check, with its session opened and locked:
/// everything the turn task owns.
pub(crate) struct Admitted {
    pub(crate) state: Arc<AppState>,
    pub(crate) session: talaria_agent::SessionHandle,
    /// The new user text.
    pub(crate) input: String,
    /// The images of the new user message, for a model that sees them.
    pub(crate) media: Vec<talaria_core::MediaRef>,
    pub(crate) stream: bool,
    /// Tool progress as `event:` frames (asked for by header); otherwise
    /// as SSE comments, which every client skips.
    pub(crate) tool_progress: bool,
    pub(crate) labels: Labels,
    /// What to record with the answer once the turn has one (where a
    /// header-less conversation stands, a stored response).
    pub(crate) after: Option<AfterTurn>,
    /// Held by the turn task: the run counts against the cap until the turn
    /// has really ended, not merely until the response is sent.
    pub(crate) permit: Option<OwnedSemaphorePermit>,
    /// Held by the turn task until the turn has ended.
    pub(crate) session_lock: tokio::sync::OwnedMutexGuard<()>,
    /// The session's turn lease, with a shared store.
    pub(crate) turn_lease: Option<talaria_gateway::turn_lease::HeldTurn>,
    /// The model of a `model.routes` name the client asked for; `None`
    /// is the session's own.
    pub(crate) provider: Option<std::sync::Arc<dyn talaria_agent::models::Provider>>,
    /// Who the turn's tools ask for approvals; `None` is the agent's own
    /// (which has no human to ask on a server).
    pub(crate) interaction: Option<Arc<dyn talaria_agent::interaction::Interaction>>,
    /// Extra system instructions for this turn (a run's `instructions`).
    pub(crate) instructions: Option<String>,
}

/// A turn running in its own task, which owns the run permit and the
/// session lock until the turn has really ended.
pub(crate) struct RunningTurn {
    pub(crate) labels: Labels,
    /// Cancels the turn when dropped: whoever waits for the answer holds it,
    /// so a client that goes away interrupts the turn.
    pub(crate) guard: DropGuard,
    pub(crate) task: JoinHandle<Result<TurnOutcome, AgentError>>,
}

impl Admitted {
    /// Starts the turn, reporting progress to `observer`.
    pub(crate) fn spawn_turn(self, observer: impl TurnObserver + 'static) -> RunningTurn {
        let Admitted {
            state,
            session,
            input,
            media,
            labels,
            permit,
            session_lock,
            turn_lease,
            after,
            provider,
            interaction,
            instructions,
            ..
        } = self;
        let cancel = state.turns.child_token();
        let guard = cancel.clone().drop_guard();
        let agent = state.agent.clone();
        let task = tokio::spawn(async move {
            let _permit = permit;
            let _session_lock = session_lock;
            // A lost lease (another node may run the session now) stops
            // the turn.
            if let Some(lease) = &turn_lease {
                let (lost, cancel) = (lease.interrupted.clone(), cancel.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        _ = lost.cancelled() => cancel.cancel(),
                        _ = cancel.cancelled() => {}
                    }
                });
            }
            let execution = state.execution(&session.id).await;
            let options = talaria_agent::TurnOptions {
                media,
                execution: Some(execution),
                platform: Some(crate::session::SOURCE.to_owned()),
                provider,
                interaction,
                instructions,
                ..talaria_agent::TurnOptions::default()
            };
            let outcome = agent
                .run_turn_with(&session, &input, &observer, cancel, options)
                .await;
            // Recorded while the session is still ours (lock and lease), so
            // the row count is the one this answer left.
            if let Ok(outcome) = &outcome {
                match after {
                    Some(AfterTurn::Transcript(remember)) => {
                        remember_answer(&state, &session.id, remember, outcome).await;
                    }
                    Some(AfterTurn::Response(pending)) => {
                        crate::responses::record(&state, &session.id, pending, outcome).await;
                    }
                    None => {}
                }
            }
            drop(turn_lease);
            outcome
        });
        RunningTurn {
            labels,
            guard,
            task,
        }
    }
}

/// What the turn task records once the turn has an answer, while the
/// session is still its own.
pub(crate) enum AfterTurn {
    /// Where a header-less chat conversation now stands.
    Transcript(Remember),
    /// A response of the Responses API, to keep for retrieval and
    /// continuation.
    Response(crate::responses::Pending),
}

/// A header-less conversation as the turn found it: the digest of the
/// conversation up to and including the new user message, and how many
/// rows its session held before the turn.
pub(crate) struct Remember {
    pub(crate) digest: TranscriptDigest,
    pub(crate) rows_before: u64,
}

/// Records where a header-less conversation stands after an answer the
/// client can resend: its history plus this answer now continues this
/// session. A failed or interrupted turn records nothing; the client's
/// retry then starts a session of its own, seeded with what it sends.
async fn remember_answer(
    state: &AppState,
    session_id: &str,
    remember: Remember,
    outcome: &TurnOutcome,
) {
    if !matches!(
        outcome.exit,
        TurnExit::Completed | TurnExit::BudgetExhausted
    ) {
        return;
    }
    let Some(rows) = rows_after(state, session_id, remember.rows_before, outcome).await else {
        return;
    };
    let Remember { mut digest, .. } = remember;
    digest.push(Role::Assistant, &outcome.answer);
    let at = Continuation {
        session_id: session_id.to_owned(),
        rows,
    };
    state
        .index
        .record(&digest.key(), &at, digest.replaces())
        .await;
}

/// How many rows the session holds after the turn, `rows_before` being
/// what it held before; `None` when that cannot be read. The session is
/// still the turn's (lock and lease), so its rows are the ones it held plus
/// the turn's, unless a compression rewrote the transcript: only then is
/// the count read back.
pub(crate) async fn rows_after(
    state: &AppState,
    session_id: &str,
    rows_before: u64,
    outcome: &TurnOutcome,
) -> Option<u64> {
    if outcome.compressed {
        session::stored_rows(&state.agent, session_id).await
    } else {
        Some(rows_before + outcome.new_messages.len() as u64)
    }
}

impl Labels {
    /// A `chat.completion.chunk` object carrying `delta`.
    pub(crate) fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        })
    }
}
