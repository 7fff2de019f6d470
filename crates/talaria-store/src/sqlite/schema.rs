//! Schema versions and migrations.
//!
//! The version lives in `PRAGMA user_version`. Each step runs in its own
//! transaction together with the version bump, so a crash mid-upgrade leaves
//! the file at the previous version rather than half-migrated. Steps are
//! append-only: once released, a step is never edited; changes go in a new
//! one.

use rusqlite::{Connection, TransactionBehavior};

use super::conn::OpResult;
use crate::StoreError;

/// Marks the file as ours (`PRAGMA application_id`, "TALA"), so a database
/// from another program is refused instead of being migrated into.
pub(crate) const APPLICATION_ID: i32 = 0x5441_4C41;

/// The migration steps, in order; step `i` moves the schema from version `i`
/// to `i + 1`.
const STEPS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7, V8, V9, V10, V11];

/// The schema version this build writes.
pub(crate) const LATEST: i64 = STEPS.len() as i64;

const V1: &str = r#"
CREATE TABLE sessions (
    id                 TEXT PRIMARY KEY NOT NULL,
    source             TEXT NOT NULL,
    session_key        TEXT,
    chat_id            TEXT,
    user_id            TEXT,
    thread_id          TEXT,
    title              TEXT,
    model              TEXT,
    system_prompt      TEXT,
    -- No foreign key: lineage is informational, and a parent may live in
    -- another profile's database or have been pruned.
    parent_session_id  TEXT,
    started_at         REAL NOT NULL,
    ended_at           REAL,
    end_reason         TEXT,
    message_count      INTEGER NOT NULL DEFAULT 0,
    input_tokens       INTEGER NOT NULL DEFAULT 0,
    output_tokens      INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens  INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens   INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX sessions_source_started ON sessions (source, started_at);
CREATE INDEX sessions_started ON sessions (started_at);
CREATE INDEX sessions_key ON sessions (session_key);
CREATE INDEX sessions_parent ON sessions (parent_session_id);

CREATE TABLE messages (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id    TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    role          TEXT NOT NULL,
    content       TEXT NOT NULL DEFAULT '',
    tool_call_id  TEXT,
    tool_calls    TEXT,
    tool_name     TEXT,
    timestamp     REAL NOT NULL,
    token_count   INTEGER,
    finish_reason TEXT,
    reasoning     TEXT,
    active        INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX messages_session ON messages (session_id, id);

-- Two external-content indexes over messages.content: words (with accents
-- folded) for ordinary queries, trigrams for CJK text and substrings.
CREATE VIRTUAL TABLE messages_fts USING fts5 (
    content, content = 'messages', content_rowid = 'id',
    tokenize = 'unicode61 remove_diacritics 2'
);
CREATE VIRTUAL TABLE messages_fts_trigram USING fts5 (
    content, content = 'messages', content_rowid = 'id',
    tokenize = 'trigram'
);

CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content);
    INSERT INTO messages_fts_trigram (rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, content)
        VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts_trigram (messages_fts_trigram, rowid, content)
        VALUES ('delete', old.id, old.content);
END;
-- Only a content change touches the index: flipping `active` during
-- compression must leave the old rows searchable.
CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, content)
        VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts_trigram (messages_fts_trigram, rowid, content)
        VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content);
    INSERT INTO messages_fts_trigram (rowid, content) VALUES (new.id, new.content);
END;
"#;

/// The gateway's tables: session routes, the delivery ledger and DM pairing.
const V2: &str = r#"
CREATE TABLE gateway_routes (
    session_key TEXT PRIMARY KEY NOT NULL,
    session_id  TEXT NOT NULL,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL
);

