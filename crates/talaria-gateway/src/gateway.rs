//! The assembled gateway: adapters under supervision, the runner reading
//! their inbox, the ledger sweeps, the status file, background maintenance
//! (ledger pruning, the session-expiry watcher; see [`crate::maintenance`])
//! and an orderly stop.

use std::sync::Arc;
use std::time::Duration;

use talaria_agent::Agent;
use talaria_core::config::StoreBackend;
use talaria_core::{Config, Env, Home};
use talaria_store::{GatewayStore, NodeId};
use tokio_util::sync::CancellationToken;

use crate::adapter::{Adapter, Inbox, Liveness};
use crate::cron::{Scheduler, SchedulerParts};
use crate::delivery::Delivery;
use crate::hooks::{Hooks, events};
use crate::ledger::Ledger;
use crate::maintenance::{Maintenance, PeriodicTask};
use crate::node::Node;
use crate::process::{AdapterStatus, GatewayStatus, write_status};
use crate::router::{EXPIRY_FIRST_RUN, EXPIRY_INTERVAL, ExpiryWatcher};
use crate::runner::{Runner, RunnerParts};
use crate::supervisor::{Leadership, StatusBoard, supervise};
use crate::target::HomeChannels;
use crate::turn_lease::TurnLeases;

/// Events waiting for the runner; an adapter blocks (and so does not
/// acknowledge its platform) while this is full.
const INBOX_CAPACITY: usize = 256;

/// How often the status file is rewritten when nothing changes (uptime
/// and ledger counts still move).
const STATUS_INTERVAL: Duration = Duration::from_secs(2);

/// After a change, how long the writer waits for more before writing, so
/// a burst of changes costs one write.
const STATUS_DEBOUNCE: Duration = Duration::from_millis(50);

/// How long a stopping gateway waits for its `gateway:shutdown` hooks;
/// runs still going then are killed.
const SHUTDOWN_HOOKS_WAIT: Duration = Duration::from_secs(15);

/// How often the ledger is swept besides when adapters go live.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// How often approvals made from the command line are looked for, to tell
/// the approved users (see [`crate::pairing::tell_approved`]).
const APPROVAL_NOTICE_INTERVAL: Duration = Duration::from_secs(3);

/// How often delivered and abandoned ledger rows are pruned.
const PRUNE_INTERVAL: Duration = Duration::from_secs(3600);

/// How often a node on a shared store sends memory and skill files changed
/// outside a tool and applies what other nodes changed. Tools and new
/// sessions do both at once; this catches everything else.
const SHARED_HOME_INTERVAL: Duration = Duration::from_secs(30);

/// How often containers of dead gateways are swept and idle ones removed.
const CONTAINER_REAP_INTERVAL: Duration = Duration::from_secs(60);

/// How often the scheduler looks for due jobs: one indexed query, so a
/// job starts within seconds of its time.
const CRON_TICK: Duration = Duration::from_secs(10);

/// How often the skills curator checks whether it is due (it runs at most
/// once per `curator.interval_hours`).
const CURATOR_INTERVAL: Duration = Duration::from_secs(3600);

/// How often runs left `running` by a dead process are marked interrupted.
const CRON_STALE_INTERVAL: Duration = Duration::from_secs(3600);

/// How long an inbound id is remembered for dedupe. Platforms re-deliver
/// within minutes (Slack) or on the next sync after a crash (Matrix); a
/// week covers a gateway that was down over a long weekend.
const INBOUND_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Everything a gateway is built from.
pub struct GatewayParts {
    /// The loaded configuration.
    pub config: Arc<Config>,
    /// The environment (`.env` and process) the adapters were set up from.
    pub env: Env,
    /// The Talaria home: PID file, state file and outputs live under it.
    pub home: Home,
    /// Runs the turns.
    pub agent: Arc<Agent>,
    /// Sessions, routes, the ledger and cron jobs.
    pub store: Arc<dyn GatewayStore>,
    /// The connected platform adapters, one per platform.
    pub adapters: Vec<Arc<dyn Adapter>>,
    /// Where credential locks live; `None` for the per-user default
    /// (`$TALARIA_GATEWAY_LOCK_DIR`, else the XDG state directory).
    pub lock_dir: Option<std::path::PathBuf>,
    /// Event hooks (`Hooks::load`, or `Hooks::none()`).
    pub hooks: Arc<Hooks>,
}

