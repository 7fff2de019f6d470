//! Reading the session database of hermes-agent, Talaria's Python
//! ancestor (`~/.hermes/state.db`), for `talaria import hermes`.
//!
//! The file is opened read-only and never changed. Its shape is checked
//! first, column by column, so a database of an unknown version fails with
//! the table and column that are missing rather than with half a result.
//! Columns later versions added (`title`, `active`, the token counters)
//! are read when present and taken as empty when not.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags, Row};
use talaria_core::{Message, Role, ToolCall};

use crate::{ImportedMessage, Result, SessionRecord, StoreError};

/// Columns without which a session cannot be brought over.
const SESSION_REQUIRED: &[&str] = &["id", "source", "started_at"];
/// Columns without which a transcript cannot be brought over.
const MESSAGE_REQUIRED: &[&str] = &["id", "session_id", "role", "content", "timestamp"];

/// The roles Talaria keeps; rows of any other are left out.
const KEPT_ROLES: &str = "('user', 'assistant', 'tool')";

/// Every session of the ancestor's database, oldest first, without its
/// transcript (read one session at a time with [`HermesDb::transcript`],
/// so an import holds one conversation in memory, never all of them), and
/// how many rows will be left out.
#[derive(Debug, Default)]
pub struct HermesSessions {
    /// The sessions, in the order they were started.
    pub sessions: Vec<HermesSession>,
    /// Rows with a role other than user, assistant or tool.
    pub skipped_rows: usize,
}

/// One session of the ancestor's database.
#[derive(Debug)]
pub struct HermesSession {
    /// The session row, without the ancestor's system prompt (it describes
    /// the ancestor's tools and home; Talaria writes its own).
    pub record: SessionRecord,
    /// Rows of its transcript that will be brought over.
    pub messages: usize,
}

/// The hermes-agent session database at a path, opened read-only and
/// checked to have the shape this reader knows.
pub struct HermesDb {
    conn: Connection,
    path: PathBuf,
    session_sql: String,
    message_sql: String,
}

