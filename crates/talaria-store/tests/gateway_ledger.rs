//! The delivery ledger, on both backends: every transition, fenced
//! attempts, what a sweep may claim, and racing sweepers.

use crate::common;

use std::collections::{BTreeMap, HashMap};

use common::{Backend, Fixture};
use talaria_store::{
    ClusterStore, LedgerStore, NewObligation, NodeId, ObligationState, OwedBatch, OwedClaim,
};

fn id(name: &str) -> NodeId {
    common::node_id(name)
}

fn obligation(row: &str, owner: &NodeId) -> NewObligation {
    NewObligation {
        id: row.to_string(),
        session_key: "telegram:dm:42".to_string(),
        platform: "telegram".to_string(),
        chat_id: "42".to_string(),
        thread_id: Some("17".to_string()),
        reply_to: Some("1001".to_string()),
        content: format!("the answer to {row}"),
        owner: owner.clone(),
        settles: Vec::new(),
    }
}

/// Registers `name` as a live node (for a minute).
async fn live<S: ClusterStore>(f: &Fixture<S>, name: &str) -> NodeId {
    common::live_node(&**f, name).await
}

/// Registers `name` and then declares it dead.
async fn dead<S: ClusterStore>(f: &Fixture<S>, name: &str) -> NodeId {
    let node = live(f, name).await;
    assert!(f.expire_node(&node).await.unwrap());
    node
}

fn claim_for(claimer: &NodeId, platforms: &[&str]) -> OwedClaim {
    OwedClaim {
        claimer: claimer.clone(),
        platforms: platforms.iter().map(|p| p.to_string()).collect(),
        limit: 1000,
        lease: 120.0,
        max_attempts: 3,
        stale_before: 0.0,
        retry_failed_after: 0.0,
        after: None,
    }
}

fn claimed_ids(batch: &OwedBatch) -> Vec<String> {
    batch
        .claimed
        .iter()
        .map(|c| c.obligation.id.clone())
        .collect()
}

/// Moves a row's times back by `secs`, as if recorded that much earlier.
async fn age<S>(f: &Fixture<S>, row: &str, secs: f64) {
    f.execute(&format!(
        "UPDATE delivery_obligations SET created_at = created_at - {secs}, \
         updated_at = updated_at - {secs} WHERE id = '{row}'"
    ))
    .await;
}

async fn record_stores_a_pending_row_with_the_full_address<S: Backend + LedgerStore>(
    f: Fixture<S>,
) {
    let me = id("node-a");
    f.record_obligation(obligation("a", &me)).await.unwrap();
    let row = f.obligation("a").await.unwrap().unwrap();
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
    assert_eq!(row.lease_until, None);
    assert_eq!(row.last_error, None);
    assert_eq!(row.parts_sent, 0);
    assert_eq!(f.obligation("missing").await.unwrap(), None);
}

async fn every_transition_is_recorded<S: Backend + LedgerStore + ClusterStore>(f: Fixture<S>) {
    let me = live(&f, "node-a").await;
    f.record_obligation(obligation("a", &me)).await.unwrap();
    age(&f, "a", 10.0).await;
    let recorded = f.obligation("a").await.unwrap().unwrap();

    let attempt = f.begin_attempt("a", &me, 120.0).await.unwrap();
    assert_eq!(attempt, Some(1));
    let row = f.obligation("a").await.unwrap().unwrap();
    assert_eq!(row.state, ObligationState::Attempting);
    assert_eq!(row.attempts, 1);
    assert!(row.updated_at > recorded.updated_at);
    assert_eq!(row.created_at, recorded.created_at);
    let lease = row.lease_until.unwrap();
    assert!(
        lease >= row.updated_at + 119.0,
        "{lease} vs {}",
        row.updated_at
    );

    assert!(f.mark_failed("a", 1, "connection reset").await.unwrap());
    let row = f.obligation("a").await.unwrap().unwrap();
    assert_eq!(row.state, ObligationState::Failed);
    assert_eq!(row.last_error.as_deref(), Some("connection reset"));
    assert_eq!(row.lease_until, None);

    // The owner's own failed row comes back in its sweep, as attempt 2.
    let batch = f.claim_owed(&claim_for(&me, &["telegram"])).await.unwrap();
    assert_eq!(claimed_ids(&batch), ["a"]);
    assert_eq!(batch.claimed[0].previous, ObligationState::Failed);
    assert_eq!(batch.claimed[0].obligation.attempts, 2);
    assert!(f.mark_delivered("a", 2).await.unwrap());
    let row = f.obligation("a").await.unwrap().unwrap();
    assert_eq!(row.state, ObligationState::Delivered);
    // The error of the failed attempt stays for the post-mortem.
    assert_eq!(row.last_error.as_deref(), Some("connection reset"));

    f.record_obligation(obligation("b", &me)).await.unwrap();
    assert!(f.abandon_obligation("b", None, "too old").await.unwrap());
    let row = f.obligation("b").await.unwrap().unwrap();
    assert_eq!(row.state, ObligationState::Abandoned);
    assert_eq!(row.last_error.as_deref(), Some("too old"));
    // Closed rows stay closed.
    assert!(!f.abandon_obligation("b", None, "again").await.unwrap());
}

