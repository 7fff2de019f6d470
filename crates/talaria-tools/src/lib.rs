//! Agent tools beyond the core set that reach an outside service through a
//! platform's client, kept apart so that platform crates never link the
//! agent.
//!
//! # Layout
//!
//! - [`homeassistant`]: the `ha_*` tools over Home Assistant's REST API.
#![forbid(unsafe_code)]

pub mod homeassistant;
