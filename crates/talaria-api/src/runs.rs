//! Asynchronous runs: `POST /v1/runs` starts a turn and answers at once;
//! the run goes on without any client, its events are kept (numbered) for
//! `GET /v1/runs/{id}/events` to stream and replay, dangerous commands
//! wait for `POST /v1/runs/{id}/approval`, and `POST /v1/runs/{id}/stop`
//! interrupts it. `POST /api/sessions/{id}/chat` and `/chat/stream` are
//! one run in a stored session, answered as one JSON object or as the
//! run's event stream.
//!
//! - `registry`: runs, their status and bounded event logs, retention.
//! - `driver`: starting a run and driving its turn to the end.
//! - `approval`: the run's [`talaria_agent::interaction::Interaction`].
//! - `stream`: the event stream, resumable by `Last-Event-ID`.

mod approval;
mod driver;
mod registry;
mod stream;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Map, Value, json};

use crate::chat::InlineFile;
use crate::error::ApiError;
use crate::{AppState, session};
use driver::NewRun;
pub(crate) use registry::Registry;
use registry::{Run, Status};

/// How long `POST /stop` waits for the turn to wind down before it
/// answers with the status it sees.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// The header naming the run behind a session chat.
const RUN_HEADER: &str = "x-talaria-run-id";

/// The routes of this module (the caller puts them behind the key).
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/runs", post(create))
        .route("/v1/runs/{id}", get(status))
        .route("/v1/runs/{id}/events", get(events))
        .route("/v1/runs/{id}/approval", post(approval))
        .route("/v1/runs/{id}/stop", post(stop))
        .route("/api/sessions/{id}/chat", post(session_chat))
        .route("/api/sessions/{id}/chat/stream", post(session_chat_stream))
}

/// The body as a JSON object.
fn json_object(body: Result<Bytes, BytesRejection>) -> Result<Map<String, Value>, ApiError> {
    crate::chat::body_object(&crate::chat::read_body(body)?)
}

/// An optional string field.
fn optional_text(object: &Map<String, Value>, key: &str) -> Result<Option<String>, ApiError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::bad_request(
            format!("'{key}' must be a string"),
            "invalid_request",
        )),
    }
}

/// The user's message: a string, or (as the ancestor also took) an array
/// of messages whose last user message is the input. That message's
/// content may be an array of parts, files among them (`image_url` with a
/// `data:` or `http(s)` URL, `input_audio`), as in a chat completion.
fn input_of(value: Option<&Value>, key: &str) -> Result<(String, Vec<InlineFile>), ApiError> {
    let missing = || {
        ApiError::bad_request(
            format!("'{key}' must be a non-empty string or an array of messages"),
            "missing_input",
        )
    };
    let (text, files) = match value {
        Some(Value::String(s)) => (s.clone(), Vec::new()),
        Some(Value::Array(messages)) => {
            let content = messages
                .iter()
                .rev()
                .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
                .and_then(|m| m.get("content"));
            crate::chat::content_of(content)
                .map_err(|e| ApiError::bad_request(e, "invalid_input"))?
        }
        _ => (String::new(), Vec::new()),
    };
    if text.trim().is_empty() && files.is_empty() {
        return Err(missing());
    }
    Ok((text, files))
}

/// [`input_of`], its files taken into the media cache (and described or
/// kept for a model that sees them) as a chat completion's are.
async fn take_input(
    state: &AppState,
    value: Option<&Value>,
    key: &str,
) -> Result<(String, Vec<talaria_core::MediaRef>), ApiError> {
    let (text, files) = input_of(value, key)?;
    crate::chat::take_files(state, &text, &files).await
}

/// The run `id`, or 404.
fn find(state: &AppState, id: &str) -> Result<Arc<Run>, ApiError> {
    state.run_registry.get(id).ok_or_else(|| {
        let shown: String = id.chars().take(100).collect();
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("No run with id {shown:?} (finished runs are kept for an hour)"),
            "invalid_request_error",
            Some("run_not_found"),
        )
    })
}

