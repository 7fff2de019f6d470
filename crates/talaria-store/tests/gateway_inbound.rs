//! Inbound dedupe and adapter cursors: one taker per event, even across
//! two stores on one file; cursors survive a reopen.

mod common;

use std::sync::{Arc, Barrier};

use common::temp_store;
use talaria_store::{CursorStore, InboundStore, SqliteStore};

#[tokio::test]
async fn an_inbound_id_is_taken_once_per_platform() {
    let (_dir, store) = temp_store();
    assert!(store.first_delivery("slack", "C1:1700.01").await.unwrap());
    assert!(!store.first_delivery("slack", "C1:1700.01").await.unwrap());
    // The same id on another platform is another event.
    assert!(store.first_delivery("discord", "C1:1700.01").await.unwrap());
    assert!(store.first_delivery("slack", "C1:1700.02").await.unwrap());
}

#[test]
fn two_stores_racing_for_one_event_give_it_to_exactly_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    drop(SqliteStore::open(&path).unwrap());
    for round in 0..20 {
        let barrier = Arc::new(Barrier::new(2));
        let takers: Vec<_> = (0..2)
            .map(|_| {
                let (path, barrier) = (path.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let store = SqliteStore::open(&path).unwrap();
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .unwrap();
                    barrier.wait();
                    rt.block_on(store.first_delivery("matrix", &format!("$event{round}")))
                        .unwrap()
                })
            })
            .collect();
        let won: usize = takers
            .into_iter()
            .map(|t| usize::from(t.join().unwrap()))
            .sum();
        assert_eq!(won, 1, "round {round}");
    }
}

#[tokio::test]
async fn pruning_forgets_only_old_ids() {
    let (_dir, store) = temp_store();
    assert!(store.first_delivery("slack", "old").await.unwrap());
    let cutoff = talaria_core::unix_now() + 1.0;
    assert_eq!(store.prune_inbound(cutoff - 3600.0).await.unwrap(), 0);
    assert_eq!(store.prune_inbound(cutoff).await.unwrap(), 1);
    assert!(store.first_delivery("slack", "old").await.unwrap());
}

#[tokio::test]
async fn cursors_are_replaced_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let store = SqliteStore::open(&path).unwrap();
        assert_eq!(store.cursor("matrix", "since").await.unwrap(), None);
        store.set_cursor("matrix", "since", "s1_2").await.unwrap();
        store.set_cursor("matrix", "since", "s9_9").await.unwrap();
        store
            .set_cursor("mattermost", "since", "other")
            .await
            .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
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
}
