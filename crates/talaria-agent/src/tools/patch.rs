//! The engine behind the `patch` tool: tolerant find-and-replace and
//! unified-diff application. Pure text functions; the tool in
//! [`super::files`] does the file I/O.
//!
//! Models copy text out of `read_file` imperfectly: they drop trailing
//! spaces, re-indent a block, or collapse runs of whitespace. Replace mode
//! therefore tries the exact text first and then progressively looser
//! comparisons, always insisting on a unique match (unless `replace_all`),
//! so a loose comparison can never silently edit the wrong place.

use std::fmt::Write as _;

/// Files past this size skip the whitespace-collapsed strategy: its position
/// map costs two words per byte.
const MAX_COLLAPSE_BYTES: usize = 1024 * 1024;
/// Line comparisons allowed when looking for the closest region of a failed
/// match; bigger searches give up on the hint rather than stall the call.
const MAX_HINT_COMPARISONS: usize = 60_000;
/// Characters of each line compared when scoring the closest region.
const HINT_LINE_CHARS: usize = 200;
/// Largest unified diff accepted in patch mode.
pub const MAX_DIFF_BYTES: usize = 4 * 1024 * 1024;
/// Most files one diff may touch.
pub const MAX_DIFF_FILES: usize = 200;
/// Line numbers listed when a match is ambiguous.
const MAX_LISTED_LINES: usize = 20;

/// How `old_string` was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Byte for byte.
    Exact,
    /// Line by line, ignoring trailing whitespace.
    TrailingWhitespace,
    /// Line by line, the whole block indented by a different amount.
    Indentation,
    /// Line by line, ignoring leading and trailing whitespace.
    LineTrimmed,
    /// Every run of whitespace treated as one space.
    WhitespaceCollapsed,
}

impl Strategy {
    /// The name reported to the model.
    pub fn label(self) -> &'static str {
        match self {
            Strategy::Exact => "exact",
            Strategy::TrailingWhitespace => "trailing_whitespace",
            Strategy::Indentation => "indentation",
            Strategy::LineTrimmed => "line_trimmed",
            Strategy::WhitespaceCollapsed => "whitespace_collapsed",
        }
    }
}

/// The outcome of a successful replacement.
#[derive(Debug, Clone)]
pub struct Replaced {
    /// The whole new text.
    pub text: String,
    /// How many places changed.
    pub count: usize,
    /// The comparison that found them.
    pub strategy: Strategy,
}

/// One place `old_string` matched: a byte range of the content and what
/// goes there.
struct Found {
    start: usize,
    end: usize,
    replacement: String,
}

/// A line of the content: byte range without its `\n`.
#[derive(Clone, Copy)]
struct Line {
    start: usize,
    end: usize,
}

fn split_lines(content: &str) -> Vec<Line> {
    let mut lines = Vec::new();
    let mut start = 0;
    for (i, b) in content.bytes().enumerate() {
        if b == b'\n' {
            lines.push(Line { start, end: i });
            start = i + 1;
        }
    }
    if start < content.len() {
        lines.push(Line {
            start,
            end: content.len(),
        });
    }
    lines
}

fn leading_ws(s: &str) -> &str {
    &s[..s.len() - s.trim_start().len()]
}

/// The longest whitespace prefix shared by every non-blank line.
fn common_indent<'a>(lines: impl Iterator<Item = &'a str>) -> String {
    let mut common: Option<&str> = None;
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let ws = leading_ws(line);
        common = Some(match common {
            None => ws,
            Some(c) => {
                let shared = c
                    .char_indices()
                    .zip(ws.chars())
                    .take_while(|((_, a), b)| a == b)
                    .last()
                    .map_or(0, |((i, a), _)| i + a.len_utf8());
                &c[..shared]
            }
        });
    }
    common.unwrap_or("").to_owned()
}

