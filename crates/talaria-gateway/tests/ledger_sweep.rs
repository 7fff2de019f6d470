//! The ledger's sweep over a real SQLite file: which rows a gateway takes
//! over after a crash, which it leaves, which it abandons, and that two
//! gateways sweeping at once never both take a row.

use std::collections::HashSet;
use std::sync::Arc;

use talaria_gateway::SendError;
use talaria_gateway::ledger::{Ledger, Liveness, MAX_ATTEMPTS, RECOVERY_MARKER, obligation_id};
use talaria_gateway::owner;
use talaria_store::{LedgerStore, NewObligation, ObligationState, Owner, SqliteStore};

/// A process that existed and is gone: spawned, then reaped.
fn dead_owner() -> Owner {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    let started_at = owner::start_time(pid);
    child.wait().unwrap();
    Owner { pid, started_at }
}

fn store() -> (tempfile::TempDir, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("state.db")).unwrap());
    (dir, store)
}

fn row(id_seed: &str, platform: &str, owner: Owner) -> NewObligation {
    NewObligation {
        id: obligation_id("agent:main:telegram:dm:42", id_seed, "the answer"),
        session_key: "agent:main:telegram:dm:42".into(),
        platform: platform.into(),
        chat_id: "42".into(),
        thread_id: Some("17".into()),
        reply_to: Some(id_seed.into()),
        content: "the answer".into(),
        owner,
    }
}

fn telegram() -> HashSet<String> {
    ["telegram".to_owned()].into()
}

#[tokio::test]
async fn dead_owners_rows_are_claimed_with_the_marker_only_when_a_send_may_have_happened() {
    let (_dir, store) = store();
    let dead = dead_owner();
    let pending = row("1", "telegram", dead);
    let attempting = row("2", "telegram", dead);
    let failed = row("3", "telegram", dead);
    for r in [&pending, &attempting, &failed] {
        store.record_obligation(r.clone()).await.unwrap();
    }
    store.mark_attempting(&attempting.id).await.unwrap();
    store.mark_attempting(&failed.id).await.unwrap();
    store.mark_failed(&failed.id, "boom").await.unwrap();

    let ledger = Ledger::new(store.clone());
    let claimed = ledger.sweep(&telegram()).await.unwrap();
    assert_eq!(claimed.len(), 3);
    for c in &claimed {
        let expect_marker = c.obligation.id != pending.id;
        assert_eq!(c.needs_marker, expect_marker, "{}", c.obligation.id);
        assert_eq!(c.text().starts_with(RECOVERY_MARKER), expect_marker);
        assert!(c.text().ends_with("the answer"));
        // The full address survives.
        assert_eq!(c.obligation.thread_id.as_deref(), Some("17"));
        assert!(c.obligation.reply_to.is_some());
        let stored = store.obligation(&c.obligation.id).await.unwrap().unwrap();
        assert_eq!(stored.owner, Some(owner::current()));
        assert_eq!(stored.attempts, 1);
    }
    // Claimed rows now belong to a live owner (us): a second sweep by the
    // same process takes nothing.
    assert!(ledger.sweep(&telegram()).await.unwrap().is_empty());
}

#[tokio::test]
async fn live_owners_rows_are_left_and_a_reused_pid_counts_as_dead() {
    let (_dir, store) = store();
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let live = Owner {
        pid: child.id(),
        started_at: owner::start_time(child.id()),
    };
    store
        .record_obligation(row("live", "telegram", live))
        .await
        .unwrap();
    // Same pid as a live process, but another start time: the pid was
    // reused, so the recorded owner is dead.
    let me = owner::current();
    let reused = Owner {
        pid: me.pid,
        started_at: me.started_at.map(|t| t + 1).or(Some(1)),
    };
    let reused_row = row("reused", "telegram", reused);
    store.record_obligation(reused_row.clone()).await.unwrap();

    let claimed = Ledger::new(store.clone()).sweep(&telegram()).await.unwrap();
    let ids: Vec<&str> = claimed.iter().map(|c| c.obligation.id.as_str()).collect();
    assert_eq!(ids, vec![reused_row.id.as_str()]);

    // Once the live owner dies, its row is taken over too.
    child.kill().unwrap();
    child.wait().unwrap();
    let claimed = Ledger::new(store.clone()).sweep(&telegram()).await.unwrap();
    assert_eq!(claimed.len(), 1);
}

