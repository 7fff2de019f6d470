//! Files in and out of Feishu chats.
//!
//! - In: `image`, `file`, `audio` (a voice message) and `media` (a video)
//!   messages, and the `img` / `media` elements of a `post`, become
//!   attachments whose locator is `<type>:<message_id>:<key>`; `download`
//!   fetches `GET /open-apis/im/v1/messages/:message_id/resources/:key?type=…`
//!   (a resource is only readable through the message that carries it).
//! - Out: an image of at most 10 MB is uploaded with `POST
//!   /open-apis/im/v1/images` (`image_type=message`) and sent as `image`;
//!   anything else of at most 30 MB with `POST /open-apis/im/v1/files`, as
//!   `audio` (an Ogg/Opus voice note), `media` (an MP4 video) or `file`.

use std::path::Path;

use serde_json::{Value, json};
use talaria_adapter::{Attachment, MediaKind};

/// Feishu's largest image upload.
pub(crate) const MAX_IMAGE_BYTES: u64 = 10 * 1024 * 1024;

/// Feishu's largest file upload.
pub(crate) const MAX_FILE_BYTES: u64 = 30 * 1024 * 1024;

/// At most this many attachments are taken from one message (a post may
/// hold many images).
const MAX_ATTACHMENTS: usize = 20;

/// The longest id or key a locator may hold.
const MAX_KEY_LEN: usize = 256;

/// Which resource `type` the download asks for: images by their
/// `image_key`, everything else (files, audio, video) by `file_key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resource {
    Image,
    File,
}

impl Resource {
    fn as_str(self) -> &'static str {
        match self {
            Resource::Image => "image",
            Resource::File => "file",
        }
    }
}

/// Message ids and resource keys are ASCII letters, digits, `_` and `-`;
/// anything else is not Feishu's and must not reach a URL path.
fn is_safe(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_KEY_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The locator of one resource of one message.
pub(crate) fn locator(resource: Resource, message_id: &str, key: &str) -> Option<String> {
    (is_safe(message_id) && is_safe(key))
        .then(|| format!("{}:{message_id}:{key}", resource.as_str()))
}

/// A locator read back: (resource, message id, key). Anything that is not
/// exactly what [`locator`] writes is refused.
pub(crate) fn parse_locator(locator: &str) -> Option<(Resource, &str, &str)> {
    let mut parts = locator.split(':');
    let resource = match parts.next()? {
        "image" => Resource::Image,
        "file" => Resource::File,
        _ => return None,
    };
    let message_id = parts.next()?;
    let key = parts.next()?;
    if parts.next().is_some() || !message_id.starts_with("om_") {
        return None;
    }
    (is_safe(message_id) && is_safe(key)).then_some((resource, message_id, key))
}

/// The download's path and query for a locator.
pub(crate) fn resource_path(resource: Resource, message_id: &str, key: &str) -> (String, String) {
    (
        format!("/open-apis/im/v1/messages/{message_id}/resources/{key}"),
        resource.as_str().to_owned(),
    )
}

fn text<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// The attachment of an `image`, `file`, `audio` or `media` message;
/// `None` when its content names no usable key.
pub(crate) fn of_message(
    message_type: &str,
    content: &Value,
    message_id: &str,
) -> Option<Attachment> {
    let name = text(content, "file_name");
    match message_type {
        "image" => {
            let at = locator(Resource::Image, message_id, text(content, "image_key")?)?;
            Some(Attachment::remote(MediaKind::Image, at))
        }
        "file" => {
            let at = locator(Resource::File, message_id, text(content, "file_key")?)?;
            Some(Attachment::guessed(at, name, None, None))
        }
        "audio" => {
            // A voice message recorded in the client: Opus audio.
            let at = locator(Resource::File, message_id, text(content, "file_key")?)?;
            Some(Attachment::remote(MediaKind::Voice, at).named(name))
        }
        "media" => {
            let at = locator(Resource::File, message_id, text(content, "file_key")?)?;
            Some(Attachment::remote(MediaKind::Video, at).named(name))
        }
        _ => None,
    }
}

/// The images and videos inside a `post`'s rows.
pub(crate) fn of_post(body: &Value, message_id: &str) -> Vec<Attachment> {
    let mut found = Vec::new();
    let elements = body
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_array)
        .flatten();
    for el in elements {
        if found.len() >= MAX_ATTACHMENTS {
            tracing::info!("a Feishu post holds more files than are taken; the rest are left");
            break;
        }
        let attachment = match el.get("tag").and_then(Value::as_str) {
            Some("img") => text(el, "image_key")
                .and_then(|k| locator(Resource::Image, message_id, k))
                .map(|at| Attachment::remote(MediaKind::Image, at)),
            Some("media") => text(el, "file_key")
                .and_then(|k| locator(Resource::File, message_id, k))
                .map(|at| Attachment::remote(MediaKind::Video, at)),
            _ => None,
        };
        found.extend(attachment);
    }
    found
}

/// How a file goes out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// `None`: the image upload; `Some(file_type)`: the file upload.
    pub file_type: Option<&'static str>,
    /// The message type that carries the key.
    pub msg_type: &'static str,
}

/// Image types the image upload takes (others go as files).
const IMAGE_TYPES: &[&str] = &[
    "image/jpeg",
    "image/png",
    "image/webp",
    "image/gif",
    "image/bmp",
    "image/x-icon",
    "image/vnd.microsoft.icon",
    "image/tiff",
    "image/heic",
];

fn extension(name: &str) -> String {
    Path::new(name)
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase()
}

