//! Nodes and leases, on both backends.

use crate::common;

use std::collections::HashMap;

use common::{Backend, Fixture};
use talaria_store::{ClusterStore, NodeAnnouncement, NodeId};

fn announcement(name: &str, pid: u32) -> NodeAnnouncement {
    NodeAnnouncement {
        id: NodeId::new(name).unwrap(),
        host: format!("host-of-{name}"),
        pid,
        started_at: Some(u64::MAX - 1),
        version: "0.1.0".to_owned(),
    }
}

async fn a_heartbeat_registers_then_refreshes_a_node<S: Backend + ClusterStore>(f: Fixture<S>) {
    let a = announcement("node-a", 100);
    let first = f.heartbeat(&a, 10.0).await.unwrap();
    let nodes = f.nodes().await.unwrap();
    assert_eq!(nodes.len(), 1);
    let n = &nodes[0];
    assert_eq!(n.id, a.id);
    assert_eq!(n.host, "host-of-node-a");
    assert_eq!(n.pid, 100);
    assert_eq!(
        n.started_at,
        Some(u64::MAX - 1),
        "start times round-trip exactly"
    );
    assert_eq!(n.version, "0.1.0");
    assert_eq!(n.joined_at, first);
    assert_eq!(n.heartbeat_at, first);
    assert!((n.lease_until - (first + 10.0)).abs() < 1e-6);

    // Pretend the first beat was a minute ago; the next one moves the
    // heartbeat and the lease but not the joining time.
    f.execute(
        "UPDATE cluster_nodes SET joined_at = joined_at - 60, heartbeat_at = heartbeat_at - 60",
    )
    .await;
    let second = f.heartbeat(&a, 30.0).await.unwrap();
    let n = f.nodes().await.unwrap().remove(0);
    assert_eq!(n.joined_at, first - 60.0);
    assert_eq!(n.heartbeat_at, second);
    assert!((n.lease_until - (second + 30.0)).abs() < 1e-6);

    f.heartbeat(&announcement("node-b", 200), 10.0)
        .await
        .unwrap();
    let ids: Vec<String> = f
        .nodes()
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.id.to_string())
        .collect();
    assert_eq!(ids, ["node-a", "node-b"], "longest-running first");
}

