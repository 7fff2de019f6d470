//! Sessions and transcripts on PostgreSQL.
//!
//! The tables mirror the SQLite schema (`src/sqlite/schema.rs`, step 1)
//! column for column. Writes that must move together are one statement
//! where they can be: appending a row bumps its session's counters in a
//! data-modifying CTE, so the session row's lock orders concurrent appends
//! (from any node) and `message_count` stays exact.

use std::borrow::Cow;

use async_trait::async_trait;
use talaria_core::ids::validate_path_component;
use talaria_core::{Message, ToolCall, Usage};
use tokio_postgres::types::ToSql;

use super::rows::{MESSAGE_COLUMNS, SESSION_COLUMNS, clean, clean_opt, sql_len, to_sql_count};
use super::{NOW, PostgresStore, search};
use crate::{
    ImportedSession, NewSession, Result, SearchHit, SearchQuery, SessionFilter, SessionRecord,
    SessionStore, StoreError, StoredMessage,
};

/// DDL for sessions and messages (part of schema step 1).
pub(super) const SCHEMA: &str = r#"
CREATE TABLE sessions (
    id                 text PRIMARY KEY,
    source             text NOT NULL,
    session_key        text,
    chat_id            text,
    user_id            text,
    thread_id          text,
    title              text,
    model              text,
    system_prompt      text,
    -- No foreign key: lineage is informational, and a parent may live in
    -- another deployment's database or have been pruned.
    parent_session_id  text,
    started_at         double precision NOT NULL,
    ended_at           double precision,
    end_reason         text,
    -- Counters are u64 in the API; a negative one could only come from a
    -- foreign writer, so the database refuses it.
    message_count      bigint NOT NULL DEFAULT 0 CHECK (message_count >= 0),
    input_tokens       bigint NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
    output_tokens      bigint NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
    cache_read_tokens  bigint NOT NULL DEFAULT 0 CHECK (cache_read_tokens >= 0),
    cache_write_tokens bigint NOT NULL DEFAULT 0 CHECK (cache_write_tokens >= 0),
    reasoning_tokens   bigint NOT NULL DEFAULT 0 CHECK (reasoning_tokens >= 0),
    -- Creation order: the tie-break SQLite's rowid gives listings, for
    -- sessions started within one tick of the clock.
    seq                bigint GENERATED ALWAYS AS IDENTITY
);
CREATE INDEX sessions_source_started ON sessions (source, started_at, seq);
CREATE INDEX sessions_started ON sessions (started_at, seq);
CREATE INDEX sessions_key ON sessions (session_key);
CREATE INDEX sessions_parent ON sessions (parent_session_id);

CREATE TABLE messages (
    -- Orders the transcript: a row's id is drawn after its session row is
    -- locked, so ids follow the order appends commit in.
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id    text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    role          text NOT NULL,
    content       text NOT NULL DEFAULT '',
    tool_call_id  text,
    tool_calls    text,
    tool_name     text,
    "timestamp"   double precision NOT NULL,
    token_count   bigint CHECK (token_count >= 0),
    finish_reason text,
    reasoning     text,
    active        boolean NOT NULL DEFAULT true
);
CREATE INDEX messages_session ON messages (session_id, id);
"#;

/// Media (issue 22, schema step 4): the files a transcript row came with,
/// as a JSON array of references into the media cache; NULL when none,
/// which is what rows from before this step read as. As in SQLite's
/// version 10.
pub(super) const MEDIA_SCHEMA: &str = r#"
ALTER TABLE messages ADD COLUMN media text;
"#;

/// Step 5 (issue 26): the model `/model` chose for a session.
pub(super) const MODEL_CHOICE_SCHEMA: &str = r#"
ALTER TABLE sessions ADD COLUMN model_choice text;
"#;

/// Signed reasoning (issue 26, schema step 5): an assistant row's thinking
/// blocks as the provider issued them, a JSON array; NULL when none. As in
/// SQLite's version 11.
pub(super) const THINKING_SCHEMA: &str = r#"
ALTER TABLE messages ADD COLUMN thinking text;
"#;

/// The largest count a `bigint` holds, as SQL: token sums saturate here
/// instead of failing the write (SQLite's backend clamps the same way).
const MAX_COUNT_SQL: &str = "9223372036854775807";

