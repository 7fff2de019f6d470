//! Sessions and transcripts round-trip through a real database, on both
//! backends.

use crate::common;

use common::{Backend, Fixture, new_session};
use talaria_core::{Message, Role, ToolCall, Usage};
use talaria_store::{NewSession, SearchQuery, SessionFilter, SessionStore, StoreError};

async fn session_fields_round_trip<S: Backend + SessionStore>(store: Fixture<S>) {
    let new = NewSession {
        id: "20260101_120000_abcdef".into(),
        source: "telegram".into(),
        session_key: Some("agent:main:telegram:dm:1".into()),
        chat_id: Some("chat-1".into()),
        user_id: Some("user_123".into()),
        thread_id: Some("t9".into()),
        model: Some("gpt-x".into()),
        system_prompt: Some("You are helpful.\nBe brief.".into()),
        parent_session_id: Some("20251231_235959_000000".into()),
    };
    store.create_session(new.clone()).await.unwrap();
    let rec = store.session(&new.id).await.unwrap().unwrap();
    assert_eq!(rec.id, new.id);
    assert_eq!(rec.source, "telegram");
    assert_eq!(rec.session_key, new.session_key);
    assert_eq!(rec.chat_id, new.chat_id);
    assert_eq!(rec.user_id, new.user_id);
    assert_eq!(rec.thread_id, new.thread_id);
    assert_eq!(rec.model, new.model);
    assert_eq!(rec.system_prompt, new.system_prompt);
    assert_eq!(rec.parent_session_id, new.parent_session_id);
    assert!(rec.started_at > 1.7e9);
    assert_eq!(rec.ended_at, None);
    assert_eq!(rec.title, None);
    assert_eq!(rec.message_count, 0);

    assert!(store.session("nope").await.unwrap().is_none());
}

async fn duplicate_session_is_refused<S: Backend + SessionStore>(store: Fixture<S>) {
    store
        .create_session(new_session("s1", "cli"))
        .await
        .unwrap();
    let err = store
        .create_session(new_session("s1", "cli"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Database(ref m) if m.contains("already exists")),
        "{err}"
    );
}

