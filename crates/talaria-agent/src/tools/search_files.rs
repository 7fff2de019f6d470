//! The `search_files` tool: regex search over file contents, or a search
//! for file names, in-process (no shell, so nothing to escape and nothing
//! to inject).
//!
//! The walk honours `.gitignore`/`.ignore` files and skips hidden entries,
//! like ripgrep, so build output and dependency folders do not drown the
//! results. The contents of the home's credential files are never searched
//! ([`super::secret_files`]).

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use grep_regex::RegexMatcherBuilder;
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkMatch};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{Tool, ToolContext, ToolError, ToolResult, opt_str, opt_u64, req_str};

/// Results returned when the call gives no `limit`.
pub const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 1000;
const MAX_CONTEXT: usize = 10;
/// Characters of a matching line shown (minified files have huge lines).
const MAX_LINE_CHARS: usize = 400;
/// A walk visiting more files than this stops and says so.
const MAX_FILES_VISITED: usize = 200_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Content,
    FilesOnly,
    Count,
}

struct Request {
    pattern: String,
    files: bool,
    mode: Mode,
    root: PathBuf,
    display_base: PathBuf,
    file_glob: Option<String>,
    limit: usize,
    offset: usize,
    context: usize,
    /// The home's credential files, whose contents are never searched (a
    /// count of matches for `token: a.*` would spell a secret out).
    protected: Vec<PathBuf>,
}

/// Collects one file's output lines.
struct FileSink<'a> {
    shown_path: &'a str,
    lines: Vec<String>,
    matches: usize,
    binary: bool,
    last_line: Option<u64>,
    /// Stop once this many matches were seen (0 = no limit).
    stop_after: usize,
}

impl FileSink<'_> {
    fn line(&mut self, sep: char, number: Option<u64>, bytes: &[u8]) {
        let text = String::from_utf8_lossy(bytes);
        let text = super::truncate_chars(text.trim_end_matches(['\n', '\r']), MAX_LINE_CHARS);
        if let (Some(prev), Some(n)) = (self.last_line, number)
            && n > prev + 1
            && !self.lines.is_empty()
        {
            self.lines.push("--".to_owned());
        }
        self.last_line = number.or(self.last_line);
        let n = number.map_or_else(|| "?".to_owned(), |n| n.to_string());
        self.lines
            .push(format!("{}{sep}{n}{sep}{text}", self.shown_path));
    }
}

impl Sink for FileSink<'_> {
    type Error = std::io::Error;

    fn matched(&mut self, _: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, std::io::Error> {
        self.matches += 1;
        self.line(':', mat.line_number(), mat.bytes());
        Ok(self.stop_after == 0 || self.matches < self.stop_after)
    }

    fn context(&mut self, _: &Searcher, ctx: &SinkContext<'_>) -> Result<bool, std::io::Error> {
        self.line('-', ctx.line_number(), ctx.bytes());
        Ok(true)
    }

    fn binary_data(&mut self, _: &Searcher, _offset: u64) -> Result<bool, std::io::Error> {
        self.binary = true;
        Ok(false)
    }
}

fn shown(path: &Path, base: &Path) -> String {
    path.strip_prefix(base)
        .ok()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(path)
        .display()
        .to_string()
}

fn walker(req: &Request) -> Result<ignore::Walk, ToolError> {
    let mut b = ignore::WalkBuilder::new(&req.root);
    b.hidden(true)
        .git_ignore(true)
        .git_exclude(true)
        .git_global(false)
        .ignore(true)
        .parents(true)
        // Honour .gitignore even outside a git checkout (a copied tree, a
        // fresh project before `git init`).
        .require_git(false)
        .follow_links(false)
        .sort_by_file_name(|a, b| a.cmp(b));
    if let Some(glob) = &req.file_glob {
        let mut ov = ignore::overrides::OverrideBuilder::new(&req.root);
        ov.add(glob).map_err(|e| {
            ToolError::new(format!("argument `file_glob` is not a valid glob: {e}"))
        })?;
        let ov = ov.build().map_err(|e| {
            ToolError::new(format!("argument `file_glob` is not a valid glob: {e}"))
        })?;
        b.overrides(ov);
    }
    Ok(b.build())
}

