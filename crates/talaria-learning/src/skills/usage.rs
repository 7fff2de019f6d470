//! `.usage.json`: per-skill telemetry and provenance, kept beside the
//! user's skills: use, view and patch counts with their last times, when
//! the skill was created and by whom, its lifecycle state and whether it is
//! pinned.
//!
//! Writes take an exclusive lock on `.usage.json.lock` and replace the
//! file atomically, so two processes (the gateway and a terminal chat)
//! never lose each other's counts. Every update is best effort: a failure
//! is logged and never fails the tool call that caused it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The file name, in the skills root.
pub const FILE: &str = ".usage.json";

/// A skill's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SkillState {
    /// In use: offered, and counted.
    #[default]
    Active,
    /// Unused for a while; still offered.
    Stale,
    /// Moved to `.archive/`; restorable.
    Archived,
}

/// One skill's record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct UsageRecord {
    /// `agent` for skills the agent wrote itself (the curator manages
    /// those), else `None`.
    pub created_by: Option<String>,
    /// When the record was made (the skill was first seen or written).
    pub created_at: Option<DateTime<Utc>>,
    /// Times the skill was used, a view by the model included.
    pub use_count: u64,
    /// Times the model opened it with `skill_view`.
    pub view_count: u64,
    /// Times it was edited or patched.
    pub patch_count: u64,
    /// The last use (a view included).
    pub last_used_at: Option<DateTime<Utc>>,
    /// The last `skill_view`.
    pub last_viewed_at: Option<DateTime<Utc>>,
    /// The last edit.
    pub last_patched_at: Option<DateTime<Utc>>,
    /// Active, stale or archived.
    pub state: SkillState,
    /// Pinned by the user: the curator leaves it alone.
    pub pinned: bool,
    /// When the curator archived it.
    pub archived_at: Option<DateTime<Utc>>,
}

impl UsageRecord {
    /// The latest use, view or patch.
    pub fn last_activity(&self) -> Option<DateTime<Utc>> {
        [self.last_used_at, self.last_viewed_at, self.last_patched_at]
            .into_iter()
            .flatten()
            .max()
    }
}

/// What happened to a skill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Loaded with `skill_view`: a view and a use.
    Viewed,
    /// Loaded for a turn with `/skill-name`.
    Used,
    /// Changed (`edit`, `patch`, `write_file`, `remove_file`).
    Patched,
}

/// The usage file of one skills root.
#[derive(Debug, Clone)]
pub struct Usage {
    path: PathBuf,
}

impl Usage {
    /// The records of the skills under `root` (in its `.usage.json`).
    pub fn new(root: &Path) -> Usage {
        Usage {
            path: root.join(FILE),
        }
    }

    /// Every record, by skill name; an unreadable file reads as empty (and
    /// is logged), since counts are never worth failing a call over.
    pub fn all(&self) -> BTreeMap<String, UsageRecord> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
                tracing::warn!(path = %self.path.display(), error = %e, "skill usage file is unreadable; counting afresh");
                BTreeMap::new()
            }),
            Err(_) => BTreeMap::new(),
        }
    }

    /// One skill's record, with defaults when it has none.
    pub fn get(&self, name: &str) -> UsageRecord {
        self.all().remove(name).unwrap_or_default()
    }

    /// Counts `event` for `name` at `now`.
    pub fn record(&self, name: &str, event: Event, now: DateTime<Utc>) {
        self.update(|records| {
            let r = records.entry(name.to_owned()).or_default();
            match event {
                Event::Viewed => {
                    r.view_count += 1;
                    r.last_viewed_at = Some(now);
                    r.use_count += 1;
                    r.last_used_at = Some(now);
                }
                Event::Used => {
                    r.use_count += 1;
                    r.last_used_at = Some(now);
                }
                Event::Patched => {
                    r.patch_count += 1;
                    r.last_patched_at = Some(now);
                }
            }
            // Use brings a stale skill back.
            if r.state == SkillState::Stale && event != Event::Patched {
                r.state = SkillState::Active;
            }
        });
    }

    /// Starts a new skill's record.
    pub fn created(&self, name: &str, by: Option<&str>, now: DateTime<Utc>) {
        self.update(|records| {
            records.insert(
                name.to_owned(),
                UsageRecord {
                    created_by: by.map(str::to_owned),
                    created_at: Some(now),
                    ..UsageRecord::default()
                },
            );
        });
    }

    /// Drops a deleted skill's record.
    pub fn forget(&self, name: &str) {
        self.update(|records| {
            records.remove(name);
        });
    }

    /// Changes one record in place (pinning, lifecycle state).
    pub fn change(&self, name: &str, f: impl FnOnce(&mut UsageRecord)) {
        self.update(|records| f(records.entry(name.to_owned()).or_default()));
    }

    fn update(&self, f: impl FnOnce(&mut BTreeMap<String, UsageRecord>)) {
        if let Err(e) = self.try_update(f) {
            tracing::warn!(path = %self.path.display(), error = %e, "could not update skill usage");
        }
    }

    fn try_update(
        &self,
        f: impl FnOnce(&mut BTreeMap<String, UsageRecord>),
    ) -> std::io::Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("{FILE}.lock")))?;
        fs4::fs_std::FileExt::lock_exclusive(&lock)?;
        let mut records = self.all();
        f(&mut records);
        let text = serde_json::to_vec_pretty(&records).map_err(std::io::Error::other)?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        tmp.write_all(&text)?;
        tmp.as_file().sync_all()?;
        tmp.persist(&self.path).map_err(|e| e.error)?;
        // The lock is released when `lock` closes.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_count_and_a_use_revives_a_stale_skill() {
        let dir = tempfile::tempdir().unwrap();
        let usage = Usage::new(dir.path());
        let t0 = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        usage.created("x", Some("agent"), t0);
        usage.record("x", Event::Viewed, t0);
        usage.record("x", Event::Used, t0);
        usage.record("x", Event::Patched, t0);
        let r = usage.get("x");
        assert_eq!((r.view_count, r.use_count, r.patch_count), (1, 2, 1));
        assert_eq!(r.created_by.as_deref(), Some("agent"));
        assert_eq!(r.last_activity(), Some(t0));
        usage.change("x", |r| r.state = SkillState::Stale);
        usage.record("x", Event::Used, t0);
        assert_eq!(usage.get("x").state, SkillState::Active);
        usage.forget("x");
        assert_eq!(usage.get("x"), UsageRecord::default());
    }

    #[test]
    fn concurrent_writers_lose_no_count() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let now = Utc::now();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let root = root.clone();
                std::thread::spawn(move || {
                    let usage = Usage::new(&root);
                    for _ in 0..10 {
                        usage.record("busy", Event::Used, now);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(Usage::new(&root).get("busy").use_count, 80);
    }
}
