//! Mapping between PostgreSQL rows and the crate's types, shared by the
//! modules that read sessions and transcripts (`sessions`, `search`,
//! `routes`, `copy`): the column lists, the conversions of text and
//! counts in both directions, and the row readers. The SQLite backend
//! keeps the same things in `src/sqlite/rows.rs`.

use std::borrow::Cow;

use talaria_core::{Message, ToolCall};
use tokio_postgres::Row;

use super::PostgresStore;
use crate::{Result, SessionRecord, StoreError, StoredMessage};

/// Session columns (table alias `s`) in the order
/// [`PostgresStore::session_from_row`] reads them.
pub(super) const SESSION_COLUMNS: &str = "s.id, s.source, s.session_key, s.chat_id, \
     s.user_id, s.thread_id, s.title, s.model, s.system_prompt, s.parent_session_id, \
     s.started_at, s.ended_at, s.end_reason, s.message_count, s.input_tokens, \
     s.output_tokens, s.cache_read_tokens, s.cache_write_tokens, s.reasoning_tokens, \
     s.model_choice";

/// Message columns (table alias `m`) in the order
/// [`PostgresStore::message_from_row`] reads them.
pub(super) const MESSAGE_COLUMNS: &str = "m.id, m.session_id, m.role, m.content, m.tool_call_id, \
     m.tool_calls, m.tool_name, m.\"timestamp\", m.token_count, m.finish_reason, m.reasoning, \
     m.active, m.media, m.thinking";
/// `text` as PostgreSQL can store it. A `text` value cannot hold U+0000
/// (SQLite's can), and a tool's output sometimes contains one; refusing
/// the write would lose the turn, so each NUL becomes U+FFFD, the usual
/// stand-in for a character that could not be kept.
pub(super) fn clean(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(text)
    }
}

/// [`clean`] for optional values.
pub(super) fn clean_opt(text: &Option<String>) -> Option<Cow<'_, str>> {
    text.as_deref().map(clean)
}

/// A count from the caller as a `bigint`: beyond `i64::MAX` is not a real
/// count, so clamping is the honest conversion.
pub(super) fn to_sql_count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A length or offset from the caller as a `bigint`.
pub(super) fn sql_len(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A counter read back. The columns refuse negative values, so a failure
/// here means the schema was changed behind Talaria's back.
fn from_sql_count(n: i64, what: &str, owner: &str) -> Result<u64> {
    u64::try_from(n).map_err(|_| {
        StoreError::Database(format!(
            "{owner} has a negative {what} ({n}); the database was changed outside Talaria"
        ))
    })
}

impl PostgresStore {
    /// Reads one column, reporting a type mismatch as a database error.
    pub(super) fn column<'a, T>(&self, row: &'a Row, index: usize) -> Result<T>
    where
        T: tokio_postgres::types::FromSql<'a>,
    {
        row.try_get(index).map_err(|e| self.error(e))
    }

    /// A session read from `row`, starting at column `at` (see
    /// [`SESSION_COLUMNS`]).
    pub(super) fn session_from_row(&self, row: &Row, at: usize) -> Result<SessionRecord> {
        let id: String = self.column(row, at)?;
        let owner = format!("session `{id}`");
        let count = |offset: usize, what: &str| -> Result<u64> {
            from_sql_count(self.column(row, at + offset)?, what, &owner)
        };
        Ok(SessionRecord {
            source: self.column(row, at + 1)?,
            session_key: self.column(row, at + 2)?,
            chat_id: self.column(row, at + 3)?,
            user_id: self.column(row, at + 4)?,
            thread_id: self.column(row, at + 5)?,
            title: self.column(row, at + 6)?,
            model: self.column(row, at + 7)?,
            system_prompt: self.column(row, at + 8)?,
            parent_session_id: self.column(row, at + 9)?,
            started_at: self.column(row, at + 10)?,
            ended_at: self.column(row, at + 11)?,
            end_reason: self.column(row, at + 12)?,
            message_count: count(13, "message_count")?,
            input_tokens: count(14, "input_tokens")?,
            output_tokens: count(15, "output_tokens")?,
            cache_read_tokens: count(16, "cache_read_tokens")?,
            cache_write_tokens: count(17, "cache_write_tokens")?,
            reasoning_tokens: count(18, "reasoning_tokens")?,
            model_choice: self.column(row, at + 19)?,
            id,
        })
    }

    /// A transcript row read from `row` (see [`MESSAGE_COLUMNS`]).
    pub(super) fn message_from_row(&self, row: &Row) -> Result<StoredMessage> {
        let id: i64 = self.column(row, 0)?;
        let role: String = self.column(row, 2)?;
        let role = parse_role(&role, id)?;
        let tool_calls: Option<String> = self.column(row, 5)?;
        // As in the SQLite backend: unreadable calls are reported, not
        // dropped, since dropping them would orphan their tool results.
        let tool_calls: Vec<ToolCall> = match tool_calls.as_deref() {
            None | Some("") => Vec::new(),
            Some(json) => serde_json::from_str(json).map_err(|e| {
                StoreError::Database(format!("message {id} has unreadable tool_calls: {e}"))
            })?,
        };
        let token_count: Option<i64> = self.column(row, 8)?;
        let media: Option<String> = self.column(row, 12)?;
        let thinking: Option<String> = self.column(row, 13)?;
        Ok(StoredMessage {
            id,
            session_id: self.column(row, 1)?,
            message: Message {
                role,
                content: self.column(row, 3)?,
                tool_calls,
                tool_call_id: self.column(row, 4)?,
                tool_name: self.column(row, 6)?,
                reasoning: self.column(row, 10)?,
                finish_reason: self.column(row, 9)?,
                media: crate::media::decode(media.as_deref(), id)?,
                thinking: crate::thinking::decode(thinking.as_deref(), id)?,
            },
            timestamp: self.column(row, 7)?,
            token_count: token_count
                .map(|n| from_sql_count(n, "token_count", &format!("message {id}")))
                .transpose()?,
            active: self.column(row, 11)?,
        })
    }
}

/// A stored role name as the type, or a clear error naming the row.
pub(super) fn parse_role(role: &str, message_id: i64) -> Result<talaria_core::Role> {
    talaria_core::Role::parse(role).ok_or_else(|| {
        StoreError::Database(format!("message {message_id} has an unknown role `{role}`"))
    })
}