/// Moves `text` from indentation `from` to indentation `to`: the prefix is
/// swapped on lines that carry it, and lines indented less than `from` are
/// shifted by the same difference where that is expressible.
fn reindent(text: &str, from: &str, to: &str) -> String {
    if from == to {
        return text.to_owned();
    }
    let shifted: Vec<String> = text
        .split('\n')
        .map(|line| {
            if line.trim().is_empty() {
                line.to_owned()
            } else if let Some(rest) = line.strip_prefix(from) {
                format!("{to}{rest}")
            } else if let Some(extra) = to.strip_prefix(from) {
                format!("{extra}{line}")
            } else if let Some(cut) = from.strip_prefix(to) {
                let ws = leading_ws(line);
                let drop = ws
                    .char_indices()
                    .nth(cut.chars().count())
                    .map_or(ws.len(), |(i, _)| i);
                line[drop..].to_owned()
            } else {
                line.to_owned()
            }
        })
        .collect();
    shifted.join("\n")
}

/// The indentation of the first non-blank line.
fn first_indent<'a>(mut lines: impl Iterator<Item = &'a str>) -> String {
    lines
        .find(|l| !l.trim().is_empty())
        .map(|l| leading_ws(l).to_owned())
        .unwrap_or_default()
}

fn line_of(content: &str, byte: usize) -> usize {
    content.as_bytes()[..byte.min(content.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

fn find_exact(content: &str, old: &str, new: &str) -> Vec<Found> {
    content
        .match_indices(old)
        .map(|(start, m)| Found {
            start,
            end: start + m.len(),
            replacement: new.to_owned(),
        })
        .collect()
}

/// Line-by-line matching under `strategy`; non-overlapping, in order.
fn find_lines(content: &str, old: &str, new: &str, strategy: Strategy) -> Vec<Found> {
    // A trailing newline on old_string means "these whole lines"; the
    // comparison itself is on the lines without it.
    let (old_body, old_nl) = match old.strip_suffix('\n') {
        Some(body) => (body, true),
        None => (old, false),
    };
    let old_lines: Vec<&str> = old_body.split('\n').collect();
    if old_lines.iter().all(|l| l.trim().is_empty()) {
        return Vec::new();
    }
    let new_body = match new.strip_suffix('\n') {
        Some(body) if old_nl => body,
        _ => new,
    };
    let lines = split_lines(content);
    let k = old_lines.len();
    if lines.len() < k {
        return Vec::new();
    }
    let old_indent = common_indent(old_lines.iter().copied());
    let line_at = |j: usize| &content[lines[j].start..lines[j].end];
    let mut found = Vec::new();
    let mut i = 0;
    while i + k <= lines.len() {
        // Every line strategy implies the trimmed lines are equal: a cheap
        // filter before the window is looked at more closely.
        if !(0..k).all(|j| line_at(i + j).trim() == old_lines[j].trim()) {
            i += 1;
            continue;
        }
        let window: Vec<&str> = (0..k).map(|j| line_at(i + j)).collect();
        let file_indent = match strategy {
            Strategy::Indentation => common_indent(window.iter().copied()),
            _ => String::new(),
        };
        let matched = window.iter().zip(&old_lines).all(|(f, o)| match strategy {
            Strategy::TrailingWhitespace => f.trim_end() == o.trim_end(),
            Strategy::Indentation => {
                let f = f.trim_end();
                let o = o.trim_end();
                if f.is_empty() || o.is_empty() {
                    f.is_empty() && o.is_empty()
                } else {
                    f.strip_prefix(file_indent.as_str()) == o.strip_prefix(old_indent.as_str())
                }
            }
            Strategy::LineTrimmed => true,
            Strategy::Exact | Strategy::WhitespaceCollapsed => false,
        });
        if !matched {
            i += 1;
            continue;
        }
        let replacement = match strategy {
            Strategy::Indentation => reindent(new_body, &old_indent, &file_indent),
            Strategy::LineTrimmed => {
                // Indentation may differ line by line here; shift by what the
                // first non-blank lines say.
                let from = first_indent(old_lines.iter().copied());
                let to = first_indent(window.iter().copied());
                reindent(new_body, &from, &to)
            }
            _ => new_body.to_owned(),
        };
        let start = lines[i].start;
        let mut end = lines[i + k - 1].end;
        // Deleting whole lines (old ends with a newline, new is empty)
        // takes the last line's newline with it.
        if old_nl && new.is_empty() && end < content.len() {
            end += 1;
        }
        found.push(Found {
            start,
            end,
            replacement,
        });
        i += k;
    }
    found
}

/// Whitespace runs treated as single spaces; the match must start and end
/// on non-whitespace.
fn find_collapsed(content: &str, old: &str, new: &str) -> Vec<Found> {
    if content.len() > MAX_COLLAPSE_BYTES {
        return Vec::new();
    }
    let needle = old.split_whitespace().collect::<Vec<_>>().join(" ");
    if needle.is_empty() {
        return Vec::new();
    }
    // norm[b] came from content[starts[b]..ends[b]].
    let mut norm = String::with_capacity(content.len());
    let mut starts = Vec::with_capacity(content.len());
    let mut ends = Vec::with_capacity(content.len());
    let mut in_ws = false;
    for (i, c) in content.char_indices() {
        let end = i + c.len_utf8();
        if c.is_whitespace() {
            if in_ws {
                if let Some(last) = ends.last_mut() {
                    *last = end;
                }
            } else {
                norm.push(' ');
                starts.push(i);
                ends.push(end);
                in_ws = true;
            }
        } else {
            in_ws = false;
            norm.push(c);
            for _ in 0..c.len_utf8() {
                starts.push(i);
                ends.push(end);
            }
        }
    }
    norm.match_indices(needle.as_str())
        .filter_map(|(s, m)| {
            let e = s + m.len();
            Some(Found {
                start: *starts.get(s)?,
                end: *ends.get(e.checked_sub(1)?)?,
                replacement: new.to_owned(),
            })
        })
        .collect()
}

fn splice(content: &str, found: &[Found]) -> String {
    let mut out = String::with_capacity(content.len());
    let mut at = 0;
    for f in found {
        out.push_str(&content[at..f.start]);
        out.push_str(&f.replacement);
        at = f.end;
    }
    out.push_str(&content[at..]);
    out
}

/// Replaces `old` with `new` in `content`, trying the exact text first and
/// then the tolerant strategies in order. The first strategy that finds
/// anything decides: it must find exactly one place unless `replace_all`.
/// Errors name `what` (a path) and tell the model what to do next.
pub fn fuzzy_replace(
    content: &str,
    old: &str,
    new: &str,
    replace_all: bool,
    what: &str,
) -> Result<Replaced, String> {
    if old.is_empty() {
        return Err("old_string is empty".into());
    }
    let strategies = [
        Strategy::Exact,
        Strategy::TrailingWhitespace,
        Strategy::Indentation,
        Strategy::LineTrimmed,
        Strategy::WhitespaceCollapsed,
    ];
    for strategy in strategies {
        let found = match strategy {
            Strategy::Exact => find_exact(content, old, new),
            Strategy::WhitespaceCollapsed => find_collapsed(content, old, new),
            _ => find_lines(content, old, new, strategy),
        };
        if found.is_empty() {
            continue;
        }
        let count = found.len();
        if count > 1 && !replace_all {
            let mut at: Vec<String> = found
                .iter()
                .take(MAX_LISTED_LINES)
                .map(|f| line_of(content, f.start).to_string())
                .collect();
            if count > MAX_LISTED_LINES {
                at.push("…".into());
            }
            let how = if strategy == Strategy::Exact {
                String::new()
            } else {
                format!(" (compared by {})", strategy.label())
            };
            return Err(format!(
                "old_string matches {count} places in {what}{how}, at lines {}; include more \
                 surrounding lines so it matches exactly one, or set replace_all=true to change \
                 all {count}",
                at.join(", ")
            ));
        }
        return Ok(Replaced {
            text: splice(content, &found),
            count,
            strategy,
        });
    }
    Err(format!(
        "old_string was not found in {what}. {}",
        not_found_hint(content, old)
    ))
}

/// Why `old_string` was not found, with the closest region when one is
/// reasonably similar.
fn not_found_hint(content: &str, old: &str) -> String {
    let first_line = old.lines().next().unwrap_or("");
    let numbered = first_line
        .trim_start()
        .split_once('|')
        .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
    if numbered {
        return "old_string seems to include read_file's `LINE|` prefixes; copy only the text \
                after the `|`."
            .into();
    }
    let mut hint = "Re-read the file with read_file and copy the exact text; the file may have \
                    changed since you last read it."
        .to_owned();
    if let Some(region) = closest_region(content, old) {
        hint.push_str(&region);
    }
    hint
}

fn similarity(a: &str, b: &str) -> f32 {
    let clip = |s: &str| -> String { s.trim().chars().take(HINT_LINE_CHARS).collect() };
    let (a, b) = (clip(a), clip(b));
    if a.is_empty() && b.is_empty() {
        return 1.0;
    }
    similar::TextDiff::from_chars(a.as_str(), b.as_str()).ratio()
}

/// The window of lines most like `old`, numbered as read_file shows them.
fn closest_region(content: &str, old: &str) -> Option<String> {
    let old_lines: Vec<&str> = old.trim_end_matches('\n').split('\n').collect();
    let lines = split_lines(content);
    let k = old_lines.len();
    if lines.is_empty() || k == 0 || lines.len() < k {
        return None;
    }
    let windows = lines.len() - k + 1;
    if windows.saturating_mul(k) > MAX_HINT_COMPARISONS {
        return None;
    }
    let mut best = (0.0f32, 0usize);
    for i in 0..windows {
        let score: f32 = old_lines
            .iter()
            .enumerate()
            .map(|(j, o)| {
                let l = lines[i + j];
                similarity(&content[l.start..l.end], o)
            })
            .sum::<f32>()
            / k as f32;
        if score > best.0 {
            best = (score, i);
        }
    }
    let (score, i) = best;
    if score < 0.5 {
        return None;
    }
    let mut out = format!(
        "\nThe closest text is at lines {}-{} ({:.0}% similar):\n",
        i + 1,
        i + k,
        score * 100.0
    );
    for (n, l) in lines[i..i + k].iter().enumerate() {
        let text: String = content[l.start..l.end]
            .chars()
            .take(HINT_LINE_CHARS)
            .collect();
        let _ = writeln!(out, "{:>4}|{text}", i + n + 1);
    }
    Some(out)
}

/// One line of a hunk.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HunkLine {
    Context(String),
    Remove(String),
    Add(String),
}

/// One `@@` hunk.
#[derive(Debug, Clone)]
struct Hunk {
    /// The header as written, for error messages.
    header: String,
    /// 1-based line the hunk claims to start at in the old file (0 for an
    /// empty file).
    old_start: usize,
    /// Whether `old_start` means anything: V4A hunks have no line numbers
    /// and are placed by their context after the previous hunk.
    anchored: bool,
    /// A V4A `@@ class Foo` hint: the hunk lies after the first line that
    /// contains it.
    hint: Option<String>,
    lines: Vec<HunkLine>,
    /// A `\ No newline at end of file` followed the last added line.
    new_no_newline: bool,
}

/// The changes to one file.
#[derive(Debug, Clone)]
pub struct FileDiff {
    /// The path on the `---` line (prefix `a/` removed); `None` for `/dev/null`.
    pub old_path: Option<String>,
    /// The path on the `+++` line (prefix `b/` removed); `None` for `/dev/null`.
    pub new_path: Option<String>,
    hunks: Vec<Hunk>,
    /// A V4A `*** Delete File`: the whole file goes, whatever it holds.
    whole_delete: bool,
}

impl FileDiff {
    /// The path the change applies to.
    pub fn target(&self) -> &str {
        self.new_path
            .as_deref()
            .or(self.old_path.as_deref())
            .unwrap_or("")
    }

    /// Number of hunks.
    pub fn hunk_count(&self) -> usize {
        self.hunks.len()
    }

    /// Whether the diff creates the file.
    pub fn creates(&self) -> bool {
        self.old_path.is_none()
    }

    /// Whether the diff deletes the file.
    pub fn deletes(&self) -> bool {
        self.new_path.is_none()
    }
}

fn header_path(raw: &str, prefix: &str) -> Option<String> {
    // `--- a/x.rs\t2024-01-01 …`: the timestamp follows a tab.
    let raw = raw.split('\t').next().unwrap_or(raw).trim();
    let raw = raw
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .unwrap_or(raw);
    if raw == "/dev/null" {
        return None;
    }
    Some(raw.strip_prefix(prefix).unwrap_or(raw).to_owned())
}

fn parse_hunk_header(line: &str, no: usize) -> Result<usize, String> {
    let bad = || {
        format!(
            "line {no} of the diff: bad hunk header '{line}'; expected '@@ -start,count \
             +start,count @@'"
        )
    };
    let rest = line.strip_prefix("@@").ok_or_else(bad)?.trim_start();
    let old = rest
        .strip_prefix('-')
        .and_then(|r| r.split_whitespace().next())
        .ok_or_else(bad)?;
    let start = old.split(',').next().unwrap_or(old);
    start.parse::<usize>().map_err(|_| bad())
}

/// Parses a unified diff: `---`/`+++` headers, `@@` hunks, several files.
/// Lines outside files (`diff --git`, `index …`, prose) are skipped. Hunk
/// line counts are not trusted (models miscount them): a hunk runs until the
/// next header or a line that is not part of a hunk.
pub fn parse_unified(text: &str) -> Result<Vec<FileDiff>, String> {
    let lines: Vec<&str> = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    let mut files: Vec<FileDiff> = Vec::new();
    let mut in_hunk = false;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let no = i + 1;
        if let Some(old) = line.strip_prefix("--- ")
            && let Some(new) = lines.get(i + 1).and_then(|n| n.strip_prefix("+++ "))
        {
            if files.len() >= MAX_DIFF_FILES {
                return Err(format!(
                    "the diff touches more than {MAX_DIFF_FILES} files; split it"
                ));
            }
            let file = FileDiff {
                old_path: header_path(old, "a/"),
                new_path: header_path(new, "b/"),
                hunks: Vec::new(),
                whole_delete: false,
            };
            if file.old_path.is_none() && file.new_path.is_none() {
                return Err(format!("line {no} of the diff: both paths are /dev/null"));
            }
            files.push(file);
            in_hunk = false;
            i += 2;
            continue;
        }
        if line.starts_with("@@") {
            let Some(file) = files.last_mut() else {
                return Err(format!(
                    "line {no} of the diff: a hunk before any '--- a/path' / '+++ b/path' header"
                ));
            };
            file.hunks.push(Hunk {
                header: line.to_owned(),
                old_start: parse_hunk_header(line, no)?,
                anchored: true,
                hint: None,
                lines: Vec::new(),
                new_no_newline: false,
            });
            in_hunk = true;
            i += 1;
            continue;
        }
        if in_hunk && let Some(hunk) = files.last_mut().and_then(|f| f.hunks.last_mut()) {
            let parsed = match line.chars().next() {
                Some(' ') => Some(HunkLine::Context(line[1..].to_owned())),
                Some('-') => Some(HunkLine::Remove(line[1..].to_owned())),
                Some('+') => Some(HunkLine::Add(line[1..].to_owned())),
                // Models often drop the space of an empty context line.
                None => Some(HunkLine::Context(String::new())),
                Some('\\') => {
                    if matches!(hunk.lines.last(), Some(HunkLine::Add(_))) {
                        hunk.new_no_newline = true;
                    }
                    i += 1;
                    continue;
                }
                Some(_) => None,
            };
            match parsed {
                Some(l) => hunk.lines.push(l),
                None => in_hunk = false,
            }
        }
        i += 1;
    }
    if files.is_empty() {
        return Err(
            "no '--- a/path' / '+++ b/path' file headers found; patch mode takes a unified diff"
                .into(),
        );
    }
    finish(files)
}

/// Checks parsed files: blank trailing context dropped, no empty diffs, no
/// renames.
fn finish(mut files: Vec<FileDiff>) -> Result<Vec<FileDiff>, String> {
    for file in &mut files {
        for hunk in &mut file.hunks {
            // A blank line ending a hunk is usually the blank line after the
            // diff, not context; dropping it only loosens the anchor.
            while matches!(hunk.lines.last(), Some(HunkLine::Context(c)) if c.is_empty()) {
                hunk.lines.pop();
            }
        }
        file.hunks.retain(|h| !h.lines.is_empty());
        if file.hunks.is_empty() && !file.whole_delete && !file.creates() {
            return Err(format!("the diff for {} has no hunks", file.target()));
        }
        if let (Some(old), Some(new)) = (&file.old_path, &file.new_path)
            && old != new
        {
            return Err(format!(
                "the diff renames {old} to {new}; renames are not supported (edit in place, \
                 then move the file with the terminal)"
            ));
        }
    }
    Ok(files)
}

/// Parses the `patch` argument: a V4A patch (`*** Begin Patch`, the
/// ancestor's format) or a unified diff.
pub fn parse_patch(text: &str) -> Result<Vec<FileDiff>, String> {
    if text.trim_start().starts_with("*** Begin Patch") {
        parse_v4a(text)
    } else {
        parse_unified(text)
    }
}

/// Parses a V4A patch: `*** Update File: p` with `@@ hint` sections of
/// ` `/`-`/`+` lines, `*** Add File: p` with `+` lines, `*** Delete File:
/// p`. Its hunks carry no line numbers; each is placed by its context
/// after the previous one.
fn parse_v4a(text: &str) -> Result<Vec<FileDiff>, String> {
    let mut files: Vec<FileDiff> = Vec::new();
    for (i, raw) in text.split('\n').enumerate() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let no = i + 1;
        if line.starts_with("*** Begin Patch") || line.starts_with("*** End of File") {
            continue;
        }
        if line.starts_with("*** End Patch") {
            break;
        }
        let header = |prefix: &str| line.strip_prefix(prefix).map(|p| p.trim().to_owned());
        let new_file = |old: Option<String>, new: Option<String>, whole_delete: bool| FileDiff {
            old_path: old,
            new_path: new,
            hunks: Vec::new(),
            whole_delete,
        };
        if let Some(p) = header("*** Update File:") {
            files.push(new_file(Some(p.clone()), Some(p), false));
            continue;
        }
        if let Some(p) = header("*** Add File:") {
            files.push(new_file(None, Some(p), false));
            continue;
        }
        if let Some(p) = header("*** Delete File:") {
            files.push(new_file(Some(p), None, true));
            continue;
        }
        if line.starts_with("*** Move to:") {
            return Err(format!(
                "line {no} of the patch: renames (*** Move to) are not supported; edit in \
                 place, then move the file with the terminal"
            ));
        }
        let Some(file) = files.last_mut() else {
            if line.trim().is_empty() {
                continue;
            }
            return Err(format!(
                "line {no} of the patch comes before any '*** Update File:' / '*** Add File:' \
                 line"
            ));
        };
        if file.whole_delete {
            continue;
        }
        if let Some(rest) = line.strip_prefix("@@") {
            let hint = rest.trim().trim_end_matches("@@").trim();
            file.hunks.push(Hunk {
                header: line.to_owned(),
                old_start: 0,
                anchored: file.creates(),
                hint: (!hint.is_empty()).then(|| hint.to_owned()),
                lines: Vec::new(),
                new_no_newline: false,
            });
            continue;
        }
        let parsed = match line.chars().next() {
            Some(' ') => HunkLine::Context(line[1..].to_owned()),
            Some('-') if !file.creates() => HunkLine::Remove(line[1..].to_owned()),
            Some('+') => HunkLine::Add(line[1..].to_owned()),
            None => HunkLine::Context(String::new()),
            _ => {
                return Err(format!(
                    "line {no} of the patch ('{line}') is not a context (' '), removed ('-') \
                     or added ('+') line"
                ));
            }
        };
        if file.hunks.is_empty() {
            file.hunks.push(Hunk {
                header: format!("section at line {no}"),
                old_start: 0,
                // A new file's lines go at its top.
                anchored: file.creates(),
                hint: None,
                lines: Vec::new(),
                new_no_newline: false,
            });
        }
        if let Some(hunk) = file.hunks.last_mut() {
            hunk.lines.push(parsed);
        }
    }
    if files.is_empty() {
        return Err("the patch names no file ('*** Update File: path' and the like)".into());
    }
    finish(files)
}

fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Applies one file's hunks to `original` (`None` for a file being
/// created). Each hunk is found by its context and removed lines, nearest
/// to the line its header names (shifted by where earlier hunks landed),
/// comparing exactly first and then ignoring whitespace differences.
pub fn apply_file(original: Option<&str>, diff: &FileDiff) -> Result<String, String> {
    let path = diff.target();
    if diff.whole_delete {
        return Ok(String::new());
    }
    let original = original.unwrap_or("");
    let crlf = original.contains("\r\n");
    let had_newline = original.is_empty() || original.ends_with('\n');
    let lines: Vec<&str> = split_lines(original)
        .iter()
        .map(|l| {
            let s = &original[l.start..l.end];
            s.strip_suffix('\r').unwrap_or(s)
        })
        .collect();
    let mut out: Vec<String> = Vec::with_capacity(lines.len());
    let mut pos = 0usize;
    let mut drift: isize = 0;
    let mut no_newline = false;
    for (h, hunk) in diff.hunks.iter().enumerate() {
        let old: Vec<&str> = hunk
            .lines
            .iter()
            .filter_map(|l| match l {
                HunkLine::Context(s) | HunkLine::Remove(s) => Some(s.as_str()),
                HunkLine::Add(_) => None,
            })
            .collect();
        let hinted = hunk
            .hint
            .as_deref()
            .and_then(|hint| (pos..lines.len()).find(|&i| lines[i].contains(hint.trim())));
        let expected = if hunk.anchored {
            (hunk.old_start.saturating_sub(1) as isize + drift).max(0) as usize
        } else {
            // After the hint's line when there is one, else right after
            // the previous hunk.
            hinted.map_or(pos, |i| i + 1)
        };
        let at = if !hunk.anchored && old.is_empty() {
            // Added lines with nothing to anchor them: after the hint, or
            // at the end of the file.
            hinted.map_or(lines.len(), |i| i + 1).max(pos)
        } else if old.is_empty() {
            // A pure insertion has nothing to anchor on: it goes where the
            // header says (an addition at "line 0" is the top of the file).
            let at = if hunk.old_start == 0 {
                0
            } else {
                (expected + 1).min(lines.len())
            };
            at.max(pos)
        } else {
            let from = if hunk.anchored {
                pos
            } else {
                hinted.unwrap_or(pos)
            };
            locate(&lines, &old, from, expected).ok_or_else(|| {
                let shown = lines
                    .get(expected)
                    .map(|l| format!(" (line {} is '{}')", expected + 1, l))
                    .unwrap_or_default();
                format!(
                    "hunk {} of {path} ('{}') does not apply: its context and removed lines \
                     (starting with '{}') were not found at or after line {}{shown}. Re-read \
                     the file and regenerate the diff",
                    h + 1,
                    hunk.header,
                    old[0],
                    pos + 1
                )
            })?
        };
        if hunk.anchored {
            drift = at as isize - hunk.old_start.saturating_sub(1) as isize;
        }
        out.extend(lines[pos..at].iter().map(|s| (*s).to_owned()));
        let mut k = at;
        for l in &hunk.lines {
            match l {
                HunkLine::Context(_) => {
                    // The file's own text, not the diff's whitespace.
                    out.push(lines[k].to_owned());
                    k += 1;
                }
                HunkLine::Remove(_) => k += 1,
                HunkLine::Add(s) => out.push(s.clone()),
            }
        }
        pos = k;
        no_newline = hunk.new_no_newline;
    }
    out.extend(lines[pos..].iter().map(|s| (*s).to_owned()));
    if diff.deletes() && out.iter().any(|l| !l.is_empty()) {
        return Err(format!(
            "the diff deletes {path} but its hunks do not remove all of its lines"
        ));
    }
    let eol = if crlf { "\r\n" } else { "\n" };
    let mut text = out.join(eol);
    let trailing = if diff.creates() {
        !no_newline
    } else {
        had_newline
    };
    if !out.is_empty() && trailing {
        text.push_str(eol);
    }
    Ok(text)
}

