//! The agent's Markdown to Slack mrkdwn, and Slack's inbound escaping back
//! to plain text.
//!
//! mrkdwn has single-character markers (`*bold*`, `_italic_`, `~strike~`),
//! `<url|label>` links and no headings; `&`, `<` and `>` must be sent as
//! entities everywhere, code included, or Slack may read them as the start
//! of a link or mention. Code spans and fences keep their content as is
//! (escaped only); markup Slack does not have is left literal.

use crate::entities::{escape, push_escaped};

/// Converts Markdown `text` to mrkdwn.
pub(crate) fn to_mrkdwn(text: &str) -> String {
    let lines: Vec<&str> = text.split('\n').collect();
    let mut out: Vec<String> = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.trim_start().starts_with("```") {
            let end = lines[i + 1..]
                .iter()
                .position(|l| l.trim() == "```")
                .map(|p| i + 1 + p);
            let body_end = end.unwrap_or(lines.len());
            let mut code = lines[i + 1..body_end].join("\n");
            // A split answer closes its chunk's fence after a kept line
            // break; the blank line is noise.
            while code.ends_with('\n') {
                code.pop();
            }
            // Slack shows no language tag: it would read as code.
            out.push(format!("```\n{}\n```", escape(&code)));
            i = end.map_or(lines.len(), |e| e + 1);
        } else {
            out.push(block_line(line));
            i += 1;
        }
    }
    out.join("\n")
}

/// One line outside a fence: headings, bullets and quotes, then inline.
fn block_line(line: &str) -> String {
    let trimmed = line.trim_start();
    let indent = &line[..line.len() - trimmed.len()];
    let hashes = trimmed.chars().take_while(|c| *c == '#').count();
    if (1..=6).contains(&hashes)
        && let Some(title) = trimmed[hashes..].strip_prefix(' ')
    {
        let title = title.trim().trim_end_matches('#').trim_end();
        // Bold markers inside a heading would close the heading's own.
        let inner = inline(title).replace('*', "");
        return if inner.is_empty() {
            String::new()
        } else {
            format!("*{inner}*")
        };
    }
    for bullet in ["- ", "* ", "+ "] {
        if let Some(item) = trimmed.strip_prefix(bullet) {
            return format!("{indent}• {}", inline(item));
        }
    }
    if let Some(quoted) = trimmed.strip_prefix('>') {
        // Slack's own quote marker: the one `>` that is not escaped.
        return format!(">{}", inline(quoted));
    }
    inline(line)
}

