//! `GET /openapi.json`: an OpenAPI 3.1 description of every route the
//! server answers, built from [`OPERATIONS`].
//!
//! It is served behind the API key like every other route: it tells no
//! secret, but it does tell what this server is and can do (its version,
//! its routes), and the ancestor keeps even `/v1/capabilities` behind the
//! key. Tools that need it fetch it with the key.
//!
//! The test `openapi_describes_every_route` (tests/rest.rs) holds the
//! description and the router to each other both ways: every
//! `.route(...)` in this crate's source is described here, and every
//! operation described here is answered (not the 404 fallback, not 405).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::AppState;

/// One operation: a method on a path.
pub(crate) struct Operation {
    /// Lower-case HTTP method.
    pub(crate) method: &'static str,
    /// The path as the router spells it (`{id}` for a parameter).
    pub(crate) path: &'static str,
    /// Unique, stable: `operationId`, and the name `/v1/capabilities`
    /// lists the endpoint under.
    pub(crate) id: &'static str,
    /// One line on what it does.
    pub(crate) summary: &'static str,
    /// The group it is shown in.
    pub(crate) tag: &'static str,
    /// The request body's schema (in `components.schemas`), if it takes one.
    pub(crate) body: Option<&'static str>,
    /// The success status and its body's schema.
    pub(crate) ok: (u16, &'static str),
    /// Query parameters: name, type, what it does.
    pub(crate) query: &'static [(&'static str, &'static str, &'static str)],
}

const fn op(
    method: &'static str,
    path: &'static str,
    id: &'static str,
    tag: &'static str,
    summary: &'static str,
    body: Option<&'static str>,
    ok: (u16, &'static str),
) -> Operation {
    Operation {
        method,
        path,
        id,
        summary,
        tag,
        body,
        ok,
        query: &[],
    }
}

const fn with_query(
    o: Operation,
    query: &'static [(&'static str, &'static str, &'static str)],
) -> Operation {
    Operation { query, ..o }
}

/// Routes that answer without the key.
pub(crate) const PUBLIC: &[&str] = &["/health", "/v1/health", "/readyz"];

