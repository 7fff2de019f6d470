//! Signed reasoning blocks on assistant rows (issue 26), on both
//! backends: kept byte for byte on every write path and read path, NULL
//! for rows without any, and a database from the schema before them
//! opens with its rows intact.

use crate::common;

use common::{Backend, Fixture, Place, new_session};
use talaria_core::{Message, ThinkingBlock, ToolCall, Usage};
use talaria_store::SessionStore;

/// The schema versions just before the `thinking` column.
const SQLITE_BEFORE_THINKING: u32 = 10;
const POSTGRES_BEFORE_THINKING: u32 = 4;

/// A tool-calling assistant row with a signed block and a redacted one,
/// in that order; the text has quotes, a newline and a NUL, which must all
/// come back unchanged (the signature covers them).
fn thinking_row() -> Message {
    let mut m = Message::assistant_tool_calls(
        "",
        vec![ToolCall {
            id: "toolu_01".into(),
            name: "terminal".into(),
            arguments: r#"{"command":"ls"}"#.into(),
        }],
    );
    m.thinking = vec![
        ThinkingBlock::Thinking {
            thinking: "The user said \"list\".\nSo: ls.\u{0}".into(),
            signature: "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxu/ZRuaMu/e0Q4ZRIiMPwP+LZ==".into(),
        },
        ThinkingBlock::RedactedThinking {
            data: "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP".into(),
        },
    ];
    m.reasoning = Some("The user said \"list\".".into());
    m
}

async fn rows_with_thinking<S>(f: &Fixture<S>) -> f64 {
    f.query_f64("SELECT count(*) FROM messages WHERE thinking IS NOT NULL")
        .await
        .unwrap()
}

async fn thinking_blocks_round_trip_on_every_write_path<S>(f: Fixture<S>)
where
    S: Backend + SessionStore,
{
    f.create_session(new_session("s1", "cli")).await.unwrap();
    f.append_message("s1", &Message::user("list files"))
        .await
        .unwrap();
    let row = thinking_row();
    let usage = Usage {
        output_tokens: 7,
        ..Usage::default()
    };
    f.append_message_with_usage("s1", &row, &usage)
        .await
        .unwrap();
    let rows = f.messages("s1").await.unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1].message, row);
    assert!(rows[0].message.thinking.is_empty());
    assert_eq!(rows_with_thinking(&f).await, 1.0, "NULL for the user row");

    // Compression's replacement keeps them too.
    f.replace_active("s1", &[Message::user("[summary]"), row.clone()])
        .await
        .unwrap();
    let active = f.messages("s1").await.unwrap();
    assert_eq!(active[1].message.thinking, row.thinking);
    assert_eq!(rows_with_thinking(&f).await, 2.0);

    // Another process reads the same.
    let other = f.reopen().await;
    assert_eq!(other.messages("s1").await.unwrap(), active);
}

async fn an_unreadable_thinking_value_is_reported<S>(f: Fixture<S>)
where
    S: Backend + SessionStore,
{
    f.create_session(new_session("s1", "cli")).await.unwrap();
    let id = f.append_message("s1", &thinking_row()).await.unwrap();
    f.execute(&format!(
        "UPDATE messages SET thinking = '[{{\"type\": \"daydream\"}}]' WHERE id = {id}"
    ))
    .await;
    let text = f.messages("s1").await.unwrap_err().to_string();
    assert!(text.contains(&format!("message {id}")), "{text}");
    assert!(text.contains("reasoning blocks"), "{text}");
}

async fn a_database_from_before_thinking_migrates<S>(f: Fixture<S>)
where
    S: Backend + SessionStore,
{
    f.create_session(new_session("s1", "cli")).await.unwrap();
    f.append_message("s1", &Message::assistant("older answer"))
        .await
        .unwrap();
    let before = f.messages("s1").await.unwrap();
    f.execute("ALTER TABLE messages DROP COLUMN thinking").await;
    // The same step's other changes go too, or migrating forward would
    // add them twice.
    f.execute("ALTER TABLE sessions DROP COLUMN model_choice")
        .await;
    f.execute("ALTER TABLE sessions DROP COLUMN cost_micros")
        .await;
    f.execute("DROP TABLE model_calls").await;
    f.execute("DROP TABLE IF EXISTS shared_files").await;
    f.execute("DROP TABLE IF EXISTS shared_files_head").await;
    match &f.place {
        Place::Sqlite { .. } => {
            f.execute(&format!("PRAGMA user_version = {SQLITE_BEFORE_THINKING}"))
                .await;
        }
        Place::Postgres { .. } => {
            f.execute(&format!(
                "UPDATE talaria_schema SET version = {POSTGRES_BEFORE_THINKING}"
            ))
            .await;
        }
    }
    let store = f.reopen().await;
    assert_eq!(store.messages("s1").await.unwrap(), before);
    let row = thinking_row();
    store.append_message("s1", &row).await.unwrap();
    assert_eq!(store.messages("s1").await.unwrap()[1].message, row);
}

contract_tests!(
    thinking_blocks_round_trip_on_every_write_path,
    an_unreadable_thinking_value_is_reported,
    a_database_from_before_thinking_migrates,
);
