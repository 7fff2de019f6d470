//! A run's events over SSE, from any point: each frame carries its
//! sequence number as the SSE `id`, so a client that reconnects with
//! `Last-Event-ID` (or `?after=N`) gets exactly the events after the last
//! one it saw. The stream ends after the run's final event. The stream
//! only reads the run: a client going away changes nothing for the run.

use std::convert::Infallible;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt, stream};

use super::registry::Run;
use crate::error::ApiError;
use crate::sse::KEEPALIVE;

/// Events sent per wake-up at most, so one slow client replaying a long
/// log does not hold the run's lock or build a large batch.
const BATCH: usize = 64;

/// Where a client resumes: `Last-Event-ID` when sent, else `?after=N`,
/// else from the start.
///
/// # Errors
/// 400 when either is not a number.
pub(crate) fn resume_point(headers: &HeaderMap, after: Option<&str>) -> Result<u64, ApiError> {
    let bad = |what: &str| {
        ApiError::bad_request(
            format!("{what} must be the number of an event"),
            "invalid_last_event_id",
        )
    };
    if let Some(value) = headers.get("last-event-id") {
        let text = value.to_str().map_err(|_| bad("Last-Event-ID"))?.trim();
        if text.is_empty() {
            return Ok(0);
        }
        return text.parse().map_err(|_| bad("Last-Event-ID"));
    }
    match after.map(str::trim) {
        None | Some("") => Ok(0),
        Some(n) => n.parse().map_err(|_| bad("'after'")),
    }
}

/// The SSE response for `run` from after event `after`.
pub(crate) fn respond(run: Arc<Run>, after: u64) -> Response {
    let sse = Sse::new(events(run, after)).keep_alive(KeepAlive::new().interval(KEEPALIVE));
    let mut response = sse.into_response();
    // Tells nginx-style proxies not to buffer the stream.
    response.headers_mut().insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    response
}

fn events(run: Arc<Run>, after: u64) -> impl Stream<Item = Result<Event, Infallible>> {
    let wake = run.subscribe();
    stream::unfold(
        (run, wake, after, false),
        |(run, mut wake, mut after, done)| async move {
            if done {
                return None;
            }
            loop {
                // Marked seen before reading, so an event written between
                // the read and the wait still wakes us.
                wake.borrow_and_update();
                let read = run.read_after(after, BATCH);
                let mut frames = Vec::with_capacity(read.events.len() + 1);
                if read.missed > 0 {
                    frames.push(Event::default().comment(format!(
                        "{} earlier events of this run were dropped (a run keeps at most {})",
                        read.missed,
                        super::registry::MAX_EVENTS
                    )));
                }
                for stored in &read.events {
                    frames.push(
                        Event::default()
                            .id(stored.seq.to_string())
                            .data(&*stored.data),
                    );
                }
                if let Some(last) = read.events.last() {
                    after = last.seq;
                }
                if !frames.is_empty() {
                    return Some((frames, (run, wake, after, read.ended)));
                }
                if read.ended || wake.changed().await.is_err() {
                    return None;
                }
            }
        },
    )
    .flat_map(|frames| stream::iter(frames.into_iter().map(Ok)))
}
