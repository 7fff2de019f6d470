//! Full-text search over stored messages.
//!
//! Three ways to find a message, tried in this order:
//! 1. the word index (`unicode61`), ranked by bm25, for ordinary text;
//! 2. the trigram index, for CJK text (no spaces to split words on) and as a
//!    substring fallback when the word index finds nothing;
//! 3. a bounded `LIKE` scan, for terms shorter than the three characters a
//!    trigram needs (two-character Chinese words are common).

use std::collections::HashSet;

use rusqlite::types::Value;
use rusqlite::{Connection, params, params_from_iter};

use super::conn::OpResult;
use super::rows::{load_session, parse_role};
use crate::fts;
use crate::{SearchHit, SearchQuery, StoreError};

/// Sessions returned when the query asks for `limit: 0`.
pub(crate) const DEFAULT_LIMIT: usize = 10;

/// Most rows a `LIKE` scan looks at; it cannot use an index, so it is
/// bounded and prefers the newest rows.
const LIKE_SCAN_LIMIT: i64 = 2000;

// A term that occurs in a large share of all messages would otherwise
// have every one of its (possibly hundreds of thousands of) rows scored
// and joined, so search time would grow with the history. FTS5 walks the
// matches newest first and the query stops at the limit; queries with
// fewer matches, the usual case, rank all of them.
use crate::MAX_RANKED_MATCHES;

/// Characters of context either side of a `LIKE` match.
const LIKE_SNIPPET_CONTEXT: usize = 60;

const MARK_OPEN: &str = ">>>";
const MARK_CLOSE: &str = "<<<";
const ELLIPSIS: &str = "...";

#[derive(Clone, Copy)]
enum Index {
    Words,
    Trigrams,
}

impl Index {
    fn table(self) -> &'static str {
        match self {
            Index::Words => "messages_fts",
            Index::Trigrams => "messages_fts_trigram",
        }
    }

    /// Snippet length in tokens. Trigram tokens overlap, one per character,
    /// so they need the maximum FTS5 allows to show a useful window.
    fn snippet_tokens(self) -> u32 {
        match self {
            Index::Words => 24,
            Index::Trigrams => 64,
        }
    }
}

pub(crate) fn search(conn: &Connection, query: &SearchQuery) -> OpResult<Vec<SearchHit>> {
    let limit = if query.limit == 0 {
        DEFAULT_LIMIT
    } else {
        query.limit
    };
    let text = query.text.as_str();
    let short = fts::has_short_term(text);

    if !fts::contains_cjk(text)
        && let Some(expr) = fts::sanitize_query(text)
    {
        let hits = fts_search(conn, Index::Words, &expr, query, limit)?;
        // Short terms cannot use the trigram index, and a LIKE scan for
        // them would mostly find the same nothing, slowly.
        if !hits.is_empty() || short {
            return Ok(hits);
        }
    }
    if !short {
        return match fts::sanitize_trigram_query(text) {
            Some(expr) => fts_search(conn, Index::Trigrams, &expr, query, limit),
            None => Ok(Vec::new()),
        };
    }
    like_search(conn, text, query, limit)
}

/// `AND`-clauses for the source and exclusion filters, with their values.
fn filters(query: &SearchQuery) -> (String, Vec<Value>) {
    let mut sql = String::new();
    let mut values = Vec::new();
    if !query.sources.is_empty() {
        let marks = vec!["?"; query.sources.len()].join(", ");
        sql.push_str(&format!(" AND s.source IN ({marks})"));
        values.extend(query.sources.iter().cloned().map(Value::Text));
    }
    if let Some(exclude) = &query.exclude_session {
        sql.push_str(" AND m.session_id <> ?");
        values.push(Value::Text(exclude.clone()));
    }
    (sql, values)
}

