//! `POST /v1/chat/completions`: one agent turn per request.
//!
//! This file parses and admits the request and writes the non-streamed
//! answer; `turn` runs the admitted request's turn, for this answer and
//! for the stream in `sse`.

pub(super) mod turn;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use rand::Rng;
use serde_json::{Value, json};
use talaria_agent::{AgentError, NullObserver, TurnExit, TurnOutcome};
use talaria_core::{Message, Role};

use super::error::ApiError;
use super::session::{self, HERMES_SESSION_HEADER, SESSION_HEADER, TranscriptDigest};
use super::{AppState, MAX_BODY_BYTES};
use turn::{Admitted, AfterTurn, Labels, Remember, RunningTurn, finish_reason, usage_json};

/// A request after parsing: what the turn needs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ChatInput {
    /// The model name the client asked for; echoed back, not used to route.
    pub(crate) model: Option<String>,
    pub(crate) stream: bool,
    /// The system messages joined with newlines. Not sent to the model
    /// (the agent keeps its own system prompt), but part of what makes two
    /// header-less conversations the same one.
    pub(crate) system: String,
    /// The new input: the last user message.
    pub(crate) last_user: String,
    /// The files of the last user message (`image_url` data URLs,
    /// `input_audio`), still encoded.
    pub(crate) files: Vec<InlineFile>,
    /// User and assistant messages before the last user message.
    pub(crate) earlier: Vec<Message>,
}

/// Parses the body into a [`ChatInput`].
///
/// # Errors
/// 400 for invalid JSON, a missing or empty `messages`, a malformed message
/// or no user message with text.
pub(crate) fn parse_request(body: &[u8]) -> Result<ChatInput, ApiError> {
    // The usual request reads straight into the fields used, without a
    // JSON tree per message (a header-less client resends its whole
    // history each time); anything that does not fit is read again as a
    // tree, which says precisely what is wrong.
    if let Ok(wire) = serde_json::from_slice::<Wire>(body) {
        let messages = wire.messages.as_ref().map(|m| {
            m.iter()
                .map(|m| (m.role.as_ref(), m.content.as_ref()))
                .collect()
        });
        return assemble(messages, wire.stream.as_ref(), wire.model.as_ref());
    }
    let object = body_object(body)?;
    let messages = object.get("messages").and_then(Value::as_array).map(|m| {
        m.iter()
            .map(|m| (m.get("role"), m.get("content")))
            .collect()
    });
    assemble(messages, object.get("stream"), object.get("model"))
}

/// A request body as the fast path reads it: only the fields used.
#[derive(serde::Deserialize)]
struct Wire {
    messages: Option<Vec<WireMessage>>,
    stream: Option<Value>,
    model: Option<Value>,
}

/// One message as the fast path reads it.
#[derive(serde::Deserialize)]
struct WireMessage {
    role: Option<Value>,
    content: Option<Value>,
}

/// Each message's `role` and `content`, as found.
pub(crate) type RawMessages<'a> = Vec<(Option<&'a Value>, Option<&'a Value>)>;

/// The [`ChatInput`] of a request's `messages` (`None` when it is not an
/// array), `stream` and `model`.
fn assemble(
    messages: Option<RawMessages<'_>>,
    stream: Option<&Value>,
    model: Option<&Value>,
) -> Result<ChatInput, ApiError> {
    let missing =
        || ApiError::bad_request("'messages' must be a non-empty array", "missing_messages");
    let messages = messages.filter(|m| !m.is_empty()).ok_or_else(missing)?;
    let stream = bool_field(stream, "stream", false, "invalid_stream")?;
    let model = model_name(model);

    let Conversation {
        system,
        last_user,
        files,
        earlier,
    } = conversation_of("messages", &messages)?;
    Ok(ChatInput {
        model,
        stream,
        system,
        last_user,
        files,
        earlier,
    })
}

/// A boolean field of a request: `default` when absent or null.
///
/// # Errors
/// 400 with `code` when it is anything but a boolean.
pub(crate) fn bool_field(
    value: Option<&Value>,
    name: &str,
    default: bool,
    code: &'static str,
) -> Result<bool, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::bad_request(
            format!("'{name}' must be a boolean"),
            code,
        )),
    }
}

