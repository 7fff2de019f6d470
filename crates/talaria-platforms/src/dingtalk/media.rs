//! Files out: an upload to the old OpenAPI's `media/upload`, then a robot
//! message naming the media id.
//!
//! A session webhook carries only text, markdown and cards, so files
//! always go through the robot send API: to the user for a 1:1 chat, to
//! the conversation for a group. DingTalk's documentation limits what the
//! upload takes: images (`type=image`) as JPG, GIF, PNG or BMP up to
//! 20 MB, sent as `sampleImageMsg` with the media id as its `photoURL`;
//! files (`type=file`) as DOC(X), XLS(X), PPT(X), ZIP, PDF or RAR up to
//! 20 MB, sent as `sampleFile`. Anything else cannot be carried (a voice
//! message needs its duration, a video a cover image), so the recipient
//! gets the gateway's fallback line instead; a file over a limit is
//! refused with the limit named, before a byte is sent.

use serde_json::json;
use talaria_adapter::{Adapter, MediaKind, OutboundFile, OutboundMessage, SendError, SentMessage};

use super::{Attempt, CUSTOM_ROBOT_CHAT, DingTalkAdapter, MAX_RATE_LIMIT_RETRIES};
use crate::http::file_part;

/// The largest image or file DingTalk's media upload takes.
pub(crate) const MAX_UPLOAD_BYTES: u64 = 20 * 1024 * 1024;

/// Image formats `type=image` takes.
const IMAGE_FORMATS: &[&str] = &["jpg", "jpeg", "gif", "png", "bmp"];

/// File formats `type=file` takes.
const FILE_FORMATS: &[&str] = &[
    "doc", "docx", "xls", "xlsx", "ppt", "pptx", "zip", "pdf", "rar",
];

/// How a file goes out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Upload {
    /// `type=image`, then `sampleImageMsg`.
    Image,
    /// `type=file`, then `sampleFile` with this extension as `fileType`.
    File(String),
}

/// The file's format: its name's extension, else its type's subtype.
fn format_of(file: &OutboundFile) -> String {
    let from_name = file
        .name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .filter(|e| !e.is_empty() && e.len() <= 8);
    from_name.unwrap_or_else(|| match file.mime.to_ascii_lowercase().as_str() {
        "image/jpeg" => "jpg".into(),
        "image/png" => "png".into(),
        "image/gif" => "gif".into(),
        "image/bmp" => "bmp".into(),
        "application/pdf" => "pdf".into(),
        "application/zip" => "zip".into(),
        _ => String::new(),
    })
}

/// How `file` of `size` bytes can go out: `Ok(None)` when DingTalk takes
/// no such file (the fallback line goes instead), `Err` naming the limit
/// when it is too large.
pub(crate) fn choose(file: &OutboundFile, size: u64) -> Result<Option<Upload>, String> {
    let format = format_of(file);
    let upload = if file.kind == MediaKind::Image && IMAGE_FORMATS.contains(&format.as_str()) {
        Upload::Image
    } else if FILE_FORMATS.contains(&format.as_str()) {
        Upload::File(format)
    } else {
        return Ok(None);
    };
    if size > MAX_UPLOAD_BYTES {
        return Err(format!(
            "{} is {size} bytes; DingTalk takes images and files up to {MAX_UPLOAD_BYTES} bytes \
             (20 MB)",
            file.name
        ));
    }
    Ok(Some(upload))
}

