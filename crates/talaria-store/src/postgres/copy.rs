//! Reading a PostgreSQL store out and writing a copy into one
//! ([`crate::copy`]).
//!
//! Both ends take a connection out of the pool for themselves (it is
//! closed, not returned, when they are dropped, so nothing they leave
//! open reaches another caller):
//! - a dump holds one `REPEATABLE READ READ ONLY` transaction, so every
//!   page and count reads one snapshot. Sessions are paged by their
//!   creation order (`seq`), messages by id, the rest by primary key;
//!   a page stops at its row limit or once the text in it reaches its byte
//!   limit (a running sum the server computes), so a page never holds more
//!   than one oversized row beyond the limit;
//! - a load holds a session-level advisory lock on `talaria-copy:<schema>`
//!   for as long as it lives, so a second copy into the same schema is
//!   refused (after a short wait, in case the holder just died) rather
//!   than interleaved. Each page is one statement over
//!   arrays (`unnest`), one transaction: an upsert keyed on the primary
//!   key, which leaves identical rows untouched. Messages keep their ids
//!   (`OVERRIDING SYSTEM VALUE`); [`Load::finish`] then moves the identity
//!   sequence past the highest id, never backwards. The search vector is a
//!   generated column, so copied messages are searchable as they land.
//!
//! Where this differs from the SQLite side: text holding U+0000 (which
//! SQLite keeps and a PostgreSQL `text` cannot) is written with U+FFFD in
//! its place, as every write of this backend does; the row counts still
//! match, the text differs in that character only.

use async_trait::async_trait;
use deadpool_postgres::{ClientWrapper, Object};
use tokio_postgres::Row as PgRow;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::rows::clean;
use super::{NOW, PostgresStore};
use crate::copy::{
    Dump, Kind, Load, MARKER_TABLE, Page, PageKey, PageLimit, Row, StoreCopy, Table, TargetState,
    Value, column_list, quoted, upsert_clause, wrong_kind,
};
use crate::{Result, StoreError, Timestamp};

/// How long a load waits for another copy into the same schema to let go.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The columns a table's pages are ordered and resumed by.
fn order_columns(table: Table) -> &'static [&'static str] {
    match table {
        // Creation order, which listings use to break ties: the target
        // gives its sessions the same order by inserting them in it.
        Table::Sessions => &["seq"],
        _ => table.key(),
    }
}

/// The SQL type each kind is read and written as.
fn sql_type(kind: Kind) -> &'static str {
    match kind {
        Kind::Text => "text",
        Kind::Int => "int8",
        Kind::Real => "float8",
        Kind::Bool => "bool",
    }
}

