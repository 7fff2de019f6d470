//! [`AgentError`]: why a session could not be opened or a turn could not
//! run, shared by the agent and its turn loop.

use talaria_store::StoreError;

/// Why a session could not be opened or a turn could not run.
///
/// Model failures are not errors here: they end the turn with
/// [`crate::TurnExit::Failed`] and the transcript so far stays stored.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The session store failed; the turn's rows may be partly stored.
    #[error("session store: {0}")]
    Store(#[from] StoreError),
    /// [`Agent::resume_session`] was given an id the store does not know.
    #[error("session `{0}` does not exist")]
    NoSuchSession(String),
    /// Building the system prompt did not complete (its task panicked).
    #[error("cannot build the system prompt: {0}")]
    Prompt(String),
}
