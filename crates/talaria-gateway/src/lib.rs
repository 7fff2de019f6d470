//! Talaria's messaging gateway: one long-running process that connects the
//! enabled platforms and serves the agent to them, losing no reply across
//! crashes.
//!
//! # Layout
//!
//! The adapter contract (the `Adapter` trait, events, session keys,
//! authorization, splitting and delivery targets) lives in
//! `talaria-adapter`, so platforms build without the gateway; its modules
//! are re-exported here under their old names.
//!
//! The data path, in order:
//!
//! - [`pairing`]: DM pairing codes for strangers.
//! - [`runner`]: the order every event goes through (intake and
//!   authorization, commands, the busy guard) and the per-chat lanes that
//!   run turns; a folder with one module per concern.
//! - [`slash`]: what slash commands do, written once behind a small
//!   front-end trait that the runner (a chat) and the CLI's REPL implement.
//! - [`jobs`]: work that outlives its turn (background commands,
//!   detached delegations, `/background`), owed its chat a report.
//! - [`owed`]: every accepted message owed an answer until one is stored;
//!   what a dead node left unanswered runs again or is said lost.
//! - [`turn_lease`]: with a shared store, one running turn per session
//!   across every node.
//! - [`router`]: session key → current session, reset policies, `/new` and
//!   `/resume`, and the watcher that ends expired sessions in the
//!   background.
//! - [`media`]: a message's attachments fetched into the media cache when
//!   its turn runs, and the services that turn them into model input
//!   (speech to text, image descriptions) or speak answers.
//! - [`delivery`]: sending answers (text split, retried, then the files of
//!   their `MEDIA:` lines, cut into [`parts`] the ledger counts) and final
//!   replies through the ledger.
//! - [`messenger`]: the agent's `send_message` tool, delivered through
//!   the ledger.
//! - [`control`]: the local socket `talaria send` hands messages over.
//! - [`ledger`]: the delivery ledger's policy: obligation ids, fenced
//!   attempts, the sweep.
//! - [`preview`]: streaming previews, one message edited as the answer
//!   grows.
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
//!   and number; each event's payload is a type in [`hooks::events`].
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

pub mod control;
pub mod cron;
pub mod delivery;
pub mod dotenv;
pub mod gateway;
pub mod hooks;
pub mod isolation;
pub mod jobs;
pub mod ledger;
pub mod maintenance;
pub mod media;
pub mod messenger;
pub mod node;
pub mod owed;
pub mod owner;
pub mod pairing;
pub mod parts;
pub mod preview;
pub mod process;
pub mod router;
pub mod runner;
pub mod slash;
pub mod supervisor;
pub mod token_lock;
pub mod turn_lease;

pub use talaria_adapter::contract as adapter;
pub use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Admission, Admit, AdmitReply, Capabilities, Inbox,
    Liveness, LivenessReporter, MessageLimits, OutboundMessage, SendError, SentMessage,
};
pub use talaria_adapter::{
    ChatType, Invocation, KeyPolicy, MessageEvent, SessionKey, SessionSource,
};
pub use talaria_adapter::{auth, event, key, split, target};
