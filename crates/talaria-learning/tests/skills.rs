//! The skills library on a real home folder, and the skill tools through
//! real agent turns against the mock LLM: validation of names and paths,
//! bundled and user skills, usage counts, the index cache across sessions,
//! and `/skill-name` invocations.

use crate::support;

use std::sync::Arc;

use chrono::Utc;
use talaria_agent::tools::Registry;
use talaria_agent::{Agent, NullObserver};
use talaria_core::Home;
use talaria_learning::skills::usage::SkillState;
use talaria_learning::skills::{Library, Origin, check_support_path, valid_name};
use talaria_learning::{invoke, skill_tools};
use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};
use tokio_util::sync::CancellationToken;

fn skill_md(name: &str, description: &str, body: &str) -> String {
    format!("---\nname: {name}\ndescription: {description}\n---\n{body}\n")
}

fn home() -> (tempfile::TempDir, Home) {
    support::home()
}

#[test]
fn names_and_paths_are_checked_before_anything_is_written() {
    for good in ["a", "deploy-api", "x1.2_b", "0day"] {
        assert!(valid_name(good), "{good}");
    }
    for bad in ["", "-a", "A", "a/b", "..", "a b", "é", &"a".repeat(65)] {
        assert!(!valid_name(bad), "{bad:?}");
    }
    for good in ["references/api.md", "scripts/run.sh", "assets/img/logo.png"] {
        assert!(check_support_path(good).is_ok(), "{good}");
    }
    for bad in [
        "notes.md",
        "SKILL.md",
        "references",
        "references/../../x",
        "../references/x",
        "/etc/passwd",
        "misc/x.md",
        "",
    ] {
        assert!(check_support_path(bad).is_err(), "{bad:?}");
    }

    let (_dir, home) = home();
    let lib = Library::new(&home);
    let now = Utc::now();
    let ok = skill_md("deploy", "Deploy the API.", "1. Build.\n2. Ship.");
    assert!(lib.create("Deploy", None, &ok, None, now).is_err());
    assert!(
        lib.create("deploy", Some("../out"), &ok, None, now)
            .is_err()
    );
    let mismatch = lib
        .create("deploy", None, &skill_md("other", "d", "b"), None, now)
        .unwrap_err();
    assert!(mismatch.0.contains("must match"), "{mismatch}");
    let huge = skill_md("deploy", "d", &"x".repeat(100_001));
    assert!(
        lib.create("deploy", None, &huge, None, now)
            .unwrap_err()
            .0
            .contains("100000")
    );
    assert!(
        !home.skills_dir().join("deploy").exists(),
        "nothing was written"
    );

    lib.create("deploy", Some("ops"), &ok, None, now).unwrap();
    assert!(home.skills_dir().join("ops/deploy/SKILL.md").is_file());
    // Support files stay under the four folders and inside the skill.
    lib.write_file("deploy", "references/hosts.md", "web-1\nweb-2\n", now)
        .unwrap();
    assert_eq!(
        lib.read_file("deploy", "references/hosts.md").unwrap(),
        "web-1\nweb-2\n"
    );
    for bad in ["../escape.md", "references/../../escape.md", "other/x.md"] {
        assert!(lib.write_file("deploy", bad, "x", now).is_err(), "{bad}");
    }
    let too_big = "x".repeat(1024 * 1024 + 1);
    assert!(
        lib.write_file("deploy", "assets/big.txt", &too_big, now)
            .is_err()
    );
    // A symlinked support folder pointing outside is an escape too.
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        outside.path(),
        home.skills_dir().join("ops/deploy/templates"),
    )
    .unwrap();
    let e = lib
        .write_file("deploy", "templates/t.md", "x", now)
        .unwrap_err();
    assert!(e.0.contains("leaves the skill folder"), "{e}");
    assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    // A patch that would break SKILL.md is refused and changes nothing.
    let e = lib
        .patch("deploy", None, "name: deploy", "name: renamed", false, now)
        .unwrap_err();
    assert!(e.0.contains("would break"), "{e}");
    assert!(lib.read("deploy").unwrap().text.contains("name: deploy"));
}

#[test]
fn bundled_skills_are_offered_read_only_and_a_user_skill_overrides_one() {
    let (_dir, home) = home();
    let lib = Library::new(&home);
    let listed = lib.list();
    let bundled: Vec<&str> = listed
        .iter()
        .filter(|s| s.origin == Origin::Bundled)
        .map(|s| s.name.as_str())
        .collect();
    assert!(bundled.contains(&"systematic-debugging"), "{bundled:?}");
    assert!(bundled.contains(&"writing-skills"), "{bundled:?}");
    let e = lib
        .edit(
            "git-workflow",
            &skill_md("git-workflow", "d", "b"),
            Utc::now(),
        )
        .unwrap_err();
    assert!(e.0.contains("bundled"), "{e}");
    assert!(lib.delete("git-workflow").is_err());
    // Creating one of the same name is refused; a hand-made one wins.
    assert!(
        lib.create(
            "git-workflow",
            None,
            &skill_md("git-workflow", "mine", "b"),
            None,
            Utc::now()
        )
        .is_err()
    );
    let mine = home.skills_dir().join("team/git-workflow");
    std::fs::create_dir_all(&mine).unwrap();
    std::fs::write(
        mine.join("SKILL.md"),
        skill_md("git-workflow", "Our own git rules.", "1. Rebase."),
    )
    .unwrap();
    let found = lib.find("git-workflow").unwrap();
    assert_eq!(found.origin, Origin::User);
    assert_eq!(found.description, "Our own git rules.");
    assert_eq!(found.category, "team");
}

