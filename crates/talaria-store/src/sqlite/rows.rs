//! Mapping between table rows and the crate's types.

use rusqlite::{Connection, OptionalExtension, Row, params};
use talaria_core::{Message, Role, ToolCall};

use super::conn::OpResult;
use crate::{SessionRecord, StoreError, StoredMessage, Timestamp};

/// Every row stored for a session, counted through the `messages_session`
/// index (no column holds it: see schema version 7). A macro so the two
/// constants below can share it.
macro_rules! message_count {
    () => {
        "(SELECT count(*) FROM messages WHERE messages.session_id = sessions.id)"
    };
}

/// [`message_count!`] as a constant, for other modules' queries.
pub(crate) const MESSAGE_COUNT: &str = message_count!();

/// Session columns in the order [`session_from_row`] reads them, for a
/// query over `sessions`.
pub(crate) const SESSION_COLUMNS: &str = concat!(
    "id, source, session_key, chat_id, user_id, thread_id, title, model, system_prompt, \
     parent_session_id, started_at, ended_at, end_reason, ",
    message_count!(),
    ", input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, \
     model_choice"
);

/// Message columns in the order [`message_from_row`] reads them.
pub(crate) const MESSAGE_COLUMNS: &str = "id, session_id, role, content, tool_call_id, \
     tool_calls, tool_name, timestamp, token_count, finish_reason, reasoning, active, media, thinking";

/// Now, as seconds since the epoch with microsecond precision.
pub(crate) fn now() -> Timestamp {
    talaria_core::unix_now()
}

/// SQLite integers are signed; counters beyond `i64::MAX` are not real, so
/// clamping is the honest conversion.
pub(crate) fn to_sql_count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The way back: this crate never writes a negative count, so one can only
/// come from a foreign writer and reads as zero rather than failing a read.
pub(crate) fn from_sql_count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// [`from_sql_count`] for counters kept as `u32` (attempts, failures):
/// beyond `u32::MAX` clamps, for the same reason as [`to_sql_count`].
pub(crate) fn from_sql_small_count(n: i64) -> u32 {
    u32::try_from(from_sql_count(n)).unwrap_or(u32::MAX)
}

pub(crate) fn session_from_row(row: &Row<'_>) -> rusqlite::Result<SessionRecord> {
    Ok(SessionRecord {
        id: row.get(0)?,
        source: row.get(1)?,
        session_key: row.get(2)?,
        chat_id: row.get(3)?,
        user_id: row.get(4)?,
        thread_id: row.get(5)?,
        title: row.get(6)?,
        model: row.get(7)?,
        system_prompt: row.get(8)?,
        parent_session_id: row.get(9)?,
        started_at: row.get(10)?,
        ended_at: row.get(11)?,
        end_reason: row.get(12)?,
        message_count: from_sql_count(row.get(13)?),
        input_tokens: from_sql_count(row.get(14)?),
        output_tokens: from_sql_count(row.get(15)?),
        cache_read_tokens: from_sql_count(row.get(16)?),
        cache_write_tokens: from_sql_count(row.get(17)?),
        reasoning_tokens: from_sql_count(row.get(18)?),
        model_choice: row.get(19)?,
    })
}

/// A message row before its role and tool calls are checked; those can fail
/// for reasons that are not SQLite's, so they are decoded afterwards.
pub(crate) struct RawMessage {
    id: i64,
    session_id: String,
    role: String,
    content: String,
    tool_call_id: Option<String>,
    tool_calls: Option<String>,
    tool_name: Option<String>,
    timestamp: Timestamp,
    token_count: Option<i64>,
    finish_reason: Option<String>,
    reasoning: Option<String>,
    active: bool,
    media: Option<String>,
    thinking: Option<String>,
}

pub(crate) fn message_from_row(row: &Row<'_>) -> rusqlite::Result<RawMessage> {
    Ok(RawMessage {
        id: row.get(0)?,
        session_id: row.get(1)?,
        role: row.get(2)?,
        content: row.get(3)?,
        tool_call_id: row.get(4)?,
        tool_calls: row.get(5)?,
        tool_name: row.get(6)?,
        timestamp: row.get(7)?,
        token_count: row.get(8)?,
        finish_reason: row.get(9)?,
        reasoning: row.get(10)?,
        active: row.get(11)?,
        media: row.get(12)?,
        thinking: row.get(13)?,
    })
}

pub(crate) fn parse_role(role: &str, message_id: i64) -> Result<Role, StoreError> {
    Role::parse(role).ok_or_else(|| {
        StoreError::Database(format!("message {message_id} has an unknown role `{role}`"))
    })
}