-- Final replies recorded before they are sent, with everything needed to
-- send them again after a crash.
CREATE TABLE delivery_obligations (
    id               TEXT PRIMARY KEY NOT NULL,
    session_key      TEXT NOT NULL,
    platform         TEXT NOT NULL,
    chat_id          TEXT NOT NULL,
    thread_id        TEXT,
    reply_to         TEXT,
    content          TEXT NOT NULL,
    state            TEXT NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    -- The owning process; both NULL when unknown. Claims compare both with
    -- IS, so a recycled pid with another start time is not the owner.
    owner_pid        INTEGER,
    owner_started_at INTEGER,
    last_error       TEXT
);
CREATE INDEX delivery_obligations_state ON delivery_obligations (state);

-- Codes waiting for approval. Only a salted hash is kept: the code itself
-- is shown to the user once and never written anywhere.
CREATE TABLE pairing_pending (
    entry_id   TEXT PRIMARY KEY NOT NULL,
    platform   TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    user_name  TEXT,
    salt       TEXT NOT NULL,
    code_hash  TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX pairing_pending_platform ON pairing_pending (platform, created_at);

CREATE TABLE pairing_approved (
    platform    TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    user_name   TEXT,
    approved_at REAL NOT NULL,
    PRIMARY KEY (platform, user_id)
);

-- Rate-limit stamps, one table for both scopes:
--   kind 'offer':    subject = user id,  stamp = when the user was last
--                    answered (a code or a refusal);
--   kind 'failures': subject = '',       count = failed approvals so far;
--   kind 'lockout':  subject = '',       stamp = when the lock ends.
-- Rows past their use are deleted or ignored by the code that reads them.
CREATE TABLE pairing_stamps (
    platform TEXT NOT NULL,
    kind     TEXT NOT NULL CHECK (kind IN ('offer', 'failures', 'lockout')),
    subject  TEXT NOT NULL DEFAULT '',
    stamp    REAL,
    count    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (platform, kind, subject)
);
"#;

/// Scheduled jobs and their occurrences; an index for the session-expiry
/// watcher's scan of idle routes.
const V3: &str = r#"
CREATE TABLE cron_jobs (
    id          TEXT PRIMARY KEY NOT NULL,
    name        TEXT NOT NULL UNIQUE,
    prompt      TEXT,
    skills      TEXT NOT NULL DEFAULT '[]',  -- JSON array of skill names
    schedule    TEXT NOT NULL,
    deliver     TEXT NOT NULL DEFAULT '[]',  -- JSON array of delivery targets
    origin      TEXT,                        -- JSON {platform, chat_id, thread_id}
    repeat      INTEGER,
    completed   INTEGER NOT NULL DEFAULT 0,
    state       TEXT NOT NULL CHECK (state IN ('scheduled', 'paused', 'completed')),
    misfire     TEXT NOT NULL CHECK (misfire IN ('run_once', 'skip')),
    -- Unix seconds, an integer so that equality (what a claim compares) is
    -- exact.
    next_run_at INTEGER,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    last_run_at REAL,
    last_status TEXT,
    last_error  TEXT
);
CREATE INDEX cron_jobs_due ON cron_jobs (state, next_run_at);

-- One row per run, inserted before the run starts: the primary key is what
-- makes an occurrence fire at most once, whichever scheduler claims it.
CREATE TABLE cron_occurrences (
    job_id         TEXT NOT NULL REFERENCES cron_jobs (id) ON DELETE CASCADE,
    scheduled_at   INTEGER NOT NULL,
    trigger        TEXT NOT NULL,
    status         TEXT NOT NULL,
    session_id     TEXT,
    started_at     REAL NOT NULL,
    finished_at    REAL,
    error          TEXT,
    output_path    TEXT,
    delivery_error TEXT,
    PRIMARY KEY (job_id, scheduled_at)
);
CREATE INDEX cron_occurrences_status ON cron_occurrences (status, started_at);

CREATE INDEX gateway_routes_updated ON gateway_routes (updated_at);
"#;

/// Inbound dedupe and adapter cursors.
const V4: &str = r#"
-- One row per inbound event taken; the primary key is the dedupe.
CREATE TABLE inbound_seen (
    platform   TEXT NOT NULL,
    inbound_id TEXT NOT NULL,
    seen_at    REAL NOT NULL,
    PRIMARY KEY (platform, inbound_id)
) WITHOUT ROWID;
CREATE INDEX inbound_seen_at ON inbound_seen (seen_at);

CREATE TABLE adapter_cursors (
    platform   TEXT NOT NULL,
    name       TEXT NOT NULL,
    value      TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (platform, name)
) WITHOUT ROWID;
"#;

/// The triggers that keep the full-text indexes equal to `messages` for
/// rows already in them (version 5), created again when version 7 rebuilt
/// the table. A macro so both migrations can spell them once.
macro_rules! fts_triggers {
    () => {
        r#"
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages
WHEN old.id <= (SELECT indexed_through FROM fts_progress WHERE id = 1) BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, content)
        VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts_trigram (messages_fts_trigram, rowid, content)
        VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages
WHEN old.id <= (SELECT indexed_through FROM fts_progress WHERE id = 1) BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, content)
        VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts_trigram (messages_fts_trigram, rowid, content)
        VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content);
    INSERT INTO messages_fts_trigram (rowid, content) VALUES (new.id, new.content);