async fn failure_text_is_cut_to_500_chars_on_a_char_boundary<S: Backend + LedgerStore>(
    f: Fixture<S>,
) {
    let me = id("node-a");
    f.record_obligation(obligation("a", &me)).await.unwrap();
    let attempt = f.begin_attempt("a", &me, 60.0).await.unwrap().unwrap();
    // Two-byte chars: a byte-based cut at 500 would split one.
    let error = "é".repeat(300) + &"x".repeat(300);
    assert!(f.mark_failed("a", attempt, &error).await.unwrap());
    let kept = f
        .obligation("a")
        .await
        .unwrap()
        .unwrap()
        .last_error
        .unwrap();
    assert_eq!(kept.chars().count(), 500);
    assert_eq!(kept, "é".repeat(300) + &"x".repeat(200));
}

async fn a_late_report_from_a_lost_attempt_changes_nothing<
    S: Backend + LedgerStore + ClusterStore,
>(
    f: Fixture<S>,
) {
    let a = live(&f, "node-a").await;
    let b = live(&f, "node-b").await;
    f.record_obligation(obligation("r", &a)).await.unwrap();
    let first = f.begin_attempt("r", &a, 120.0).await.unwrap().unwrap();
    // A stalls; its node lease runs out and B takes the row over.
    f.expire_node(&a).await.unwrap();
    let batch = f.claim_owed(&claim_for(&b, &["telegram"])).await.unwrap();
    assert_eq!(claimed_ids(&batch), ["r"]);
    let second = batch.claimed[0].obligation.attempts;
    assert_eq!((first, second), (1, 2));
    assert_eq!(batch.claimed[0].previous, ObligationState::Attempting);

    // A wakes up and reports: fenced out, whatever it says.
    assert!(!f.mark_delivered("r", first).await.unwrap());
    assert!(!f.mark_failed("r", first, "late").await.unwrap());
    assert!(
        !f.abandon_obligation("r", Some(first), "late")
            .await
            .unwrap()
    );
    let row = f.obligation("r").await.unwrap().unwrap();
    assert_eq!(row.state, ObligationState::Attempting);
    assert_eq!(row.owner, Some(b));
    assert_eq!(row.last_error, None);

    assert!(f.mark_delivered("r", second).await.unwrap());
    assert_eq!(
        f.obligation("r").await.unwrap().unwrap().state,
        ObligationState::Delivered
    );
    // Settling twice, or an unknown row, changes nothing and is no error.
    assert!(!f.mark_delivered("r", second).await.unwrap());
    assert!(!f.mark_delivered("ghost", 1).await.unwrap());
    assert!(!f.mark_failed("ghost", 1, "boom").await.unwrap());
    assert!(!f.abandon_obligation("ghost", None, "why").await.unwrap());
    assert_eq!(f.obligation("ghost").await.unwrap(), None);
}

async fn only_the_owner_begins_a_pending_row<S: Backend + LedgerStore>(f: Fixture<S>) {
    let me = id("node-a");
    let other = id("node-b");
    f.record_obligation(obligation("a", &me)).await.unwrap();
    assert_eq!(f.begin_attempt("a", &other, 60.0).await.unwrap(), None);
    assert_eq!(f.begin_attempt("a", &me, 60.0).await.unwrap(), Some(1));
    // Already under way: a second start is refused.
    assert_eq!(f.begin_attempt("a", &me, 60.0).await.unwrap(), None);
    assert!(f.mark_delivered("a", 1).await.unwrap());
    assert_eq!(f.begin_attempt("a", &me, 60.0).await.unwrap(), None);
    assert_eq!(f.begin_attempt("ghost", &me, 60.0).await.unwrap(), None);
}