fn agent(home: &Home, llm: &MockOpenAi, lib: Arc<Library>) -> Agent {
    let config = support::config(llm, |_| {});
    let mut registry = Registry::with_core_tools(&config);
    for tool in skill_tools(lib) {
        registry.register(tool).unwrap();
    }
    support::agent(
        &config,
        home,
        llm,
        support::store(home),
        registry,
        home.root(),
    )
}

fn system_prompt(llm: &MockOpenAi, request: usize) -> String {
    llm.requests()[request].body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn last_tool_result(llm: &MockOpenAi) -> serde_json::Value {
    tool_result_in(llm, llm.requests().len() - 1)
}

/// The last tool result in model request number `request`.
fn tool_result_in(llm: &MockOpenAi, request: usize) -> serde_json::Value {
    let messages = llm.requests()[request].body["messages"].clone();
    let text = messages
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_made_in_a_session_shows_in_the_next_sessions_index_only() {
    let (_dir, home) = home();
    let llm = MockOpenAi::start().await;
    let lib = Arc::new(Library::new(&home));
    let agent = agent(&home, &llm, lib.clone());
    let first = agent.new_session("cli").await.unwrap();
    let content = skill_md(
        "rotate-logs",
        "Rotate and compress the app logs when the disk fills.",
        "1. gzip logs older than a day.",
    );
    let args = serde_json::json!({"action": "create", "name": "rotate-logs", "category": "ops", "content": content});
    llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c1",
        "skill_manage",
        args.to_string(),
    )]));
    llm.push(Reply::text("Saved the procedure as a skill."));
    agent
        .run_turn(
            &first,
            "save that procedure",
            &NullObserver,
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(last_tool_result(&llm)["success"], true);
    // The session's prompt is the same before and after the write...
    let before = system_prompt(&llm, 0);
    assert_eq!(system_prompt(&llm, 1), before);
    assert!(
        before.contains("systematic-debugging"),
        "the bundled skills are indexed"
    );
    assert!(!before.contains("rotate-logs"));
    llm.push(Reply::text("ok"));
    agent
        .run_turn(&first, "and again", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        system_prompt(&llm, 2),
        before,
        "byte-stable within the session"
    );

    // ...and the next session's index has the new skill.
    let second = agent.new_session("cli").await.unwrap();
    llm.push(Reply::text("hello"));
    agent
        .run_turn(&second, "hi", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    let next = system_prompt(&llm, 3);
    assert!(
        next.contains("    - rotate-logs: Rotate and compress the app logs"),
        "{next}"
    );
    assert!(next.contains("  ops:"), "{next}");
    // The new skill is the user's, made here, not the agent's own accord.
    assert_eq!(lib.usage().get("rotate-logs").created_by, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tools_view_patch_add_files_and_delete_with_counts() {
    let (_dir, home) = home();
    let llm = MockOpenAi::start().await;
    let lib = Arc::new(Library::new(&home));
    lib.create(
        "brew-tea",
        None,
        &skill_md(
            "brew-tea",
            "Brew green tea.",
            "1. Water at 100 C.\n2. Steep 3 min.",
        ),
        None,
        Utc::now(),
    )
    .unwrap();
    let agent = agent(&home, &llm, lib.clone());
    let session = agent.new_session("cli").await.unwrap();
    let call = |id: &str, name: &str, args: serde_json::Value| {
        ToolCallReply::new(id, name, args.to_string())
    };
    llm.push(Reply::tool_calls(vec![call(
        "v",
        "skill_view",
        serde_json::json!({"name": "brew-tea"}),
    )]));
    llm.push(Reply::tool_calls(vec![call(
        "p",
        "skill_manage",
        serde_json::json!({"action": "patch", "name": "brew-tea", "old_string": "100 C", "new_string": "80 C"}),
    )]));
    llm.push(Reply::tool_calls(vec![call(
        "w",
        "skill_manage",
        serde_json::json!({"action": "write_file", "name": "brew-tea", "file_path": "references/teas.md", "file_content": "sencha: 70 C"}),
    )]));
    llm.push(Reply::tool_calls(vec![call(
        "f",
        "skill_view",
        serde_json::json!({"name": "brew-tea", "file_path": "references/teas.md"}),
    )]));
    llm.push(Reply::text("Fixed the temperature."));
    agent
        .run_turn(
            &session,
            "fix the tea skill",
            &NullObserver,
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let view = serde_json::from_str::<serde_json::Value>(
        llm.requests()[1].body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|m| m["role"] == "tool")
            .unwrap()["content"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert!(view["content"].as_str().unwrap().contains("Steep 3 min"));
    assert_eq!(last_tool_result(&llm)["content"], "sencha: 70 C");
    let skill = lib.read("brew-tea").unwrap();
    assert!(skill.text.contains("80 C") && !skill.text.contains("100 C"));
    assert_eq!(skill.files, ["references/teas.md"]);
    let usage = lib.usage().get("brew-tea");
    assert_eq!((usage.view_count, usage.patch_count), (2, 2), "{usage:?}");

    // Pinned skills cannot be deleted; unpinned ones can.
    lib.usage().change("brew-tea", |r| r.pinned = true);
    llm.push(Reply::tool_calls(vec![call(
        "d",
        "skill_manage",
        serde_json::json!({"action": "delete", "name": "brew-tea"}),
    )]));
    llm.push(Reply::text("It is pinned."));
    agent
        .run_turn(
            &session,
            "delete it",
            &NullObserver,
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert!(last_tool_result(&llm).to_string().contains("pinned"));
    lib.usage().change("brew-tea", |r| r.pinned = false);
    lib.delete("brew-tea").unwrap();
    assert!(lib.find("brew-tea").is_none());
    assert!(!home.skills_dir().join("brew-tea").exists());
}

#[test]
fn a_slash_invocation_loads_the_skill_with_the_instruction_and_counts_a_use() {
    let (_dir, home) = home();
    let lib = Library::new(&home);
    assert!(invoke::invocation(&lib, "nope", "").is_none());
    let message = invoke::invocation(&lib, "system-health", "only the disks").unwrap();
    assert!(message.starts_with("[The user invoked the \"system-health\" skill"));
    assert!(message.contains("df -hP"));
    assert!(message.ends_with("The user's instruction with the skill: only the disks"));
    assert_eq!(lib.usage().get("system-health").use_count, 1);
    // Archived skills leave the index but stay loadable by name.
    lib.usage()
        .change("system-health", |r| r.state = SkillState::Archived);
    assert!(!lib.index().contains("system-health"));
    assert!(lib.index().contains("git-workflow"));
}

/// A skill a person installed that declares `required_environment_variables`
/// gets exactly those variables into the session's commands once loaded
/// (from the home's `.env` here); one the agent wrote gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loaded_skill_gets_the_variables_it_declares_and_no_others() {
    let (_dir, home) = home();
    let llm = MockOpenAi::start().await;
    std::fs::write(
        home.dotenv_file(),
        "TALARIA_TEST_SKILL_TOKEN=skill-token-value-7777\nTALARIA_TEST_OTHER=other-value-8888\n",
    )
    .unwrap();
    let lib = Arc::new(Library::new(&home));
    let with_env = |name: &str, var: &str| {
        format!(
            "---\nname: {name}\ndescription: Deploys.\nrequired_environment_variables:\n  - {var}\n---\nRun the deploy.\n"
        )
    };
    lib.create(
        "deploy",
        None,
        &with_env("deploy", "TALARIA_TEST_SKILL_TOKEN"),
        None,
        Utc::now(),
    )
    .unwrap();
    lib.create(
        "sneaky",
        None,
        &with_env("sneaky", "TALARIA_TEST_OTHER"),
        Some("agent"),
        Utc::now(),
    )
    .unwrap();
    let agent = agent(&home, &llm, lib);
    let session = agent.new_session("cli").await.unwrap();
    let call = |id: &str, name: &str, args: serde_json::Value| {
        ToolCallReply::new(id, name, args.to_string())
    };
    // Lengths, not values: the redactor would hide the values anyway.
    let probe = serde_json::json!({
        "command": "echo token=${#TALARIA_TEST_SKILL_TOKEN} other=${#TALARIA_TEST_OTHER}"
    });
    llm.push(Reply::tool_calls(vec![call(
        "before",
        "terminal",
        probe.clone(),
    )]));
    llm.push(Reply::tool_calls(vec![call(
        "view",
        "skill_view",
        serde_json::json!({"name": "deploy"}),
    )]));
    llm.push(Reply::tool_calls(vec![call(
        "view2",
        "skill_view",
        serde_json::json!({"name": "sneaky"}),
    )]));
    llm.push(Reply::tool_calls(vec![call("after", "terminal", probe)]));
    llm.push(Reply::text("Deployed."));
    agent
        .run_turn(&session, "deploy", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    let result = |request: usize| tool_result_in(&llm, request);
    assert!(
        result(1)["output"]
            .as_str()
            .unwrap()
            .contains("token=0 other=0"),
        "{}",
        result(1)
    );
    let view = result(2);
    assert_eq!(
        view["required_environment_variables"][0],
        "TALARIA_TEST_SKILL_TOKEN"
    );
    assert!(
        view["environment"]
            .as_str()
            .unwrap()
            .starts_with("TALARIA_TEST_SKILL_TOKEN passed to commands"),
        "{view}"
    );
    let sneaky = result(3);
    assert!(
        sneaky["environment"]
            .as_str()
            .unwrap()
            .contains("written by the agent"),
        "{sneaky}"
    );
    let after = result(4);
    assert!(
        after["output"]
            .as_str()
            .unwrap()
            .contains("token=22 other=0"),
        "{after}"
    );
}
