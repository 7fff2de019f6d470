//! Full-text search over stored messages, on PostgreSQL.
//!
//! The same three ways to find a message as the SQLite backend
//! (`src/sqlite/search.rs`), tried in the same order:
//! 1. the word index, a `tsvector` of each message (config `simple`, so
//!    no language's stemming or stop words; accents folded), ranked by
//!    `ts_rank`;
//! 2. substrings, for CJK text (no spaces to split words on) and as the
//!    fallback when the word index finds nothing: `ILIKE`, served by a
//!    `pg_trgm` GIN index where the extension could be installed (and by
//!    a scan where it could not);
//! 3. a bounded, newest-first `ILIKE` scan for terms shorter than the
//!    three characters a trigram needs.
//!
//! User text never reaches a query parser. The query is taken apart by the
//! sanitizer's parser ([`crate::fts`]); each term is bound as a parameter
//! and turned into a `tsquery` by `phraseto_tsquery` (or, with a prefix
//! marker, by `talaria_prefix_query`, which quotes every lexeme itself),
//! and the terms are joined with the `tsquery` operators in SQL written
//! here. So no input can make a `tsquery` syntax error.
//!
//! Work is bounded as in the SQLite backend: only the newest
//! [`MAX_RANKED_MATCHES`] matching rows are ranked. The filter is a
//! constant when the statement is planned (each search is planned for
//! its own terms), so PostgreSQL can see a common word's frequency and
//! walk the primary key backwards instead of collecting every match.
//!
//! Differences from the SQLite backend, all in what a match looks like:
//! - words are split as PostgreSQL's default parser splits them, after
//!   ASCII and common Unicode punctuation became spaces (close to FTS5's
//!   `unicode61`, not identical for every script);
//! - only the first [`WORD_INDEX_CHARS`] characters of a message are in
//!   the word index (a `tsvector` is limited to 1 MB); a word past them is
//!   still found, by the substring fallback;
//! - `ts_rank` (normalised by document length) replaces bm25, and the
//!   substring ranking counts occurrences per length, where FTS5 runs bm25
//!   over trigrams; the sign and the order (lower is better) are the same;
//! - substring and short-term matching fold case for every script
//!   (`ILIKE`), where SQLite's `LIKE` folds only ASCII.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use tokio_postgres::types::ToSql;

use super::PostgresStore;
use super::sessions::{SESSION_COLUMNS, clean, parse_role, sql_len};
use crate::fts::{self, Item, Op};
use crate::{MAX_RANKED_MATCHES, Result, SearchHit, SearchQuery, StoreError};

/// Characters of a message in the word index. A `tsvector` holds at most
/// 1 MB of lexemes; at four bytes a character at worst this stays under
/// it, so no message is refused for its size.
const WORD_INDEX_CHARS: usize = 100_000;

