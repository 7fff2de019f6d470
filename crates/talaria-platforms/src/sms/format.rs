//! The agent's Markdown as plain SMS text.
//!
//! Phones show SMS as plain text, so Markdown markers would be shown
//! literally: emphasis and code markers, heading hashes, fences and quote
//! markers are dropped; links become `text (url)`; list items keep a `-`
//! or their number; table rows become cells joined by ` | `. Code keeps
//! its text as written.
//!
//! Then the typographic characters models like (curly quotes, dashes, the
//! ellipsis, non-breaking spaces) become their ASCII look-alikes: one of
//! them alone would switch the whole message from GSM-7 to UCS-2 and more
//! than double the segments it costs (see [`super::segments`]).
//!
//! The result is never longer than [`MAX_BODY_CHARS`] when the input was
//! not: every rewrite shortens the text or keeps its length, except the
//! ellipsis (one character becomes three), which is left alone when
//! expanding it would cross the limit.

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

use super::MAX_BODY_CHARS;

/// `text` (Markdown) as plain text for an SMS.
pub(crate) fn to_sms(text: &str) -> String {
    let plain = as_part(text);
    let ascii = gsm_friendly(&plain, true);
    if ascii.chars().count() <= MAX_BODY_CHARS || plain.chars().count() > MAX_BODY_CHARS {
        ascii
    } else {
        gsm_friendly(&plain, false)
    }
}

/// [`plain`], keeping a part of a split answer joinable: the gateway's
/// splitter ends every part with ` (i/n)` and leaves the break (a newline
/// or a space) at the end of the earlier part. The part number is kept
/// out of the Markdown (after a fence the splitter closed, CommonMark
/// would not see the fence closing), and the whitespace at both ends of
/// the part is kept, so the parts of a plain-text answer, their numbers
/// taken off, join into the answer exactly.
fn as_part(text: &str) -> String {
    let Some((body, number)) = split_part_number(text) else {
        return plain(text);
    };
    let trimmed = body.trim_matches([' ', '\n']);
    if trimmed.is_empty() {
        return text.to_owned();
    }
    let lead = &body[..body.len() - body.trim_start_matches([' ', '\n']).len()];
    let trail = &body[body.trim_end_matches([' ', '\n']).len()..];
    let rendered = plain(trimmed);
    // A part cut inside a fence ends with the fence the splitter closed;
    // the number goes on a line of its own rather than onto the code.
    let join = if trail.is_empty() && trimmed.ends_with("```") {
        "\n"
    } else {
        trail
    };
    format!("{lead}{rendered}{join}{number}")
}

/// The text before ` (i/n)` and the suffix itself, when `text` ends with
/// one.
fn split_part_number(text: &str) -> Option<(&str, &str)> {
    let open = text.rfind(" (")?;
    let number = &text[open..];
    is_part_suffix(number).then(|| (&text[..open], number))
}

/// ` (3/5)`.
fn is_part_suffix(s: &str) -> bool {
    let Some(inner) = s.strip_prefix(" (").and_then(|s| s.strip_suffix(')')) else {
        return false;
    };
    let Some((a, b)) = inner.split_once('/') else {
        return false;
    };
    let digits = |x: &str| !x.is_empty() && x.chars().all(|c| c.is_ascii_digit());
    digits(a) && digits(b)
}

/// One open list: its next number, `None` for a bulleted list.
struct List {
    next: Option<u64>,
}

