//! The skills library: bundled skills shipped inside the binary and the
//! user's under `$TALARIA_HOME/skills/[<category>/]<name>/SKILL.md`, with
//! optional `references/`, `templates/`, `scripts/` and `assets/`.
//!
//! A skill is named by its folder. The user's skills win over bundled ones
//! of the same name; only the user's can be changed. Every write goes
//! through the checks here (names, sizes, paths that stay inside the skill
//! folder, a frontmatter that names the skill), and every successful write
//! invalidates the cached skills index, so the next session sees it.

pub mod bundled;
pub mod frontmatter;
pub mod usage;

use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use talaria_core::Home;

use self::frontmatter::{Frontmatter, parse};
use self::usage::{Event, SkillState, Usage};

/// Longest skill name.
pub const MAX_NAME: usize = 64;

/// Longest SKILL.md, in chars.
pub const MAX_SKILL_CHARS: usize = 100_000;

/// Largest support file, in bytes.
pub const MAX_FILE_BYTES: usize = 1024 * 1024;

/// The folders support files may live in.
pub const SUPPORT_DIRS: &[&str] = &["references", "templates", "scripts", "assets"];

/// Folders never searched for skills.
const SKIPPED: &[&str] = &[
    ".git",
    ".github",
    ".hub",
    ".archive",
    ".venv",
    "venv",
    "node_modules",
    "__pycache__",
];

/// Longest description shown in the index, in chars.
const INDEX_DESCRIPTION_CHARS: usize = 60;

/// What went wrong with a skill operation; the text says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SkillError(pub String);

fn err<T>(message: impl Into<String>) -> Result<T, SkillError> {
    Err(SkillError(message.into()))
}

/// Where a skill comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The user's skills folder: can be changed.
    User,
    /// Shipped with Talaria: read-only.
    Bundled,
}

/// A skill as listed.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillInfo {
    /// The folder name, which is how the skill is called.
    pub name: String,
    /// What the skill is for, from its frontmatter.
    pub description: String,
    /// `general` for a skill directly under the root.
    pub category: String,
    /// Bundled, or the user's own.
    pub origin: Origin,
    /// The skill folder (user skills only).
    pub dir: Option<PathBuf>,
    /// Everything its frontmatter says.
    pub frontmatter: Frontmatter,
}

/// A skill with its instructions.
#[derive(Debug, Clone, PartialEq)]
pub struct Skill {
    /// Name, category, origin and frontmatter.
    pub info: SkillInfo,
    /// The whole SKILL.md.
    pub text: String,
    /// Support files, relative to the skill folder.
    pub files: Vec<String>,
}

/// Whether `name` may name a skill (or a category): lower-case letters,
/// digits, `.`, `_`, `-`, starting with a letter or digit, at most 64.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= MAX_NAME
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
}

fn check_name(name: &str) -> Result<(), SkillError> {
    if valid_name(name) {
        Ok(())
    } else {
        err(format!(
            "`{name}` is not a skill name: lower-case letters, digits, `.`, `_` and `-`, starting with a letter or digit, at most {MAX_NAME}"
        ))
    }
}

/// A support file's path inside a skill, checked: `<dir>/<file>` under one
/// of [`SUPPORT_DIRS`], no `..`, nothing absolute.
pub fn check_support_path(rel: &str) -> Result<PathBuf, SkillError> {
    let path = Path::new(rel);
    let mut parts = path.components();
    let top = match parts.next() {
        Some(Component::Normal(top)) => top.to_string_lossy().into_owned(),
        _ => return err(format!("`{rel}` is not a support file path")),
    };
    if !SUPPORT_DIRS.contains(&top.as_str()) {
        return err(format!(
            "support files live under {}/ (`{rel}` is not)",
            SUPPORT_DIRS.join("/, ")
        ));
    }
    let mut depth = 0;
    for part in parts {
        match part {
            Component::Normal(_) => depth += 1,
            _ => return err(format!("`{rel}` leaves the skill folder")),
        }
    }
    if depth == 0 {
        return err(format!("`{rel}` names a folder, not a file"));
    }
    Ok(path.to_path_buf())
}

/// The state of the files an index was built from: each SKILL.md (and the
/// usage file) with its modification time and size.
type Manifest = Vec<(PathBuf, Option<std::time::SystemTime>, u64)>;

