//! The learning log: an append-only record of every change the agent (or
//! its background review, or you) made to skills and memory, with the
//! content before and after kept by hash, so any change can be inspected
//! and undone (`talaria skills history`, `talaria skills rollback`).
//!
//! `$TALARIA_HOME/learning/log.jsonl` holds one JSON object per change;
//! `learning/blobs/<sha256>` holds each distinct content once. Appends take
//! an exclusive lock, so concurrent writers never interleave a line.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use talaria_core::Home;

/// One change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// When the change was made.
    pub at: DateTime<Utc>,
    /// `agent`, `review`, `user`, `curator` or `api` (the HTTP API).
    pub actor: String,
    /// `create`, `edit`, `patch`, `delete`, `write_file`, `remove_file`,
    /// `memory`, `rollback`, ...
    pub action: String,
    /// `skill:<name>`, `skill:<name>/<file>` or `memory:<FILE>.md`.
    pub target: String,
    /// Where the content lives, relative to the home.
    pub path: String,
    /// Hash of the content before (`None`: it did not exist).
    pub before: Option<String>,
    /// Hash of the content after (`None`: it no longer exists).
    pub after: Option<String>,
}

/// Bytes the log is read backwards by at a time.
const BLOCK: usize = 64 * 1024;

/// Longest line read backwards: an entry is a few hundred
/// bytes, so only a damaged file has longer ones.
const MAX_LINE: usize = 64 * 1024;

/// The hash the log names a content by: SHA-256, lower-case hex.
pub fn content_hash(content: &[u8]) -> String {
    talaria_core::ids::to_hex(&Sha256::digest(content))
}

/// One page of the log, newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    /// The entries of the page.
    pub entries: Vec<Entry>,
    /// Whether older entries follow.
    pub has_more: bool,
}

/// The log of one home.
#[derive(Debug, Clone)]
pub struct LearningLog {
    root: PathBuf,
    home: PathBuf,
}

impl LearningLog {
    /// The log of `home`, under `learning/`; nothing is created until the
    /// first change.
    pub fn new(home: &Home) -> LearningLog {
        LearningLog {
            root: home.root().join("learning"),
            home: home.root().to_path_buf(),
        }
    }

    /// Records a change of the file at `path`, whose content was `before`
    /// and is now `after`. Nothing is recorded when nothing changed. A
    /// failure is logged: the log never stops a write.
    pub fn record(
        &self,
        actor: &str,
        action: &str,
        target: &str,
        path: &Path,
        before: Option<&[u8]>,
        after: Option<&[u8]>,
    ) {
        if before == after {
            return;
        }
        if let Err(e) = self.try_record(actor, action, target, path, before, after) {
            tracing::warn!(error = %e, "could not write the learning log");
        }
    }

