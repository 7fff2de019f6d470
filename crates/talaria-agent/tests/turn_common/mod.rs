//! Shared set-up for the turn tests: a mock OpenAI server, the real OpenAI
//! provider, a real SQLite file, and a few small tools.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::{Registry, Tool, ToolContext, ToolError, ToolResult};
use talaria_agent::{Agent, AgentParts, TurnObserver};
use talaria_core::{Config, Endpoint, Home, Message, ProviderKind, Redactor};
use talaria_store::{SessionStore, SqliteStore};
use talaria_testkit::MockOpenAi;
use tokio_util::sync::CancellationToken;

pub struct Rig {
    pub mock: MockOpenAi,
    pub dir: tempfile::TempDir,
    pub home: Home,
    pub workdir: PathBuf,
    pub store: Arc<SqliteStore>,
    pub agent: Agent,
    pub config: Arc<Config>,
}

/// Builds a rig; `configure` adjusts the config, `tools` are registered.
pub async fn rig(configure: impl FnOnce(&mut Config), tools: Vec<Arc<dyn Tool>>) -> Rig {
    let mock = MockOpenAi::start().await;
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
    let endpoint = Endpoint {
        provider: ProviderKind::Custom,
        model: "test-model".into(),
        base_url: mock.base_url(),
        api_key: None,
    };
    let provider = talaria_llm::provider_for(&endpoint, &config.agent);
    let store = Arc::new(SqliteStore::open(&home.state_db()).unwrap());
    let mut registry = Registry::new();
    for t in tools {
        registry.register(t).unwrap();
    }
    let agent = Agent::new(AgentParts {
        config: config.clone(),
        home: home.clone(),
        provider,
        store: store.clone(),
        registry: Arc::new(registry),
        interaction: Arc::new(NoHuman),
        redactor: Redactor::new(["super-secret-value-123".to_owned()]),
        workdir: workdir.clone(),
    });
    Rig {
        mock,
        dir,
        home,
        workdir,
        store,
        agent,
        config,
    }
}

impl Rig {
    /// A second agent over the same home, store and server, as another
    /// process would build it (used for resume tests).
    pub fn another_agent(&self, tools: Vec<Arc<dyn Tool>>) -> Agent {
        let endpoint = Endpoint {
            provider: ProviderKind::Custom,
            model: "test-model".into(),
            base_url: self.mock.base_url(),
            api_key: None,
        };
        let mut registry = Registry::new();
        for t in tools {
            registry.register(t).unwrap();
        }
        Agent::new(AgentParts {
            config: self.config.clone(),
            home: self.home.clone(),
            provider: talaria_llm::provider_for(&endpoint, &self.config.agent),
            store: self.store.clone(),
            registry: Arc::new(registry),
            interaction: Arc::new(NoHuman),
            redactor: Redactor::default(),
            workdir: self.workdir.clone(),
        })
    }

    /// The session's active transcript as stored.
    pub async fn stored(&self, session_id: &str) -> Vec<Message> {
        self.store
            .messages(session_id)
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.message)
            .collect()
    }

    /// The `messages` array of request `i`.
    pub fn sent_messages(&self, i: usize) -> Vec<Value> {
        let reqs = self.mock.requests();
        reqs[i].body["messages"].as_array().unwrap().clone()
    }
}

/// Records everything it is told; optionally cancels on the first text.
#[derive(Default)]
pub struct Recorder {
    pub events: Mutex<Vec<String>>,
    pub cancel_on_text: Option<CancellationToken>,
}

impl Recorder {
    pub fn cancelling(token: CancellationToken) -> Recorder {
        Recorder {
            events: Mutex::new(Vec::new()),
            cancel_on_text: Some(token),
        }
    }

    pub fn events(&self) -> Vec<String> {
        self.events.lock().unwrap().clone()
    }

    pub fn streamed_text(&self) -> String {
        self.events()
            .iter()
            .filter_map(|e| e.strip_prefix("text:"))
            .collect()
    }
}

