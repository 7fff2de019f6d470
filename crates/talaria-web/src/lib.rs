//! The web, made safe to hand to a chat.
//!
//! # Layout
//!
//! - [`guard`]: [`UrlGuard`], which addresses a fetch a chat can steer may
//!   reach, decided on resolved addresses; the HTTP client that connects
//!   only to what it checked.
//! - [`browser`]: [`browser::Browser`], headless Chromium over the DevTools protocol
//!   for the `browser_*` tools, one context per conversation, every request
//!   it makes through the guard.
//! - [`fetch`]: [`Fetcher`], a GET through the guard within limits of
//!   redirects, bytes and time.
#![forbid(unsafe_code)]

pub mod browser;
pub mod fetch;
pub mod guard;

pub use fetch::{FetchError, Fetched, Fetcher, Limits, Oversize};
pub use guard::{GuardError, UrlGuard};
