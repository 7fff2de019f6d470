//! The runner: every inbound event passes through here, in order.
//!
//! For each event: compute its session key once; authorize the sender
//! (strangers in DMs may get a pairing code, nobody unauthorized reaches the
//! model); answer slash commands without the model; otherwise run an agent
//! turn, or, when the chat's agent is already busy, apply the busy-input
//! mode.
//!
//! # Layout
//!
//! - [`intake`](self::intake): taking an event: its key, authorization
//!   and pairing, deduplication, the owed-turn record, and where it goes
//!   next (a command, a waiting question, a turn).
//! - [`lane`](self::lane): the busy guard as a state machine without I/O:
//!   one lane per session key, what runs, what waits, what is settled.
//! - [`turn`](self::turn): driving a lane's turns: routing, the agent run
//!   with its typing indicator and preview, delivery, the cross-node turn
//!   lease, and coalescing bursts.
//! - [`commands`](self::commands): the chat as a front end of the shared
//!   slash commands ([`crate::slash`]).
//! - [`interaction`](self::interaction): approvals and clarifying
//!   questions asked in the chat.
//! - [`recovery`](self::recovery): owed turns of a dead node, run again or
//!   said lost.
//! - [`jobs`](self::jobs): work that outlives its turn ([`crate::jobs`]):
//!   the reports of the agent's background tools, `/background`, and what
//!   a stop or a restart says about jobs.
//!
//! Hook payloads are the typed events of [`crate::hooks::events`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use talaria_agent::Agent;
use talaria_core::config::BusyInputMode;
use talaria_core::{Config, Env, Home};
use talaria_store::{GatewayStore, NodeId};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::adapter::Admit;
use crate::auth::AuthPolicy;
use crate::delivery::{Address, Delivery};
use crate::event::{MessageEvent, SessionSource};
use crate::hooks::Hooks;
use crate::hooks::events::{self, clip};
use crate::key::{KeyPolicy, SessionKey};
use crate::media::MediaServices;
use crate::pairing::Pairing;
use crate::router::{Routed, Router};
use crate::supervisor::StatusBoard;
use crate::turn_lease::TurnLeases;

mod commands;
mod intake;
pub(crate) use intake::UNREGISTERED;
mod interaction;
mod jobs;
mod lane;
mod recovery;
mod turn;

use lane::{Ack, Lane};

/// At most one "busy" acknowledgement per chat in this window.
const ACK_COOLDOWN: Duration = Duration::from_secs(30);

/// Chats whose acknowledgement time is kept before the expired ones are
/// swept out.
const MAX_ACK_ENTRIES: usize = 1024;

/// Everything the runner is built from.
pub struct RunnerParts {
    /// The loaded configuration.
    pub config: Arc<Config>,
    /// `.env` overlaid by the process environment: allowlists and flags.
    pub env: Env,
    /// The Talaria home (skills, `.env`, the config file).
    pub home: Home,
    /// The agent that runs the turns.
    pub agent: Arc<Agent>,
    /// Routes, owed turns, pairing, dedupe.
    pub store: Arc<dyn GatewayStore>,
    /// Where answers and notices go.
    pub delivery: Delivery,
    /// Adapter liveness, shown by `/status`.
    pub board: Arc<StatusBoard>,
    /// Event hooks; the runner only ever fires them and moves on.
    pub hooks: Arc<Hooks>,
    /// Set when several nodes share the store: each turn then holds the
    /// session's lease there, so no two nodes run one session at once.
    pub turn_leases: Option<TurnLeases>,
    /// This process as a node: the owner of the turns it owes.
    pub node: NodeId,
    /// How attachments are fetched and turned into model input, and
    /// answers spoken.
    pub media: Arc<MediaServices>,
    /// Where each conversation's commands run.
    pub backends: Arc<talaria_exec::Backends>,
}

/// The runner. Cheap to clone; clones share all state.
#[derive(Clone)]
pub struct Runner {
    inner: Arc<Inner>,
}

