//! The gateway decides by what an adapter declares (`Adapter::capabilities`),
//! never by which platform it is: no registered platform's name may stand
//! as a string literal in `talaria-gateway`'s code outside its tests.

use std::path::{Path, PathBuf};

use talaria_platforms::registry::PLATFORMS;

/// Every `.rs` file below `dir`, test files and folders left out.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "tests" {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

/// A piece of Rust source, as far as this check needs to see it.
#[derive(Debug, PartialEq)]
enum Token {
    /// A string literal's contents (escapes left as written).
    Str(String),
    /// A `#[cfg(test)]` (or `#[cfg(all(test, ...))]`) attribute.
    TestOnly,
    Open,
    Close,
    Semi,
}

/// The tokens of `src` that matter here; comments, char literals and
/// everything else are skipped.
fn tokens(src: &str) -> Vec<Token> {
    let c: Vec<char> = src.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        match c[i] {
            '/' if at(i + 1) == '/' => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '/' if at(i + 1) == '*' => {
                i += 2;
                while i < c.len() && !(c[i] == '*' && at(i + 1) == '/') {
                    i += 1;
                }
                i += 2;
            }
            'r' if (at(i + 1) == '"' || at(i + 1) == '#')
                && !(i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_')) =>
            {
                let mut j = i + 1;
                let mut hashes = 0;
                while at(j) == '#' {
                    hashes += 1;
                    j += 1;
                }
                if at(j) != '"' {
                    i += 1;
                    continue;
                }
                let start = j + 1;
                let mut k = start;
                loop {
                    if k >= c.len() {
                        break;
                    }
                    if c[k] == '"' && (1..=hashes).all(|h| at(k + h) == '#') {
                        break;
                    }
                    k += 1;
                }
                out.push(Token::Str(c[start..k.min(c.len())].iter().collect()));
                i = k + 1 + hashes;
            }
            '"' => {
                let mut k = i + 1;
                let mut text = String::new();
                while k < c.len() && c[k] != '"' {
                    if c[k] == '\\' {
                        text.push(c[k]);
                        k += 1;
                    }
                    if k < c.len() {
                        text.push(c[k]);
                    }
                    k += 1;
                }
                out.push(Token::Str(text));
                i = k + 1;
            }
            '\'' => {
                // A char literal ('x', '\n', '\u{1f}') or a lifetime ('a).
                if at(i + 1) == '\\' {
                    let mut k = i + 2;
                    while k < c.len() && c[k] != '\'' {
                        k += 1;
                    }
                    i = k + 1;
                } else if at(i + 2) == '\'' {
                    i += 3;
                } else {
                    i += 1;
                }
            }
            '#' => {
                let mut j = i + 1;
                if at(j) == '!' {
                    j += 1;
                }
                if at(j) != '[' {
                    i += 1;
                    continue;
                }
                let mut depth = 0;
                let mut k = j;
                let mut text = String::new();
                while k < c.len() {
                    match c[k] {
                        '[' => depth += 1,
                        ']' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        ch if !ch.is_whitespace() => text.push(ch),
                        _ => {}
                    }
                    k += 1;
                }
                let attr = text.trim_start_matches('[');
                if attr.starts_with("cfg(") && attr.contains("test") && !attr.contains("not(test") {
                    out.push(Token::TestOnly);
                }
                i = k + 1;
            }
            '{' => {
                out.push(Token::Open);
                i += 1;
            }
            '}' => {
                out.push(Token::Close);
                i += 1;
            }
            ';' => {
                out.push(Token::Semi);
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

/// The string literals of `src` outside `#[cfg(test)]` items.
fn literals_outside_tests(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut tokens = tokens(src).into_iter();
    while let Some(token) = tokens.next() {
        match token {
            Token::Str(s) => out.push(s),
            // Skips the item: up to its `;`, or through its braces.
            Token::TestOnly => {
                let mut depth = 0usize;
                for t in tokens.by_ref() {
                    match t {
                        Token::Open => depth += 1,
                        Token::Close => {
                            depth = depth.saturating_sub(1);
                            if depth == 0 {
                                break;
                            }
                        }
                        Token::Semi if depth == 0 => break,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    out
}

#[test]
fn the_scanner_sees_literals_and_skips_tests() {
    let src = r##"
        const A: &str = "telegram"; // "discord" in a comment
        fn f<'a>(x: &'a str) -> char { let _ = r#"raw "slack""#; '{' }
        #[cfg(test)]
        mod tests {
            fn g() { let _ = "matrix"; if true { "email"; } }
        }
        /* "signal" */
        static B: &str = "sms";
    "##;
    assert_eq!(
        literals_outside_tests(src),
        vec![
            "telegram".to_owned(),
            r#"raw "slack""#.to_owned(),
            "sms".to_owned()
        ]
    );
}

#[test]
fn no_platform_name_is_spelled_out_in_the_gateway() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../talaria-gateway/src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(
        files.len() > 10,
        "the gateway's sources were not found at {}",
        root.display()
    );
    let mut found = Vec::new();
    for file in &files {
        let src = std::fs::read_to_string(file).unwrap();
        for literal in literals_outside_tests(&src) {
            if let Some(p) = PLATFORMS.iter().find(|p| p.name == literal) {
                found.push(format!("{}: \"{}\"", file.display(), p.name));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the gateway names platforms instead of asking their capabilities:\n{}",
        found.join("\n")
    );
}
