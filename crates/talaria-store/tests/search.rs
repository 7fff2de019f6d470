//! Full-text search through the store, on both backends.

use crate::common;

use common::{Backend, Fixture, new_session};
use talaria_core::{Message, Role};
use talaria_store::{SearchQuery, SessionStore};

fn query(text: &str) -> SearchQuery {
    SearchQuery {
        text: text.to_string(),
        sources: Vec::new(),
        exclude_session: None,
        limit: 10,
    }
}

async fn seed<S: SessionStore>(store: &S) {
    let sessions: [(&str, &str, &[&str]); 4] = [
        (
            "s1",
            "cli",
            &[
                "How do I configure the nginx reverse proxy?",
                "Edit nginx.conf and add a proxy_pass line for nginx.",
                "Thanks, the café menu works now",
            ],
        ),
        (
            "s2",
            "telegram",
            &["nginx keeps returning 502", "Check the upstream"],
        ),
        (
            "s3",
            "cron",
            &["nightly backup finished", "我们明天去北京开会"],
        ),
        (
            "s4",
            "cli",
            &["Beijing weather is sunny", "東京タワーに行きました"],
        ),
    ];
    for (id, source, texts) in sessions {
        store.create_session(new_session(id, source)).await.unwrap();
        for (i, t) in texts.iter().enumerate() {
            let m = if i % 2 == 0 {
                Message::user(*t)
            } else {
                Message::assistant(*t)
            };
            store.append_message(id, &m).await.unwrap();
        }
    }
}

fn ids(hits: &[talaria_store::SearchHit]) -> Vec<String> {
    hits.iter().map(|h| h.session.id.clone()).collect()
}

async fn english_search_gives_one_hit_per_session<S: Backend + SessionStore>(store: Fixture<S>) {
    seed(&*store).await;
    let hits = store.search(query("nginx")).await.unwrap();
    let mut found = ids(&hits);
    found.sort();
    assert_eq!(found, ["s1", "s2"]);
    for h in &hits {
        assert!(h.snippet.contains(">>>nginx<<<"), "{}", h.snippet);
        assert!(h.rank < 0.0, "bm25 ranks are negative: {}", h.rank);
    }
    // Ranks come back best first.
    assert!(hits.windows(2).all(|w| w[0].rank <= w[1].rank));
    // The hit carries its session and the matched row.
    let s2 = hits.iter().find(|h| h.session.id == "s2").unwrap();
    assert_eq!(s2.session.source, "telegram");
    assert_eq!(s2.role, Role::User);
    let window = store
        .message_window("s2", s2.message_id, 0, 0)
        .await
        .unwrap();
    assert!(window[0].message.content.contains("502"));
}

async fn filters_and_limit<S: Backend + SessionStore>(store: Fixture<S>) {
    seed(&*store).await;
    let mut q = query("nginx");
    q.exclude_session = Some("s1".into());
    assert_eq!(ids(&store.search(q).await.unwrap()), ["s2"]);

    let mut q = query("nginx");
    q.sources = vec!["cli".into(), "cron".into()];
    assert_eq!(ids(&store.search(q).await.unwrap()), ["s1"]);

    let mut q = query("nginx");
    q.sources = vec!["api".into()];
    assert!(store.search(q).await.unwrap().is_empty());

    let mut q = query("nginx");
    q.limit = 1;
    assert_eq!(store.search(q).await.unwrap().len(), 1);
}

