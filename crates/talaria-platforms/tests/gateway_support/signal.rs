//! An in-process gateway for end-to-end tests of the Signal adapter: the
//! real runner, ledger and adapter against the fake signal-cli REST API,
//! the real OpenAI provider against the mock LLM server, and a real SQLite
//! file. The adapter is built the way `talaria gateway run` builds it:
//! settings from `platforms.signal` and the environment.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::Registry;
use talaria_agent::{Agent, AgentParts};
use talaria_core::{Config, Endpoint, Env, Home, ProviderKind, Redactor};
use talaria_gateway::Adapter;
use talaria_gateway::gateway::{Gateway, GatewayParts};
use talaria_gateway::hooks::Hooks;
use talaria_platforms::signal::{SignalAdapter, SignalSettings};
use talaria_store::{LedgerStore, ObligationState, SqliteStore};
use talaria_testkit::signal::{Mode, Person, Sent};
use talaria_testkit::{FakeSignal, MockOpenAi};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The bot's number.
pub const BOT: &str = "+15550009999";

/// How long a test waits for something that should happen.
pub const WAIT: Duration = Duration::from_secs(15);

/// The person on the allowlist.
pub fn alice() -> Person {
    Person::numbered(1, "Alice")
}

/// A person on no list.
pub fn mallory() -> Person {
    Person::numbered(666, "Mallory")
}

pub struct Rig {
    pub signal: FakeSignal,
    pub llm: MockOpenAi,
    pub dir: tempfile::TempDir,
    pub home: Home,
    pub env: Vec<(String, String)>,
    pub config: Config,
    /// The account the gateway is configured with (normally [`BOT`]).
    pub account: String,
    running: Option<(CancellationToken, JoinHandle<()>)>,
}

impl Rig {
    /// A rig whose gateway is not started yet.
    pub async fn new(env: &[(&str, &str)], mode: Mode, configure: impl FnOnce(&mut Config)) -> Rig {
        let signal = FakeSignal::start(BOT, mode).await;
        let llm = MockOpenAi::start().await;
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        home.ensure().unwrap();
        let mut config = Config::default();
        config.model.default = Some("test-model".into());
        config.model.base_url = Some(llm.base_url());
        config.platforms.set("signal.poll_interval_secs", 1);
        config.gateway.typing_interval_secs = 1;
        configure(&mut config);
        Rig {
            signal,
            llm,
            dir,
            home,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            config,
            account: BOT.to_owned(),
            running: None,
        }
    }

    /// A rig with a gateway running and receiving over the WebSocket.
    pub async fn started(env: &[(&str, &str)], configure: impl FnOnce(&mut Config)) -> Rig {
        let mut rig = Rig::new(env, Mode::JsonRpc, configure).await;
        rig.start();
        rig.signal.wait_for_connections(1, WAIT).await;
        rig
    }

    /// Builds everything afresh from the home and runs the gateway.
    pub fn start(&mut self) {
        assert!(self.running.is_none());
        let mut pairs = self.env.clone();
        pairs.push(("SIGNAL_HTTP_URL".into(), self.signal.url()));
        pairs.push(("SIGNAL_ACCOUNT".into(), self.account.clone()));
        let env = Env::from_pairs(pairs);
        let config = Arc::new(self.config.clone());
        let store = Arc::new(SqliteStore::open(&self.home.state_db()).unwrap());
        let endpoint = Endpoint {
            provider: ProviderKind::Custom,
            model: "test-model".into(),
            base_url: self.llm.base_url(),
            api_key: None,
        };
        let agent = Arc::new(Agent::new(AgentParts {
            config: config.clone(),
            home: self.home.clone(),
            provider: talaria_llm::provider_for(&endpoint, &config.agent),
            store: store.clone(),
            registry: Arc::new(Registry::with_core_tools(&config)),
            interaction: Arc::new(NoHuman),
            redactor: Redactor::default(),
            workdir: self.dir.path().to_path_buf(),
        }));
        let settings = SignalSettings::from_config(&config.section().unwrap(), &env).unwrap();
        let adapter: Arc<dyn Adapter> = Arc::new(SignalAdapter::new(settings).unwrap());
        let gateway = Gateway::new(GatewayParts {
            config,
            env,
            home: self.home.clone(),
            agent,
            store,
            adapters: vec![adapter],
            lock_dir: Some(self.dir.path().join("locks")),
            hooks: Arc::new(Hooks::load(&self.home)),
        });
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let task = tokio::spawn(async move { gateway.run(stop).await });
        self.running = Some((shutdown, task));
    }

    /// The user messages of LLM request `i`.
    pub fn user_messages(&self, i: usize) -> Vec<String> {
        self.llm.requests()[i].body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "user")
            .map(|m| m["content"].as_str().unwrap_or("").to_owned())
            .collect()
    }

    /// Waits until some sent message contains `needle` and returns all.
    pub async fn wait_for_text(&self, needle: &str) -> Vec<Sent> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let sent = self.signal.sent();
            if sent.iter().any(|s| s.message.contains(needle)) {
                return sent;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no message containing {needle:?}; sent: {:?}",
                sent.iter().map(|s| &s.message).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the ledger shows `n` delivered rows.
    pub async fn wait_for_delivered(&self, n: u64) {
        let store = SqliteStore::open(&self.home.state_db()).unwrap();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let counts = store.obligation_counts().await.unwrap();
            if counts.get(&ObligationState::Delivered) == Some(&n) {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "{counts:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Gives the gateway a moment to do something it should not do.
    pub async fn settle(&self) {
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some((shutdown, _)) = &self.running {
            shutdown.cancel();
        }
    }
}
