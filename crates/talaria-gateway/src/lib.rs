//! Talaria's messaging gateway: one long-running process that connects the
//! enabled platforms and serves the agent to them, losing no reply across
//! crashes.
//!
//! # Layout
//!
//! The data path, in order:
//!
//! - [`adapter`]: the contract every platform connector implements, and
//!   the [`adapter::Inbox`] it hands [`event::MessageEvent`]s to.
//! - [`event`]: [`event::MessageEvent`], [`event::SessionSource`], and
//!   slash-command parsing.
//! - [`key`]: the one function that turns a source into a
//!   [`key::SessionKey`].
//! - [`auth`]: who may talk to the bot (allow-all flags, allowlists, the
//!   pairing store), evaluated in a fixed order.
//! - [`pairing`]: DM pairing codes for strangers.
//! - [`split`]: cutting long answers to a platform's limit without breaking
//!   code fences.
//!
//! Process-level pieces:
//!
//! - [`owner`]: this process's identity (pid plus start time) and whether
//!   another process is still alive.
//! - [`process`]: the PID file under an exclusive lock, and the state file
//!   `talaria gateway status` reads.
//! - [`token_lock`]: one gateway per bot credential on a machine.
#![forbid(unsafe_code)]

pub mod adapter;
pub mod auth;
pub mod event;
pub mod key;
pub mod owner;
pub mod pairing;
pub mod process;
pub mod split;
pub mod token_lock;

pub use adapter::{
    Adapter, AdapterContext, AdapterError, Inbox, Liveness, LivenessReporter, MessageLimits,
    OutboundMessage, SendError, SentMessage,
};
pub use event::{ChatType, Invocation, MessageEvent, SessionSource};
pub use key::{KeyPolicy, SessionKey};
