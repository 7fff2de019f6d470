//! `delegate_task` against the mock OpenAI server over HTTP: children run
//! at once with only the tools allowed them, the parent gets their reports
//! in task order, an interrupt stops every child, bad requests are refused,
//! and a background delegation reports through `Reports` after the turn.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_agent::background::{JobKind, JobReport, JobStart, Reports, ReportsSlot};
use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::delegate::{BLOCKED_TOOLS, DelegateBinding, DelegateTool};
use talaria_agent::tools::{Registry, Tool, ToolContext, ToolResult};
use talaria_agent::{Agent, AgentParts, TurnExit, TurnObserver};
use talaria_core::{Config, Endpoint, Home, Message, ProviderKind, Redactor, Role};
use talaria_store::{SessionStore, SqliteStore};
use talaria_testkit::wait::wait_for;
use talaria_testkit::{MockOpenAi, Recorded, Reply, ToolCallReply};
use tokio_util::sync::CancellationToken;

/// A tool that only has a name: stands in for the parent's tools a child
/// must not get.
struct Named(&'static str);

#[async_trait]
impl Tool for Named {
    fn name(&self) -> &str {
        self.0
    }
    fn description(&self) -> &str {
        "A stand-in."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {}})
    }
    async fn call(&self, _args: Value, _ctx: &ToolContext) -> ToolResult {
        Ok("stand-in".into())
    }
}

/// Records what the tool reports about background jobs.
#[derive(Default)]
struct Book {
    events: Mutex<Vec<(String, JobStart, Option<JobReport>)>>,
}

impl Book {
    fn events(&self) -> Vec<(String, JobStart, Option<JobReport>)> {
        self.events.lock().unwrap().clone()
    }
}

#[async_trait]
impl Reports for Book {
    async fn opened(&self, job: &JobStart) -> Result<(), String> {
        self.events
            .lock()
            .unwrap()
            .push(("opened".into(), job.clone(), None));
        Ok(())
    }
    async fn progress(&self, job: &JobStart, _text: &str) {
        self.events
            .lock()
            .unwrap()
            .push(("progress".into(), job.clone(), None));
    }
    async fn closed(&self, job: &JobStart, report: JobReport) {
        self.events
            .lock()
            .unwrap()
            .push(("closed".into(), job.clone(), Some(report)));
    }
    async fn dropped(&self, job: &JobStart) {
        self.events
            .lock()
            .unwrap()
            .push(("dropped".into(), job.clone(), None));
    }
}

/// Keeps the progress lines a turn reports.
#[derive(Default)]
struct Lines(Mutex<Vec<String>>);