struct Inner {
    config: Arc<Config>,
    home: Home,
    policy: KeyPolicy,
    auth: AuthPolicy,
    pairing: Pairing,
    router: Router,
    agent: Arc<Agent>,
    store: Arc<dyn GatewayStore>,
    delivery: Delivery,
    board: Arc<StatusBoard>,
    hooks: Arc<Hooks>,
    turn_leases: Option<TurnLeases>,
    node: NodeId,
    media: Arc<MediaServices>,
    backends: Arc<talaria_exec::Backends>,
    lanes: Mutex<HashMap<SessionKey, Lane>>,
    /// When each key was last sent a busy acknowledgement. Kept apart from
    /// the lanes, which go when their queue empties: the cooldown must
    /// outlive them (at most one acknowledgement per chat per window).
    acks: Mutex<HashMap<SessionKey, Instant>>,
    generations: AtomicU64,
    /// Set when the gateway stops: new work is refused.
    draining: AtomicBool,
    /// Every lane driver, so a stopping gateway can wait for them.
    tasks: TaskTracker,
    started: Instant,
    /// Background work open on this node, and where each reports.
    jobs: crate::jobs::Jobs,
    /// Stops `/background` tasks when the gateway stops.
    background: CancellationToken,
    /// The `/background` tasks, so a stop can wait for them to unwind.
    background_tasks: TaskTracker,
    /// What ends the background commands of a session that is reset.
    session_work: std::sync::OnceLock<Arc<dyn talaria_agent::background::SessionWork>>,
}

