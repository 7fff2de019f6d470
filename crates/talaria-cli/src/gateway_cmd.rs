//! `talaria gateway run | start | stop | status | install`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::send_message::SendMessageTool;
use talaria_api::{ApiServer, ApiServerConfig, ApiServerSettings};
use talaria_core::Home;
use talaria_core::config::PlatformSection;
use talaria_dashboard::{Dashboard, DashboardSettings};
use talaria_gateway::Adapter;
use talaria_gateway::cron::{CronTool, Zone};
use talaria_gateway::delivery::Delivery;
use talaria_gateway::gateway::{Gateway, GatewayParts, report_service};
use talaria_gateway::hooks::Hooks;
use talaria_gateway::ledger::Ledger;
use talaria_gateway::messenger::GatewayMessenger;
use talaria_gateway::node::Node;
use talaria_gateway::process::{self, PidFile, PidFileError};
use talaria_gateway::target::HomeChannels;
use talaria_platforms::ingress::{Ingress, Mount};
use talaria_platforms::registry::{BuildError, PLATFORMS, Platform, Setup};
use talaria_platforms::webhook::WebhookConfig;
use tokio_util::sync::CancellationToken;

use crate::runtime::Runtime;

/// The configured chat platforms (not yet connected).
pub struct ConfiguredAdapters {
    /// Every adapter: what the gateway serves, and what `talaria send`
    /// sends through without one.
    pub adapters: Vec<Arc<dyn Adapter>>,
    /// The routes of those that receive by webhook, for the shared
    /// listener (only a running gateway serves them).
    pub mounts: Vec<Mount>,
}

/// The configured chat platforms' adapters (not yet connected): those
/// that can deliver without a running gateway.
pub fn configured_adapters(rt: &Runtime) -> anyhow::Result<ConfiguredAdapters> {
    build_platforms(rt, |p| p.standalone)
}

/// Every registered platform `wanted` picks that its settings turn on,
/// set up in the registry's order; the first that cannot be set up stops
/// the walk.
fn build_platforms(
    rt: &Runtime,
    wanted: impl Fn(&Platform) -> bool,
) -> anyhow::Result<ConfiguredAdapters> {
    let setup = Setup {
        home: &rt.home,
        config: &rt.config,
        env: &rt.loaded.env,
        cursors: rt.gateway_store.clone(),
        media: talaria_media::MediaCache::for_home(&rt.home, &rt.config.media),
        yuanbao: rt.yuanbao.clone(),
    };
    let mut adapters: Vec<Arc<dyn Adapter>> = Vec::new();
    let mut mounts: Vec<Mount> = Vec::new();
    for platform in PLATFORMS.iter().filter(|p| wanted(p)) {
        let built = (platform.build)(&setup).map_err(|e| match e {
            BuildError::Misconfigured(e) => {
                anyhow::anyhow!(e).context(format!("{} is misconfigured", platform.title))
            }
            BuildError::SetUp(e) => {
                anyhow::anyhow!(e).context(format!("cannot set up {}", platform.title))
            }
        })?;
        if let Some(built) = built {
            mounts.extend(built.mount);
            adapters.push(built.adapter);
        }
    }
    Ok(ConfiguredAdapters { adapters, mounts })
}

/// Sending without a gateway (`talaria send`, `talaria cron run`): the
/// configured chat platforms, not connected for receiving, with their home
/// channels and the ledger, so a send cut short here is finished by the
/// next gateway.
pub fn standalone_delivery(rt: &Runtime) -> anyhow::Result<Delivery> {
    let adapters = configured_adapters(rt)?.adapters;
    let platforms: Vec<&str> = adapters.iter().map(|a| a.platform()).collect();
    let homes = HomeChannels::load(&rt.config.gateway.home_channels, &rt.loaded.env, &platforms);
    let ledger = rt
        .config
        .gateway
        .delivery_ledger
        .then(|| Ledger::new(rt.gateway_store.clone(), Node::current().id().clone()));
    Ok(Delivery::new(adapters, ledger)
        .with_homes(Arc::new(homes))
        .with_local_dir(rt.home.cron_output_dir())
        .with_file_roots(talaria_gateway::parts::FileRoots::new([
            rt.workdir()?,
            rt.home.media_dir(),
            rt.home.cron_output_dir(),
        ])))
}