/// Every operation of the server.
pub(crate) const OPERATIONS: &[Operation] = &[
    op(
        "get",
        "/health",
        "health",
        "health",
        "Liveness: ok, the platform and the version (no key needed).",
        None,
        (200, "Health"),
    ),
    op(
        "get",
        "/v1/health",
        "health_v1",
        "health",
        "The same as /health.",
        None,
        (200, "Health"),
    ),
    op(
        "get",
        "/readyz",
        "readyz",
        "health",
        "Readiness: 200 once every enabled platform is connected (or held by another node), else 503 naming those still connecting (no key needed).",
        None,
        (200, "Readiness"),
    ),
    op(
        "get",
        "/metrics",
        "metrics",
        "ops",
        "The gateway's counters and gauges in Prometheus' text format (the key is needed unless metrics.public on loopback).",
        None,
        (200, "MetricsText"),
    ),
    op(
        "get",
        "/health/detailed",
        "health_detailed",
        "health",
        "Platforms with liveness, nodes, ledger counts, cron state and running turns.",
        None,
        (200, "DetailedHealth"),
    ),
    op(
        "get",
        "/openapi.json",
        "openapi",
        "meta",
        "This description.",
        None,
        (200, "Object"),
    ),
    op(
        "get",
        "/v1/capabilities",
        "capabilities",
        "meta",
        "What this server supports: features, endpoints, model, version.",
        None,
        (200, "Capabilities"),
    ),
    op(
        "get",
        "/v1/skills",
        "skills",
        "meta",
        "The installed skills.",
        None,
        (200, "SkillList"),
    ),
    op(
        "get",
        "/v1/toolsets",
        "toolsets",
        "meta",
        "The toolsets with their tools, and which are enabled for the API server.",
        None,
        (200, "ToolsetList"),
    ),
    op(
        "get",
        "/api/memory",
        "memory",
        "learning",
        "MEMORY.md (memory) and USER.md (user): their entries, the characters they take and the limits.",
        None,
        (200, "Memory"),
    ),
    op(
        "post",
        "/api/memory",
        "memory_change",
        "learning",
        "Adds, replaces or removes one memory entry through the agent's memory tool (logged); its refusal is a 400.",
        Some("MemoryChange"),
        (200, "Memory"),
    ),
    op(
        "post",
        "/api/skills",
        "skill_create",
        "learning",
        "Creates a skill of the user's through skill_manage (validated, logged); 409 when the name is taken.",
        Some("NewSkill"),
        (201, "Skill"),
    ),
    op(
        "get",
        "/api/skills/{name}",
        "skill",
        "learning",
        "A skill's SKILL.md, listing, origin (bundled skills are read-only) and support files.",
        None,
        (200, "Skill"),
    ),
    op(
        "put",
        "/api/skills/{name}",
        "skill_edit",
        "learning",
        "Rewrites a user skill's SKILL.md through skill_manage (validated, logged); bundled skills are 403.",
        Some("SkillContent"),
        (200, "Skill"),
    ),
    with_query(
        op(
            "get",
            "/api/learning",
            "learning_log",
            "learning",
            "The learning log (every change to skills and memory), newest first, a page at a time.",
            None,
            (200, "LearningLog"),
        ),
        &[
            (
                "limit",
                "integer",
                "Entries per page: 0 to 200, default 50.",
            ),
            ("offset", "integer", "Entries to skip (at most 100000)."),
            (
                "target",
                "string",
                "Only one target's changes: skill:<name> (its support files included) or memory:MEMORY.md / memory:USER.md.",
            ),
        ],
    ),
    op(
        "post",
        "/api/learning/rollback",
        "learning_rollback",
        "learning",
        "Puts a skill's SKILL.md or a memory file back one change, or to a version the log names (logged).",
        Some("Rollback"),
        (200, "RollbackResult"),
    ),
    with_query(
        op(
            "get",
            "/api/learning/graph",
            "learning_graph",
            "learning",
            "The learning graph: skills by who wrote them, memory cards, their links.",
            None,
            (200, "LearningGraph"),
        ),
        &[(
            "format",
            "string",
            "json (the default) or dot (Graphviz, text/vnd.graphviz).",
        )],
    ),
    op(
        "get",
        "/v1/models",
        "models",
        "openai",
        "The models this server answers as (OpenAI's list).",
        None,
        (200, "ModelList"),
    ),
    op(
        "get",
        "/v1/models/{id}",
        "model",
        "openai",
        "One model, or 404 model_not_found.",
        None,
        (200, "Model"),
    ),
    op(
        "post",
        "/v1/chat/completions",
        "chat_completions",
        "openai",
        "Runs one agent turn: a chat.completion, or with stream: true a stream of chat.completion.chunk events.",
        Some("ChatCompletionRequest"),
        (200, "ChatCompletion"),
    ),
    op(
        "post",
        "/v1/responses",
        "responses",
        "openai",
        "OpenAI's Responses API: one agent turn, streamed or not; previous_response_id continues a conversation.",
        Some("ResponseRequest"),
        (200, "Response"),
    ),
    op(
        "get",
        "/v1/responses/{id}",
        "response",
        "openai",
        "A stored response.",
        None,
        (200, "Response"),
    ),
    op(
        "delete",
        "/v1/responses/{id}",
        "response_delete",
        "openai",
        "Deletes a stored response.",
        None,
        (200, "Deleted"),
    ),
    op(
        "post",
        "/v1/runs",
        "runs",
        "runs",
        "Starts a turn and answers at once with its run id.",
        Some("RunRequest"),
        (202, "Run"),
    ),
    op(
        "get",
        "/v1/runs/{id}",
        "run_status",
        "runs",
        "A run's status.",
        None,
        (200, "Run"),
    ),
    op(
        "get",
        "/v1/runs/{id}/events",
        "run_events",
        "runs",
        "A run's events as server-sent events: text deltas, tool starts and ends, approval requests, the final answer.",
        None,
        (200, "EventStream"),
    ),
    op(
        "post",
        "/v1/runs/{id}/approval",
        "run_approval",
        "runs",
        "Answers a run's dangerous-command prompt.",
        Some("ApprovalRequest"),
        (200, "Run"),
    ),
    op(
        "post",
        "/v1/runs/{id}/stop",
        "run_stop",
        "runs",
        "Stops a run.",
        None,
        (200, "Run"),
    ),
    with_query(
        op(
            "get",
            "/api/sessions",
            "sessions",
            "sessions",
            "Stored sessions, newest first; q searches their transcripts.",
            None,
            (200, "SessionList"),
        ),
        &[
            (
                "q",
                "string",
                "Full-text search over the transcripts; hits come best first, each with a match.",
            ),
            (
                "source",
                "string",
                "Only sessions from this source (api_server, telegram, cli, ...).",
            ),
            (
                "limit",
                "integer",
                "Sessions per page: 0 to 200, default 50.",
            ),
            (
                "offset",
                "integer",
                "Sessions to skip (a search pages at most 1000 deep).",
            ),
        ],
    ),
    op(
        "post",
        "/api/sessions",
        "session_create",
        "sessions",
        "Creates an empty session (source api_server).",
        Some("SessionBody"),
        (201, "SessionEnvelope"),
    ),
    op(
        "get",
        "/api/sessions/{id}",
        "session",
        "sessions",
        "One session.",
        None,
        (200, "SessionEnvelope"),
    ),
    op(
        "patch",
        "/api/sessions/{id}",
        "session_rename",
        "sessions",
        "Renames a session.",
        Some("SessionBody"),
        (200, "SessionEnvelope"),
    ),
    op(
        "delete",
        "/api/sessions/{id}",
        "session_delete",
        "sessions",
        "Deletes a session, its transcript, its search entries and the routes pointing at it.",
        None,
        (200, "Deleted"),
    ),
    with_query(
        op(
            "get",
            "/api/sessions/{id}/messages",
            "session_messages",
            "sessions",
            "The active transcript, a page at a time; tool calls and results included.",
            None,
            (200, "MessageList"),
        ),
        &[
            (
                "limit",
                "integer",
                "Messages per page: 0 to 500, default 100.",
            ),
            (
                "after",
                "integer",
                "The last message id of the previous page (its next_after).",
            ),
        ],
    ),
    op(
        "post",
        "/api/sessions/{id}/fork",
        "session_fork",
        "sessions",
        "A new session holding a copy of the active transcript, its parent recorded.",
        Some("SessionBody"),
        (201, "SessionEnvelope"),
    ),
    op(
        "post",
        "/api/sessions/{id}/chat",
        "session_chat",
        "sessions",
        "Runs one turn on the session and answers when it ends.",
        Some("SessionChatRequest"),
        (200, "Object"),
    ),
    op(
        "post",
        "/api/sessions/{id}/chat/stream",
        "session_chat_stream",
        "sessions",
        "Runs one turn on the session, streamed as server-sent events.",
        Some("SessionChatRequest"),
        (200, "EventStream"),
    ),
    with_query(
        op(
            "get",
            "/api/jobs",
            "jobs",
            "jobs",
            "The cron jobs, a page at a time.",
            None,
            (200, "JobList"),
        ),
        &[
            ("limit", "integer", "Jobs per page: 0 to 500, default 100."),
            ("offset", "integer", "Jobs to skip."),
        ],
    ),
    op(
        "post",
        "/api/jobs",
        "job_create",
        "jobs",
        "Creates a cron job, checked as `talaria cron add` checks one.",
        Some("NewJob"),
        (201, "Job"),
    ),
    op(
        "get",
        "/api/jobs/{id}",
        "job",
        "jobs",
        "One cron job, by id or name.",
        None,
        (200, "Job"),
    ),
    op(
        "patch",
        "/api/jobs/{id}",
        "job_update",
        "jobs",
        "Changes a job's fields; a new schedule starts from now.",
        Some("JobChanges"),
        (200, "Job"),
    ),
    op(
        "delete",
        "/api/jobs/{id}",
        "job_delete",
        "jobs",
        "Deletes a job and the record of its runs.",
        None,
        (200, "Deleted"),
    ),
    op(
        "post",
        "/api/jobs/{id}/pause",
        "job_pause",
        "jobs",
        "Pauses a job.",
        None,
        (200, "Job"),
    ),
    op(
        "post",
        "/api/jobs/{id}/resume",
        "job_resume",
        "jobs",
        "Resumes a paused job from now.",
        None,
        (200, "Job"),
    ),
    with_query(
        op(
            "post",
            "/api/jobs/{id}/run",
            "job_run",
            "jobs",
            "Runs a job now, outside its schedule; 202 at once, or its report with wait=true.",
            None,
            (202, "JobRun"),
        ),
        &[(
            "wait",
            "boolean",
            "Wait for the run and answer with its report (200).",
        )],
    ),
    op(
        "get",
        "/api/pairing",
        "pairing",
        "pairing",
        "Pending pairing requests (never their codes), approved users, locked platforms.",
        None,
        (200, "Pairing"),
    ),
    op(
        "post",
        "/api/pairing/approve",
        "pairing_approve",
        "pairing",
        "Approves the user who was shown a code.",
        Some("PairingApprove"),
        (200, "Object"),
    ),
    op(
        "post",
        "/api/pairing/deny",
        "pairing_deny",
        "pairing",
        "Drops a user's pending request.",
        Some("PairingUser"),
        (200, "Object"),
    ),
    op(
        "post",
        "/api/pairing/revoke",
        "pairing_revoke",
        "pairing",
        "Revokes an approved user.",
        Some("PairingUser"),
        (200, "Object"),
    ),
    op(
        "get",
        "/api/config",
        "config",
        "ops",
        "The effective configuration as `talaria config show` prints it (secrets masked), with the errors and warnings `talaria config check` reports.",
        None,
        (200, "Config"),
    ),
    with_query(
        op(
            "get",
            "/api/logs",
            "logs",
            "ops",
            "The last lines of a log file in $TALARIA_HOME/logs/, oldest first, optionally filtered.",
            None,
            (200, "LogTail"),
        ),
        &[
            (
                "lines",
                "integer",
                "Lines to return: 0 to 1000, default 200.",
            ),
            (
                "filter",
                "string",
                "Only lines containing this text (any case).",
            ),
            (
                "level",
                "string",
                "Only lines at this level or above: trace, debug, info, warn, error.",
            ),
            (
                "file",
                "string",
                "A file name from /api/logs/files; default gateway.log, else the log written last.",
            ),
        ],
    ),
    op(
        "get",
        "/api/logs/files",
        "log_files",
        "ops",
        "The files in $TALARIA_HOME/logs/ with their sizes.",
        None,
        (200, "LogFiles"),
    ),
];

