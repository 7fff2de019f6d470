//! Agent tools beyond the core set that reach an outside service through a
//! platform's client, kept apart so that platform crates never link the
//! agent.
//!
//! # Layout
//!
//! - [`browser`]: the `browser_*` tools over a headless Chromium
//!   (`talaria_web::browser`).
//! - [`homeassistant`]: the `ha_*` tools over Home Assistant's REST API.
#![forbid(unsafe_code)]

pub mod browser;
pub mod homeassistant;
