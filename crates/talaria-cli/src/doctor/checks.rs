//! The checks, in the order the report lists them: the home's files and
//! room, the configuration, the database, the model, each platform, where
//! commands run, the MCP servers and the gateway process.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use talaria_core::config::{BackendKind, Loaded, StoreBackend};
use talaria_core::{Endpoint, Home, Message, Redactor};
use talaria_gateway::adapter::AdapterError;
use talaria_llm::{ChatRequest, ToolSpec};
use tokio_util::sync::CancellationToken;

use super::{Finding, Options, Status, dotenv_redactor};
use crate::human_bytes;

/// How long the model has to answer the tool-call question.
const MODEL_WAIT: Duration = Duration::from_secs(60);
/// How long a platform has to say whom a token belongs to.
const PLATFORM_WAIT: Duration = Duration::from_secs(20);
/// How long an MCP server has to start and list its tools.
const MCP_WAIT: Duration = Duration::from_secs(30);
/// Free space under which the home is in trouble (the database and the
/// media cache stop growing), and under which a warning is due.
const DISK_FAIL: u64 = 100 * 1024 * 1024;
const DISK_WARN: u64 = 1024 * 1024 * 1024;

/// Every check of `home`, and the redactor for the report's sentences.
pub(super) async fn all(home: &Home, options: Options) -> (Vec<Finding>, Redactor) {
    let mut out = Vec::new();
    if !home_files(home, &mut out) {
        return (out, dotenv_redactor(home));
    }
    disk(home, &mut out);
    let loaded = match crate::sections::load(home) {
        Ok(loaded) => loaded,
        Err(e) => {
            out.push(Finding::new("config", Status::Fail, e.to_string()));
            // The database and the process can still be looked at; the
            // rest needs the configuration.
            sqlite(home, &mut out).await;
            gateway(home, &mut out);
            return (out, dotenv_redactor(home));
        }
    };
    let redactor = Redactor::new(
        loaded
            .env
            .secret_values()
            .into_iter()
            .chain(loaded.config.secret_values()),
    );
    config(home, &loaded, &mut out);
    database(home, &loaded, &mut out).await;
    model(&loaded, options, &mut out).await;
    platforms(home, &loaded, options, &mut out).await;
    terminal(home, &loaded, &mut out).await;
    mcp(home, &loaded, &mut out).await;
    gateway(home, &mut out);
    (out, redactor)
}

/// The mode bits of `path`, when it exists.
fn mode(path: &Path) -> Option<u32> {
    std::fs::metadata(path)
        .ok()
        .map(|m| m.permissions().mode() & 0o777)
}

/// The home and its secret-holding files: who may read and write them.
/// `false` when there is no home to check further.
fn home_files(home: &Home, out: &mut Vec<Finding>) -> bool {
    let root = home.root();
    let Some(root_mode) = mode(root) else {
        out.push(Finding::new(
            "home",
            Status::Fail,
            format!(
                "{} does not exist: run `talaria setup` to create it",
                root.display()
            ),
        ));
        return false;
    };
    let mut problems = 0;
    if root_mode & 0o002 != 0 {
        problems += 1;
        out.push(Finding::new(
            "home",
            Status::Fail,
            format!(
                "{} is writable by everyone (mode {root_mode:o}): anyone on this machine can \
                 change the agent's skills and memory; run chmod o-w {}",
                root.display(),
                root.display()
            ),
        ));
    }
    let env_file = home.dotenv_file();
    if let Some(env_mode) = mode(&env_file)
        && env_mode & 0o077 != 0
    {
        problems += 1;
        out.push(Finding::new(
            ".env",
            Status::Fail,
            format!(
                "{} holds the keys and is readable by others (mode {env_mode:o}); run chmod 600 {}",
                env_file.display(),
                env_file.display()
            ),
        ));
    }
    let config_file = home.config_file();
    if let Some(config_mode) = mode(&config_file)
        && config_mode & 0o022 != 0
    {
        problems += 1;
        out.push(Finding::new(
            "config",
            Status::Fail,
            format!(
                "{} may be changed by others (mode {config_mode:o}); run chmod go-w {}",
                config_file.display(),
                config_file.display()
            ),
        ));
    }
    if problems == 0 {
        out.push(Finding::new(
            "home",
            Status::Ok,
            format!(
                "{} and its secrets are kept from other users",
                root.display()
            ),
        ));
    }
    true
}

