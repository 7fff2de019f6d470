//! The events the gateway emits: their names, as hook manifests name
//! them, and one payload type per kind.

use std::borrow::Cow;

use serde::{Serialize, Serializer};

/// The gateway started; payload `{platforms: [names]}`.
pub const GATEWAY_STARTUP: &str = "gateway:startup";
/// The gateway is stopping (turns are drained); payload `{}`.
pub const GATEWAY_SHUTDOWN: &str = "gateway:shutdown";
/// A session key got a new session.
pub const SESSION_START: &str = "session:start";
/// A session stopped being its key's current one (`/new`, automatic
/// reset).
pub const SESSION_END: &str = "session:end";
/// `/new` replaced a key's session.
pub const SESSION_RESET: &str = "session:reset";
/// An authorized message arrived.
pub const MESSAGE_RECEIVED: &str = "message:received";
/// A final reply was delivered.
pub const MESSAGE_SENT: &str = "message:sent";
/// An agent turn is about to run.
pub const AGENT_START: &str = "agent:start";
/// An agent turn ended.
pub const AGENT_END: &str = "agent:end";
/// A scheduled job ran (reserved: cron is not built yet).
pub const CRON_RUN: &str = "cron:run";
/// The prefix of `command:<canonical name>`.
pub const COMMAND_PREFIX: &str = "command";

/// Every event with a fixed name.
pub const FIXED: &[&str] = &[
    GATEWAY_STARTUP,
    GATEWAY_SHUTDOWN,
    SESSION_START,
    SESSION_END,
    SESSION_RESET,
    MESSAGE_RECEIVED,
    MESSAGE_SENT,
    AGENT_START,
    AGENT_END,
    CRON_RUN,
];

/// Prefixes a manifest may subscribe to as `<prefix>:*`.
pub const PREFIXES: &[&str] = &["gateway", "session", "message", "agent", "command", "cron"];

/// The event a slash command emits, by its canonical name.
pub fn command(name: &str) -> String {
    format!("{COMMAND_PREFIX}:{name}")
}

/// A typed event: the payload a handler receives, and the name hooks
/// subscribe to it by.
///
/// Payloads borrow what they report and do their hashing and clipping
/// while being serialized, so building one costs nothing when no hook
/// subscribes (see [`super::Hooks::fire`]). Raw platform ids never reach
/// a hook: chats, users and session keys are hashed like everywhere else
/// outside the process.
pub trait HookEvent: Serialize {
    /// The event's name, as a manifest subscribes to it.
    fn name(&self) -> Cow<'static, str>;
}

/// Implements [`HookEvent`] for payloads whose name is fixed.
macro_rules! named {
    ($($ty:ident => $name:ident),* $(,)?) => {$(
        impl HookEvent for $ty<'_> {
            fn name(&self) -> Cow<'static, str> {
                Cow::Borrowed($name)
            }
        }
    )*};
}

named! {
    GatewayStartup => GATEWAY_STARTUP,
    GatewayShutdown => GATEWAY_SHUTDOWN,
    SessionStart => SESSION_START,
    SessionEnd => SESSION_END,
    SessionReset => SESSION_RESET,
    MessageReceived => MESSAGE_RECEIVED,
    MessageSent => MESSAGE_SENT,
    AgentStart => AGENT_START,
    AgentEnd => AGENT_END,
    CronRun => CRON_RUN,
}

/// `gateway:startup`: the platforms this gateway serves.
#[derive(Debug, Serialize)]
pub struct GatewayStartup<'a> {
    /// The enabled platforms' names.
    pub platforms: &'a [&'a str],
}

/// `gateway:shutdown`: an empty payload.
#[derive(Debug, Default, Serialize)]
pub struct GatewayShutdown<'a> {
    #[serde(skip)]
    _none: std::marker::PhantomData<&'a ()>,
}

/// `session:start`: a session key got a new session.
#[derive(Debug, Serialize)]
pub struct SessionStart<'a> {
    /// The platform the key belongs to.
    pub platform: &'a str,
    /// The session key (hashed when sent).
    #[serde(serialize_with = "hashed_key")]
    pub session_key: &'a str,
    /// The new session.
    pub session_id: &'a str,
    /// The sender who started it (hashed when sent).
    #[serde(rename = "user_id_hash", serialize_with = "hashed_user")]
    pub user_id: Option<&'a str>,
    /// Why a new session started: `first`, `idle`, `daily`, `new_session`.
    pub reason: &'a str,
}

/// `session:end`: a session stopped being its key's current one.
#[derive(Debug, Serialize)]
pub struct SessionEnd<'a> {
    /// The platform the key belongs to.
    pub platform: &'a str,
    /// The session key (hashed when sent).
    #[serde(serialize_with = "hashed_key")]
    pub session_key: &'a str,
    /// The session that ended.
    pub session_id: &'a str,
    /// Why: the reason the next session starts with.
    pub reason: &'a str,
}

