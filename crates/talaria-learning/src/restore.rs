//! Putting a skill's SKILL.md or a memory file back to a content the
//! learning log kept: one step back (the content before the change that
//! left it as it is now), or any version the log names by hash. Every
//! restore is itself logged, as a `rollback` by whoever asked.
//!
//! Unlike [`crate::skill_history::rollback_skill`] (`talaria skills
//! rollback`: undo the agent's latest change), a step back here undoes
//! whatever change made the current content, whoever made it, so a person
//! editing in the dashboard can undo their own edit, then the one before.
//! Rollbacks are never the change a step back undoes, so stepping back
//! twice goes two changes back instead of redoing the first.

use std::io::Write;
use std::path::{Component, Path, PathBuf};

use talaria_agent::tools::memory::MemoryTarget;
use talaria_core::Home;

use crate::log::{Entry, LearningLog, content_hash};
use crate::skills::Library;

/// Which content to put back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version<'a> {
    /// The content before the change that left the file as it is now.
    Previous,
    /// A content the log holds for this file, by its hash (as entries'
    /// `before` and `after` name it).
    Hash(&'a str),
}

/// Why a restore did not happen; the text says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    /// The log has no such version of that file.
    #[error("{0}")]
    NotFound(String),
    /// The file is not in a state the log can step back from.
    #[error("{0}")]
    Conflict(String),
    /// Reading or writing a file failed.
    #[error("{0}")]
    Io(String),
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// One sentence for a person.
    pub message: String,
    /// The hash of the content the file had before (`None`: it did not
    /// exist).
    pub from: Option<String>,
    /// The hash of the content put back (`None`: the file was removed).
    pub to: Option<String>,
}

/// The log entry that decides what `version` means for `target`, and
/// the hash to put back.
fn pick(
    log: &LearningLog,
    target: &str,
    current: Option<&[u8]>,
    version: Version<'_>,
) -> Result<(Entry, Option<String>), RestoreError> {
    let io = |e: std::io::Error| RestoreError::Io(format!("cannot read the learning log: {e}"));
    match version {
        Version::Previous => {
            let now = current.map(content_hash);
            let found = log
                .latest(|e| e.target == target && e.action != "rollback" && e.after == now)
                .map_err(io)?;
            let entry = found.ok_or_else(|| {
                RestoreError::Conflict(format!(
                    "the learning log has no change that left `{target}` as it is now: it was \
                     never changed through Talaria, or was changed by hand since; name a \
                     version from the log to restore it"
                ))
            })?;
            let before = entry.before.clone();
            Ok((entry, before))
        }
        Version::Hash(hash) => {
            let hash = hash.trim().to_ascii_lowercase();
            if hash.len() != 64 || !hash.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(RestoreError::NotFound(format!(
                    "`{}` is not a version: versions are the 64-digit hashes the learning log \
                     shows",
                    hash.chars().take(70).collect::<String>()
                )));
            }
            let wanted = Some(hash.clone());
            let found = log
                .latest(|e| e.target == target && (e.before == wanted || e.after == wanted))
                .map_err(io)?;
            let entry = found.ok_or_else(|| {
                RestoreError::NotFound(format!(
                    "the learning log has no version {} of `{target}`",
                    &hash[..12]
                ))
            })?;
            Ok((entry, Some(hash)))
        }
    }
}

/// The version put back, for a person: the change undone, or the hash.
fn which(version: Version<'_>, entry: &Entry) -> String {
    match version {
        Version::Previous => format!(
            "before the {} by the {} at {}",
            entry.action,
            entry.actor,
            entry.at.format("%Y-%m-%d %H:%M UTC")
        ),
        Version::Hash(hash) => format!("version {}", hash.chars().take(12).collect::<String>()),
    }
}

/// The stored content for `hash` (`None` stays `None`: the file did not
/// exist).
fn content(log: &LearningLog, hash: Option<&str>) -> Result<Option<Vec<u8>>, RestoreError> {
    hash.map(|h| {
        log.blob(h).ok_or_else(|| {
            RestoreError::Io(format!(
                "the content {} is missing from the learning log's blobs",
                &h[..12.min(h.len())]
            ))
        })
    })
    .transpose()
}

