//! Reading every session a page at a time with its last activity,
//! deleting idle sessions without taking one a gateway is using, and
//! counting what is stored: on both backends.

use crate::common;

use common::{Backend, Fixture, new_session};
use talaria_core::Message;
use talaria_store::{
    ClusterStore, IdleDeletion, NewOwedTurn, OwedTurnStore, RouteStore, SearchQuery, SessionPage,
    SessionStore, StoreError,
};

async fn say<S: SessionStore>(store: &S, id: &str, text: &str) {
    store
        .append_message(id, &Message::user(text))
        .await
        .unwrap();
}

fn page(after: Option<&str>, limit: usize) -> SessionPage {
    SessionPage {
        after_id: after.map(str::to_owned),
        limit,
        ..SessionPage::default()
    }
}

async fn pages_follow_the_ids_and_carry_the_last_activity<S: Backend + SessionStore>(
    store: Fixture<S>,
) {
    // Created out of id order: pages follow the ids, not creation.
    for (id, source) in [
        ("s3", "cli"),
        ("s1", "telegram"),
        ("s2", "cli"),
        ("s4", "cli"),
    ] {
        store.create_session(new_session(id, source)).await.unwrap();
    }
    say(&*store, "s1", "first").await;
    say(&*store, "s1", "second").await;
    // A replaced row is activity too.
    store
        .replace_active("s2", &[Message::user("summary")])
        .await
        .unwrap();
    store.end_session("s4", "new").await.unwrap();

    let first = store.session_page(page(None, 2)).await.unwrap();
    let ids: Vec<&str> = first.iter().map(|a| a.session.id.as_str()).collect();
    assert_eq!(ids, ["s1", "s2"]);
    let rest = store.session_page(page(Some("s2"), 10)).await.unwrap();
    let ids: Vec<&str> = rest.iter().map(|a| a.session.id.as_str()).collect();
    assert_eq!(ids, ["s3", "s4"]);
    assert!(
        store
            .session_page(page(Some("s4"), 10))
            .await
            .unwrap()
            .is_empty()
    );

    let all: Vec<_> = first.into_iter().chain(rest).collect();
    let by_id = |id: &str| all.iter().find(|a| a.session.id == id).unwrap().clone();
    // The newest row, the start when there is none, the end when later.
    let s1_rows = store.messages("s1").await.unwrap();
    assert_eq!(by_id("s1").last_active, s1_rows[1].timestamp);
    let s3 = by_id("s3");
    assert_eq!(s3.last_active, s3.session.started_at);
    let s4 = by_id("s4");
    assert_eq!(Some(s4.last_active), s4.session.ended_at);
    // The record is the one `session` returns.
    assert_eq!(
        by_id("s1").session,
        store.session("s1").await.unwrap().unwrap()
    );

    // Only one source; only sessions idle before a time.
    let cli = store
        .session_page(SessionPage {
            source: Some("cli".into()),
            limit: 10,
            ..SessionPage::default()
        })
        .await
        .unwrap();
    let ids: Vec<&str> = cli.iter().map(|a| a.session.id.as_str()).collect();
    assert_eq!(ids, ["s2", "s3", "s4"]);
    let cutoff = by_id("s1").last_active;
    let idle = store
        .session_page(SessionPage {
            idle_before: Some(cutoff),
            limit: 10,
            ..SessionPage::default()
        })
        .await
        .unwrap();
    let mut expected: Vec<&str> = all
        .iter()
        .filter(|a| a.last_active < cutoff)
        .map(|a| a.session.id.as_str())
        .collect();
    expected.sort();
    let ids: Vec<&str> = idle.iter().map(|a| a.session.id.as_str()).collect();
    assert_eq!(ids, expected);
    assert!(!ids.contains(&"s1"), "{ids:?}");
}

async fn an_idle_session_goes_unless_used_since_or_owed_a_turn<
    S: Backend + SessionStore + RouteStore + OwedTurnStore + ClusterStore,
