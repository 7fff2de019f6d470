//! Full-text indexing in batches: rows reach the indexes every 64 writes
//! or before a search, never twice, and deleting or editing rows keeps both
//! indexes equal to the table whether or not the rows were indexed yet.

use crate::common;

use std::path::Path;

use common::{new_session, temp_store};
use talaria_core::Message;
use talaria_store::{SearchQuery, SessionStore, SqliteStore};

fn indexed_through(path: &Path) -> i64 {
    let raw = rusqlite::Connection::open(path).unwrap();
    raw.query_row("SELECT indexed_through FROM fts_progress", [], |r| r.get(0))
        .unwrap()
}

/// FTS5's own check that an external-content index matches its table,
/// after a search has brought the indexes up to date (rows not yet indexed
/// would count as a mismatch).
async fn assert_indexes_match_the_table(store: &SqliteStore, path: &Path) {
    store.search(query("anything")).await.unwrap();
    let raw = rusqlite::Connection::open(path).unwrap();
    for table in ["messages_fts", "messages_fts_trigram"] {
        raw.execute(
            &format!("INSERT INTO {table} ({table}, rank) VALUES ('integrity-check', 1)"),
            [],
        )
        .unwrap_or_else(|e| panic!("{table}: {e}"));
    }
}

fn query(text: &str) -> SearchQuery {
    SearchQuery {
        text: text.to_owned(),
        sources: Vec::new(),
        exclude_session: None,
        limit: 10,
    }
}

async fn append(store: &SqliteStore, session: &str, n: usize, word: &str) {
    for i in 0..n {
        store
            .append_message(session, &Message::user(format!("{word} number {i}")))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_row_is_found_at_once_and_indexing_happens_in_batches() {
    let (dir, store) = temp_store();
    let path = dir.path().join("state.db");
    store
        .create_session(new_session("s1", "cli"))
        .await
        .unwrap();
    append(&store, "s1", 10, "zebra").await;
    // Written, not yet indexed: the write path only indexes whole batches.
    assert_eq!(indexed_through(&path), 0);
    let hits = store.search(query("zebra")).await.unwrap();
    assert_eq!(hits.len(), 1, "the session is found");
    assert_eq!(indexed_through(&path), 10);
    // A second search indexes nothing twice.
    assert_eq!(store.search(query("zebra")).await.unwrap().len(), 1);
    assert_indexes_match_the_table(&store, &path).await;

    // 70 more rows: the write path indexed a batch on its own.
    append(&store, "s1", 70, "walrus").await;
    let through = indexed_through(&path);
    assert!((74..80).contains(&through), "{through}");
    assert_indexes_match_the_table(&store, &path).await;
}

#[tokio::test]
async fn deleting_and_editing_rows_keeps_both_indexes_true() {
    let (dir, store) = temp_store();
    let path = dir.path().join("state.db");
    store
        .create_session(new_session("s1", "cli"))
        .await
        .unwrap();
    store
        .create_session(new_session("s2", "cli"))
        .await
        .unwrap();
    append(&store, "s1", 5, "otter").await;
    store.search(query("otter")).await.unwrap();
    // s1's rows are indexed, s2's are not yet.
    append(&store, "s2", 5, "beaver").await;
    {
        let raw = rusqlite::Connection::open(&path).unwrap();
        raw.execute_batch(
            "UPDATE messages SET content = 'heron edited' WHERE id IN (1, 7); \
             DELETE FROM messages WHERE id IN (2, 8);",
        )
        .unwrap();
    }
    assert_indexes_match_the_table(&store, &path).await;
    let hits = store.search(query("heron")).await.unwrap();
    assert_eq!(hits.len(), 2, "{hits:?}");
    assert_indexes_match_the_table(&store, &path).await;
    // Deleted rows are gone from the results, edited ones lost their words.
    let otters: usize = store.search(query("otter")).await.unwrap().len();
    assert_eq!(otters, 1);
}

/// Ids are not an `AUTOINCREMENT` sequence (its counter row cost a page
/// per commit), so a row deleted at the tail after indexing must still
/// never have its id given out again: the new row would pass for indexed.
#[tokio::test]
async fn an_indexed_id_deleted_at_the_tail_is_not_given_out_again() {
    let (dir, store) = temp_store();
    let path = dir.path().join("state.db");
    store
        .create_session(new_session("s1", "cli"))
        .await
        .unwrap();
    append(&store, "s1", 3, "walrus").await;
    store.search(query("walrus")).await.unwrap();
    assert_eq!(indexed_through(&path), 3);
    {
        let raw = rusqlite::Connection::open(&path).unwrap();
        raw.execute("DELETE FROM messages WHERE id IN (2, 3)", [])
            .unwrap();
    }
    let id = store
        .append_message("s1", &Message::user("a puffin arrives"))
        .await
        .unwrap();
    assert_eq!(id, 4);
    let hits = store.search(query("puffin")).await.unwrap();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_indexes_match_the_table(&store, &path).await;
    let raw = rusqlite::Connection::open(&path).unwrap();
    let counters: i64 = raw
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_sequence'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let sequence_rows: i64 = if counters == 0 {
        0
    } else {
        raw.query_row(
            "SELECT count(*) FROM sqlite_sequence WHERE name = 'messages'",
            [],
            |r| r.get(0),
        )
        .unwrap()
    };
    assert_eq!(sequence_rows, 0, "messages ids keep no counter row");
}