/// Why `gateway run` stopped early: an unusable configuration (exits with
/// [`process::EXIT_BAD_CONFIG`], which the systemd unit does not restart
/// on), or anything else (worth a restart: a busy port, a database that
/// is down).
enum RunError {
    Config(anyhow::Error),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for RunError {
    fn from(e: anyhow::Error) -> RunError {
        RunError::Other(e)
    }
}

/// Marks an error as the configuration's fault.
fn bad_config<E: Into<anyhow::Error>>(e: E) -> RunError {
    RunError::Config(e.into())
}

/// How `gateway run` starts the line saying why it stopped early, so that
/// `gateway start` finds it in the log among the other lines.
const ERROR_PREFIX: &str = "talaria: error: ";

/// `talaria gateway run`: serves in the foreground until SIGTERM or SIGINT.
pub async fn run(home: Home) -> anyhow::Result<ExitCode> {
    let config_file = home.config_file();
    match serve(home).await {
        Ok(code) => Ok(code),
        Err(RunError::Other(e)) => {
            eprintln!("{ERROR_PREFIX}{e:#}");
            Ok(ExitCode::FAILURE)
        }
        Err(RunError::Config(e)) => {
            eprintln!("{ERROR_PREFIX}{e:#}");
            eprintln!(
                "The configuration is not usable: fix {} or the .env beside it \
                 (`talaria config check` checks the model settings), then start the gateway again.",
                config_file.display()
            );
            Ok(ExitCode::from(process::EXIT_BAD_CONFIG))
        }
    }
}

async fn serve(home: Home) -> Result<ExitCode, RunError> {
    // Read once before the runtime (which also opens the store) so that a
    // broken file is told apart from a database that is down.
    crate::sections::load(&home).map_err(bad_config)?;
    // Before anything records: counts from the start are kept.
    let metrics = install_metrics();
    let mut rt = Runtime::load(home, "info").await?;
    rt.probe_model().await;
    log_open_file_limit();
    // Approvals are asked in each chat by the runner; this is only the
    // fallback for work that has no chat.
    let messenger = GatewayMessenger::new(rt.store.clone());
    let send_message: Arc<dyn talaria_agent::tools::Tool> =
        Arc::new(SendMessageTool::new(messenger.clone()));
    let zone = Zone::from_config(&rt.config.cron)
        .map_err(anyhow::Error::msg)
        .map_err(bad_config)?;
    let cron_tool = CronTool::new(rt.gateway_store.clone(), rt.home.clone(), zone);
    let (agent, client) = rt
        .agent_with_tools(
            Arc::new(NoHuman),
            vec![
                send_message,
                cron_tool.clone() as Arc<dyn talaria_agent::tools::Tool>,
            ],
        )
        .map_err(bad_config)?;

    // Every platform, the webhook routes included: a bad route stops the
    // start here.
    let ConfiguredAdapters { adapters, mounts } =
        build_platforms(&rt, |_| true).map_err(bad_config)?;
    let api_config = ApiServerConfig::read(&rt.config).map_err(bad_config)?;
    let api = ApiServerSettings::from_config(&api_config, &rt.loaded.env)
        .context("the API server is misconfigured")
        .map_err(bad_config)?;
    let dashboard = DashboardSettings::from_config(&rt.config.dashboard, api.is_some())
        .context("the dashboard is misconfigured")
        .map_err(bad_config)?;
    if adapters.is_empty() && api.is_none() {
        return Err(bad_config(anyhow::anyhow!(
            "nothing to serve: no platform is enabled.\n\
             Set a platform's credentials (TELEGRAM_BOT_TOKEN, DISCORD_BOT_TOKEN, \
             SLACK_BOT_TOKEN and SLACK_APP_TOKEN, MATTERMOST_URL and MATTERMOST_TOKEN, \
             MATRIX_HOMESERVER and MATRIX_ACCESS_TOKEN, \
             SIGNAL_HTTP_URL and SIGNAL_ACCOUNT, EMAIL_ADDRESS, EMAIL_PASSWORD, \
             EMAIL_IMAP_HOST and EMAIL_SMTP_HOST, WHATSAPP_CLOUD_TOKEN (with the three other \
             WHATSAPP_CLOUD_ variables), TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN, HASS_CONVERSATION_TOKEN, \
             or their platforms.<name> keys) \
             or API_SERVER_KEY \
             (or platforms.api_server.key) in {} or the environment, or configure \
             platforms.webhook.routes in config.yaml.",
            rt.home.dotenv_file().display()
        )));
    }
    // Only now, with the configuration found usable, does this process
    // claim the home: `gateway start` takes the PID file as the sign that
    // the gateway came up, and a run that was going to exit for a bad
    // configuration must never be seen holding it.
    let pid_file = match PidFile::acquire(&rt.home) {
        Ok(f) => f,
        Err(PidFileError::AlreadyRunning { pid }) => {
            return Err(anyhow::anyhow!(
                "a gateway is already running for {} (pid {pid}); stop it with `talaria gateway stop`",
                rt.home.root().display()
            )
            .into());
        }
        Err(e) => {
            return Err(anyhow::Error::new(e)
                .context("cannot take the gateway PID file")
                .into());
        }
    };
    if let Some(memory) = agent.memory() {
        memory.initialize().await;
    }
    // Bound before anything runs, so a busy port stops the start here.
    let ingress = if mounts.is_empty() {
        None
    } else {
        let listen = WebhookConfig::read(&rt.config).map_err(bad_config)?;
        let mut ingress = Ingress::bind(listen.host.trim(), listen.port)
            .await
            .context("cannot start the webhook listener (platforms.webhook.host and port)")?;
        ingress.set_connection_limits(
            ingress
                .connection_limits()
                .with_timeouts(listen.header_timeout_secs, listen.body_timeout_secs)
                .context("platforms.webhook is misconfigured")
                .map_err(bad_config)?,
        );
        for mount in mounts {
            ingress.mount(mount);
        }
        eprintln!(
            "talaria: webhook listener on http://{} for {}",
            ingress.local_addr(),
            ingress.platform_names().join(", ")
        );
        Some(ingress)
    };
    let names: Vec<&str> = adapters.iter().map(|a| a.platform()).collect();

    let gateway = Gateway::new(GatewayParts {
        config: rt.config.clone(),
        env: rt.loaded.env.clone(),
        home: rt.home.clone(),
        agent: agent.clone(),
        store: rt.gateway_store.clone(),
        adapters,
        lock_dir: None,
        hooks: Arc::new(Hooks::load(&rt.home)),
    });
    messenger.bind(gateway.delivery());
    // Background work reports to the chat that started it.
    rt.background.reports.bind(gateway.reports());
    gateway.bind_session_work(Arc::new(rt.background.processes.clone()));
    // What a background review learned is said in the chat it reviewed.
    rt.attach_review(
        &agent,
        client,
        talaria_gateway::messenger::session_notifier(rt.store.clone(), gateway.delivery()),
    );
    if let Some(scheduler) = gateway.scheduler() {
        cron_tool.bind(scheduler);
    }
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone())?;

