//! The embedded SQLite backend.

/// The SQLite-backed [`crate::SessionStore`].
pub struct SqliteStore {}
