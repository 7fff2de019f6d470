//! Opening existing, future and foreign files.

use crate::common;

use common::new_session;
use talaria_core::Message;
use talaria_store::{SessionStore, SqliteStore, StoreError};

#[tokio::test]
async fn reopening_keeps_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let store = SqliteStore::open(&path).unwrap();
        store
            .create_session(new_session("s1", "cli"))
            .await
            .unwrap();
        store
            .append_message("s1", &Message::user("remember the llama"))
            .await
            .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.path(), path);
    let msgs = store.messages("s1").await.unwrap();
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0].message.content, "remember the llama");
    // Appends after a reopen keep going and stay indexed.
    store
        .append_message("s1", &Message::user("and the alpaca"))
        .await
        .unwrap();
    assert_eq!(store.session("s1").await.unwrap().unwrap().message_count, 2);

    let raw = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = raw
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert!(version >= 1);
    let mode: String = raw
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn future_schema_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    drop(SqliteStore::open(&path).unwrap());
    {
        let raw = rusqlite::Connection::open(&path).unwrap();
        raw.execute_batch("PRAGMA user_version = 999").unwrap();
    }
    let err = SqliteStore::open(&path).unwrap_err();
    match err {
        StoreError::Database(msg) => {
            assert!(msg.contains("newer Talaria"), "{msg}");
            assert!(msg.contains("999"), "{msg}");
        }
        other => panic!("unexpected error: {other}"),
    }
}

#[test]
fn garbage_file_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let junk: Vec<u8> = (0..8192u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&path, junk).unwrap();
    let err = SqliteStore::open(&path).unwrap_err();
    match err {
        StoreError::Database(msg) => assert!(msg.contains("not a database"), "{msg}"),
        other => panic!("unexpected error: {other}"),
    }

    std::fs::write(&path, "this is a text file, not sqlite\n".repeat(200)).unwrap();
    assert!(matches!(
        SqliteStore::open(&path),
        Err(StoreError::Database(_))
    ));
}

#[test]
fn foreign_application_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.db");
    {
        let raw = rusqlite::Connection::open(&path).unwrap();
        raw.execute_batch("PRAGMA application_id = 1234; CREATE TABLE t(x);")
            .unwrap();
    }
    let err = SqliteStore::open(&path).unwrap_err();
    assert!(
        matches!(err, StoreError::Database(ref m) if m.contains("another application")),
        "{err}"
    );
}

#[test]
fn missing_parent_directory_is_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no/such/dir/state.db");
    let err = SqliteStore::open(&path).unwrap_err();
    assert!(
        matches!(err, StoreError::Io(ref e) if e.kind() == std::io::ErrorKind::NotFound),
        "{err}"
    );
}

#[test]
fn schema_has_the_documented_shape() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    drop(SqliteStore::open(&path).unwrap());
    let raw = rusqlite::Connection::open(&path).unwrap();
    let names: Vec<String> = raw
        .prepare("SELECT name FROM sqlite_master ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for expected in [
        "sessions",
        "messages",
        "messages_fts",
        "messages_fts_trigram",
        "sessions_source_started",
        "sessions_key",
        "messages_session",
        "fts_progress",
        "messages_fts_update",
        "messages_fts_delete",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "missing {expected}: {names:?}"
        );
    }
}

#[tokio::test]
async fn fts_stays_in_sync_with_content_edits_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let store = SqliteStore::open(&path).unwrap();
    store
        .create_session(new_session("s1", "cli"))
        .await
        .unwrap();
    let id = store
        .append_message("s1", &Message::user("original wombat"))
        .await
        .unwrap();
    // Rows are indexed in batches; a search brings the index up to date.
    store
        .search(talaria_store::SearchQuery {
            text: "wombat".to_owned(),
            sources: Vec::new(),
            exclude_session: None,
            limit: 1,
        })
        .await
        .unwrap();

    let raw = rusqlite::Connection::open(&path).unwrap();
    let count = |q: &str| -> i64 {
        raw.query_row(
            "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?1",
            [q],
            |r| r.get(0),
        )
        .unwrap()
    };
    assert_eq!(count("wombat"), 1);
    raw.execute(
        "UPDATE messages SET content = 'edited numbat' WHERE id = ?1",
        [id],
    )
    .unwrap();
    assert_eq!(count("wombat"), 0);
    assert_eq!(count("numbat"), 1);
    raw.execute("DELETE FROM messages WHERE id = ?1", [id])
        .unwrap();
    assert_eq!(count("numbat"), 0);
    // The index is still consistent with its content table.
    raw.execute_batch("INSERT INTO messages_fts(messages_fts) VALUES('integrity-check')")
        .unwrap();
    raw.execute_batch(
        "INSERT INTO messages_fts_trigram(messages_fts_trigram) VALUES('integrity-check')",
    )
    .unwrap();
}

fn page_size(path: &std::path::Path) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap()
}

/// New databases get the smaller page size; a database created with
/// SQLite's default keeps its pages and its data.
#[tokio::test]
async fn new_databases_get_small_pages_and_old_ones_keep_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = dir.path().join("fresh.db");
    drop(SqliteStore::open(&fresh).unwrap());
    assert_eq!(page_size(&fresh), talaria_store::sqlite::PAGE_SIZE);

    let old = dir.path().join("old.db");
    {
        let raw = rusqlite::Connection::open(&old).unwrap();
        raw.execute_batch("PRAGMA page_size = 4096; CREATE TABLE before_talaria (x)")
            .unwrap();
    }
    assert_eq!(page_size(&old), 4096);
    let store = SqliteStore::open(&old).unwrap();
    store
        .create_session(new_session("s1", "cli"))
        .await
        .unwrap();
    store
        .append_message("s1", &Message::user("still here"))
        .await
        .unwrap();
    drop(store);
    assert_eq!(page_size(&old), 4096);
    let store = SqliteStore::open(&old).unwrap();
    assert_eq!(store.messages("s1").await.unwrap().len(), 1);
}
