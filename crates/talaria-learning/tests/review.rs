//! The background review through the mock LLM: a scripted review saves a
//! skill and a memory entry after the answer is returned; a review that
//! fails or hangs leaves turns alone; the review gets only the memory and
//! skill tools, must read a skill before changing it, and leaves no
//! session in the database.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use talaria_agent::tools::Registry;
use talaria_agent::{Agent, NullObserver, TurnExit};
use talaria_core::{Home, Redactor};
use talaria_learning::review::{BackgroundReview, Focus, ReviewParts};
use talaria_learning::skill_tools;
use talaria_learning::skills::Library;
use talaria_store::{SessionFilter, SessionStore, SqliteStore};
use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};
use tokio_util::sync::CancellationToken;

struct Rig {
    _dir: tempfile::TempDir,
    home: Home,
    llm: MockOpenAi,
    store: Arc<SqliteStore>,
    library: Arc<Library>,
    agent: Arc<Agent>,
    review: Arc<BackgroundReview>,
    lines: Arc<Mutex<Vec<(String, String)>>>,
}

async fn rig(memory_every: u32, skills_every: u32) -> Rig {
    let (dir, home) = support::home();
    let llm = MockOpenAi::start().await;
    let config = support::config(&llm, |c| {
        c.memory.nudge_interval = memory_every;
        c.skills.creation_nudge_interval = skills_every;
    });
    let provider = support::provider(&llm, &config);
    let store = support::store(&home);
    let library = Arc::new(Library::new(&home));
    let mut registry = Registry::with_core_tools(&config);
    for tool in skill_tools(library.clone()) {
        registry.register(tool).unwrap();
    }
    let agent = Arc::new(support::agent(
        &config,
        &home,
        &llm,
        store.clone(),
        registry,
        dir.path(),
    ));
    let lines: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let sink = lines.clone();
    let review = BackgroundReview::new(ReviewParts {
        config,
        home: home.clone(),
        provider,
        store: store.clone(),
        library: library.clone(),
        redactor: Redactor::default(),
        workdir: dir.path().to_path_buf(),
        notify: Arc::new(move |session: &str, line: &str| {
            sink.lock()
                .unwrap()
                .push((session.to_owned(), line.to_owned()))
        }),
    });
    agent.set_turn_hook(review.clone());
    Rig {
        _dir: dir,
        home,
        llm,
        store,
        library,
        agent,
        review,
        lines,
    }
}

fn skill_md(name: &str, body: &str) -> String {
    format!("---\nname: {name}\ndescription: How to {name}.\n---\n{body}\n")
}

fn call(id: &str, tool: &str, args: serde_json::Value) -> ToolCallReply {
    ToolCallReply::new(id, tool, args.to_string())
}

