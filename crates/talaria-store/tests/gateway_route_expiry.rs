//! What the session-expiry watcher asks of the route store: listing stale
//! routes whose session is still open, and ending a route's session at
//! most once per expiry.

use crate::common;

use std::sync::Arc;

use common::{Backend, Fixture, new_session};
use talaria_store::{RouteStore, SessionStore};

/// What these tests need of a backend.
trait Store: Backend + RouteStore + SessionStore {}
impl<S: Backend + RouteStore + SessionStore> Store for S {}

/// Moves a route's stamps back by `secs`, so routes get distinct, ordered
/// times without sleeping.
async fn age_route<S>(f: &Fixture<S>, session_key: &str, secs: f64) {
    // The key is a test constant; the statement reads the same in both
    // dialects.
    let changed = f
        .execute(&format!(
            "UPDATE gateway_routes SET created_at = created_at - {secs}, \
             updated_at = updated_at - {secs} WHERE session_key = '{session_key}'"
        ))
        .await;
    assert_eq!(changed, 1);
}

fn keys(routes: &[talaria_store::Route]) -> Vec<&str> {
    routes.iter().map(|r| r.session_key.as_str()).collect()
}

async fn stale_routes_are_listed_oldest_first_up_to_the_limit<S: Store>(store: Fixture<S>) {
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
        age_route(&store, key, age).await;
    }
    store
        .create_session(new_session("s_fresh", "telegram"))
        .await
        .unwrap();
    store.set_route("fresh", "s_fresh").await.unwrap();
    // "Now" by the store's clock (the database server's, for PostgreSQL).
    let now = store.route("fresh").await.unwrap().unwrap().updated_at;

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

async fn a_route_whose_session_ended_since_its_last_activity_is_left_out<S: Store>(
    store: Fixture<S>,
) {
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

    // Later than every stamp, by the store's clock.
    let last = store
        .session("s1")
        .await
        .unwrap()
        .unwrap()
        .ended_at
        .unwrap();
    let later = last + 1.0;
    let mut listed = keys(&store.stale_routes(later, 10).await.unwrap())
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    listed.sort();
    assert_eq!(listed, ["open", "resumed"]);
}

async fn a_routes_session_is_ended_once_per_expiry<S: Store>(store: Fixture<S>) {
    store
        .create_session(new_session("s1", "telegram"))
        .await
        .unwrap();
    store.set_route("k", "s1").await.unwrap();
    age_route(&store, "k", 100.0).await;
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

async fn racing_ends_of_one_expired_session_have_one_winner<S: Store>(f: Fixture<S>) {
    let store = f.store.clone();
    store
        .create_session(new_session("s1", "telegram"))
        .await
        .unwrap();
    store.set_route("k", "s1").await.unwrap();
    age_route(&f, "k", 100.0).await;
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

/// Two nodes (two handles on one database) running the expiry watcher
/// over the same stale routes: every session is ended exactly once, with
/// the reason of whichever node won.
async fn nodes_racing_to_end_expired_sessions_end_each_once<S: Store>(f: Fixture<S>) {
    const ROUTES: usize = 20;
    for i in 0..ROUTES {
        let (key, id) = (format!("k{i}"), format!("s{i}"));
        f.create_session(new_session(&id, "telegram"))
            .await
            .unwrap();
        f.set_route(&key, &id).await.unwrap();
        age_route(&f, &key, 100.0).await;
    }
    let nodes: [Arc<S>; 2] = [f.store.clone(), Arc::new(f.reopen().await)];
    let before = f.route("k0").await.unwrap().unwrap().updated_at + 50.0;
    let mut tasks = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        for worker in 0..3 {
            let node = node.clone();
            tasks.push(tokio::spawn(async move {
                let reason = format!("idle by node {n}");
                let mut won = Vec::new();
                let mut routes = node.stale_routes(before, ROUTES).await.unwrap();
                // Workers walk the list from different ends so they collide.
                if worker % 2 == 1 {
                    routes.reverse();
                }
                for route in routes {
                    if node.end_route_session(&route, &reason).await.unwrap() {
                        won.push(route.session_id);
                    }
                }
                (reason, won)
            }));
        }
    }
    let mut winners = std::collections::HashMap::new();
    for task in tasks {
        let (reason, won) = task.await.unwrap();
        for id in won {
            assert!(
                winners.insert(id.clone(), reason.clone()).is_none(),
                "{id} was ended twice"
            );
        }
    }
    assert_eq!(winners.len(), ROUTES);
    for (id, reason) in &winners {
        let rec = f.session(id).await.unwrap().unwrap();
        assert_eq!(rec.end_reason.as_ref(), Some(reason));
    }
    // Ended since their last activity, the routes are no longer stale.
    assert!(f.stale_routes(before, ROUTES).await.unwrap().is_empty());
}

contract_tests!(
    stale_routes_are_listed_oldest_first_up_to_the_limit,
    a_route_whose_session_ended_since_its_last_activity_is_left_out,
    a_routes_session_is_ended_once_per_expiry,
    racing_ends_of_one_expired_session_have_one_winner,
    nodes_racing_to_end_expired_sessions_end_each_once,
);
