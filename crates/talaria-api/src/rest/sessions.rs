//! `/api/sessions`: the stored sessions, searched, paged, created, renamed,
//! deleted and forked, and their transcripts page by page.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use talaria_store::{
    NewSession, SearchHit, SearchQuery, SessionFilter, SessionRecord, StoredMessage,
};

use super::{
    Params, bad_request, count_param, json_body, not_found, path_id, query, shown, store_error, usd,
};
use crate::AppState;
use crate::error::ApiError;

/// Sessions a list answers with unless `limit` says otherwise.
const DEFAULT_LIMIT: usize = 50;
/// Most sessions one page holds.
const MAX_LIMIT: usize = 200;
/// Deepest a plain listing pages (the store skips rows it reads).
const MAX_OFFSET: usize = 100_000;
/// Deepest a search pages: each page ranks `offset + limit` sessions.
const MAX_SEARCH_DEPTH: usize = 1_000;
/// Messages a transcript page holds unless `limit` says otherwise.
const DEFAULT_MESSAGES: usize = 100;
/// Most messages one transcript page holds.
const MAX_MESSAGES: usize = 500;
/// Messages a fork copies per read, so a long transcript is never held
/// whole.
const FORK_BATCH: usize = 200;
/// Longest title accepted, in chars.
const MAX_TITLE_CHARS: usize = 200;
/// Where sessions made through this API come from: the chat routes' mark.
use crate::session::SOURCE;

type PathId = Result<Path<String>, PathRejection>;
type QueryParams = Result<Query<Params>, QueryRejection>;

/// A session as clients see it: no system prompt (only whether there is
/// one), the transcript's active length, tokens and cost.
fn session_json(s: &SessionRecord, active_messages: u64, cost_micros: u64) -> Value {
    json!({
        "id": s.id,
        "object": "talaria.session",
        "source": s.source,
        "title": s.title,
        "model": s.model_choice.as_ref().or(s.model.as_ref()),
        "started_at": s.started_at,
        "ended_at": s.ended_at,
        "end_reason": s.end_reason,
        "message_count": active_messages,
        "parent_session_id": s.parent_session_id,
        "input_tokens": s.input_tokens,
        "output_tokens": s.output_tokens,
        "cache_read_tokens": s.cache_read_tokens,
        "cache_write_tokens": s.cache_write_tokens,
        "reasoning_tokens": s.reasoning_tokens,
        "cost_usd": usd(cost_micros),
        "has_system_prompt": s.system_prompt.is_some(),
    })
}

/// [`session_json`] for a page of sessions: counts in one read, costs
/// one each (a page is bounded).
async fn sessions_json(
    state: &AppState,
    sessions: &[SessionRecord],
) -> Result<Vec<Value>, ApiError> {
    let store = &state.agent.parts().store;
    let ids: Vec<String> = sessions.iter().map(|s| s.id.clone()).collect();
    let counts = store
        .active_message_counts(&ids)
        .await
        .map_err(store_error)?;
    let mut out = Vec::with_capacity(sessions.len());
    for (s, count) in sessions.iter().zip(counts) {
        let cost = store
            .session_cost_micros(&s.id)
            .await
            .map_err(store_error)?;
        out.push(session_json(s, count, cost));
    }
    Ok(out)
}

/// `{"object": "talaria.session", "session": …}`, as the ancestor wraps one.
async fn one_session(state: &AppState, s: &SessionRecord) -> Result<Value, ApiError> {
    let mut page = sessions_json(state, std::slice::from_ref(s)).await?;
    Ok(json!({"object": "talaria.session", "session": page.pop()}))
}

/// The session, or 404.
async fn load(state: &AppState, id: &str) -> Result<SessionRecord, ApiError> {
    state
        .agent
        .parts()
        .store
        .session(id)
        .await
        .map_err(store_error)?
        .ok_or_else(|| {
            not_found(
                format!("No session with id {:?}", shown(id)),
                "session_not_found",
            )
        })
}

