//! The adapter contract suite: one in-process rig and one set of scenarios
//! that every adapter runs through its fake, in the spirit of the store's
//! `contract_tests!`.
//!
//! A platform's test file names its kit ([`talaria_testkit::kit`]), says
//! how its adapter is built ([`AdapterKit`], the one place per platform)
//! and invokes [`adapter_contract!`] with the scenarios it runs and the
//! ones it cannot have, each with its reason. A skipped scenario is a
//! declaration checked against the adapter's capabilities, never a test
//! that passes without doing anything.
#![allow(dead_code)]

pub mod scenarios;

use std::path::Path;
use std::sync::Arc;

use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::{Registry, Tool};
use talaria_agent::{Agent, AgentParts};
use talaria_core::{Config, Endpoint, Env, Home, ProviderKind, Redactor};
use talaria_gateway::Adapter;
use talaria_gateway::gateway::{Gateway, GatewayParts};
use talaria_gateway::hooks::Hooks;
use talaria_gateway::supervisor::StatusBoard;
#[cfg(feature = "ingress")]
use talaria_platforms::ingress::Ingress;
use talaria_platforms::registry::{Built, Setup};
use talaria_store::{LedgerStore, ObligationState, SqliteStore};
use talaria_testkit::MockOpenAi;
use talaria_testkit::kit::{Out, PlatformKit};
pub use talaria_testkit::wait::WAIT;
use talaria_testkit::wait::wait_for;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A kit whose adapter the suite can build in process.
pub trait AdapterKit: PlatformKit {
    /// The adapter as `talaria gateway run` builds it from `config` and
    /// `env`, with test timings where the platform has them.
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter>;

    /// The adapter as the registry builds it for `talaria gateway run`,
    /// given the store for its position across restarts (Matrix's sync
    /// token, e-mail's IMAP cursor) and, for a platform that receives by
    /// webhook, with its routes for the shared listener, which the rig
    /// binds where the configuration's `platforms.webhook` says. The
    /// default is [`AdapterKit::adapter`], keeping no position and
    /// mounting nothing.
    fn build(&self, setup: &Setup<'_>) -> Built {
        Built {
            adapter: self.adapter(setup.config, setup.env),
            #[cfg(feature = "ingress")]
            mount: None,
        }
    }

    /// Adapters the gateway runs beside the kit's: where its answers go,
    /// for a platform that is not a chat (a webhook route's `deliver`
    /// target).
    fn beside(&self, _config: &Config, _env: &Env) -> Vec<Arc<dyn Adapter>> {
        Vec::new()
    }

    /// Tools the platform brings to the agent beside the core ones, as
    /// `talaria gateway run` registers them (Home Assistant's `ha_*`).
    fn tools(&self, _config: &Config, _env: &Env) -> Vec<Arc<dyn Tool>> {
        Vec::new()
    }
}

/// The real runner, ledger and agent around one adapter and its fake, the
/// real OpenAI provider against the mock LLM, and a real SQLite file.
pub struct Rig<K> {
    pub kit: K,
    pub llm: MockOpenAi,
    pub dir: tempfile::TempDir,
    pub home: Home,
    pub env: Vec<(String, String)>,
    pub config: Config,
    board: Option<Arc<StatusBoard>>,
    running: Option<(CancellationToken, JoinHandle<()>)>,
}

impl<K: AdapterKit> Rig<K> {
    /// A rig whose gateway is not started yet: the kit's section and
    /// `.env`, then `env` on top, then `configure`.
    pub async fn new(env: &[(&str, &str)], configure: impl FnOnce(&mut Config)) -> Rig<K> {
        let kit = K::start().await;
        let llm = MockOpenAi::start().await;
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        home.ensure().unwrap();
        let yaml = format!("platforms:\n{}", kit.section());
        let (mut config, unknown) = Config::parse(&yaml, Path::new("kit.yaml")).unwrap();
        assert!(
            unknown.is_empty(),
            "the kit's section has unknown keys: {unknown:?}"
        );
        config.model.default = Some("test-model".into());
        config.model.base_url = Some(llm.base_url());
        config.gateway.typing_interval_secs = 1;
        configure(&mut config);
        let mut pairs = kit.dotenv();
        for (k, v) in env {
            pairs.retain(|(old, _)| old != k);
            pairs.push((k.to_string(), v.to_string()));
        }
        Rig {
            kit,
            llm,
            dir,
            home,
            env: pairs,
            config,
            board: None,
            running: None,
        }
    }