    let mut dashboard_task = None;
    let api_task = match api {
        Some(settings) => {
            let key = settings.key.clone();
            let mut server = ApiServer::bind_with(settings, agent.clone(), gateway.turn_leases())
                .await
                .context("cannot start the API server")?
                .with_transcript_store(rt.gateway_store.clone())
                .with_media(gateway.media())
                .with_backends(gateway.backends())
                .with_gateway(talaria_api::GatewayServices {
                    store: rt.gateway_store.clone(),
                    scheduler: gateway.scheduler(),
                    board: gateway.board(),
                    platforms: names.iter().map(|n| (*n).to_owned()).collect(),
                    running_turns: gateway.running_turns(),
                    config_report: crate::config_cmd::api_report(rt.home.clone()),
                    metrics: metrics.clone(),
                });
            let config = &api_config;
            server.set_connection_limits(
                server
                    .connection_limits()
                    .with_timeouts(config.header_timeout_secs, config.body_timeout_secs)
                    .context("platforms.api_server is misconfigured")
                    .map_err(bad_config)?,
            );
            let addr = server.local_addr();
            tracing::info!(%addr, "API server listening");
            eprintln!("talaria: API server listening on http://{addr}");
            if let Some(settings) = dashboard {
                let ui = Dashboard::new(
                    settings.clone(),
                    server.routes(),
                    key,
                    rt.gateway_store.clone(),
                );
                match &settings.own_listener {
                    None => {
                        server.merge(ui.router());
                        eprintln!("talaria: dashboard on http://{addr}/ui/");
                    }
                    Some((host, port)) => {
                        dashboard_task = Some(
                            serve_dashboard(host, *port, ui, &gateway.board(), shutdown.clone())
                                .await?,
                        );
                    }
                }
            }
            report_service(&gateway.board(), "api_server", true, None);
            let board = gateway.board();
            let stop = shutdown.clone();
            Some(tokio::spawn(async move {
                if let Err(e) = server.serve(stop).await {
                    tracing::error!(error = %e, "API server failed");
                    report_service(&board, "api_server", false, Some(e.to_string()));
                }
            }))
        }
        None => None,
    };
    let ingress_task = ingress.map(|ingress| {
        report_service(&gateway.board(), "webhook_listener", true, None);
        let board = gateway.board();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            if let Err(e) = ingress.serve(stop).await {
                tracing::error!(error = %e, "the webhook listener failed");
                report_service(&board, "webhook_listener", false, Some(e.to_string()));
            }
        })
    });
    if !names.is_empty() {
        eprintln!("talaria: gateway running for {}", names.join(", "));
    }
    crate::service::ready(&names);
    // Pings go on through the drain: a long drain is not a hang.
    let pinging = CancellationToken::new();
    let watchdog = crate::service::watchdog(pinging.clone());
    crate::service::stopping_on(shutdown.clone());
    gateway.run(shutdown).await;
    pinging.cancel();
    if let Some(watchdog) = watchdog {
        let _ = watchdog.await;
    }
    for task in [api_task, dashboard_task, ingress_task]
        .into_iter()
        .flatten()
    {
        let _ = task.await;
    }
    // The gateway told the chats what its stop ended; now it ends.
    rt.background.shutdown().await;
    rt.mcp.shutdown().await;
    // The browser's Chromium ends with the gateway (a killed gateway's is
    // ended by the next start's sweep).
    rt.close_browser().await;
    if let Some(memory) = agent.memory() {
        memory.shutdown(Duration::from_secs(5)).await;
    }
    drop(pid_file);
    Ok(ExitCode::SUCCESS)
}

