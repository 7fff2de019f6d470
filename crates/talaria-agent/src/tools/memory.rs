//! The `memory` tool: the agent's durable notes (`MEMORY.md`) and its
//! profile of the user (`USER.md`), and the frozen snapshot of both that the
//! system prompt shows.
//!
//! Each file is a list of entries joined by [`ENTRY_DELIMITER`]. The size
//! limits apply to the whole joined text because that is exactly what lands
//! in the prompt. Writes take an exclusive lock on a `.lock` sidecar (so two
//! processes never interleave a read-modify-write) and replace the file
//! atomically (so a reader never sees half a file).

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_core::Home;
use talaria_core::config::MemoryConfig;

use super::{Tool, ToolContext, ToolError, ToolResult, opt_array, opt_str, threat};

/// Separates entries inside a memory file. A bare `§` inside an entry does
/// not split it; only the character on a line of its own does.
pub const ENTRY_DELIMITER: &str = "\n§\n";

/// Most operations one batch may carry.
const MAX_BATCH: usize = 50;

/// Characters of an entry shown when several entries match.
const PREVIEW_CHARS: usize = 80;

/// Which file an operation works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MemoryTarget {
    /// `MEMORY.md`: the agent's own notes.
    Memory,
    /// `USER.md`: what the agent knows about its user.
    User,
}

impl MemoryTarget {
    /// Parses the tool's spelling (`memory` or `user`).
    pub fn parse(s: &str) -> Option<MemoryTarget> {
        match s {
            "memory" => Some(MemoryTarget::Memory),
            "user" => Some(MemoryTarget::User),
            _ => None,
        }
    }

    /// The tool's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryTarget::Memory => "memory",
            MemoryTarget::User => "user",
        }
    }

    /// The file name inside the memories directory.
    pub fn file_name(self) -> &'static str {
        match self {
            MemoryTarget::Memory => "MEMORY.md",
            MemoryTarget::User => "USER.md",
        }
    }

    /// The character limit on the whole joined file.
    pub fn limit(self, config: &MemoryConfig) -> usize {
        match self {
            MemoryTarget::Memory => config.memory_char_limit,
            MemoryTarget::User => config.user_char_limit,
        }
    }
}

/// Splits a file's text into entries: trimmed, empty pieces dropped, exact
/// duplicates removed keeping the first.
pub fn parse_entries(raw: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for piece in raw.split(ENTRY_DELIMITER) {
        let piece = piece.trim();
        if !piece.is_empty() && !out.iter().any(|e| e == piece) {
            out.push(piece.to_owned());
        }
    }
    out
}

/// The file text for `entries`.
pub fn join_entries(entries: &[String]) -> String {
    entries.join(ENTRY_DELIMITER)
}

/// Characters the entries take in the prompt, delimiters included.
pub fn usage_chars(entries: &[String]) -> usize {
    let text: usize = entries.iter().map(|e| e.chars().count()).sum();
    text + entries.len().saturating_sub(1) * ENTRY_DELIMITER.chars().count()
}

/// Reads one target's entries; a missing file is an empty list.
pub fn read_entries(home: &Home, target: MemoryTarget) -> std::io::Result<Vec<String>> {
    Ok(parse_entries(&read_raw(
        &home.memories_dir().join(target.file_name()),
    )?))
}

fn read_raw(path: &Path) -> std::io::Result<String> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(e),
    }
}

/// Renders both files for the system prompt.
///
/// Call this once when a session starts and keep the text: the prompt must
/// stay byte-identical for the whole session (provider prompt caches depend
/// on it), so writes made during the session show up in the next one. An
/// entry that fails the threat scan (say, one edited by hand) is replaced by
/// a placeholder in the rendering only; the file keeps it so the agent can
/// remove it. Returns an empty string when memory is disabled or empty.
pub fn memory_snapshot(home: &Home, config: &MemoryConfig) -> String {
    if !config.enabled {
        return String::new();
    }
    let mut blocks = Vec::new();
    for (target, title) in [
        (
            MemoryTarget::Memory,
            "MEMORY (your own notes from earlier sessions)",
        ),
        (
            MemoryTarget::User,
            "USER PROFILE (what you know about the user)",
        ),
    ] {
        let entries = match read_entries(home, target) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!("cannot read {}: {e}", target.file_name());
                continue;
            }
        };
        if entries.is_empty() {
            continue;
        }
        let limit = target.limit(config);
        let used = usage_chars(&entries);
        let shown: Vec<String> = entries
            .iter()
            .map(|e| match threat::scan(e) {
                Ok(()) => e.clone(),
                Err(f) => format!(
                    "[BLOCKED: this {} entry matched threat pattern {} and is left out of the \
                     prompt; call memory with action=remove to delete it.]",
                    target.file_name(),
                    f.id()
                ),
            })
            .collect();
        let rule = "═".repeat(46);
        blocks.push(format!(
            "{rule}\n{title} [{}% — {used}/{limit} chars]\n{rule}\n{}",
            percent(used, limit),
            join_entries(&shown)
        ));
    }
    blocks.join("\n\n")
}

