//! Files in and out of Mattermost, through the files API.
//!
//! In: a post's `file_ids` are fetched with `GET /api/v4/files/{id}` and
//! the bot's token, from the configured server only (an id is not an
//! address, so nothing from a post chooses the host).
//!
//! Out: `POST /api/v4/files` as `multipart/form-data` with `channel_id`
//! first and the file streamed from disk as `files`, then a post carrying
//! the stored file's id in `file_ids`. Mattermost has no photo or voice
//! message types: every kind is a file, which its clients preview by type.

use std::time::Duration;

use serde_json::{Value, json};
use talaria_adapter::{Download, DownloadError, OutboundFile, SendError, SentMessage};

use super::api::{self, MATTERMOST, Uploaded};
use super::{MAX_POST_CHARS, MattermostAdapter, format, lock};
use crate::http::{Failure, HttpError, file_part};

/// How long a whole download may take, body included.
pub(super) const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// How long a whole upload may take.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// Whether `locator` can be a Mattermost id (26 lowercase letters and
/// digits; a little looser here), so nothing else reaches the URL.
fn is_file_id(locator: &str) -> bool {
    !locator.is_empty() && locator.len() <= 64 && locator.bytes().all(|b| b.is_ascii_alphanumeric())
}

impl MattermostAdapter {
    /// `GET /api/v4/files/{id}`, streamed.
    pub(super) async fn fetch_file(&self, locator: &str) -> Result<Download, DownloadError> {
        if !is_file_id(locator) {
            let shown: String = locator.chars().take(80).collect();
            return Err(DownloadError::Gone(format!(
                "{shown:?} is not a Mattermost file address (a file id)"
            )));
        }
        let request = self
            .files
            .client()
            .get(format!("{}/api/v4/files/{locator}", self.base_url))
            .bearer_auth(self.token.expose());
        self.files.download(request, DOWNLOAD_TIMEOUT).await
    }

    /// Uploads `file` to its channel; the stored file's id.
    async fn upload(&self, file: &OutboundFile) -> Result<String, SendError> {
        let part = file_part(&file.path, &file.name, &file.mime)
            .await
            .map_err(|e| SendError::Rejected(format!("cannot read {}: {e}", file.name)))?;
        // The server reads the form as a stream and needs the channel
        // before the first file.
        let form = reqwest::multipart::Form::new()
            .text("channel_id", file.chat_id.clone())
            .part("files", part);
        let request = self
            .files
            .client()
            .post(format!("{}/api/v4/files", self.base_url))
            .bearer_auth(self.token.expose())
            .multipart(form);
        let answer = self
            .files
            .send(request, UPLOAD_TIMEOUT)
            .await
            .map_err(HttpError::classify)?;
        if !answer.is_success() {
            let r = api::refusal(&answer);
            let message = if r.message.is_empty() {
                format!("HTTP {}", answer.status)
            } else {
                r.message
            };
            let e = self
                .files
                .refused(answer.status, r.code, &message, r.retry_after);
            return Err(e.classify());
        }
        let uploaded: Uploaded = self.files.decode(&answer).map_err(HttpError::classify)?;
        match uploaded.file_infos.into_iter().next() {
            Some(info) if is_file_id(&info.id) => Ok(info.id),
            _ => Err(HttpError::new(
                MATTERMOST,
                Failure::Other("the upload was answered without a file id".into()),
            )
            .classify()),
        }
    }

    /// Uploads the file, then posts it with the caption as the message.
    pub(super) async fn post_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        let file_id = self.upload(file).await?;
        let caption = file.caption.as_deref().unwrap_or("").trim();
        let mut message = format::to_mattermost(caption);
        if message.chars().count() > MAX_POST_CHARS {
            message = caption.chars().take(MAX_POST_CHARS).collect();
        }
        let mut body: Value = json!({
            "channel_id": file.chat_id,
            "message": message,
            "file_ids": [file_id],
        });
        let root = file.thread_id.as_deref().filter(|t| !t.is_empty());
        if let Some(root) = root {
            body["root_id"] = json!(root);
        }
        let post = self.create_post(&body).await?;
        if let Some(root) = root {
            lock(&self.threads).insert(root);
        }
        Ok(SentMessage {
            message_id: Some(post.id),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ids_are_fetched() {
        assert!(is_file_id("8xk3j5tq7frb5mhw1n6ft8qz3e"));
        for bad in ["", "../users/me", "https://evil.example/x", "a b", "a?b"] {
            assert!(!is_file_id(bad), "{bad}");
        }
    }
}
