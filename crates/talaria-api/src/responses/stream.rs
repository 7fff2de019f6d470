//! The streamed response: OpenAI's Responses events over SSE, each with
//! its `type` as the event name and a `sequence_number` counting up from 0.
//!
//! In order: `response.created`, `response.in_progress`, the answer's
//! `message` item opened (`response.output_item.added`,
//! `response.content_part.added`), one `response.output_text.delta` per
//! text delta, then, once the turn has ended, the text, part and item
//! closed (`.done`), each tool call and output the turn made as an item
//! added and done, and `response.completed` with the whole response. A
//! failed turn ends with `response.failed` instead. Tool progress goes out
//! as SSE comments while it happens, which clients skip.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::response::Response;
use axum::response::sse::Event;
use futures::{Stream, StreamExt, stream};
use serde_json::{Value, json};
use talaria_agent::{TurnExit, TurnOutcome};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::object::{Echo, output_text};
use crate::chat::turn::{Admitted, RunningTurn};
use crate::sse::{ChannelObserver, Progress, stream_response, tool_event};

/// Starts the turn and answers with its event stream.
pub(crate) fn respond(admitted: Admitted, echo: Echo) -> Response {
    let (observer, rx) = ChannelObserver::channel();
    let turn = admitted.spawn_turn(observer);
    stream_response(events(turn, rx, echo))
}

/// Numbers the events of one stream.
#[derive(Default)]
struct Sequence(AtomicU64);

impl Sequence {
    /// The event `kind` carrying `fields`, with its type and the next
    /// sequence number added.
    fn event(&self, kind: &str, mut fields: Value) -> Event {
        if let Some(object) = fields.as_object_mut() {
            object.insert("type".to_owned(), json!(kind));
            object.insert(
                "sequence_number".to_owned(),
                json!(self.0.fetch_add(1, Ordering::Relaxed)),
            );
        }
        Event::default().event(kind).data(fields.to_string())
    }
}

/// The opening events, the deltas as they come, then (once the turn task
/// has ended and dropped the observer, which closes the channel) the
/// closing events. The turn's drop guard lives in the stream: when the
/// server drops the body because the client went away, the turn is
/// cancelled.
fn events(
    turn: RunningTurn,
    rx: mpsc::UnboundedReceiver<Progress>,
    echo: Echo,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let RunningTurn { guard, task, .. } = turn;
    let sequence = Arc::new(Sequence::default());
    let message_id = echo.message_id();
    let opening = vec![
        sequence.event("response.created", json!({"response": echo.in_progress()})),
        sequence.event(
            "response.in_progress",
            json!({"response": echo.in_progress()}),
        ),
        sequence.event(
            "response.output_item.added",
            json!({"output_index": 0, "item": echo.message_item("in_progress", None)}),
        ),
        sequence.event(
            "response.content_part.added",
            json!({
                "item_id": message_id,
                "output_index": 0,
                "content_index": 0,
                "part": output_text(""),
            }),
        ),
    ];
    let progress = UnboundedReceiverStream::new(rx).map({
        let sequence = sequence.clone();
        move |progress| match progress {
            Progress::Text(delta) => sequence.event(
                "response.output_text.delta",
                json!({
                    "item_id": message_id,
                    "output_index": 0,
                    "content_index": 0,
                    "delta": delta,
                    "logprobs": [],
                }),
            ),
            Progress::Tool(tool) => tool_event(tool.data(), false),
        }
    });
    let end = stream::once(async move {
        let result = match task.await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "API streamed response failed");
                Err(format!("The turn failed: {e}"))
            }
            // The task panicked: close the stream properly so the client
            // does not wait for more.
            Err(_) => Err("The turn stopped unexpectedly".to_owned()),
        };
        drop(guard);
        stream::iter(closing(&echo, &sequence, result))
    })
    .flatten();
    stream::iter(opening).chain(progress).chain(end).map(Ok)
}

/// How the stream ends: the answer's text, part and item closed, the tool
/// items, and the finished response; or `response.failed`.
fn closing(echo: &Echo, sequence: &Sequence, result: Result<TurnOutcome, String>) -> Vec<Event> {
    let outcome = match result {
        Ok(outcome) => match &outcome.exit {
            TurnExit::Failed(why) => {
                let failed = echo.failed(&format!("The agent did not complete: {why}"));
                return vec![sequence.event("response.failed", json!({"response": failed}))];
            }
            _ => outcome,
        },
        Err(why) => {
            let failed = echo.failed(&why);
            return vec![sequence.event("response.failed", json!({"response": failed}))];
        }
    };
    let message_id = echo.message_id();
    let answer = outcome.answer.as_str();
    let mut events = vec![
        sequence.event(
            "response.output_text.done",
            json!({
                "item_id": message_id,
                "output_index": 0,
                "content_index": 0,
                "text": answer,
                "logprobs": [],
            }),
        ),
        sequence.event(
            "response.content_part.done",
            json!({
                "item_id": message_id,
                "output_index": 0,
                "content_index": 0,
                "part": output_text(answer),
            }),
        ),
    ];
    let finished = echo.finished(&outcome);
    let output = finished["output"].as_array().cloned().unwrap_or_default();
    for (index, item) in output.into_iter().enumerate() {
        // The message item was opened at the start; the tool items are
        // known only now.
        if index > 0 {
            events.push(sequence.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            ));
        }
        events.push(sequence.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
    }
    let kind = match finished["status"].as_str() {
        Some("incomplete") => "response.incomplete",
        _ => "response.completed",
    };
    events.push(sequence.event(kind, json!({"response": finished})));
    events
}
