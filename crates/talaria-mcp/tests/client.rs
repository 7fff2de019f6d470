//! The MCP client against a real MCP server process (the
//! `talaria-mcp-fixture` binary), over stdio and over Streamable HTTP on
//! 127.0.0.1: listing across pages, calls, timeouts, crashes and restarts,
//! cancellation, list-changed notifications, filters, `${VAR}` secrets,
//! and a whole agent turn against the mock LLM calling an MCP tool.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::{Registry, ToolSource};
use talaria_agent::{Agent, AgentParts, NullObserver};
use talaria_core::config::McpServerConfig;
use talaria_core::{Config, Endpoint, Env, Home, ProviderKind, Redactor};
use talaria_mcp::{CallError, Health, McpManager, McpServer};
use talaria_store::SqliteStore;
use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;

const FIXTURE: &str = env!("CARGO_BIN_EXE_talaria-mcp-fixture");
const WAIT: Duration = Duration::from_secs(20);

struct State {
    dir: tempfile::TempDir,
}

impl State {
    fn new() -> State {
        State {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The lines of one of the fixture's record files.
    fn lines(&self, file: &str) -> Vec<String> {
        std::fs::read_to_string(self.path().join(file))
            .map(|t| t.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// Waits until `file` has at least `n` lines.
    async fn wait_lines(&self, file: &str, n: usize) -> Vec<String> {
        let deadline = Instant::now() + WAIT;
        loop {
            let lines = self.lines(file);
            if lines.len() >= n {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "{file} has {lines:?}, wanted {n} lines"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A stdio server config for the fixture recording into this state.
    fn stdio(&self) -> McpServerConfig {
        let mut env = BTreeMap::new();
        env.insert(
            "FIXTURE_STATE_DIR".to_owned(),
            self.path().display().to_string(),
        );
        McpServerConfig {
            command: Some(FIXTURE.to_owned()),
            args: vec!["stdio".into()],
            env,
            timeout: 10,
            connect_timeout: 15,
            ..McpServerConfig::default()
        }
    }
}

fn server(config: McpServerConfig) -> Arc<McpServer> {
    Arc::new(McpServer::new("fix", config, Env::default()))
}

fn args(v: Value) -> serde_json::Map<String, Value> {
    match v {
        Value::Object(map) => map,
        _ => unreachable!("test arguments are objects"),
    }
}

fn text_of(result: &Value) -> String {
    talaria_mcp::tool::render_result(result)
}

/// Calls `tool` and returns its text, failing the test on an error.
async fn ok(fix: &McpServer, tool: &str, arguments: Value) -> String {
    let result = fix
        .call(tool, args(arguments), &CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    text_of(&result)
}

/// A manager over these servers, as a configuration would list them.
fn manager(servers: BTreeMap<String, McpServerConfig>) -> Arc<McpManager> {
    let config = Config {
        mcp_servers: servers,
        ..Config::default()
    };
    McpManager::new(&config, &Env::default())
}

fn alive(pid: &str) -> bool {
    // A zombie still has a /proc entry; its state letter says it is gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            let state = stat.rsplit(") ").next().and_then(|r| r.chars().next());
            !matches!(state, Some('Z') | Some('X'))
        })
        .unwrap_or(false)
}

#[tokio::test]
async fn tools_are_listed_across_pages_and_called() {
    let state = State::new();
    let mut config = state.stdio();
    config.env.insert("FIXTURE_EXTRA_TOOLS".into(), "8".into());
    let fix = server(config);
    let tools = fix.tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    // Seven built into the fixture and eight extras: three pages of five.
    assert_eq!(tools.len(), 15, "{names:?}");
    assert!(
        names.contains(&"echo") && names.contains(&"extra_7"),
        "{names:?}"
    );
    assert_eq!(ok(&fix, "echo", json!({"text": "hi"})).await, "echo: hi");
    assert_eq!(ok(&fix, "add", json!({"a": 2, "b": 3})).await, "5");
    // A refusal by the server is an error naming it, not a crash.
    let refused = fix
        .call("no_such_tool", args(json!({})), &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(refused, CallError::Refused { .. }), "{refused:?}");
    assert_eq!(
        state.lines("starts.log").len(),
        1,
        "one process for all of it"
    );
    // All of it on one connection, which the server's health shows.
    assert!(matches!(
        fix.health().await,
        Health::Connected { tools: 15 }
    ));
}

#[tokio::test]
async fn a_slow_call_times_out_and_is_cancelled_at_the_server() {
    let state = State::new();
    let mut config = state.stdio();
    config.timeout = 1;
    let fix = server(config);
    let started = Instant::now();
    let e = fix
        .call(
            "slow",
            args(json!({"seconds": 30})),
            &CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, CallError::Timeout { secs: 1, .. }), "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(state.wait_lines("cancelled.log", 1).await, ["slow"]);
    // The server is still fine for the next call.
    assert_eq!(
        ok(&fix, "echo", json!({"text": "after"})).await,
        "echo: after"
    );
}

#[tokio::test]
async fn an_interrupt_cancels_a_long_call() {
    let state = State::new();
    let fix = server(state.stdio());
    fix.connect().await.unwrap();
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        trigger.cancel();
    });
    let started = Instant::now();
    let e = fix
        .call("slow", args(json!({"seconds": 30})), &cancel)
        .await
        .unwrap_err();
    assert_eq!(e, CallError::Cancelled);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(state.wait_lines("cancelled.log", 1).await, ["slow"]);
}

#[tokio::test]
async fn a_crashed_server_is_started_again_on_next_use() {
    let state = State::new();
    let fix = server(state.stdio());
    fix.connect().await.unwrap();
    let first = state.wait_lines("starts.log", 1).await;
    let e = fix
        .call("crash", args(json!({})), &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        matches!(e, CallError::Died { .. } | CallError::Refused { .. }),
        "{e:?}"
    );
    let deadline = Instant::now() + WAIT;
    while alive(&first[0]) {
        assert!(Instant::now() < deadline, "the crashed fixture still runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The next call starts a new process and succeeds.
    assert_eq!(
        ok(&fix, "echo", json!({"text": "back"})).await,
        "echo: back"
    );
    let starts = state.lines("starts.log");
    assert_eq!(starts.len(), 2, "{starts:?}");
    assert_ne!(starts[0], starts[1]);
}

#[tokio::test]
async fn a_server_that_cannot_start_is_retried_with_backoff_not_every_turn() {
    let state = State::new();
    let mut config = state.stdio();
    config.command = Some(state.path().join("no-such-program").display().to_string());
    let broken = server(config);
    let e = broken.tools().await.unwrap_err();
    assert!(e.contains("cannot start"), "{e}");
    // The first retry is immediate; after a second failure it waits.
    assert!(broken.tools().await.is_err());
    let e = broken.tools().await.unwrap_err();
    assert!(e.contains("next attempt in"), "{e}");
    assert!(matches!(
        broken.health().await,
        Health::Failing { failures: 2, .. }
    ));
}

#[tokio::test]
async fn a_list_changed_notification_is_picked_up_before_the_next_use() {
    let state = State::new();
    let fix = server(state.stdio());
    assert!(!fix.tools().await.unwrap().iter().any(|t| t.name == "fresh"));
    fix.call(
        "grow",
        args(json!({"name": "fresh"})),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        if fix.tools().await.unwrap().iter().any(|t| t.name == "fresh") {
            break;
        }
        assert!(Instant::now() < deadline, "the new tool never showed up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ok(&fix, "fresh", json!({"text": "new"})).await, "echo: new");
}

#[tokio::test]
async fn include_and_exclude_filters_decide_what_the_agent_sees() {
    let state = State::new();
    let mut config = state.stdio();
    config.tools.include = vec!["echo".into(), "add".into(), "slow".into()];
    config.tools.exclude = vec!["slow".into()];
    let mut servers = BTreeMap::new();
    servers.insert("fix".to_owned(), config);
    let manager = manager(servers);
    let mut names: Vec<String> = manager
        .tools()
        .await
        .iter()
        .map(|t| t.name().to_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["mcp__fix__add", "mcp__fix__echo"]);
    manager.shutdown().await;
}

#[tokio::test]
async fn env_values_take_secrets_from_variables_and_nothing_else_leaks() {
    let state = State::new();
    let mut config = state.stdio();
    config
        .env
        .insert("FIXTURE_SECRET".into(), "${MY_MCP_SECRET}".into());
    let env = Env::from_pairs([("MY_MCP_SECRET", "s3cr3t-value")]);
    let fix = Arc::new(McpServer::new("fix", config.clone(), env));
    fix.connect().await.unwrap();
    assert_eq!(
        state.wait_lines("env.log", 1).await,
        ["secret=s3cr3t-value"]
    );
    fix.shutdown().await;

    // A variable that is not set stops the start with its name.
    let missing = server(config);
    let e = missing.connect().await.unwrap_err();
    assert!(e.contains("MY_MCP_SECRET"), "{e}");
}

#[tokio::test]
async fn lazy_servers_start_on_first_use_and_all_stop_with_the_manager() {
    let eager = State::new();
    let lazy = State::new();
    let mut servers = BTreeMap::new();
    servers.insert("eager".to_owned(), eager.stdio());
    let mut lazy_config = lazy.stdio();
    lazy_config.lazy = true;
    servers.insert("lazy".to_owned(), lazy_config);
    let manager = manager(servers);
    manager.start_eager();
    let eager_pid = eager.wait_lines("starts.log", 1).await[0].clone();
    assert!(lazy.lines("starts.log").is_empty(), "lazy started early");
    let tools = manager.tools().await;
    assert!(tools.iter().any(|t| t.name() == "mcp__lazy__echo"));
    let lazy_pid = lazy.wait_lines("starts.log", 1).await[0].clone();

    manager.shutdown().await;
    let deadline = Instant::now() + WAIT;
    while alive(&eager_pid) || alive(&lazy_pid) {
        assert!(Instant::now() < deadline, "a server outlived the manager");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_reload_restarts_changed_servers_and_stops_removed_ones() {
    let a = State::new();
    let b = State::new();
    let mut servers = BTreeMap::new();
    servers.insert("a".to_owned(), a.stdio());
    servers.insert("b".to_owned(), b.stdio());
    let mut config = Config {
        mcp_servers: servers,
        ..Config::default()
    };
    let manager = McpManager::new(&config, &Env::default());
    manager.start_eager();
    let b_pid = b.wait_lines("starts.log", 1).await[0].clone();
    a.wait_lines("starts.log", 1).await;

    config.mcp_servers.remove("b");
    if let Some(a_config) = config.mcp_servers.get_mut("a") {
        a_config.tools.exclude = vec!["crash".into()];
    }
    let report = manager.reload(&config, &Env::default()).await;
    assert_eq!(report.removed, ["b"]);
    assert_eq!(report.changed, ["a"]);
    let deadline = Instant::now() + WAIT;
    while alive(&b_pid) {
        assert!(Instant::now() < deadline, "the removed server still runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.wait_lines("starts.log", 2).await;
    let names: Vec<String> = manager
        .tools()
        .await
        .iter()
        .map(|t| t.name().to_owned())
        .collect();
    assert!(!names.iter().any(|n| n == "mcp__a__crash"), "{names:?}");
    assert!(
        !names.iter().any(|n| n.starts_with("mcp__b__")),
        "{names:?}"
    );
    manager.shutdown().await;
}

/// The fixture serving Streamable HTTP on an ephemeral port, killed on drop.
struct HttpFixture {
    child: tokio::process::Child,
    url: String,
}

impl HttpFixture {
    async fn start(state: &State) -> HttpFixture {
        let mut child = tokio::process::Command::new(FIXTURE)
            .args(["http", "0"])
            .env("FIXTURE_STATE_DIR", state.path())
            .env("FIXTURE_REQUIRE_TOKEN", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let url = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        HttpFixture { child, url }
    }
}

#[tokio::test]
async fn streamable_http_servers_list_and_call_with_a_bearer_token_from_env() {
    let state = State::new();
    let mut fixture = HttpFixture::start(&state).await;
    let mut headers = BTreeMap::new();
    headers.insert("Authorization".to_owned(), "Bearer ${FIX_TOKEN}".to_owned());
    let config = McpServerConfig {
        url: Some(fixture.url.clone()),
        headers,
        timeout: 10,
        connect_timeout: 10,
        ..McpServerConfig::default()
    };
    let env = Env::from_pairs([("FIX_TOKEN", "fixture-token")]);
    let fix = Arc::new(McpServer::new("web", config.clone(), env));
    let tools = fix.tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "schema_zoo"));
    assert_eq!(ok(&fix, "add", json!({"a": 40, "b": 2})).await, "42");
    let e = fix
        .call("slow", args(json!({"seconds": 30})), &{
            let c = CancellationToken::new();
            let t = c.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                t.cancel();
            });
            c
        })
        .await
        .unwrap_err();
    assert_eq!(e, CallError::Cancelled);
    assert_eq!(state.wait_lines("cancelled.log", 1).await, ["slow"]);
    fix.shutdown().await;

    // The wrong token is refused at the handshake, clearly.
    let wrong = Arc::new(McpServer::new(
        "web",
        config,
        Env::from_pairs([("FIX_TOKEN", "not-the-token")]),
    ));
    assert!(wrong.connect().await.is_err());

    // A server that dies mid-call fails the call promptly, not at its
    // timeout (the SDK's default would reconnect forever).
    let right = Arc::new(McpServer::new(
        "web",
        McpServerConfig {
            timeout: 30,
            ..wrong.config().clone()
        },
        Env::from_pairs([("FIX_TOKEN", "fixture-token")]),
    ));
    right.connect().await.unwrap();
    let started = Instant::now();
    let e = right
        .call("crash", args(json!({})), &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(!matches!(e, CallError::Timeout { .. }), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let status = tokio::time::timeout(WAIT, fixture.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(3));
}

fn agent_with(home: &Home, llm: &MockOpenAi, dir: &Path, manager: Arc<McpManager>) -> Agent {
    let mut config = Config::default();
    config.model.default = Some("test-model".into());
    config.model.base_url = Some(llm.base_url());
    config.agent.api_max_retries = 0;
    let config = Arc::new(config);
    let endpoint = Endpoint {
        provider: ProviderKind::Custom,
        model: "test-model".into(),
        base_url: llm.base_url(),
        api_key: None,
    };
    let store = Arc::new(SqliteStore::open(&home.state_db()).unwrap());
    let mut registry = Registry::with_core_tools(&config);
    registry.add_source(manager);
    Agent::new(AgentParts {
        config: config.clone(),
        home: home.clone(),
        provider: talaria_llm::provider_for(&endpoint, &config.agent),
        store,
        registry: Arc::new(registry),
        interaction: Arc::new(NoHuman),
        redactor: Redactor::default(),
        workdir: dir.to_path_buf(),
    })
}

fn home_in(dir: &Path) -> Home {
    let home = Home::at(PathBuf::from(dir).join("home"));
    home.ensure().unwrap();
    home
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_calls_an_mcp_tool_within_a_turn() {
    let state = State::new();
    let llm = MockOpenAi::start().await;
    let mut servers = BTreeMap::new();
    servers.insert("fix".to_owned(), state.stdio());
    let manager = manager(servers);
    let dir = tempfile::tempdir().unwrap();
    let home = home_in(dir.path());
    let agent = agent_with(&home, &llm, dir.path(), manager.clone());
    let session = agent.new_session("cli").await.unwrap();
    llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c1",
        "mcp__fix__add",
        r#"{"a": 19, "b": 23}"#,
    )]));
    llm.push(Reply::text("The sum is 42."));
    let outcome = agent
        .run_turn(
            &session,
            "add 19 and 23",
            &NullObserver,
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(outcome.answer, "The sum is 42.");
    let requests = llm.requests();
    // The MCP tools were offered, with schemas providers accept.
    let offered = requests[0].body["tools"].to_string();
    assert!(offered.contains("mcp__fix__add") && offered.contains("mcp__fix__schema_zoo"));
    let zoo = requests[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "mcp__fix__schema_zoo")
        .unwrap()["function"]["parameters"]
        .clone();
    assert!(zoo.get("$schema").is_none(), "{zoo}");
    // The result came back as data, marked untrusted.
    let result = requests[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        result.contains("42") && result.contains("not instructions"),
        "{result}"
    );

    // The name earlier releases offered (`mcp_<server>_<tool>`, in skills
    // and prompts written then) still reaches the tool, though only the
    // ancestor's spelling is offered.
    assert!(!offered.contains("\"mcp_fix_add\""), "{offered}");
    llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c1b",
        "mcp_fix_add",
        r#"{"a": 40, "b": 2}"#,
    )]));
    llm.push(Reply::text("Still 42."));
    let outcome = agent
        .run_turn(&session, "again", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(outcome.answer, "Still 42.");
    let last = llm.requests().last().unwrap().body["messages"].to_string();
    assert!(
        last.contains("42") && !last.contains("does not exist"),
        "{last}"
    );

    // An interrupt during a long MCP call cancels it at the server and the
    // turn ends interrupted.
    llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c2",
        "mcp__fix__slow",
        r#"{"seconds": 30}"#,
    )]));
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        trigger.cancel();
    });
    let started = Instant::now();
    let outcome = agent
        .run_turn(&session, "wait a long time", &NullObserver, cancel)
        .await
        .unwrap();
    assert_eq!(outcome.exit, talaria_agent::TurnExit::Interrupted);
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(state.wait_lines("cancelled.log", 1).await, ["slow"]);