fn percent(used: usize, limit: usize) -> usize {
    if limit == 0 {
        return 100;
    }
    (used.saturating_mul(100) / limit).min(100)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Add,
    Replace,
    Remove,
}

#[derive(Debug, Clone)]
struct Op {
    action: Action,
    target: MemoryTarget,
    content: String,
    old_text: String,
}

/// A refusal that still shows the model the state it must work with.
#[derive(Debug)]
struct Refusal {
    message: String,
    target: MemoryTarget,
    entries: Vec<String>,
    matches: Vec<String>,
}

/// Parses one operation; `label` prefixes errors in a batch ("operation 2: ").
fn parse_op(v: &Value, default_target: MemoryTarget, label: &str) -> Result<Op, ToolError> {
    if !v.is_object() {
        return Err(ToolError::new(format!("{label}must be an object")));
    }
    let err = |e: ToolError| ToolError::new(format!("{label}{e}"));
    let action = match opt_str(v, "action").map_err(err)? {
        Some("add") => Action::Add,
        Some("replace") => Action::Replace,
        Some("remove") => Action::Remove,
        Some(other) => {
            return Err(ToolError::new(format!(
                "{label}invalid action '{other}'; use add, replace or remove"
            )));
        }
        None => {
            return Err(ToolError::new(format!(
                "{label}missing required argument `action` (add, replace or remove)"
            )));
        }
    };
    let target = match opt_str(v, "target").map_err(err)? {
        None => default_target,
        Some(t) => MemoryTarget::parse(t).ok_or_else(|| {
            ToolError::new(format!(
                "{label}invalid target '{t}'; use 'memory' or 'user'"
            ))
        })?,
    };
    let content = opt_str(v, "content").map_err(err)?.unwrap_or("").trim();
    let old_text = opt_str(v, "old_text").map_err(err)?.unwrap_or("").trim();
    match action {
        Action::Add if content.is_empty() => {
            return Err(ToolError::new(format!(
                "{label}`content` is required for 'add' and must not be empty"
            )));
        }
        Action::Replace | Action::Remove if old_text.is_empty() => {
            return Err(ToolError::new(format!(
                "{label}`old_text` is required for '{}': give a distinctive part of the entry \
                 to change",
                if action == Action::Replace {
                    "replace"
                } else {
                    "remove"
                }
            )));
        }
        Action::Replace if content.is_empty() => {
            return Err(ToolError::new(format!(
                "{label}`content` is required for 'replace' (use 'remove' to delete an entry)"
            )));
        }
        _ => {}
    }
    Ok(Op {
        action,
        target,
        content: content.to_owned(),
        old_text: old_text.to_owned(),
    })
}

/// What one target looked like before and after the operations.
struct TargetState {
    target: MemoryTarget,
    path: PathBuf,
    raw: String,
    before: Vec<String>,
    after: Vec<String>,
}

/// Outcome of a successful apply.
struct Applied {
    message: String,
    states: Vec<(MemoryTarget, Vec<String>)>,
}

/// Index of the single entry `old_text` designates, or a refusal.
fn find_entry(entries: &[String], old_text: &str, target: MemoryTarget) -> Result<usize, Refusal> {
    let hits: Vec<usize> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.contains(old_text))
        .map(|(i, _)| i)
        .collect();
    match hits.as_slice() {
        [] => Err(Refusal {
            message: format!(
                "No {} entry contains '{}'. Check current_entries and retry with text copied \
                 from the entry you mean.",
                target.as_str(),
                super::truncate_chars(old_text, PREVIEW_CHARS)
            ),
            target,
            entries: entries.to_vec(),
            matches: Vec::new(),
        }),
        [one] => Ok(*one),
        many => {
            // An entry equal to old_text is unambiguous even when it is also
            // a substring of longer entries.
            if let Some(exact) = many.iter().find(|i| entries[**i] == old_text) {
                return Ok(*exact);
            }
            let first = &entries[many[0]];
            if many.iter().all(|i| entries[*i] == *first) {
                return Ok(many[0]);
            }
            Err(Refusal {
                message: format!(
                    "several entries match '{}' ({} of them); use a longer, more specific \
                     old_text.",
                    super::truncate_chars(old_text, PREVIEW_CHARS),
                    many.len()
                ),
                target,
                entries: entries.to_vec(),
                matches: many
                    .iter()
                    .map(|i| super::truncate_chars(&entries[*i], PREVIEW_CHARS))
                    .collect(),
            })
        }
    }
}