/// The tool results the review got, in order.
fn tool_results(llm: &MockOpenAi, request: usize) -> Vec<String> {
    llm.requests()[request].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_after_the_answer_saves_a_skill_and_a_memory_entry() {
    let rig = rig(1, 0).await;
    let session = rig.agent.new_session("cli").await.unwrap();
    rig.llm
        .push(Reply::text("Deployed with the blue-green script."));
    // The review: one batch writing both, then its closing words.
    rig.llm.push(
        Reply::tool_calls(vec![
            call(
                "m",
                "memory",
                serde_json::json!({"action": "add", "target": "user", "content": "Deploys go through the blue-green script."}),
            ),
            call(
                "s",
                "skill_manage",
                serde_json::json!({"action": "create", "name": "blue-green-deploy", "category": "ops", "content": skill_md("blue-green-deploy", "1. Run ./deploy --blue-green.")}),
            ),
        ])
        .with_delay(Duration::from_millis(500)),
    );
    rig.llm.push(Reply::text("Saved."));
    let outcome = rig
        .agent
        .run_turn(
            &session,
            "deploy it",
            &NullObserver,
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let returned = Instant::now();
    assert_eq!(outcome.answer, "Deployed with the blue-green script.");
    rig.review.idle().await;

    let requests = rig.llm.requests();
    assert_eq!(requests.len(), 3, "the turn, then the review's two calls");
    // The answer did not wait for the review: the turn returned before the
    // review's second call, which comes only after its first reply's
    // delay. (When the review's first call starts is up to the scheduler:
    // it is spawned as the turn ends.)
    assert!(
        returned < requests[2].at,
        "the answer was held back until the review had finished"
    );
    // The review read the conversation, answer included, and had only its
    // tools.
    let review_prompt = requests[1].body["messages"].to_string();
    assert!(review_prompt.contains("USER: deploy it"), "{review_prompt}");
    assert!(
        review_prompt.contains("Deployed with the blue-green script."),
        "{review_prompt}"
    );
    let mut tools: Vec<String> = requests[1].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect();
    tools.sort();
    assert_eq!(
        tools,
        ["memory", "skill_manage", "skill_view", "skills_list"]
    );

    let user_md = std::fs::read_to_string(rig.home.memories_dir().join("USER.md")).unwrap();
    assert!(user_md.contains("blue-green script"), "{user_md}");
    let skill = rig.library.read("blue-green-deploy").unwrap();
    assert_eq!(skill.info.category, "ops");
    assert_eq!(
        rig.library
            .usage()
            .get("blue-green-deploy")
            .created_by
            .as_deref(),
        Some("agent"),
        "the review's skills are the agent's own (the curator's to manage)"
    );
    let lines = rig.lines.lock().unwrap().clone();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].0, session.id);
    assert!(
        lines[0].1.contains("user profile updated")
            && lines[0].1.contains("skill `blue-green-deploy` created"),
        "{}",
        lines[0].1
    );
    // Both writes are in the learning log, as the review's.
    let logged: Vec<(String, String)> = rig
        .library
        .log()
        .entries()
        .into_iter()
        .map(|e| (e.actor, e.target))
        .collect();
    assert!(
        logged.contains(&("review".into(), "memory:USER.md".into())),
        "{logged:?}"
    );
    assert!(
        logged.contains(&("review".into(), "skill:blue-green-deploy".into())),
        "{logged:?}"
    );
    // Nothing of the review is in the database.
    let sessions = rig
        .store
        .list_sessions(SessionFilter::default())
        .await
        .unwrap();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_or_hanging_review_leaves_the_turns_alone() {
    let rig = rig(1, 0).await;
    let session = rig.agent.new_session("cli").await.unwrap();
    rig.llm.push(Reply::text("first answer"));
    rig.llm.push(Reply::error(
        500,
        r#"{"error":{"message":"review exploded"}}"#,
    ));
    let first = rig
        .agent
        .run_turn(&session, "one", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(first.answer, "first answer");
    assert_eq!(first.exit, TurnExit::Completed);
    rig.review.idle().await;
    assert!(rig.lines.lock().unwrap().is_empty());

    // A review that hangs: the next turn is answered at once all the same.
    rig.llm.push(Reply::text("second answer"));
    rig.llm
        .push(Reply::text("Nothing to save.").with_delay(Duration::from_secs(30)));
    rig.llm.push(Reply::text("third answer"));
    let started = Instant::now();
    let second = rig
        .agent
        .run_turn(&session, "two", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(second.answer, "second answer");
    // Wait for the hanging review's request, then take the next turn.
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.llm.requests().len() < 4 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let third = rig
        .agent
        .run_turn(&session, "three", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(third.answer, "third answer");
    assert!(started.elapsed() < Duration::from_secs(20));
    // The conversation holds the turns and nothing of the reviews.
    let rows = rig.store.messages(&session.id).await.unwrap();
    let text: Vec<&str> = rows.iter().map(|r| r.message.content.as_str()).collect();
    assert_eq!(
        text,
        [
            "one",
            "first answer",
            "two",
            "second answer",
            "three",
            "third answer"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_review_has_only_its_tools_and_must_read_before_it_writes() {
    let rig = rig(0, 1).await;
    let now = chrono::Utc::now();
    rig.library
        .create(
            "mine",
            None,
            &skill_md("mine", "1. The user's own."),
            None,
            now,
        )
        .unwrap();
    rig.library
        .create(
            "agents",
            None,
            &skill_md("agents", "1. Old step."),
            Some("agent"),
            now,
        )
        .unwrap();
    let session = rig.agent.new_session("cli").await.unwrap();
    rig.llm.push(Reply::text("done"));
    let marker = rig.home.root().join("ran-terminal");
    rig.llm.push(Reply::tool_calls(vec![
        call(
            "t",
            "terminal",
            serde_json::json!({"command": format!("touch {}", marker.display())}),
        ),
        call(
            "p1",
            "skill_manage",
            serde_json::json!({"action": "patch", "name": "agents", "old_string": "Old step", "new_string": "New step"}),
        ),
        call(
            "p2",
            "skill_manage",
            serde_json::json!({"action": "patch", "name": "mine", "old_string": "own", "new_string": "changed"}),
        ),
    ]));
    rig.llm.push(Reply::tool_calls(vec![call(
        "v",
        "skill_view",
        serde_json::json!({"name": "agents"}),
    )]));
    rig.llm.push(Reply::tool_calls(vec![call(
        "p3",
        "skill_manage",
        serde_json::json!({"action": "patch", "name": "agents", "old_string": "Old step", "new_string": "New step"}),
    )]));
    rig.llm.push(Reply::text("Patched."));
    rig.agent
        .run_turn(&session, "do it", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    rig.review.idle().await;

    let first = tool_results(&rig.llm, 2);
    assert!(
        first[0].contains("unknown tool") || first[0].contains("terminal"),
        "{}",
        first[0]
    );
    assert!(!marker.exists(), "no command ran");
    assert!(first[1].contains("read it first"), "{}", first[1]);
    assert!(
        first[2].contains("not written by the agent"),
        "{}",
        first[2]
    );
    assert!(rig.library.read("mine").unwrap().text.contains("own"));
    let last = tool_results(&rig.llm, 4);
    assert!(
        last.last().unwrap().contains("\"success\":true"),
        "{last:?}"
    );
    assert!(
        rig.library
            .read("agents")
            .unwrap()
            .text
            .contains("New step")
    );
    let lines = rig.lines.lock().unwrap().clone();
    assert!(lines[0].1.contains("skill `agents` updated"), "{lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_count_turns_and_calls_and_cron_sessions_are_never_reviewed() {
    let rig = rig(3, 0).await;
    let session = rig.agent.new_session("cli").await.unwrap();
    for i in 0..5 {
        rig.llm.push(Reply::text(format!("answer {i}")));
        if i == 2 {
            rig.llm.push(Reply::text("Nothing to save."));
        }
        rig.agent
            .run_turn(
                &session,
                &format!("q{i}"),
                &NullObserver,
                CancellationToken::new(),
            )
            .await
            .unwrap();
        rig.review.idle().await;
    }
    // Five turns and one review, after the third.
    assert_eq!(rig.llm.requests().len(), 6);
    assert!(
        rig.lines.lock().unwrap().is_empty(),
        "nothing saved, nothing said"
    );

    let cron = rig.agent.new_session("cron").await.unwrap();
    rig.llm.push(Reply::text("cron answer"));
    let outcome = rig
        .agent
        .run_turn(&cron, "scheduled", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(outcome.answer, "cron answer");
    assert_eq!(
        rig.review.review(&cron.id, Focus::Both).await.unwrap(),
        None,
        "cron sessions are not reviewed"
    );
    assert_eq!(rig.llm.requests().len(), 7);
}
