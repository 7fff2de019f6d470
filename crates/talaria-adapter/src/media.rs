//! Files crossing the adapter line: what an inbound message carries
//! ([`Attachment`]), how the gateway fetches it ([`Download`]), and a file
//! the gateway asks an adapter to send ([`OutboundFile`]).
//!
//! An adapter never decides what a file means to the model. It says what
//! the platform claims (kind, name, type, size) and how to fetch the
//! bytes; the gateway streams them into the media cache, bounded, typed
//! from the bytes, and turns them into what the model sees. Fetching in
//! the turn rather than at intake keeps intake fast (a webhook must be
//! answered within seconds) and means a message owed after a restart is
//! fetched again rather than lost.

use std::fmt;
use std::path::PathBuf;
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncRead;

pub use talaria_core::{MediaKind, MediaRef};

/// A file that came with an inbound message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    /// What the platform says it is (a photo, a voice note). The gateway
    /// decides from the bytes; this picks the wording when they are gone.
    pub kind: MediaKind,
    /// The file's name as sent, unsanitized.
    #[serde(default)]
    pub name: Option<String>,
    /// The type the platform claims. Never trusted.
    #[serde(default)]
    pub mime: Option<String>,
    /// The size the platform claims, so a file over the limit is refused
    /// before a byte of it is fetched.
    #[serde(default)]
    pub size: Option<u64>,
    /// Where the bytes are.
    pub source: AttachmentSource,
}

/// Where an attachment's bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachmentSource {
    /// Fetched with [`crate::Adapter::download`] and this locator, which
    /// only its adapter understands (a Telegram file id, a URL, a media id).
    Remote(String),
    /// Already in the media cache: the adapter had the bytes in hand (an
    /// e-mail's MIME part) and stored them at intake.
    Cached(MediaRef),
    /// The adapter could not take it, and says why in words for the user
    /// (larger than `media.max_bytes`, a part it could not decode).
    Refused(String),
}

impl Attachment {
    /// An attachment fetched later through the adapter.
    pub fn remote(kind: MediaKind, locator: impl Into<String>) -> Attachment {
        Attachment {
            kind,
            name: None,
            mime: None,
            size: None,
            source: AttachmentSource::Remote(locator.into()),
        }
    }

    /// An attachment whose kind is guessed from what the platform claims
    /// (its type, else its name's extension), for platforms that send
    /// every file alike. The gateway still types it from its bytes.
    pub fn guessed(
        locator: impl Into<String>,
        name: Option<&str>,
        mime: Option<&str>,
        size: Option<u64>,
    ) -> Attachment {
        Attachment::remote(guess_kind(mime, name), locator)
            .named(name)
            .claiming(mime)
            .sized(size)
    }

    /// The same attachment with the name the platform gave.
    pub fn named(mut self, name: Option<impl Into<String>>) -> Attachment {
        self.name = name.map(Into::into);
        self
    }

    /// The same attachment with the type the platform claims.
    pub fn claiming(mut self, mime: Option<impl Into<String>>) -> Attachment {
        self.mime = mime.map(Into::into);
        self
    }

    /// The same attachment with the size the platform claims.
    pub fn sized(mut self, size: Option<u64>) -> Attachment {
        self.size = size;
        self
    }

    /// A short label for logs and for text the model sees when the file
    /// itself cannot be shown: `voice note`, `document report.pdf`.
    pub fn label(&self) -> String {
        let kind = match self.kind {
            MediaKind::Image => "image",
            MediaKind::Voice => "voice note",
            MediaKind::Audio => "audio",
            MediaKind::Video => "video",
            MediaKind::Document => "document",
        };
        match &self.name {
            Some(name) => format!("{kind} {name}"),
            None => kind.to_owned(),
        }
    }
}

