//! A gateway serving Home Assistant end to end: the real runner, ledger,
//! router and Home Assistant adapter (mounted on the shared listener on a
//! free port of 127.0.0.1), the `ha_*` tools against the fake Home
//! Assistant REST API, the real OpenAI provider against the mock LLM
//! server, and a real SQLite file in a temporary directory.
//!
//! The gateway is assembled the way `talaria gateway run` does it: the
//! settings are resolved from `platforms.homeassistant` and the
//! environment handed to the gateway (`HASS_URL`, `HASS_TOKEN`,
//! `HASS_CONVERSATION_TOKEN`).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::Registry;
use talaria_agent::{Agent, AgentParts};
use talaria_core::{Config, Endpoint, Env, Home, ProviderKind, Redactor};
use talaria_gateway::Adapter;
use talaria_gateway::gateway::{Gateway, GatewayParts};
use talaria_gateway::hooks::Hooks;
use talaria_platforms::homeassistant::{HomeAssistantAdapter, HomeAssistantSettings};
use talaria_platforms::ingress::Ingress;
use talaria_store::{LedgerStore, ObligationState, SqliteStore};
use talaria_testkit::{FakeHomeAssistant, MockOpenAi};
use talaria_tools::homeassistant::ha_tools;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::gateway_support::WAIT;

/// How often the polling helpers look again.
const POLL: Duration = Duration::from_millis(20);

/// The long-lived token the fake Home Assistant accepts.
pub const HASS_TOKEN: &str = "hass-long-lived-token-0123456789";
/// The conversation endpoint's bearer secret.
pub const CONV_SECRET: &str = "conversation-secret-0123456789";

/// One HTTP answer of the conversation endpoint.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// The JSON body, `Value::Null` when there was none.
    pub body: Value,
}

impl Answer {
    /// The spoken answer.
    pub fn speech(&self) -> &str {
        self.body["response"]["speech"]["plain"]["speech"]
            .as_str()
            .unwrap_or_else(|| panic!("no speech in {}", self.body))
    }
}

pub struct HaRig {
    pub ha: FakeHomeAssistant,
    pub llm: MockOpenAi,
    pub dir: tempfile::TempDir,
    pub home: Home,
    /// `http://127.0.0.1:<port>`, the shared listener.
    pub base: String,
    http: reqwest::Client,
    running: Option<(CancellationToken, JoinHandle<()>)>,
}

