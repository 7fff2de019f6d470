//! The curator: a deterministic lifecycle for the skills the agent wrote
//! itself (`created_by: agent`). Unused for `stale_after_days`, a skill is
//! marked stale (still offered); unused for `archive_after_days`, it is
//! moved to `skills/.archive/` (restorable with `talaria skills restore`).
//! Pinned skills and skills a cron job uses are never touched, nor are the
//! user's own or the bundled ones.
//!
//! It runs at most once per `interval_hours`, from the CLI's start and the
//! gateway's maintenance; the very first time it only notes the time, so a
//! fresh install never archives anything. Before it changes anything it
//! copies the skills folder to `skills/.snapshots/<time>/` (the newest five
//! kept). Time is passed in, so tests drive it with an injected clock.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use talaria_core::config::CuratorConfig;

use crate::skills::usage::{SkillState, UsageRecord};
use crate::skills::{Library, Origin, SkillError};

/// The state file, in the skills root.
pub const STATE_FILE: &str = ".curator_state.json";

/// Where archived skills go, in the skills root.
pub const ARCHIVE_DIR: &str = ".archive";

/// Where snapshots go, in the skills root.
pub const SNAPSHOT_DIR: &str = ".snapshots";

/// Snapshots kept.
const SNAPSHOTS_KEPT: usize = 5;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
struct State {
    last_run_at: Option<DateTime<Utc>>,
    run_count: u64,
    last_summary: Option<String>,
}

/// What a run changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Unused past the stale threshold, now marked stale (still offered).
    pub marked_stale: Vec<String>,
    /// Stale past the archive threshold, moved to `.archive/`.
    pub archived: Vec<String>,
    /// Stale skills used again, active once more.
    pub reactivated: Vec<String>,
    /// Skills seen for the first time, given a record and left for the
    /// next run.
    pub seeded: Vec<String>,
    /// The copy of the skills folder taken before anything changed, so a
    /// run can be undone by hand; `None` when nothing changed.
    pub snapshot: Option<PathBuf>,
}

impl Report {
    /// Whether the run changed no skill (seeding records does not count).
    pub fn is_empty(&self) -> bool {
        self.marked_stale.is_empty() && self.archived.is_empty() && self.reactivated.is_empty()
    }

    /// One line for logs and the terminal.
    pub fn summary(&self) -> String {
        if self.is_empty() {
            return "curator: nothing to change".into();
        }
        let mut parts = Vec::new();
        if !self.archived.is_empty() {
            parts.push(format!("archived {}", self.archived.join(", ")));
        }
        if !self.marked_stale.is_empty() {
            parts.push(format!("marked stale {}", self.marked_stale.join(", ")));
        }
        if !self.reactivated.is_empty() {
            parts.push(format!("reactivated {}", self.reactivated.join(", ")));
        }
        format!("curator: {}", parts.join("; "))
    }
}

/// Whether [`run_if_due`] would do anything now (run, or note the time
/// of its first look), so a caller can skip gathering what it needs.
pub fn is_due(library: &Library, config: &CuratorConfig, now: DateTime<Utc>) -> bool {
    if !config.enabled {
        return false;
    }
    match read_state(&library.root().join(STATE_FILE)).last_run_at {
        None => true,
        Some(last) => now - last >= interval(config),
    }
}

fn interval(config: &CuratorConfig) -> Duration {
    Duration::hours(i64::try_from(config.interval_hours).unwrap_or(i64::MAX / 4000))
}

/// Runs the curator when it is due: `Ok(None)` when it is not (or is
/// disabled, or this was the first look). `in_use_by_cron` names the
/// skills a cron job loads.
pub fn run_if_due(
    library: &Library,
    config: &CuratorConfig,
    in_use_by_cron: &HashSet<String>,
    now: DateTime<Utc>,
) -> Result<Option<Report>, SkillError> {
    if !config.enabled {
        return Ok(None);
    }
    let state_path = library.root().join(STATE_FILE);
    let mut state = read_state(&state_path);
    let Some(last) = state.last_run_at else {
        state.last_run_at = Some(now);
        write_state(&state_path, &state)?;
        return Ok(None);
    };
    if now - last < interval(config) {
        return Ok(None);
    }
    let report = run(library, config, in_use_by_cron, now)?;
    state.last_run_at = Some(now);
    state.run_count += 1;
    state.last_summary = Some(report.summary());
    write_state(&state_path, &state)?;
    if !report.is_empty() {
        tracing::info!("{}", report.summary());
    }
    Ok(Some(report))
}

/// One pass of the transitions, now, whatever the schedule.
pub fn run(
    library: &Library,
    config: &CuratorConfig,
    in_use_by_cron: &HashSet<String>,
    now: DateTime<Utc>,
) -> Result<Report, SkillError> {
    let stale_after = days(config.stale_after_days);
    let archive_after = days(config.archive_after_days);
    let records = library.usage().all();
    let mut report = Report::default();
    let mut plan: Vec<(String, Action)> = Vec::new();
    for skill in library.list() {
        if skill.origin != Origin::User {
            continue;
        }
        let Some(record) = records.get(&skill.name) else {
            continue;
        };
        if record.created_by.as_deref() != Some("agent")
            || record.pinned
            || in_use_by_cron.contains(&skill.name)
        {
            continue;
        }
        let Some(anchor) = record.last_activity().or(record.created_at) else {
            // No time to measure from: start the clock now.
            report.seeded.push(skill.name.clone());
            library
                .usage()
                .change(&skill.name, |r| r.created_at = Some(now));
            continue;
        };
        if let Some(action) = decide(record, now - anchor, stale_after, archive_after) {
            plan.push((skill.name.clone(), action));
        }
    }
    if plan.is_empty() {
        return Ok(report);
    }
    report.snapshot = Some(snapshot(library.root(), now)?);
    for (name, action) in plan {
        match action {
            Action::Archive => {
                archive(library, &name, now)?;
                report.archived.push(name);
            }
            Action::MarkStale => {
                library
                    .usage()
                    .change(&name, |r| r.state = SkillState::Stale);
                report.marked_stale.push(name);
            }
            Action::Reactivate => {
                library
                    .usage()
                    .change(&name, |r| r.state = SkillState::Active);
                report.reactivated.push(name);
            }
        }
    }
    library.invalidate();
    Ok(report)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    MarkStale,
    Archive,
    Reactivate,
}