/// The model name a request asked for, when it named one.
pub(crate) fn model_name(value: Option<&Value>) -> Option<String> {
    value
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .map(str::to_owned)
}

/// A conversation a client sent: the new input and what came before it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Conversation {
    /// The system (and developer) messages joined with newlines.
    pub(crate) system: String,
    /// The new input: the last user message's text.
    pub(crate) last_user: String,
    /// The files of the last user message, still encoded.
    pub(crate) files: Vec<InlineFile>,
    /// User and assistant messages before the last user message.
    pub(crate) earlier: Vec<Message>,
}

/// Splits the `(role, content)` of each message of the request's `field`
/// (`messages` here, `input` for the Responses API) into a
/// [`Conversation`].
///
/// # Errors
/// 400 for a message without a role or with content of the wrong shape,
/// and when no user message has text or files.
pub(crate) fn conversation_of(
    field: &str,
    messages: &RawMessages<'_>,
) -> Result<Conversation, ApiError> {
    let mut parsed = Vec::with_capacity(messages.len());
    for (i, (role, content)) in messages.iter().enumerate() {
        let bad =
            |what: &str| ApiError::bad_request(format!("{field}[{i}]: {what}"), "invalid_message");
        let role = role
            .and_then(Value::as_str)
            .ok_or_else(|| bad("missing 'role'"))?;
        let (text, files) = content_of(*content).map_err(|e| bad(&e))?;
        parsed.push((role, text, files));
    }

    let system = parsed
        .iter()
        .filter(|(role, text, _)| matches!(*role, "system" | "developer") && !text.is_empty())
        .map(|(_, text, _)| text.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let is_user = |(role, text, files): &&(&str, String, Vec<InlineFile>)| {
        *role == "user" && (!text.trim().is_empty() || !files.is_empty())
    };
    let Some(last_index) = parsed.iter().rposition(|m| is_user(&m)) else {
        return Err(ApiError::bad_request(
            format!("No user message found in '{field}'"),
            "no_user_message",
        ));
    };
    let last_user = parsed[last_index].1.clone();
    let files = std::mem::take(&mut parsed[last_index].2);
    // Tool rows and system rows are not replayed: the agent has its own
    // system prompt, and a tool row without its call would be invalid.
    let earlier = parsed[..last_index]
        .iter()
        .filter(|(_, text, _)| !text.trim().is_empty())
        .filter_map(|(role, text, _)| match *role {
            "user" => Some(Message::user(text.clone())),
            "assistant" => Some(Message::assistant(text.clone())),
            _ => None,
        })
        .collect();
    Ok(Conversation {
        system,
        last_user,
        files,
        earlier,
    })
}

/// A file sent inside a message, as it came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InlineFile {
    /// Where it came from: `image_url` or `input_audio`.
    pub(crate) part: &'static str,
    /// Its bytes, or where to fetch them.
    pub(crate) source: FileSource,
}

/// Where an [`InlineFile`]'s bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FileSource {
    /// In the request, base64 as it came.
    Base64(String),
    /// At an `http(s)` URL the client named: fetched through the URL
    /// guard, like every fetch a client or a chat can steer.
    Url(String),
}

