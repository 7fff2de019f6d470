//! Shared helpers for the store's integration tests.
#![allow(dead_code)]

use talaria_store::{NewSession, SqliteStore};
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