/// A schema reference.
fn schema(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// The named schemas the operations refer to. Loose where the shape is
/// OpenAI's (the SDKs define those) or grows often.
fn schemas() -> Value {
    let object = json!({"type": "object"});
    let string = json!({"type": "string"});
    let nullable_string = json!({"type": ["string", "null"]});
    let number = json!({"type": "number"});
    let integer = json!({"type": "integer"});
    let mut all = Map::new();
    all.insert("Object".into(), object.clone());
    all.insert(
        "Error".into(),
        json!({
            "type": "object",
            "required": ["error"],
            "properties": {"error": {
                "type": "object",
                "required": ["message", "type"],
                "properties": {"message": string, "type": string, "code": nullable_string},
            }},
        }),
    );
    all.insert(
        "Health".into(),
        json!({"type": "object", "required": ["status", "platform", "version"], "properties": {
            "status": string, "platform": string, "version": string}}),
    );
    all.insert(
        "Readiness".into(),
        json!({"type": "object", "required": ["ready", "waiting"], "properties": {
            "ready": {"type": "boolean"}, "waiting": {"type": "array", "items": string}}}),
    );
    all.insert(
        "MetricsText".into(),
        json!({"type": "string", "description": "text/plain; version=0.0.4"}),
    );
    all.insert(
        "DetailedHealth".into(),
        json!({"type": "object", "properties": {
            "status": string, "platform": string, "version": string, "pid": integer,
            "platforms": object, "nodes": {"type": "array", "items": object},
            "ledger": object, "cron": object, "running_turns": object}}),
    );
    all.insert(
        "Capabilities".into(),
        json!({"type": "object", "required": ["object", "features", "endpoints"], "properties": {
            "object": string, "platform": string, "version": string, "model": string,
            "auth": object, "runtime": object, "features": object, "endpoints": object}}),
    );
    all.insert("SkillList".into(), json!({"type": "object", "properties": {"object": string, "data": {"type": "array", "items": {
            "type": "object", "properties": {"name": string, "description": string, "category": string, "origin": string}}}}}));
    all.insert("ToolsetList".into(), json!({"type": "object", "properties": {"object": string, "platform": string, "data": {"type": "array", "items": {
            "type": "object", "properties": {"name": string, "enabled": {"type": "boolean"},
            "tools": {"type": "array", "items": string}, "available_tools": {"type": "array", "items": string}}}}}}));
    all.insert("ModelList".into(), json!({"type": "object", "properties": {"object": string, "data": {"type": "array", "items": schema("Model")}}}));
    all.insert("Model".into(), json!({"type": "object", "properties": {"id": string, "object": string, "created": integer, "owned_by": string}}));
    all.insert("ChatCompletionRequest".into(), object.clone());
    all.insert("ChatCompletion".into(), object.clone());
    all.insert("ResponseRequest".into(), object.clone());
    all.insert("Response".into(), object.clone());
    all.insert("RunRequest".into(), object.clone());
    all.insert("Run".into(), object.clone());
    all.insert("ApprovalRequest".into(), object.clone());
    all.insert("SessionChatRequest".into(), object.clone());
    all.insert(
        "EventStream".into(),
        json!({"type": "string", "description": "text/event-stream"}),
    );
    all.insert("Deleted".into(), json!({"type": "object", "properties": {"object": string, "id": string, "deleted": {"type": "boolean"}}}));
    all.insert("Session".into(), json!({"type": "object", "required": ["id", "object", "source", "started_at", "message_count"], "properties": {
            "id": string, "object": string, "source": string, "title": nullable_string, "model": nullable_string,
            "started_at": number, "ended_at": {"type": ["number", "null"]}, "end_reason": nullable_string,
            "message_count": integer, "parent_session_id": nullable_string,
            "input_tokens": integer, "output_tokens": integer, "cache_read_tokens": integer,
            "cache_write_tokens": integer, "reasoning_tokens": integer, "cost_usd": number,
            "has_system_prompt": {"type": "boolean"},
            "match": {"type": "object", "properties": {"message_id": integer, "role": string, "snippet": string}}}}));
    all.insert(
        "SessionEnvelope".into(),
        json!({"type": "object", "properties": {"object": string, "session": schema("Session"),
            "forked_from": string, "copied_messages": integer}}),
    );
    all.insert("SessionList".into(), json!({"type": "object", "properties": {"object": string, "data": {"type": "array", "items": schema("Session")},
            "limit": integer, "offset": integer, "has_more": {"type": "boolean"}}}));
    all.insert(
        "SessionBody".into(),
        json!({"type": "object", "additionalProperties": false, "properties": {"title": string}}),
    );
    all.insert("Message".into(), json!({"type": "object", "properties": {"id": integer, "session_id": string,
            "role": {"enum": ["system", "user", "assistant", "tool"]}, "content": string,
            "tool_calls": {"type": ["array", "null"], "items": {"type": "object", "properties": {
                "id": string, "type": string, "function": {"type": "object", "properties": {"name": string, "arguments": string}}}}},
            "tool_call_id": nullable_string, "tool_name": nullable_string, "finish_reason": nullable_string,
            "reasoning": nullable_string, "timestamp": number, "token_count": {"type": ["integer", "null"]}}}));
    all.insert(
        "MessageList".into(),
        json!({"type": "object", "properties": {"object": string, "session_id": string,
            "data": {"type": "array", "items": schema("Message")}, "has_more": {"type": "boolean"},
            "next_after": {"type": ["integer", "null"]}}}),
    );
    all.insert("Job".into(), json!({"type": "object", "properties": {"id": string, "object": string, "name": string,
            "prompt": nullable_string, "skills": {"type": "array", "items": string}, "schedule": string,
            "deliver": {"type": "array", "items": string}, "repeat": {"type": ["integer", "null"]},
            "completed": integer, "state": {"enum": ["scheduled", "paused", "completed"]},
            "misfire": {"enum": ["run_once", "skip"]}, "next_run_at": {"type": ["integer", "null"]},
            "created_at": number, "updated_at": number, "last_run_at": {"type": ["number", "null"]},
            "last_status": nullable_string, "last_error": nullable_string}}));
    all.insert("JobList".into(), json!({"type": "object", "properties": {"object": string, "data": {"type": "array", "items": schema("Job")}}}));
    all.insert("NewJob".into(), json!({"type": "object", "additionalProperties": false, "required": ["schedule"], "properties": {
            "schedule": string, "name": string, "prompt": string, "skills": {"type": "array", "items": string},
            "deliver": {"type": "array", "items": string}, "repeat": integer, "misfire": {"enum": ["run_once", "skip"]}}}));
    all.insert("JobChanges".into(), json!({"type": "object", "additionalProperties": false, "properties": {
            "schedule": string, "name": string, "prompt": string, "skills": {"type": "array", "items": string},
            "deliver": {"type": "array", "items": string}, "repeat": {"type": ["integer", "null"]},
            "misfire": {"enum": ["run_once", "skip"]}}}));
    all.insert("JobRun".into(), json!({"type": "object", "properties": {"object": string, "job_id": string, "job_name": string,
            "status": string, "session_id": string, "answer": string, "error": nullable_string}}));
    all.insert("Pairing".into(), json!({"type": "object", "properties": {"object": string,
            "pending": {"type": "array", "items": object}, "approved": {"type": "array", "items": object},
            "lockouts": {"type": "array", "items": object}}}));
    all.insert(
        "PairingApprove".into(),
        json!({"type": "object", "additionalProperties": false, "required": ["platform", "code"],
            "properties": {"platform": string, "code": string}}),
    );
    all.insert(
        "PairingUser".into(),
        json!({"type": "object", "additionalProperties": false, "required": ["platform", "user_id"],
            "properties": {"platform": string, "user_id": string}}),
    );
    all.insert(
        "MemoryTarget".into(),
        json!({"type": "object", "properties": {
            "target": {"enum": ["memory", "user"]}, "file": string,
            "entries": {"type": "array", "items": string}, "entry_count": integer,
            "chars_used": integer, "char_limit": integer, "usage_percent": integer}}),
    );
    all.insert(
        "Memory".into(),
        json!({"type": "object", "properties": {"object": string,
            "enabled": {"type": "boolean"}, "delimiter": string,
            "targets": {"type": "array", "items": schema("MemoryTarget")}, "message": string}}),
    );
    all.insert("MemoryChange".into(), json!({"type": "object", "additionalProperties": false,
            "required": ["action", "target"], "properties": {
            "action": {"enum": ["add", "replace", "remove"]}, "target": {"enum": ["memory", "user"]},
            "content": string, "old_text": string}}));
    all.insert(
        "Skill".into(),
        json!({"type": "object", "properties": {"object": string,
            "name": string, "description": string, "category": string,
            "origin": {"enum": ["user", "bundled"]}, "read_only": {"type": "boolean"},
            "content": string, "files": {"type": "array", "items": string},
            "files_truncated": {"type": "boolean"}, "message": string}}),
    );
    all.insert("NewSkill".into(), json!({"type": "object", "additionalProperties": false,
            "required": ["name", "content"], "properties": {"name": string, "content": string, "category": string}}));
    all.insert(
        "SkillContent".into(),
        json!({"type": "object", "additionalProperties": false,
            "required": ["content"], "properties": {"content": string}}),
    );
    all.insert(
        "LearningEntry".into(),
        json!({"type": "object", "properties": {
            "at": string, "actor": string, "action": string, "target": string, "path": string,
            "before": nullable_string, "after": nullable_string}}),
    );
    all.insert(
        "LearningLog".into(),
        json!({"type": "object", "properties": {"object": string,
            "data": {"type": "array", "items": schema("LearningEntry")},
            "limit": integer, "offset": integer, "has_more": {"type": "boolean"}}}),
    );
    all.insert("Rollback".into(), json!({"type": "object", "additionalProperties": false, "properties": {
            "skill": string, "memory": {"enum": ["memory", "user"]},
            "to": {"type": "string", "description": "a version's hash from the log; omitted: one step back"}}}));
    all.insert(
        "RollbackResult".into(),
        json!({"type": "object", "properties": {"object": string,
            "target": string, "message": string, "from": nullable_string, "to": nullable_string,
            "skill": {"oneOf": [schema("Skill"), {"type": "null"}]}, "memory": schema("Memory")}}),
    );
    all.insert("LearningGraph".into(), object.clone());
    all.insert("Config".into(), json!({"type": "object", "properties": {"object": string,
            "path": nullable_string, "config_file": string, "config": {"type": ["object", "null"]},
            "from_env": {"type": "array", "items": {"type": "object", "properties": {
                "key": string, "var": string, "shown": string, "origin": string, "overrode": {"type": "boolean"}}}},
            "model": {"type": ["object", "null"], "properties": {"provider": string, "model": string,
                "base_url": string, "api_key": nullable_string, "fallbacks": {"type": "array", "items": object}}},
            "platforms": {"type": "array", "items": string},
            "findings": {"type": "object", "properties": {
                "errors": {"type": "array", "items": string}, "warnings": {"type": "array", "items": string}}}}}));
    all.insert(
        "LogTail".into(),
        json!({"type": "object", "properties": {"object": string,
            "file": nullable_string, "size": integer, "lines": {"type": "array", "items": string},
            "truncated": {"type": "boolean"}}}),
    );
    all.insert(
        "LogFiles".into(),
        json!({"type": "object", "properties": {"object": string,
            "data": {"type": "array", "items": {"type": "object", "properties": {
                "name": string, "size": integer, "modified": number}}},
            "has_more": {"type": "boolean"}}}),
    );
    Value::Object(all)
}

fn error_response(description: &str) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": schema("Error")}}})
}

