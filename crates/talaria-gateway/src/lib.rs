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
//! - [`runner`]: the order every event goes through (authorization,
//!   commands, the busy guard) and the per-chat lanes that run turns.
//! - [`owed`]: every accepted message owed an answer until one is stored;
//!   what a dead node left unanswered runs again or is said lost.
//! - [`turn_lease`]: with a shared store, one running turn per session
//!   across every node.
//! - [`router`]: session key → current session, reset policies, `/new` and
//!   `/resume`, and the watcher that ends expired sessions in the
//!   background.
//! - [`delivery`]: sending text (split, retried) and final replies through
//!   the ledger.
//! - [`messenger`]: the agent's `send_message` tool, delivered through
//!   the ledger.
//! - [`control`]: the local socket `talaria send` hands messages over.
//! - [`ledger`]: the delivery ledger's policy: obligation ids, fenced
//!   attempts, the sweep.
//! - [`preview`]: streaming previews, one message edited as the answer
//!   grows.
//! - [`target`]: the delivery-target grammar (`origin`, `local`,
//!   `<platform>[:<chat>[:<thread>]]`) and home channels.
//! - [`split`]: cutting long answers to a platform's limit without breaking
//!   code fences.
//! - [`supervisor`]: adapters as supervised tasks with reconnect backoff and
//!   a liveness board; a ledger sweep each time one goes live.
//! - [`gateway`]: all of the above assembled, with an orderly stop.
//! - [`maintenance`]: periodic background chores (ledger pruning, the
//!   session-expiry watcher) as supervised tasks: errors logged, panics
//!   restarted with backoff, a prompt stop.
//! - [`dotenv`]: writing variables into the home's `.env` (`/sethome`).
//! - [`cron`]: scheduled jobs, each run an isolated session delivered
//!   through the ledger; the occurrence claim that keeps a run from firing
//!   twice.
//! - [`hooks`]: user programs run on gateway events (startup, messages,
//!   turns, commands), isolated in their own processes and bounded in time
//!   and number.
//!
//! Process-level pieces:
//!
//! - [`owner`]: this process's identity (pid plus start time) and whether
//!   another process is still alive.
//! - [`node`]: this gateway as a node of its deployment: its id, its
//!   heartbeat, and dead neighbours on the same host.
//! - [`process`]: the PID file under an exclusive lock, and the state file
//!   `talaria gateway status` reads.
//! - [`token_lock`]: one gateway per bot credential on a machine.
#![forbid(unsafe_code)]

pub mod adapter;
pub mod auth;
pub mod control;
pub mod cron;
pub mod delivery;
pub mod dotenv;
pub mod event;
pub mod gateway;
pub mod hooks;
pub mod key;
pub mod ledger;
pub mod maintenance;
pub mod messenger;
pub mod node;
pub mod owed;
pub mod owner;
pub mod pairing;
pub mod preview;
pub mod process;
pub mod router;
pub mod runner;
pub mod split;
pub mod supervisor;
pub mod target;
pub mod token_lock;
pub mod turn_lease;

pub use adapter::{
    Adapter, AdapterContext, AdapterError, Admission, Admit, AdmitReply, Inbox, Liveness,
    LivenessReporter, MessageLimits, OutboundMessage, SendError, SentMessage,
};
pub use event::{ChatType, Invocation, MessageEvent, SessionSource};
pub use key::{KeyPolicy, SessionKey};