/// `GET /api/sessions`: newest first; `q` searches the transcripts (best
/// match first, each with its snippet); `source`, `limit`, `offset`.
pub(super) async fn list(State(state): State<Arc<AppState>>, params: QueryParams) -> Response {
    list_inner(&state, params)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn list_inner(state: &AppState, params: QueryParams) -> Result<Response, ApiError> {
    let params = query(params)?;
    let limit = count_param(&params, "limit", DEFAULT_LIMIT, MAX_LIMIT)?;
    let offset = count_param(&params, "offset", 0, MAX_OFFSET)?;
    let source = params
        .get("source")
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty());
    let q = params.get("q").map(|q| q.trim()).filter(|q| !q.is_empty());
    let store = &state.agent.parts().store;
    let (page, matches, has_more) = match q {
        Some(text) => {
            if offset + limit > MAX_SEARCH_DEPTH {
                return Err(bad_request(
                    format!(
                        "A search pages at most {MAX_SEARCH_DEPTH} sessions deep; narrow the query"
                    ),
                    "invalid_query",
                ));
            }
            // One more than the page, to tell whether another follows.
            let hits = store
                .search(SearchQuery {
                    text: text.to_owned(),
                    sources: source.into_iter().collect(),
                    exclude_session: None,
                    limit: offset + limit + 1,
                })
                .await
                .map_err(store_error)?;
            let has_more = hits.len() > offset + limit;
            let hits: Vec<SearchHit> = hits.into_iter().skip(offset).take(limit).collect();
            let matches: Vec<Value> = hits
                .iter()
                .map(|h| json!({"message_id": h.message_id, "role": h.role, "snippet": h.snippet}))
                .collect();
            let page: Vec<SessionRecord> = hits.into_iter().map(|h| h.session).collect();
            (page, Some(matches), has_more)
        }
        None => {
            let mut page = store
                .list_sessions(SessionFilter {
                    source,
                    session_key: None,
                    limit: limit + 1,
                    offset,
                })
                .await
                .map_err(store_error)?;
            let has_more = page.len() > limit;
            page.truncate(limit);
            (page, None, has_more)
        }
    };
    let mut data = sessions_json(state, &page).await?;
    if let Some(matches) = matches {
        for (item, m) in data.iter_mut().zip(matches) {
            item["match"] = m;
        }
    }
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "limit": limit,
        "offset": offset,
        "has_more": has_more,
    }))
    .into_response())
}

/// What `POST /api/sessions` and `PATCH` take.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionBody {
    title: Option<String>,
}

/// A title as stored: trimmed, one line, not too long; `None` for blank.
fn clean_title(title: &str) -> Result<Option<String>, ApiError> {
    let title = title.trim();
    if title.chars().any(char::is_control) {
        return Err(bad_request(
            "A title is one line without control characters",
            "invalid_title",
        ));
    }
    if title.chars().count() > MAX_TITLE_CHARS {
        return Err(bad_request(
            format!("A title is at most {MAX_TITLE_CHARS} characters"),
            "invalid_title",
        ));
    }
    Ok((!title.is_empty()).then(|| title.to_owned()))
}

