//! File tools: `read_file`, `write_file` and `patch`.
//!
//! Paths may point anywhere the user could (the agent edits the user's
//! machine on their behalf) except the home's credential files
//! ([`super::secret_files`]); relative ones resolve against the session's
//! working directory. Writes are atomic so an interrupted call never leaves
//! a half-written file.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolResult, opt_bool, opt_str, opt_u64, req_str};

/// Lines returned when the call gives no `limit`.
pub const DEFAULT_READ_LIMIT: usize = 500;
/// Most lines one call may return.
pub const MAX_READ_LIMIT: usize = 2000;
/// Longer lines are cut (minified files would otherwise flood the context).
const MAX_LINE_CHARS: usize = 2000;
/// Past this size the total line count is not computed (it costs a full read).
const COUNT_ALL_LINES_BELOW: u64 = 64 * 1024 * 1024;
/// Largest file `patch` will load.
const MAX_PATCH_BYTES: u64 = 16 * 1024 * 1024;

fn io_error(path: &Path, e: &std::io::Error) -> ToolError {
    match e.kind() {
        std::io::ErrorKind::NotFound => ToolError::new(format!(
            "{} does not exist (check the path; relative paths are resolved against the \
             working directory)",
            path.display()
        )),
        std::io::ErrorKind::PermissionDenied => {
            ToolError::new(format!("permission denied: {}", path.display()))
        }
        _ => ToolError::new(format!("{}: {e}", path.display())),
    }
}

/// Refuses the home's credential files (see [`super::secret_files`]).
fn refuse_protected(ctx: &ToolContext, path: &Path) -> Result<(), ToolError> {
    match super::secret_files::protected(&ctx.home, path) {
        Some(file) => Err(ToolError::new(super::secret_files::refusal(&file))),
        None => Ok(()),
    }
}

fn join_error(e: tokio::task::JoinError) -> ToolError {
    ToolError::new(format!("file task failed: {e}"))
}

/// Whether the first bytes look like a binary file (a NUL byte is the same
/// heuristic git and grep use).
fn looks_binary(head: &[u8]) -> bool {
    head.contains(&0)
}

/// Reads lines `[offset, offset + limit)` (1-based) with numbers. Blocking.
fn read_numbered(path: &Path, offset: usize, limit: usize) -> Result<String, ToolError> {
    let meta = std::fs::metadata(path).map_err(|e| io_error(path, &e))?;
    if meta.is_dir() {
        return Err(ToolError::new(format!(
            "{} is a directory; use search_files with target \"files\" to list it",
            path.display()
        )));
    }
    let file = std::fs::File::open(path).map_err(|e| io_error(path, &e))?;
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let head = reader.fill_buf().map_err(|e| io_error(path, &e))?;
    let sniff = &head[..head.len().min(8192)];
    if looks_binary(sniff) {
        return Err(ToolError::new(format!(
            "{} looks like a binary file ({} bytes); read_file only shows text",
            path.display(),
            meta.len()
        )));
    }
    let count_all = meta.len() < COUNT_ALL_LINES_BELOW;
    let last_wanted = offset.saturating_add(limit).saturating_sub(1);
    let mut out = String::new();
    let mut raw = Vec::new();
    let mut line_no = 0usize;
    let mut shown = 0usize;
    let mut more_after_window = false;
    let width = last_wanted.to_string().len().clamp(4, 12);
    loop {
        raw.clear();
        let n = reader
            .read_until(b'\n', &mut raw)
            .map_err(|e| io_error(path, &e))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        if line_no < offset {
            continue;
        }
        if line_no > last_wanted {
            more_after_window = true;
            if !count_all {
                break;
            }
            continue;
        }
        if looks_binary(&raw) {
            return Err(ToolError::new(format!(
                "{} contains binary data (a NUL byte on line {line_no}); read_file only shows \
                 text",
                path.display()
            )));
        }
        let text = String::from_utf8_lossy(&raw);
        let text = text.trim_end_matches(['\n', '\r']);
        let text = super::truncate_chars(text, MAX_LINE_CHARS);
        out.push_str(&format!("{line_no:>width$}|{text}\n"));
        shown += 1;
    }
    if line_no == 0 {
        return Ok(format!("{} is empty (0 lines).", path.display()));
    }
    if shown == 0 {
        return Err(ToolError::new(format!(
            "argument `offset` ({offset}) is past the end of {} ({line_no} lines)",
            path.display()
        )));
    }
    let last_shown = offset + shown - 1;
    if more_after_window {
        let total = if count_all {
            format!("{line_no}")
        } else {
            "more".to_owned()
        };
        out.push_str(&format!(
            "\n[Showing lines {offset}-{last_shown} of {total}. Call read_file with offset={} \
             to continue.]\n",
            last_shown + 1
        ));
    } else if offset > 1 {
        out.push_str(&format!(
            "\n[Showing lines {offset}-{last_shown} of {line_no} (end of file).]\n"
        ));
    }
    Ok(out)
}

