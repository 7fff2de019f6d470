//! The three characters that HTML-like markups (Telegram's HTML mode,
//! Slack's mrkdwn) reserve, written as entities so text is never read as
//! markup.

/// `text` with `&`, `<` and `>` as entities.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        push_escaped(&mut out, c);
    }
    out
}

/// Pushes `c`, as an entity when it is one of the three.
pub(crate) fn push_escaped(out: &mut String, c: char) {
    match c {
        '&' => out.push_str("&amp;"),
        '<' => out.push_str("&lt;"),
        '>' => out.push_str("&gt;"),
        c => out.push(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_three_become_entities() {
        assert_eq!(escape("a<b> & \"c\" 'd'"), "a&lt;b&gt; &amp; \"c\" 'd'");
        assert_eq!(escape("&amp;"), "&amp;amp;");
    }
}