/// Runs the search. Blocking.
fn search(req: &Request, cancel: &CancellationToken) -> Result<Value, ToolError> {
    if !req.root.exists() {
        return Err(ToolError::new(format!(
            "argument `path`: {} does not exist",
            req.root.display()
        )));
    }
    let want = req.offset.saturating_add(req.limit);
    let mut results: Vec<String> = Vec::new();
    let mut total = 0usize;
    let mut files_with_hits = 0usize;
    let mut truncated = false;
    let mut visited = 0usize;
    let mut walk_errors = 0usize;
    let mut stopped_early = false;

    let matcher = if req.files {
        None
    } else {
        Some(
            RegexMatcherBuilder::new()
                .line_terminator(Some(b'\n'))
                .build(&req.pattern)
                .map_err(|e| {
                    ToolError::new(format!(
                        "argument `pattern` is not a valid regular expression: {e}"
                    ))
                })?,
        )
    };
    let mut searcher = SearcherBuilder::new()
        .binary_detection(BinaryDetection::quit(0))
        .line_number(true)
        .before_context(req.context)
        .after_context(req.context)
        .build();
    let needle = req.pattern.to_lowercase();
    let is_glob = req.pattern.contains(['*', '?', '[']);

    for entry in walker(req)? {
        if cancel.is_cancelled() {
            stopped_early = true;
            break;
        }
        let entry = match entry {
            Ok(e) => e,
            Err(_) => {
                walk_errors += 1;
                continue;
            }
        };
        if !entry.file_type().is_some_and(|t| t.is_file()) {
            continue;
        }
        visited += 1;
        if visited > MAX_FILES_VISITED {
            stopped_early = true;
            break;
        }
        let path = entry.path();
        let shown_path = shown(path, &req.display_base);
        if req.files {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let hit = if is_glob {
                let subject = if req.pattern.contains('/') {
                    shown(path, &req.root)
                } else {
                    name
                };
                super::guard::glob_match(&req.pattern, &subject)
            } else {
                name.to_lowercase().contains(&needle)
            };
            if hit {
                total += 1;
                if total > want {
                    truncated = true;
                    break;
                }
                if total > req.offset {
                    results.push(shown_path);
                }
            }
            continue;
        }
        let Some(matcher) = &matcher else { continue };
        if req
            .protected
            .iter()
            .any(|p| super::secret_files::same_file(p, path))
        {
            continue;
        }
        let mut sink = FileSink {
            shown_path: &shown_path,
            lines: Vec::new(),
            matches: 0,
            binary: false,
            last_line: None,
            stop_after: if req.mode == Mode::Content {
                want.saturating_sub(total) + 1
            } else {
                0
            },
        };
        if searcher.search_path(matcher, path, &mut sink).is_err() {
            walk_errors += 1;
            continue;
        }
        if sink.binary || sink.matches == 0 {
            continue;
        }
        files_with_hits += 1;
        match req.mode {
            Mode::Content => {
                // Keep only whole match lines past `offset`, with their context.
                let mut seen = total;
                for line in sink.lines {
                    let is_match = line
                        .get(shown_path.len()..)
                        .is_some_and(|r| r.starts_with(':'));
                    if is_match {
                        seen += 1;
                        if seen > want {
                            truncated = true;
                            break;
                        }
                        if seen > req.offset {
                            results.push(line);
                        }
                    } else if seen + 1 > req.offset && !(line == "--" && results.is_empty()) {
                        // Context before the next shown match, or after the
                        // last one.
                        results.push(line);
                    }
                }
                total += sink.matches;
                if total >= want {
                    truncated = truncated || total > want;
                    if truncated {
                        break;
                    }
                }
            }
            Mode::FilesOnly => {
                if files_with_hits > want {
                    truncated = true;
                    break;
                }
                if files_with_hits > req.offset {
                    results.push(shown_path.clone());
                }
                total += sink.matches;
            }
            Mode::Count => {
                if files_with_hits > want {
                    truncated = true;
                    break;
                }
                if files_with_hits > req.offset {
                    results.push(format!("{shown_path}:{}", sink.matches));
                }
                total += sink.matches;
            }
        }
    }

    while results.last().is_some_and(|l| l == "--") {
        results.pop();
    }
    let mut out = serde_json::Map::new();
    let what = if req.files { "files" } else { "matches" };
    let summary = if results.is_empty() && total == 0 {
        format!("No {what} found for '{}'.", req.pattern)
    } else if truncated {
        format!(
            "Showing {what} {}-{} (more exist; pass offset={} for the next page or narrow the \
             search).",
            req.offset + 1,
            want,
            want
        )
    } else if req.files {
        format!("Found {total} file(s).")
    } else {
        format!("Found {total} matching line(s) in {files_with_hits} file(s).")
    };
    out.insert("summary".into(), json!(summary));
    out.insert("total_count".into(), json!(total));
    out.insert("truncated".into(), json!(truncated));
    if stopped_early {
        out.insert(
            "note".into(),
            json!(if cancel.is_cancelled() {
                "the search was interrupted; results are partial".to_owned()
            } else {
                format!("the walk stopped after {MAX_FILES_VISITED} files; search a narrower path")
            }),
        );
    }
    if walk_errors > 0 {
        out.insert("unreadable_entries".into(), json!(walk_errors));
    }
    out.insert("results".into(), json!(results.join("\n")));
    Ok(Value::Object(out))
}

