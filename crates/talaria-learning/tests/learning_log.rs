//! The learning log through real turns: the agent's skill and memory
//! writes are recorded with their contents, and a skill change can be
//! rolled back.

use crate::support;

use std::sync::Arc;

use talaria_agent::NullObserver;
use talaria_agent::tools::Registry;
use talaria_learning::log::LoggedMemory;
use talaria_learning::skill_history::rollback_skill;
use talaria_learning::skill_tools;
use talaria_learning::skills::Library;
use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};
use tokio_util::sync::CancellationToken;

fn call(id: &str, tool: &str, args: serde_json::Value) -> ToolCallReply {
    ToolCallReply::new(id, tool, args.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_logged_with_their_contents_and_a_skill_change_rolls_back() {
    let (dir, home) = support::home();
    let llm = MockOpenAi::start().await;
    let config = support::config(&llm, |_| {});
    let library = Arc::new(Library::new(&home));
    let mut registry = Registry::with_core_tools(&config);
    for tool in skill_tools(library.clone()) {
        registry.register(tool).unwrap();
    }
    registry.replace(Arc::new(LoggedMemory::new(&home, "agent")));
    let agent = support::agent(
        &config,
        &home,
        &llm,
        support::store(&home),
        registry,
        dir.path(),
    );
    let session = agent.new_session("cli").await.unwrap();
    let skill = "---\nname: backup\ndescription: Back up the database.\n---\n1. pg_dump nightly.\n";
    llm.push(Reply::tool_calls(vec![call(
        "c",
        "skill_manage",
        serde_json::json!({"action": "create", "name": "backup", "content": skill}),
    )]));
    llm.push(Reply::tool_calls(vec![call(
        "p",
        "skill_manage",
        serde_json::json!({"action": "patch", "name": "backup", "old_string": "nightly", "new_string": "hourly"}),
    )]));
    llm.push(Reply::tool_calls(vec![call(
        "m",
        "memory",
        serde_json::json!({"action": "add", "target": "memory", "content": "Backups run from the db host."}),
    )]));
    llm.push(Reply::text("Done."));
    agent
        .run_turn(
            &session,
            "set up backups",
            &NullObserver,
            CancellationToken::new(),
        )
        .await
        .unwrap();

    let log = library.log();
    let entries = log.entries();
    let summary: Vec<(String, String, String)> = entries
        .iter()
        .map(|e| (e.actor.clone(), e.action.clone(), e.target.clone()))
        .collect();
    assert_eq!(
        summary,
        [
            ("agent".into(), "create".into(), "skill:backup".into()),
            ("agent".into(), "patch".into(), "skill:backup".into()),
            ("agent".into(), "memory".into(), "memory:MEMORY.md".into()),
        ]
    );
    assert_eq!(entries[0].before, None);
    let created = log.blob(entries[0].after.as_ref().unwrap()).unwrap();
    assert_eq!(String::from_utf8(created).unwrap(), skill);
    assert_eq!(entries[1].before, entries[0].after);
    let memory = log.blob(entries[2].after.as_ref().unwrap()).unwrap();
    assert!(String::from_utf8(memory).unwrap().contains("db host"));

    // Undo the patch: back to nightly, and the undo is logged as yours.
    let said = rollback_skill(&library, "backup").unwrap();
    assert!(said.contains("before the patch"), "{said}");
    assert!(
        library
            .read("backup")
            .unwrap()
            .text
            .contains("pg_dump nightly")
    );
    let last = log.entries().pop().unwrap();
    assert_eq!(
        (last.actor.as_str(), last.action.as_str()),
        ("user", "rollback")
    );
    assert!(rollback_skill(&library, "nothing-here").is_err());
}