/// The text of a `content` field (a string, or the text parts of an array
/// joined with newlines) and its files: `image_url` parts holding a
/// `data:` URL or an `http(s)` URL (fetched later through the URL guard),
/// `input_audio` parts. The Responses API's spellings are the same parts:
/// `input_text` and `output_text` are text, `input_image` an image whose
/// `image_url` is the URL itself.
pub(crate) fn content_of(content: Option<&Value>) -> Result<(String, Vec<InlineFile>), String> {
    let shape = "'content' must be a string or an array of content parts";
    let parts = match content {
        None | Some(Value::Null) => return Ok((String::new(), Vec::new())),
        Some(Value::String(s)) => return Ok((s.clone(), Vec::new())),
        Some(Value::Array(parts)) => parts,
        Some(_) => return Err(shape.to_owned()),
    };
    let mut texts = Vec::new();
    let mut files = Vec::new();
    for part in parts {
        let o = match part {
            Value::String(s) => {
                texts.push(s.as_str());
                continue;
            }
            Value::Object(o) => o,
            _ => return Err(shape.to_owned()),
        };
        match o.get("type").and_then(Value::as_str) {
            Some("text" | "input_text" | "output_text") => {
                texts.push(o.get("text").and_then(Value::as_str).ok_or(shape)?)
            }
            Some("image_url" | "input_image") => {
                let url = o
                    .get("image_url")
                    .and_then(|i| i.get("url").or(Some(i)))
                    .and_then(Value::as_str)
                    .ok_or("an image part needs image_url (a URL, or an object with url)")?;
                let source = if let Some(rest) = url.strip_prefix("data:") {
                    let (_, data) = rest
                        .split_once(";base64,")
                        .ok_or("an image_url data: URL must hold base64 content")?;
                    FileSource::Base64(data.to_owned())
                } else if url.starts_with("http://") || url.starts_with("https://") {
                    FileSource::Url(url.to_owned())
                } else {
                    return Err(
                        "image_url must be a data: URL with base64 content or an http(s) URL"
                            .to_owned(),
                    );
                };
                files.push(InlineFile {
                    part: "image_url",
                    source,
                });
            }
            Some("input_audio") => {
                let data = o
                    .get("input_audio")
                    .and_then(|a| a.get("data"))
                    .and_then(Value::as_str)
                    .ok_or("an input_audio part needs input_audio.data")?;
                files.push(InlineFile {
                    part: "input_audio",
                    source: FileSource::Base64(data.to_owned()),
                });
            }
            // Other part kinds (files by id, refusals) carry nothing this
            // server can use: skipped, as before.
            _ => {}
        }
    }
    Ok((texts.join("\n"), files))
}

/// Seconds since the Unix epoch, as OpenAI's `created`.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `chatcmpl-<32 hex>`.
fn completion_id() -> String {
    let n: u128 = rand::rng().random();
    format!("chatcmpl-{n:032x}")
}

/// The request header that asks for tool progress as named SSE events.
pub(crate) const TOOL_PROGRESS_HEADER: &str = "x-talaria-tool-progress";

/// Whether the client asked for tool progress events: the header with a
/// true value. Off by default because OpenAI's SDKs turn every named event
/// into a chunk, and a chunk without `choices` crashes the usual loop.
fn wants_tool_progress(headers: &HeaderMap) -> bool {
    headers
        .get(TOOL_PROGRESS_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        })
}

/// The session headers on every answer that ran (or tried to run) a turn.
pub(crate) fn session_headers(session_id: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    // The id passed the path-component check, so it is always a valid
    // header value; a failure here would only drop the header.
    if let Ok(v) = HeaderValue::from_str(session_id) {
        headers.insert(HeaderName::from_static(SESSION_HEADER), v.clone());
        headers.insert(HeaderName::from_static(HERMES_SESSION_HEADER), v);
    }
    headers
}

/// The handler.
pub(crate) async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let admitted = match admit(state, &headers, body).await {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    let headers = session_headers(&admitted.session.id);
    if admitted.stream {
        (headers, super::sse::respond(admitted)).into_response()
    } else {
        (headers, complete(admitted).await).into_response()
    }
}

/// Checks the request, takes a run slot, and opens (or creates) its
/// session under that session's lock. Dropping this future (the client went
/// away while waiting for the lock) leaves nothing behind.
async fn admit(
    state: Arc<AppState>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Admitted, ApiError> {
    let body = read_body(body)?;
    let header_id = session::header_session_id(headers)?;
    let request = parse_request(&body)?;
    let permit = take_run_slot(&state)?;
    let (input, media) = take_files(&state, &request.last_user, &request.files).await?;
    tracing::debug!(
        session = header_id.as_deref().unwrap_or("(from the messages)"),
        stream = request.stream,
        chars = request.last_user.len(),
        "API chat completion"
    );
    let opened = match header_id {
        Some(id) => open_named(&state, id, &request.earlier).await?,
        None => open_conversation(&state, &request).await?,
    };
    let (provider, model) = route(&state, request.model);
    Ok(Admitted {
        provider,
        interaction: None,
        instructions: None,
        state,
        session: opened.session,
        input,
        media,
        stream: request.stream,
        tool_progress: wants_tool_progress(headers),
        labels: Labels {
            id: completion_id(),
            created: unix_now(),
            model,
        },
        after: opened.remember.map(AfterTurn::Transcript),
        permit,
        session_lock: opened.lock,
        turn_lease: opened.lease,
    })
}

/// The body as a JSON object, or 400 saying what is wrong with it.
pub(crate) fn body_object(body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(ApiError::bad_request(
            "Request body must be a JSON object",
            "invalid_json",
        )),
        Err(e) => Err(ApiError::bad_request(
            format!("Invalid JSON in request body: {e}"),
            "invalid_json",
        )),
    }
}