/// The skills library of one home.
pub struct Library {
    root: PathBuf,
    usage: Usage,
    log: crate::log::LearningLog,
    /// The prompt index and the state of the files it was built from.
    index: Mutex<Option<(Manifest, String)>>,
}

impl Library {
    /// The library of `home`: its `skills/` folder over the bundled skills.
    pub fn new(home: &Home) -> Library {
        let root = home.skills_dir();
        Library {
            usage: Usage::new(&root),
            log: crate::log::LearningLog::new(home),
            root,
            index: Mutex::new(None),
        }
    }

    /// The user's skills folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The usage records of the user's skills.
    pub fn usage(&self) -> &Usage {
        &self.usage
    }

    /// The learning log changes are recorded in.
    pub fn log(&self) -> &crate::log::LearningLog {
        &self.log
    }

    /// The file a write to `name` touches: its SKILL.md, or `file` (a
    /// support file) in its folder. `None` for a skill not (yet) the
    /// user's.
    pub fn file_of(&self, name: &str, file: Option<&str>) -> Option<PathBuf> {
        let dir = self.find(name)?.dir?;
        Some(match file {
            None | Some("SKILL.md") => dir.join("SKILL.md"),
            Some(rel) => dir.join(check_support_path(rel).ok()?),
        })
    }

    /// Every skill, user skills first winning name clashes, sorted by
    /// category and name.
    pub fn list(&self) -> Vec<SkillInfo> {
        let mut out: Vec<SkillInfo> = self
            .user_skill_files()
            .into_iter()
            .filter_map(|(name, category, path)| user_info(name, category, &path))
            .collect();
        for b in bundled::SKILLS {
            if !out.iter().any(|s| s.name == b.name)
                && let Some(info) = bundled_info(b)
            {
                out.push(info);
            }
        }
        out.retain(|s| runs_here(&s.frontmatter));
        out.sort_by(|a, b| (&a.category, &a.name).cmp(&(&b.category, &b.name)));
        out
    }

    /// The skill called `name`: the user's (directly under the root, else
    /// in the first category folder holding it), else the bundled one.
    /// Looks only where that skill can be, rather than reading them all.
    pub fn find(&self, name: &str) -> Option<SkillInfo> {
        if !valid_name(name) {
            return None;
        }
        let direct = self.root.join(name).join("SKILL.md");
        let path = if direct.is_file() {
            Some((direct, "general".to_owned()))
        } else {
            dirs(&self.root)
                .into_iter()
                .filter(|c| !c.join("SKILL.md").is_file())
                .find_map(|c| {
                    let md = c.join(name).join("SKILL.md");
                    let category = c.file_name()?.to_string_lossy().into_owned();
                    md.is_file().then_some((md, category))
                })
        };
        let info = match path {
            Some((md, category)) => user_info(name.to_owned(), category, &md),
            None => bundled::SKILLS
                .iter()
                .find(|b| b.name == name)
                .and_then(bundled_info),
        }?;
        runs_here(&info.frontmatter).then_some(info)
    }

    /// A skill's SKILL.md and its support files.
    pub fn read(&self, name: &str) -> Result<Skill, SkillError> {
        check_name(name)?;
        let info = self.find(name).ok_or_else(|| {
            SkillError(format!("no skill named `{name}`; skills_list shows them"))
        })?;
        let (text, files) = match &info.dir {
            Some(dir) => {
                let text = std::fs::read_to_string(dir.join("SKILL.md"))
                    .map_err(|e| SkillError(format!("cannot read {name}'s SKILL.md: {e}")))?;
                (text, support_files(dir))
            }
            None => (
                bundled::SKILLS
                    .iter()
                    .find(|b| b.name == name)
                    .map(|b| b.text.to_owned())
                    .unwrap_or_default(),
                Vec::new(),
            ),
        };
        Ok(Skill { info, text, files })
    }

    /// A support file of a user skill.
    pub fn read_file(&self, name: &str, rel: &str) -> Result<String, SkillError> {
        let dir = self.user_dir(name)?;
        let rel = check_support_path(rel)?;
        let path = dir.join(&rel);
        inside(&dir, &path)?;
        let bytes = std::fs::read(&path).map_err(|_| {
            SkillError(format!(
                "`{}` does not exist in `{name}`; its files are: {}",
                rel.display(),
                support_files(&dir).join(", ")
            ))
        })?;
        if bytes.len() > MAX_FILE_BYTES {
            return err(format!("`{}` is larger than 1 MiB", rel.display()));
        }
        String::from_utf8(bytes).map_err(|_| SkillError(format!("`{}` is not text", rel.display())))
    }