/// `session:reset`: `/new` replaced a key's session.
#[derive(Debug, Serialize)]
pub struct SessionReset<'a> {
    /// The platform the key belongs to.
    pub platform: &'a str,
    /// The session key (hashed when sent).
    #[serde(serialize_with = "hashed_key")]
    pub session_key: &'a str,
    /// Who sent `/new` (hashed when sent).
    #[serde(rename = "user_id_hash", serialize_with = "hashed_user")]
    pub user_id: Option<&'a str>,
    /// The session the key points at now.
    pub session_id: &'a str,
    /// The one it pointed at before, if any.
    pub previous_session_id: Option<&'a str>,
}

/// `message:received`: an authorized message arrived.
#[derive(Debug, Serialize)]
pub struct MessageReceived<'a> {
    /// Where it came from.
    pub platform: &'a str,
    /// `dm`, `group`, ... as [`crate::ChatType::as_str`] names it.
    pub chat_type: &'a str,
    /// The chat (hashed when sent).
    #[serde(rename = "chat_id_hash", serialize_with = "hashed_chat")]
    pub chat_id: &'a str,
    /// The sender (hashed when sent).
    #[serde(rename = "user_id_hash", serialize_with = "hashed_user")]
    pub user_id: Option<&'a str>,
    /// The session key (hashed when sent).
    #[serde(serialize_with = "hashed_key")]
    pub session_key: &'a str,
    /// The message (its first [`CLIP`] characters when sent).
    #[serde(serialize_with = "clipped")]
    pub text: &'a str,
    /// Whether it is a slash command.
    pub is_command: bool,
}

/// `message:sent`: a final reply was delivered.
#[derive(Debug, Serialize)]
pub struct MessageSent<'a> {
    /// Where it went.
    pub platform: &'a str,
    /// The session key (hashed when sent).
    #[serde(serialize_with = "hashed_key")]
    pub session_key: &'a str,
    /// The reply's length in characters.
    pub chars: usize,
}

/// `agent:start`: an agent turn is about to run.
#[derive(Debug, Serialize)]
pub struct AgentStart<'a> {
    /// The platform of the chat it answers.
    pub platform: &'a str,
    /// The session key (hashed when sent).
    #[serde(serialize_with = "hashed_key")]
    pub session_key: &'a str,
    /// The session it runs in.
    pub session_id: &'a str,
    /// The message it answers (clipped when sent).
    #[serde(serialize_with = "clipped")]
    pub message: &'a str,
}

/// `agent:end`: an agent turn ended.
#[derive(Debug, Serialize)]
pub struct AgentEnd<'a> {
    /// The platform of the chat it answered.
    pub platform: &'a str,
    /// The session key (hashed when sent).
    #[serde(serialize_with = "hashed_key")]
    pub session_key: &'a str,
    /// The session it ran in.
    pub session_id: &'a str,
    /// `completed`, `budget_exhausted`, `interrupted` or `failed`.
    pub exit: &'a str,
    /// The answer, empty when there is none (clipped when sent).
    #[serde(serialize_with = "clipped")]
    pub response: &'a str,
}

/// `command:<name>`: a slash command is about to run in a chat.
#[derive(Debug, Serialize)]
pub struct CommandRun<'a> {
    /// The platform of the chat.
    pub platform: &'a str,
    /// The command's canonical name.
    pub command: &'a str,
    /// Its arguments (clipped when sent).
    #[serde(serialize_with = "clipped")]
    pub args: &'a str,
    /// The session key (hashed when sent).
    #[serde(serialize_with = "hashed_key")]
    pub session_key: &'a str,
}

impl HookEvent for CommandRun<'_> {
    fn name(&self) -> Cow<'static, str> {
        Cow::Owned(command(self.command))
    }
}

/// `cron:run`: a scheduled job ran.
#[derive(Debug, Serialize)]
pub struct CronRun<'a> {
    /// The job's id.
    pub job_id: &'a str,
    /// The job's name.
    pub job_name: &'a str,
    /// The occurrence it ran for, in Unix seconds.
    pub scheduled_at: i64,
    /// What started it (`schedule`, `manual`, ...).
    pub trigger: &'a str,
    /// How it ended.
    pub status: &'a str,
    /// The session the run used.
    pub session_id: &'a str,
}

/// How much of a text hooks get, in characters.
pub const CLIP: usize = 500;

/// The first [`CLIP`] characters of `text`: what hooks (and quoted replies
/// in prompts) get.
pub fn clip(text: &str) -> String {
    text.chars().take(CLIP).collect()
}

/// A session key as hooks see it: hashed like every other platform id,
/// since the key itself carries the chat (and maybe user) id. Stable, so a
/// hook can still tell conversations apart and follow one.
pub fn hook_key(key: &str) -> String {
    talaria_core::ids::hash_id("key", key)
}

fn hashed_key<S: Serializer>(key: &&str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&hook_key(key))
}

fn hashed_user<S: Serializer>(user: &Option<&str>, s: S) -> Result<S::Ok, S::Error> {
    match user {
        Some(u) => s.serialize_some(&talaria_core::ids::hash_id("user", u)),
        None => s.serialize_none(),
    }
}

fn hashed_chat<S: Serializer>(chat: &&str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&talaria_core::ids::hash_id("chat", chat))
}

fn clipped<S: Serializer>(text: &&str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&clip(text))
}