/// A gateway ready to run.
pub struct Gateway {
    /// This process as a node of the deployment: the owner of its ledger
    /// rows, kept alive by a heartbeat while it runs.
    node: Node,
    config: Arc<Config>,
    home: Home,
    adapters: Vec<Arc<dyn Adapter>>,
    lock_dir: Option<std::path::PathBuf>,
    runner: Runner,
    delivery: Delivery,
    board: Arc<StatusBoard>,
    hooks: Arc<Hooks>,
    /// For the maintenance tasks (the expiry watcher).
    store: Arc<dyn GatewayStore>,
    /// Runs scheduled jobs; `None` when `cron.enabled` is off.
    scheduler: Option<Scheduler>,
    /// The agent, for what maintenance tells it (sessions ended).
    agent: Arc<Agent>,
    /// Attachments in, speech out (shared with the runner).
    media: Arc<crate::media::MediaServices>,
    /// Where conversations' commands run (shared with the runner).
    backends: Arc<talaria_exec::Backends>,
}

impl Gateway {
    /// How files are taken and answers spoken, for the API server that
    /// runs beside the gateway.
    pub fn media(&self) -> Arc<crate::media::MediaServices> {
        self.media.clone()
    }

    /// Builds the gateway's parts (router, runner, delivery, scheduler)
    /// from `parts`; nothing connects until it runs.
    pub fn new(parts: GatewayParts) -> Gateway {
        let GatewayParts {
            config,
            env,
            home,
            agent,
            store,
            adapters,
            lock_dir,
            hooks,
        } = parts;
        let node = Node::current();
        let ledger = config
            .gateway
            .delivery_ledger
            .then(|| Ledger::new(store.clone(), node.id().clone()));
        let platforms: Vec<&str> = adapters.iter().map(|a| a.platform()).collect();
        let homes = HomeChannels::load(&config.gateway.home_channels, &env, &platforms);
        let delivery = Delivery::new(adapters.clone(), ledger)
            .with_homes(Arc::new(homes))
            .with_local_dir(home.cron_output_dir())
            .with_file_roots(crate::parts::FileRoots::new([
                agent.parts().workdir.clone(),
                home.media_dir(),
                home.cron_output_dir(),
                // Files an isolated conversation made; its answers name
                // nothing else (the agent checks them against its own
                // workspace).
                config
                    .terminal
                    .workspaces_dir
                    .clone()
                    .unwrap_or_else(|| home.root().join("workspaces")),
            ]));
        process_started_unix();
        let board = Arc::new(StatusBoard::default());
        let (media, problems) = crate::media::MediaServices::from_config(
            &config,
            &env,
            &home,
            agent.parts().provider.model(),
        );
        for p in problems {
            tracing::warn!("{p}");
        }
        let media = Arc::new(media);
        let backends = Arc::new(talaria_exec::Backends::new(
            &config.terminal,
            &home,
            agent.parts().workdir.clone(),
        ));
        let runner = Runner::new(RunnerParts {
            backends: backends.clone(),
            config: config.clone(),
            env,
            home: home.clone(),
            agent: agent.clone(),
            store: store.clone(),
            delivery: delivery.clone(),
            board: board.clone(),
            hooks: hooks.clone(),
            media: media.clone(),
            turn_leases: (config.store.backend == StoreBackend::Postgres)
                .then(|| TurnLeases::new(store.clone(), node.id().clone())),
            node: node.id().clone(),
        });
        let scheduler = if config.cron.enabled {
            let parts = SchedulerParts {
                config: config.clone(),
                home: home.clone(),
                agent: agent.clone(),
                store: store.clone(),
                delivery: delivery.clone(),
                hooks: hooks.clone(),
                await_hooks: false,
                backends: Some(backends.clone()),
            };
            Scheduler::new(parts)
                .inspect_err(|e| tracing::error!("scheduled jobs will not run: {e}"))
                .ok()
        } else {
            None
        };
        Gateway {
            node,
            config,
            home,
            adapters,
            lock_dir,
            runner,
            delivery,
            board,
            hooks,
            store,
            scheduler,
            agent,
            media,
            backends,
        }
    }

