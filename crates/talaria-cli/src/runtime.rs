//! Everything a command needs, loaded once: home, configuration, secrets,
//! the store and (for chat) the model client and the agent.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use talaria_agent::interaction::Interaction;
use talaria_agent::tools::Registry;
use talaria_agent::{Agent, AgentParts};
use talaria_core::config::Loaded;
use talaria_core::config::{DATABASE_URL_ENV, PlatformSection, StoreBackend};
use talaria_core::{Config, Home, Redactor};
use talaria_llm::LlmClient;
use talaria_mcp::McpManager;
use talaria_platforms::homeassistant::HomeAssistantConfig;
use talaria_store::{GatewayStore, PostgresOptions, PostgresStore, SessionStore, SqliteStore};

/// Resolves `--home`, `TALARIA_HOME` or `~/.talaria`, creating it (0700).
pub fn resolve_home(flag: Option<&Path>) -> anyhow::Result<Home> {
    let home = match flag {
        Some(dir) => Home::at(dir),
        None => Home::from_env()?,
    };
    home.ensure()
        .with_context(|| format!("cannot create {}", home.root().display()))?;
    Ok(home)
}

/// Opens the configured store: the home's `state.db`, or the PostgreSQL
/// database `store.postgres_url` (or `TALARIA_DATABASE_URL`) names.
pub async fn open_store(
    home: &Home,
    config: &Config,
    env: &talaria_core::Env,
) -> anyhow::Result<Arc<dyn GatewayStore>> {
    match config.store.backend {
        StoreBackend::Sqlite => {
            if env.get(DATABASE_URL_ENV).is_some() {
                tracing::warn!(
                    "{DATABASE_URL_ENV} is set but store.backend is sqlite: using {} (set store.backend: postgres to use the database)",
                    home.state_db().display()
                );
            }
            let db = home.state_db();
            let store = tokio::task::spawn_blocking(move || SqliteStore::open(&db))
                .await
                .context("store task failed")?
                .with_context(|| format!("cannot open {}", home.state_db().display()))?;
            Ok(Arc::new(store))
        }
        StoreBackend::Postgres => {
            let Some(url) = config.store.postgres_url(env) else {
                anyhow::bail!(
                    "store.backend is postgres but no database is named: set {DATABASE_URL_ENV} or store.postgres_url in {}",
                    home.config_file().display()
                );
            };
            let mut options = PostgresOptions::new(url);
            options.schema = config.store.postgres_schema.clone();
            options.max_connections = config.store.postgres_max_connections;
            let store = PostgresStore::connect(options)
                .await
                .context("cannot open the PostgreSQL store")?;
            if let Some((source, started)) = store
                .unfinished_copy()
                .await
                .context("cannot check the PostgreSQL store for an unfinished copy")?
            {
                anyhow::bail!(
                    "the PostgreSQL store holds a copy of {source} that `talaria store migrate`                      started ({}) and never finished: run the same `talaria store migrate` again                      to finish it before using this database",
                    talaria_gateway::slash::when(started)
                );
            }
            Ok(Arc::new(store))
        }
    }
}

/// A loaded home with its store. Cloning shares the store and servers.
#[derive(Clone)]
pub struct Runtime {
    pub home: Home,
    pub config: Arc<Config>,
    pub loaded: Loaded,
    pub redactor: Redactor,
    pub store: Arc<dyn SessionStore>,
    /// The same store with the gateway's tables (routes, ledger, pairing).
    pub gateway_store: Arc<dyn GatewayStore>,
    /// The configured MCP servers; started when an agent is built.
    pub mcp: Arc<McpManager>,
    /// Bundled skills and the user's (the skill tools and `/skill-name`).
    pub skills: Arc<talaria_learning::Library>,
    /// Where the owner's commands run (`terminal.backend`).
    pub backends: Arc<talaria_exec::Backends>,
    /// The headless browser behind the `browser_*` tools: looked for when
    /// an agent is built (commands without one pay nothing), `None` when
    /// there is no Chromium and no `browser.cdp_url`; Chromium itself
    /// starts on the first call.
    browser: std::sync::OnceLock<Option<Arc<talaria_web::browser::Browser>>>,
    /// Work that outlives a turn: where it reports (bound by the front end:
    /// the gateway's chats, or the terminal) and the tools that start it.
    pub background: Background,
    /// Local model servers found by [`Runtime::probe_model`] when no model
    /// is configured, named in the error that says so.
    local_servers: Vec<talaria_llm::probe::LocalServer>,
    /// Yuanbao's socket request channel: the adapter `gateway run` builds
    /// serves it, the `yb_*` tools ask over it.
    pub yuanbao: talaria_platforms::yuanbao::YuanbaoLink,
}

