//! One MCP server: its connection (a child process over stdio, or a
//! Streamable HTTP endpoint), its tool list, calls with a timeout and
//! cancellation, and restarts after it dies.
//!
//! This module is the only one that touches the SDK (`rmcp`): everything
//! it hands out is plain JSON or Talaria's own types, so an SDK upgrade
//! stays here.
//!
//! # Lifecycle
//!
//! A server is down until something needs it ([`McpServer::connect`], or a
//! turn asking for its tools). Connecting starts the program (or opens the
//! HTTP session), runs the handshake and lists every tool, all within
//! `connect_timeout`. When the connection is found closed (the program
//! crashed), the server is down again and the next use reconnects: the
//! first time at once, then after 1 s, 2 s, 4 s, ... up to a minute while
//! attempts keep failing, so a broken server costs a log line per minute
//! instead of a process per turn. A server announcing
//! `notifications/tools/list_changed` has its list read again before the
//! next turn uses it.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, JsonObject,
};
use rmcp::service::ClientInitializeError;
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::common::client_side_sse::ExponentialBackoff;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceError, ServiceExt};
use serde_json::Value;
use talaria_core::Env;
use talaria_core::config::McpServerConfig;
use tokio::io::AsyncBufReadExt;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::expand::expand;

/// Variables a stdio server inherits from Talaria's environment; its
/// configured `env` comes on top. Nothing else is passed, so API keys and
/// bot tokens do not reach third-party programs unless configured.
const PASSED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TMPDIR",
    "TZ",
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
];

/// The longest wait between reconnection attempts.
const MAX_RETRY: Duration = Duration::from_secs(60);

/// A tool as the server lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteTool {
    /// The tool's name on its server (Talaria prefixes it with
    /// `mcp_<server>_`).
    pub name: String,
    /// The server's description of the tool, passed on to the model.
    pub description: String,
    /// The input JSON schema, as the server gave it.
    pub schema: Value,
}

/// What a server offers, for `talaria mcp test` and `tools`.
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    /// `name version` from the handshake.
    pub server: String,
    /// Every tool, before the include/exclude filter.
    pub tools: Vec<RemoteTool>,
    /// Resource URIs with their names.
    pub resources: Vec<(String, String)>,
    /// Prompt names with their descriptions.
    pub prompts: Vec<(String, String)>,
}

/// Why a call did not produce a result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The server is not running and could not be started for the call.
    #[error("the MCP server \"{server}\" is not available: {reason}")]
    Unavailable {
        /// The server's name in the configuration.
        server: String,
        /// Why it is not running (its last start's error, or that it was
        /// never started).
        reason: String,
    },
    /// No answer within the server's timeout; the call was cancelled there.
    #[error("the MCP server \"{server}\" did not answer within {secs} s; the call was cancelled")]
    Timeout {
        /// The server's name in the configuration.
        server: String,
        /// The configured timeout that ran out.
        secs: u64,
    },
    /// The turn was interrupted while the call ran.
    #[error("the call was cancelled")]
    Cancelled,
    /// The server's process or connection ended mid-call; it is restarted.
    #[error("the MCP server \"{server}\" stopped during the call; it will be started again")]
    Died {
        /// The server's name in the configuration.
        server: String,
    },
    /// The server answered with a protocol error (unknown tool, bad arguments).
    #[error("the MCP server \"{server}\" refused the call: {message}")]
    Refused {
        /// The server's name in the configuration.
        server: String,
        /// The server's own error message.
        message: String,
    },
}

/// Marks the tool list stale when the server says it changed.
struct Listener {
    server: String,
    stale: Arc<AtomicBool>,
}

impl ClientHandler for Listener {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::info!(server = %self.server, "MCP server changed its tools; they are read again before the next turn");
        self.stale.store(true, Ordering::SeqCst);
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("talaria", env!("CARGO_PKG_VERSION")),
        )
    }
}

type Session = RunningService<RoleClient, Listener>;

enum State {
    Down {
        /// Failed connections (or deaths) since the last good one.
        failures: u32,
        /// No attempt before this.
        retry_at: Option<Instant>,
        last_error: Option<String>,
    },
    Up {
        session: Box<Session>,
        tools: Vec<RemoteTool>,
    },
}

