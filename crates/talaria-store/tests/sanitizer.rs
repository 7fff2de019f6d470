//! Sanitised queries are executed against real FTS5 tables: whatever the
//! input, the MATCH must not fail.

use proptest::prelude::*;
use rusqlite::Connection;
use talaria_store::fts::{sanitize_query, sanitize_trigram_query};

/// An in-file database with both tokenizers, shaped like the store's.
fn fts_db() -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let conn = Connection::open(dir.path().join("fts.db")).unwrap();
    conn.execute_batch(
        "CREATE TABLE docs (id INTEGER PRIMARY KEY, content TEXT NOT NULL);
         CREATE VIRTUAL TABLE words USING fts5 (content, content = 'docs', content_rowid = 'id',
             tokenize = 'unicode61 remove_diacritics 2');
         CREATE VIRTUAL TABLE grams USING fts5 (content, content = 'docs', content_rowid = 'id',
             tokenize = 'trigram');
         CREATE TRIGGER docs_ai AFTER INSERT ON docs BEGIN
             INSERT INTO words (rowid, content) VALUES (new.id, new.content);
             INSERT INTO grams (rowid, content) VALUES (new.id, new.content);
         END;",
    )
    .unwrap();
    for text in [
        "hello world",
        "foo AND bar OR baz NOT qux",
        "col:x near(a b) \"quoted\" (paren) ^caret -minus *star",
        "我们明天去北京开会",
        "emoji 🎉🚀 party",
        "Zürich café naïve",
    ] {
        conn.execute("INSERT INTO docs (content) VALUES (?1)", [text])
            .unwrap();
    }
    (dir, conn)
}

fn run(conn: &Connection, table: &str, expr: &str) -> rusqlite::Result<usize> {
    let sql = format!(
        "SELECT rowid, snippet({table}, 0, '[', ']', '...', 8), bm25({table}) \
         FROM {table} WHERE {table} MATCH ?1 ORDER BY rank"
    );
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map([expr], |r| r.get::<_, i64>(0))?;
    let mut n = 0;
    for row in rows {
        row?;
        n += 1;
    }
    Ok(n)
}

/// Runs what the sanitizers make of `input` against both tables; panics
/// when a MATCH fails. Says which of the two produced a query, so a test
/// can count how often the check had something to check.
fn check(conn: &Connection, input: &str) -> (bool, bool) {
    let words = sanitize_query(input);
    if let Some(expr) = &words {
        run(conn, "words", expr)
            .unwrap_or_else(|e| panic!("words: input {input:?} -> {expr:?}: {e}"));
    }
    let grams = sanitize_trigram_query(input);
    if let Some(expr) = &grams {
        run(conn, "grams", expr)
            .unwrap_or_else(|e| panic!("grams: input {input:?} -> {expr:?}: {e}"));
    }
    (words.is_some(), grams.is_some())
}

