//! session_search: discover, read, scroll and browse, over an in-memory
//! store (for the filtering rules) and the real SQLite store (for FTS).

use crate::tools_support;

use std::sync::Arc;

use serde_json::{Value, json};
use talaria_agent::tools::Tool;
use talaria_agent::tools::session_search::SessionSearchTool;
use talaria_core::Message;
use talaria_store::{NewSession, SessionStore, SqliteStore};
use tools_support::{Env, assistant, json, record, user};

const CURRENT: &str = "20260101_000000_aaaaaa";

async fn call(env: &Env, args: Value) -> Value {
    json(&SessionSearchTool.call(args, &env.ctx).await.unwrap())
}

/// Past sessions: two about docker, one current, one subagent, a cron run
/// and a child of the first (same lineage).
fn seed(env: &Env) {
    let s = &env.store;
    s.add_session(record("s_docker1", "cli", 100.0, None));
    s.add_session(record("s_docker2", "telegram", 200.0, None));
    s.add_session(record("s_cron", "cron", 300.0, None));
    s.add_session(record("s_sub", "subagent", 400.0, None));
    s.add_session(record("s_child", "cli", 500.0, Some("s_docker1")));
    s.add_session(record(CURRENT, "cli", 600.0, None));
    for i in 0..8 {
        s.add_message("s_docker1", user(&format!("filler {i}")));
    }
    s.add_message("s_docker1", user("how do I prune docker images"));
    s.add_message("s_docker1", assistant("use docker image prune -a"));
    for i in 0..8 {
        s.add_message("s_docker1", assistant(&format!("later {i}")));
    }
    s.add_message("s_docker2", user("docker compose keeps restarting"));
    s.add_message(
        "s_docker2",
        Message::tool_result(
            "c1",
            "terminal",
            "docker ps output sk-abcdefghijklmnopqrstuvwx",
        ),
    );
    s.add_message(
        "s_docker2",
        assistant(&format!("the healthcheck fails {}", "x".repeat(5000))),
    );
    s.add_message("s_cron", user("docker nightly report"));
    s.add_message("s_sub", user("docker subagent work"));
    s.add_message("s_child", user("docker follow-up in the continued session"));
    s.add_message(CURRENT, user("docker question right now"));
}

