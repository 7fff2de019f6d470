//! Session routes (on both backends), and the SQLite schema step that
//! added the gateway's tables.

use crate::common;

use common::{Backend, Fixture, new_session};
use talaria_store::{RouteStore, SessionStore, SqliteStore};

const GATEWAY_TABLES: [&str; 6] = [
    "gateway_routes",
    "delivery_obligations",
    "pairing_pending",
    "pairing_approved",
    "pairing_stamps",
    // The ledger's index of open rows, so sweeps do not scan delivered ones.
    "delivery_obligations_owed",
];

/// Moves a route's stamps back by `secs`, so that the next stamp is later
/// however fast the clock reads, without sleeping.
async fn age_route<S>(f: &Fixture<S>, session_key: &str, secs: f64) {
    // The key is a test constant; the statement reads the same in both
    // dialects.
    let changed = f
        .execute(&format!(
            "UPDATE gateway_routes SET created_at = created_at - {secs}, \
             updated_at = updated_at - {secs} WHERE session_key = '{session_key}'"
        ))
        .await;
    assert_eq!(changed, 1);
}

fn user_version(path: &std::path::Path) -> i64 {
    let raw = rusqlite::Connection::open(path).unwrap();
    raw.query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

fn has_object(path: &std::path::Path, name: &str) -> bool {
    let raw = rusqlite::Connection::open(path).unwrap();
    raw.query_row(
        "SELECT COUNT(*) FROM sqlite_master WHERE name = ?1",
        [name],
        |r| r.get::<_, i64>(0),
    )
    .unwrap()
        == 1
}

async fn a_missing_route_is_none<S: Backend + RouteStore>(store: Fixture<S>) {
    assert_eq!(store.route("telegram:dm:42").await.unwrap(), None);
}

async fn set_route_stamps_both_times_and_replacing_restamps<S: Backend + RouteStore>(
    store: Fixture<S>,
) {
    store.set_route("telegram:dm:42", "s1").await.unwrap();
    let first = store.route("telegram:dm:42").await.unwrap().unwrap();
    assert_eq!(first.session_key, "telegram:dm:42");
    assert_eq!(first.session_id, "s1");
    assert_eq!(first.created_at, first.updated_at);
    assert!(first.created_at > 1_600_000_000.0);

    age_route(&store, "telegram:dm:42", 10.0).await;
    let first = store.route("telegram:dm:42").await.unwrap().unwrap();
    store.set_route("telegram:dm:42", "s2").await.unwrap();
    let second = store.route("telegram:dm:42").await.unwrap().unwrap();
    assert_eq!(second.session_id, "s2");
    assert!(second.created_at > first.created_at);
    assert_eq!(second.created_at, second.updated_at);

    // Other keys are unaffected.
    store.set_route("discord:dm:7", "s3").await.unwrap();
    let again = store.route("telegram:dm:42").await.unwrap().unwrap();
    assert_eq!(again, second);
}

async fn touch_moves_only_updated_at<S: Backend + RouteStore>(store: Fixture<S>) {
    store.set_route("k", "s1").await.unwrap();
    age_route(&store, "k", 10.0).await;
    let before = store.route("k").await.unwrap().unwrap();
    store.touch_route("k").await.unwrap();
    let after = store.route("k").await.unwrap().unwrap();
    assert_eq!(after.session_id, "s1");
    assert_eq!(after.created_at, before.created_at);
    assert!(after.updated_at > before.updated_at);
}

async fn touching_an_unknown_key_does_nothing<S: Backend + RouteStore>(store: Fixture<S>) {
    store.touch_route("nobody").await.unwrap();
    assert_eq!(store.route("nobody").await.unwrap(), None);
}

async fn routes_survive_a_reopen<S: Backend + RouteStore>(store: Fixture<S>) {
    store.set_route("k", "s1").await.unwrap();
    let reopened = store.reopen().await;
    assert_eq!(reopened.route("k").await.unwrap().unwrap().session_id, "s1");
}

contract_tests!(
    a_missing_route_is_none,
    set_route_stamps_both_times_and_replacing_restamps,
    touch_moves_only_updated_at,
    touching_an_unknown_key_does_nothing,
    routes_survive_a_reopen,
);

// SQLite only from here: the file's schema versions.

#[test]
fn a_fresh_database_is_at_the_latest_version_with_the_gateway_cron_inbound_and_cluster_tables() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    drop(SqliteStore::open(&path).unwrap());
    assert_eq!(user_version(&path), 11);
    for name in GATEWAY_TABLES.iter().chain(&[
        "cron_jobs",
        "cron_occurrences",
        "inbound_seen",
        "owed_turns",
        "adapter_cursors",
        "cluster_nodes",
        "cluster_leases",
    ]) {
        assert!(has_object(&path, name), "{name} is missing");
    }
    // Reopening an up-to-date file migrates nothing and still works.
    drop(SqliteStore::open(&path).unwrap());
    assert_eq!(user_version(&path), 11);
}

#[tokio::test]
async fn a_version_1_database_is_upgraded_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let store = SqliteStore::open(&path).unwrap();
        store
            .create_session(new_session("s1", "cli"))
            .await
            .unwrap();
    }
    // Turn the file back into what a V1 build left behind.
    {
        let raw = rusqlite::Connection::open(&path).unwrap();
        raw.execute_batch(
            "DROP TABLE model_calls; ALTER TABLE sessions DROP COLUMN model_choice; \
             ALTER TABLE sessions DROP COLUMN cost_micros; \
             DROP TABLE cron_occurrences; DROP TABLE cron_jobs; \
             DROP TABLE gateway_routes; DROP TABLE delivery_obligations; \
             DROP TABLE pairing_pending; DROP TABLE pairing_approved; \
             DROP TABLE pairing_stamps; DROP TABLE inbound_seen; \
             DROP TABLE adapter_cursors; DROP TABLE fts_progress; \
             DROP TABLE cluster_nodes; DROP TABLE cluster_leases; \
             DROP TABLE owed_turns; \
             ALTER TABLE sessions ADD COLUMN message_count INTEGER NOT NULL DEFAULT 0; \
             DROP TRIGGER messages_fts_delete; DROP TRIGGER messages_fts_update; \
             CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN \
               INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content); \
               INSERT INTO messages_fts_trigram (rowid, content) VALUES (new.id, new.content); \
             END; \
             CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN \
               INSERT INTO messages_fts (messages_fts, rowid, content) \
                 VALUES ('delete', old.id, old.content); \
               INSERT INTO messages_fts_trigram (messages_fts_trigram, rowid, content) \
                 VALUES ('delete', old.id, old.content); \
             END; \
             CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN \
               SELECT 1; \
             END; \
             PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    assert_eq!(user_version(&path), 1);
    assert!(!has_object(&path, "gateway_routes"));

    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(user_version(&path), 11);
    for name in GATEWAY_TABLES.iter().chain(&[
        "inbound_seen",
        "adapter_cursors",
        "cluster_nodes",
        "owed_turns",
    ]) {
        assert!(has_object(&path, name), "{name} is missing");
    }
    // V1 data is untouched and the new tables work.
    assert!(store.session("s1").await.unwrap().is_some());
    store.set_route("k", "s1").await.unwrap();
    assert_eq!(store.route("k").await.unwrap().unwrap().session_id, "s1");
}