    // A tool error comes back as an error result, and the turn goes on.
    llm.push(Reply::tool_calls(vec![ToolCallReply::new(
        "c3",
        "mcp__fix__fail",
        "{}",
    )]));
    llm.push(Reply::text("It failed."));
    let outcome = agent
        .run_turn(
            &session,
            "try the failing tool",
            &NullObserver,
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(outcome.answer, "It failed.");
    let last = llm.requests().last().unwrap().body["messages"].to_string();
    assert!(last.contains("it failed on purpose"), "{last}");
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_server_costs_its_tools_not_the_turn() {
    let state = State::new();
    let llm = MockOpenAi::start().await;
    let mut config = state.stdio();
    config.command = Some("/nonexistent/mcp-server".into());
    let mut servers = BTreeMap::new();
    servers.insert("gone".to_owned(), config);
    let manager = manager(servers);
    let dir = tempfile::tempdir().unwrap();
    let home = home_in(dir.path());
    let agent = agent_with(&home, &llm, dir.path(), manager);
    let session = agent.new_session("cli").await.unwrap();
    llm.push(Reply::text("Still here."));
    let outcome = agent
        .run_turn(&session, "hello", &NullObserver, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(outcome.answer, "Still here.");
    let offered = llm.requests()[0].body["tools"].to_string();
    assert!(!offered.contains("mcp_gone"));
    assert!(offered.contains("terminal"));
}

#[tokio::test]
async fn reload_mcp_reads_the_home_configuration_again() {
    let state = State::new();
    let dir = tempfile::tempdir().unwrap();
    let home = home_in(dir.path());
    std::fs::write(home.config_file(), "mcp_servers: {}\n").unwrap();
    let manager = McpManager::for_home(&Config::default(), &Env::default(), &home);
    assert!(manager.tools().await.is_empty());

    // The user adds a server and says /reload-mcp.
    std::fs::write(
        home.config_file(),
        format!(
            "mcp_servers:\n  late:\n    command: {FIXTURE}\n    env:\n      FIXTURE_STATE_DIR: {}\n",
            state.path().display()
        ),
    )
    .unwrap();
    let summary = ToolSource::reload(manager.as_ref()).await.unwrap();
    assert!(summary.contains("Added: late"), "{summary}");
    let names: Vec<String> = manager
        .tools()
        .await
        .iter()
        .map(|t| t.name().to_owned())
        .collect();
    assert!(names.iter().any(|n| n == "mcp__late__echo"), "{names:?}");

    // A broken file changes nothing and says why.
    std::fs::write(home.config_file(), "mcp_servers: [not, a, map\n").unwrap();
    let e = ToolSource::reload(manager.as_ref()).await.unwrap_err();
    assert!(e.contains("nothing was changed"), "{e}");
    assert!(manager.server("late").is_some());
    manager.shutdown().await;
}

#[tokio::test]
async fn resources_and_prompts_are_listed_where_the_server_has_them() {
    let state = State::new();
    let fix = server(state.stdio());
    let offer = fix.offer().await.unwrap();
    assert_eq!(offer.server, "talaria-fixture 1.0.0");
    assert_eq!(
        offer.resources,
        [("fixture://readme".to_owned(), "readme".to_owned())]
    );
    assert_eq!(offer.prompts.len(), 1);
    assert_eq!(offer.prompts[0].0, "greet");
    assert_eq!(offer.tools.len(), 7);
}