/// Markdown rendered as plain text (see the module docs).
fn plain(text: &str) -> String {
    let options =
        Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TABLES | Options::ENABLE_TASKLISTS;
    let mut out = String::with_capacity(text.len());
    let mut lists: Vec<List> = Vec::new();
    // Where each open link's or image's text starts in `out`, and where
    // it points.
    let mut links: Vec<(usize, String)> = Vec::new();
    let mut cell = 0usize;
    for event in Parser::new_ext(text, options) {
        match event {
            Event::Start(tag) => match tag {
                Tag::Paragraph
                | Tag::Heading { .. }
                | Tag::CodeBlock(_)
                | Tag::BlockQuote(_)
                | Tag::Table(_)
                | Tag::HtmlBlock => block_break(&mut out, lists.len()),
                Tag::List(start) => {
                    block_break(&mut out, lists.len());
                    lists.push(List { next: start });
                }
                Tag::Item => {
                    line_break(&mut out);
                    let depth = lists.len().saturating_sub(1);
                    out.push_str(&"  ".repeat(depth));
                    match lists.last_mut().and_then(|l| l.next.as_mut()) {
                        Some(n) => {
                            out.push_str(&format!("{n}. "));
                            *n += 1;
                        }
                        None => out.push_str("- "),
                    }
                }
                Tag::TableHead | Tag::TableRow => {
                    line_break(&mut out);
                    cell = 0;
                }
                Tag::TableCell => {
                    if cell > 0 {
                        out.push_str(" | ");
                    }
                    cell += 1;
                }
                Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. } => {
                    links.push((out.len(), dest_url.to_string()));
                }
                _ => {}
            },
            Event::End(tag) => match tag {
                TagEnd::Paragraph
                | TagEnd::Heading(_)
                | TagEnd::CodeBlock
                | TagEnd::BlockQuote(_)
                | TagEnd::Table
                | TagEnd::HtmlBlock => block_break(&mut out, lists.len()),
                TagEnd::List(_) => {
                    lists.pop();
                    block_break(&mut out, lists.len());
                }
                TagEnd::Link | TagEnd::Image => {
                    if let Some((start, dest)) = links.pop() {
                        let shown = out[start..].trim();
                        if shown.is_empty() {
                            out.push_str(&dest);
                        } else if shown != dest && !dest.is_empty() && !dest.starts_with('#') {
                            out.push_str(" (");
                            out.push_str(dest.strip_prefix("mailto:").unwrap_or(&dest));
                            out.push(')');
                        }
                    }
                }
                _ => {}
            },
            Event::Text(t) | Event::Code(t) | Event::Html(t) => out.push_str(&t),
            Event::InlineHtml(t) => {
                let tag = t.trim().to_ascii_lowercase();
                if matches!(tag.as_str(), "<br>" | "<br/>" | "<br />") {
                    out.push('\n');
                }
                // Other inline tags (`<b>`, `<i>`, ...) only format.
            }
            Event::SoftBreak | Event::HardBreak => out.push('\n'),
            Event::Rule => {
                block_break(&mut out, lists.len());
                out.push_str("---");
            }
            Event::TaskListMarker(done) => out.push_str(if done { "[x] " } else { "[ ] " }),
            Event::FootnoteReference(name) => {
                out.push_str("[^");
                out.push_str(&name);
                out.push(']');
            }
            Event::InlineMath(t) | Event::DisplayMath(t) => out.push_str(&t),
        }
    }
    out.trim().to_owned()
}

/// Ends the current block: a blank line between blocks, a line break
/// between the blocks inside a list item.
fn block_break(out: &mut String, list_depth: usize) {
    let kept = out.trim_end_matches([' ', '\n']).len();
    out.truncate(kept);
    if out.is_empty() {
        return;
    }
    out.push_str(if list_depth > 0 { "\n" } else { "\n\n" });
}

fn line_break(out: &mut String) {
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
}

