//! Turning user text into a safe FTS5 query.
