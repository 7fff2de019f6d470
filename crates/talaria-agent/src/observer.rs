//! The turn's outward-facing progress channel.
//!
//! A front end (the REPL, a chat gateway, a test) implements
//! [`TurnObserver`] to show progress while a turn runs. Every method has an
//! empty default so an implementation overrides only what it displays.

/// Receives progress from a running turn.
///
/// Methods are called from the task that drives the turn (text and reasoning
/// deltas from inside the provider's stream), so they must return quickly:
/// anything slow belongs on a channel to another task.
pub trait TurnObserver: Send + Sync {
    /// A piece of visible answer text as it streams.
    fn text(&self, _delta: &str) {}
    /// The text streamed so far by the current model call is void: the
    /// attempt failed and a retry (or a fallback model) streams anew. A
    /// front end showing the text should clear what this call showed.
    fn text_restarted(&self) {}
    /// A piece of model reasoning as it streams (not part of the answer).
    fn reasoning(&self, _delta: &str) {}
    /// A tool call is about to run, with its raw argument text.
    fn tool_started(&self, _name: &str, _args: &str) {}
    /// A tool call finished; `preview` is the start of what the model sees.
    fn tool_finished(&self, _name: &str, _ok: bool, _preview: &str) {}
    /// Something the user should know that is not part of the answer
    /// (compression, a retry after an empty reply, ...).
    fn notice(&self, _msg: &str) {}
    /// A line from inside a running tool call: what a subagent of
    /// `delegate_task` is doing, say. Frequent; show it compactly.
    fn progress(&self, _line: &str) {}
}

/// How a tool call reports progress lines to its turn's observer
/// ([`TurnObserver::progress`]) while it runs. Lines are dropped, never
/// waited for, when the observer falls behind.
#[derive(Debug, Clone, Default)]
pub struct Progress(Option<tokio::sync::mpsc::Sender<String>>);

impl Progress {
    /// Progress that goes nowhere (a call outside a turn).
    pub fn none() -> Progress {
        Progress(None)
    }

    /// Progress sent on `tx`.
    pub fn to(tx: tokio::sync::mpsc::Sender<String>) -> Progress {
        Progress(Some(tx))
    }

    /// Reports `line`.
    pub fn line(&self, line: impl Into<String>) {
        if let Some(tx) = &self.0 {
            let _ = tx.try_send(line.into());
        }
    }
}

/// An observer that shows nothing (batch jobs, background work, tests).
#[derive(Debug, Clone, Copy, Default)]
pub struct NullObserver;

impl TurnObserver for NullObserver {}