/// `POST /api/sessions`: a new empty session (source `api_server`), with
/// an optional title; 201.
pub(super) async fn create(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    create_inner(&state, &body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn create_inner(state: &AppState, body: &Bytes) -> Result<Response, ApiError> {
    let body: SessionBody = json_body(body)?;
    let title = body
        .title
        .as_deref()
        .map(clean_title)
        .transpose()?
        .flatten();
    let parts = state.agent.parts();
    let id = talaria_core::ids::new_session_id();
    parts
        .store
        .create_session(NewSession {
            id: id.clone(),
            source: SOURCE.to_owned(),
            model: Some(parts.provider.model().to_owned()),
            ..NewSession::default()
        })
        .await
        .map_err(store_error)?;
    if let Some(title) = title {
        parts
            .store
            .set_title(&id, &title)
            .await
            .map_err(store_error)?;
    }
    let session = load(state, &id).await?;
    Ok((
        StatusCode::CREATED,
        Json(one_session(state, &session).await?),
    )
        .into_response())
}

/// `GET /api/sessions/{id}`.
pub(super) async fn show(State(state): State<Arc<AppState>>, id: PathId) -> Response {
    async {
        let id = path_id(id)?;
        let session = load(&state, &id).await?;
        Ok::<_, ApiError>(Json(one_session(&state, &session).await?).into_response())
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// `PATCH /api/sessions/{id}`: renames it (`title`; blank clears nothing,
/// it is refused, since a session's title is never unset).
pub(super) async fn rename(
    State(state): State<Arc<AppState>>,
    id: PathId,
    body: Bytes,
) -> Response {
    async {
        let id = path_id(id)?;
        let body: SessionBody = json_body(&body)?;
        load(&state, &id).await?;
        let Some(raw) = body.title else {
            return Err(bad_request(
                "Give a `title` to rename the session",
                "invalid_title",
            ));
        };
        let Some(title) = clean_title(&raw)? else {
            return Err(bad_request("A title cannot be blank", "invalid_title"));
        };
        let store = &state.agent.parts().store;
        store.set_title(&id, &title).await.map_err(store_error)?;
        let session = load(&state, &id).await?;
        Ok(Json(one_session(&state, &session).await?).into_response())
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// `DELETE /api/sessions/{id}`: the session, its transcript (and search
/// entries) and the routes pointing at it. A turn running on it in this
/// process holds its lock: the delete waits for that turn, so the turn
/// does not write into a session that is gone.
pub(super) async fn remove(State(state): State<Arc<AppState>>, id: PathId) -> Response {
    async {
        let id = path_id(id)?;
        let lock = state.locks.get(&id);
        let _turn = lock.lock().await;
        let deleted = state
            .agent
            .parts()
            .store
            .delete_session(&id)
            .await
            .map_err(store_error)?;
        if !deleted {
            return Err(not_found(
                format!("No session with id {:?}", shown(&id)),
                "session_not_found",
            ));
        }
        Ok(
            Json(json!({"object": "talaria.session.deleted", "id": id, "deleted": true}))
                .into_response(),
        )
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// One transcript row, shaped as OpenAI's chat messages are (tool calls
/// under `tool_calls` with `function`, results as `tool` rows naming their
/// `tool_call_id`), so a client can fold each result under its call.
fn message_json(m: &StoredMessage) -> Value {
    let msg = &m.message;
    let calls: Vec<Value> = msg
        .tool_calls
        .iter()
        .map(|c| {
            json!({
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            })
        })
        .collect();
    json!({
        "id": m.id,
        "session_id": m.session_id,
        "role": msg.role,
        "content": msg.content,
        "tool_calls": if calls.is_empty() { Value::Null } else { Value::Array(calls) },
        "tool_call_id": msg.tool_call_id,
        "tool_name": msg.tool_name,
        "finish_reason": msg.finish_reason,
        "reasoning": msg.reasoning,
        "timestamp": m.timestamp,
        "token_count": m.token_count,
    })
}

/// `GET /api/sessions/{id}/messages`: the active transcript in order, a
/// page at a time: `limit`, and `after` (the last id of the previous
/// page; the answer's `next_after`).
pub(super) async fn messages(
    State(state): State<Arc<AppState>>,
    id: PathId,
    params: QueryParams,
) -> Response {
    async {
        let id = path_id(id)?;
        let params = query(params)?;
        let limit = count_param(&params, "limit", DEFAULT_MESSAGES, MAX_MESSAGES)?;
        let after = match params.get("after") {
            None => 0,
            Some(raw) => raw.trim().parse::<i64>().map_err(|_| {
                bad_request(
                    "`after` must be a message id (a whole number)",
                    "invalid_query",
                )
            })?,
        };
        let mut rows = state
            .agent
            .parts()
            .store
            .messages_page(&id, after, limit + 1)
            .await
            .map_err(store_error)?;
        let has_more = rows.len() > limit;
        rows.truncate(limit);
        let next_after = rows.last().map(|m| m.id);
        Ok::<_, ApiError>(
            Json(json!({
                "object": "list",
                "session_id": id,
                "data": rows.iter().map(message_json).collect::<Vec<_>>(),
                "has_more": has_more,
                "next_after": if has_more { next_after } else { None },
            }))
            .into_response(),
        )
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// `POST /api/sessions/{id}/fork`: a new session holding a copy of the
/// active transcript (its system prompt and model choice too), its parent
/// recorded; an optional `title`. 201.
pub(super) async fn fork(State(state): State<Arc<AppState>>, id: PathId, body: Bytes) -> Response {
    async {
        let id = path_id(id)?;
        let body: SessionBody = json_body(&body)?;
        let title = body
            .title
            .as_deref()
            .map(clean_title)
            .transpose()?
            .flatten();
        let source = load(&state, &id).await?;
        let store = &state.agent.parts().store;
        // The source's lock: the copy is the transcript between turns,
        // never half of one.
        let lock = state.locks.get(&id);
        let _turn = lock.lock().await;
        let fork_id = talaria_core::ids::new_session_id();
        store
            .create_session(NewSession {
                id: fork_id.clone(),
                source: SOURCE.to_owned(),
                model: source.model.clone(),
                system_prompt: source.system_prompt.clone(),
                parent_session_id: Some(source.id.clone()),
                ..NewSession::default()
            })
            .await
            .map_err(store_error)?;
        if source.model_choice.is_some() {
            store
                .set_model_choice(&fork_id, source.model_choice.as_deref())
                .await
                .map_err(store_error)?;
        }
        let title = title.or_else(|| source.title.as_ref().map(|t| fork_title(t)));
        if let Some(title) = title {
            store
                .set_title(&fork_id, &title)
                .await
                .map_err(store_error)?;
        }
        let mut after = 0;
        let mut copied = 0u64;
        loop {
            let batch = store
                .messages_page(&id, after, FORK_BATCH)
                .await
                .map_err(store_error)?;
            let Some(last) = batch.last() else { break };
            after = last.id;
            for row in &batch {
                store
                    .append_message(&fork_id, &row.message)
                    .await
                    .map_err(store_error)?;
                copied += 1;
            }
            if batch.len() < FORK_BATCH {
                break;
            }
        }
        let session = load(&state, &fork_id).await?;
        let mut answer = one_session(&state, &session).await?;
        answer["forked_from"] = json!(id);
        answer["copied_messages"] = json!(copied);
        Ok::<_, ApiError>((StatusCode::CREATED, Json(answer)).into_response())
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// The title of a fork of a session titled `title`, kept within the
/// length a title may have.
fn fork_title(title: &str) -> String {
    let base: String = title.chars().take(MAX_TITLE_CHARS - 7).collect();
    format!("{base} (fork)")
}