/// Inline markup within one line.
fn inline(line: &str) -> String {
    let mut out = String::with_capacity(line.len() + 8);
    let mut rest = line;
    let mut prev: Option<char> = None;
    while let Some(c) = rest.chars().next() {
        if let Some((converted, used)) = markup(rest, prev) {
            out.push_str(&converted);
            prev = rest[..used].chars().next_back();
            rest = &rest[used..];
            continue;
        }
        push_escaped(&mut out, c);
        prev = Some(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// The markup starting `rest`, converted, and the bytes it used.
fn markup(rest: &str, prev: Option<char>) -> Option<(String, usize)> {
    if let Some(after) = rest.strip_prefix('`') {
        let end = after.find('`')?;
        if end == 0 {
            return None;
        }
        return Some((format!("`{}`", escape(&after[..end])), end + 2));
    }
    for (open, to) in [("**", "*"), ("__", "*"), ("~~", "~")] {
        if let Some(after) = rest.strip_prefix(open) {
            let end = after.find(open)?;
            let inner = &after[..end];
            if !tight(inner) {
                return None;
            }
            return Some((format!("{to}{}{to}", inline(inner)), end + 2 * open.len()));
        }
    }
    for marker in ['*', '_'] {
        if let Some(after) = rest.strip_prefix(marker) {
            // `snake_case` and `2*3*4` are not emphasis.
            if prev.is_some_and(char::is_alphanumeric) {
                return None;
            }
            let end = after.find(marker)?;
            let inner = &after[..end];
            let next = after[end + 1..].chars().next();
            if !tight(inner) || next.is_some_and(|c| c.is_alphanumeric() || c == marker) {
                return None;
            }
            return Some((format!("_{}_", inline(inner)), end + 2));
        }
    }
    if rest.starts_with('[') {
        return link(rest);
    }
    if let Some(after) = rest.strip_prefix('<') {
        // A Markdown autolink, which is already Slack's form.
        let end = after.find('>')?;
        let url = &after[..end];
        if is_url(url) && !url.contains(char::is_whitespace) {
            return Some((format!("<{}>", url_text(url)), end + 2));
        }
    }
    None
}

/// `[label](url)` as `<url|label>`.
fn link(rest: &str) -> Option<(String, usize)> {
    let close = rest.find("](")?;
    let label = &rest[1..close];
    if label.is_empty() || label.contains('[') {
        return None;
    }
    let after = &rest[close + 2..];
    let end = after.find(')')?;
    let url = after[..end].trim();
    if !is_url(url) || url.contains(char::is_whitespace) {
        return None;
    }
    // The label cannot hold markup inside a link; `|` would end the URL.
    let label = escape(label).replace('|', "¦");
    Some((format!("<{}|{label}>", url_text(url)), close + 2 + end + 1))
}

fn is_url(url: &str) -> bool {
    ["http://", "https://", "mailto:"]
        .iter()
        .any(|p| url.len() > p.len() && url.to_ascii_lowercase().starts_with(p))
}

/// A URL inside `<...>`: the characters that would end it percent-encoded,
/// `&` as the entity Slack decodes.
fn url_text(url: &str) -> String {
    url.replace('&', "&amp;")
        .replace('|', "%7C")
        .replace('<', "%3C")
        .replace('>', "%3E")
}

fn tight(inner: &str) -> bool {
    !inner.is_empty()
        && !inner.starts_with(char::is_whitespace)
        && !inner.ends_with(char::is_whitespace)
}

/// Inbound text as the user typed it: Slack's three entities decoded.
/// Mentions and links (`<@U1>`, `<https://x|x>`) are left as they are.
pub(crate) fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emphasis_becomes_single_markers() {
        assert_eq!(to_mrkdwn("a **bold** b"), "a *bold* b");
        assert_eq!(to_mrkdwn("a __bold__ b"), "a *bold* b");
        assert_eq!(
            to_mrkdwn("an *italic* and _this_"),
            "an _italic_ and _this_"
        );
        assert_eq!(to_mrkdwn("~~gone~~"), "~gone~");
        assert_eq!(to_mrkdwn("**bold _and italic_**"), "*bold _and italic_*");
    }

    #[test]
    fn things_that_only_look_like_emphasis_stay_literal() {
        assert_eq!(to_mrkdwn("snake_case_name"), "snake_case_name");
        assert_eq!(to_mrkdwn("2 * 3 * 4"), "2 * 3 * 4");
        assert_eq!(to_mrkdwn("2*3*4"), "2*3*4");
        assert_eq!(to_mrkdwn("** not bold **"), "** not bold **");
        assert_eq!(to_mrkdwn("a `b"), "a `b");
    }

    #[test]
    fn links_become_slack_links() {
        assert_eq!(
            to_mrkdwn("see [the docs](https://example.com/a?b=1&c=2)"),
            "see <https://example.com/a?b=1&amp;c=2|the docs>"
        );
        assert_eq!(to_mrkdwn("<https://example.com>"), "<https://example.com>");
        // Not a URL scheme Slack links: kept as text, escaped.
        assert_eq!(
            to_mrkdwn("[x](javascript:alert(1))"),
            "[x](javascript:alert(1))"
        );
        assert_eq!(to_mrkdwn("[a|b](https://x.y)"), "<https://x.y|a¦b>");
    }

    #[test]
    fn headings_become_bold_lines_and_bullets_become_dots() {
        assert_eq!(to_mrkdwn("# Title"), "*Title*");
        assert_eq!(to_mrkdwn("### A **strong** word ###"), "*A strong word*");
        assert_eq!(to_mrkdwn("#hashtag"), "#hashtag");
        assert_eq!(to_mrkdwn("- one\n  * two"), "• one\n  • two");
        assert_eq!(to_mrkdwn("> quoted <b>"), "> quoted &lt;b&gt;");
    }

    #[test]
    fn text_is_escaped_but_generated_links_are_not() {
        assert_eq!(
            to_mrkdwn("a < b && c > d <@U123>"),
            "a &lt; b &amp;&amp; c &gt; d &lt;@U123&gt;"
        );
        assert_eq!(to_mrkdwn("AT&T"), "AT&amp;T");
    }

    #[test]
    fn code_is_kept_as_is_apart_from_escaping() {
        assert_eq!(
            to_mrkdwn("run `a **b** <c>` now"),
            "run `a **b** &lt;c&gt;` now"
        );
        assert_eq!(
            to_mrkdwn("Run:\n```rust\nif a < b { **x** }\n```\ndone *ok*"),
            "Run:\n```\nif a &lt; b { **x** }\n```\ndone _ok_"
        );
        // Unclosed fences run to the end; a split chunk's blank line goes.
        assert_eq!(
            to_mrkdwn("```\n# not a heading"),
            "```\n# not a heading\n```"
        );
        assert_eq!(to_mrkdwn("```py\nx = 1\n\n```"), "```\nx = 1\n```");
    }

    #[test]
    fn inbound_entities_are_decoded() {
        assert_eq!(unescape("a &lt;b&gt; &amp;amp;"), "a <b> &amp;");
    }
}
