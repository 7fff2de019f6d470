//! Snippets of search hits on PostgreSQL: which words of a hit match the
//! query, and the excerpt around them with the matches marked as FTS5's
//! `snippet` marks them in the SQLite backend.
//!
//! `search` finds the hits; this module only reads their text, and asks
//! the server (one round trip per search) to fold the words that are not
//! plain ASCII exactly as the index folds them, so a word is marked when
//! and only when the index matched it.

use std::collections::{HashMap, HashSet};

use super::PostgresStore;
use super::rows::clean;
use crate::{Result, StoreError};

/// Characters of a message in the word index. A `tsvector` holds at most
/// 1 MB of lexemes; at four bytes a character at worst this stays under
/// it, so no message is refused for its size. The schema (`search`'s
/// `SCHEMA`) writes the same number into the generated column.
pub(super) const WORD_INDEX_CHARS: usize = 100_000;

/// Tokens in a word-match snippet (FTS5's `snippet` gets 24 there).
const SNIPPET_TOKENS: usize = 24;

/// Characters of context either side of a substring match.
const SUBSTRING_CONTEXT: usize = 60;

/// Most distinct non-ASCII words sent to the server for folding while
/// marking one search's snippets; beyond it a word is shown unmarked.
const MAX_FOLDED_WORDS: usize = 10_000;

/// What opens and closes a marked run, and stands for cut text: FTS5's
/// `snippet` arguments in the SQLite backend, so hits read the same.
const MARK_OPEN: &str = ">>>";
const MARK_CLOSE: &str = "<<<";
const ELLIPSIS: &str = "...";

/// Decides which words of a hit to mark: the runs of words that spell one
/// of the wanted terms, lexeme by lexeme (the last one as a prefix, for a
/// prefix term). Both sides are folded the way the index folds.
pub(super) struct WordMarker {
    /// Each wanted term's lexemes in order, and whether it is a prefix.
    terms: Vec<(Vec<String>, bool)>,
    /// Lexemes (in order) of the non-ASCII words, as the server folds them.
    folded: HashMap<String, Vec<String>>,
}

impl WordMarker {
    /// Folds, in one round trip, whatever needs the server: the wanted
    /// terms and the hits' words that are not plain ASCII. An ASCII word
    /// (a run of letters and digits) folds to itself lower-cased, which
    /// needs no round trip.
    ///
    /// `terms` are the texts a match must contain, each with whether it is
    /// a prefix; `contents` are the hits' texts.
    pub(super) async fn new(
        store: &PostgresStore,
        client: &deadpool_postgres::Object,
        terms: &[(&str, bool)],
        contents: &[&str],
    ) -> Result<WordMarker> {
        let mut pending: Vec<String> = Vec::new();
        let mut queued = HashSet::new();
        for &(text, _) in terms {
            if !text.is_ascii() && queued.insert(text) {
                pending.push(clean(text).into_owned());
            }
        }
        'hits: for &content in contents {
            for (start, end) in word_spans(content).spans {
                let word = &content[start..end];
                if !word.is_ascii() && queued.insert(word) {
                    if pending.len() >= MAX_FOLDED_WORDS {
                        break 'hits;
                    }
                    pending.push(clean(word).into_owned());
                }
            }
        }
        let mut folded = HashMap::new();
        if !pending.is_empty() {
            let statement = client
                .prepare_cached(
                    "SELECT ARRAY(SELECT w.lexeme \
                         FROM unnest(to_tsvector('simple', talaria_fold(u.t))) \
                             AS w (lexeme, positions, weights), \
                         unnest(w.positions) AS p (pos) \
                         ORDER BY p.pos) \
                     FROM unnest($1::text[]) WITH ORDINALITY AS u (t, i) ORDER BY u.i",
                )
                .await
                .map_err(|e| store.error(e))?;
            let rows = client
                .query(&statement, &[&pending])
                .await
                .map_err(|e| store.error(e))?;
            if rows.len() != pending.len() {
                return Err(StoreError::Database(format!(
                    "folding {} words returned {} rows",
                    pending.len(),
                    rows.len()
                )));
            }
            for (word, row) in pending.into_iter().zip(&rows) {
                let lexemes: Vec<String> = store.column(row, 0)?;
                folded.insert(word, lexemes);
            }
        }
        let mut marker = WordMarker {
            terms: Vec::new(),
            folded,
        };
        marker.terms = terms
            .iter()
            .map(|&(text, prefix)| (marker.lexemes(text), prefix))
            .filter(|(lexemes, _)| !lexemes.is_empty())
            .collect();
        Ok(marker)
    }

    /// The lexemes of `text` as the index would have them, in order.
    fn lexemes(&self, text: &str) -> Vec<String> {
        if text.is_ascii() {
            text.split(|c: char| !c.is_ascii_alphanumeric())
                .filter(|w| !w.is_empty())
                .map(str::to_ascii_lowercase)
                .collect()
        } else {
            self.folded
                .get(clean(text).as_ref())
                .cloned()
                .unwrap_or_default()
        }
    }

    /// Runs of words to mark, as `[start, end)` word indexes: every place
    /// a wanted term matches, overlapping runs merged.
    fn runs(&self, content: &str, words: &Words) -> Vec<(usize, usize)> {
        let lexemes: Vec<Vec<String>> = words
            .spans
            .iter()
            .map(|&(start, end)| self.lexemes(&content[start..end]))
            .collect();
        let mut runs = Vec::new();
        for (wanted, prefix) in &self.terms {
            let len = wanted.len();
            for at in 0..lexemes.len().saturating_sub(len - 1) {
                let spelled = wanted.iter().enumerate().all(|(k, lexeme)| {
                    lexemes[at + k].iter().any(|have| {
                        have == lexeme || (*prefix && k == len - 1 && have.starts_with(lexeme))
                    })
                });
                if spelled {
                    runs.push((at, at + len));
                }
            }
        }
        runs.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(runs.len());
        for (start, end) in runs {
            match merged.last_mut() {
                Some(last) if start < last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        merged
    }

    /// An excerpt of about [`SNIPPET_TOKENS`] words, placed over the most
    /// marked words, marked like FTS5's snippets.
    pub(super) fn snippet(&self, content: &str) -> String {
        let words = word_spans(content);
        let runs = self.runs(content, &words);
        word_snippet(content, &words, &runs)
    }
}

/// Whether `c` belongs to a word for snippets: letters, digits, and the
/// combining marks the index folds away.
fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(u32::from(c), 0x0300..=0x036F)
}