    /// Where conversations' commands run, for the API server that runs
    /// beside the gateway.
    pub fn backends(&self) -> Arc<talaria_exec::Backends> {
        self.backends.clone()
    }

    /// The scheduler of cron jobs, when `cron.enabled` (the agent's
    /// `cronjob` tool binds to it to run jobs on request).
    pub fn scheduler(&self) -> Option<Scheduler> {
        self.scheduler.clone()
    }

    /// Where replies and messages go out: the adapters, home channels and
    /// ledger (the agent's `send_message` tool binds to it).
    pub fn delivery(&self) -> Delivery {
        self.delivery.clone()
    }

    /// Where the agent's tools report work that outlives its turn (bind it
    /// to their `ReportsSlot`): the chat that started it, through the
    /// delivery ledger.
    pub fn reports(&self) -> Arc<dyn talaria_agent::background::Reports> {
        self.runner.reports()
    }

    /// Binds what holds the background commands of the sessions (the
    /// agent's process registry): `/status` lists them, and `/new` ends
    /// them (`terminal.background.kill_on_reset`).
    pub fn bind_session_work(&self, work: Arc<dyn talaria_agent::background::SessionWork>) {
        self.runner.bind_session_work(work);
    }

    /// The adapters' states, as `/status` and the state file show them
    /// (services outside the adapters, such as the API server, report
    /// here too).
    pub fn board(&self) -> Arc<StatusBoard> {
        self.board.clone()
    }

    /// Counts the chats with a turn running now; it stays usable after
    /// the gateway moved into [`Gateway::run`] (the API server's health
    /// report reads it).
    pub fn running_turns(&self) -> Arc<dyn Fn() -> usize + Send + Sync> {
        let runner = self.runner.clone();
        Arc::new(move || runner.running_sessions().len())
    }

    /// This gateway's identity in the shared store.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Turn leases for front ends that run turns themselves (the API
    /// server), when the store is shared by several nodes.
    pub fn turn_leases(&self) -> Option<TurnLeases> {
        (self.config.store.backend == StoreBackend::Postgres)
            .then(|| TurnLeases::new(self.store.clone(), self.node.id().clone()))
    }

    /// Lock files on one machine; leases when the store is shared by
    /// several nodes (PostgreSQL), where a lock file would only see this
    /// host.
    fn leadership(&self) -> Leadership {
        match self.config.store.backend {
            StoreBackend::Sqlite => Leadership::MachineLock(self.lock_dir.clone()),
            StoreBackend::Postgres => Leadership::StoreLease {
                store: self.store.clone(),
                node: self.node.id().clone(),
            },
        }
    }

