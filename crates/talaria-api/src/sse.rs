//! The streamed answer: `chat.completion.chunk` events over SSE.
//!
//! Frames, in order: a role chunk; one content chunk per text delta, with
//! tool progress in between while tools run; a final chunk with an empty
//! delta, the finish reason and the usage; then `data: [DONE]`. A
//! `: keepalive` comment goes out after [`KEEPALIVE`] of silence so proxies
//! do not close a quiet stream.
//!
//! Tool progress is a comment (`: talaria.tool.progress {...}`) unless the
//! client sent `X-Talaria-Tool-Progress: true`, which makes it a named
//! `event: talaria.tool.progress` frame (the hermes-agent way). Named
//! events are opt-in because OpenAI's SDKs turn every event into a chunk,
//! and a chunk without `choices` breaks the usual
//! `chunk.choices[0].delta.content` loop.
//!
//! A turn that fails ends as OpenAI ends a failed stream: one
//! `data: {"error": {...}}` frame, then the connection closes, with no
//! final chunk and no `[DONE]` (OpenAI has no "error" finish reason; its
//! SDKs raise the error frame as an `APIError`).

use std::convert::Infallible;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt, stream};
use serde_json::{Value, json};
use talaria_agent::{TurnExit, TurnObserver, TurnOutcome};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::chat::turn::{Admitted, Labels, RunningTurn, finish_reason, usage_json};
use super::error::ApiError;

/// Silence after which a keepalive comment is sent.
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(15);

/// The SSE event name of tool progress frames.
pub(crate) const TOOL_PROGRESS_EVENT: &str = "talaria.tool.progress";

/// What the turn task tells the response body.
#[derive(Debug)]
pub(crate) enum Progress {
    Text(String),
    Tool(ToolProgress),
}

/// A tool starting or ending.
#[derive(Debug)]
pub(crate) enum ToolProgress {
    Started(String),
    Finished { name: String, ok: bool },
}

impl ToolProgress {
    /// What its frame says.
    pub(crate) fn data(&self) -> Value {
        match self {
            ToolProgress::Started(name) => json!({"tool": name, "status": "running"}),
            ToolProgress::Finished { name, ok } => {
                json!({"tool": name, "status": "completed", "ok": ok})
            }
        }
    }
}

/// Forwards the turn's progress to the response body. The channel is
/// unbounded because observer methods must not wait; it lives only as long
/// as the turn, and a dropped receiver (client gone) makes sends no-ops.
pub(crate) struct ChannelObserver {
    tx: mpsc::UnboundedSender<Progress>,
}

impl ChannelObserver {
    /// An observer and the receiving end of what it forwards.
    pub(crate) fn channel() -> (ChannelObserver, mpsc::UnboundedReceiver<Progress>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (ChannelObserver { tx }, rx)
    }
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
            let _ = self
                .tx
                .send(Progress::Tool(ToolProgress::Started(name.to_owned())));
        }
    }

    fn tool_finished(&self, name: &str, ok: bool, _preview: &str) {
        if visible(name) {
            let _ = self.tx.send(Progress::Tool(ToolProgress::Finished {
                name: name.to_owned(),
                ok,
            }));
        }
    }
}

/// Starts the turn and answers with its event stream.
pub(crate) fn respond(admitted: Admitted) -> Response {
    let (observer, rx) = ChannelObserver::channel();
    let named_progress = admitted.tool_progress;
    let turn = admitted.spawn_turn(observer);
    stream_response(events(turn, rx, named_progress))
}

/// An SSE answer of `events`, with keepalive comments while it is quiet.
pub(crate) fn stream_response(
    events: impl Stream<Item = Result<Event, Infallible>> + Send + 'static,
) -> Response {
    let sse = Sse::new(events).keep_alive(KeepAlive::new().interval(KEEPALIVE).text("keepalive"));
    let mut response = sse.into_response();
    // Tells nginx-style proxies not to buffer the stream.
    response.headers_mut().insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    response
}

/// The role chunk, the progress as it comes, then (once the turn task has
/// ended and dropped the observer, which closes the channel) the final
/// chunk and `[DONE]`. The turn's drop guard lives in the stream: when the
/// server drops the body because the client went away, the turn is
/// cancelled.
fn events(
    turn: RunningTurn,
    rx: mpsc::UnboundedReceiver<Progress>,
    named_progress: bool,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let RunningTurn {
        labels,
        guard,
        task,
    } = turn;
    let role = chunk(&labels, json!({"role": "assistant"}));
    let progress = UnboundedReceiverStream::new(rx).map({
        let labels = labels.clone();
        move |p| progress_event(&labels, p, named_progress)
    });
    let end = stream::once(async move {
        let result = match task.await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "API streamed turn failed");
                Err(e.to_string())
            }
            // The task panicked: close the stream properly so the client
            // does not wait for more.
            Err(_) => Err("the turn stopped unexpectedly".to_owned()),
        };
        drop(guard);
        stream::iter(last_frames(&labels, result))
    })
    .flatten();
    stream::once(async move { role })
        .chain(progress)
        .chain(end)
        .map(Ok)
}

fn progress_event(labels: &Labels, progress: Progress, named: bool) -> Event {
    match progress {
        Progress::Text(delta) => chunk(labels, json!({"content": delta})),
        Progress::Tool(tool) => tool_event(tool.data(), named),
    }
}

/// A chunk carrying `delta`, not the last one.
fn chunk(labels: &Labels, delta: Value) -> Event {
    Event::default().data(labels.chunk(delta, None).to_string())
}

/// A named event for clients that asked for one; otherwise a comment,
/// which SSE clients skip (and which still tells a proxy the stream is
/// alive while a long tool runs). JSON from `to_string` has no newline, so
/// it fits on one comment line.
pub(crate) fn tool_event(data: Value, named: bool) -> Event {
    if named {
        Event::default()
            .event(TOOL_PROGRESS_EVENT)
            .data(data.to_string())
    } else {
        Event::default().comment(format!("{TOOL_PROGRESS_EVENT} {data}"))
    }
}

/// How the stream ends: the final chunk (finish reason and usage) and
/// `[DONE]` when the turn produced its answer (or was interrupted); a lone
/// error frame when it failed.
fn last_frames(labels: &Labels, result: Result<TurnOutcome, String>) -> Vec<Event> {
    let error = match &result {
        Ok(outcome) => match finish_reason(&outcome.exit) {
            Some(reason) => {
                let mut event = labels.chunk(json!({}), Some(reason));
                if let Some(object) = event.as_object_mut() {
                    object.insert("usage".to_owned(), usage_json(&outcome.usage));
                }
                return vec![
                    Event::default().data(event.to_string()),
                    Event::default().data("[DONE]"),
                ];
            }
            None => {
                let why = match &outcome.exit {
                    TurnExit::Failed(why) => why.as_str(),
                    _ => "unknown",
                };
                ApiError::incomplete(format!("The agent did not complete: {why}"))
            }
        },
        Err(why) => ApiError::internal(format!("The turn failed: {why}")),
    };
    vec![Event::default().data(error.body().to_string())]
}
