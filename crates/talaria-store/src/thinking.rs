//! The `messages.thinking` column, the same in both backends: a JSON array
//! of an assistant row's signed reasoning blocks in the provider's own
//! shape, or NULL when the row has none. Kept so a resumed tool-use loop
//! can send them back exactly as the provider issued them.

use talaria_core::ThinkingBlock;

use crate::{Result, StoreError};

/// The column's value for `blocks`: NULL (`None`) when there are none, so
/// most rows cost nothing and read the same as rows from before the
/// column existed.
pub(crate) fn encode(blocks: &[ThinkingBlock]) -> Result<Option<String>> {
    if blocks.is_empty() {
        return Ok(None);
    }
    serde_json::to_string(blocks)
        .map(Some)
        .map_err(|e| StoreError::Database(format!("could not record reasoning blocks: {e}")))
}

/// The blocks kept in the column of message `message_id`. An unreadable
/// value is an error, not an empty list: replaying the turn without its
/// blocks would be refused by the provider anyway, and the cause would be
/// harder to find there.
pub(crate) fn decode(column: Option<&str>, message_id: i64) -> Result<Vec<ThinkingBlock>> {
    match column {
        None | Some("") => Ok(Vec::new()),
        Some(json) => serde_json::from_str(json).map_err(|e| {
            StoreError::Database(format!(
                "message {message_id} has unreadable reasoning blocks: {e}"
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_is_null_and_blocks_round_trip_in_wire_shape() {
        assert_eq!(encode(&[]).unwrap(), None);
        assert!(decode(None, 1).unwrap().is_empty());
        let blocks = vec![
            ThinkingBlock::Thinking {
                thinking: "weigh \"a\" vs b\n".into(),
                signature: "EqQBCgIYAhIM".into(),
            },
            ThinkingBlock::RedactedThinking {
                data: "EmwKAhgBEgy3va".into(),
            },
        ];
        let text = encode(&blocks).unwrap().unwrap();
        assert!(text.starts_with(r#"[{"type":"thinking","#), "{text}");
        assert!(text.contains(r#"{"type":"redacted_thinking","data":"EmwKAhgBEgy3va"}"#));
        assert_eq!(decode(Some(&text), 1).unwrap(), blocks);
        assert!(decode(Some("[{\"type\":\"nope\"}]"), 7).is_err());
    }
}
