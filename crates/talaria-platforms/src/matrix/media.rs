//! Files in and out of Matrix rooms, through the homeserver's media
//! repository.
//!
//! In: a message's `url` is an `mxc://{server}/{media id}` address, always
//! fetched from the bot's own homeserver (which fetches remote media over
//! federation), never from a host named in an event. The authenticated
//! endpoint (`GET /_matrix/client/v1/media/download/...`, Matrix 1.11) is
//! asked first; a homeserver that does not know it (404 or 405
//! `M_UNRECOGNIZED`) is asked at the older unauthenticated one
//! (`/_matrix/media/v3/download/...`).
//!
//! Out: the bytes are streamed from disk to `POST /_matrix/media/v3/upload`
//! (raw body, its type in `Content-Type`), and the `content_uri` it answers
//! is posted as an `m.image`, `m.audio`, `m.video` or `m.file` message.

use std::time::Duration;

use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE};
use serde_json::{Value, json};
use talaria_adapter::{Download, DownloadError, MediaKind, OutboundFile, SendError};
use talaria_core::Secret;

use super::api::{self, HOMESERVER, segment};
use crate::http::{Failure, Http, HttpError};

/// How long a whole download may take, body included: 20 MB on a slow
/// link, with room to spare.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// How long a whole upload may take.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// The media repository of one homeserver, with the bot's token.
#[derive(Debug, Clone)]
pub(super) struct Media {
    http: Http,
    homeserver: String,
    token: Secret,
}

impl Media {
    /// A client of `homeserver`'s media repository (no trailing `/`).
    pub(super) fn new(homeserver: &str, token: &Secret) -> Result<Media, String> {
        Ok(Media {
            http: Http::new(HOMESERVER)?.hiding(token, "<token>"),
            homeserver: homeserver.trim_end_matches('/').to_owned(),
            token: token.clone(),
        })
    }

    /// Opens the file at `locator`, an `mxc://` address from an event.
    pub(super) async fn download(&self, locator: &str) -> Result<Download, DownloadError> {
        let Some((server, media_id)) = parse_mxc(locator) else {
            return Err(DownloadError::Gone(format!(
                "{} is not a Matrix file address (mxc://server/id)",
                shorten(locator)
            )));
        };
        let path = format!("{}/{}", segment(server), segment(media_id));
        let authenticated = self
            .http
            .client()
            .get(format!(
                "{}/_matrix/client/v1/media/download/{path}",
                self.homeserver
            ))
            .bearer_auth(self.token.expose());
        match self.http.download(authenticated, DOWNLOAD_TIMEOUT).await {
            Err(e) if unrecognized(&e) => {
                tracing::debug!(
                    "the homeserver has no authenticated media endpoint; using the older one"
                );
                // Same homeserver, so the token may go along; servers of
                // that age ignore it.
                let legacy = self
                    .http
                    .client()
                    .get(format!(
                        "{}/_matrix/media/v3/download/{path}",
                        self.homeserver
                    ))
                    .bearer_auth(self.token.expose());
                self.http.download(legacy, DOWNLOAD_TIMEOUT).await
            }
            other => other,
        }
    }

    /// Streams `file` from disk into the media repository; its
    /// `content_uri` and size.
    pub(super) async fn upload(&self, file: &OutboundFile) -> Result<(String, u64), SendError> {
        let opened = tokio::fs::File::open(&file.path).await;
        let (handle, size) = match opened {
            Ok(f) => match f.metadata().await {
                Ok(m) => (f, m.len()),
                Err(e) => return Err(unreadable(file, &e)),
            },
            Err(e) => return Err(unreadable(file, &e)),
        };
        let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(handle));
        let uri = self.post(body, size, &file.mime, Some(&file.name)).await?;
        Ok((uri, size))
    }

    /// Posts `size` bytes of `body` to the media repository; the
    /// `content_uri` it answers.
    pub(super) async fn post(
        &self,
        body: reqwest::Body,
        size: u64,
        mime: &str,
        name: Option<&str>,
    ) -> Result<String, SendError> {
        let mut request = self
            .http
            .client()
            .post(format!("{}/_matrix/media/v3/upload", self.homeserver))
            .bearer_auth(self.token.expose());
        if let Some(name) = name {
            request = request.query(&[("filename", name)]);
        }
        let request = request
            .header(CONTENT_TYPE, mime)
            .header(CONTENT_LENGTH, size)
            .body(body);
        let answer = self
            .http
            .send(request, UPLOAD_TIMEOUT)
            .await
            .map_err(super::classify)?;
        if !answer.is_success() {
            let refusal = api::refusal(&answer);
            let message = if refusal.message.is_empty() {
                format!("HTTP {}", answer.status)
            } else {
                refusal.message
            };
            let e = self
                .http
                .refused(answer.status, refusal.code, &message, refusal.retry_after);
            if api::is_rate_limit(&e) {
                // The ledger waits and sends again (a retry uploads anew).
                return Err(SendError::RateLimited(
                    e.retry_after().unwrap_or(Duration::from_secs(1)),
                ));
            }
            return Err(super::classify(e));
        }
        let v: Value = self.http.decode(&answer).map_err(super::classify)?;
        match v.get("content_uri").and_then(Value::as_str) {
            Some(uri) if parse_mxc(uri).is_some() => Ok(uri.to_owned()),
            _ => Err(super::classify(HttpError::new(
                HOMESERVER,
                Failure::Other("the upload was answered without a content_uri".into()),
            ))),
        }
    }
}

