//! `talaria mcp list | test | tools | serve`: what the configured MCP
//! servers offer, and Talaria as an MCP server.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use talaria_agent::tools::send_message::{Messenger, TargetInfo};
use talaria_core::Home;
use talaria_gateway::messenger::delivery_targets;
use talaria_mcp::McpServer;
use talaria_mcp::serve::TalariaServer;
use talaria_mcp::tool::tool_name;

use crate::cli::McpCommand;
use crate::runtime::Runtime;
use crate::{gateway_cmd, send_cmd};

pub async fn run(home: Home, command: McpCommand) -> anyhow::Result<ExitCode> {
    let rt = Runtime::load_without_model(home).await?;
    let code = match command {
        McpCommand::List => list(&rt).await,
        McpCommand::Test { server } => match find(&rt, &server) {
            Ok(server) => test(&server).await,
            Err(code) => code,
        },
        McpCommand::Tools { server } => match find(&rt, &server) {
            Ok(server) => tools(&server).await,
            Err(code) => code,
        },
        McpCommand::Serve => serve(&rt).await,
    };
    rt.mcp.shutdown().await;
    Ok(code)
}

fn find(rt: &Runtime, name: &str) -> Result<Arc<McpServer>, ExitCode> {
    if let Some(server) = rt.mcp.server(name) {
        return Ok(server);
    }
    match rt.config.mcp_servers.get(name) {
        Some(_) => eprintln!(
            "talaria: the MCP server `{name}` is disabled (mcp_servers.{name}.enabled: false)"
        ),
        None => eprintln!(
            "talaria: no MCP server named `{name}` in {}",
            rt.home.config_file().display()
        ),
    }
    Err(ExitCode::FAILURE)
}

async fn list(rt: &Runtime) -> ExitCode {
    if rt.config.mcp_servers.is_empty() {
        println!(
            "no MCP servers configured; add them under mcp_servers: in {}",
            rt.home.config_file().display()
        );
        return ExitCode::SUCCESS;
    }
    let width = rt
        .config
        .mcp_servers
        .keys()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(0);
    for (name, server) in &rt.config.mcp_servers {
        let how = match (&server.command, &server.url) {
            (Some(command), _) => format!("stdio: {command} {}", server.args.join(" ")),
            (None, Some(url)) => format!("http: {url}"),
            (None, None) => "not set up".into(),
        };
        let mut notes = Vec::new();
        if !server.enabled {
            notes.push("disabled".to_owned());
        }
        if server.lazy {
            notes.push("starts on first use".to_owned());
        }
        if !server.tools.include.is_empty() {
            notes.push(format!("only {}", server.tools.include.join(", ")));
        }
        if !server.tools.exclude.is_empty() {
            notes.push(format!("not {}", server.tools.exclude.join(", ")));
        }
        let notes = if notes.is_empty() {
            String::new()
        } else {
            format!("  ({})", notes.join("; "))
        };
        println!("{name:<width$}  {}{notes}", how.trim_end());
    }
    ExitCode::SUCCESS
}

/// Connects and says what the server offers and how long it took.
async fn test(server: &McpServer) -> ExitCode {
    let started = Instant::now();
    match server.offer().await {
        Ok(offer) => {
            println!(
                "{}: connected in {} ms to {}",
                server.name(),
                started.elapsed().as_millis(),
                offer.server
            );
            let offered = offer
                .tools
                .iter()
                .filter(|t| server.config().tools.admits(&t.name))
                .count();
            println!(
                "  tools: {} ({} offered to the agent)",
                offer.tools.len(),
                offered
            );
            println!("  resources: {}", offer.resources.len());
            for (uri, name) in &offer.resources {
                println!("    {uri}  {name}");
            }
            println!("  prompts: {}", offer.prompts.len());
            for (name, description) in &offer.prompts {
                println!("    {name}  {description}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "talaria: cannot use the MCP server `{}`: {e}",
                server.name()
            );
            // A program's stderr goes to the log: point there.
            if let (Some(command), Some(log)) =
                (&server.config().command, crate::logging::log_file())
            {
                eprintln!(
                    "What `{command}` wrote to its standard error is in {}.",
                    log.display()
                );
            }
            ExitCode::FAILURE
        }
    }
}

/// Every tool with the name the model sees, marking what the filter hides.
async fn tools(server: &McpServer) -> ExitCode {
    match server.offer().await {
        Ok(offer) => {
            for tool in &offer.tools {
                let shown = if server.config().tools.admits(&tool.name) {
                    ""
                } else {
                    "  [filtered out]"
                };
                let description = tool.description.lines().next().unwrap_or_default();
                println!(
                    "{}{shown}\n    {description}",
                    tool_name(server.name(), &tool.name)
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "talaria: cannot use the MCP server `{}`: {e}",
                server.name()
            );
            ExitCode::FAILURE
        }
    }
}

/// Sends as `talaria send` does: through the running gateway, else
/// directly.
struct CliMessenger {
    rt: Runtime,
}

#[async_trait]
impl Messenger for CliMessenger {
    async fn send(&self, target: &str, message: &str, _session: &str) -> Result<String, String> {
        let response = send_cmd::deliver(&self.rt, target, message)
            .await
            .map_err(|e| format!("{e:#}"))?;
        if response.ok {
            Ok(response.detail.unwrap_or_else(|| "sent".into()))
        } else {
            Err(response
                .error
                .unwrap_or_else(|| "the message was not sent".into()))
        }
    }

    /// What `talaria send` can reach. `origin` is not among them: an MCP
    /// client is in no conversation of Talaria's.
    async fn targets(&self) -> Result<Vec<TargetInfo>, String> {
        let delivery = gateway_cmd::standalone_delivery(&self.rt).map_err(|e| format!("{e:#}"))?;
        Ok(delivery_targets(&delivery))
    }
}

async fn serve(rt: &Runtime) -> ExitCode {
    let messenger = Arc::new(CliMessenger { rt: rt.clone() });
    let server = TalariaServer::new(rt.store.clone(), messenger);
    match server.serve_stdio().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("talaria: {e}");
            ExitCode::FAILURE
        }
    }
}
