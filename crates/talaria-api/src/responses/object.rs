//! The `response` object and its output items, shaped as OpenAI's
//! specification and the SDKs' `Response` model have them.
//!
//! The output holds the answer as one `message` item first, then each
//! tool call the agent made as a `function_call` item followed by its
//! `function_call_output`: item types the SDKs know. The answer comes first
//! so that a stream can open it before the turn has run any tool and still
//! number every item as the finished response does.

use serde_json::{Map, Value, json};
use talaria_agent::{TurnExit, TurnOutcome};
use talaria_core::{Role, Usage};

/// Longest tool call arguments or tool output kept in an item, in bytes:
/// a response is stored, and one tool can print megabytes.
pub(crate) const MAX_TOOL_TEXT_BYTES: usize = 4 * 1024;

/// Most tool items (calls and outputs) a response holds; later ones are
/// left out.
pub(crate) const MAX_TOOL_ITEMS: usize = 64;

/// What a response echoes of its request, fixed when it is admitted.
#[derive(Debug, Clone)]
pub(crate) struct Echo {
    /// `resp_<32 hex>`.
    pub(crate) id: String,
    pub(crate) created_at: u64,
    pub(crate) model: String,
    pub(crate) instructions: Option<String>,
    pub(crate) previous_response_id: Option<String>,
    pub(crate) store: bool,
    pub(crate) metadata: Map<String, Value>,
}

impl Echo {
    /// The random part of the id, which the output items' ids share.
    fn suffix(&self) -> &str {
        self.id.strip_prefix("resp_").unwrap_or(&self.id)
    }

    /// The id of the answer's `message` item.
    pub(crate) fn message_id(&self) -> String {
        format!("msg_{}", self.suffix())
    }

    /// The response object in `status`, with `output`, `usage` and
    /// `error` as given.
    pub(crate) fn response(
        &self,
        status: &str,
        output: Vec<Value>,
        usage: Option<Value>,
        error: Option<Value>,
    ) -> Value {
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": false,
            "error": error,
            "incomplete_details": null,
            "instructions": self.instructions,
            "max_output_tokens": null,
            "max_tool_calls": null,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": true,
            "previous_response_id": self.previous_response_id,
            "reasoning": {"effort": null, "summary": null},
            "service_tier": "default",
            "store": self.store,
            "temperature": null,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": null,
            "truncation": "disabled",
            "usage": usage,
            "user": null,
            "metadata": self.metadata,
        })
    }

    /// The response object before the turn has produced anything.
    pub(crate) fn in_progress(&self) -> Value {
        self.response("in_progress", Vec::new(), None, None)
    }

    /// The finished response of a turn that ended with an answer.
    pub(crate) fn finished(&self, outcome: &TurnOutcome) -> Value {
        let status = match outcome.exit {
            TurnExit::Interrupted => "incomplete",
            _ => "completed",
        };
        self.response(
            status,
            self.output(outcome),
            Some(usage_json(&outcome.usage)),
            None,
        )
    }

    /// The response of a turn that failed, with OpenAI's error object.
    pub(crate) fn failed(&self, message: &str) -> Value {
        self.response(
            "failed",
            Vec::new(),
            None,
            Some(json!({"code": "server_error", "message": message})),
        )
    }

    /// The answer's `message` item in `status` holding `text`.
    pub(crate) fn message_item(&self, status: &str, text: Option<&str>) -> Value {
        let content: Vec<Value> = text.map(output_text).into_iter().collect();
        json!({
            "id": self.message_id(),
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        })
    }

    /// Every output item of a finished turn: the answer, then the tool
    /// calls and their outputs.
    pub(crate) fn output(&self, outcome: &TurnOutcome) -> Vec<Value> {
        let mut output = vec![self.message_item("completed", Some(&outcome.answer))];
        output.extend(self.tool_items(outcome));
        output
    }

    /// The turn's tool calls as `function_call` items, each followed by
    /// its `function_call_output`, at most [`MAX_TOOL_ITEMS`]. Internal
    /// tools (a leading `_`) are left out, as from the chat stream.
    fn tool_items(&self, outcome: &TurnOutcome) -> Vec<Value> {
        let suffix = self.suffix();
        let mut items = Vec::new();
        let mut hidden = std::collections::HashSet::new();
        for (n, message) in outcome.new_messages.iter().enumerate() {
            if items.len() >= MAX_TOOL_ITEMS {
                break;
            }
            match message.role {
                Role::Assistant => {
                    for (k, call) in message.tool_calls.iter().enumerate() {
                        if call.name.starts_with('_') {
                            hidden.insert(call.id.as_str());
                            continue;
                        }
                        items.push(json!({
                            "id": format!("fc_{suffix}_{n}_{k}"),
                            "type": "function_call",
                            "status": "completed",
                            "call_id": call.id,
                            "name": call.name,
                            "arguments": bounded(&call.arguments),
                        }));
                    }
                }
                Role::Tool => {
                    let call_id = message.tool_call_id.as_deref().unwrap_or_default();
                    if hidden.contains(call_id)
                        || message
                            .tool_name
                            .as_deref()
                            .is_some_and(|t| t.starts_with('_'))
                    {
                        continue;
                    }
                    items.push(json!({
                        "id": format!("fco_{suffix}_{n}"),
                        "type": "function_call_output",
                        "status": "completed",
                        "call_id": call_id,
                        "output": bounded(&message.content),
                    }));
                }
                _ => {}
            }
        }
        items.truncate(MAX_TOOL_ITEMS);
        items
    }
}

