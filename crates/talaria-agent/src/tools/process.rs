//! The `process` tool: the model's handle on the commands it started with
//! `terminal(background=true)` in this session (see
//! [`crate::processes`]): list them, read their output, wait for one, kill
//! one, answer one on its stdin.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolResult, opt_str, opt_u64, req_str};
use crate::processes::ProcessRegistry;

/// How long `wait` blocks without a `timeout`.
const DEFAULT_WAIT_SECS: u64 = 180;

/// The `process` tool.
#[derive(Debug, Clone)]
pub struct ProcessTool {
    processes: ProcessRegistry,
}

impl ProcessTool {
    /// The tool over `processes` (the registry `terminal` starts them in).
    pub fn new(processes: ProcessRegistry) -> ProcessTool {
        ProcessTool { processes }
    }
}

/// The process id argument, required for every action but `list`.
fn id_of<'a>(args: &'a Value, action: &str) -> Result<&'a str, ToolError> {
    match opt_str(args, "session_id")?.map(str::trim) {
        Some(id) if !id.is_empty() => Ok(id),
        _ => Err(ToolError::new(format!(
            "action `{action}` needs `session_id`: the process id (proc_…) that \
             terminal(background=true) returned; process(action=\"list\") shows them"
        ))),
    }
}

/// An optional count argument as a `usize`.
fn opt_count(args: &Value, name: &str) -> Result<Option<usize>, ToolError> {
    Ok(opt_u64(args, name)?.map(|n| usize::try_from(n).unwrap_or(usize::MAX)))
}

#[async_trait]
impl Tool for ProcessTool {
    fn name(&self) -> &str {
        "process"
    }

    fn description(&self) -> &str {
        "Manage the background processes this session started with \
         terminal(background=true). Actions: 'list' (all of them), 'poll' (status and the \
         output since the last poll), 'log' (output lines with offset/limit; the last 200 by \
         default), 'wait' (block until it ends or `timeout` seconds pass), 'kill' (it and \
         everything it started), 'write' (raw text to its stdin), 'submit' (text and Enter, \
         to answer a prompt), 'close' (end its stdin). session_id is required for all but \
         'list'."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "action": {
                    "type": "string",
                    "enum": ["list", "poll", "log", "wait", "kill", "write", "submit", "close"],
                    "description": "What to do."
                },
                "session_id": {"type": "string", "description": "The process id (proc_…) from terminal(background=true). Required for all actions but 'list'."},
                "data": {"type": "string", "description": "Text for 'write' and 'submit'."},
                "timeout": {"type": "integer", "minimum": 1, "description": "Seconds 'wait' may block (capped by terminal.max_timeout_secs); it returns the output so far if the process is still running."},
                "offset": {"type": "integer", "description": "First line for 'log' (0-based; default: the last lines)."},
                "limit": {"type": "integer", "minimum": 1, "description": "Lines for 'log' (default 200)."}
            },
            "required": ["action"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolResult {
        let action = req_str(&args, "action")?.trim();
        let session = ctx.session_id.as_str();
        let max_chars = ctx.config.terminal.max_output_chars.max(100);
        let p = &self.processes;
        let out = match action {
            "list" => p.list(session),
            "poll" => p.poll(session, id_of(&args, action)?, max_chars)?,
            "log" => {
                let id = id_of(&args, action)?;
                let offset = opt_count(&args, "offset")?;
                let limit = opt_count(&args, "limit")?;
                if limit == Some(0) {
                    return Err(ToolError::new("argument `limit` must be at least 1"));
                }
                p.log(session, id, offset, limit, max_chars).await?
            }
            "wait" => {
                let id = id_of(&args, action)?;
                let cap = ctx.config.terminal.max_timeout_secs.max(1);
                let secs = opt_u64(&args, "timeout")?
                    .unwrap_or(DEFAULT_WAIT_SECS)
                    .clamp(1, cap);
                p.wait(
                    session,
                    id,
                    Duration::from_secs(secs),
                    &ctx.cancel,
                    max_chars,
                )
                .await?
            }
            "kill" => p.kill(session, id_of(&args, action)?).await?,
            "write" | "submit" => {
                let id = id_of(&args, action)?;
                let data = match opt_str(&args, "data")? {
                    Some(d) => d,
                    None if action == "submit" => "",
                    None => {
                        return Err(ToolError::new(
                            "action `write` needs `data`: the text to send to the process's stdin",
                        ));
                    }
                };
                p.write(session, id, data, action == "submit").await?
            }
            "close" => p.close(session, id_of(&args, action)?).await?,
            other => {
                return Err(ToolError::new(format!(
                    "argument `action`: unknown action {other:?}; use one of list, poll, log, \
                     wait, kill, write, submit, close"
                )));
            }
        };
        Ok(out.to_string())
    }
}