/// What to do with a skill idle for `idle`.
fn decide(
    record: &UsageRecord,
    idle: Duration,
    stale_after: Duration,
    archive_after: Duration,
) -> Option<Action> {
    if record.use_count == 0 && idle < stale_after {
        // Never used but young: it has had no chance yet.
        return (record.state == SkillState::Stale).then_some(Action::Reactivate);
    }
    if idle >= archive_after {
        return Some(Action::Archive);
    }
    if idle >= stale_after {
        return (record.state == SkillState::Active).then_some(Action::MarkStale);
    }
    (record.state == SkillState::Stale).then_some(Action::Reactivate)
}

fn days(n: u64) -> Duration {
    Duration::days(i64::try_from(n).unwrap_or(i64::MAX / 100_000))
}

/// Moves a skill's folder under `.archive/`, keeping its place relative to
/// the root so it can be put back.
pub fn archive(library: &Library, name: &str, now: DateTime<Utc>) -> Result<(), SkillError> {
    let info = library
        .find(name)
        .filter(|s| s.origin == Origin::User)
        .ok_or_else(|| SkillError(format!("no skill of yours named `{name}`")))?;
    let dir = info
        .dir
        .ok_or_else(|| SkillError(format!("`{name}` has no folder")))?;
    let rel = dir
        .strip_prefix(library.root())
        .map_err(|_| SkillError(format!("`{name}` is outside the skills folder")))?
        .to_path_buf();
    let target = library.root().join(ARCHIVE_DIR).join(&rel);
    if target.exists() {
        return Err(SkillError(format!(
            "an archived skill is already at {}; restore or remove it first",
            target.display()
        )));
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
    }
    std::fs::rename(&dir, &target).map_err(|e| io(&dir, e))?;
    if let Some(parent) = dir.parent()
        && parent != library.root()
    {
        let _ = std::fs::remove_dir(parent);
    }
    library.usage().change(name, |r| {
        r.state = SkillState::Archived;
        r.archived_at = Some(now);
    });
    library.invalidate();
    Ok(())
}

/// Puts an archived skill back where it was, active, its clock restarted.
pub fn restore(library: &Library, name: &str, now: DateTime<Utc>) -> Result<PathBuf, SkillError> {
    if !crate::skills::valid_name(name) {
        return Err(SkillError(format!("`{name}` is not a skill name")));
    }
    let archive = library.root().join(ARCHIVE_DIR);
    let found = [archive.join(name)]
        .into_iter()
        .chain(
            std::fs::read_dir(&archive)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path().join(name)),
        )
        .find(|p| p.join("SKILL.md").is_file())
        .ok_or_else(|| SkillError(format!("no archived skill named `{name}`")))?;
    if library.find(name).is_some() {
        return Err(SkillError(format!(
            "a skill named `{name}` exists already; rename or delete it first"
        )));
    }
    let rel = found
        .strip_prefix(&archive)
        .map_err(|_| SkillError("the archive is inconsistent".into()))?
        .to_path_buf();
    let target = library.root().join(&rel);
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
    }
    std::fs::rename(&found, &target).map_err(|e| io(&found, e))?;
    library.usage().change(name, |r| {
        r.state = SkillState::Active;
        r.archived_at = None;
        r.last_used_at = Some(now);
    });
    library.invalidate();
    Ok(target)
}

/// Copies the skills folder (without archives and snapshots) to
/// `.snapshots/<time>/`, keeping the newest [`SNAPSHOTS_KEPT`].
fn snapshot(root: &Path, now: DateTime<Utc>) -> Result<PathBuf, SkillError> {
    let base = root.join(SNAPSHOT_DIR);
    let target = base.join(now.format("%Y%m%dT%H%M%SZ").to_string());
    copy_tree(root, &target, true).map_err(|e| io(&target, e))?;
    let mut old: Vec<PathBuf> = std::fs::read_dir(&base)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    old.sort();
    let excess = old.len().saturating_sub(SNAPSHOTS_KEPT);
    for dir in old.into_iter().take(excess) {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(target)
}

fn copy_tree(from: &Path, to: &Path, top: bool) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        if top
            && (name == SNAPSHOT_DIR
                || name == ARCHIVE_DIR
                || name.to_string_lossy().ends_with(".lock"))
        {
            continue;
        }
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&entry.path(), &to.join(&name), false)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), to.join(&name))?;
        }
    }
    Ok(())
}

fn read_state(path: &Path) -> State {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

fn write_state(path: &Path, state: &State) -> Result<(), SkillError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
    }
    let text = serde_json::to_vec_pretty(state).map_err(|e| SkillError(e.to_string()))?;
    std::fs::write(path, text).map_err(|e| io(path, e))
}

fn io(path: &Path, e: std::io::Error) -> SkillError {
    SkillError(format!("{}: {e}", path.display()))
}
