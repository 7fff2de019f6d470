//! Reading an SQLite store out and writing a copy into one
//! ([`crate::copy`]).
//!
//! A dump reads through a connection of its own, opened read-only, inside
//! one read transaction: WAL gives it a snapshot that no later write
//! changes, so every page and every count agree. Pages follow the `rowid`
//! (the order rows were inserted, so sessions land in the target in the
//! order they were created, which is how listings break ties), or the
//! primary key for the two `WITHOUT ROWID` tables.
//!
//! A load writes each page as one write operation of the store, so it
//! commits in one transaction. Message ids are written as they come; new
//! messages then take ids above the highest. Each page of messages
//! is added to the full-text indexes in the same transaction
//! ([`super::rows::index_pending`]), so the indexes never lag behind what
//! was committed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Transaction, params, params_from_iter};

use super::SqliteStore;
use super::conn::{OpError, OpResult, configure, lock, to_store_error};
use super::rows::{MESSAGE_COUNT, index_pending, now};
use crate::copy::{
    Column, Dump, Kind, Load, MARKER_TABLE, Page, PageKey, PageLimit, Row, StoreCopy, Table,
    TargetState, Value, quoted, upsert_clause_of, wrong_kind,
};
use crate::{Result, StoreError, Timestamp};

/// The columns a table's pages are ordered and resumed by.
fn order_columns(table: Table) -> Vec<&'static str> {
    match table {
        // `WITHOUT ROWID`: the primary key is all there is.
        Table::InboundSeen | Table::AdapterCursors | Table::OwedTurns => table.key().to_vec(),
        _ => vec!["rowid"],
    }
}

/// Whether this file holds `column` of `table` as a column. The one it
/// does not, `sessions.message_count`, is counted from `messages` when
/// read ([`MESSAGE_COUNT`]) and needs no writing.
fn stored(table: Table, column: &str) -> bool {
    !(table == Table::Sessions && column == "message_count")
}

/// What a dump selects for `column`.
fn select_expr(table: Table, column: &str) -> String {
    if stored(table, column) {
        quoted(column)
    } else {
        MESSAGE_COUNT.to_owned()
    }
}

/// The statement for one page: the order columns, then the copied ones;
/// after the previous page's order values when `resume` is set.
fn page_sql(table: Table, resume: bool) -> String {
    let order: Vec<String> = order_columns(table)
        .into_iter()
        .map(|c| {
            if c == "rowid" {
                c.to_owned()
            } else {
                quoted(c)
            }
        })
        .collect();
    let order = order.join(", ");
    let filter = if resume {
        let marks = (1..=order_columns(table).len())
            .map(|i| format!("?{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        format!("WHERE ({order}) > ({marks})")
    } else {
        String::new()
    };
    let columns = table
        .columns()
        .iter()
        .map(|c| select_expr(table, c.name))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "SELECT {order}, {columns} FROM {name} {filter} ORDER BY {order}",
        name = quoted(table.name()),
    )
}

/// A column's value as the copy carries it.
fn read_value(table: Table, column: &Column, value: ValueRef<'_>) -> Result<Value> {
    let bad = |found: Value| wrong_kind(table, column, &found);
    Ok(match (column.kind, value) {
        (_, ValueRef::Null) => Value::Null,
        (Kind::Text, ValueRef::Text(bytes)) => {
            Value::Text(String::from_utf8(bytes.to_vec()).map_err(|_| {
                StoreError::Database(format!(
                    "cannot copy {table}.{}: it holds text that is not UTF-8",
                    column.name
                ))
            })?)
        }
        (Kind::Int, ValueRef::Integer(n)) => Value::Int(n),
        // A REAL column may keep a whole number as an integer.
        (Kind::Real, ValueRef::Integer(n)) => Value::Real(n as f64),
        (Kind::Real, ValueRef::Real(x)) => Value::Real(x),
        (Kind::Bool, ValueRef::Integer(n)) => Value::Bool(n != 0),
        (_, ValueRef::Integer(n)) => return Err(bad(Value::Int(n))),
        (_, ValueRef::Real(x)) => return Err(bad(Value::Real(x))),
        (_, ValueRef::Text(bytes)) => {
            return Err(bad(Value::Text(
                String::from_utf8_lossy(bytes).into_owned(),
            )));
        }
        (_, ValueRef::Blob(_)) => return Err(bad(Value::Text("<blob>".to_owned()))),
    })
}

/// A value as SQLite stores it (a flag as 0 or 1).
fn to_sql(value: &Value) -> rusqlite::types::Value {
    use rusqlite::types::Value as Sql;
    match value {
        Value::Null => Sql::Null,
        Value::Int(n) => Sql::Integer(*n),
        Value::Real(x) => Sql::Real(*x),
        Value::Text(s) => Sql::Text(s.clone()),
        Value::Bool(b) => Sql::Integer(i64::from(*b)),
    }
}

fn count_rows(conn: &Connection, table: Table) -> OpResult<u64> {
    let n: i64 = conn
        .prepare_cached(&format!("SELECT count(*) FROM {}", quoted(table.name())))?
        .query_row([], |r| r.get(0))?;
    u64::try_from(n).map_err(|_| {
        OpError::Store(StoreError::Database(format!(
            "{table} reports {n} rows, which is not a count"
        )))
    })
}

/// A dump: a read-only connection holding one read transaction open.
struct SqliteDump {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
    source: String,
}

impl SqliteDump {
    fn open(path: &Path, opts: &super::SqliteOptions) -> Result<SqliteDump> {
        let failed = |e: rusqlite::Error| to_store_error(OpError::Sql(e), path);
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(failed)?;
        configure(&conn, opts).map_err(failed)?;
        conn.pragma_update(None, "query_only", true)
            .map_err(failed)?;
        // The snapshot starts with the first read, and holds until COMMIT.
        conn.execute_batch("BEGIN").map_err(failed)?;
        conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
            r.get::<_, i64>(0)
        })
        .map_err(failed)?;
        let source = std::fs::canonicalize(path)
            .unwrap_or_else(|_| path.to_path_buf())
            .display()
            .to_string();
        Ok(SqliteDump {
            conn: Arc::new(Mutex::new(conn)),
            path: path.to_path_buf(),
            source,
        })
    }

    /// Runs `op` on the dump's connection on the blocking pool.
    async fn run<T, F>(&self, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> OpResult<T> + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        let path = self.path.clone();
        super::join(
            tokio::task::spawn_blocking(move || {
                let conn = lock(&conn);
                op(&conn).map_err(|e| to_store_error(e, &path))
            })
            .await,
        )
    }
}