async fn re_recording_starts_over_and_keeps_the_attempt_count<
    S: Backend + LedgerStore + ClusterStore,
>(
    f: Fixture<S>,
) {
    let first = live(&f, "node-a").await;
    f.record_obligation(obligation("a", &first)).await.unwrap();
    let attempt = f.begin_attempt("a", &first, 60.0).await.unwrap().unwrap();
    assert!(f.mark_parts_sent("a", attempt, 2).await.unwrap());
    assert!(f.mark_failed("a", attempt, "boom").await.unwrap());
    age(&f, "a", 10.0).await;
    let before = f.obligation("a").await.unwrap().unwrap();
    assert_eq!(before.parts_sent, 2);

    let again = id("node-c");
    f.record_obligation(obligation("a", &again)).await.unwrap();
    let row = f.obligation("a").await.unwrap().unwrap();
    assert_eq!(row.state, ObligationState::Pending);
    assert_eq!(row.owner, Some(again.clone()));
    assert_eq!(row.last_error, None);
    // The reply is sent again from its first part.
    assert_eq!(row.parts_sent, 0);
    assert!(row.created_at > before.created_at);
    // Kept, so the next attempt's number was never used before.
    assert_eq!(row.attempts, 1);
    assert_eq!(f.begin_attempt("a", &again, 60.0).await.unwrap(), Some(2));
    assert_eq!(f.open_obligations(0).await.unwrap().len(), 1);
}

/// Parts confirmed by one attempt survive its node's death: the sweeper
/// that takes the row over is told how many to skip, the dead node's
/// late reports change nothing, and the count never goes down.
async fn parts_sent_are_fenced_monotonic_and_seen_by_the_next_claim<
    S: Backend + LedgerStore + ClusterStore,
>(
    f: Fixture<S>,
) {
    let a = live(&f, "node-a").await;
    let b = live(&f, "node-b").await;
    f.record_obligation(obligation("r", &a)).await.unwrap();
    assert_eq!(f.obligation("r").await.unwrap().unwrap().parts_sent, 0);
    // Not attempting yet: nothing to record progress for.
    assert!(!f.mark_parts_sent("r", 0, 1).await.unwrap());
    let first = f.begin_attempt("r", &a, 120.0).await.unwrap().unwrap();
    let before = f.obligation("r").await.unwrap().unwrap();
    assert!(f.mark_parts_sent("r", first, 2).await.unwrap());
    let row = f.obligation("r").await.unwrap().unwrap();
    assert_eq!(row.parts_sent, 2);
    // Progress is not a change of state: the row is otherwise as it was.
    assert_eq!(
        (row.state, row.attempts, row.updated_at, row.lease_until),
        (
            before.state,
            before.attempts,
            before.updated_at,
            before.lease_until
        )
    );
    assert_eq!(f.open_obligations(0).await.unwrap()[0].parts_sent, 2);

    // A dies mid-reply; B's claim carries what A confirmed.
    f.expire_node(&a).await.unwrap();
    let batch = f.claim_owed(&claim_for(&b, &["telegram"])).await.unwrap();
    assert_eq!(claimed_ids(&batch), ["r"]);
    let second = batch.claimed[0].obligation.attempts;
    assert_eq!(second, first + 1);
    assert_eq!(batch.claimed[0].obligation.parts_sent, 2);

    // A's late report, higher or not, is fenced out.
    assert!(!f.mark_parts_sent("r", first, 5).await.unwrap());
    assert_eq!(f.obligation("r").await.unwrap().unwrap().parts_sent, 2);

    // B's progress counts; a smaller (late, reordered) number does not
    // lower it, though the attempt is the current one.
    assert!(f.mark_parts_sent("r", second, 3).await.unwrap());
    assert!(f.mark_parts_sent("r", second, 1).await.unwrap());
    assert_eq!(f.obligation("r").await.unwrap().unwrap().parts_sent, 3);

    // Once settled, or for a row that does not exist: nothing, no error.
    assert!(f.mark_delivered("r", second).await.unwrap());
    assert!(!f.mark_parts_sent("r", second, 4).await.unwrap());
    let row = f.obligation("r").await.unwrap().unwrap();
    assert_eq!((row.state, row.parts_sent), (ObligationState::Delivered, 3));
    assert!(!f.mark_parts_sent("ghost", 1, 1).await.unwrap());
    assert_eq!(f.obligation("ghost").await.unwrap(), None);
}

