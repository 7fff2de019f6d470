//! Shared set-up for the API server tests: the mock model, the real OpenAI
//! provider, a real SQLite store in a temporary directory, the core tools,
//! and the server itself on an ephemeral 127.0.0.1 port.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::Registry;
use talaria_agent::{Agent, AgentParts};
use talaria_api::{ApiServer, ApiServerSettings};
use talaria_core::{Config, Endpoint, Home, Message, ProviderKind, Redactor, Secret};
use talaria_store::{SessionRecord, SessionStore, SqliteStore};
use talaria_testkit::MockOpenAi;
use tokio_util::sync::CancellationToken;

/// The key every test server is started with.
pub const KEY: &str = "test-key-0123456789abcdef";

pub struct Rig {
    pub mock: MockOpenAi,
    pub dir: tempfile::TempDir,
    pub store: Arc<SqliteStore>,
    pub agent: Arc<Agent>,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub client: reqwest::Client,
    shutdown: CancellationToken,
    task: Option<ServerTask>,
    max_runs: usize,
}

/// Starts a server whose runs are capped at `max_runs` (0 = no cap).
pub async fn rig(max_runs: usize) -> Rig {
    rig_with(max_runs, |_| {}).await
}

/// [`rig`] with the agent's configuration changed by `configure`.
pub async fn rig_with(max_runs: usize, configure: impl FnOnce(&mut Config)) -> Rig {
    let mock = MockOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    home.ensure().unwrap();
    let store = Arc::new(SqliteStore::open(&home.state_db()).unwrap());
    let agent = agent_over(&mock, dir.path(), home, store.clone(), configure);
    let (base, shutdown, task) = serve(&agent, &store, max_runs).await;
    Rig {
        mock,
        dir,
        store,
        agent,
        base,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
        shutdown,
        task: Some(task),
        max_runs,
    }
}

/// An agent over `store` whose model is `mock`, with the core tools and
/// its workspace in `dir`, configured by `configure`.
pub fn agent_over(
    mock: &MockOpenAi,
    dir: &std::path::Path,
    home: Home,
    store: Arc<dyn SessionStore>,
    configure: impl FnOnce(&mut Config),
) -> Arc<Agent> {
    let workdir = dir.join("work");
    std::fs::create_dir_all(&workdir).unwrap();
    let mut config = Config::default();
    config.model.default = Some("test-model".into());
    config.model.base_url = Some(mock.base_url());
    config.agent.api_max_retries = 0;
    configure(&mut config);
    let config = Arc::new(config);
    let endpoint = Endpoint {
        provider: ProviderKind::Custom,
        model: "test-model".into(),
        base_url: mock.base_url(),
        api_key: None,
    };
    let provider = talaria_llm::provider_for(&endpoint, &config.agent);
    Arc::new(Agent::new(AgentParts {
        config: config.clone(),
        home,
        provider,
        store,
        registry: Arc::new(Registry::with_core_tools(&config)),
        interaction: Arc::new(NoHuman),
        redactor: Redactor::default(),
        workdir,
    }))
}

type ServerTask = tokio::task::JoinHandle<std::io::Result<()>>;

/// Binds and serves a server over `agent`, with its transcript index in
/// `store`, as the gateway does.
async fn serve(
    agent: &Arc<Agent>,
    store: &Arc<SqliteStore>,
    max_runs: usize,
) -> (String, CancellationToken, ServerTask) {
    let settings = ApiServerSettings {
        host: "127.0.0.1".into(),
        port: 0,
        key: Secret::new(KEY),
        max_concurrent_runs: max_runs,
        busy_wait: std::time::Duration::from_secs(60),
    };
    let server = ApiServer::bind(settings, agent.clone())
        .await
        .unwrap()
        .with_transcript_store(store.clone());
    let base = format!("http://{}", server.local_addr());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server.serve(shutdown.clone()));
    (base, shutdown, task)
}

impl Rig {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `POST /v1/chat/completions` with the right key and extra headers.
    pub async fn chat(&self, body: &Value, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut req = self
            .client
            .post(self.url("/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send().await.unwrap()
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

    /// The stored session record.
    pub async fn store_session(&self, id: &str) -> SessionRecord {
        self.store.session(id).await.unwrap().unwrap()
    }

    /// The `messages` array the model received in request `i`.
    pub fn sent_messages(&self, i: usize) -> Vec<Value> {
        self.mock.requests()[i].body["messages"]
            .as_array()
            .unwrap()
            .clone()
    }

    /// Stops the server and starts a new one (a new port, nothing in
    /// memory) over the same store and home.
    pub async fn restart(mut self) -> Rig {
        self.halt().await;
        let (base, shutdown, task) = serve(&self.agent, &self.store, self.max_runs).await;
        self.base = base;
        self.shutdown = shutdown;
        self.task = Some(task);
        self
    }

    /// Stops the server and waits for it to finish.
    pub async fn stop(mut self) {
        self.halt().await;
    }

    async fn halt(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("server did not shut down in time")
                .unwrap()
                .unwrap();
        }
    }
}

/// `(role, content)` of each sent message, system rows left out.
pub fn conversation(messages: &[Value]) -> Vec<(String, String)> {
    messages
        .iter()
        .filter(|m| m["role"] != "system")
        .map(|m| {
            (
                m["role"].as_str().unwrap_or("").to_owned(),
                m["content"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// One SSE frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub event: Option<String>,
    pub data: Option<String>,
    pub comment: Option<String>,
}

impl Frame {
    /// The data as JSON (panics when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(self.data.as_deref().unwrap()).unwrap()
    }
}

/// Splits an SSE body into frames.
pub fn parse_sse(text: &str) -> Vec<Frame> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let mut frame = Frame {
                event: None,
                data: None,
                comment: None,
            };
            for line in block.lines() {
                if let Some(c) = line.strip_prefix(':') {
                    frame.comment = Some(c.trim().to_owned());
                } else if let Some(e) = line.strip_prefix("event:") {
                    frame.event = Some(e.trim().to_owned());
                } else if let Some(d) = line.strip_prefix("data:") {
                    let d = d.strip_prefix(' ').unwrap_or(d);
                    frame.data = Some(match frame.data.take() {
                        Some(prev) => format!("{prev}\n{d}"),
                        None => d.to_owned(),
                    });
                }
            }
            frame
        })
        .collect()
}