/// The parts behind the tools whose work outlives a turn.
#[derive(Clone)]
pub struct Background {
    /// Where background work reports; bound by the front end.
    pub reports: talaria_agent::background::ReportsSlot,
    /// Commands started with `terminal(background=true)`, of every
    /// conversation of this process.
    pub processes: talaria_agent::processes::ProcessRegistry,
    /// `delegate_task`'s way back to the agent that runs its subagents.
    delegation: talaria_agent::tools::delegate::DelegateBinding,
    /// The `delegate_task` tool of the agent built last, to stop its
    /// detached delegations at the end.
    delegate: Arc<std::sync::OnceLock<Arc<talaria_agent::tools::delegate::DelegateTool>>>,
}

impl Background {
    /// Nothing running yet, for `home`.
    fn new(home: &Home) -> Background {
        let reports = talaria_agent::background::ReportsSlot::new();
        Background {
            processes: talaria_agent::processes::ProcessRegistry::new(home, reports.clone()),
            reports,
            delegation: Default::default(),
            delegate: Default::default(),
        }
    }

    /// Stops what still runs in the background (the chat or the gateway
    /// is ending). Detached delegations report how they ended; background
    /// commands are killed without a word, their obligations left to the
    /// front end (the gateway has said in each chat what its stop ended).
    pub async fn shutdown(&self) {
        if let Some(delegate) = self.delegate.get() {
            delegate.shutdown().await;
        }
        let killed = self.processes.kill_all().await;
        if killed > 0 {
            tracing::info!(killed, "background commands killed at the end");
        }
    }
}

impl Runtime {
    /// Loads configuration and opens the store; no model is needed.
    pub async fn load_without_model(home: Home) -> anyhow::Result<Runtime> {
        Runtime::load(home, crate::logging::DEFAULT_LEVEL).await
    }

    /// [`Runtime::load_without_model`] with a default log level.
    pub async fn load(home: Home, default_log: &str) -> anyhow::Result<Runtime> {
        let loaded = crate::sections::load(&home)?;
        let redactor = Redactor::new(
            loaded
                .env
                .secret_values()
                .into_iter()
                .chain(loaded.config.secret_values()),
        );
        crate::logging::init(redactor.clone(), default_log);
        for w in &loaded.warnings {
            tracing::warn!("{w}");
        }
        let store = open_store(&home, &loaded.config, &loaded.env).await?;
        let mcp = McpManager::for_home(&loaded.config, &loaded.env, &home);
        let workdir = match &loaded.config.terminal.cwd {
            Some(dir) => dir.clone(),
            None => std::env::current_dir().unwrap_or_else(|_| std::path::PathBuf::from(".")),
        };
        let backends = Arc::new(talaria_exec::Backends::new(
            &loaded.config.terminal,
            &home,
            workdir,
        ));
        Ok(Runtime {
            background: Background::new(&home),
            backends,
            browser: std::sync::OnceLock::new(),
            skills: Arc::new(talaria_learning::Library::new(&home)),
            mcp,
            config: Arc::new(loaded.config.clone()),
            home,
            loaded,
            redactor,
            store: store.clone() as Arc<dyn SessionStore>,
            gateway_store: store,
            local_servers: Vec::new(),
            yuanbao: talaria_platforms::yuanbao::YuanbaoLink::new(),
        })
    }

