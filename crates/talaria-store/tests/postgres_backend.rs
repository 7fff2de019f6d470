//! What is particular to the PostgreSQL backend: connecting, migrating
//! (once, even when nodes start together), refusing what it cannot use.

use crate::common;

use common::{Backend, postgres_url, raw_postgres};
use talaria_store::{PostgresOptions, PostgresStore, StoreError};

/// Six "nodes" open one schema that does not exist yet, all at once: the
/// schema, the version table and every step are created exactly once,
/// and none of them fails on the race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_starting_together_migrate_once() {
    let schema = talaria_testkit::postgres::fresh_schema().await;
    let opens: Vec<_> = (0..6)
        .map(|_| {
            let mut options = PostgresOptions::new(postgres_url());
            options.schema = Some(schema.clone());
            options.max_connections = 1;
            tokio::spawn(PostgresStore::connect(options))
        })
        .collect();
    for open in opens {
        open.await.unwrap().unwrap();
    }
    let client = raw_postgres(Some(&schema)).await;
    let rows = client
        .query("SELECT version FROM talaria_schema", &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_from_a_newer_build_is_refused() {
    let fixture = PostgresStore::fresh().await;
    fixture
        .execute("UPDATE talaria_schema SET version = version + 100")
        .await;
    let err = fixture.reopen_result().await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("newer Talaria"), "{text}");
}

#[tokio::test]
async fn an_unreachable_server_is_a_clear_error_not_a_hang() {
    // Nothing listens on port 1 of loopback.
    let mut options = PostgresOptions::new("postgres://talaria:hunter2@127.0.0.1:1/talaria");
    options.connect_timeout = std::time::Duration::from_secs(2);
    let err = PostgresStore::connect(options).await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, StoreError::Database(_) | StoreError::Busy),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "the password leaked: {text}");
}

#[tokio::test]
async fn a_malformed_url_is_refused_with_the_reason() {
    let err = PostgresStore::connect(PostgresOptions::new("postgres://h:notaport/x"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("invalid PostgreSQL URL"), "{err}");
}

#[tokio::test]
async fn the_clock_is_the_servers() {
    let fixture = PostgresStore::fresh().await;
    let server = fixture.now().await.unwrap();
    let local = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    // Same machine here, so the two clocks agree closely.
    assert!((server - local).abs() < 5.0, "{server} vs {local}");
}
