//! The transcript vocabulary shared by the store, the providers and the agent.
//!
//! The transcript is provider-neutral and shaped like OpenAI Chat Completions,
//! because that is the lingua franca of model servers; each provider adapter
//! converts it at its edge.

use serde::{Deserialize, Serialize};

/// Who authored a transcript row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The system prompt, first in every request.
    System,
    /// The person talking to the agent.
    User,
    /// The model: text, tool calls or both.
    Assistant,
    /// A tool's result, answering one tool call by its id.
    Tool,
}

impl Role {
    /// The wire and storage spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// Parses the storage spelling; `None` for anything else.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "system" => Some(Role::System),
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            "tool" => Some(Role::Tool),
            _ => None,
        }
    }
}

/// One function call requested by the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider-assigned id; tool results refer back to it.
    pub id: String,
    /// The tool name exactly as the model wrote it (it may not exist).
    pub name: String,
    /// The raw JSON argument text. Kept as text, not parsed, because models
    /// produce invalid JSON and the transcript must replay what was sent.
    pub arguments: String,
}

/// One transcript row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote the row, which decides how providers send it.
    pub role: Role,
    /// Visible text. Empty for a pure tool-call assistant row.
    #[serde(default)]
    pub content: String,
    /// Calls requested by an assistant row, in the order the model listed them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a tool row: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// For a tool row: the tool that produced it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// Model reasoning text, kept for the record but never shown as the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// Why generation stopped (`stop`, `tool_calls`, `length`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    /// Files that came with a user row (photos a vision model sees), by
    /// reference into the media cache: never their bytes, so a transcript
    /// stays small however many photos a chat holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub media: Vec<MediaRef>,
    /// For an assistant row: the reasoning blocks its provider signed
    /// (Anthropic's extended thinking), in the order they came. The API
    /// refuses a tool-use loop whose earlier assistant turn comes back
    /// without them or altered, so they are kept apart from `reasoning`
    /// (which is for reading) and replayed exactly as received.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thinking: Vec<ThinkingBlock>,
}

/// A reasoning block as the provider returned it, to be sent back
/// unchanged. Serialized in Anthropic's own shape (`{"type": "thinking",
/// "thinking", "signature"}`, `{"type": "redacted_thinking", "data"}`), so
/// the stored form is the wire form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ThinkingBlock {
    /// Reasoning the model wrote, with the signature that vouches for it.
    Thinking {
        /// The reasoning text, byte for byte.
        thinking: String,
        /// The provider's opaque signature over the text.
        signature: String,
    },
    /// Reasoning the provider withheld, as the encrypted blob it sent.
    RedactedThinking {
        /// The opaque payload.
        data: String,
    },
}

impl Message {
    fn new(role: Role, content: impl Into<String>) -> Message {
        Message {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            tool_name: None,
            reasoning: None,
            finish_reason: None,
            media: Vec::new(),
            thinking: Vec::new(),
        }
    }

    /// A system row with `content`.
    pub fn system(content: impl Into<String>) -> Message {
        Message::new(Role::System, content)
    }

    /// A user row with `content`.
    pub fn user(content: impl Into<String>) -> Message {
        Message::new(Role::User, content)
    }

    /// An assistant row with `content` and no tool calls.
    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new(Role::Assistant, content)
    }

    /// An assistant row that requests tool calls.
    pub fn assistant_tool_calls(content: impl Into<String>, calls: Vec<ToolCall>) -> Message {
        Message {
            tool_calls: calls,
            ..Message::new(Role::Assistant, content)
        }
    }

    /// The result of one tool call.
    pub fn tool_result(
        call_id: impl Into<String>,
        tool_name: impl Into<String>,
        content: impl Into<String>,
    ) -> Message {
        Message {
            tool_call_id: Some(call_id.into()),
            tool_name: Some(tool_name.into()),
            ..Message::new(Role::Tool, content)
        }
    }

    /// A user row with `content` and the files that came with it.
    pub fn user_with_media(content: impl Into<String>, media: Vec<MediaRef>) -> Message {
        Message {
            media,
            ..Message::new(Role::User, content)
        }
    }

    /// Whether this row asks for tools to run.
    pub fn has_tool_calls(&self) -> bool {
        !self.tool_calls.is_empty()
    }
}

/// Token accounting reported by a provider for one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the prompt that were processed afresh.
    pub input_tokens: u64,
    /// Tokens the model generated.
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's cache.
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's cache.
    pub cache_write_tokens: u64,
    /// Generated tokens spent on reasoning (counted in `output_tokens` by
    /// providers that report both).
    pub reasoning_tokens: u64,
}

impl Usage {
    /// Adds another request's usage to this running total.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
    }
}

/// A kind of media: what a platform carries, what the media cache
/// records, what a message's attachment is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MediaKind {
    /// A picture (photo, sticker rendered as one).
    Image,
    /// A voice note recorded in the app.
    Voice,
    /// An audio file.
    Audio,
    /// A video or animation.
    Video,
    /// Any other file, sent as an attachment.
    Document,
}

impl MediaKind {
    /// The lowercase name used in config, logs and the transcript.
    pub fn as_str(self) -> &'static str {
        match self {
            MediaKind::Image => "image",
            MediaKind::Voice => "voice",
            MediaKind::Audio => "audio",
            MediaKind::Video => "video",
            MediaKind::Document => "document",
        }
    }
}

/// A file in the media cache, as a transcript row refers to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MediaRef {
    /// What the file is, from its bytes.
    pub kind: MediaKind,
    /// The cached file's absolute path. It may be gone later (the cache
    /// forgets old files); readers then say so instead of failing.
    pub path: std::path::PathBuf,
    /// Its type, sniffed from the bytes (`image/jpeg`).
    pub mime: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_round_trips_through_its_spelling() {
        for role in [Role::System, Role::User, Role::Assistant, Role::Tool] {
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
        assert_eq!(Role::parse("developer"), None);
    }

    #[test]
    fn tool_result_carries_its_call() {
        let m = Message::tool_result("call_1", "terminal", "ok");
        assert_eq!(m.role, Role::Tool);
        assert_eq!(m.tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(m.tool_name.as_deref(), Some("terminal"));
    }
}
