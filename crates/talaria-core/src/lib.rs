//! Talaria's shared vocabulary: the transcript types every crate speaks, the
//! configuration schema, the home directory layout, redaction and id
//! validation.
//!
//! # Layout
//!
//! - [`message`]: transcript rows ([`Message`], [`ToolCall`], [`Role`]) and [`Usage`].
//! - [`config`]: the typed `config.yaml` schema with its defaults, and `.env` loading.
//! - [`effective`]: the configuration as it takes effect, with the values the
//!   environment supplies filled in (what `config show` prints).
//! - [`home`]: `TALARIA_HOME` and the paths inside it.
//! - [`redact`]: secret redaction for tool output, logs and stored text.
//! - [`logs`]: reading the log files: their tails backwards within bounds,
//!   a line's time and level, the filters `/api/logs` and `talaria logs`
//!   share.
//! - [`ids`]: session ids, hashed platform ids, path and key validators.
//! - [`toolsets`]: the named groups of tools `platform_toolsets` switches.
//!
//! This crate does no network or database I/O (its only file I/O is
//! reading configuration files and, in [`logs`], log files); everything
//! here is usable from any other crate without pulling in a runtime.
#![forbid(unsafe_code)]

pub mod commands;
pub mod config;
pub mod effective;
pub mod home;
pub mod ids;
pub mod logs;
pub mod message;
pub mod metrics;
pub mod redact;
pub mod toolsets;

pub use config::{Config, Endpoint, Env, ModelRoute, ProviderKind, Secret, constant_time_eq};
pub use home::Home;
pub use message::{MediaKind, MediaRef, Message, Role, ThinkingBlock, ToolCall, Usage};
pub use redact::Redactor;

/// Now, as seconds since the Unix epoch with microseconds: the one clock
/// every stored and reported timestamp uses (store rows, the ledger, the
/// status file, hook events).
pub fn unix_now() -> f64 {
    chrono::Utc::now().timestamp_micros() as f64 / 1_000_000.0
}
