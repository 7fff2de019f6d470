//! Starting a run and driving it to its end in a task of its own, through
//! the same turn machinery as `/v1/chat/completions` (run cap, session
//! lock and lease, execution and trust), with the run's own observer and
//! approvals. No client holds the turn: it ends when it ends, or when
//! `POST /stop` cancels it.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use serde_json::json;
use talaria_agent::{TurnExit, TurnObserver};

use super::approval::RunInteraction;
use super::registry::{Ending, PREVIEW_CHARS, Run, Status};
use crate::AppState;
use crate::chat::turn::{Admitted, Labels, RunningTurn};
use crate::chat::{open_named, take_run_slot};
use crate::error::ApiError;
use crate::session;

/// What a run is asked to do.
pub(crate) struct NewRun {
    /// The user's message.
    pub(crate) input: String,
    /// Its files, already in the media cache.
    pub(crate) media: Vec<talaria_core::MediaRef>,
    /// The session to continue; `None` starts a new one.
    pub(crate) session_id: Option<String>,
    /// A `model.routes` name; any other name is only echoed back.
    pub(crate) model: Option<String>,
    /// Extra system instructions for this turn.
    pub(crate) instructions: Option<String>,
}

/// `run_` + 32 random hex digits.
fn run_id() -> String {
    let n: u128 = rand::rng().random();
    format!("run_{n:032x}")
}

/// Registers the run and starts it; returns at once.
///
/// # Errors
/// 429 when the run cap (or the table of live runs) is full.
pub(crate) fn start(state: &Arc<AppState>, new: NewRun) -> Result<Arc<Run>, ApiError> {
    let permit = take_run_slot(state)?;
    let session_id = new.session_id.unwrap_or_else(session::new_conversation_id);
    let provider = new
        .model
        .as_deref()
        .and_then(|name| state.agent.route_provider(name));
    let model = new
        .model
        .unwrap_or_else(|| state.agent.parts().provider.model().to_owned());
    let run = Arc::new(Run::new(
        run_id(),
        session_id,
        model,
        state.turns.child_token(),
    ));
    state.run_registry.insert(run.clone())?;
    tracing::debug!(run = %run.id, session = %run.session_id, "API run started");
    let (state, driven) = (state.clone(), run.clone());
    tokio::spawn(async move {
        let turn = Turn {
            input: new.input,
            media: new.media,
            instructions: new.instructions,
            permit,
            provider,
        };
        drive(&state, &driven, turn).await;
        state.run_registry.finished(&driven.id);
    });
    Ok(run)
}

/// Opens the session (queued while another turn holds it), runs the turn
/// and records how it ended.
/// What the run's turn takes.
struct Turn {
    input: String,
    media: Vec<talaria_core::MediaRef>,
    instructions: Option<String>,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    provider: Option<Arc<dyn talaria_agent::models::Provider>>,
}

async fn drive(state: &Arc<AppState>, run: &Arc<Run>, turn: Turn) {
    let Turn {
        input,
        media,
        instructions,
        permit,
        provider,
    } = turn;
    let opened = tokio::select! {
        opened = open_named(state, run.session_id.clone(), &[]) => opened,
        () = run.stop.cancelled() => {
            run.finish(stopped(None));
            return;
        }
    };
    let opened = match opened {
        Ok(opened) => opened,
        Err(e) => {
            run.finish(failed(e.message));
            return;
        }
    };
    run.set_status(Status::Running);
    let wait = Duration::from_secs(state.agent.parts().config.approvals.timeout_secs.max(1));
    let admitted = Admitted {
        state: state.clone(),
        session: opened.session,
        input,
        media,
        stream: false,
        tool_progress: false,
        labels: Labels {
            id: run.id.clone(),
            created: run.created,
            model: run.model.clone(),
        },
        after: None,
        permit,
        session_lock: opened.lock,
        turn_lease: opened.lease,
        provider,
        interaction: Some(Arc::new(RunInteraction {
            run: run.clone(),
            wait,
        })),
        instructions,
    };
    let RunningTurn { guard, task, .. } = admitted.spawn_turn(RunObserver {
        run: run.clone(),
        redactor: state.agent.parts().redactor.clone(),
    });
    let mut task = task;
    let mut guard = Some(guard);
    let result = tokio::select! {
        result = &mut task => result,
        () = run.stop.cancelled() => {
            // Dropping the guard cancels the turn; it then ends on its own
            // terms (the text so far, the rows stored).
            drop(guard.take());
            task.await
        }
    };
    if let Some(guard) = guard {
        guard.disarm();
    }
    let ending = match result {
        Ok(Ok(outcome)) => match outcome.exit {
            TurnExit::Completed | TurnExit::BudgetExhausted => Ending {
                status: Status::Completed,
                output: Some(outcome.answer),
                usage: Some(outcome.usage),
                error: None,
            },
            TurnExit::Interrupted => stopped(Some(outcome.answer)),
            TurnExit::Failed(why) => failed(format!("The agent did not complete: {why}")),
        },
        Ok(Err(e)) => {
            tracing::warn!(run = %run.id, error = %e, "API run failed");
            failed(format!("The turn failed: {e}"))
        }
        Err(e) => {
            tracing::error!(run = %run.id, error = %e, "API run task died");
            failed("The turn stopped unexpectedly".to_owned())
        }
    };
    run.finish(ending);
}

fn stopped(output: Option<String>) -> Ending {
    Ending {
        status: Status::Stopped,
        output,
        usage: None,
        error: Some("The run was stopped".to_owned()),
    }
}

fn failed(error: String) -> Ending {
    Ending {
        status: Status::Failed,
        output: None,
        usage: None,
        error: Some(error),
    }
}

/// Puts the turn's progress on the run's event log.
struct RunObserver {
    run: Arc<Run>,
    /// Tool arguments and results may quote a secret the agent knows.
    redactor: talaria_core::Redactor,
}

impl RunObserver {
    fn preview(&self, text: &str) -> String {
        // Redacted whole, then cut: a cut could split a secret the
        // redactor would then miss.
        self.redactor
            .redact(text)
            .chars()
            .take(PREVIEW_CHARS)
            .collect()
    }
}

/// Internal tools (leading `_`) are not shown to clients.
fn visible(tool: &str) -> bool {
    !tool.starts_with('_')
}

impl TurnObserver for RunObserver {
    fn text(&self, delta: &str) {
        self.run.push_text(delta);
    }

    fn text_restarted(&self) {
        self.run.push("message.restarted", json!({}));
    }

    fn tool_started(&self, name: &str, args: &str) {
        if visible(name) {
            self.run.push(
                "tool.started",
                json!({"tool": name, "arguments": self.preview(args)}),
            );
        }
    }

    fn tool_finished(&self, name: &str, ok: bool, preview: &str) {
        if visible(name) {
            self.run.push(
                "tool.completed",
                json!({"tool": name, "ok": ok, "preview": self.preview(preview)}),
            );
        }
    }
}