impl HermesDb {
    /// Opens `path` without ever writing to it; a database of an unknown
    /// shape is refused naming the table and column that are missing.
    pub fn open(path: &Path) -> Result<HermesDb> {
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
            "SELECT id, source, {}, {}, {}, {}, {}, {}, {}, started_at, {}, {}, {}, {}, {}, {}, {} \
             FROM sessions ORDER BY started_at, id",
            optional(&session_cols, "session_key"),
            optional(&session_cols, "chat_id"),
            optional(&session_cols, "user_id"),
            optional(&session_cols, "thread_id"),
            optional(&session_cols, "title"),
            optional(&session_cols, "model"),
            optional(&session_cols, "parent_session_id"),
            optional(&session_cols, "ended_at"),
            optional(&session_cols, "end_reason"),
            optional(&session_cols, "input_tokens"),
            optional(&session_cols, "output_tokens"),
            optional(&session_cols, "cache_read_tokens"),
            optional(&session_cols, "cache_write_tokens"),
            optional(&session_cols, "reasoning_tokens"),
        );
        // `reasoning_content` is where later versions keep what the
        // provider called its reasoning; the older `reasoning` wins when
        // both are set.
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
             FROM messages WHERE session_id = ?1 AND role IN {KEPT_ROLES} ORDER BY id",
            optional(&message_cols, "tool_call_id"),
            optional(&message_cols, "tool_calls"),
            optional(&message_cols, "tool_name"),
            optional(&message_cols, "finish_reason"),
            optional(&message_cols, "active"),
        );
        Ok(HermesDb {
            conn,
            path: path.to_owned(),
            session_sql,
            message_sql,
        })
    }

    /// Every session, oldest first, with how many of its rows will be
    /// brought over; and how many rows will not.
    pub fn sessions(&self) -> Result<HermesSessions> {
        let path = &self.path;
        let mut counts: HashMap<String, usize> = HashMap::new();
        let mut skipped_rows = 0;
        {
            let mut stmt = self
                .conn
                .prepare(&format!(
                    "SELECT session_id, role IN {KEPT_ROLES}, COUNT(*) FROM messages \
                     GROUP BY session_id, role IN {KEPT_ROLES}"
                ))
                .map_err(|e| foreign(path, &e))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((
                        r.get::<_, Option<String>>(0)?,
                        r.get::<_, bool>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })
                .map_err(|e| foreign(path, &e))?;
            for row in rows {
                let (session, kept, n) = row.map_err(|e| foreign(path, &e))?;
                let n = usize::try_from(n).unwrap_or(0);
                match (session, kept) {
                    (Some(session), true) => *counts.entry(session).or_default() += n,
                    _ => skipped_rows += n,
                }
            }
        }
        let mut stmt = self
            .conn
            .prepare(&self.session_sql)
            .map_err(|e| foreign(path, &e))?;
        let rows = stmt
            .query_map([], session_row)
            .map_err(|e| foreign(path, &e))?;
        let mut sessions = Vec::new();
        for row in rows {
            let record = row.map_err(|e| foreign(path, &e))?;
            let messages = counts.get(&record.id).copied().unwrap_or(0);
            sessions.push(HermesSession { record, messages });
        }
        Ok(HermesSessions {
            sessions,
            skipped_rows,
        })
    }

    /// The transcript of session `id`, in order.
    pub fn transcript(&self, id: &str) -> Result<Vec<ImportedMessage>> {
        let path = &self.path;
        let mut stmt = self
            .conn
            .prepare_cached(&self.message_sql)
            .map_err(|e| foreign(path, &e))?;
        let rows = stmt
            .query_map([id], raw_message)
            .map_err(|e| foreign(path, &e))?;
        let mut out = Vec::new();
        for row in rows {
            let raw = row.map_err(|e| foreign(path, &e))?;
            // The query asks only for kept roles.
            out.extend(raw.into_message());
        }
        Ok(out)
    }
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
        parent_session_id: r.get(8)?,
        started_at: r.get(9)?,
        ended_at: r.get(10)?,
        end_reason: r.get(11)?,
        input_tokens: count(r.get(12)?),
        output_tokens: count(r.get(13)?),
        cache_read_tokens: count(r.get(14)?),
        cache_write_tokens: count(r.get(15)?),
        reasoning_tokens: count(r.get(16)?),
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
    fn sessions_are_listed_with_counts_and_transcripts_read_one_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE sessions (id TEXT, source TEXT, started_at REAL, system_prompt TEXT);
             CREATE TABLE messages (id INTEGER PRIMARY KEY, session_id TEXT, role TEXT,
                                    content TEXT, timestamp REAL);
             INSERT INTO sessions VALUES ('b', 'cli', 2.0, 'their prompt'), ('a', 'telegram', 1.0, NULL);
             INSERT INTO messages (session_id, role, content, timestamp) VALUES
               ('a', 'system', 'sys', 1.0), ('a', 'user', 'hi', 1.1), ('a', 'assistant', 'hello', 1.2),
               ('b', 'user', 'q', 2.1), ('b', 'session_meta', '{}', 2.2), ('b', 'tool', 'out', 2.3);",
        )
        .unwrap();
        drop(conn);
        let db = HermesDb::open(&path).unwrap();
        let listed = db.sessions().unwrap();
        let shown: Vec<(&str, usize, Option<&str>)> = listed
            .sessions
            .iter()
            .map(|s| {
                (
                    s.record.id.as_str(),
                    s.messages,
                    s.record.system_prompt.as_deref(),
                )
            })
            .collect();
        assert_eq!(shown, [("a", 2, None), ("b", 2, None)]);
        assert_eq!(listed.skipped_rows, 2);
        let a: Vec<String> = db
            .transcript("a")
            .unwrap()
            .into_iter()
            .map(|m| m.message.content)
            .collect();
        assert_eq!(a, ["hi", "hello"]);
        assert_eq!(db.transcript("b").unwrap().len(), 2);
        assert!(db.transcript("nope").unwrap().is_empty());
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
        let err = HermesDb::open(&path)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("table `sessions` has no column `source`"),
            "{err}"
        );
    }
}