/// Applies `ops` all-or-nothing under the targets' file locks. Blocking.
fn apply(
    dir: &Path,
    config: &MemoryConfig,
    ops: &[Op],
) -> Result<Result<Applied, Refusal>, std::io::Error> {
    std::fs::create_dir_all(dir)?;
    let mut targets: Vec<MemoryTarget> = ops.iter().map(|o| o.target).collect();
    // A fixed order (memory before user) so two batches never deadlock.
    targets.sort();
    targets.dedup();
    let mut locks = Vec::new();
    let mut states: Vec<TargetState> = Vec::new();
    for target in &targets {
        let path = dir.join(target.file_name());
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(dir.join(format!("{}.lock", target.file_name())))?;
        fs4::fs_std::FileExt::lock_exclusive(&lock)?;
        // Held until the end of this function; closing the file releases it.
        locks.push(lock);
        let raw = read_raw(&path)?;
        let before = parse_entries(&raw);
        states.push(TargetState {
            target: *target,
            path,
            raw,
            after: before.clone(),
            before,
        });
    }
    let mut skipped = 0usize;
    for op in ops {
        let Some(state) = states.iter_mut().find(|s| s.target == op.target) else {
            continue;
        };
        match op.action {
            Action::Add => {
                if state.after.contains(&op.content) {
                    skipped += 1;
                } else {
                    state.after.push(op.content.clone());
                }
            }
            Action::Replace => match find_entry(&state.after, &op.old_text, op.target) {
                Ok(i) => {
                    state.after[i] = op.content.clone();
                    // Replacing with text that another entry already has
                    // would duplicate it.
                    state.after = parse_entries(&join_entries(&state.after));
                }
                Err(r) => return Ok(Err(r)),
            },
            Action::Remove => match find_entry(&state.after, &op.old_text, op.target) {
                Ok(i) => {
                    state.after.remove(i);
                }
                Err(r) => return Ok(Err(r)),
            },
        }
    }
    for state in &states {
        let limit = state.target.limit(config);
        let old = usage_chars(&state.before);
        let new = usage_chars(&state.after);
        // Growth past the limit is refused; a change that shrinks an
        // already-oversized file (the limit was lowered) is let through so
        // consolidation stays possible.
        if new > limit && new > old {
            let message = if ops.len() == 1 && ops[0].action == Action::Add {
                format!(
                    "{} is at {old}/{limit} chars; adding this entry ({} chars) would bring it \
                     to {new}/{limit}, over the limit. Make room first: 'replace' overlapping \
                     entries with a shorter merged one or 'remove' stale ones (see \
                     current_entries), then retry the add.",
                    state.target.file_name(),
                    ops[0].content.chars().count()
                )
            } else {
                format!(
                    "{} is at {old}/{limit} chars; this change would bring it to {new}/{limit}, \
                     over the limit. Shorten the new text or remove stale entries (see \
                     current_entries), then retry.",
                    state.target.file_name()
                )
            };
            return Ok(Err(Refusal {
                message,
                target: state.target,
                entries: state.before.clone(),
                matches: Vec::new(),
            }));
        }
    }
    for state in &states {
        if state.after == state.before {
            continue;
        }
        let joined = join_entries(&state.before);
        if !state.raw.trim().is_empty() && state.raw.trim() != joined {
            // The file was edited outside the tool in a shape that does not
            // round-trip; keep the original before rewriting it normalised.
            let stamp = chrono::Utc::now().timestamp();
            let backup = state
                .path
                .with_file_name(format!("{}.bak.{stamp}", state.target.file_name()));
            std::fs::write(&backup, state.raw.as_bytes())?;
            tracing::warn!(
                "{} did not round-trip; original saved to {}",
                state.path.display(),
                backup.display()
            );
        }
        super::atomic_write(&state.path, join_entries(&state.after).as_bytes())?;
    }
    drop(locks);
    let message = match (ops.len(), ops.first().map(|o| o.action)) {
        (1, Some(Action::Add)) if skipped == 1 => {
            "Entry already exists (nothing added).".to_owned()
        }
        (1, Some(Action::Add)) => "Entry added.".to_owned(),
        (1, Some(Action::Replace)) => "Entry replaced.".to_owned(),
        (1, Some(Action::Remove)) => "Entry removed.".to_owned(),
        (n, _) if skipped > 0 => {
            format!("Applied {n} operation(s) ({skipped} add(s) were already present).")
        }
        (n, _) => format!("Applied {n} operation(s)."),
    };
    Ok(Ok(Applied {
        message,
        states: states.into_iter().map(|s| (s.target, s.after)).collect(),
    }))
}