impl PostgresStore {
    /// Runs a message query and decodes every row.
    async fn query_messages(
        &self,
        client: &deadpool_postgres::Object,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<StoredMessage>> {
        let statement = client
            .prepare_cached(sql)
            .await
            .map_err(|e| self.error(e))?;
        let rows = client
            .query(&statement, params)
            .await
            .map_err(|e| self.error(e))?;
        rows.iter().map(|row| self.message_from_row(row)).collect()
    }

    /// Fails with [`StoreError::NoSuchSession`] unless the session exists.
    async fn require_session(&self, client: &deadpool_postgres::Object, id: &str) -> Result<()> {
        let statement = client
            .prepare_cached("SELECT 1 FROM sessions WHERE id = $1")
            .await
            .map_err(|e| self.error(e))?;
        let found = client
            .query_opt(&statement, &[&clean(id).as_ref()])
            .await
            .map_err(|e| self.error(e))?;
        match found {
            Some(_) => Ok(()),
            None => Err(StoreError::NoSuchSession(id.to_owned())),
        }
    }

    /// Appends one row and adds `usage` to its session's counters, in one
    /// statement (so one implicit transaction): the `UPDATE` locks the
    /// session row first, so concurrent appends to one session queue there
    /// and the count stays exact; the row's id is drawn after the lock.
    async fn append_row(&self, session_id: &str, message: &Message, usage: &Usage) -> Result<i64> {
        let client = self.client().await?;
        self.append_row_on(&client, session_id, message, usage)
            .await
    }

    /// [`PostgresStore::append_row`] on `client`, which may be a
    /// transaction (the ledger's outbox appends and records in one).
    pub(super) async fn append_row_on(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        session_id: &str,
        message: &Message,
        usage: &Usage,
    ) -> Result<i64> {
        let tool_calls = encode_tool_calls(&message.tool_calls)?;
        let media = crate::media::encode(&message.media)?;
        let thinking = crate::thinking::encode(&message.thinking)?;
        let sql = format!(
            "WITH s AS (\
                 UPDATE sessions SET message_count = message_count + 1, \
                 input_tokens = {input}, output_tokens = {output}, \
                 cache_read_tokens = {cache_read}, cache_write_tokens = {cache_write}, \
                 reasoning_tokens = {reasoning} \
                 WHERE id = $1 RETURNING id) \
             INSERT INTO messages (session_id, role, content, tool_call_id, tool_calls, \
                 tool_name, \"timestamp\", finish_reason, reasoning, media, thinking) \
             SELECT s.id, $2, $3, $4, $5, $6, {NOW}, $7, $8, $14, $15 FROM s \
             RETURNING id",
            input = saturating_add("input_tokens", 9),
            output = saturating_add("output_tokens", 10),
            cache_read = saturating_add("cache_read_tokens", 11),
            cache_write = saturating_add("cache_write_tokens", 12),
            reasoning = saturating_add("reasoning_tokens", 13),
        );
        let statement = client
            .prepare_cached(&sql)
            .await
            .map_err(|e| self.error(e))?;
        let id = clean(session_id);
        let content = clean(&message.content);
        let tool_call_id = clean_opt(&message.tool_call_id);
        let tool_name = clean_opt(&message.tool_name);
        let finish_reason = clean_opt(&message.finish_reason);
        let reasoning = clean_opt(&message.reasoning);
        let counts = usage_params(usage);
        let row = client
            .query_opt(
                &statement,
                &[
                    &id.as_ref(),
                    &message.role.as_str(),
                    &content.as_ref(),
                    &tool_call_id.as_deref(),
                    &tool_calls.as_deref(),
                    &tool_name.as_deref(),
                    &finish_reason.as_deref(),
                    &reasoning.as_deref(),
                    &counts[0],
                    &counts[1],
                    &counts[2],
                    &counts[3],
                    &counts[4],
                    &media.as_deref(),
                    &thinking.as_deref(),
                ],
            )
            .await
            .map_err(|e| self.error(e))?;
        match row {
            Some(row) => self.column(&row, 0),
            None => Err(StoreError::NoSuchSession(session_id.to_owned())),
        }
    }

    /// Runs an update of one session by id (`$1`); no row changed means
    /// no such session.
    async fn update_session(
        &self,
        id: &str,
        sql: &str,
        rest: &[&(dyn ToSql + Sync)],
    ) -> Result<()> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(sql)
            .await
            .map_err(|e| self.error(e))?;
        let key = clean(id);
        let key = key.as_ref();
        let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(rest.len() + 1);
        params.push(&key);
        params.extend_from_slice(rest);
        let changed = client
            .execute(&statement, &params)
            .await
            .map_err(|e| self.error(e))?;
        if changed == 0 {
            Err(StoreError::NoSuchSession(id.to_owned()))
        } else {
            Ok(())
        }
    }
}

