//! The agent's Markdown as Matrix's `org.matrix.custom.html`.
//!
//! Rendered from pulldown-cmark's events by hand rather than with its HTML
//! writer, so that only tags the Matrix spec lists for messages come out:
//! raw HTML in the Markdown is shown as text, links keep only web, mail
//! and Matrix schemes, and images (whose `src` Matrix clients only load
//! from `mxc://`) become links.

use pulldown_cmark::{CodeBlockKind, Event, HeadingLevel, Options, Parser, Tag, TagEnd};

/// `text` (Markdown) as sanitized HTML for `formatted_body`.
pub(crate) fn to_html(text: &str) -> String {
    let options =
        Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TABLES | Options::ENABLE_TASKLISTS;
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    let mut in_table_head = false;
    // Link and image destinations are decided at the start tag; the end
    // tag must close whatever the start opened.
    let mut links: Vec<bool> = Vec::new();
    let mut image_alt: Option<(String, Option<String>)> = None;
    for event in Parser::new_ext(text, options) {
        if let Some((alt, _)) = image_alt.as_mut() {
            match event {
                Event::End(TagEnd::Image) => {
                    if let Some((alt, dest)) = image_alt.take() {
                        let shown = if alt.is_empty() { "image" } else { &alt };
                        match dest {
                            Some(d) => {
                                out.push_str("<a href=\"");
                                escape_into(&mut out, &d);
                                out.push_str("\">");
                                escape_into(&mut out, shown);
                                out.push_str("</a>");
                            }
                            None => escape_into(&mut out, shown),
                        }
                    }
                }
                Event::Text(t) | Event::Code(t) => alt.push_str(&t),
                _ => {}
            }
            continue;
        }
        match event {
            Event::Start(tag) => match tag {
                Tag::Paragraph => out.push_str("<p>"),
                Tag::Heading { level, .. } => {
                    out.push_str("<h");
                    out.push_str(heading_number(level));
                    out.push('>');
                }
                Tag::BlockQuote(_) => out.push_str("<blockquote>"),
                Tag::CodeBlock(kind) => {
                    let lang = match &kind {
                        CodeBlockKind::Fenced(info) => info
                            .split_whitespace()
                            .next()
                            .filter(|l| {
                                l.chars().all(|c| {
                                    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '+')
                                })
                            })
                            .map(str::to_owned),
                        CodeBlockKind::Indented => None,
                    };
                    match lang {
                        Some(l) => {
                            out.push_str("<pre><code class=\"language-");
                            out.push_str(&l);
                            out.push_str("\">");
                        }
                        None => out.push_str("<pre><code>"),
                    }
                }
                Tag::List(Some(1)) => out.push_str("<ol>"),
                Tag::List(Some(start)) => out.push_str(&format!("<ol start=\"{start}\">")),
                Tag::List(None) => out.push_str("<ul>"),
                Tag::Item => out.push_str("<li>"),
                Tag::Table(_) => out.push_str("<table>"),
                Tag::TableHead => {
                    in_table_head = true;
                    out.push_str("<thead><tr>");
                }
                Tag::TableRow => out.push_str("<tr>"),
                Tag::TableCell => out.push_str(if in_table_head { "<th>" } else { "<td>" }),
                Tag::Emphasis => out.push_str("<em>"),
                Tag::Strong => out.push_str("<strong>"),
                Tag::Strikethrough => out.push_str("<del>"),
                Tag::Superscript => out.push_str("<sup>"),
                Tag::Subscript => out.push_str("<sub>"),
                Tag::Link { dest_url, .. } => {
                    let ok = safe_url(&dest_url);
                    if ok {
                        out.push_str("<a href=\"");
                        escape_into(&mut out, &dest_url);
                        out.push_str("\">");
                    }
                    links.push(ok);
                }
                Tag::Image { dest_url, .. } => {
                    let dest = safe_url(&dest_url).then(|| dest_url.to_string());
                    image_alt = Some((String::new(), dest));
                }
                // Definition lists, footnote definitions, raw HTML blocks
                // and metadata: their text still comes through below.
                _ => {}
            },
            Event::End(end) => match end {
                TagEnd::Paragraph => out.push_str("</p>"),
                TagEnd::Heading(level) => {
                    out.push_str("</h");
                    out.push_str(heading_number(level));
                    out.push('>');
                }
                TagEnd::BlockQuote(_) => out.push_str("</blockquote>"),
                TagEnd::CodeBlock => out.push_str("</code></pre>"),
                TagEnd::List(true) => out.push_str("</ol>"),
                TagEnd::List(false) => out.push_str("</ul>"),
                TagEnd::Item => out.push_str("</li>"),
                TagEnd::Table => out.push_str("</tbody></table>"),
                TagEnd::TableHead => {
                    in_table_head = false;
                    out.push_str("</tr></thead><tbody>");
                }
                TagEnd::TableRow => out.push_str("</tr>"),
                TagEnd::TableCell => out.push_str(if in_table_head { "</th>" } else { "</td>" }),
                TagEnd::Emphasis => out.push_str("</em>"),
                TagEnd::Strong => out.push_str("</strong>"),
                TagEnd::Strikethrough => out.push_str("</del>"),
                TagEnd::Superscript => out.push_str("</sup>"),
                TagEnd::Subscript => out.push_str("</sub>"),
                TagEnd::Link => {
                    let opened = links.pop() == Some(true);
                    out.push_str(if opened { "</a>" } else { "" });
                }
                _ => {}
            },
            Event::Text(t) => escape_into(&mut out, &t),
            Event::Code(t) => {
                out.push_str("<code>");
                escape_into(&mut out, &t);
                out.push_str("</code>");
            }
            // Never passed through: what the model wrote as HTML is shown.
            Event::Html(t) | Event::InlineHtml(t) => escape_into(&mut out, &t),
            Event::InlineMath(t) | Event::DisplayMath(t) => escape_into(&mut out, &t),
            Event::FootnoteReference(t) => {
                out.push('[');
                escape_into(&mut out, &t);
                out.push(']');
            }
            Event::SoftBreak => out.push('\n'),
            Event::HardBreak => out.push_str("<br>"),
            Event::Rule => out.push_str("<hr>"),
            Event::TaskListMarker(done) => out.push_str(if done { "[x] " } else { "[ ] " }),
        }
    }
    out
}

