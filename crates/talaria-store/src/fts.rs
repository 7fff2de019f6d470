//! Turning user text into a safe FTS5 query.
//!
//! FTS5's query language is strict: a stray `"`, `(`, a trailing `AND` or a
//! `word:` that names no column is a syntax error, and the text we search for
//! comes from users and models who type all of those. So a query is never
//! passed through: it is taken apart into terms, and a new expression is
//! built in which every term is an FTS5 string literal. The only syntax in
//! the output is what this module writes itself (literals, `*` after a word,
//! and `AND`/`OR`/`NOT` between two terms), so no input can make it invalid.

/// Most terms kept from one query; more only slow the search down.
pub const MAX_TERMS: usize = 32;

/// Longest query considered, in characters; the rest is ignored.
pub const MAX_QUERY_CHARS: usize = 2048;

/// A boolean operator the user wrote in capitals, as FTS5 spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    And,
    Or,
    Not,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::And => "AND",
            Op::Or => "OR",
            Op::Not => "NOT",
        }
    }
}

/// One piece of a parsed query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Item {
    /// Text to look for: a bare word or a balanced `"phrase"`.
    Term { text: String, prefix: bool },
    /// An operator; only honoured when a term stands on both sides.
    Op(Op),
}

/// Splits raw text into terms and operators without judging whether a term
/// is searchable; that depends on the index (see [`sanitize_query`] and
/// [`sanitize_trigram_query`]).
pub(crate) fn parse(input: &str) -> Vec<Item> {
    // Control characters (NUL included) carry no meaning in a search and
    // some of them confuse tokenizers, so they become plain separators.
    let chars: Vec<char> = input
        .chars()
        .take(MAX_QUERY_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let is_break = |c: char| c.is_whitespace() || c == '"' || c == '(' || c == ')';

    let mut items = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            let close = chars[i + 1..].iter().position(|&d| d == '"');
            let Some(len) = close else {
                // An unmatched quote is a typo, not a phrase: drop it and
                // read on as if it were a space.
                i += 1;
                continue;
            };
            let body: String = chars[i + 1..i + 1 + len].iter().collect();
            i += len + 2;
            let mut prefix = false;
            while chars.get(i) == Some(&'*') {
                prefix = true;
                i += 1;
            }
            items.push(Item::Term {
                prefix: prefix && ends_in_word_char(&body),
                text: body,
            });
        } else if is_break(c) {
            i += 1;
        } else {
            let start = i;
            while i < chars.len() && !is_break(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            items.push(match word.as_str() {
                // FTS5 only treats capitalised operators as operators; the
                // lower-case words stay ordinary search terms, as there.
                "AND" => Item::Op(Op::And),
                "OR" => Item::Op(Op::Or),
                "NOT" => Item::Op(Op::Not),
                _ => word_term(&word),
            });
        }
    }
    items
}

/// A bare word as a term: any column filter removed, trailing stars turned
/// into a prefix marker.
fn word_term(word: &str) -> Item {
    let word = strip_column_filter(word);
    let stem = word.trim_end_matches('*');
    let prefix = stem.len() != word.len() && ends_in_word_char(stem);
    Item::Term {
        text: stem.to_string(),
        prefix,
    }
}

/// Removes a leading `column:` (optionally `-column:` or `^column:`), the
/// FTS5 column-filter form, so the query cannot aim at columns that do not
/// exist. A word that is only a filter becomes empty.
fn strip_column_filter(word: &str) -> &str {
    let body = word.trim_start_matches(['-', '+', '^']);
    let Some(colon) = body.find(':') else {
        return word;
    };
    let name = &body[..colon];
    let mut name_chars = name.chars();
    let starts_like_ident = name_chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if starts_like_ident && name_chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        &body[colon + 1..]
    } else {
        word
    }
}

fn ends_in_word_char(s: &str) -> bool {
    s.chars().last().is_some_and(char::is_alphanumeric)
}

/// Writes `text` as an FTS5 string literal: inside double quotes a quote is
/// escaped by doubling it, and nothing else is special.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        if c == '"' {
            out.push('"');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// Renders the parsed items as an expression, keeping the terms `keep`
/// accepts. An operator is written only between two written terms (the
/// first of a run wins), so a dangling `AND`, `OR` or `NOT` never reaches
/// FTS5.
fn render(items: &[Item], keep: impl Fn(&str) -> bool, allow_prefix: bool) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    let mut pending: Option<Op> = None;
    let mut terms = 0usize;
    for item in items {
        match item {
            Item::Op(op) => {
                if terms > 0 && pending.is_none() {
                    pending = Some(*op);
                }
            }
            Item::Term { text, prefix } => {
                if !keep(text) {
                    continue;
                }
                if terms == MAX_TERMS {
                    break;
                }
                if let Some(op) = pending.take() {
                    parts.push(op.as_str().to_string());
                }
                let mut literal = quote(text);
                if *prefix && allow_prefix {
                    literal.push('*');
                }
                parts.push(literal);
                terms += 1;
            }
        }
    }
    (terms > 0).then(|| parts.join(" "))
}