fn sql_limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn fts_search(
    conn: &Connection,
    index: Index,
    expr: &str,
    query: &SearchQuery,
    limit: usize,
) -> OpResult<Vec<SearchHit>> {
    let table = index.table();
    let (filter_sql, filter_values) = filters(query);
    // bm25 weighs each term by how many rows hold it, and FTS5 counts
    // those by walking every match of the term once per query: for a term
    // in a third of a million-row history that walk alone took tens of
    // milliseconds. A query with more matches than are ranked is made of
    // words too common to tell rows apart, so it is answered by recency.
    if matches_more_than_ranked(conn, table, expr)? {
        return newest_matches(conn, index, expr, query, limit);
    }
    // The newest matches (see MAX_RANKED_MATCHES), then the best row per
    // session (lowest score, newer row on a tie), then the best sessions
    // (newer session on a tie).
    let sql = format!(
        "WITH hits AS (
             SELECT m.id AS mid, m.session_id AS sid, m.role AS role,
                    {table}.rank AS score, s.started_at AS started
             FROM {table}
             JOIN messages m ON m.id = {table}.rowid
             JOIN sessions s ON s.id = m.session_id
             WHERE {table} MATCH ?{filter_sql}
             ORDER BY {table}.rowid DESC
             LIMIT {MAX_RANKED_MATCHES}
         ),
         ranked AS (
             SELECT mid, sid, role, score, started,
                    ROW_NUMBER() OVER (PARTITION BY sid ORDER BY score, mid DESC) AS pick
             FROM hits
         )
         SELECT mid, sid, role, score FROM ranked
         WHERE pick = 1
         ORDER BY score, started DESC, mid DESC
         LIMIT ?"
    );
    let mut values = vec![Value::Text(expr.to_string())];
    values.extend(filter_values);
    values.push(Value::Integer(sql_limit(limit)));

    let rows: Vec<(i64, String, String, f64)> = conn
        .prepare(&sql)?
        .query_map(params_from_iter(values), |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?
        .collect::<rusqlite::Result<_>>()?;

    with_snippets(conn, index, expr, rows)
}

/// The sessions of the newest matches, each with its newest matching
/// message, newest first. Reads matches newest first and stops as soon as
/// `limit` sessions are found (or [`MAX_RANKED_MATCHES`] rows were read),
/// so a query for the commonest words costs about as much as a rare one.
/// Every hit has rank 0: nothing was scored.
fn newest_matches(
    conn: &Connection,
    index: Index,
    expr: &str,
    query: &SearchQuery,
    limit: usize,
) -> OpResult<Vec<SearchHit>> {
    let table = index.table();
    let (filter_sql, filter_values) = filters(query);
    let sql = format!(
        "SELECT m.id, m.session_id, m.role
         FROM {table}
         JOIN messages m ON m.id = {table}.rowid
         JOIN sessions s ON s.id = m.session_id
         WHERE {table} MATCH ?{filter_sql}
         ORDER BY {table}.rowid DESC
         LIMIT {MAX_RANKED_MATCHES}"
    );
    let mut values = vec![Value::Text(expr.to_string())];
    values.extend(filter_values);
    let mut stmt = conn.prepare(&sql)?;
    let mut matches = stmt.query(params_from_iter(values))?;
    let mut seen = HashSet::new();
    let mut rows = Vec::new();
    while rows.len() < limit
        && let Some(row) = matches.next()?
    {
        let session_id: String = row.get(1)?;
        if seen.insert(session_id.clone()) {
            rows.push((row.get(0)?, session_id, row.get(2)?, 0.0));
        }
    }
    with_snippets(conn, index, expr, rows)
}

/// The hits for `rows` (message id, session id, role, rank), with the
/// snippet of each message around what matched.
fn with_snippets(
    conn: &Connection,
    index: Index,
    expr: &str,
    rows: Vec<(i64, String, String, f64)>,
) -> OpResult<Vec<SearchHit>> {
    let table = index.table();
    let snippet_sql = format!(
        "SELECT snippet({table}, 0, '{MARK_OPEN}', '{MARK_CLOSE}', '{ELLIPSIS}', {tokens})
         FROM {table} WHERE {table} MATCH ?1 AND rowid = ?2",
        tokens = index.snippet_tokens()
    );
    let mut snippet_stmt = conn.prepare(&snippet_sql)?;
    let mut hits = Vec::with_capacity(rows.len());
    for (message_id, session_id, role, rank) in rows {
        let snippet: String = snippet_stmt.query_row(params![expr, message_id], |r| r.get(0))?;
        hits.push(make_hit(
            conn,
            message_id,
            &session_id,
            &role,
            snippet,
            rank,
        )?);
    }
    Ok(hits)
}

/// Whether `expr` matches more rows than one search ranks. Stops reading
/// matches at the first one past the bound.
fn matches_more_than_ranked(conn: &Connection, table: &str, expr: &str) -> OpResult<bool> {
    let sql = format!(
        "SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {table} MATCH ?1 LIMIT {})",
        MAX_RANKED_MATCHES + 1
    );
    let found: i64 = conn.prepare_cached(&sql)?.query_row([expr], |r| r.get(0))?;
    Ok(usize::try_from(found).is_ok_and(|n| n > MAX_RANKED_MATCHES))
}

fn make_hit(
    conn: &Connection,
    message_id: i64,
    session_id: &str,
    role: &str,
    snippet: String,
    rank: f64,
) -> OpResult<SearchHit> {
    let session = load_session(conn, session_id)?
        // The hit was joined to its session inside this same snapshot.
        .ok_or_else(|| StoreError::NoSuchSession(session_id.to_string()))?;
    Ok(SearchHit {
        session,
        message_id,
        role: parse_role(role, message_id)?,
        snippet,
        rank,
    })
}

