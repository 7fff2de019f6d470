//! Keeping a node's memory files and skills in step with the copy a
//! multi-node store shares ([`talaria_store::shared`]).
//!
//! The files under `memories/` and `skills/` stay the interface: the
//! prompt, the tools, the CLI and the operator read and write them as on a
//! single node. On a backend that shares them (PostgreSQL), this module
//! moves changes both ways:
//!
//! - [`pull`] applies every write the store has after the node's cursor
//!   (`.shared-files` in the home: the last revision applied). A session's
//!   prompt is built right after one, so what any node learned is in the
//!   next session on every node. It costs one indexed query when nothing
//!   changed.
//! - [`push`] sends this node's changes under a folder, deciding each file
//!   three ways: a file that differs from the store's copy is this node's
//!   edit when the store's copy is one the node has already applied (its
//!   revision is at or below the cursor), and another node's, to be
//!   pulled, when it is newer. Every write names the revision it was based
//!   on, so nothing another node wrote meanwhile is overwritten.
//! - [`begin_write`] is the same decision for a tool about to change a
//!   few files (the memory tool), whose [`PendingWrite::commit`] then
//!   writes them expecting the revisions they were brought to, and which
//!   starts over on a conflict.
//!
//! Only plain files are shared: nothing whose name starts with a dot (the
//! cursor, usage counters, archives, temporary files), no lock files, no
//! memory backups, no symlinks, nothing over
//! [`talaria_store::shared::MAX_SHARED_FILE_BYTES`].
//!
//! Pulls and pushes of one home take an exclusive lock on
//! `.shared-files.lock`, so two processes on one home (a gateway and a
//! `talaria chat`) never apply pages out of order.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use talaria_core::Home;
use talaria_store::shared::{MAX_SHARED_FILE_BYTES, valid_shared_path};
use talaria_store::{Expect, SharedFile, SharedFileStore, SharedWrite, StoreError};

/// The file holding the last revision this home applied.
const CURSOR_FILE: &str = ".shared-files";

/// Files one pull reads at a time.
const PAGE: usize = 64;

/// Most files one push compares (a skills folder larger than this is
/// pushed in part, with a warning).
const MAX_LISTED: usize = 20_000;

/// Deepest folder nesting a push walks.
const MAX_DEPTH: usize = 8;

/// What went wrong keeping the home in step.
#[derive(Debug, thiserror::Error)]
pub enum SharedHomeError {
    /// The store refused or could not be reached.
    #[error("the shared store: {0}")]
    Store(#[from] StoreError),
    /// A file of the home could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> SharedHomeError + '_ {
    move |source| SharedHomeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether the file at `rel` (relative to the home, `/`-separated) is one
/// the nodes share.
pub fn is_shared(rel: &str) -> bool {
    if !valid_shared_path(rel) {
        return false;
    }
    let name = rel.rsplit('/').next().unwrap_or(rel);
    !rel.split('/').any(|part| part.starts_with('.'))
        && !name.ends_with(".lock")
        && !name.contains(".bak.")
}

fn sha256_hex(bytes: &[u8]) -> String {
    talaria_core::ids::to_hex(&Sha256::digest(bytes))
}

/// Holds the home's sync lock until dropped.
struct SyncLock(std::fs::File);

impl SyncLock {
    async fn take(home: &Home) -> Result<SyncLock, SharedHomeError> {
        let path = home.root().join(format!("{CURSOR_FILE}.lock"));
        let file = tokio::task::spawn_blocking(move || {
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(&path)
                .map_err(io_at(&path))?;
            fs4::fs_std::FileExt::lock_exclusive(&file).map_err(io_at(&path))?;
            Ok::<_, SharedHomeError>(file)
        })
        .await
        .map_err(|e| SharedHomeError::Io {
            path: home.root().to_path_buf(),
            source: io::Error::other(e.to_string()),
        })??;
        Ok(SyncLock(file))
    }
}

impl Drop for SyncLock {
    fn drop(&mut self) {
        // Closing the file releases the lock too; unlocking first says so.
        let _ = fs4::fs_std::FileExt::unlock(&self.0);
    }
}

/// The last revision this home applied (0 before the first pull).
pub fn cursor(home: &Home) -> i64 {
    std::fs::read_to_string(home.root().join(CURSOR_FILE))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn set_cursor(home: &Home, revision: i64) -> Result<(), SharedHomeError> {
    let path = home.root().join(CURSOR_FILE);
    crate::tools::atomic_write(&path, format!("{revision}\n").as_bytes()).map_err(io_at(&path))
}

/// The local bytes of `rel`; `None` when there is no such regular file.
fn read_local(home: &Home, rel: &str) -> Result<Option<Vec<u8>>, SharedHomeError> {
    let path = home.root().join(rel);
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_file() => std::fs::read(&path).map(Some).map_err(io_at(&path)),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_at(&path)(e)),
    }
}

/// Makes the local file `rel` hold `content` (`None`: absent). Unchanged
/// bytes are left alone, so a pull of a node's own write touches nothing.
fn write_local(home: &Home, rel: &str, content: Option<&[u8]>) -> Result<bool, SharedHomeError> {
    if !is_shared(rel) {
        // A row no writer of ours could have made; never act on it.
        tracing::warn!(
            path = rel,
            "ignored a shared file outside memories/ and skills/"
        );
        return Ok(false);
    }
    let path = home.root().join(rel);
    let now = read_local(home, rel)?;
    if now.as_deref() == content {
        return Ok(false);
    }
    match content {
        Some(bytes) => {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(io_at(parent))?;
            }
            crate::tools::atomic_write(&path, bytes).map_err(io_at(&path))?;
        }
        None => {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_at(&path)(e)),
            }
            remove_empty_parents(home, &path);
        }
    }
    Ok(true)
}