    /// A rig whose gateway runs and has connected (or polled) once.
    pub async fn started(env: &[(&str, &str)], configure: impl FnOnce(&mut Config)) -> Rig<K> {
        let mut rig = Rig::<K>::new(env, configure).await;
        let seen = rig.kit.connections();
        rig.start();
        rig.kit.wait_connected(seen + 1).await;
        rig
    }

    /// Builds everything afresh from the home (as a new process would) and
    /// runs the gateway.
    pub fn start(&mut self) {
        assert!(self.running.is_none());
        let env = Env::from_pairs(self.env.clone());
        let config = Arc::new(self.config.clone());
        let store = Arc::new(SqliteStore::open(&self.home.state_db()).unwrap());
        let endpoint = Endpoint {
            provider: ProviderKind::Custom,
            model: "test-model".into(),
            base_url: self.llm.base_url(),
            api_key: None,
        };
        let mut registry = Registry::with_core_tools(&config);
        for tool in self.kit.tools(&config, &env) {
            registry.register(tool).unwrap();
        }
        let agent = Arc::new(Agent::new(AgentParts {
            config: config.clone(),
            home: self.home.clone(),
            // As the binary builds it: `model.vision` decides image parts.
            provider: talaria_llm::provider_with(
                &endpoint,
                talaria_llm::HttpOptions {
                    vision: config.model.vision,
                    ..talaria_llm::HttpOptions::from_agent(&config.agent)
                },
            ),
            store: store.clone(),
            registry: Arc::new(registry),
            interaction: Arc::new(NoHuman),
            redactor: Redactor::default(),
            workdir: self.dir.path().to_path_buf(),
        }));
        let built = self.kit.build(&Setup {
            config: &config,
            env: &env,
            cursors: store.clone(),
            media: talaria_media::MediaCache::for_home(&self.home, &config.media),
            #[cfg(feature = "yuanbao")]
            yuanbao: Default::default(),
        });
        #[cfg(feature = "ingress")]
        let listen = built.mount.map(|mount| {
            let webhook: talaria_platforms::webhook::WebhookConfig = config.section().unwrap();
            (webhook.host, webhook.port, mount)
        });
        let mut adapters = vec![built.adapter];
        adapters.extend(self.kit.beside(&config, &env));
        let gateway = Gateway::new(GatewayParts {
            config,
            env,
            home: self.home.clone(),
            agent,
            store,
            adapters,
            lock_dir: Some(self.dir.path().join("locks")),
            hooks: Arc::new(Hooks::load(&self.home)),
        });
        self.board = Some(gateway.board());
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            // A platform that receives by webhook is served on the shared
            // listener, bound before the gateway runs and released when it
            // stops, as `talaria gateway run` does, so the next gateway of
            // a restart binds the same port.
            #[cfg(feature = "ingress")]
            let server = match listen {
                Some((host, port, mount)) => {
                    let mut ingress = Ingress::bind(&host, port).await.unwrap();
                    ingress.mount(mount);
                    Some(tokio::spawn(ingress.serve(stop.clone())))
                }
                None => None,
            };
            gateway.run(stop).await;
            #[cfg(feature = "ingress")]
            if let Some(server) = server {
                server.await.unwrap().unwrap();
            }
        });
        self.running = Some((shutdown, task));
    }

    /// Stops the gateway gracefully and waits for it.
    pub async fn stop(&mut self) {
        if let Some((shutdown, task)) = self.running.take() {
            shutdown.cancel();
            tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
        }
    }

    /// Stops the gateway and starts a new one on the same home, waiting
    /// for its first connection.
    pub async fn restart(&mut self) {
        self.stop().await;
        let seen = self.kit.connections();
        self.start();
        self.kit.wait_connected(seen + 1).await;
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
    pub async fn sent(&self, n: usize) -> Vec<Out> {
        self.kit.wait_sent(n).await
    }

    /// Waits until some sent message contains `needle`; returns them all.
    pub async fn wait_for_text(&self, needle: &str) -> Vec<Out> {
        talaria_testkit::kit::wait_for_text(&self.kit, needle).await
    }

    /// Waits for `n` LLM requests in total.
    pub async fn llm_requests(&self, n: usize) {
        wait_for(&format!("{n} LLM requests"), || async {
            let got = self.llm.requests().len();
            if got >= n { Ok(()) } else { Err(got) }
        })
        .await;
    }

    /// Waits until the ledger shows exactly `n` delivered rows.
    pub async fn wait_for_delivered(&self, n: u64) {
        let store = SqliteStore::open(&self.home.state_db()).unwrap();
        wait_for(&format!("{n} delivered ledger rows"), || async {
            let counts = store.obligation_counts().await.unwrap();
            if counts.get(&ObligationState::Delivered) == Some(&n) {
                Ok(())
            } else {
                Err(counts)
            }
        })
        .await;
    }

    /// Gives the gateway a moment to do something it should not do.
    pub async fn settle(&self) {
        talaria_testkit::wait::settle().await;
    }

    /// The adapter's liveness and last error on the running gateway's
    /// status board.
    pub fn status(&self) -> Option<(talaria_gateway::Liveness, Option<String>)> {
        self.board
            .as_ref()?
            .snapshot()
            .get(K::NAME)
            .map(|s| (s.liveness, s.last_error.clone()))
    }

    /// The adapter's declared capabilities.
    pub fn capabilities(&self) -> talaria_adapter::capabilities::Capabilities {
        let env = Env::from_pairs(self.env.clone());
        self.kit.adapter(&self.config, &env).capabilities()
    }
}