/// The statement for one page: the order columns, then the copied ones
/// (cast to the kind's type, so `integer` columns read as `i64`); after
/// the previous page's order values when `resume` is set. The last two
/// parameters are the row and byte limits.
fn page_sql(table: Table) -> (String, String) {
    let order = order_columns(table)
        .iter()
        .map(|c| quoted(c))
        .collect::<Vec<_>>()
        .join(", ");
    // The order columns again under names of their own: a key column is
    // also a copied column, and the outer query must not find two `id`s.
    let keys = order_columns(table)
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{} AS copy_key_{i}", quoted(c)))
        .collect::<Vec<_>>()
        .join(", ");
    let outer_order = (0..order_columns(table).len())
        .map(|i| format!("copy_key_{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let columns = table
        .columns()
        .iter()
        .map(|c| format!("{}::{}", quoted(c.name), sql_type(c.kind)))
        .collect::<Vec<_>>()
        .join(", ");
    // The text in a row, for the byte limit.
    let mut size = table
        .columns()
        .iter()
        .filter(|c| c.kind == Kind::Text)
        .map(|c| format!("coalesce(octet_length({}), 0)", quoted(c.name)))
        .collect::<Vec<_>>()
        .join(" + ");
    if size.is_empty() {
        size = "0".to_owned();
    }
    let name = quoted(table.name());
    let build = |filter: &str, first_limit: usize| {
        format!(
            "SELECT * FROM (\
                 SELECT {keys}, {columns}, \
                 sum({size}) OVER (ORDER BY {order}) - ({size}) AS copy_bytes_before \
                 FROM {name} {filter} ORDER BY {order} LIMIT ${rows}) page \
             WHERE copy_bytes_before < ${bytes} ORDER BY {outer_order}",
            rows = first_limit,
            bytes = first_limit + 1,
        )
    };
    let marks = (1..=order_columns(table).len())
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ");
    (
        build("", 1),
        build(
            &format!("WHERE ({order}) > ({marks})"),
            order_columns(table).len() + 1,
        ),
    )
}

/// A value as a statement parameter.
fn param(value: &Value) -> Box<dyn ToSql + Sync + Send> {
    match value {
        Value::Null => Box::new(Option::<String>::None),
        Value::Int(n) => Box::new(*n),
        Value::Real(x) => Box::new(*x),
        Value::Text(s) => Box::new(s.clone()),
        Value::Bool(b) => Box::new(*b),
    }
}

/// Reads column `index` of `row` as `kind`.
fn read_value(row: &PgRow, index: usize, kind: Kind) -> std::result::Result<Value, String> {
    let value = match kind {
        Kind::Text => row
            .try_get::<_, Option<String>>(index)
            .map(|v| v.map(Value::Text)),
        Kind::Int => row
            .try_get::<_, Option<i64>>(index)
            .map(|v| v.map(Value::Int)),
        Kind::Real => row
            .try_get::<_, Option<f64>>(index)
            .map(|v| v.map(Value::Real)),
        Kind::Bool => row
            .try_get::<_, Option<bool>>(index)
            .map(|v| v.map(Value::Bool)),
    };
    value
        .map(|v| v.unwrap_or(Value::Null))
        .map_err(|e| e.to_string())
}

/// A pooled connection taken out of the pool: dropping it closes it, so a
/// transaction or a session lock left open ends with it.
async fn own_connection(store: &PostgresStore) -> Result<ClientWrapper> {
    let pooled = store.client().await?;
    Ok(Object::take(pooled))
}

/// `schema` as an identifier.
fn quote_ident(schema: &str) -> String {
    format!("\"{}\"", schema.replace('"', "\"\""))
}

/// Where the connection's unqualified names go, and how people should
/// read it.
async fn describe(store: &PostgresStore, client: &ClientWrapper) -> Result<(String, String)> {
    let row = client
        .query_one("SELECT current_schema()", &[])
        .await
        .map_err(|e| store.error(e))?;
    let schema: Option<String> = row.try_get(0).map_err(|e| store.error(e))?;
    let schema = schema.ok_or_else(|| {
        StoreError::Database(format!(
            "{}: no schema on the search path exists",
            store.inner.target
        ))
    })?;
    let label = format!("{} (schema {schema})", store.inner.target);
    Ok((schema, label))
}

async fn count_rows(store: &PostgresStore, client: &ClientWrapper, table: Table) -> Result<u64> {
    let row = client
        .query_one(
            &format!("SELECT count(*) FROM {}", quoted(table.name())),
            &[],
        )
        .await
        .map_err(|e| store.error(e))?;
    let n: i64 = row.try_get(0).map_err(|e| store.error(e))?;
    u64::try_from(n).map_err(|_| {
        StoreError::Database(format!("{table} reports {n} rows, which is not a count"))
    })
}

/// A dump: its own connection, inside one read-only snapshot.
struct PostgresDump {
    store: PostgresStore,
    client: ClientWrapper,
    source: String,
}

#[async_trait]
impl Dump for PostgresDump {
    fn source(&self) -> &str {
        &self.source
    }

    async fn count(&mut self, table: Table) -> Result<u64> {
        count_rows(&self.store, &self.client, table).await
    }

    async fn page(
        &mut self,
        table: Table,
        after: Option<&PageKey>,
        limit: PageLimit,
    ) -> Result<Option<Page>> {
        let (first, next) = page_sql(table);
        let rows_limit = i64::try_from(limit.rows.max(1)).unwrap_or(i64::MAX);
        // At least one byte, so the first row always fits.
        let bytes_limit = i64::try_from(limit.bytes.max(1)).unwrap_or(i64::MAX);
        let mut owned: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
        let sql = match after {
            Some(key) => {
                owned.extend(key.0.iter().map(param));
                next
            }
            None => first,
        };
        owned.push(Box::new(rows_limit));
        owned.push(Box::new(bytes_limit));
        let params: Vec<&(dyn ToSql + Sync)> = owned
            .iter()
            .map(|p| p.as_ref() as &(dyn ToSql + Sync))
            .collect();
        let statement = self
            .client
            .prepare_cached(&sql)
            .await
            .map_err(|e| self.store.error(e))?;
        let found = self
            .client
            .query(&statement, &params)
            .await
            .map_err(|e| self.store.error(e))?;
        let keys = order_columns(table).len();
        let columns = table.columns();
        let bad = |what: String| StoreError::Database(format!("cannot copy {table}: {what}"));
        let mut rows = Vec::with_capacity(found.len());
        let mut last_key = Vec::new();
        for row in &found {
            let mut key = Vec::with_capacity(keys);
            for i in 0..keys {
                // Keys are bigint (`seq`, ids, times) or text.
                let value = match row.try_get::<_, i64>(i) {
                    Ok(n) => Value::Int(n),
                    Err(_) => Value::Text(
                        row.try_get::<_, String>(i)
                            .map_err(|e| bad(e.to_string()))?,
                    ),
                };
                key.push(value);
            }
            let mut values = Vec::with_capacity(columns.len());
            for (i, column) in columns.iter().enumerate() {
                values.push(read_value(row, keys + i, column.kind).map_err(&bad)?);
            }
            rows.push(values);
            last_key = key;
        }
        if rows.is_empty() {
            return Ok(None);
        }
        Ok(Some(Page {
            rows,
            next: PageKey(last_key),
        }))
    }

    async fn close(self: Box<Self>) -> Result<()> {
        self.client
            .batch_execute("COMMIT")
            .await
            .map_err(|e| self.store.error(e))
    }
}

/// A load: its own connection, holding the copy lock of its schema.
struct PostgresLoad {
    store: PostgresStore,
    client: ClientWrapper,
    schema: String,
    target: String,
}

impl PostgresLoad {
    /// The marker table, qualified: an unqualified name could resolve to
    /// another schema's table further along the search path.
    fn marker(&self) -> String {
        format!("{}.{MARKER_TABLE}", quote_ident(&self.schema))
    }
}

/// The upsert for a page of `table`, as one statement over arrays.
fn insert_sql(table: Table) -> String {
    let name = quoted(table.name());
    let arrays = table
        .columns()
        .iter()
        .enumerate()
        .map(|(i, c)| format!("${}::{}[]", i + 1, sql_type(c.kind)))
        .collect::<Vec<_>>()
        .join(", ");
    let key = table
        .key()
        .iter()
        .map(|k| quoted(k))
        .collect::<Vec<_>>()
        .join(", ");
    let conflict = match upsert_clause(table, &name, "IS DISTINCT FROM") {
        Some((set, changed)) => format!("DO UPDATE SET {set} WHERE {changed}"),
        None => "DO NOTHING".to_owned(),
    };
    // Message ids are an identity column that refuses given values unless
    // told otherwise.
    let overriding = if table == Table::Messages {
        "OVERRIDING SYSTEM VALUE"
    } else {
        ""
    };
    format!(
        "INSERT INTO {name} ({columns}) {overriding} SELECT * FROM unnest({arrays}) \
         ON CONFLICT ({key}) {conflict}",
        columns = column_list(table),
    )
}

/// One column of a page, as the array its parameter binds.
enum ColumnArray {
    Text(Vec<Option<String>>),
    Int(Vec<Option<i64>>),
    Real(Vec<Option<f64>>),
    Bool(Vec<Option<bool>>),
}

impl ColumnArray {
    fn as_param(&self) -> &(dyn ToSql + Sync) {
        match self {
            ColumnArray::Text(v) => v,
            ColumnArray::Int(v) => v,
            ColumnArray::Real(v) => v,
            ColumnArray::Bool(v) => v,
        }
    }
}

/// `rows` turned column-wise, each value checked against its column.
fn columns_of(table: Table, rows: &[Row]) -> Result<Vec<ColumnArray>> {
    let columns = table.columns();
    let mut arrays: Vec<ColumnArray> = columns
        .iter()
        .map(|c| match c.kind {
            Kind::Text => ColumnArray::Text(Vec::with_capacity(rows.len())),
            Kind::Int => ColumnArray::Int(Vec::with_capacity(rows.len())),
            Kind::Real => ColumnArray::Real(Vec::with_capacity(rows.len())),
            Kind::Bool => ColumnArray::Bool(Vec::with_capacity(rows.len())),
        })
        .collect();
    for row in rows {
        if row.len() != columns.len() {
            return Err(StoreError::Database(format!(
                "cannot copy a row of {table}: {} values for {} columns",
                row.len(),
                columns.len()
            )));
        }
        for ((column, array), value) in columns.iter().zip(arrays.iter_mut()).zip(row) {
            match (array, value) {
                (ColumnArray::Text(v), Value::Null) => v.push(None),
                (ColumnArray::Int(v), Value::Null) => v.push(None),
                (ColumnArray::Real(v), Value::Null) => v.push(None),
                (ColumnArray::Bool(v), Value::Null) => v.push(None),
                (ColumnArray::Text(v), Value::Text(s)) => v.push(Some(clean(s).into_owned())),
                (ColumnArray::Int(v), Value::Int(n)) => v.push(Some(*n)),
                (ColumnArray::Real(v), Value::Real(x)) => v.push(Some(*x)),
                (ColumnArray::Bool(v), Value::Bool(b)) => v.push(Some(*b)),
                (_, other) => return Err(wrong_kind(table, column, other)),
            }
        }
    }
    Ok(arrays)
}

#[async_trait]
impl Load for PostgresLoad {
    fn target(&self) -> &str {
        &self.target
    }

    fn start_over(&self) -> String {
        if self.schema == "public" {
            "copy into a new schema instead (--schema), or empty this database \
             (`DROP SCHEMA public CASCADE; CREATE SCHEMA public;` if it holds nothing else)"
                .to_owned()
        } else {
            format!(
                "drop the schema (`DROP SCHEMA {} CASCADE;`) and copy again, or copy into \
                 another schema",
                quote_ident(&self.schema)
            )
        }
    }

    async fn begin(&mut self, source: &str) -> Result<TargetState> {
        let store = self.store.clone();
        let err = |e: tokio_postgres::Error| store.error(e);
        let marker = self.marker();
        let tx = self.client.transaction().await.map_err(err)?;
        let exists = tx
            .query_one(
                "SELECT to_regclass(format('%I.%I', current_schema(), $1::text)) IS NOT NULL",
                &[&MARKER_TABLE],
            )
            .await
            .map_err(err)?;
        if exists.try_get::<_, bool>(0).map_err(err)? {
            let row = tx
                .query_opt(
                    &format!("SELECT source, started_at, finished_at FROM {marker} WHERE id = 1"),
                    &[],
                )
                .await
                .map_err(err)?;
            if let Some(row) = row {
                let marked: String = row.try_get(0).map_err(err)?;
                let started_at: Timestamp = row.try_get(1).map_err(err)?;
                let finished_at: Option<Timestamp> = row.try_get(2).map_err(err)?;
                tx.commit().await.map_err(err)?;
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
            let found = tx
                .query_one(
                    &format!("SELECT count(*) FROM {}", quoted(table.name())),
                    &[],
                )
                .await
                .map_err(err)?;
            let n: i64 = found.try_get(0).map_err(err)?;
            if n > 0 {
                rows.push((table, u64::try_from(n).unwrap_or(0)));
            }
        }
        if !rows.is_empty() {
            tx.commit().await.map_err(err)?;
            return Ok(TargetState::InUse { rows });
        }
        tx.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {marker} (\
                 id          integer PRIMARY KEY CHECK (id = 1), \
                 source      text NOT NULL, \
                 started_at  double precision NOT NULL, \
                 finished_at double precision)"
        ))
        .await
        .map_err(err)?;
        tx.execute(
            &format!("INSERT INTO {marker} (id, source, started_at) VALUES (1, $1, {NOW})"),
            &[&clean(source).as_ref()],
        )
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(TargetState::Empty)
    }

    async fn write(&mut self, table: Table, rows: &[Row]) -> Result<()> {
        let store = self.store.clone();
        let err = |e: tokio_postgres::Error| store.error(e);
        let arrays = columns_of(table, rows)?;
        let params: Vec<&(dyn ToSql + Sync)> = arrays.iter().map(ColumnArray::as_param).collect();
        let tx = self.client.transaction().await.map_err(err)?;
        let statement = tx.prepare_cached(&insert_sql(table)).await.map_err(err)?;
        tx.execute(&statement, &params).await.map_err(err)?;
        tx.commit().await.map_err(err)
    }

    async fn finish(&mut self) -> Result<()> {
        // Never backwards: a sequence that already handed out higher ids
        // keeps its place.
        // The ledger's ids are an identity column too.
        for table in ["messages", "model_calls"] {
            self.client
                .execute(
                    &format!(
                        "SELECT setval(s.seq::regclass, GREATEST(s.top, \
                             COALESCE(pg_sequence_last_value(s.seq::regclass), 0))) \
                         FROM (SELECT pg_get_serial_sequence('{table}', 'id') AS seq, \
                               (SELECT max(id) FROM {table}) AS top) s \
                         WHERE s.top IS NOT NULL"
                    ),
                    &[],
                )
                .await
                .map_err(|e| self.store.error(e))?;
        }
        Ok(())
    }

    async fn count(&mut self, table: Table) -> Result<u64> {
        count_rows(&self.store, &self.client, table).await
    }

    async fn seal(&mut self) -> Result<()> {
        self.client
            .execute(
                &format!(
                    "UPDATE {} SET finished_at = {NOW} WHERE id = 1",
                    self.marker()
                ),
                &[],
            )
            .await
            .map_err(|e| self.store.error(e))?;
        Ok(())
    }
}

/// See the module documentation for how each end works.
#[async_trait]
impl StoreCopy for PostgresStore {
    async fn dump(&self) -> Result<Box<dyn Dump>> {
        let client = own_connection(self).await?;
        let (_, source) = describe(self, &client).await?;
        client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await
            .map_err(|e| self.error(e))?;
        Ok(Box::new(PostgresDump {
            store: self.clone(),
            client,
            source,
        }))
    }

    async fn load(&self) -> Result<Box<dyn Load>> {
        let client = own_connection(self).await?;
        let (schema, target) = describe(self, &client).await?;
        // A copy that just died may still hold the lock until the server
        // notices its connection is gone: wait a little before refusing.
        client
            .batch_execute(&format!("SET lock_timeout = '{}ms'", LOCK_WAIT.as_millis()))
            .await
            .map_err(|e| self.error(e))?;
        let locked = client
            .execute(
                "SELECT pg_advisory_lock(hashtext('talaria-copy:' || $1::text))",
                &[&schema],
            )
            .await;
        match locked {
            Ok(_) => {}
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                return Err(StoreError::Conflict(format!(
                    "another copy into {target} is running; wait for it to finish"
                )));
            }
            Err(e) => return Err(self.error(e)),
        }
        client
            .batch_execute("RESET lock_timeout")
            .await
            .map_err(|e| self.error(e))?;
        Ok(Box::new(PostgresLoad {
            store: self.clone(),
            client,
            schema,
            target,
        }))
    }
}

impl PostgresStore {
    /// The source and start of a `store migrate` copy into this database
    /// that never finished, if one did not: a gateway must not run on
    /// such a database, which would look like lost conversations.
    pub async fn unfinished_copy(&self) -> Result<Option<(String, Timestamp)>> {
        let client = self.client().await?;
        let err = |e: tokio_postgres::Error| self.error(e);
        let exists = client
            .query_one(
                "SELECT to_regclass(format('%I.%I', current_schema(), $1::text)) IS NOT NULL",
                &[&MARKER_TABLE],
            )
            .await
            .map_err(err)?;
        if !exists.try_get::<_, bool>(0).map_err(err)? {
            return Ok(None);
        }
        let row = client
            .query_opt(
                &format!(
                    "SELECT source, started_at FROM {} WHERE id = 1 AND finished_at IS NULL",
                    quoted(MARKER_TABLE)
                ),
                &[],
            )
            .await
            .map_err(err)?;
        match row {
            None => Ok(None),
            Some(row) => Ok(Some((
                row.try_get(0).map_err(err)?,
                row.try_get(1).map_err(err)?,
            ))),
        }
    }
}