fn operation(o: &Operation) -> Value {
    let mut parameters: Vec<Value> = Vec::new();
    // Every `{name}` segment of the path is a parameter.
    let params: Vec<&str> = o
        .path
        .split('/')
        .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
        .collect();
    for name in &params {
        parameters.push(
            json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}),
        );
    }
    for (name, kind, description) in o.query {
        parameters.push(json!({"name": name, "in": "query", "required": false,
            "description": description, "schema": {"type": kind}}));
    }
    let (status, body) = o.ok;
    let media = if body == "EventStream" {
        "text/event-stream"
    } else {
        "application/json"
    };
    let mut responses = Map::new();
    responses.insert(
        status.to_string(),
        json!({"description": "Success", "content": {media: {"schema": schema(body)}}}),
    );
    responses.insert("400".into(), error_response("The request is not valid"));
    let public = PUBLIC.contains(&o.path);
    if !public {
        responses.insert("401".into(), error_response("Missing or wrong API key"));
    }
    if !params.is_empty() {
        responses.insert("404".into(), error_response("No such id"));
    }
    let mut v = json!({
        "operationId": o.id,
        "summary": o.summary,
        "tags": [o.tag],
        "parameters": parameters,
        "responses": responses,
    });
    if let Some(body) = o.body {
        v["requestBody"] =
            json!({"required": true, "content": {"application/json": {"schema": schema(body)}}});
    }
    if public {
        v["security"] = json!([]);
    }
    v
}

/// The whole description.
pub(crate) fn describe() -> Value {
    let mut paths = Map::new();
    for o in OPERATIONS {
        let entry = paths
            .entry(o.path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        entry[o.method] = operation(o);
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Talaria API server",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "OpenAI-compatible chat, responses and runs, and REST for sessions, \
                            cron jobs, pairing, skills, memory, the learning log, toolsets, the \
                            configuration and the logs. Errors are OpenAI's \
                            {\"error\": {\"message\", \"type\", \"code\"}}.",
        },
        "security": [{"bearerAuth": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
            "schemas": schemas(),
        },
    })
}

/// `GET /openapi.json`.
pub(super) async fn document(State(_state): State<Arc<AppState>>) -> Response {
    Json(describe()).into_response()
}