/// Builds an FTS5 `MATCH` expression for a word index (the `unicode61`
/// tokenizer) from arbitrary text.
///
/// Every term becomes a quoted string; balanced `"phrases"` stay phrases;
/// unbalanced quotes, parentheses and column filters are dropped; a trailing
/// `*` on a word keeps its prefix meaning; `AND`, `OR` and `NOT` written in
/// capitals between two terms keep theirs. Terms without a letter or digit
/// (which the tokenizer would ignore) are dropped, at most [`MAX_TERMS`]
/// terms are kept, and only the first [`MAX_QUERY_CHARS`] characters are
/// read.
///
/// Returns `None` when nothing searchable is left. The result can never be
/// an FTS5 syntax error.
pub fn sanitize_query(input: &str) -> Option<String> {
    render(
        &parse(input),
        |t| t.chars().any(char::is_alphanumeric),
        true,
    )
}

/// Builds an FTS5 `MATCH` expression for a trigram index from arbitrary
/// text.
///
/// The trigram tokenizer matches substrings, so punctuation and symbols are
/// meaningful here (`C++`, emoji) and prefix markers are not: every
/// non-empty term is kept as a quoted string and `*` is dropped. Terms
/// shorter than three characters cannot match a trigram index and FTS5
/// silently ignores them; callers that need them should check
/// [`has_short_term`] and search another way.
///
/// Returns `None` when nothing searchable is left. The result can never be
/// an FTS5 syntax error.
pub fn sanitize_trigram_query(input: &str) -> Option<String> {
    render(&parse(input), |t| !t.trim().is_empty(), false)
}

/// The non-empty terms of a query as they would be searched, in order, at
/// most [`MAX_TERMS`]; operators are left out.
pub fn query_terms(input: &str) -> Vec<String> {
    parse(input)
        .into_iter()
        .filter_map(|item| match item {
            Item::Term { text, .. } if !text.trim().is_empty() => Some(text),
            _ => None,
        })
        .take(MAX_TERMS)
        .collect()
}

/// Whether any term of the query is shorter than the three characters a
/// trigram index needs.
pub fn has_short_term(input: &str) -> bool {
    query_terms(input)
        .iter()
        .any(|t| t.trim().chars().count() < 3)
}

/// Whether the text contains Chinese, Japanese or Korean script, which the
/// word tokenizer cannot split (there are no spaces between words).
pub fn contains_cjk(text: &str) -> bool {
    text.chars().any(is_cjk)
}

fn is_cjk(c: char) -> bool {
    matches!(u32::from(c),
        0x1100..=0x11FF       // Hangul Jamo
        | 0x3040..=0x30FF     // Hiragana, Katakana
        | 0x3100..=0x312F     // Bopomofo
        | 0x3130..=0x318F     // Hangul compatibility Jamo
        | 0x31F0..=0x31FF     // Katakana phonetic extensions
        | 0x3400..=0x4DBF     // CJK extension A
        | 0x4E00..=0x9FFF     // CJK unified ideographs
        | 0xA960..=0xA97F     // Hangul Jamo extended A
        | 0xAC00..=0xD7AF     // Hangul syllables
        | 0xD7B0..=0xD7FF     // Hangul Jamo extended B
        | 0xF900..=0xFAFF     // CJK compatibility ideographs
        | 0xFF66..=0xFF9F     // half-width Katakana
        | 0x20000..=0x3134F   // CJK extensions B..G, compatibility supplement
    )
}

/// One `OR`-branch of a query for a substring scan: rows containing all of
/// `include` and none of `exclude`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ScanBranch {
    pub(crate) include: Vec<String>,
    pub(crate) exclude: Vec<String>,
}