/// The body, or 413 / 400 when it could not be read.
pub(crate) fn read_body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(MAX_BODY_BYTES)
        } else {
            ApiError::bad_request(
                format!("Cannot read the request body: {rejection}"),
                "invalid_body",
            )
        }
    })
}

/// A run slot, when runs are capped.
///
/// # Errors
/// 429 when every slot is taken.
pub(crate) fn take_run_slot(
    state: &AppState,
) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, ApiError> {
    match &state.runs {
        None => Ok(None),
        Some(runs) => runs
            .clone()
            .try_acquire_owned()
            .map(Some)
            .map_err(|_| ApiError::too_many_runs()),
    }
}

/// The model serving a request that asked for `model`, and the name its
/// answer is labelled with. A route's name picks its model; any other name
/// is only echoed back (clients send whatever model name they were set up
/// with).
pub(crate) fn route(
    state: &AppState,
    model: Option<String>,
) -> (Option<Arc<dyn talaria_agent::models::Provider>>, String) {
    let provider = model
        .as_deref()
        .and_then(|name| state.agent.route_provider(name));
    let model = model.unwrap_or_else(|| state.agent.parts().provider.model().to_owned());
    (provider, model)
}

/// The turn's input: the last user message's text with what its files
/// gave (a transcript, a document's text, words about an image), and the
/// images for a model that sees them. The files go through the media
/// cache and the same digest as a photo sent in a chat app.
pub(crate) async fn take_files(
    state: &AppState,
    text: &str,
    files: &[InlineFile],
) -> Result<(String, Vec<talaria_core::MediaRef>), ApiError> {
    use base64::Engine as _;
    if files.is_empty() {
        return Ok((text.to_owned(), Vec::new()));
    }
    let Some(media) = state.media.get() else {
        return Err(ApiError::bad_request(
            "This server does not take files in messages",
            "files_not_supported",
        ));
    };
    let mut received = Vec::with_capacity(files.len());
    for file in files {
        let bytes = match &file.source {
            FileSource::Base64(data) => base64::engine::general_purpose::STANDARD
                .decode(data.trim().as_bytes())
                .map_err(|_| {
                    ApiError::bad_request(
                        format!("{}: the data is not valid base64", file.part),
                        "invalid_file",
                    )
                })?,
            FileSource::Url(url) => state.fetch_file(url).await?,
        };
        let stored = media
            .cache
            .store(&bytes[..], talaria_media::Hint::default())
            .await
            .map_err(|e| e.to_string());
        received.push(talaria_agent::attach::Received {
            label: match file.part {
                "image_url" => "image".to_owned(),
                _ => "audio".to_owned(),
            },
            claimed: Some(match file.part {
                "image_url" => talaria_core::MediaKind::Image,
                _ => talaria_core::MediaKind::Audio,
            }),
            file: stored,
        });
    }
    let digest = talaria_agent::attach::digest(received, &media.attach_context()).await;
    Ok((digest.message_text(text), digest.media))
}

/// A session opened for a turn, with what keeps it ours.
pub(crate) struct Opened {
    pub(crate) session: talaria_agent::SessionHandle,
    pub(crate) lock: tokio::sync::OwnedMutexGuard<()>,
    pub(crate) lease: Option<talaria_gateway::turn_lease::HeldTurn>,
    pub(crate) remember: Option<Remember>,
}