END;
"#
    };
}

/// Full-text indexing in batches instead of row by row: a row's words reach
/// the two indexes when [`super::rows::index_pending`] runs (every
/// [`super::rows::FTS_BATCH`] rows, and before every search), so the
/// indexes gain one segment per batch instead of one per message. Deleting
/// or editing a row touches the indexes only if the row is already in them.
const V5: &str = concat!(
    r#"
CREATE TABLE fts_progress (
    id              INTEGER PRIMARY KEY CHECK (id = 1),
    -- Every message with an id up to this one is in both indexes; none
    -- above it is (ids only grow: AUTOINCREMENT never reuses one).
    indexed_through INTEGER NOT NULL
);
INSERT INTO fts_progress (id, indexed_through)
    VALUES (1, (SELECT COALESCE(MAX(id), 0) FROM messages));

DROP TRIGGER messages_fts_insert;
DROP TRIGGER messages_fts_delete;
DROP TRIGGER messages_fts_update;

"#,
    fts_triggers!()
);

/// Nodes and leases; ledger rows owned by a node, with a lease on each
/// attempt. Rows owned by a process id (before nodes) keep no owner: that
/// process is gone (this build is running in its place), and a sweep claims
/// ownerless rows as it claimed a dead process's.
const V6: &str = r#"
CREATE TABLE cluster_nodes (
    id           TEXT PRIMARY KEY NOT NULL,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    started_at   INTEGER,
    version      TEXT NOT NULL,
    joined_at    REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    lease_until  REAL NOT NULL
) WITHOUT ROWID;

-- A released or expired lease keeps its row, so the fence of the next
-- holder is higher than every earlier one.
CREATE TABLE cluster_leases (
    name        TEXT PRIMARY KEY NOT NULL,
    holder      TEXT NOT NULL,
    fence       INTEGER NOT NULL,
    acquired_at REAL NOT NULL,
    lease_until REAL NOT NULL,
    -- When another node last asked for it during this tenure.
    wanted_at   REAL
) WITHOUT ROWID;

ALTER TABLE delivery_obligations ADD COLUMN owner_node TEXT;
ALTER TABLE delivery_obligations ADD COLUMN lease_until REAL;
ALTER TABLE delivery_obligations DROP COLUMN owner_pid;
ALTER TABLE delivery_obligations DROP COLUMN owner_started_at;
DROP INDEX delivery_obligations_state;
CREATE INDEX delivery_obligations_open ON delivery_obligations (state, created_at);
"#;

