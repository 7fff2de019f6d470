//! The files of the ancestor's home: `.env`, `SOUL.md`, the memory files,
//! skill folders, `cron/jobs.json` and the pairing approvals. Each is
//! planned (read and compared, nothing written) and then applied.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context;
use talaria_core::Home;

use super::{Section, some_names, verb};
use crate::count;

/// The memory files' entry separator, as both agents write it.
use talaria_agent::tools::memory::ENTRY_DELIMITER;

/// Reads `path`, or `None` when it does not exist.
fn read_optional(path: &Path) -> anyhow::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Writes `text` to `path` through a temporary file in the same folder
/// and a rename, so a crash leaves the old file or the new one, never
/// half of one. `private` files are made mode 0600 before they hold
/// anything.
pub(super) fn write_atomic(path: &Path, text: &str, private: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .with_context(|| format!("{} has no folder", path.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".import-")
        .tempfile_in(dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = if private { 0o600 } else { 0o644 };
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode))?;
    }
    #[cfg(not(unix))]
    let _ = private;
    tmp.write_all(text.as_bytes())
        .and_then(|()| tmp.as_file().sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    tmp.persist(path)
        .map_err(|e| e.error)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

// ---------------------------------------------------------------- .env

/// The variable a `.env` line sets, if it sets one.
fn env_name(line: &str) -> Option<&str> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let line = line.strip_prefix("export ").unwrap_or(line);
    let (name, _) = line.split_once('=')?;
    let name = name.trim();
    (!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .then_some(name)
}

/// Whether a `.env` line gives its variable an empty value (`KEY=`,
/// `KEY=""`): the ancestor's setup writes such placeholders.
fn env_value_empty(line: &str) -> bool {
    line.split_once('=')
        .map(|(_, v)| matches!(v.trim(), "" | "\"\"" | "''"))
        .unwrap_or(true)
}

/// Variables of the ancestor's `.env` missing here.
pub struct EnvPlan {
    /// The lines to append, as the ancestor wrote them.
    new: Vec<(String, String)>,
    /// Names set on both sides: this home's value is kept.
    kept: Vec<String>,
    /// This home's `.env` as it is.
    current: String,
}

pub fn plan_env(source: &Path, home: &Home) -> anyhow::Result<Option<EnvPlan>> {
    let Some(theirs) = read_optional(&source.join(".env"))? else {
        return Ok(None);
    };
    let current = read_optional(&home.dotenv_file())?.unwrap_or_default();
    let ours: BTreeSet<&str> = current.lines().filter_map(env_name).collect();
    let mut new: Vec<(String, String)> = Vec::new();
    let mut kept = Vec::new();
    for line in theirs.lines() {
        let Some(name) = env_name(line) else { continue };
        if env_value_empty(line) {
            continue;
        }
        if ours.contains(name) {
            kept.push(name.to_owned());
        } else if let Some(slot) = new.iter_mut().find(|(n, _)| n == name) {
            // A later line wins, as when the file is read.
            slot.1 = line.trim().to_owned();
        } else {
            new.push((name.to_owned(), line.trim().to_owned()));
        }
    }
    Ok(Some(EnvPlan { new, kept, current }))
}

pub fn apply_env(home: &Home, plan: &Option<EnvPlan>, dry_run: bool) -> anyhow::Result<Section> {
    let mut s = Section::new(".env");
    let Some(plan) = plan else {
        s.line("the hermes-agent home has no .env");
        return Ok(s);
    };
    let names: Vec<String> = plan.new.iter().map(|(n, _)| n.clone()).collect();
    s.line(format!(
        "{} {}{}, {} already set here (kept)",
        count(plan.new.len(), "variable", "variables"),
        verb(dry_run, "to add", "added"),
        if names.is_empty() {
            String::new()
        } else {
            format!(" ({})", some_names(&names))
        },
        plan.kept.len()
    ));
    if !dry_run && !plan.new.is_empty() {
        let mut text = plan.current.clone();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str("# imported from hermes-agent\n");
        for (_, line) in &plan.new {
            text.push_str(line);
            text.push('\n');
        }
        write_atomic(&home.dotenv_file(), &text, true)?;
    }
    Ok(s)
}

// ---------------------------------------------------------------- SOUL.md

pub enum SoulPlan {
    /// The ancestor has none.
    Absent,
    /// This home has none: the ancestor's is copied.
    Copy(String),
    /// Both have the same text.
    Same,
    /// This home's differs and is kept.
    Differs,
}

pub fn plan_soul(source: &Path, home: &Home) -> anyhow::Result<SoulPlan> {
    let Some(theirs) = read_optional(&source.join("SOUL.md"))? else {
        return Ok(SoulPlan::Absent);
    };
    Ok(match read_optional(&home.soul_file())? {
        None => SoulPlan::Copy(theirs),
        Some(ours) if ours.trim() == theirs.trim() => SoulPlan::Same,
        Some(_) => SoulPlan::Differs,
    })
}

pub fn apply_soul(home: &Home, plan: &SoulPlan, dry_run: bool) -> anyhow::Result<Section> {
    let mut s = Section::new("SOUL.md");
    match plan {
        SoulPlan::Absent => s.line("the hermes-agent home has none"),
        SoulPlan::Same => s.line("already the same here"),
        SoulPlan::Differs => s.line(format!(
            "{} differs from the hermes-agent one and is kept",
            home.soul_file().display()
        )),
        SoulPlan::Copy(text) => {
            s.line(format!(
                "{} (this home had none)",
                verb(dry_run, "to copy", "copied")
            ));
            if !dry_run {
                write_atomic(&home.soul_file(), text, false)?;
            }
        }
    }
    Ok(s)
}

// ---------------------------------------------------------------- memories

/// The entries of a memory file, trimmed, empty ones left out.
fn entries(text: &str) -> Vec<String> {
    text.split(ENTRY_DELIMITER)
        .map(|e| e.trim().to_owned())
        .filter(|e| !e.is_empty())
        .collect()
}

pub struct MemoryPlan {
    file: &'static str,
    /// This home's entries, then the ancestor's new ones.
    merged: Vec<String>,
    new: usize,
    present: usize,
}

pub fn plan_memories(source: &Path, home: &Home) -> anyhow::Result<Vec<MemoryPlan>> {
    let mut plans = Vec::new();
    for file in ["MEMORY.md", "USER.md"] {
        let Some(theirs) = read_optional(&source.join("memories").join(file))? else {
            continue;
        };
        let mut merged =
            entries(&read_optional(&home.memories_dir().join(file))?.unwrap_or_default());
        let (mut new, mut present) = (0, 0);
        for entry in entries(&theirs) {
            if merged.contains(&entry) {
                present += 1;
            } else {
                merged.push(entry);
                new += 1;
            }
        }
        plans.push(MemoryPlan {
            file,
            merged,
            new,
            present,
        });
    }
    Ok(plans)
}

pub fn apply_memories(home: &Home, plans: &[MemoryPlan], dry_run: bool) -> anyhow::Result<Section> {
    let mut s = Section::new("memories");
    if plans.is_empty() {
        s.line("the hermes-agent home has no memory files");
    }
    for plan in plans {
        s.line(format!(
            "{}: {} {}, {} already there",
            plan.file,
            count(plan.new, "entry", "entries"),
            verb(dry_run, "to add", "added"),
            plan.present
        ));
        if !dry_run && plan.new > 0 {
            let mut text = plan.merged.join(ENTRY_DELIMITER);
            text.push('\n');
            write_atomic(&home.memories_dir().join(plan.file), &text, true)?;
        }
    }
    Ok(s)
}

// ---------------------------------------------------------------- skills

/// Skill folders under `root`: `<name>/SKILL.md` or
/// `<category>/<name>/SKILL.md`, by name, with their path below `root`.
/// Hidden folders (the archive, the hub's cache) are not skills.
fn skill_folders(root: &Path) -> anyhow::Result<BTreeMap<String, PathBuf>> {
    let mut found = BTreeMap::new();
    let Ok(top) = std::fs::read_dir(root) else {
        return Ok(found);
    };
    for entry in top {
        let entry = entry.with_context(|| format!("cannot read {}", root.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !entry.file_type()?.is_dir() {
            continue;
        }
        if entry.path().join("SKILL.md").is_file() {
            found.insert(name.clone(), PathBuf::from(&name));
            continue;
        }
        // A category folder.
        for inner in std::fs::read_dir(entry.path())
            .with_context(|| format!("cannot read {}", entry.path().display()))?
        {
            let inner = inner?;
            let skill = inner.file_name().to_string_lossy().into_owned();
            if skill.starts_with('.') || !inner.file_type()?.is_dir() {
                continue;
            }
            if inner.path().join("SKILL.md").is_file() {
                found.insert(skill.clone(), PathBuf::from(&name).join(&skill));
            }
        }
    }
    Ok(found)
}

/// The skills the ancestor copied from its own package
/// (`skills/.bundled_manifest`, a line `name` or `name:hash` each): not
/// the user's work, and Talaria has bundled skills of its own.
fn bundled(root: &Path) -> anyhow::Result<BTreeSet<String>> {
    Ok(read_optional(&root.join(".bundled_manifest"))?
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(':').next())
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .collect())
}

pub struct SkillPlan {
    root: PathBuf,
    /// Name and path below the ancestor's `skills/`.
    copy: Vec<(String, PathBuf)>,
    /// Names a different skill here already has.
    taken: Vec<String>,
    /// Skills here already with the same SKILL.md (imported before).
    same: Vec<String>,
    /// Skills that came with the ancestor.
    bundled: Vec<String>,
}

pub fn plan_skills(source: &Path, home: &Home) -> anyhow::Result<SkillPlan> {
    let root = source.join("skills");
    let theirs = skill_folders(&root)?;
    let ours = skill_folders(&home.skills_dir())?;
    let shipped = bundled(&root)?;
    let mut plan = SkillPlan {
        root,
        copy: Vec::new(),
        taken: Vec::new(),
        same: Vec::new(),
        bundled: Vec::new(),
    };
    for (name, rel) in theirs {
        if shipped.contains(&name) {
            plan.bundled.push(name);
        } else if let Some(here) = ours.get(&name) {
            let text =
                |root: &Path, rel: &Path| std::fs::read(root.join(rel).join("SKILL.md")).ok();
            if text(&plan.root, &rel).is_some()
                && text(&plan.root, &rel) == text(&home.skills_dir(), here)
            {
                plan.same.push(name);
            } else {
                plan.taken.push(name);
            }
        } else {
            plan.copy.push((name, rel));
        }
    }
    Ok(plan)
}

/// Copies the folder `from` to `to`: regular files and folders, not
/// symbolic links (they could point anywhere on the old machine).
fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("cannot create {}", to.display()))?;
    for entry in
        std::fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))?
    {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target).with_context(|| {
                format!(
                    "cannot copy {} to {}",
                    entry.path().display(),
                    target.display()
                )
            })?;
        }
    }
    Ok(())
}

