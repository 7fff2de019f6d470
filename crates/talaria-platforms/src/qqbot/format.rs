//! The agent's Markdown as QQ shows it.
//!
//! With the Markdown permission (`markdown_support`), C2C and group
//! answers go out as `msg_type: 2` and QQ renders the common subset
//! (headings, emphasis, lists, quotes, links) itself, so the text is sent
//! as written. Without it, and in guild channels, QQ shows text as typed:
//! [`to_plain`] takes the markers out so the reader sees words, not
//! asterisks. Code is left alone in both.

/// `text` as plain text: emphasis markers, heading hashes and fence lines
/// removed, `[label](url)` written as `label (url)`. Inside code fences
/// nothing changes but the fence lines themselves.
pub(crate) fn to_plain(text: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut in_fence = false;
    for line in text.split('\n') {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            out.push(line.to_owned());
            continue;
        }
        let trimmed = line.trim_start();
        let hashes = trimmed.chars().take_while(|c| *c == '#').count();
        let line = if (1..=6).contains(&hashes) && trimmed[hashes..].starts_with(' ') {
            trimmed[hashes..].trim().to_owned()
        } else {
            line.to_owned()
        };
        out.push(inline_plain(&line));
    }
    out.join("\n")
}

/// One line without `**`, `__`, `~~`, inline backticks and link syntax.
fn inline_plain(line: &str) -> String {
    let mut s = line.replace("**", "").replace("__", "").replace("~~", "");
    s = s.replace('`', "");
    let mut out = String::with_capacity(s.len());
    let mut rest = s.as_str();
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        let link = after.find("](").and_then(|close| {
            let url_part = &after[close + 2..];
            url_part
                .find(')')
                .map(|end| (&after[..close], &url_part[..end], close + 2 + end + 1))
        });
        match link {
            Some((label, url, used)) if !label.contains('[') => {
                out.push_str(&rest[..open]);
                if label == url || label.is_empty() {
                    out.push_str(url);
                } else {
                    out.push_str(&format!("{label} ({url})"));
                }
                rest = &after[used..];
            }
            _ => {
                out.push_str(&rest[..=open]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_go_words_stay() {
        assert_eq!(
            to_plain("## Title\n**bold** and `code`"),
            "Title\nbold and code"
        );
        assert_eq!(
            to_plain("see [the docs](https://x.example/a) now"),
            "see the docs (https://x.example/a) now"
        );
        assert_eq!(to_plain("[a] b [c"), "[a] b [c");
        assert_eq!(to_plain("```rust\nlet **x** = 1;\n```"), "let **x** = 1;");
        assert_eq!(to_plain("plain text."), "plain text.");
        assert_eq!(to_plain("#hashtag"), "#hashtag");
    }
}