/// The session the client named: waits for its lock (two requests for one
/// session take turns), then opens it, or creates it seeded with the
/// request's earlier messages. For a known session the store holds the
/// history and those messages are the client's copy of it, not stored
/// twice.
pub(crate) async fn open_named(
    state: &AppState,
    id: String,
    earlier: &[Message],
) -> Result<Opened, ApiError> {
    let lock = state.locks.get(&id).lock_owned().await;
    let lease = take_lease(state, &id).await?;
    let session = session::open_session(&state.agent, &id, earlier)
        .await
        .map_err(|e| cannot_open(&id, &e))?;
    Ok(Opened {
        session,
        lock,
        lease,
        remember: None,
    })
}

/// A header-less request: the request's messages are the conversation.
///
/// When the earlier messages are exactly a conversation this server
/// answered (the digest of the client's history, which ends with our last
/// answer, is in the index) and its session has not moved on since, the
/// turn continues that session. Anything else (a new conversation, an
/// edited history, a session another client with the same history is
/// using or has continued) gets a session of its own, seeded with what the
/// client sent. So the model sees only the conversation the client sent,
/// and unrelated conversations never wait for each other.
async fn open_conversation(state: &AppState, request: &ChatInput) -> Result<Opened, ApiError> {
    let mut digest = TranscriptDigest::new(&request.system);
    digest.extend(&request.earlier);
    let prior = (!request.earlier.is_empty()).then(|| digest.key());
    digest.push(Role::User, &request.last_user);

    if let Some(key) = prior
        && let Some(at) = state.index.lookup(&key).await
        // A session busy with a turn is about to move on: waiting for it
        // would only serialize identical conversations to then not match.
        && let Ok(lock) = state.locks.get(&at.session_id).try_lock_owned()
    {
        let lease = take_lease(state, &at.session_id).await?;
        match session::continue_if_unchanged(&state.agent, &at).await {
            Ok(Some(session)) => {
                // The session moves on: the conversation's old key will
                // never match again, so the answer's record replaces it
                // (one record per conversation, not one per turn).
                return Ok(Opened {
                    session,
                    lock,
                    lease,
                    remember: Some(Remember {
                        digest: digest.replacing(key),
                        rows_before: at.rows,
                    }),
                });
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(session = %at.session_id, error = %e, "cannot reopen an API conversation; starting a new session");
            }
        }
    }

    let id = session::new_conversation_id();
    // Nobody else knows this id yet: the lock and the lease are free.
    let lock = state.locks.get(&id).lock_owned().await;
    let lease = take_lease(state, &id).await?;
    let session = session::start_conversation(&state.agent, &id, &request.earlier)
        .await
        .map_err(|e| cannot_open(&id, &e))?;
    Ok(Opened {
        session,
        lock,
        lease,
        remember: Some(Remember {
            digest,
            rows_before: request.earlier.len() as u64,
        }),
    })
}

pub(crate) fn cannot_open(id: &str, e: &AgentError) -> ApiError {
    tracing::warn!(session = %id, error = %e, "cannot open API session");
    ApiError::internal(format!("Cannot open session: {e}"))
}

/// Across nodes sharing a store: waits for, and takes, the session's turn
/// lease, so two nodes never run one session at once.
pub(crate) async fn take_lease(
    state: &AppState,
    session_id: &str,
) -> Result<Option<talaria_gateway::turn_lease::HeldTurn>, ApiError> {
    let Some(leases) = &state.turn_leases else {
        return Ok(None);
    };
    use talaria_gateway::turn_lease::Taken;
    let key = format!("api:{session_id}");
    match tokio::time::timeout(
        state.busy_wait,
        leases.take(&key, &state.turns, false, || {}),
    )
    .await
    {
        Ok(Taken::Held(held)) => Ok(Some(held)),
        Ok(Taken::Cancelled) => Err(ApiError::unavailable("The server is shutting down")),
        // The turn elsewhere may well run for minutes: the client is told
        // when to come back rather than held.
        Err(_) => Err(ApiError::session_busy(state.busy_wait)),
    }
}

