//! Reading the logs under `$TALARIA_HOME/logs/`: the files there, a line's
//! time and level, and a file's tail read backwards within bounds. Both
//! `GET /api/logs` and `talaria logs` read through here, so a filter means
//! the same in both.
//!
//! A log can be large (`gateway.log` is appended to for as long as the
//! gateway runs), so a tail is read backwards from the end in chunks of
//! [`CHUNK`] bytes, never the whole file: memory stays within a chunk, one
//! cut line and the lines returned, and a search reads at most
//! [`Query::scan_limit`] bytes before it gives up and says the answer is
//! truncated. Lines are returned as written: what reaches a log has
//! already passed the secret redactor, so nothing is masked again here.
//!
//! A line is the start of a record when it states a time or a level (the
//! way `tracing` writes them, or the `error: ` / `warning: ` lines written
//! for a person); a line that states neither (a message's second line, a
//! panic's backtrace) belongs to the record above it, and a level or time
//! filter keeps or drops it with that record.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use chrono::{DateTime, Duration, Utc};

/// How much of a file is read at a time.
pub const CHUNK: usize = 64 * 1024;

/// A line longer than this is cut to its first this many bytes (its time
/// and level are at the start) and marked with [`CUT`].
pub const MAX_LINE_BYTES: usize = 8 * 1024;

/// The marker a cut line ends with.
pub const CUT: &str = "…";

/// The gateway's log when `gateway start` runs it.
pub const GATEWAY_LOG: &str = "gateway.log";

/// A log line's level, least severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// `TRACE`.
    Trace,
    /// `DEBUG`.
    Debug,
    /// `INFO`.
    Info,
    /// `WARN`.
    Warn,
    /// `ERROR`.
    Error,
}

impl Level {
    /// A level as a person writes it (any case; `warning` for `warn`).
    pub fn parse(raw: &str) -> Option<Level> {
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

    /// The level `line` states, if it states one (see [`Head::of`]).
    pub fn of(line: &str) -> Option<Level> {
        Head::of(line).and_then(|head| head.level)
    }
}

impl std::str::FromStr for Level {
    type Err = String;

    fn from_str(raw: &str) -> Result<Level, String> {
        Level::parse(raw)
            .ok_or_else(|| format!("{raw:?} is not a level; use trace, debug, info, warn or error"))
    }
}

/// What the start of a record states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// Its level, when it states one.
    pub level: Option<Level>,
    /// Its time, when it starts with one (RFC 3339, as tracing writes it).
    pub time: Option<DateTime<Utc>>,
}

impl Head {
    /// What `line` states when it starts a record: tracing's `<time>  INFO
    /// message` (or without the time, or the time alone), or an `error: ` /
    /// `warning: ` line. Colour codes are skipped. `None` for a line that
    /// continues the record above it.
    pub fn of(line: &str) -> Option<Head> {
        let plain;
        let line = if line.contains('\u{1b}') {
            plain = strip_ansi(line);
            plain.as_str()
        } else {
            line
        };
        let stated = |level| {
            Some(Head {
                level: Some(level),
                time: None,
            })
        };
        if line.starts_with("error: ") {
            return stated(Level::Error);
        }
        if line.starts_with("warning: ") {
            return stated(Level::Warn);
        }
        let mut words = line.split_whitespace();
        let first = words.next()?;
        if let Some(level) = Level::from_word(first) {
            return stated(level);
        }
        // A timestamp starts with a digit (`2026-12-06T15:38:02.1Z`).
        if !first.starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        let time = DateTime::parse_from_rfc3339(first)
            .ok()
            .map(|t| t.with_timezone(&Utc));
        let level = words.next().and_then(Level::from_word);
        (time.is_some() || level.is_some()).then_some(Head { level, time })
    }
}

