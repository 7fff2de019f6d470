//! OpenAI's Responses API: `POST /v1/responses` runs one agent turn and
//! answers with a `response` object (or its event stream);
//! `GET`/`DELETE /v1/responses/{id}` read and forget a stored one.
//!
//! A request without `previous_response_id` is a new conversation, in a
//! session of its own seeded with the messages its `input` lists before
//! the new one. With it, the turn continues that response's conversation:
//! in the response's own session when no turn has run there since, or else
//! (a branch: another request continued the same response first) in a new
//! session seeded with the conversation as it stood at that response. So
//! two requests continuing one response each see that conversation and
//! never each other's.
//!
//! Admission, the run cap, session locks and leases, files and the turn
//! task are the chat completions' (`chat`, `chat::turn`); this module adds
//! the request's parsing (`request`), the object (`object`), the stream
//! (`stream`) and where responses are kept (`stored`).

mod object;
mod request;
mod stored;
mod stream;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use rand::Rng;
use serde_json::json;
use talaria_agent::{NullObserver, TurnExit, TurnOutcome};
use talaria_core::Message;

use crate::AppState;
use crate::chat::turn::{Admitted, AfterTurn, Labels, RunningTurn, rows_after};
use crate::chat::{
    cannot_open, read_body, route, session_headers, take_files, take_lease, take_run_slot, unix_now,
};
use crate::error::ApiError;
use crate::session;
use object::Echo;
pub(crate) use stored::ResponseStore;
use stored::StoredResponse;

/// The routes, for the key-protected part of the router.
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/responses", post(create))
        .route("/v1/responses/{id}", get(retrieve).delete(delete))
}

/// `resp_<32 hex>`.
fn response_id() -> String {
    let n: u128 = rand::rng().random();
    format!("resp_{n:032x}")
}

/// 404 for a response this server does not hold (never stored, stored
/// with `store: false`, deleted, or not an id of ours).
fn response_not_found(id: &str) -> ApiError {
    // The id comes from the client: quoted with escapes and cut short.
    let shown: String = id.chars().take(100).collect();
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("Response with id {shown:?} not found."),
        kind: "invalid_request_error",
        code: Some("response_not_found"),
        retry_after: None,
    }
}

