//! Parsing a `POST /v1/responses` body.

use serde_json::{Map, Value};

use crate::chat::{Conversation, RawMessages, bool_field, conversation_of, model_name};
use crate::error::ApiError;

/// Most `metadata` pairs a response keeps (OpenAI's limit).
pub(crate) const MAX_METADATA_PAIRS: usize = 16;
/// Longest `metadata` key, in characters (OpenAI's limit).
pub(crate) const MAX_METADATA_KEY: usize = 64;
/// Longest `metadata` value, in characters (OpenAI's limit).
pub(crate) const MAX_METADATA_VALUE: usize = 512;
/// Longest `instructions` kept with a response, in bytes: they are echoed
/// and stored, so they are bounded like everything else a response keeps.
pub(crate) const MAX_INSTRUCTIONS_BYTES: usize = 64 * 1024;

/// A request after parsing.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ResponsesInput {
    /// The model name asked for; a route's name picks its model, any other
    /// is echoed back.
    pub(crate) model: Option<String>,
    pub(crate) stream: bool,
    /// Whether the response is kept for retrieval and continuation.
    pub(crate) store: bool,
    /// `instructions` as sent, echoed in the response.
    pub(crate) instructions: Option<String>,
    /// The response whose conversation this one continues.
    pub(crate) previous_response_id: Option<String>,
    /// `metadata` as sent (string values only), echoed and stored.
    pub(crate) metadata: Map<String, Value>,
    /// The new input and the messages that came before it in `input`.
    pub(crate) conversation: Conversation,
}

/// Parses the body. Fields this server has no use for (`tools`,
/// `temperature`, `reasoning`, ...) are accepted and ignored.
///
/// # Errors
/// 400 in OpenAI's shape for invalid JSON, a missing or malformed `input`,
/// no user text in it, and fields of the wrong type.
pub(crate) fn parse_request(body: &[u8]) -> Result<ResponsesInput, ApiError> {
    let object = crate::chat::body_object(body)?;
    // The ancestor's named chains are not kept here: a client relying on
    // one must hear so, not silently start over.
    if object.get("conversation").is_some_and(|c| !c.is_null()) {
        return Err(ApiError::bad_request(
            "'conversation' is not supported; continue a conversation with \
             'previous_response_id'",
            "unsupported_parameter",
        ));
    }
    let conversation = match object.get("input") {
        Some(Value::String(text)) if !text.trim().is_empty() => Conversation {
            system: String::new(),
            last_user: text.clone(),
            files: Vec::new(),
            earlier: Vec::new(),
        },
        Some(Value::Array(items)) if !items.is_empty() => {
            conversation_of("input", &messages_of(items)?)?
        }
        _ => {
            return Err(ApiError::bad_request(
                "'input' must be a non-empty string or a non-empty array of input items",
                "missing_input",
            ));
        }
    };
    let instructions = match object.get("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.len() <= MAX_INSTRUCTIONS_BYTES => Some(s.clone()),
        Some(Value::String(_)) => {
            return Err(ApiError::bad_request(
                format!("'instructions' is longer than {MAX_INSTRUCTIONS_BYTES} bytes"),
                "invalid_instructions",
            ));
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "'instructions' must be a string",
                "invalid_instructions",
            ));
        }
    };
    let previous_response_id = match object.get("previous_response_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) if !id.is_empty() => Some(id.clone()),
        Some(_) => {
            return Err(ApiError::bad_request(
                "'previous_response_id' must be a non-empty string",
                "invalid_previous_response_id",
            ));
        }
    };
    Ok(ResponsesInput {
        model: model_name(object.get("model")),
        stream: bool_field(object.get("stream"), "stream", false, "invalid_stream")?,
        store: bool_field(object.get("store"), "store", true, "invalid_store")?,
        instructions,
        previous_response_id,
        metadata: metadata_of(object.get("metadata"))?,
        conversation,
    })
}

/// The `(role, content)` of each message item of `input`. An item is a
/// message when its `type` is `message` or absent (the easy form
/// `{"role", "content"}`); other items (tool outputs, references,
/// reasoning) carry nothing this server replays and are skipped.
fn messages_of(items: &[Value]) -> Result<RawMessages<'_>, ApiError> {
    let mut messages = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Some(item) = item.as_object() else {
            return Err(ApiError::bad_request(
                format!("input[{i}]: an input item must be an object"),
                "invalid_input_item",
            ));
        };
        match item.get("type").and_then(Value::as_str) {
            None | Some("message") => messages.push((item.get("role"), item.get("content"))),
            Some(_) => {}
        }
    }
    Ok(messages)
}