/// DDL for search (part of schema step 1, after the sessions part).
///
/// `talaria_fold` is what both sides of a word match go through: ASCII
/// and common Unicode punctuation become spaces (so `nginx.conf` is two
/// words, as in FTS5, not one "file" token), then accents are removed
/// (decompose, drop the combining marks, recompose). Every function in it
/// is IMMUTABLE, so it can feed a stored generated column.
///
/// The trigram index needs the `pg_trgm` extension. Creating it can fail
/// (no permission, not installed); that must not fail the migration, so
/// it is tried in a block that catches the error, and the index is made
/// only if the operator class exists afterwards (in whatever schema the
/// extension lives). Without it substring search still works, by scanning.
pub(super) const SCHEMA: &str = r##"
CREATE FUNCTION talaria_fold(t text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $fold$
    SELECT CASE
        -- Plain ASCII (most tool output) has no accents: the costly
        -- normalisation is skipped.
        WHEN octet_length(t) = char_length(t) THEN
            regexp_replace(t,
                E'[\\u0021-\\u002f\\u003a-\\u0040\\u005b-\\u0060\\u007b-\\u007e]+',
                ' ', 'g')
        ELSE normalize(
            regexp_replace(
                normalize(
                    regexp_replace(t,
                        E'[\\u0021-\\u002f\\u003a-\\u0040\\u005b-\\u0060\\u007b-\\u007e\\u00a0\\u00ab\\u00b7\\u00bb\\u00bf\\u2000-\\u206f\\u3000-\\u3004\\u3008-\\u3020\\u3030]+',
                        ' ', 'g'),
                    NFD),
                E'[\\u0300-\\u036f]+', '', 'g'),
            NFC)
    END
$fold$;

-- A term with a trailing `*`: its lexemes as a phrase, the last one a
-- prefix. Lexemes are quoted here (quotes and backslashes doubled), so
-- the text cast to tsquery is never a syntax error; a term without
-- lexemes gives the empty query, as phraseto_tsquery does.
CREATE FUNCTION talaria_prefix_query(term text) RETURNS tsquery
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $prefix$
    SELECT CASE WHEN q.text IS NULL
                THEN phraseto_tsquery('simple', talaria_fold(term))
                ELSE q.text::tsquery END
    FROM (
        SELECT string_agg(
                   '''' || replace(replace(w.lexeme, E'\\', E'\\\\'), '''', '''''') || '''',
                   ' <-> ' ORDER BY p.pos) || ':*' AS text
        FROM unnest(to_tsvector('simple', talaria_fold(term))) AS w (lexeme, positions, weights),
             unnest(w.positions) AS p (pos)
    ) q
$prefix$;

ALTER TABLE messages ADD COLUMN search_words tsvector
    GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, talaria_fold(left(content, 100000))))
    STORED;
CREATE INDEX messages_words ON messages USING gin (search_words);

DO $trigrams$
DECLARE
    home text;
BEGIN
    BEGIN
        CREATE EXTENSION IF NOT EXISTS pg_trgm WITH SCHEMA public;
    EXCEPTION WHEN OTHERS THEN
        RAISE NOTICE 'pg_trgm is not available (%); substring search will scan', SQLERRM;
    END;
    SELECT n.nspname INTO home
    FROM pg_opclass c
    JOIN pg_am a ON a.oid = c.opcmethod
    JOIN pg_namespace n ON n.oid = c.opcnamespace
    WHERE c.opcname = 'gin_trgm_ops' AND a.amname = 'gin'
    LIMIT 1;
    IF home IS NOT NULL THEN
        EXECUTE format(
            'CREATE INDEX messages_trigrams ON messages USING gin (content %I.gin_trgm_ops)',
            home);
    END IF;
END
$trigrams$;
"##;

/// Sessions returned when the query asks for `limit: 0` (as in SQLite).
const DEFAULT_LIMIT: usize = 10;

/// Most matching rows the short-term scan collects, newest first. As in
/// SQLite, this bounds the matches, not the rows read: a short term that
/// matches little is looked for in every row.
const LIKE_SCAN_LIMIT: usize = 2000;

/// Tokens in a word-match snippet (FTS5's `snippet` gets 24 there).
const SNIPPET_TOKENS: usize = 24;

/// Characters of context either side of a substring match.
const SUBSTRING_CONTEXT: usize = 60;

/// Most distinct non-ASCII words sent to the server for folding while
/// marking one search's snippets; beyond it a word is shown unmarked.
const MAX_FOLDED_WORDS: usize = 10_000;

const MARK_OPEN: &str = ">>>";
const MARK_CLOSE: &str = "<<<";
const ELLIPSIS: &str = "...";

/// One term of a query in disjunctive normal form.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Term {
    text: String,
    /// A trailing `*`: matches words starting with the term.
    prefix: bool,
    /// Rows containing the term are excluded from its branch.
    negated: bool,
}

/// A query as `OR`-branches of `AND`ed terms: a row matches when it
/// matches every term of some branch. Every branch has a term that is
/// not negated.
type Branches = Vec<Vec<Term>>;

