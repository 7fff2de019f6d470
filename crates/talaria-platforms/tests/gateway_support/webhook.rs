//! A gateway serving webhooks end to end: the real runner, ledger, router,
//! webhook adapter (on a free port of 127.0.0.1) and Telegram adapter
//! (against the fake Bot API, so answers delivered to `telegram` targets
//! can be seen), the real OpenAI provider against the mock LLM server, and
//! a real SQLite file in a temporary directory.
//!
//! The gateway is assembled the way `talaria gateway run` does it: the
//! webhook settings are resolved from `platforms.webhook` in the config
//! and from the environment handed to the gateway, then bound.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;
use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::Registry;
use talaria_agent::{Agent, AgentParts};
use talaria_core::{Config, Endpoint, Env, Home, ProviderKind, Redactor};
use talaria_gateway::Adapter;
use talaria_gateway::gateway::{Gateway, GatewayParts};
use talaria_gateway::hooks::Hooks;
use talaria_platforms::ingress::Ingress;
use talaria_platforms::telegram::{TelegramAdapter, TelegramSettings};
use talaria_platforms::webhook::{WebhookAdapter, WebhookSettings};
use talaria_platforms::webhook::{WebhookRouteConfig, WebhookScheme};
use talaria_store::{
    LedgerStore, ObligationState, SessionFilter, SessionRecord, SessionStore, SqliteStore,
};
use talaria_testkit::telegram::Sent;
use talaria_testkit::{FakeTelegram, MockOpenAi};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::gateway_support::{TOKEN, WAIT};

/// How often the polling helpers look again.
const POLL: Duration = Duration::from_millis(20);

/// A route as `platforms.webhook.routes.<name>` would configure it, with
/// every optional field at its default.
pub fn route(
    scheme: WebhookScheme,
    secret_env: &str,
    prompt: &str,
    deliver: &str,
) -> WebhookRouteConfig {
    WebhookRouteConfig {
        secret: None,
        secret_env: Some(secret_env.to_owned()),
        scheme,
        prompt: prompt.to_owned(),
        deliver: deliver.to_owned(),
        events: Vec::new(),
        enabled: true,
    }
}

/// The hex HMAC-SHA256 of `data` under `key`.
pub fn hmac_hex(key: &str, data: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).expect("HMAC takes any key");
    mac.update(data);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The headers GitHub sends with a delivery signed with `secret`.
pub fn github_headers(
    secret: &str,
    body: &[u8],
    event: &str,
    delivery: &str,
) -> Vec<(&'static str, String)> {
    vec![
        ("X-GitHub-Event", event.to_owned()),
        ("X-GitHub-Delivery", delivery.to_owned()),
        (
            "X-Hub-Signature-256",
            format!("sha256={}", hmac_hex(secret, body)),
        ),
    ]
}

/// The headers of the generic `hmac` scheme, signed now with `secret`.
pub fn hmac_headers(secret: &str, body: &[u8]) -> Vec<(&'static str, String)> {
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_secs()
        .to_string();
    let signed = [ts.as_bytes(), b".", body].concat();
    vec![
        ("X-Webhook-Timestamp", ts),
        (
            "X-Webhook-Signature",
            format!("sha256={}", hmac_hex(secret, &signed)),
        ),
    ]
}

/// One HTTP answer of the webhook server.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// The JSON body, `Value::Null` when there was none.
    pub body: Value,
}

pub struct WebhookRig {
    pub tg: FakeTelegram,
    pub llm: MockOpenAi,
    pub dir: tempfile::TempDir,
    pub home: Home,
    /// `http://127.0.0.1:<port>`, the webhook server.
    pub base: String,
    http: reqwest::Client,
    running: Option<(CancellationToken, JoinHandle<()>)>,
}