    /// Runs until `shutdown` fires, then stops in order: adapters stop
    /// receiving, events already received are still taken, running turns
    /// get `gateway.drain_timeout_secs` to finish before they are
    /// interrupted, `gateway:shutdown` hooks get a bounded wait, the
    /// maintenance tasks stop (a chore already running finishes first),
    /// scheduled jobs still running get the same grace as turns, and the
    /// status file says `stopped`.
    pub async fn run(self, shutdown: CancellationToken) {
        let platforms: Vec<&str> = self.adapters.iter().map(|a| a.platform()).collect();
        self.hooks.fire(&events::GatewayStartup {
            platforms: &platforms,
        });
        // Alive before anything is recorded under this node's name; the
        // heartbeat keeps it so until the very end of the stop.
        if let Err(e) = self.node.announce(self.store.as_ref()).await {
            tracing::warn!(error = %e, "cannot announce this gateway in the store; retrying with the heartbeat");
        }
        let beating = CancellationToken::new();
        let heartbeat = tokio::spawn(crate::node::heartbeat(
            self.store.clone(),
            self.node.clone(),
            beating.clone(),
        ));
        let (inbox, events) = Inbox::admitting(INBOX_CAPACITY);
        let receiving = CancellationToken::new();
        let mut supervisors = Vec::new();
        for adapter in &self.adapters {
            supervisors.push(tokio::spawn(supervise(
                adapter.clone(),
                inbox.clone(),
                self.board.clone(),
                self.delivery.clone(),
                self.leadership(),
                receiving.clone(),
            )));
        }
        // The runner reads until every sender is gone: after the adapters
        // stop, nothing they already handed over is lost.
        drop(inbox);
        let runner = self.runner.clone();
        let reader = tokio::spawn(async move {
            runner.serve(events, CancellationToken::new()).await;
        });
        let background = CancellationToken::new();
        let status = tokio::spawn(status_writer(
            self.home.clone(),
            self.runner.clone(),
            self.board.clone(),
            self.delivery.clone(),
            // Store leases are PostgreSQL's: on SQLite the machine lock
            // decides, and there is nothing to count every tick.
            (self.config.store.backend == StoreBackend::Postgres)
                .then(|| (self.store.clone(), self.node.id().clone())),
            background.clone(),
        ));
        let maintenance = Maintenance::start(self.maintenance_tasks());
        let recovery = tokio::spawn(recover_owed_turns(
            self.runner.clone(),
            self.board.clone(),
            receiving.clone(),
        ));
        // `talaria send` hands messages over here; taken until the stop
        // begins, like messages from the platforms.
        let control = {
            let path = self.home.gateway_socket();
            let delivery = self.delivery.clone();
            let stop = receiving.clone();
            tokio::spawn(async move {
                if let Err(e) = crate::control::serve(path.clone(), delivery, stop).await {
                    tracing::warn!(path = %path.display(), error = %e, "cannot serve the control socket; `talaria send` will send directly instead");
                }
            })
        };

        shutdown.cancelled().await;
        tracing::info!("stopping: no new messages are taken");
        receiving.cancel();
        for task in supervisors {
            let _ = task.await;
        }
        let _ = control.await;
        let _ = recovery.await;
        let _ = reader.await;
        let grace = Duration::from_secs(self.config.gateway.drain_timeout_secs);
        self.runner.drain(grace).await;
        // No tick starts a job from here on; jobs already running get the
        // same grace as turns.
        maintenance.stop().await;
        if let Some(scheduler) = &self.scheduler {
            scheduler.stop(grace).await;
        }
        if self.hooks.wants(events::GATEWAY_SHUTDOWN) {
            let shutdown = events::GatewayShutdown::default();
            let hooks = self.hooks.fire_and_wait(&shutdown);
            if tokio::time::timeout(SHUTDOWN_HOOKS_WAIT, hooks)
                .await
                .is_err()
            {
                tracing::warn!("shutdown hooks did not finish in time; killed them");
            }
        }
        background.cancel();
        let _ = status.await;
        beating.cancel();
        let _ = heartbeat.await;
        write_snapshot(
            &self.home,
            &self.runner,
            &self.board,
            &self.delivery,
            "stopped",
        )
        .await;
        tracing::info!("gateway stopped");
    }
}

/// Takes up the messages dead nodes accepted and never answered (see
/// [`crate::owed`]): whenever a platform goes live (a restart's first
/// connection included, so the previous process's messages are taken up
/// at once) and every [`SWEEP_INTERVAL`] (another node that died while
/// this one stayed up), until the stop begins.
async fn recover_owed_turns(runner: Runner, board: Arc<StatusBoard>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = board.went_live() => {}
            _ = tokio::time::sleep(SWEEP_INTERVAL) => {}
        }
        runner.recover_owed(&board.live()).await;
    }
}

