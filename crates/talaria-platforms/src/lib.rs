//! Talaria's platform adapters. Each lives behind a cargo feature that is
//! on by default and keeps everything platform-specific inside itself.
//!
//! # Layout
//!
//! - [`telegram`]: the Telegram Bot API over long polling.
//! - [`discord`]: Discord's gateway WebSocket in, its REST API out.
//! - [`mattermost`]: Mattermost's API v4 and its WebSocket event stream.
//! - [`matrix`]: a Matrix account over the client-server API's `/sync`.
//! - [`email`]: a mailbox over IMAP (IDLE or polling), replies over SMTP.
//! - [`slack`]: Slack over Socket Mode, sending through the Web API.
//! - [`api_server`]: the OpenAI-compatible HTTP server (port 8642).
//! - [`webhook`]: signed webhook deliveries as agent turns (port 8644).
#![forbid(unsafe_code)]

#[cfg(feature = "api-server")]
pub mod api_server;
#[cfg(feature = "discord")]
pub mod discord;
#[cfg(feature = "email")]
pub mod email;
#[cfg(any(feature = "api-server", feature = "webhook"))]
mod listen;
#[cfg(feature = "matrix")]
pub mod matrix;
#[cfg(feature = "mattermost")]
pub mod mattermost;
#[cfg(feature = "slack")]
pub mod slack;
#[cfg(feature = "telegram")]
pub mod telegram;
#[cfg(feature = "webhook")]
pub mod webhook;
#[cfg(feature = "websocket")]
mod ws;
