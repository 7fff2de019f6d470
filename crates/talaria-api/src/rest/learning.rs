//! What the agent learns, over HTTP: the memory files (`/api/memory`), a
//! skill read, created and rewritten (`/api/skills`), the learning log a
//! page at a time with rollback (`/api/learning`), and the learning graph.
//!
//! Every change runs through the code the agent's own tools run (the
//! logged `memory` tool, `skill_manage`), so the same checks apply and the
//! learning log records it, as the `api`'s: the dashboard's edits can be
//! inspected and undone like the agent's.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use talaria_agent::execution::{Execution, Trust};
use talaria_agent::tools::memory::{ENTRY_DELIMITER, MemoryTarget, read_entries, usage_chars};
use talaria_agent::tools::{SessionState, Tool, ToolContext};
use talaria_core::Home;
use talaria_core::config::MemoryConfig;
use talaria_learning::log::{Entry, LearningLog, LoggedMemory};
use talaria_learning::restore::{RestoreError, Version, restore_memory, restore_skill};
use talaria_learning::skills::{Library, Origin, valid_name};
use tokio_util::sync::CancellationToken;

use super::{Params, bad_request, count_param, error, json_body, not_found, query, shown};
use crate::AppState;
use crate::error::ApiError;

/// The actor the learning log records for changes made through the API.
const ACTOR: &str = "api";
/// Log entries a page holds unless `limit` says otherwise.
const DEFAULT_LOG_PAGE: usize = 50;
/// Most log entries one page holds.
const MAX_LOG_PAGE: usize = 200;
/// Deepest a log page goes (the log is read from its end, so a deep page
/// reads everything newer).
const MAX_LOG_OFFSET: usize = 100_000;
/// Largest memory file served: the tool keeps them to a few thousand
/// characters, so only a file edited by hand is ever near this.
const MAX_MEMORY_FILE_BYTES: u64 = 1024 * 1024;
/// Most support file names a skill lists.
const MAX_FILES_LISTED: usize = 500;

type QueryParams = Result<Query<Params>, QueryRejection>;
type PathName = Result<Path<String>, PathRejection>;

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("The request's file work failed: {e}")))?
}

/// The context the tools are called with: the agent's parts, and no
/// backend, since neither the memory tool nor `skill_manage` runs a
/// command (and nothing called from here should).
fn tool_context(state: &AppState) -> ToolContext {
    let parts = state.agent.parts();
    ToolContext {
        session_id: ACTOR.to_owned(),
        home: parts.home.clone(),
        workdir: parts.workdir.clone(),
        config: parts.config.clone(),
        store: parts.store.clone(),
        interaction: parts.interaction.clone(),
        session: Arc::new(SessionState::default()),
        redactor: parts.redactor.clone(),
        cancel: CancellationToken::new(),
        execution: Execution {
            trust: Trust::Owner,
            kind: talaria_exec::BackendKind::Local,
            backend: Err(talaria_exec::Unavailable {
                kind: talaria_exec::BackendKind::Local,
                reason: "the REST API runs no commands".into(),
            }),
            workspace: None,
        },
        tools: parts.registry.clone(),
        platform: Some(crate::session::SOURCE.to_owned()),
        progress: talaria_agent::Progress::none(),
    }
}

// ---------------------------------------------------------------------
// Memory

/// Both memory files as the dashboard shows them: entries, characters
/// used and the limit. Blocking.
fn memory_json(home: &Home, config: &MemoryConfig) -> Result<Value, ApiError> {
    let mut targets = Vec::new();
    for target in [MemoryTarget::Memory, MemoryTarget::User] {
        let file = target.file_name();
        let path = home.memories_dir().join(file);
        if let Ok(meta) = std::fs::metadata(&path)
            && meta.len() > MAX_MEMORY_FILE_BYTES
        {
            return Err(ApiError::internal(format!(
                "{file} is {} bytes, far over its limit; trim it with `talaria memory edit`",
                meta.len()
            )));
        }
        let entries = read_entries(home, target)
            .map_err(|e| ApiError::internal(format!("Cannot read {file}: {e}")))?;
        let used = usage_chars(&entries);
        let limit = target.limit(config);
        // A limit of 0 means the file is full.
        let percent = used
            .saturating_mul(100)
            .checked_div(limit)
            .map_or(100, |p| p.min(100));
        targets.push(json!({
            "target": target.as_str(),
            "file": file,
            "entries": entries,
            "entry_count": entries.len(),
            "chars_used": used,
            "char_limit": limit,
            "usage_percent": percent,
        }));
    }
    Ok(json!({
        "object": "talaria.memory",
        "enabled": config.enabled,
        "delimiter": ENTRY_DELIMITER,
        "targets": targets,
    }))
}