fn disk(home: &Home, out: &mut Vec<Finding>) {
    let free = match fs4::available_space(home.root()) {
        Ok(free) => free,
        Err(e) => {
            out.push(Finding::new(
                "disk",
                Status::Warn,
                format!("cannot read the free space: {e}"),
            ));
            return;
        }
    };
    let shown = human_bytes(free);
    let (status, detail) = if free < DISK_FAIL {
        (
            Status::Fail,
            format!("only {shown} free: the database and the media cache cannot grow"),
        )
    } else if free < DISK_WARN {
        (Status::Warn, format!("{shown} free: less than 1 GiB left"))
    } else {
        (
            Status::Ok,
            format!("{shown} free on the home's file system"),
        )
    };
    out.push(Finding::new("disk", status, detail));
}

/// The configuration loaded; a key that does nothing is a failure here,
/// because it is most often a misspelt setting silently left at its
/// default.
fn config(home: &Home, loaded: &Loaded, out: &mut Vec<Finding>) {
    let file = loaded
        .path
        .as_ref()
        .map_or_else(|| home.config_file(), Clone::clone);
    for w in &loaded.warnings {
        // The loader's warnings name the file and line already.
        out.push(Finding::new("config", Status::Fail, w.clone()));
    }
    let has_secrets = !loaded.config.secret_values().is_empty();
    if has_secrets
        && let Some(m) = mode(&file)
        && m & 0o044 != 0
    {
        out.push(Finding::new(
            "config",
            Status::Warn,
            format!(
                "{} holds keys and is readable by others (mode {m:o}); keep keys in .env, or run chmod 600 {}",
                file.display(),
                file.display()
            ),
        ));
    }
    if loaded.warnings.is_empty() {
        let detail = match &loaded.path {
            Some(path) => format!("{} loads", path.display()),
            None => format!("no {}: the defaults apply", home.config_file().display()),
        };
        out.push(Finding::new("config", Status::Ok, detail));
    }
}

async fn database(home: &Home, loaded: &Loaded, out: &mut Vec<Finding>) {
    match loaded.config.store.backend {
        StoreBackend::Sqlite => sqlite(home, out).await,
        StoreBackend::Postgres => {
            let opened = tokio::time::timeout(
                Duration::from_secs(15),
                crate::runtime::open_store(home, &loaded.config, &loaded.env),
            )
            .await;
            let finding = match opened {
                Ok(Ok(_)) => Finding::new(
                    "database",
                    Status::Ok,
                    "PostgreSQL answers and its schema is current",
                ),
                Ok(Err(e)) => Finding::new("database", Status::Fail, format!("{e:#}")),
                Err(_) => Finding::new(
                    "database",
                    Status::Fail,
                    "PostgreSQL did not answer within 15 s",
                ),
            };
            out.push(finding);
        }
    }
}

async fn sqlite(home: &Home, out: &mut Vec<Finding>) {
    let path = home.state_db();
    if !path.exists() {
        out.push(Finding::new(
            "database",
            Status::Ok,
            format!(
                "{} does not exist yet; the first run creates it",
                path.display()
            ),
        ));
        return;
    }
    let inspected = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || talaria_store::sqlite::inspect(&path)).await
    };
    let health = match inspected {
        Ok(Ok(health)) => health,
        Ok(Err(e)) => {
            out.push(Finding::new(
                "database",
                Status::Fail,
                format!("{} cannot be read: {e}", path.display()),
            ));
            return;
        }
        Err(e) => {
            out.push(Finding::new(
                "database",
                Status::Fail,
                format!("the check stopped: {e}"),
            ));
            return;
        }
    };
    let name = path.display();
    let mut failed = false;
    let mut fail = |detail: String| {
        failed = true;
        out.push(Finding::new("database", Status::Fail, detail));
    };
    if health.foreign {
        fail(format!("{name} belongs to another application"));
    }
    if health.schema_version > health.latest {
        fail(format!(
            "{name} was written by a newer Talaria (schema version {}, this build knows up to {}): upgrade Talaria",
            health.schema_version, health.latest
        ));
    }
    if let Err(damage) = &health.integrity {
        fail(format!(
            "{name} is damaged ({damage}); restore it from a backup (`talaria restore`)"
        ));
    }
    if let Err(why) = &health.writable {
        fail(format!(
            "{name} cannot be written ({why}): nothing can be recorded or delivered"
        ));
    }
    if failed {
        return;
    }
    let size = if health.wal_bytes > 0 {
        format!(
            "{} and {} of log",
            human_bytes(health.bytes),
            human_bytes(health.wal_bytes)
        )
    } else {
        human_bytes(health.bytes)
    };
    if health.journal_mode != "wal" {
        out.push(Finding::new(
            "database",
            Status::Warn,
            format!(
                "{name} is in {} mode, not WAL: readers will wait for writers until the next start switches it",
                health.journal_mode
            ),
        ));
    }
    let schema = if health.schema_version < health.latest {
        format!(
            "schema version {} (the next start upgrades it to {})",
            health.schema_version, health.latest
        )
    } else {
        format!("schema version {}", health.schema_version)
    };
    out.push(Finding::new(
        "database",
        Status::Ok,
        format!("{name}: {schema}, {size}, sound and writable"),
    ));
}