/// A media kind from a claimed type or a file name, `Document` when
/// neither says more.
pub fn guess_kind(mime: Option<&str>, name: Option<&str>) -> MediaKind {
    let mime = mime.unwrap_or("").to_ascii_lowercase();
    let top = mime.split('/').next().unwrap_or("");
    match top {
        "image" => return MediaKind::Image,
        "audio" => return MediaKind::Audio,
        "video" => return MediaKind::Video,
        _ => {}
    }
    let ext = name
        .and_then(|n| n.rsplit_once('.'))
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "jpg" | "jpeg" | "png" | "gif" | "webp" | "heic" | "bmp" => MediaKind::Image,
        "mp3" | "m4a" | "wav" | "flac" | "aac" => MediaKind::Audio,
        "ogg" | "oga" | "opus" => MediaKind::Voice,
        "mp4" | "mov" | "webm" | "mkv" => MediaKind::Video,
        _ => MediaKind::Document,
    }
}

/// An attachment's bytes on their way in: a stream, never the whole file
/// in memory.
pub struct Download {
    /// The body.
    pub reader: Pin<Box<dyn AsyncRead + Send>>,
    /// Its length, when the platform said (`Content-Length`): a file over
    /// the limit is refused without reading it.
    pub length: Option<u64>,
}

impl fmt::Debug for Download {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Download")
            .field("length", &self.length)
            .finish_non_exhaustive()
    }
}

/// Why an attachment could not be fetched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DownloadError {
    /// The platform is unreachable or failed; a later try may work.
    #[error("the platform could not hand over the file: {0}")]
    Unavailable(String),
    /// The platform no longer has it, or will not give it (expired,
    /// deleted, forbidden).
    #[error("the file is no longer available: {0}")]
    Gone(String),
    /// The platform says it is bigger than it lets bots fetch.
    #[error("the platform does not let bots fetch a file this large: {0}")]
    TooLarge(String),
    /// This adapter cannot fetch files.
    #[error("this platform's files cannot be fetched")]
    Unsupported,
}

/// A file for an adapter to send, from an allowed root, already checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboundFile {
    /// The chat (or channel, room, address) to post in.
    pub chat_id: String,
    /// Thread or forum topic to post in.
    pub thread_id: Option<String>,
    /// The message this one answers, when the platform can show that.
    pub reply_to: Option<String>,
    /// The file on disk.
    pub path: PathBuf,
    /// What it is, from its bytes: decides photo, voice note, audio or
    /// document upload.
    pub kind: MediaKind,
    /// Its type, from its bytes.
    pub mime: String,
    /// The name shown to the recipient (sanitized).
    pub name: String,
    /// Text shown with the file, when the platform has captions.
    pub caption: Option<String>,
}

impl OutboundFile {
    /// The line sent instead of the file where a platform cannot carry
    /// it, so the recipient still learns a file was meant for them.
    pub fn fallback_text(&self, platform: &str) -> String {
        let mut text = format!(
            "📎 {} ({}; {platform} cannot carry this file)",
            self.name, self.mime
        );
        if let Some(caption) = &self.caption {
            text.push('\n');
            text.push_str(caption);
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_guessed_from_the_claimed_type_then_the_name() {
        assert_eq!(
            guess_kind(Some("image/png"), Some("x.pdf")),
            MediaKind::Image
        );
        assert_eq!(guess_kind(Some("Audio/OGG"), None), MediaKind::Audio);
        assert_eq!(guess_kind(None, Some("note.OGG")), MediaKind::Voice);
        assert_eq!(
            guess_kind(Some("application/octet-stream"), Some("a.jpeg")),
            MediaKind::Image
        );
        assert_eq!(guess_kind(None, Some("report.pdf")), MediaKind::Document);
        assert_eq!(guess_kind(None, None), MediaKind::Document);
    }

    #[test]
    fn an_attachment_round_trips_through_the_owed_rows_json() {
        let a = Attachment::guessed("file-1", Some("a.png"), Some("image/png"), Some(10));
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<Attachment>(&json).unwrap(), a);
        assert_eq!(a.label(), "image a.png");
    }
}
