//! Markdown-ish answer text to Telegram HTML.
//!
//! Only a conservative subset is converted: fenced code blocks, inline
//! code and `**bold**`. Everything else is escaped, so the worst a model's
//! odd markup can do is show up literally.

use crate::entities::{escape, push_escaped};

/// Converts `text` to Telegram HTML (`parse_mode: "HTML"`).
pub(crate) fn to_html(text: &str) -> String {
    let lines: Vec<&str> = text.split('\n').collect();
    let mut out: Vec<String> = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if let Some(info) = fence_open(line) {
            let end = lines[i + 1..]
                .iter()
                .position(|l| l.trim_end() == "```")
                .map(|p| i + 1 + p);
            let body_end = end.unwrap_or(lines.len());
            let mut code = lines[i + 1..body_end].join("\n");
            // A split answer closes its chunk's fence after a kept line
            // break; a trailing blank line in the block is noise.
            while code.ends_with('\n') {
                code.pop();
            }
            out.push(code_block(info, &code));
            i = end.map_or(lines.len(), |e| e + 1);
        } else {
            out.push(inline(line));
            i += 1;
        }
    }
    out.join("\n")
}

/// The info string when `line` opens a fence.
fn fence_open(line: &str) -> Option<&str> {
    let info = line.strip_prefix("```")?.trim();
    (!info.contains('`')).then_some(info)
}

fn code_block(info: &str, code: &str) -> String {
    // The language lands in an attribute: keep only characters that cannot
    // end it or start markup.
    let lang: String = info
        .split_whitespace()
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+' | '#' | '.'))
        .collect();
    if lang.is_empty() {
        format!("<pre>{}</pre>", escape(code))
    } else {
        format!(
            "<pre><code class=\"language-{lang}\">{}</code></pre>",
            escape(code)
        )
    }
}

/// Inline code and bold within one line; everything else escaped.
fn inline(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('`')
            && let Some(end) = after.find('`')
            && end > 0
        {
            out.push_str("<code>");
            out.push_str(&escape(&after[..end]));
            out.push_str("</code>");
            rest = &after[end + 1..];
            continue;
        }
        if let Some(after) = rest.strip_prefix("**")
            && let Some(end) = after.find("**")
        {
            let inner = &after[..end];
            let tight = !inner.is_empty()
                && !inner.starts_with(char::is_whitespace)
                && !inner.ends_with(char::is_whitespace);
            if tight {
                out.push_str("<b>");
                out.push_str(&inline(inner));
                out.push_str("</b>");
                rest = &after[end + 2..];
                continue;
            }
        }
        let mut chars = rest.chars();
        if let Some(c) = chars.next() {
            push_escaped(&mut out, c);
        }
        rest = chars.as_str();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_everything_outside_markup() {
        assert_eq!(
            to_html("<script>alert(1)</script> & a > b"),
            "&lt;script&gt;alert(1)&lt;/script&gt; &amp; a &gt; b"
        );
        assert_eq!(to_html("AT&T"), "AT&amp;T");
    }

    #[test]
    fn converts_the_subset() {
        assert_eq!(
            to_html("say **hi** with `a<b`"),
            "say <b>hi</b> with <code>a&lt;b</code>"
        );
        assert_eq!(to_html("**bold `code`**"), "<b>bold <code>code</code></b>");
        assert_eq!(to_html("** not bold **"), "** not bold **");
        assert_eq!(to_html("a `b"), "a `b");
        assert_eq!(to_html("2 * 3 ** 4"), "2 * 3 ** 4");
    }

    #[test]
    fn fences_become_pre() {
        assert_eq!(
            to_html("Run:\n```rust\nif a < b { x && y }\n```\ndone"),
            "Run:\n<pre><code class=\"language-rust\">if a &lt; b { x &amp;&amp; y }</code></pre>\ndone"
        );
        assert_eq!(to_html("```\n**x**\n```"), "<pre>**x**</pre>");
        // Unclosed fences run to the end; hostile info strings are defused.
        assert_eq!(
            to_html("```\"><b onclick=x\ncode"),
            "<pre><code class=\"language-b\">code</code></pre>"
        );
        // A split chunk's fence: kept line break before the added close.
        assert_eq!(
            to_html("```py\nx = 1\n\n```"),
            "<pre><code class=\"language-py\">x = 1</code></pre>"
        );
    }
}
