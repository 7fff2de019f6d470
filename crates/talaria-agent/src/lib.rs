//! Talaria's agent: a stateless turn loop over a model, with tools.
//!
//! A front end builds one [`Agent`] from its [`AgentParts`], opens a
//! [`SessionHandle`] with [`Agent::new_session`] or [`Agent::resume_session`],
//! and calls [`Agent::run_turn`] once per user message, watching progress
//! through a [`TurnObserver`] and interrupting with a cancellation token.
//!
//! # Layout
//!
//! - [`agent`]: [`Agent`]; opening and resuming sessions, running turns.
//! - `parts`: [`AgentParts`], what an agent is built from and what its
//!   turns borrow; `session`: [`SessionHandle`]; `error`: [`AgentError`].
//! - [`turn`]: the turn loop itself ([`TurnOutcome`], [`TurnExit`],
//!   [`Outbox`]): the iteration budget, interrupts, persistence order;
//!   its model calls (with compression) in `turn/model.rs` and its tool
//!   batches in `turn/tools.rs`.
//! - [`dispatch`]: planning a batch of tool calls (unknown names, bad
//!   arguments, duplicates, parallel groups) and running one call safely.
//! - [`prompt`]: assembling the system prompt once per session.
//! - [`repair`]: making a stored transcript acceptable to chat APIs (pure).
//! - [`compress`]: context compression: estimates, the cut, the summary
//!   request (pure parts).
//! - [`spill`]: moving oversized tool output to files.
//! - [`shared_home`]: keeping the memory files and skills in step with the
//!   copy a multi-node store shares.
//! - [`execution`]: where a conversation's commands run and which files
//!   its tools may touch (the backend from `talaria-exec`, the workspace,
//!   the tools withheld when an isolated backend can't start).
//! - [`observer`]: the [`TurnObserver`] progress trait.
//! - [`memory_context`]: the `<memory-context>` fence for recalled memory,
//!   its sanitizer and the streaming scrubber.
//! - [`memory_provider`]: the external memory provider trait and the
//!   manager that holds one and isolates its failures.
//! - [`interaction`]: the seam to a human (approvals, clarifying questions).
//! - [`background`]: work that outlives its turn and where it reports
//!   ([`background::Reports`]).
//! - [`processes`]: background processes (`terminal(background=true)`):
//!   the registry every session shares, their output buffers and logs,
//!   limits, and their reports; the `process` tool is its handle.
//! - [`tools`]: the [`tools::Tool`] trait, the registry, and the core tools.
//! - [`untrusted`]: fencing what tools bring in from outside as data.
//!
//! # Invariant
//!
//! This crate knows nothing about chat platforms: a turn gets text in and
//! gives text and transcript rows out. It holds no transcript between
//! turns: the store is the source of truth, and every stored transcript is
//! valid for an API after [`repair::repair_history`].
#![forbid(unsafe_code)]

pub mod agent;
pub mod attach;
pub mod background;
pub mod budget;
pub mod compress;
pub mod dispatch;
mod error;
pub mod execution;
pub mod interaction;
pub mod memory_context;
pub mod memory_provider;
pub mod models;
pub mod observer;
mod parts;
pub mod processes;
pub mod prompt;
pub mod repair;
mod session;
pub mod shared_home;
pub mod spill;
pub mod tools;
pub mod turn;
pub mod untrusted;

pub use agent::{
    Agent, AgentError, AgentParts, Outbox, SessionHandle, TurnHook, TurnOptions, pick_session,
    session_title,
};
pub use execution::Execution;
pub use observer::{NullObserver, Progress, TurnObserver};
pub use turn::{TurnExit, TurnOutcome};