async fn prefix_phrase_operators_and_diacritics<S: Backend + SessionStore>(store: Fixture<S>) {
    seed(&*store).await;
    assert_eq!(ids(&store.search(query("backu*")).await.unwrap()), ["s3"]);
    assert_eq!(
        ids(&store.search(query(r#""reverse proxy""#)).await.unwrap()),
        ["s1"]
    );
    assert!(
        store
            .search(query(r#""proxy reverse""#))
            .await
            .unwrap()
            .is_empty()
    );
    let mut both = ids(&store.search(query("backup OR upstream")).await.unwrap());
    both.sort();
    assert_eq!(both, ["s2", "s3"]);
    // NOT applies per message: both s1 rows mention "proxy".
    assert_eq!(
        ids(&store.search(query("nginx NOT proxy")).await.unwrap()),
        ["s2"]
    );
    // Accents are folded: "cafe" finds "café".
    assert_eq!(ids(&store.search(query("cafe")).await.unwrap()), ["s1"]);
}

async fn cjk_search_uses_trigrams_and_like<S: Backend + SessionStore>(store: Fixture<S>) {
    seed(&*store).await;
    // Two characters: shorter than a trigram, found by the LIKE scan.
    let hits = store.search(query("北京")).await.unwrap();
    assert_eq!(ids(&hits), ["s3"]);
    assert!(
        hits[0].snippet.contains(">>>北京<<<"),
        "{}",
        hits[0].snippet
    );
    assert_eq!(hits[0].role, Role::Assistant);
    // Three or more: the trigram index.
    let hits = store.search(query("北京开会")).await.unwrap();
    assert_eq!(ids(&hits), ["s3"]);
    assert!(hits[0].snippet.contains("北京开会"), "{}", hits[0].snippet);
    // Japanese kana/kanji.
    assert_eq!(ids(&store.search(query("タワー")).await.unwrap()), ["s4"]);
    // Not present.
    assert!(store.search(query("上海")).await.unwrap().is_empty());
    assert!(store.search(query("上海市")).await.unwrap().is_empty());
    // Filters apply on the LIKE path too.
    let mut q = query("北京");
    q.exclude_session = Some("s3".into());
    assert!(store.search(q).await.unwrap().is_empty());
}

async fn substring_fallback_finds_inside_words<S: Backend + SessionStore>(store: Fixture<S>) {
    seed(&*store).await;
    // "eijin" is inside "Beijing"; the word index has no such token.
    assert_eq!(ids(&store.search(query("eijin")).await.unwrap()), ["s4"]);
    // Symbols only the trigram index sees.
    store
        .create_session(new_session("s5", "cli"))
        .await
        .unwrap();
    store
        .append_message("s5", &Message::user("I write C++ daily"))
        .await
        .unwrap();
    assert_eq!(ids(&store.search(query("C++")).await.unwrap()), ["s5"]);
    // Short emoji-only queries go to the LIKE scan.
    store
        .append_message("s5", &Message::user("party 🎉 time"))
        .await
        .unwrap();
    assert_eq!(ids(&store.search(query("🎉")).await.unwrap()), ["s5"]);
}

async fn best_hit_per_session_prefers_rank_then_newest<S: Backend + SessionStore>(
    store: Fixture<S>,
) {
    store
        .create_session(new_session("s1", "cli"))
        .await
        .unwrap();
    let _first = store
        .append_message("s1", &Message::user("zebra"))
        .await
        .unwrap();
    let second = store
        .append_message("s1", &Message::user("zebra"))
        .await
        .unwrap();
    store
        .append_message(
            "s1",
            &Message::user("a long message that mentions zebra once among many other words here"),
        )
        .await
        .unwrap();
    let hits = store.search(query("zebra")).await.unwrap();
    assert_eq!(hits.len(), 1);
    // Two equally ranked short rows: the newer one wins.
    assert_eq!(hits[0].message_id, second);
}

async fn empty_and_hostile_queries_do_not_fail<S: Backend + SessionStore>(store: Fixture<S>) {
    seed(&*store).await;
    for q in [
        "",
        "   ",
        "\"",
        "(((",
        "foo AND",
        "NEAR(",
        "col:x",
        "*",
        "-",
        "^",
        "AND",
        "OR NOT",
        "\0",
        "%",
        "_",
        "\\",
        "'",
        "'; DROP TABLE messages; --",
        "🎉🎉🎉",
        "a",
        "北",
    ] {
        store
            .search(query(q))
            .await
            .unwrap_or_else(|e| panic!("{q:?}: {e}"));
    }
    let long = "nginx ".repeat(2000);
    store.search(query(&long)).await.unwrap();
    // The LIKE scan treats wildcards literally.
    assert!(store.search(query("%")).await.unwrap().is_empty());
    // Only s1 has a literal underscore ("proxy_pass").
    assert_eq!(ids(&store.search(query("_")).await.unwrap()), ["s1"]);
    // Still intact afterwards.
    assert_eq!(store.search(query("backup")).await.unwrap().len(), 1);
}

/// Only the newest `MAX_RANKED_MATCHES` matches are ranked: an old message
/// that would score best is found while it is among them, and no longer
/// once that many newer messages match too.
async fn only_the_newest_matches_are_ranked<S: Backend + SessionStore>(store: Fixture<S>) {
    store
        .create_session(new_session("old", "cli"))
        .await
        .unwrap();
    store
        .append_message(
            "old",
            &Message::user("zebra zebra zebra zebra zebra, all about zebra"),
        )
        .await
        .unwrap();
    store
        .create_session(new_session("new", "cli"))
        .await
        .unwrap();
    let filler = "a long message that mentions zebra once among many other words";
    for _ in 0..talaria_store::MAX_RANKED_MATCHES - 1 {
        store
            .append_message("new", &Message::user(filler))
            .await
            .unwrap();
    }
    let hits = store.search(query("zebra")).await.unwrap();
    assert_eq!(
        ids(&hits),
        ["old", "new"],
        "the old message is still ranked"
    );

    store
        .append_message("new", &Message::user(filler))
        .await
        .unwrap();
    let hits = store.search(query("zebra")).await.unwrap();
    assert_eq!(
        ids(&hits),
        ["new"],
        "the old message fell out of the ranked set"
    );
}

/// Accents are folded on both sides of a word match, punctuation splits
/// words (`nginx.conf`, `proxy_pass`), and the snippet marks the word as
/// written.
async fn accents_fold_both_ways_and_punctuation_splits_words<S: Backend + SessionStore>(
    store: Fixture<S>,
) {
    seed(&*store).await;
    store
        .create_session(new_session("s5", "cli"))
        .await
        .unwrap();
    store
        .append_message("s5", &Message::user("meet me in Zurich at the cafe"))
        .await
        .unwrap();
    let mut both = ids(&store.search(query("café")).await.unwrap());
    both.sort();
    assert_eq!(both, ["s1", "s5"]);
    assert_eq!(ids(&store.search(query("ZÜRICH")).await.unwrap()), ["s5"]);
    let hits = store.search(query("cafe")).await.unwrap();
    let s1 = hits.iter().find(|h| h.session.id == "s1").unwrap();
    assert!(s1.snippet.contains(">>>café<<<"), "{}", s1.snippet);
    assert_eq!(ids(&store.search(query("conf")).await.unwrap()), ["s1"]);
    assert_eq!(ids(&store.search(query("pass")).await.unwrap()), ["s1"]);
    assert_eq!(ids(&store.search(query("caf*")).await.unwrap()).len(), 2);
}

/// Operators bind as in FTS5: `NOT` tighter than `AND` (written or
/// implied), `AND` tighter than `OR`. Each query below would answer
/// differently under another precedence.
async fn operator_precedence_is_fts5s<S: Backend + SessionStore>(store: Fixture<S>) {
    seed(&*store).await;
    let sorted = |hits: Vec<talaria_store::SearchHit>| {
        let mut found = ids(&hits);
        found.sort();
        found
    };
    // (nginx NOT returning) OR keeps, not nginx NOT (returning OR keeps).
    assert_eq!(
        sorted(
            store
                .search(query("nginx NOT returning OR keeps"))
                .await
                .unwrap()
        ),
        ["s1", "s2"]
    );
    // (nginx returning) OR backup, not nginx (returning OR backup).
    assert_eq!(
        sorted(
            store
                .search(query("nginx returning OR backup"))
                .await
                .unwrap()
        ),
        ["s2", "s3"]
    );
    assert_eq!(
        sorted(
            store
                .search(query("nginx AND returning OR backup"))
                .await
                .unwrap()
        ),
        ["s2", "s3"]
    );
    // backup OR (nginx NOT proxy NOT configure): s1's rows all name a
    // proxy, so only s2 and s3.
    assert_eq!(
        sorted(
            store
                .search(query("backup OR nginx NOT proxy NOT configure"))
                .await
                .unwrap()
        ),
        ["s2", "s3"]
    );
}

/// A deterministic generator, so a failing query can be reproduced.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// The syntax of every query language involved (FTS5, `tsquery`, `LIKE`,
/// SQL) typed as a query is searched for as text, never parsed: no input
/// fails, and the store still answers afterwards.
async fn query_syntax_of_any_backend_is_plain_text<S: Backend + SessionStore>(store: Fixture<S>) {
    seed(&*store).await;
    store
        .create_session(new_session("s5", "cli"))
        .await
        .unwrap();
    store
        .append_message(
            "s5",
            &Message::user("operators a&b|c !x <-> 'quoted' back\\slash 100% done_ok"),
        )
        .await
        .unwrap();
    let pieces = [
        "nginx",
        "a",
        "b",
        "x",
        "&",
        "|",
        "!",
        "!!",
        ":*",
        ":",
        "*",
        "'",
        "''",
        "\"",
        "(",
        ")",
        "<->",
        "<2>",
        "<-2>",
        "\\",
        "%",
        "_",
        "AND",
        "OR",
        "NOT",
        "NEAR(",
        "col:",
        "^",
        "-",
        "+",
        "北京",
        "é",
        "🎉",
        "\0",
        "\t",
        "$1",
        "::tsquery",
        "E'\\\\'",
        "'; DROP TABLE messages; --",
        "&&",
        "||",
        "@@",
        ":A",
        ":*B",
        "a:1",
        "\u{301}",
        "\u{3000}",
        "\u{a0}",
        "'s",
        "\\'",
    ];
    for q in [
        "a & b",
        "!x",
        "a:*",
        "'quoted'",
        "a <-> b",
        "a <2> b",
        "(a | b) & !c",
        "\\",
        "' OR 1=1 --",
        "nginx:*",
        "nginx:A",
        "x & (",
        "!",
        "<->",
        ":*",
        "''",
        "E'\\x'",
        "\u{301}",
        "é\u{301}",
    ] {
        store
            .search(query(q))
            .await
            .unwrap_or_else(|e| panic!("{q:?}: {e}"));
    }
    let mut rng = Lcg(0x5441_4C41);
    for _ in 0..300 {
        let n = 1 + rng.next(8);
        let mut q = String::new();
        for _ in 0..n {
            if rng.next(2) == 0 {
                q.push(' ');
            }
            q.push_str(pieces[rng.next(pieces.len())]);
        }
        store
            .search(query(&q))
            .await
            .unwrap_or_else(|e| panic!("{q:?}: {e}"));
    }
    // Syntax characters are text: the trigram path finds them literally.
    assert_eq!(ids(&store.search(query("a&b|c")).await.unwrap()), ["s5"]);
    assert_eq!(ids(&store.search(query("<->")).await.unwrap()), ["s5"]);
    assert_eq!(ids(&store.search(query("100%")).await.unwrap()), ["s5"]);
    assert_eq!(
        ids(&store.search(query("back\\slash")).await.unwrap()),
        ["s5"]
    );
    assert_eq!(store.search(query("backup")).await.unwrap().len(), 1);
}

contract_tests!(
    english_search_gives_one_hit_per_session,
    filters_and_limit,
    prefix_phrase_operators_and_diacritics,
    cjk_search_uses_trigrams_and_like,
    substring_fallback_finds_inside_words,
    best_hit_per_session_prefers_rank_then_newest,
    empty_and_hostile_queries_do_not_fail,
    only_the_newest_matches_are_ranked,
    accents_fold_both_ways_and_punctuation_splits_words,
    operator_precedence_is_fts5s,
    query_syntax_of_any_backend_is_plain_text,
);

/// What only the SQLite backend does.
mod sqlite_only {
    use super::*;

    /// When more messages match than are ranked, bm25 would need a walk
    /// over every match to weigh the words; SQLite answers by recency
    /// instead, so a session whose message would score better comes after
    /// one with a newer match.
    #[tokio::test]
    async fn words_in_more_messages_than_are_ranked_give_the_newest_first() {
        let (_dir, store) = common::temp_store();
        for id in ["older", "newer"] {
            store.create_session(new_session(id, "cli")).await.unwrap();
        }
        let focused = "zebra zebra zebra, all about zebra";
        let filler = "a long message that mentions zebra once among many other words";
        let add = |session: &'static str, text: &'static str| {
            let store = store.clone();
            async move {
                store
                    .append_message(session, &Message::user(text))
                    .await
                    .unwrap()
            }
        };
        add("older", focused).await;
        add("newer", filler).await;
        assert_eq!(
            ids(&store.search(query("zebra")).await.unwrap()),
            ["older", "newer"],
            "few matches are ranked by bm25"
        );
        for _ in 0..talaria_store::MAX_RANKED_MATCHES {
            add("newer", filler).await;
        }
        // Among the newest matches, and the best of them by bm25.
        add("older", focused).await;
        let newest = add("newer", filler).await;
        let hits = store.search(query("zebra")).await.unwrap();
        assert_eq!(ids(&hits), ["newer", "older"], "newest first");
        assert_eq!(hits[0].message_id, newest);
        // Recency of the match, not of the session's start.
        let newest = add("older", filler).await;
        let hits = store.search(query("zebra")).await.unwrap();
        assert_eq!(ids(&hits), ["older", "newer"]);
        assert_eq!(hits[0].message_id, newest);
    }
}

/// What only the PostgreSQL backend has: its indexes, and a schema that
/// may lack the trigram one.
mod postgres_only {
    use super::*;
    use talaria_store::PostgresStore;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_word_and_trigram_indexes_exist_where_pg_trgm_does() {
        let f = PostgresStore::fresh().await;
        let found = f
            .query_f64(
                "SELECT count(*) FROM pg_indexes WHERE schemaname = current_schema() \
                 AND indexname IN ('messages_words', 'messages_trigrams')",
            )
            .await;
        assert_eq!(found, Some(2.0));
    }

    /// Where `pg_trgm` could not be installed the migration makes no
    /// trigram index; substring and CJK search give the same answers, by
    /// scanning.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn substring_search_works_without_the_trigram_index() {
        let f = PostgresStore::fresh().await;
        seed(&*f).await;
        f.execute("DROP INDEX messages_trigrams").await;
        assert_eq!(ids(&f.search(query("eijin")).await.unwrap()), ["s4"]);
        let hits = f.search(query("北京开会")).await.unwrap();
        assert_eq!(ids(&hits), ["s3"]);
        assert!(
            hits[0].snippet.contains(">>>北京开会<<<"),
            "{}",
            hits[0].snippet
        );
        assert_eq!(ids(&f.search(query("北京")).await.unwrap()), ["s3"]);
    }
}
