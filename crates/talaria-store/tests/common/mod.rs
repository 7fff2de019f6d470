//! Shared helpers for the store's integration tests.
//!
//! # The contract suite
//!
//! A test written once as `async fn name<S: Backend + SomeStore>(f:
//! Fixture<S>)` runs against both backends: list it in
//! [`contract_tests!`] (with `#[macro_use] mod common;`), which makes `sqlite::name` and `postgres::name`.
//! The PostgreSQL tests need a server (see `talaria_testkit::postgres`);
//! they fail (never skip) when it cannot be reached. Each fixture gets a schema of its own, so tests
//! run in parallel on one database.
#![allow(dead_code)]

use std::ops::Deref;
use std::path::PathBuf;
use std::sync::Arc;

use talaria_store::{NewSession, PostgresOptions, PostgresStore, SqliteStore};
use tempfile::TempDir;

/// A fresh store in its own temporary directory (kept alive by the guard).
pub fn temp_store() -> (TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
    (dir, store)
}

pub fn new_session(id: &str, source: &str) -> NewSession {
    NewSession {
        id: id.to_string(),
        source: source.to_string(),
        ..NewSession::default()
    }
}

/// The server the PostgreSQL tests use.
pub fn postgres_url() -> String {
    talaria_testkit::postgres::url()
}

/// Where a fixture's data lives, for raw SQL and for reopening.
pub enum Place {
    Sqlite { dir: TempDir, path: PathBuf },
    Postgres { schema: String },
}

/// A store under test, fresh and empty. Derefs to the store.
pub struct Fixture<S> {
    pub store: Arc<S>,
    pub place: Place,
}

impl<S> Deref for Fixture<S> {
    type Target = S;
    fn deref(&self) -> &S {
        &self.store
    }
}

/// What the contract suite needs of a backend.
pub trait Backend: Sized + Send + Sync + 'static {
    /// A fresh, empty store.
    fn fresh() -> impl std::future::Future<Output = Fixture<Self>> + Send;
    /// A second handle on the same data, as another process would open it.
    fn reopen(place: &Place) -> impl std::future::Future<Output = Self> + Send;
}

impl Backend for SqliteStore {
    async fn fresh() -> Fixture<SqliteStore> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let store = Arc::new(SqliteStore::open(&path).unwrap());
        Fixture {
            store,
            place: Place::Sqlite { dir, path },
        }
    }

    async fn reopen(place: &Place) -> SqliteStore {
        match place {
            Place::Sqlite { path, .. } => SqliteStore::open(path).unwrap(),
            Place::Postgres { .. } => unreachable!("an SQLite fixture has an SQLite place"),
        }
    }
}

impl Backend for PostgresStore {
    async fn fresh() -> Fixture<PostgresStore> {
        let schema = fresh_schema().await;
        let store = Arc::new(open_postgres(&schema).await);
        Fixture {
            store,
            place: Place::Postgres { schema },
        }
    }

    async fn reopen(place: &Place) -> PostgresStore {
        match place {
            Place::Postgres { schema } => open_postgres(schema).await,
            Place::Sqlite { .. } => unreachable!("a PostgreSQL fixture has a PostgreSQL place"),
        }
    }
}

async fn open_postgres(schema: &str) -> PostgresStore {
    let mut options = PostgresOptions::new(postgres_url());
    options.schema = Some(schema.to_owned());
    options.max_connections = 4;
    match PostgresStore::connect(options).await {
        Ok(store) => store,
        Err(e) => panic!(
            "the PostgreSQL contract tests need a server at {} (set TALARIA_TEST_POSTGRES_URL): {e}",
            postgres_url()
        ),
    }
}

async fn fresh_schema() -> String {
    talaria_testkit::postgres::fresh_schema().await
}

/// A plain connection, for raw SQL beside the store.
pub async fn raw_postgres(schema: Option<&str>) -> tokio_postgres::Client {
    talaria_testkit::postgres::connect(schema).await
}

impl<S> Fixture<S> {
    /// Runs one statement on the fixture's database, outside the store:
    /// for staging what the API cannot (rows aged into the past). Times
    /// are Unix seconds in both backends, so most statements read the
    /// same in both dialects. Returns the rows changed.
    pub async fn execute(&self, sql: &str) -> u64 {
        match &self.place {
            Place::Sqlite { path, .. } => {
                let conn = rusqlite::Connection::open(path).unwrap();
                conn.busy_timeout(std::time::Duration::from_secs(5))
                    .unwrap();
                conn.execute(sql, []).unwrap() as u64
            }
            Place::Postgres { schema } => {
                let client = raw_postgres(Some(schema)).await;
                client.execute(sql, &[]).await.unwrap()
            }
        }
    }

    /// One number from the fixture's database (a count, a stamp).
    pub async fn query_f64(&self, sql: &str) -> Option<f64> {
        match &self.place {
            Place::Sqlite { path, .. } => {
                let conn = rusqlite::Connection::open(path).unwrap();
                conn.query_row(sql, [], |r| r.get::<_, Option<f64>>(0))
                    .unwrap()
            }
            Place::Postgres { schema } => {
                let client = raw_postgres(Some(schema)).await;
                let row = client
                    .query_one(&format!("SELECT ({sql})::float8"), &[])
                    .await
                    .unwrap();
                row.get(0)
            }
        }
    }
}

impl<S: Backend> Fixture<S> {
    /// Another handle on the same data (a restart, or a second process).
    pub async fn reopen(&self) -> S {
        S::reopen(&self.place).await
    }
}

impl Fixture<PostgresStore> {
    /// Opens the fixture's schema again, returning what `connect` says.
    pub async fn reopen_result(&self) -> talaria_store::Result<PostgresStore> {
        let Place::Postgres { schema } = &self.place else {
            unreachable!("a PostgreSQL fixture has a PostgreSQL place")
        };
        let mut options = PostgresOptions::new(postgres_url());
        options.schema = Some(schema.clone());
        PostgresStore::connect(options).await
    }
}

/// Makes `sqlite::$name` and `postgres::$name` tests of each generic
/// `async fn $name<S>(f: Fixture<S>)` listed.
#[allow(unused_macros)]
macro_rules! contract_tests {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let fixture = <talaria_store::SqliteStore as crate::common::Backend>::fresh().await;
                    super::$name(fixture).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let fixture = <talaria_store::PostgresStore as crate::common::Backend>::fresh().await;
                    super::$name(fixture).await;
                }
            )*
        }
    };
}

/// A node id, checked.
pub fn node_id(name: &str) -> talaria_store::NodeId {
    talaria_store::NodeId::new(name).unwrap()
}

/// Registers `name` as a live node (for a minute) in `store`.
pub async fn live_node<S: talaria_store::ClusterStore>(
    store: &S,
    name: &str,
) -> talaria_store::NodeId {
    let node = node_id(name);
    store
        .heartbeat(
            &talaria_store::NodeAnnouncement {
                id: node.clone(),
                host: "host-a".to_owned(),
                pid: 4242,
                started_at: Some(1),
                version: "test".to_owned(),
            },
            60.0,
        )
        .await
        .unwrap();
    node
}