    fn try_record(
        &self,
        actor: &str,
        action: &str,
        target: &str,
        path: &Path,
        before: Option<&[u8]>,
        after: Option<&[u8]>,
    ) -> std::io::Result<()> {
        let entry = Entry {
            at: Utc::now(),
            actor: actor.to_owned(),
            action: action.to_owned(),
            target: target.to_owned(),
            path: path
                .strip_prefix(&self.home)
                .unwrap_or(path)
                .display()
                .to_string(),
            before: before.map(|b| self.store_blob(b)).transpose()?,
            after: after.map(|b| self.store_blob(b)).transpose()?,
        };
        let mut line = serde_json::to_vec(&entry).map_err(std::io::Error::other)?;
        line.push(b'\n');
        std::fs::create_dir_all(&self.root)?;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join("log.jsonl"))?;
        fs4::fs_std::FileExt::lock_exclusive(&file)?;
        file.write_all(&line)?;
        file.sync_data()
    }

    /// Stores `content` under its hash; returns the hash.
    fn store_blob(&self, content: &[u8]) -> std::io::Result<String> {
        let hash = content_hash(content);
        let dir = self.root.join("blobs");
        let path = dir.join(&hash);
        if !path.exists() {
            std::fs::create_dir_all(&dir)?;
            let mut tmp = tempfile::NamedTempFile::new_in(&dir)?;
            tmp.write_all(content)?;
            tmp.persist(&path).map_err(|e| e.error)?;
        }
        Ok(hash)
    }

    /// A stored content by hash.
    pub fn blob(&self, hash: &str) -> Option<Vec<u8>> {
        if hash.len() != 64 || !hash.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        std::fs::read(self.root.join("blobs").join(hash)).ok()
    }

    /// Every entry, oldest first; unreadable lines are skipped.
    pub fn entries(&self) -> Vec<Entry> {
        std::fs::read_to_string(self.root.join("log.jsonl"))
            .map(|text| {
                text.lines()
                    .filter_map(|l| serde_json::from_str(l).ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The entries `keep` accepts, newest first: `skip` of them passed
    /// over, then at most `take`. The file is read backwards from its end
    /// a block at a time, so a recent page costs a few blocks however long
    /// the log has grown, and memory stays bounded; a deep page reads
    /// everything after it. Lines that do not parse (or are absurdly long)
    /// are skipped, as [`LearningLog::entries`] skips them.
    pub fn newest(
        &self,
        skip: usize,
        take: usize,
        keep: impl Fn(&Entry) -> bool,
    ) -> std::io::Result<Page> {
        let mut page = Page::default();
        let mut skipped = 0usize;
        self.scan_back(|entry| {
            if !keep(&entry) {
                return false;
            }
            if skipped < skip {
                skipped += 1;
                false
            } else if page.entries.len() < take {
                page.entries.push(entry);
                false
            } else {
                page.has_more = true;
                true
            }
        })?;
        Ok(page)
    }

    /// The newest entry `keep` accepts, read from the end of the log as
    /// [`LearningLog::newest`] reads it.
    pub fn latest(&self, keep: impl Fn(&Entry) -> bool) -> std::io::Result<Option<Entry>> {
        let mut found = None;
        self.scan_back(|entry| {
            if keep(&entry) {
                found = Some(entry);
                true
            } else {
                false
            }
        })?;
        Ok(found)
    }

    /// Hands `visit` every entry from the newest back, until it returns
    /// true or the log's start is reached.
    fn scan_back(&self, mut visit: impl FnMut(Entry) -> bool) -> std::io::Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = match std::fs::File::open(self.root.join("log.jsonl")) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut line = |bytes: &[u8]| -> bool {
            serde_json::from_slice::<Entry>(bytes.trim_ascii()).is_ok_and(&mut visit)
        };
        let mut pos = file.metadata()?.len();
        // The end of the line being read: its bytes after the block that
        // holds its start.
        let mut carry: Vec<u8> = Vec::new();
        // Inside a line longer than MAX_LINE: dropped up to its start.
        let mut oversized = false;
        while pos > 0 {
            let n = (BLOCK as u64).min(pos);
            pos -= n;
            file.seek(SeekFrom::Start(pos))?;
            let mut buf = vec![0u8; n as usize];
            file.read_exact(&mut buf)?;
            buf.extend_from_slice(&carry);
            while let Some(i) = buf.iter().rposition(|b| *b == b'\n') {
                if !oversized && line(&buf[i + 1..]) {
                    return Ok(());
                }
                oversized = false;
                buf.truncate(i);
            }
            if buf.len() > MAX_LINE {
                oversized = true;
                buf.clear();
            }
            carry = buf;
        }
        if !oversized {
            line(&carry);
        }
        Ok(())
    }

    /// The home the paths are relative to.
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// The skills whose SKILL.md the agent created (in a conversation or
    /// in its background review) and that have not been removed since. A
    /// skill the agent wrote because you asked it to is among them: the
    /// agent wrote it. Removing the skill (a delete, or undoing its
    /// creation) takes it out again.
    pub fn skills_created_by_agent(&self) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        for entry in self.entries() {
            // `skill:<name>` is the SKILL.md; `skill:<name>/<file>` a
            // support file, which says nothing about who wrote the skill.
            let Some(name) = entry.target.strip_prefix("skill:") else {
                continue;
            };
            if name.contains('/') {
                continue;
            }
            if entry.after.is_none() {
                names.remove(name);
            } else if entry.action == "create"
                && (entry.actor == "agent" || entry.actor == "review")
            {
                names.insert(name.to_owned());
            }
        }
        names
    }
}

/// The `memory` tool with every change to MEMORY.md and USER.md recorded in
/// the learning log.
pub struct LoggedMemory {
    inner: std::sync::Arc<dyn talaria_agent::tools::Tool>,
    log: LearningLog,
    files: Vec<(String, PathBuf)>,
    actor: &'static str,
}

impl LoggedMemory {
    /// Wraps the core memory tool for `actor` (`agent`, `review`).
    pub fn new(home: &Home, actor: &'static str) -> LoggedMemory {
        let dir = home.memories_dir();
        LoggedMemory {
            inner: std::sync::Arc::new(talaria_agent::tools::memory::MemoryTool),
            log: LearningLog::new(home),
            files: ["MEMORY.md", "USER.md"]
                .iter()
                .map(|f| ((*f).to_owned(), dir.join(f)))
                .collect(),
            actor,
        }
    }

    fn contents(&self) -> Vec<Option<Vec<u8>>> {
        self.files
            .iter()
            .map(|(_, p)| std::fs::read(p).ok())
            .collect()
    }
}

#[async_trait::async_trait]
impl talaria_agent::tools::Tool for LoggedMemory {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn description(&self) -> &str {
        self.inner.description()
    }

    fn parameters(&self) -> serde_json::Value {
        self.inner.parameters()
    }

    async fn call(
        &self,
        args: serde_json::Value,
        ctx: &talaria_agent::tools::ToolContext,
    ) -> talaria_agent::tools::ToolResult {
        let before = self.contents();
        let result = self.inner.call(args, ctx).await;
        let after = self.contents();
        for (i, (name, path)) in self.files.iter().enumerate() {
            self.log.record(
                self.actor,
                "memory",
                &format!("memory:{name}"),
                path,
                before[i].as_deref(),
                after[i].as_deref(),
            );
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_read_newest_first_from_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        let log = LearningLog::new(&home);
        std::fs::create_dir_all(dir.path().join("home/learning")).unwrap();
        // Enough entries to span several blocks, a line that is not JSON
        // and one far longer than any entry.
        let mut text = String::new();
        for i in 0..1500 {
            let entry = Entry {
                at: Utc::now(),
                actor: "agent".into(),
                action: "edit".into(),
                target: format!("skill:s{}", i % 3),
                path: format!("skills/s{i}/SKILL.md"),
                before: None,
                after: Some(format!("{i:064}")),
            };
            text.push_str(&serde_json::to_string(&entry).unwrap());
            text.push('\n');
            if i == 700 {
                text.push_str("not json\n");
                text.push_str(&"x".repeat(3 * MAX_LINE));
                text.push('\n');
            }
        }
        std::fs::write(dir.path().join("home/learning/log.jsonl"), text).unwrap();
        let numbers = |page: &Page| -> Vec<usize> {
            page.entries
                .iter()
                .map(|e| e.after.as_deref().unwrap().parse().unwrap())
                .collect()
        };
        let first = log.newest(0, 3, |_| true).unwrap();
        assert_eq!(numbers(&first), [1499, 1498, 1497]);
        assert!(first.has_more);
        let across = log.newest(797, 5, |_| true).unwrap();
        assert_eq!(numbers(&across), [702, 701, 700, 699, 698]);
        let last = log.newest(1498, 10, |_| true).unwrap();
        assert_eq!(numbers(&last), [1, 0]);
        assert!(!last.has_more);
        let one_skill = log.newest(1, 2, |e| e.target == "skill:s1").unwrap();
        assert_eq!(numbers(&one_skill), [1495, 1492]);
        assert_eq!(log.newest(0, 2000, |_| true).unwrap().entries.len(), 1500);
        let latest = log.latest(|e| e.target == "skill:s0").unwrap().unwrap();
        assert_eq!(latest.path, "skills/s1497/SKILL.md");
        assert!(log.latest(|e| e.target == "skill:none").unwrap().is_none());
        // No log yet: an empty page.
        let empty = LearningLog::new(&Home::at(dir.path().join("none")));
        assert_eq!(empty.newest(0, 5, |_| true).unwrap(), Page::default());
    }

    #[test]
    fn the_agent_wrote_the_skills_it_created_until_they_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        let log = LearningLog::new(&home);
        let md = |name: &str| home.skills_dir().join(name).join("SKILL.md");
        // Asked for in a conversation, or of the review's own accord.
        log.record(
            "agent",
            "create",
            "skill:asked",
            &md("asked"),
            None,
            Some(b"a"),
        );
        log.record(
            "review",
            "create",
            "skill:own",
            &md("own"),
            None,
            Some(b"o"),
        );
        // A support file's creation says nothing about who wrote the skill.
        let notes = home.skills_dir().join("mine/references/notes.md");
        log.record(
            "agent",
            "write_file",
            "skill:mine/references/notes.md",
            &notes,
            None,
            Some(b"n"),
        );
        // The agent patching the user's skill does not make it the agent's.
        log.record(
            "agent",
            "patch",
            "skill:mine",
            &md("mine"),
            Some(b"m"),
            Some(b"m2"),
        );
        // Created, then deleted: gone from the set.
        log.record(
            "agent",
            "create",
            "skill:gone",
            &md("gone"),
            None,
            Some(b"g"),
        );
        log.record(
            "agent",
            "delete",
            "skill:gone",
            &md("gone"),
            Some(b"g"),
            None,
        );
        // Created, then the creation undone: gone too.
        log.record(
            "agent",
            "create",
            "skill:undone",
            &md("undone"),
            None,
            Some(b"u"),
        );
        log.record(
            "user",
            "rollback",
            "skill:undone",
            &md("undone"),
            Some(b"u"),
            None,
        );
        let names: Vec<String> = log.skills_created_by_agent().into_iter().collect();
        assert_eq!(names, ["asked", "own"]);
    }
}