async fn messages_round_trip_in_order<S: Backend + SessionStore>(store: Fixture<S>) {
    store
        .create_session(new_session("s1", "cli"))
        .await
        .unwrap();

    let calls = vec![
        ToolCall {
            id: "call_1".into(),
            name: "terminal".into(),
            arguments: r#"{"cmd":"ls -la"}"#.into(),
        },
        ToolCall {
            id: "call_2".into(),
            name: "no_such_tool".into(),
            // Invalid JSON must survive byte-for-byte.
            arguments: r#"{"broken": "#.into(),
        },
    ];
    let mut assistant = Message::assistant_tool_calls("", calls);
    assistant.reasoning = Some("I should list files.".into());
    assistant.finish_reason = Some("tool_calls".into());
    let mut last = Message::assistant("done ✅ — 完成");
    last.finish_reason = Some("stop".into());
    let transcript = vec![
        Message::system("sys"),
        Message::user("list files"),
        assistant,
        Message::tool_result("call_1", "terminal", "a.txt\nb.txt"),
        Message::tool_result("call_2", "no_such_tool", "error: unknown tool"),
        last,
    ];
    let mut ids = Vec::new();
    for m in &transcript {
        ids.push(store.append_message("s1", m).await.unwrap());
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");

    let stored = store.messages("s1").await.unwrap();
    assert_eq!(stored.len(), transcript.len());
    for ((s, m), id) in stored.iter().zip(&transcript).zip(&ids) {
        assert_eq!(&s.message, m);
        assert_eq!(s.id, *id);
        assert_eq!(s.session_id, "s1");
        assert!(s.active);
        assert!(s.timestamp > 1.7e9);
        assert_eq!(s.token_count, None);
    }
    assert_eq!(stored[3].message.role, Role::Tool);

    let rec = store.session("s1").await.unwrap().unwrap();
    assert_eq!(rec.message_count, transcript.len() as u64);
}

async fn missing_sessions_are_reported<S: Backend + SessionStore>(store: Fixture<S>) {
    let missing = |r: Result<(), StoreError>| {
        assert!(
            matches!(r, Err(StoreError::NoSuchSession(ref id)) if id == "ghost"),
            "{r:?}"
        )
    };
    missing(
        store
            .append_message("ghost", &Message::user("hi"))
            .await
            .map(|_| ()),
    );
    missing(store.set_title("ghost", "t").await);
    missing(store.set_system_prompt("ghost", "p").await);
    missing(store.set_model_choice("ghost", Some("m")).await);
    missing(store.end_session("ghost", "x").await);
    missing(store.add_usage("ghost", &Usage::default()).await);
    missing(store.messages("ghost").await.map(|_| ()));
    missing(store.message_window("ghost", 1, 1, 1).await.map(|_| ()));
    missing(store.replace_active("ghost", &[]).await);
}

async fn usage_title_prompt_and_end<S: Backend + SessionStore>(store: Fixture<S>) {
    store
        .create_session(new_session("s1", "cli"))
        .await
        .unwrap();
    let usage = Usage {
        input_tokens: 100,
        output_tokens: 20,
        cache_read_tokens: 50,
        cache_write_tokens: 5,
        reasoning_tokens: 7,
    };
    store.add_usage("s1", &usage).await.unwrap();
    store.add_usage("s1", &usage).await.unwrap();
    store.set_title("s1", "Deploying the thing").await.unwrap();
    store.set_system_prompt("s1", "new prompt").await.unwrap();
    assert_eq!(
        store.session("s1").await.unwrap().unwrap().model_choice,
        None
    );
    store
        .set_model_choice("s1", Some("openrouter:qwen/qwen3:free"))
        .await
        .unwrap();
    assert_eq!(
        store
            .session("s1")
            .await
            .unwrap()
            .unwrap()
            .model_choice
            .as_deref(),
        Some("openrouter:qwen/qwen3:free")
    );

    let rec = store.session("s1").await.unwrap().unwrap();
    assert_eq!(
        (
            rec.input_tokens,
            rec.output_tokens,
            rec.cache_read_tokens,
            rec.cache_write_tokens,
            rec.reasoning_tokens
        ),
        (200, 40, 100, 10, 14)
    );
    assert_eq!(rec.title.as_deref(), Some("Deploying the thing"));
    assert_eq!(rec.system_prompt.as_deref(), Some("new prompt"));
    assert_eq!(rec.ended_at, None);

    store.end_session("s1", "user_exit").await.unwrap();
    let rec = store.session("s1").await.unwrap().unwrap();
    assert!(rec.ended_at.unwrap() >= rec.started_at);
    assert_eq!(rec.end_reason.as_deref(), Some("user_exit"));

    // Counters saturate rather than wrap or turn into floats.
    let huge = Usage {
        input_tokens: u64::MAX,
        ..Usage::default()
    };
    store.add_usage("s1", &huge).await.unwrap();
    store.add_usage("s1", &huge).await.unwrap();
    let rec = store.session("s1").await.unwrap().unwrap();
    assert_eq!(rec.input_tokens, i64::MAX as u64);
}

async fn latest_and_listing<S: Backend + SessionStore>(store: Fixture<S>) {
    assert!(
        store
            .last_answered_session(&["cli"])
            .await
            .unwrap()
            .is_none()
    );
    for (id, source) in [
        ("a1", "cli"),
        ("b1", "telegram"),
        ("a2", "cli"),
        ("b2", "telegram"),
        ("a3", "cli"),
    ] {
        let mut s = new_session(id, source);
        if source == "telegram" {
            s.session_key = Some("tg:1".into());
        }
        store.create_session(s).await.unwrap();
    }
    // Started but never answered: nothing to go back to.
    assert!(
        store
            .last_answered_session(&["cli"])
            .await
            .unwrap()
            .is_none()
    );
    let answer = |text: &str| Message::assistant(text);
    store
        .append_message("a2", &Message::user("q"))
        .await
        .unwrap();
    store.append_message("a2", &answer("a")).await.unwrap();
    store.append_message("b1", &answer("a")).await.unwrap();
    store.append_message("a1", &answer("a")).await.unwrap();
    // a1 was answered last, though a3 (empty) and a2 started later.
    let last = |sources: &'static [&'static str]| {
        let store = &store;
        async move {
            store
                .last_answered_session(sources)
                .await
                .unwrap()
                .map(|s| s.id)
        }
    };
    assert_eq!(last(&["cli"]).await.as_deref(), Some("a1"));
    assert_eq!(last(&["telegram"]).await.as_deref(), Some("b1"));
    assert_eq!(last(&["cli", "telegram"]).await.as_deref(), Some("a1"));
    assert_eq!(last(&["telegram", "cron"]).await.as_deref(), Some("b1"));
    assert_eq!(last(&["cron"]).await, None);
    assert_eq!(last(&[]).await, None);
    // An answer taken back (/undo) no longer counts.
    store
        .replace_active("a1", &[Message::user("only a question")])
        .await
        .unwrap();
    assert_eq!(last(&["cli"]).await.as_deref(), Some("a2"));
    // Counts shown to people leave out replaced rows; message_count does not.
    let ids_asked: Vec<String> = ["a1", "a2", "a3", "nope"].map(String::from).to_vec();
    assert_eq!(
        store.active_message_counts(&ids_asked).await.unwrap(),
        [1, 2, 0, 0]
    );
    assert_eq!(store.session("a1").await.unwrap().unwrap().message_count, 2);
    // The automatic title never overwrites a chosen one.
    assert!(store.set_title_if_unset("a2", "auto").await.unwrap());
    assert!(!store.set_title_if_unset("a2", "again").await.unwrap());
    store.set_title("a3", "chosen").await.unwrap();
    assert!(!store.set_title_if_unset("a3", "auto").await.unwrap());
    assert!(!store.set_title_if_unset("nope", "auto").await.unwrap());
    let title = |id: &'static str| {
        let store = &store;
        async move { store.session(id).await.unwrap().unwrap().title }
    };
    assert_eq!(title("a2").await.as_deref(), Some("auto"));
    assert_eq!(title("a3").await.as_deref(), Some("chosen"));
    assert_eq!(
        store.session_sources().await.unwrap(),
        [("cli".to_owned(), 3), ("telegram".to_owned(), 2)]
    );

    let ids =
        |v: Vec<talaria_store::SessionRecord>| v.into_iter().map(|s| s.id).collect::<Vec<_>>();
    let all = store.list_sessions(SessionFilter::default()).await.unwrap();
    assert_eq!(ids(all), ["a3", "b2", "a2", "b1", "a1"]);

    let cli = SessionFilter {
        source: Some("cli".into()),
        ..SessionFilter::default()
    };
    assert_eq!(
        ids(store.list_sessions(cli.clone()).await.unwrap()),
        ["a3", "a2", "a1"]
    );
    let page = SessionFilter {
        limit: 2,
        offset: 1,
        ..cli
    };
    assert_eq!(ids(store.list_sessions(page).await.unwrap()), ["a2", "a1"]);
    let keyed = SessionFilter {
        session_key: Some("tg:1".into()),
        limit: 1,
        ..SessionFilter::default()
    };
    assert_eq!(ids(store.list_sessions(keyed).await.unwrap()), ["b2"]);
    let past_end = SessionFilter {
        limit: 10,
        offset: 10,
        ..SessionFilter::default()
    };
    assert!(store.list_sessions(past_end).await.unwrap().is_empty());
}

