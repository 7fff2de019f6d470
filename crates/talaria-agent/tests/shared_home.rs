//! Memory and skills shared by several homes through one PostgreSQL store,
//! as the homes of nodes on several hosts would be: what one writes the
//! others get, a change made on a stale copy never overwrites a newer one,
//! and concurrent memory writes on two nodes all survive.

use crate::tools_support;

use std::path::Path;
use std::sync::Arc;

use serde_json::json;
use talaria_agent::shared_home::{cursor, pull, push, reconcile};
use talaria_agent::tools::Tool;
use talaria_agent::tools::memory::{MemoryTarget, MemoryTool, read_entries};
use talaria_store::{PostgresOptions, PostgresStore, SessionStore, SharedFileStore};
use tools_support::Env;

async fn shared_store() -> Arc<PostgresStore> {
    let mut options = PostgresOptions::new(talaria_testkit::postgres::url());
    options.schema = Some(talaria_testkit::postgres::fresh_schema().await);
    options.max_connections = 4;
    Arc::new(PostgresStore::connect(options).await.unwrap())
}

/// A node: a home of its own on the shared store.
fn node(store: &Arc<PostgresStore>) -> Env {
    let mut env = Env::new();
    env.ctx.store = store.clone();
    env
}

fn put(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn read(root: &Path, rel: &str) -> Option<String> {
    std::fs::read_to_string(root.join(rel)).ok()
}

async fn stored(store: &PostgresStore, rel: &str) -> Option<String> {
    let file = store.shared_file(rel).await.unwrap()?;
    file.content.map(|c| String::from_utf8(c).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_node_seeds_the_store_and_a_second_gets_it_and_adds_its_own() {
    let store = shared_store().await;
    let (a, b) = (node(&store), node(&store));
    let (ra, rb) = (a.ctx.home.root(), b.ctx.home.root());
    put(ra, "memories/MEMORY.md", "the llama is Pablo");
    put(
        ra,
        "skills/llama-care/SKILL.md",
        "---\nname: llama-care\n---\nhay",
    );
    put(ra, "skills/llama-care/references/hay.md", "timothy");
    // Node-local files stay local.
    put(ra, "skills/.usage.json", "{}");
    put(ra, "memories/MEMORY.md.lock", "");
    put(ra, "memories/MEMORY.md.bak.1700000000", "old");
    put(
        rb,
        "skills/knitting/SKILL.md",
        "---\nname: knitting\n---\npurl",
    );

    let (sent, _) = reconcile(&a.ctx.home, store.as_ref()).await.unwrap();
    assert_eq!(sent, 3);
    let listed: Vec<String> = store
        .shared_file_list("", 100)
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.path)
        .collect();
    assert_eq!(
        listed,
        [
            "memories/MEMORY.md",
            "skills/llama-care/SKILL.md",
            "skills/llama-care/references/hay.md"
        ]
    );
    let (sent, applied) = reconcile(&b.ctx.home, store.as_ref()).await.unwrap();
    assert_eq!((sent, applied), (1, 3));
    assert_eq!(
        read(rb, "memories/MEMORY.md").as_deref(),
        Some("the llama is Pablo")
    );
    assert_eq!(
        read(rb, "skills/llama-care/references/hay.md").as_deref(),
        Some("timothy")
    );
    assert_eq!(read(rb, "skills/.usage.json"), None);
    assert_eq!(cursor(&b.ctx.home), 4);
    // And back: the first node gets the second's skill.
    assert_eq!(pull(&a.ctx.home, store.as_ref()).await.unwrap(), 1);
    assert_eq!(
        read(ra, "skills/knitting/SKILL.md").as_deref(),
        Some("---\nname: knitting\n---\npurl")
    );
    // Nothing changed: nothing moves.
    assert_eq!(
        reconcile(&a.ctx.home, store.as_ref()).await.unwrap(),
        (0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_and_deletes_move_and_a_newer_copy_is_never_overwritten() {
    let store = shared_store().await;
    let (a, b) = (node(&store), node(&store));
    let (ra, rb) = (a.ctx.home.root(), b.ctx.home.root());
    put(ra, "skills/cook/SKILL.md", "v1");
    put(ra, "skills/cook/templates/menu.md", "soup");
    reconcile(&a.ctx.home, store.as_ref()).await.unwrap();
    pull(&b.ctx.home, store.as_ref()).await.unwrap();

    // An edit on one node reaches the other.
    put(ra, "skills/cook/SKILL.md", "v2 by a");
    assert_eq!(
        push(&a.ctx.home, store.as_ref(), "skills/cook/")
            .await
            .unwrap(),
        1
    );
    pull(&b.ctx.home, store.as_ref()).await.unwrap();
    assert_eq!(read(rb, "skills/cook/SKILL.md").as_deref(), Some("v2 by a"));

    // Node b edits; node a, not having seen it, edits too. Its push must
    // not overwrite b's newer copy: the pull that follows brings b's.
    put(rb, "skills/cook/SKILL.md", "v3 by b");
    push(&b.ctx.home, store.as_ref(), "skills/").await.unwrap();
    put(ra, "skills/cook/SKILL.md", "v3 by a, on a stale copy");
    assert_eq!(
        push(&a.ctx.home, store.as_ref(), "skills/").await.unwrap(),
        0
    );
    assert_eq!(
        stored(&store, "skills/cook/SKILL.md").await.as_deref(),
        Some("v3 by b")
    );
    assert_eq!(read(ra, "skills/cook/SKILL.md").as_deref(), Some("v3 by b"));

    // A skill deleted on one node goes on the other, folder and all.
    std::fs::remove_dir_all(rb.join("skills/cook")).unwrap();
    assert_eq!(
        push(&b.ctx.home, store.as_ref(), "skills/").await.unwrap(),
        2
    );
    assert_eq!(stored(&store, "skills/cook/SKILL.md").await, None);
    pull(&a.ctx.home, store.as_ref()).await.unwrap();
    assert!(!ra.join("skills/cook").exists());
    assert!(ra.join("skills").is_dir());
    // A later push of a does not bring it back.
    assert_eq!(
        push(&a.ctx.home, store.as_ref(), "skills/").await.unwrap(),
        0
    );
    // Created again on a, it is a new file to everyone.
    put(ra, "skills/cook/SKILL.md", "v4");
    assert_eq!(
        push(&a.ctx.home, store.as_ref(), "skills/").await.unwrap(),
        1
    );
    pull(&b.ctx.home, store.as_ref()).await.unwrap();
    assert_eq!(read(rb, "skills/cook/SKILL.md").as_deref(), Some("v4"));
}

/// The memory tool on two nodes at once, eight adds each: every entry is
/// in the shared file, and each node's file is that file after a pull.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_memory_adds_on_two_nodes_all_survive() {
    let store = shared_store().await;
    let (a, b) = (Arc::new(node(&store)), Arc::new(node(&store)));
    let calls: Vec<_> = (0..16)
        .map(|i| {
            let env = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                let out = MemoryTool
                    .call(
                        json!({"action": "add", "target": "memory", "content": format!("fact number {i}")}),
                        &env.ctx,
                    )
                    .await
                    .unwrap();
                let out: serde_json::Value = serde_json::from_str(&out).unwrap();
                assert_eq!(out["success"], true, "{out}");
            })
        })
        .collect();
    for call in calls {
        call.await.unwrap();
    }
    let shared = stored(&store, "memories/MEMORY.md").await.unwrap();
    let mut entries = talaria_agent::tools::memory::parse_entries(&shared);
    entries.sort();
    let mut expected: Vec<String> = (0..16).map(|i| format!("fact number {i}")).collect();
    expected.sort();
    assert_eq!(entries, expected);
    for env in [&a, &b] {
        pull(&env.ctx.home, store.as_ref()).await.unwrap();
        let mut here = read_entries(&env.ctx.home, MemoryTarget::Memory).unwrap();
        here.sort();
        assert_eq!(here, expected);
    }
}

async fn call(env: &Env, args: serde_json::Value) -> serde_json::Value {
    let out = MemoryTool.call(args, &env.ctx).await.unwrap();
    serde_json::from_str(&out).unwrap()
}

/// A memory entry removed on one node is gone on the other, and a replace
/// on a node that has not pulled yet works on the newest text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_changes_build_on_the_newest_copy() {
    let store = shared_store().await;
    let (a, b) = (node(&store), node(&store));
    call(
        &a,
        json!({"action": "add", "target": "user", "content": "Name: Ana"}),
    )
    .await;
    call(
        &a,
        json!({"action": "add", "target": "user", "content": "Likes tea"}),
    )
    .await;
    // b has pulled nothing, yet its replace finds a's entry.
    let out = call(
        &b,
        json!({"action": "replace", "target": "user", "old_text": "tea", "content": "Likes coffee"}),
    )
    .await;
    assert_eq!(out["success"], true, "{out}");
    assert_eq!(out["entries"], json!(["Name: Ana", "Likes coffee"]));
    let out = call(
        &a,
        json!({"action": "remove", "target": "user", "old_text": "Ana"}),
    )
    .await;
    assert_eq!(out["success"], true, "{out}");
    assert_eq!(out["entries"], json!(["Likes coffee"]));
    assert_eq!(
        stored(&store, "memories/USER.md").await.as_deref(),
        Some("Likes coffee")
    );
    pull(&b.ctx.home, store.as_ref()).await.unwrap();
    assert_eq!(
        read_entries(&b.ctx.home, MemoryTarget::User).unwrap(),
        ["Likes coffee"]
    );
    // On a store that shares nothing, the tool is the file tool it was.
    assert!(tools_support::MemStore::default().shared_files().is_none());
}

/// A memory call that changes nothing (an entry already there) writes no
/// new revision, so no node pulls the same bytes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_call_that_changes_nothing_writes_no_revision() {
    let store = shared_store().await;
    let a = node(&store);
    let add = json!({"action": "add", "target": "memory", "content": "The llama is Pablo"});
    call(&a, add.clone()).await;
    let first = store
        .shared_file("memories/MEMORY.md")
        .await
        .unwrap()
        .unwrap();
    let out = call(&a, add).await;
    assert_eq!(out["entries"], json!(["The llama is Pablo"]), "{out}");
    let again = store
        .shared_file("memories/MEMORY.md")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        again.revision, first.revision,
        "no new revision for the same bytes"
    );
    call(
        &a,
        json!({"action": "add", "target": "memory", "content": "Hay at noon"}),
    )
    .await;
    let changed = store
        .shared_file("memories/MEMORY.md")
        .await
        .unwrap()
        .unwrap();
    assert!(
        changed.revision > first.revision,
        "a real change is written"
    );
}