/// Replaces `path` with `bytes` in one step, so a reader never sees half.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), RestoreError> {
    let fail =
        |e: std::io::Error| RestoreError::Io(format!("cannot write {}: {e}", path.display()));
    let dir = path
        .parent()
        .ok_or_else(|| RestoreError::Io(format!("{} has no folder", path.display())))?;
    std::fs::create_dir_all(dir).map_err(fail)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(fail)?;
    tmp.write_all(bytes).map_err(fail)?;
    tmp.as_file().sync_all().map_err(fail)?;
    tmp.persist(path).map_err(|e| fail(e.error))?;
    Ok(())
}

/// A SKILL.md path the log recorded, checked to be one inside the skills
/// folder (the log is only as trustworthy as the home it lives in; a
/// restore never writes anywhere else).
fn logged_skill_path(library: &Library, entry: &Entry) -> Result<PathBuf, RestoreError> {
    let rel = Path::new(&entry.path);
    let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
    let path = library.log().home().join(rel);
    if plain && path.starts_with(library.root()) && path.ends_with("SKILL.md") {
        Ok(path)
    } else {
        Err(RestoreError::Io(format!(
            "the learning log names `{}` for this skill, which is not a SKILL.md in the skills \
             folder",
            entry.path
        )))
    }
}

/// Puts skill `name`'s SKILL.md back to `version`: the content is written
/// again (or, when the version is "did not exist", the skill's folder is
/// removed, as undoing its creation does). Logged as a `rollback` by
/// `actor`. A bundled skill has no history here: only the user's change.
pub fn restore_skill(
    library: &Library,
    name: &str,
    version: Version<'_>,
    actor: &str,
) -> Result<Restored, RestoreError> {
    let log = library.log();
    let target = format!("skill:{name}");
    let now_at = library.file_of(name, None);
    let current = now_at.as_ref().and_then(|p| std::fs::read(p).ok());
    let (entry, hash) = pick(log, &target, current.as_deref(), version)?;
    let path = match now_at {
        Some(p) => p,
        None => logged_skill_path(library, &entry)?,
    };
    let wanted = content(log, hash.as_deref())?;
    let from = current.as_deref().map(content_hash);
    let message = if wanted == current {
        format!("`{name}` already has that content; nothing changed")
    } else {
        match &wanted {
            Some(bytes) => {
                write_atomic(&path, bytes)?;
                format!("restored `{name}` to {}", which(version, &entry))
            }
            None => {
                if let Some(dir) = path.parent().filter(|d| d.exists()) {
                    std::fs::remove_dir_all(dir).map_err(|e| {
                        RestoreError::Io(format!("cannot remove {}: {e}", dir.display()))
                    })?;
                }
                library.usage().forget(name);
                format!("removed `{name}`: it did not exist before that change")
            }
        }
    };
    if wanted != current {
        log.record(
            actor,
            "rollback",
            &target,
            &path,
            current.as_deref(),
            wanted.as_deref(),
        );
        library.invalidate();
    }
    Ok(Restored {
        message,
        from,
        to: hash,
    })
}

/// Puts a memory file (MEMORY.md or USER.md) back to `version`, under the
/// same lock the `memory` tool takes, so the two never interleave a write.
/// Logged as a `rollback` by `actor`.
pub fn restore_memory(
    home: &Home,
    target: MemoryTarget,
    version: Version<'_>,
    actor: &str,
) -> Result<Restored, RestoreError> {
    let log = LearningLog::new(home);
    let file = target.file_name();
    let logged = format!("memory:{file}");
    let dir = home.memories_dir();
    let path = dir.join(file);
    let fail = |e: std::io::Error| RestoreError::Io(format!("cannot update {file}: {e}"));
    std::fs::create_dir_all(&dir).map_err(fail)?;
    // The memory tool's lock: `<file>.lock` beside the file.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(dir.join(format!("{file}.lock")))
        .map_err(fail)?;
    fs4::fs_std::FileExt::lock_exclusive(&lock).map_err(fail)?;
    let current = match std::fs::read(&path) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(fail(e)),
    };
    let (entry, hash) = pick(&log, &logged, current.as_deref(), version)?;
    let wanted = content(&log, hash.as_deref())?;
    let from = current.as_deref().map(content_hash);
    let message = if wanted == current {
        format!("{file} already has that content; nothing changed")
    } else {
        match &wanted {
            Some(bytes) => write_atomic(&path, bytes)?,
            None => std::fs::remove_file(&path).map_err(fail)?,
        }
        log.record(
            actor,
            "rollback",
            &logged,
            &path,
            current.as_deref(),
            wanted.as_deref(),
        );
        format!("restored {file} to {}", which(version, &entry))
    };
    drop(lock);
    Ok(Restored {
        message,
        from,
        to: hash,
    })
}