/// Serves the dashboard on a port of its own (`dashboard.port`) until
/// `shutdown`.
async fn serve_dashboard(
    host: &str,
    port: u16,
    ui: Dashboard,
    board: &Arc<talaria_gateway::supervisor::StatusBoard>,
    shutdown: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let (listener, addr) = talaria_platforms::listen::bind_listener(host, port)
        .await
        .map_err(|(addr, e)| anyhow::anyhow!("cannot start the dashboard on {addr}: {e}"))?;
    eprintln!("talaria: dashboard on http://{addr}/ui/");
    report_service(board, "dashboard", true, None);
    let board = board.clone();
    Ok(tokio::spawn(async move {
        let served = talaria_platforms::listen::serve(
            "dashboard",
            listener,
            ui.router(),
            talaria_platforms::listen::ConnectionLimits::for_this_process(),
            shutdown.cancelled_owned(),
        )
        .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the dashboard failed");
            report_service(&board, "dashboard", false, Some(e.to_string()));
        }
    }))
}

/// Says what the open-file limit is (raised at start, see `main`): the
/// listeners' connection caps derive from it, and a low one explains
/// "Too many open files".
/// Installs the Prometheus recorder every crate's counters go to, and
/// returns what renders it for `/metrics`. `None` (logged) if a recorder
/// is installed already, which only a second gateway in one process could
/// do.
fn install_metrics() -> Option<Arc<dyn Fn() -> String + Send + Sync>> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let installed = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(talaria_core::metrics::TURN_SECONDS.to_owned()),
            talaria_core::metrics::TURN_BUCKETS,
        )
        .and_then(PrometheusBuilder::install_recorder);
    let handle = match installed {
        Ok(handle) => handle,
        Err(e) => {
            tracing::warn!(error = %e, "metrics are not recorded: /metrics will not be served");
            return None;
        }
    };
    talaria_core::metrics::describe();
    Some(Arc::new(move || {
        // Folds the histograms' recent samples into their buckets, which
        // keeps the recorder's memory bounded between scrapes.
        handle.run_upkeep();
        handle.render()
    }))
}

