//! WeCom (企业微信), through its two unrelated bot surfaces, registered as
//! two platforms:
//!
//! - [`callback`] (`wecom_callback`): a company's self-built application;
//!   WeCom posts encrypted XML to a callback on the shared listener, and
//!   answers go through the server API.
//! - [`bot`] (`wecom`): an intelligent robot (智能机器人) in API mode; it
//!   holds WeCom's long connection open, and answers go back on it.
//!
//! Shared by both: `crypto` (WeCom's AES-256-CBC with 32-byte padding,
//! and the SHA-1 signature) and `seen` (the bounded repeat filter).

pub mod bot;
pub mod callback;
mod crypto;
mod seen;