/// Runs the turn in its own task and answers with one `chat.completion`.
async fn complete(admitted: Admitted) -> Response {
    let RunningTurn {
        labels,
        guard,
        task,
    } = admitted.spawn_turn(NullObserver);
    let result = task.await;
    guard.disarm();
    match result {
        Ok(Ok(outcome)) => completion_response(&labels, &outcome),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "API turn failed");
            ApiError::internal(format!("The turn failed: {e}")).into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "API turn task died");
            ApiError::internal("The turn stopped unexpectedly").into_response()
        }
    }
}

/// The `chat.completion` object, or 502 when the turn failed (with or
/// without partial text: OpenAI answers a failed request with an error,
/// never with a completion cut short).
fn completion_response(labels: &Labels, outcome: &TurnOutcome) -> Response {
    let Some(reason) = finish_reason(&outcome.exit) else {
        let why = match &outcome.exit {
            TurnExit::Failed(why) => why.as_str(),
            _ => "unknown",
        };
        return ApiError::incomplete(format!("The agent did not complete: {why}")).into_response();
    };
    axum::Json(json!({
        "id": labels.id,
        "object": "chat.completion",
        "created": labels.created,
        "model": labels.model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": outcome.answer},
            "finish_reason": reason,
        }],
        "usage": usage_json(&outcome.usage),
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<ChatInput, ApiError> {
        parse_request(v.to_string().as_bytes())
    }

    #[test]
    fn the_last_user_message_is_the_input() {
        let input = parse(json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "A"},
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": [{"type": "text", "text": "B"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}},
                    {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]},
            ],
        }));
        let input = input.map_err(|e| e.message);
        assert_eq!(
            input,
            Ok(ChatInput {
                model: Some("m".into()),
                stream: false,
                system: "be brief".into(),
                last_user: "B".into(),
                files: vec![
                    InlineFile {
                        part: "image_url",
                        source: FileSource::Base64("iVBORw0K".into())
                    },
                    InlineFile {
                        part: "input_audio",
                        source: FileSource::Base64("UklGRg==".into())
                    },
                ],
                earlier: vec![Message::user("A"), Message::assistant("a")],
            })
        );
    }

    #[test]
    fn a_remote_image_url_is_kept_for_the_guarded_fetch() {
        let input = parse(json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest"}}]}]}));
        let files = input.map(|i| i.files).unwrap_or_default();
        assert_eq!(
            files,
            [InlineFile {
                part: "image_url",
                source: FileSource::Url("http://169.254.169.254/latest".to_owned())
            }]
        );
        let input = parse(json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]}));
        let e = input.err().map(|e| e.message).unwrap_or_default();
        assert!(e.contains("data: URL"), "{e}");
    }

    #[test]
    fn bad_requests_are_refused_with_a_code() {
        let code = |body: &[u8]| parse_request(body).err().and_then(|e| e.code);
        assert_eq!(code(b"{not json"), Some("invalid_json"));
        assert_eq!(code(b"[]"), Some("invalid_json"));
        assert_eq!(code(br#"{"model":"m"}"#), Some("missing_messages"));
        assert_eq!(code(br#"{"messages":[]}"#), Some("missing_messages"));
        assert_eq!(
            code(br#"{"messages":[{"role":"system","content":"x"}]}"#),
            Some("no_user_message")
        );
        assert_eq!(
            code(br#"{"messages":[{"role":"user","content":"  "}]}"#),
            Some("no_user_message")
        );
        assert_eq!(
            code(br#"{"messages":[{"role":"user","content":5}]}"#),
            Some("invalid_message")
        );
        assert_eq!(
            code(br#"{"messages":[{"content":"x"}]}"#),
            Some("invalid_message")
        );
        assert_eq!(
            code(br#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#),
            Some("invalid_stream")
        );
    }

    #[test]
    fn finish_reasons_follow_the_exit() {
        assert_eq!(finish_reason(&TurnExit::Completed), Some("stop"));
        assert_eq!(finish_reason(&TurnExit::Interrupted), Some("stop"));
        assert_eq!(finish_reason(&TurnExit::BudgetExhausted), Some("length"));
        // OpenAI has no "error" finish reason: a failed turn ends in an error.
        assert_eq!(finish_reason(&TurnExit::Failed("x".into())), None);
    }
}
