//! The ledger's sweep over a real SQLite file: which rows a gateway takes
//! over after a crash, which it leaves, which it abandons, and that two
//! gateways sweeping at once never both take a row.

use std::collections::HashSet;
use std::sync::Arc;

use talaria_gateway::SendError;
use talaria_gateway::ledger::{Ledger, MAX_ATTEMPTS, RECOVERY_MARKER, obligation_id};
use talaria_gateway::node::{Node, host_name};
use talaria_gateway::owner;
use talaria_store::{
    ClusterStore, GatewayStore, LedgerStore, NewObligation, NodeAnnouncement, NodeId,
    ObligationState, OwedClaim, SqliteStore,
};

/// A process that existed and is gone: spawned, then reaped.
fn dead_process() -> (u32, Option<u64>) {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    let started_at = owner::start_time(pid);
    child.wait().unwrap();
    (pid, started_at)
}

/// Announces a node for process `pid` on `host`, alive for a minute as far
/// as its lease goes.
async fn announce(
    store: &dyn ClusterStore,
    name: &str,
    host: &str,
    (pid, started_at): (u32, Option<u64>),
) -> NodeId {
    let id = NodeId::new(name).unwrap();
    let node = Node::with_announcement(NodeAnnouncement {
        id: id.clone(),
        host: host.to_owned(),
        pid,
        started_at,
        version: "test".to_owned(),
    });
    store.heartbeat(node.announcement(), 60.0).await.unwrap();
    id
}

/// This process as a live node with its own id.
async fn me(store: &dyn ClusterStore, name: &str) -> NodeId {
    let current = owner::current();
    announce(store, name, &host_name(), (current.pid, current.started_at)).await
}

fn store() -> (tempfile::TempDir, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("state.db")).unwrap());
    (dir, store)
}

/// A ledger that retries failed rows at once (the tests need not wait
/// out the pause a running gateway keeps).
fn ledger(store: &Arc<SqliteStore>, node: &NodeId) -> Ledger {
    let store: Arc<dyn GatewayStore> = store.clone();
    Ledger::new(store, node.clone()).retrying_failed_after(std::time::Duration::ZERO)
}

fn row(id_seed: &str, platform: &str, owner: &NodeId) -> NewObligation {
    NewObligation {
        id: obligation_id("agent:main:telegram:dm:42", id_seed, "the answer"),
        session_key: "agent:main:telegram:dm:42".into(),
        platform: platform.into(),
        chat_id: "42".into(),
        thread_id: Some("17".into()),
        reply_to: Some(id_seed.into()),
        content: "the answer".into(),
        owner: owner.clone(),
        settles: Vec::new(),
    }
}

fn telegram() -> HashSet<String> {
    ["telegram".to_owned()].into()
}