/// The sanitizer's rendering rules ([`fts::sanitize_query`]), producing
/// branches instead of an FTS5 string: terms `keep` accepts, at most
/// [`fts::MAX_TERMS`]; an operator counts only between two kept terms
/// (the first of a run wins). FTS5 binds `NOT` tighter than `AND` and
/// `AND` tighter than `OR`, and `a NOT b` means `a AND NOT b`, so `OR`
/// starts a branch and `NOT` negates the term after it.
fn rendered_branches(items: &[Item], keep: impl Fn(&str) -> bool, allow_prefix: bool) -> Branches {
    let mut branches: Branches = Vec::new();
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
                if terms == fts::MAX_TERMS {
                    break;
                }
                let op = pending.take();
                if branches.is_empty() || op == Some(Op::Or) {
                    branches.push(Vec::new());
                }
                if let Some(branch) = branches.last_mut() {
                    branch.push(Term {
                        text: text.clone(),
                        prefix: *prefix && allow_prefix,
                        negated: op == Some(Op::Not),
                    });
                }
                terms += 1;
            }
        }
    }
    branches
}

/// The short-term scan's reading of a query ([`fts::scan_branches`], as
/// the SQLite backend reads it), as terms.
fn like_branches(items: &[Item]) -> Branches {
    fts::scan_branches(items)
        .into_iter()
        .map(|branch| {
            let term = |negated: bool| {
                move |text: String| Term {
                    text,
                    prefix: false,
                    negated,
                }
            };
            let mut terms: Vec<Term> = branch.include.into_iter().map(term(false)).collect();
            terms.extend(branch.exclude.into_iter().map(term(true)));
            terms
        })
        .collect()
}

/// The texts of the terms a match must contain (the ones snippets mark).
fn wanted(branches: &Branches) -> Vec<String> {
    let mut seen = HashSet::new();
    branches
        .iter()
        .flatten()
        .filter(|t| !t.negated && seen.insert((t.text.clone(), t.prefix)))
        .map(|t| t.text.clone())
        .collect()
}

/// Bound parameters of a statement built per query.
#[derive(Default)]
struct Params {
    values: Vec<Box<dyn ToSql + Sync + Send>>,
}

impl Params {
    /// Binds `value` and returns its placeholder.
    fn bind(&mut self, value: impl ToSql + Sync + Send + 'static) -> String {
        self.values.push(Box::new(value));
        format!("${}", self.values.len())
    }

    fn refs(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.values
            .iter()
            .map(|v| v.as_ref() as &(dyn ToSql + Sync))
            .collect()
    }
}

/// The branches as one `tsquery` expression. Only the shape (which terms
/// are prefixes or negated, where branches split) is written into the
/// SQL; every term is a parameter.
fn tsquery_sql(branches: &Branches, params: &mut Params) -> String {
    let mut out = String::new();
    for (i, branch) in branches.iter().enumerate() {
        if i > 0 {
            out.push_str(" || ");
        }
        out.push('(');
        for (j, term) in branch.iter().enumerate() {
            if j > 0 {
                out.push_str(" && ");
            }
            let value = params.bind(clean(&term.text).into_owned());
            let query = if term.prefix {
                format!("talaria_prefix_query({value}::text)")
            } else {
                format!("phraseto_tsquery('simple', talaria_fold({value}::text))")
            };
            if term.negated {
                let _ = write!(out, "(!! {query})");
            } else {
                out.push_str(&query);
            }
        }
        out.push(')');
    }
    out
}

