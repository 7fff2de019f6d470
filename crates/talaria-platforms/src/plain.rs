//! Markdown to plain text, for the platforms that show none (Signal, IRC).
//!
//! Signal renders no Markdown (and the REST API's `text_mode: styled` has
//! its own syntax, single `*` for italic and `||` for spoilers, that model
//! output would trip over); IRC shows text as sent. So answers go out as
//! plain text: markup that only decorates is removed, structure that reads
//! well as text stays.
//!
//! - fenced code blocks lose their fence lines; their content is kept
//!   byte for byte (no markup is touched inside);
//! - `# Heading` loses its hashes;
//! - list bullets `-`, `*`, `+` become `•`;
//! - `**bold**`, `__bold__`, `*italic*` and `~~strike~~` lose their
//!   markers, `` `code` `` its backticks;
//! - `[text](url)` becomes `text (url)`, or just `url` when both are the
//!   same.
//!
//! Nothing here makes a text longer, so a part the gateway cut to the
//! limit still fits.

/// `markdown` as plain text (see the module docs).
pub(crate) fn to_plain(markdown: &str) -> String {
    let mut out = String::with_capacity(markdown.len());
    let mut in_fence: Option<String> = None;
    for (i, line) in markdown.split('\n').enumerate() {
        let trimmed = line.trim_start();
        if let Some(fence) = &in_fence {
            if trimmed.starts_with(fence.as_str()) && trimmed.trim_end() == fence.as_str() {
                in_fence = None;
                continue;
            }
            push_line(&mut out, i, line);
            continue;
        }
        if let Some(fence) = fence_of(trimmed) {
            in_fence = Some(fence);
            continue;
        }
        push_line(&mut out, i, &plain_line(line));
    }
    // A dropped fence line at the very start leaves a leading newline.
    out.trim_matches('\n').to_owned()
}

fn push_line(out: &mut String, i: usize, line: &str) {
    if i > 0 {
        out.push('\n');
    }
    out.push_str(line);
}

/// The fence a line opens (three or more backticks or tildes), if any.
fn fence_of(trimmed: &str) -> Option<String> {
    for mark in ['`', '~'] {
        let n = trimmed.chars().take_while(|c| *c == mark).count();
        if n >= 3 {
            return Some(std::iter::repeat_n(mark, n).collect());
        }
    }
    None
}

fn plain_line(line: &str) -> String {
    let indent_len = line.len() - line.trim_start().len();
    let (indent, rest) = line.split_at(indent_len);
    let mut body = rest;
    let mut prefix = String::new();
    // Headings: one to six hashes and a space.
    let hashes = body.chars().take_while(|c| *c == '#').count();
    if (1..=6).contains(&hashes) && body[hashes..].starts_with(' ') {
        body = body[hashes..].trim_start();
    } else if let Some(rest) = ["- ", "* ", "+ "].iter().find_map(|b| body.strip_prefix(b)) {
        prefix.push_str("• ");
        body = rest;
    }
    format!("{indent}{prefix}{}", inline(body))
}

/// Emphasis markers, longest first so `**` is not read as two `*`.
const MARKERS: [&[char]; 4] = [&['*', '*'], &['_', '_'], &['~', '~'], &['*']];

/// Inline markup of one line, outside code spans.
fn inline(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    'scan: while i < chars.len() {
        let c = chars[i];
        if c == '`'
            && let Some(end) = find(&chars, i + 1, &['`'])
        {
            out.extend(&chars[i + 1..end]);
            i = end + 1;
            continue;
        }
        if c == '['
            && let Some((label, url, next)) = link(&chars, i)
        {
            if label == url {
                out.push_str(&url);
            } else {
                out.push_str(&format!("{} ({url})", inline(&label)));
            }
            i = next;
            continue;
        }
        for marker in MARKERS {
            if chars[i..].starts_with(marker)
                && let Some(end) = closing(&chars, i + marker.len(), marker)
            {
                let inner: String = chars[i + marker.len()..end].iter().collect();
                out.push_str(&inline(&inner));
                i = end + marker.len();
                continue 'scan;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

/// The index of the next character in `set` from `from`.
fn find(chars: &[char], from: usize, set: &[char]) -> Option<usize> {
    (from..chars.len()).find(|j| set.contains(&chars[*j]))
}

/// Where the emphasis opened at `from` (inner text starts there) closes:
/// the inner text is not empty and neither starts nor ends with a space,
/// and a single `*` is not a `**`.
fn closing(chars: &[char], from: usize, marker: &[char]) -> Option<usize> {
    if from >= chars.len() || chars[from].is_whitespace() {
        return None;
    }
    let mut j = from + 1;
    while j + marker.len() <= chars.len() {
        if chars[j..].starts_with(marker) && !chars[j - 1].is_whitespace() {
            let doubled = marker.len() == 1 && chars.get(j + 1) == Some(&marker[0]);
            if !doubled {
                return Some(j);
            }
            j += 2;
            continue;
        }
        j += 1;
    }
    None
}

/// `[label](url)` at `at`: the label, the URL and the index after it.
fn link(chars: &[char], at: usize) -> Option<(String, String, usize)> {
    let close = find(chars, at + 1, &[']'])?;
    if chars.get(close + 1) != Some(&'(') {
        return None;
    }
    let end = find(chars, close + 2, &[')'])?;
    let label: String = chars[at + 1..close].iter().collect();
    let url: String = chars[close + 2..end].iter().collect();
    if url.is_empty() || url.contains(char::is_whitespace) {
        return None;
    }
    Some((label, url, end + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoration_goes_and_structure_stays() {
        assert_eq!(
            to_plain("# Title\n\nSome **bold** text"),
            "Title\n\nSome bold text"
        );
        assert_eq!(
            to_plain("- one\n- two\n  * nested"),
            "• one\n• two\n  • nested"
        );
        assert_eq!(to_plain("*it* and __b__ and ~~gone~~"), "it and b and gone");
        assert_eq!(to_plain("run `ls -l` now"), "run ls -l now");
        assert_eq!(
            to_plain("see [the docs](https://x.org/a) or [https://y.org](https://y.org)"),
            "see the docs (https://x.org/a) or https://y.org"
        );
    }

    #[test]
    fn code_blocks_keep_their_content_verbatim() {
        let md = "Here:\n```rust\nlet a = *b * 2; // **not bold**\n```\nDone.";
        assert_eq!(
            to_plain(md),
            "Here:\nlet a = *b * 2; // **not bold**\nDone."
        );
    }

    #[test]
    fn lone_markers_and_snake_case_survive() {
        assert_eq!(to_plain("2 * 3 * 4"), "2 * 3 * 4");
        assert_eq!(to_plain("snake_case_name"), "snake_case_name");
        assert_eq!(to_plain("a ** b"), "a ** b");
        assert_eq!(to_plain("[not a link] (x)"), "[not a link] (x)");
        assert_eq!(to_plain("unclosed `tick"), "unclosed `tick");
    }

    #[test]
    fn nothing_gets_longer() {
        for md in [
            "**a** [b](c) `d` # e",
            "- x\n+ y\n* z",
            "```\ncode\n```",
            "[same](same)",
            "plain",
        ] {
            assert!(to_plain(md).chars().count() <= md.chars().count(), "{md}");
        }
    }
}
