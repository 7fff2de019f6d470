//! The `session_search` tool: recall from past sessions through the store's
//! full-text index. No model calls; it returns excerpts for the model to
//! read.
//!
//! Four shapes, picked by the arguments:
//! - discover (`query`): the best hit per past session, each with a few
//!   messages around it;
//! - scroll (`session_id` + `around_message_id`): a window of one session;
//! - read (`session_id`): one session's transcript, head and tail when long;
//! - browse (nothing): the most recent sessions.
//!
//! The current session (and the sessions it continues) is left out: its
//! content is already in the context window.

use std::collections::HashSet;

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_core::Role;
use talaria_store::{SearchQuery, SessionFilter, SessionRecord, StoredMessage};

use super::{Tool, ToolContext, ToolError, ToolResult, opt_str, opt_u64};

/// Sessions returned when the call gives no `limit`.
pub const DEFAULT_LIMIT: usize = 3;
/// Most sessions one call returns.
pub const MAX_LIMIT: usize = 10;
/// Messages either side of a hit in discover mode.
const HIT_WINDOW: usize = 5;
const DEFAULT_SCROLL_WINDOW: usize = 5;
const MAX_SCROLL_WINDOW: usize = 20;
/// Read mode shows all of a session up to this many messages...
const READ_ALL_UP_TO: usize = 30;
/// ...and otherwise this many from the start and the end.
const READ_HEAD: usize = 20;
const READ_TAIL: usize = 10;
/// Characters kept of each message; the anchor of a hit gets more.
const MESSAGE_CHARS: usize = 600;
const ANCHOR_CHARS: usize = 2000;
/// Parent links followed when finding a lineage root (guards against cycles).
const MAX_LINEAGE_HOPS: usize = 32;
/// Sources that are machinery, not conversations the user had.
const HIDDEN_SOURCES: &[&str] = &["subagent", "tool"];

fn store_error(e: talaria_store::StoreError) -> ToolError {
    ToolError::new(format!("session store error: {e}"))
}

fn when(ts: f64) -> String {
    let secs = ts.floor();
    let nanos = ((ts - secs) * 1e9).clamp(0.0, 999_999_999.0) as u32;
    if !secs.is_finite() || secs.abs() > 1e15 {
        return String::new();
    }
    chrono::DateTime::from_timestamp(secs as i64, nanos)
        .map(|d| d.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_default()
}

fn session_json(s: &SessionRecord) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("session_id".into(), json!(s.id));
    m.insert("when".into(), json!(when(s.started_at)));
    m.insert("source".into(), json!(s.source));
    if let Some(t) = &s.title {
        m.insert("title".into(), json!(t));
    }
    if let Some(model) = &s.model {
        m.insert("model".into(), json!(model));
    }
    m.insert("message_count".into(), json!(s.message_count));
    if let Some(p) = &s.parent_session_id {
        m.insert("parent_session_id".into(), json!(p));
    }
    m
}

fn message_json(m: &StoredMessage, anchor: bool, ctx: &ToolContext) -> Value {
    let limit = if anchor { ANCHOR_CHARS } else { MESSAGE_CHARS };
    let mut content = m.message.content.clone();
    if content.trim().is_empty() && !m.message.tool_calls.is_empty() {
        let names: Vec<&str> = m
            .message
            .tool_calls
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        content = format!("[called tools: {}]", names.join(", "));
    }
    let mut o = serde_json::Map::new();
    o.insert("id".into(), json!(m.id));
    o.insert("role".into(), json!(m.message.role.as_str()));
    if let Some(t) = &m.message.tool_name {
        o.insert("tool".into(), json!(t));
    }
    o.insert(
        "content".into(),
        json!(ctx.redactor.redact(&super::truncate_chars(&content, limit))),
    );
    if anchor {
        o.insert("anchor".into(), json!(true));
    }
    Value::Object(o)
}

/// Ids of the current session and every session it continues.
async fn current_lineage(ctx: &ToolContext) -> HashSet<String> {
    let mut ids = HashSet::new();
    let mut next = Some(ctx.session_id.clone());
    for _ in 0..MAX_LINEAGE_HOPS {
        let Some(id) = next.take() else { break };
        if !ids.insert(id.clone()) {
            break;
        }
        next = match ctx.store.session(&id).await {
            Ok(Some(s)) => s.parent_session_id,
            _ => None,
        };
    }
    ids
}