/// Removes the folders a delete emptied, up to (not including) the shared
/// roots: a skill deleted on another node leaves no empty folder here.
fn remove_empty_parents(home: &Home, path: &Path) {
    let roots = [home.memories_dir(), home.skills_dir()];
    let mut dir = path.parent();
    while let Some(d) = dir {
        if roots.iter().any(|r| r == d) || !d.starts_with(home.root()) {
            break;
        }
        if std::fs::remove_dir(d).is_err() {
            break;
        }
        dir = d.parent();
    }
}

/// Applies what the store has after this home's cursor; returns how many
/// local files changed.
pub async fn pull(home: &Home, files: &dyn SharedFileStore) -> Result<usize, SharedHomeError> {
    let _lock = SyncLock::take(home).await?;
    pull_locked(home, files).await
}

async fn pull_locked(home: &Home, files: &dyn SharedFileStore) -> Result<usize, SharedHomeError> {
    let mut after = cursor(home);
    let mut changed = 0;
    loop {
        let page = files.shared_files_since(after, PAGE).await?;
        let Some(last) = page.last().map(|f| f.revision) else {
            break;
        };
        let full = page.len() == PAGE;
        let home2 = home.clone();
        changed += tokio::task::spawn_blocking(move || apply_page(&home2, &page))
            .await
            .map_err(|e| SharedHomeError::Io {
                path: home.root().to_path_buf(),
                source: io::Error::other(e.to_string()),
            })??;
        set_cursor(home, last)?;
        after = last;
        if !full {
            break;
        }
    }
    Ok(changed)
}

fn apply_page(home: &Home, page: &[SharedFile]) -> Result<usize, SharedHomeError> {
    let mut changed = 0;
    for file in page {
        if write_local(home, &file.path, file.content.as_deref())? {
            tracing::debug!(path = %file.path, revision = file.revision, "applied a shared file");
            changed += 1;
        }
    }
    Ok(changed)
}

/// Every shared file under `prefix` on this node, with its bytes' hash.
fn local_files(home: &Home, prefix: &str) -> Result<BTreeMap<String, String>, SharedHomeError> {
    let mut out = BTreeMap::new();
    let start = home.root().join(prefix.trim_end_matches('/'));
    let meta = match std::fs::symlink_metadata(&start) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io_at(&start)(e)),
    };
    if meta.is_file() {
        let rel = prefix.trim_end_matches('/');
        if is_shared(rel)
            && let Some(bytes) = read_local(home, rel)?
            && bytes.len() <= MAX_SHARED_FILE_BYTES
        {
            out.insert(rel.to_owned(), sha256_hex(&bytes));
        }
        return Ok(out);
    }
    if meta.is_dir() {
        walk(home, &start, 0, &mut out)?;
    }
    Ok(out)
}

