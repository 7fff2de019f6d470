//! Talaria and the Model Context Protocol: tools from MCP servers for the
//! agent, and Talaria itself as an MCP server.
//!
//! # Layout
//!
//! - [`server`]: one MCP server's connection (stdio child process or
//!   Streamable HTTP), tool list, calls with timeout and cancellation,
//!   restarts with backoff. The only module that touches the SDK (`rmcp`).
//! - [`tool`]: an MCP tool as Talaria's [`talaria_agent::tools::Tool`]
//!   (`mcp_<server>_<tool>`, schemas every provider accepts, results marked
//!   as untrusted data).
//! - [`manager`]: every configured server as one
//!   [`talaria_agent::tools::ToolSource`], eager or lazy start, reload,
//!   shutdown.
//! - [`serve`]: Talaria as an MCP server (`talaria mcp serve`):
//!   `session_search` and `send_message`.
//! - [`expand`]: `${VAR}` in configured env and headers.
//!
//! # Invariants
//!
//! - **A broken server never breaks a turn**: a server that cannot start
//!   or answer costs its own tools for that turn and a log line; a call to
//!   it gets an error result.
//! - **Built-in tools win**: an MCP tool named like one is left out.
//! - **A server sees no secret it was not given**: stdio servers inherit a
//!   short list of harmless variables, plus their configured `env`.
#![forbid(unsafe_code)]

pub mod expand;
pub mod manager;
pub mod serve;
pub mod server;
pub mod tool;

pub use manager::{McpManager, ReloadReport};
pub use server::{CallError, Health, McpServer, Offer, RemoteTool};
pub use tool::McpTool;