#[tokio::test]
async fn over_budget_rows_are_abandoned_and_down_platforms_spend_nothing() {
    let (_dir, store) = store();
    let dead = dead_owner();
    // Claimed and failed MAX_ATTEMPTS times by successive dead gateways.
    let tired = row("tired", "discord", dead);
    store.record_obligation(tired.clone()).await.unwrap();
    let mut prev = dead;
    for i in 0..MAX_ATTEMPTS {
        let next = Owner {
            pid: 4_000_000 + i,
            started_at: Some(1),
        };
        assert!(
            store
                .claim_obligation(&tired.id, Some(prev), next)
                .await
                .unwrap()
        );
        prev = next;
    }
    let waiting = row("waiting", "discord", dead);
    store.record_obligation(waiting.clone()).await.unwrap();

    // Discord is not connected: the tired row is abandoned anyway (the
    // budget is checked first); the other is not touched at all.
    let claimed = Ledger::new(store.clone()).sweep(&telegram()).await.unwrap();
    assert!(claimed.is_empty());
    let t = store.obligation(&tired.id).await.unwrap().unwrap();
    assert_eq!(t.state, ObligationState::Abandoned);
    let w = store.obligation(&waiting.id).await.unwrap().unwrap();
    assert_eq!(w.state, ObligationState::Pending);
    assert_eq!(w.attempts, 0);
    assert_eq!(w.owner, Some(dead));
}

#[tokio::test]
async fn this_process_retries_its_own_failed_rows_but_not_its_rows_in_flight() {
    let (_dir, store) = store();
    let me = owner::current();
    let in_flight = row("flight", "telegram", me);
    let failed = row("failed", "telegram", me);
    store.record_obligation(in_flight.clone()).await.unwrap();
    store.record_obligation(failed.clone()).await.unwrap();
    store.mark_attempting(&in_flight.id).await.unwrap();
    store
        .mark_failed(&failed.id, "telegram was down")
        .await
        .unwrap();
    let claimed = Ledger::new(store.clone()).sweep(&telegram()).await.unwrap();
    let ids: Vec<&str> = claimed.iter().map(|c| c.obligation.id.as_str()).collect();
    assert_eq!(ids, vec![failed.id.as_str()]);
}

/// Every owner but the dead one is alive: two "gateways" in one process.
struct AllButDead(Owner);