/// The root of `s`'s lineage and whether the lineage touches `exclude`.
async fn lineage_root(
    s: &SessionRecord,
    exclude: &HashSet<String>,
    ctx: &ToolContext,
) -> (String, bool) {
    let mut root = s.id.clone();
    let mut touches = exclude.contains(&s.id);
    let mut parent = s.parent_session_id.clone();
    let mut seen = HashSet::from([s.id.clone()]);
    for _ in 0..MAX_LINEAGE_HOPS {
        let Some(p) = parent.take() else { break };
        if !seen.insert(p.clone()) {
            break;
        }
        touches |= exclude.contains(&p);
        root = p.clone();
        parent = match ctx.store.session(&p).await {
            Ok(Some(rec)) => rec.parent_session_id,
            _ => None,
        };
    }
    (root, touches)
}

async fn discover(query: &str, limit: usize, ctx: &ToolContext) -> Result<Value, ToolError> {
    let exclude = current_lineage(ctx).await;
    let hits = ctx
        .store
        .search(SearchQuery {
            text: query.to_owned(),
            sources: Vec::new(),
            exclude_session: Some(ctx.session_id.clone()),
            // Room for hits that are filtered out below.
            limit: limit.saturating_mul(4).max(20),
        })
        .await
        .map_err(store_error)?;
    let searched = hits.len();
    let mut hits: Vec<_> = hits
        .into_iter()
        .filter(|h| !HIDDEN_SOURCES.contains(&h.session.source.as_str()))
        .collect();
    // Scheduled runs are rarely what the user means by "last time"; they go
    // last but are not dropped.
    hits.sort_by_key(|h| h.session.source == "cron");
    let mut roots = HashSet::new();
    let mut results = Vec::new();
    for hit in hits {
        if results.len() >= limit {
            break;
        }
        let (root, touches_current) = lineage_root(&hit.session, &exclude, ctx).await;
        if touches_current || !roots.insert(root) {
            continue;
        }
        let window = ctx
            .store
            .message_window(&hit.session.id, hit.message_id, HIT_WINDOW, HIT_WINDOW)
            .await
            .map_err(store_error)?;
        let messages: Vec<Value> = window
            .iter()
            .filter(|m| {
                m.id == hit.message_id || matches!(m.message.role, Role::User | Role::Assistant)
            })
            .map(|m| message_json(m, m.id == hit.message_id, ctx))
            .collect();
        let mut entry = session_json(&hit.session);
        entry.insert("matched_role".into(), json!(hit.role.as_str()));
        entry.insert("match_message_id".into(), json!(hit.message_id));
        entry.insert(
            "snippet".into(),
            json!(
                ctx.redactor
                    .redact(&super::truncate_chars(&hit.snippet, MESSAGE_CHARS))
            ),
        );
        entry.insert("messages".into(), Value::Array(messages));
        results.push(Value::Object(entry));
    }
    let count = results.len();
    let mut out = json!({
        "success": true,
        "mode": "discover",
        "query": query,
        "results": results,
        "count": count,
        "sessions_searched": searched,
    });
    if count == 0
        && let Some(o) = out.as_object_mut()
    {
        o.insert(
            "note".into(),
            json!("No past session matched. Try fewer or different words, a prefix (deploy*), or OR between alternatives."),
        );
    }
    Ok(out)
}

async fn browse(limit: usize, ctx: &ToolContext) -> Result<Value, ToolError> {
    let exclude = current_lineage(ctx).await;
    let sessions = ctx
        .store
        .list_sessions(SessionFilter {
            source: None,
            session_key: None,
            limit: limit.saturating_mul(5).max(30),
            offset: 0,
        })
        .await
        .map_err(store_error)?;
    let results: Vec<Value> = sessions
        .iter()
        .filter(|s| {
            !exclude.contains(&s.id)
                && s.parent_session_id.is_none()
                && !HIDDEN_SOURCES.contains(&s.source.as_str())
        })
        .take(limit)
        .map(|s| Value::Object(session_json(s)))
        .collect();
    Ok(json!({
        "success": true,
        "mode": "browse",
        "count": results.len(),
        "results": results,
        "note": "Pass a query to search message text, or a session_id to read one session.",
    }))
}

async fn refuse_current(session_id: &str, ctx: &ToolContext) -> Result<(), ToolError> {
    if current_lineage(ctx).await.contains(session_id) {
        return Err(ToolError::new(
            "that is the current conversation (or one it continues); its content is already \
             in your context",
        ));
    }
    Ok(())
}

