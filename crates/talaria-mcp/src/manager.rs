//! Every configured MCP server, as one [`ToolSource`] for the agent:
//! started at launch or on first use, reloaded from the configuration on
//! request, stopped with the process.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use talaria_agent::tools::{Tool, ToolSource};
use talaria_core::config::McpServerConfig;
use talaria_core::{Config, Env, Home};

use crate::server::{Health, McpServer, Servers};
use crate::tool::McpTool;

/// What a reload changed, by server name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// Servers in the new configuration that were not running before (started).
    pub added: Vec<String>,
    /// Servers no longer configured (stopped).
    pub removed: Vec<String>,
    /// Servers whose configuration changed (restarted).
    pub changed: Vec<String>,
    /// Servers left running as they were.
    pub unchanged: Vec<String>,
}

impl std::fmt::Display for ReloadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |v: &[String]| {
            if v.is_empty() {
                "none".to_owned()
            } else {
                v.join(", ")
            }
        };
        write!(
            f,
            "MCP servers reloaded. Added: {}. Removed: {}. Restarted: {}. Unchanged: {}.",
            list(&self.added),
            list(&self.removed),
            list(&self.changed),
            list(&self.unchanged)
        )
    }
}

/// The MCP servers of one process.
pub struct McpManager {
    servers: RwLock<Servers>,
    env: RwLock<Env>,
    /// Where `/reload-mcp` reads the configuration from; `None` for a
    /// manager built from a configuration in memory.
    home: Option<Home>,
}

impl McpManager {
    /// The enabled servers of `config`; nothing is started yet.
    pub fn new(config: &Config, env: &Env) -> Arc<McpManager> {
        Arc::new(McpManager {
            servers: RwLock::new(build(&config.mcp_servers, env)),
            env: RwLock::new(env.clone()),
            home: None,
        })
    }

    /// [`McpManager::new`], reloading from `home`'s `config.yaml` and
    /// `.env` on `/reload-mcp`.
    pub fn for_home(config: &Config, env: &Env, home: &Home) -> Arc<McpManager> {
        Arc::new(McpManager {
            servers: RwLock::new(build(&config.mcp_servers, env)),
            env: RwLock::new(env.clone()),
            home: Some(home.clone()),
        })
    }

    /// The servers, by name.
    pub fn servers(&self) -> Vec<Arc<McpServer>> {
        self.read().values().cloned().collect()
    }

    /// One server by name.
    pub fn server(&self, name: &str) -> Option<Arc<McpServer>> {
        self.read().get(name).cloned()
    }

    /// Whether no server is configured.
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    /// Starts, in the background, every server not marked `lazy`; a server
    /// that fails is logged and tried again when a turn needs it.
    pub fn start_eager(&self) {
        for server in self.servers() {
            if server.config().lazy {
                continue;
            }
            tokio::spawn(async move {
                let _ = server.connect().await;
            });
        }
    }

    /// Applies a new configuration: servers removed or changed are
    /// stopped, new and changed ones start as they would at launch.
    pub async fn reload(&self, config: &Config, env: &Env) -> ReloadReport {
        let wanted = build(&config.mcp_servers, env);
        let mut report = ReloadReport::default();
        let mut stop = Vec::new();
        let mut start = Vec::new();
        {
            let mut servers = self.servers.write().unwrap_or_else(|p| p.into_inner());
            let env_changed = *self.env.read().unwrap_or_else(|p| p.into_inner()) != *env;
            let old = std::mem::take(&mut *servers);
            for (name, server) in &old {
                if !wanted.contains_key(name) {
                    report.removed.push(name.clone());
                    stop.push(server.clone());
                }
            }
            for (name, fresh) in wanted {
                match old.get(&name) {
                    Some(current) if current.config() == fresh.config() && !env_changed => {
                        report.unchanged.push(name.clone());
                        servers.insert(name, current.clone());
                    }
                    Some(current) => {
                        report.changed.push(name.clone());
                        stop.push(current.clone());
                        start.push(fresh.clone());
                        servers.insert(name, fresh);
                    }
                    None => {
                        report.added.push(name.clone());
                        start.push(fresh.clone());
                        servers.insert(name, fresh);
                    }
                }
            }
            *self.env.write().unwrap_or_else(|p| p.into_inner()) = env.clone();
        }
        for server in stop {
            server.shutdown().await;
        }
        for server in start {
            if !server.config().lazy {
                tokio::spawn(async move {
                    let _ = server.connect().await;
                });
            }
        }
        tracing::info!("{report}");
        report
    }

    /// Stops every server (their programs with them).
    pub async fn shutdown(&self) {
        for server in self.servers() {
            server.shutdown().await;
        }
    }

    /// Every server's health, by name.
    pub async fn health(&self) -> BTreeMap<String, Health> {
        let mut out = BTreeMap::new();
        for server in self.servers() {
            out.insert(server.name().to_owned(), server.health().await);
        }
        out
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Servers> {
        self.servers.read().unwrap_or_else(|p| p.into_inner())
    }
}

fn build(config: &BTreeMap<String, McpServerConfig>, env: &Env) -> Servers {
    config
        .iter()
        .filter(|(_, c)| c.enabled)
        .map(|(name, c)| {
            (
                name.clone(),
                Arc::new(McpServer::new(name, c.clone(), env.clone())),
            )
        })
        .collect()
}

#[async_trait]
impl ToolSource for McpManager {
    fn name(&self) -> &str {
        "mcp"
    }

    async fn reload(&self) -> Result<String, String> {
        let Some(home) = &self.home else {
            return Err("this process has no configuration file to reload from".into());
        };
        let home = home.clone();
        let loaded = tokio::task::spawn_blocking(move || talaria_core::config::load(&home))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("the configuration has an error, nothing was changed: {e}"))?;
        Ok(self.reload(&loaded.config, &loaded.env).await.to_string())
    }

    /// Every server's tools, asked concurrently; a server that cannot
    /// answer is skipped for this turn (it was logged).
    async fn tools(&self) -> Vec<Arc<dyn Tool>> {
        let servers = self.servers();
        let lists = futures::future::join_all(servers.iter().map(|s| s.tools())).await;
        let mut out: Vec<Arc<dyn Tool>> = Vec::new();
        for (server, list) in servers.iter().zip(lists) {
            match list {
                Ok(tools) => {
                    for t in tools {
                        out.push(Arc::new(McpTool::new(
                            server.clone(),
                            &t.name,
                            &t.description,
                            &t.schema,
                        )));
                    }
                }
                Err(e) => {
                    tracing::debug!(server = %server.name(), error = %e, "MCP server's tools left out of this turn");
                }
            }
        }
        out
    }
}