/// Fewer writes per stored message, and a ledger index sweeps can walk.
///
/// - Message ids without `AUTOINCREMENT`. Its counter lives in a row of
///   `sqlite_sequence`, so every stored message also rewrote that page: one
///   WAL frame of five per commit. A new row now takes the next id above
///   both the highest id and the full-text watermark
///   ([`super::rows::insert_message`]), which keeps what the watermark
///   needs: no id at or below it is ever given out again. Only ids of rows
///   deleted at the tail before they were indexed can come back.
/// - No `sessions.message_count`: bumping it rewrote the session's page in
///   the commit of every message. The count is read from `messages` (the
///   `messages_session` index) instead; it was always every row stored for
///   the session, which is what counting them gives.
/// - Open obligations indexed in claim order (`delivery_obligations_owed`),
///   replacing the `(state, created_at)` index.
const V7: &str = concat!(
    r#"
ALTER TABLE sessions DROP COLUMN message_count;

-- Open obligations in the order a sweep claims them, so each of its calls
-- starts where the previous one stopped. The condition is the sweep
-- query's own first term, which is what lets SQLite use the index.
CREATE INDEX delivery_obligations_owed ON delivery_obligations (created_at, id)
    WHERE state IN ('pending', 'attempting', 'failed');
-- Every state change rewrote an entry of this one too; what read it (open
-- rows, and pruning old closed ones now and then) reads the index above or
-- the table.
DROP INDEX delivery_obligations_open;

CREATE TABLE messages_v7 (
    id            INTEGER PRIMARY KEY,
    session_id    TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    role          TEXT NOT NULL,
    content       TEXT NOT NULL DEFAULT '',
    tool_call_id  TEXT,
    tool_calls    TEXT,
    tool_name     TEXT,
    timestamp     REAL NOT NULL,
    token_count   INTEGER,
    finish_reason TEXT,
    reasoning     TEXT,
    active        INTEGER NOT NULL DEFAULT 1
);
INSERT INTO messages_v7 (id, session_id, role, content, tool_call_id, tool_calls,
                         tool_name, timestamp, token_count, finish_reason, reasoning, active)
    SELECT id, session_id, role, content, tool_call_id, tool_calls,
           tool_name, timestamp, token_count, finish_reason, reasoning, active
    FROM messages ORDER BY id;
DROP TABLE messages;
ALTER TABLE messages_v7 RENAME TO messages;
DELETE FROM sqlite_sequence WHERE name = 'messages';
CREATE INDEX messages_session ON messages (session_id, id);

"#,
    fts_triggers!()
);