impl Runner {
    /// A runner over `parts`; nothing runs until [`Runner::serve`].
    pub fn new(parts: RunnerParts) -> Runner {
        let RunnerParts {
            config,
            env,
            home,
            agent,
            store,
            delivery,
            board,
            hooks,
            turn_leases,
            node,
            media,
            backends,
        } = parts;
        let router = Router::new(agent.clone(), store.clone(), config.session_reset.clone());
        Runner {
            inner: Arc::new(Inner {
                policy: KeyPolicy::from_config(&config.gateway),
                auth: AuthPolicy::from_env(&env),
                pairing: Pairing::new(store.clone()),
                router,
                config,
                home,
                agent,
                store,
                delivery,
                board,
                hooks,
                turn_leases,
                node,
                media,
                backends,
                lanes: Mutex::new(HashMap::new()),
                acks: Mutex::new(HashMap::new()),
                generations: AtomicU64::new(1),
                draining: AtomicBool::new(false),
                tasks: TaskTracker::new(),
                started: Instant::now(),
                jobs: crate::jobs::Jobs::default(),
                background: CancellationToken::new(),
                background_tasks: TaskTracker::new(),
                session_work: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Reads events until the inbox closes or `shutdown` fires. Each is
    /// answered with its [`Admission`] as soon as it is taken, before any
    /// command or turn runs, so the adapter can acknowledge it.
    pub async fn serve(
        &self,
        mut inbox: tokio::sync::mpsc::Receiver<Admit>,
        shutdown: CancellationToken,
    ) {
        loop {
            let admit = tokio::select! {
                _ = shutdown.cancelled() => break,
                admit = inbox.recv() => match admit {
                    Some(a) => a,
                    None => break,
                },
            };
            let (event, reply) = admit.into_parts();
            self.accept(event, reply).await;
        }
    }

    /// Whose conversation `source` is (the owner's DM, or anyone else's).
    pub(crate) fn trust_of(&self, source: &SessionSource) -> talaria_exec::Trust {
        let inner = &self.inner;
        let caps = self.capabilities(&source.platform);
        crate::isolation::trust(source, &caps, &inner.config.gateway, &inner.auth)
    }

    /// What `platform`'s adapter declares (a plain chat's, for a platform
    /// with no adapter here).
    pub(crate) fn capabilities(&self, platform: &str) -> talaria_adapter::Capabilities {
        self.inner
            .delivery
            .adapter(platform)
            .map_or(UNREGISTERED, |a| a.capabilities())
    }

    /// Where commands run, for `gateway status`.
    pub fn backend_status(&self) -> Vec<String> {
        self.inner.backends.status_lines()
    }

    /// Session keys with a turn running now.
    pub fn running_sessions(&self) -> Vec<String> {
        self.inner
            .lanes()
            .iter()
            .filter(|(_, lane)| lane.run.is_some())
            .map(|(k, _)| k.to_string())
            .collect()
    }

    /// Messages waiting behind a running turn, in every conversation.
    pub fn queued(&self) -> usize {
        self.inner
            .lanes()
            .values()
            .map(|lane| lane.queue.len())
            .sum()
    }

    /// Stops taking work, lets running turns finish for up to `grace`,
    /// then interrupts what is left and waits briefly for it to unwind.
    pub async fn drain(&self, grace: Duration) {
        let inner = &self.inner;
        inner.draining.store(true, Ordering::SeqCst);
        inner.tasks.close();
        // Background tasks may run for hours: they stop now, and their
        // chats are told so below rather than after a restart.
        inner.background.cancel();
        inner.background_tasks.close();
        if tokio::time::timeout(grace, inner.tasks.wait())
            .await
            .is_err()
        {
            self.interrupt_turns().await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), inner.background_tasks.wait()).await;
        self.report_stopped_jobs().await;
    }

    /// Interrupts the turns still running at the end of a drain and waits
    /// briefly for them to unwind.
    async fn interrupt_turns(&self) {
        let inner = &self.inner;
        tracing::info!("interrupting running turns to shut down");
        for lane in inner.lanes().values_mut() {
            lane.shut_down();
        }
        if tokio::time::timeout(Duration::from_secs(5), inner.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("some turns did not stop in time");
        }
    }
}

impl Inner {
    /// `session:end` and `session:start` for what routing just did.
    fn session_hooks(&self, key: &SessionKey, source: &SessionSource, routed: &Routed) {
        let Some(reason) = routed.started else {
            return;
        };
        if let Some(ended) = &routed.ended {
            self.hooks.fire(&events::SessionEnd {
                platform: &source.platform,
                session_key: key.as_str(),
                session_id: ended,
                reason: reason.as_str(),
            });
        }
        self.hooks.fire(&events::SessionStart {
            platform: &source.platform,
            session_key: key.as_str(),
            session_id: &routed.handle.id,
            user_id: source.user_id.as_deref(),
            reason: reason.as_str(),
        });
    }

    fn lanes(&self) -> MutexGuard<'_, HashMap<SessionKey, Lane>> {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A generation no run of this process had before.
    fn next_generation(&self) -> u64 {
        self.generations.fetch_add(1, Ordering::SeqCst)
    }

    /// Whether a busy acknowledgement may go to `key` now (at most one per
    /// [`ACK_COOLDOWN`]); if so, starts the cooldown.
    fn ack_due(&self, key: &SessionKey) -> bool {
        let mut acks = self.acks.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if acks.len() >= MAX_ACK_ENTRIES {
            // Only entries still cooling down matter; the rest can go, so
            // the map stays as small as the chats acknowledged recently.
            acks.retain(|_, at| now.duration_since(*at) < ACK_COOLDOWN);
        }
        let due = acks
            .get(key)
            .is_none_or(|at| now.duration_since(*at) >= ACK_COOLDOWN);
        if due {
            acks.insert(key.clone(), now);
        }
        due
    }

    /// Sends a busy acknowledgement to `to` in the background, when they
    /// are on and `key`'s cooldown allows one.
    fn acknowledge(&self, key: &SessionKey, to: Address, ack: Ack) {
        if !self.config.gateway.busy_ack || !self.ack_due(key) {
            return;
        }
        let delivery = self.delivery.clone();
        tokio::spawn(async move { delivery.notify(&to, ack.text()).await });
    }

    /// The configured busy mode.
    fn busy_mode(&self) -> BusyInputMode {
        self.config.gateway.busy_input_mode
    }
}

/// The sender as prompts see it: hashed, since raw platform ids never
/// leave the process.
fn user_hash(source: &SessionSource) -> Option<String> {
    source
        .user_id
        .as_deref()
        .map(|u| talaria_core::ids::hash_id("user", u))
}

/// The text the agent sees: the message, with what it replies to, and in
/// shared chats who wrote it (the platform id hashed:
/// raw ids never enter a prompt).
fn prompt_text(event: &MessageEvent) -> String {
    let mut text = String::new();
    let s: &SessionSource = &event.source;
    if s.chat_type.is_shared() {
        let who = user_hash(s).unwrap_or_else(|| "anonymous".to_owned());
        match &s.user_name {
            Some(name) => text.push_str(&format!("[{name} · {who}] ")),
            None => text.push_str(&format!("[{who}] ")),
        }
    }
    if let Some(quoted) = &event.reply_to_text {
        text.push_str(&format!("(replying to: \"{}\")\n", clip(quoted)));
    }
    // Attachments are added when the turn has fetched them
    // ([`crate::media`]).
    text.push_str(&event.text);
    text
}
