//! Transcript rows with media (issue 22), on both backends: the
//! references a row came with are kept exactly, in order, on every path
//! that writes rows and every path that reads them; rows without media
//! cost a NULL; a database from the schema before media opens with its
//! rows intact.

use crate::common;

use std::path::PathBuf;

use common::{Backend, Fixture, Place, new_session};
use talaria_core::{MediaKind, MediaRef, Message, Usage};
use talaria_store::{
    ClusterStore, LedgerStore, NewObligation, NodeId, ObligationState, SessionStore,
};

/// The schema versions just before media: SQLite's `user_version`, and
/// PostgreSQL's `talaria_schema`.
const SQLITE_BEFORE_MEDIA: u32 = 9;
const POSTGRES_BEFORE_MEDIA: u32 = 3;

fn media_ref(kind: MediaKind, path: &str, mime: &str) -> MediaRef {
    MediaRef {
        kind,
        path: PathBuf::from(path),
        mime: mime.to_owned(),
    }
}

/// Two references of different kinds, in an order no sort would give
/// (paths and kinds both descending), with a path that needs escaping.
fn two_refs() -> Vec<MediaRef> {
    vec![
        media_ref(
            MediaKind::Voice,
            "/home/ann/.talaria/cache/media/f0/f0e1d2 \"note\".ogg",
            "audio/ogg",
        ),
        media_ref(
            MediaKind::Image,
            "/home/ann/.talaria/cache/media/0a/0a1b2c.jpg",
            "image/jpeg",
        ),
    ]
}

fn obligation(id: &str, owner: &NodeId) -> NewObligation {
    NewObligation {
        id: id.to_owned(),
        session_key: "telegram:dm:42".to_owned(),
        platform: "telegram".to_owned(),
        chat_id: "42".to_owned(),
        thread_id: None,
        reply_to: Some("1001".to_owned()),
        content: "here is the picture".to_owned(),
        owner: owner.clone(),
        settles: Vec::new(),
    }
}

/// Rows whose `media` column is NULL, counted outside the store.
async fn null_media_rows<S>(f: &Fixture<S>) -> f64 {
    f.query_f64("SELECT count(*) FROM messages WHERE media IS NULL")
        .await
        .unwrap()
}

async fn media_round_trips_in_order_on_every_write_path<S>(f: Fixture<S>)
where
    S: Backend + SessionStore + LedgerStore,
{
    f.create_session(new_session("s1", "telegram"))
        .await
        .unwrap();
    let refs = two_refs();
    let photo_only = vec![refs[1].clone()];

    let asked = Message::user_with_media("what is in these?", refs.clone());
    let first = f.append_message("s1", &asked).await.unwrap();
    let usage = Usage {
        input_tokens: 10,
        ..Usage::default()
    };
    let mut seen = Message::user_with_media("and this one", photo_only.clone());
    seen.finish_reason = Some("stop".to_owned());
    f.append_message_with_usage("s1", &seen, &usage)
        .await
        .unwrap();
    let mut answer = Message::assistant("a cat, twice");
    answer.media = vec![refs[0].clone()];
    f.append_reply(
        "s1",
        &answer,
        &usage,
        obligation("o", &common::node_id("n")),
    )
    .await
    .unwrap();

    let rows = f.messages("s1").await.unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0].id, first);
    assert_eq!(rows[0].message, asked);
    assert_eq!(rows[0].message.media, refs, "kinds, paths and order kept");
    assert_eq!(rows[1].message, seen);
    assert_eq!(rows[2].message.media, vec![refs[0].clone()]);
    assert_eq!(null_media_rows(&f).await, 0.0);

    // The window reads them the same.
    let window = f.message_window("s1", first, 0, 10).await.unwrap();
    assert_eq!(window, rows);

    // Compression: the replacement keeps its own media, the rows it
    // replaced keep theirs (inactive, still readable by id).
    let summary = Message::user_with_media("[summary] two photos of a cat", photo_only.clone());
    f.replace_active("s1", &[summary.clone(), Message::assistant("noted")])
        .await
        .unwrap();
    let active = f.messages("s1").await.unwrap();
    assert_eq!(active.len(), 2);
    assert_eq!(active[0].message, summary);
    assert!(active[1].message.media.is_empty());
    let all = f.message_window("s1", 0, 0, 100).await.unwrap();
    assert_eq!(all.len(), 5);
    assert_eq!(all[0].message.media, refs);
    assert!(!all[0].active);

    // Another process reads the same.
    let other = f.reopen().await;
    assert_eq!(other.messages("s1").await.unwrap(), active);
}

async fn a_row_without_media_reads_back_empty<S>(f: Fixture<S>)
where
    S: Backend + SessionStore,
{
    f.create_session(new_session("s1", "cli")).await.unwrap();
    let plain = Message::user("just words");
    f.append_message("s1", &plain).await.unwrap();
    f.replace_active("s1", &[Message::assistant("still just words")])
        .await
        .unwrap();
    let all = f.message_window("s1", 0, 0, 10).await.unwrap();
    assert_eq!(all.len(), 2);
    assert!(all.iter().all(|m| m.message.media.is_empty()));
    assert_eq!(all[0].message, plain);
    // Stored as NULL, not as an empty array.
    assert_eq!(null_media_rows(&f).await, 2.0);
}