/// A `LIKE` pattern matching `term` anywhere, with its wildcards escaped
/// (the escape character is PostgreSQL's default, the backslash).
fn like_pattern(term: &str) -> String {
    let mut out = String::with_capacity(term.len() + 2);
    out.push('%');
    for c in clean(term).chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

/// The branches as a boolean expression of `ILIKE`s on `m.content`.
fn ilike_sql(branches: &Branches, params: &mut Params) -> String {
    let mut out = String::new();
    for (i, branch) in branches.iter().enumerate() {
        if i > 0 {
            out.push_str(" OR ");
        }
        out.push('(');
        for (j, term) in branch.iter().enumerate() {
            if j > 0 {
                out.push_str(" AND ");
            }
            let pattern = params.bind(like_pattern(&term.text));
            let not = if term.negated { "NOT " } else { "" };
            let _ = write!(out, "m.content {not}ILIKE {pattern}");
        }
        out.push(')');
    }
    out
}

/// `AND`-clauses for the source and exclusion filters.
fn filters_sql(query: &SearchQuery, params: &mut Params) -> String {
    let mut out = String::new();
    if !query.sources.is_empty() {
        let sources: Vec<String> = query
            .sources
            .iter()
            .map(|s| clean(s).into_owned())
            .collect();
        let _ = write!(out, " AND s.source = ANY({}::text[])", params.bind(sources));
    }
    if let Some(exclude) = &query.exclude_session {
        let _ = write!(
            out,
            " AND m.session_id <> {}::text",
            params.bind(clean(exclude).into_owned())
        );
    }
    out
}

/// How candidate rows are ordered within and across sessions.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    /// By score (lower is better), then the newer session, then the newer
    /// row: the word and trigram paths.
    Rank,
    /// By recency alone, every score 0: the short-term scan, which has no
    /// relevance to offer.
    Recency,
}

/// The statement shared by every path: the newest `scan_limit` rows
/// matching `condition` (after the filters), scored by `score` (an
/// expression over the CTE `hits`, whose columns are `id`, `session_id`
/// and `body`, the column named by `body`), the best row of each session,
/// the best `limit` sessions, joined to their session rows.
fn hits_sql(
    condition: &str,
    filters: &str,
    body: &str,
    score: &str,
    scan_limit: usize,
    order: Order,
    limit: &str,
) -> String {
    let (across, across_chosen) = match order {
        Order::Rank => (
            "score, started_at DESC, id DESC",
            "c.score, c.started_at DESC, c.id DESC",
        ),
        Order::Recency => ("id DESC", "c.id DESC"),
    };
    // The score is computed outside the LIMIT's subquery, so only the
    // rows kept are ranked; messages and sessions are joined for the
    // chosen few only.
    format!(
        "WITH hits AS (
             SELECT m.id, m.session_id, s.started_at, {body} AS body
             FROM messages m JOIN sessions s ON s.id = m.session_id
             WHERE ({condition}){filters}
             ORDER BY m.id DESC
             LIMIT {scan_limit}
         ),
         scored AS (
             SELECT id, session_id, started_at, ({score})::float8 AS score FROM hits
         ),
         ranked AS (
             SELECT id, session_id, started_at, score,
                    row_number() OVER (PARTITION BY session_id ORDER BY score, id DESC) AS pick
             FROM scored
         ),
         chosen AS (
             SELECT id, session_id, started_at, score FROM ranked
             WHERE pick = 1
             ORDER BY {across}
             LIMIT {limit}
         )
         SELECT c.id, c.score, m.role, m.content, {SESSION_COLUMNS}
         FROM chosen c
         JOIN messages m ON m.id = c.id
         JOIN sessions s ON s.id = c.session_id
         ORDER BY {across_chosen}"
    )
}

/// A hit before its snippet is made.
struct Found {
    hit: SearchHit,
    content: String,
}

/// Runs a statement built by [`hits_sql`] and decodes its rows.
async fn run_hits(
    store: &PostgresStore,
    client: &deadpool_postgres::Object,
    sql: &str,
    params: &Params,
) -> Result<Vec<Found>> {
    // Not a cached statement: the SQL differs with the query's shape, and
    // a statement prepared afresh is planned for these very terms.
    let rows = client
        .query(sql, &params.refs())
        .await
        .map_err(|e| store.error(e))?;
    rows.iter()
        .map(|row| {
            let message_id: i64 = store.column(row, 0)?;
            let role: String = store.column(row, 2)?;
            Ok(Found {
                hit: SearchHit {
                    session: store.session_from_row(row, 4)?,
                    message_id,
                    role: parse_role(&role, message_id)?,
                    snippet: String::new(),
                    rank: store.column(row, 1)?,
                },
                content: store.column(row, 3)?,
            })
        })
        .collect()
}