/// A failed attempt's confirmed parts stay for the retry, which the
/// owner's own sweep claims; the largest count a sender can report is
/// kept as it is.
async fn parts_sent_survive_a_failure_into_the_retry<S: Backend + LedgerStore + ClusterStore>(
    f: Fixture<S>,
) {
    let me = live(&f, "node-a").await;
    f.record_obligation(obligation("r", &me)).await.unwrap();
    let first = f.begin_attempt("r", &me, 120.0).await.unwrap().unwrap();
    assert!(f.mark_parts_sent("r", first, 1).await.unwrap());
    assert!(f.mark_failed("r", first, "HTTP 502").await.unwrap());
    // Failed is not attempting: the failed attempt cannot add more.
    assert!(!f.mark_parts_sent("r", first, 2).await.unwrap());
    let batch = f.claim_owed(&claim_for(&me, &["telegram"])).await.unwrap();
    assert_eq!(claimed_ids(&batch), ["r"]);
    assert_eq!(batch.claimed[0].previous, ObligationState::Failed);
    let retry = &batch.claimed[0].obligation;
    assert_eq!(retry.parts_sent, 1);
    assert!(
        f.mark_parts_sent("r", retry.attempts, u32::MAX)
            .await
            .unwrap()
    );
    let stored = f.obligation("r").await.unwrap().unwrap().parts_sent;
    // The PostgreSQL column is an `integer`: a count past it clamps.
    assert!(stored >= i32::MAX as u32, "{stored}");
}

async fn a_sweep_claims_only_what_is_owed_to_it<S: Backend + LedgerStore + ClusterStore>(
    f: Fixture<S>,
) {
    let me = live(&f, "node-me").await;
    let alive = live(&f, "node-alive").await;
    let gone = dead(&f, "node-gone").await;
    let never = id("node-never-registered");

    // A live node's pending, attempting (within its lease) and failed rows
    // are its own business.
    f.record_obligation(obligation("live-pending", &alive))
        .await
        .unwrap();
    f.record_obligation(obligation("live-attempting", &alive))
        .await
        .unwrap();
    f.begin_attempt("live-attempting", &alive, 600.0)
        .await
        .unwrap();
    f.record_obligation(obligation("live-failed", &alive))
        .await
        .unwrap();
    let n = f
        .begin_attempt("live-failed", &alive, 600.0)
        .await
        .unwrap()
        .unwrap();
    f.mark_failed("live-failed", n, "down").await.unwrap();
    // An attempt past its lease is presumed stuck, owner alive or not.
    f.record_obligation(obligation("live-stuck", &alive))
        .await
        .unwrap();
    f.begin_attempt("live-stuck", &alive, 600.0).await.unwrap();
    f.execute(
        "UPDATE delivery_obligations SET lease_until = lease_until - 1200 WHERE id = 'live-stuck'",
    )
    .await;
    // A dead node's rows and an unknown node's rows are orphans.
    f.record_obligation(obligation("dead-pending", &gone))
        .await
        .unwrap();
    f.record_obligation(obligation("unknown-pending", &never))
        .await
        .unwrap();
    // My own pending row is about to be sent by me; my failed row is
    // mine to retry.
    f.record_obligation(obligation("my-pending", &me))
        .await
        .unwrap();
    f.record_obligation(obligation("my-failed", &me))
        .await
        .unwrap();
    let n = f
        .begin_attempt("my-failed", &me, 60.0)
        .await
        .unwrap()
        .unwrap();
    f.mark_failed("my-failed", n, "down").await.unwrap();

    let batch = f.claim_owed(&claim_for(&me, &["telegram"])).await.unwrap();
    let mut got = claimed_ids(&batch);
    got.sort();
    assert_eq!(
        got,
        ["dead-pending", "live-stuck", "my-failed", "unknown-pending"]
    );
    assert!(batch.abandoned.is_empty());
    for c in &batch.claimed {
        assert_eq!(c.obligation.state, ObligationState::Attempting);
        assert_eq!(c.obligation.owner, Some(me.clone()));
        assert!(c.obligation.lease_until.is_some());
        let stored = f.obligation(&c.obligation.id).await.unwrap().unwrap();
        assert_eq!(stored, c.obligation, "the claim returns the row as stored");
    }
    let previous: HashMap<_, _> = batch
        .claimed
        .iter()
        .map(|c| (c.obligation.id.as_str(), c.previous))
        .collect();
    assert_eq!(previous["dead-pending"], ObligationState::Pending);
    assert_eq!(previous["live-stuck"], ObligationState::Attempting);
    assert_eq!(previous["my-failed"], ObligationState::Failed);

    // Nothing is claimed twice: a second sweep right after finds nothing.
    let again = f.claim_owed(&claim_for(&me, &["telegram"])).await.unwrap();
    assert!(again.claimed.is_empty() && again.abandoned.is_empty());
    for (row, owner, state) in [
        ("live-pending", &alive, ObligationState::Pending),
        ("live-attempting", &alive, ObligationState::Attempting),
        ("live-failed", &alive, ObligationState::Failed),
        ("my-pending", &me, ObligationState::Pending),
    ] {
        let stored = f.obligation(row).await.unwrap().unwrap();
        assert_eq!(
            (stored.owner.as_ref(), stored.state),
            (Some(owner), state),
            "{row}"
        );
    }
}