/// The `read_file` tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadFileTool;

#[async_trait]
impl Tool for ReadFileTool {
    fn name(&self) -> &str {
        "read_file"
    }

    fn description(&self) -> &str {
        "Read a text file with line numbers (`LINE|content`). Use offset (1-based line) and \
         limit to page through large files. Binary files are refused; secrets are redacted."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, absolute or relative to the working directory."},
                "offset": {"type": "integer", "minimum": 1, "description": "First line to show (1-based). Default 1."},
                "limit": {"type": "integer", "minimum": 1, "description": format!("Most lines to show. Default {DEFAULT_READ_LIMIT}, max {MAX_READ_LIMIT}.")}
            },
            "required": ["path"]
        })
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolResult {
        let raw = req_str(&args, "path")?;
        if raw.trim().is_empty() {
            return Err(ToolError::new("argument `path` is empty"));
        }
        let offset = opt_u64(&args, "offset")?
            .unwrap_or(1)
            .clamp(1, usize::MAX as u64) as usize;
        let limit = opt_u64(&args, "limit")?
            .unwrap_or(DEFAULT_READ_LIMIT as u64)
            .clamp(1, MAX_READ_LIMIT as u64) as usize;
        let path = super::resolve_path(ctx, raw)?;
        refuse_protected(ctx, &path)?;
        let text = tokio::task::spawn_blocking(move || read_numbered(&path, offset, limit))
            .await
            .map_err(join_error)??;
        Ok(ctx.redactor.redact(&text))
    }
}

/// The `write_file` tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteFileTool;

#[async_trait]
impl Tool for WriteFileTool {
    fn name(&self) -> &str {
        "write_file"
    }

    fn description(&self) -> &str {
        "Write a file with the given content, replacing it entirely if it exists. Parent \
         directories are created. For small edits to an existing file prefer patch."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, absolute or relative to the working directory."},
                "content": {"type": "string", "description": "The complete new content of the file."}
            },
            "required": ["path", "content"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolResult {
        let raw = req_str(&args, "path")?;
        if raw.trim().is_empty() {
            return Err(ToolError::new("argument `path` is empty"));
        }
        let content = req_str(&args, "content")?.to_owned();
        let path = super::resolve_path(ctx, raw)?;
        refuse_protected(ctx, &path)?;
        let shown = super::shown_path(ctx, &path);
        let bytes = content.len();
        let lines = content.lines().count();
        tokio::task::spawn_blocking(move || -> Result<(), ToolError> {
            if path.is_dir() {
                return Err(ToolError::new(format!(
                    "{} is a directory, not a file",
                    path.display()
                )));
            }
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|e| io_error(parent, &e))?;
            }
            super::atomic_write(&path, content.as_bytes()).map_err(|e| io_error(&path, &e))
        })
        .await
        .map_err(join_error)??;
        Ok(json!({
            "success": true,
            "path": shown,
            "bytes_written": bytes,
            "lines": lines,
        })
        .to_string())
    }
}

/// Why `old_string` was not found, as a hint for the model's retry.
fn not_found_hint(content: &str, old: &str) -> &'static str {
    let squash = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let first_line = old.lines().next().unwrap_or("");
    let numbered = first_line
        .trim_start()
        .split_once('|')
        .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
    if numbered {
        "old_string seems to include read_file's `LINE|` prefixes; copy only the text after the `|`."
    } else if squash(content).contains(&squash(old)) {
        "The text exists with different whitespace or indentation (tabs vs spaces, trailing \
         spaces, line breaks); copy it exactly from read_file output."
    } else {
        "Re-read the file with read_file and copy the exact text, including whitespace; the \
         file may have changed since you last read it."
    }
}

/// The `patch` tool: find-and-replace tolerant of whitespace (mode
/// `replace`) or a unified diff over one or more files (mode `patch`).
/// Returns a unified diff of what changed. The argument names are the
/// ancestor's.
#[derive(Debug, Clone, Copy, Default)]
pub struct PatchTool;