/// Reads a parsed query the way FTS5 would, for the backends' substring
/// scans: `NOT` binds to the next term, `OR` separates branches,
/// everything else is `AND`; at most [`MAX_TERMS`] terms. A branch with
/// nothing to include is dropped: it would match nearly every row.
pub(crate) fn scan_branches(items: &[Item]) -> Vec<ScanBranch> {
    let mut branches = vec![ScanBranch::default()];
    let mut negate = false;
    let mut terms = 0;
    for item in items {
        match item {
            Item::Op(Op::Or) => {
                branches.push(ScanBranch::default());
                negate = false;
            }
            Item::Op(Op::Not) => negate = true,
            Item::Op(Op::And) => {}
            Item::Term { text, .. } => {
                if text.trim().is_empty() || terms == MAX_TERMS {
                    continue;
                }
                terms += 1;
                if let Some(branch) = branches.last_mut() {
                    if negate {
                        branch.exclude.push(text.clone());
                    } else {
                        branch.include.push(text.clone());
                    }
                }
                negate = false;
            }
        }
    }
    branches.retain(|b| !b.include.is_empty());
    branches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_words_are_quoted() {
        assert_eq!(
            sanitize_query("hello world").as_deref(),
            Some(r#""hello" "world""#)
        );
    }

    #[test]
    fn balanced_phrases_survive_and_unbalanced_quotes_vanish() {
        assert_eq!(
            sanitize_query(r#"say "hello there" now"#).as_deref(),
            Some(r#""say" "hello there" "now""#)
        );
        assert_eq!(
            sanitize_query(r#"say "hello"#).as_deref(),
            Some(r#""say" "hello""#)
        );
        assert_eq!(sanitize_query(r#"""#), None);
    }

    #[test]
    fn prefix_marker_only_on_words() {
        assert_eq!(sanitize_query("deploy*").as_deref(), Some(r#""deploy"*"#));
        assert_eq!(sanitize_query("deploy**").as_deref(), Some(r#""deploy"*"#));
        assert_eq!(sanitize_query("*"), None);
        assert_eq!(sanitize_query("foo-*").as_deref(), Some(r#""foo-""#));
        assert_eq!(
            sanitize_trigram_query("deploy*").as_deref(),
            Some(r#""deploy""#)
        );
    }

    #[test]
    fn operators_only_between_terms() {
        assert_eq!(sanitize_query("foo AND").as_deref(), Some(r#""foo""#));
        assert_eq!(sanitize_query("OR foo").as_deref(), Some(r#""foo""#));
        assert_eq!(
            sanitize_query("foo OR NOT bar").as_deref(),
            Some(r#""foo" OR "bar""#)
        );
        assert_eq!(
            sanitize_query("foo NOT bar").as_deref(),
            Some(r#""foo" NOT "bar""#)
        );
        assert_eq!(
            sanitize_query("foo or bar").as_deref(),
            Some(r#""foo" "or" "bar""#)
        );
        assert_eq!(sanitize_query("AND OR NOT"), None);
    }

    #[test]
    fn column_filters_are_dropped() {
        assert_eq!(
            sanitize_query("content:secret").as_deref(),
            Some(r#""secret""#)
        );
        assert_eq!(sanitize_query("-role:x").as_deref(), Some(r#""x""#));
        assert_eq!(sanitize_query("col:"), None);
        assert_eq!(sanitize_query("12:30").as_deref(), Some(r#""12:30""#));
    }

    #[test]
    fn punctuation_only_terms_are_dropped_for_words_but_kept_for_trigrams() {
        assert_eq!(sanitize_query("- ^ (((  )))"), None);
        assert_eq!(sanitize_trigram_query("C++").as_deref(), Some(r#""C++""#));
        assert_eq!(sanitize_query("🎉"), None);
        assert_eq!(sanitize_trigram_query("🎉").as_deref(), Some(r#""🎉""#));
    }

    #[test]
    fn terms_and_length_are_capped() {
        let many = (0..100)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" ");
        let q = sanitize_query(&many).unwrap();
        assert_eq!(q.matches('"').count(), 2 * MAX_TERMS);
        let long = "a".repeat(10_000);
        let q = sanitize_query(&long).unwrap();
        assert_eq!(q.len(), MAX_QUERY_CHARS + 2);
    }

    #[test]
    fn control_characters_separate_terms() {
        assert_eq!(sanitize_query("a\0b").as_deref(), Some(r#""a" "b""#));
    }

    #[test]
    fn cjk_is_detected() {
        assert!(contains_cjk("去北京开会"));
        assert!(contains_cjk("カタカナ"));
        assert!(contains_cjk("한국어"));
        assert!(!contains_cjk("Zürich café"));
        assert!(has_short_term("北京"));
        assert!(!has_short_term("北京市 meeting"));
    }

    #[test]
    fn scan_branches_follow_fts_precedence() {
        let b = scan_branches(&parse("北京 NOT 上海 OR 东京"));
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].include, vec!["北京"]);
        assert_eq!(b[0].exclude, vec!["上海"]);
        assert_eq!(b[1].include, vec!["东京"]);
        assert!(scan_branches(&parse("NOT x")).is_empty());
    }
}