fn log_open_file_limit() {
    let Some(limit) = crate::open_files() else {
        return;
    };
    match &limit.error {
        Some(error) => tracing::warn!(
            soft = limit.soft,
            hard = limit.hard,
            "{error}; the listeners' connection caps are derived from the soft limit"
        ),
        None => tracing::info!(
            soft = limit.soft,
            hard = limit.hard,
            was = limit.was,
            "open-file limit"
        ),
    }
}

/// SIGTERM and SIGINT both stop the gateway gracefully; a second signal
/// while stopping exits at once.
fn spawn_signal_handler(shutdown: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("signal received; stopping gracefully (send it again to exit at once)");
        shutdown.cancel();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        eprintln!("talaria: stopping immediately");
        std::process::exit(130);
    });
    Ok(())
}

/// `talaria gateway start`: runs the gateway in the background, logging to
/// `$TALARIA_HOME/logs/gateway.log`. When it does not come up, says why,
/// from what it wrote to the log.
pub async fn start(home: Home) -> anyhow::Result<ExitCode> {
    if let Some(info) = process::running_gateway(&home) {
        println!("The gateway is already running (pid {}).", info.pid);
        return Ok(ExitCode::SUCCESS);
    }
    let exe = std::env::current_exe().context("cannot find the talaria executable")?;
    std::fs::create_dir_all(home.logs_dir())
        .with_context(|| format!("cannot create {}", home.logs_dir().display()))?;
    let log_path = home.logs_dir().join("gateway.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open {}", log_path.display()))?;
    // Where this run's lines begin: earlier runs' lines are not its reasons.
    let log_start = log.metadata().map_or(0, |m| m.len());
    let mut command = std::process::Command::new(exe);
    command
        .arg("--home")
        .arg(home.root())
        .args(["gateway", "run"])
        // The home given is the profile's already; the variable would
        // look for a profile inside it.
        .env_remove("TALARIA_PROFILE")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // Its own process group: a Ctrl-C in this terminal must not reach it.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command.spawn().context("cannot start the gateway")?;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            let reason = startup_reason(&log_path, log_start);
            bail!(
                "the gateway did not start ({status}). It said:\n{reason}\n(the full log: {})",
                log_path.display()
            );
        }
        if process::running_gateway(&home).is_some() {
            println!(
                "Gateway started (pid {}). Log: {}",
                child.id(),
                log_path.display()
            );
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!(
        "the gateway did not come up within 15 s (it may still be starting; \
         `talaria gateway status` tells). Its log so far:\n{}\n(the full log: {})",
        startup_reason(&log_path, log_start),
        log_path.display()
    )
}