/// Runs `check` on `cases` inputs drawn from `strategy`, and returns how
/// many produced a words query and how many a trigram query.
fn check_many(strategy: impl Strategy<Value = String>, cases: u32) -> (usize, usize) {
    use proptest::test_runner::{Config, TestRunner};
    use std::cell::Cell;
    let (_dir, conn) = fts_db();
    let (words, grams) = (Cell::new(0), Cell::new(0));
    let mut runner = TestRunner::new(Config::with_cases(cases));
    runner
        .run(&strategy, |input| {
            let (w, g) = check(&conn, &input);
            words.set(words.get() + usize::from(w));
            grams.set(grams.get() + usize::from(g));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    (words.get(), grams.get())
}

#[test]
fn raw_hostile_queries_really_do_break_fts5() {
    // Guards the test itself: these inputs are errors when passed through
    // unsanitised, so the checks below prove the sanitiser does something.
    let (_dir, conn) = fts_db();
    for raw in ["\"", "(((", "foo AND", "NEAR(", "col:x", "*", "-", "^"] {
        assert!(
            run(&conn, "words", raw).is_err(),
            "{raw:?} unexpectedly valid"
        );
    }
}

#[test]
fn hostile_queries_are_safe() {
    let (_dir, conn) = fts_db();
    let long = "x".repeat(10_000);
    let long_words = "word ".repeat(5_000);
    let many_quotes = "\"".repeat(1001);
    let hostile = [
        "\"",
        "\"\"",
        "\"\"\"",
        "(((",
        ")))",
        "foo AND",
        "AND foo",
        "foo OR",
        "NOT foo",
        "foo NOT",
        "foo AND OR NOT bar",
        "NEAR(",
        "NEAR(a b, 3)",
        "NEAR/3",
        "col:x",
        "content:x",
        "{content}: x",
        "-content:x",
        "*",
        "**",
        "foo**",
        "*foo",
        "-",
        "--",
        "^",
        "^foo",
        "+",
        "a + b",
        ":",
        "::",
        ",",
        ".",
        "'",
        "\\",
        "\0",
        "a\0b",
        "\u{1}\u{7f}",
        "💥",
        "👨‍👩‍👧‍👦",
        "é",
        "e\u{301}",
        "北",
        "北京",
        "我们明天去北京开会",
        "\u{200b}",
        "\u{feff}foo",
        "\u{fffd}",
        "Ω≈ç√∫",
        "\"unterminated phrase",
        "balanced \"phrase here\" tail",
        "\"phrase\"*",
        "\"\"*",
        "\"-\"*",
        "² *",
        "²*",
        &long,
        &long_words,
        &many_quotes,
    ];
    let (mut words, mut grams) = (0, 0);
    for input in hostile {
        let (w, g) = check(&conn, input);
        words += usize::from(w);
        grams += usize::from(g);
    }
    eprintln!(
        "{words} words and {grams} trigram queries of {}",
        hostile.len()
    );
    // Most of these hold a word worth searching for: a sanitizer that gave
    // up on them (or on everything) would pass the checks vacuously. The
    // counts are today's; a sanitizer that makes fewer queries is a change
    // to look at.
    assert!(
        words >= 32,
        "only {words} of {} made a words query",
        hostile.len()
    );
    assert!(
        grams >= 47,
        "only {grams} of {} made a trigram query",
        hostile.len()
    );
}

#[test]
fn sanitised_queries_still_find_things() {
    let (_dir, conn) = fts_db();
    let count = |table: &str, q: &str| {
        let expr = if table == "words" {
            sanitize_query(q)
        } else {
            sanitize_trigram_query(q)
        };
        run(&conn, table, &expr.unwrap()).unwrap()
    };
    assert_eq!(count("words", "hello"), 1);
    assert_eq!(count("words", "hel*"), 1);
    assert_eq!(count("words", "\"hello world\""), 1);
    assert_eq!(count("words", "hello OR quoted"), 2);
    assert_eq!(count("words", "zurich"), 1);
    assert_eq!(count("words", "col:x"), 1);
    assert_eq!(count("grams", "北京开会"), 1);
    assert_eq!(count("grams", "\"🎉🚀 p\""), 1);
    // Terms under three characters carry no trigrams and cannot match.
    assert_eq!(count("grams", "🎉🚀 p"), 0);
}

/// Strings heavy in FTS5 syntax, to reach the awkward corners more often
/// than uniformly random text would.
fn syntaxy() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("\"".to_string()),
        Just("(".to_string()),
        Just(")".to_string()),
        Just("*".to_string()),
        Just(":".to_string()),
        Just("^".to_string()),
        Just("-".to_string()),
        Just("+".to_string()),
        Just(" ".to_string()),
        Just("AND".to_string()),
        Just("OR".to_string()),
        Just("NOT".to_string()),
        Just("NEAR".to_string()),
        Just("{".to_string()),
        Just("}".to_string()),
        Just(",".to_string()),
        Just("北京".to_string()),
        Just("\0".to_string()),
        "[a-z]{1,5}",
        "\\PC{1,3}",
    ];
    prop::collection::vec(piece, 0..24).prop_map(|v| v.concat())
}

const CASES: u32 = 512;

#[test]
fn arbitrary_text_never_breaks_match() {
    let (words, grams) = check_many(any::<String>(), CASES);
    eprintln!("{words} words and {grams} trigram queries of {CASES}");
    // Random text is mostly letters of some script: most of it must make a
    // query, or the property above held for nothing.
    assert!(
        words * 2 > CASES as usize,
        "{words} words queries of {CASES}"
    );
    assert!(
        grams * 2 > CASES as usize,
        "{grams} trigram queries of {CASES}"
    );
}

#[test]
fn syntax_soup_never_breaks_match() {
    let (words, grams) = check_many(syntaxy(), CASES);
    eprintln!("{words} words and {grams} trigram queries of {CASES}");
    assert!(
        words * 2 > CASES as usize,
        "{words} words queries of {CASES}"
    );
    assert!(
        grams * 2 > CASES as usize,
        "{grams} trigram queries of {CASES}"
    );
}