pub fn apply_skills(home: &Home, plan: &SkillPlan, dry_run: bool) -> anyhow::Result<Section> {
    let mut s = Section::new("skills");
    let names: Vec<String> = plan.copy.iter().map(|(n, _)| n.clone()).collect();
    s.line(format!(
        "{} {}{}, {} already here",
        count(plan.copy.len(), "skill", "skills"),
        verb(dry_run, "to copy", "copied"),
        if names.is_empty() {
            String::new()
        } else {
            format!(" ({})", some_names(&names))
        },
        plan.same.len()
    ));
    if !plan.taken.is_empty() {
        s.line(format!(
            "{} not copied: a skill of the same name is here already ({})",
            count(plan.taken.len(), "skill", "skills"),
            some_names(&plan.taken)
        ));
    }
    if !plan.bundled.is_empty() {
        s.line(format!(
            "{} bundled with hermes-agent, not copied",
            count(plan.bundled.len(), "skill", "skills")
        ));
    }
    if !dry_run {
        for (name, rel) in &plan.copy {
            let dest = home.skills_dir().join(rel);
            let parent = dest
                .parent()
                .with_context(|| format!("{} has no folder", dest.display()))?;
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
            // Copied beside, then renamed: a skill is there whole or not.
            let tmp = tempfile::Builder::new()
                .prefix(".import-")
                .tempdir_in(parent)
                .with_context(|| format!("cannot write in {}", parent.display()))?;
            let staged = tmp.path().join(name);
            copy_dir(&plan.root.join(rel), &staged)?;
            std::fs::rename(&staged, &dest)
                .with_context(|| format!("cannot move the skill into {}", dest.display()))?;
        }
    }
    Ok(s)
}