/// Lines kept from a failed start's log.
const REASON_LINES: usize = 8;

/// What the gateway wrote to its log since `from`: the error it stopped
/// with (from its [`ERROR_PREFIX`] line on, without the prefix or the log
/// lines that follow) when there is one, else its last few lines.
/// Indented, for printing under a headline.
fn startup_reason(log_path: &std::path::Path, from: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let mut text = String::new();
    let read = std::fs::File::open(log_path).and_then(|mut f| {
        f.seek(SeekFrom::Start(from))?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)?;
        text = String::from_utf8_lossy(&bytes).into_owned();
        Ok(())
    });
    if let Err(e) = read {
        return format!("  (cannot read the log: {e})");
    }
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let chosen: Vec<&str> = match lines.iter().rposition(|l| l.starts_with(ERROR_PREFIX)) {
        Some(at) => {
            let mut error = vec![&lines[at][ERROR_PREFIX.len()..]];
            error.extend(lines[at + 1..].iter().filter(|l| !is_log_record(l)));
            error
        }
        None => lines[lines.len().saturating_sub(REASON_LINES)..].to_vec(),
    };
    if chosen.is_empty() {
        return "  (it wrote nothing to its log)".to_owned();
    }
    chosen
        .iter()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A line the logger wrote (it starts with a timestamp, `2025-06-01T...`)
/// rather than part of an error message.
fn is_log_record(line: &str) -> bool {
    let b = line.as_bytes();
    b.len() > 10 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' && b[10] == b'T'
}

/// `talaria gateway stop`: SIGTERM, then waits for a graceful exit. Running
/// turns get `gateway.drain_timeout_secs` to finish; the wait says so.
pub async fn stop(home: Home) -> anyhow::Result<ExitCode> {
    let Some(info) = process::running_gateway(&home) else {
        println!("The gateway is not running.");
        return Ok(ExitCode::SUCCESS);
    };
    let pid = info.pid;
    // The running gateway read the same file; a broken one cannot have
    // started it, so the default is the best guess then.
    let drain = crate::sections::load(&home).map_or_else(
        |_| talaria_core::Config::default().gateway.drain_timeout_secs,
        |l| l.config.gateway.drain_timeout_secs,
    );
    let running = process::read_status(&home)
        .ok()
        .flatten()
        .map_or(0, |s| s.running_sessions.len());
    let pinned = process::pin(pid);
    process::signal_stop(pid).context("cannot signal the gateway")?;
    if running > 0 {
        println!(
            "Waiting for {running} running turn{s} to finish: at most {drain} s \
             (gateway.drain_timeout_secs), then {it} interrupted.",
            s = if running == 1 { "" } else { "s" },
            it = if running == 1 { "it is" } else { "they are" },
        );
    }
    // Turns and then scheduled jobs each get the grace, shutdown hooks a
    // little more.
    let wait = Duration::from_secs((2 * drain + 30).max(90));
    let exited = tokio::task::spawn_blocking(move || process::wait_for_exit(&pinned, wait))
        .await
        .unwrap_or(false);
    if exited {
        println!("Gateway stopped (pid {pid}).");
        Ok(ExitCode::SUCCESS)
    } else {
        bail!(
            "the gateway (pid {pid}) did not stop within {} s; its log says what it is doing \
             ({})",
            wait.as_secs(),
            home.logs_dir().join("gateway.log").display()
        )
    }
}