impl RawMessage {
    pub(crate) fn decode(self) -> Result<StoredMessage, StoreError> {
        let role = parse_role(&self.role, self.id)?;
        // A row whose tool calls cannot be read is reported rather than
        // silently emptied: dropping calls would orphan their tool results
        // and the provider would reject the replayed transcript.
        let tool_calls: Vec<ToolCall> = match self.tool_calls.as_deref() {
            None | Some("") => Vec::new(),
            Some(json) => serde_json::from_str(json).map_err(|e| {
                StoreError::Database(format!(
                    "message {} has unreadable tool_calls: {e}",
                    self.id
                ))
            })?,
        };
        Ok(StoredMessage {
            id: self.id,
            session_id: self.session_id,
            message: Message {
                role,
                content: self.content,
                tool_calls,
                tool_call_id: self.tool_call_id,
                tool_name: self.tool_name,
                reasoning: self.reasoning,
                finish_reason: self.finish_reason,
                media: crate::media::decode(self.media.as_deref(), self.id)?,
                thinking: crate::thinking::decode(self.thinking.as_deref(), self.id)?,
            },
            timestamp: self.timestamp,
            token_count: self.token_count.map(from_sql_count),
            active: self.active,
        })
    }
}

/// Runs a message query and decodes every row.
pub(crate) fn query_messages(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> OpResult<Vec<StoredMessage>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let raw = stmt
        .query_map(params, message_from_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(raw
        .into_iter()
        .map(RawMessage::decode)
        .collect::<Result<Vec<_>, _>>()?)
}

pub(crate) fn load_session(conn: &Connection, id: &str) -> OpResult<Option<SessionRecord>> {
    let sql = format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?1");
    Ok(conn
        .prepare_cached(&sql)?
        .query_row(params![id], session_from_row)
        .optional()?)
}

pub(crate) fn session_exists(conn: &Connection, id: &str) -> OpResult<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM sessions WHERE id = ?1")?
        .exists(params![id])?)
}

pub(crate) fn require_session(conn: &Connection, id: &str) -> OpResult<()> {
    if session_exists(conn, id)? {
        Ok(())
    } else {
        Err(StoreError::NoSuchSession(id.to_string()).into())
    }
}

/// Inserts one message row.
pub(crate) fn insert_message(
    conn: &Connection,
    session_id: &str,
    message: &Message,
    timestamp: Timestamp,
) -> OpResult<i64> {
    let tool_calls = if message.tool_calls.is_empty() {
        None
    } else {
        Some(
            serde_json::to_string(&message.tool_calls)
                .map_err(|e| StoreError::Database(format!("could not encode tool calls: {e}")))?,
        )
    };
    let media = crate::media::encode(&message.media)?;
    let thinking = crate::thinking::encode(&message.thinking)?;
    // Above the full-text watermark as well as every row: an id at or
    // below it would be taken for indexed and never reach the indexes.
    let watermark = indexed_through(conn)?;
    conn.prepare_cached(
        "INSERT INTO messages (id, session_id, role, content, tool_call_id, tool_calls, \
         tool_name, timestamp, finish_reason, reasoning, active, media, thinking) \
         VALUES (MAX(?10, COALESCE((SELECT MAX(id) FROM messages), 0)) + 1, \
         ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 1, ?11, ?12)",
    )?
    .execute(params![
        session_id,
        message.role.as_str(),
        message.content,
        message.tool_call_id,
        tool_calls,
        message.tool_name,
        timestamp,
        message.finish_reason,
        message.reasoning,
        watermark,
        media,
        thinking,
    ])?;
    let id = conn.last_insert_rowid();
    if id - watermark >= FTS_BATCH {
        index_pending(conn)?;
    }
    Ok(id)
}

/// Rows written between two runs of [`index_pending`] on the write path.
/// Each run adds one segment to each full-text index; a run per row (what
/// triggers did) wrote several index pages per message.
pub(crate) const FTS_BATCH: i64 = 64;

fn indexed_through(conn: &Connection) -> OpResult<i64> {
    Ok(conn
        .prepare_cached("SELECT indexed_through FROM fts_progress WHERE id = 1")?
        .query_row([], |r| r.get(0))?)
}

/// Adds every message not yet in the full-text indexes to both; returns
/// how many. Runs in the caller's (write) transaction.
pub(crate) fn index_pending(conn: &Connection) -> OpResult<usize> {
    let from = indexed_through(conn)?;
    let to: i64 = conn
        .prepare_cached("SELECT COALESCE(MAX(id), 0) FROM messages")?
        .query_row([], |r| r.get(0))?;
    if to <= from {
        return Ok(0);
    }
    let added = conn
        .prepare_cached(
            "INSERT INTO messages_fts (rowid, content) \
             SELECT id, content FROM messages WHERE id > ?1 AND id <= ?2",
        )?
        .execute(params![from, to])?;
    conn.prepare_cached(
        "INSERT INTO messages_fts_trigram (rowid, content) \
         SELECT id, content FROM messages WHERE id > ?1 AND id <= ?2",
    )?
    .execute(params![from, to])?;
    conn.prepare_cached("UPDATE fts_progress SET indexed_through = ?1 WHERE id = 1")?
        .execute(params![to])?;
    Ok(added)
}
