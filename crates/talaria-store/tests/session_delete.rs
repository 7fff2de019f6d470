//! Deleting a session takes everything that belongs to it, paging the
//! transcript reads only the page, and denying a pairing request drops
//! only that request: on both backends.

use crate::common;

use common::{Backend, Fixture, new_session};
use talaria_core::{Message, ToolCall};
use talaria_store::{
    ModelCall, PairingLimits, PairingStore, RouteStore, SearchQuery, SessionStore, StoreError,
};

fn search(text: &str) -> SearchQuery {
    SearchQuery {
        text: text.into(),
        sources: vec![],
        exclude_session: None,
        limit: 10,
    }
}

async fn deleting_a_session_takes_its_transcript_search_and_routes<
    S: Backend + SessionStore + RouteStore,
>(
    store: Fixture<S>,
) {
    for id in ["doomed", "kept"] {
        store.create_session(new_session(id, "cli")).await.unwrap();
        store
            .append_message(id, &Message::user(format!("zebracorn from {id}")))
            .await
            .unwrap();
    }
    // A compressed-away row is searchable too; it must go as well.
    store
        .replace_active("doomed", &[Message::assistant("summary of zebracorn")])
        .await
        .unwrap();
    let calls = [ModelCall {
        provider: "p".into(),
        model: "m".into(),
        ..ModelCall::default()
    }];
    store.add_calls("doomed", &calls).await.unwrap();
    store.set_route("telegram:dm:1", "doomed").await.unwrap();
    store.set_route("telegram:dm:2", "kept").await.unwrap();
    assert_eq!(store.search(search("zebracorn")).await.unwrap().len(), 2);

    assert!(store.delete_session("doomed").await.unwrap());

    assert!(store.session("doomed").await.unwrap().is_none());
    assert!(matches!(
        store.messages("doomed").await.unwrap_err(),
        StoreError::NoSuchSession(_)
    ));
    let hits = store.search(search("zebracorn")).await.unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].session.id, "kept");
    assert!(store.route("telegram:dm:1").await.unwrap().is_none());
    assert_eq!(
        store
            .route("telegram:dm:2")
            .await
            .unwrap()
            .unwrap()
            .session_id,
        "kept"
    );
    assert_eq!(store.messages("kept").await.unwrap().len(), 1);
    // Gone already: nothing to delete, and no error.
    assert!(!store.delete_session("doomed").await.unwrap());
    // The id is free again.
    store
        .create_session(new_session("doomed", "cli"))
        .await
        .unwrap();
    assert!(store.messages("doomed").await.unwrap().is_empty());
}

async fn a_transcript_is_read_page_by_page<S: Backend + SessionStore>(store: Fixture<S>) {
    store.create_session(new_session("s", "cli")).await.unwrap();
    store
        .append_message("s", &Message::user("old"))
        .await
        .unwrap();
    // Replaced rows are not part of the active transcript.
    store
        .replace_active("s", &[Message::user("first")])
        .await
        .unwrap();
    let call = Message::assistant_tool_calls(
        "",
        vec![ToolCall {
            id: "call_1".into(),
            name: "terminal".into(),
            arguments: "{\"command\":\"ls\"}".into(),
        }],
    );
    store.append_message("s", &call).await.unwrap();
    store
        .append_message("s", &Message::tool_result("call_1", "terminal", "a.txt"))
        .await
        .unwrap();
    store
        .append_message("s", &Message::assistant("done"))
        .await
        .unwrap();

    let first = store.messages_page("s", 0, 2).await.unwrap();
    assert_eq!(first.len(), 2);
    assert_eq!(first[0].message.content, "first");
    assert_eq!(first[1].message.tool_calls[0].id, "call_1");
    let rest = store.messages_page("s", first[1].id, 10).await.unwrap();
    assert_eq!(rest.len(), 2);
    assert_eq!(rest[0].message.tool_call_id.as_deref(), Some("call_1"));
    assert_eq!(rest[1].message.content, "done");
    assert!(
        store
            .messages_page("s", rest[1].id, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        store.messages_page("nope", 0, 10).await.unwrap_err(),
        StoreError::NoSuchSession(_)
    ));
}

async fn denying_drops_only_that_request<S: Backend + PairingStore>(store: Fixture<S>) {
    let limits = PairingLimits::default();
    for (user, code) in [("u1", "AAAA1111"), ("u2", "BBBB2222")] {
        store
            .pairing_offer("telegram", user, Some(user), "chat", code, limits)
            .await
            .unwrap();
    }
    assert!(store.pairing_deny("telegram", "u1").await.unwrap());
    assert!(!store.pairing_deny("telegram", "u1").await.unwrap());
    assert!(!store.pairing_deny("discord", "u2").await.unwrap());
    let snapshot = store.pairing_snapshot(limits).await.unwrap();
    let pending: Vec<&str> = snapshot
        .pending
        .iter()
        .map(|p| p.user_id.as_str())
        .collect();
    assert_eq!(pending, ["u2"]);
    // The denied code no longer approves anyone.
    assert!(matches!(
        store
            .pairing_approve("telegram", "AAAA1111", limits)
            .await
            .unwrap(),
        talaria_store::ApproveOutcome::NoMatch { .. }
    ));
    assert!(!store.pairing_is_approved("telegram", "u1").await.unwrap());
}

contract_tests!(
    deleting_a_session_takes_its_transcript_search_and_routes,
    a_transcript_is_read_page_by_page,
    denying_drops_only_that_request,
);