async fn a_node_never_claims_its_own_pending_row<S: Backend + LedgerStore + ClusterStore>(
    f: Fixture<S>,
) {
    // Not even when its own node row is missing (its first heartbeat
    // failed): it is about to send that row itself.
    let me = id("node-unregistered");
    f.record_obligation(obligation("mine", &me)).await.unwrap();
    let batch = f.claim_owed(&claim_for(&me, &["telegram"])).await.unwrap();
    assert!(batch.claimed.is_empty());
    // Anyone else may: to them, an unregistered owner is a dead one.
    let other = live(&f, "node-other").await;
    let batch = f
        .claim_owed(&claim_for(&other, &["telegram"]))
        .await
        .unwrap();
    assert_eq!(claimed_ids(&batch), ["mine"]);
}

async fn a_sweep_keeps_to_its_platforms_its_limit_and_age_order<
    S: Backend + LedgerStore + ClusterStore,
>(
    f: Fixture<S>,
) {
    let me = live(&f, "node-me").await;
    let gone = dead(&f, "node-gone").await;
    for (n, row) in ["t5", "t4", "t3", "t2", "t1"].into_iter().enumerate() {
        f.record_obligation(obligation(row, &gone)).await.unwrap();
        age(&f, row, 10.0 * (n + 1) as f64).await;
    }
    let mut discord = obligation("d1", &gone);
    discord.platform = "discord".to_owned();
    f.record_obligation(discord).await.unwrap();
    age(&f, "d1", 100.0).await;

    let mut claim = claim_for(&me, &["telegram"]);
    claim.limit = 2;
    let batch = f.claim_owed(&claim).await.unwrap();
    assert_eq!(claimed_ids(&batch), ["t1", "t2"]);
    let batch = f.claim_owed(&claim).await.unwrap();
    assert_eq!(claimed_ids(&batch), ["t3", "t4"]);
    let batch = f.claim_owed(&claim).await.unwrap();
    assert_eq!(claimed_ids(&batch), ["t5"]);
    // The discord row waits, untouched, for a node that can send it.
    let d1 = f.obligation("d1").await.unwrap().unwrap();
    assert_eq!((d1.state, d1.attempts), (ObligationState::Pending, 0));
    let batch = f.claim_owed(&claim_for(&me, &["discord"])).await.unwrap();
    assert_eq!(claimed_ids(&batch), ["d1"]);
}

async fn rows_over_budget_are_abandoned_whatever_their_platform<
    S: Backend + LedgerStore + ClusterStore,
>(
    f: Fixture<S>,
) {
    let me = live(&f, "node-me").await;
    let gone = dead(&f, "node-gone").await;
    let mut spent = obligation("spent", &gone);
    spent.platform = "discord".to_owned();
    f.record_obligation(spent).await.unwrap();
    f.execute("UPDATE delivery_obligations SET attempts = 3 WHERE id = 'spent'")
        .await;
    f.record_obligation(obligation("old", &gone)).await.unwrap();
    age(&f, "old", 2.0 * 86_400.0).await;
    f.record_obligation(obligation("fresh", &gone))
        .await
        .unwrap();

    let mut claim = claim_for(&me, &["telegram"]);
    claim.stale_before = f.clock().await.unwrap() - 86_400.0;
    let batch = f.claim_owed(&claim).await.unwrap();
    assert_eq!(claimed_ids(&batch), ["fresh"]);
    let mut gave_up: Vec<_> = batch
        .abandoned
        .iter()
        .map(|o| (o.id.as_str(), o.state, o.last_error.clone().unwrap()))
        .collect();
    gave_up.sort();
    assert_eq!(gave_up.len(), 2);
    assert_eq!(gave_up[0].0, "old");
    assert!(gave_up[0].2.contains("too old"), "{}", gave_up[0].2);
    assert_eq!(gave_up[1].0, "spent");
    assert!(
        gave_up[1].2.contains("maximum number of attempts"),
        "{}",
        gave_up[1].2
    );
    for (row, state, _) in &gave_up {
        assert_eq!(*state, ObligationState::Abandoned);
        assert_eq!(
            f.obligation(row).await.unwrap().unwrap().state,
            ObligationState::Abandoned
        );
    }
    // The spent row kept its owner and count, for the post-mortem.
    let spent = f.obligation("spent").await.unwrap().unwrap();
    assert_eq!((spent.owner, spent.attempts), (Some(gone), 3));
}