impl Lines {
    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

impl TurnObserver for Lines {
    fn progress(&self, line: &str) {
        self.0.lock().unwrap().push(line.to_owned());
    }
}

struct Rig {
    mock: MockOpenAi,
    /// The server of `delegation.model`, when the rig has one.
    child_mock: Option<MockOpenAi>,
    _dir: tempfile::TempDir,
    workdir: PathBuf,
    store: Arc<SqliteStore>,
    agent: Arc<Agent>,
    tool: Arc<DelegateTool>,
    book: Arc<Book>,
}

fn endpoint(mock: &MockOpenAi) -> Endpoint {
    Endpoint {
        provider: ProviderKind::Custom,
        model: "test-model".into(),
        base_url: mock.base_url(),
        api_key: None,
    }
}

/// An agent with the core tools, stand-ins for `send_message` and
/// `execute_code`, and `delegate_task` bound to it; with `child_model`,
/// subagents talk to a second server.
async fn rig(configure: impl FnOnce(&mut Config), child_model: bool) -> Rig {
    let mock = MockOpenAi::start().await;
    let child_mock = if child_model {
        Some(MockOpenAi::start().await)
    } else {
        None
    };
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    home.ensure().unwrap();
    let workdir = dir.path().join("work");
    std::fs::create_dir_all(&workdir).unwrap();
    let mut config = Config::default();
    config.model.default = Some("test-model".into());
    config.model.base_url = Some(mock.base_url());
    configure(&mut config);
    let config = Arc::new(config);
    let store = Arc::new(SqliteStore::open(&home.state_db()).unwrap());
    let binding = DelegateBinding::new();
    let slot = ReportsSlot::new();
    let book = Arc::new(Book::default());
    slot.bind(book.clone());
    let child_provider = child_mock
        .as_ref()
        .map(|m| talaria_llm::provider_for(&endpoint(m), &config.agent));
    let tool = Arc::new(DelegateTool::new(binding.clone(), slot).with_provider(child_provider));
    let mut registry = Registry::with_core_tools(&config);
    registry.register(tool.clone()).unwrap();
    registry.register(Arc::new(Named("send_message"))).unwrap();
    registry.register(Arc::new(Named("execute_code"))).unwrap();
    let agent = Arc::new(Agent::new(AgentParts {
        config: config.clone(),
        home,
        provider: talaria_llm::provider_for(&endpoint(&mock), &config.agent),
        store: store.clone(),
        registry: Arc::new(registry),
        interaction: Arc::new(NoHuman),
        redactor: Redactor::default(),
        workdir: workdir.clone(),
    }));
    binding.bind(&agent);
    Rig {
        mock,
        child_mock,
        _dir: dir,
        workdir,
        store,
        agent,
        tool,
        book,
    }
}

fn delegate(id: &str, args: Value) -> Reply {
    Reply::tool_calls(vec![ToolCallReply::new(
        id,
        "delegate_task",
        args.to_string(),
    )])
}

/// The names of the tools a request offered.
fn offered(request: &Recorded) -> BTreeSet<String> {
    request.body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The first user message of a request.
fn first_user_text(request: &Recorded) -> String {
    request.body["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn is_child(request: &Recorded) -> bool {
    first_user_text(request).contains("You are a subagent")
}

/// The parsed result of the parent's `delegate_task` call `call_id`, as
/// stored in the parent's transcript.
async fn stored_result(r: &Rig, session: &str, call_id: &str) -> Value {
    let rows: Vec<Message> = r
        .store
        .messages(session)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.message)
        .collect();
    let row = rows
        .iter()
        .find(|m| m.role == Role::Tool && m.tool_call_id.as_deref() == Some(call_id))
        .unwrap_or_else(|| panic!("no result for {call_id} in {rows:#?}"));
    serde_json::from_str(&row.content).unwrap_or_else(|_| json!({"raw": row.content}))
}

#[tokio::test]
async fn a_batch_of_three_runs_concurrently_with_only_the_allowed_tools() {
    let r = rig(|_| {}, false).await;
    r.mock.push(delegate(
        "d1",
        json!({"tasks": [
            {"goal": "TASK-ALPHA: survey the logs"},
            {"goal": "TASK-BRAVO: read the notes", "toolsets": ["file"]},
            {"goal": "TASK-CHARLIE: check the build", "context": "it lives in ./build"}
        ]}),
    ));
    r.mock.push(Reply::text("All three reported."));
    let delay = Duration::from_secs(2);
    for (needle, answer) in [
        ("TASK-ALPHA", "alpha report"),
        ("TASK-BRAVO", "bravo report"),
        ("TASK-CHARLIE", "charlie report"),
    ] {
        r.mock
            .push_when(needle, Reply::text(answer).with_delay(delay));
    }
    let parent = r.agent.new_session("test").await.unwrap();
    let out = r
        .agent
        .run_turn(
            &parent,
            "split the work",
            &Lines::default(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(out.exit, TurnExit::Completed, "{out:?}");
    assert_eq!(out.answer, "All three reported.");

    let requests = r.mock.requests();
    assert_eq!(requests.len(), 5, "two parent requests and three children");
    let children: Vec<&Recorded> = requests.iter().filter(|q| is_child(q)).collect();
    assert_eq!(children.len(), 3);
    // Every child asked before any child could have been answered: their
    // waits on the delayed replies overlap.
    let first = children.iter().map(|q| q.at).min().unwrap();
    let last = children.iter().map(|q| q.at).max().unwrap();
    assert!(
        last < first + delay,
        "the children asked one after another: {:?} apart",
        last - first
    );

    let parent_tools = offered(&requests[0]);
    for blocked in BLOCKED_TOOLS {
        assert!(parent_tools.contains(blocked), "the parent lacks {blocked}");
    }
    let inherited: BTreeSet<String> = parent_tools
        .iter()
        .filter(|t| !BLOCKED_TOOLS.contains(&t.as_str()))
        .cloned()
        .collect();
    let file_tools: BTreeSet<String> = ["patch", "read_file", "search_files", "write_file"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    for child in &children {
        let tools = offered(child);
        if first_user_text(child).contains("TASK-BRAVO") {
            assert_eq!(tools, file_tools);
        } else {
            assert_eq!(tools, inherited);
            assert!(tools.contains("terminal"));
        }
    }
    let charlie = children
        .iter()
        .find(|q| first_user_text(q).contains("TASK-CHARLIE"))
        .unwrap();
    assert!(first_user_text(charlie).contains("it lives in ./build"));

    // The parent's final request holds the three reports, in task order.
    let last_request = requests.last().unwrap();
    assert!(!is_child(last_request));
    let messages = last_request.body["messages"].as_array().unwrap();
    let tool_row = messages.last().unwrap();
    assert_eq!(tool_row["role"], "tool");
    let result: Value = serde_json::from_str(tool_row["content"].as_str().unwrap()).unwrap();
    let entries = result["results"].as_array().unwrap();
    let summaries: Vec<&str> = entries
        .iter()
        .map(|e| e["summary"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        summaries,
        ["alpha report", "bravo report", "charlie report"]
    );
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e["task_index"], i);
        assert_eq!(e["status"], "completed", "{e}");
        assert_eq!(e["api_calls"], 1);
        // Each child has its own stored session under the parent's.
        let id = e["session_id"].as_str().unwrap();
        let child = r.store.session(id).await.unwrap().unwrap();
        assert_eq!(child.source, "subagent");
        assert_eq!(child.parent_session_id.as_deref(), Some(parent.id.as_str()));
        assert!(child.ended_at.is_some());
        assert_eq!(child.end_reason.as_deref(), Some("subagent_completed"));
    }
}

#[tokio::test]
async fn an_interrupt_during_the_batch_stops_every_child() {
    let r = rig(|_| {}, false).await;
    r.mock.push(delegate(
        "d1",
        json!({"tasks": [
            {"goal": "TASK-ONE: wait"},
            {"goal": "TASK-TWO: wait"},
            {"goal": "TASK-THREE: wait"}
        ]}),
    ));
    r.mock.push(Reply::text("must not be requested"));
    for needle in ["TASK-ONE", "TASK-TWO", "TASK-THREE"] {
        r.mock.push_when(
            needle,
            Reply::text("too late").with_delay(Duration::from_secs(120)),
        );
    }
    let parent = r.agent.new_session("test").await.unwrap();
    let cancel = CancellationToken::new();
    let pressed = cancel.clone();
    let watched = r.mock.requests().len();
    let mock_requests = {
        let r = &r;
        move || async move {
            let n = r.mock.requests().len();
            if n >= watched + 4 { Ok(()) } else { Err(n) }
        }
    };
    let observer = Lines::default();
    let turn = r
        .agent
        .run_turn(&parent, "do three slow things", &observer, cancel);
    let press = async {
        wait_for("the three children to ask the model", mock_requests).await;
        pressed.cancel();
    };
    let (out, ()) =
        tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(turn, press) })
            .await
            .expect("the interrupted turn never returned");
    let out = out.unwrap();
    assert_eq!(out.exit, TurnExit::Interrupted, "{out:?}");

    let result = stored_result(&r, &parent.id, "d1").await;
    let entries = result["results"].as_array().expect("a result per task");
    assert_eq!(entries.len(), 3);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e["task_index"], i);
        assert_eq!(e["status"], "interrupted", "{e}");
        let id = e["session_id"].as_str().unwrap();
        let child = r.store.session(id).await.unwrap().unwrap();
        assert!(child.ended_at.is_some(), "child {id} was left open");
        assert_eq!(child.end_reason.as_deref(), Some("subagent_interrupted"));
    }
    // Nothing keeps running: every child hung up on its model call (one
    // left running would still be waiting for its two-minute reply), and
    // neither a child nor the parent asked the model again.
    let hung_up = {
        let r = &r;
        move || async move {
            let n = r.mock.hung_up();
            if n == 3 { Ok(()) } else { Err(n) }
        }
    };
    wait_for("the three children to hang up on the model", hung_up).await;
    assert_eq!(
        r.mock.requests().len(),
        4,
        "a model call after the interrupt"
    );
    assert_eq!(r.mock.pending(), 1, "the parent's next request was made");
}

