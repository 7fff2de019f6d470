//! Sessions and approvals brought over from another agent (`talaria
//! import`): kept with their ids, times and tool calls, searchable, and
//! never twice; on both backends.

use crate::common;

use common::{Backend, Fixture};
use talaria_core::{Message, ToolCall};
use talaria_store::{
    ImportedMessage, ImportedSession, PairingStore, SearchQuery, SessionRecord, SessionStore,
};

fn imported() -> ImportedSession {
    let call = ToolCall {
        id: "c1".into(),
        name: "memory".into(),
        arguments: r#"{"action":"add"}"#.into(),
    };
    let rows = vec![
        (Message::user("remember the quokkaberry"), true),
        (Message::assistant_tool_calls("", vec![call]), true),
        (Message::tool_result("c1", "memory", "saved"), true),
        (Message::assistant("an older answer"), false),
        (Message::assistant("saved it"), true),
    ];
    ImportedSession {
        record: SessionRecord {
            id: "20250101_120000_abcdef".into(),
            source: "telegram".into(),
            chat_id: Some("42".into()),
            title: Some("Quokkaberries".into()),
            model: Some("m".into()),
            started_at: 1_735_732_800.0,
            ended_at: Some(1_735_733_000.0),
            end_reason: Some("new".into()),
            input_tokens: 30,
            ..SessionRecord::default()
        },
        messages: rows
            .into_iter()
            .enumerate()
            .map(|(i, (message, active))| ImportedMessage {
                message,
                timestamp: 1_735_732_800.0 + i as f64,
                active,
            })
            .collect(),
    }
}

async fn an_imported_session_keeps_what_it_was_and_comes_once<S: Backend + SessionStore>(
    store: Fixture<S>,
) {
    assert!(store.import_session(imported()).await.unwrap());
    let record = store
        .session("20250101_120000_abcdef")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.title.as_deref(), Some("Quokkaberries"));
    assert_eq!(record.source, "telegram");
    assert_eq!(record.chat_id.as_deref(), Some("42"));
    assert_eq!(record.started_at, 1_735_732_800.0);
    assert_eq!(record.ended_at, Some(1_735_733_000.0));
    assert_eq!(record.input_tokens, 30);

    // The active transcript, in order, without the replaced row.
    let rows = store.messages("20250101_120000_abcdef").await.unwrap();
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[1].message.tool_calls[0].name, "memory");
    assert_eq!(rows[2].message.tool_call_id.as_deref(), Some("c1"));
    assert_eq!(rows[0].timestamp, 1_735_732_800.0);
    assert_eq!(rows[3].message.content, "saved it");

    let hits = store
        .search(SearchQuery {
            text: "quokkaberry".into(),
            sources: vec![],
            exclude_session: None,
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].session.id, "20250101_120000_abcdef");

    // A second import of the same id writes nothing.
    assert!(!store.import_session(imported()).await.unwrap());
    assert_eq!(
        store
            .messages("20250101_120000_abcdef")
            .await
            .unwrap()
            .len(),
        4
    );
}

async fn a_granted_approval_is_there_once<S: Backend + PairingStore>(store: Fixture<S>) {
    assert!(
        store
            .pairing_grant("telegram", "424242", Some("Ada"), 1_735_732_800.0)
            .await
            .unwrap()
    );
    assert!(
        store
            .pairing_is_approved("telegram", "424242")
            .await
            .unwrap()
    );
    assert!(
        !store
            .pairing_grant("telegram", "424242", None, 1_800_000_000.0)
            .await
            .unwrap()
    );
    // Nobody is owed a notice for it: they were told where they were approved.
    let notices = store
        .pairing_take_notices(&["telegram".to_owned()], 10)
        .await
        .unwrap();
    assert!(notices.is_empty());
}

contract_tests!(
    an_imported_session_keeps_what_it_was_and_comes_once,
    a_granted_approval_is_there_once,
);
