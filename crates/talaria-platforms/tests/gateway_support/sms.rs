//! An in-process gateway for end-to-end tests of the SMS adapter: the real
//! runner, ledger and SMS adapter (its webhook on the shared listener, on
//! a free port of 127.0.0.1) against the fake Twilio, the real OpenAI
//! provider against the mock LLM server, and a real SQLite file.
//!
//! The adapter is built the way `talaria gateway run` builds it: settings
//! from `platforms.sms` and the environment handed to the gateway.
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
use talaria_platforms::ingress::Ingress;
use talaria_platforms::sms::{PATH, SmsAdapter, SmsSettings};
use talaria_store::{LedgerStore, ObligationState, SqliteStore};
use talaria_testkit::twilio::{InboundSms, SentSms, WebhookSender};
use talaria_testkit::{FakeTwilio, MockOpenAi};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const ACCOUNT_SID: &str = "AC00000000000000000000000000000abc";
pub const AUTH_TOKEN: &str = "gateway-twilio-token-0123456789";
/// The gateway's Twilio number.
pub const NUMBER: &str = "+15550001111";
/// The public URL set on the number in Twilio (a proxy in front of the
/// listener): what signatures are computed over.
pub const PUBLIC_URL: &str = "https://sms.example.com/sms/twilio";

/// How long a test waits for something that should happen.
pub const WAIT: Duration = Duration::from_secs(15);

/// How often the polling helpers look again.
const POLL: Duration = Duration::from_millis(20);

pub struct SmsRig {
    pub twilio: FakeTwilio,
    pub llm: MockOpenAi,
    pub dir: tempfile::TempDir,
    pub home: Home,
    /// Posts webhooks as Twilio does, to the listener, signed over
    /// [`PUBLIC_URL`].
    pub sender: WebhookSender,
    http: reqwest::Client,
    base: String,
    running: Option<(CancellationToken, JoinHandle<()>)>,
}

impl SmsRig {
    /// A running gateway with this environment added to the Twilio
    /// settings; returns once the listener's `/health` says the SMS
    /// adapter takes messages.
    pub async fn started(env: &[(&str, &str)]) -> SmsRig {
        let twilio = FakeTwilio::start(ACCOUNT_SID, AUTH_TOKEN, NUMBER);
        let llm = MockOpenAi::start().await;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let home = Home::at(dir.path().join("home"));
        home.ensure().expect("a fresh home");

        let mut config = Config::default();
        config.model.default = Some("test-model".into());
        config.model.base_url = Some(llm.base_url());
        config.platforms.set("sms.api_base", twilio.base_url());
        config.platforms.set("webhook.port", 0);

        let mut pairs: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (k, v) in [
            ("TWILIO_ACCOUNT_SID", ACCOUNT_SID),
            ("TWILIO_AUTH_TOKEN", AUTH_TOKEN),
            ("TWILIO_PHONE_NUMBER", NUMBER),
            ("SMS_WEBHOOK_URL", PUBLIC_URL),
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

        let settings = SmsSettings::from_config(&config.section().unwrap(), &env)
            .expect("the SMS settings resolve")
            .expect("SMS is on");
        let sms = SmsAdapter::new(settings).expect("the SMS adapter");
        let mut ingress = Ingress::bind("127.0.0.1", 0)
            .await
            .expect("the webhook listener binds");
        ingress.mount(sms.mount());
        let base = format!("http://{}", ingress.local_addr());
        let sender = twilio.webhook_sender(&format!("{base}{PATH}"), PUBLIC_URL);
        let sms: Arc<dyn Adapter> = Arc::new(sms);

        let gateway = Gateway::new(GatewayParts {
            config,
            env,
            home: home.clone(),
            agent,
            store,
            adapters: vec![sms],
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

        let rig = SmsRig {
            twilio,
            llm,
            dir,
            home,
            sender,
            http: reqwest::Client::new(),
            base,
            running: Some((shutdown, task)),
        };
        let url = format!("{}/health", rig.base);
        rig.wait_for("the listener to answer /health", || async {
            matches!(rig.http.get(&url).send().await, Ok(r) if r.status().as_u16() == 200)
        })
        .await;
        rig
    }

    /// An SMS from `from` to the gateway's number, with a fresh
    /// `MessageSid`.
    pub fn sms(&self, from: &str, body: &str) -> InboundSms {
        self.twilio.inbound(from, body)
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

    /// The user messages of LLM request `i`.
    pub fn user_messages(&self, i: usize) -> Vec<String> {
        let requests = self.llm.requests();
        let Some(messages) = requests[i].body["messages"].as_array() else {
            panic!("LLM request {i} has no messages: {}", requests[i].body);
        };
        messages
            .iter()
            .filter(|m| m["role"] == "user")
            .map(|m| m["content"].as_str().unwrap_or("").to_owned())
            .collect()
    }

    /// Waits for `n` SMS sent through Twilio in total and returns them.
    pub async fn sent(&self, n: usize) -> Vec<SentSms> {
        self.twilio.wait_for_sent(n, WAIT).await
    }

    /// Waits until the ledger holds exactly `n` rows, all delivered.
    pub async fn wait_for_ledger_delivered(&self, n: u64) {
        let store = SqliteStore::open(&self.home.state_db()).expect("the state database");
        let what = format!("{n} delivered ledger rows and nothing else");
        self.wait_for(&what, || async {
            let counts = store.obligation_counts().await.expect("ledger counts");
            let total: u64 = counts.values().sum();
            counts.get(&ObligationState::Delivered) == Some(&n) && total == n
        })
        .await;
    }

    /// The ledger's rows by state.
    pub async fn ledger_counts(&self) -> std::collections::BTreeMap<ObligationState, u64> {
        let store = SqliteStore::open(&self.home.state_db()).expect("the state database");
        store
            .obligation_counts()
            .await
            .expect("ledger counts")
            .into_iter()
            .collect()
    }

    /// Gives the gateway a moment to do something it should not do.
    pub async fn settle(&self) {
        tokio::time::sleep(Duration::from_millis(700)).await;
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

impl Drop for SmsRig {
    fn drop(&mut self) {
        if let Some((shutdown, _)) = &self.running {
            shutdown.cancel();
        }
    }
}
