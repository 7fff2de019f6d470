//! The agent's Markdown as Mattermost shows it.
//!
//! Mattermost renders Markdown itself (tables, task lists, fenced code
//! with languages included), so the text is kept as it is except where
//! Mattermost differs:
//!
//! - raw HTML is shown literally, so the few tags models like to emit
//!   (`<br>`, `<b>`, `<strong>`, `<i>`, `<em>`, `<code>`) become their
//!   Markdown equivalents;
//! - `@channel`, `@all` and `@here` notify everyone in a channel, so a
//!   zero-width space after the `@` keeps an answer that quotes them from
//!   paging a whole team.
//!
//! Nothing inside code (fenced blocks or backtick spans) is touched.

/// Inserted after `@` in team-wide mentions.
const ZERO_WIDTH_SPACE: char = '\u{200B}';

/// The mentions that notify a whole channel.
const BROADCAST_MENTIONS: &[&str] = &["channel", "all", "here"];

/// Converts `text` to what Mattermost should be sent.
pub(crate) fn to_mattermost(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut fence: Option<String> = None;
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let trimmed = line.trim_start();
        match &fence {
            Some(marker) => {
                if trimmed.starts_with(marker.as_str()) && trimmed[marker.len()..].trim().is_empty()
                {
                    fence = None;
                }
                out.push_str(line);
            }
            None => {
                if let Some(marker) = fence_marker(trimmed) {
                    fence = Some(marker);
                    out.push_str(line);
                } else {
                    out.push_str(&inline(line));
                }
            }
        }
    }
    out
}

/// The run of backticks or tildes that opens a fence on this line.
fn fence_marker(line: &str) -> Option<String> {
    for ch in ['`', '~'] {
        let n = line.chars().take_while(|c| *c == ch).count();
        if n >= 3 {
            return Some(std::iter::repeat_n(ch, n).collect());
        }
    }
    None
}

/// One line outside fences: code spans kept, the rest adjusted.
fn inline(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while !rest.is_empty() {
        let Some(start) = rest.find('`') else {
            out.push_str(&prose(rest));
            break;
        };
        out.push_str(&prose(&rest[..start]));
        let ticks = rest[start..].chars().take_while(|c| *c == '`').count();
        let opener = &rest[start..start + ticks];
        let after = &rest[start + ticks..];
        // A code span closes with the same number of backticks.
        match find_closing(after, ticks) {
            Some(end) => {
                out.push_str(opener);
                out.push_str(&after[..end + ticks]);
                rest = &after[end + ticks..];
            }
            None => {
                out.push_str(opener);
                rest = after;
            }
        }
    }
    out
}

fn find_closing(text: &str, ticks: usize) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = text[from..].find('`') {
        let at = from + i;
        let run = text[at..].chars().take_while(|c| *c == '`').count();
        if run == ticks {
            return Some(at);
        }
        from = at + run;
    }
    None
}

/// Text outside code: HTML tags to Markdown, broadcast mentions defused.
fn prose(text: &str) -> String {
    let mut s = text.to_owned();
    for (tags, md) in [
        (&["<br>", "<br/>", "<br />"][..], "\n"),
        (&["<b>", "</b>", "<strong>", "</strong>"][..], "**"),
        (&["<i>", "</i>", "<em>", "</em>"][..], "*"),
        (&["<code>", "</code>"][..], "`"),
    ] {
        for tag in tags {
            s = replace_ignore_case(&s, tag, md);
        }
    }
    defuse_broadcasts(&s)
}

fn replace_ignore_case(text: &str, needle: &str, with: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (i, _) in lower.match_indices(needle) {
        if i < at {
            continue;
        }
        out.push_str(&text[at..i]);
        out.push_str(with);
        at = i + needle.len();
    }
    out.push_str(&text[at..]);
    out
}

fn defuse_broadcasts(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let word = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    let mut prev: Option<char> = None;
    for (i, c) in text.char_indices() {
        out.push(c);
        if c == '@' && prev.is_none_or(|p| !word(p)) {
            let rest = &text[i + 1..];
            let name: String = rest.chars().take_while(|c| word(*c)).collect();
            let name = name.trim_end_matches('.');
            if BROADCAST_MENTIONS
                .iter()
                .any(|m| m.eq_ignore_ascii_case(name))
            {
                out.push(ZERO_WIDTH_SPACE);
            }
        }
        prev = Some(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_is_kept() {
        let md = "# Title\n\n**bold** _it_ [link](https://x.y)\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n- [ ] task";
        assert_eq!(to_mattermost(md), md);
    }

    #[test]
    fn html_becomes_markdown_outside_code() {
        assert_eq!(
            to_mattermost("a<br>b <B>bold</B> <em>it</em> <code>x</code>"),
            "a\nb **bold** *it* `x`"
        );
        assert_eq!(to_mattermost("`<br>` stays"), "`<br>` stays");
        assert_eq!(
            to_mattermost("```html\n<b>kept</b>\n```\n<b>x</b>"),
            "```html\n<b>kept</b>\n```\n**x**"
        );
        // Other HTML is shown as text by Mattermost, as it should be.
        assert_eq!(to_mattermost("<script>x</script>"), "<script>x</script>");
    }

    #[test]
    fn broadcast_mentions_are_defused() {
        let z = ZERO_WIDTH_SPACE;
        assert_eq!(
            to_mattermost("ping @channel and @ALL, @here."),
            format!("ping @{z}channel and @{z}ALL, @{z}here.")
        );
        assert_eq!(
            to_mattermost("@alice @channels a@all"),
            "@alice @channels a@all"
        );
        assert_eq!(to_mattermost("`@channel`"), "`@channel`");
        assert_eq!(
            to_mattermost("~~~\n@here\n~~~\n@here"),
            format!("~~~\n@here\n~~~\n@{z}here")
        );
    }

    #[test]
    fn a_split_chunk_with_an_unclosed_or_reopened_fence_is_untouched_inside() {
        assert_eq!(to_mattermost("```py\n# @all <b>\n"), "```py\n# @all <b>\n");
        assert_eq!(to_mattermost("``a `b` c``"), "``a `b` c``");
        assert_eq!(to_mattermost("x ` <b>y</b>"), "x ` **y**");
    }
}