impl TurnObserver for Recorder {
    fn text(&self, delta: &str) {
        self.events.lock().unwrap().push(format!("text:{delta}"));
        if let Some(t) = &self.cancel_on_text {
            t.cancel();
        }
    }
    fn tool_started(&self, name: &str, args: &str) {
        self.events
            .lock()
            .unwrap()
            .push(format!("start:{name}:{args}"));
    }
    fn tool_finished(&self, name: &str, ok: bool, _preview: &str) {
        self.events
            .lock()
            .unwrap()
            .push(format!("done:{name}:{ok}"));
    }
    fn notice(&self, msg: &str) {
        self.events.lock().unwrap().push(format!("notice:{msg}"));
    }
}

/// `echo`: returns `echo: <text>` and counts its calls.
pub struct Echo {
    pub calls: Arc<AtomicUsize>,
    pub parallel: bool,
}

impl Echo {
    pub fn new() -> (Arc<Echo>, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        (
            Arc::new(Echo {
                calls: calls.clone(),
                parallel: false,
            }),
            calls,
        )
    }
}

#[async_trait]
impl Tool for Echo {
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "Echoes its text argument."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
    }
    fn parallel_safe(&self) -> bool {
        self.parallel
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> ToolResult {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let text = args["text"]
            .as_str()
            .ok_or_else(|| ToolError::new("missing text"))?;
        Ok(format!("echo: {text}"))
    }
}

/// `big`: returns `n` characters (`x`).
pub struct Big;

#[async_trait]
impl Tool for Big {
    fn name(&self) -> &str {
        "big"
    }
    fn description(&self) -> &str {
        "Returns a lot of text."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"n": {"type": "integer"}}})
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> ToolResult {
        let n = args["n"].as_u64().unwrap_or(10) as usize;
        let mut s = String::from("BEGIN");
        s.push_str(&"x".repeat(n));
        s.push_str("END");
        Ok(s)
    }
}

/// `interrupter`: simulates the user pressing Ctrl-C while it runs.
pub struct Interrupter;

#[async_trait]
impl Tool for Interrupter {
    fn name(&self) -> &str {
        "interrupter"
    }
    fn description(&self) -> &str {
        "Cancels the turn."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }
    async fn call(&self, _args: Value, ctx: &ToolContext) -> ToolResult {
        ctx.cancel.cancel();
        Ok("interrupter ran".into())
    }
}

/// `panicker`: panics.
pub struct Panicker;

#[async_trait]
impl Tool for Panicker {
    fn name(&self) -> &str {
        "panicker"
    }
    fn description(&self) -> &str {
        "Panics."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }
    async fn call(&self, _args: Value, _ctx: &ToolContext) -> ToolResult {
        panic!("deliberate test panic");
    }
}

/// `rendezvous`: parallel-safe; succeeds only if `parties` calls are running
/// at the same time (they meet at a barrier within a deadline).
pub struct Rendezvous {
    pub barrier: Arc<tokio::sync::Barrier>,
}

#[async_trait]
impl Tool for Rendezvous {
    fn name(&self) -> &str {
        "rendezvous"
    }
    fn description(&self) -> &str {
        "Waits for its peers."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"k": {"type": "integer"}}})
    }
    fn parallel_safe(&self) -> bool {
        true
    }
    async fn call(&self, _args: Value, _ctx: &ToolContext) -> ToolResult {
        match tokio::time::timeout(Duration::from_secs(5), self.barrier.wait()).await {
            Ok(_) => Ok("met".into()),
            Err(_) => Err(ToolError::new(
                "peers never arrived: calls ran one at a time",
            )),
        }
    }
}

/// Asserts every tool call in `messages` has a result right after it, and
/// every result has its call.
pub fn assert_valid(messages: &[Message]) {
    assert!(
        talaria_agent::repair::is_well_formed(messages),
        "transcript is not well formed: {messages:#?}"
    );
}