/// SQL for `column + $param`, saturating at the largest `bigint` (the sum
/// is taken in `numeric`, which cannot overflow).
fn saturating_add(column: &str, param: usize) -> String {
    format!("LEAST({column}::numeric + ${param}::bigint, {MAX_COUNT_SQL})::bigint")
}

/// Tool calls as the JSON text the `tool_calls` column keeps; none is
/// NULL.
fn encode_tool_calls(calls: &[ToolCall]) -> Result<Option<String>> {
    if calls.is_empty() {
        return Ok(None);
    }
    serde_json::to_string(calls)
        .map(Some)
        .map_err(|e| StoreError::Database(format!("could not encode tool calls: {e}")))
}

/// The five token counters of `usage`, in column order.
fn usage_params(usage: &Usage) -> [i64; 5] {
    [
        to_sql_count(usage.input_tokens),
        to_sql_count(usage.output_tokens),
        to_sql_count(usage.cache_read_tokens),
        to_sql_count(usage.cache_write_tokens),
        to_sql_count(usage.reasoning_tokens),
    ]
}

/// The conventions are [`crate::SqliteStore`]'s (`message_count` counts every
/// stored row, `limit: 0` lists everything, inactive rows stay
/// searchable, missing sessions are [`StoreError::NoSuchSession`] except
/// for the two lookups). Where PostgreSQL differs:
/// - times are the database server's clock;
/// - a NUL character in stored text becomes U+FFFD (see `clean`): a
///   PostgreSQL `text` value cannot hold one;
/// - [`SessionStore::append_message_with_usage`] is a single statement, so
///   the row and its usage always land together (SQLite's is one
///   transaction too);
/// - search is described in `postgres/search.rs`.
#[async_trait]
impl SessionStore for PostgresStore {
    async fn create_session(&self, session: NewSession) -> Result<()> {
        validate_path_component(&session.id)?;
        if let Some(parent) = &session.parent_session_id {
            validate_path_component(parent)?;
        }
        let client = self.client().await?;
        let sql = format!(
            "INSERT INTO sessions (id, source, session_key, chat_id, user_id, thread_id, \
             model, system_prompt, parent_session_id, started_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, {NOW}) \
             ON CONFLICT (id) DO NOTHING"
        );
        let statement = client
            .prepare_cached(&sql)
            .await
            .map_err(|e| self.error(e))?;
        let source = clean(&session.source);
        let session_key = clean_opt(&session.session_key);
        let chat_id = clean_opt(&session.chat_id);
        let user_id = clean_opt(&session.user_id);
        let thread_id = clean_opt(&session.thread_id);
        let model = clean_opt(&session.model);
        let system_prompt = clean_opt(&session.system_prompt);
        let inserted = client
            .execute(
                &statement,
                &[
                    &session.id,
                    &source.as_ref(),
                    &session_key.as_deref(),
                    &chat_id.as_deref(),
                    &user_id.as_deref(),
                    &thread_id.as_deref(),
                    &model.as_deref(),
                    &system_prompt.as_deref(),
                    &session.parent_session_id,
                ],
            )
            .await
            .map_err(|e| self.error(e))?;
        if inserted == 0 {
            return Err(StoreError::Database(format!(
                "session `{}` already exists",
                session.id
            )));
        }
        Ok(())
    }