impl WebhookRig {
    /// A running gateway with these webhook routes and this environment
    /// (which also holds the routes' secrets); Telegram is connected with
    /// [`TOKEN`]. Returns once the webhook server answers `/health` and the
    /// Telegram adapter has polled.
    pub async fn started(
        env: &[(&str, &str)],
        routes: Vec<(&str, WebhookRouteConfig)>,
    ) -> WebhookRig {
        let tg = FakeTelegram::start(TOKEN).await;
        let llm = MockOpenAi::start().await;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let home = Home::at(dir.path().join("home"));
        home.ensure().expect("a fresh home");

        let mut config = Config::default();
        config.model.default = Some("test-model".into());
        config.model.base_url = Some(llm.base_url());
        config.platforms.set("telegram.base_url", tg.base_url());
        config.platforms.set("telegram.poll_timeout_secs", 1);
        config.gateway.typing_interval_secs = 1;
        config.platforms.set("webhook.port", 0);
        let routes = routes
            .into_iter()
            .map(|(name, r)| (name.to_owned(), r))
            .collect::<BTreeMap<_, _>>();
        config.platforms.set(
            "webhook.routes",
            serde_json::to_value(routes).expect("routes as YAML would hold them"),
        );

        let mut pairs: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        pairs.push(("TELEGRAM_BOT_TOKEN".into(), TOKEN.into()));
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

        let telegram = TelegramSettings::from_config(&config.section().unwrap(), &env)
            .expect("Telegram is configured");
        let telegram: Arc<dyn Adapter> =
            Arc::new(TelegramAdapter::new(telegram).expect("the Telegram adapter"));
        let settings = WebhookSettings::from_config(&config.section().unwrap(), &env)
            .expect("the webhook routes resolve")
            .expect("webhooks are on");
        let webhook = WebhookAdapter::new(settings).expect("the webhook routes are usable");
        let mut ingress = Ingress::bind("127.0.0.1", 0)
            .await
            .expect("the webhook listener binds");
        ingress.mount(webhook.mount());
        let base = format!("http://{}", ingress.local_addr());
        let webhook: Arc<dyn Adapter> = Arc::new(webhook);

        let gateway = Gateway::new(GatewayParts {
            config,
            env,
            home: home.clone(),
            agent,
            store,
            adapters: vec![telegram, webhook],
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

        let rig = WebhookRig {
            tg,
            llm,
            dir,
            home,
            base,
            http: reqwest::Client::new(),
            running: Some((shutdown, task)),
        };
        rig.wait_until_serving().await;
        rig.tg.wait_for_get_updates_calls(1, WAIT).await;
        rig
    }

    /// Waits until the webhook listener answers `/health` with 200: the
    /// adapter's run has attached the gateway's inbox.
    async fn wait_until_serving(&self) {
        let url = format!("{}/health", self.base);
        self.wait_for("the webhook server to answer /health", || async {
            matches!(self.http.get(&url).send().await, Ok(r) if r.status().as_u16() == 200)
        })
        .await;
    }

    /// Posts `body` to `/webhooks/<route>` with these headers.
    pub async fn post(&self, route: &str, headers: &[(&str, String)], body: &[u8]) -> Answer {
        let mut req = self
            .http
            .post(format!("{}/webhooks/{route}", self.base))
            .header("content-type", "application/json")
            .body(body.to_vec());
        for (name, value) in headers {
            req = req.header(*name, value);
        }
        let resp = tokio::time::timeout(WAIT, req.send())
            .await
            .expect("the webhook server answers in time")
            .expect("the webhook request goes through");
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

    /// The contents of the messages of LLM request `i` with this role.
    pub fn messages(&self, i: usize, role: &str) -> Vec<String> {
        let requests = self.llm.requests();
        let Some(messages) = requests[i].body["messages"].as_array() else {
            panic!("LLM request {i} has no messages: {}", requests[i].body);
        };
        messages
            .iter()
            .filter(|m| m["role"] == role)
            .map(|m| m["content"].as_str().unwrap_or("").to_owned())
            .collect()
    }

    /// Waits for `n` Telegram messages in total and returns them all.
    pub async fn sent(&self, n: usize) -> Vec<Sent> {
        self.tg.wait_for_sent(n, WAIT).await
    }

    /// A second connection to the gateway's database, as `talaria` would
    /// open while the gateway runs.
    pub fn store(&self) -> SqliteStore {
        SqliteStore::open(&self.home.state_db()).expect("the state database")
    }

    /// Waits until the ledger holds exactly `n` rows, all delivered (a row
    /// is marked just after the platform took the message, so a test that
    /// saw the message may look a moment too early).
    pub async fn wait_for_ledger_delivered(&self, n: u64) {
        let store = self.store();
        let what = format!("{n} delivered ledger rows and nothing else");
        self.wait_for(&what, || async {
            let counts = store.obligation_counts().await.expect("ledger counts");
            let total: u64 = counts.values().sum();
            counts.get(&ObligationState::Delivered) == Some(&n) && total == n
        })
        .await;
        let open = store.open_obligations(0).await.expect("open obligations");
        assert!(open.is_empty(), "obligations still open: {open:?}");
    }

    /// The sessions the webhook platform started, newest first.
    pub async fn webhook_sessions(&self) -> Vec<SessionRecord> {
        self.store()
            .list_sessions(SessionFilter {
                source: Some("webhook".to_owned()),
                ..SessionFilter::default()
            })
            .await
            .expect("the stored sessions")
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

impl Drop for WebhookRig {
    fn drop(&mut self) {
        if let Some((shutdown, _)) = &self.running {
            shutdown.cancel();
        }
    }
}