impl DingTalkAdapter {
    /// Sends `file` (see the module docs).
    pub(super) async fn post_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        let size = tokio::fs::metadata(&file.path)
            .await
            .map_err(|e| SendError::Rejected(format!("cannot read {}: {e}", file.name)))?
            .len();
        let upload = if file.chat_id == CUSTOM_ROBOT_CHAT {
            // A custom robot posts text and markdown only.
            None
        } else {
            choose(file, size).map_err(SendError::Rejected)?
        };
        let Some(upload) = upload else {
            return self.send(&fallback(file, "dingtalk")).await;
        };
        // Nothing is uploaded for a chat the robot cannot reach.
        if self.route(&file.chat_id).await.is_none() {
            return Err(self.unreachable(&file.chat_id));
        }
        let kind = match upload {
            Upload::Image => "image",
            Upload::File(_) => "file",
        };
        let part = file_part(&file.path, &file.name, &file.mime)
            .await
            .map_err(|e| SendError::Rejected(format!("cannot read {}: {e}", file.name)))?;
        let media_id = self
            .api
            .upload_media(&self.settings.media_base, kind, part)
            .await
            .map_err(|e| match e.status() {
                // Answered 200 with an errcode: the file itself was
                // refused (its type, its size), and will be again.
                Some(200) => SendError::Rejected(format!(
                    "DingTalk refused {} as {kind}: {}",
                    file.name,
                    e.reason()
                )),
                _ => e.classify(),
            })?;
        let (key, param) = match &upload {
            Upload::Image => ("sampleImageMsg", json!({ "photoURL": media_id })),
            Upload::File(format) => (
                "sampleFile",
                json!({ "mediaId": media_id, "fileName": file.name, "fileType": format }),
            ),
        };
        let param = param.to_string();
        let mut retries = 0;
        loop {
            match self.robot_send_as(&file.chat_id, key, &param).await {
                Ok(()) => break,
                Err(Attempt::TooFast(wait)) if retries < MAX_RATE_LIMIT_RETRIES => {
                    retries += 1;
                    tracing::info!(?wait, "DingTalk says sending too fast; waiting");
                    tokio::time::sleep(wait).await;
                }
                Err(Attempt::TooFast(wait)) => return Err(SendError::RateLimited(wait)),
                Err(Attempt::WebhookDead(why)) => return Err(SendError::Rejected(why)),
                Err(Attempt::Failed(e)) => return Err(e),
            }
        }
        if let Some(caption) = file.caption.as_deref().filter(|c| !c.trim().is_empty()) {
            let message = OutboundMessage {
                chat_id: file.chat_id.clone(),
                thread_id: None,
                reply_to: None,
                text: caption.to_owned(),
                choices: Vec::new(),
            };
            self.send(&message).await?;
        }
        Ok(SentMessage::default())
    }
}

/// The line sent instead of a file DingTalk cannot carry.
fn fallback(file: &OutboundFile, platform: &str) -> OutboundMessage {
    OutboundMessage {
        chat_id: file.chat_id.clone(),
        thread_id: file.thread_id.clone(),
        reply_to: file.reply_to.clone(),
        text: file.fallback_text(platform),
        choices: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(kind: MediaKind, name: &str, mime: &str) -> OutboundFile {
        OutboundFile {
            chat_id: "cid1".into(),
            thread_id: None,
            reply_to: None,
            path: "/nonexistent".into(),
            kind,
            mime: mime.into(),
            name: name.into(),
            caption: None,
        }
    }

    #[test]
    fn images_and_office_files_are_uploaded_within_the_limits() {
        let png = file(MediaKind::Image, "chart.png", "image/png");
        assert_eq!(choose(&png, 10), Ok(Some(Upload::Image)));
        let jpeg = file(MediaKind::Image, "photo", "image/jpeg");
        assert_eq!(choose(&jpeg, 10), Ok(Some(Upload::Image)));
        let pdf = file(MediaKind::Document, "Report.PDF", "application/pdf");
        assert_eq!(choose(&pdf, 10), Ok(Some(Upload::File("pdf".into()))));
        let big = choose(&pdf, MAX_UPLOAD_BYTES + 1).unwrap_err();
        assert!(big.contains("20 MB") && big.contains("Report.PDF"), "{big}");
        assert!(choose(&png, MAX_UPLOAD_BYTES).unwrap().is_some());
        // DingTalk takes neither as an upload.
        let webp = file(MediaKind::Image, "x.webp", "image/webp");
        assert_eq!(choose(&webp, 10), Ok(None));
        let voice = file(MediaKind::Voice, "note.ogg", "audio/ogg");
        assert_eq!(choose(&voice, 10), Ok(None));
        let text = file(MediaKind::Document, "notes.txt", "text/plain");
        assert_eq!(choose(&text, MAX_UPLOAD_BYTES * 2), Ok(None));
    }
}
