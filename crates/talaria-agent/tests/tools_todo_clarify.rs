//! todo, clarify, and the core registry.

use crate::tools_support;

use std::sync::Arc;

use serde_json::{Value, json};
use talaria_agent::tools::clarify::ClarifyTool;
use talaria_agent::tools::todo::TodoTool;
use talaria_agent::tools::{Registry, Tool};
use talaria_core::Config;
use tools_support::{Env, Scripted, json};

async fn todo(env: &Env, args: Value) -> Result<Value, String> {
    TodoTool
        .call(args, &env.ctx)
        .await
        .map(|s| json(&s))
        .map_err(|e| e.0)
}

#[tokio::test]
async fn todo_replace_merge_and_read() {
    let env = Env::new();
    let out = todo(&env, json!({})).await.unwrap();
    assert_eq!(out["todos"], json!([]));
    let out = todo(
        &env,
        json!({"todos": [
            {"id": "1", "content": "plan", "status": "completed"},
            {"id": "2", "content": "build", "status": "in_progress"},
            {"id": 3, "content": "ship"}
        ]}),
    )
    .await
    .unwrap();
    assert_eq!(out["summary"]["total"], 3);
    assert_eq!(
        out["summary"]["pending"], 1,
        "status defaults to pending: {out}"
    );
    assert_eq!(out["todos"][2]["id"], "3");
    // Merge updates by id and appends new ids.
    let out = todo(
        &env,
        json!({"merge": true, "todos": [
            {"id": "2", "status": "completed"},
            {"id": "4", "content": "celebrate", "status": "pending"}
        ]}),
    )
    .await
    .unwrap();
    assert_eq!(out["summary"]["total"], 4);
    assert_eq!(out["todos"][1]["content"], "build");
    assert_eq!(out["todos"][1]["status"], "completed");
    assert_eq!(out["todos"][3]["content"], "celebrate");
    // Replace drops what is not listed.
    let out = todo(
        &env,
        json!({"todos": [{"id": "9", "content": "only", "status": "cancelled"}]}),
    )
    .await
    .unwrap();
    assert_eq!(out["summary"]["total"], 1);
    assert_eq!(out["summary"]["cancelled"], 1);
    let out = todo(&env, json!({})).await.unwrap();
    assert_eq!(out["todos"][0]["content"], "only");
    assert_eq!(env.ctx.session.todos.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn todo_limits_and_validation_leave_the_list_alone() {
    let env = Env::new();
    todo(
        &env,
        json!({"todos": [{"id": "a", "content": "keep", "status": "pending"}]}),
    )
    .await
    .unwrap();
    let too_many: Vec<Value> = (0..257)
        .map(|i| json!({"id": i.to_string(), "content": "x", "status": "pending"}))
        .collect();
    let e = todo(&env, json!({"todos": too_many})).await.unwrap_err();
    assert!(e.contains("256"), "{e}");
    let exactly: Vec<Value> = (0..256)
        .map(|i| json!({"id": i.to_string(), "content": "x", "status": "pending"}))
        .collect();
    todo(&env, json!({"todos": exactly})).await.unwrap();
    let e = todo(
        &env,
        json!({"merge": true, "todos": [{"id": "new", "content": "x"}]}),
    )
    .await
    .unwrap_err();
    assert!(e.contains("256"), "merging past the cap: {e}");
    todo(
        &env,
        json!({"todos": [{"id": "a", "content": "keep", "status": "pending"}]}),
    )
    .await
    .unwrap();
    for (args, needle) in [
        (
            json!({"todos": [{"id": "b", "content": "y".repeat(4001)}]}),
            "4000",
        ),
        (
            json!({"todos": [{"id": "b", "content": "x", "status": "done"}]}),
            "status",
        ),
        (json!({"todos": [{"content": "x"}]}), "id"),
        (json!({"todos": [{"id": "b"}]}), "content"),
        (json!({"todos": [{"id": "b", "content": ""}]}), "content"),
        (json!({"todos": "x"}), "todos"),
        (json!({"todos": [], "merge": 3}), "merge"),
        (json!({"todos": [5]}), "todos[0]"),
    ] {
        let e = todo(&env, args.clone()).await.unwrap_err();
        assert!(e.contains(needle), "{args}: {e}");
    }
    let list = env.ctx.session.todos.lock().unwrap().clone();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].content, "keep");
    // Exactly 4000 chars is fine.
    todo(
        &env,
        json!({"merge": true, "todos": [{"id": "a", "content": "z".repeat(4000)}]}),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn clarify_asks_and_returns_the_answer() {
    let human = Arc::new(Scripted {
        answer: Some("the blue one".into()),
        ..Scripted::default()
    });
    let env = Env::with(Config::default(), human.clone());
    let out = json(
        &ClarifyTool
            .call(
                json!({"question": "Which?", "choices": ["red", "blue"]}),
                &env.ctx,
            )
            .await
            .unwrap(),
    );
    assert_eq!(out["user_response"], "the blue one");
    let asked = human.questions.lock().unwrap().clone();
    assert_eq!(asked[0].question, "Which?");
    assert_eq!(asked[0].choices, ["red", "blue"]);
}

#[tokio::test]
async fn clarify_without_a_human_says_so() {
    let env = Env::new();
    let out = json(
        &ClarifyTool
            .call(json!({"question": "Proceed?"}), &env.ctx)
            .await
            .unwrap(),
    );
    assert_eq!(out["user_response"], Value::Null);
    assert!(out["note"].as_str().unwrap().contains("No human"), "{out}");
}

#[tokio::test]
async fn clarify_validates() {
    let env = Env::new();
    for (args, needle) in [
        (json!({}), "question"),
        (json!({"question": ""}), "question"),
        (
            json!({"question": "q", "choices": ["a", "b", "c", "d", "e"]}),
            "at most 4",
        ),
        (json!({"question": "q", "choices": [1]}), "choices[0]"),
        (json!({"question": "q", "choices": "a"}), "choices"),
    ] {
        let e = ClarifyTool.call(args.clone(), &env.ctx).await.unwrap_err();
        assert!(e.0.contains(needle), "{args}: {e}");
    }
}

#[test]
fn registry_has_the_core_tools_with_ancestor_names() {
    let r = Registry::with_core_tools(&Config::default());
    assert_eq!(
        r.names(),
        [
            "clarify",
            "memory",
            "patch",
            "read_file",
            "search_files",
            "session_search",
            "terminal",
            "todo",
            "write_file"
        ]
    );
    for spec in r.specs() {
        assert_eq!(spec.parameters["type"], "object", "{}", spec.name);
        assert!(!spec.description.is_empty());
    }
    let parallel: Vec<&str> = r
        .names()
        .into_iter()
        .filter(|n| r.get(n).unwrap().parallel_safe())
        .collect();
    assert_eq!(parallel, ["read_file", "search_files", "session_search"]);
    let mut c = Config::default();
    c.memory.enabled = false;
    assert!(Registry::with_core_tools(&c).get("memory").is_none());
}
