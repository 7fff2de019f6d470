//! An in-process gateway over the Discord adapter: the real runner, ledger
//! and adapter against the fake Discord, the real OpenAI provider against
//! the mock LLM, and a real SQLite file.
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
use talaria_platforms::discord::{DiscordAdapter, DiscordSettings, DiscordTimings};
use talaria_store::SqliteStore;
use talaria_testkit::discord::Sent;
use talaria_testkit::{FakeDiscord, MockOpenAi};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const TOKEN: &str = "MTk4NjIy.gateway.discord-test-token";

/// How long a test waits for something that should happen.
pub const WAIT: Duration = Duration::from_secs(15);

pub struct DiscordRig {
    pub dc: FakeDiscord,
    pub llm: MockOpenAi,
    pub dir: tempfile::TempDir,
    pub home: Home,
    pub env: Vec<(String, String)>,
    pub config: Config,
    running: Option<(CancellationToken, JoinHandle<()>)>,
}

impl DiscordRig {
    /// A rig with a gateway running and connected (READY seen).
    pub async fn started(env: &[(&str, &str)], configure: impl FnOnce(&mut Config)) -> DiscordRig {
        let dc = FakeDiscord::start_with_heartbeat(TOKEN, Duration::from_millis(500)).await;
        let llm = MockOpenAi::start().await;
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        home.ensure().unwrap();
        let mut config = Config::default();
        config.model.default = Some("test-model".into());
        config.model.base_url = Some(llm.base_url());
        config.platforms.discord.api_base = dc.api_base();
        config.gateway.typing_interval_secs = 1;
        configure(&mut config);
        let mut rig = DiscordRig {
            dc,
            llm,
            dir,
            home,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            config,
            running: None,
        };
        rig.start();
        rig.dc.wait_for_sessions(1, WAIT).await;
        rig
    }

    /// Builds everything afresh from the home and runs the gateway.
    pub fn start(&mut self) {
        assert!(self.running.is_none());
        let mut pairs = self.env.clone();
        pairs.push(("DISCORD_BOT_TOKEN".into(), TOKEN.into()));
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
        let mut settings = DiscordSettings::from_config(&config.platforms.discord, &env).unwrap();
        settings.timings = DiscordTimings {
            connect_timeout: Duration::from_secs(5),
            reidentify_delay: Duration::from_millis(50),
        };
        let adapter: Arc<dyn Adapter> = Arc::new(DiscordAdapter::new(settings).unwrap());
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

    /// Stops the gateway gracefully and waits for it.
    pub async fn stop(&mut self) {
        if let Some((shutdown, task)) = self.running.take() {
            shutdown.cancel();
            tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
        }
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

    /// Waits for `n` sent messages in total and returns them.
    pub async fn sent(&self, n: usize) -> Vec<Sent> {
        self.dc.wait_for_sent(n, WAIT).await
    }

    /// Waits until some sent message contains `needle`.
    pub async fn wait_for_text(&self, needle: &str) -> Vec<Sent> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let sent = self.dc.sent();
            if sent.iter().any(|s| s.content.contains(needle)) {
                return sent;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no message containing {needle:?}; sent: {:?}",
                sent.iter().map(|s| &s.content).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Gives the gateway a moment to do something it should not do.
    pub async fn settle(&self) {
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
}

impl Drop for DiscordRig {
    fn drop(&mut self) {
        if let Some((shutdown, _)) = &self.running {
            shutdown.cancel();
        }
    }
}