    /// Counts a view (and use) of `name`.
    pub fn viewed(&self, name: &str, now: DateTime<Utc>) {
        self.usage.record(name, Event::Viewed, now);
    }

    /// Creates a user skill from a whole SKILL.md; `by` is `Some("agent")`
    /// for skills the agent writes of its own accord.
    pub fn create(
        &self,
        name: &str,
        category: Option<&str>,
        content: &str,
        by: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<PathBuf, SkillError> {
        check_name(name)?;
        if let Some(c) = category {
            check_name(c).map_err(|_| {
                SkillError(format!(
                    "`{c}` is not a category name (the same rules as a skill name)"
                ))
            })?;
        }
        if let Some(existing) = self.find(name) {
            let place = existing
                .dir
                .map(|d| d.display().to_string())
                .unwrap_or_else(|| "Talaria's bundled skills".into());
            return err(format!("a skill named `{name}` already exists ({place})"));
        }
        check_content(name, content)?;
        let dir = match category {
            Some(c) => self.root.join(c).join(name),
            None => self.root.join(name),
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| SkillError(format!("cannot create {}: {e}", dir.display())))?;
        write_atomic(&dir.join("SKILL.md"), content.as_bytes())?;
        self.usage.created(name, by, now);
        self.invalidate();
        Ok(dir)
    }

    /// Replaces a user skill's SKILL.md.
    pub fn edit(&self, name: &str, content: &str, now: DateTime<Utc>) -> Result<(), SkillError> {
        let dir = self.user_dir(name)?;
        check_content(name, content)?;
        write_atomic(&dir.join("SKILL.md"), content.as_bytes())?;
        self.usage.record(name, Event::Patched, now);
        self.invalidate();
        Ok(())
    }

    /// Replaces `old` with `new` in SKILL.md or a support file; returns how
    /// many places changed. SKILL.md must still be a valid skill after.
    pub fn patch(
        &self,
        name: &str,
        file: Option<&str>,
        old: &str,
        new: &str,
        replace_all: bool,
        now: DateTime<Utc>,
    ) -> Result<usize, SkillError> {
        let dir = self.user_dir(name)?;
        let (path, shown) = match file {
            None | Some("SKILL.md") => (dir.join("SKILL.md"), "SKILL.md".to_owned()),
            Some(rel) => {
                let rel = check_support_path(rel)?;
                (dir.join(&rel), rel.display().to_string())
            }
        };
        inside(&dir, &path)?;
        let content = std::fs::read_to_string(&path)
            .map_err(|e| SkillError(format!("cannot read {shown}: {e}")))?;
        let (updated, count) =
            talaria_agent::tools::files::replace_exact(&content, old, new, replace_all, &shown)
                .map_err(SkillError)?;
        if shown == "SKILL.md" {
            check_content(name, &updated)
                .map_err(|e| SkillError(format!("the patch would break SKILL.md: {e}")))?;
        } else if updated.len() > MAX_FILE_BYTES {
            return err(format!("{shown} would be larger than 1 MiB"));
        }
        write_atomic(&path, updated.as_bytes())?;
        self.usage.record(name, Event::Patched, now);
        self.invalidate();
        Ok(count)
    }

    /// Deletes a user skill (refused for pinned ones).
    pub fn delete(&self, name: &str) -> Result<(), SkillError> {
        let dir = self.user_dir(name)?;
        if self.usage.get(name).pinned {
            return err(format!("`{name}` is pinned; unpin it first"));
        }
        std::fs::remove_dir_all(&dir)
            .map_err(|e| SkillError(format!("cannot delete {}: {e}", dir.display())))?;
        // An emptied category folder goes too.
        if let Some(parent) = dir.parent()
            && parent != self.root
        {
            let _ = std::fs::remove_dir(parent);
        }
        self.usage.forget(name);
        self.invalidate();
        Ok(())
    }

    /// Writes a support file of a user skill.
    pub fn write_file(
        &self,
        name: &str,
        rel: &str,
        content: &str,
        now: DateTime<Utc>,
    ) -> Result<(), SkillError> {
        let dir = self.user_dir(name)?;
        let rel = check_support_path(rel)?;
        if content.len() > MAX_FILE_BYTES {
            return err("support files are at most 1 MiB");
        }
        let path = dir.join(&rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| SkillError(format!("cannot create {}: {e}", parent.display())))?;
        }
        inside(&dir, &path)?;
        write_atomic(&path, content.as_bytes())?;
        self.usage.record(name, Event::Patched, now);
        Ok(())
    }