    /// Asks the model server what it is before the agent is built (for
    /// `talaria chat` and `talaria gateway run`); never fails.
    ///
    /// - When `model.context_length` is not in config.yaml, the window the
    ///   server reports replaces the default, so compression acts at the
    ///   real limit.
    /// - When the server says the model cannot take tool calls, that is
    ///   said once, in the log and on stderr.
    /// - When no model is configured, local servers on the usual ports are
    ///   looked for, so the error can name one.
    pub async fn probe_model(&mut self) {
        let endpoint = match self.config.primary_endpoint(&self.loaded.env) {
            Ok(endpoint) => endpoint,
            Err(why) => {
                if why.starts_with("no model is configured") {
                    self.local_servers = find_local_servers().await;
                }
                return;
            }
        };
        // Hosted APIs (OpenAI, OpenRouter, Anthropic, ...) are not asked:
        // their answers carry no window, and a start should not wait on
        // them. The ones that need no key are servers people run.
        if endpoint.provider.needs_key() {
            return;
        }
        let key = endpoint.api_key.as_ref().map(|k| k.expose().to_owned());
        let info = talaria_llm::probe::probe(
            &endpoint.base_url,
            Some(&endpoint.model),
            key.as_deref(),
            talaria_llm::probe::PROBE_TIMEOUT,
        )
        .await;
        tracing::debug!(?info, "probed the model server");
        let server = format!("{} at {}", info.kind.label(), endpoint.base_url);
        if let Some(window) = info.context_length {
            if self.config.model.context_length_set {
                if window < self.config.model.context_length {
                    tracing::warn!(
                        "model.context_length is {} but {server} runs {} with a window of {window} tokens; compression may start too late",
                        self.config.model.context_length,
                        endpoint.model
                    );
                }
            } else {
                // The schema's floor still holds for a tiny reported window.
                let window = window.max(1024);
                tracing::info!(
                    "context window of {} from {server}: {window} tokens",
                    endpoint.model
                );
                Arc::make_mut(&mut self.config).model.context_length = window;
            }
        }
        if info.tools == Some(false) {
            let line = format!(
                "model {} on {server} does not support tool calls: it will answer in text only \
                 and cannot run commands or edit files (choose a model with tool support{})",
                endpoint.model,
                if info.kind == talaria_llm::probe::ServerKind::LlamaCpp {
                    ", or start llama-server with --jinja"
                } else {
                    ""
                }
            );
            // One event: the terminal shows this binary's warnings (and the
            // gateway's stderr is its log), so it is printed once.
            tracing::warn!("{line}");
        }
    }

    /// Builds the model client and the agent. Fails with a message that says
    /// exactly what to configure when no model is set.
    pub fn agent(
        &self,
        interaction: Arc<dyn Interaction>,
    ) -> anyhow::Result<(Arc<Agent>, Arc<LlmClient>)> {
        self.agent_with_tools(interaction, Vec::new())
    }

    /// The browser for the `browser_*` tools, made (after sweeping what a
    /// killed gateway left) the first time it is asked for.
    fn browser(&self) -> Option<&Arc<talaria_web::browser::Browser>> {
        self.browser
            .get_or_init(|| open_browser(&self.home, &self.config))
            .as_ref()
    }

    /// Ends the browser's Chromium, if one was made.
    pub async fn close_browser(&self) {
        if let Some(Some(browser)) = self.browser.get() {
            browser.close_all().await;
        }
    }

    /// Where the agent works: `terminal.cwd`, else the current directory.
    pub fn workdir(&self) -> anyhow::Result<std::path::PathBuf> {
        match &self.config.terminal.cwd {
            Some(dir) => Ok(dir.clone()),
            None => std::env::current_dir().context("cannot read the current directory"),
        }
    }

