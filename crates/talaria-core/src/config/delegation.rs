//! `delegation:`: how `delegate_task` runs its subagents.

use super::*;

/// `delegation:`: the `delegate_task` tool's subagents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DelegationConfig {
    /// Tasks one call may hand out (they all run at once); a longer batch
    /// is refused. Also the most detached (`background`) delegations
    /// running at a time.
    pub max_concurrent: usize,
    /// Model calls a subagent may make before it must summarise (its own
    /// step budget, instead of `agent.max_turns`).
    pub max_iterations: u32,
    /// A model for subagents (a cheaper or faster one); unset, they use the
    /// main model. The front end builds the provider from it.
    pub model: Option<String>,
    /// Let subagents run commands that need an approval without asking.
    /// Off, such commands are refused: no human watches a subagent.
    pub subagent_auto_approve: bool,
}

impl Default for DelegationConfig {
    fn default() -> DelegationConfig {
        DelegationConfig {
            max_concurrent: 3,
            max_iterations: 50,
            model: None,
            subagent_auto_approve: false,
        }
    }
}

impl DelegationConfig {
    /// The first value that makes no sense, as (key, what is expected).
    pub(crate) fn problem(&self) -> Option<(&'static str, &'static str)> {
        if self.max_concurrent == 0 {
            return Some((
                "delegation.max_concurrent",
                "expected an integer of at least 1",
            ));
        }
        if self.max_iterations == 0 {
            return Some((
                "delegation.max_iterations",
                "expected an integer of at least 1",
            ));
        }
        if self.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
            return Some((
                "delegation.model",
                "expected a model name (or leave it out for the main model)",
            ));
        }
        None
    }
}