#[tokio::test]
async fn discover_returns_one_hit_per_lineage_with_context() {
    let env = Env::new();
    seed(&env);
    let out = call(&env, json!({"query": "docker", "limit": 10})).await;
    assert_eq!(out["mode"], "discover");
    let ids: Vec<&str> = out["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["session_id"].as_str().unwrap())
        .collect();
    // Current session and subagent are excluded; s_child shares s_docker1's
    // lineage; cron comes last.
    assert_eq!(ids, ["s_docker1", "s_docker2", "s_cron"], "{out}");
    let first = &out["results"][0];
    let msgs = first["messages"].as_array().unwrap();
    assert!(msgs.len() <= 11, "{first}");
    let anchor: Vec<&Value> = msgs.iter().filter(|m| m["anchor"] == true).collect();
    assert_eq!(anchor.len(), 1);
    assert!(
        anchor[0]["content"]
            .as_str()
            .unwrap()
            .contains("prune docker")
    );
    assert_eq!(first["match_message_id"], anchor[0]["id"]);
    assert_eq!(first["when"], "1970-01-01 00:01 UTC");
}

#[tokio::test]
async fn discover_defaults_to_three_and_caps_at_ten() {
    let env = Env::new();
    for i in 0..15 {
        let id = format!("s{i:02}");
        env.store.add_session(record(&id, "cli", i as f64, None));
        env.store.add_message(&id, user("common needle"));
    }
    let out = call(&env, json!({"query": "needle"})).await;
    assert_eq!(out["count"], 3);
    let out = call(&env, json!({"query": "needle", "limit": 50})).await;
    assert_eq!(out["count"], 10);
}

#[tokio::test]
async fn contents_are_truncated_and_redacted() {
    let env = Env::new();
    seed(&env);
    let out = call(&env, json!({"session_id": "s_docker2"})).await;
    assert_eq!(out["mode"], "read");
    let text = out.to_string();
    assert!(
        !text.contains("abcdefghijklmnopqrstuvwx"),
        "tool rows are hidden or redacted"
    );
    let msgs = out["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 2, "user/assistant only: {out}");
    let long = msgs[1]["content"].as_str().unwrap();
    assert!(
        long.chars().count() < 1000 && long.contains("more chars"),
        "{long}"
    );
    // In discover mode the anchor keeps more but is still bounded.
    let out = call(&env, json!({"query": "healthcheck"})).await;
    let anchor = &out["results"][0]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["anchor"] == true)
        .unwrap()["content"];
    assert!(anchor.as_str().unwrap().chars().count() < 2100);
}

#[tokio::test]
async fn read_long_sessions_shows_head_and_tail() {
    let env = Env::new();
    env.store.add_session(record("s_long", "cli", 1.0, None));
    for i in 0..50 {
        env.store.add_message("s_long", user(&format!("msg {i}")));
    }
    let out = call(&env, json!({"session_id": "s_long"})).await;
    assert_eq!(out["messages"].as_array().unwrap().len(), 20);
    assert_eq!(out["messages_end"].as_array().unwrap().len(), 10);
    assert_eq!(out["messages_end"][9]["content"], "msg 49");
    assert!(
        out["omitted"].as_str().unwrap().contains("20 messages"),
        "{out}"
    );
}

#[tokio::test]
async fn scroll_shows_a_window() {
    let env = Env::new();
    seed(&env);
    let out = call(
        &env,
        json!({"session_id": "s_docker1", "around_message_id": 9, "window": 2}),
    )
    .await;
    let msgs = out["messages"].as_array().unwrap();
    let ids: Vec<i64> = msgs.iter().map(|m| m["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, [7, 8, 9, 10, 11]);
    assert_eq!(msgs[2]["anchor"], true);
}

#[tokio::test]
async fn browse_lists_recent_root_sessions() {
    let env = Env::new();
    seed(&env);
    let out = call(&env, json!({})).await;
    assert_eq!(out["mode"], "browse");
    let ids: Vec<&str> = out["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["s_cron", "s_docker2", "s_docker1"], "{out}");
}

#[tokio::test]
async fn the_current_session_and_bad_ids_are_refused() {
    let env = Env::new();
    seed(&env);
    for (args, needle) in [
        (json!({"session_id": CURRENT}), "current"),
        (json!({"session_id": "../etc/passwd"}), "session_id"),
        (json!({"session_id": "nope_123"}), "no session"),
        (json!({"around_message_id": 3}), "session_id"),
        (json!({"query": 7}), "query"),
        (json!({"limit": "many"}), "limit"),
    ] {
        let e = SessionSearchTool
            .call(args.clone(), &env.ctx)
            .await
            .unwrap_err();
        assert!(e.0.contains(needle), "{args}: {e}");
    }
}

#[tokio::test]
async fn no_hits_say_how_to_broaden() {
    let env = Env::new();
    seed(&env);
    let out = call(&env, json!({"query": "kubernetes"})).await;
    assert_eq!(out["count"], 0);
    assert!(out["note"].as_str().unwrap().contains("OR"));
}

#[tokio::test]
async fn works_over_the_sqlite_store() {
    let mut env = Env::new();
    let db = env.dir.path().join("state.db");
    let store = Arc::new(SqliteStore::open(&db).unwrap());
    for (id, text) in [
        (
            "20250101_000000_000001",
            "we configured nginx reverse proxy for grafana",
        ),
        (
            "20250102_000000_000002",
            "the postgres backup script runs nightly",
        ),
        (CURRENT, "nginx again in the current session"),
    ] {
        store
            .create_session(NewSession {
                id: id.into(),
                source: "cli".into(),
                ..NewSession::default()
            })
            .await
            .unwrap();
        store
            .append_message(id, &Message::user("hello there"))
            .await
            .unwrap();
        store
            .append_message(id, &Message::user(text))
            .await
            .unwrap();
        store
            .append_message(id, &Message::assistant("noted"))
            .await
            .unwrap();
    }
    env.ctx.store = store;
    let out = call(&env, json!({"query": "nginx"})).await;
    assert_eq!(out["count"], 1, "{out}");
    assert_eq!(out["results"][0]["session_id"], "20250101_000000_000001");
    let msgs = out["results"][0]["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3, "{out}");
    let out = call(&env, json!({"session_id": "20250102_000000_000002"})).await;
    assert_eq!(
        out["messages"][1]["content"],
        "the postgres backup script runs nightly"
    );
    let out = call(&env, json!({})).await;
    assert_eq!(out["count"], 2, "{out}");
    // FTS syntax the model might send does not break the tool.
    for q in ["\"unbalanced", "a:b", "NOT", "*", "nginx OR postgres"] {
        let _ = SessionSearchTool
            .call(json!({"query": q}), &env.ctx)
            .await
            .unwrap();
    }
}

#[test]
fn session_search_is_parallel_safe() {
    assert!(SessionSearchTool.parallel_safe());
}