async fn message_window_is_positional_and_includes_inactive_rows<S: Backend + SessionStore>(
    store: Fixture<S>,
) {
    store
        .create_session(new_session("s1", "cli"))
        .await
        .unwrap();
    store
        .create_session(new_session("s2", "cli"))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(
            store
                .append_message("s1", &Message::user(format!("m{i}")))
                .await
                .unwrap(),
        );
        // Interleave another session so ids are not contiguous.
        store
            .append_message("s2", &Message::user("other"))
            .await
            .unwrap();
    }
    let texts = |v: Vec<talaria_store::StoredMessage>| {
        v.into_iter().map(|m| m.message.content).collect::<Vec<_>>()
    };
    let w = store.message_window("s1", ids[5], 2, 3).await.unwrap();
    assert_eq!(texts(w), ["m3", "m4", "m5", "m6", "m7", "m8"]);
    let w = store.message_window("s1", ids[0], 5, 1).await.unwrap();
    assert_eq!(texts(w), ["m0", "m1"]);
    let w = store.message_window("s1", ids[9], 1, 5).await.unwrap();
    assert_eq!(texts(w), ["m8", "m9"]);
    let w = store.message_window("s1", ids[4], 0, 0).await.unwrap();
    assert_eq!(texts(w), ["m4"]);

    store
        .replace_active("s1", &[Message::user("summary")])
        .await
        .unwrap();
    let w = store.message_window("s1", ids[5], 1, 1).await.unwrap();
    assert_eq!(
        w.iter().map(|m| m.active).collect::<Vec<_>>(),
        [false, false, false]
    );
}