async fn delivered_and_abandoned_rows_are_never_claimed<S: Backend + LedgerStore + ClusterStore>(
    f: Fixture<S>,
) {
    let gone = live(&f, "node-gone").await;
    for row in ["d", "x"] {
        f.record_obligation(obligation(row, &gone)).await.unwrap();
    }
    let n = f.begin_attempt("d", &gone, 60.0).await.unwrap().unwrap();
    f.mark_delivered("d", n).await.unwrap();
    f.abandon_obligation("x", None, "gave up").await.unwrap();
    f.expire_node(&gone).await.unwrap();
    let me = live(&f, "node-me").await;
    let batch = f.claim_owed(&claim_for(&me, &["telegram"])).await.unwrap();
    assert!(batch.claimed.is_empty() && batch.abandoned.is_empty());
    assert_eq!(
        f.obligation("x")
            .await
            .unwrap()
            .unwrap()
            .last_error
            .as_deref(),
        Some("gave up")
    );
}

async fn open_obligations_are_the_owed_ones_oldest_first<S: Backend + LedgerStore>(f: Fixture<S>) {
    let me = id("node-a");
    // Recorded newest first and aged so that "1" is the oldest: creation
    // order, not insertion order, decides.
    for (n, row) in ["5", "4", "3", "2", "1"].into_iter().enumerate() {
        f.record_obligation(obligation(row, &me)).await.unwrap();
        age(&f, row, 10.0 * (n + 1) as f64).await;
    }
    f.begin_attempt("2", &me, 60.0).await.unwrap();
    let n = f.begin_attempt("3", &me, 60.0).await.unwrap().unwrap();
    f.mark_failed("3", n, "boom").await.unwrap();
    let n = f.begin_attempt("4", &me, 60.0).await.unwrap().unwrap();
    f.mark_delivered("4", n).await.unwrap();
    f.abandon_obligation("5", None, "old").await.unwrap();
    // Touching an older row does not move it behind newer ones.
    f.begin_attempt("1", &me, 60.0).await.unwrap();
    let open: Vec<String> = f
        .open_obligations(0)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.id)
        .collect();
    assert_eq!(open, ["1", "2", "3"]);
    let first_two: Vec<String> = f
        .open_obligations(2)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.id)
        .collect();
    assert_eq!(first_two, ["1", "2"]);
}

async fn prune_deletes_only_old_closed_rows<S: Backend + LedgerStore>(f: Fixture<S>) {
    let me = id("node-a");
    for row in ["old_done", "old_gone", "old_open", "old_failed", "new_done"] {
        f.record_obligation(obligation(row, &me)).await.unwrap();
    }
    for row in ["old_done", "new_done"] {
        let n = f.begin_attempt(row, &me, 60.0).await.unwrap().unwrap();
        f.mark_delivered(row, n).await.unwrap();
    }
    f.abandon_obligation("old_gone", None, "x").await.unwrap();
    let n = f
        .begin_attempt("old_failed", &me, 60.0)
        .await
        .unwrap()
        .unwrap();
    f.mark_failed("old_failed", n, "x").await.unwrap();
    for row in ["old_done", "old_gone", "old_open", "old_failed"] {
        f.execute(&format!(
            "UPDATE delivery_obligations SET updated_at = updated_at - 864000 WHERE id = '{row}'"
        ))
        .await;
    }
    let cutoff = f.obligation("new_done").await.unwrap().unwrap().updated_at - 86_400.0;
    assert_eq!(f.prune_obligations(cutoff).await.unwrap(), 2);
    assert_eq!(f.obligation("old_done").await.unwrap(), None);
    assert_eq!(f.obligation("old_gone").await.unwrap(), None);
    for row in ["old_open", "old_failed", "new_done"] {
        assert!(f.obligation(row).await.unwrap().is_some(), "{row}");
    }
    assert_eq!(f.prune_obligations(cutoff).await.unwrap(), 0);
}

