//! An in-process gateway for end-to-end tests of the WhatsApp Cloud
//! adapter: the real runner, ledger, router and adapter (mounted on the
//! shared webhook listener on a free port of 127.0.0.1) against the fake
//! Graph API, the real OpenAI provider against the mock LLM server, and a
//! real SQLite file. Meta's deliveries are signed and posted by the
//! testkit's [`MetaWebhook`].
//!
//! The adapter is built the way `talaria gateway run` builds it: settings
//! from `platforms.whatsapp_cloud` and the environment.
#![allow(dead_code)]

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::Registry;
use talaria_agent::{Agent, AgentParts};
use talaria_core::{Config, Endpoint, Env, Home, ProviderKind, Redactor};
use talaria_gateway::Adapter;
use talaria_gateway::gateway::{Gateway, GatewayParts};
use talaria_gateway::hooks::Hooks;
use talaria_platforms::ingress::Ingress;
use talaria_platforms::whatsapp::{WhatsappAdapter, WhatsappSettings};
use talaria_store::{LedgerStore, Obligation, ObligationState, SqliteStore};
use talaria_testkit::whatsapp::{API_VERSION, MetaWebhook};
use talaria_testkit::{FakeGraph, MockOpenAi};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const TOKEN: &str = "EAAGgateway-access-token-0123456789";
pub const NUMBER: &str = "106540352242922";
pub const APP_SECRET: &str = "gateway-app-secret-0123456789";
pub const VERIFY: &str = "gateway-verify-token-0123";

/// How long a test waits for something that should happen.
pub const WAIT: Duration = Duration::from_secs(15);

/// How often the polling helpers look again.
const POLL: Duration = Duration::from_millis(20);

pub struct Rig {
    pub graph: FakeGraph,
    pub llm: MockOpenAi,
    pub meta: MetaWebhook,
    pub dir: tempfile::TempDir,
    pub home: Home,
    /// `http://127.0.0.1:<port>`, the shared webhook listener.
    pub base: String,
    running: Option<(CancellationToken, JoinHandle<()>)>,
}

impl Rig {
    /// A running gateway with WhatsApp Cloud configured from this
    /// environment (the four credentials are added). Returns once the
    /// listener's `/health` says the adapter's inbox is attached.
    pub async fn started(env: &[(&str, &str)]) -> Rig {
        let graph = FakeGraph::start(TOKEN, NUMBER).await;
        let llm = MockOpenAi::start().await;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let home = Home::at(dir.path().join("home"));
        home.ensure().expect("a fresh home");

        let mut config = Config::default();
        config.model.default = Some("test-model".into());
        config.model.base_url = Some(llm.base_url());
        config.gateway.typing_interval_secs = 1;
        config.platforms.set("webhook.port", 0);
        config
            .platforms
            .set("whatsapp_cloud.graph_base", graph.base_url());
        config
            .platforms
            .set("whatsapp_cloud.api_version", API_VERSION.to_owned());

        let mut pairs: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (k, v) in [
            ("WHATSAPP_CLOUD_TOKEN", TOKEN),
            ("WHATSAPP_CLOUD_PHONE_NUMBER_ID", NUMBER),
            ("WHATSAPP_CLOUD_APP_SECRET", APP_SECRET),
            ("WHATSAPP_CLOUD_VERIFY_TOKEN", VERIFY),
        ] {
            pairs.push((k.into(), v.into()));
        }
        let env = Env::from_pairs(pairs);
        let config = Arc::new(config);

        let store = Arc::new(SqliteStore::open(&home.state_db()).expect("the state database"));
        let endpoint = Endpoint {
            provider: ProviderKind::Custom,
            model: "test-model".into(),
            base_url: llm.base_url(),
            api_key: None,
        };
        let agent = Arc::new(Agent::new(AgentParts {
            config: config.clone(),
            home: home.clone(),
            provider: talaria_llm::provider_for(&endpoint, &config.agent),
            store: store.clone(),
            registry: Arc::new(Registry::with_core_tools(&config)),
            interaction: Arc::new(NoHuman),
            redactor: Redactor::default(),
            workdir: dir.path().to_path_buf(),
        }));

        let settings = WhatsappSettings::from_config(&config.section().unwrap(), &env)
            .expect("the WhatsApp settings resolve")
            .expect("WhatsApp Cloud is on");
        let settings = WhatsappSettings {
            // Graph's pauses are seconds long; tests need not wait them.
            rate_limit_wait: Duration::from_millis(10),
            ..settings
        };
        let adapter = WhatsappAdapter::new(settings).expect("the WhatsApp adapter");
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
        let rig = Rig {
            graph,
            llm,
            meta: MetaWebhook::new(&base, APP_SECRET),
            dir,
            home,
            base,
            running: Some((shutdown, task)),
        };
        rig.wait_until_serving().await;
        rig
    }