async fn replace_active_swaps_the_transcript_and_keeps_history_searchable<
    S: Backend + SessionStore,
>(
    store: Fixture<S>,
) {
    store
        .create_session(new_session("s1", "cli"))
        .await
        .unwrap();
    for text in [
        "we discussed the aardvark migration",
        "ok",
        "more about aardvarks",
    ] {
        store
            .append_message("s1", &Message::user(text))
            .await
            .unwrap();
    }
    let replacement = vec![
        Message::system("sys"),
        Message::user("[summary] earlier turns were about animals"),
    ];
    store.replace_active("s1", &replacement).await.unwrap();

    let active = store.messages("s1").await.unwrap();
    assert_eq!(
        active.iter().map(|m| m.message.clone()).collect::<Vec<_>>(),
        replacement
    );
    let rec = store.session("s1").await.unwrap().unwrap();
    assert_eq!(rec.message_count, 5);

    let hits = store
        .search(SearchQuery {
            text: "aardvark".into(),
            sources: vec![],
            exclude_session: None,
            limit: 5,
        })
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].session.id, "s1");
    assert!(
        hits[0].snippet.contains(">>>aardvark<<<"),
        "{}",
        hits[0].snippet
    );

    // Replacing with nothing leaves an empty active transcript.
    store.replace_active("s1", &[]).await.unwrap();
    assert!(store.messages("s1").await.unwrap().is_empty());
}

async fn traversal_ids_are_refused<S: Backend + SessionStore>(store: Fixture<S>) {
    for bad in [
        "../x", "a/b", "..", "", ".hidden", "a\\b", "x/../y", "a b", "-rf",
    ] {
        let err = store
            .create_session(new_session(bad, "cli"))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::InvalidId(_)), "{bad:?}: {err}");
    }
    let mut s = new_session("ok_1", "cli");
    s.parent_session_id = Some("../etc".into());
    assert!(matches!(
        store.create_session(s).await,
        Err(StoreError::InvalidId(_))
    ));
    assert!(
        store
            .list_sessions(SessionFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
}

async fn a_row_and_its_usage_are_stored_together<S: Backend + SessionStore>(store: Fixture<S>) {
    store
        .create_session(new_session("s1", "cli"))
        .await
        .unwrap();
    let usage = Usage {
        input_tokens: 900,
        output_tokens: 12,
        ..Usage::default()
    };
    store
        .append_message_with_usage("s1", &Message::assistant("first"), &usage)
        .await
        .unwrap();
    // Zero usage adds nothing and still stores the row.
    store
        .append_message_with_usage("s1", &Message::assistant("second"), &Usage::default())
        .await
        .unwrap();
    let rec = store.session("s1").await.unwrap().unwrap();
    assert_eq!((rec.input_tokens, rec.output_tokens), (900, 12));
    assert_eq!(rec.message_count, 2);
    assert_eq!(store.messages("s1").await.unwrap().len(), 2);
    // A missing session gets neither.
    let err = store
        .append_message_with_usage("ghost", &Message::assistant("x"), &usage)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NoSuchSession(_)), "{err:?}");
}