async fn read(session_id: &str, ctx: &ToolContext) -> Result<Value, ToolError> {
    refuse_current(session_id, ctx).await?;
    let session = ctx
        .store
        .session(session_id)
        .await
        .map_err(store_error)?
        .ok_or_else(|| ToolError::new(format!("no session with id '{session_id}'")))?;
    let all = ctx.store.messages(session_id).await.map_err(store_error)?;
    let visible: Vec<&StoredMessage> = all
        .iter()
        .filter(|m| matches!(m.message.role, Role::User | Role::Assistant))
        .collect();
    let mut out = session_json(&session);
    out.insert("success".into(), json!(true));
    out.insert("mode".into(), json!("read"));
    let total = visible.len();
    if total > READ_ALL_UP_TO {
        let head: Vec<Value> = visible[..READ_HEAD]
            .iter()
            .map(|m| message_json(m, false, ctx))
            .collect();
        let tail: Vec<Value> = visible[total - READ_TAIL..]
            .iter()
            .map(|m| message_json(m, false, ctx))
            .collect();
        out.insert("messages".into(), Value::Array(head));
        out.insert(
            "omitted".into(),
            json!(format!(
                "{} messages in the middle are not shown; pass around_message_id (with this \
                 session_id) to scroll to them",
                total - READ_HEAD - READ_TAIL
            )),
        );
        out.insert("messages_end".into(), Value::Array(tail));
    } else {
        let msgs: Vec<Value> = visible
            .iter()
            .map(|m| message_json(m, false, ctx))
            .collect();
        out.insert("messages".into(), Value::Array(msgs));
    }
    Ok(Value::Object(out))
}

async fn scroll(
    session_id: &str,
    around: i64,
    window: usize,
    ctx: &ToolContext,
) -> Result<Value, ToolError> {
    refuse_current(session_id, ctx).await?;
    let msgs = ctx
        .store
        .message_window(session_id, around, window, window)
        .await
        .map_err(store_error)?;
    if msgs.is_empty() {
        return Err(ToolError::new(format!(
            "no messages around id {around} in session '{session_id}'"
        )));
    }
    let list: Vec<Value> = msgs
        .iter()
        .map(|m| message_json(m, m.id == around, ctx))
        .collect();
    Ok(json!({
        "success": true,
        "mode": "scroll",
        "session_id": session_id,
        "around_message_id": around,
        "messages": list,
    }))
}

/// The `session_search` tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct SessionSearchTool;

#[async_trait]
impl Tool for SessionSearchTool {
    fn name(&self) -> &str {
        "session_search"
    }

    fn description(&self) -> &str {
        "Recall past conversations. With query: full-text search (words are ANDed; use OR, \
         \"exact phrase\", prefix*), one best hit per session with surrounding messages. With \
         session_id: read that session (add around_message_id to scroll). With neither: list \
         recent sessions."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Words to search for in past messages."},
                "session_id": {"type": "string", "description": "Read this session instead of searching."},
                "around_message_id": {"type": "integer", "description": "With session_id: show messages around this message id."},
                "window": {"type": "integer", "minimum": 1, "maximum": MAX_SCROLL_WINDOW, "description": "With around_message_id: messages either side. Default 5."},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "description": "Most sessions to return. Default 3."}
            }
        })
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolResult {
        let query = opt_str(&args, "query")?
            .map(str::trim)
            .filter(|q| !q.is_empty());
        let session_id = opt_str(&args, "session_id")?
            .map(str::trim)
            .filter(|s| !s.is_empty());
        let limit = opt_u64(&args, "limit")?
            .unwrap_or(DEFAULT_LIMIT as u64)
            .clamp(1, MAX_LIMIT as u64) as usize;
        let around = match args.get("around_message_id").filter(|v| !v.is_null()) {
            None => None,
            Some(v) => Some(
                v.as_i64()
                    .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
                    .ok_or_else(|| {
                        ToolError::new("argument `around_message_id` must be an integer")
                    })?,
            ),
        };
        let window = opt_u64(&args, "window")?
            .unwrap_or(DEFAULT_SCROLL_WINDOW as u64)
            .clamp(1, MAX_SCROLL_WINDOW as u64) as usize;
        if let Some(id) = session_id {
            talaria_core::ids::validate_path_component(id)
                .map_err(|e| ToolError::new(format!("argument `session_id`: {e}")))?;
        }
        let value = match (session_id, around, query) {
            (Some(id), Some(a), _) => scroll(id, a, window, ctx).await?,
            (Some(id), None, _) => read(id, ctx).await?,
            (None, Some(_), _) => {
                return Err(ToolError::new(
                    "argument `around_message_id` needs `session_id` as well",
                ));
            }
            (None, None, Some(q)) => discover(q, limit, ctx).await?,
            (None, None, None) => browse(limit, ctx).await?,
        };
        Ok(value.to_string())
    }
}