/// The memory files now, read off the async threads.
async fn memory_now(state: &AppState) -> Result<Value, ApiError> {
    let home = state.agent.parts().home.clone();
    let config = state.agent.parts().config.memory.clone();
    blocking(move || memory_json(&home, &config)).await
}

/// `GET /api/memory`: MEMORY.md (`memory`) and USER.md (`user`), each as
/// its entries with the characters they take and the limit.
pub(super) async fn memory(State(state): State<Arc<AppState>>) -> Response {
    match memory_now(&state).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// What `POST /api/memory` takes: the `memory` tool's own arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MemoryChange {
    action: String,
    target: String,
    content: Option<String>,
    old_text: Option<String>,
}

/// `POST /api/memory`: one add, replace or remove through the `memory`
/// tool the agent uses, recorded in the learning log; the tool's refusal
/// is a 400 with its sentence. Answers with both files as they are now.
pub(super) async fn memory_change(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    async {
        let change: MemoryChange = json_body(&body)?;
        let mut args = json!({"action": change.action, "target": change.target});
        if let Some(content) = change.content {
            args["content"] = json!(content);
        }
        if let Some(old_text) = change.old_text {
            args["old_text"] = json!(old_text);
        }
        let ctx = tool_context(&state);
        let tool = LoggedMemory::new(&ctx.home, ACTOR);
        let said = tool
            .call(args, &ctx)
            .await
            .map_err(|e| bad_request(e.0, "memory_refused"))?;
        // A refusal the tool answers with (no match, over the limit) comes
        // back as `success: false` with the reason.
        let said: Value = serde_json::from_str(&said).unwrap_or(Value::Null);
        if said["success"] != true {
            let reason = said["error"]
                .as_str()
                .unwrap_or("The memory tool refused the change");
            return Err(bad_request(reason, "memory_refused"));
        }
        let mut now = memory_now(&state).await?;
        now["message"] = said["message"].clone();
        Ok(Json(now).into_response())
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

// ---------------------------------------------------------------------
// Skills

/// The path's skill name, checked.
fn skill_name(path: PathName) -> Result<String, ApiError> {
    let Path(name) = path.map_err(|e| bad_request(e.body_text(), "invalid_path"))?;
    checked_name(&name)?;
    Ok(name)
}

/// 400 unless `name` may name a skill.
fn checked_name(name: &str) -> Result<(), ApiError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(bad_request(
            format!(
                "{:?} is not a skill name: lower-case letters, digits, `.`, `_` and `-`, \
                 starting with a letter or digit, at most {} characters",
                shown(name),
                talaria_learning::skills::MAX_NAME
            ),
            "invalid_skill_name",
        ))
    }
}

fn no_skill(name: &str) -> ApiError {
    not_found(format!("No skill named {name:?}"), "skill_not_found")
}

/// A skill as `GET /api/skills/{name}` shows it, or `None` when there is
/// none of that name. Blocking.
fn skill_json(library: &Library, name: &str) -> Result<Option<Value>, ApiError> {
    if library.find(name).is_none() {
        return Ok(None);
    }
    let skill = library
        .read(name)
        .map_err(|e| ApiError::internal(format!("Cannot read the skill: {e}")))?;
    let info = &skill.info;
    let bundled = info.origin == Origin::Bundled;
    let truncated = skill.files.len() > MAX_FILES_LISTED;
    let files: Vec<&String> = skill.files.iter().take(MAX_FILES_LISTED).collect();
    Ok(Some(json!({
        "object": "talaria.skill",
        "name": info.name,
        "description": info.description,
        "category": info.category,
        "origin": if bundled { "bundled" } else { "user" },
        "read_only": bundled,
        "content": skill.text,
        "files": files,
        "files_truncated": truncated,
    })))
}