// ---------------------------------------------------------------- pairing

/// A user the ancestor approved.
#[derive(Debug, Clone)]
pub struct Approval {
    pub platform: String,
    pub user_id: String,
    pub user_name: Option<String>,
    pub approved_at: f64,
}

pub struct Pairing {
    pub approved: Vec<Approval>,
    pub notes: Vec<String>,
}

/// `<platform>-approved.json` files (`{user_id: {user_name,
/// approved_at}}`) in `platforms/pairing/` and the older `pairing/`.
/// Pending codes are not brought over: they expire within the hour.
pub fn read_pairing(source: &Path) -> anyhow::Result<Pairing> {
    let mut pairing = Pairing {
        approved: Vec::new(),
        notes: Vec::new(),
    };
    for dir in [
        source.join("platforms").join("pairing"),
        source.join("pairing"),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry?.path();
            let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
                continue;
            };
            let Some(platform) = file.strip_suffix("-approved.json") else {
                continue;
            };
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let Ok(serde_json::Value::Object(users)) = serde_json::from_str(&text) else {
                pairing
                    .notes
                    .push(format!("{} is not a map of users; skipped", path.display()));
                continue;
            };
            for (user_id, info) in users {
                if pairing
                    .approved
                    .iter()
                    .any(|a| a.platform == platform && a.user_id == user_id)
                {
                    continue;
                }
                pairing.approved.push(Approval {
                    platform: platform.to_owned(),
                    user_id,
                    user_name: info
                        .get("user_name")
                        .and_then(|v| v.as_str())
                        .filter(|n| !n.is_empty())
                        .map(str::to_owned),
                    approved_at: info
                        .get("approved_at")
                        .and_then(|v| v.as_f64())
                        .unwrap_or(0.0),
                });
            }
        }
    }
    Ok(pairing)
}

