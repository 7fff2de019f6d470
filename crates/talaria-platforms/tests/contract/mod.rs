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
use std::sync::atomic::{AtomicUsize, Ordering};

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
use talaria_store::{LedgerStore, ObligationState, OwedTurnStore, SqliteStore};
use talaria_testkit::kit::{Out, PlatformKit, Who};
pub use talaria_testkit::wait::WAIT;
use talaria_testkit::wait::wait_for;
use talaria_testkit::{MockOpenAi, Reply};
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
    markers: Markers,
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
            markers: Markers::default(),
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
            home: &self.home,
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

    /// The observed point after which a test may assert that something
    /// did *not* happen (a second turn, an answer to a stranger, a
    /// duplicate send): everything pushed before it has been decided on
    /// and every turn it started has made its model call.
    ///
    /// Waits until the adapter handed over all it was given (where the
    /// platform shows that), then sends a marker, a DM from the friend
    /// with a reply reserved for its text, and waits for its answer. The
    /// runner's intake takes one event at a time, in the order the adapter
    /// hands them over, and decides each before the next: a command is
    /// answered, a pairing offer sent, a repeat or a stranger dropped, and
    /// a message that starts a turn recorded as owed. So by the marker's
    /// answer every earlier event was decided, and a turn taken for one is
    /// either still owed (the check here fails) or was answered, which it
    /// is only after its model call. The counts a test asserts next are
    /// final and include the marker: one more model call, one more sent
    /// message, one more delivered ledger row.
    pub async fn barrier(&self) {
        self.kit.wait_handed_over().await;
        // A marker that met a turn still finishing in its chat would be
        // told the chat is busy: the answers on their way go out first.
        wait_for_answers_out(&self.home).await;
        let marker = self.markers.next(&self.llm);
        self.kit.push_dm(Who::Friend, &marker.text);
        self.wait_for_text(&marker.answer).await;
        assert_nothing_owed(&self.home).await;
        // Its turn is over once the answer is delivered: a message the test
        // sends next in the friend's chat is not met as a busy notice.
        wait_for_answers_out(&self.home).await;
    }

    /// See [`assert_nothing_owed`].
    pub async fn assert_nothing_owed(&self) {
        assert_nothing_owed(&self.home).await;
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

/// The markers a rig sends (see [`Rig::barrier`]), each with a text and an
/// answer of its own.
#[derive(Default)]
pub struct Markers(AtomicUsize);

/// One marker: what the friend writes and what the model answers.
pub struct Marker {
    pub text: String,
    pub answer: String,
}

impl Markers {
    /// The next marker, its answer reserved on `llm` for the request
    /// that carries its text (so no other turn can take it).
    pub fn next(&self, llm: &MockOpenAi) -> Marker {
        let n = self.0.fetch_add(1, Ordering::Relaxed) + 1;
        let marker = Marker {
            text: format!("marker {n} please"),
            answer: format!("marker {n} answered"),
        };
        llm.push_when(&marker.text, Reply::text(marker.answer.clone()));
        marker
    }
}

/// Waits until the ledger of the gateway at `home` holds no answer still
/// on its way (pending, or a send in progress).
pub async fn wait_for_answers_out(home: &Home) {
    let store = SqliteStore::open(&home.state_db()).unwrap();
    wait_for("no answer on its way in the ledger", || async {
        let counts = store.obligation_counts().await.unwrap();
        let moving = [ObligationState::Pending, ObligationState::Attempting]
            .iter()
            .any(|s| counts.get(s).is_some_and(|n| *n > 0));
        if moving { Err(counts) } else { Ok(()) }
    })
    .await;
}

/// No message the gateway at `home` took is still owed an answer. Called
/// once an answer to a later message is out (see [`Rig::barrier`]), it
/// shows that no earlier message started a turn that has not made its
/// model call (or said it failed) yet. An answer is stored, settling its
/// own owed turn, before it is sent, so the later message's turn is no
/// exception.
pub async fn assert_nothing_owed(home: &Home) {
    let store = SqliteStore::open(&home.state_db()).unwrap();
    let owed = store.owed_turn_count().await.unwrap();
    assert_eq!(
        owed, 0,
        "a message the gateway took still waits for its turn"
    );
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
