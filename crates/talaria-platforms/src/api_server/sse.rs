//! The streamed answer: `chat.completion.chunk` events over SSE.
//!
//! Frames, in order: a role chunk; one content chunk per text delta, with
//! `event: talaria.tool.progress` frames in between while tools run; a
//! final chunk with an empty delta, the finish reason and the usage; then
//! `data: [DONE]`. A `: keepalive` comment goes out after
//! [`KEEPALIVE`] of silence so proxies do not close a quiet stream.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde_json::{Value, json};
use talaria_agent::{AgentError, TurnExit, TurnObserver, TurnOutcome};
use tokio::sync::mpsc;
use tokio_util::sync::DropGuard;

use super::chat::{Admitted, Labels, finish_reason, usage_json};
use super::error::ApiError;

/// Silence after which a keepalive comment is sent.
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(15);

/// The SSE event name of tool progress frames.
pub(crate) const TOOL_PROGRESS_EVENT: &str = "talaria.tool.progress";

/// What the turn task tells the response body.
#[derive(Debug)]
enum Progress {
    Text(String),
    ToolStarted(String),
    ToolFinished {
        name: String,
        ok: bool,
    },
    /// The turn ended; always the last message.
    Finished(Result<TurnOutcome, String>),
}

/// Forwards the turn's progress to the response body. The channel is
/// unbounded because observer methods must not wait; it lives only as long
/// as the turn, and a dropped receiver (client gone) makes sends no-ops.
struct ChannelObserver {
    tx: mpsc::UnboundedSender<Progress>,
}

/// Internal tools (leading `_`) are not shown to clients.
fn visible(tool: &str) -> bool {
    !tool.starts_with('_')
}

impl TurnObserver for ChannelObserver {
    fn text(&self, delta: &str) {
        if !delta.is_empty() {
            let _ = self.tx.send(Progress::Text(delta.to_owned()));
        }
    }

    fn tool_started(&self, name: &str, _args: &str) {
        if visible(name) {
            let _ = self.tx.send(Progress::ToolStarted(name.to_owned()));
        }
    }

    fn tool_finished(&self, name: &str, ok: bool, _preview: &str) {
        if visible(name) {
            let _ = self.tx.send(Progress::ToolFinished {
                name: name.to_owned(),
                ok,
            });
        }
    }
}

/// Starts the turn and answers with its event stream.
pub(crate) fn respond(admitted: Admitted) -> Response {
    let Admitted {
        state,
        session,
        input,
        labels,
        permit,
        session_lock,
        ..
    } = admitted;
    let cancel = state.turns.child_token();
    let guard = cancel.clone().drop_guard();
    let (tx, rx) = mpsc::unbounded_channel();
    let agent = state.agent.clone();
    tokio::spawn(async move {
        let _permit = permit;
        let _session_lock = session_lock;
        let observer = ChannelObserver { tx: tx.clone() };
        let result = agent
            .run_turn(&session, &input, &observer, cancel)
            .await
            .map_err(|e: AgentError| {
                tracing::warn!(error = %e, "API streamed turn failed");
                e.to_string()
            });
        let _ = tx.send(Progress::Finished(result));
    });
    let sse = Sse::new(events(labels, rx, guard))
        .keep_alive(KeepAlive::new().interval(KEEPALIVE).text("keepalive"));
    let mut response = sse.into_response();
    // Tells nginx-style proxies not to buffer the stream.
    response.headers_mut().insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    response
}

/// The body's state. Owns the guard: when the server drops the body (the
/// client went away), the guard cancels the turn.
struct Body {
    labels: Labels,
    rx: mpsc::UnboundedReceiver<Progress>,
    queued: VecDeque<Event>,
    finished: bool,
    _guard: DropGuard,
}

fn events(
    labels: Labels,
    rx: mpsc::UnboundedReceiver<Progress>,
    guard: DropGuard,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let role = chunk(&labels, json!({"role": "assistant"}));
    let body = Body {
        labels,
        rx,
        queued: VecDeque::from([role]),
        finished: false,
        _guard: guard,
    };
    futures::stream::unfold(body, |mut body| async move {
        loop {
            if let Some(event) = body.queued.pop_front() {
                return Some((Ok(event), body));
            }
            if body.finished {
                return None;
            }
            match body.rx.recv().await {
                Some(Progress::Text(delta)) => {
                    let event = chunk(&body.labels, json!({"content": delta}));
                    body.queued.push_back(event);
                }
                Some(Progress::ToolStarted(name)) => {
                    body.queued
                        .push_back(tool_event(json!({"tool": name, "status": "running"})));
                }
                Some(Progress::ToolFinished { name, ok }) => {
                    body.queued.push_back(tool_event(
                        json!({"tool": name, "status": "completed", "ok": ok}),
                    ));
                }
                Some(Progress::Finished(result)) => {
                    body.queued.push_back(final_chunk(&body.labels, result));
                    body.queued.push_back(Event::default().data("[DONE]"));
                    body.finished = true;
                }
                // The task ended without reporting (it panicked): close the
                // stream properly so the client does not wait for more.
                None => {
                    let lost = Err("the turn stopped unexpectedly".to_owned());
                    body.queued.push_back(final_chunk(&body.labels, lost));
                    body.queued.push_back(Event::default().data("[DONE]"));
                    body.finished = true;
                }
            }
        }
    })
}

/// A chunk carrying `delta`, not the last one.
fn chunk(labels: &Labels, delta: Value) -> Event {
    let body = json!({
        "id": labels.id,
        "object": "chat.completion.chunk",
        "created": labels.created,
        "model": labels.model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": null}],
    });
    Event::default().data(body.to_string())
}

fn tool_event(data: Value) -> Event {
    Event::default()
        .event(TOOL_PROGRESS_EVENT)
        .data(data.to_string())
}

/// The last chunk: finish reason and usage, plus an error object when the
/// turn did not produce an answer.
fn final_chunk(labels: &Labels, result: Result<TurnOutcome, String>) -> Event {
    let (reason, usage, error) = match &result {
        Ok(outcome) => {
            let error = match &outcome.exit {
                TurnExit::Failed(why) => Some(ApiError::incomplete(format!(
                    "The agent did not complete: {why}"
                ))),
                _ => None,
            };
            (
                finish_reason(&outcome.exit),
                usage_json(&outcome.usage),
                error,
            )
        }
        Err(why) => (
            "error",
            usage_json(&talaria_core::Usage::default()),
            Some(ApiError::internal(format!("The turn failed: {why}"))),
        ),
    };
    let mut event = json!({
        "id": labels.id,
        "object": "chat.completion.chunk",
        "created": labels.created,
        "model": labels.model,
        "choices": [{"index": 0, "delta": {}, "finish_reason": reason}],
        "usage": usage,
    });
    if let (Some(error), Some(object)) = (error, event.as_object_mut())
        && let Some(inner) = error.body().get("error").cloned()
    {
        object.insert("error".to_owned(), inner);
    }
    Event::default().data(event.to_string())
}