/// `POST /v1/responses`.
async fn create(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let (admitted, echo) = match admit(state, body).await {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    let headers = session_headers(&admitted.session.id);
    if admitted.stream {
        (headers, stream::respond(admitted, echo)).into_response()
    } else {
        (headers, complete(admitted, echo).await).into_response()
    }
}

/// `GET /v1/responses/{id}`: the response as it was answered.
async fn retrieve(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match state.responses.get(&id).await {
        Ok(Some(record)) => axum::Json(record.response).into_response(),
        Ok(None) => response_not_found(&id).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `DELETE /v1/responses/{id}`: OpenAI's deletion object. The session's
/// transcript stays (it is the agent's, like every session's); only the
/// response, and with it the way to continue from it, goes.
async fn delete(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match state.responses.delete(&id).await {
        Ok(true) => axum::Json(json!({
            "id": id,
            "object": "response.deleted",
            "deleted": true,
        }))
        .into_response(),
        Ok(false) => response_not_found(&id).into_response(),
        Err(e) => e.into_response(),
    }
}

/// What the turn task keeps once the turn has answered, when the request
/// asked for the response to be stored.
pub(crate) struct Pending {
    echo: Echo,
    /// Rows the session held before the turn, replaced ones included.
    rows_before: u64,
    /// Active rows the session held before the turn.
    active_before: u64,
}

/// Stores the response of a turn that answered, with where its
/// conversation now stands. Called by the turn task while the session is
/// still its own, so the counts are the ones this answer left.
pub(crate) async fn record(
    state: &AppState,
    session_id: &str,
    pending: Pending,
    outcome: &TurnOutcome,
) {
    if !matches!(
        outcome.exit,
        TurnExit::Completed | TurnExit::BudgetExhausted
    ) {
        return;
    }
    let Some(rows) = rows_after(state, session_id, pending.rows_before, outcome).await else {
        return;
    };
    let active = if outcome.compressed {
        let store = &state.agent.parts().store;
        match store.active_message_counts(&[session_id.to_owned()]).await {
            Ok(counts) => match counts.first() {
                Some(n) => *n,
                None => return,
            },
            Err(e) => {
                tracing::warn!(session = %session_id, error = %e, "cannot count a response's rows");
                return;
            }
        }
    } else {
        pending.active_before + outcome.new_messages.len() as u64
    };
    let record = StoredResponse {
        session_id: session_id.to_owned(),
        rows,
        active,
        response: pending.echo.finished(outcome),
    };
    state.responses.put(&pending.echo.id, &record).await;
}

/// A session opened for a response's turn, with what keeps it ours and
/// its row counts before the turn.
struct Opened {
    session: talaria_agent::SessionHandle,
    lock: tokio::sync::OwnedMutexGuard<()>,
    lease: Option<talaria_gateway::turn_lease::HeldTurn>,
    rows: u64,
    active: u64,
}

/// Checks the request, finds the response it continues, takes a run slot
/// and opens its session under that session's lock.
async fn admit(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(Admitted, Echo), ApiError> {
    let body = read_body(body)?;
    let request = request::parse_request(&body)?;
    // Looked up before a run slot is taken: an unknown id costs no slot.
    let previous = match &request.previous_response_id {
        Some(id) => Some(
            state
                .responses
                .get(id)
                .await?
                .ok_or_else(|| response_not_found(id))?,
        ),
        None => None,
    };
    let permit = take_run_slot(&state)?;
    let conversation = &request.conversation;
    let (input, media) = take_files(&state, &conversation.last_user, &conversation.files).await?;
    tracing::debug!(
        stream = request.stream,
        store = request.store,
        continues = request.previous_response_id.as_deref().unwrap_or("(new)"),
        chars = conversation.last_user.len(),
        "API response"
    );
    let opened = match &previous {
        Some(previous) => continue_from(&state, previous, &conversation.earlier).await?,
        None => start(&state, conversation.earlier.clone()).await?,
    };
    let (provider, model) = route(&state, request.model);
    let echo = Echo {
        id: response_id(),
        created_at: unix_now(),
        model: model.clone(),
        instructions: request.instructions,
        previous_response_id: request.previous_response_id,
        store: request.store,
        metadata: request.metadata,
    };
    let after = request.store.then(|| {
        AfterTurn::Response(Pending {
            echo: echo.clone(),
            rows_before: opened.rows,
            active_before: opened.active,
        })
    });
    let admitted = Admitted {
        provider,
        // As OpenAI does: the request's instructions steer this turn only
        // (a continuation does not inherit the previous response's).
        instructions: echo.instructions.clone(),
        interaction: None,
        labels: Labels {
            id: echo.id.clone(),
            created: echo.created_at,
            model,
        },
        state,
        session: opened.session,
        input,
        media,
        stream: request.stream,
        tool_progress: false,
        after,
        permit,
        session_lock: opened.lock,
        turn_lease: opened.lease,
    };
    Ok((admitted, echo))
}

/// A new session holding `seed` (messages the client or a branch brings).
async fn start(state: &AppState, seed: Vec<Message>) -> Result<Opened, ApiError> {
    let id = session::new_conversation_id();
    // Nobody else knows this id yet: the lock and the lease are free.
    let lock = state.locks.get(&id).lock_owned().await;
    let lease = take_lease(state, &id).await?;
    let session = session::start_conversation(&state.agent, &id, &seed)
        .await
        .map_err(|e| cannot_open(&id, &e))?;
    let rows = seed.len() as u64;
    Ok(Opened {
        session,
        lock,
        lease,
        rows,
        active: rows,
    })
}

/// The session continuing `previous`'s conversation, with `earlier` (the
/// messages the request's `input` lists before the new one) appended.
///
/// Waits for the session's lock, then continues it in place when it
/// holds exactly the rows it held after `previous`; otherwise a turn ran
/// on it since, and the conversation as it stood at `previous` (the first
/// rows of its transcript) seeds a new session.
async fn continue_from(
    state: &AppState,
    previous: &StoredResponse,
    earlier: &[Message],
) -> Result<Opened, ApiError> {
    let id = &previous.session_id;
    let lock = state.locks.get(id).lock_owned().await;
    let lease = take_lease(state, id).await?;
    let store = &state.agent.parts().store;
    let unreadable = |e: talaria_store::StoreError| {
        tracing::warn!(session = %id, error = %e, "cannot read a response's session");
        ApiError::internal(format!("Cannot read the conversation: {e}"))
    };
    let gone = || ApiError {
        status: StatusCode::NOT_FOUND,
        message: "The conversation of the previous response is no longer stored".to_owned(),
        kind: "invalid_request_error",
        code: Some("response_not_found"),
        retry_after: None,
    };
    let record = store
        .session(id)
        .await
        .map_err(unreadable)?
        .ok_or_else(gone)?;
    let extra = earlier.len() as u64;
    if record.message_count == previous.rows {
        let session = state
            .agent
            .resume_record(record)
            .await
            .map_err(|e| cannot_open(id, &e))?;
        for message in earlier {
            store
                .append_message(id, message)
                .await
                .map_err(unreadable)?;
        }
        return Ok(Opened {
            session,
            lock,
            lease,
            rows: previous.rows + extra,
            active: previous.active + extra,
        });
    }
    let transcript = store.messages(id).await.map_err(unreadable)?;
    drop((lock, lease));
    // With no compression since, the active rows grew exactly as all rows
    // did, and the first `active` of them are the conversation at
    // `previous`. A compression replaced those rows with a summary that
    // may hold what came after.
    let grown_active = (transcript.len() as u64).checked_sub(previous.active);
    let grown_rows = record.message_count.checked_sub(previous.rows);
    if grown_active.is_none() || grown_active != grown_rows {
        return Err(ApiError {
            status: StatusCode::CONFLICT,
            message: "The conversation continued from the previous response has since been \
                      compressed, so it can no longer be branched at that response; continue \
                      from its latest response instead"
                .to_owned(),
            kind: "invalid_request_error",
            code: Some("conversation_compressed"),
            retry_after: None,
        });
    }
    let seed: Vec<Message> = transcript
        .into_iter()
        .take(previous.active as usize)
        .map(|row| row.message)
        .chain(earlier.iter().cloned())
        .collect();
    start(state, seed).await
}

/// Runs the turn and answers with the finished `response`, or with an
/// error when the turn failed (OpenAI answers a failed request with an
/// error, never with an answer cut short).
async fn complete(admitted: Admitted, echo: Echo) -> Response {
    let RunningTurn { guard, task, .. } = admitted.spawn_turn(NullObserver);
    let result = task.await;
    guard.disarm();
    match result {
        Ok(Ok(outcome)) => match &outcome.exit {
            TurnExit::Failed(why) => {
                ApiError::incomplete(format!("The agent did not complete: {why}")).into_response()
            }
            _ => axum::Json(echo.finished(&outcome)).into_response(),
        },
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "API response turn failed");
            ApiError::internal(format!("The turn failed: {e}")).into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "API response turn task died");
            ApiError::internal("The turn stopped unexpectedly").into_response()
        }
    }
}
