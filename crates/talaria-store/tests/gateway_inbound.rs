//! Inbound dedupe and adapter cursors, on both backends: one taker per
//! event, even across two stores on one database; cursors survive a
//! reopen and move in one write.

use crate::common;

use std::sync::Arc;

use common::{Backend, Fixture};
use talaria_store::{CursorStore, InboundStore};
use tokio::sync::Barrier;

async fn an_inbound_id_is_taken_once_per_platform<S: Backend + InboundStore>(f: Fixture<S>) {
    assert!(f.first_delivery("slack", "C1:1700.01").await.unwrap());
    assert!(!f.first_delivery("slack", "C1:1700.01").await.unwrap());
    // The same id on another platform is another event.
    assert!(f.first_delivery("discord", "C1:1700.01").await.unwrap());
    assert!(f.first_delivery("slack", "C1:1700.02").await.unwrap());
}

/// Two handles on one database (two gateways) race for each event, two
/// callers on each: exactly one of the four takes it.
async fn two_stores_racing_for_one_event_give_it_to_exactly_one<S: Backend + InboundStore>(
    f: Fixture<S>,
) {
    let handles: [Arc<S>; 2] = [f.store.clone(), Arc::new(f.reopen().await)];
    for round in 0..40 {
        let barrier = Arc::new(Barrier::new(4));
        let takers: Vec<_> = (0..4)
            .map(|i| {
                let (store, barrier) = (handles[i % 2].clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store
                        .first_delivery("matrix", &format!("$event{round}"))
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut won = 0;
        for taker in takers {
            won += usize::from(taker.await.unwrap());
        }
        assert_eq!(won, 1, "round {round}");
    }
}

async fn pruning_forgets_only_old_ids<S: Backend + InboundStore>(f: Fixture<S>) {
    assert!(f.first_delivery("slack", "old").await.unwrap());
    let cutoff = talaria_core::unix_now() + 1.0;
    assert_eq!(f.prune_inbound(cutoff - 3600.0).await.unwrap(), 0);
    assert_eq!(f.prune_inbound(cutoff).await.unwrap(), 1);
    assert!(f.first_delivery("slack", "old").await.unwrap());
}

async fn cursors_are_replaced_and_survive_a_reopen<S: Backend + CursorStore>(f: Fixture<S>) {
    assert_eq!(f.cursor("matrix", "since").await.unwrap(), None);
    f.set_cursor("matrix", "since", "s1_2").await.unwrap();
    f.set_cursor("matrix", "since", "s9_9").await.unwrap();
    f.set_cursor("mattermost", "since", "other").await.unwrap();
    let store = f.reopen().await;
    assert_eq!(
        store.cursor("matrix", "since").await.unwrap().as_deref(),
        Some("s9_9")
    );
    assert_eq!(
        store
            .cursor("mattermost", "since")
            .await
            .unwrap()
            .as_deref(),
        Some("other")
    );
    assert!(store.delete_cursor("matrix", "since").await.unwrap());
    assert!(!store.delete_cursor("matrix", "since").await.unwrap());
    assert_eq!(store.cursor("matrix", "since").await.unwrap(), None);
    assert!(store.cursor("mattermost", "since").await.unwrap().is_some());
}

async fn a_moved_cursor_leaves_its_old_name<S: Backend + CursorStore>(f: Fixture<S>) {
    f.set_cursor("api_server", "a", "1 s1").await.unwrap();
    f.set_cursor("api_server", "c", "old").await.unwrap();
    f.move_cursor("api_server", "a", "b", "2 s1").await.unwrap();
    assert_eq!(f.cursor("api_server", "a").await.unwrap(), None);
    assert_eq!(
        f.cursor("api_server", "b").await.unwrap().as_deref(),
        Some("2 s1")
    );
    // Onto a name already taken: replaced. From a name that is gone: fine.
    f.move_cursor("api_server", "b", "c", "3 s1").await.unwrap();
    f.move_cursor("api_server", "missing", "d", "4 s2")
        .await
        .unwrap();
    // Onto itself: kept, with the new value.
    f.move_cursor("api_server", "d", "d", "5 s2").await.unwrap();
    let store = f.reopen().await;
    assert_eq!(store.cursor("api_server", "b").await.unwrap(), None);
    assert_eq!(
        store.cursor("api_server", "c").await.unwrap().as_deref(),
        Some("3 s1")
    );
    assert_eq!(
        store.cursor("api_server", "d").await.unwrap().as_deref(),
        Some("5 s2")
    );
}

contract_tests!(
    a_moved_cursor_leaves_its_old_name,
    an_inbound_id_is_taken_once_per_platform,
    two_stores_racing_for_one_event_give_it_to_exactly_one,
    pruning_forgets_only_old_ids,
    cursors_are_replaced_and_survive_a_reopen,
);