impl Liveness for AllButDead {
    fn is_alive(&self, owner: &Owner) -> bool {
        *owner != self.0
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_sweepers_racing_claim_each_row_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let dead = dead_owner();
    let seed = SqliteStore::open(&path).unwrap();
    for i in 0..60 {
        seed.record_obligation(row(&i.to_string(), "telegram", dead))
            .await
            .unwrap();
    }
    // Two separate connections to one file, as two processes would have.
    let a = Ledger::with_owner(
        Arc::new(SqliteStore::open(&path).unwrap()),
        Owner {
            pid: 1_000_001,
            started_at: Some(1),
        },
        Arc::new(AllButDead(dead)),
    );
    let b = Ledger::with_owner(
        Arc::new(SqliteStore::open(&path).unwrap()),
        Owner {
            pid: 1_000_002,
            started_at: Some(2),
        },
        Arc::new(AllButDead(dead)),
    );
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let run = |ledger: Ledger, barrier: Arc<tokio::sync::Barrier>| async move {
        barrier.wait().await;
        ledger.sweep(&telegram()).await.unwrap()
    };
    let (ra, rb) = tokio::join!(
        tokio::spawn(run(a, barrier.clone())),
        tokio::spawn(run(b, barrier.clone()))
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let ids_a: HashSet<String> = ra.iter().map(|c| c.obligation.id.clone()).collect();
    let ids_b: HashSet<String> = rb.iter().map(|c| c.obligation.id.clone()).collect();
    assert!(ids_a.is_disjoint(&ids_b), "a row was claimed twice");
    assert_eq!(ids_a.len() + ids_b.len(), 60, "every row was claimed");
    for c in ra.iter().chain(rb.iter()) {
        let stored = seed.obligation(&c.obligation.id).await.unwrap().unwrap();
        assert_eq!(stored.attempts, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_sweeps_of_one_process_retry_each_of_its_failed_rows_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    // One owner for both sweeps: one process, two adapters reconnecting at
    // once. Its own failed rows are the ones it retries, and there the
    // owner a claim expects is the owner it writes.
    let me = Owner {
        pid: 1_000_003,
        started_at: Some(3),
    };
    let seed = SqliteStore::open(&path).unwrap();
    let mut ids = Vec::new();
    for i in 0..60 {
        let r = row(&format!("own{i}"), "telegram", me);
        seed.record_obligation(r.clone()).await.unwrap();
        seed.mark_failed(&r.id, "telegram was down").await.unwrap();
        ids.push(r.id);
    }
    let sweeper = || {
        Ledger::with_owner(
            Arc::new(SqliteStore::open(&path).unwrap()),
            me,
            Arc::new(AllButDead(dead_owner())),
        )
    };
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let run = |ledger: Ledger, barrier: Arc<tokio::sync::Barrier>| async move {
        barrier.wait().await;
        ledger.sweep(&telegram()).await.unwrap()
    };
    let (ra, rb) = tokio::join!(
        tokio::spawn(run(sweeper(), barrier.clone())),
        tokio::spawn(run(sweeper(), barrier.clone()))
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let ids_a: HashSet<String> = ra.iter().map(|c| c.obligation.id.clone()).collect();
    let ids_b: HashSet<String> = rb.iter().map(|c| c.obligation.id.clone()).collect();
    assert!(ids_a.is_disjoint(&ids_b), "a row was claimed twice");
    assert_eq!(ids_a.len() + ids_b.len(), 60, "every row was claimed");
    for id in &ids {
        let stored = seed.obligation(id).await.unwrap().unwrap();
        assert_eq!(stored.attempts, 1, "{id}");
        assert_eq!(stored.state, ObligationState::Attempting, "{id}");
    }
}

/// A send the platform refused for good is abandoned at once with its
/// reason, so no sweep spends attempts on it; other failures stay open
/// for the next sweep.
#[tokio::test]
async fn a_refused_send_is_abandoned_and_a_failed_one_stays_open() {
    let (_dir, store) = store();
    let me = owner::current();
    let refused = row("refused", "telegram", me);
    let failed = row("failed", "telegram", me);
    let sent = row("sent", "telegram", me);
    for r in [&refused, &failed, &sent] {
        store.record_obligation(r.clone()).await.unwrap();
    }
    let ledger = Ledger::new(store.clone());
    let outcomes = [
        (
            &refused,
            Err(SendError::Rejected("the user opted out".into())),
        ),
        (&failed, Err(SendError::Transient("502".into()))),
        (&sent, Ok(())),
    ];
    for (r, outcome) in &outcomes {
        ledger.settle(&r.id, outcome).await;
    }
    let state = |id: String| {
        let store = store.clone();
        async move { store.obligation(&id).await.unwrap().unwrap() }
    };
    let r = state(refused.id.clone()).await;
    assert_eq!(r.state, ObligationState::Abandoned);
    assert!(
        r.last_error.as_deref().unwrap_or("").contains("opted out"),
        "{r:?}"
    );
    assert_eq!(
        state(failed.id.clone()).await.state,
        ObligationState::Failed
    );
    assert_eq!(
        state(sent.id.clone()).await.state,
        ObligationState::Delivered
    );
    // Only the failed row is tried again.
    let claimed = ledger.sweep(&telegram()).await.unwrap();
    let ids: Vec<&str> = claimed.iter().map(|c| c.obligation.id.as_str()).collect();
    assert_eq!(ids, [failed.id.as_str()]);
}
