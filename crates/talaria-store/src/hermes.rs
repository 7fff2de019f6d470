//! Reading the session database of hermes-agent, Talaria's Python
//! ancestor (`~/.hermes/state.db`), for `talaria import hermes`.
//!
//! The file is opened read-only and never changed. Its shape is checked
//! first, column by column, so a database of an unknown version fails with
//! the table and column that are missing rather than with half a result.
//! Columns later versions added (`title`, `active`, the token counters)
//! are read when present and taken as empty when not.

use std::collections::HashSet;
use std::path::Path;

use rusqlite::{Connection, OpenFlags, Row};
use talaria_core::{Message, Role, ToolCall};

use crate::{ImportedMessage, ImportedSession, Result, SessionRecord, StoreError};

/// Columns without which a session cannot be brought over.
const SESSION_REQUIRED: &[&str] = &["id", "source", "started_at"];
/// Columns without which a transcript cannot be brought over.
const MESSAGE_REQUIRED: &[&str] = &["id", "session_id", "role", "content", "timestamp"];

/// Every session of the ancestor's database, oldest first, with its
/// transcript, and how many rows were left out (roles Talaria has no
/// place for).
#[derive(Debug, Default)]
pub struct HermesSessions {
    /// The sessions, in the order they were started.
    pub sessions: Vec<ImportedSession>,
    /// Rows with a role other than user, assistant or tool.
    pub skipped_rows: usize,
}

/// Reads every session and message of the hermes-agent database at
/// `path`, without writing to it.
pub fn read_sessions(path: &Path) -> Result<HermesSessions> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| foreign(path, &e))?;
    // A writer (the ancestor still running) may hold the file briefly.
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(|e| foreign(path, &e))?;
    let session_cols = columns(&conn, path, "sessions")?;
    let message_cols = columns(&conn, path, "messages")?;
    require(path, "sessions", &session_cols, SESSION_REQUIRED)?;
    require(path, "messages", &message_cols, MESSAGE_REQUIRED)?;

    let optional = |cols: &HashSet<String>, name: &str| {
        if cols.contains(name) {
            name.to_owned()
        } else {
            format!("NULL AS {name}")
        }
    };
    let session_sql = format!(
        "SELECT id, source, {}, {}, {}, {}, {}, {}, {}, {}, started_at, {}, {}, {}, {}, {}, {}, {} \
         FROM sessions ORDER BY started_at, id",
        optional(&session_cols, "session_key"),
        optional(&session_cols, "chat_id"),
        optional(&session_cols, "user_id"),
        optional(&session_cols, "thread_id"),
        optional(&session_cols, "title"),
        optional(&session_cols, "model"),
        optional(&session_cols, "system_prompt"),
        optional(&session_cols, "parent_session_id"),
        optional(&session_cols, "ended_at"),
        optional(&session_cols, "end_reason"),
        optional(&session_cols, "input_tokens"),
        optional(&session_cols, "output_tokens"),
        optional(&session_cols, "cache_read_tokens"),
        optional(&session_cols, "cache_write_tokens"),
        optional(&session_cols, "reasoning_tokens"),
    );
    let mut sessions = Vec::new();
    {
        let mut stmt = conn.prepare(&session_sql).map_err(|e| foreign(path, &e))?;
        let rows = stmt
            .query_map([], session_row)
            .map_err(|e| foreign(path, &e))?;
        for row in rows {
            sessions.push(ImportedSession {
                record: row.map_err(|e| foreign(path, &e))?,
                messages: Vec::new(),
            });
        }
    }

    // `reasoning_content` is where later versions keep what the provider
    // called its reasoning; the older `reasoning` wins when both are set.
    let reasoning = match (
        message_cols.contains("reasoning"),
        message_cols.contains("reasoning_content"),
    ) {
        (true, true) => "COALESCE(reasoning, reasoning_content)",
        (true, false) => "reasoning",
        (false, true) => "reasoning_content",
        (false, false) => "NULL",
    };
    let message_sql = format!(
        "SELECT role, content, {}, {}, {}, timestamp, {}, {reasoning}, {} \
         FROM messages WHERE session_id = ?1 ORDER BY id",
        optional(&message_cols, "tool_call_id"),
        optional(&message_cols, "tool_calls"),
        optional(&message_cols, "tool_name"),
        optional(&message_cols, "finish_reason"),
        optional(&message_cols, "active"),
    );
    let mut stmt = conn.prepare(&message_sql).map_err(|e| foreign(path, &e))?;
    let mut skipped_rows = 0;
    for session in &mut sessions {
        let rows = stmt
            .query_map([&session.record.id], raw_message)
            .map_err(|e| foreign(path, &e))?;
        for row in rows {
            let raw = row.map_err(|e| foreign(path, &e))?;
            match raw.into_message() {
                Some(message) => session.messages.push(message),
                None => skipped_rows += 1,
            }
        }
    }
    Ok(HermesSessions {
        sessions,
        skipped_rows,
    })
}

fn foreign(path: &Path, e: &rusqlite::Error) -> StoreError {
    StoreError::Database(format!("cannot read {}: {e}", path.display()))
}