/// Owed turns: each accepted message until its answer is stored (see the
/// crate's `owed` module). Small: rows leave as turns finish.
const V8: &str = r#"
CREATE TABLE owed_turns (
    id          TEXT PRIMARY KEY,
    session_key TEXT NOT NULL,
    platform    TEXT NOT NULL,
    event       TEXT NOT NULL,
    owner_node  TEXT,
    accepted_at REAL NOT NULL,
    claims      INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX owed_turns_accepted ON owed_turns (accepted_at);
"#;

/// Approval notices: the chat a pairing code was shown in, and on an
/// approval the chat still owed the news (NULL once told, or when the code
/// came from a release that did not record its chat).
const V9: &str = r#"
ALTER TABLE pairing_pending ADD COLUMN chat_id TEXT;
ALTER TABLE pairing_approved ADD COLUMN notice_chat TEXT;
"#;

/// Media (issue 22): the files a transcript row came with, as a JSON
/// array of references into the media cache (NULL when none, which is
/// what rows from before this step read as); and how many parts of a
/// reply (text chunks and files, in order) were confirmed sent, so a
/// node sending it again after a crash skips those.
const V10: &str = r#"
ALTER TABLE messages ADD COLUMN media TEXT;
ALTER TABLE delivery_obligations ADD COLUMN parts_sent INTEGER NOT NULL DEFAULT 0;
"#;

/// Models (issue 26): the model `/model` chose for a session (NULL while
/// it follows the configured default); an assistant row's signed
/// reasoning blocks as the provider issued them, a JSON array (NULL when
/// none, which is what rows from before this step read as), replayed
/// unchanged in a tool-use loop. Cost: a session's running cost, and the
/// per-call ledger budgets and `talaria insights` sum. A ledger row copies
/// its session's platform and chat, so sums by chat read one indexed
/// table; it has no foreign key, so deleting a session does not erase what
/// was spent.
const V11: &str = r#"
ALTER TABLE sessions ADD COLUMN model_choice TEXT;
ALTER TABLE messages ADD COLUMN thinking TEXT;
ALTER TABLE sessions ADD COLUMN cost_micros INTEGER NOT NULL DEFAULT 0;
CREATE TABLE model_calls (
    id                 INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id         TEXT NOT NULL,
    at                 REAL NOT NULL,
    platform           TEXT NOT NULL,
    session_key        TEXT,
    chat_id            TEXT,
    provider           TEXT NOT NULL,
    model              TEXT NOT NULL,
    kind               TEXT NOT NULL,
    input_tokens       INTEGER NOT NULL DEFAULT 0,
    output_tokens      INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens  INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens   INTEGER NOT NULL DEFAULT 0,
    cost_micros        INTEGER NOT NULL DEFAULT 0,
    tool_calls         INTEGER NOT NULL DEFAULT 0,
    turns              INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX model_calls_at ON model_calls (at);
CREATE INDEX model_calls_key_at ON model_calls (session_key, at);
CREATE INDEX model_calls_chat_at ON model_calls (platform, chat_id, at);
"#;

/// Brings the database to [`LATEST`], refusing files that are not ours or
/// are newer than this build.
pub(crate) fn migrate(conn: &mut Connection) -> OpResult<()> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version > LATEST {
        return Err(StoreError::Database(format!(
            "this database was created by a newer Talaria (schema version {version}; \
             this build understands up to {LATEST}); upgrade Talaria to open it"
        ))
        .into());
    }
    let app_id: i32 = conn.pragma_query_value(None, "application_id", |r| r.get(0))?;
    if app_id != 0 && app_id != APPLICATION_ID {
        return Err(StoreError::Database(format!(
            "this database belongs to another application (application_id {app_id:#x})"
        ))
        .into());
    }
    for (index, step) in STEPS.iter().enumerate().skip(version.max(0) as usize) {
        let target = index as i64 + 1;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Another process may have migrated while we waited for the lock.
        let now: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if now >= target {
            continue;
        }
        tx.execute_batch(step)?;
        tx.pragma_update(None, "application_id", APPLICATION_ID)?;
        tx.pragma_update(None, "user_version", target)?;
        tx.commit()?;
        tracing::info!(version = target, "migrated session database");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version-5 file with a row owned by a pid (as the ledger stored
    /// owners before nodes) upgrades with the row kept and ownerless.
    #[test]
    fn ledger_rows_owned_by_a_pid_become_ownerless() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let mut conn = Connection::open(&path).unwrap();
        for step in &STEPS[..5] {
            conn.execute_batch(step).unwrap();
        }
        conn.pragma_update(None, "user_version", 5).unwrap();
        conn.execute(
            "INSERT INTO delivery_obligations (id, session_key, platform, chat_id, content, \
             state, attempts, created_at, updated_at, owner_pid, owner_started_at) \
             VALUES ('r', 'k', 'telegram', '42', 'owed', 'attempting', 1, 1.0, 2.0, 4242, 7)",
            [],
        )
        .unwrap();
        migrate(&mut conn).map_err(|_| "migrate").unwrap();
        let row: (String, i64, Option<String>, Option<f64>) = conn
            .query_row(
                "SELECT content, attempts, owner_node, lease_until FROM delivery_obligations",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap();
        assert_eq!(row, ("owed".to_owned(), 1, None, None));
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, LATEST);
        for table in ["cluster_nodes", "cluster_leases"] {
            let n: i64 = conn
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE name = ?1",
                    [table],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(n, 1, "{table}");
        }
    }

    /// A version-9 file (the last before media) keeps its transcript and
    /// ledger rows; they read as having no media and no part sent.
    #[test]
    fn rows_from_before_media_have_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let mut conn = Connection::open(&path).unwrap();
        for step in &STEPS[..9] {
            conn.execute_batch(step).unwrap();
        }
        conn.pragma_update(None, "user_version", 9).unwrap();
        conn.execute_batch(
            "INSERT INTO sessions (id, source, started_at) VALUES ('s', 'telegram', 1.0);
             INSERT INTO messages (id, session_id, role, content, timestamp)
                 VALUES (1, 's', 'user', 'a photo, once', 1.0);
             INSERT INTO delivery_obligations (id, session_key, platform, chat_id, content,
                 state, attempts, created_at, updated_at, owner_node, lease_until)
                 VALUES ('r', 'k', 'telegram', '42', 'owed', 'attempting', 2, 1.0, 2.0,
                         'node-a', 9.0);",
        )
        .unwrap();
        migrate(&mut conn).map_err(|_| "migrate").unwrap();
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, LATEST);
        let sql = format!(
            "SELECT {} FROM messages",
            super::super::rows::MESSAGE_COLUMNS
        );
        let rows = super::super::rows::query_messages(&conn, &sql, [])
            .map_err(|_| "read")
            .unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].message.content, "a photo, once");
        assert!(rows[0].message.media.is_empty());
        let ledger: (String, i64, i64) = conn
            .query_row(
                "SELECT content, attempts, parts_sent FROM delivery_obligations",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!(ledger, ("owed".to_owned(), 2, 0));
    }

    /// A version-6 file keeps its messages, their ids and their index
    /// entries when the table loses `AUTOINCREMENT`.
    #[test]
    fn messages_keep_their_ids_and_index_without_autoincrement() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let mut conn = Connection::open(&path).unwrap();
        for step in &STEPS[..6] {
            conn.execute_batch(step).unwrap();
        }
        conn.pragma_update(None, "user_version", 6).unwrap();
        conn.execute_batch(
            "INSERT INTO sessions (id, source, started_at) VALUES ('s', 'cli', 1.0);
             INSERT INTO messages (session_id, role, content, timestamp)
                 VALUES ('s', 'user', 'first otter', 1.0), ('s', 'user', 'gone', 2.0),
                        ('s', 'assistant', 'second otter', 3.0);
             DELETE FROM messages WHERE id = 2;",
        )
        .unwrap();
        super::super::rows::index_pending(&conn)
            .map_err(|_| "index")
            .unwrap();
        migrate(&mut conn).map_err(|_| "migrate").unwrap();
        let sql: String = conn
            .query_row(
                "SELECT sql FROM sqlite_master WHERE name = 'messages'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(!sql.contains("AUTOINCREMENT"), "{sql}");
        let ids: Vec<(i64, String)> = conn
            .prepare("SELECT id, content FROM messages ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            ids,
            [
                (1, "first otter".to_owned()),
                (3, "second otter".to_owned())
            ]
        );
        let found: i64 = conn
            .query_row(
                "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'otter'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(found, 2);
        let triggers: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'messages'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(triggers, 2);
        // The count of a session's rows is read from them now.
        let session = super::super::rows::load_session(&conn, "s")
            .map_err(|_| "load")
            .unwrap()
            .unwrap();
        assert_eq!(session.message_count, 2);
        for table in ["messages_fts", "messages_fts_trigram"] {
            conn.execute(
                &format!("INSERT INTO {table} ({table}, rank) VALUES ('integrity-check', 1)"),
                [],
            )
            .unwrap_or_else(|e| panic!("{table}: {e}"));
        }
    }
}