/// Most times a change is redone because other nodes wrote the same file
/// first. Each retry waits a little longer, with jitter, so two busy
/// nodes stop colliding instead of one starving the other.
const MAX_SHARED_ATTEMPTS: u64 = 20;

/// [`apply`] on this node's files and, when the store shares them between
/// nodes, on the shared copy: the files are brought up to the store's
/// version first, and a write that lost a race with another node's is
/// redone on top of it, so concurrent adds on two nodes both survive.
async fn apply_everywhere(
    ctx: &ToolContext,
    config: &MemoryConfig,
    ops: Vec<Op>,
) -> Result<Result<Applied, Refusal>, ToolError> {
    let mut targets: Vec<MemoryTarget> = ops.iter().map(|o| o.target).collect();
    targets.sort();
    targets.dedup();
    let rels: Vec<String> = targets
        .iter()
        .map(|t| format!("memories/{}", t.file_name()))
        .collect();
    let rels: Vec<&str> = rels.iter().map(String::as_str).collect();
    let shared = ctx.store.shared_files();
    let shared_error = |e: crate::shared_home::SharedHomeError| {
        ToolError::new(format!("cannot update memory: {e}"))
    };
    for attempt in 0..MAX_SHARED_ATTEMPTS {
        if attempt > 0 {
            let jitter = rand::random_range(0..20u64);
            tokio::time::sleep(std::time::Duration::from_millis(attempt * 5 + jitter)).await;
        }
        let pending = match shared {
            Some(files) => Some(
                crate::shared_home::begin_write(&ctx.home, files, &rels)
                    .await
                    .map_err(shared_error)?,
            ),
            None => None,
        };
        let dir = ctx.home.memories_dir();
        let cfg = config.clone();
        let batch = ops.clone();
        let outcome = tokio::task::spawn_blocking(move || apply(&dir, &cfg, &batch))
            .await
            .map_err(|e| ToolError::new(format!("memory write task failed: {e}")))?
            .map_err(|e| ToolError::new(format!("cannot update memory files: {e}")))?;
        let (Some(files), Some(pending), Ok(_)) = (shared, pending, &outcome) else {
            return Ok(outcome);
        };
        if pending
            .commit(&ctx.home, files)
            .await
            .map_err(shared_error)?
        {
            return Ok(outcome);
        }
        tracing::debug!("another node changed memory first; redoing the change on its version");
    }
    Err(ToolError::new(
        "memory kept changing on other nodes while this change was saved; try again",
    ))
}

fn target_json(
    target: MemoryTarget,
    entries: &[String],
    config: &MemoryConfig,
) -> serde_json::Map<String, Value> {
    let limit = target.limit(config);
    let used = usage_chars(entries);
    let mut m = serde_json::Map::new();
    m.insert("target".into(), json!(target.as_str()));
    m.insert("usage".into(), json!(format!("{used}/{limit}")));
    m.insert("usage_percent".into(), json!(percent(used, limit)));
    m.insert("entry_count".into(), json!(entries.len()));
    m.insert("entries".into(), json!(entries));
    m
}

/// The `memory` tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryTool;

#[async_trait]
impl Tool for MemoryTool {
    fn name(&self) -> &str {
        "memory"
    }

    fn description(&self) -> &str {
        "Save durable facts across sessions. target 'memory' holds your own notes (environment, \
         conventions, lessons learned); target 'user' holds the user's profile (name, \
         preferences, habits). action add|replace|remove; replace/remove find the entry by a \
         unique substring old_text. Use operations[] to apply several changes at once, all or \
         nothing. Both files have character limits: consolidate when near them. Changes show \
         in the system prompt from the next session on."
    }

