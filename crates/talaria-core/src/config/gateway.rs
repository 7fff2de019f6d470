//! The gateway: busy input, routing, shutdown, session resets.

use super::*;

/// What happens to a message that arrives while the agent is still working
/// on the same chat (`gateway.busy_input_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BusyInputMode {
    /// Cancel the running turn and answer the new message next.
    #[default]
    Interrupt,
    /// Let the turn finish; merge what arrived into the next turn.
    Queue,
    /// Hand the text to the running turn after its next tool call.
    Steer,
}

/// `gateway:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GatewayConfig {
    /// What a message arriving during a running turn does: interrupt it,
    /// wait in the queue, or steer it.
    pub busy_input_mode: BusyInputMode,
    /// In groups, each member gets a conversation of their own.
    pub group_sessions_per_user: bool,
    /// Inside threads and forum topics, each member gets their own too
    /// (by default a thread is one shared conversation).
    pub thread_sessions_per_user: bool,
    /// Seconds a stopping gateway lets running turns finish before it
    /// interrupts them.
    pub drain_timeout_secs: u64,
    /// Tell the user when their message interrupted or was queued behind a
    /// running turn (at most once per 30 s per chat).
    pub busy_ack: bool,
    /// Record every final reply before sending it, so a crash cannot lose it.
    pub delivery_ledger: bool,
    /// Seconds between typing indicators while the agent works.
    pub typing_interval_secs: u64,
    /// Where a platform shows the answer growing (streaming edits), the
    /// least time between two edits of that message, in milliseconds.
    /// Platforms rate-limit edits; about one a second stays clear of it.
    pub stream_edit_interval_ms: u64,
    /// Each platform's home channel, `<chat_id>` or `<chat_id>:<thread_id>`,
    /// where a bare `<platform>` delivery target goes. The environment's
    /// `<PLATFORM>_HOME_CHANNEL` (which `/sethome` writes) wins.
    pub home_channels: std::collections::BTreeMap<String, String>,
    /// Each platform's owners, by user id (`*`: everyone the platform lets
    /// in): their DMs run commands in `terminal.backend`, everyone else's
    /// in `terminal.untrusted_backend`. A platform missing here takes the
    /// ids written out on its `<PLATFORM>_ALLOWED_USERS`.
    pub owners: std::collections::BTreeMap<String, Vec<String>>,
    /// When background work that asked to be followed up ends (a command
    /// started with `notify_on_complete`, a detached delegation), the
    /// agent gets a turn on its result after the notice, so it can act on
    /// it. Off: the notice alone.
    pub background_follow_up: bool,
}

impl Default for GatewayConfig {
    fn default() -> GatewayConfig {
        GatewayConfig {
            busy_input_mode: BusyInputMode::Interrupt,
            group_sessions_per_user: true,
            thread_sessions_per_user: false,
            drain_timeout_secs: 30,
            busy_ack: true,
            delivery_ledger: true,
            typing_interval_secs: 4,
            stream_edit_interval_ms: 1000,
            home_channels: Default::default(),
            owners: Default::default(),
            background_follow_up: false,
        }
    }
}

/// When a conversation resets by itself (`session_reset.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResetMode {
    /// Never: only `/new` starts afresh.
    #[default]
    None,
    /// After `idle_minutes` without a message.
    Idle,
    /// Once a day at `at_hour` (local time).
    Daily,
    /// Whichever of the two comes first.
    Both,
}

/// `session_reset:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionResetConfig {
    /// When a chat's conversation starts afresh: never, after being idle,
    /// daily, or both.
    pub mode: ResetMode,
    /// Minutes without a message after which the next one starts afresh.
    pub idle_minutes: u64,
    /// Hour of the day (0-23, local time) of the daily reset.
    pub at_hour: u32,
}

impl Default for SessionResetConfig {
    fn default() -> SessionResetConfig {
        SessionResetConfig {
            mode: ResetMode::None,
            idle_minutes: 1440,
            at_hour: 4,
        }
    }
}
