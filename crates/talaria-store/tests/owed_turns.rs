//! Owed turns, on both backends: accepted with the inbound dedupe in one
//! step, settled with the answer that stores them, and taken over once
//! from a dead node, even by racing nodes.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;

use common::{Backend, Fixture, new_session};
use talaria_core::{Message, Usage};
use talaria_store::{
    ClusterStore, GatewayStore, InboundStore, NewObligation, NewOwedTurn, NodeId, OwedTurnStore,
};
use tokio::sync::Barrier;

fn id(name: &str) -> NodeId {
    common::node_id(name)
}

fn turn(id: &str, platform: &str, owner: &NodeId) -> NewOwedTurn {
    NewOwedTurn {
        id: id.to_owned(),
        session_key: format!("{platform}:dm:{id}"),
        platform: platform.to_owned(),
        event: format!("{{\"text\":\"message {id}\"}}"),
        owner: owner.clone(),
    }
}

/// Registers `name` as a live node (for a minute).
async fn live<S: ClusterStore>(f: &Fixture<S>, name: &str) -> NodeId {
    common::live_node(&**f, name).await
}

fn platforms(names: &[&str]) -> Vec<String> {
    names.iter().map(|p| (*p).to_owned()).collect()
}

async fn a_message_is_taken_once_and_recorded_with_its_dedupe<
    S: Backend + OwedTurnStore + InboundStore,
>(
    f: Fixture<S>,
) {
    let me = id("node-a");
    assert!(
        f.accept_turn(Some("42\u{1f}7"), turn("t1", "telegram", &me))
            .await
            .unwrap()
    );
    // A repeat of the same inbound id records nothing more.
    assert!(
        !f.accept_turn(Some("42\u{1f}7"), turn("t1-again", "telegram", &me))
            .await
            .unwrap()
    );
    assert_eq!(f.owed_turn_count().await.unwrap(), 1);
    // The dedupe is the one the inbound store keeps.
    assert!(!f.first_delivery("telegram", "42\u{1f}7").await.unwrap());
    // No inbound id: nothing to dedupe on, always recorded.
    assert!(f.accept_turn(None, turn("t2", "api", &me)).await.unwrap());
    assert_eq!(f.owed_turn_count().await.unwrap(), 2);
    assert_eq!(
        f.settle_turns(&["t1".to_owned(), "t2".to_owned(), "unknown".to_owned()])
            .await
            .unwrap(),
        2
    );
    assert_eq!(f.owed_turn_count().await.unwrap(), 0);
    assert_eq!(f.settle_turns(&[]).await.unwrap(), 0);
}

async fn the_answer_settles_its_turns_in_the_transaction_that_stores_it<
    S: Backend + GatewayStore,
