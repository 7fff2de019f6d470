//! What a copy carries over: the tables, each column with the kind of
//! value both backends store in it, and the values themselves. Both
//! backends build their copy statements from these descriptions, so a
//! column added here is copied by both.

use std::fmt;

/// The table a copy leaves in its target, naming its source and whether it
/// finished. Not part of either backend's versioned schema: only a copy
/// creates, reads and writes it.
pub const MARKER_TABLE: &str = "talaria_copy";

/// What a column holds, as both backends can store it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `TEXT` / `text`.
    Text,
    /// `INTEGER` / `bigint` or `integer`.
    Int,
    /// `REAL` / `double precision` (times).
    Real,
    /// `INTEGER` 0 or 1 / `boolean`.
    Bool,
}

/// One copied column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// Its name in both backends.
    pub name: &'static str,
    /// What it holds.
    pub kind: Kind,
}

const fn text(name: &'static str) -> Column {
    Column {
        name,
        kind: Kind::Text,
    }
}

const fn int(name: &'static str) -> Column {
    Column {
        name,
        kind: Kind::Int,
    }
}

const fn real(name: &'static str) -> Column {
    Column {
        name,
        kind: Kind::Real,
    }
}

const fn boolean(name: &'static str) -> Column {
    Column {
        name,
        kind: Kind::Bool,
    }
}

const SESSIONS_COLUMNS: &[Column] = &[
    text("id"),
    text("source"),
    text("session_key"),
    text("chat_id"),
    text("user_id"),
    text("thread_id"),
    text("title"),
    text("model"),
    text("system_prompt"),
    text("parent_session_id"),
    real("started_at"),
    real("ended_at"),
    text("end_reason"),
    int("message_count"),
    int("input_tokens"),
    int("output_tokens"),
    int("cache_read_tokens"),
    int("cache_write_tokens"),
    int("reasoning_tokens"),
    text("model_choice"),
    int("cost_micros"),
];

const MODEL_CALLS_COLUMNS: &[Column] = &[
    int("id"),
    text("session_id"),
    real("at"),
    text("platform"),
    text("session_key"),
    text("chat_id"),
    text("provider"),
    text("model"),
    text("kind"),
    int("input_tokens"),
    int("output_tokens"),
    int("cache_read_tokens"),
    int("cache_write_tokens"),
    int("reasoning_tokens"),
    int("cost_micros"),
    int("tool_calls"),
    int("turns"),
];

const MESSAGES_COLUMNS: &[Column] = &[
    int("id"),
    text("session_id"),
    text("role"),
    text("content"),
    text("tool_call_id"),
    text("tool_calls"),
    text("tool_name"),
    real("timestamp"),
    int("token_count"),
    text("finish_reason"),
    text("reasoning"),
    boolean("active"),
    text("media"),
    text("thinking"),
];

const ROUTES_COLUMNS: &[Column] = &[
    text("session_key"),
    text("session_id"),
    real("created_at"),
    real("updated_at"),
];

const LEDGER_COLUMNS: &[Column] = &[
    text("id"),
    text("session_key"),
    text("platform"),
    text("chat_id"),
    text("thread_id"),
    text("reply_to"),
    text("content"),
    text("state"),
    int("attempts"),
    real("created_at"),
    real("updated_at"),
    text("owner_node"),
    real("lease_until"),
    text("last_error"),
    int("parts_sent"),
];

const PAIRING_PENDING_COLUMNS: &[Column] = &[
    text("entry_id"),
    text("platform"),
    text("user_id"),
    text("user_name"),
    text("salt"),
    text("code_hash"),
    real("created_at"),
    text("chat_id"),
];

const PAIRING_APPROVED_COLUMNS: &[Column] = &[
    text("platform"),
    text("user_id"),
    text("user_name"),
    real("approved_at"),
    text("notice_chat"),
];

const PAIRING_STAMPS_COLUMNS: &[Column] = &[
    text("platform"),
    text("kind"),
    text("subject"),
    real("stamp"),
    int("count"),
];

const INBOUND_SEEN_COLUMNS: &[Column] = &[text("platform"), text("inbound_id"), real("seen_at")];

const OWED_TURNS_COLUMNS: &[Column] = &[
    text("id"),
    text("session_key"),
    text("platform"),
    text("event"),
    text("owner_node"),
    real("accepted_at"),
    int("claims"),
];

const ADAPTER_CURSORS_COLUMNS: &[Column] = &[
    text("platform"),
    text("name"),
    text("value"),
    real("updated_at"),
];

const CRON_JOBS_COLUMNS: &[Column] = &[
    text("id"),
    text("name"),
    text("prompt"),
    text("skills"),
    text("schedule"),
    text("deliver"),
    text("origin"),
    int("repeat"),
    int("completed"),
    text("state"),
    text("misfire"),
    int("next_run_at"),
    real("created_at"),
    real("updated_at"),
    real("last_run_at"),
    text("last_status"),
    text("last_error"),
];

const CRON_OCCURRENCES_COLUMNS: &[Column] = &[
    text("job_id"),
    int("scheduled_at"),
    text("trigger"),
    text("status"),
    text("session_id"),
    real("started_at"),
    real("finished_at"),
    text("error"),
    text("output_path"),
    text("delivery_error"),
];