impl HaRig {
    /// A running gateway whose Home Assistant credentials come from the
    /// environment, with `configure` applied to the config. Returns once
    /// the listener answers `/health`.
    pub async fn started(configure: impl FnOnce(&mut Config)) -> HaRig {
        let ha = FakeHomeAssistant::start(HASS_TOKEN).await;
        let llm = MockOpenAi::start().await;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let home = Home::at(dir.path().join("home"));
        home.ensure().expect("a fresh home");

        let mut config = Config::default();
        config.model.default = Some("test-model".into());
        config.model.base_url = Some(llm.base_url());
        config.gateway.typing_interval_secs = 1;
        config.platforms.set("webhook.port", 0);
        configure(&mut config);
        let env = Env::from_pairs([
            ("HASS_URL".to_owned(), ha.url()),
            ("HASS_TOKEN".to_owned(), HASS_TOKEN.to_owned()),
            ("HASS_CONVERSATION_TOKEN".to_owned(), CONV_SECRET.to_owned()),
        ]);
        let config = Arc::new(config);
        let settings = HomeAssistantSettings::from_config(&config.section().unwrap(), &env)
            .expect("Home Assistant is configured");

        let store = Arc::new(SqliteStore::open(&home.state_db()).expect("the state database"));
        let endpoint = Endpoint {
            provider: ProviderKind::Custom,
            model: "test-model".into(),
            base_url: llm.base_url(),
            api_key: None,
        };
        let mut registry = Registry::with_core_tools(&config);
        for tool in ha_tools(&settings).expect("the tools") {
            registry.register(tool).expect("no name clash");
        }
        let agent = Arc::new(Agent::new(AgentParts {
            config: config.clone(),
            home: home.clone(),
            provider: talaria_llm::provider_for(&endpoint, &config.agent),
            store: store.clone(),
            registry: Arc::new(registry),
            interaction: Arc::new(NoHuman),
            redactor: Redactor::default(),
            workdir: dir.path().to_path_buf(),
        }));

        let adapter = HomeAssistantAdapter::new(&settings)
            .expect("usable settings")
            .expect("a conversation token is set");
        let mut ingress = Ingress::bind("127.0.0.1", 0)
            .await
            .expect("the webhook listener binds");
        ingress.mount(adapter.mount());
        let base = format!("http://{}", ingress.local_addr());
        let adapter: Arc<dyn Adapter> = Arc::new(adapter);

        let gateway = Gateway::new(GatewayParts {
            config,
            env,
            home: home.clone(),
            agent,
            store,
            adapters: vec![adapter],
            lock_dir: Some(dir.path().join("locks")),
            hooks: Arc::new(Hooks::load(&home)),
        });
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let serving = shutdown.clone();
        let task = tokio::spawn(async move {
            let server = tokio::spawn(ingress.serve(serving));
            gateway.run(stop).await;
            let _ = server.await;
        });

        let rig = HaRig {
            ha,
            llm,
            dir,
            home,
            base,
            http: reqwest::Client::new(),
            running: Some((shutdown, task)),
        };
        let url = format!("{}/health", rig.base);
        rig.wait_for("the listener to answer /health", || async {
            matches!(rig.http.get(&url).send().await, Ok(r) if r.status().as_u16() == 200)
        })
        .await;
        rig
    }

    /// Posts a conversation request with this bearer (none when `None`).
    pub async fn converse(&self, bearer: Option<&str>, body: Value) -> Answer {
        let mut req = self
            .http
            .post(format!("{}/homeassistant/conversation", self.base))
            .json(&body);
        if let Some(b) = bearer {
            req = req.bearer_auth(b);
        }
        let resp = tokio::time::timeout(WAIT, req.send())
            .await
            .expect("the endpoint answers in time")
            .expect("the request goes through");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        Answer {
            status,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
        }
    }

    /// Polls `check` until it holds; panics naming `what` after [`WAIT`].
    pub async fn wait_for<F, Fut>(&self, what: &str, check: F)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !check().await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "waited {WAIT:?} for {what}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits for `n` LLM requests in total.
    pub async fn llm_requests(&self, n: usize) {
        let what = format!("{n} LLM requests");
        self.wait_for(&what, || async { self.llm.requests().len() >= n })
            .await;
    }

    /// The messages of LLM request `i`, as `(role, content)`.
    pub fn messages(&self, i: usize) -> Vec<(String, String)> {
        let requests = self.llm.requests();
        let Some(messages) = requests[i].body["messages"].as_array() else {
            panic!("LLM request {i} has no messages: {}", requests[i].body);
        };
        messages
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap_or("").to_owned(),
                    m["content"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    }

    /// A second connection to the gateway's database.
    pub fn store(&self) -> SqliteStore {
        SqliteStore::open(&self.home.state_db()).expect("the state database")
    }

    /// Waits until the ledger holds exactly `n` rows, all delivered.
    pub async fn wait_for_ledger_delivered(&self, n: u64) {
        let store = self.store();
        let what = format!("{n} delivered ledger rows and nothing else");
        self.wait_for(&what, || async {
            let counts = store.obligation_counts().await.expect("ledger counts");
            let total: u64 = counts.values().sum();
            counts.get(&ObligationState::Delivered) == Some(&n) && total == n
        })
        .await;
    }
}

impl Drop for HaRig {
    fn drop(&mut self) {
        if let Some((shutdown, _)) = &self.running {
            shutdown.cancel();
        }
    }
}