// ---------------------------------------------------------------- cron

/// A job of the ancestor's, as Talaria's job validation takes it.
#[derive(Debug, Clone)]
pub struct HermesJob {
    pub spec: talaria_gateway::cron::JobSpec,
    /// Paused there: paused here too once made.
    pub paused: bool,
    /// Its settings Talaria's jobs have no place for.
    pub dropped: Vec<String>,
}

pub struct CronJobs {
    pub jobs: Vec<HermesJob>,
    pub notes: Vec<String>,
}

/// `cron/jobs.json`: `{"jobs": [...]}` or a bare list.
pub fn read_cron_jobs(source: &Path) -> anyhow::Result<CronJobs> {
    let mut out = CronJobs {
        jobs: Vec::new(),
        notes: Vec::new(),
    };
    let path = source.join("cron").join("jobs.json");
    let Some(text) = read_optional(&path)? else {
        return Ok(out);
    };
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let list = match &value {
        serde_json::Value::Array(list) => list.clone(),
        other => other
            .get("jobs")
            .and_then(|j| j.as_array())
            .cloned()
            .with_context(|| format!("{} holds no list of jobs", path.display()))?,
    };
    for job in &list {
        match hermes_job(job) {
            Ok(job) => out.jobs.push(job),
            Err(why) => out.notes.push(why),
        }
    }
    Ok(out)
}