    /// Removes a support file of a user skill.
    pub fn remove_file(&self, name: &str, rel: &str, now: DateTime<Utc>) -> Result<(), SkillError> {
        let dir = self.user_dir(name)?;
        let rel_path = check_support_path(rel)?;
        let path = dir.join(&rel_path);
        inside(&dir, &path)?;
        if !path.is_file() {
            return err(format!(
                "`{rel}` does not exist in `{name}`; its files are: {}",
                support_files(&dir).join(", ")
            ));
        }
        std::fs::remove_file(&path).map_err(|e| SkillError(format!("cannot remove {rel}: {e}")))?;
        self.usage.record(name, Event::Patched, now);
        Ok(())
    }

    /// The skills index for the system prompt: names and short
    /// descriptions by category. Rebuilt only when a skill was written
    /// through the library or a SKILL.md changed on disk.
    pub fn index(&self) -> String {
        let manifest = self.manifest();
        let mut cached = self.index.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((seen, text)) = &*cached
            && *seen == manifest
        {
            return text.clone();
        }
        let text = render_index(&self.list(), &self.usage);
        *cached = Some((manifest, text.clone()));
        text
    }

    /// Forgets the cached index (after a write).
    pub fn invalidate(&self) {
        *self.index.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The folder of the user skill `name`, refusing bundled and unknown
    /// ones.
    fn user_dir(&self, name: &str) -> Result<PathBuf, SkillError> {
        check_name(name)?;
        match self.find(name) {
            Some(SkillInfo { dir: Some(dir), .. }) => Ok(dir),
            Some(_) => err(format!(
                "`{name}` is one of Talaria's bundled skills and cannot be changed; create your own skill with another name"
            )),
            None => err(format!("no skill named `{name}`; skills_list shows them")),
        }
    }

    /// `(name, category, SKILL.md path)` of every user skill: at
    /// `<root>/<name>/` or `<root>/<category>/<name>/`.
    fn user_skill_files(&self) -> Vec<(String, String, PathBuf)> {
        let mut out = Vec::new();
        for entry in dirs(&self.root) {
            let Some(top) = entry.file_name().map(|n| n.to_string_lossy().into_owned()) else {
                continue;
            };
            let skill_md = entry.join("SKILL.md");
            if skill_md.is_file() {
                if valid_name(&top) {
                    out.push((top, "general".to_owned(), skill_md));
                }
                continue;
            }
            for inner in dirs(&entry) {
                let Some(name) = inner.file_name().map(|n| n.to_string_lossy().into_owned()) else {
                    continue;
                };
                let skill_md = inner.join("SKILL.md");
                if skill_md.is_file() && valid_name(&name) {
                    out.push((name, top.clone(), skill_md));
                }
            }
        }
        out
    }

    fn manifest(&self) -> Manifest {
        let mut files: Vec<_> = self
            .user_skill_files()
            .into_iter()
            .map(|(_, _, path)| {
                let meta = std::fs::metadata(&path).ok();
                let modified = meta.as_ref().and_then(|m| m.modified().ok());
                let len = meta.map_or(0, |m| m.len());
                (path, modified, len)
            })
            .collect();
        // Archiving changes the index without touching a SKILL.md.
        let usage_file = self.root.join(usage::FILE);
        let meta = std::fs::metadata(&usage_file).ok();
        files.push((
            usage_file,
            meta.as_ref().and_then(|m| m.modified().ok()),
            meta.map_or(0, |m| m.len()),
        ));
        files.sort();
        files
    }
}

/// A user skill's listing from its SKILL.md; a file that does not parse is
/// skipped with a warning.
fn user_info(name: String, category: String, path: &Path) -> Option<SkillInfo> {
    let text = std::fs::read_to_string(path).ok()?;
    let parsed = match parse(&text) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "skill skipped");
            return None;
        }
    };
    Some(SkillInfo {
        description: parsed.frontmatter.description.trim().to_owned(),
        name,
        category,
        origin: Origin::User,
        dir: path.parent().map(Path::to_path_buf),
        frontmatter: parsed.frontmatter,
    })
}

