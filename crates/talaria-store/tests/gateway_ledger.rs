//! The delivery ledger: every transition, guarded claims, pruning.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Barrier};

use common::temp_store;
use talaria_store::{LedgerStore, NewObligation, ObligationState, Owner, SqliteStore};

const DEAD: Owner = Owner {
    pid: 999_999,
    started_at: Some(12_345),
};

fn owner(pid: u32, started_at: u64) -> Owner {
    Owner {
        pid,
        started_at: Some(started_at),
    }
}

fn obligation(id: &str, who: Owner) -> NewObligation {
    NewObligation {
        id: id.to_string(),
        session_key: "telegram:dm:42".to_string(),
        platform: "telegram".to_string(),
        chat_id: "42".to_string(),
        thread_id: Some("17".to_string()),
        reply_to: Some("1001".to_string()),
        content: format!("the answer to {id}"),
        owner: who,
    }
}

/// Moves a row's `created_at` and `updated_at` back by `secs`, as if it
/// were recorded that much earlier: later stamps then differ however fast
/// the clock reads, without sleeping.
fn age(path: &Path, id: &str, secs: f64) {
    let raw = rusqlite::Connection::open(path).unwrap();
    raw.execute(
        "UPDATE delivery_obligations SET created_at = created_at - ?2, \
         updated_at = updated_at - ?2 WHERE id = ?1",
        rusqlite::params![id, secs],
    )
    .unwrap();
}

/// Moves a row's `updated_at` back, as if it was last touched `secs` ago.
fn age_updated(path: &Path, id: &str, secs: f64) {
    let raw = rusqlite::Connection::open(path).unwrap();
    raw.execute(
        "UPDATE delivery_obligations SET updated_at = updated_at - ?2 WHERE id = ?1",
        rusqlite::params![id, secs],
    )
    .unwrap();
}

#[tokio::test]
async fn record_stores_a_pending_row_with_the_full_address() {
    let (_dir, store) = temp_store();
    let me = owner(100, 7);
    store.record_obligation(obligation("a", me)).await.unwrap();
    let row = store.obligation("a").await.unwrap().unwrap();
    assert_eq!(row.id, "a");
    assert_eq!(row.session_key, "telegram:dm:42");
    assert_eq!(row.platform, "telegram");
    assert_eq!(row.chat_id, "42");
    assert_eq!(row.thread_id.as_deref(), Some("17"));
    assert_eq!(row.reply_to.as_deref(), Some("1001"));
    assert_eq!(row.content, "the answer to a");
    assert_eq!(row.state, ObligationState::Pending);
    assert_eq!(row.attempts, 0);
    assert_eq!(row.created_at, row.updated_at);
    assert_eq!(row.owner, Some(me));
    assert_eq!(row.last_error, None);
    assert_eq!(store.obligation("missing").await.unwrap(), None);
}

#[tokio::test]
async fn every_transition_is_recorded() {
    let (dir, store) = temp_store();
    store
        .record_obligation(obligation("a", owner(1, 1)))
        .await
        .unwrap();
    age(&dir.path().join("state.db"), "a", 10.0);
    let recorded = store.obligation("a").await.unwrap().unwrap();

    store.mark_attempting("a").await.unwrap();
    let row = store.obligation("a").await.unwrap().unwrap();
    assert_eq!(row.state, ObligationState::Attempting);
    // Only claims count attempts: a first send is not a retry.
    assert_eq!(row.attempts, 0);
    assert!(row.updated_at > recorded.updated_at);
    assert_eq!(row.created_at, recorded.created_at);

    store.mark_failed("a", "connection reset").await.unwrap();
    let row = store.obligation("a").await.unwrap().unwrap();
    assert_eq!(row.state, ObligationState::Failed);
    assert_eq!(row.last_error.as_deref(), Some("connection reset"));

    store.mark_delivered("a").await.unwrap();
    let row = store.obligation("a").await.unwrap().unwrap();
    assert_eq!(row.state, ObligationState::Delivered);

    store
        .record_obligation(obligation("b", owner(1, 1)))
        .await
        .unwrap();
    store.abandon_obligation("b", "too old").await.unwrap();
    let row = store.obligation("b").await.unwrap().unwrap();
    assert_eq!(row.state, ObligationState::Abandoned);
    assert_eq!(row.last_error.as_deref(), Some("too old"));
}