async fn leases_go_to_one_holder_and_change_hands_with_a_higher_fence<S: Backend + ClusterStore>(
    f: Fixture<S>,
) {
    let a = NodeId::new("node-a").unwrap();
    let b = NodeId::new("node-b").unwrap();
    let grant = f
        .acquire_lease("connector:x", &a, 10.0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(grant.fence, 1);
    assert!((grant.until - (grant.now + 10.0)).abs() < 1e-6);
    assert_eq!(
        f.acquire_lease("connector:x", &b, 10.0).await.unwrap(),
        None
    );

    // A renewal extends and keeps the fence.
    let renewed = f
        .acquire_lease("connector:x", &a, 20.0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(renewed.fence, 1);
    assert!(renewed.until >= grant.until);

    // Once A's time runs out, B takes over with a higher fence.
    f.execute("UPDATE cluster_leases SET lease_until = lease_until - 100")
        .await;
    let taken = f
        .acquire_lease("connector:x", &b, 10.0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(taken.fence, 2);
    assert_eq!(
        f.acquire_lease("connector:x", &a, 10.0).await.unwrap(),
        None
    );

    // Released, it is free at once; the fence still only grows.
    assert!(!f.release_lease("connector:x", &a).await.unwrap());
    assert!(f.release_lease("connector:x", &b).await.unwrap());
    assert!(!f.release_lease("connector:x", &b).await.unwrap());
    let back = f
        .acquire_lease("connector:x", &a, 10.0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back.fence, 3);
    // Even its own lease, once lapsed, starts a new tenure.
    f.execute("UPDATE cluster_leases SET lease_until = lease_until - 100")
        .await;
    let again = f
        .acquire_lease("connector:x", &a, 10.0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.fence, 4);

    let listed = f.leases("connector:").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "connector:x");
    assert_eq!(listed[0].holder, a);
    assert_eq!(listed[0].fence, 4);
    assert_eq!(listed[0].lease_until, again.until);
}

async fn leases_are_listed_by_prefix<S: Backend + ClusterStore>(f: Fixture<S>) {
    let a = NodeId::new("node-a").unwrap();
    for name in ["turn:k2", "connector:telegram:1", "turn:k1", "turnover"] {
        f.acquire_lease(name, &a, 10.0).await.unwrap().unwrap();
    }
    let names = |prefix: &'static str| {
        let f = &f;
        async move {
            f.leases(prefix)
                .await
                .unwrap()
                .into_iter()
                .map(|l| l.name)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(names("turn:").await, ["turn:k1", "turn:k2"]);
    assert_eq!(names("connector:").await, ["connector:telegram:1"]);
    assert_eq!(names("").await.len(), 4);
    // A prefix is matched literally, not as a pattern.
    assert!(names("turn_").await.is_empty());
    assert!(names("%").await.is_empty());
}

async fn leaving_or_dying_frees_a_nodes_leases<S: Backend + ClusterStore>(f: Fixture<S>) {
    let a = announcement("node-a", 1);
    let b = announcement("node-b", 2);
    f.heartbeat(&a, 60.0).await.unwrap();
    f.heartbeat(&b, 60.0).await.unwrap();
    f.acquire_lease("connector:x", &a.id, 60.0)
        .await
        .unwrap()
        .unwrap();
    f.acquire_lease("connector:y", &b.id, 60.0)
        .await
        .unwrap()
        .unwrap();

    // A leaves in order: gone from the list, its lease free at once.
    f.leave(&a.id).await.unwrap();
    let ids: Vec<NodeId> = f.nodes().await.unwrap().into_iter().map(|n| n.id).collect();
    assert_eq!(ids, std::slice::from_ref(&b.id));
    assert_eq!(
        f.acquire_lease("connector:x", &b.id, 60.0)
            .await
            .unwrap()
            .unwrap()
            .fence,
        2
    );

    // B is found dead: its lease ends now and its leases are free.
    assert!(f.expire_node(&b.id).await.unwrap());
    assert!(!f.expire_node(&b.id).await.unwrap(), "already dead");
    let clock = f.clock().await.unwrap();
    let node = f.nodes().await.unwrap().remove(0);
    assert!(node.lease_until <= clock);
    let c = NodeId::new("node-c").unwrap();
    assert!(
        f.acquire_lease("connector:y", &c, 60.0)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        f.acquire_lease("connector:x", &c, 60.0)
            .await
            .unwrap()
            .is_some()
    );
    assert!(!f.expire_node(&NodeId::new("ghost").unwrap()).await.unwrap());
}

async fn dead_nodes_are_pruned<S: Backend + ClusterStore>(f: Fixture<S>) {
    f.heartbeat(&announcement("old", 1), 10.0).await.unwrap();
    f.heartbeat(&announcement("live", 2), 10.0).await.unwrap();
    f.execute("UPDATE cluster_nodes SET lease_until = lease_until - 7200 WHERE id = 'old'")
        .await;
    let before = f.clock().await.unwrap() - 3600.0;
    assert_eq!(f.prune_nodes(before).await.unwrap(), 1);
    assert_eq!(f.prune_nodes(before).await.unwrap(), 0);
    let ids: Vec<String> = f
        .nodes()
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.id.to_string())
        .collect();
    assert_eq!(ids, ["live"]);
}

async fn the_clock_is_close_to_this_machines<S: Backend + ClusterStore>(f: Fixture<S>) {
    let store = f.clock().await.unwrap();
    let local = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((store - local).abs() < 5.0, "{store} vs {local}");
}

/// Three nodes, each on its own connection, ask for the same 40 leases; a
/// barrier releases all three into each request at the same instant, so
/// every lease is really contended. Each is granted once, to the holder the
/// store records, at fence 1; and the race is shown to have happened: more
/// than one node won leases (one after another, the first would win all).
async fn racing_nodes_get_each_lease_once<S: Backend + ClusterStore>(f: Fixture<S>) {
    const NAMES: usize = 40;
    const RACERS: usize = 3;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(RACERS));
    let mut racers = Vec::new();
    for n in 0..RACERS {
        let store = f.reopen().await;
        let me = NodeId::new(format!("racer-{n}")).unwrap();
        let barrier = barrier.clone();
        racers.push(tokio::spawn(async move {
            let mut won = Vec::new();
            for i in 0..NAMES {
                let name = format!("connector:{i}");
                barrier.wait().await;
                if store
                    .acquire_lease(&name, &me, 60.0)
                    .await
                    .unwrap()
                    .is_some()
                {
                    won.push(name);
                }
            }
            (me, won)
        }));
    }
    let mut holders: HashMap<String, NodeId> = HashMap::new();
    let mut winners = 0;
    for racer in racers {
        // A racer that failed leaves the others at the barrier: give up
        // rather than hang.
        let (me, won) = tokio::time::timeout(std::time::Duration::from_secs(120), racer)
            .await
            .expect("a racer stopped (see its panic above)")
            .unwrap();
        if !won.is_empty() {
            winners += 1;
        }
        for name in won {
            assert!(
                holders.insert(name.clone(), me.clone()).is_none(),
                "{name} granted twice"
            );
        }
    }
    assert_eq!(holders.len(), NAMES);
    assert!(
        winners > 1,
        "the requests did not race: one node won every lease"
    );
    for lease in f.leases("connector:").await.unwrap() {
        assert_eq!(holders[&lease.name], lease.holder);
        assert_eq!(lease.fence, 1);
    }
}

async fn a_holder_learns_that_another_node_is_waiting<S: Backend + ClusterStore>(f: Fixture<S>) {
    let a = NodeId::new("node-a").unwrap();
    let b = NodeId::new("node-b").unwrap();
    let grant = f.acquire_lease("turn:k", &a, 30.0).await.unwrap().unwrap();
    assert!(!grant.wanted);
    assert!(
        !f.acquire_lease("turn:k", &a, 30.0)
            .await
            .unwrap()
            .unwrap()
            .wanted
    );
    // B asks and is refused; A's next renewal says someone waits.
    assert_eq!(f.acquire_lease("turn:k", &b, 30.0).await.unwrap(), None);
    assert!(
        f.acquire_lease("turn:k", &a, 30.0)
            .await
            .unwrap()
            .unwrap()
            .wanted
    );
    // A new tenure starts with nobody waiting.
    assert!(f.release_lease("turn:k", &a).await.unwrap());
    let taken = f.acquire_lease("turn:k", &b, 30.0).await.unwrap().unwrap();
    assert!(!taken.wanted);
    assert_eq!(taken.fence, grant.fence + 1);
}

async fn a_dead_nodes_leases_are_free_before_they_lapse<S: Backend + ClusterStore>(f: Fixture<S>) {
    let a = announcement("node-a", 1);
    f.heartbeat(&a, 60.0).await.unwrap();
    f.acquire_lease("turn:k", &a.id, 600.0)
        .await
        .unwrap()
        .unwrap();
    let b = NodeId::new("node-b").unwrap();
    assert_eq!(f.acquire_lease("turn:k", &b, 30.0).await.unwrap(), None);
    // A's heartbeats stop: its node lease runs out long before the turn
    // lease would.
    f.execute("UPDATE cluster_nodes SET lease_until = lease_until - 120 WHERE id = 'node-a'")
        .await;
    let taken = f.acquire_lease("turn:k", &b, 30.0).await.unwrap().unwrap();
    assert_eq!(taken.fence, 2);
    // A holder without a node row is judged by its lease alone.
    let ghost = NodeId::new("never-registered").unwrap();
    f.acquire_lease("turn:g", &ghost, 600.0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(f.acquire_lease("turn:g", &b, 30.0).await.unwrap(), None);
}

contract_tests!(
    a_dead_nodes_leases_are_free_before_they_lapse,
    a_holder_learns_that_another_node_is_waiting,
    a_heartbeat_registers_then_refreshes_a_node,
    leases_go_to_one_holder_and_change_hands_with_a_higher_fence,
    leases_are_listed_by_prefix,
    leaving_or_dying_frees_a_nodes_leases,
    dead_nodes_are_pruned,
    the_clock_is_close_to_this_machines,
    racing_nodes_get_each_lease_once,
);
