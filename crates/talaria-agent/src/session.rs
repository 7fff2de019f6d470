//! [`SessionHandle`]: an open session as a front end holds it between
//! turns.

use std::sync::Arc;

use crate::tools::SessionState;

/// An open session: its id, its process-local state and its frozen system
/// prompt. Cheap to clone; clones share the state and take turns one at a
/// time.
#[derive(Debug, Clone)]
pub struct SessionHandle {
    /// The stored session's id.
    pub id: String,
    /// State that lives as long as the session in this process (todo list,
    /// approvals given).
    pub state: Arc<SessionState>,
    /// Where the session came from (`cli`, `telegram`, `cron`, ...), as
    /// stored.
    source: Arc<str>,
    system_prompt: Arc<str>,
    /// The model `/model` chose for the session, as stored (a route's
    /// name, `model` or `provider:model`); `None` follows the configured
    /// default.
    model_choice: Arc<std::sync::Mutex<Option<String>>>,
    /// Held for the length of a turn: two turns interleaving on one
    /// transcript would corrupt it.
    pub(crate) turn_lock: Arc<tokio::sync::Mutex<()>>,
}

impl SessionHandle {
    /// A handle on stored session `id` from `source`, whose system prompt
    /// is `system_prompt`.
    pub(crate) fn new(id: String, source: String, system_prompt: String) -> SessionHandle {
        SessionHandle {
            id,
            source: source.into(),
            state: Arc::new(SessionState::default()),
            system_prompt: system_prompt.into(),
            model_choice: Arc::default(),
            turn_lock: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// Where the session came from (`cli`, `telegram`, `cron`, ...).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The system prompt sent, unchanged, with every request of the session.
    pub fn system_prompt(&self) -> &str {
        &self.system_prompt
    }

    /// The model this session switched to, if it did.
    pub fn model_choice(&self) -> Option<String> {
        self.model_choice
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records the session's switch in this handle (and its clones); the
    /// caller stores it ([`crate::Agent::switch_model`] does both).
    pub(crate) fn set_model_choice(&self, choice: Option<String>) {
        *self.model_choice.lock().unwrap_or_else(|p| p.into_inner()) = choice;
    }
}