/// `text` without ANSI escape sequences (`ESC [ ... letter`).
pub fn strip_ansi(text: &str) -> String {
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

/// When `--since`-style text points to: a span back from `now` (`90s`,
/// `10m`, `2h`, `1d`, `1w`) or an RFC 3339 time (`2026-12-07T09:30:00Z`,
/// `2026-12-07T10:30:00+01:00`).
pub fn parse_since(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, String> {
    let text = text.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let bad = || {
        format!(
            "{text:?} is neither a span back from now (30s, 10m, 2h, 1d, 1w) nor an RFC 3339 time (2026-12-07T09:30:00Z)"
        )
    };
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .filter(|&i| i > 0)
        .ok_or_else(bad)?;
    let (number, unit) = text.split_at(split);
    let n: i64 = number.parse().map_err(|_| bad())?;
    let unit_secs: i64 = match unit.trim() {
        "s" | "sec" | "secs" | "second" | "seconds" => 1,
        "m" | "min" | "mins" | "minute" | "minutes" => 60,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3600,
        "d" | "day" | "days" => 86_400,
        "w" | "week" | "weeks" => 7 * 86_400,
        _ => return Err(bad()),
    };
    n.checked_mul(unit_secs)
        .and_then(Duration::try_seconds)
        .and_then(|span| now.checked_sub_signed(span))
        .ok_or_else(bad)
}

/// Whether `name` may name a file in `logs/`: one plain path component,
/// not hidden, so no `..`, no `/`, no absolute path.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.contains(['/', '\\'])
        && !name.chars().any(char::is_control)
}

/// A regular file in `logs/` (a link is not followed: it could point
/// anywhere).
#[derive(Debug, Clone, PartialEq)]
pub struct LogFile {
    /// Its name in `logs/`.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// When it was last written, in Unix seconds.
    pub modified: f64,
}

/// The plain files in `dir`, by name, at most `max`; whether there were
/// more. A missing directory has none.
pub fn list(dir: &Path, max: usize) -> io::Result<(Vec<LogFile>, bool)> {
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
        if files.len() == max {
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

/// Which lines a reading keeps.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    /// The most lines a tail returns.
    pub lines: usize,
    /// Text a line must contain, lower-cased (lines are compared in lower
    /// case too).
    pub text: Option<String>,
    /// Records at this level or above.
    pub level: Option<Level>,
    /// Records at or after this time. A tail stops at the first record
    /// before it: a log is written in time order.
    pub since: Option<DateTime<Utc>>,
    /// The most bytes a tail reads before it gives up.
    pub scan_limit: u64,
}

/// What a query makes of a record's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Keep,
    Drop,
    /// Before `since`.
    Older,
}

impl Query {
    /// The last `lines` lines, no filter, reading at most `scan_limit`.
    pub fn last(lines: usize, scan_limit: u64) -> Query {
        Query {
            lines,
            text: None,
            level: None,
            since: None,
            scan_limit,
        }
    }

    /// Whether lines are judged by the record they belong to.
    fn by_record(&self) -> bool {
        self.level.is_some() || self.since.is_some()
    }

    fn judge(&self, head: &Head) -> Verdict {
        if let (Some(since), Some(time)) = (self.since, head.time)
            && time < since
        {
            return Verdict::Older;
        }
        match self.level {
            Some(wanted) if head.level.is_none_or(|level| level < wanted) => Verdict::Drop,
            _ => Verdict::Keep,
        }
    }

    fn matches(&self, line: &str) -> bool {
        self.text
            .as_deref()
            .is_none_or(|text| line.to_lowercase().contains(text))
    }
}

/// A file's last lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tail {
    /// Oldest first.
    pub lines: Vec<String>,
    /// Whether lines before the first one were left unread (the count or
    /// the scan limit was reached first; lines before `since` do not
    /// count).
    pub truncated: bool,
}

/// The last `query.lines` lines `query` keeps of the first `size` bytes of
/// `file`, read backwards within `query.scan_limit`.
pub fn tail(file: &File, size: u64, query: &Query) -> io::Result<Tail> {
    let mut reader = Backwards {
        file,
        start: size,
        buf: Vec::new(),
        read: 0,
        limit: query.scan_limit,
    };
    let wanted = query.lines;
    // Newest first while reading; turned around at the end.
    let mut out: Vec<String> = Vec::new();
    // Judged by their record, lines that start none wait for the line
    // above them that does (newest first as well).
    let mut pending: Vec<String> = Vec::new();
    let truncated = loop {
        if out.len() >= wanted {
            break reader.start > 0 || !reader.buf.is_empty();
        }
        let line = match reader.prev()? {
            Step::Line(line) => line,
            Step::Start => break false,
            Step::Budget => break true,
        };
        if !query.by_record() {
            if query.matches(&line) {
                out.push(line);
            }
            continue;
        }
        let Some(head) = Head::of(&line) else {
            if query.matches(&line) && out.len() + pending.len() < wanted {
                pending.push(line);
            }
            continue;
        };
        match query.judge(&head) {
            Verdict::Keep => {
                out.append(&mut pending);
                out.truncate(wanted);
                if out.len() < wanted && query.matches(&line) {
                    out.push(line);
                }
            }
            Verdict::Drop => pending.clear(),
            Verdict::Older => break false,
        }
    };
    out.reverse();
    Ok(Tail {
        lines: out,
        truncated,
    })
}