/// Typographic characters as their GSM-7 look-alikes; `expand` also turns
/// `…` into `...`.
fn gsm_friendly(text: &str, expand: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\u{2018}' | '\u{2019}' | '\u{201A}' | '\u{2032}' => out.push('\''),
            '\u{201C}' | '\u{201D}' | '\u{201E}' | '\u{2033}' => out.push('"'),
            '\u{2010}' | '\u{2011}' | '\u{2012}' | '\u{2013}' | '\u{2014}' | '\u{2212}' => {
                out.push('-');
            }
            '\u{2022}' => out.push('-'),
            '\u{00A0}' | '\u{2007}' | '\u{2009}' | '\u{202F}' => out.push(' '),
            '\u{200B}' | '\u{200C}' | '\u{200D}' | '\u{2060}' | '\u{FEFF}' => {}
            '\u{2026}' if expand => out.push_str("..."),
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_dropped() {
        assert_eq!(
            to_sms("# Title\n\n**bold**, *it*, _it_, ~~gone~~ and `code`."),
            "Title\n\nbold, it, it, gone and code."
        );
        assert_eq!(to_sms("> quoted\n> more"), "quoted\nmore");
        assert_eq!(to_sms("a\\*b\\* 2 * 3 = 6"), "a*b* 2 * 3 = 6");
        assert_eq!(to_sms("snake_case_name stays"), "snake_case_name stays");
        assert_eq!(to_sms("line one<br>line two"), "line one\nline two");
    }

    #[test]
    fn links_lists_and_tables_read_as_text() {
        assert_eq!(
            to_sms("See [the docs](https://x.example/d) or <https://y.example>."),
            "See the docs (https://x.example/d) or https://y.example."
        );
        assert_eq!(
            to_sms("![a cat](https://x.example/cat.png)"),
            "a cat (https://x.example/cat.png)"
        );
        assert_eq!(
            to_sms("Steps:\n\n1. one\n2. two\n   - sub\n\n* a\n* b\n\nDone."),
            "Steps:\n\n1. one\n2. two\n  - sub\n\n- a\n- b\n\nDone."
        );
        assert_eq!(to_sms("- [x] done\n- [ ] todo"), "- [x] done\n- [ ] todo");
        assert_eq!(to_sms("| a | b |\n|---|---|\n| 1 | 2 |"), "a | b\n1 | 2");
    }

    #[test]
    fn code_keeps_its_text() {
        assert_eq!(
            to_sms("Run:\n\n```sh\nls  -la *.rs\necho **x**\n```\n\nThen stop."),
            "Run:\n\nls  -la *.rs\necho **x**\n\nThen stop."
        );
    }

    #[test]
    fn parts_of_a_split_answer_keep_their_number_and_their_ends() {
        // What the gateway's splitter makes of a fence cut in two.
        assert_eq!(
            to_sms("Here:\n```rust\nlet a = 1;\n``` (1/2)"),
            "Here:\n\nlet a = 1;\n (1/2)"
        );
        assert_eq!(
            to_sms("```rust\nlet b = 2;\n```\nDone. (2/2)"),
            "let b = 2;\n\nDone. (2/2)"
        );
        // Plain parts join back exactly once their numbers are taken off.
        let answer = "First paragraph, **bold**.\n\nSecond one\nwith a line.\n\nThird.";
        let parts = [
            "First paragraph, **bold**.\n (1/3)",
            "\nSecond one\nwith a line.\n\n (2/3)",
            "Third. (3/3)",
        ];
        let joined: String = parts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let sms = to_sms(p);
                let suffix = format!(" ({}/3)", i + 1);
                sms.strip_suffix(&suffix).unwrap().to_owned()
            })
            .collect();
        assert_eq!(joined, answer.replace("**", ""));
        assert!(!is_part_suffix(" (a/2)"));
        assert!(!is_part_suffix("(1/2)"));
    }

    #[test]
    fn typography_becomes_gsm() {
        assert_eq!(
            to_sms("It\u{2019}s \u{201C}fine\u{201D} \u{2014} really\u{2026}"),
            "It's \"fine\" - really..."
        );
        assert_eq!(
            super::super::segments::measure(&to_sms("It\u{2019}s")).0,
            super::super::segments::Encoding::Gsm7
        );
        // Other scripts and emoji are kept: they are meant.
        assert_eq!(to_sms("Привет 👋"), "Привет 👋");
    }

    #[test]
    fn never_longer_than_the_limit() {
        let dots = "\u{2026}".repeat(MAX_BODY_CHARS);
        let out = to_sms(&dots);
        assert_eq!(out.chars().count(), MAX_BODY_CHARS);
        let text = format!("[{}](https://e.x) **b** `c`", "w".repeat(1500));
        assert!(to_sms(&text).chars().count() <= text.chars().count());
    }
}
