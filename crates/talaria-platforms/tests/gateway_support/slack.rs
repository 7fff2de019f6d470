//! An in-process gateway with the Slack adapter: the real runner, ledger
//! and supervisor against the fake Slack, the real OpenAI provider against
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
use talaria_platforms::slack::{SlackAdapter, SlackSettings};
use talaria_store::{LedgerStore, ObligationState, SqliteStore};
use talaria_testkit::slack::Posted;
use talaria_testkit::{FakeSlack, MockOpenAi};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const BOT_TOKEN: &str = "xoxb-gateway-test-bot-token-0123";
pub const APP_TOKEN: &str = "xapp-1-gateway-test-app-token-0123";

/// How long a test waits for something that should happen.
pub const WAIT: Duration = Duration::from_secs(15);

pub struct SlackRig {
    pub slack: FakeSlack,
    pub llm: MockOpenAi,
    pub dir: tempfile::TempDir,
    pub home: Home,
    pub env: Vec<(String, String)>,
    pub config: Config,
    running: Option<(CancellationToken, JoinHandle<()>)>,
}

impl SlackRig {
    /// A rig with a gateway running and connected.
    pub async fn started(env: &[(&str, &str)], configure: impl FnOnce(&mut Config)) -> SlackRig {
        let slack = FakeSlack::start(BOT_TOKEN, APP_TOKEN).await;
        let llm = MockOpenAi::start().await;
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        home.ensure().unwrap();
        let mut config = Config::default();
        config.model.default = Some("test-model".into());
        config.model.base_url = Some(llm.base_url());
        config.platforms.slack.api_base = slack.api_base();
        config.platforms.slack.ping_interval_ms = 50;
        config.platforms.slack.ping_timeout_ms = 500;
        config.gateway.typing_interval_secs = 1;
        configure(&mut config);
        let mut rig = SlackRig {
            slack,
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
        rig.slack.wait_for_connection(1, WAIT).await;
        rig
    }

    /// Builds everything afresh from the home (as a new process would)
    /// and runs the gateway.
    pub fn start(&mut self) {
        assert!(self.running.is_none());
        let mut pairs = self.env.clone();
        pairs.push(("SLACK_BOT_TOKEN".into(), BOT_TOKEN.into()));
        pairs.push(("SLACK_APP_TOKEN".into(), APP_TOKEN.into()));
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
        let settings = SlackSettings::from_config(&config.platforms.slack, &env).unwrap();
        let adapter: Arc<dyn Adapter> = Arc::new(SlackAdapter::new(settings).unwrap());
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

    /// Waits for `n` posted messages in total and returns them.
    pub async fn posts(&self, n: usize) -> Vec<Posted> {
        self.slack.wait_for_posts(n, WAIT).await
    }

    /// Waits until some posted message contains `needle`.
    pub async fn wait_for_text(&self, needle: &str) -> Vec<Posted> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let posted = self.slack.posted();
            if posted.iter().any(|p| p.rendered().contains(needle)) {
                return posted;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no message containing {needle:?}; posted: {:?}",
                posted.iter().map(|p| p.rendered()).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
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

impl Drop for SlackRig {
    fn drop(&mut self) {
        if let Some((shutdown, _)) = &self.running {
            shutdown.cancel();
        }
    }
}
