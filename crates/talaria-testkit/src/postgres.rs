//! The PostgreSQL server tests run against: its URL, and a fresh schema per
//! test so tests run in parallel on one database.
//!
//! The server is `TALARIA_TEST_POSTGRES_URL`, or
//! `postgres://postgres@127.0.0.1:5432/test`. Tests that need it fail, never
//! skip, when it cannot be reached: `.ci/run` makes sure one is running.

/// The variable that names the test server.
pub const URL_ENV: &str = "TALARIA_TEST_POSTGRES_URL";

/// Schemas made here start with this, then their creation time.
const PREFIX: &str = "talaria_test_";

/// The test server's URL.
pub fn url() -> String {
    std::env::var(URL_ENV).unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A plain connection to the test server, resolving names in `schema`
/// first when given.
///
/// # Panics
/// When the server cannot be reached, saying how to point the tests at one.
pub async fn connect(schema: Option<&str>) -> tokio_postgres::Client {
    let mut config: tokio_postgres::Config = match url().parse() {
        Ok(c) => c,
        Err(e) => panic!("{URL_ENV} is not a PostgreSQL URL: {e}"),
    };
    if let Some(schema) = schema {
        config.options(format!("-c search_path={schema},public"));
    }
    let (client, connection) = match config.connect(tokio_postgres::NoTls).await {
        Ok(pair) => pair,
        Err(e) => panic!(
            "these tests need PostgreSQL at {} (start it, or set {URL_ENV}): {e}",
            url()
        ),
    };
    tokio::spawn(connection);
    client
}

/// A new schema name, unused, after dropping the ones earlier runs left
/// behind (older than an hour: a run still going keeps its own). The
/// store creates the schema when it first connects.
pub async fn fresh_schema() -> String {
    let client = connect(None).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let pattern = format!("{PREFIX}%");
    if let Ok(rows) = client
        .query(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE $1",
            &[&pattern],
        )
        .await
    {
        for row in rows {
            let name: String = row.get(0);
            let born = name
                .strip_prefix(PREFIX)
                .and_then(|rest| rest.split('_').next())
                .and_then(|secs| secs.parse::<u64>().ok());
            if born.is_some_and(|born| born + 3600 < now) {
                // Another run may be dropping it too; either way it goes.
                let _ = client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                    .await;
            }
        }
    }
    format!("{PREFIX}{now}_{:016x}", rand_u64())
}

/// Random enough for a unique name, without a dependency.
fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}
