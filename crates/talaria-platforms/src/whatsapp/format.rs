//! Markdown, as models write it, to WhatsApp's own formatting.
//!
//! WhatsApp knows `*bold*`, `_italic_`, `~strike~`, `` `code` `` and
//! ```` ``` ```` blocks, and `- ` or `* ` lists; it has no headings, no
//! links with text and no escaping. So `**b**`/`__b__` become `*b*`, `*i*`
//! becomes `_i_`, `~~s~~` becomes `~s~`, headings become bold lines,
//! `[text](url)` becomes `text (url)` and `* item` becomes `- item` (so it
//! cannot be read as emphasis). Code, inline or fenced, is left as it is.
//! Nothing here makes a text longer than the Markdown it came from, except
//! a heading that held bold markers (which are dropped instead).

/// Converts Markdown to WhatsApp formatting (see the module docs).
pub(crate) fn to_whatsapp(markdown: &str) -> String {
    let mut out = String::with_capacity(markdown.len());
    let mut in_fence = false;
    for (i, line) in markdown.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            out.push_str(line);
            continue;
        }
        if in_fence {
            out.push_str(line);
            continue;
        }
        out.push_str(&convert_line(line));
    }
    out
}

fn convert_line(line: &str) -> String {
    let indent_len = line.len() - line.trim_start().len();
    let (indent, rest) = line.split_at(indent_len);
    if let Some(title) = heading(rest) {
        // Bold inside a heading would close the heading's own bold early.
        let plain = inline(title).replace('*', "");
        let plain = plain.trim();
        if plain.is_empty() {
            return String::new();
        }
        return format!("{indent}*{plain}*");
    }
    if let Some(item) = rest.strip_prefix("* ") {
        return format!("{indent}- {}", inline(item));
    }
    format!("{indent}{}", inline(rest))
}

/// The text of an ATX heading (`# Title` to `###### Title`).
fn heading(line: &str) -> Option<&str> {
    let hashes = line.chars().take_while(|c| *c == '#').count();
    if !(1..=6).contains(&hashes) {
        return None;
    }
    let rest = &line[hashes..];
    if rest.is_empty() {
        return Some("");
    }
    rest.strip_prefix(' ')
        .map(|t| t.trim().trim_end_matches('#').trim_end())
}

/// Inline spans of one line.
fn inline(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        // Inline code: copied verbatim up to its closing backtick.
        if c == '`'
            && let Some(end) = find(&chars, i + 1, "`")
        {
            out.extend(&chars[i..=end]);
            i = end + 1;
            continue;
        }
        if let Some((with, end)) = paired(&chars, i) {
            let inner: String = chars[i + 2..end].iter().collect();
            out.push(with);
            out.push_str(&inline(&inner));
            out.push(with);
            i = end + 2;
            continue;
        }
        // Single `*italic*` (Markdown) is `_italic_` in WhatsApp.
        if c == '*'
            && !starts(&chars, i, "**")
            && chars.get(i + 1).is_some_and(|n| !n.is_whitespace())
            && let Some(end) = closing(&chars, i + 1, "*")
        {
            let inner: String = chars[i + 1..end].iter().collect();
            out.push('_');
            out.push_str(&inline(&inner));
            out.push('_');
            i = end + 1;
            continue;
        }
        if c == '['
            && let Some((label, url, end)) = link(&chars, i)
        {
            let label = inline(&label);
            if label.trim().is_empty() || label == url {
                out.push_str(&url);
            } else {
                out.push_str(&format!("{label} ({url})"));
            }
            i = end + 1;
            continue;
        }
        out.push(c);
        i += 1;
    }
    out
}

/// A `**b**`, `__b__` or `~~s~~` span at `at`: WhatsApp's marker for it
/// and the index of its closing pair.
fn paired(chars: &[char], at: usize) -> Option<(char, usize)> {
    [("**", '*'), ("__", '*'), ("~~", '~')]
        .into_iter()
        .filter(|(open, _)| starts(chars, at, open))
        .find_map(|(open, with)| {
            let after = chars.get(at + 2)?;
            if after.is_whitespace() {
                return None;
            }
            closing(chars, at + 2, open).map(|end| (with, end))
        })
}

fn starts(chars: &[char], at: usize, pat: &str) -> bool {
    pat.chars()
        .enumerate()
        .all(|(k, p)| chars.get(at + k) == Some(&p))
}

/// The index of the next `pat` at or after `from`.
fn find(chars: &[char], from: usize, pat: &str) -> Option<usize> {
    (from..chars.len()).find(|&k| starts(chars, k, pat))
}

/// The closing `pat` of a span whose content starts at `from`: not empty,
/// and not preceded by whitespace (Markdown's rule for a closing run).
fn closing(chars: &[char], from: usize, pat: &str) -> Option<usize> {
    let mut k = from;
    while let Some(end) = find(chars, k, pat) {
        if end > from && !chars[end - 1].is_whitespace() {
            // `**` inside a single-`*` span would be read as its close.
            if pat == "*" && starts(chars, end, "**") {
                k = end + 2;
                continue;
            }
            return Some(end);
        }
        k = end + pat.chars().count();
    }
    None
}

/// `[label](url)` at `at`: the label, the url and the index of `)`.
fn link(chars: &[char], at: usize) -> Option<(String, String, usize)> {
    let close = find(chars, at + 1, "](")?;
    let end = find(chars, close + 2, ")")?;
    let label: String = chars[at + 1..close].iter().collect();
    let url: String = chars[close + 2..end].iter().collect();
    if label.contains('[') || url.is_empty() || url.contains(char::is_whitespace) {
        return None;
    }
    Some((label, url, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_becomes_whatsapp() {
        let cases = [
            ("plain text", "plain text"),
            ("**bold** and __bold__", "*bold* and *bold*"),
            ("*italic* and _italic_", "_italic_ and _italic_"),
            ("~~gone~~", "~gone~"),
            (
                "**bold with *italic* inside**",
                "*bold with _italic_ inside*",
            ),
            ("# Title", "*Title*"),
            ("### A **strong** heading ###", "*A strong heading*"),
            ("#hashtag stays", "#hashtag stays"),
            (
                "see [the docs](https://example.org/a)",
                "see the docs (https://example.org/a)",
            ),
            ("[https://x.org](https://x.org)", "https://x.org"),
            ("* one\n* two", "- one\n- two"),
            ("  * nested", "  - nested"),
            ("- dash stays", "- dash stays"),
            ("`**not bold**` here", "`**not bold**` here"),
            ("2 * 3 * 4", "2 * 3 * 4"),
            ("a ** b", "a ** b"),
            ("unclosed **bold", "unclosed **bold"),
            ("[not a link] (x)", "[not a link] (x)"),
            ("snake_case_name", "snake_case_name"),
        ];
        for (md, want) in cases {
            assert_eq!(to_whatsapp(md), want, "{md:?}");
        }
    }

    #[test]
    fn code_blocks_are_left_alone() {
        let md = "Run:\n```sh\necho **hi** [a](b)\n# not a heading\n```\n**after**";
        assert_eq!(
            to_whatsapp(md),
            "Run:\n```sh\necho **hi** [a](b)\n# not a heading\n```\n*after*"
        );
    }

    #[test]
    fn output_is_never_longer_than_ordinary_markdown() {
        let md = "# Heading\n**b** *i* ~~s~~ [l](https://e.org) `c`\n* x\n```\n**\n```";
        assert!(to_whatsapp(md).chars().count() <= md.chars().count());
    }
}
