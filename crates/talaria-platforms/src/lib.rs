//! Talaria's platform adapters. Each lives behind a cargo feature that is
//! on by default and keeps everything platform-specific inside itself.
//!
//! This crate builds against the adapter contract (`talaria-adapter`),
//! core and the store's traits only: never the gateway, the agent, the
//! learning loop or a model client (`scripts/check-deps` fails CI if that
//! changes).
//!
//! # Layout
//!
//! - [`registry`]: every platform of this build as one entry (name,
//!   title, constructor); the CLI and the docs walk it.
//! - [`telegram`]: the Telegram Bot API over long polling.
//! - [`discord`]: Discord's gateway WebSocket in, its REST API out.
//! - [`mattermost`]: Mattermost's API v4 and its WebSocket event stream.
//! - [`matrix`]: a Matrix account over the client-server API's `/sync`.
//! - [`email`]: a mailbox over IMAP (IDLE or polling), replies over SMTP.
//! - [`slack`]: Slack over Socket Mode, sending through the Web API.
//! - [`dingtalk`]: DingTalk's Stream mode in, session webhooks and the
//!   robot send API out.
//! - [`webhook`]: signed webhook deliveries as agent turns.
//! - [`ingress`]: the one HTTP listener (port 8644) that every platform
//!   delivering by webhook is mounted on.
//! - [`listen`]: serving an HTTP listener (the ingress, and the API
//!   server of `talaria-api`) within timeouts and a connection cap
//!   derived from the open-file limit.
//! - [`signal`]: a Signal account through a signal-cli REST API server.
//! - [`whatsapp`]: the WhatsApp Cloud API (Meta's webhook in, Graph out).
//! - [`feishu`]: Feishu / Lark (long connection or event webhook in, Open
//!   Platform REST out) and document comments answered in their threads.
//! - [`sms`]: SMS through a Twilio number, its webhook on [`ingress`].
//! - [`homeassistant`]: Home Assistant's conversation endpoint and the
//!   `ha_*` tools.
//! - [`qqbot`]: a QQ bot over QQ's official API v2 (gateway WebSocket in,
//!   OpenAPI out).
//! - [`weixin`]: a personal WeChat account through Tencent's iLink bot API
//!   (long polling).
//! - [`yuanbao`]: Tencent Yuanbao's bot socket (a signed token, then
//!   protobuf frames both ways).
//! - [`wecom`]: WeCom's self-built app (encrypted XML callback on
//!   [`ingress`], the corp API out) and its intelligent robot (a long
//!   connection both ways).
//! - [`irc`]: one nick on an IRC network (TLS, SASL PLAIN), channels and
//!   private messages.
//! - [`bluebubbles`]: iMessage through a BlueBubbles server on a Mac (its
//!   webhook on [`ingress`], caught up from its REST API).
//! - [`google_chat`]: a Google Chat app's HTTP endpoint on [`ingress`]
//!   (Google-signed tokens checked), the Chat API out as its service
//!   account.
//! - [`line`]: a LINE Official Account (the Messaging API's signed webhook
//!   on [`ingress`], reply tokens and idempotent pushes out).
//! - [`msgraph`]: Microsoft Graph change notifications for Teams chats
//!   and channels and Outlook mail on [`ingress`] (journaled before they
//!   are acknowledged), subscriptions kept alive, Graph's REST API out.
//! - `http`: the client, error type and default send-error reading every
//!   REST-speaking adapter shares; `rest`: a JSON client of one root with
//!   a bearer token (Mattermost, Signal, Matrix); `seen`: the bounded set
//!   of ids already handed over (Slack, DingTalk, Feishu, the WeCom
//!   robot); `ws`: WebSocket connections and a socket given up when it
//!   goes silent; `kept`: a connection's resume state in the store,
//!   written at most once per interval (Discord, Mattermost); `access`: the ancestor's DM and group policies (the
//!   WeCom robot, Yuanbao); `entities`:
//!   escaping for HTML-like markups; `net`: the loopback check; `plain`:
//!   Markdown as plain text (Signal, IRC).
#![forbid(unsafe_code)]

#[cfg(feature = "bluebubbles")]
pub mod bluebubbles;
#[cfg(feature = "dingtalk")]
pub mod dingtalk;
#[cfg(feature = "discord")]
pub mod discord;
#[cfg(feature = "email")]
pub mod email;
#[cfg(any(feature = "telegram", feature = "slack"))]
mod entities;
#[cfg(feature = "feishu")]
pub mod feishu;
#[cfg(feature = "google_chat")]
pub mod google_chat;
#[cfg(feature = "homeassistant")]
pub mod homeassistant;
#[cfg(any(
    feature = "telegram",
    feature = "discord",
    feature = "slack",
    feature = "mattermost",
    feature = "matrix",
    feature = "signal",
    feature = "whatsapp",
    feature = "sms",
    feature = "dingtalk",
    feature = "qqbot",
    feature = "weixin",
    feature = "feishu",
    feature = "line",
    feature = "bluebubbles",
    feature = "google_chat",
    feature = "msgraph"
))]
mod http;
#[cfg(feature = "ingress")]
pub mod ingress;
#[cfg(feature = "irc")]
pub mod irc;
#[cfg(any(feature = "discord", feature = "mattermost"))]
mod kept;
#[cfg(feature = "line")]
pub mod line;
pub mod listen;
#[cfg(feature = "matrix")]
pub mod matrix;
#[cfg(feature = "mattermost")]
pub mod mattermost;
#[cfg(feature = "msgraph")]
pub mod msgraph;
mod net;
#[cfg(any(
    feature = "signal",
    feature = "irc",
    feature = "line",
    feature = "bluebubbles",
    feature = "google_chat"
))]
mod plain;
#[cfg(feature = "qqbot")]
pub mod qqbot;
pub mod registry;
#[cfg(any(feature = "mattermost", feature = "signal", feature = "matrix"))]
mod rest;
#[cfg(any(
    feature = "slack",
    feature = "dingtalk",
    feature = "feishu",
    feature = "wecom",
    feature = "msgraph"
))]
mod seen;
// The ancestor's DM and group policies, for the platforms that have them.
#[cfg(any(feature = "wecom", feature = "yuanbao"))]
mod access;
#[cfg(feature = "signal")]
pub mod signal;
#[cfg(feature = "slack")]
pub mod slack;
#[cfg(feature = "sms")]
pub mod sms;
#[cfg(feature = "telegram")]
pub mod telegram;
#[cfg(feature = "webhook")]
pub mod webhook;
#[cfg(feature = "wecom")]
pub mod wecom;
#[cfg(feature = "weixin")]
pub mod weixin;
#[cfg(feature = "whatsapp")]
pub mod whatsapp;
#[cfg(feature = "websocket")]
mod ws;
#[cfg(feature = "yuanbao")]
pub mod yuanbao;