/// Two handles on one database (two processes, or two gateway nodes)
/// appending to the same session at once: every row lands once, ids are
/// unique, and the counters add up exactly.
async fn concurrent_appends_from_two_handles_keep_counts_exact<S: Backend + SessionStore>(
    store: Fixture<S>,
) {
    const TASKS_PER_HANDLE: usize = 4;
    const ROWS_PER_TASK: usize = 20;
    store
        .create_session(new_session("s1", "api"))
        .await
        .unwrap();
    let other = std::sync::Arc::new(store.reopen().await);
    let usage = Usage {
        input_tokens: 3,
        output_tokens: 2,
        reasoning_tokens: 1,
        ..Usage::default()
    };
    let mut tasks = Vec::new();
    for handle in 0..2 {
        for task in 0..TASKS_PER_HANDLE {
            let first = store.store.clone();
            let second = other.clone();
            tasks.push(tokio::spawn(async move {
                let mut ids = Vec::new();
                for row in 0..ROWS_PER_TASK {
                    let text = format!("handle {handle} task {task} row {row}");
                    let message = Message::user(text);
                    let id = if handle == 0 {
                        first
                            .append_message_with_usage("s1", &message, &usage)
                            .await
                    } else {
                        second
                            .append_message_with_usage("s1", &message, &usage)
                            .await
                    };
                    ids.push(id.unwrap());
                }
                ids
            }));
        }
    }
    let mut all = std::collections::HashSet::new();
    for task in tasks {
        for id in task.await.unwrap() {
            assert!(all.insert(id), "row id {id} handed out twice");
        }
    }
    let total = 2 * TASKS_PER_HANDLE * ROWS_PER_TASK;
    assert_eq!(all.len(), total);
    let rec = store.session("s1").await.unwrap().unwrap();
    assert_eq!(rec.message_count, total as u64);
    assert_eq!(
        (rec.input_tokens, rec.output_tokens, rec.reasoning_tokens),
        (3 * total as u64, 2 * total as u64, total as u64)
    );
    let stored = store.messages("s1").await.unwrap();
    assert_eq!(stored.len(), total);
    // Each task's rows keep their order in the transcript.
    for handle in 0..2 {
        for task in 0..TASKS_PER_HANDLE {
            let prefix = format!("handle {handle} task {task} row ");
            let rows: Vec<usize> = stored
                .iter()
                .filter_map(|m| m.message.content.strip_prefix(&prefix))
                .map(|n| n.parse().unwrap())
                .collect();
            assert_eq!(rows, (0..ROWS_PER_TASK).collect::<Vec<_>>());
        }
    }
}

/// Compression racing appends: whatever interleaving happens,
/// `message_count` is the number of rows stored, and the active transcript
/// is the last replacement plus whatever was appended after it.
async fn replace_active_and_appends_interleave_cleanly<S: Backend + SessionStore>(
    store: Fixture<S>,
) {
    store
        .create_session(new_session("s1", "api"))
        .await
        .unwrap();
    let other = store.reopen().await;
    let appends = {
        let store = store.store.clone();
        tokio::spawn(async move {
            for i in 0..40 {
                store
                    .append_message("s1", &Message::user(format!("turn {i}")))
                    .await
                    .unwrap();
            }
        })
    };
    for round in 0..5 {
        other
            .replace_active(
                "s1",
                &[
                    Message::system("sys"),
                    Message::user(format!("[summary {round}]")),
                ],
            )
            .await
            .unwrap();
    }
    appends.await.unwrap();
    let rows = store
        .query_f64("SELECT COUNT(*) FROM messages WHERE session_id = 's1'")
        .await
        .unwrap();
    let rec = store.session("s1").await.unwrap().unwrap();
    assert_eq!(rec.message_count as f64, rows);
    assert_eq!(rec.message_count, 40 + 5 * 2);
    let active = store.messages("s1").await.unwrap();
    assert_eq!(active[0].message.content, "sys");
    assert_eq!(active[1].message.content, "[summary 4]");
    assert!(
        active[2..]
            .iter()
            .all(|m| m.message.content.starts_with("turn "))
    );
}