/// An `output_text` content part.
pub(crate) fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// `text` cut to [`MAX_TOOL_TEXT_BYTES`] on a character boundary, saying
/// so when cut.
fn bounded(text: &str) -> String {
    if text.len() <= MAX_TOOL_TEXT_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_TOOL_TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [cut: {} bytes in all]", &text[..end], text.len())
}

/// The Responses API's `usage` from the turn's summed usage. OpenAI counts
/// cached prompt tokens within `input_tokens`; the agent counts them apart.
pub(crate) fn usage_json(usage: &Usage) -> Value {
    let input = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens;
    json!({
        "input_tokens": input,
        "input_tokens_details": {
            "cached_tokens": usage.cache_read_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
        },
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": input + usage.output_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use talaria_core::{Message, ToolCall};

    fn echo() -> Echo {
        Echo {
            id: "resp_00ff".into(),
            created_at: 7,
            model: "m".into(),
            instructions: Some("be brief".into()),
            previous_response_id: None,
            store: true,
            metadata: Map::new(),
        }
    }

    fn outcome(new_messages: Vec<Message>) -> TurnOutcome {
        TurnOutcome {
            answer: "done".into(),
            exit: TurnExit::Completed,
            new_messages,
            api_calls: 1,
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                cache_read_tokens: 3,
                ..Usage::default()
            },
            compressed: false,
            owed: false,
        }
    }

    #[test]
    fn a_finished_turn_is_a_completed_response_with_its_answer_and_usage() {
        let r = echo().finished(&outcome(vec![
            Message::user("q"),
            Message::assistant("done"),
        ]));
        assert_eq!(r["object"], "response");
        assert_eq!(r["status"], "completed");
        assert_eq!(r["output"].as_array().map(Vec::len), Some(1));
        assert_eq!(r["output"][0]["id"], "msg_00ff");
        assert_eq!(r["output"][0]["content"][0]["text"], "done");
        assert_eq!(r["output"][0]["content"][0]["annotations"], json!([]));
        assert_eq!(r["usage"]["input_tokens"], 13);
        assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 3);
        assert_eq!(r["usage"]["total_tokens"], 18);
        assert_eq!(r["instructions"], "be brief");
    }

    #[test]
    fn tool_calls_follow_the_answer_and_internal_ones_are_hidden() {
        let call = Message::assistant_tool_calls(
            "",
            vec![
                ToolCall {
                    id: "c1".into(),
                    name: "terminal".into(),
                    arguments: "{}".into(),
                },
                ToolCall {
                    id: "c2".into(),
                    name: "_internal".into(),
                    arguments: "{}".into(),
                },
            ],
        );
        let out1 = Message::tool_result("c1", "terminal", "x".repeat(MAX_TOOL_TEXT_BYTES + 10));
        let out2 = Message::tool_result("c2", "_internal", "secret");
        let r = echo().finished(&outcome(vec![
            Message::user("q"),
            call,
            out1,
            out2,
            Message::assistant("done"),
        ]));
        let kinds: Vec<&str> = r["output"]
            .as_array()
            .map(|o| o.iter().filter_map(|i| i["type"].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(kinds, ["message", "function_call", "function_call_output"]);
        assert_eq!(r["output"][1]["call_id"], "c1");
        assert_eq!(r["output"][2]["call_id"], "c1");
        let output = r["output"][2]["output"].as_str().unwrap_or_default();
        assert!(output.len() < MAX_TOOL_TEXT_BYTES + 100, "{}", output.len());
        assert!(output.ends_with("bytes in all]"));
    }
}
