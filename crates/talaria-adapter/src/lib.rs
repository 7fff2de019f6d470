//! The contract between Talaria's gateway and its platform adapters.
//!
//! A platform crate depends on this crate, core and the store's traits it
//! needs, and on nothing that runs a turn: no gateway, agent or model
//! client. What crosses the line is defined here.
//!
//! # Layout
//!
//! - [`contract`]: the [`Adapter`] trait, the [`Inbox`] adapters hand
//!   events to, send and connection errors and what the ledger does on
//!   each, liveness.
//! - [`capabilities`]: what a platform can do ([`Capabilities`], with its
//!   [`MessageLimits`]), which the gateway asks instead of comparing
//!   platform names.
//! - [`event`]: [`MessageEvent`] and [`SessionSource`], what every inbound
//!   message becomes.
//! - [`media`]: files in ([`Attachment`], fetched as a [`Download`]) and
//!   out ([`OutboundFile`]).
//! - [`key`]: the one function that turns a source into a [`SessionKey`].
//! - [`auth`]: who may talk to the bot (allow-all flags, allowlists, the
//!   pairing store), evaluated in a fixed order.
//! - [`split`]: cutting long answers to a platform's limit without breaking
//!   code fences, and joining the parts again.
//! - [`target`]: the delivery-target grammar (`origin`, `local`,
//!   `<platform>[:<chat>[:<thread>]]`) and home channels.
#![forbid(unsafe_code)]

pub mod auth;
pub mod capabilities;
pub mod contract;
pub mod event;
pub mod key;
pub mod media;
pub mod split;
pub mod target;

pub use capabilities::{Capabilities, Markup, MediaKind, SenderIds};
pub use contract::{
    Adapter, AdapterContext, AdapterError, Admission, Admit, AdmitReply, Choice, Inbox,
    InboxClosed, LengthUnit, Liveness, LivenessReporter, MessageLimits, OutboundMessage, SendError,
    SentMessage,
};
pub use event::{ChatType, Invocation, MessageEvent, SessionSource};
pub use key::{KeyPolicy, SessionKey};
pub use media::{Attachment, AttachmentSource, Download, DownloadError, OutboundFile};