    async fn session(&self, id: &str) -> Result<Option<SessionRecord>> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&format!(
                "SELECT {SESSION_COLUMNS} FROM sessions s WHERE s.id = $1"
            ))
            .await
            .map_err(|e| self.error(e))?;
        let row = client
            .query_opt(&statement, &[&clean(id).as_ref()])
            .await
            .map_err(|e| self.error(e))?;
        row.map(|row| self.session_from_row(&row, 0)).transpose()
    }

    async fn set_title(&self, id: &str, title: &str) -> Result<()> {
        let title = clean(title);
        self.update_session(
            id,
            "UPDATE sessions SET title = $2 WHERE id = $1",
            &[&title.as_ref()],
        )
        .await
    }

    async fn set_title_if_unset(&self, id: &str, title: &str) -> Result<bool> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached("UPDATE sessions SET title = $2 WHERE id = $1 AND title IS NULL")
            .await
            .map_err(|e| self.error(e))?;
        let changed = client
            .execute(&statement, &[&clean(id).as_ref(), &clean(title).as_ref()])
            .await
            .map_err(|e| self.error(e))?;
        Ok(changed == 1)
    }

    async fn set_model_choice(&self, id: &str, choice: Option<&str>) -> Result<()> {
        let choice = choice.map(clean);
        self.update_session(
            id,
            "UPDATE sessions SET model_choice = $2 WHERE id = $1",
            &[&choice.as_deref()],
        )
        .await
    }

    async fn set_system_prompt(&self, id: &str, prompt: &str) -> Result<()> {
        let prompt = clean(prompt);
        self.update_session(
            id,
            "UPDATE sessions SET system_prompt = $2 WHERE id = $1",
            &[&prompt.as_ref()],
        )
        .await
    }

    async fn end_session(&self, id: &str, reason: &str) -> Result<()> {
        let reason = clean(reason);
        self.update_session(
            id,
            &format!("UPDATE sessions SET ended_at = {NOW}, end_reason = $2 WHERE id = $1"),
            &[&reason.as_ref()],
        )
        .await
    }

    async fn append_message(&self, session_id: &str, message: &Message) -> Result<i64> {
        self.append_row(session_id, message, &Usage::default())
            .await
    }

    async fn add_usage(&self, session_id: &str, usage: &Usage) -> Result<()> {
        let sql = format!(
            "UPDATE sessions SET input_tokens = {}, output_tokens = {}, \
             cache_read_tokens = {}, cache_write_tokens = {}, reasoning_tokens = {} \
             WHERE id = $1",
            saturating_add("input_tokens", 2),
            saturating_add("output_tokens", 3),
            saturating_add("cache_read_tokens", 4),
            saturating_add("cache_write_tokens", 5),
            saturating_add("reasoning_tokens", 6),
        );
        let counts = usage_params(usage);
        self.update_session(
            session_id,
            &sql,
            &[&counts[0], &counts[1], &counts[2], &counts[3], &counts[4]],
        )
        .await
    }

    async fn append_message_with_usage(
        &self,
        session_id: &str,
        message: &Message,
        usage: &Usage,
    ) -> Result<i64> {
        // Zero usage adds zeros: the same statement either way.
        self.append_row(session_id, message, usage).await
    }

    async fn add_calls(&self, session_id: &str, calls: &[crate::ModelCall]) -> Result<()> {
        self.add_calls_tx(session_id, calls).await
    }

    async fn append_message_with_calls(
        &self,
        session_id: &str,
        message: &Message,
        calls: &[crate::ModelCall],
    ) -> Result<i64> {
        self.append_with_calls_tx(session_id, message, calls).await
    }

    async fn session_cost_micros(&self, session_id: &str) -> Result<u64> {
        self.session_cost(session_id).await
    }

    async fn spend_since(&self, since: f64, scope: &crate::SpendScope) -> Result<u64> {
        self.spend(since, scope).await
    }

    async fn usage_report(&self, since: f64, top: usize) -> Result<crate::UsageReport> {
        self.report(since, top).await
    }

    async fn messages(&self, session_id: &str) -> Result<Vec<StoredMessage>> {
        let client = self.client().await?;
        self.require_session(&client, session_id).await?;
        let id = clean(session_id);
        self.query_messages(
            &client,
            &format!(
                "SELECT {MESSAGE_COLUMNS} FROM messages m \
                 WHERE m.session_id = $1 AND m.active ORDER BY m.id"
            ),
            &[&id.as_ref()],
        )
        .await
    }

    async fn messages_page(
        &self,
        session_id: &str,
        after_id: i64,
        limit: usize,
    ) -> Result<Vec<StoredMessage>> {
        let client = self.client().await?;
        self.require_session(&client, session_id).await?;
        let id = clean(session_id);
        self.query_messages(
            &client,
            &format!(
                "SELECT {MESSAGE_COLUMNS} FROM messages m \
                 WHERE m.session_id = $1 AND m.active AND m.id > $2 ORDER BY m.id LIMIT $3"
            ),
            &[&id.as_ref(), &after_id, &sql_len(limit)],
        )
        .await
    }

    async fn delete_session(&self, id: &str) -> Result<bool> {
        let id = clean(id);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        let deleted = self.delete_session_in(&tx, &id).await?;
        tx.commit().await.map_err(|e| self.error(e))?;
        Ok(deleted)
    }

    async fn delete_session_if_idle(
        &self,
        id: &str,
        idle_before: crate::Timestamp,
    ) -> Result<crate::IdleDeletion> {
        self.delete_if_idle(id, idle_before).await
    }

    async fn session_page(&self, page: crate::SessionPage) -> Result<Vec<crate::SessionActivity>> {
        self.page(page).await
    }

    async fn session_stats(&self) -> Result<crate::StoreStats> {
        self.stats().await
    }

    async fn message_window(
        &self,
        session_id: &str,
        around_id: i64,
        before: usize,
        after: usize,
    ) -> Result<Vec<StoredMessage>> {
        let client = self.client().await?;
        self.require_session(&client, session_id).await?;
        let id = clean(session_id);
        let mut earlier = self
            .query_messages(
                &client,
                &format!(
                    "SELECT {MESSAGE_COLUMNS} FROM messages m \
                     WHERE m.session_id = $1 AND m.id < $2 ORDER BY m.id DESC LIMIT $3"
                ),
                &[&id.as_ref(), &around_id, &sql_len(before)],
            )
            .await?;
        earlier.reverse();
        // The anchor itself plus `after` rows; if the anchor id is not in
        // this session, this is simply the next rows.
        let rest = self
            .query_messages(
                &client,
                &format!(
                    "SELECT {MESSAGE_COLUMNS} FROM messages m \
                     WHERE m.session_id = $1 AND m.id >= $2 ORDER BY m.id LIMIT $3"
                ),
                &[&id.as_ref(), &around_id, &sql_len(after).saturating_add(1)],
            )
            .await?;
        earlier.extend(rest);
        Ok(earlier)
    }

    async fn import_session(&self, session: ImportedSession) -> Result<bool> {
        validate_path_component(&session.record.id)?;
        let r = &session.record;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        // ON CONFLICT: a session already here (an earlier import) is left
        // as it is, and so is its transcript.
        let insert_session = tx
            .prepare_cached(
                "INSERT INTO sessions (id, source, session_key, chat_id, user_id, thread_id, \
                 title, model, system_prompt, parent_session_id, started_at, ended_at, \
                 end_reason, message_count, input_tokens, output_tokens, cache_read_tokens, \
                 cache_write_tokens, reasoning_tokens) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, \
                 $16, $17, $18, $19) ON CONFLICT (id) DO NOTHING",
            )
            .await
            .map_err(|e| self.error(e))?;
        let count = sql_len(session.messages.len());
        let usage = [
            to_sql_count(r.input_tokens),
            to_sql_count(r.output_tokens),
            to_sql_count(r.cache_read_tokens),
            to_sql_count(r.cache_write_tokens),
            to_sql_count(r.reasoning_tokens),
        ];
        let inserted = tx
            .execute(
                &insert_session,
                &[
                    &r.id,
                    &clean(&r.source).as_ref(),
                    &clean_opt(&r.session_key).as_deref(),
                    &clean_opt(&r.chat_id).as_deref(),
                    &clean_opt(&r.user_id).as_deref(),
                    &clean_opt(&r.thread_id).as_deref(),
                    &clean_opt(&r.title).as_deref(),
                    &clean_opt(&r.model).as_deref(),
                    &clean_opt(&r.system_prompt).as_deref(),
                    &clean_opt(&r.parent_session_id).as_deref(),
                    &r.started_at,
                    &r.ended_at,
                    &clean_opt(&r.end_reason).as_deref(),
                    &count,
                    &usage[0],
                    &usage[1],
                    &usage[2],
                    &usage[3],
                    &usage[4],
                ],
            )
            .await
            .map_err(|e| self.error(e))?;
        if inserted == 0 {
            return Ok(false);
        }
        let insert_row = tx
            .prepare_cached(
                "INSERT INTO messages (session_id, role, content, tool_call_id, tool_calls, \
                 tool_name, \"timestamp\", finish_reason, reasoning, media, thinking, active) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            )
            .await
            .map_err(|e| self.error(e))?;
        for row in &session.messages {
            let m = &row.message;
            let tool_calls = encode_tool_calls(&m.tool_calls)?;
            let media = crate::media::encode(&m.media)?;
            let thinking = crate::thinking::encode(&m.thinking)?;
            tx.execute(
                &insert_row,
                &[
                    &r.id,
                    &m.role.as_str(),
                    &clean(&m.content).as_ref(),
                    &clean_opt(&m.tool_call_id).as_deref(),
                    &tool_calls.as_deref(),
                    &clean_opt(&m.tool_name).as_deref(),
                    &row.timestamp,
                    &clean_opt(&m.finish_reason).as_deref(),
                    &clean_opt(&m.reasoning).as_deref(),
                    &media.as_deref(),
                    &thinking.as_deref(),
                    &row.active,
                ],
            )
            .await
            .map_err(|e| self.error(e))?;
        }
        tx.commit().await.map_err(|e| self.error(e))?;
        Ok(true)
    }

    async fn replace_active(&self, session_id: &str, replacement: &[Message]) -> Result<()> {
        let owned = |text: &Option<String>| clean_opt(text).map(Cow::into_owned);
        let mut roles = Vec::with_capacity(replacement.len());
        let mut contents = Vec::with_capacity(replacement.len());
        let mut tool_call_ids = Vec::with_capacity(replacement.len());
        let mut tool_calls = Vec::with_capacity(replacement.len());
        let mut tool_names = Vec::with_capacity(replacement.len());
        let mut finish_reasons = Vec::with_capacity(replacement.len());
        let mut reasonings = Vec::with_capacity(replacement.len());
        let mut media = Vec::with_capacity(replacement.len());
        let mut thinking = Vec::with_capacity(replacement.len());
        for message in replacement {
            roles.push(message.role.as_str());
            contents.push(clean(&message.content));
            tool_call_ids.push(owned(&message.tool_call_id));
            tool_calls.push(encode_tool_calls(&message.tool_calls)?);
            tool_names.push(owned(&message.tool_name));
            finish_reasons.push(owned(&message.finish_reason));
            reasonings.push(owned(&message.reasoning));
            media.push(crate::media::encode(&message.media)?);
            thinking.push(crate::thinking::encode(&message.thinking)?);
        }
        let contents: Vec<&str> = contents.iter().map(AsRef::as_ref).collect();
        let id = clean(session_id);
        let count = sql_len(replacement.len());

        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        // The session row first: its lock queues this behind (and ahead
        // of) appends to the same session, so no row lands between the
        // deactivation and the replacement.
        let counted = tx
            .prepare_cached("UPDATE sessions SET message_count = message_count + $2 WHERE id = $1")
            .await
            .map_err(|e| self.error(e))?;
        if tx
            .execute(&counted, &[&id.as_ref(), &count])
            .await
            .map_err(|e| self.error(e))?
            == 0
        {
            return Err(StoreError::NoSuchSession(session_id.to_owned()));
        }
        let deactivate = tx
            .prepare_cached("UPDATE messages SET active = false WHERE session_id = $1 AND active")
            .await
            .map_err(|e| self.error(e))?;
        tx.execute(&deactivate, &[&id.as_ref()])
            .await
            .map_err(|e| self.error(e))?;
        if !replacement.is_empty() {
            // One statement for all rows; rows are inserted (and their ids
            // drawn) in the order of the list. One timestamp for all, as
            // in the SQLite backend.
            let insert = tx
                .prepare_cached(&format!(
                    "INSERT INTO messages (session_id, role, content, tool_call_id, tool_calls, \
                     tool_name, \"timestamp\", finish_reason, reasoning, media, thinking) \
                     SELECT $1, r.role, r.content, r.tool_call_id, r.tool_calls, r.tool_name, \
                     t.at, r.finish_reason, r.reasoning, r.media, r.thinking \
                     FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], \
                     $7::text[], $8::text[], $9::text[], $10::text[]) WITH ORDINALITY \
                     AS r (role, content, tool_call_id, tool_calls, tool_name, finish_reason, \
                     reasoning, media, thinking, ord) \
                     CROSS JOIN (SELECT {NOW} AS at) t \
                     ORDER BY r.ord"
                ))
                .await
                .map_err(|e| self.error(e))?;
            tx.execute(
                &insert,
                &[
                    &id.as_ref(),
                    &roles,
                    &contents,
                    &tool_call_ids,
                    &tool_calls,
                    &tool_names,
                    &finish_reasons,
                    &reasonings,
                    &media,
                    &thinking,
                ],
            )
            .await
            .map_err(|e| self.error(e))?;
        }
        tx.commit().await.map_err(|e| self.error(e))
    }

    async fn list_sessions(&self, filter: SessionFilter) -> Result<Vec<SessionRecord>> {
        // One statement per filter shape (four at most), so each shape is
        // planned for its own index and stays in the statement cache.
        let mut sql = format!("SELECT {SESSION_COLUMNS} FROM sessions s WHERE true");
        let source = filter.source.as_deref().map(clean);
        let key = filter.session_key.as_deref().map(clean);
        let limit = (filter.limit != 0).then(|| sql_len(filter.limit));
        let offset = sql_len(filter.offset);
        let mut params: Vec<&(dyn ToSql + Sync)> = Vec::new();
        let source_ref = source.as_deref();
        let key_ref = key.as_deref();
        if source_ref.is_some() {
            params.push(&source_ref);
            sql.push_str(&format!(" AND s.source = ${}", params.len()));
        }
        if key_ref.is_some() {
            params.push(&key_ref);
            sql.push_str(&format!(" AND s.session_key = ${}", params.len()));
        }
        // A NULL limit is no limit.
        params.push(&limit);
        params.push(&offset);
        sql.push_str(&format!(
            " ORDER BY s.started_at DESC, s.seq DESC LIMIT ${}::bigint OFFSET ${}::bigint",
            params.len() - 1,
            params.len()
        ));
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&sql)
            .await
            .map_err(|e| self.error(e))?;
        let rows = client
            .query(&statement, &params)
            .await
            .map_err(|e| self.error(e))?;
        rows.iter()
            .map(|row| self.session_from_row(row, 0))
            .collect()
    }

    async fn last_answered_session(&self, sources: &[&str]) -> Result<Option<SessionRecord>> {
        let client = self.client().await?;
        // Newest rows first: the answer sought is usually among the last
        // few rows written.
        let statement = client
            .prepare_cached(&format!(
                "SELECT {SESSION_COLUMNS} FROM sessions s WHERE s.id = ( \
                   SELECT m.session_id FROM messages m JOIN sessions o ON o.id = m.session_id \
                   WHERE o.source = ANY($1) AND m.role = 'assistant' AND m.active \
                   ORDER BY m.id DESC LIMIT 1)"
            ))
            .await
            .map_err(|e| self.error(e))?;
        let row = client
            .query_opt(&statement, &[&sources])
            .await
            .map_err(|e| self.error(e))?;
        row.map(|row| self.session_from_row(&row, 0)).transpose()
    }

    async fn session_sources(&self) -> Result<Vec<(String, u64)>> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(
                "SELECT source, count(*) AS n FROM sessions GROUP BY source ORDER BY n DESC, source",
            )
            .await
            .map_err(|e| self.error(e))?;
        let rows = client
            .query(&statement, &[])
            .await
            .map_err(|e| self.error(e))?;
        rows.iter()
            .map(|row| {
                let source: String = row.try_get(0).map_err(|e| self.error(e))?;
                let n: i64 = row.try_get(1).map_err(|e| self.error(e))?;
                Ok((source, u64::try_from(n).unwrap_or(0)))
            })
            .collect()
    }

    async fn active_message_counts(&self, ids: &[String]) -> Result<Vec<u64>> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(
                "SELECT i.id, (SELECT count(*) FROM messages m \
                   WHERE m.session_id = i.id AND m.active) \
                 FROM unnest($1::text[]) AS i(id)",
            )
            .await
            .map_err(|e| self.error(e))?;
        let keys: Vec<String> = ids.iter().map(|id| clean(id).into_owned()).collect();
        let rows = client
            .query(&statement, &[&keys])
            .await
            .map_err(|e| self.error(e))?;
        let mut by_id = std::collections::HashMap::with_capacity(rows.len());
        for row in &rows {
            let id: String = row.try_get(0).map_err(|e| self.error(e))?;
            let n: i64 = row.try_get(1).map_err(|e| self.error(e))?;
            by_id.insert(id, u64::try_from(n).unwrap_or(0));
        }
        Ok(keys
            .iter()
            .map(|id| by_id.get(id).copied().unwrap_or(0))
            .collect())
    }

    async fn search(&self, query: SearchQuery) -> Result<Vec<SearchHit>> {
        search::search(self, &query).await
    }

    fn shared_files(&self) -> Option<&dyn crate::SharedFileStore> {
        Some(self)
    }
}