#[tokio::test]
async fn bad_requests_are_refused_with_the_reason() {
    let r = rig(|c| c.delegation.max_concurrent = 2, false).await;
    let calls = vec![
        ToolCallReply::new(
            "over",
            "delegate_task",
            json!({"tasks": [{"goal": "a"}, {"goal": "b"}, {"goal": "c"}]}).to_string(),
        ),
        ToolCallReply::new("none", "delegate_task", json!({"context": "x"}).to_string()),
        ToolCallReply::new(
            "toolset",
            "delegate_task",
            json!({"goal": "a", "toolsets": ["files"]}).to_string(),
        ),
        ToolCallReply::new(
            "role",
            "delegate_task",
            json!({"goal": "a", "role": "boss"}).to_string(),
        ),
        ToolCallReply::new(
            "batch_bg",
            "delegate_task",
            json!({"tasks": [{"goal": "a"}, {"goal": "b"}], "background": true}).to_string(),
        ),
        ToolCallReply::new(
            "no_goal",
            "delegate_task",
            json!({"tasks": [{"context": "only"}]}).to_string(),
        ),
    ];
    r.mock.push(Reply::tool_calls(calls));
    r.mock.push(Reply::text("understood"));
    let parent = r.agent.new_session("test").await.unwrap();
    let out = r
        .agent
        .run_turn(
            &parent,
            "delegate badly",
            &Lines::default(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(out.exit, TurnExit::Completed);
    // No subagent ever asked the model.
    assert_eq!(r.mock.requests().len(), 2);
    for (call, expected) in [
        ("over", "too many tasks: 3 given, at most 2"),
        ("none", "give `goal`"),
        ("toolset", "unknown toolset `files`"),
        ("role", "`role` must be"),
        ("batch_bg", "`background` runs a single task"),
        ("no_goal", "`tasks[0].goal` is required"),
    ] {
        let result = stored_result(&r, &parent.id, call).await;
        let error = result["error"].as_str().unwrap_or_default();
        assert!(error.contains(expected), "{call}: {result}");
    }
}

#[tokio::test]
async fn the_children_s_tool_calls_reach_the_parent_s_observer() {
    let r = rig(|_| {}, false).await;
    std::fs::write(r.workdir.join("notes.txt"), "remember the milk\n").unwrap();
    r.mock.push(delegate(
        "d1",
        json!({"tasks": [{"goal": "TASK-ONE: read notes"}, {"goal": "TASK-TWO: run echo"}]}),
    ));
    r.mock.push(Reply::text("done"));
    r.mock.push_when(
        "TASK-ONE",
        Reply::tool_calls(vec![ToolCallReply::new(
            "c1",
            "read_file",
            r#"{"path": "notes.txt"}"#,
        )]),
    );
    r.mock
        .push_when("TASK-ONE", Reply::text("the notes say milk"));
    r.mock.push_when(
        "TASK-TWO",
        Reply::tool_calls(vec![ToolCallReply::new(
            "c2",
            "terminal",
            r#"{"command": "echo   from the   second child"}"#,
        )]),
    );
    r.mock.push_when("TASK-TWO", Reply::text("echo worked"));
    let parent = r.agent.new_session("test").await.unwrap();
    let lines = Lines::default();
    let out = r
        .agent
        .run_turn(&parent, "go", &lines, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.exit, TurnExit::Completed);
    let lines = lines.all();
    assert!(
        lines.contains(&"↳ [1/2] read_file: notes.txt".to_owned()),
        "{lines:#?}"
    );
    assert!(
        lines.contains(&"↳ [2/2] terminal: echo from the second child".to_owned()),
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("✓ [1/2] completed")),
        "{lines:#?}"
    );
    let result = stored_result(&r, &parent.id, "d1").await;
    assert_eq!(result["results"][0]["summary"], "the notes say milk");
    assert_eq!(result["results"][0]["tool_calls"], 1);
    assert_eq!(result["results"][1]["summary"], "echo worked");
    // The read really happened, in the parent's working directory.
    let child_requests: Vec<Recorded> = r
        .mock
        .requests()
        .into_iter()
        .filter(|q| first_user_text(q).contains("TASK-ONE"))
        .collect();
    let tool_row = child_requests
        .iter()
        .filter_map(|q| q.body["messages"].as_array())
        .flatten()
        .find(|m| m["role"] == "tool")
        .expect("the child's second request carries the file");
    assert!(
        tool_row["content"]
            .as_str()
            .unwrap()
            .contains("remember the milk")
    );
}

#[tokio::test]
async fn a_background_delegation_returns_at_once_and_reports_when_done() {
    let r = rig(|_| {}, true).await;
    let child_mock = r.child_mock.as_ref().unwrap();
    child_mock.push(Reply::text("background report"));
    r.mock.push(delegate(
        "d1",
        json!({"goal": "TASK-BG: index the docs", "context": "docs are in ./docs", "background": true}),
    ));
    r.mock.push(Reply::text("Started it."));
    let parent = r.agent.new_session("test").await.unwrap();
    let out = r
        .agent
        .run_turn(
            &parent,
            "do it in the background",
            &Lines::default(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(out.answer, "Started it.");
    let started = stored_result(&r, &parent.id, "d1").await;
    assert_eq!(started["status"], "started", "{started}");
    let id = started["delegation_id"].as_str().unwrap().to_owned();

    let book = r.book.clone();
    let events = wait_for("the background delegation to report", || {
        let book = book.clone();
        async move {
            let events = book.events();
            if events.iter().any(|(what, _, _)| what == "closed") {
                Ok(events)
            } else {
                Err(events)
            }
        }
    })
    .await;
    let kinds: Vec<&str> = events.iter().map(|(w, _, _)| w.as_str()).collect();
    assert_eq!(kinds, ["opened", "closed"]);
    let (_, job, report) = &events[1];
    assert_eq!(job.id, id);
    assert_eq!(job.kind, JobKind::Delegation);
    assert_eq!(job.session_id, parent.id);
    assert_eq!(job.title, "TASK-BG: index the docs");
    let report = report.as_ref().unwrap();
    assert_eq!(
        report.text,
        "🔀 Delegated task finished: TASK-BG: index the docs\n\nbackground report"
    );
    let follow_up = report.follow_up.as_deref().unwrap();
    assert!(follow_up.contains("docs are in ./docs"), "{follow_up}");
    assert!(follow_up.contains("background report"), "{follow_up}");
    // The subagent talked to the delegation model's server only.
    assert_eq!(child_mock.requests().len(), 1);
    assert!(is_child(&child_mock.requests()[0]));
    assert!(r.mock.requests().iter().all(|q| !is_child(q)));
    r.tool.shutdown().await;
    assert_eq!(r.tool.background_running(), 0);
}

#[tokio::test]
async fn shutdown_stops_a_background_delegation_and_reports_it() {
    let r = rig(|_| {}, false).await;
    r.mock.push(delegate(
        "call-bg-1",
        json!({"goal": "TASK-SLOW: take forever", "background": true}),
    ));
    // The parent's second request holds the goal too (in its call): its
    // answer is reserved first, for the request carrying the call's id.
    r.mock.push_when("call-bg-1", Reply::text("Started."));
    r.mock.push_when(
        "TASK-SLOW",
        Reply::text("never").with_delay(Duration::from_secs(120)),
    );
    let parent = r.agent.new_session("test").await.unwrap();
    let out = r
        .agent
        .run_turn(
            &parent,
            "start it",
            &Lines::default(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    // The turn is over while the subagent still waits on its model.
    assert_eq!(out.answer, "Started.");
    let book = r.book.clone();
    let mock = &r.mock;
    wait_for("the subagent to ask its model", || {
        let asked: Vec<String> = mock.requests().iter().map(first_user_text).collect();
        let events = book.events().len();
        async move {
            if asked
                .iter()
                .filter(|t| t.contains("You are a subagent"))
                .count()
                == 1
            {
                Ok(())
            } else {
                Err((asked, events))
            }
        }
    })
    .await;
    let kinds: Vec<String> = book.events().into_iter().map(|(w, _, _)| w).collect();
    assert_eq!(kinds, ["opened"]);
    assert_eq!(r.tool.background_running(), 1);

    tokio::time::timeout(Duration::from_secs(60), r.tool.shutdown())
        .await
        .expect("shutdown waited for the subagent's model");
    let events = book.events();
    assert_eq!(events.len(), 2, "{:?}", events.len());
    let report = events[1].2.as_ref().unwrap();
    assert!(
        report.text.contains("stopped before it finished"),
        "{}",
        report.text
    );
    assert_eq!(report.follow_up, None);
    assert_eq!(r.tool.background_running(), 0);

    // After shutdown, nothing new starts in the background.
    r.mock.push(delegate(
        "d2",
        json!({"goal": "TASK-LATE: too late", "background": true}),
    ));
    r.mock.push(Reply::text("ok"));
    r.agent
        .run_turn(
            &parent,
            "again",
            &Lines::default(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let refused = stored_result(&r, &parent.id, "d2").await;
    assert!(
        refused["error"]
            .as_str()
            .unwrap_or_default()
            .contains("shutting down"),
        "{refused}"
    );
}

/// Runs one child whose single command is `rm -rf victim` in a rig made
/// with `auto_approve`; returns whether `victim` survived and what the
/// command's result said to the child.
async fn child_deletes(auto_approve: bool) -> (bool, String) {
    let r = rig(|c| c.delegation.subagent_auto_approve = auto_approve, false).await;
    let victim = r.workdir.join("victim");
    std::fs::create_dir_all(victim.join("inside")).unwrap();
    r.mock
        .push(delegate("d1", json!({"goal": "TASK-RM: clean up"})));
    r.mock.push_when(
        "TASK-RM",
        Reply::tool_calls(vec![ToolCallReply::new(
            "c1",
            "terminal",
            json!({"command": format!("rm -rf {}", victim.display())}).to_string(),
        )]),
    );
    r.mock.push_when("TASK-RM", Reply::text("tried"));
    r.mock.push(Reply::text("ok"));
    let parent = r.agent.new_session("test").await.unwrap();
    r.agent
        .run_turn(&parent, "go", &Lines::default(), CancellationToken::new())
        .await
        .unwrap();
    let said = r
        .mock
        .requests()
        .iter()
        .filter(|q| first_user_text(q).contains("TASK-RM"))
        .filter_map(|q| q.body["messages"].as_array().cloned())
        .flatten()
        .find(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .expect("the child was told how its command went");
    (victim.exists(), said)
}

#[tokio::test]
async fn a_child_s_dangerous_command_is_refused_unless_auto_approve_is_on() {
    let (survived, said) = child_deletes(false).await;
    assert!(survived, "the command ran without approval: {said}");
    assert!(said.contains("BLOCKED"), "{said}");

    let (survived, said) = child_deletes(true).await;
    assert!(!survived, "auto-approve did not let it run: {said}");
}

#[tokio::test]
async fn a_child_that_spends_its_steps_reports_how_far_it_got() {
    let r = rig(|c| c.delegation.max_iterations = 1, false).await;
    std::fs::write(r.workdir.join("a.txt"), "a").unwrap();
    r.mock.push(delegate(
        "d1",
        json!({"goal": "TASK-LONG: read everything"}),
    ));
    r.mock.push_when(
        "TASK-LONG",
        Reply::tool_calls(vec![ToolCallReply::new(
            "c1",
            "read_file",
            r#"{"path": "a.txt"}"#,
        )]),
    );
    r.mock
        .push_when("TASK-LONG", Reply::text("read a.txt, the rest remains"));
    r.mock.push(Reply::text("ok"));
    let parent = r.agent.new_session("test").await.unwrap();
    r.agent
        .run_turn(&parent, "go", &Lines::default(), CancellationToken::new())
        .await
        .unwrap();
    let result = stored_result(&r, &parent.id, "d1").await;
    let entry = &result["results"][0];
    assert_eq!(entry["status"], "budget_exhausted", "{entry}");
    assert_eq!(entry["summary"], "read a.txt, the rest remains");
    assert_eq!(entry["api_calls"], 2);
    // The summary request offered no tools: the budget was the child's.
    let child_requests: Vec<Recorded> = r
        .mock
        .requests()
        .into_iter()
        .filter(|q| first_user_text(q).contains("TASK-LONG") && is_child(q))
        .collect();
    assert_eq!(child_requests.len(), 2);
    assert!(offered(&child_requests[1]).is_empty());
}
