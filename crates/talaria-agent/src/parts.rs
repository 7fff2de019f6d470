//! [`AgentParts`]: what an [`Agent`](crate::Agent) is built from, and all a
//! turn needs of it (the turn loop borrows the parts, not the agent).

use std::path::PathBuf;
use std::sync::Arc;

use talaria_core::{Config, Home, Redactor};
use talaria_llm::Provider;
use talaria_store::SessionStore;

use crate::interaction::Interaction;
use crate::tools::Registry;

/// Everything an [`Agent`] is built from. Cloning shares every part (a
/// subagent runs on a copy with another provider).
#[derive(Clone)]
pub struct AgentParts {
    /// The loaded configuration (budget, compression, memory, model caps).
    pub config: Arc<Config>,
    /// `TALARIA_HOME`: identity, memory and spilled tool output.
    pub home: Home,
    /// The model. Fallback and retry, if any, live behind this trait.
    pub provider: Arc<dyn Provider>,
    /// Where sessions and transcripts are kept; the source of truth.
    pub store: Arc<dyn SessionStore>,
    /// The tools offered to the model.
    pub registry: Arc<Registry>,
    /// How tools reach a human (approvals, clarifying questions).
    pub interaction: Arc<dyn Interaction>,
    /// Applied to assistant text before it is stored or returned.
    pub redactor: Redactor,
    /// Where relative paths point and where project files are looked for.
    pub workdir: PathBuf,
}
