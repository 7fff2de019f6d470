//! `GET /api/logs` (the tail of a log file under `$TALARIA_HOME/logs/`,
//! with a text and a level filter) and `GET /api/logs/files` (the files
//! there with their sizes).
//!
//! A log can be large (`gateway.log` is appended to for as long as the
//! gateway runs), so a tail is read backwards from the end in chunks of
//! [`CHUNK`] bytes, never the whole file: memory stays within a chunk,
//! one cut line and the lines returned, and a search reads at most
//! [`SCAN_LIMIT`] bytes before it gives up and says the answer is
//! truncated. Lines are returned as written: what reaches a log has
//! already passed the secret redactor, so nothing is masked again here.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{Params, bad_request, count_param, not_found, query, shown};
use crate::AppState;
use crate::error::ApiError;

/// Lines returned when the request does not say.
const DEFAULT_LINES: usize = 200;

/// The most lines one request may ask for.
const MAX_LINES: usize = 1000;

/// How much of the file is read at a time, going backwards.
const CHUNK: usize = 64 * 1024;

/// A line longer than this is cut to its first this many bytes (its time
/// and level are at the start) and marked with `…`.
const MAX_LINE_BYTES: usize = 8 * 1024;

/// The most bytes one request reads: a filter that matches little stops
/// here rather than reading a log of gigabytes.
const SCAN_LIMIT: u64 = 16 * 1024 * 1024;

/// The longest `filter` accepted, in characters.
const MAX_FILTER_CHARS: usize = 500;

/// The most files `/api/logs/files` lists.
const MAX_FILES: usize = 500;

/// The gateway's log when `gateway start` runs it: the default file.
const GATEWAY_LOG: &str = "gateway.log";

/// The marker a cut line ends with.
const CUT: &str = "…";

/// A log line's level, least severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

impl Level {
    /// The `level` parameter's value (any case; `warning` for `warn`).
    fn parse(raw: &str) -> Option<Level> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "trace" => Some(Level::Trace),
            "debug" => Some(Level::Debug),
            "info" => Some(Level::Info),
            "warn" | "warning" => Some(Level::Warn),
            "error" => Some(Level::Error),
            _ => None,
        }
    }

    /// The level tracing's formatter writes (`INFO`, ...).
    fn from_word(word: &str) -> Option<Level> {
        match word {
            "TRACE" => Some(Level::Trace),
            "DEBUG" => Some(Level::Debug),
            "INFO" => Some(Level::Info),
            "WARN" => Some(Level::Warn),
            "ERROR" => Some(Level::Error),
            _ => None,
        }
    }

    /// The level a line states, when the format makes it recognisable:
    /// tracing's `<time>  INFO message` (or without the time), and the
    /// `error: ` / `warning: ` lines written for a person. Colour codes
    /// are skipped. A line with none (a message's second line, a panic)
    /// continues the line above it.
    fn of(line: &str) -> Option<Level> {
        let plain;
        let line = if line.contains('\u{1b}') {
            plain = strip_ansi(line);
            plain.as_str()
        } else {
            line
        };
        if line.starts_with("error: ") {
            return Some(Level::Error);
        }
        if line.starts_with("warning: ") {
            return Some(Level::Warn);
        }
        let mut words = line.split_whitespace();
        let first = words.next()?;
        if let Some(level) = Level::from_word(first) {
            return Some(level);
        }
        // A timestamp starts with a digit (`2026-12-06T15:38:02.1Z`).
        if first.starts_with(|c: char| c.is_ascii_digit()) {
            return words.next().and_then(Level::from_word);
        }
        None
    }
}

/// `text` without ANSI escape sequences (`ESC [ ... letter`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.next() == Some('[') {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        }
    }
    out
}

/// Whether `name` may name a file in `logs/`: one plain path component,
/// not hidden, so no `..`, no `/`, no absolute path.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.contains(['/', '\\'])
        && !name.chars().any(char::is_control)
}

/// A regular file in `logs/` (a link is not followed: it could point
/// anywhere).
struct LogFile {
    name: String,
    size: u64,
    /// Unix seconds.
    modified: f64,
}

/// The plain files in `dir`, by name, at most [`MAX_FILES`]; whether
/// there were more. A missing directory has none.
fn list(dir: &Path) -> io::Result<(Vec<LogFile>, bool)> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), false)),
        Err(e) => return Err(e),
    };
    let mut files = Vec::new();
    let mut more = false;
    for entry in entries {
        let entry = entry?;
        // `DirEntry::metadata` does not follow links.
        let Ok(meta) = entry.metadata() else { continue };
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if !meta.is_file() || !valid_name(&name) {
            continue;
        }
        if files.len() == MAX_FILES {
            more = true;
            break;
        }
        let modified = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0.0, |d| d.as_secs_f64());
        files.push(LogFile {
            name,
            size: meta.len(),
            modified,
        });
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((files, more))
}