/// The words of the indexed part of `content` (byte ranges), and where
/// that part ends.
struct Words {
    spans: Vec<(usize, usize)>,
    indexed_end: usize,
}

fn word_spans(content: &str) -> Words {
    let mut spans = Vec::new();
    let mut start = None;
    let mut indexed_end = content.len();
    for (n, (at, c)) in content.char_indices().enumerate() {
        if n == WORD_INDEX_CHARS {
            indexed_end = at;
            break;
        }
        match (is_word_char(c), start) {
            (true, None) => start = Some(at),
            (false, Some(from)) => {
                spans.push((from, at));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(from) = start {
        spans.push((from, indexed_end));
    }
    Words { spans, indexed_end }
}

/// Cuts the window of [`SNIPPET_TOKENS`] words with the most marked ones
/// (centred on them) out of `content`, marking each run of `runs` (word
/// index ranges, sorted, not overlapping) as one span. A window at either
/// end of the text takes the punctuation there along.
fn word_snippet(content: &str, words: &Words, runs: &[(usize, usize)]) -> String {
    let spans = &words.spans;
    let n = spans.len();
    if n == 0 {
        return substring_snippet(content, &[]);
    }
    let mut marked = vec![false; n];
    for &(start, end) in runs {
        marked[start..end].iter_mut().for_each(|m| *m = true);
    }
    let width = SNIPPET_TOKENS.min(n);
    // The first window with the most marks (a running count).
    let mut count = marked[..width].iter().filter(|&&m| m).count();
    let (mut best, mut best_count) = (0, count);
    for start in 1..=n - width {
        count += usize::from(marked[start + width - 1]);
        count -= usize::from(marked[start - 1]);
        if count > best_count {
            (best, best_count) = (start, count);
        }
    }
    // Centre the marks of that window in it.
    let mut first = best;
    if let Some(first_mark) = (best..best + width).find(|&i| marked[i]) {
        let last_mark = (best..best + width)
            .rev()
            .find(|&i| marked[i])
            .unwrap_or(first_mark);
        let slack = width - (last_mark - first_mark + 1);
        first = first_mark.saturating_sub(slack / 2).min(n - width);
    }
    let last = first + width - 1;

    let from = if first == 0 { 0 } else { spans[first].0 };
    let to = if last == n - 1 {
        words.indexed_end
    } else {
        spans[last].1
    };
    let shown: Vec<(usize, usize)> = runs
        .iter()
        .copied()
        .filter(|&(start, end)| start <= last && end > first)
        .collect();
    let mut out = String::new();
    if from > 0 {
        out.push_str(ELLIPSIS);
    }
    let mut at = from;
    let mut open = false;
    for (i, &(start, end)) in spans.iter().enumerate().take(last + 1).skip(first) {
        out.push_str(&content[at..start]);
        // A run cut by the window's start opens at its first word.
        if !open && shown.iter().any(|&(s, e)| s <= i && i < e) {
            out.push_str(MARK_OPEN);
            open = true;
        }
        out.push_str(&content[start..end]);
        if open && (i == last || shown.iter().any(|&(_, e)| e == i + 1)) {
            out.push_str(MARK_CLOSE);
            open = false;
        }
        at = end;
    }
    out.push_str(&content[at..to]);
    if to < content.len() {
        out.push_str(ELLIPSIS);
    }
    out
}

/// `text` with each character replaced by its first lower-case form,
/// and the byte offset in the result of each character of `text`: a
/// match found in the result maps back to characters of the original.
fn lowered(text: &str) -> (String, Vec<usize>) {
    let mut out = String::with_capacity(text.len());
    let mut starts = Vec::with_capacity(text.len());
    for c in text.chars() {
        starts.push(out.len());
        out.push(c.to_lowercase().next().unwrap_or(c));
    }
    (out, starts)
}

/// An excerpt around the first match of any needle, with every match in
/// it marked; matching ignores case, as `ILIKE` does.
pub(super) fn substring_snippet(content: &str, needles: &[String]) -> String {
    let chars: Vec<char> = content.chars().collect();
    let (haystack, starts) = lowered(content);
    // Matches as character ranges.
    let mut found: Vec<(usize, usize)> = Vec::new();
    for needle in needles {
        let (needle, _) = lowered(needle);
        let len = needle.chars().count();
        if len == 0 {
            continue;
        }
        let mut from = 0;
        while let Some(offset) = haystack[from..].find(&needle) {
            let byte = from + offset;
            if let Ok(at) = starts.binary_search(&byte) {
                found.push((at, at + len));
            }
            from = byte + needle.len();
        }
    }
    found.sort_unstable();
    let Some(&(anchor, anchor_end)) = found.first() else {
        let mut out: String = chars.iter().take(2 * SUBSTRING_CONTEXT).collect();
        if chars.len() > 2 * SUBSTRING_CONTEXT {
            out.push_str(ELLIPSIS);
        }
        return out;
    };
    let start = anchor.saturating_sub(SUBSTRING_CONTEXT);
    let end = (anchor_end + SUBSTRING_CONTEXT).min(chars.len());
    let mut out = String::new();
    if start > 0 {
        out.push_str(ELLIPSIS);
    }
    let mut at = start;
    for (from, to) in found {
        // Overlapping or cut by the window's edge: left unmarked.
        if from < at || to > end {
            continue;
        }
        out.extend(&chars[at..from]);
        out.push_str(MARK_OPEN);
        out.extend(&chars[from..to]);
        out.push_str(MARK_CLOSE);
        at = to;
    }
    out.extend(&chars[at..end]);
    if end < chars.len() {
        out.push_str(ELLIPSIS);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substring_snippets_mark_every_match_in_the_window() {
        let s = substring_snippet("我们明天去北京开会", &["北京".to_string()]);
        assert_eq!(s, "我们明天去>>>北京<<<开会");
        let s = substring_snippet("Foo and FOO", &["foo".to_string()]);
        assert_eq!(s, ">>>Foo<<< and >>>FOO<<<");
        let long = format!("{}needle{}", "a".repeat(100), "b".repeat(100));
        let s = substring_snippet(&long, &["NEEDLE".to_string()]);
        assert!(s.starts_with("...") && s.ends_with("..."), "{s}");
        assert!(s.contains(">>>needle<<<"), "{s}");
        // Case folding that changes a character's width keeps offsets right.
        let s = substring_snippet("İstanbul ẞtraße", &["ßtraße".to_string()]);
        assert_eq!(s, "İstanbul >>>ẞtraße<<<");
    }

    fn marker(terms: &[(&str, bool)]) -> WordMarker {
        let mut marker = WordMarker {
            terms: Vec::new(),
            folded: HashMap::new(),
        };
        marker.terms = terms
            .iter()
            .map(|&(t, prefix)| (marker.lexemes(t), prefix))
            .collect();
        marker
    }

    #[test]
    fn phrases_mark_as_one_run_and_prefixes_complete_words() {
        let text = "Reverse the proxy; then reverse proxy-pass it, or reversed proxies";
        let m = marker(&[("reverse proxy", false)]);
        assert_eq!(
            m.snippet(text),
            "Reverse the proxy; then >>>reverse proxy<<<-pass it, or reversed proxies"
        );
        let m = marker(&[("reverse prox", true), ("it", false)]);
        assert_eq!(
            m.snippet(text),
            "Reverse the proxy; then >>>reverse proxy<<<-pass >>>it<<<, or reversed proxies"
        );
    }

    #[test]
    fn word_snippets_centre_the_marks() {
        let text = (0..100)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" ");
        let words = word_spans(&text);
        let s = word_snippet(&text, &words, &[(50, 51)]);
        assert!(s.starts_with("...w39 ") && s.ends_with(" w62..."), "{s}");
        assert!(s.contains(">>>w50<<<"), "{s}");
        // A short text is shown whole, punctuation included.
        let text = "(Edit nginx.conf, then nginx!)";
        let words = word_spans(text);
        assert_eq!(
            word_snippet(text, &words, &[(1, 2), (4, 5)]),
            "(Edit >>>nginx<<<.conf, then >>>nginx<<<!)"
        );
        // A run is one span, however many words it covers.
        assert_eq!(
            word_snippet(text, &words, &[(1, 3)]),
            "(Edit >>>nginx.conf<<<, then nginx!)"
        );
    }
}
