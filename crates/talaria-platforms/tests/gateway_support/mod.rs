//! An in-process gateway for end-to-end tests: the real runner, ledger and
//! Telegram adapter against a fake Bot API server, the real OpenAI
//! provider against the mock LLM server, and a real SQLite file.
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
use talaria_platforms::telegram::{TelegramAdapter, TelegramSettings};
use talaria_store::SqliteStore;
use talaria_testkit::wait::wait_for;
use talaria_testkit::{FakeTelegram, MockOpenAi};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::contract::{self, Markers};

pub const TOKEN: &str = "123456:test-token-abcdefghijklmnop";

/// The user whose DM carries [`Rig::barrier`]'s marker: a test that uses
/// it puts them on the allowlist.
pub const FRIEND: i64 = 42;

/// How long a test waits for something that should happen.
pub const WAIT: Duration = Duration::from_secs(15);

pub struct Rig {
    pub tg: FakeTelegram,
    pub llm: MockOpenAi,
    pub dir: tempfile::TempDir,
    pub home: Home,
    pub env: Vec<(String, String)>,
    pub config: Config,
    running: Option<(CancellationToken, JoinHandle<()>)>,
    markers: Markers,
}

impl Rig {
    /// A rig whose gateway is not started yet.
    pub async fn new(env: &[(&str, &str)], configure: impl FnOnce(&mut Config)) -> Rig {
        let tg = FakeTelegram::start(TOKEN).await;
        let llm = MockOpenAi::start().await;
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        home.ensure().unwrap();
        let mut config = Config::default();
        config.model.default = Some("test-model".into());
        config.model.base_url = Some(llm.base_url());
        config.platforms.set("telegram.base_url", tg.base_url());
        config.platforms.set("telegram.poll_timeout_secs", 1);
        config.gateway.typing_interval_secs = 1;
        configure(&mut config);
        Rig {
            tg,
            llm,
            dir,
            home,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            config,
            running: None,
            markers: Markers::default(),
        }
    }

    /// A rig with a gateway running.
    pub async fn started(env: &[(&str, &str)], configure: impl FnOnce(&mut Config)) -> Rig {
        let mut rig = Rig::new(env, configure).await;
        rig.start();
        rig.wait_until_polling().await;
        rig
    }

    /// Builds everything afresh from the home (as a new process would)
    /// and runs the gateway.
    pub fn start(&mut self) {
        assert!(self.running.is_none());
        let mut pairs = self.env.clone();
        pairs.push(("TELEGRAM_BOT_TOKEN".into(), TOKEN.into()));
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
        let adapter = telegram_adapter(&config, &env);
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

    /// Waits until the adapter has polled at least once more than before.
    pub async fn wait_until_polling(&self) {
        let n = self.tg.get_updates_calls().len();
        self.tg.wait_for_get_updates_calls(n + 1, WAIT).await;
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
    pub async fn sent(&self, n: usize) -> Vec<talaria_testkit::telegram::Sent> {
        self.tg.wait_for_sent(n, WAIT).await
    }

    /// Waits for `n` LLM requests in total.
    pub async fn llm_requests(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.llm.requests().len() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "expected {n} LLM requests, saw {}",
                self.llm.requests().len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// [`contract::Rig::barrier`] on Telegram: once every update is
    /// confirmed (so handed over) and the answers on their way are out,
    /// a DM from [`FRIEND`] whose answer is reserved for it; then no turn
    /// may be owed. The counts a test asserts next include the marker.
    pub async fn barrier(&self) {
        self.tg.wait_for_confirmed_updates(WAIT).await;
        contract::wait_for_answers_out(&self.home).await;
        let marker = self.markers.next(&self.llm);
        self.tg.push_private_text(FRIEND, &marker.text);
        wait_for(&format!("the answer {:?}", marker.answer), || async {
            let sent: Vec<String> = self.tg.sent().iter().map(|s| s.rendered()).collect();
            if sent.iter().any(|s| s.contains(&marker.answer)) {
                Ok(())
            } else {
                Err(sent)
            }
        })
        .await;
        contract::assert_nothing_owed(&self.home).await;
        // Its turn is over once the answer is delivered: a message the test
        // sends next in the friend's chat is not met as a busy notice.
        contract::wait_for_answers_out(&self.home).await;
    }
}

/// The Telegram adapter as `talaria gateway run` builds it: the one place
/// the tests construct it.
pub fn telegram_adapter(config: &Config, env: &Env) -> Arc<dyn Adapter> {
    let settings = TelegramSettings::from_config(&config.section().unwrap(), env).unwrap();
    Arc::new(TelegramAdapter::new(settings).unwrap())
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some((shutdown, _)) = &self.running {
            shutdown.cancel();
        }
    }
}