async fn status_writer(
    home: Home,
    runner: Runner,
    board: Arc<StatusBoard>,
    delivery: Delivery,
    leases: Option<(Arc<dyn GatewayStore>, NodeId)>,
    stop: CancellationToken,
) {
    loop {
        write_snapshot(&home, &runner, &board, &delivery, "running").await;
        if let Some((store, me)) = &leases {
            count_connector_leases(store.as_ref(), me).await;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(STATUS_INTERVAL) => {}
            _ = board.changed() => {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(STATUS_DEBOUNCE) => {}
                }
            }
        }
    }
}

/// Sets the `/metrics` gauge of the connector leases this node holds:
/// one per platform credential at most, so the query stays small however
/// much the store holds (turn leases, one per conversation ever run on a
/// shared store, are left out for that reason).
async fn count_connector_leases(store: &dyn GatewayStore, me: &NodeId) {
    let (Ok(now), Ok(leases)) = (store.clock().await, store.leases("connector:").await) else {
        return;
    };
    let held = leases
        .iter()
        .filter(|l| l.holder == *me && l.lease_until > now)
        .count();
    talaria_core::metrics::node_leases("connector", held);
}

async fn write_snapshot(
    home: &Home,
    runner: &Runner,
    board: &StatusBoard,
    delivery: &Delivery,
    state: &str,
) {
    let ledger: std::collections::BTreeMap<String, u64> = match delivery.ledger() {
        Some(l) => l
            .counts()
            .await
            .map(|c| {
                c.into_iter()
                    .map(|(s, n)| (s.as_str().to_owned(), n))
                    .collect()
            })
            .unwrap_or_default(),
        None => Default::default(),
    };
    // The gauges a scrape of `/metrics` reads are brought up to date with
    // the status file, so both say the same.
    for (state, rows) in &ledger {
        talaria_core::metrics::ledger_rows(state, *rows);
    }
    talaria_core::metrics::busy_queued(runner.queued());
    let me = crate::owner::current();
    let status = GatewayStatus {
        node: delivery.ledger().map(|l| l.node().to_string()),
        pid: me.pid,
        started_at_unix: process_started_unix(),
        state: state.to_owned(),
        adapters: board
            .snapshot()
            .into_iter()
            .map(|(p, s)| {
                (
                    p,
                    AdapterStatus {
                        liveness: s.liveness.to_string(),
                        since: s.since,
                        last_error: s.last_error,
                    },
                )
            })
            .collect(),
        running_sessions: runner.running_sessions(),
        ledger,
        commands: runner.backend_status(),
        updated_at: talaria_core::unix_now(),
    };
    let home = home.clone();
    let result = tokio::task::spawn_blocking(move || write_status(&home, &status)).await;
    if let Ok(Err(e)) = result {
        tracing::debug!(error = %e, "cannot write the status file");
    }
}

/// Forgets the files users sent once they are `media.retention_days` old
/// (and what an interrupted download left); `None` when the retention is 0
/// (keep them).
fn media_sweep(home: &Home, config: &Config) -> Option<PeriodicTask> {
    let days = config.media.retention_days;
    if days == 0 {
        return None;
    }
    let keep = Duration::from_secs(days.saturating_mul(24 * 3600));
    let cache = talaria_media::MediaCache::for_home(home, &config.media);
    Some(PeriodicTask::new(
        "media-sweep",
        PRUNE_INTERVAL,
        move || {
            let cache = cache.clone();
            async move {
                let report = cache
                    .sweep(keep)
                    .await
                    .map_err(|e| format!("cannot sweep the media cache: {e}"))?;
                if report.removed + report.removed_temp > 0 {
                    tracing::info!(
                        files = report.removed,
                        partial = report.removed_temp,
                        bytes = report.freed_bytes,
                        "forgot old media files"
                    );
                }
                Ok(())
            }
        },
    ))
}

/// When this process started, as wall-clock seconds.
fn process_started_unix() -> f64 {
    static STARTED: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *STARTED.get_or_init(talaria_core::unix_now)
}