/// How a server stands, for `talaria mcp list` and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Running, offering this many tools.
    Connected {
        /// The tools it lists.
        tools: usize,
    },
    /// Lazy start, and nothing has called it yet.
    NotStarted,
    /// Its starts keep failing; it is retried with backoff.
    Failing {
        /// Failed starts in a row.
        failures: u32,
        /// The latest start's error.
        last_error: String,
    },
}

/// One configured MCP server.
pub struct McpServer {
    name: String,
    config: McpServerConfig,
    env: Env,
    state: Mutex<State>,
    /// Set by `notifications/tools/list_changed`.
    stale: Arc<AtomicBool>,
}

impl McpServer {
    /// A server not yet started, as `name` is configured; `env` supplies
    /// the variables its configuration refers to.
    pub fn new(name: &str, config: McpServerConfig, env: Env) -> McpServer {
        McpServer {
            name: name.to_owned(),
            config,
            env,
            state: Mutex::new(State::Down {
                failures: 0,
                retry_at: None,
                last_error: None,
            }),
            stale: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Its name in the configuration.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its configuration, as loaded.
    pub fn config(&self) -> &McpServerConfig {
        &self.config
    }

    /// Connects now unless connected (or waiting out a retry delay).
    pub async fn connect(&self) -> Result<(), String> {
        self.tools().await.map(drop)
    }

    /// The server's tools that pass the configured filter, connecting (or
    /// re-reading a changed list) first when needed.
    pub async fn tools(&self) -> Result<Vec<RemoteTool>, String> {
        let mut state = self.state.lock().await;
        self.ensure_up(&mut state).await?;
        if let State::Up { session, tools } = &mut *state
            && self.stale.swap(false, Ordering::SeqCst)
        {
            match self.list_tools(session).await {
                Ok(fresh) => *tools = fresh,
                Err(e) => {
                    tracing::warn!(server = %self.name, error = %e, "could not read the changed tool list; keeping the old one");
                }
            }
        }
        match &*state {
            State::Up { tools, .. } => Ok(tools
                .iter()
                .filter(|t| self.config.tools.admits(&t.name))
                .cloned()
                .collect()),
            State::Down { last_error, .. } => {
                Err(last_error.clone().unwrap_or_else(|| "not connected".into()))
            }
        }
    }

    /// How it stands now, without connecting.
    pub async fn health(&self) -> Health {
        match &*self.state.lock().await {
            State::Up { tools, .. } => Health::Connected { tools: tools.len() },
            State::Down {
                failures: 0,
                last_error: None,
                ..
            } => Health::NotStarted,
            State::Down {
                failures,
                last_error,
                ..
            } => Health::Failing {
                failures: *failures,
                last_error: last_error.clone().unwrap_or_default(),
            },
        }
    }

    /// Everything the server offers (connecting if needed): its tools
    /// unfiltered, resources and prompts where it has them.
    pub async fn offer(&self) -> Result<Offer, String> {
        let mut state = self.state.lock().await;
        self.ensure_up(&mut state).await?;
        let State::Up { session, tools } = &*state else {
            return Err("not connected".into());
        };
        let info = session.peer_info();
        let capabilities = info
            .as_ref()
            .map(|i| serde_json::to_value(&i.capabilities).unwrap_or_default())
            .unwrap_or_default();
        let server = info
            .as_ref()
            .and_then(|i| i.server_info.as_ref())
            .map(|s| format!("{} {}", s.name, s.version))
            .unwrap_or_else(|| "unknown".into());
        let timeout = Duration::from_secs(self.config.timeout);
        let mut resources = Vec::new();
        if capabilities.get("resources").is_some() {
            match tokio::time::timeout(timeout, session.list_all_resources()).await {
                Ok(Ok(list)) => {
                    for r in list {
                        let r = serde_json::to_value(&r).unwrap_or_default();
                        resources.push((
                            r["uri"].as_str().unwrap_or_default().to_owned(),
                            r["name"].as_str().unwrap_or_default().to_owned(),
                        ));
                    }
                }
                Ok(Err(e)) => {
                    tracing::debug!(server = %self.name, error = %e, "resources not listed")
                }
                Err(_) => tracing::debug!(server = %self.name, "listing resources timed out"),
            }
        }
        let mut prompts = Vec::new();
        if capabilities.get("prompts").is_some() {
            match tokio::time::timeout(timeout, session.list_all_prompts()).await {
                Ok(Ok(list)) => {
                    for p in list {
                        let p = serde_json::to_value(&p).unwrap_or_default();
                        prompts.push((
                            p["name"].as_str().unwrap_or_default().to_owned(),
                            p["description"].as_str().unwrap_or_default().to_owned(),
                        ));
                    }
                }
                Ok(Err(e)) => {
                    tracing::debug!(server = %self.name, error = %e, "prompts not listed")
                }
                Err(_) => tracing::debug!(server = %self.name, "listing prompts timed out"),
            }
        }
        Ok(Offer {
            server,
            tools: tools.clone(),
            resources,
            prompts,
        })
    }

    /// Calls the server's tool `tool`; the result as JSON (a
    /// `CallToolResult`). Dropping the call, the timeout and `cancel` all
    /// send the server `notifications/cancelled`.
    pub async fn call(
        &self,
        tool: &str,
        arguments: JsonObject,
        cancel: &CancellationToken,
    ) -> Result<Value, CallError> {
        let peer = {
            let mut state = self.state.lock().await;
            self.ensure_up(&mut state)
                .await
                .map_err(|reason| CallError::Unavailable {
                    server: self.name.clone(),
                    reason,
                })?;
            match &*state {
                State::Up { session, .. } => session.peer().clone(),
                State::Down { .. } => {
                    return Err(CallError::Unavailable {
                        server: self.name.clone(),
                        reason: "not connected".into(),
                    });
                }
            }
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let secs = self.config.timeout;
        let outcome = tokio::select! {
            r = tokio::time::timeout(Duration::from_secs(secs), peer.call_tool(params)) => r,
            _ = cancel.cancelled() => return Err(CallError::Cancelled),
        };
        match outcome {
            Err(_) => Err(CallError::Timeout {
                server: self.name.clone(),
                secs,
            }),
            Ok(Ok(result)) => Ok(serde_json::to_value(&result).unwrap_or_default()),
            Ok(Err(ServiceError::McpError(e))) => Err(CallError::Refused {
                server: self.name.clone(),
                message: e.message.to_string(),
            }),
            Ok(Err(e)) => {
                let mut state = self.state.lock().await;
                if self.is_dead(&state) {
                    self.mark_dead(&mut state, &service_failure(&e));
                    Err(CallError::Died {
                        server: self.name.clone(),
                    })
                } else {
                    Err(CallError::Refused {
                        server: self.name.clone(),
                        message: service_failure(&e),
                    })
                }
            }
        }
    }

    /// Ends the connection (the program is stopped); the next use starts
    /// it again.
    pub async fn shutdown(&self) {
        let mut state = self.state.lock().await;
        if let State::Up { session, .. } = std::mem::replace(
            &mut *state,
            State::Down {
                failures: 0,
                retry_at: None,
                last_error: None,
            },
        ) {
            let mut session = *session;
            if let Err(e) = session.close_with_timeout(Duration::from_secs(5)).await {
                tracing::debug!(server = %self.name, error = %e, "MCP session did not close cleanly");
            }
        }
    }

    /// Whether the connection is gone: the service loop ends when the
    /// program's output closes (it exited) or the session broke.
    fn is_dead(&self, state: &State) -> bool {
        matches!(state, State::Up { session, .. }
            if session.is_closed() || session.peer().is_transport_closed())
    }

    fn mark_dead(&self, state: &mut State, why: &str) {
        tracing::warn!(server = %self.name, error = why, "MCP server stopped; it is started again when next needed");
        *state = State::Down {
            failures: 1,
            retry_at: None,
            last_error: Some(format!("it stopped: {why}")),
        };
    }

    /// Makes the state `Up`, connecting when it is down and its retry time
    /// has come.
    async fn ensure_up(&self, state: &mut State) -> Result<(), String> {
        if self.is_dead(state) {
            self.mark_dead(state, "the connection closed");
        }
        let (failures, retry_at, last_error) = match state {
            State::Up { .. } => return Ok(()),
            State::Down {
                failures,
                retry_at,
                last_error,
            } => (*failures, *retry_at, last_error.clone()),
        };
        if let Some(at) = retry_at
            && Instant::now() < at
        {
            let wait = at.saturating_duration_since(Instant::now()).as_secs() + 1;
            return Err(format!(
                "{} (next attempt in {wait} s)",
                last_error.unwrap_or_else(|| "it failed to start".into())
            ));
        }
        let limit = Duration::from_secs(self.config.connect_timeout);
        let attempt = async {
            let session = self.open().await?;
            let tools = self.list_tools(&session).await?;
            Ok::<_, String>((session, tools))
        };
        match tokio::time::timeout(limit, attempt).await {
            Ok(Ok((session, tools))) => {
                tracing::info!(server = %self.name, tools = tools.len(), "MCP server connected");
                self.stale.store(false, Ordering::SeqCst);
                *state = State::Up {
                    session: Box::new(session),
                    tools,
                };
                Ok(())
            }
            outcome => {
                let error = match outcome {
                    Ok(Err(e)) => e,
                    _ => format!("it did not start within {} s", limit.as_secs()),
                };
                let failures = failures.saturating_add(1);
                let delay = retry_delay(failures);
                tracing::warn!(server = %self.name, error = %error, retry_in = ?delay, "cannot connect to the MCP server");
                *state = State::Down {
                    failures,
                    retry_at: Some(Instant::now() + delay),
                    last_error: Some(error.clone()),
                };
                Err(error)
            }
        }
    }

    /// Starts the program or opens the HTTP session, and shakes hands.
    async fn open(&self) -> Result<Session, String> {
        let listener = Listener {
            server: self.name.clone(),
            stale: self.stale.clone(),
        };
        if let Some(command) = &self.config.command {
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(&self.config.args).env_clear();
            for key in PASSED_ENV {
                if let Some(value) = std::env::var_os(key) {
                    cmd.env(key, value);
                }
            }
            for (key, value) in &self.config.env {
                cmd.env(
                    key,
                    expand(value, &self.env).map_err(|e| format!("env {key}: {e}"))?,
                );
            }
            if let Some(cwd) = &self.config.cwd {
                cmd.current_dir(cwd);
            }
            let (transport, stderr) = TokioChildProcess::builder(cmd)
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot start `{command}`: {e}"))?;
            if let Some(stderr) = stderr {
                let server = self.name.clone();
                tokio::spawn(async move {
                    let mut lines = tokio::io::BufReader::new(stderr).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        tracing::info!(server = %server, "mcp stderr: {line}");
                    }
                });
            }
            listener.serve(transport).await.map_err(|e| {
                tracing::debug!(server = %self.name, "MCP handshake failed: {e}");
                format!(
                    "`{command}` started but the MCP handshake failed: {}",
                    handshake_failure(&e, true)
                )
            })
        } else if let Some(url) = &self.config.url {
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.clone());
            // The SDK's default reconnects a broken event stream forever,
            // which would hold a call until its timeout after the server
            // died; a few quick tries, then the call fails and the server
            // is restarted like a crashed stdio one.
            let mut retry = ExponentialBackoff::default();
            retry.max_times = Some(3);
            retry.base_duration = Duration::from_millis(200);
            retry.max_delay = Some(Duration::from_secs(2));
            config.retry_config = Arc::new(retry);
            let mut custom = std::collections::HashMap::new();
            for (key, value) in &self.config.headers {
                let value = expand(value, &self.env).map_err(|e| format!("header {key}: {e}"))?;
                if key.eq_ignore_ascii_case("authorization")
                    && let Some(token) = value.strip_prefix("Bearer ")
                {
                    config = config.auth_header(token.trim().to_owned());
                    continue;
                }
                let name = http::HeaderName::from_bytes(key.as_bytes())
                    .map_err(|_| format!("`{key}` is not an HTTP header name"))?;
                let value = http::HeaderValue::from_str(&value)
                    .map_err(|_| format!("header {key} has a value HTTP cannot carry"))?;
                custom.insert(name, value);
            }
            let transport =
                StreamableHttpClientTransport::from_config(config.custom_headers(custom));
            listener.serve(transport).await.map_err(|e| {
                tracing::debug!(server = %self.name, "MCP handshake failed: {e}");
                format!(
                    "the MCP handshake with {url} failed: {}",
                    handshake_failure(&e, false)
                )
            })
        } else {
            Err("neither `command` nor `url` is configured".into())
        }
    }

    async fn list_tools(&self, session: &Session) -> Result<Vec<RemoteTool>, String> {
        let tools = session
            .list_all_tools()
            .await
            .map_err(|e| format!("cannot list its tools: {}", service_failure(&e)))?;
        Ok(tools
            .into_iter()
            .map(|t| RemoteTool {
                name: t.name.to_string(),
                description: t.description.map(|d| d.to_string()).unwrap_or_default(),
                schema: Value::Object((*t.input_schema).clone()),
            })
            .collect())
    }
}

/// Why a handshake failed, in words: rmcp's own text names Rust types
/// (`Transport [rmcp::transport::worker::WorkerTransport<…>] error`).
/// `program` is whether the server is a program Talaria started.
fn handshake_failure(e: &ClientInitializeError, program: bool) -> String {
    let closed = if program {
        "the program ended (or closed its output) before answering"
    } else {
        "the server closed the connection before answering"
    };
    match e {
        ClientInitializeError::ConnectionClosed(_) => closed.to_owned(),
        ClientInitializeError::TransportError { error, .. } => {
            let cause = without_type_names(&error.error.to_string());
            if program || cause.is_empty() {
                closed.to_owned()
            } else {
                format!("the connection failed ({cause})")
            }
        }
        ClientInitializeError::JsonRpcError(data) => {
            format!("the server refused to start a session: {}", data.message)
        }
        ClientInitializeError::NoCompatibleProtocolVersion { .. } => {
            "the server speaks no version of the MCP protocol Talaria knows".to_owned()
        }
        ClientInitializeError::Cancelled => "the start was cancelled".to_owned(),
        ClientInitializeError::LegacyFallbackFailed { fallback, .. } => {
            handshake_failure(fallback, program)
        }
        _ => "the server's answer to the handshake is not MCP (is this an MCP server?)".to_owned(),
    }
}

/// Why a request to a connected server failed, in words.
fn service_failure(e: &ServiceError) -> String {
    match e {
        ServiceError::McpError(data) => data.message.to_string(),
        ServiceError::TransportSend(error) => {
            let cause = without_type_names(&error.error.to_string());
            if cause.is_empty() {
                "the connection failed".to_owned()
            } else {
                format!("the connection failed ({cause})")
            }
        }
        ServiceError::TransportClosed => "the connection closed".to_owned(),
        ServiceError::UnexpectedResponse => {
            "the server answered something other than what was asked".to_owned()
        }
        ServiceError::Timeout { timeout } => {
            format!("no answer within {} s", timeout.as_secs())
        }
        ServiceError::Cancelled { .. } => "the request was cancelled".to_owned(),
        other => without_type_names(&other.to_string()),
    }
}

/// A transport's error text without the Rust paths and generics some of
/// them carry (`Transport [a::b::C<D>] error: …`).
fn without_type_names(text: &str) -> String {
    text.split_whitespace()
        .filter(|word| !(word.contains("::") || word.contains('<') || word.starts_with('[')))
        .collect::<Vec<_>>()
        .join(" ")
        .trim_start_matches("error:")
        .trim()
        .to_owned()
}

/// The wait before attempt `failures + 1`: none after the first failure
/// (a crash is retried at once), then 1 s doubling to a minute.
fn retry_delay(failures: u32) -> Duration {
    match failures {
        0 | 1 => Duration::ZERO,
        n => Duration::from_secs(1u64 << (n - 2).min(6)).min(MAX_RETRY),
    }
}

/// Servers by name, as configured.
pub type Servers = BTreeMap<String, Arc<McpServer>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_to_a_minute() {
        assert_eq!(retry_delay(1), Duration::ZERO);
        assert_eq!(retry_delay(2), Duration::from_secs(1));
        assert_eq!(retry_delay(3), Duration::from_secs(2));
        assert_eq!(retry_delay(8), Duration::from_secs(60));
        assert_eq!(retry_delay(100), Duration::from_secs(60));
    }
}
