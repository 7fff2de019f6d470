//! An in-process gateway for end-to-end tests of the e-mail adapter: the
//! real runner, ledger and adapter against real Dovecot (IMAP) and SMTP
//! servers on loopback, the real OpenAI provider against the mock LLM
//! server, and a real SQLite file. The adapter is built the way
//! `talaria gateway run` builds it: settings from `platforms.email` and
//! the environment.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::Registry;
use talaria_agent::{Agent, AgentParts};
use talaria_core::{Config, Endpoint, Env, Home, ProviderKind, Redactor};
use talaria_gateway::gateway::{Gateway, GatewayParts};
use talaria_gateway::hooks::Hooks;
use talaria_gateway::supervisor::StatusBoard;
use talaria_gateway::{Adapter, Liveness};
use talaria_platforms::email::{EmailAdapter, EmailSettings};
use talaria_store::{CursorStore, LedgerStore, ObligationState, SqliteStore};
use talaria_testkit::email::{ADDRESS, PASSWORD, SentMail};
use talaria_testkit::{MailServer, MockOpenAi};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long a test waits for something that should happen.
pub const WAIT: Duration = Duration::from_secs(20);

pub struct Rig {
    pub mail: MailServer,
    pub llm: MockOpenAi,
    pub dir: tempfile::TempDir,
    pub home: Home,
    pub env: Vec<(String, String)>,
    pub config: Config,
    /// The password the gateway logs in with.
    pub password: String,
    board: Option<Arc<StatusBoard>>,
    running: Option<(CancellationToken, JoinHandle<()>)>,
}

impl Rig {
    /// A rig whose gateway is not started yet.
    pub async fn new(env: &[(&str, &str)], configure: impl FnOnce(&mut Config)) -> Rig {
        let mail = tokio::task::spawn_blocking(MailServer::start)
            .await
            .unwrap();
        let llm = MockOpenAi::start().await;
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        home.ensure().unwrap();
        let mut config = Config::default();
        config.model.default = Some("test-model".into());
        config.model.base_url = Some(llm.base_url());
        config.platforms.set("email.imap_tls", "none");
        config.platforms.set("email.smtp_tls", "none");
        config.gateway.typing_interval_secs = 1;
        configure(&mut config);
        Rig {
            mail,
            llm,
            dir,
            home,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            config,
            password: PASSWORD.to_owned(),
            board: None,
            running: None,
        }
    }

    /// A rig with a gateway running and reading the mailbox.
    pub async fn started(env: &[(&str, &str)], configure: impl FnOnce(&mut Config)) -> Rig {
        let mut rig = Rig::new(env, configure).await;
        rig.start();
        rig.wait_until_live().await;
        rig
    }

    /// Builds everything afresh from the home and runs the gateway.
    pub fn start(&mut self) {
        assert!(self.running.is_none());
        let mut pairs = self.env.clone();
        pairs.push(("EMAIL_ADDRESS".into(), ADDRESS.into()));
        pairs.push(("EMAIL_PASSWORD".into(), self.password.clone()));
        pairs.push(("EMAIL_IMAP_HOST".into(), self.mail.imap_host()));
        pairs.push(("EMAIL_SMTP_HOST".into(), self.mail.smtp_host()));
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
        let settings = EmailSettings::from_config(&config.section().unwrap(), &env).unwrap();
        let cursors: Arc<dyn CursorStore> = store.clone();
        let adapter: Arc<dyn Adapter> = Arc::new(EmailAdapter::new(settings, cursors).unwrap());
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
        self.board = Some(gateway.board());
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

    /// The e-mail adapter's state on the gateway's board.
    pub fn state(&self) -> Option<(Liveness, Option<String>)> {
        self.board
            .as_ref()?
            .snapshot()
            .get("email")
            .map(|s| (s.liveness, s.last_error.clone()))
    }

    /// Waits until the adapter has logged in and selected the mailbox.
    pub async fn wait_until_live(&self) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.state().map(|s| s.0) != Some(Liveness::Live) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the e-mail adapter never went live: {:?}",
                self.state()
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

    /// Waits for `n` sent mails in total and returns them.
    pub async fn sent(&self, n: usize) -> Vec<SentMail> {
        self.mail.wait_for_sent(n, WAIT).await
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

    /// Waits until the LLM saw `n` requests.
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

    /// Gives the gateway a moment to do something it should not do.
    pub async fn settle(&self) {
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some((shutdown, _)) = &self.running {
            shutdown.cancel();
        }
    }
}