>(
    f: Fixture<S>,
) {
    let me = live(&f, "node-a").await;
    f.create_session(new_session("s1", "telegram"))
        .await
        .unwrap();
    for t in ["a", "b", "c"] {
        assert!(
            f.accept_turn(Some(t), turn(t, "telegram", &me))
                .await
                .unwrap()
        );
    }
    let obligation = NewObligation {
        id: "reply-1".to_owned(),
        session_key: "telegram:dm:42".to_owned(),
        platform: "telegram".to_owned(),
        chat_id: "42".to_owned(),
        thread_id: None,
        reply_to: None,
        content: "the answer".to_owned(),
        owner: me.clone(),
        settles: vec!["a".to_owned(), "b".to_owned()],
    };
    f.append_reply(
        "s1",
        &Message::assistant("the answer"),
        &Usage::default(),
        obligation,
    )
    .await
    .unwrap();
    assert_eq!(f.owed_turn_count().await.unwrap(), 1);
    assert!(f.obligation("reply-1").await.unwrap().is_some());
    // Nothing claims the survivor while its node lives.
    let other = live(&f, "node-b").await;
    assert!(
        f.claim_owed_turns(&other, &platforms(&["telegram"]), 10)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn a_dead_nodes_turns_are_taken_over_once_on_live_platforms<S: Backend + GatewayStore>(
    f: Fixture<S>,
) {
    let gone = live(&f, "node-gone").await;
    let me = live(&f, "node-me").await;
    f.accept_turn(Some("1"), turn("t1", "telegram", &gone))
        .await
        .unwrap();
    f.accept_turn(Some("2"), turn("t2", "discord", &gone))
        .await
        .unwrap();
    f.accept_turn(Some("3"), turn("t3", "telegram", &me))
        .await
        .unwrap();
    // Alive: nothing to take.
    assert!(
        f.claim_owed_turns(&me, &platforms(&["telegram", "discord"]), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(f.expire_node(&gone).await.unwrap());
    // Only where the answer can go; never the claimer's own.
    let taken = f
        .claim_owed_turns(&me, &platforms(&["telegram"]), 10)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert_eq!(taken[0].id, "t1");
    assert_eq!(taken[0].claims, 1);
    assert_eq!(taken[0].owner.as_ref(), Some(&me));
    assert_eq!(taken[0].event, "{\"text\":\"message t1\"}");
    // Taken: now the claimer's, not taken again.
    assert!(
        f.claim_owed_turns(&me, &platforms(&["telegram"]), 10)
            .await
            .unwrap()
            .is_empty()
    );
    // A node that has no row at all (a stopped one that left) is dead too,
    // and each takeover counts.
    f.leave(&me).await.unwrap();
    let third = live(&f, "node-third").await;
    let taken = f
        .claim_owed_turns(&third, &platforms(&["telegram", "discord"]), 10)
        .await
        .unwrap();
    let ids: Vec<(&str, u32)> = taken.iter().map(|t| (t.id.as_str(), t.claims)).collect();
    assert_eq!(ids, vec![("t1", 2), ("t2", 1), ("t3", 1)]);
    // The limit holds.
    f.leave(&third).await.unwrap();
    let fourth = live(&f, "node-fourth").await;
    assert_eq!(
        f.claim_owed_turns(&fourth, &platforms(&["telegram", "discord"]), 2)
            .await
            .unwrap()
            .len(),
        2
    );
}

/// Two handles on one database (two nodes) claim a dead node's turns at
/// once, many times over: every turn is taken by exactly one of them.
async fn racing_nodes_take_each_turn_exactly_once<S: Backend + GatewayStore>(f: Fixture<S>) {
    const TURNS: usize = 60;
    let gone = live(&f, "node-gone").await;
    for i in 0..TURNS {
        f.accept_turn(
            Some(&i.to_string()),
            turn(&format!("t{i:03}"), "telegram", &gone),
        )
        .await
        .unwrap();
    }
    assert!(f.expire_node(&gone).await.unwrap());
    let handles: [Arc<S>; 2] = [f.store.clone(), Arc::new(f.reopen().await)];
    let nodes = [live(&f, "node-a").await, live(&f, "node-b").await];
    let barrier = Arc::new(Barrier::new(2));
    let racers: Vec<_> = (0..2)
        .map(|i| {
            let (store, node, barrier) = (handles[i].clone(), nodes[i].clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let mut mine = Vec::new();
                // Small bites, so the two interleave.
                loop {
                    let taken = store
                        .claim_owed_turns(&node, &["telegram".to_owned()], 3)
                        .await
                        .unwrap();
                    if taken.is_empty() {
                        return mine;
                    }
                    mine.extend(taken.into_iter().map(|t| t.id));
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for racer in racers {
        all.extend(racer.await.unwrap());
    }
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(all.len(), TURNS, "a turn was taken twice or missed");
    assert_eq!(unique.len(), TURNS);
}

contract_tests!(
    a_message_is_taken_once_and_recorded_with_its_dedupe,
    the_answer_settles_its_turns_in_the_transaction_that_stores_it,
    a_dead_nodes_turns_are_taken_over_once_on_live_platforms,
    racing_nodes_take_each_turn_exactly_once,
);
