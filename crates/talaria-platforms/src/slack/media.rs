//! Files in and out of Slack.
//!
//! In: a shared file's `url_private_download` (else `url_private`) is
//! fetched with the bot token in the `Authorization` header, and only
//! from `files.slack.com` or the configured API root's origin: a URL in
//! an event never takes the token anywhere else.
//!
//! Out: Slack's external upload flow. `files.getUploadURLExternal`
//! (form-encoded `filename` and `length`) answers an upload address and a
//! file id; the bytes are streamed there from disk as a multipart form;
//! `files.completeUploadExternal` then shares the file in the channel (and
//! thread), the caption as its `initial_comment`. Slack has no photo or
//! voice message types for bots: every kind goes as a file, which its
//! clients preview by type.

use std::time::Duration;

use tokio::io::AsyncReadExt;

use serde_json::json;
use talaria_adapter::{Download, DownloadError, OutboundFile, SendError, SentMessage};

use super::api::{Params, UploadError};
use super::{SlackAdapter, format};

/// How long a whole download may take, body included.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// How long posting a file's bytes may take.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(300);

impl SlackAdapter {
    /// Opens a file an event linked to.
    pub(super) async fn fetch_file(&self, locator: &str) -> Result<Download, DownloadError> {
        if !self.api.is_file_url(locator) {
            let shown: String = locator.chars().take(80).collect();
            return Err(DownloadError::Gone(format!(
                "{shown:?} is not a Slack file address"
            )));
        }
        let download = self
            .api
            .download(locator, &self.bot_token, DOWNLOAD_TIMEOUT)
            .await?;
        not_a_sign_in_page(locator, download).await
    }

    /// Uploads and shares `file` (see the module docs).
    pub(super) async fn share_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        let unreadable =
            |e: std::io::Error| SendError::Rejected(format!("cannot read {}: {e}", file.name));
        let length = tokio::fs::metadata(&file.path)
            .await
            .map_err(unreadable)?
            .len();
        // This method takes a form only (no JSON body).
        let form = [
            ("filename", file.name.clone()),
            ("length", length.to_string()),
        ];
        let answer = self
            .call_params_with_retries("files.getUploadURLExternal", Params::Form(&form))
            .await?;
        let field = |k: &str| answer.get(k).and_then(serde_json::Value::as_str);
        let (Some(upload_url), Some(file_id)) = (field("upload_url"), field("file_id")) else {
            return Err(SendError::Ambiguous(
                "Slack gave no upload address for the file".into(),
            ));
        };
        if !self.api.is_file_url(upload_url) {
            return Err(SendError::Rejected(
                "Slack gave an upload address off its file host; not sending the file there".into(),
            ));
        }
        match self
            .api
            .upload(
                upload_url,
                &file.path,
                &file.name,
                &file.mime,
                UPLOAD_TIMEOUT,
            )
            .await
        {
            Ok(()) => {}
            Err(UploadError::File(e)) => return Err(unreadable(e)),
            Err(UploadError::Http(e)) => return Err(e.classify()),
        }
        let mut params = json!({
            "files": [{ "id": file_id, "title": file.name }],
            "channel_id": file.chat_id,
        });
        if let Some(t) = file.thread_id.as_deref().filter(|t| !t.is_empty()) {
            params["thread_ts"] = json!(t);
        }
        if let Some(c) = file
            .caption
            .as_deref()
            .map(str::trim)
            .filter(|c| !c.is_empty())
        {
            params["initial_comment"] = json!(format::to_mrkdwn(c));
        }
        self.call_params_with_retries("files.completeUploadExternal", Params::Json(&params))
            .await?;
        self.done_working(&file.chat_id, file.thread_id.as_deref())
            .await;
        // Slack answers with the file, not the message that shares it
        // (that one is made asynchronously): there is no ts to edit.
        Ok(SentMessage { message_id: None })
    }
}

/// How much of a body is looked at for Slack's sign-in page.
const SNIFF_BYTES: usize = 512;

/// Slack answers a file request it will not serve to this token (no
/// `files:read` scope) with 200 and its HTML sign-in page, which would
/// otherwise reach the model as the file. The first bytes are read to
/// tell, then handed back in front of the rest of the stream.
async fn not_a_sign_in_page(url: &str, mut d: Download) -> Result<Download, DownloadError> {
    let lower = url.to_ascii_lowercase();
    if lower.ends_with(".html") || lower.ends_with(".htm") {
        return Ok(d);
    }
    let mut head = vec![0u8; SNIFF_BYTES];
    let mut filled = 0;
    while filled < head.len() {
        let n = d
            .reader
            .read(&mut head[filled..])
            .await
            .map_err(|e| DownloadError::Unavailable(e.to_string()))?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    head.truncate(filled);
    let start = String::from_utf8_lossy(&head)
        .trim_start()
        .to_ascii_lowercase();
    if start.starts_with("<!doctype html") || start.starts_with("<html") {
        return Err(DownloadError::Gone(
            "Slack answered with its sign-in page instead of the file; \
             the bot token needs the files:read scope"
                .into(),
        ));
    }
    d.reader = Box::pin(std::io::Cursor::new(head).chain(d.reader));
    Ok(d)
}
