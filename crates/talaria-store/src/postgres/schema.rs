//! Schema versions and migrations for PostgreSQL.
//!
//! The version lives in `talaria_schema`, one row. Each step runs in its
//! own transaction with the version bump, holding a transaction-scoped
//! advisory lock, so nodes that start together migrate once and one that
//! dies mid-step leaves the previous version. Steps are append-only: once
//! released, a step is never edited.

use deadpool_postgres::Object;

use crate::{Result, StoreError};

/// Key of the advisory lock migrations hold ("TALA" + 1).
const MIGRATION_LOCK: i64 = 0x5441_4C41_0001;

/// The migration steps, in order; step `i` moves the schema from version
/// `i` to `i + 1`. A step is the concatenation of its parts (one per area
/// of the store, each kept beside the code that uses it).
const STEPS: &[&[&str]] = &[
    &[
        super::sessions::SCHEMA,
        super::search::SCHEMA,
        super::routes::SCHEMA,
        super::gateway::SCHEMA,
        super::cron::SCHEMA,
        super::cluster::SCHEMA,
        super::ledger::SCHEMA,
    ],
    &[super::owed::SCHEMA],
    &[super::gateway::NOTICE_SCHEMA],
    &[super::sessions::MEDIA_SCHEMA, super::ledger::PARTS_SCHEMA],
    &[
        super::sessions::MODEL_CHOICE_SCHEMA,
        super::sessions::THINKING_SCHEMA,
        super::spend::SCHEMA,
    ],
    &[super::shared::SCHEMA],
];

/// The schema version this build writes.
pub(crate) const LATEST: i32 = STEPS.len() as i32;

/// Brings the database to [`LATEST`], creating `schema` first when given.
/// Refuses a database migrated by a newer build.
pub(crate) async fn migrate(client: &mut Object, schema: Option<&str>) -> Result<()> {
    let db = |e: tokio_postgres::Error| {
        let detail = match e.as_db_error() {
            Some(d) => d.message().to_owned(),
            None => e.to_string(),
        };
        StoreError::Database(format!("cannot migrate the PostgreSQL schema: {detail}"))
    };
    // Even `IF NOT EXISTS` races when several nodes create the same
    // object at once (the loser fails on the catalog's unique index), so
    // the schema and the version table are made under the lock too.
    let tx = client.transaction().await.map_err(db)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(db)?;
    if let Some(schema) = schema {
        // The name was validated as a plain identifier by the caller.
        tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
            .await
            .map_err(db)?;
    }
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS talaria_schema (\
             id integer PRIMARY KEY CHECK (id = 1), \
             version integer NOT NULL)",
    )
    .await
    .map_err(db)?;
    tx.commit().await.map_err(db)?;
    let version = current_version(client).await.map_err(db)?;
    if version > LATEST {
        return Err(StoreError::Database(format!(
            "this database was migrated by a newer Talaria (schema version {version}; this \
             build understands up to {LATEST}); upgrade Talaria on this node"
        )));
    }
    for (index, parts) in STEPS.iter().enumerate().skip(version.max(0) as usize) {
        let target = index as i32 + 1;
        let tx = client.transaction().await.map_err(db)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(db)?;
        // Another node may have migrated while this one waited for the lock.
        let row = tx
            .query_opt("SELECT version FROM talaria_schema WHERE id = 1", &[])
            .await
            .map_err(db)?;
        let now: i32 = row.map(|r| r.get(0)).unwrap_or(0);
        if now >= target {
            tx.commit().await.map_err(db)?;
            continue;
        }
        for part in *parts {
            tx.batch_execute(part).await.map_err(db)?;
        }
        tx.execute(
            "INSERT INTO talaria_schema (id, version) VALUES (1, $1) \
             ON CONFLICT (id) DO UPDATE SET version = excluded.version",
            &[&target],
        )
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
        tracing::info!(version = target, "migrated the PostgreSQL schema");
    }
    Ok(())
}

async fn current_version(client: &Object) -> std::result::Result<i32, tokio_postgres::Error> {
    let row = client
        .query_opt("SELECT version FROM talaria_schema WHERE id = 1", &[])
        .await?;
    Ok(row.map(|r| r.get(0)).unwrap_or(0))
}