/// [`crate::SessionStore::search`] for PostgreSQL.
pub(super) async fn search(store: &PostgresStore, query: &SearchQuery) -> Result<Vec<SearchHit>> {
    let limit = if query.limit == 0 {
        DEFAULT_LIMIT
    } else {
        query.limit
    };
    let text = query.text.as_str();
    let items = fts::parse(text);
    let short = fts::has_short_term(text);
    let client = store.client().await?;

    if !fts::contains_cjk(text) {
        let words = rendered_branches(&items, |t| t.chars().any(char::is_alphanumeric), true);
        if !words.is_empty() {
            let hits = word_search(store, &client, &words, query, limit).await?;
            // As in SQLite: short terms cannot use the trigram index, and
            // a scan for them would mostly find the same nothing, slowly.
            if !hits.is_empty() || short {
                return Ok(hits);
            }
        }
    }
    if !short {
        let terms = rendered_branches(&items, |t| !t.trim().is_empty(), false);
        if terms.is_empty() {
            return Ok(Vec::new());
        }
        return substring_search(store, &client, &terms, query, limit, Order::Rank).await;
    }
    let terms = like_branches(&items);
    if terms.is_empty() {
        return Ok(Vec::new());
    }
    substring_search(store, &client, &terms, query, limit, Order::Recency).await
}

async fn word_search(
    store: &PostgresStore,
    client: &deadpool_postgres::Object,
    branches: &Branches,
    query: &SearchQuery,
    limit: usize,
) -> Result<Vec<SearchHit>> {
    let mut params = Params::default();
    let tsquery = tsquery_sql(branches, &mut params);
    let filters = filters_sql(query, &mut params);
    let limit = params.bind(sql_len(limit));
    // Normalisation 1 divides by 1 + log(length): of two rows with the
    // same matches the shorter ranks better, as with bm25.
    let sql = hits_sql(
        &format!("m.search_words @@ ({tsquery})"),
        &filters,
        "m.search_words",
        &format!("-ts_rank(body, ({tsquery}), 1)"),
        MAX_RANKED_MATCHES,
        Order::Rank,
        &limit,
    );
    let found = run_hits(store, client, &sql, &params).await?;
    if found.is_empty() {
        return Ok(Vec::new());
    }
    let marker = WordMarker::new(store, client, branches, &found).await?;
    Ok(found
        .into_iter()
        .map(|f| {
            let mut hit = f.hit;
            hit.snippet = marker.snippet(&f.content);
            hit
        })
        .collect())
}

async fn substring_search(
    store: &PostgresStore,
    client: &deadpool_postgres::Object,
    branches: &Branches,
    query: &SearchQuery,
    limit: usize,
    order: Order,
) -> Result<Vec<SearchHit>> {
    let mut params = Params::default();
    let condition = ilike_sql(branches, &mut params);
    let needles = wanted(branches);
    let (score, scan_limit) = match order {
        // Occurrences of the wanted terms per (log) length: more is
        // better, shorter is better. Counted on lower-cased text, which
        // is how ILIKE compares.
        Order::Rank => {
            let terms = params.bind(
                needles
                    .iter()
                    .map(|t| clean(t).into_owned())
                    .collect::<Vec<_>>(),
            );
            (
                format!(
                    "-(SELECT coalesce(sum((char_length(lower(body)) \
                     - char_length(replace(lower(body), lower(t), ''))) \
                     / char_length(lower(t))), 0) \
                     FROM unnest({terms}::text[]) AS t) \
                     / (1 + ln(1 + char_length(body)::float8))"
                ),
                MAX_RANKED_MATCHES,
            )
        }
        Order::Recency => ("0".to_owned(), LIKE_SCAN_LIMIT),
    };
    let filters = filters_sql(query, &mut params);
    let limit = params.bind(sql_len(limit));
    let sql = hits_sql(
        &condition,
        &filters,
        "m.content",
        &score,
        scan_limit,
        order,
        &limit,
    );
    let found = run_hits(store, client, &sql, &params).await?;
    Ok(found
        .into_iter()
        .map(|f| {
            let mut hit = f.hit;
            hit.snippet = substring_snippet(&f.content, &needles);
            hit
        })
        .collect())
}