    /// [`Runtime::agent`] with `extra` tools beside the core ones (the
    /// gateway adds `send_message`).
    pub fn agent_with_tools(
        &self,
        interaction: Arc<dyn Interaction>,
        extra: Vec<Arc<dyn talaria_agent::tools::Tool>>,
    ) -> anyhow::Result<(Arc<Agent>, Arc<LlmClient>)> {
        let client = LlmClient::from_config(&self.config, &self.loaded.env).map_err(|e| {
            let found: Vec<String> = self
                .local_servers
                .iter()
                .map(talaria_llm::probe::describe_local)
                .collect();
            let hint = if found.is_empty() {
                String::new()
            } else {
                format!(
                    "\n{}: run `talaria setup` or set model.default (and model.base_url)",
                    found.join("; ")
                )
            };
            anyhow::anyhow!(
                "{e}{hint}\n(config file: {})",
                self.home.config_file().display()
            )
        })?;
        let client = Arc::new(client);
        let workdir = self.workdir()?;
        let mut registry = Registry::with_core_tools(&self.config);
        // terminal with background commands, and the process tool for them.
        let processes = self.background.processes.clone();
        registry.replace(Arc::new(
            talaria_agent::tools::terminal::TerminalTool::with_processes(processes.clone()),
        ));
        registry
            .register(Arc::new(talaria_agent::tools::process::ProcessTool::new(
                processes,
            )))
            .map_err(anyhow::Error::msg)?;
        for tool in talaria_learning::skill_tools(self.skills.clone()) {
            registry.register(tool).map_err(anyhow::Error::msg)?;
        }
        if self.config.memory.enabled {
            // Memory writes go into the learning log too.
            registry.replace(Arc::new(talaria_learning::log::LoggedMemory::new(
                &self.home, "agent",
            )));
        }
        for tool in extra {
            registry.register(tool).map_err(anyhow::Error::msg)?;
        }
        // Speech, image generation and vision_analyze, as configured.
        let (media_tools, problems) = talaria_agent::tools::media_out::media_tools(
            &self.config,
            &self.loaded.env,
            &self.home,
            &workdir,
        );
        for p in problems {
            tracing::warn!("{p}");
        }
        for tool in media_tools {
            registry.register(tool).map_err(anyhow::Error::msg)?;
        }
        // web_search (when a search service is configured) and web_extract,
        // whose long pages `auxiliary.web` (else the main model) summarises.
        let summarizer = match talaria_llm::auxiliary_web_provider(&self.config, &self.loaded.env) {
            Some(Ok(provider)) => provider,
            Some(Err(e)) => {
                tracing::warn!("auxiliary.web is not used: {e}; the main model summarises pages");
                client.clone() as Arc<dyn talaria_llm::Provider>
            }
            None => client.clone() as Arc<dyn talaria_llm::Provider>,
        };
        let (web_tools, problems) =
            talaria_tools::web::web_tools(&self.config, &self.loaded.env, Some(summarizer));
        for p in problems {
            tracing::warn!("{p}");
        }
        for tool in web_tools {
            registry.register(tool).map_err(anyhow::Error::msg)?;
        }
        // The browser_* tools, when a browser can run here; browser_vision
        // asks the auxiliary vision model when there is one.
        if let Some(browser) = self.browser() {
            let vision =
                match talaria_llm::auxiliary_vision_provider(&self.config, &self.loaded.env) {
                    Some(Ok(provider)) => Some(Arc::new(
                        talaria_agent::tools::vision::VisionAnalyzeTool::new(
                            provider,
                            vec![self.home.media_dir(), workdir.clone()],
                            self.config.media.image_max_px,
                        ),
                    )),
                    _ => None,
                };
            for tool in talaria_tools::browser::browser_tools(browser.clone(), vision) {
                registry.register(tool).map_err(anyhow::Error::msg)?;
            }
        }
        // Home Assistant's ha_* tools, when HASS_URL and HASS_TOKEN are set.
        let homeassistant = HomeAssistantConfig::read(&self.config)?;
        if let Some(settings) = talaria_platforms::homeassistant::HomeAssistantSettings::from_config(
            &homeassistant,
            &self.loaded.env,
        ) {
            for tool in talaria_tools::homeassistant::ha_tools(&settings)? {
                registry.register(tool).map_err(anyhow::Error::msg)?;
            }
        }
        // The feishu_doc_read and feishu_drive_* tools, when the Feishu app
        // credentials are set; a Feishu section the gateway cannot use
        // leaves them out (the gateway says why).
        let feishu = talaria_platforms::feishu::FeishuConfig::read(&self.config)?;
        match talaria_platforms::feishu::FeishuSettings::from_config(&feishu, &self.loaded.env) {
            Ok(Some(settings)) => {
                for tool in talaria_tools::feishu::feishu_tools(&settings)? {
                    registry.register(tool).map_err(anyhow::Error::msg)?;
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "the Feishu tools are off"),
        }
        // Yuanbao's yb_* group tools, when Yuanbao is configured: they ask
        // over the socket of the adapter built on the same link.
        let yuanbao = talaria_platforms::yuanbao::YuanbaoConfig::read(&self.config)?;
        if matches!(
            talaria_platforms::yuanbao::YuanbaoSettings::from_config(&yuanbao, &self.loaded.env),
            Ok(Some(_))
        ) {
            for tool in talaria_tools::yuanbao::yb_tools(self.yuanbao.clone()) {
                registry.register(tool).map_err(anyhow::Error::msg)?;
            }
        }
        // The external memory provider, if configured: its tools join the
        // registry, and the agent recalls through it.
        let memory = match &self.config.memory.provider {
            None => None,
            Some(name) => {
                let provider: Arc<dyn talaria_agent::memory_provider::MemoryProvider> = match name
                    .as_str()
                {
                    "mem0" => Arc::new(
                        talaria_learning::mem0::Mem0::from_config(
                            &self.config.memory.mem0,
                            &self.loaded.env,
                        )
                        .map_err(anyhow::Error::msg)?,
                    ),
                    other => anyhow::bail!("memory.provider `{other}` is not one Talaria knows"),
                };
                for tool in provider.tools() {
                    registry.register(tool).map_err(anyhow::Error::msg)?;
                }
                let memory = Arc::new(talaria_agent::memory_provider::MemoryManager::new(
                    std::time::Duration::from_millis(self.config.memory.prefetch_timeout_ms),
                ));
                memory.add(provider).map_err(anyhow::Error::msg)?;
                Some(memory)
            }
        };
        // delegate_task: subagents on the main model, or on
        // `delegation.model` (same server) when one is set.
        let child_provider = match &self.config.delegation.model {
            Some(model) => {
                let mut config = (*self.config).clone();
                config.model.default = Some(model.clone());
                let provider = LlmClient::from_config(&config, &self.loaded.env)
                    .map_err(|e| anyhow::anyhow!("delegation.model: {e}"))?;
                Some(Arc::new(provider) as Arc<dyn talaria_llm::Provider>)
            }
            None => None,
        };
        let delegate = Arc::new(
            talaria_agent::tools::delegate::DelegateTool::new(
                self.background.delegation.clone(),
                self.background.reports.clone(),
            )
            .with_provider(child_provider),
        );
        let _ = self.background.delegate.set(delegate.clone());
        registry.register(delegate).map_err(anyhow::Error::msg)?;
        // execute_code: scripts that call the turn's tools, run where the
        // conversation's commands run.
        registry
            .register(Arc::new(
                talaria_agent::tools::execute_code::ExecuteCodeTool::new(),
            ))
            .map_err(anyhow::Error::msg)?;
        if !self.mcp.is_empty() {
            registry.add_source(self.mcp.clone());
            self.mcp.start_eager();
        }
        let agent = Agent::new(AgentParts {
            config: self.config.clone(),
            home: self.home.clone(),
            provider: client.clone(),
            store: self.store.clone(),
            registry: Arc::new(registry),
            interaction,
            redactor: self.redactor.clone(),
            workdir,
        });
        if let Some(memory) = memory {
            agent.set_memory(memory);
        }
        // `/model` and `model.routes`: other models on the configured
        // servers, with the same retries and fallbacks.
        agent.set_models(Arc::new(talaria_agent::models::ModelSwitch::new(
            self.config.clone(),
            self.loaded.env.clone(),
        )));
        let agent = Arc::new(agent);
        self.background.delegation.bind(&agent);
        Ok((agent, client))
    }

    /// Starts background reviews after this agent's turns (see
    /// `talaria_learning::review`); `notify` hears what each one learned.
    pub fn attach_review(
        &self,
        agent: &Agent,
        client: Arc<LlmClient>,
        notify: talaria_learning::review::Notify,
    ) -> Arc<talaria_learning::review::BackgroundReview> {
        let review = talaria_learning::review::BackgroundReview::new(
            talaria_learning::review::ReviewParts {
                config: self.config.clone(),
                home: self.home.clone(),
                provider: client,
                store: self.store.clone(),
                library: self.skills.clone(),
                redactor: self.redactor.clone(),
                workdir: agent.parts().workdir.clone(),
                notify,
            },
        );
        agent.set_turn_hook(review.clone());
        review
    }
}

/// Local model servers on the usual ports (or `TALARIA_LOCAL_PORTS`),
/// probed at once on 127.0.0.1.
pub async fn find_local_servers() -> Vec<talaria_llm::probe::LocalServer> {
    let ports =
        talaria_llm::probe::local_ports(std::env::var("TALARIA_LOCAL_PORTS").ok().as_deref());
    talaria_llm::probe::detect_local(&ports, talaria_llm::probe::LOCAL_TIMEOUT).await
}

/// The browser for the `browser_*` tools, when one can run here: Chromium
/// processes a killed gateway left behind are swept first (their profiles
/// live under `<home>/browser`). `None`, with the reason logged at debug,
/// when there is no Chromium and no `browser.cdp_url`.
fn open_browser(
    home: &Home,
    config: &talaria_core::Config,
) -> Option<Arc<talaria_web::browser::Browser>> {
    use talaria_web::browser::Browser;
    if let Err(why) = Browser::available(&config.browser) {
        tracing::debug!("the browser tools are off: {why}");
        return None;
    }
    let guard = match talaria_web::UrlGuard::from_config(&config.web) {
        Ok(g) => g,
        Err(e) => {
            tracing::warn!("the browser tools are off: {e}");
            return None;
        }
    };
    let dir = home.root().join("browser");
    // A short read of /proc (it waits only for processes it killed).
    Browser::sweep(&dir);
    Some(Arc::new(Browser::new(&config.browser, guard, dir)))
}