/// A table a copy carries over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// `sessions`: one row per conversation, with its counters.
    Sessions,
    /// `messages`: every transcript row, active or compressed away.
    Messages,
    /// `gateway_routes`: session key → current session.
    Routes,
    /// `delivery_obligations`: the delivery ledger.
    Ledger,
    /// `pairing_pending`: codes waiting for approval (salted hashes).
    PairingPending,
    /// `pairing_approved`: users who may talk to the bot.
    PairingApproved,
    /// `pairing_stamps`: offer times, failure counts, lockouts.
    PairingStamps,
    /// `inbound_seen`: inbound event ids already taken.
    InboundSeen,
    /// `owed_turns`: messages accepted and not yet answered.
    OwedTurns,
    /// `adapter_cursors`: adapters' saved positions.
    AdapterCursors,
    /// `cron_jobs`: scheduled jobs.
    CronJobs,
    /// `cron_occurrences`: the record of their runs.
    CronOccurrences,
    /// `model_calls`: the per-call ledger of usage and cost.
    ModelCalls,
}

impl Table {
    /// Every copied table, in the order a copy writes them: a table comes
    /// after the ones its foreign keys point at.
    pub const ALL: [Table; 13] = [
        Table::Sessions,
        Table::Messages,
        Table::Routes,
        Table::Ledger,
        Table::PairingPending,
        Table::PairingApproved,
        Table::PairingStamps,
        Table::InboundSeen,
        Table::OwedTurns,
        Table::AdapterCursors,
        Table::CronJobs,
        Table::CronOccurrences,
        Table::ModelCalls,
    ];

    /// Its name in both backends' schemas.
    pub fn name(self) -> &'static str {
        match self {
            Table::Sessions => "sessions",
            Table::Messages => "messages",
            Table::Routes => "gateway_routes",
            Table::Ledger => "delivery_obligations",
            Table::PairingPending => "pairing_pending",
            Table::PairingApproved => "pairing_approved",
            Table::PairingStamps => "pairing_stamps",
            Table::InboundSeen => "inbound_seen",
            Table::OwedTurns => "owed_turns",
            Table::AdapterCursors => "adapter_cursors",
            Table::CronJobs => "cron_jobs",
            Table::CronOccurrences => "cron_occurrences",
            Table::ModelCalls => "model_calls",
        }
    }

    /// The copied columns, in the order a [`Row`] holds their values.
    /// Columns one backend computes itself (PostgreSQL's creation order of
    /// sessions and its search vector) are not among them.
    pub fn columns(self) -> &'static [Column] {
        match self {
            Table::Sessions => SESSIONS_COLUMNS,
            Table::Messages => MESSAGES_COLUMNS,
            Table::Routes => ROUTES_COLUMNS,
            Table::Ledger => LEDGER_COLUMNS,
            Table::PairingPending => PAIRING_PENDING_COLUMNS,
            Table::PairingApproved => PAIRING_APPROVED_COLUMNS,
            Table::PairingStamps => PAIRING_STAMPS_COLUMNS,
            Table::InboundSeen => INBOUND_SEEN_COLUMNS,
            Table::OwedTurns => OWED_TURNS_COLUMNS,
            Table::AdapterCursors => ADAPTER_CURSORS_COLUMNS,
            Table::CronJobs => CRON_JOBS_COLUMNS,
            Table::CronOccurrences => CRON_OCCURRENCES_COLUMNS,
            Table::ModelCalls => MODEL_CALLS_COLUMNS,
        }
    }

    /// The primary key's columns: what identifies a row on both sides.
    pub fn key(self) -> &'static [&'static str] {
        match self {
            Table::Sessions
            | Table::Messages
            | Table::Ledger
            | Table::CronJobs
            | Table::OwedTurns
            | Table::ModelCalls => &["id"],
            Table::Routes => &["session_key"],
            Table::PairingPending => &["entry_id"],
            Table::PairingApproved => &["platform", "user_id"],
            Table::PairingStamps => &["platform", "kind", "subject"],
            Table::InboundSeen => &["platform", "inbound_id"],
            Table::AdapterCursors => &["platform", "name"],
            Table::CronOccurrences => &["job_id", "scheduled_at"],
        }
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Tables (or name prefixes, ending in `*`) a backend holds that a copy
/// deliberately leaves out, with why.
pub const LEFT_OUT: &[(&str, &str)] = &[
    (
        "cluster_nodes",
        "the gateway processes running now, which re-announce themselves",
    ),
    ("cluster_leases", "held by running processes"),
    (
        "messages_fts*",
        "SQLite's full-text indexes, rebuilt from the messages",
    ),
    (
        "fts_progress",
        "how far SQLite's indexes have got, kept by the target",
    ),
    ("talaria_schema", "the target's own schema version"),
    (
        "shared_files*",
        "the memory and skill files a shared backend holds, which each node's gateway \
         sends from its home when it starts",
    ),
    (MARKER_TABLE, "the copy's own marker"),
];

/// One stored value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL `NULL`, in a column of any kind.
    Null,
    /// For [`Kind::Int`].
    Int(i64),
    /// For [`Kind::Real`].
    Real(f64),
    /// For [`Kind::Text`].
    Text(String),
    /// For [`Kind::Bool`].
    Bool(bool),
}

impl Value {
    /// Bytes this value holds, for bounding a page's size.
    pub fn size(&self) -> usize {
        match self {
            Value::Text(s) => s.len(),
            _ => 8,
        }
    }
}

/// One row: a value per column of [`Table::columns`], in that order.
pub type Row = Vec<Value>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_column_is_a_copied_column() {
        for table in Table::ALL {
            for key in table.key() {
                assert!(
                    table.columns().iter().any(|c| c.name == *key),
                    "{table}.{key}"
                );
            }
        }
    }

    #[test]
    fn tables_come_after_what_they_refer_to() {
        let at = |t: Table| Table::ALL.iter().position(|x| *x == t);
        assert!(at(Table::Sessions) < at(Table::Messages));
        assert!(at(Table::CronJobs) < at(Table::CronOccurrences));
    }
}