async fn counts_group_rows_by_state<S: Backend + LedgerStore>(f: Fixture<S>) {
    let me = id("node-a");
    for row in ["a", "b", "c", "d", "e", "f"] {
        f.record_obligation(obligation(row, &me)).await.unwrap();
    }
    for row in ["b", "c", "d", "e"] {
        f.begin_attempt(row, &me, 60.0).await.unwrap();
    }
    f.mark_delivered("c", 1).await.unwrap();
    f.mark_delivered("d", 1).await.unwrap();
    f.mark_failed("e", 1, "x").await.unwrap();
    f.abandon_obligation("f", None, "x").await.unwrap();
    let counts = f.obligation_counts().await.unwrap();
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

/// Three sweepers, each on its own connection, claim 120 orphaned rows in
/// batches of 7. A barrier releases all three into every claim at the same
/// instant, so each claim really contends with the other two (on
/// PostgreSQL, for the same row locks). Every row goes to exactly one
/// sweeper, once; and the race is shown to have happened: more than one
/// sweeper won rows (run one after another, the first would take them all).
async fn racing_sweepers_claim_each_row_exactly_once<S: Backend + LedgerStore + ClusterStore>(
    f: Fixture<S>,
) {
    const ROWS: usize = 120;
    const SWEEPERS: usize = 3;
    const LIMIT: usize = 7;
    // Enough claims for one sweeper to take every row alone, and one more
    // that must come back empty.
    const CLAIMS: usize = ROWS.div_ceil(LIMIT) + 1;
    let gone = dead(&f, "node-gone").await;
    for i in 0..ROWS {
        f.record_obligation(obligation(&format!("row{i:03}"), &gone))
            .await
            .unwrap();
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(SWEEPERS));
    let mut sweepers = Vec::new();
    for n in 0..SWEEPERS {
        let store = f.reopen().await;
        let me = live(&f, &format!("sweeper-{n}")).await;
        let barrier = barrier.clone();
        sweepers.push(tokio::spawn(async move {
            let mut claim = claim_for(&me, &["telegram"]);
            claim.limit = LIMIT;
            let mut won = Vec::new();
            for _ in 0..CLAIMS {
                barrier.wait().await;
                let batch = store.claim_owed(&claim).await.unwrap();
                won.extend(batch.claimed.into_iter().map(|c| c.obligation.id));
            }
            (me, won)
        }));
    }
    let mut winners: HashMap<String, NodeId> = HashMap::new();
    let mut won_by: BTreeMap<NodeId, usize> = BTreeMap::new();
    for sweeper in sweepers {
        // A sweeper that failed leaves the others at the barrier: give up
        // rather than hang.
        let (me, won) = tokio::time::timeout(std::time::Duration::from_secs(120), sweeper)
            .await
            .expect("a sweeper stopped (see its panic above)")
            .unwrap();
        *won_by.entry(me.clone()).or_default() += won.len();
        for row in won {
            assert!(
                winners.insert(row.clone(), me.clone()).is_none(),
                "{row} was claimed twice"
            );
        }
    }
    assert_eq!(winners.len(), ROWS, "every row was claimed");
    assert!(
        won_by.values().filter(|&&n| n > 0).count() > 1,
        "the claims did not race: one sweeper won every row ({won_by:?})"
    );
    for (row, me) in &winners {
        let stored = f.obligation(row).await.unwrap().unwrap();
        assert_eq!(stored.owner.as_ref(), Some(me), "{row}");
        assert_eq!(stored.attempts, 1, "{row}");
        assert_eq!(stored.state, ObligationState::Attempting, "{row}");
    }
}

/// A sweep of several calls hands each call the last row of the one
/// before, and each call starts after it. The leases here end at once, so
/// every row claimed is claimable again: only the cursor keeps a call from
/// taking the first rows over and over.
async fn claims_page_through_the_rows_after_the_cursor<S: Backend + LedgerStore + ClusterStore>(
    f: Fixture<S>,
) {
    let gone = dead(&f, "node-gone").await;
    for i in 0..5 {
        f.record_obligation(obligation(&format!("row{i}"), &gone))
            .await
            .unwrap();
    }
    let me = live(&f, "sweeper").await;
    let mut claim = claim_for(&me, &["telegram"]);
    claim.limit = 2;
    claim.lease = -1.0;
    let mut pages = Vec::new();
    while pages.len() < 10 {
        let batch = f.claim_owed(&claim).await.unwrap();
        let Some(last) = batch.last.clone() else {
            break;
        };
        let ids = claimed_ids(&batch);
        assert_eq!(ids.last(), Some(&last.id));
        pages.push(ids);
        claim.after = Some(last);
    }
    assert_eq!(
        pages,
        [vec!["row0", "row1"], vec!["row2", "row3"], vec!["row4"]]
    );
    // A new sweep starts from the beginning.
    claim.after = None;
    let batch = f.claim_owed(&claim).await.unwrap();
    assert_eq!(claimed_ids(&batch), ["row0", "row1"]);
}

/// The outbox: the answer and its obligation are stored together, or,
/// when the append fails, neither.
async fn a_reply_and_its_obligation_are_stored_together<
    S: Backend + LedgerStore + talaria_store::SessionStore,
>(
    f: Fixture<S>,
) {
    use talaria_core::{Message, Usage};
    let me = id("node-a");
    f.create_session(common::new_session("s1", "telegram"))
        .await
        .unwrap();
    let usage = Usage {
        input_tokens: 10,
        output_tokens: 5,
        ..Usage::default()
    };
    let row = f
        .append_reply(
            "s1",
            &Message::assistant("the answer"),
            &usage,
            obligation("r1", &me),
        )
        .await
        .unwrap();
    let messages = f.messages("s1").await.unwrap();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].id, row);
    assert_eq!(messages[0].message.content, "the answer");
    let session = f.session("s1").await.unwrap().unwrap();
    assert_eq!((session.input_tokens, session.output_tokens), (10, 5));
    let owed = f.obligation("r1").await.unwrap().unwrap();
    assert_eq!(
        (owed.state, owed.owner),
        (ObligationState::Pending, Some(me.clone()))
    );
    // The owner sends it as usual.
    assert_eq!(f.begin_attempt("r1", &me, 60.0).await.unwrap(), Some(1));

    // A session that is not there: nothing is stored, nothing is owed.
    let err = f
        .append_reply(
            "ghost",
            &Message::assistant("lost"),
            &usage,
            obligation("r2", &me),
        )
        .await;
    assert!(err.is_err());
    assert_eq!(f.obligation("r2").await.unwrap(), None);
}

