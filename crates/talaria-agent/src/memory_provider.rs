//! External memory providers (a mem0- or Honcho-like service) behind one
//! trait, and the [`MemoryManager`] that holds at most one of them and
//! keeps its failures away from turns.
//!
//! A provider is asked, before each turn, for memory relevant to the
//! user's message ([`MemoryProvider::prefetch`], bounded by a timeout); what
//! it recalls enters that turn's user message inside the `<memory-context>`
//! fence ([`crate::memory_context`]). After the turn the exchange is handed
//! to it ([`MemoryProvider::sync_turn`]) on a task of its own. A provider
//! that is slow, down or broken costs its recall for that turn and a log
//! line, never the turn.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;

use crate::tools::Tool;

/// A long-term memory service.
#[async_trait]
pub trait MemoryProvider: Send + Sync {
    /// For logs and errors.
    fn name(&self) -> &str;
    /// Connects or checks the service; called once before first use.
    async fn initialize(&self) -> Result<(), String> {
        Ok(())
    }
    /// Text for the system prompt of new sessions, if any.
    fn system_prompt_block(&self) -> Option<String> {
        None
    }
    /// Memory relevant to `query` (the user's message), or `None`.
    async fn prefetch(&self, query: &str, session_id: &str) -> Result<Option<String>, String>;
    /// Hands over a finished exchange for the service to learn from.
    async fn sync_turn(&self, user: &str, assistant: &str, session_id: &str) -> Result<(), String>;
    /// Tools of the provider's own (search, remember, ...).
    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        Vec::new()
    }
    /// A session ended.
    async fn on_session_end(&self, _session_id: &str) {}
    /// The process is stopping.
    async fn shutdown(&self) {}
}

/// Why a provider could not be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    #[error(
        "an external memory provider (`{existing}`) is already active; only one may be (memory.provider names it)"
    )]
    /// A provider is already active; only one external provider may be.
    SecondProvider {
        /// The name of the provider already active.
        existing: String,
    },
}

/// The built-in memory's companion: at most one external provider.
pub struct MemoryManager {
    provider: OnceLock<Arc<dyn MemoryProvider>>,
    prefetch_timeout: Duration,
}

impl MemoryManager {
    /// A manager giving each prefetch at most `prefetch_timeout`.
    pub fn new(prefetch_timeout: Duration) -> MemoryManager {
        MemoryManager {
            provider: OnceLock::new(),
            prefetch_timeout,
        }
    }

    /// Makes `provider` the external one; a second is refused.
    pub fn add(&self, provider: Arc<dyn MemoryProvider>) -> Result<(), MemoryError> {
        let name = provider.name().to_owned();
        self.provider
            .set(provider)
            .map_err(|_| MemoryError::SecondProvider {
                existing: self
                    .provider
                    .get()
                    .map(|p| p.name().to_owned())
                    .unwrap_or(name),
            })
    }

    /// The active external provider, if one was added.
    pub fn provider(&self) -> Option<&Arc<dyn MemoryProvider>> {
        self.provider.get()
    }

    /// Initializes the provider; a failure is logged and the provider is
    /// still asked later (a service that was down at start may come up).
    pub async fn initialize(&self) {
        if let Some(p) = self.provider.get()
            && let Err(e) = p.initialize().await
        {
            tracing::warn!(provider = p.name(), error = %e, "the memory provider did not initialize; recall may fail until it is reachable");
        }
    }

    /// Tells the provider a session ended (on its own task).
    pub fn session_ended(&self, session_id: &str) {
        let (Some(p), Ok(runtime)) = (
            self.provider.get().cloned(),
            tokio::runtime::Handle::try_current(),
        ) else {
            return;
        };
        let session = session_id.to_owned();
        runtime.spawn(async move { p.on_session_end(&session).await });
    }

    /// Stops the provider, waiting at most `limit`.
    pub async fn shutdown(&self, limit: Duration) {
        if let Some(p) = self.provider.get()
            && tokio::time::timeout(limit, p.shutdown()).await.is_err()
        {
            tracing::warn!(
                provider = p.name(),
                "the memory provider did not stop in time"
            );
        }
    }

    /// The provider's recall for `query`, fenced; `None` when there is
    /// none, or the provider failed or took longer than the timeout (which
    /// is logged).
    pub async fn recall(&self, query: &str, session_id: &str) -> Option<String> {
        let provider = self.provider.get()?;
        match tokio::time::timeout(self.prefetch_timeout, provider.prefetch(query, session_id))
            .await
        {
            Ok(Ok(Some(text))) if !text.trim().is_empty() => {
                Some(crate::memory_context::fence(&text))
            }
            Ok(Ok(_)) => None,
            Ok(Err(e)) => {
                tracing::warn!(provider = provider.name(), error = %e, "memory recall failed; the turn goes on without it");
                None
            }
            Err(_) => {
                tracing::warn!(provider = provider.name(), timeout = ?self.prefetch_timeout, "memory recall timed out; the turn goes on without it");
                None
            }
        }
    }

    /// Hands the exchange to the provider on its own task; a failure is
    /// logged.
    pub fn sync(&self, user: &str, assistant: &str, session_id: &str) {
        let Some(provider) = self.provider.get().cloned() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let user = crate::memory_context::sanitize(user);
        let assistant = crate::memory_context::sanitize(assistant);
        let session = session_id.to_owned();
        runtime.spawn(async move {
            if let Err(e) = provider.sync_turn(&user, &assistant, &session).await {
                tracing::warn!(provider = provider.name(), error = %e, "could not hand the turn to the memory provider");
            }
        });
    }
}