/// Asks each configured model, the primary and its fallbacks, to call a
/// tool: the agent needs both an answer and tool calls.
async fn model(loaded: &Loaded, options: Options, out: &mut Vec<Finding>) {
    let (config, env) = (&loaded.config, &loaded.env);
    let primary = match config.primary_endpoint(env) {
        Ok(endpoint) => endpoint,
        Err(e) => {
            out.push(Finding::new("model", Status::Fail, e));
            return;
        }
    };
    let (fallbacks, warnings) = config.fallback_endpoints(env);
    let mut endpoints = vec![("model".to_owned(), primary)];
    endpoints.extend(
        fallbacks
            .into_iter()
            .enumerate()
            .map(|(i, e)| (format!("fallback {}", i + 1), e)),
    );
    for w in warnings {
        out.push(Finding::new("fallback", Status::Warn, w));
    }
    for (check, endpoint) in endpoints {
        let finding = if options.offline {
            Finding::new(
                check,
                Status::Skip,
                format!("{} not asked (--offline)", describe(&endpoint)),
            )
        } else {
            ask_model(check, &endpoint, loaded).await
        };
        out.push(finding);
    }
}

fn describe(endpoint: &Endpoint) -> String {
    format!(
        "{} {} at {}",
        endpoint.provider.as_str(),
        endpoint.model,
        endpoint.base_url
    )
}

async fn ask_model(check: String, endpoint: &Endpoint, loaded: &Loaded) -> Finding {
    let provider = talaria_llm::client::provider_for(endpoint, &loaded.config.agent);
    let request = ChatRequest {
        messages: vec![
            Message::system(
                "You are being checked by `talaria doctor`. Call the tool `doctor_ping` \
                 with {\"ok\": true}. Do not answer in text.",
            ),
            Message::user("Call doctor_ping now."),
        ],
        tools: vec![ToolSpec {
            name: "doctor_ping".into(),
            description: "Confirms that tool calls work.".into(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {"ok": {"type": "boolean"}},
                "required": ["ok"],
            }),
        }],
        max_tokens: Some(512),
        temperature: None,
    };
    let cancel = CancellationToken::new();
    let started = Instant::now();
    let answer = tokio::time::timeout(MODEL_WAIT, provider.chat(&request, &|_| {}, &cancel)).await;
    let shown = describe(endpoint);
    match answer {
        Err(_) => Finding::new(
            check,
            Status::Fail,
            format!("{shown}: no answer within {} s", MODEL_WAIT.as_secs()),
        ),
        Ok(Err(e)) => Finding::new(check, Status::Fail, format!("{shown}: {}", e.message)),
        Ok(Ok(response)) if response.message.tool_calls.is_empty() => Finding::new(
            check,
            Status::Warn,
            format!(
                "{shown} answers but did not call the tool it was asked to call: the agent's tools may not work with this model"
            ),
        ),
        Ok(Ok(_)) => Finding::new(
            check,
            Status::Ok,
            format!(
                "{shown} answers and calls tools ({} ms)",
                started.elapsed().as_millis()
            ),
        ),
    }
}