/// `talaria gateway status`: this home's gateway and, when the store is
/// shared (PostgreSQL), the cluster: its nodes, and which connectors each
/// runs. Exits 3 when this home's gateway is not running.
pub async fn status(home: &Home) -> anyhow::Result<ExitCode> {
    // A configuration that does not load still leaves the process state
    // worth showing; its error follows.
    let loaded = crate::sections::load(home);
    let configured = match &loaded {
        Ok(l) => crate::config_cmd::platforms_on(home, &l.config, &l.env).0,
        Err(_) => Vec::new(),
    };
    let code = local_status(home, &configured)?;
    let loaded = loaded?;
    if loaded.config.store.backend == talaria_core::config::StoreBackend::Postgres {
        let store = crate::runtime::open_store(home, &loaded.config, &loaded.env).await?;
        print_cluster(store.as_ref()).await?;
    }
    Ok(code)
}

/// The nodes sharing the store and the connector leases they hold.
async fn print_cluster(store: &dyn talaria_store::GatewayStore) -> anyhow::Result<()> {
    let now = store
        .clock()
        .await
        .context("cannot read the store's clock")?;
    let nodes = store.nodes().await.context("cannot list the nodes")?;
    let leases = store
        .leases("connector:")
        .await
        .context("cannot list the connector leases")?;
    let turns = store
        .leases("turn:")
        .await
        .context("cannot list the turn leases")?;
    let alive: Vec<_> = nodes.iter().filter(|n| n.lease_until > now).collect();
    println!(
        "Cluster: {} node{} alive{}",
        alive.len(),
        if alive.len() == 1 { "" } else { "s" },
        match nodes.len() - alive.len() {
            0 => String::new(),
            dead => format!(", {dead} gone"),
        }
    );
    for node in &nodes {
        // A dead node's leases are void (others may take them at once),
        // so only a live node is shown holding anything.
        let holds = |l: &&talaria_store::LeaseRecord| {
            l.holder == node.id && l.lease_until > now && node.lease_until > now
        };
        let held: Vec<&str> = leases
            .iter()
            .filter(holds)
            .map(|l| connector_scope(&l.name))
            .collect();
        let running = turns.iter().filter(holds).count();
        let state = if node.lease_until > now {
            format!(
                "alive, beat {} ago",
                human_duration(now - node.heartbeat_at)
            )
        } else {
            format!("gone for {}", human_duration(now - node.lease_until))
        };
        println!(
            "  {} {}  pid {}  v{}  {state}",
            node.id, node.host, node.pid, node.version
        );
        if !held.is_empty() {
            println!("    connectors: {}", held.join(", "));
        }
        if running > 0 {
            println!("    turns running: {running}");
        }
    }
    let live = |id: &talaria_store::NodeId| alive.iter().any(|n| &n.id == id);
    let unheld: Vec<&str> = leases
        .iter()
        .filter(|l| l.lease_until <= now || !live(&l.holder))
        .map(|l| connector_scope(&l.name))
        .collect();
    if !unheld.is_empty() {
        println!("  not run by any node now: {}", unheld.join(", "));
    }
    Ok(())
}

/// `connector:telegram-bot-token:0a1b…` → `telegram-bot-token`.
fn connector_scope(lease: &str) -> &str {
    lease
        .strip_prefix("connector:")
        .and_then(|rest| rest.split(':').next())
        .unwrap_or(lease)
}