fn heading_number(level: HeadingLevel) -> &'static str {
    match level {
        HeadingLevel::H1 => "1",
        HeadingLevel::H2 => "2",
        HeadingLevel::H3 => "3",
        HeadingLevel::H4 => "4",
        HeadingLevel::H5 => "5",
        HeadingLevel::H6 => "6",
    }
}

/// Links a client may open: web, mail and Matrix ones.
fn safe_url(url: &str) -> bool {
    let lower = url.trim().to_ascii_lowercase();
    ["https://", "http://", "mailto:", "matrix:"]
        .iter()
        .any(|p| lower.starts_with(p))
}

fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::to_html;

    #[test]
    fn inline_markup_becomes_tags() {
        assert_eq!(
            to_html("**bold**, *it*, ~~gone~~ and `x < y`"),
            "<p><strong>bold</strong>, <em>it</em>, <del>gone</del> and <code>x &lt; y</code></p>"
        );
    }

    #[test]
    fn code_blocks_keep_their_language_and_escape_their_body() {
        assert_eq!(
            to_html("```rust\nfn a() -> &'static str { \"<b>\" }\n```"),
            "<pre><code class=\"language-rust\">fn a() -&gt; &amp;&#39;static str { &quot;&lt;b&gt;&quot; }\n</code></pre>"
        );
        // A language name that could break out of the attribute is dropped.
        assert_eq!(
            to_html("```a\"onclick=x\ncode\n```"),
            "<pre><code>code\n</code></pre>"
        );
    }

    #[test]
    fn raw_html_is_shown_not_passed_through() {
        let html =
            to_html("hi <script>alert(1)</script> <b>x</b>\n\n<div onclick=\"x\">block</div>");
        assert!(!html.contains("<script"), "{html}");
        assert!(!html.contains("<b>"), "{html}");
        assert!(!html.contains("<div"), "{html}");
        assert!(html.contains("&lt;script&gt;"), "{html}");
        assert!(html.contains("&lt;div onclick=&quot;x&quot;&gt;"), "{html}");
    }

    #[test]
    fn only_safe_links_are_links() {
        assert_eq!(
            to_html("[site](https://example.org/?a=1&b=\"2\")"),
            "<p><a href=\"https://example.org/?a=1&amp;b=&quot;2&quot;\">site</a></p>"
        );
        assert_eq!(to_html("[click](javascript:alert(1))"), "<p>click</p>");
        assert_eq!(
            to_html("![a cat](https://example.org/cat.png)"),
            "<p><a href=\"https://example.org/cat.png\">a cat</a></p>"
        );
    }

    #[test]
    fn block_structure() {
        assert_eq!(
            to_html("# Title\n\n- one\n- two\n\n3. three\n4. four\n\n> quoted"),
            "<h1>Title</h1><ul>\n<li>one</li>\n<li>two</li>\n</ul>\n<ol start=\"3\">\n<li>three</li>\n<li>four</li>\n</ol>\n<blockquote>\n<p>quoted</p>\n</blockquote>\n"
                .replace('\n', "")
        );
        assert_eq!(
            to_html("| a | b |\n|---|---|\n| 1 | 2 |"),
            "<table><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td>1</td><td>2</td></tr></tbody></table>"
        );
        assert_eq!(to_html("line one\nline two"), "<p>line one\nline two</p>");
    }
}
