//! Forgetting old files.

use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::MediaError;
use crate::cache::{MediaCache, TEMP_PREFIX};

/// The most directory entries one sweep looks at: a sweep is a cheap,
/// bounded chore; what it did not reach, the next one does.
const MAX_ENTRIES: usize = 100_000;

/// A temporary file older than this belongs to no running store (a 20 MB
/// download does not take an hour), whatever the retention.
const TEMP_STALE_AFTER: Duration = Duration::from_secs(60 * 60);

/// What a sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Cached files removed.
    pub removed: usize,
    /// Temporary files left by an interrupted store, removed.
    pub removed_temp: usize,
    /// Bytes freed.
    pub freed_bytes: u64,
    /// Cached files kept (younger than the cut-off).
    pub kept: usize,
    /// Whether entries were left unexamined because of the bound; sweep
    /// again to reach them.
    pub incomplete: bool,
}

impl MediaCache {
    /// Removes the cached files last written more than `older_than` ago,
    /// and temporary files of stores that were interrupted.
    ///
    /// Only the cache directory itself is read (no sub-directories), only
    /// regular files with the names the cache gives are removed, and
    /// symbolic links are neither followed nor removed, so nothing outside
    /// the cache is touched. A missing cache directory is an empty one.
    pub async fn sweep(&self, older_than: Duration) -> Result<SweepReport, MediaError> {
        let dir = self.dir().to_owned();
        // Directory walks are blocking calls: one trip to the blocking
        // pool rather than one per file.
        tokio::task::spawn_blocking(move || sweep_dir(&dir, older_than, SystemTime::now()))
            .await
            .map_err(|e| MediaError::Cache {
                path: self.dir().to_owned(),
                source: std::io::Error::other(e),
            })?
    }
}

fn sweep_dir(dir: &Path, older_than: Duration, now: SystemTime) -> Result<SweepReport, MediaError> {
    let mut report = SweepReport::default();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(report),
        Err(source) => {
            return Err(MediaError::Cache {
                path: dir.to_owned(),
                source,
            });
        }
    };
    for (seen, entry) in entries.enumerate() {
        if seen == MAX_ENTRIES {
            report.incomplete = true;
            break;
        }
        // One unreadable entry must not stop the chore.
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let temp = name.starts_with(TEMP_PREFIX);
        if !temp && !is_cache_name(name) {
            continue;
        }
        // `DirEntry::metadata` does not follow symbolic links.
        let Ok(meta) = entry.metadata() else { continue };
        if temp && meta.file_type().is_dir() {
            // A speech program's scratch directory (`tts`), left by a crash.
            sweep_scratch_dir(&entry.path(), &meta, now, &mut report);
            continue;
        }
        if !meta.file_type().is_file() {
            continue;
        }
        let limit = if temp {
            older_than.min(TEMP_STALE_AFTER)
        } else {
            older_than
        };
        // A time in the future (a clock set back) counts as new.
        let age = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .unwrap_or(Duration::ZERO);
        if age <= limit {
            if !temp {
                report.kept += 1;
            }
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => {
                report.freed_bytes += meta.len();
                if temp {
                    report.removed_temp += 1;
                } else {
                    report.removed += 1;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(file = name, error = %e, "media: cannot remove an old file");
            }
        }
    }
    Ok(report)
}

/// Removes a temporary directory older than [`TEMP_STALE_AFTER`] with what
/// it holds. `remove_dir_all` does not follow symbolic links inside it, and
/// the entry itself is a real directory (its metadata was not followed).
fn sweep_scratch_dir(
    path: &Path,
    meta: &std::fs::Metadata,
    now: SystemTime,
    report: &mut SweepReport,
) {
    let age = meta
        .modified()
        .ok()
        .and_then(|m| now.duration_since(m).ok())
        .unwrap_or(Duration::ZERO);
    if age <= TEMP_STALE_AFTER {
        return;
    }
    match std::fs::remove_dir_all(path) {
        Ok(()) => report.removed_temp += 1,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "media: cannot remove an old scratch directory");
        }
    }
}

/// `<64 lowercase hex digits>.<ext>`: a name the cache gave.
fn is_cache_name(name: &str) -> bool {
    let Some((hash, ext)) = name.split_once('.') else {
        return false;
    };
    hash.len() == 64
        && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        && !ext.is_empty()
        && ext.bytes().all(|b| b.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_scratch_directories_are_removed_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join(format!("{TEMP_PREFIX}tts-1-2-3"));
        let live = dir.path().join(format!("{TEMP_PREFIX}tts-4-5-6"));
        let other = dir.path().join("keep-me");
        for d in [&stale, &live, &other] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("speech.wav"), b"RIFF").unwrap();
        }
        // Two hours on, the first is stale; the second was made "now".
        let later = SystemTime::now() + Duration::from_secs(2 * 60 * 60);
        let fresh = std::fs::metadata(&live).unwrap().modified().unwrap();
        let report = sweep_dir(dir.path(), Duration::from_secs(86_400 * 7), later).unwrap();
        assert_eq!(report.removed_temp, 2, "both are stale two hours on");
        assert!(!stale.exists() && !live.exists());
        assert!(
            other.join("speech.wav").exists(),
            "not the cache's: untouched"
        );

        std::fs::create_dir(&live).unwrap();
        let report = sweep_dir(dir.path(), Duration::from_secs(60), fresh).unwrap();
        assert_eq!(report.removed_temp, 0);
        assert!(live.exists());
    }

    #[test]
    fn only_names_the_cache_gives_are_its_own() {
        let hash = "ab".repeat(32);
        assert!(is_cache_name(&format!("{hash}.jpg")));
        assert!(is_cache_name(&format!("{hash}.bin")));
        assert!(!is_cache_name(&hash));
        assert!(!is_cache_name(&format!("{}.jpg", "AB".repeat(32))));
        assert!(!is_cache_name(&format!("{hash}.tar.gz")));
        assert!(!is_cache_name("notes.txt"));
    }
}
