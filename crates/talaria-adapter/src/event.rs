//! What every platform's inbound message becomes: a [`MessageEvent`] with
//! its [`SessionSource`].
//!
//! Adapters build these and nothing else crosses into the runner, so the
//! runner, the session router and the ledger never see a platform's own
//! payload types.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::media::Attachment;
// Parsed in core so the CLI and the gateway agree on what a command is.
pub use talaria_core::commands::Invocation;

/// The kind of conversation a message belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChatType {
    /// A one-to-one chat with the bot.
    Dm,
    /// A group chat (Telegram groups and supergroups, Discord guild channels).
    Group,
    /// A broadcast channel.
    Channel,
    /// A thread inside a channel (Slack, Discord threads).
    Thread,
    /// A forum-style group whose topics are threads (Telegram forums).
    Forum,
}

impl ChatType {
    /// The form used in session keys and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ChatType::Dm => "dm",
            ChatType::Group => "group",
            ChatType::Channel => "channel",
            ChatType::Thread => "thread",
            ChatType::Forum => "forum",
        }
    }

    /// Whether several people may speak in this chat.
    pub fn is_shared(self) -> bool {
        !matches!(self, ChatType::Dm)
    }
}

impl fmt::Display for ChatType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a message came from: platform, chat, thread and sender.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSource {
    /// The platform's name as used in keys and config: `telegram`, `discord`, ...
    pub platform: String,
    /// The platform's chat (or channel, or room) id.
    pub chat_id: String,
    /// The chat's display name, when the platform gives one.
    pub chat_name: Option<String>,
    /// Direct message, group or channel: decides the session key and
    /// which allowlists apply.
    pub chat_type: ChatType,
    /// The sender's platform id. `None` for anonymous posts (channel posts).
    pub user_id: Option<String>,
    /// The sender's display name.
    pub user_name: Option<String>,
    /// The thread, forum topic or reply chain, when the platform has one.
    pub thread_id: Option<String>,
    /// The sender is a bot or an automated account.
    pub is_bot: bool,
}

impl SessionSource {
    /// A DM source, the common case in tests and tools.
    pub fn dm(platform: &str, chat_id: &str, user_id: &str) -> SessionSource {
        SessionSource {
            platform: platform.to_owned(),
            chat_id: chat_id.to_owned(),
            chat_name: None,
            chat_type: ChatType::Dm,
            user_id: Some(user_id.to_owned()),
            user_name: None,
            thread_id: None,
            is_bot: false,
        }
    }
}

/// One inbound message, normalised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageEvent {
    /// Where the message came from: platform, chat, thread and sender.
    pub source: SessionSource,
    /// The text as the user wrote it (captions for media).
    pub text: String,
    /// The platform's id for this message; replies anchor to it and the
    /// delivery ledger keys obligations by it.
    pub message_id: Option<String>,
    /// The message this one replies to.
    pub reply_to_message_id: Option<String>,
    /// The text of the message replied to, when the platform sends it.
    pub reply_to_text: Option<String>,
    /// Files that came with the message, fetched by the gateway when the
    /// turn runs.
    #[serde(default)]
    pub attachments: Vec<Attachment>,
    /// Where the answer goes instead of back to the source, as a delivery
    /// target (`telegram:123`, `local`, ...). Set by adapters whose source
    /// cannot take a reply, such as a webhook route.
    #[serde(default)]
    pub reply_target: Option<String>,
}

impl MessageEvent {
    /// A text message from `source`.
    pub fn text(source: SessionSource, text: impl Into<String>) -> MessageEvent {
        MessageEvent {
            source,
            text: text.into(),
            message_id: None,
            reply_to_message_id: None,
            reply_to_text: None,
            attachments: Vec::new(),
            reply_target: None,
        }
    }

    /// The slash command this message invokes, if it is one.
    pub fn command(&self) -> Option<Invocation<'_>> {
        Invocation::parse(&self.text)
    }
}
