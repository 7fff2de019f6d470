//! The tool seam: the [`Tool`] trait, what a call can see ([`ToolContext`]),
//! and the [`Registry`] the turn loop dispatches through.
//!
//! Adding a tool is one file: implement [`Tool`] and register it in
//! [`Registry::with_core_tools`].

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use talaria_core::{Config, Home, Redactor};
use talaria_llm::ToolSpec;
use talaria_store::SessionStore;
use tokio_util::sync::CancellationToken;

use crate::interaction::Interaction;

pub mod clarify;
pub mod files;
pub mod guard;
pub mod memory;
pub mod search_files;
pub mod session_search;
pub mod terminal;
pub mod threat;
pub mod todo;

/// A failed tool call. The loop turns it into `{"error": "..."}` for the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

impl ToolError {
    pub fn new(message: impl Into<String>) -> ToolError {
        ToolError(message.into())
    }
}

pub type ToolResult = Result<String, ToolError>;

/// A capability the model can call.
#[async_trait]
pub trait Tool: Send + Sync {
    /// The name the model calls; ancestor-compatible for the core tools.
    fn name(&self) -> &str;
    /// One or two sentences for the model.
    fn description(&self) -> &str;
    /// JSON schema of the arguments object.
    fn parameters(&self) -> serde_json::Value;
    /// Whether calls may run concurrently with other parallel-safe calls
    /// (true only for tools that change nothing).
    fn parallel_safe(&self) -> bool {
        false
    }
    /// Runs one call. `args` is already a JSON object.
    async fn call(&self, args: serde_json::Value, ctx: &ToolContext) -> ToolResult;

    /// The provider-facing description.
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name().to_owned(),
            description: self.description().to_owned(),
            parameters: self.parameters(),
        }
    }
}

/// State that lives as long as one session in this process.
#[derive(Debug, Default)]
pub struct SessionState {
    /// The `todo` tool's list.
    pub todos: Mutex<Vec<todo::TodoItem>>,
    /// Dangerous-command pattern keys the user approved for this session.
    pub approved_patterns: Mutex<HashSet<String>>,
}

/// What a tool call can see and use.
#[derive(Clone)]
pub struct ToolContext {
    pub session_id: String,
    pub home: Home,
    /// Working directory for relative paths and commands.
    pub workdir: PathBuf,
    pub config: Arc<Config>,
    pub store: Arc<dyn SessionStore>,
    /// Asks the human (approvals, clarifying questions).
    pub interaction: Arc<dyn Interaction>,
    pub session: Arc<SessionState>,
    pub redactor: Redactor,
    /// Fires when the turn is interrupted; long tools must watch it.
    pub cancel: CancellationToken,
}

/// The tools available to the model, by name.
#[derive(Clone, Default)]
pub struct Registry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Adds a tool. A name already taken is refused: the first one stays.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), String> {
        let name = tool.name().to_owned();
        if self.tools.contains_key(&name) {
            return Err(format!("a tool named `{name}` is already registered"));
        }
        self.tools.insert(name, tool);
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// Tool names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.tools.keys().map(String::as_str).collect()
    }

    /// Provider-facing specs, sorted by name (a stable order keeps the
    /// provider's prompt cache warm).
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.values().map(|t| t.spec()).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}