/// The `search_files` tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct SearchFilesTool;

#[async_trait]
impl Tool for SearchFilesTool {
    fn name(&self) -> &str {
        "search_files"
    }

    fn description(&self) -> &str {
        "Search files without a shell. target 'content' (default): regex search inside files, \
         results as path:line:text. target 'files': find files whose name contains pattern or \
         matches it as a glob (*.rs). Honours .gitignore and skips hidden and binary files."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "Regex for content search; substring or glob for file search."},
                "target": {"type": "string", "enum": ["content", "files"], "description": "What to search. Default content."},
                "path": {"type": "string", "description": "Directory or file to search. Default: the working directory."},
                "file_glob": {"type": "string", "description": "Only search files matching this glob, e.g. *.py."},
                "limit": {"type": "integer", "minimum": 1, "description": format!("Most results. Default {DEFAULT_LIMIT}.")},
                "offset": {"type": "integer", "minimum": 0, "description": "Results to skip, for paging."},
                "output_mode": {"type": "string", "enum": ["content", "files_only", "count"], "description": "For content search: matching lines (default), just file paths, or counts per file."},
                "context": {"type": "integer", "minimum": 0, "description": "Lines of context around each match (content mode). Default 0."}
            },
            "required": ["pattern"]
        })
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolResult {
        let pattern = req_str(&args, "pattern")?;
        if pattern.is_empty() {
            return Err(ToolError::new("argument `pattern` is empty"));
        }
        let files = match opt_str(&args, "target")? {
            None | Some("content") | Some("grep") => false,
            Some("files") | Some("find") => true,
            Some(other) => {
                return Err(ToolError::new(format!(
                    "argument `target`: '{other}' is not one of content, files"
                )));
            }
        };
        let mode = match opt_str(&args, "output_mode")? {
            None | Some("content") => Mode::Content,
            Some("files_only") | Some("files_with_matches") => Mode::FilesOnly,
            Some("count") => Mode::Count,
            Some(other) => {
                return Err(ToolError::new(format!(
                    "argument `output_mode`: '{other}' is not one of content, files_only, count"
                )));
            }
        };
        let root = match opt_str(&args, "path")? {
            Some(p) if !p.trim().is_empty() => super::resolve_path(ctx, p)?,
            _ => super::base_dir(ctx),
        };
        let req = Request {
            pattern: pattern.to_owned(),
            files,
            mode,
            root,
            display_base: super::base_dir(ctx),
            file_glob: opt_str(&args, "file_glob")?
                .filter(|g| !g.trim().is_empty())
                .map(str::to_owned),
            limit: opt_u64(&args, "limit")?
                .unwrap_or(DEFAULT_LIMIT as u64)
                .clamp(1, MAX_LIMIT as u64) as usize,
            offset: opt_u64(&args, "offset")?.unwrap_or(0).min(1_000_000) as usize,
            context: opt_u64(&args, "context")?
                .unwrap_or(0)
                .min(MAX_CONTEXT as u64) as usize,
            protected: super::secret_files::protected_files(&ctx.home).to_vec(),
        };
        let cancel = ctx.cancel.clone();
        let value = tokio::task::spawn_blocking(move || search(&req, &cancel))
            .await
            .map_err(|e| ToolError::new(format!("search task failed: {e}")))??;
        Ok(ctx.redactor.redact(&value.to_string()))
    }
}