/// `metadata` within OpenAI's limits: at most [`MAX_METADATA_PAIRS`]
/// string values under short keys.
fn metadata_of(value: Option<&Value>) -> Result<Map<String, Value>, ApiError> {
    let bad = |what: String| ApiError::bad_request(what, "invalid_metadata");
    let map = match value {
        None | Some(Value::Null) => return Ok(Map::new()),
        Some(Value::Object(map)) => map,
        Some(_) => return Err(bad("'metadata' must be an object of strings".to_owned())),
    };
    if map.len() > MAX_METADATA_PAIRS {
        return Err(bad(format!(
            "'metadata' holds {} pairs; at most {MAX_METADATA_PAIRS} are allowed",
            map.len()
        )));
    }
    for (key, value) in map {
        let shown: String = key.chars().take(MAX_METADATA_KEY).collect();
        if key.chars().count() > MAX_METADATA_KEY {
            return Err(bad(format!(
                "metadata key {shown:?}... is longer than {MAX_METADATA_KEY} characters"
            )));
        }
        match value.as_str() {
            Some(v) if v.chars().count() <= MAX_METADATA_VALUE => {}
            Some(_) => {
                return Err(bad(format!(
                    "metadata value of {shown:?} is longer than {MAX_METADATA_VALUE} characters"
                )));
            }
            None => return Err(bad(format!("metadata value of {shown:?} must be a string"))),
        }
    }
    Ok(map.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{FileSource, InlineFile};
    use serde_json::json;
    use talaria_core::Message;

    fn parse(v: Value) -> Result<ResponsesInput, ApiError> {
        parse_request(v.to_string().as_bytes())
    }

    fn code(v: Value) -> Option<&'static str> {
        parse(v).err().and_then(|e| e.code)
    }

    #[test]
    fn a_string_input_is_the_new_user_message() {
        let input = parse(
            json!({"model": "m", "input": "hi", "instructions": "be brief",
            "metadata": {"k": "v"}, "tools": [{"type": "web_search"}], "temperature": 0.2}),
        )
        .map_err(|e| e.message);
        let input = input.as_ref().ok();
        assert_eq!(input.map(|i| i.conversation.last_user.as_str()), Some("hi"));
        assert_eq!(input.map(|i| i.store), Some(true));
        assert_eq!(input.map(|i| i.stream), Some(false));
        assert_eq!(
            input.and_then(|i| i.instructions.as_deref()),
            Some("be brief")
        );
        assert_eq!(input.map(|i| i.metadata.len()), Some(1));
        assert_eq!(input.and_then(|i| i.model.as_deref()), Some("m"));
    }

    #[test]
    fn input_items_give_the_history_the_new_message_and_its_image() {
        let input = parse(json!({"input": [
            {"role": "developer", "content": "terse"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "A"}]},
            {"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "a", "annotations": []}]},
            {"type": "function_call_output", "call_id": "c1", "output": "x"},
            {"role": "user", "content": [
                {"type": "input_text", "text": "B"},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0K"}]},
        ], "store": false, "previous_response_id": "resp_1"}))
        .map_err(|e| e.message);
        let Ok(input) = input else {
            panic!("{input:?}");
        };
        assert!(!input.store);
        assert_eq!(input.previous_response_id.as_deref(), Some("resp_1"));
        assert_eq!(
            input.conversation,
            Conversation {
                system: "terse".into(),
                last_user: "B".into(),
                files: vec![InlineFile {
                    part: "image_url",
                    source: FileSource::Base64("iVBORw0K".into()),
                }],
                earlier: vec![Message::user("A"), Message::assistant("a")],
            }
        );
    }

    #[test]
    fn bad_requests_are_refused_with_a_code() {
        assert_eq!(
            parse_request(b"{nope").err().and_then(|e| e.code),
            Some("invalid_json")
        );
        assert_eq!(code(json!([])), Some("invalid_json"));
        assert_eq!(code(json!({"model": "m"})), Some("missing_input"));
        assert_eq!(code(json!({"input": ""})), Some("missing_input"));
        assert_eq!(code(json!({"input": []})), Some("missing_input"));
        assert_eq!(code(json!({"input": 5})), Some("missing_input"));
        assert_eq!(code(json!({"input": [5]})), Some("invalid_input_item"));
        assert_eq!(
            code(json!({"input": [{"role": "assistant", "content": "x"}]})),
            Some("no_user_message")
        );
        assert_eq!(
            code(json!({"input": [{"role": "user", "content": 5}]})),
            Some("invalid_message")
        );
        assert_eq!(
            code(json!({"input": "x", "stream": "yes"})),
            Some("invalid_stream")
        );
        assert_eq!(
            code(json!({"input": "x", "store": 1})),
            Some("invalid_store")
        );
        assert_eq!(
            code(json!({"input": "x", "instructions": ["x"]})),
            Some("invalid_instructions")
        );
        assert_eq!(
            code(json!({"input": "x", "previous_response_id": 7})),
            Some("invalid_previous_response_id")
        );
        assert_eq!(
            code(json!({"input": "x", "conversation": "conv_1"})),
            Some("unsupported_parameter")
        );
        assert_eq!(
            code(json!({"input": "x", "metadata": {"k": 1}})),
            Some("invalid_metadata")
        );
        let many: Map<String, Value> = (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
        assert_eq!(
            code(json!({"input": "x", "metadata": many})),
            Some("invalid_metadata")
        );
        assert_eq!(
            code(json!({"input": "x", "metadata": {"k": "v".repeat(513)}})),
            Some("invalid_metadata")
        );
    }
}