/// The column names of `table`; an error naming the table when it is not
/// there.
fn columns(conn: &Connection, path: &Path, table: &str) -> Result<HashSet<String>> {
    let mut stmt = conn
        .prepare("SELECT name FROM pragma_table_info(?1)")
        .map_err(|e| foreign(path, &e))?;
    let names = stmt
        .query_map([table], |r| r.get::<_, String>(0))
        .map_err(|e| foreign(path, &e))?
        .collect::<std::result::Result<HashSet<_>, _>>()
        .map_err(|e| foreign(path, &e))?;
    if names.is_empty() {
        return Err(StoreError::Database(format!(
            "{} is not a hermes-agent session database this version knows: it has no `{table}` table",
            path.display()
        )));
    }
    Ok(names)
}

fn require(path: &Path, table: &str, have: &HashSet<String>, need: &[&str]) -> Result<()> {
    let missing: Vec<&str> = need
        .iter()
        .copied()
        .filter(|c| !have.contains(*c))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(StoreError::Database(format!(
        "{} is not a hermes-agent session database this version knows: table `{table}` has no column {}",
        path.display(),
        missing
            .iter()
            .map(|c| format!("`{c}`"))
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

fn count(value: Option<i64>) -> u64 {
    value.and_then(|v| u64::try_from(v).ok()).unwrap_or(0)
}

fn session_row(r: &Row<'_>) -> rusqlite::Result<SessionRecord> {
    Ok(SessionRecord {
        id: r.get(0)?,
        source: r.get(1)?,
        session_key: r.get(2)?,
        chat_id: r.get(3)?,
        user_id: r.get(4)?,
        thread_id: r.get(5)?,
        title: r.get(6)?,
        model: r.get(7)?,
        system_prompt: r.get(8)?,
        parent_session_id: r.get(9)?,
        started_at: r.get(10)?,
        ended_at: r.get(11)?,
        end_reason: r.get(12)?,
        input_tokens: count(r.get(13)?),
        output_tokens: count(r.get(14)?),
        cache_read_tokens: count(r.get(15)?),
        cache_write_tokens: count(r.get(16)?),
        reasoning_tokens: count(r.get(17)?),
        ..SessionRecord::default()
    })
}

/// A message row as the ancestor stored it.
struct RawMessage {
    role: String,
    content: Option<String>,
    tool_call_id: Option<String>,
    tool_calls: Option<String>,
    tool_name: Option<String>,
    timestamp: f64,
    finish_reason: Option<String>,
    reasoning: Option<String>,
    active: Option<i64>,
}

fn raw_message(r: &Row<'_>) -> rusqlite::Result<RawMessage> {
    Ok(RawMessage {
        role: r.get(0)?,
        content: r.get(1)?,
        tool_call_id: r.get(2)?,
        tool_calls: r.get(3)?,
        tool_name: r.get(4)?,
        timestamp: r.get(5)?,
        finish_reason: r.get(6)?,
        reasoning: r.get(7)?,
        active: r.get(8)?,
    })
}

impl RawMessage {
    /// The row as Talaria stores it; `None` for a role it has no place
    /// for. System rows are among those: Talaria writes its own system
    /// prompt for a session, and a second one inside the transcript would
    /// go to the model as well.
    fn into_message(self) -> Option<ImportedMessage> {
        let role = match self.role.as_str() {
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            _ => return None,
        };
        let tool_calls = self
            .tool_calls
            .as_deref()
            .map(parse_tool_calls)
            .unwrap_or_default();
        let mut message = Message {
            role,
            content: self.content.unwrap_or_default(),
            tool_calls,
            tool_call_id: self.tool_call_id,
            tool_name: self.tool_name,
            reasoning: self.reasoning.filter(|r| !r.is_empty()),
            finish_reason: self.finish_reason,
            media: Vec::new(),
            thinking: Vec::new(),
        };
        if message.role != Role::Tool {
            message.tool_call_id = None;
        }
        Some(ImportedMessage {
            message,
            timestamp: self.timestamp,
            active: self.active.is_none_or(|a| a != 0),
        })
    }
}

/// The ancestor's `tool_calls` column: the OpenAI list
/// (`[{"id", "type": "function", "function": {"name", "arguments"}}]`),
/// arguments as a JSON string or, from some providers, as an object.
/// Entries without a name are left out: no provider accepts them back.
fn parse_tool_calls(text: &str) -> Vec<ToolCall> {
    let Ok(serde_json::Value::Array(items)) = serde_json::from_str(text) else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let function = item.get("function").unwrap_or(item);
            let name = function.get("name")?.as_str()?.to_owned();
            let id = item
                .get("id")
                .or_else(|| item.get("call_id"))
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_owned();
            let arguments = match function.get("arguments") {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(serde_json::Value::Null) | None => "{}".to_owned(),
                Some(other) => other.to_string(),
            };
            Some(ToolCall {
                id,
                name,
                arguments,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_calls_come_with_string_or_object_arguments() {
        let calls = parse_tool_calls(
            r#"[{"id":"c1","type":"function","function":{"name":"memory","arguments":"{\"a\":1}"}},
                {"id":"c2","function":{"name":"skill_view","arguments":{"name":"x"}}},
                {"id":"c3","function":{}}]"#,
        );
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, r#"{"a":1}"#);
        assert_eq!(calls[1].arguments, r#"{"name":"x"}"#);
    }

    #[test]
    fn a_database_without_a_needed_column_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE sessions (id TEXT, started_at REAL);
             CREATE TABLE messages (id INTEGER, session_id TEXT, role TEXT, content TEXT, timestamp REAL);",
        )
        .unwrap();
        drop(conn);
        let err = read_sessions(&path).unwrap_err().to_string();
        assert!(
            err.contains("table `sessions` has no column `source`"),
            "{err}"
        );
    }
}
