//! What a platform can do, declared once by its adapter.
//!
//! The gateway decides by asking these, never by comparing platform names:
//! how to cut an answer, whether a sender id is an e-mail address (compared
//! without case, never offered a pairing code), whether a chat allowlist
//! applies, whether a source is a chat a scheduled job could answer in.

/// How a platform measures message length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LengthUnit {
    /// Unicode scalar values.
    Chars,
    /// UTF-16 code units (Telegram).
    Utf16,
}

impl LengthUnit {
    /// The length of `text` in this unit.
    pub fn measure(self, text: &str) -> usize {
        match self {
            LengthUnit::Chars => text.chars().count(),
            LengthUnit::Utf16 => text.encode_utf16().count(),
        }
    }

    /// The length of one character in this unit.
    pub fn char_len(self, c: char) -> usize {
        match self {
            LengthUnit::Chars => 1,
            LengthUnit::Utf16 => c.len_utf16(),
        }
    }
}

/// The largest message a platform accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageLimits {
    /// The most a message may measure, in `unit`s; longer answers are
    /// split to fit.
    pub max_len: usize,
    /// How the platform counts a message's length.
    pub unit: LengthUnit,
}

/// A platform's abilities and the shape of its ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// The largest message it accepts, and how it counts.
    pub limits: MessageLimits,
    /// Replies can go into a thread (or forum topic) of a chat.
    pub threads: bool,
    /// A sent message can be edited later (streaming previews need this).
    pub edits: bool,
    /// The formatting its messages are rendered in.
    pub markup: Markup,
    /// Media kinds it hands the gateway as attachments.
    pub receives: &'static [MediaKind],
    /// Media kinds it can send.
    pub sends: &'static [MediaKind],
    /// What a sender's id is.
    pub sender_ids: SenderIds,
    /// People converse with the bot here and an answer can be sent back
    /// to the chat later (a scheduled job's origin). `false` for sources
    /// that only hand in work: a signed webhook, a voice assistant's
    /// request that waits for its answer.
    pub chat: bool,
    /// The adapter authenticates every event itself (a webhook checks each
    /// delivery's signature), so user allowlists and pairing do not apply.
    /// Chat platforms leave this `false`.
    pub verifies_senders: bool,
    /// `<P>_GROUP_ALLOWED_CHATS` is honoured: group chats the operator
    /// vouched for as a whole, anonymous posts included.
    pub group_chat_allowlist: bool,
}

impl Capabilities {
    /// Whether a stranger writing here directly can be offered a pairing
    /// code: a chat whose senders the adapter does not vouch for itself,
    /// known by an id an operator approves (an e-mail address is matched
    /// against the allowlist instead, since anyone can claim one).
    pub const fn offers_pairing(&self) -> bool {
        self.chat
            && !self.verifies_senders
            && !matches!(self.sender_ids, SenderIds::Email | SenderIds::Nick)
    }

    /// A plain-text chat with opaque sender ids and no threads, edits or
    /// media: the baseline an adapter adjusts with struct update syntax.
    pub const fn chat(limits: MessageLimits) -> Capabilities {
        Capabilities {
            limits,
            threads: false,
            edits: false,
            markup: Markup::Plain,
            receives: &[],
            sends: &[],
            sender_ids: SenderIds::Opaque,
            chat: true,
            verifies_senders: false,
            group_chat_allowlist: false,
        }
    }
}

/// The formatting dialect a platform renders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Markup {
    /// No formatting: markdown is shown as typed.
    Plain,
    /// CommonMark-style markdown (Discord, Mattermost).
    Markdown,
    /// Slack's mrkdwn.
    Mrkdwn,
    /// A subset of HTML (Telegram's, Matrix's `formatted_body`).
    Html,
}

/// What a sender's platform id is, which decides how ids are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SenderIds {
    /// An opaque id, compared exactly.
    Opaque,
    /// A phone number in E.164 form.
    Phone,
    /// An e-mail address: compared without case, and never offered a
    /// pairing code, since anyone can write from any address.
    Email,
    /// A nickname (IRC): compared without case, as the network does, and
    /// never offered a pairing code, since anyone may take a nick its
    /// owner is not using.
    Nick,
}

impl SenderIds {
    /// Whether ids of this kind are compared without (ASCII) case.
    pub const fn caseless(self) -> bool {
        matches!(self, SenderIds::Email | SenderIds::Nick)
    }
}

/// A kind of media a platform can carry (core's, so the media cache and
/// the agent below the adapters name it too).
pub use talaria_core::MediaKind;