/// Reads a text file `patch` may edit. Blocking.
fn read_for_patch(path: &Path) -> Result<String, ToolError> {
    let meta = std::fs::metadata(path).map_err(|e| io_error(path, &e))?;
    if meta.is_dir() {
        return Err(ToolError::new(format!("{} is a directory", path.display())));
    }
    if meta.len() > MAX_PATCH_BYTES {
        return Err(ToolError::new(format!(
            "{} is {} bytes; patch handles files up to {MAX_PATCH_BYTES} bytes",
            path.display(),
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| io_error(path, &e))?;
    String::from_utf8(bytes).map_err(|_| {
        ToolError::new(format!(
            "{} is not UTF-8 text; patch only edits text files",
            path.display()
        ))
    })
}

fn unified(before: &str, after: &str, shown: &str) -> String {
    let (a, b) = (format!("a/{shown}"), format!("b/{shown}"));
    similar::TextDiff::from_lines(before, after)
        .unified_diff()
        .context_radius(3)
        .header(&a, &b)
        .to_string()
}

impl PatchTool {
    async fn replace(&self, args: &Value, ctx: &ToolContext) -> ToolResult {
        let raw = opt_str(args, "path")?.ok_or_else(|| {
            ToolError::new(
                "missing argument `path` (mode 'replace' needs path, old_string, new_string)",
            )
        })?;
        if raw.trim().is_empty() {
            return Err(ToolError::new("argument `path` is empty"));
        }
        let old = req_str(args, "old_string")?.to_owned();
        let new = req_str(args, "new_string")?.to_owned();
        let replace_all = opt_bool(args, "replace_all")?.unwrap_or(false);
        if old.is_empty() {
            return Err(ToolError::new(
                "argument `old_string` is empty; to create or overwrite a whole file use \
                 write_file",
            ));
        }
        if old == new {
            return Err(ToolError::new(
                "old_string and new_string are identical; there is nothing to change",
            ));
        }
        let path = super::resolve_path(ctx, raw)?;
        refuse_protected(ctx, &path)?;
        let shown = raw.to_owned();
        let (diff, count, strategy) = tokio::task::spawn_blocking(
            move || -> Result<(String, usize, super::patch::Strategy), ToolError> {
                let content = read_for_patch(&path)?;
                let done = super::patch::fuzzy_replace(
                    &content,
                    &old,
                    &new,
                    replace_all,
                    &path.display().to_string(),
                )
                .map_err(ToolError::new)?;
                super::atomic_write(&path, done.text.as_bytes())
                    .map_err(|e| io_error(&path, &e))?;
                Ok((
                    unified(&content, &done.text, &shown),
                    done.count,
                    done.strategy,
                ))
            },
        )
        .await
        .map_err(join_error)??;
        let mut out = json!({
            "success": true,
            "path": raw,
            "replacements": count,
            "diff": ctx.redactor.redact(&diff),
        });
        if strategy != super::patch::Strategy::Exact {
            // Tell the model its text was not exact, so it copies better
            // next time and checks the diff.
            out["match"] = json!(strategy.label());
        }
        Ok(out.to_string())
    }

    async fn apply_diff(&self, args: &Value, ctx: &ToolContext) -> ToolResult {
        let text = opt_str(args, "patch")?.ok_or_else(|| {
            ToolError::new("missing argument `patch`: mode 'patch' takes a unified diff in `patch`")
        })?;
        if text.len() > super::patch::MAX_DIFF_BYTES {
            return Err(ToolError::new(format!(
                "argument `patch` is {} bytes; at most {}",
                text.len(),
                super::patch::MAX_DIFF_BYTES
            )));
        }
        let files = super::patch::parse_patch(text).map_err(ToolError::new)?;
        // Every path goes through the same resolution and refusals as the
        // other file tools before anything is read.
        let mut targets = Vec::with_capacity(files.len());
        for file in files {
            let raw = file.target().to_owned();
            if raw.trim().is_empty() {
                return Err(ToolError::new(
                    "a file header in the diff has an empty path",
                ));
            }
            let path = super::resolve_path(ctx, &raw)?;
            refuse_protected(ctx, &path)?;
            targets.push((raw, path, file));
        }
        let (diff, summary) = tokio::task::spawn_blocking(move || apply_all(targets))
            .await
            .map_err(join_error)??;
        Ok(json!({
            "success": true,
            "mode": "patch",
            "files": summary,
            "diff": ctx.redactor.redact(&diff),
        })
        .to_string())
    }
}

/// Computes every file's new text in memory, and writes only when all of
/// them applied; a write that fails part-way restores what was written.
fn apply_all(
    targets: Vec<(String, std::path::PathBuf, super::patch::FileDiff)>,
) -> Result<(String, Vec<Value>), ToolError> {
    use std::collections::HashMap;
    // path -> (text before this call, text now); None = absent.
    let mut state: HashMap<std::path::PathBuf, (Option<String>, Option<String>)> = HashMap::new();
    let mut order: Vec<(String, std::path::PathBuf)> = Vec::new();
    let mut summary = Vec::new();
    for (raw, path, file) in &targets {
        if !state.contains_key(path) {
            let before = if path.exists() {
                Some(read_for_patch(path)?)
            } else {
                None
            };
            state.insert(path.clone(), (before.clone(), before));
            order.push((raw.clone(), path.clone()));
        }
        let Some(entry) = state.get_mut(path) else {
            continue;
        };
        let current = entry.1.as_deref();
        if file.creates() && current.is_some() {
            return Err(ToolError::new(format!(
                "the diff creates {raw} (from /dev/null) but it already exists; nothing was \
                 changed"
            )));
        }
        if !file.creates() && current.is_none() {
            return Err(ToolError::new(format!(
                "{raw} does not exist (the diff edits it); nothing was changed"
            )));
        }
        let next = super::patch::apply_file(current, file)
            .map_err(|e| ToolError::new(format!("{e}; nothing was changed")))?;
        entry.1 = if file.deletes() { None } else { Some(next) };
        let action = if file.creates() {
            "created"
        } else if file.deletes() {
            "deleted"
        } else {
            "modified"
        };
        summary.push(json!({"path": raw, "action": action, "hunks": file.hunk_count()}));
    }
    let mut diff = String::new();
    for (raw, path) in &order {
        if let Some((before, after)) = state.get(path) {
            diff.push_str(&unified(
                before.as_deref().unwrap_or(""),
                after.as_deref().unwrap_or(""),
                raw,
            ));
        }
    }
    let mut done: Vec<&std::path::PathBuf> = Vec::new();
    for (_, path) in &order {
        let Some((before, after)) = state.get(path) else {
            continue;
        };
        let result = match after {
            Some(text) => {
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent).map_err(|e| io_error(parent, &e))?;
                }
                super::atomic_write(path, text.as_bytes())
            }
            None if before.is_some() => std::fs::remove_file(path),
            None => Ok(()),
        };
        if let Err(e) = result {
            // Best effort: put back what this call already changed.
            for undo in done {
                if let Some((before, _)) = state.get(undo) {
                    let _ = match before {
                        Some(text) => super::atomic_write(undo, text.as_bytes()),
                        None => std::fs::remove_file(undo),
                    };
                }
            }
            return Err(io_error(path, &e));
        }
        done.push(path);
    }
    Ok((diff, summary))
}

#[async_trait]
impl Tool for PatchTool {
    fn name(&self) -> &str {
        "patch"
    }

    fn description(&self) -> &str {
        "Edit files. mode 'replace' (default): replace old_string with new_string in path; \
         minor whitespace and indentation differences are tolerated (the replacement is \
         re-indented to match), and the match must be unique unless replace_all is true. \
         mode 'patch': apply a unified diff (--- a/file, +++ b/file, @@ hunks; several files; \
         /dev/null to create) or a V4A patch (*** Begin Patch / *** Update File: path / @@ \
         context hint / lines / *** End Patch) given in `patch`; it applies entirely or not at \
         all. Returns a unified diff of the change."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "mode": {"type": "string", "enum": ["replace", "patch"], "default": "replace", "description": "'replace' (default) needs path, old_string, new_string; 'patch' needs patch."},
                "path": {"type": "string", "description": "mode 'replace': the file to edit."},
                "old_string": {"type": "string", "description": "mode 'replace': the text to find; include surrounding lines so it is unique."},
                "new_string": {"type": "string", "description": "mode 'replace': the text to put in its place (empty to delete)."},
                "replace_all": {"type": "boolean", "default": false, "description": "Replace every occurrence instead of requiring exactly one. Default false."},
                "patch": {"type": "string", "description": "mode 'patch': a unified diff, e.g. '--- a/src/x.py\\n+++ b/src/x.py\\n@@ -3,2 +3,2 @@\\n context\\n-old\\n+new'."}
            },
            "required": ["mode"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolResult {
        match opt_str(&args, "mode")?.unwrap_or("replace") {
            "replace" => self.replace(&args, ctx).await,
            "patch" => self.apply_diff(&args, ctx).await,
            other => Err(ToolError::new(format!(
                "argument `mode`: '{other}' is not one of 'replace', 'patch'"
            ))),
        }
    }
}

/// Replaces `old` with `new` in `content`: exactly one occurrence, or all
/// with `replace_all`. The errors say what to do, naming `what` (a path).
/// Returns the new text and how many places changed. Shared by `patch` and
/// the skill tools, so both edit by the same rule.
pub fn replace_exact(
    content: &str,
    old: &str,
    new: &str,
    replace_all: bool,
    what: &str,
) -> Result<(String, usize), String> {
    if old.is_empty() {
        return Err("old_string is empty".into());
    }
    let count = content.matches(old).count();
    if count == 0 {
        return Err(format!(
            "old_string was not found in {what}. {}",
            not_found_hint(content, old)
        ));
    }
    if count > 1 && !replace_all {
        return Err(format!(
            "old_string matches {count} places in {what}; include more surrounding lines so it \
             matches exactly one, or set replace_all=true to change all {count}"
        ));
    }
    let updated = if replace_all {
        content.replace(old, new)
    } else {
        content.replacen(old, new, 1)
    };
    Ok((updated, count))
}
