//! `send_message`: the agent sends a message to a chat other than the one
//! it is answering (a home channel, another platform), or lists where it
//! can send.
//!
//! The agent knows nothing about platforms: delivery is behind the
//! [`Messenger`] seam, which the gateway (or the CLI, talking to a running
//! gateway) implements. The tool is only registered where a messenger
//! exists.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;

use super::{Tool, ToolContext, ToolError, ToolResult, opt_str};

/// Longest message the tool accepts, in characters. Platforms split long
/// messages; this only keeps a runaway model from flooding a chat.
const MAX_MESSAGE_CHARS: usize = 20_000;

/// Where the agent can send, as the messenger sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetInfo {
    /// A target string the model can pass back (`telegram`, `telegram:123`).
    pub target: String,
    /// What it is, for the model.
    pub description: String,
}

/// Delivers messages for the tool.
#[async_trait]
pub trait Messenger: Send + Sync {
    /// Sends `message` to `target` (the delivery-target grammar: `origin`,
    /// `local`, `<platform>`, `<platform>:<chat_id>[:<thread_id>]`).
    /// `session_id` is the calling session, which `origin` refers to.
    /// Returns a short description of where it went, or why it could not.
    async fn send(&self, target: &str, message: &str, session_id: &str) -> Result<String, String>;

    /// The targets worth offering: connected platforms and their home
    /// channels.
    async fn targets(&self) -> Result<Vec<TargetInfo>, String>;
}

/// The most files one call sends.
const MAX_FILES: usize = 10;

/// The `media` argument: paths, one per line of the message sent.
fn media_paths(args: &serde_json::Value) -> Result<Vec<String>, ToolError> {
    let Some(list) = args.get("media").filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let list = list
        .as_array()
        .ok_or_else(|| ToolError::new("`media` must be a list of file paths"))?;
    if list.len() > MAX_FILES {
        return Err(ToolError::new(format!(
            "at most {MAX_FILES} files per message"
        )));
    }
    list.iter()
        .map(|v| {
            v.as_str()
                .map(str::trim)
                .filter(|p| !p.is_empty() && !p.contains('\n'))
                .map(str::to_owned)
                .ok_or_else(|| ToolError::new("each `media` entry must be a file path"))
        })
        .collect()
}

/// The `send_message` tool.
pub struct SendMessageTool {
    messenger: Arc<dyn Messenger>,
}

impl SendMessageTool {
    /// The tool, sending through `messenger` (the gateway's delivery).
    pub fn new(messenger: Arc<dyn Messenger>) -> SendMessageTool {
        SendMessageTool { messenger }
    }
}

#[async_trait]
impl Tool for SendMessageTool {
    fn name(&self) -> &str {
        "send_message"
    }

    fn description(&self) -> &str {
        "Send a message to a chat other than this conversation (a platform's home channel or a given chat), or list the targets. Your normal answer already reaches the user: use this only to notify elsewhere."
    }

    fn parameters(&self) -> serde_json::Value {
        json!({
            "type": "object",
            "properties": {
                "action": {
                    "type": "string",
                    "enum": ["send", "list"],
                    "description": "send (default) or list the available targets"
                },
                "target": {
                    "type": "string",
                    "description": "origin, local, <platform> (its home channel), <platform>:<chat_id> or <platform>:<chat_id>:<thread_id>"
                },
                "message": {"type": "string", "description": "the text to send"},
                "media": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "paths of files to send with the message (photos, voice notes, documents), from the workspace or the media cache"
                }
            },
            "required": []
        })
    }

    async fn call(&self, args: serde_json::Value, ctx: &ToolContext) -> ToolResult {
        match opt_str(&args, "action")?.unwrap_or("send") {
            "list" => {
                let targets = self.messenger.targets().await.map_err(ToolError::new)?;
                let list: Vec<serde_json::Value> = targets
                    .into_iter()
                    .map(|t| json!({"target": t.target, "description": t.description}))
                    .collect();
                Ok(json!({"targets": list}).to_string())
            }
            "send" => {
                let target = opt_str(&args, "target")?
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| {
                        ToolError::new("`target` is required to send (action=list shows them)")
                    })?;
                let files = media_paths(&args)?;
                let message = opt_str(&args, "message")?.unwrap_or("");
                if message.trim().is_empty() && files.is_empty() {
                    return Err(ToolError::new(
                        "`message` (or `media`) is required and must not be empty",
                    ));
                }
                if message.chars().count() > MAX_MESSAGE_CHARS {
                    return Err(ToolError::new(format!(
                        "the message is longer than {MAX_MESSAGE_CHARS} characters; send less"
                    )));
                }
                // Files travel as `MEDIA:` lines, which delivery checks
                // against the folders files may be sent from.
                let mut text = message.trim().to_owned();
                for path in &files {
                    text.push_str(&format!("\nMEDIA:{path}"));
                }
                let detail = self
                    .messenger
                    .send(target, text.trim(), &ctx.session_id)
                    .await
                    .map_err(ToolError::new)?;
                Ok(json!({"success": true, "target": target, "detail": detail}).to_string())
            }
            other => Err(ToolError::new(format!(
                "unknown action `{other}`: use send or list"
            ))),
        }
    }
}