fn text_of(v: &serde_json::Value, key: &str) -> Option<String> {
    v.get(key)
        .and_then(|v| v.as_str())
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// One job record of the ancestor's as a [`HermesJob`], or why not.
fn hermes_job(job: &serde_json::Value) -> Result<HermesJob, String> {
    let name = text_of(job, "name").or_else(|| text_of(job, "id"));
    let label = name.clone().unwrap_or_else(|| "(unnamed)".to_owned());
    let schedule = job.get("schedule");
    // The parsed form first: its display text can be a rendering
    // ("every 30 minutes") rather than what was typed.
    let schedule = match schedule {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(s) => match s.get("kind").and_then(|k| k.as_str()) {
            Some("interval") => s
                .get("minutes")
                .and_then(|m| m.as_u64())
                .map(|m| format!("every {m}m")),
            Some("cron") => text_of(s, "expr"),
            Some("once") => text_of(s, "run_at"),
            _ => None,
        },
        None => None,
    }
    .or_else(|| text_of(job, "schedule_display"))
    .ok_or_else(|| format!("job `{label}` not imported: its schedule could not be read"))?;

    let mut skills: Vec<String> = job
        .get("skills")
        .and_then(|s| s.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if skills.is_empty()
        && let Some(skill) = text_of(job, "skill")
    {
        skills.push(skill);
    }
    let origin = job.get("origin").and_then(|o| {
        Some(talaria_store::JobOrigin {
            platform: text_of(o, "platform")?,
            chat_id: o.get("chat_id").and_then(|c| match c {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Number(n) => Some(n.to_string()),
                _ => None,
            })?,
            thread_id: o.get("thread_id").and_then(|t| match t {
                serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
                serde_json::Value::Number(n) => Some(n.to_string()),
                _ => None,
            }),
        })
    });
    let deliver: Vec<String> = text_of(job, "deliver")
        .map(|d| {
            d.split(',')
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
                .filter(|t| t != "origin" || origin.is_some())
                .collect()
        })
        .unwrap_or_default();
    // What is left of a limited job's runs.
    let repeat = match job.get("repeat") {
        Some(r) => match r.get("times").and_then(|t| t.as_u64()) {
            Some(times) => {
                let done = r.get("completed").and_then(|c| c.as_u64()).unwrap_or(0);
                let left = times.saturating_sub(done);
                if left == 0 {
                    return Err(format!(
                        "job `{label}` not imported: it has run all its times"
                    ));
                }
                Some(u32::try_from(left).unwrap_or(u32::MAX))
            }
            None => None,
        },
        None => None,
    };
    let state = text_of(job, "state").unwrap_or_default();
    if state == "completed" {
        return Err(format!("job `{label}` not imported: it is completed"));
    }
    let paused = state == "paused" || job.get("enabled").and_then(|e| e.as_bool()) == Some(false);
    let mut dropped = Vec::new();
    for key in [
        "model",
        "provider",
        "base_url",
        "script",
        "workdir",
        "context_from",
        "enabled_toolsets",
    ] {
        let set = match job.get(key) {
            None | Some(serde_json::Value::Null) => false,
            Some(serde_json::Value::String(s)) => !s.is_empty(),
            Some(serde_json::Value::Array(a)) => !a.is_empty(),
            Some(_) => true,
        };
        if set {
            dropped.push(key.to_owned());
        }
    }
    if job.get("no_agent").and_then(|v| v.as_bool()) == Some(true) {
        return Err(format!(
            "job `{label}` not imported: it runs a script without the agent (no_agent), which Talaria's jobs do not"
        ));
    }
    Ok(HermesJob {
        spec: talaria_gateway::cron::JobSpec {
            name,
            prompt: text_of(job, "prompt"),
            skills,
            schedule,
            deliver,
            repeat,
            misfire: None,
            origin,
        },
        paused,
        dropped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_lines_name_their_variable() {
        assert_eq!(env_name("export A_B=1"), Some("A_B"));
        assert_eq!(env_name("# C=2"), None);
        assert_eq!(env_name("D = 'x'"), Some("D"));
        assert!(env_value_empty("E="));
        assert!(env_value_empty("E=\"\""));
        assert!(!env_value_empty("E=x"));
    }

    #[test]
    fn jobs_keep_their_schedule_and_what_is_left_of_their_runs() {
        let job = serde_json::json!({
            "id": "abc", "name": "digest", "prompt": "summarise",
            "schedule": {"kind": "interval", "minutes": 30, "display": "every 30m"},
            "repeat": {"times": 5, "completed": 2}, "deliver": "origin,local",
            "state": "scheduled", "model": "x"
        });
        let job = hermes_job(&job).unwrap();
        assert_eq!(job.spec.schedule, "every 30m");
        assert_eq!(job.spec.repeat, Some(3));
        // No origin was recorded, so `origin` cannot be delivered to.
        assert_eq!(job.spec.deliver, vec!["local".to_owned()]);
        assert_eq!(job.dropped, vec!["model".to_owned()]);
    }
}
