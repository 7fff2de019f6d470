//! The `messages.media` column, the same in both backends: a JSON array of
//! [`MediaRef`]s (kind, cache path, type), or NULL when a row has none.
//! Only references are kept: the bytes stay in the media cache, so a
//! transcript stays small however many photos a chat holds.

use talaria_core::MediaRef;

use crate::{Result, StoreError};

/// The column's value for `media`: NULL (`None`) when there is none, so
/// rows without media (nearly all of them) cost nothing and read the same
/// as rows written before the column existed.
pub(crate) fn encode(media: &[MediaRef]) -> Result<Option<String>> {
    if media.is_empty() {
        return Ok(None);
    }
    serde_json::to_string(media).map(Some).map_err(|e| {
        StoreError::Database(format!(
            "could not record the message's attachments (a cache path that is not \
             valid UTF-8?): {e}"
        ))
    })
}

/// The references kept in the column of message `message_id`. Like
/// unreadable tool calls, an unreadable value is reported rather than
/// read as none: dropping it would silently take a photo out of the
/// conversation the model is shown.
pub(crate) fn decode(column: Option<&str>, message_id: i64) -> Result<Vec<MediaRef>> {
    match column {
        None | Some("") => Ok(Vec::new()),
        Some(json) => serde_json::from_str(json).map_err(|e| {
            StoreError::Database(format!(
                "message {message_id} has unreadable media references: {e}"
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use talaria_core::MediaKind;

    fn photo(path: &str) -> MediaRef {
        MediaRef {
            kind: MediaKind::Image,
            path: path.into(),
            mime: "image/jpeg".to_owned(),
        }
    }

    #[test]
    fn none_is_null_and_null_is_none() {
        assert_eq!(encode(&[]).unwrap(), None);
        assert!(decode(None, 1).unwrap().is_empty());
        assert!(decode(Some(""), 1).unwrap().is_empty());
    }

    #[test]
    fn references_round_trip_in_order() {
        let media = vec![
            photo("/cache/ab/cd.jpg"),
            MediaRef {
                kind: MediaKind::Voice,
                path: "/cache/ef/01.ogg".into(),
                mime: "audio/ogg".to_owned(),
            },
        ];
        let text = encode(&media).unwrap().unwrap();
        assert!(text.contains(r#""kind":"voice""#), "{text}");
        assert_eq!(decode(Some(&text), 1).unwrap(), media);
    }

    #[test]
    fn an_unreadable_value_names_its_row() {
        let err = decode(Some("[{\"kind\":\"hologram\"}]"), 77).unwrap_err();
        assert!(err.to_string().contains("message 77"), "{err}");
    }
}