pub(super) fn unreadable(file: &OutboundFile, e: &std::io::Error) -> SendError {
    // The file is gone or unreadable: a retry would fail the same way.
    SendError::Rejected(format!("cannot read {}: {e}", file.name))
}

/// Whether the homeserver said it does not know the endpoint at all (an
/// older server), as opposed to not having the file. The shared download
/// reports the refusal as text, the body's `errcode` included.
fn unrecognized(e: &DownloadError) -> bool {
    match e {
        DownloadError::Gone(why) | DownloadError::Unavailable(why) => {
            why.contains("M_UNRECOGNIZED")
        }
        _ => false,
    }
}

/// The server name and media id of an `mxc://` address, checked against
/// the spec's grammar so nothing else reaches a URL path.
pub(super) fn parse_mxc(locator: &str) -> Option<(&str, &str)> {
    let (server, media_id) = locator.strip_prefix("mxc://")?.split_once('/')?;
    let server_ok = !server.is_empty()
        && server.len() <= 255
        && server
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'));
    let id_ok = !media_id.is_empty()
        && media_id.len() <= 255
        && media_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
    (server_ok && id_ok).then_some((server, media_id))
}

/// A locator as an error may show it: an event's field, bounded.
fn shorten(locator: &str) -> String {
    let mut s: String = locator.chars().take(80).collect();
    if s.len() < locator.len() {
        s.push('…');
    }
    format!("{s:?}")
}

/// The message type a file of `kind` is posted as.
fn msgtype(kind: MediaKind) -> &'static str {
    match kind {
        MediaKind::Image => "m.image",
        MediaKind::Voice | MediaKind::Audio => "m.audio",
        MediaKind::Video => "m.video",
        MediaKind::Document => "m.file",
    }
}

/// [`file_content`] for a file in an encrypted room: its `file` object
/// (address and key) in place of the plain `url`.
pub(super) fn encrypted_file_content(file: &OutboundFile, object: Value, size: u64) -> Value {
    let mut content = file_content(file, "", size);
    if let Some(map) = content.as_object_mut() {
        map.remove("url");
        map.insert("file".to_owned(), object);
    }
    content
}

/// The content of the message that shows an uploaded file. With a
/// caption, `body` is the caption and `filename` the name (Matrix 1.10);
/// without one, `body` is the name.
pub(super) fn file_content(file: &OutboundFile, content_uri: &str, size: u64) -> Value {
    let caption = file
        .caption
        .as_deref()
        .map(str::trim)
        .filter(|c| !c.is_empty());
    let mut content = json!({
        "msgtype": msgtype(file.kind),
        "body": caption.unwrap_or(&file.name),
        "filename": file.name,
        "url": content_uri,
        "info": { "mimetype": file.mime, "size": size },
    });
    if let Some(c) = caption {
        content["format"] = json!("org.matrix.custom.html");
        content["formatted_body"] = json!(super::format::to_html(c));
    }
    if file.kind == MediaKind::Voice {
        // MSC3245: clients draw it as a voice message, not a music file.
        content["org.matrix.msc3245.voice"] = json!({});
    }
    content
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_well_formed_mxc_addresses_are_fetched() {
        assert_eq!(
            parse_mxc("mxc://example.org:8448/AbC_d-1"),
            Some(("example.org:8448", "AbC_d-1"))
        );
        for bad in [
            "https://example.org/x",
            "mxc://example.org/",
            "mxc:///abc",
            "mxc://example.org/a/../b",
            "mxc://exa mple.org/a",
            "mxc://example.org/a?b",
            "mxc://user@example.org/a",
        ] {
            assert_eq!(parse_mxc(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_voice_note_is_audio_flagged_as_voice_and_a_caption_becomes_the_body() {
        let file = OutboundFile {
            chat_id: "!r:x".into(),
            thread_id: None,
            reply_to: None,
            path: "/tmp/x.ogg".into(),
            kind: MediaKind::Voice,
            mime: "audio/ogg".into(),
            name: "note.ogg".into(),
            caption: Some("listen **now**".into()),
        };
        let c = file_content(&file, "mxc://x/y", 12);
        assert_eq!(c["msgtype"], "m.audio");
        assert_eq!(c["org.matrix.msc3245.voice"], json!({}));
        assert_eq!(c["body"], "listen **now**");
        assert_eq!(c["filename"], "note.ogg");
        assert_eq!(c["info"], json!({ "mimetype": "audio/ogg", "size": 12 }));
        assert!(
            c["formatted_body"]
                .as_str()
                .unwrap()
                .contains("<strong>now</strong>")
        );
        let doc = OutboundFile {
            kind: MediaKind::Document,
            caption: None,
            ..file
        };
        let c = file_content(&doc, "mxc://x/y", 12);
        assert_eq!(c["msgtype"], "m.file");
        assert_eq!(c["body"], "note.ogg");
        assert!(c.get("org.matrix.msc3245.voice").is_none());
        assert!(c.get("formatted_body").is_none());
    }
}
