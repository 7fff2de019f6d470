use super::*;

#[test]
fn html_checks() {
    assert!(
        check_html(
            "<b>x</b> &lt;script&gt; &amp; <pre><code class=\"language-rust\">a</code></pre>"
        )
        .is_ok()
    );
    assert!(check_html("<script>").is_err());
    assert!(check_html("a < b").is_err());
    assert!(check_html("a & b").is_err());
    assert!(check_html("<b>x").is_err());
    assert_eq!(render_html("<b>a &lt;b&gt;</b> &amp;"), "a <b> &");
}

#[test]
fn form_decoding() {
    assert_eq!(
        form_pairs("chat_id=42&text=a+b%21&x"),
        vec![
            ("chat_id".into(), "42".into()),
            ("text".into(), "a b!".into()),
            ("x".into(), "".into())
        ]
    );
}

#[test]
fn entities_use_utf16_offsets() {
    let e = entities("😀 @bot hi");
    assert_eq!(
        e,
        vec![json!({"type": "mention", "offset": 3, "length": 4})]
    );
    let e = entities("/start now");
    assert_eq!(e[0]["type"], "bot_command");
}