impl Gateway {
    /// The periodic chores, each supervised (see [`crate::maintenance`]).
    fn maintenance_tasks(&self) -> Vec<PeriodicTask> {
        let mut tasks = Vec::new();
        if self.delivery.ledger().is_some() {
            let delivery = self.delivery.clone();
            tasks.push(PeriodicTask::new(
                "ledger-prune",
                PRUNE_INTERVAL,
                move || prune_ledger(delivery.clone()),
            ));
            // Sweeps happen when an adapter goes live; this one catches the
            // rest: replies owed by a node that died while this one's
            // adapters stayed up, and this node's own failed sends.
            let (delivery, board) = (self.delivery.clone(), self.board.clone());
            tasks.push(PeriodicTask::new(
                "ledger-sweep",
                SWEEP_INTERVAL,
                move || {
                    let (delivery, board) = (delivery.clone(), board.clone());
                    async move {
                        crate::supervisor::sweep_platforms(board.live(), &delivery).await;
                        Ok(())
                    }
                },
            ));
        }
        let (store, delivery) = (self.store.clone(), self.delivery.clone());
        tasks.push(PeriodicTask::new(
            "pairing-notices",
            APPROVAL_NOTICE_INTERVAL,
            move || {
                let (store, delivery) = (store.clone(), delivery.clone());
                async move {
                    crate::pairing::tell_approved(store.as_ref(), &delivery)
                        .await
                        .map(drop)
                        .map_err(|e| format!("cannot look for approvals to announce: {e}"))
                }
            },
        ));
        let store = self.store.clone();
        tasks.push(PeriodicTask::new(
            "nodes-forget",
            PRUNE_INTERVAL,
            move || {
                let store = store.clone();
                async move {
                    crate::node::forget_dead(store.as_ref())
                        .await
                        .map(drop)
                        .map_err(|e| format!("cannot forget dead nodes: {e}"))
                }
            },
        ));
        let store = self.store.clone();
        tasks.push(PeriodicTask::new(
            "inbound-prune",
            PRUNE_INTERVAL,
            move || {
                let store = store.clone();
                async move {
                    let cutoff = talaria_core::unix_now() - INBOUND_RETENTION.as_secs_f64();
                    match store.prune_inbound(cutoff).await {
                        Ok(0) => Ok(()),
                        Ok(n) => {
                            tracing::info!(rows = n, "forgot old inbound message ids");
                            Ok(())
                        }
                        Err(e) => Err(format!("cannot prune inbound message ids: {e}")),
                    }
                }
            },
        ));
        if let Some(task) = media_sweep(&self.home, &self.config) {
            tasks.push(task);
        }
        if self.store.shared_files().is_some() {
            // Memory and skills changed on this node outside a tool (by
            // hand, by a CLI command, before this node joined) reach the
            // others; the first run is at start.
            let (store, home) = (self.store.clone(), self.home.clone());
            tasks.push(PeriodicTask::new(
                "shared-home",
                SHARED_HOME_INTERVAL,
                move || {
                    let (store, home) = (store.clone(), home.clone());
                    async move {
                        let Some(files) = store.shared_files() else {
                            return Ok(());
                        };
                        match talaria_agent::shared_home::reconcile(&home, files).await {
                            Ok((0, 0)) => Ok(()),
                            Ok((sent, applied)) => {
                                tracing::info!(sent, applied, "memory and skills in step");
                                Ok(())
                            }
                            Err(e) => Err(format!("cannot keep memory and skills in step: {e}")),
                        }
                    }
                },
            ));
        }
        // The first run is at start: containers a killed gateway left are
        // swept before any conversation needs one.
        let backends = self.backends.clone();
        tasks.push(PeriodicTask::new(
            "command-backends",
            CONTAINER_REAP_INTERVAL,
            move || {
                let backends = backends.clone();
                async move {
                    backends.check().await;
                    if let Some(done) = backends.start().await {
                        tracing::info!("{done}");
                    }
                    backends.reap_idle().await;
                    Ok(())
                }
            },
        ));
        if let Some(scheduler) = &self.scheduler {
            let ticker = scheduler.clone();
            tasks.push(PeriodicTask::new("cron-tick", CRON_TICK, move || {
                let scheduler = ticker.clone();
                async move {
                    scheduler
                        .tick(chrono::Utc::now())
                        .await
                        .map(drop)
                        .map_err(|e| format!("cannot check for due cron jobs: {e}"))
                }
            }));
            let sweeper = scheduler.clone();
            tasks.push(PeriodicTask::new(
                "cron-stale-runs",
                CRON_STALE_INTERVAL,
                move || {
                    let scheduler = sweeper.clone();
                    async move {
                        match scheduler.mark_abandoned_runs(chrono::Utc::now()).await {
                            Ok(0) => Ok(()),
                            Ok(n) => {
                                tracing::warn!(
                                    runs = n,
                                    "cron runs whose process died are marked interrupted"
                                );
                                Ok(())
                            }
                            Err(e) => Err(format!("cannot check for abandoned cron runs: {e}")),
                        }
                    }
                },
            ));
        }
        if self.config.curator.enabled {
            let (store, home, config) = (
                self.store.clone(),
                self.home.clone(),
                self.config.curator.clone(),
            );
            tasks.push(PeriodicTask::new("curator", CURATOR_INTERVAL, move || {
                curate(store.clone(), home.clone(), config.clone())
            }));
        }
        let policy = self.config.session_reset.clone();
        if policy.mode != talaria_core::config::ResetMode::None {
            let runner = self.runner.clone();
            let mut watcher = ExpiryWatcher::new(
                self.store.clone(),
                policy,
                self.hooks.clone(),
                Arc::new(move |key: &str| runner.running_sessions().iter().any(|k| k == key)),
            );
            if let Some(memory) = self.agent.memory().cloned() {
                watcher = watcher
                    .with_on_end(Arc::new(move |session: &str| memory.session_ended(session)));
            }
            let watcher = Arc::new(watcher);
            tasks.push(
                PeriodicTask::new("session-expiry", EXPIRY_INTERVAL, move || {
                    let watcher = watcher.clone();
                    async move {
                        watcher
                            .pass(chrono::Utc::now())
                            .await
                            .map(drop)
                            .map_err(|e| format!("cannot end expired sessions: {e}"))
                    }
                })
                .first_run_after(EXPIRY_FIRST_RUN),
            );
        }
        tasks
    }
}