#[tokio::test]
async fn failure_text_is_cut_to_500_chars_on_a_char_boundary() {
    let (_dir, store) = temp_store();
    store
        .record_obligation(obligation("a", owner(1, 1)))
        .await
        .unwrap();
    // Two-byte chars: a byte-based cut at 500 would split one.
    let error = "é".repeat(300) + &"x".repeat(300);
    store.mark_failed("a", &error).await.unwrap();
    let kept = store
        .obligation("a")
        .await
        .unwrap()
        .unwrap()
        .last_error
        .unwrap();
    assert_eq!(kept.chars().count(), 500);
    assert_eq!(kept, "é".repeat(300) + &"x".repeat(200));

    store.mark_failed("a", "short").await.unwrap();
    let kept = store
        .obligation("a")
        .await
        .unwrap()
        .unwrap()
        .last_error
        .unwrap();
    assert_eq!(kept, "short");
}

#[tokio::test]
async fn marking_an_unknown_id_succeeds_and_changes_nothing() {
    let (_dir, store) = temp_store();
    store.mark_attempting("ghost").await.unwrap();
    store.mark_delivered("ghost").await.unwrap();
    store.mark_failed("ghost", "boom").await.unwrap();
    store.abandon_obligation("ghost", "why").await.unwrap();
    assert_eq!(store.obligation("ghost").await.unwrap(), None);
    assert!(store.obligation_counts().await.unwrap().is_empty());
}