/// Text from tools can contain NUL characters. SQLite keeps them;
/// PostgreSQL's `text` cannot, and stores U+FFFD in their place rather
/// than refusing the row (which would lose the turn).
async fn nul_characters_do_not_fail_a_write<S: Backend + SessionStore>(store: Fixture<S>) {
    let mut new = new_session("s1", "cli");
    new.system_prompt = Some("be\0brief".into());
    store.create_session(new).await.unwrap();
    let mut message = Message::tool_result("call\0_1", "term\0inal", "bin\0ary output");
    message.reasoning = Some("r\0".into());
    store.append_message("s1", &message).await.unwrap();
    store
        .replace_active("s1", &[Message::user("sum\0mary")])
        .await
        .unwrap();
    store.set_title("s1", "ti\0tle").await.unwrap();
    store.end_session("s1", "do\0ne").await.unwrap();

    let restore = |s: &str| s.replace('\u{FFFD}', "\0");
    let rec = store.session("s1").await.unwrap().unwrap();
    assert_eq!(restore(rec.system_prompt.as_deref().unwrap()), "be\0brief");
    assert_eq!(restore(rec.title.as_deref().unwrap()), "ti\0tle");
    assert_eq!(restore(rec.end_reason.as_deref().unwrap()), "do\0ne");
    let all = store.message_window("s1", 0, 0, 10).await.unwrap();
    assert_eq!(all.len(), 2);
    let first = &all[0].message;
    assert_eq!(restore(&first.content), "bin\0ary output");
    assert_eq!(restore(first.tool_call_id.as_deref().unwrap()), "call\0_1");
    assert_eq!(restore(first.tool_name.as_deref().unwrap()), "term\0inal");
    assert_eq!(restore(first.reasoning.as_deref().unwrap()), "r\0");
    assert_eq!(restore(&all[1].message.content), "sum\0mary");
    // Lookups with a NUL are just lookups.
    assert!(store.session("s\0_1").await.unwrap().is_none());
}

/// A message far larger than a PostgreSQL `tsvector` can hold (1 MB of
/// distinct words) is stored whole, and a word anywhere in it is found.
async fn a_huge_message_is_stored_and_searchable_throughout<S: Backend + SessionStore>(
    store: Fixture<S>,
) {
    store
        .create_session(new_session("s1", "cli"))
        .await
        .unwrap();
    let text = (0..200_000)
        .map(|i| format!("w{i:06}"))
        .collect::<Vec<_>>()
        .join(" ");
    store
        .append_message("s1", &Message::tool_result("c1", "terminal", &text))
        .await
        .unwrap();
    let stored = store.messages("s1").await.unwrap();
    assert_eq!(stored[0].message.content, text);
    for word in ["w000007", "w199993"] {
        let hits = store
            .search(SearchQuery {
                text: word.into(),
                sources: vec![],
                exclude_session: None,
                limit: 5,
            })
            .await
            .unwrap();
        assert_eq!(hits.len(), 1, "{word}");
        assert!(
            hits[0].snippet.contains(&format!(">>>{word}<<<")),
            "{word}: {}",
            hits[0].snippet
        );
    }
}

contract_tests!(
    session_fields_round_trip,
    duplicate_session_is_refused,
    messages_round_trip_in_order,
    missing_sessions_are_reported,
    usage_title_prompt_and_end,
    latest_and_listing,
    message_window_is_positional_and_includes_inactive_rows,
    replace_active_swaps_the_transcript_and_keeps_history_searchable,
    traversal_ids_are_refused,
    a_row_and_its_usage_are_stored_together,
    concurrent_appends_from_two_handles_keep_counts_exact,
    replace_active_and_appends_interleave_cleanly,
    nul_characters_do_not_fail_a_write,
    a_huge_message_is_stored_and_searchable_throughout,
);
