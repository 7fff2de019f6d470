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
//! - only the first `WORD_INDEX_CHARS` (in `snippet`) characters of a message are in
//!   the word index (a `tsvector` is limited to 1 MB); a word past them is
//!   still found, by the substring fallback;
//! - `ts_rank` (normalised by document length) replaces bm25, and the
//!   substring ranking counts occurrences per length, where FTS5 runs bm25
//!   over trigrams; the sign and the order (lower is better) are the same;
//! - substring and short-term matching fold case for every script
//!   (`ILIKE`), where SQLite's `LIKE` folds only ASCII.

use std::collections::HashSet;
use std::fmt::Write as _;

use tokio_postgres::types::ToSql;

use super::PostgresStore;
use super::rows::{SESSION_COLUMNS, clean, parse_role, sql_len};
use super::snippet::{WordMarker, substring_snippet};
use crate::fts::{self, Item, Op};
use crate::{MAX_RANKED_MATCHES, Result, SearchHit, SearchQuery};

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
    let wanted: Vec<(&str, bool)> = branches
        .iter()
        .flatten()
        .filter(|t| !t.negated)
        .map(|t| (t.text.as_str(), t.prefix))
        .collect();
    let contents: Vec<&str> = found.iter().map(|f| f.content.as_str()).collect();
    let marker = WordMarker::new(store, client, &wanted, &contents).await?;
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
        use super::super::snippet::WORD_INDEX_CHARS;
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
}