/// `GET /api/logs/files`: `{object, data: [{name, size, modified}],
/// has_more}`; an empty list when there is no `logs/` yet.
pub(super) async fn files(State(state): State<Arc<AppState>>) -> Response {
    let dir = state.agent.parts().home.logs_dir();
    let listed = tokio::task::spawn_blocking(move || list(&dir)).await;
    let (files, more) = match listed {
        Ok(Ok(listed)) => listed,
        Ok(Err(e)) => {
            return ApiError::internal(format!("Cannot list the log files: {e}")).into_response();
        }
        Err(e) => {
            return ApiError::internal(format!("Cannot list the log files: {e}")).into_response();
        }
    };
    let data: Vec<Value> = files
        .iter()
        .map(|f| json!({"name": f.name, "size": f.size, "modified": f.modified}))
        .collect();
    Json(json!({"object": "list", "data": data, "has_more": more})).into_response()
}

/// What a tail asks for.
struct Ask {
    lines: usize,
    /// Lower-cased.
    filter: Option<String>,
    level: Option<Level>,
}

/// `GET /api/logs?lines=N&filter=TEXT&level=LEVEL&file=NAME`: the last
/// `lines` lines (default 200, at most 1000) of `file` (default
/// `gateway.log`, else the log written last) that contain `filter` (any
/// case) and are at `level` or above, oldest first: `{object, file,
/// size, lines, truncated}`. `truncated` says lines before the first one
/// returned were not looked at.
pub(super) async fn tail(
    State(state): State<Arc<AppState>>,
    params: Result<Query<Params>, QueryRejection>,
) -> Response {
    let dir = state.agent.parts().home.logs_dir();
    async move {
        let params = query(params)?;
        let lines = count_param(&params, "lines", DEFAULT_LINES, MAX_LINES)?;
        let filter = match params.get("filter").filter(|f| !f.is_empty()) {
            Some(f) if f.chars().count() > MAX_FILTER_CHARS => {
                return Err(bad_request(
                    format!("`filter` may be at most {MAX_FILTER_CHARS} characters long"),
                    "invalid_query",
                ));
            }
            Some(f) => Some(f.to_lowercase()),
            None => None,
        };
        let level = match params.get("level").filter(|l| !l.trim().is_empty()) {
            Some(raw) => Some(Level::parse(raw).ok_or_else(|| {
                bad_request(
                    format!(
                        "`level` is {:?}; use trace, debug, info, warn or error",
                        shown(raw)
                    ),
                    "invalid_query",
                )
            })?),
            None => None,
        };
        let file = params.get("file").cloned();
        if let Some(name) = &file
            && !valid_name(name)
        {
            return Err(bad_request(
                format!(
                    "`file` must be the name of a file in the logs directory, not a path: {:?}",
                    shown(name)
                ),
                "invalid_log_file",
            ));
        }
        let ask = Ask {
            lines,
            filter,
            level,
        };
        tokio::task::spawn_blocking(move || read_tail(&dir, file, &ask))
            .await
            .map_err(|e| ApiError::internal(format!("Cannot read the log: {e}")))?
            .map(|v| Json(v).into_response())
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// The tail of the chosen file as the route answers it.
fn read_tail(dir: &Path, file: Option<String>, ask: &Ask) -> Result<Value, ApiError> {
    let empty = |name: Option<String>| json!({"object": "talaria.log", "file": name, "size": 0, "lines": [], "truncated": false});
    let name = match file {
        Some(name) => name,
        None => match default_file(dir)
            .map_err(|e| ApiError::internal(format!("Cannot list the log files: {e}")))?
        {
            Some(name) => name,
            None => return Ok(empty(None)),
        },
    };
    let path = dir.join(&name);
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(not_found(
                format!("There is no log file {:?}", shown(&name)),
                "log_not_found",
            ));
        }
        Err(e) => return Err(ApiError::internal(format!("Cannot read the log: {e}"))),
    };
    if !meta.is_file() {
        return Err(bad_request(
            format!(
                "{:?} is not a plain file in the logs directory",
                shown(&name)
            ),
            "invalid_log_file",
        ));
    }
    let opened = File::open(&path)
        .and_then(|f| f.metadata().map(|m| (m.len(), f)))
        .map_err(|e| ApiError::internal(format!("Cannot read the log: {e}")))?;
    let (size, handle) = opened;
    let (lines, truncated) = tail_lines(&handle, size, ask)
        .map_err(|e| ApiError::internal(format!("Cannot read the log: {e}")))?;
    Ok(json!({
        "object": "talaria.log",
        "file": name,
        "size": size,
        "lines": lines,
        "truncated": truncated,
    }))
}