fn walk(
    home: &Home,
    dir: &Path,
    depth: usize,
    out: &mut BTreeMap<String, String>,
) -> Result<(), SharedHomeError> {
    if depth > MAX_DEPTH || out.len() >= MAX_LISTED {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir).map_err(io_at(dir))? {
        let entry = entry.map_err(io_at(dir))?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let kind = entry.file_type().map_err(io_at(&path))?;
        if kind.is_dir() {
            walk(home, &path, depth + 1, out)?;
        } else if kind.is_file() {
            let Ok(rel) = path.strip_prefix(home.root()) else {
                continue;
            };
            let Some(rel) = rel.to_str().map(|r| r.replace('\\', "/")) else {
                continue;
            };
            if !is_shared(&rel) {
                continue;
            }
            let bytes = std::fs::read(&path).map_err(io_at(&path))?;
            if bytes.len() > MAX_SHARED_FILE_BYTES {
                tracing::warn!(
                    path = %rel,
                    bytes = bytes.len(),
                    "a file too large to share stays on this node only"
                );
                continue;
            }
            out.insert(rel, sha256_hex(&bytes));
            if out.len() >= MAX_LISTED {
                tracing::warn!(prefix = %dir.display(), "too many files to share; pushed in part");
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Sends this node's changes under `prefix` (`skills/`, `skills/cooking/`,
/// `memories/MEMORY.md`) to the store, then pulls; returns how many files
/// were sent. A conflict (another node wrote one of them meanwhile) leaves
/// that file to the pull, which brings the other node's version.
pub async fn push(
    home: &Home,
    files: &dyn SharedFileStore,
    prefix: &str,
) -> Result<usize, SharedHomeError> {
    let _lock = SyncLock::take(home).await?;
    let sent = push_locked(home, files, prefix).await?;
    pull_locked(home, files).await?;
    Ok(sent)
}

async fn push_locked(
    home: &Home,
    files: &dyn SharedFileStore,
    prefix: &str,
) -> Result<usize, SharedHomeError> {
    let seen = cursor(home);
    let stored = files.shared_file_list(prefix, MAX_LISTED).await?;
    let home2 = home.clone();
    let prefix2 = prefix.to_owned();
    let local = tokio::task::spawn_blocking(move || local_files(&home2, &prefix2))
        .await
        .map_err(|e| SharedHomeError::Io {
            path: home.root().to_path_buf(),
            source: io::Error::other(e.to_string()),
        })??;
    let mut writes = Vec::new();
    let mut stored_paths = std::collections::BTreeSet::new();
    for row in &stored {
        stored_paths.insert(row.path.as_str());
        let here = local.get(&row.path);
        if here == row.sha256.as_ref() || row.revision > seen || !is_shared(&row.path) {
            // The same bytes, or another node's change still to pull.
            continue;
        }
        // This node changed (or deleted) a file it had in step.
        let content = match here {
            Some(_) => read_local(home, &row.path)?,
            None => None,
        };
        writes.push(SharedWrite {
            path: row.path.clone(),
            content,
            expect: Expect::Revision(Some(row.revision)),
        });
    }
    for path in local.keys() {
        if !stored_paths.contains(path.as_str()) {
            writes.push(SharedWrite {
                path: path.clone(),
                content: read_local(home, path)?,
                expect: Expect::Revision(None),
            });
        }
    }
    let mut sent = 0;
    // One write per file: a conflict on one must not hold back the rest.
    for write in writes {
        match files.put_shared_files(std::slice::from_ref(&write)).await? {
            Ok(_) => sent += 1,
            Err(conflict) => tracing::info!(
                path = %conflict.path,
                "another node changed this file first; its version is pulled instead"
            ),
        }
    }
    Ok(sent)
}

/// A change to a few shared files in progress (the memory tool's): made
/// by [`begin_write`], which brought the files up to the store's version,
/// and ended by [`PendingWrite::commit`]. It holds the home's sync lock
/// throughout, so no pull and no other write on this home can slip between
/// the read the change is based on and the write that saves it.
pub struct PendingWrite {
    _lock: SyncLock,
    rels: Vec<String>,
    expected: Vec<Option<i64>>,
    /// What the store held of each file at that revision: a file the
    /// change left as it was is not written again (no new revision for
    /// every node to pull).
    stored: Vec<Option<Vec<u8>>>,
}

/// Brings the files `rels` in step before a change: a newer copy in the
/// store replaces the local one; a local change the store has not seen is
/// kept (the change builds on it, and its write carries it along).
pub async fn begin_write(
    home: &Home,
    files: &dyn SharedFileStore,
    rels: &[&str],
) -> Result<PendingWrite, SharedHomeError> {
    let lock = SyncLock::take(home).await?;
    let seen = cursor(home);
    let mut expected = Vec::with_capacity(rels.len());
    let mut stored = Vec::with_capacity(rels.len());
    for rel in rels {
        let Some(row) = files.shared_file(rel).await? else {
            expected.push(None);
            stored.push(None);
            continue;
        };
        let local = read_local(home, rel)?;
        if local != row.content && row.revision > seen {
            write_local(home, rel, row.content.as_deref())?;
        }
        expected.push(Some(row.revision));
        stored.push(row.content);
    }
    Ok(PendingWrite {
        _lock: lock,
        rels: rels.iter().map(|r| (*r).to_owned()).collect(),
        expected,
        stored,
    })
}

impl PendingWrite {
    /// Writes the local files to the store, each expecting the revision it
    /// was brought to, all in one transaction. `Ok(false)`: another node
    /// wrote one of them first; begin again and redo the change.
    pub async fn commit(
        self,
        home: &Home,
        files: &dyn SharedFileStore,
    ) -> Result<bool, SharedHomeError> {
        let mut writes = Vec::with_capacity(self.rels.len());
        for ((rel, expect), stored) in self.rels.iter().zip(&self.expected).zip(&self.stored) {
            let content = read_local(home, rel)?;
            if content == *stored {
                // Unchanged (or absent on both sides): nothing to send.
                continue;
            }
            writes.push(SharedWrite {
                path: rel.clone(),
                content,
                expect: Expect::Revision(*expect),
            });
        }
        if writes.is_empty() {
            return Ok(true);
        }
        Ok(files.put_shared_files(&writes).await?.is_ok())
    }
}

/// At a node's start and now and then after: sends what changed here
/// while nobody was looking (a file edited by hand, a CLI command, a first
/// start on a store that has nothing yet), then pulls. Returns how many
/// files were sent and how many local files the pull changed.
pub async fn reconcile(
    home: &Home,
    files: &dyn SharedFileStore,
) -> Result<(usize, usize), SharedHomeError> {
    let _lock = SyncLock::take(home).await?;
    let mut sent = 0;
    for root in ["memories/", "skills/"] {
        sent += push_locked(home, files, root).await?;
    }
    let applied = pull_locked(home, files).await?;
    Ok((sent, applied))
}

#[cfg(test)]
mod tests {
    use super::is_shared;

    #[test]
    fn only_plain_files_of_the_two_folders_are_shared() {
        assert!(is_shared("memories/MEMORY.md"));
        assert!(is_shared("skills/cooking/SKILL.md"));
        assert!(is_shared("skills/cooking/references/pans.md"));
        assert!(!is_shared("memories/MEMORY.md.lock"));
        assert!(!is_shared("memories/MEMORY.md.bak.1700000000"));
        assert!(!is_shared("skills/.usage.json"));
        assert!(!is_shared("skills/.archive/old/SKILL.md"));
        assert!(!is_shared("skills/cooking/.talaria-x.tmp"));
        assert!(!is_shared(".shared-files"));
        assert!(!is_shared("config.yaml"));
        assert!(!is_shared("skills/../.env"));
    }
}