/// An unreadable value is an error naming the row, not media silently
/// dropped from the conversation.
async fn an_unreadable_media_value_is_reported<S>(f: Fixture<S>)
where
    S: Backend + SessionStore,
{
    f.create_session(new_session("s1", "cli")).await.unwrap();
    let id = f
        .append_message("s1", &Message::user_with_media("look", two_refs()))
        .await
        .unwrap();
    f.execute(&format!(
        "UPDATE messages SET media = '[{{\"kind\": \"hologram\"}}]' WHERE id = {id}"
    ))
    .await;
    let err = f.messages("s1").await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains(&format!("message {id}")), "{text}");
    assert!(text.contains("media"), "{text}");
}

/// The schema version the fixture's database is at.
async fn schema_version<S>(f: &Fixture<S>) -> u32 {
    let sql = match &f.place {
        Place::Sqlite { .. } => "SELECT user_version FROM pragma_user_version",
        Place::Postgres { .. } => "SELECT version FROM talaria_schema",
    };
    f.query_f64(sql).await.unwrap() as u32
}

/// Turns the fixture's database back into what the build before media
/// left: no `messages.media`, no `delivery_obligations.parts_sent`, the
/// version before. Returns that version.
async fn back_to_before_media<S>(f: &Fixture<S>) -> u32 {
    f.execute("ALTER TABLE messages DROP COLUMN media").await;
    // Later steps' columns go too, or migrating forward would add them twice.
    f.execute("ALTER TABLE messages DROP COLUMN thinking").await;
    f.execute("ALTER TABLE sessions DROP COLUMN model_choice")
        .await;
    f.execute("ALTER TABLE sessions DROP COLUMN cost_micros")
        .await;
    f.execute("DROP TABLE model_calls").await;
    f.execute("DROP TABLE IF EXISTS shared_files").await;
    f.execute("DROP TABLE IF EXISTS shared_files_head").await;
    f.execute("ALTER TABLE delivery_obligations DROP COLUMN parts_sent")
        .await;
    match &f.place {
        Place::Sqlite { .. } => {
            f.execute(&format!("PRAGMA user_version = {SQLITE_BEFORE_MEDIA}"))
                .await;
            SQLITE_BEFORE_MEDIA
        }
        Place::Postgres { .. } => {
            f.execute(&format!(
                "UPDATE talaria_schema SET version = {POSTGRES_BEFORE_MEDIA}"
            ))
            .await;
            POSTGRES_BEFORE_MEDIA
        }
    }
}

async fn a_database_from_before_media_migrates_and_keeps_its_rows<S>(f: Fixture<S>)
where
    S: Backend + SessionStore + LedgerStore + ClusterStore,
{
    let latest = schema_version(&f).await;
    f.create_session(new_session("s1", "telegram"))
        .await
        .unwrap();
    f.append_message("s1", &Message::user("before media"))
        .await
        .unwrap();
    f.append_message("s1", &Message::assistant("an answer"))
        .await
        .unwrap();
    let me = common::live_node(&*f.store, "node-a").await;
    f.record_obligation(obligation("o", &me)).await.unwrap();
    let attempt = f.begin_attempt("o", &me, 120.0).await.unwrap().unwrap();
    let before_rows = f.messages("s1").await.unwrap();
    let before_row = f.obligation("o").await.unwrap().unwrap();

    let old = back_to_before_media(&f).await;
    assert_eq!(schema_version(&f).await, old);
    assert!(old < latest, "{old} < {latest}");

    let store = f.reopen().await;
    assert_eq!(schema_version(&f).await, latest);
    // Rows from before read back as they were, with no media and no part
    // confirmed.
    assert_eq!(store.messages("s1").await.unwrap(), before_rows);
    assert!(before_rows.iter().all(|m| m.message.media.is_empty()));
    let row = store.obligation("o").await.unwrap().unwrap();
    assert_eq!(row, before_row);
    assert_eq!(
        (row.state, row.attempts, row.parts_sent),
        (ObligationState::Attempting, attempt, 0)
    );
    // ... and the new columns work on the migrated database.
    let refs = two_refs();
    store
        .append_message("s1", &Message::user_with_media("after media", refs.clone()))
        .await
        .unwrap();
    assert_eq!(store.messages("s1").await.unwrap()[2].message.media, refs);
    assert!(store.mark_parts_sent("o", attempt, 1).await.unwrap());
    assert_eq!(store.obligation("o").await.unwrap().unwrap().parts_sent, 1);
    // Opening again migrates nothing more.
    drop(store);
    let again = f.reopen().await;
    assert_eq!(schema_version(&f).await, latest);
    assert_eq!(again.messages("s1").await.unwrap().len(), 3);
}

contract_tests!(
    media_round_trips_in_order_on_every_write_path,
    a_row_without_media_reads_back_empty,
    an_unreadable_media_value_is_reported,
    a_database_from_before_media_migrates_and_keeps_its_rows,
);