/// A bundled skill's listing.
fn bundled_info(b: &bundled::BundledSkill) -> Option<SkillInfo> {
    let parsed = parse(b.text).ok()?;
    Some(SkillInfo {
        name: b.name.to_owned(),
        description: parsed.frontmatter.description.trim().to_owned(),
        category: b.category.to_owned(),
        origin: Origin::Bundled,
        dir: None,
        frontmatter: parsed.frontmatter,
    })
}

/// Folders in `dir` that may hold skills.
fn dirs(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            !name.starts_with('.') && !SKIPPED.contains(&name.as_str())
        })
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// Support files of a skill folder, relative, sorted.
fn support_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for sub in SUPPORT_DIRS {
        let mut stack = vec![dir.join(sub)];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else if let Ok(rel) = path.strip_prefix(dir) {
                    out.push(rel.display().to_string());
                }
            }
        }
    }
    out.sort();
    out
}

/// Refuses `path` unless it resolves inside `dir` (a symlink pointing out
/// is an escape too).
fn inside(dir: &Path, path: &Path) -> Result<(), SkillError> {
    let base = dir
        .canonicalize()
        .map_err(|e| SkillError(format!("cannot resolve {}: {e}", dir.display())))?;
    // The file may not exist yet: resolve its nearest existing ancestor.
    let mut probe = path.to_path_buf();
    let resolved = loop {
        match probe.canonicalize() {
            Ok(p) => break p,
            Err(_) => match probe.parent() {
                Some(parent) => probe = parent.to_path_buf(),
                None => return err("the path cannot be resolved"),
            },
        }
    };
    if resolved.starts_with(&base) {
        Ok(())
    } else {
        err("the path leaves the skill folder")
    }
}

fn check_content(name: &str, content: &str) -> Result<(), SkillError> {
    if content.chars().count() > MAX_SKILL_CHARS {
        return err(format!(
            "SKILL.md is limited to {MAX_SKILL_CHARS} characters"
        ));
    }
    let parsed = parse(content).map_err(SkillError)?;
    frontmatter::check(&parsed, name).map_err(SkillError)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), SkillError> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let result = (|| -> std::io::Result<()> {
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        tmp.write_all(bytes)?;
        tmp.as_file().sync_all()?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    })();
    result.map_err(|e| SkillError(format!("cannot write {}: {e}", path.display())))
}

/// Whether a skill's `platforms` admit this machine.
fn runs_here(fm: &Frontmatter) -> bool {
    let here = match std::env::consts::OS {
        "macos" => "macos",
        "windows" => "windows",
        "android" => "android",
        _ => "linux",
    };
    fm.platforms.is_empty() || fm.platforms.iter().any(|p| p.eq_ignore_ascii_case(here))
}

/// The prompt block: archived skills left out, descriptions shortened.
fn render_index(skills: &[SkillInfo], usage: &Usage) -> String {
    let records = usage.all();
    let shown: Vec<&SkillInfo> = skills
        .iter()
        .filter(|s| {
            records
                .get(&s.name)
                .is_none_or(|r| r.state != SkillState::Archived)
        })
        .collect();
    if shown.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "## Skills\nSkills are tested procedures for recurring tasks. Before replying, scan the list below: if a skill matches the task, even partly, load it with skill_view(name) and follow it. When you work out a procedure worth reusing, or a skill proves wrong, save or fix it with skill_manage.\n<available_skills>\n",
    );
    let mut category = "";
    for s in shown {
        if s.category != category {
            category = &s.category;
            out.push_str(&format!("  {category}:\n"));
        }
        out.push_str(&format!(
            "    - {}: {}\n",
            s.name,
            shorten(&s.description, INDEX_DESCRIPTION_CHARS)
        ));
    }
    out.push_str("</available_skills>");
    out
}

fn shorten(text: &str, max: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        flat
    } else {
        let cut: String = flat.chars().take(max - 3).collect();
        format!("{cut}...")
    }
}