/// One look by the skills curator (it runs when its interval has passed),
/// sparing the skills a cron job loads.
async fn curate(
    store: Arc<dyn GatewayStore>,
    home: Home,
    config: talaria_core::config::CuratorConfig,
) -> Result<(), String> {
    let library = talaria_learning::Library::new(&home);
    // It runs weekly; the hourly look reads the cron jobs only when due.
    if !talaria_learning::curator::is_due(&library, &config, chrono::Utc::now()) {
        return Ok(());
    }
    let in_use: std::collections::HashSet<String> = store
        .jobs()
        .await
        .map_err(|e| format!("cannot read the cron jobs: {e}"))?
        .into_iter()
        .flat_map(|j| j.skills)
        .collect();
    tokio::task::spawn_blocking(move || {
        talaria_learning::curator::run_if_due(&library, &config, &in_use, chrono::Utc::now())
            .map(drop)
            .map_err(|e| format!("the skills curator failed: {e}"))
    })
    .await
    .map_err(|e| e.to_string())?
}

/// One pruning of delivered and abandoned ledger rows.
async fn prune_ledger(delivery: Delivery) -> Result<(), String> {
    let Some(ledger) = delivery.ledger() else {
        return Ok(());
    };
    match ledger.prune().await {
        Ok(0) => Ok(()),
        Ok(n) => {
            tracing::info!(rows = n, "pruned old delivery ledger rows");
            Ok(())
        }
        Err(e) => Err(format!("cannot prune the delivery ledger: {e}")),
    }
}

/// Marks a service that is not an adapter (the API server) on the board.
pub fn report_service(board: &StatusBoard, name: &str, live: bool, error: Option<String>) {
    board.set(
        name,
        if live {
            Liveness::Live
        } else {
            Liveness::Backoff
        },
        error,
    );
}