/// The rows of a crashed gateway on this host are taken over at once,
/// without waiting for its lease: its process is gone.
#[tokio::test]
async fn a_dead_local_nodes_rows_are_claimed_with_the_marker_only_when_a_send_may_have_happened() {
    let (_dir, store) = store();
    let dead = announce(store.as_ref(), "crashed", &host_name(), dead_process()).await;
    let pending = row("1", "telegram", &dead);
    let attempting = row("2", "telegram", &dead);
    let failed = row("3", "telegram", &dead);
    for r in [&pending, &attempting, &failed] {
        store.record_obligation(r.clone()).await.unwrap();
    }
    store
        .begin_attempt(&attempting.id, &dead, 600.0)
        .await
        .unwrap();
    let n = store
        .begin_attempt(&failed.id, &dead, 600.0)
        .await
        .unwrap()
        .unwrap();
    store.mark_failed(&failed.id, n, "boom").await.unwrap();

    let mine = me(store.as_ref(), "restarted").await;
    let ledger = ledger(&store, &mine);
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
        assert_eq!(stored.owner.as_ref(), Some(&mine));
        assert_eq!(stored.attempts, c.attempt());
    }
    // Claimed rows are in a live node's hands now: a second sweep takes
    // nothing.
    assert!(ledger.sweep(&telegram()).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_live_local_nodes_rows_are_left_and_a_reused_pid_counts_as_dead() {
    let (_dir, store) = store();
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let live_process = (child.id(), owner::start_time(child.id()));
    let live = announce(store.as_ref(), "live", &host_name(), live_process).await;
    let live_row = row("live", "telegram", &live);
    store.record_obligation(live_row.clone()).await.unwrap();
    // Same pid as a live process (this one), but another start time: the
    // pid was reused, so the node's process is gone.
    let current = owner::current();
    let reused_start = current.started_at.map(|t| t + 1).or(Some(1));
    let reused = announce(
        store.as_ref(),
        "reused",
        &host_name(),
        (current.pid, reused_start),
    )
    .await;
    let reused_row = row("reused", "telegram", &reused);
    store.record_obligation(reused_row.clone()).await.unwrap();

    let mine = me(store.as_ref(), "sweeper").await;
    let claimed = ledger(&store, &mine).sweep(&telegram()).await.unwrap();
    let ids: Vec<&str> = claimed.iter().map(|c| c.obligation.id.as_str()).collect();
    assert_eq!(ids, vec![reused_row.id.as_str()]);

    // Once the live process dies, its row is taken over too.
    child.kill().unwrap();
    child.wait().unwrap();
    let claimed = ledger(&store, &mine).sweep(&telegram()).await.unwrap();
    let ids: Vec<&str> = claimed.iter().map(|c| c.obligation.id.as_str()).collect();
    assert_eq!(ids, vec![live_row.id.as_str()]);
}

/// A node on another host cannot be checked by pid: it is alive until its
/// lease says otherwise.
#[tokio::test]
async fn a_node_elsewhere_is_trusted_until_its_lease_runs_out() {
    let (_dir, store) = store();
    // Its pid means nothing here (it is even a dead one on this host).
    let remote = announce(store.as_ref(), "remote", "another-host", dead_process()).await;
    store
        .record_obligation(row("remote", "telegram", &remote))
        .await
        .unwrap();
    let mine = me(store.as_ref(), "sweeper").await;
    assert!(
        ledger(&store, &mine)
            .sweep(&telegram())
            .await
            .unwrap()
            .is_empty()
    );
    // Its heartbeats stop; the lease lapses (declared here for speed).
    store.expire_node(&remote).await.unwrap();
    let claimed = ledger(&store, &mine).sweep(&telegram()).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert!(
        !claimed[0].needs_marker,
        "it was never handed to a platform"
    );
}

#[tokio::test]
async fn over_budget_rows_are_abandoned_and_down_platforms_spend_nothing() {
    let (_dir, store) = store();
    let gone = NodeId::new("never-announced").unwrap();
    // Claimed MAX_ATTEMPTS times by successive gateways that died too.
    let tired = row("tired", "discord", &gone);
    store.record_obligation(tired.clone()).await.unwrap();
    for i in 0..MAX_ATTEMPTS {
        let claimer = NodeId::new(format!("died-{i}")).unwrap();
        let batch = store
            .claim_owed(&OwedClaim {
                claimer,
                platforms: vec!["discord".to_owned()],
                limit: 10,
                // Each claim's attempt is presumed stuck at once.
                lease: -1.0,
                max_attempts: MAX_ATTEMPTS,
                stale_before: 0.0,
                retry_failed_after: 0.0,
                after: None,
            })
            .await
            .unwrap();
        assert_eq!(batch.claimed.len(), 1);
    }
    let waiting = row("waiting", "discord", &gone);
    store.record_obligation(waiting.clone()).await.unwrap();

    // Discord is not connected here: the tired row is abandoned anyway
    // (the budget is checked first); the other is not touched at all.
    let mine = me(store.as_ref(), "sweeper").await;
    let claimed = ledger(&store, &mine).sweep(&telegram()).await.unwrap();
    assert!(claimed.is_empty());
    let t = store.obligation(&tired.id).await.unwrap().unwrap();
    assert_eq!(t.state, ObligationState::Abandoned);
    let w = store.obligation(&waiting.id).await.unwrap().unwrap();
    assert_eq!(w.state, ObligationState::Pending);
    assert_eq!(w.attempts, 0);
    assert_eq!(w.owner, Some(gone));
}

#[tokio::test]
async fn a_node_retries_its_own_failed_rows_but_not_its_sends_in_flight() {
    let (_dir, store) = store();
    let mine = me(store.as_ref(), "me").await;
    let ledger = ledger(&store, &mine);
    let record = |seed: &'static str| {
        let ledger = ledger.clone();
        async move {
            ledger
                .record(
                    "agent:main:telegram:dm:42",
                    seed,
                    "telegram",
                    "42",
                    None,
                    None,
                    seed,
                    &[],
                )
                .await
                .unwrap()
        }
    };
    let _in_flight = record("flight").await;
    let failed = record("failed").await;
    ledger
        .settle(
            &failed,
            &Err(SendError::Transient("telegram was down".into())),
        )
        .await;
    // A gateway's ledger lets a failure rest before trying again.
    let patient = Ledger::new(store.clone() as Arc<dyn GatewayStore>, mine.clone());
    assert!(patient.sweep(&telegram()).await.unwrap().is_empty());
    let claimed = ledger.sweep(&telegram()).await.unwrap();
    let ids: Vec<&str> = claimed.iter().map(|c| c.obligation.id.as_str()).collect();
    assert_eq!(ids, vec![failed.id.as_str()]);
    assert_eq!(claimed[0].attempt(), failed.number + 1);
    assert!(claimed[0].needs_marker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_sweepers_racing_claim_each_row_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let seed = Arc::new(SqliteStore::open(&path).unwrap());
    let gone = NodeId::new("never-announced").unwrap();
    for i in 0..60 {
        seed.record_obligation(row(&i.to_string(), "telegram", &gone))
            .await
            .unwrap();
    }
    // Two separate connections to one file, as two processes would have.
    let a_store = Arc::new(SqliteStore::open(&path).unwrap());
    let b_store = Arc::new(SqliteStore::open(&path).unwrap());
    let a = ledger(&a_store, &me(a_store.as_ref(), "node-a").await);
    let b = ledger(&b_store, &me(b_store.as_ref(), "node-b").await);
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
async fn two_sweeps_of_one_node_retry_each_of_its_failed_rows_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    // One node for both sweeps: two adapters reconnecting at once.
    let seed = Arc::new(SqliteStore::open(&path).unwrap());
    let mine = me(seed.as_ref(), "me").await;
    let mut ids = Vec::new();
    for i in 0..60 {
        let r = row(&format!("own{i}"), "telegram", &mine);
        seed.record_obligation(r.clone()).await.unwrap();
        let n = seed
            .begin_attempt(&r.id, &mine, 600.0)
            .await
            .unwrap()
            .unwrap();
        seed.mark_failed(&r.id, n, "telegram was down")
            .await
            .unwrap();
        ids.push(r.id);
    }
    let sweeper = || ledger(&Arc::new(SqliteStore::open(&path).unwrap()), &mine);
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
        assert_eq!(stored.attempts, 2, "{id}");
        assert_eq!(stored.state, ObligationState::Attempting, "{id}");
    }
}

