//! Behaviour while another connection holds the write lock.

use crate::common;

use std::time::{Duration, Instant};

use common::new_session;
use talaria_core::Message;
use talaria_store::sqlite::SqliteOptions;
use talaria_store::{SessionStore, SqliteStore, StoreError};

fn quick_options() -> SqliteOptions {
    SqliteOptions {
        busy_timeout: Duration::from_millis(50),
        max_attempts: 10,
        retry_budget: Duration::from_millis(600),
        ..SqliteOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn held_lock_gives_busy_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let store = SqliteStore::open_with_options(&path, quick_options()).unwrap();
    store
        .create_session(new_session("s1", "cli"))
        .await
        .unwrap();

    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch("BEGIN IMMEDIATE").unwrap();

    let started = Instant::now();
    let err = store
        .append_message("s1", &Message::user("blocked"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Busy), "{err}");
    // It retried for its budget, and not much longer.
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(500), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");

    // Readers are not blocked by a writer under WAL.
    assert_eq!(store.messages("s1").await.unwrap().len(), 0);

    raw.execute_batch("ROLLBACK").unwrap();
    store
        .append_message("s1", &Message::user("free"))
        .await
        .unwrap();
    assert_eq!(store.messages("s1").await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn write_succeeds_once_the_lock_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let opts = SqliteOptions {
        retry_budget: Duration::from_secs(10),
        max_attempts: 50,
        ..quick_options()
    };
    let store = SqliteStore::open_with_options(&path, opts).unwrap();
    store
        .create_session(new_session("s1", "cli"))
        .await
        .unwrap();

    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let holder_path = path.clone();
    let holder = std::thread::spawn(move || {
        let raw = rusqlite::Connection::open(&holder_path).unwrap();
        raw.execute_batch("BEGIN IMMEDIATE").unwrap();
        locked_tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(400));
        let released = Instant::now();
        raw.execute_batch("COMMIT").unwrap();
        released
    });
    locked_rx.recv().unwrap();

    let id = store
        .append_message("s1", &Message::user("eventually"))
        .await
        .unwrap();
    let written = Instant::now();
    // The write began while the lock was held and ended after its release
    // began: it waited for the lock, however slow or fast this machine.
    let released = holder.join().unwrap();
    assert!(
        written > released,
        "the write ended before the lock was released"
    );
    let msgs = store.messages("s1").await.unwrap();
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0].id, id);
    assert_eq!(store.session("s1").await.unwrap().unwrap().message_count, 1);
}

#[test]
fn open_while_locked_by_another_process_does_not_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    // A file created by someone else, still locked mid-migration.
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch("PRAGMA journal_mode = WAL; BEGIN IMMEDIATE; CREATE TABLE x(y);")
        .unwrap();
    let result = SqliteStore::open_with_options(&path, quick_options());
    assert!(matches!(result, Err(StoreError::Busy)), "{result:?}");
    raw.execute_batch("ROLLBACK").unwrap();
    SqliteStore::open_with_options(&path, quick_options()).unwrap();
}