/// A failed row rests before it is tried again, whoever sweeps.
async fn a_failed_row_waits_before_its_retry<S: Backend + LedgerStore + ClusterStore>(
    f: Fixture<S>,
) {
    let me = live(&f, "node-me").await;
    f.record_obligation(obligation("r", &me)).await.unwrap();
    let n = f.begin_attempt("r", &me, 60.0).await.unwrap().unwrap();
    f.mark_failed("r", n, "the platform answered 502")
        .await
        .unwrap();
    let mut claim = claim_for(&me, &["telegram"]);
    claim.retry_failed_after = 60.0;
    assert!(f.claim_owed(&claim).await.unwrap().claimed.is_empty());
    // A minute later it is due.
    f.execute("UPDATE delivery_obligations SET updated_at = updated_at - 61 WHERE id = 'r'")
        .await;
    assert_eq!(claimed_ids(&f.claim_owed(&claim).await.unwrap()), ["r"]);
}

contract_tests!(
    a_failed_row_waits_before_its_retry,
    a_reply_and_its_obligation_are_stored_together,
    record_stores_a_pending_row_with_the_full_address,
    every_transition_is_recorded,
    failure_text_is_cut_to_500_chars_on_a_char_boundary,
    a_late_report_from_a_lost_attempt_changes_nothing,
    only_the_owner_begins_a_pending_row,
    re_recording_starts_over_and_keeps_the_attempt_count,
    a_sweep_claims_only_what_is_owed_to_it,
    a_node_never_claims_its_own_pending_row,
    a_sweep_keeps_to_its_platforms_its_limit_and_age_order,
    rows_over_budget_are_abandoned_whatever_their_platform,
    delivered_and_abandoned_rows_are_never_claimed,
    open_obligations_are_the_owed_ones_oldest_first,
    prune_deletes_only_old_closed_rows,
    counts_group_rows_by_state,
    racing_sweepers_claim_each_row_exactly_once,
    claims_page_through_the_rows_after_the_cursor,
    parts_sent_are_fenced_monotonic_and_seen_by_the_next_claim,
    parts_sent_survive_a_failure_into_the_retry,
);
