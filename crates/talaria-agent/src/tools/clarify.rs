//! The `clarify` tool: ask the human a question and wait for the answer.

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolResult, opt_array, req_str};
use crate::interaction::ClarifyRequest;

/// Most choices a question may offer (the human can always answer freely).
pub const MAX_CHOICES: usize = 4;
const MAX_QUESTION_CHARS: usize = 4000;
const MAX_CHOICE_CHARS: usize = 500;

/// The `clarify` tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClarifyTool;

#[async_trait]
impl Tool for ClarifyTool {
    fn name(&self) -> &str {
        "clarify"
    }

    fn description(&self) -> &str {
        "Ask the user a question when you cannot proceed well without their input: an open \
         question, or up to 4 choices (they may still answer freely). Do not use it for \
         things you can find out yourself."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "question": {"type": "string", "description": "The question to ask."},
                "choices": {
                    "type": "array",
                    "items": {"type": "string"},
                    "maxItems": MAX_CHOICES,
                    "description": "Optional answer options, at most 4."
                }
            },
            "required": ["question"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolResult {
        let question = req_str(&args, "question")?.trim();
        if question.is_empty() {
            return Err(ToolError::new("argument `question` is empty"));
        }
        if question.chars().count() > MAX_QUESTION_CHARS {
            return Err(ToolError::new(format!(
                "argument `question` is longer than {MAX_QUESTION_CHARS} characters; ask \
                 something shorter"
            )));
        }
        let mut choices = Vec::new();
        for (i, c) in opt_array(&args, "choices")?
            .into_iter()
            .flatten()
            .enumerate()
        {
            let Some(text) = c.as_str() else {
                return Err(ToolError::new(format!(
                    "argument `choices[{i}]` must be a string, got {}",
                    super::json_type(c)
                )));
            };
            let text = text.trim();
            if !text.is_empty() {
                choices.push(super::truncate_chars(text, MAX_CHOICE_CHARS));
            }
        }
        if choices.len() > MAX_CHOICES {
            return Err(ToolError::new(format!(
                "argument `choices` has {} entries; at most {MAX_CHOICES}",
                choices.len()
            )));
        }
        let request = ClarifyRequest {
            question: question.to_owned(),
            choices: choices.clone(),
        };
        let answer = tokio::select! {
            a = ctx.interaction.clarify(&request) => a,
            _ = ctx.cancel.cancelled() => None,
        };
        let out = match answer {
            Some(a) => json!({
                "question": question,
                "choices_offered": choices,
                "user_response": a,
            }),
            None => json!({
                "question": question,
                "choices_offered": choices,
                "user_response": null,
                "note": "No human is available to answer right now. Continue with your best \
                         judgement, state the assumption you made, and do not ask again this turn.",
            }),
        };
        Ok(out.to_string())
    }
}