/// Where `old` sits in `lines` at or after `from`: exact comparison first,
/// then ignoring trailing whitespace, then ignoring all whitespace
/// differences; within a pass, the position nearest `expected` wins.
fn locate(lines: &[&str], old: &[&str], from: usize, expected: usize) -> Option<usize> {
    if lines.len() < old.len() || from > lines.len() - old.len() {
        return None;
    }
    let last = lines.len() - old.len();
    let expected = expected.clamp(from, last);
    type LineEq = fn(&str, &str) -> bool;
    let passes: [LineEq; 3] = [
        |a, b| a == b,
        |a, b| a.trim_end() == b.trim_end(),
        |a, b| collapse(a) == collapse(b),
    ];
    for eq in passes {
        let fits = |p: usize| {
            lines[p..p + old.len()]
                .iter()
                .zip(old)
                .all(|(a, b)| eq(a, b))
        };
        let span = (expected - from).max(last - expected);
        for d in 0..=span {
            if let Some(p) = expected.checked_sub(d).filter(|p| *p >= from)
                && fits(p)
            {
                return Some(p);
            }
            if d > 0 && expected + d <= last && fits(expected + d) {
                return Some(expected + d);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reindent_shifts_both_ways() {
        assert_eq!(reindent("a\n  b", "", "    "), "    a\n      b");
        assert_eq!(reindent("    a\n      b", "    ", ""), "a\n  b");
        assert_eq!(reindent("  a\nb", "  ", "\t"), "\ta\nb");
    }

    #[test]
    fn collapsed_match_maps_back_to_the_original_bytes() {
        let r = fuzzy_replace("let  x =\n   1;\n", "let x = 1;", "let y = 2;", false, "f").unwrap();
        assert_eq!(r.strategy, Strategy::WhitespaceCollapsed);
        assert_eq!(r.text, "let y = 2;\n");
    }

    #[test]
    fn v4a_patches_are_placed_by_context_and_hint() {
        let patch = "*** Begin Patch\n*** Update File: f.py\n@@ def b\n     x = 1\n-    return x\n+    return x + 1\n*** Add File: g.txt\n+hi\n*** End Patch\n";
        let files = parse_patch(patch).unwrap();
        assert_eq!(files.len(), 2);
        let src = "def a():\n    x = 1\n    return x\ndef b():\n    x = 1\n    return x\n";
        let out = apply_file(Some(src), &files[0]).unwrap();
        assert_eq!(
            out,
            "def a():\n    x = 1\n    return x\ndef b():\n    x = 1\n    return x + 1\n"
        );
        assert_eq!(apply_file(None, &files[1]).unwrap(), "hi\n");
    }

    #[test]
    fn hunks_tolerate_offsets_and_blank_context() {
        let diff = "--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n\n";
        let files = parse_unified(diff).unwrap();
        let out = apply_file(Some("x\ny\na\nb\nc\n"), &files[0]).unwrap();
        assert_eq!(out, "x\ny\na\nB\nc\n");
    }
}