/// Reads one page: rows in order until `limit` is reached.
fn read_page(
    conn: &Connection,
    table: Table,
    after: Option<&[Value]>,
    limit: PageLimit,
) -> OpResult<Option<Page>> {
    let order = order_columns(table).len();
    let mut stmt = conn.prepare_cached(&page_sql(table, after.is_some()))?;
    let mut rows = match after {
        Some(key) => stmt.query(params_from_iter(key.iter().map(to_sql)))?,
        None => stmt.query([])?,
    };
    let columns = table.columns();
    let mut out: Vec<Row> = Vec::new();
    let mut last_key: Vec<Value> = Vec::new();
    let mut bytes = 0usize;
    while out.len() < limit.rows.max(1) && (out.is_empty() || bytes < limit.bytes) {
        let Some(row) = rows.next()? else { break };
        let mut key = Vec::with_capacity(order);
        for i in 0..order {
            key.push(match row.get_ref(i)? {
                ValueRef::Integer(n) => Value::Int(n),
                ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
                other => {
                    return Err(OpError::Store(StoreError::Database(format!(
                        "cannot page through {table}: a key reads {other:?}"
                    ))));
                }
            });
        }
        let mut values = Vec::with_capacity(columns.len());
        for (i, column) in columns.iter().enumerate() {
            let value = read_value(table, column, row.get_ref(order + i)?)?;
            bytes = bytes.saturating_add(value.size());
            values.push(value);
        }
        out.push(values);
        last_key = key;
    }
    if out.is_empty() {
        return Ok(None);
    }
    Ok(Some(Page {
        rows: out,
        next: PageKey(last_key),
    }))
}

#[async_trait]
impl Dump for SqliteDump {
    fn source(&self) -> &str {
        &self.source
    }

    async fn count(&mut self, table: Table) -> Result<u64> {
        self.run(move |conn| count_rows(conn, table)).await
    }

    async fn page(
        &mut self,
        table: Table,
        after: Option<&PageKey>,
        limit: PageLimit,
    ) -> Result<Option<Page>> {
        let after = after.map(|k| k.0.clone());
        self.run(move |conn| read_page(conn, table, after.as_deref(), limit))
            .await
    }

    async fn close(self: Box<Self>) -> Result<()> {
        self.run(|conn| Ok(conn.execute_batch("COMMIT")?)).await
    }
}

/// A load into this store: every write is one operation of its writer.
struct SqliteLoad {
    store: SqliteStore,
    target: String,
}

/// The marker's DDL (see [`crate::copy::MARKER_TABLE`]).
fn marker_ddl() -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {MARKER_TABLE} (\
             id          INTEGER PRIMARY KEY CHECK (id = 1), \
             source      TEXT NOT NULL, \
             started_at  REAL NOT NULL, \
             finished_at REAL)"
    )
}

