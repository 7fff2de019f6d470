//! Files of the home that every node of a deployment shares: the memory
//! files and the skills, on a backend that several nodes use at once.
//!
//! On SQLite the home's files are the only copy and nothing here is used.
//! On PostgreSQL the store holds the authoritative copy of each shared
//! file, stamped with a revision from one counter that only moves forward;
//! each node keeps its files in step with it (the agent's `shared_home`
//! module does that) and the file layout stays the interface for everything
//! that reads them.
//!
//! Writers never lose each other's changes: a write names the revision it
//! was based on, and one made on a stale copy is refused as a
//! [`SharedConflict`], so the writer reads the newer copy and tries again.
//! Deleting a file leaves a tombstone (a row without content), so a node
//! that has not seen the delete yet learns of it instead of putting the
//! file back.

use async_trait::async_trait;

use crate::Result;

/// Largest file the store shares, in bytes. A skill's support files are
/// text and small pictures; anything bigger stays on the node that has it.
pub const MAX_SHARED_FILE_BYTES: usize = 8 * 1024 * 1024;

/// One shared file as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedFile {
    /// Relative to the home, `/`-separated (`memories/MEMORY.md`).
    pub path: String,
    /// The bytes; `None` when the file was deleted.
    pub content: Option<Vec<u8>>,
    /// The revision of the write that left the file this way.
    pub revision: i64,
}

/// A shared file without its bytes: what a node compares its own copy to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedFileInfo {
    /// Relative to the home, `/`-separated.
    pub path: String,
    /// SHA-256 of the bytes, lowercase hex; `None` when deleted.
    pub sha256: Option<String>,
    /// The revision of the write that left the file this way.
    pub revision: i64,
}

/// What a write expects the file to be before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Whatever is there (a write that must win, such as an operator's).
    Anything,
    /// Never written, or the store's row is at exactly this revision.
    Revision(Option<i64>),
}

/// One file of a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedWrite {
    /// Relative to the home, `/`-separated.
    pub path: String,
    /// The new bytes; `None` deletes the file.
    pub content: Option<Vec<u8>>,
    /// What the writer based the change on.
    pub expect: Expect,
}

/// A write refused because a file moved on since the writer read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedConflict {
    /// The first file whose revision was not the one expected.
    pub path: String,
    /// Its revision now (`None`: it was never written).
    pub revision: Option<i64>,
}

/// The shared files of a multi-node backend.
#[async_trait]
pub trait SharedFileStore: Send + Sync {
    /// Files written after revision `after`, oldest first, at most `limit`
    /// of them (a node catching up pages through them).
    async fn shared_files_since(&self, after: i64, limit: usize) -> Result<Vec<SharedFile>>;

    /// The file at `path` as the store holds it (tombstones included).
    async fn shared_file(&self, path: &str) -> Result<Option<SharedFile>>;

    /// Every file under `prefix` (a path, or a folder ending in `/`),
    /// without bytes, in path order; at most `limit`.
    async fn shared_file_list(&self, prefix: &str, limit: usize) -> Result<Vec<SharedFileInfo>>;

    /// Writes every file of `writes` in one transaction under one new
    /// revision, which it returns; or writes nothing and names the first
    /// file whose revision was not the one expected. An empty write is
    /// refused as bad input.
    async fn put_shared_files(
        &self,
        writes: &[SharedWrite],
    ) -> Result<std::result::Result<i64, SharedConflict>>;

    /// The newest revision written (0 before any write).
    async fn shared_revision(&self) -> Result<i64>;
}

/// Whether `path` is one the store may hold: relative, `/`-separated, made
/// of plain names only (no `.`, `..`, empty parts or backslashes), under
/// `memories/` or `skills/`. Both the writer and every node applying a
/// file check this, so no row can make a node write outside those folders.
pub fn valid_shared_path(path: &str) -> bool {
    let mut parts = path.split('/');
    let Some(root) = parts.next() else {
        return false;
    };
    if !matches!(root, "memories" | "skills") {
        return false;
    }
    let mut any = false;
    for part in parts {
        if part.is_empty()
            || part == "."
            || part == ".."
            || part.contains('\\')
            || part.contains('\0')
        {
            return false;
        }
        any = true;
    }
    any && path.len() <= 1024
}

#[cfg(test)]
mod tests {
    use super::valid_shared_path;

    #[test]
    fn shared_paths_stay_in_the_two_folders() {
        for good in [
            "memories/MEMORY.md",
            "skills/cooking/SKILL.md",
            "skills/a/references/b.md",
        ] {
            assert!(valid_shared_path(good), "{good}");
        }
        for bad in [
            "",
            "memories",
            "memories/",
            "/memories/MEMORY.md",
            "config.yaml",
            ".env",
            "skills/../.env",
            "skills/./a",
            "skills//a",
            "skills/a\\b",
            "state.db",
        ] {
            assert!(!valid_shared_path(bad), "{bad}");
        }
    }
}