/// A send the platform refused for good is abandoned at once with its
/// reason, so no sweep spends attempts on it; other failures stay open
/// for the next sweep.
#[tokio::test]
async fn a_refused_send_is_abandoned_and_a_failed_one_stays_open() {
    let (_dir, store) = store();
    let mine = me(store.as_ref(), "me").await;
    let ledger = ledger(&store, &mine);
    let mut attempts = Vec::new();
    for seed in ["refused", "failed", "sent"] {
        let a = ledger
            .record(
                "agent:main:telegram:dm:42",
                seed,
                "telegram",
                "42",
                None,
                None,
                seed,
                &[],
            )
            .await
            .unwrap();
        attempts.push(a);
    }
    let outcomes = [
        Err(SendError::Rejected("the user opted out".into())),
        Err(SendError::Transient("502".into())),
        Ok(()),
    ];
    for (a, outcome) in attempts.iter().zip(&outcomes) {
        ledger.settle(a, outcome).await;
    }
    let state = |id: String| {
        let store = store.clone();
        async move { store.obligation(&id).await.unwrap().unwrap() }
    };
    let r = state(attempts[0].id.clone()).await;
    assert_eq!(r.state, ObligationState::Abandoned);
    assert!(
        r.last_error.as_deref().unwrap_or("").contains("opted out"),
        "{r:?}"
    );
    assert_eq!(
        state(attempts[1].id.clone()).await.state,
        ObligationState::Failed
    );
    assert_eq!(
        state(attempts[2].id.clone()).await.state,
        ObligationState::Delivered
    );
    // Only the failed row is tried again.
    let claimed = ledger.sweep(&telegram()).await.unwrap();
    let ids: Vec<&str> = claimed.iter().map(|c| c.obligation.id.as_str()).collect();
    assert_eq!(ids, [attempts[1].id.as_str()]);
}

/// A send that ends after another node took the row over reports into the
/// void: the row stays with the node that has it now.
#[tokio::test]
async fn a_late_report_after_a_takeover_changes_nothing() {
    let (_dir, store) = store();
    let slow = me(store.as_ref(), "slow").await;
    let slow_ledger = ledger(&store, &slow);
    let attempt = slow_ledger
        .record("k", "m1", "telegram", "42", None, None, "hello", &[])
        .await
        .unwrap();
    // The slow node's lease runs out mid-send; another node takes over.
    store.expire_node(&slow).await.unwrap();
    let other = me(store.as_ref(), "other").await;
    let claimed = ledger(&store, &other).sweep(&telegram()).await.unwrap();
    assert_eq!(claimed.len(), 1);
    slow_ledger.settle(&attempt, &Ok(())).await;
    let stored = store.obligation(&attempt.id).await.unwrap().unwrap();
    assert_eq!(stored.state, ObligationState::Attempting);
    assert_eq!(stored.owner, Some(other));
}
