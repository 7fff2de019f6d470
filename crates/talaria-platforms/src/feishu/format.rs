//! Which message type carries a text: plain `text`, or a rich-text `post`
//! whose one `md` element Feishu renders as Markdown (bold, italic,
//! strikethrough, links, lists, quotes, code blocks). Cards (`card`) show
//! the same Markdown.

use serde_json::{Value, json};

/// Whether `text` uses Markdown Feishu's `md` element renders.
pub(crate) fn looks_like_markdown(text: &str) -> bool {
    text.contains("**")
        || text.contains("```")
        || text.contains("~~")
        || text.contains("](")
        || text.lines().any(|l| {
            let l = l.trim_start();
            l.starts_with("# ")
                || l.starts_with("## ")
                || l.starts_with("### ")
                || l.starts_with("- ")
                || l.starts_with("* ")
                || l.starts_with("> ")
        })
}

/// `text` as Feishu's Markdown subset shows it: headings, which the `md`
/// element does not render, become bold lines.
pub(crate) fn markdown(text: &str) -> String {
    text.lines()
        .map(|l| {
            let t = l.trim_start();
            match t.trim_start_matches('#') {
                rest if rest.len() < t.len() && rest.starts_with(' ') => {
                    format!("**{}**", rest.trim())
                }
                _ => l.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `(msg_type, content)` for a send; `content` is the JSON string Feishu
/// wants.
pub(crate) fn content(text: &str) -> (&'static str, String) {
    if looks_like_markdown(text) {
        let body = markdown(text);
        let post: Value = json!({"zh_cn": {"content": [[{"tag": "md", "text": body}]]}});
        ("post", post.to_string())
    } else {
        ("text", json!({ "text": text }).to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_stays_text_and_markdown_becomes_a_post() {
        let (kind, c) = content("Hello there.");
        assert_eq!(kind, "text");
        assert_eq!(c, r#"{"text":"Hello there."}"#);
        let (kind, c) = content("## Title\nSome **bold** text");
        assert_eq!(kind, "post");
        let v: Value = serde_json::from_str(&c).unwrap();
        assert_eq!(v["zh_cn"]["content"][0][0]["tag"], "md");
        assert_eq!(
            v["zh_cn"]["content"][0][0]["text"],
            "**Title**\nSome **bold** text"
        );
    }
}