    async fn wait_until_serving(&self) {
        let url = format!("{}/health", self.base);
        let http = reqwest::Client::new();
        self.wait_for("the webhook listener to answer /health", || async {
            matches!(http.get(&url).send().await, Ok(r) if r.status().as_u16() == 200)
        })
        .await;
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

    /// The user messages of LLM request `i`.
    pub fn user_messages(&self, i: usize) -> Vec<String> {
        self.llm.requests()[i].body["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .filter(|m| m["role"] == "user")
            .map(|m| m["content"].as_str().unwrap_or("").to_owned())
            .collect()
    }

    /// A second connection to the gateway's database.
    pub fn store(&self) -> SqliteStore {
        SqliteStore::open(&self.home.state_db()).expect("the state database")
    }

    /// Waits until the ledger holds exactly `n` rows, all delivered.
    pub async fn wait_for_delivered(&self, n: u64) {
        let store = self.store();
        let what = format!("{n} delivered ledger rows and nothing else");
        self.wait_for(&what, || async {
            let counts = store.obligation_counts().await.expect("ledger counts");
            let total: u64 = counts.values().sum();
            counts.get(&ObligationState::Delivered) == Some(&n) && total == n
        })
        .await;
    }

    /// Waits until some ledger row is `failed` and returns the open rows.
    /// Waits until the ledger abandoned a reply, and returns the open
    /// rows left.
    pub async fn wait_for_abandoned(&self) -> Vec<Obligation> {
        let store = self.store();
        self.wait_for("an abandoned ledger row", || async {
            let counts = store.obligation_counts().await.expect("ledger counts");
            counts.contains_key(&ObligationState::Abandoned)
        })
        .await;
        store.open_obligations(0).await.expect("open obligations")
    }

    pub async fn wait_for_failed(&self) -> Vec<Obligation> {
        let store = self.store();
        self.wait_for("a failed ledger row", || async {
            let counts = store.obligation_counts().await.expect("ledger counts");
            counts.contains_key(&ObligationState::Failed)
        })
        .await;
        store.open_obligations(0).await.expect("open obligations")
    }

    /// Stops the gateway gracefully and waits for it.
    pub async fn stop(&mut self) {
        if let Some((shutdown, task)) = self.running.take() {
            shutdown.cancel();
            tokio::time::timeout(WAIT, task)
                .await
                .expect("the gateway stops in time")
                .expect("the gateway task ends without panicking");
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some((shutdown, _)) = &self.running {
            shutdown.cancel();
        }
    }
}

/// Everything logged at info and above by this test binary, from the
/// first call on (a global subscriber: the gateway logs from its own
/// tasks, on any thread). Tests look for lines naming their own ids.
pub fn captured_logs() -> String {
    let buffer = log_buffer();
    let bytes = buffer.lock().unwrap_or_else(|p| p.into_inner()).clone();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Starts capturing logs (once per test binary).
pub fn capture_logs() {
    log_buffer();
}

fn log_buffer() -> Arc<Mutex<Vec<u8>>> {
    static BUFFER: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    BUFFER
        .get_or_init(|| {
            let buffer = Arc::new(Mutex::new(Vec::new()));
            let sink = buffer.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::INFO)
                .with_ansi(false)
                .with_writer(move || Sink(sink.clone()))
                .finish();
            // Another subscriber may already be global; then nothing is
            // captured and the assertions on logs say so.
            let _ = tracing::subscriber::set_global_default(subscriber);
            buffer
        })
        .clone()
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
