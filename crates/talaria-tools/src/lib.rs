//! Agent tools beyond the core set that reach an outside service (a
//! platform's client, the web), kept apart so that platform crates and the
//! web crate never link the agent.
//!
//! # Layout
//!
//! - [`browser`]: the `browser_*` tools over a headless Chromium
//!   (`talaria_web::browser`).
//! - [`feishu`]: the `feishu_doc_read` and `feishu_drive_*` tools over the
//!   Feishu / Lark Open Platform.
//! - [`homeassistant`]: the `ha_*` tools over Home Assistant's REST API.
//! - [`web`]: `web_search` and `web_extract`.
//! - [`yuanbao`]: the `yb_*` group tools over Yuanbao's bot socket.
#![forbid(unsafe_code)]

pub mod browser;
pub mod feishu;
pub mod homeassistant;
pub mod web;
pub mod yuanbao;
