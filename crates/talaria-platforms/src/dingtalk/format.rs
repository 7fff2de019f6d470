//! DingTalk's markdown: a small subset (headings, emphasis, links, images,
//! lists, quotes). Two things render badly unless adjusted: a numbered
//! list right under a paragraph line is shown as that paragraph's text,
//! and an indented code fence is not recognised at all.

/// `text` adjusted for DingTalk's markdown renderer.
pub(crate) fn to_markdown(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut previous: Option<&str> = None;
    // The indentation of the open fence, stripped from its lines.
    let mut fence: Option<usize> = None;
    for line in text.split('\n') {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let line = match fence {
            Some(cut) => {
                if trimmed.starts_with("```") {
                    fence = None;
                }
                strip_indent(line, cut)
            }
            None if trimmed.starts_with("```") => {
                fence = Some(indent);
                trimmed
            }
            None => {
                if is_numbered(trimmed)
                    && previous
                        .is_some_and(|p| !p.trim().is_empty() && !is_numbered(p.trim_start()))
                {
                    out.push('\n');
                }
                line
            }
        };
        if previous.is_some() {
            out.push('\n');
        }
        out.push_str(line);
        previous = Some(line);
    }
    out
}

/// Whether `line` starts a numbered list item (`1. `, `12) `).
fn is_numbered(line: &str) -> bool {
    let digits = line.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0
        && matches!(
            line.as_bytes().get(digits..digits + 2),
            Some([b'.' | b')', b' '])
        )
}

/// `line` without up to `cut` leading spaces.
fn strip_indent(line: &str, cut: usize) -> &str {
    let spaces = line.bytes().take(cut).take_while(|b| *b == b' ').count();
    &line[spaces..]
}

/// The title of a markdown message: the configured one, or the first
/// words of the answer when none is configured.
pub(crate) fn title(configured: &str, text: &str) -> String {
    if !configured.trim().is_empty() {
        return configured.trim().to_owned();
    }
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("…");
    first.trim().chars().take(20).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_paragraphs_are_unchanged() {
        let t = "Hello.\n\nParagraph two: **bold**.";
        assert_eq!(to_markdown(t), t);
    }

    #[test]
    fn a_numbered_list_under_a_paragraph_gets_a_blank_line() {
        assert_eq!(
            to_markdown("Steps:\n1. one\n2. two"),
            "Steps:\n\n1. one\n2. two"
        );
        assert_eq!(to_markdown("Steps:\n\n1. one"), "Steps:\n\n1. one");
    }

    #[test]
    fn indented_fences_are_dedented_with_their_content() {
        assert_eq!(
            to_markdown("  ```rust\n  let x = 1;\n    y\n  ```\nafter"),
            "```rust\nlet x = 1;\n  y\n```\nafter"
        );
        // A numbered line inside a fence is code, not a list.
        assert_eq!(to_markdown("```\nx\n1. y\n```"), "```\nx\n1. y\n```");
    }

    #[test]
    fn titles_fall_back_to_the_first_words() {
        assert_eq!(title("Talaria", "x"), "Talaria");
        assert_eq!(title("", "\n  first line here\nsecond"), "first line here");
    }
}
