//! What the session-expiry watcher asks of the route store: listing stale
//! routes whose session is still open, and ending a route's session at
//! most once per expiry.

mod common;

use std::path::Path;

use common::{new_session, temp_store};
use talaria_store::{RouteStore, SessionStore};

/// Moves a route's stamps back by `secs`, so routes get distinct, ordered
/// times without sleeping.
fn age_route(path: &Path, session_key: &str, secs: f64) {
    let raw = rusqlite::Connection::open(path).unwrap();
    raw.execute(
        "UPDATE gateway_routes SET created_at = created_at - ?2, \
         updated_at = updated_at - ?2 WHERE session_key = ?1",
        rusqlite::params![session_key, secs],
    )
    .unwrap();
}

fn keys(routes: &[talaria_store::Route]) -> Vec<&str> {
    routes.iter().map(|r| r.session_key.as_str()).collect()
}

#[tokio::test]
async fn stale_routes_are_listed_oldest_first_up_to_the_limit() {
    let (dir, store) = temp_store();
    let db = dir.path().join("state.db");
    for (key, id, age) in [
        ("b", "s_b", 300.0),
        ("a", "s_a", 100.0),
        ("c", "s_c", 200.0),
    ] {
        store
            .create_session(new_session(id, "telegram"))
            .await
            .unwrap();
        store.set_route(key, id).await.unwrap();
        age_route(&db, key, age);
    }
    store
        .create_session(new_session("s_fresh", "telegram"))
        .await
        .unwrap();
    store.set_route("fresh", "s_fresh").await.unwrap();
    let now = talaria_core::unix_now();

    let all = store.stale_routes(now - 50.0, 10).await.unwrap();
    assert_eq!(keys(&all), ["b", "c", "a"]);
    assert_eq!(all[0].session_id, "s_b");
    assert_eq!(
        keys(&store.stale_routes(now - 50.0, 2).await.unwrap()),
        ["b", "c"]
    );
    // The cutoff is strict about recency: only what is older than it.
    assert_eq!(
        keys(&store.stale_routes(now - 150.0, 10).await.unwrap()),
        ["b", "c"]
    );
    assert!(
        store
            .stale_routes(now - 1000.0, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.stale_routes(now - 50.0, 0).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_route_whose_session_ended_since_its_last_activity_is_left_out() {
    let (_dir, store) = temp_store();
    for (key, id) in [
        ("ended", "s1"),
        ("open", "s2"),
        ("resumed", "s3"),
        ("ghost", "s4"),
    ] {
        store
            .create_session(new_session(id, "telegram"))
            .await
            .unwrap();
        if key == "resumed" {
            // Ended earlier, then brought back: the route moved after the end.
            store.end_session(id, "new_session").await.unwrap();
        }
        store.set_route(key, id).await.unwrap();
    }
    store.set_route("ghost", "no_such_session").await.unwrap();
    // The watcher's end comes after the route's last activity.
    store.end_session("s1", "idle").await.unwrap();

    let later = talaria_core::unix_now() + 1.0;
    let mut listed = keys(&store.stale_routes(later, 10).await.unwrap())
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    listed.sort();
    assert_eq!(listed, ["open", "resumed"]);
}

#[tokio::test]
async fn a_routes_session_is_ended_once_per_expiry() {
    let (dir, store) = temp_store();
    let db = dir.path().join("state.db");
    store
        .create_session(new_session("s1", "telegram"))
        .await
        .unwrap();
    store.set_route("k", "s1").await.unwrap();
    age_route(&db, "k", 100.0);
    let route = store.route("k").await.unwrap().unwrap();

    assert!(store.end_route_session(&route, "idle").await.unwrap());
    let ended = store.session("s1").await.unwrap().unwrap();
    assert_eq!(ended.end_reason.as_deref(), Some("idle"));
    let stamp = ended.ended_at.unwrap();
    assert!(stamp >= route.updated_at);

    // A second caller acting on the same route state changes nothing,
    // neither the reason nor the stamp.
    assert!(
        !store
            .end_route_session(&route, "new_session")
            .await
            .unwrap()
    );
    let again = store.session("s1").await.unwrap().unwrap();
    assert_eq!(again.end_reason.as_deref(), Some("idle"));
    assert_eq!(again.ended_at, Some(stamp));

    // Brought back (the route moves on), it can be ended again.
    store.set_route("k", "s1").await.unwrap();
    let resumed = store.route("k").await.unwrap().unwrap();
    assert!(resumed.updated_at > stamp);
    assert!(store.end_route_session(&resumed, "daily").await.unwrap());
    let last = store.session("s1").await.unwrap().unwrap();
    assert_eq!(last.end_reason.as_deref(), Some("daily"));

    let ghost = talaria_store::Route {
        session_id: "missing".into(),
        ..resumed
    };
    assert!(!store.end_route_session(&ghost, "idle").await.unwrap());
}

#[tokio::test]
async fn racing_ends_of_one_expired_session_have_one_winner() {
    let (dir, store) = temp_store();
    let store = std::sync::Arc::new(store);
    let db = dir.path().join("state.db");
    store
        .create_session(new_session("s1", "telegram"))
        .await
        .unwrap();
    store.set_route("k", "s1").await.unwrap();
    age_route(&db, "k", 100.0);
    let route = store.route("k").await.unwrap().unwrap();

    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            let route = route.clone();
            tokio::spawn(async move { store.end_route_session(&route, "idle").await.unwrap() })
        })
        .collect();
    let mut wins = 0;
    for t in tasks {
        if t.await.unwrap() {
            wins += 1;
        }
    }
    assert_eq!(wins, 1);
}