/// `POST /v1/runs`: 202 with the run's id, status and session.
async fn create(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = async {
        let object = json_object(body)?;
        // Taken by the ancestor, not (yet) here: refused rather than
        // ignored, so a client never continues the wrong conversation.
        for key in ["previous_response_id", "conversation_history"] {
            if object.get(key).is_some_and(|v| !v.is_null()) {
                return Err(ApiError::bad_request(
                    format!(
                        "'{key}' is not supported on runs; send 'session_id' to continue a session"
                    ),
                    "unsupported_parameter",
                ));
            }
        }
        let (input, media) = take_input(&state, object.get("input"), "input").await?;
        let session_id = optional_text(&object, "session_id")?
            .map(|id| session::validate_client_id(&id))
            .transpose()?;
        let model = optional_text(&object, "model")?;
        let instructions = optional_text(&object, "instructions")?;
        driver::start(
            &state,
            NewRun {
                input,
                media,
                session_id,
                model,
                instructions,
            },
        )
    };
    match started.await {
        // Usually still `queued`: its task has not taken the session yet.
        Ok(run) => (StatusCode::ACCEPTED, axum::Json(run.snapshot())).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/runs/{id}`.
async fn status(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match find(&state, &id) {
        Ok(run) => axum::Json(run.snapshot()).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `?after=N` on the event stream.
#[derive(serde::Deserialize)]
struct After {
    after: Option<String>,
}

/// `GET /v1/runs/{id}/events`.
async fn events(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(query): Query<After>,
    headers: HeaderMap,
) -> Response {
    let run = match find(&state, &id) {
        Ok(run) => run,
        Err(e) => return e.into_response(),
    };
    match stream::resume_point(&headers, query.after.as_deref()) {
        Ok(after) => stream::respond(run, after),
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/runs/{id}/approval` with `{"decision", "approval_id"?}`.
async fn approval(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let answered = (|| {
        let run = find(&state, &id)?;
        let object = json_object(body)?;
        let decision = approval::parse_decision(object.get("decision"))?;
        let approval_id = optional_text(&object, "approval_id")?;
        let answered = run.answer(approval_id.as_deref(), decision)?;
        Ok::<_, ApiError>(json!({
            "run_id": run.id,
            "approval_id": answered,
            "decision": registry::decision_name(decision),
            "status": run.status().as_str(),
        }))
    })();
    match answered {
        Ok(body) => axum::Json(body).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Waits (at most `limit`) until `run` has ended.
async fn ended(run: &Run, limit: Option<Duration>) {
    let mut wake = run.subscribe();
    let wait = async {
        loop {
            wake.borrow_and_update();
            if run.status().is_terminal() || wake.changed().await.is_err() {
                return;
            }
        }
    };
    match limit {
        Some(limit) => {
            let _ = tokio::time::timeout(limit, wait).await;
        }
        None => wait.await,
    }
}

/// `POST /v1/runs/{id}/stop`: interrupts the run and answers with its
/// status once it has wound down.
async fn stop(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    let run = match find(&state, &id) {
        Ok(run) => run,
        Err(e) => return e.into_response(),
    };
    let was = run.status();
    if was.is_terminal() {
        return ApiError::new(
            StatusCode::CONFLICT,
            format!("The run has already ended ({})", was.as_str()),
            "invalid_request_error",
            Some("run_ended"),
        )
        .into_response();
    }
    run.stop.cancel();
    ended(&run, Some(STOP_WAIT)).await;
    axum::Json(run.snapshot()).into_response()
}

/// A session chat's run: the session must exist; the body is
/// `{"message"}` (or `"input"`), with an optional `model`.
async fn start_session_chat(
    state: &Arc<AppState>,
    id: &str,
    body: Result<Bytes, BytesRejection>,
) -> Result<Arc<Run>, ApiError> {
    let id = session::validate_client_id(id)?;
    let object = json_object(body)?;
    let key = if object.contains_key("message") {
        "message"
    } else {
        "input"
    };
    let (input, media) = take_input(state, object.get(key), key).await?;
    let model = optional_text(&object, "model")?;
    let instructions = optional_text(&object, "instructions")?;
    match state.agent.parts().store.session(&id).await {
        Ok(Some(_)) => {}
        Ok(None) => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("No session with id {id:?}"),
                "invalid_request_error",
                Some("session_not_found"),
            ));
        }
        Err(e) => {
            tracing::warn!(session = %id, error = %e, "cannot read the session for a chat");
            return Err(ApiError::internal(format!("Cannot read the session: {e}")));
        }
    }
    driver::start(
        state,
        NewRun {
            input,
            media,
            session_id: Some(id),
            model,
            instructions,
        },
    )
}

/// The session and run headers of a session chat's answer.
fn chat_headers(run: &Run) -> HeaderMap {
    let mut headers = crate::chat::session_headers(&run.session_id);
    if let Ok(v) = HeaderValue::from_str(&run.id) {
        headers.insert(HeaderName::from_static(RUN_HEADER), v);
    }
    headers
}

/// `POST /api/sessions/{id}/chat`: one turn, answered when it has ended.
/// The run goes on if the client leaves; its id is in the answer's
/// `X-Talaria-Run-Id` header and in every event of its stream.
async fn session_chat(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let run = match start_session_chat(&state, &id, body).await {
        Ok(run) => run,
        Err(e) => return e.into_response(),
    };
    ended(&run, None).await;
    let headers = chat_headers(&run);
    if run.status() == Status::Failed {
        let snapshot = run.snapshot();
        let why = snapshot["error"].as_str().unwrap_or("The turn failed");
        return (headers, ApiError::incomplete(why)).into_response();
    }
    (headers, axum::Json(run.snapshot())).into_response()
}

/// `POST /api/sessions/{id}/chat/stream`: one turn, answered with its
/// run's event stream from the first event.
async fn session_chat_stream(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match start_session_chat(&state, &id, body).await {
        Ok(run) => (chat_headers(&run), stream::respond(run, 0)).into_response(),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_input_is_text_or_the_last_user_message() {
        let text = |v: &Value| input_of(Some(v), "input").ok().map(|(t, _)| t);
        assert_eq!(text(&json!("hi")), Some("hi".into()));
        let messages = json!([
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "a"},
            {"role": "user", "content": [{"type": "text", "text": "second"}]},
        ]);
        assert_eq!(text(&messages), Some("second".into()));
        // A file alone is an input; its text may be empty.
        let photo = json!([{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
        ]}]);
        let (said, files) = input_of(Some(&photo), "input").unwrap();
        assert_eq!((said.as_str(), files.len()), ("", 1));
        for bad in [json!(""), json!("  "), json!(5), json!([])] {
            let e = input_of(Some(&bad), "input").err().and_then(|e| e.code);
            assert_eq!(e, Some("missing_input"), "{bad}");
        }
        assert!(input_of(None, "input").is_err());
    }
}