/// `gateway.log` when it is there, else the file written last; `None`
/// when `logs/` holds no file.
fn default_file(dir: &Path) -> io::Result<Option<String>> {
    let (files, _) = list(dir)?;
    if files.iter().any(|f| f.name == GATEWAY_LOG) {
        return Ok(Some(GATEWAY_LOG.to_owned()));
    }
    Ok(files
        .into_iter()
        .max_by(|a, b| a.modified.total_cmp(&b.modified))
        .map(|f| f.name))
}

/// The last `ask.lines` matching lines of the first `size` bytes of
/// `file`, oldest first, and whether earlier lines were left unread.
fn tail_lines(file: &File, size: u64, ask: &Ask) -> io::Result<(Vec<String>, bool)> {
    let mut reader = Backwards {
        file,
        start: size,
        buf: Vec::new(),
        read: 0,
    };
    // Newest first while reading; turned around at the end.
    let mut out: Vec<String> = Vec::new();
    // With a level filter, lines with no level of their own wait for the
    // line above them that has one (newest first as well).
    let mut pending: Vec<String> = Vec::new();
    let matches = |line: &str| {
        ask.filter
            .as_deref()
            .is_none_or(|f| line.to_lowercase().contains(f))
    };
    let truncated = loop {
        if out.len() >= ask.lines {
            break reader.start > 0 || !reader.buf.is_empty();
        }
        let line = match reader.prev()? {
            Step::Line(line) => line,
            Step::Start => break false,
            Step::Budget => break true,
        };
        let Some(wanted) = ask.level else {
            if matches(&line) {
                out.push(line);
            }
            continue;
        };
        match Level::of(&line) {
            None => {
                if matches(&line) && out.len() + pending.len() < ask.lines {
                    pending.push(line);
                }
            }
            Some(level) if level >= wanted => {
                out.append(&mut pending);
                out.truncate(ask.lines);
                if out.len() < ask.lines && matches(&line) {
                    out.push(line);
                }
            }
            Some(_) => pending.clear(),
        }
    };
    out.reverse();
    Ok((out, truncated))
}

/// What [`Backwards::prev`] found.
enum Step {
    /// The line before the ones already read.
    Line(String),
    /// The start of the file: no line is left.
    Start,
    /// [`SCAN_LIMIT`] bytes were read.
    Budget,
}

/// Reads a file's lines from the end towards the start.
struct Backwards<'a> {
    file: &'a File,
    /// The file offset of `buf[0]`.
    start: u64,
    /// Bytes not yet returned, ending where the last line returned
    /// began. A trailing `\n` ends the line to return next.
    buf: Vec<u8>,
    /// Bytes read from the file so far.
    read: u64,
}

impl Backwards<'_> {
    fn prev(&mut self) -> io::Result<Step> {
        loop {
            let body = match self.buf.last() {
                Some(b'\n') => self.buf.len() - 1,
                _ => self.buf.len(),
            };
            if let Some(i) = self.buf[..body].iter().rposition(|&b| b == b'\n') {
                let line = text(&self.buf[i + 1..body], false);
                self.buf.truncate(i + 1);
                return Ok(Step::Line(line));
            }
            if self.start == 0 {
                if self.buf.is_empty() {
                    return Ok(Step::Start);
                }
                let line = text(&self.buf[..body], false);
                self.buf.clear();
                return Ok(Step::Line(line));
            }
            if body > MAX_LINE_BYTES {
                return self.long_line(self.start + body as u64);
            }
            let n = CHUNK.min(usize::try_from(self.start).unwrap_or(CHUNK));
            if self.read + n as u64 > SCAN_LIMIT {
                return Ok(Step::Budget);
            }
            let at = self.start - n as u64;
            let mut chunk = vec![0; n + self.buf.len()];
            self.file.read_exact_at(&mut chunk[..n], at)?;
            chunk[n..].copy_from_slice(&self.buf);
            self.buf = chunk;
            self.start = at;
            self.read += n as u64;
        }
    }

    /// A line longer than [`MAX_LINE_BYTES`] ending at `end`: its start is
    /// found without keeping what lies between, and its first
    /// [`MAX_LINE_BYTES`] are read again.
    fn long_line(&mut self, end: u64) -> io::Result<Step> {
        let mut chunk = vec![0; CHUNK];
        let mut pos = self.start;
        let begins = loop {
            if pos == 0 {
                break 0;
            }
            let n = CHUNK.min(usize::try_from(pos).unwrap_or(CHUNK));
            if self.read + n as u64 > SCAN_LIMIT {
                return Ok(Step::Budget);
            }
            let at = pos - n as u64;
            self.file.read_exact_at(&mut chunk[..n], at)?;
            self.read += n as u64;
            if let Some(i) = chunk[..n].iter().rposition(|&b| b == b'\n') {
                break at + i as u64 + 1;
            }
            pos = at;
        };
        let len = usize::try_from(end - begins)
            .unwrap_or(MAX_LINE_BYTES)
            .min(MAX_LINE_BYTES);
        let mut head = vec![0; len];
        self.file.read_exact_at(&mut head, begins)?;
        self.buf.clear();
        self.start = begins;
        Ok(Step::Line(text(&head, true)))
    }
}