/// `GET /api/skills/{name}`: the skill's SKILL.md, its listing (as
/// `/v1/skills` gives it), whether it is bundled (read-only) or the
/// user's, and its support files' names.
pub(super) async fn skill(State(state): State<Arc<AppState>>, name: PathName) -> Response {
    async {
        let name = skill_name(name)?;
        let home = state.agent.parts().home.clone();
        let shown = blocking(move || {
            skill_json(&Library::new(&home), &name)?.ok_or_else(|| no_skill(&name))
        })
        .await?;
        Ok::<_, ApiError>(Json(shown).into_response())
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// Runs `skill_manage` with `args` as the API, and answers with the skill
/// as it is after, with the tool's message. Its refusal (a bad
/// frontmatter, a name in use) is a 400 with its sentence.
async fn manage(state: &AppState, name: String, args: Value) -> Result<Value, ApiError> {
    let home = state.agent.parts().home.clone();
    let library = Arc::new(Library::new(&home));
    let tool = talaria_learning::tools::skill_manage_as(library.clone(), ACTOR);
    let said = tool
        .call(args, &tool_context(state))
        .await
        .map_err(|e| bad_request(e.0, "skill_refused"))?;
    let said: Value = serde_json::from_str(&said).unwrap_or(Value::Null);
    let mut out =
        blocking(move || skill_json(&library, &name)?.ok_or_else(|| no_skill(&name))).await?;
    out["message"] = said["message"].clone();
    Ok(out)
}

/// Where skill `name` stands before a change: 404 when there is none, 403
/// when it is bundled. Blocking.
fn changeable(home: &Home, name: &str) -> Result<(), ApiError> {
    match Library::new(home).find(name) {
        None => Err(no_skill(name)),
        Some(info) if info.origin == Origin::Bundled => Err(error(
            StatusCode::FORBIDDEN,
            format!(
                "{name:?} is one of Talaria's bundled skills, which are read-only; create your \
                 own skill under another name"
            ),
            "skill_read_only",
        )),
        Some(_) => Ok(()),
    }
}

/// What `PUT /api/skills/{name}` takes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SkillContent {
    content: String,
}

/// `PUT /api/skills/{name}`: rewrites a user skill's SKILL.md through
/// `skill_manage`'s `edit` (validated, logged). A bundled skill is 403,
/// an unknown one 404.
pub(super) async fn skill_edit(
    State(state): State<Arc<AppState>>,
    name: PathName,
    body: Bytes,
) -> Response {
    async {
        let name = skill_name(name)?;
        let body: SkillContent = json_body(&body)?;
        let home = state.agent.parts().home.clone();
        let checked = name.clone();
        blocking(move || changeable(&home, &checked)).await?;
        let args = json!({"action": "edit", "name": name, "content": body.content});
        Ok::<_, ApiError>(Json(manage(&state, name, args).await?).into_response())
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// What `POST /api/skills` takes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSkill {
    name: String,
    content: String,
    category: Option<String>,
}

/// `POST /api/skills`: creates a user skill through `skill_manage`'s
/// `create` (validated, logged); 201, or 409 when the name is taken.
pub(super) async fn skill_create(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    async {
        let body: NewSkill = json_body(&body)?;
        let name = body.name.trim().to_owned();
        checked_name(&name)?;
        let home = state.agent.parts().home.clone();
        let checked = name.clone();
        let taken = blocking(move || Ok(Library::new(&home).find(&checked).is_some())).await?;
        if taken {
            return Err(error(
                StatusCode::CONFLICT,
                format!("A skill named {name:?} already exists; change it with PUT instead"),
                "skill_exists",
            ));
        }
        let mut args = json!({"action": "create", "name": name, "content": body.content});
        if let Some(category) = body.category {
            args["category"] = json!(category);
        }
        let made = manage(&state, name, args).await?;
        Ok((StatusCode::CREATED, Json(made)).into_response())
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

// ---------------------------------------------------------------------
// The learning log

/// `GET /api/learning`: the learning log newest first, `limit` (at most
/// 200) and `offset`; `target` keeps one skill's or memory file's changes
/// (`skill:<name>` takes its support files' too). Read from the end of
/// the log, so recent pages stay cheap however long it grows.
pub(super) async fn log(State(state): State<Arc<AppState>>, params: QueryParams) -> Response {
    async {
        let params = query(params)?;
        let limit = count_param(&params, "limit", DEFAULT_LOG_PAGE, MAX_LOG_PAGE)?;
        let offset = count_param(&params, "offset", 0, MAX_LOG_OFFSET)?;
        let target = params
            .get("target")
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty());
        let home = state.agent.parts().home.clone();
        let page = blocking(move || {
            let nested = target.as_ref().map(|t| format!("{t}/"));
            let keep = |e: &Entry| match (&target, &nested) {
                (Some(t), Some(n)) => e.target == *t || e.target.starts_with(n.as_str()),
                _ => true,
            };
            LearningLog::new(&home)
                .newest(offset, limit, keep)
                .map_err(|e| ApiError::internal(format!("Cannot read the learning log: {e}")))
        })
        .await?;
        Ok::<_, ApiError>(
            Json(json!({
                "object": "list",
                "data": page.entries,
                "limit": limit,
                "offset": offset,
                "has_more": page.has_more,
            }))
            .into_response(),
        )
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// What `POST /api/learning/rollback` takes: one skill or one memory
/// file, and optionally the version (a hash the log shows) to put back.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rollback {
    skill: Option<String>,
    memory: Option<String>,
    to: Option<String>,
}

/// A restore's refusal as an answer.
fn restore_error(e: RestoreError) -> ApiError {
    match e {
        RestoreError::NotFound(m) => not_found(m, "version_not_found"),
        RestoreError::Conflict(m) => error(StatusCode::CONFLICT, m, "nothing_to_restore"),
        RestoreError::Io(m) => ApiError::internal(m),
    }
}

/// `POST /api/learning/rollback`: puts a skill's SKILL.md (`skill`) or a
/// memory file (`memory`: `memory` or `user`) back to `to`, a version the
/// log names, or without it one step back (before the change that left it
/// as it is). Recorded in the learning log as the API's `rollback`.
pub(super) async fn rollback(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    async {
        let body: Rollback = json_body(&body)?;
        let home = state.agent.parts().home.clone();
        let to = body
            .to
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty());
        match (body.skill, body.memory) {
            (Some(name), None) => {
                let name = name.trim().to_owned();
                checked_name(&name)?;
                let out = blocking(move || {
                    let library = Library::new(&home);
                    let version = to.as_deref().map_or(Version::Previous, Version::Hash);
                    let done =
                        restore_skill(&library, &name, version, ACTOR).map_err(restore_error)?;
                    Ok(json!({
                        "object": "talaria.rollback",
                        "target": format!("skill:{name}"),
                        "message": done.message,
                        "from": done.from,
                        "to": done.to,
                        "skill": skill_json(&library, &name)?,
                    }))
                })
                .await?;
                Ok(Json(out).into_response())
            }
            (None, Some(which)) => {
                let target = MemoryTarget::parse(which.trim()).ok_or_else(|| {
                    bad_request(
                        format!(
                            "`memory` is \"memory\" or \"user\", not {:?}",
                            shown(&which)
                        ),
                        "invalid_target",
                    )
                })?;
                let done = blocking(move || {
                    let version = to.as_deref().map_or(Version::Previous, Version::Hash);
                    restore_memory(&home, target, version, ACTOR).map_err(restore_error)
                })
                .await?;
                let mut out = json!({
                    "object": "talaria.rollback",
                    "target": format!("memory:{}", target.file_name()),
                    "message": done.message,
                    "from": done.from,
                    "to": done.to,
                });
                out["memory"] = memory_now(&state).await?;
                Ok(Json(out).into_response())
            }
            _ => Err(bad_request(
                "Give either `skill` (a skill's name) or `memory` (\"memory\" or \"user\")",
                "invalid_body",
            )),
        }
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// `GET /api/learning/graph`: the learning graph (skills by who wrote
/// them, memory cards, their links) as JSON, or `format=dot` for
/// Graphviz.
pub(super) async fn graph(State(state): State<Arc<AppState>>, params: QueryParams) -> Response {
    async {
        let params = query(params)?;
        let dot = match params.get("format").map(|f| f.trim()) {
            None | Some("json") => false,
            Some("dot") => true,
            Some(other) => {
                return Err(bad_request(
                    format!("`format` is json or dot, not {:?}", shown(other)),
                    "invalid_query",
                ));
            }
        };
        let home = state.agent.parts().home.clone();
        let graph =
            blocking(move || Ok(talaria_learning::graph::build(&Library::new(&home), &home)))
                .await?;
        Ok(if dot {
            (
                [(header::CONTENT_TYPE, "text/vnd.graphviz; charset=utf-8")],
                talaria_learning::graph::to_dot(&graph),
            )
                .into_response()
        } else {
            Json(graph).into_response()
        })
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}