fn begin(tx: &Transaction<'_>, source: &str) -> OpResult<TargetState> {
    let has_marker = tx
        .prepare_cached("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1")?
        .exists(params![MARKER_TABLE])?;
    if has_marker {
        let marker: Option<(String, Timestamp, Option<Timestamp>)> = tx
            .prepare_cached(&format!(
                "SELECT source, started_at, finished_at FROM {MARKER_TABLE} WHERE id = 1"
            ))?
            .query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()?;
        if let Some((marked, started_at, finished_at)) = marker {
            return Ok(TargetState::from_marker(
                source,
                marked,
                started_at,
                finished_at,
            ));
        }
    }
    let mut rows = Vec::new();
    for table in Table::ALL {
        let n = count_rows(tx, table)?;
        if n > 0 {
            rows.push((table, n));
        }
    }
    if !rows.is_empty() {
        return Ok(TargetState::InUse { rows });
    }
    tx.execute_batch(&marker_ddl())?;
    tx.prepare_cached(&format!(
        "INSERT INTO {MARKER_TABLE} (id, source, started_at) VALUES (1, ?1, ?2)"
    ))?
    .execute(params![source, now()])?;
    Ok(TargetState::Empty)
}

/// The upsert for one row of `table`, over the columns this file stores.
fn insert_sql(table: Table) -> String {
    let name = quoted(table.name());
    let names: Vec<&str> = table
        .columns()
        .iter()
        .map(|c| c.name)
        .filter(|c| stored(table, c))
        .collect();
    let marks = (1..=names.len())
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let key = table
        .key()
        .iter()
        .map(|k| quoted(k))
        .collect::<Vec<_>>()
        .join(", ");
    let conflict = match upsert_clause_of(table, &names, &name, "IS NOT") {
        Some((set, changed)) => format!("DO UPDATE SET {set} WHERE {changed}"),
        None => "DO NOTHING".to_owned(),
    };
    let columns = names
        .iter()
        .map(|c| quoted(c))
        .collect::<Vec<_>>()
        .join(", ");
    format!("INSERT INTO {name} ({columns}) VALUES ({marks}) ON CONFLICT ({key}) {conflict}")
}

fn write_rows(tx: &Transaction<'_>, table: Table, rows: &[Row]) -> OpResult<()> {
    let width = table.columns().len();
    let mut stmt = tx.prepare_cached(&insert_sql(table))?;
    for row in rows {
        if row.len() != width {
            return Err(OpError::Store(StoreError::Database(format!(
                "cannot copy a row of {table}: {} values for {width} columns",
                row.len()
            ))));
        }
        let values = row
            .iter()
            .zip(table.columns())
            .filter(|(_, c)| stored(table, c.name))
            .map(|(v, _)| to_sql(v));
        stmt.execute(params_from_iter(values))?;
    }
    if table == Table::Messages {
        index_pending(tx)?;
    }
    Ok(())
}

#[async_trait]
impl Load for SqliteLoad {
    fn target(&self) -> &str {
        &self.target
    }

    fn start_over(&self) -> String {
        format!(
            "move {} aside (with its -wal and -shm files) and copy again",
            self.target
        )
    }

    async fn begin(&mut self, source: &str) -> Result<TargetState> {
        let source = source.to_owned();
        self.store.write(move |tx| begin(tx, &source)).await
    }

    async fn write(&mut self, table: Table, rows: &[Row]) -> Result<()> {
        let rows: Arc<Vec<Row>> = Arc::new(rows.to_vec());
        self.store
            .write(move |tx| write_rows(tx, table, &rows))
            .await
    }

    async fn finish(&mut self) -> Result<()> {
        // Every page indexed its own rows; this catches anything else.
        self.store.write(|tx| index_pending(tx).map(|_| ())).await
    }

    async fn count(&mut self, table: Table) -> Result<u64> {
        self.store.read(move |tx| count_rows(tx, table)).await
    }

    async fn seal(&mut self) -> Result<()> {
        self.store
            .write(|tx| {
                tx.prepare_cached(&format!(
                    "UPDATE {MARKER_TABLE} SET finished_at = ?1 WHERE id = 1"
                ))?
                .execute(params![now()])?;
                Ok(())
            })
            .await
    }
}

/// Dumps read through a read-only connection of their own; loads write
/// through the store's writer. Text is copied byte for byte and times as
/// the same floats.
#[async_trait]
impl StoreCopy for SqliteStore {
    async fn dump(&self) -> Result<Box<dyn Dump>> {
        let path = self.inner.path.clone();
        let opts = self.inner.opts.clone();
        let dump =
            super::join(tokio::task::spawn_blocking(move || SqliteDump::open(&path, &opts)).await)?;
        Ok(Box::new(dump))
    }

    async fn load(&self) -> Result<Box<dyn Load>> {
        Ok(Box::new(SqliteLoad {
            store: self.clone(),
            target: self.inner.path.display().to_string(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_prepares_against_the_schema() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("s.db")).unwrap();
        let conn = Connection::open(store.path()).unwrap();
        for table in Table::ALL {
            conn.prepare(&page_sql(table, false)).unwrap();
            conn.prepare(&page_sql(table, true)).unwrap();
            conn.prepare(&insert_sql(table)).unwrap();
        }
    }
}