/// Each platform the configuration turns on: set up as the gateway would,
/// then asked whom its credentials belong to.
async fn platforms(home: &Home, loaded: &Loaded, options: Options, out: &mut Vec<Finding>) {
    let (built, errors) = crate::config_cmd::built_platforms(home, &loaded.config, &loaded.env);
    for e in errors {
        out.push(Finding::new("platform", Status::Fail, e));
    }
    let asked = built.iter().map(|(platform, adapter)| async move {
        if options.offline {
            return Finding::new(
                platform.name,
                Status::Skip,
                format!("{}: not asked (--offline)", platform.title),
            );
        }
        match tokio::time::timeout(PLATFORM_WAIT, adapter.whoami()).await {
            Err(_) => Finding::new(
                platform.name,
                Status::Warn,
                format!(
                    "{} did not answer within {} s; its credentials are unchecked",
                    platform.title,
                    PLATFORM_WAIT.as_secs()
                ),
            ),
            Ok(None) => Finding::new(
                platform.name,
                Status::Skip,
                format!(
                    "{}: no question to ask without a connection; its credentials are tried when the gateway connects",
                    platform.title
                ),
            ),
            Ok(Some(Ok(who))) => Finding::new(
                platform.name,
                Status::Ok,
                format!("{}: the credentials belong to {who}", platform.title),
            ),
            Ok(Some(Err(AdapterError::Fatal(e)))) => Finding::new(
                platform.name,
                Status::Fail,
                format!("{}: {e}", platform.title),
            ),
            Ok(Some(Err(AdapterError::Disconnected(e)))) => Finding::new(
                platform.name,
                Status::Warn,
                format!(
                    "cannot reach {} ({e}); offline? its credentials are unchecked",
                    platform.title
                ),
            ),
        }
    });
    out.extend(futures::future::join_all(asked).await);
}

/// Whether the configured places for commands can start: the host for
/// the owner's chats, the sandbox (or container) for untrusted ones, which
/// the background processes use too.
async fn terminal(home: &Home, loaded: &Loaded, out: &mut Vec<Finding>) {
    let terminal = &loaded.config.terminal;
    let workdir = terminal
        .cwd
        .clone()
        .unwrap_or_else(|| std::env::current_dir().unwrap_or_else(|_| ".".into()));
    let backends = talaria_exec::Backends::new(terminal, home, workdir);
    backends.check().await;
    let mut kinds = vec![
        ("owner commands", terminal.backend),
        ("untrusted commands", terminal.untrusted_backend),
    ];
    if terminal.backend == terminal.untrusted_backend {
        kinds = vec![("commands", terminal.backend)];
    }
    for (who, kind) in kinds {
        let finding = match backends.unavailable_reason(kind) {
            Some(why) => Finding::new(
                "terminal",
                Status::Fail,
                format!("{who} run in {kind}, which cannot start: {why}"),
            ),
            None => Finding::new(
                "terminal",
                Status::Ok,
                format!("{who} run in {kind}{}", isolation_note(kind)),
            ),
        };
        out.push(finding);
    }
    backends.release_all().await;
}

fn isolation_note(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Sandbox => " (bubblewrap starts here)",
        BackendKind::Docker => " (the container engine answers)",
        BackendKind::Ssh => " (the connection is configured)",
        BackendKind::Local => "",
    }
}

/// Each enabled MCP server started and asked for its tools.
async fn mcp(home: &Home, loaded: &Loaded, out: &mut Vec<Finding>) {
    let manager = talaria_mcp::McpManager::for_home(&loaded.config, &loaded.env, home);
    let servers = manager.servers();
    let asked = servers.iter().map(|server| async move {
        let check = format!("mcp {}", server.name());
        match tokio::time::timeout(MCP_WAIT, server.offer()).await {
            Err(_) => Finding::new(
                check,
                Status::Fail,
                format!("did not list its tools within {} s", MCP_WAIT.as_secs()),
            ),
            Ok(Err(e)) => Finding::new(check, Status::Fail, e),
            Ok(Ok(offer)) => Finding::new(
                check,
                Status::Ok,
                format!("{} offers {} tools", offer.server, offer.tools.len()),
            ),
        }
    });
    out.extend(futures::future::join_all(asked).await);
    manager.shutdown().await;
}

fn gateway(home: &Home, out: &mut Vec<Finding>) {
    let detail = match talaria_gateway::process::running_gateway(home) {
        Some(info) => format!("running (pid {})", info.pid),
        None => "not running; `talaria gateway start` starts it".to_owned(),
    };
    out.push(Finding::new("gateway", Status::Ok, detail));
}