impl<K> Drop for Rig<K> {
    fn drop(&mut self) {
        if let Some((shutdown, _)) = &self.running {
            shutdown.cancel();
        }
    }
}

/// Why a platform cannot have a scenario; checked against the adapter's
/// capabilities where they say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// The platform has no threads (`Capabilities::threads` is false).
    Threadless,
    /// Deliveries arrive by webhook or polling: no connection to drop.
    Connectionless,
    /// The platform does not rate-limit sends (an answer that rides in
    /// the asker's own HTTP response), or the fake cannot the way it does.
    UnlimitedSends,
    /// The platform never delivers one event twice.
    DeliversOnce,
    /// The adapter joins the runner's parts back and hands the platform
    /// one whole answer (it answers in the asker's own HTTP response, as
    /// Home Assistant's conversation endpoint does): no parts to count.
    Reassembled,
    /// The platform is not a chat (`Capabilities::chat` is false): its
    /// answers go to another platform, whose own kit tests how they are
    /// split.
    NotAChat,
    /// The platform hands over no files (`Capabilities::receives` is
    /// empty).
    ReceivesNoFiles,
    /// The platform sends no files (`Capabilities::sends` is empty): a
    /// file goes as a line naming it.
    SendsNoFiles,
    /// The platform has no shared chats the bot is addressed in: every
    /// conversation is one person's (SMS, a personal account's DMs).
    NoGroups,
}

/// Generates one test per scenario a kit runs, and one test that checks
/// the kit's declared skips against its adapter's capabilities.
///
/// ```ignore
/// adapter_contract!(DiscordKit;
///     run: dm_turn, thread_reply, long_answer, redelivery,
///          dropped_connection, rate_limit, unauthorized;
///     skip: );
/// ```
macro_rules! adapter_contract {
    ($kit:ty; run: $($scenario:ident),* ; skip: $($skipped:ident => $why:expr),* $(,)?) => {
        mod adapter_contract {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    crate::contract::scenarios::$scenario::<$kit>().await;
                }
            )*

            /// Every scenario is either run or skipped with its reason.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn skipped_scenarios_are_declared_and_agree_with_the_capabilities() {
                let run: &[&str] = &[$(stringify!($scenario)),*];
                let skipped: &[(&str, crate::contract::Skip)] =
                    &[$((stringify!($skipped), $why)),*];
                crate::contract::scenarios::check_declaration::<$kit>(run, skipped).await;
            }
        }
    };
}