    fn parameters(&self) -> Value {
        let op_props = json!({
            "action": {"type": "string", "enum": ["add", "replace", "remove"]},
            "target": {"type": "string", "enum": ["memory", "user"]},
            "content": {"type": "string", "description": "Entry text for add/replace."},
            "old_text": {"type": "string", "description": "A unique substring of the entry to replace or remove."}
        });
        json!({
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["add", "replace", "remove"], "description": "What to do (single-operation form)."},
                "target": {"type": "string", "enum": ["memory", "user"], "description": "'memory' for your notes, 'user' for the user profile. Default: memory."},
                "content": {"type": "string", "description": "The entry text for add, or the new text for replace."},
                "old_text": {"type": "string", "description": "For replace/remove: a short substring that identifies exactly one entry."},
                "operations": {
                    "type": "array",
                    "description": "Batch form: several operations applied all-or-nothing. Each may set its own target.",
                    "items": {"type": "object", "properties": op_props, "required": ["action"]}
                }
            },
            "required": ["target"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolResult {
        let config = ctx.config.memory.clone();
        if !config.enabled {
            return Err(ToolError::new(
                "memory is disabled in config (memory.enabled: false)",
            ));
        }
        let default_target = match opt_str(&args, "target")? {
            None => MemoryTarget::Memory,
            Some(t) => MemoryTarget::parse(t).ok_or_else(|| {
                ToolError::new(format!("invalid target '{t}'; use 'memory' or 'user'"))
            })?,
        };
        let ops: Vec<Op> = match opt_array(&args, "operations")? {
            Some(list) if !list.is_empty() => {
                if list.len() > MAX_BATCH {
                    return Err(ToolError::new(format!(
                        "`operations` has {} items; at most {MAX_BATCH} per call",
                        list.len()
                    )));
                }
                list.iter()
                    .enumerate()
                    .map(|(i, v)| parse_op(v, default_target, &format!("operations[{i}]: ")))
                    .collect::<Result<_, _>>()?
            }
            _ => vec![parse_op(&args, default_target, "")?],
        };
        for (i, op) in ops.iter().enumerate() {
            if op.action == Action::Remove {
                continue;
            }
            if let Err(finding) = threat::scan(&op.content) {
                let prefix = if ops.len() > 1 {
                    format!("operations[{i}]: ")
                } else {
                    String::new()
                };
                let tail = if ops.len() > 1 {
                    " Nothing was applied (a batch is all-or-nothing)."
                } else {
                    ""
                };
                return Err(ToolError::new(format!("{prefix}{finding}{tail}")));
            }
        }
        let batch = ops.len() > 1;
        let outcome = apply_everywhere(ctx, &config, ops).await?;
        let value = match outcome {
            Ok(applied) => {
                let mut states = applied.states;
                let mut out = serde_json::Map::new();
                out.insert("success".into(), json!(true));
                out.insert("message".into(), json!(applied.message));
                if states.len() == 1 {
                    let (t, entries) = states.remove(0);
                    out.extend(target_json(t, &entries, &config));
                } else {
                    let all: Vec<Value> = states
                        .iter()
                        .map(|(t, e)| Value::Object(target_json(*t, e, &config)))
                        .collect();
                    out.insert("targets".into(), Value::Array(all));
                }
                Value::Object(out)
            }
            Err(refusal) => {
                let mut message = refusal.message;
                if batch {
                    message.push_str(" Nothing was applied (a batch is all-or-nothing).");
                }
                let mut out = serde_json::Map::new();
                out.insert("success".into(), json!(false));
                out.insert("error".into(), json!(message));
                let mut state = target_json(refusal.target, &refusal.entries, &config);
                if let Some(entries) = state.remove("entries") {
                    state.insert("current_entries".into(), entries);
                }
                out.extend(state);
                if !refusal.matches.is_empty() {
                    out.insert("matches".into(), json!(refusal.matches));
                }
                Value::Object(out)
            }
        };
        Ok(ctx.redactor.redact(&value.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing_splits_only_on_the_delimiter_line() {
        let raw = "a § b\n§\n  c  \n§\n\n§\na § b\n";
        assert_eq!(parse_entries(raw), vec!["a § b".to_owned(), "c".to_owned()]);
    }

    #[test]
    fn usage_counts_the_joined_text() {
        let e = vec!["ab".to_owned(), "é".to_owned()];
        assert_eq!(usage_chars(&e), join_entries(&e).chars().count());
        assert_eq!(usage_chars(&[]), 0);
    }
}