/// This home's gateway, from its PID file and status file, and every
/// platform of this build: running (with its state), turned on by the
/// configuration, or off.
fn local_status(home: &Home, configured: &[&str]) -> anyhow::Result<ExitCode> {
    let Some(info) = process::running_gateway(home) else {
        println!("Gateway: not running");
        print_platform_list("Configured", configured);
        return Ok(ExitCode::from(3));
    };
    println!("Gateway: running (pid {})", info.pid);
    let Some(status) = process::read_status(home).context("cannot read the status file")? else {
        println!("(no status reported yet)");
        print_platform_list("Configured", configured);
        return Ok(ExitCode::SUCCESS);
    };
    let now = talaria_core::unix_now();
    if let Some(node) = &status.node {
        println!("Node: {node}");
    }
    println!("State: {}", status.state);
    println!("Uptime: {}", human_duration(now - status.started_at_unix));
    if status.adapters.is_empty() {
        println!("Platforms: none");
    } else {
        println!("Platforms:");
        // The status file also lists services that report on the same
        // board (the API server); they are shown as they come.
        for (name, a) in &status.adapters {
            let err = a
                .last_error
                .as_deref()
                .map(|e| format!(" (last error: {e})"))
                .unwrap_or_default();
            println!(
                "  {name:<14} {:<10} for {}{err}",
                a.liveness,
                human_duration(now - a.since)
            );
        }
    }
    let (waiting, off): (Vec<&Platform>, Vec<&Platform>) = PLATFORMS
        .iter()
        .filter(|p| !status.adapters.contains_key(p.name))
        .partition(|p| configured.contains(&p.name));
    let names = |ps: Vec<&Platform>| ps.into_iter().map(|p| p.name).collect::<Vec<_>>();
    // Configured since the gateway started, or refused at its start.
    print_platform_list("Configured, not running", &names(waiting));
    print_platform_list("Off", &names(off));
    if !status.commands.is_empty() {
        println!("Commands:");
        for line in &status.commands {
            println!("  {line}");
        }
    }
    println!("Running turns: {}", status.running_sessions.len());
    for key in &status.running_sessions {
        println!("  {key}");
    }
    let ledger: Vec<String> = status
        .ledger
        .iter()
        .map(|(state, n)| format!("{state} {n}"))
        .collect();
    println!(
        "Delivery ledger: {}",
        if ledger.is_empty() {
            "empty".to_owned()
        } else {
            ledger.join(", ")
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// `label: a, b, c` when there are any.
fn print_platform_list(label: &str, names: &[&str]) {
    if !names.is_empty() {
        println!("{label}: {}", names.join(", "));
    }
}

pub(crate) fn human_duration(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86400 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86400, (s % 86400) / 3600),
    }
}

/// `talaria gateway install`: writes a systemd user unit.
/// Where systemd looks for the user's units.
fn user_unit_dir() -> anyhow::Result<PathBuf> {
    Ok(match std::env::var_os("XDG_CONFIG_HOME") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".config"),
    }
    .join("systemd/user"))
}

/// `talaria gateway restart`: a graceful stop (if one runs), then a start.
pub async fn restart(home: Home) -> anyhow::Result<ExitCode> {
    if process::running_gateway(&home).is_some() {
        let stopped = stop(home.clone()).await?;
        if stopped != ExitCode::SUCCESS {
            return Ok(stopped);
        }
    } else {
        println!("The gateway was not running; starting it.");
    }
    start(home).await
}

/// `talaria gateway uninstall`: removes the unit file `install` wrote
/// (after saying how to stop and disable a running unit first).
pub fn uninstall(unit: &str) -> anyhow::Result<ExitCode> {
    let path = user_unit_dir()?.join(format!("{unit}.service"));
    match std::fs::remove_file(&path) {
        Ok(()) => {
            println!("Removed {}", path.display());
            println!(
                "If it was enabled, also run:\n  systemctl --user disable --now {unit}\n  systemctl --user daemon-reload"
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("No unit to remove: {} does not exist.", path.display());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err(e).with_context(|| format!("cannot remove {}", path.display())),
    }
}

pub fn install(home: &Home, force: bool, unit: &str) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find the talaria executable")?;
    let dir = user_unit_dir()?;
    let path = dir.join(format!("{unit}.service"));
    if path.exists() && !force {
        bail!(
            "{} already exists; pass --force to replace it",
            path.display()
        );
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::write(&path, process::systemd_unit(&exe, home))
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("Wrote {}", path.display());
    println!(
        "Enable and start it with:\n  systemctl --user daemon-reload\n  systemctl --user enable --now {unit}"
    );
    println!("To keep it running after you log out:\n  loginctl enable-linger $USER");
    Ok(ExitCode::SUCCESS)
}