/// Judges lines read forwards (a file followed as it grows) the way
/// [`tail`] judges them backwards: a line that starts no record goes with
/// the last one that did.
#[derive(Debug, Clone)]
pub struct Forwards {
    query: Query,
    /// Whether the record being read is kept.
    keeping: bool,
}

impl Forwards {
    /// Lines before the first record's start are kept only without a level
    /// or time filter: their record is not known.
    pub fn new(query: Query) -> Forwards {
        let keeping = !query.by_record();
        Forwards { query, keeping }
    }

    /// Whether `line`, the next one, is kept.
    pub fn keep(&mut self, line: &str) -> bool {
        if self.query.by_record()
            && let Some(head) = Head::of(line)
        {
            self.keeping = self.query.judge(&head) == Verdict::Keep;
        }
        self.keeping && self.query.matches(line)
    }
}

/// What [`Backwards::prev`] found.
enum Step {
    /// The line before the ones already read.
    Line(String),
    /// The start of the file: no line is left.
    Start,
    /// The scan limit was reached.
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
    /// The most bytes to read.
    limit: u64,
}

impl Backwards<'_> {
    fn prev(&mut self) -> io::Result<Step> {
        loop {
            let body = match self.buf.last() {
                Some(b'\n') => self.buf.len() - 1,
                _ => self.buf.len(),
            };
            if let Some(i) = self.buf[..body].iter().rposition(|&b| b == b'\n') {
                let line = line_text(&self.buf[i + 1..body], false);
                self.buf.truncate(i + 1);
                return Ok(Step::Line(line));
            }
            if self.start == 0 {
                if self.buf.is_empty() {
                    return Ok(Step::Start);
                }
                let line = line_text(&self.buf[..body], false);
                self.buf.clear();
                return Ok(Step::Line(line));
            }
            if body > MAX_LINE_BYTES {
                return self.long_line(self.start + body as u64);
            }
            let n = CHUNK.min(usize::try_from(self.start).unwrap_or(CHUNK));
            if self.read + n as u64 > self.limit {
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
            if self.read + n as u64 > self.limit {
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
        Ok(Step::Line(line_text(&head, true)))
    }
}

/// A line's bytes (without its `\n`) as text: invalid UTF-8 replaced, a
/// `\r` at the end dropped; a `cut` line loses the half character at its
/// end and gets the [`CUT`] mark.
pub fn line_text(bytes: &[u8], cut: bool) -> String {
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

    const NO_LIMIT: u64 = u64::MAX;

    fn tail_of(content: &str, query: &Query) -> (Vec<String>, bool) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.log");
        std::fs::write(&path, content).unwrap();
        let file = File::open(&path).unwrap();
        let tail = tail(&file, content.len() as u64, query).unwrap();
        (tail.lines, tail.truncated)
    }

    fn last(lines: usize) -> Query {
        Query::last(lines, NO_LIMIT)
    }

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn lines_come_back_oldest_first_with_and_without_a_last_newline() {
        assert_eq!(
            tail_of("a\nb\nc\n", &last(2)),
            (vec!["b".into(), "c".into()], true)
        );
        assert_eq!(tail_of("a\nb\nc", &last(5)).0, vec!["a", "b", "c"]);
        assert_eq!(tail_of("a\r\n\nc\n", &last(5)).0, vec!["a", "", "c"]);
        assert_eq!(tail_of("", &last(5)), (vec![], false));
        assert_eq!(
            tail_of("a\nb\n", &last(2)),
            (vec!["a".into(), "b".into()], false)
        );
        assert_eq!(tail_of("a\nb\n", &last(0)), (vec![], true));
    }

    #[test]
    fn a_long_line_is_cut_to_its_start_and_the_lines_around_it_stay_whole() {
        let long = format!("START{}END", "x".repeat(3 * CHUNK));
        let content = format!("first\n{long}\nlast\n");
        let (lines, truncated) = tail_of(&content, &last(10));
        assert!(!truncated);
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], "first");
        assert!(lines[1].starts_with("START"), "{}", &lines[1][..20]);
        assert!(lines[1].ends_with(CUT));
        assert_eq!(lines[1].len(), MAX_LINE_BYTES + CUT.len());
        assert_eq!(lines[2], "last");
    }

    #[test]
    fn the_scan_stops_at_its_limit_and_says_so() {
        let content = "line\n".repeat(3 * CHUNK / 5);
        let (lines, truncated) = tail_of(&content, &Query::last(usize::MAX, CHUNK as u64));
        assert!(truncated);
        // One chunk's worth: the lines whole in it.
        assert!((CHUNK / 5 - 1..=CHUNK / 5).contains(&lines.len()));
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
        assert_eq!(Head::of("2026 was a year of INFO"), None);
        let log = "2026-01-01T00:00:00Z  INFO one\n\
                   2026-01-01T00:00:01Z ERROR two\n  detail of two\n\
                   2026-01-01T00:00:02Z DEBUG three\n  detail of three\n";
        let warn = Query {
            level: Some(Level::Warn),
            ..last(10)
        };
        assert_eq!(
            tail_of(log, &warn).0,
            vec!["2026-01-01T00:00:01Z ERROR two", "  detail of two"]
        );
    }

    #[test]
    fn times_are_read_from_the_start_of_a_line() {
        assert_eq!(
            Head::of("2026-12-06T15:38:02.123456Z  INFO x"),
            Some(Head {
                level: Some(Level::Info),
                time: Some(at("2026-12-06T15:38:02.123456Z"))
            })
        );
        assert_eq!(
            Head::of("\u{1b}[2m2026-12-06T15:38:02Z\u{1b}[0m plain words").and_then(|h| h.time),
            Some(at("2026-12-06T15:38:02Z"))
        );
        assert_eq!(Head::of("INFO no time").and_then(|h| h.time), None);
    }

    #[test]
    fn since_stops_at_the_first_older_record_with_its_continuations() {
        let log = "2026-01-01T00:00:00Z  INFO old\n  detail of old\n\
                   2026-01-01T00:01:00Z  WARN new\n  detail of new\n\
                   talaria: said by hand\n\
                   2026-01-01T00:02:00Z  INFO newest\n";
        let since = Query {
            since: Some(at("2026-01-01T00:00:30Z")),
            ..last(10)
        };
        assert_eq!(
            tail_of(log, &since),
            (
                vec![
                    "2026-01-01T00:01:00Z  WARN new".to_owned(),
                    "  detail of new".into(),
                    "talaria: said by hand".into(),
                    "2026-01-01T00:02:00Z  INFO newest".into()
                ],
                false
            )
        );
        let both = Query {
            level: Some(Level::Warn),
            ..since
        };
        assert_eq!(
            tail_of(log, &both).0,
            vec![
                "2026-01-01T00:01:00Z  WARN new",
                "  detail of new",
                "talaria: said by hand"
            ]
        );
    }

    #[test]
    fn forwards_judges_each_record_as_the_tail_does() {
        let mut f = Forwards::new(Query {
            level: Some(Level::Warn),
            ..last(10)
        });
        let kept: Vec<&str> = [
            "  orphan",
            "2026-01-01T00:00:00Z  INFO a",
            "  detail of a",
            "2026-01-01T00:00:01Z ERROR b",
            "  detail of b",
            "warning: c",
        ]
        .into_iter()
        .filter(|line| f.keep(line))
        .collect();
        assert_eq!(
            kept,
            vec![
                "2026-01-01T00:00:01Z ERROR b",
                "  detail of b",
                "warning: c"
            ]
        );
        let mut all = Forwards::new(last(10));
        assert!(all.keep("  orphan"));
    }

    #[test]
    fn since_takes_spans_and_times() {
        let now = at("2026-12-07T12:00:00Z");
        assert_eq!(parse_since("10m", now), Ok(at("2026-12-07T11:50:00Z")));
        assert_eq!(parse_since("2h", now), Ok(at("2026-12-07T10:00:00Z")));
        assert_eq!(parse_since("1d", now), Ok(at("2026-12-06T12:00:00Z")));
        assert_eq!(parse_since("45s", now), Ok(at("2026-12-07T11:59:15Z")));
        assert_eq!(
            parse_since("2026-12-07T10:30:00+01:00", now),
            Ok(at("2026-12-07T09:30:00Z"))
        );
        for bad in [
            "",
            "m",
            "10",
            "10y",
            "-5m",
            "yesterday",
            "99999999999999999d",
        ] {
            assert!(parse_since(bad, now).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_are_single_plain_components() {
        assert!(valid_name("gateway.log"));
        for bad in ["", ".hidden", "../x", "a/b", "a\\b", "a\nb"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }
}
