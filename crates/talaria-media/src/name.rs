//! Original file names made safe to show to a model and to upload.

/// The longest name kept, in characters. File systems allow 255 bytes;
/// this leaves room and keeps a name readable in a chat.
const MAX_NAME_CHARS: usize = 100;

/// The longest extension kept when a long name is shortened.
const MAX_EXT_CHARS: usize = 16;

/// `name` made safe: only its last path component, without control
/// characters, without leading dots (no hidden files) or surrounding
/// blanks, at most 100 characters (a long name keeps its extension).
/// When nothing is left, `file.<ext>`, with `ext` the sniffed type's
/// extension.
pub fn sanitize_name(name: Option<&str>, ext: &str) -> String {
    let raw = name.unwrap_or("");
    // `\` separates folders on Windows, and senders use both.
    let last = raw.rsplit(['/', '\\']).next().unwrap_or("");
    let clean: String = last.chars().filter(|c| !c.is_control()).collect();
    let clean = clean
        .trim()
        .trim_start_matches('.')
        .trim_end_matches(['.', ' '])
        .trim();
    if clean.is_empty() {
        return format!("file.{ext}");
    }
    shorten(clean)
}

/// `name` cut to [`MAX_NAME_CHARS`], keeping a short extension.
fn shorten(name: &str) -> String {
    if name.chars().count() <= MAX_NAME_CHARS {
        return name.to_owned();
    }
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e)
        .filter(|e| !e.is_empty() && e.chars().count() <= MAX_EXT_CHARS);
    match ext {
        Some(ext) => {
            let keep = MAX_NAME_CHARS - ext.chars().count() - 1;
            let stem: String = name.chars().take(keep).collect();
            format!("{}.{ext}", stem.trim_end())
        }
        None => name.chars().take(MAX_NAME_CHARS).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_components_are_dropped() {
        assert_eq!(sanitize_name(Some("../../etc/passwd"), "bin"), "passwd");
        assert_eq!(
            sanitize_name(Some("C:\\Users\\me\\cv.pdf"), "pdf"),
            "cv.pdf"
        );
        assert_eq!(sanitize_name(Some("photos/"), "jpg"), "file.jpg");
        assert_eq!(sanitize_name(Some(".."), "jpg"), "file.jpg");
    }

    #[test]
    fn control_characters_and_leading_dots_are_dropped() {
        assert_eq!(sanitize_name(Some("\u{0}evil"), "bin"), "evil");
        assert_eq!(
            sanitize_name(Some("a\nb\r\u{1b}[31mc.txt"), "txt"),
            "ab[31mc.txt"
        );
        assert_eq!(sanitize_name(Some(".hidden"), "txt"), "hidden");
        assert_eq!(sanitize_name(Some("...bashrc"), "txt"), "bashrc");
        assert_eq!(
            sanitize_name(Some("  report .pdf . "), "pdf"),
            "report .pdf"
        );
    }

    #[test]
    fn nothing_left_falls_back_to_a_name_of_the_sniffed_type() {
        assert_eq!(sanitize_name(None, "png"), "file.png");
        assert_eq!(sanitize_name(Some(""), "bin"), "file.bin");
        assert_eq!(sanitize_name(Some("\u{0}\u{7f}\t"), "ogg"), "file.ogg");
    }

    #[test]
    fn a_long_name_is_bounded_and_keeps_its_extension() {
        let long = format!("{}.jpg", "a".repeat(500));
        let short = sanitize_name(Some(&long), "jpg");
        assert_eq!(short.chars().count(), MAX_NAME_CHARS);
        assert!(short.ends_with("a.jpg"), "{short}");

        let no_ext = "é".repeat(500);
        let short = sanitize_name(Some(&no_ext), "bin");
        assert_eq!(short, "é".repeat(MAX_NAME_CHARS));

        let fits = "b".repeat(MAX_NAME_CHARS);
        assert_eq!(sanitize_name(Some(&fits), "bin"), fits);
    }
}