/// A line's bytes as text (invalid UTF-8 replaced, a `\r` before the
/// newline dropped); a cut line loses the half character at its end and
/// gets the [`CUT`] mark.
fn text(bytes: &[u8], cut: bool) -> String {
    if cut {
        let whole = match std::str::from_utf8(bytes) {
            Err(e) if e.error_len().is_none() => &bytes[..e.valid_up_to()],
            _ => bytes,
        };
        let mut line = String::from_utf8_lossy(whole).into_owned();
        line.push_str(CUT);
        return line;
    }
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tail_of(content: &str, ask: Ask) -> (Vec<String>, bool) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.log");
        std::fs::write(&path, content).unwrap();
        let file = File::open(&path).unwrap();
        tail_lines(&file, content.len() as u64, &ask).unwrap()
    }

    fn ask(lines: usize) -> Ask {
        Ask {
            lines,
            filter: None,
            level: None,
        }
    }

    #[test]
    fn lines_come_back_oldest_first_with_and_without_a_last_newline() {
        assert_eq!(
            tail_of("a\nb\nc\n", ask(2)),
            (vec!["b".into(), "c".into()], true)
        );
        assert_eq!(tail_of("a\nb\nc", ask(5)).0, vec!["a", "b", "c"]);
        assert_eq!(tail_of("a\r\n\nc\n", ask(5)).0, vec!["a", "", "c"]);
        assert_eq!(tail_of("", ask(5)), (vec![], false));
        assert_eq!(
            tail_of("a\nb\n", ask(2)),
            (vec!["a".into(), "b".into()], false)
        );
    }

    #[test]
    fn a_long_line_is_cut_to_its_start_and_the_lines_around_it_stay_whole() {
        let long = format!("START{}END", "x".repeat(3 * CHUNK));
        let content = format!("first\n{long}\nlast\n");
        let (lines, truncated) = tail_of(&content, ask(10));
        assert!(!truncated);
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], "first");
        assert!(lines[1].starts_with("START"), "{}", &lines[1][..20]);
        assert!(lines[1].ends_with(CUT));
        assert_eq!(lines[1].len(), MAX_LINE_BYTES + CUT.len());
        assert_eq!(lines[2], "last");
    }

    #[test]
    fn levels_are_read_from_tracing_lines_and_continuations_follow_their_line() {
        assert_eq!(
            Level::of("2026-12-06T15:38:02.123456Z  WARN something"),
            Some(Level::Warn)
        );
        assert_eq!(
            Level::of("\u{1b}[2m2026-12-06T15:38:02Z\u{1b}[0m \u{1b}[31mERROR\u{1b}[0m boom"),
            Some(Level::Error)
        );
        assert_eq!(Level::of("error: it broke"), Some(Level::Error));
        assert_eq!(Level::of("  at some frame"), None);
        assert_eq!(Level::of("2026 was a year of INFO"), None);
        let log = "2026-01-01T00:00:00Z  INFO one\n\
                   2026-01-01T00:00:01Z ERROR two\n  detail of two\n\
                   2026-01-01T00:00:02Z DEBUG three\n  detail of three\n";
        let warn = Ask {
            lines: 10,
            filter: None,
            level: Some(Level::Warn),
        };
        assert_eq!(
            tail_of(log, warn).0,
            vec!["2026-01-01T00:00:01Z ERROR two", "  detail of two"]
        );
    }
}