/// A `LIKE` pattern matching `term` anywhere, with its wildcards escaped.
fn like_pattern(term: &str) -> String {
    let mut out = String::with_capacity(term.len() + 2);
    out.push('%');
    for c in term.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

fn like_search(
    conn: &Connection,
    text: &str,
    query: &SearchQuery,
    limit: usize,
) -> OpResult<Vec<SearchHit>> {
    let branches = fts::scan_branches(&fts::parse(text));
    if branches.is_empty() {
        return Ok(Vec::new());
    }
    let mut values = Vec::new();
    let mut clauses = Vec::new();
    for branch in &branches {
        let mut parts = Vec::new();
        for term in &branch.include {
            parts.push("m.content LIKE ? ESCAPE '\\'");
            values.push(Value::Text(like_pattern(term)));
        }
        for term in &branch.exclude {
            parts.push("m.content NOT LIKE ? ESCAPE '\\'");
            values.push(Value::Text(like_pattern(term)));
        }
        clauses.push(format!("({})", parts.join(" AND ")));
    }
    let (filter_sql, filter_values) = filters(query);
    values.extend(filter_values);
    values.push(Value::Integer(LIKE_SCAN_LIMIT));
    let sql = format!(
        "SELECT m.id, m.session_id, m.role, m.content
         FROM messages m JOIN sessions s ON s.id = m.session_id
         WHERE ({}){filter_sql}
         ORDER BY m.id DESC
         LIMIT ?",
        clauses.join(" OR ")
    );
    let rows: Vec<(i64, String, String, String)> = conn
        .prepare(&sql)?
        .query_map(params_from_iter(values), |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?
        .collect::<rusqlite::Result<_>>()?;

    let needles: Vec<&String> = branches.iter().flat_map(|b| &b.include).collect();
    let mut seen = HashSet::new();
    let mut hits = Vec::new();
    // Rows come newest first, so the first row of each session is its hit.
    for (message_id, session_id, role, content) in rows {
        if hits.len() == limit {
            break;
        }
        if !seen.insert(session_id.clone()) {
            continue;
        }
        let snippet = like_snippet(&content, &needles);
        // A scan has no relevance score; every hit ranks the same and the
        // order is recency.
        hits.push(make_hit(
            conn,
            message_id,
            &session_id,
            &role,
            snippet,
            0.0,
        )?);
    }
    Ok(hits)
}

/// An excerpt around the first needle found, marked like FTS5's snippets.
/// Matching folds ASCII case only, as SQLite's `LIKE` does.
fn like_snippet(content: &str, needles: &[&String]) -> String {
    let chars: Vec<char> = content.chars().collect();
    for needle in needles {
        let pattern: Vec<char> = needle.chars().collect();
        if pattern.is_empty() || pattern.len() > chars.len() {
            continue;
        }
        let found = chars.windows(pattern.len()).position(|window| {
            window
                .iter()
                .zip(&pattern)
                .all(|(a, b)| a.eq_ignore_ascii_case(b))
        });
        let Some(at) = found else { continue };
        let end_match = at + pattern.len();
        let start = at.saturating_sub(LIKE_SNIPPET_CONTEXT);
        let end = (end_match + LIKE_SNIPPET_CONTEXT).min(chars.len());
        let mut out = String::new();
        if start > 0 {
            out.push_str(ELLIPSIS);
        }
        out.extend(&chars[start..at]);
        out.push_str(MARK_OPEN);
        out.extend(&chars[at..end_match]);
        out.push_str(MARK_CLOSE);
        out.extend(&chars[end_match..end]);
        if end < chars.len() {
            out.push_str(ELLIPSIS);
        }
        return out;
    }
    let mut out: String = chars.iter().take(2 * LIKE_SNIPPET_CONTEXT).collect();
    if chars.len() > 2 * LIKE_SNIPPET_CONTEXT {
        out.push_str(ELLIPSIS);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_patterns_escape_wildcards() {
        assert_eq!(like_pattern("50%_x\\"), "%50\\%\\_x\\\\%");
    }

    #[test]
    fn like_snippet_marks_the_match() {
        let s = like_snippet("我们明天去北京开会", &[&"北京".to_string()]);
        assert_eq!(s, "我们明天去>>>北京<<<开会");
        let long = format!("{}needle{}", "a".repeat(100), "b".repeat(100));
        let s = like_snippet(&long, &[&"NEEDLE".to_string()]);
        assert!(s.starts_with("...") && s.ends_with("..."), "{s}");
        assert!(s.contains(">>>needle<<<"), "{s}");
    }
}