/// Decides which words of a hit to mark: the runs of words that spell one
/// of the wanted terms, lexeme by lexeme (the last one as a prefix, for a
/// prefix term). Both sides are folded the way the index folds.
struct WordMarker {
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
    async fn new(
        store: &PostgresStore,
        client: &deadpool_postgres::Object,
        branches: &Branches,
        found: &[Found],
    ) -> Result<WordMarker> {
        let terms: Vec<&Term> = branches.iter().flatten().filter(|t| !t.negated).collect();
        let mut pending: Vec<String> = Vec::new();
        let mut queued = HashSet::new();
        for term in &terms {
            if !term.text.is_ascii() && queued.insert(term.text.as_str()) {
                pending.push(clean(&term.text).into_owned());
            }
        }
        'hits: for f in found {
            for (start, end) in word_spans(&f.content).spans {
                let word = &f.content[start..end];
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
            .map(|t| (marker.lexemes(&t.text), t.prefix))
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
    fn snippet(&self, content: &str) -> String {
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
fn substring_snippet(content: &str, needles: &[String]) -> String {
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

    fn parsed(text: &str) -> Branches {
        rendered_branches(
            &fts::parse(text),
            |t| t.chars().any(char::is_alphanumeric),
            true,
        )
    }

    fn shape(branches: &Branches) -> Vec<Vec<String>> {
        branches
            .iter()
            .map(|b| {
                b.iter()
                    .map(|t| {
                        format!(
                            "{}{}{}",
                            if t.negated { "-" } else { "" },
                            t.text,
                            if t.prefix { "*" } else { "" }
                        )
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_index_covers_what_snippets_read() {
        let limit = WORD_INDEX_CHARS.to_string();
        assert!(SCHEMA.contains(&format!("left(content, {limit})")));
    }

    #[test]
    fn branches_follow_fts5_precedence() {
        assert_eq!(
            shape(&parsed("a b NOT c OR d")),
            [vec!["a", "b", "-c"], vec!["d"]]
        );
        assert_eq!(shape(&parsed("foo OR NOT bar")), [vec!["foo"], vec!["bar"]]);
        assert_eq!(shape(&parsed("AND foo OR")), [vec!["foo"]]);
        assert_eq!(shape(&parsed("backu* \"x y\"")), [vec!["backu*", "x y"]]);
        assert!(parsed("AND OR NOT - ^").is_empty());
        // Dropped terms leave the pending operator in place, as in FTS5's
        // rendering.
        assert_eq!(shape(&parsed("a OR - b")), [vec!["a"], vec!["b"]]);
    }

    #[test]
    fn like_reading_matches_the_sqlite_scan() {
        let b = like_branches(&fts::parse("北京 NOT 上海 OR 东京"));
        assert_eq!(shape(&b), [vec!["北京", "-上海"], vec!["东京"]]);
        assert!(like_branches(&fts::parse("NOT x")).is_empty());
    }

    #[test]
    fn terms_are_parameters_never_sql() {
        let mut params = Params::default();
        let sql = tsquery_sql(&parsed("it's a* \"(x) | y\" NOT z*"), &mut params);
        assert_eq!(params.values.len(), 4);
        for user_text in ["it's", "(x)", "| y"] {
            assert!(!sql.contains(user_text), "{user_text:?} in {sql}");
        }
        assert!(sql.contains("talaria_prefix_query($2::text)"), "{sql}");
        assert!(sql.contains("(!! talaria_prefix_query($4::text))"), "{sql}");
    }

    #[test]
    fn like_patterns_escape_wildcards() {
        assert_eq!(like_pattern("50%_x\\"), "%50\\%\\_x\\\\%");
        assert_eq!(like_pattern("a\0b"), "%a\u{FFFD}b%");
    }

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