/// Which upload and message a file of `size` bytes takes; `Err` says, in
/// words for the ledger, why Feishu cannot take it.
pub(crate) fn plan(kind: MediaKind, mime: &str, name: &str, size: u64) -> Result<Plan, String> {
    let mime = mime.trim().to_ascii_lowercase();
    if size == 0 {
        return Err(format!("{name} is empty, and Feishu takes no empty files"));
    }
    if kind == MediaKind::Image && size <= MAX_IMAGE_BYTES && IMAGE_TYPES.contains(&mime.as_str()) {
        return Ok(Plan {
            file_type: None,
            msg_type: "image",
        });
    }
    if size > MAX_FILE_BYTES {
        return Err(format!(
            "{name} is {:.1} MB; Feishu takes files of at most 30 MB (images as pictures up to 10 MB)",
            size as f64 / (1024.0 * 1024.0)
        ));
    }
    let opus = matches!(mime.as_str(), "audio/ogg" | "audio/opus")
        || matches!(extension(name).as_str(), "opus" | "ogg" | "oga");
    let plan = match kind {
        MediaKind::Voice | MediaKind::Audio if opus => Plan {
            file_type: Some("opus"),
            msg_type: "audio",
        },
        MediaKind::Video if mime == "video/mp4" => Plan {
            file_type: Some("mp4"),
            msg_type: "media",
        },
        _ => Plan {
            file_type: Some(document_type(&mime, name)),
            msg_type: "file",
        },
    };
    Ok(plan)
}

/// The `file_type` of a document: the few Feishu names, else `stream`.
fn document_type(mime: &str, name: &str) -> &'static str {
    match (mime, extension(name).as_str()) {
        ("application/pdf", _) | (_, "pdf") => "pdf",
        (_, "doc" | "docx") => "doc",
        (_, "xls" | "xlsx") => "xls",
        (_, "ppt" | "pptx") => "ppt",
        _ => "stream",
    }
}

/// The `content` of the message that carries an uploaded key.
pub(crate) fn content(msg_type: &str, key: &str) -> String {
    match msg_type {
        "image" => json!({ "image_key": key }),
        _ => json!({ "file_key": key }),
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locators_round_trip_and_refuse_anything_else() {
        let at = locator(Resource::Image, "om_1a", "img_v3_02ab-cd").unwrap();
        assert_eq!(at, "image:om_1a:img_v3_02ab-cd");
        assert_eq!(
            parse_locator(&at),
            Some((Resource::Image, "om_1a", "img_v3_02ab-cd"))
        );
        for bad in [
            "image:om_1:../../x",
            "image:om_1",
            "video:om_1:k",
            "file:oc_1:k",
            "file:om_1:k:extra",
            "file:om_1:k?type=image",
            "https://evil.example/x",
            "",
        ] {
            assert_eq!(parse_locator(bad), None, "{bad}");
        }
        assert_eq!(locator(Resource::File, "om_1", "a/b"), None);
    }

    #[test]
    fn messages_and_posts_become_attachments() {
        let image = of_message("image", &json!({"image_key": "img_1"}), "om_1").unwrap();
        assert_eq!(image.kind, MediaKind::Image);
        let file = of_message(
            "file",
            &json!({"file_key": "file_1", "file_name": "report.pdf"}),
            "om_1",
        )
        .unwrap();
        assert_eq!(file.kind, MediaKind::Document);
        assert_eq!(file.name.as_deref(), Some("report.pdf"));
        let voice = of_message(
            "audio",
            &json!({"file_key": "file_2", "duration": 2000}),
            "om_1",
        );
        assert_eq!(voice.unwrap().kind, MediaKind::Voice);
        let video = of_message(
            "media",
            &json!({"file_key": "file_3", "image_key": "img_c"}),
            "om_1",
        );
        assert_eq!(video.unwrap().kind, MediaKind::Video);
        assert!(of_message("image", &json!({}), "om_1").is_none());
        let post = json!({"title": "", "content": [
            [{"tag": "text", "text": "look"}, {"tag": "img", "image_key": "img_a"}],
            [{"tag": "img", "image_key": "bad key"}, {"tag": "media", "file_key": "file_v"}],
        ]});
        let found = of_post(&post, "om_2");
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].kind, MediaKind::Image);
        assert_eq!(found[1].kind, MediaKind::Video);
    }

    #[test]
    fn plans_follow_feishus_limits_and_types() {
        let mb = 1024 * 1024;
        let p = plan(MediaKind::Image, "image/png", "a.png", mb).unwrap();
        assert_eq!((p.file_type, p.msg_type), (None, "image"));
        let big = plan(MediaKind::Image, "image/png", "a.png", 12 * mb).unwrap();
        assert_eq!((big.file_type, big.msg_type), (Some("stream"), "file"));
        let voice = plan(MediaKind::Voice, "audio/ogg", "v.ogg", 10).unwrap();
        assert_eq!((voice.file_type, voice.msg_type), (Some("opus"), "audio"));
        let mp3 = plan(MediaKind::Audio, "audio/mpeg", "s.mp3", 10).unwrap();
        assert_eq!((mp3.file_type, mp3.msg_type), (Some("stream"), "file"));
        let video = plan(MediaKind::Video, "video/mp4", "v.mp4", 10).unwrap();
        assert_eq!((video.file_type, video.msg_type), (Some("mp4"), "media"));
        let doc = plan(MediaKind::Document, "application/pdf", "r", 10).unwrap();
        assert_eq!(doc.file_type, Some("pdf"));
        let sheet = plan(MediaKind::Document, "application/zip", "t.xlsx", 10).unwrap();
        assert_eq!(sheet.file_type, Some("xls"));
        let err = plan(MediaKind::Document, "application/pdf", "huge.pdf", 31 * mb).unwrap_err();
        assert!(err.contains("30 MB"), "{err}");
        assert!(plan(MediaKind::Document, "text/plain", "e.txt", 0).is_err());
    }
}