>(
    store: Fixture<S>,
) {
    for id in ["idle", "busy", "leased", "recent"] {
        store
            .create_session(new_session(id, "telegram"))
            .await
            .unwrap();
        say(&*store, id, &format!("quokkafish in {id}")).await;
    }
    let last = |id: &'static str| {
        let store = &store;
        async move {
            store
                .session_page(page(None, 10))
                .await
                .unwrap()
                .into_iter()
                .find(|a| a.session.id == id)
                .unwrap()
                .last_active
        }
    };
    let later = last("recent").await + 1.0;

    assert_eq!(
        store.delete_session_if_idle("nobody", later).await.unwrap(),
        IdleDeletion::Missing
    );

    // Used at the cutoff itself: not before it, so kept.
    let recent = last("recent").await;
    assert_eq!(
        store
            .delete_session_if_idle("recent", recent)
            .await
            .unwrap(),
        IdleDeletion::ActiveSince(recent)
    );

    // A message accepted for a chat routed here, not answered yet.
    let node = common::live_node(&*store, "node-a").await;
    store.set_route("telegram:dm:1", "busy").await.unwrap();
    let owed = NewOwedTurn {
        id: "t1".into(),
        session_key: "telegram:dm:1".into(),
        platform: "telegram".into(),
        event: "{}".into(),
        owner: node.clone(),
    };
    assert!(store.accept_turn(None, owed).await.unwrap());
    assert_eq!(
        store.delete_session_if_idle("busy", later).await.unwrap(),
        IdleDeletion::TurnRunning
    );
    // A node running a turn of a chat routed here.
    store.set_route("telegram:dm:2", "leased").await.unwrap();
    assert!(
        store
            .acquire_lease("turn:telegram:dm:2", &node, 60.0)
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        store.delete_session_if_idle("leased", later).await.unwrap(),
        IdleDeletion::TurnRunning
    );
    assert!(store.session("busy").await.unwrap().is_some());
    assert!(store.session("leased").await.unwrap().is_some());
    // Pages say so too, so a listing of what would go can leave them out.
    let owed: Vec<String> = store
        .session_page(page(None, 10))
        .await
        .unwrap()
        .into_iter()
        .filter(|a| a.turn_owed)
        .map(|a| a.session.id)
        .collect();
    assert_eq!(owed, ["busy", "leased"]);

    // Once answered and released, they go like the idle one.
    store.settle_turns(&["t1".to_owned()]).await.unwrap();
    assert!(
        store
            .release_lease("turn:telegram:dm:2", &node)
            .await
            .unwrap()
    );
    for id in ["idle", "busy", "leased"] {
        assert_eq!(
            store.delete_session_if_idle(id, later).await.unwrap(),
            IdleDeletion::Deleted,
            "{id}"
        );
        assert!(store.session(id).await.unwrap().is_none());
        assert!(matches!(
            store.messages(id).await.unwrap_err(),
            StoreError::NoSuchSession(_)
        ));
    }
    assert!(store.route("telegram:dm:1").await.unwrap().is_none());
    let hits = store
        .search(SearchQuery {
            text: "quokkafish".into(),
            sources: vec![],
            exclude_session: None,
            limit: 10,
        })
        .await
        .unwrap();
    let ids: Vec<&str> = hits.iter().map(|h| h.session.id.as_str()).collect();
    assert_eq!(ids, ["recent"]);
}

async fn stats_count_sessions_and_rows_by_source<S: Backend + SessionStore>(store: Fixture<S>) {
    let empty = store.session_stats().await.unwrap();
    assert!(empty.sources.is_empty());
    assert_eq!(empty.total().sessions, 0);
    assert_eq!(empty.total().last_active, None);

    for (id, source) in [("a", "cli"), ("b", "cli"), ("c", "telegram")] {
        store.create_session(new_session(id, source)).await.unwrap();
    }
    say(&*store, "a", "one").await;
    say(&*store, "a", "two").await;
    // Two rows replaced by one: 1 message as it stands, 3 rows stored.
    store
        .replace_active("a", &[Message::user("summary")])
        .await
        .unwrap();
    say(&*store, "b", "three").await;

    let stats = store.session_stats().await.unwrap();
    let sources: Vec<(&str, u64, u64, u64)> = stats
        .sources
        .iter()
        .map(|s| (s.source.as_str(), s.sessions, s.messages, s.rows))
        .collect();
    assert_eq!(sources, [("cli", 2, 2, 4), ("telegram", 1, 0, 0)]);
    let started: Vec<f64> = {
        let mut v = Vec::new();
        for id in ["a", "b", "c"] {
            v.push(store.session(id).await.unwrap().unwrap().started_at);
        }
        v
    };
    let newest_row = store.messages("b").await.unwrap()[0].timestamp;
    let total = stats.total();
    assert_eq!((total.sessions, total.messages, total.rows), (3, 2, 4));
    assert_eq!(
        total.first_started,
        started.iter().copied().reduce(f64::min)
    );
    assert_eq!(total.last_active, Some(newest_row));
    let telegram = &stats.sources[1];
    assert_eq!(telegram.last_active, Some(started[2]));
    let size = stats.size.expect("both backends measure themselves");
    assert!(size.bytes > 0, "{size:?}");
}

contract_tests!(
    pages_follow_the_ids_and_carry_the_last_activity,
    an_idle_session_goes_unless_used_since_or_owed_a_turn,
    stats_count_sessions_and_rows_by_source,
);