#[tokio::test]
async fn re_recording_starts_the_obligation_over() {
    let (dir, store) = temp_store();
    let first = owner(1, 1);
    store
        .record_obligation(obligation("a", first))
        .await
        .unwrap();
    assert!(
        store
            .claim_obligation("a", Some(first), owner(2, 2))
            .await
            .unwrap()
    );
    store.mark_failed("a", "boom").await.unwrap();
    age(&dir.path().join("state.db"), "a", 10.0);
    let before = store.obligation("a").await.unwrap().unwrap();
    assert_eq!(before.attempts, 1);

    let again = owner(3, 3);
    store
        .record_obligation(obligation("a", again))
        .await
        .unwrap();
    let row = store.obligation("a").await.unwrap().unwrap();
    assert_eq!(row.state, ObligationState::Pending);
    assert_eq!(row.attempts, 0);
    assert_eq!(row.owner, Some(again));
    assert_eq!(row.last_error, None);
    assert!(row.created_at > before.created_at);
    assert_eq!(store.open_obligations().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_claim_wins_once_and_a_stale_expectation_loses() {
    let (_dir, store) = temp_store();
    store
        .record_obligation(obligation("a", DEAD))
        .await
        .unwrap();
    store.mark_attempting("a").await.unwrap();
    let a = owner(10, 10);
    let b = owner(20, 20);
    assert!(store.claim_obligation("a", Some(DEAD), a).await.unwrap());
    // B read the row before A's claim and still expects the dead owner.
    assert!(!store.claim_obligation("a", Some(DEAD), b).await.unwrap());

    let row = store.obligation("a").await.unwrap().unwrap();
    assert_eq!(row.owner, Some(a));
    assert_eq!(row.attempts, 1);
    // A claimed row is in the claimer's hands: attempting.
    assert_eq!(row.state, ObligationState::Attempting);

    // Expecting the current owner succeeds and counts another attempt.
    assert!(store.claim_obligation("a", Some(a), b).await.unwrap());
    let row = store.obligation("a").await.unwrap().unwrap();
    assert_eq!(row.owner, Some(b));
    assert_eq!(row.attempts, 2);

    assert!(
        !store
            .claim_obligation("ghost", Some(DEAD), a)
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn two_claims_of_ones_own_failed_row_win_once() {
    let (_dir, store) = temp_store();
    let me = owner(10, 10);
    store.record_obligation(obligation("a", me)).await.unwrap();
    store.mark_failed("a", "platform down").await.unwrap();
    // Two sweeps of one process read the failed row, both expecting (and
    // claiming for) the same owner: the first claim leaves it attempting
    // under `me`, which the second must not take again.
    assert!(store.claim_obligation("a", Some(me), me).await.unwrap());
    assert!(!store.claim_obligation("a", Some(me), me).await.unwrap());
    let row = store.obligation("a").await.unwrap().unwrap();
    assert_eq!(row.state, ObligationState::Attempting);
    assert_eq!(row.attempts, 1);
    assert_eq!(row.owner, Some(me));

    // Failed again, it can be re-claimed again, once.
    store.mark_failed("a", "still down").await.unwrap();
    assert!(store.claim_obligation("a", Some(me), me).await.unwrap());
    assert!(!store.claim_obligation("a", Some(me), me).await.unwrap());
    assert_eq!(store.obligation("a").await.unwrap().unwrap().attempts, 2);

    // Another process may still take over a row attempting under `me`
    // (that is how a dead owner's in-flight row is recovered).
    assert!(
        store
            .claim_obligation("a", Some(me), owner(20, 20))
            .await
            .unwrap()
    );

    // The same holds for an owner whose start time is unknown (NULL).
    let no_start = Owner {
        pid: 30,
        started_at: None,
    };
    store
        .record_obligation(obligation("b", no_start))
        .await
        .unwrap();
    store.mark_failed("b", "boom").await.unwrap();
    assert!(
        store
            .claim_obligation("b", Some(no_start), no_start)
            .await
            .unwrap()
    );
    assert!(
        !store
            .claim_obligation("b", Some(no_start), no_start)
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn a_claim_compares_the_start_time_too() {
    let (_dir, store) = temp_store();
    let original = owner(4242, 1000);
    store
        .record_obligation(obligation("a", original))
        .await
        .unwrap();
    let new = owner(1, 1);
    // Same pid, another process (the pid was reused).
    assert!(
        !store
            .claim_obligation("a", Some(owner(4242, 1001)), new)
            .await
            .unwrap()
    );
    let unknown_start = Owner {
        pid: 4242,
        started_at: None,
    };
    assert!(
        !store
            .claim_obligation("a", Some(unknown_start), new)
            .await
            .unwrap()
    );
    assert!(!store.claim_obligation("a", None, new).await.unwrap());
    assert_eq!(store.obligation("a").await.unwrap().unwrap().attempts, 0);
    assert!(
        store
            .claim_obligation("a", Some(original), new)
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn a_missing_start_time_matches_only_a_missing_start_time() {
    let (_dir, store) = temp_store();
    let no_start = Owner {
        pid: 77,
        started_at: None,
    };
    store
        .record_obligation(obligation("a", no_start))
        .await
        .unwrap();
    assert_eq!(
        store.obligation("a").await.unwrap().unwrap().owner,
        Some(no_start)
    );
    assert!(
        !store
            .claim_obligation("a", Some(owner(77, 0)), owner(1, 1))
            .await
            .unwrap()
    );
    assert!(
        store
            .claim_obligation("a", Some(no_start), owner(1, 1))
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn delivered_and_abandoned_rows_cannot_be_claimed() {
    let (_dir, store) = temp_store();
    store
        .record_obligation(obligation("d", DEAD))
        .await
        .unwrap();
    store
        .record_obligation(obligation("x", DEAD))
        .await
        .unwrap();
    store
        .record_obligation(obligation("f", DEAD))
        .await
        .unwrap();
    store.mark_delivered("d").await.unwrap();
    store.abandon_obligation("x", "gave up").await.unwrap();
    store.mark_failed("f", "boom").await.unwrap();
    let me = owner(1, 1);
    assert!(!store.claim_obligation("d", Some(DEAD), me).await.unwrap());
    assert!(!store.claim_obligation("x", Some(DEAD), me).await.unwrap());
    assert!(store.claim_obligation("f", Some(DEAD), me).await.unwrap());
    for id in ["d", "x"] {
        let row = store.obligation(id).await.unwrap().unwrap();
        assert_eq!(row.owner, Some(DEAD));
        assert_eq!(row.attempts, 0);
    }
}

#[tokio::test]
async fn open_obligations_are_the_owed_ones_oldest_first() {
    let (dir, store) = temp_store();
    let path = dir.path().join("state.db");
    // Recorded newest first and aged so that "1" is the oldest: creation
    // order, not insertion order, decides.
    for (n, id) in ["5", "4", "3", "2", "1"].into_iter().enumerate() {
        store.record_obligation(obligation(id, DEAD)).await.unwrap();
        age(&path, id, 10.0 * (n + 1) as f64);
    }
    store.mark_attempting("2").await.unwrap();
    store.mark_failed("3", "boom").await.unwrap();
    store.mark_delivered("4").await.unwrap();
    store.abandon_obligation("5", "old").await.unwrap();
    // Touching an older row does not move it behind newer ones.
    store.mark_attempting("1").await.unwrap();
    let open: Vec<String> = store
        .open_obligations()
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.id)
        .collect();
    assert_eq!(open, ["1", "2", "3"]);
}

#[tokio::test]
async fn prune_deletes_only_old_closed_rows() {
    let (dir, store) = temp_store();
    let path = dir.path().join("state.db");
    for id in ["old_done", "old_gone", "old_open", "old_failed", "new_done"] {
        store.record_obligation(obligation(id, DEAD)).await.unwrap();
    }
    store.mark_delivered("old_done").await.unwrap();
    store.abandon_obligation("old_gone", "x").await.unwrap();
    store.mark_failed("old_failed", "x").await.unwrap();
    store.mark_delivered("new_done").await.unwrap();
    for id in ["old_done", "old_gone", "old_open", "old_failed"] {
        age_updated(&path, id, 10.0 * 86_400.0);
    }
    let cutoff = store
        .obligation("new_done")
        .await
        .unwrap()
        .unwrap()
        .updated_at
        - 86_400.0;
    assert_eq!(store.prune_obligations(cutoff).await.unwrap(), 2);
    assert_eq!(store.obligation("old_done").await.unwrap(), None);
    assert_eq!(store.obligation("old_gone").await.unwrap(), None);
    for id in ["old_open", "old_failed", "new_done"] {
        assert!(store.obligation(id).await.unwrap().is_some(), "{id}");
    }
    assert_eq!(store.prune_obligations(cutoff).await.unwrap(), 0);
}

#[tokio::test]
async fn counts_group_rows_by_state() {
    let (_dir, store) = temp_store();
    for id in ["a", "b", "c", "d", "e", "f"] {
        store.record_obligation(obligation(id, DEAD)).await.unwrap();
    }
    store.mark_attempting("b").await.unwrap();
    store.mark_delivered("c").await.unwrap();
    store.mark_delivered("d").await.unwrap();
    store.mark_failed("e", "x").await.unwrap();
    store.abandon_obligation("f", "x").await.unwrap();
    let counts = store.obligation_counts().await.unwrap();
    let expected: BTreeMap<ObligationState, u64> = [
        (ObligationState::Pending, 1),
        (ObligationState::Attempting, 1),
        (ObligationState::Delivered, 2),
        (ObligationState::Failed, 1),
        (ObligationState::Abandoned, 1),
    ]
    .into();
    assert_eq!(counts, expected);
}

/// Two handles on one file, as two gateway processes would have, race to
/// claim the same dead owner's rows from two OS threads.
#[test]
fn two_sweepers_racing_claim_each_row_exactly_once() {
    const ROWS: usize = 50;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let seed = SqliteStore::open(&path).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        for i in 0..ROWS {
            seed.record_obligation(obligation(&format!("row{i:02}"), DEAD))
                .await
                .unwrap();
        }
    });

    let barrier = Arc::new(Barrier::new(2));
    let sweepers: Vec<_> = [owner(1_000_001, 1), owner(1_000_002, 2)]
        .into_iter()
        .map(|me| {
            let path = path.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let store = SqliteStore::open(&path).unwrap();
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                barrier.wait();
                rt.block_on(async {
                    let mut won = Vec::new();
                    // Each sweeper tries every row twice, so every row is
                    // contested at least once after the other has won it.
                    for _ in 0..2 {
                        for i in 0..ROWS {
                            let id = format!("row{i:02}");
                            if store.claim_obligation(&id, Some(DEAD), me).await.unwrap() {
                                won.push(id);
                            }
                        }
                    }
                    (me, won)
                })
            })
        })
        .collect();

    let mut winners: HashMap<String, Owner> = HashMap::new();
    for handle in sweepers {
        let (me, won) = handle.join().unwrap();
        for id in won {
            assert!(
                winners.insert(id.clone(), me).is_none(),
                "{id} was claimed twice"
            );
        }
    }
    assert_eq!(winners.len(), ROWS, "every row was claimed");
    rt.block_on(async {
        for (id, me) in &winners {
            let row = seed.obligation(id).await.unwrap().unwrap();
            assert_eq!(row.owner, Some(*me), "{id}");
            assert_eq!(row.attempts, 1, "{id}");
            assert_eq!(row.state, ObligationState::Attempting, "{id}");
        }
    });
}

#[tokio::test]
async fn a_batch_claim_guards_each_row_on_its_own_owner() {
    let (_dir, store) = temp_store();
    let me = owner(7, 70);
    for id in ["a", "b", "c", "d"] {
        store.record_obligation(obligation(id, DEAD)).await.unwrap();
    }
    // Another sweeper took `b` first; `d` was never ours to expect.
    assert!(
        store
            .claim_obligation("b", Some(DEAD), owner(8, 80))
            .await
            .unwrap()
    );
    let claims = vec![
        ("a".to_owned(), Some(DEAD)),
        ("b".to_owned(), Some(DEAD)),
        ("c".to_owned(), Some(DEAD)),
        ("d".to_owned(), Some(owner(9, 90))),
        ("missing".to_owned(), Some(DEAD)),
    ];
    let won = store.claim_obligations(&claims, me).await.unwrap();
    assert_eq!(won, vec![true, false, true, false, false]);
    // A second batch of the same claims wins nothing.
    let again = store.claim_obligations(&claims, me).await.unwrap();
    assert_eq!(again, vec![false; 5]);
    let a = store.obligation("a").await.unwrap().unwrap();
    assert_eq!((a.owner, a.attempts), (Some(me), 1));
    let b = store.obligation("b").await.unwrap().unwrap();
    assert_eq!(b.owner, Some(owner(8, 80)));
}
