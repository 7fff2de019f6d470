//! The images of a request's user rows, read from the media cache when the
//! request is built.
//!
//! A transcript row refers to its photos by path ([`MediaRef`]); the bytes
//! are read here, once per request, and base64 exists only while the body
//! is serialized. Only the newest [`KEEP_IMAGES`] images go out as image
//! parts: a long chat with photos would otherwise resend all of them (and
//! pay for them) on every turn. Older ones, files the cache has forgotten
//! and files that cannot be sent become a short text placeholder, never an
//! error, so one bad file never costs the turn.

use std::borrow::Cow;
use std::io::ErrorKind as IoErrorKind;
use std::path::Path;

use base64::Engine as _;
use base64::display::Base64Display;
use base64::engine::general_purpose::STANDARD;
use serde::{Serialize, Serializer};
use talaria_core::{MediaKind, Message, Role};
use tokio::io::AsyncReadExt;

/// How many images, counting back from the newest, are sent as image parts.
pub const KEEP_IMAGES: usize = 4;

/// The largest image file sent, in bytes. The gateway downscales photos to
/// `media.image_max_px` before they reach the cache, so a file this big is
/// not a photo it prepared; it is refused rather than read whole.
pub const MAX_IMAGE_BYTES: u64 = 8 * 1024 * 1024;

/// Instead of an image older than the newest [`KEEP_IMAGES`].
pub const SENT_EARLIER: &str = "[image sent earlier]";
/// Instead of an image whose file the cache no longer has.
pub const NO_LONGER_AVAILABLE: &str = "[image no longer available]";
/// Instead of an image file over the size the provider sends.
pub const TOO_LARGE: &str = "[image too large to send]";
/// Instead of an image in a format the model APIs do not take.
pub const UNSUPPORTED: &str = "[image in a format the model cannot take]";
/// Instead of an image file that exists but could not be read.
pub const UNREADABLE: &str = "[image could not be read]";
/// Instead of every image, for a model that does not take images.
pub const NOT_SEEN: &str = "[image: this model does not see images]";

/// The image types both APIs accept as inline data.
const SENDABLE_TYPES: &[&str] = &["image/jpeg", "image/png", "image/gif", "image/webp"];

/// What one image of a user row becomes in a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImagePart {
    /// The file's bytes, sent as an image part.
    Image {
        /// Its type (`image/jpeg`), as the media cache sniffed it.
        mime: String,
        /// The file's content.
        bytes: Vec<u8>,
    },
    /// A short text said instead (one of this module's constants).
    Placeholder(&'static str),
}

/// The images of a request's user rows, by row.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Attachments {
    /// Indexed like the request's messages; shorter when the last rows
    /// have no images.
    rows: Vec<Vec<ImagePart>>,
}

impl Attachments {
    /// No images at all: every row is sent as its text alone.
    pub const fn none() -> Attachments {
        Attachments { rows: Vec::new() }
    }

    /// Reads the images of `messages`' user rows (media of kind `Image`;
    /// other media never become parts). The newest [`KEEP_IMAGES`] are read
    /// from disk, each bounded by `max_bytes` (at most [`MAX_IMAGE_BYTES`];
    /// a provider whose API takes less says so); the rest, and any that
    /// cannot be sent, become placeholders. With `sees_images` false, every
    /// image becomes [`NOT_SEEN`] and nothing is read.
    pub async fn load(messages: &[Message], sees_images: bool, max_bytes: u64) -> Attachments {
        let max_bytes = max_bytes.min(MAX_IMAGE_BYTES);
        let images: Vec<(usize, &talaria_core::MediaRef)> = messages
            .iter()
            .enumerate()
            .filter(|(_, m)| m.role == Role::User)
            .flat_map(|(i, m)| {
                m.media
                    .iter()
                    .filter(|r| r.kind == MediaKind::Image)
                    .map(move |r| (i, r))
            })
            .collect();
        let Some(&(last_row, _)) = images.last() else {
            return Attachments::none();
        };
        let mut rows: Vec<Vec<ImagePart>> = Vec::new();
        rows.resize_with(last_row + 1, Vec::new);
        let first_sent = images.len().saturating_sub(KEEP_IMAGES);
        for (n, (row, r)) in images.into_iter().enumerate() {
            let part = if !sees_images {
                ImagePart::Placeholder(NOT_SEEN)
            } else if n < first_sent {
                ImagePart::Placeholder(SENT_EARLIER)
            } else if !SENDABLE_TYPES.contains(&r.mime.as_str()) {
                ImagePart::Placeholder(UNSUPPORTED)
            } else {
                match read_bounded(&r.path, max_bytes).await {
                    Ok(bytes) => ImagePart::Image {
                        mime: r.mime.clone(),
                        bytes,
                    },
                    Err(p) => ImagePart::Placeholder(p),
                }
            };
            rows[row].push(part);
        }
        Attachments { rows }
    }

    /// The images of row `i` of the messages this was loaded from.
    pub fn row(&self, i: usize) -> &[ImagePart] {
        self.rows.get(i).map_or(&[], Vec::as_slice)
    }
}

/// The file at `path`, or the placeholder that says why it is not sent.
async fn read_bounded(path: &Path, max_bytes: u64) -> Result<Vec<u8>, &'static str> {
    let file = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) if e.kind() == IoErrorKind::NotFound => {
            tracing::debug!(path = %path.display(), "an image of the transcript is gone from the media cache");
            return Err(NO_LONGER_AVAILABLE);
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), "an image of the transcript cannot be opened: {e}");
            return Err(UNREADABLE);
        }
    };
    let len = match file.metadata().await {
        Ok(m) => m.len(),
        Err(e) => {
            tracing::warn!(path = %path.display(), "an image of the transcript cannot be read: {e}");
            return Err(UNREADABLE);
        }
    };
    if len > max_bytes {
        tracing::warn!(path = %path.display(), len, "an image of the transcript is over the size sent to a model");
        return Err(TOO_LARGE);
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    // Bounded again while reading: the file may have grown since.
    if let Err(e) = file.take(max_bytes + 1).read_to_end(&mut bytes).await {
        tracing::warn!(path = %path.display(), "an image of the transcript cannot be read: {e}");
        return Err(UNREADABLE);
    }
    if bytes.len() as u64 > max_bytes {
        return Err(TOO_LARGE);
    }
    Ok(bytes)
}

/// The text of a user row with its placeholders first, one a line, the way
/// the images came before the words in the chat.
pub(crate) fn text_with_placeholders<'a>(content: &'a str, parts: &[ImagePart]) -> Cow<'a, str> {
    let mut lines: Vec<&str> = parts
        .iter()
        .filter_map(|p| match p {
            ImagePart::Placeholder(t) => Some(*t),
            ImagePart::Image { .. } => None,
        })
        .collect();
    if lines.is_empty() {
        return Cow::Borrowed(content);
    }
    if !content.is_empty() {
        lines.push(content);
    }
    Cow::Owned(lines.join("\n"))
}

/// `data:<mime>;base64,<bytes>`, encoded straight into the serializer's
/// output: the base64 text is never held anywhere else.
pub(crate) struct DataUrl<'a> {
    pub(crate) mime: &'a str,
    pub(crate) bytes: &'a [u8],
}

impl Serialize for DataUrl<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!(
            "data:{};base64,{}",
            self.mime,
            Base64Display::new(self.bytes, &STANDARD)
        ))
    }
}

/// `bytes` as standard base64 (Anthropic's `data` field).
pub(crate) fn base64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use talaria_core::MediaRef;

    use super::*;

    fn image(path: PathBuf) -> MediaRef {
        MediaRef {
            kind: MediaKind::Image,
            path,
            mime: "image/png".into(),
        }
    }

    #[tokio::test]
    async fn only_the_newest_images_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut msgs = vec![Message::system("s")];
        for i in 0..6u8 {
            let p = dir.path().join(format!("{i}.png"));
            std::fs::write(&p, [i; 3]).unwrap();
            msgs.push(Message::user_with_media(
                format!("photo {i}"),
                vec![image(p)],
            ));
            msgs.push(Message::assistant("nice"));
        }
        let a = Attachments::load(&msgs, true, MAX_IMAGE_BYTES).await;
        let kinds: Vec<_> = (0..msgs.len())
            .flat_map(|i| a.row(i).to_vec())
            .map(|p| match p {
                ImagePart::Image { bytes, .. } => format!("image {}", bytes[0]),
                ImagePart::Placeholder(t) => t.to_owned(),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                SENT_EARLIER,
                SENT_EARLIER,
                "image 2",
                "image 3",
                "image 4",
                "image 5"
            ]
        );
    }

    #[tokio::test]
    async fn unsendable_files_become_placeholders() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.png");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_IMAGE_BYTES + 1).unwrap();
        let tiff = MediaRef {
            mime: "image/tiff".into(),
            ..image(dir.path().join("t.tif"))
        };
        let voice = MediaRef {
            kind: MediaKind::Voice,
            path: dir.path().join("v.ogg"),
            mime: "audio/ogg".into(),
        };
        let msgs = vec![Message::user_with_media(
            "look",
            vec![image(dir.path().join("gone.png")), image(big), tiff, voice],
        )];
        let a = Attachments::load(&msgs, true, MAX_IMAGE_BYTES).await;
        assert_eq!(
            a.row(0),
            [
                ImagePart::Placeholder(NO_LONGER_AVAILABLE),
                ImagePart::Placeholder(TOO_LARGE),
                ImagePart::Placeholder(UNSUPPORTED),
            ]
        );
        assert_eq!(
            text_with_placeholders("look", a.row(0)),
            format!("{NO_LONGER_AVAILABLE}\n{TOO_LARGE}\n{UNSUPPORTED}\nlook")
        );
        // A provider's smaller limit applies; a larger one is capped.
        let small = dir.path().join("small.png");
        std::fs::write(&small, [0u8; 100]).unwrap();
        let msgs = vec![Message::user_with_media("x", vec![image(small)])];
        let a = Attachments::load(&msgs, true, 99).await;
        assert_eq!(a.row(0), [ImagePart::Placeholder(TOO_LARGE)]);
        let a = Attachments::load(&msgs, true, 100).await;
        assert!(matches!(a.row(0), [ImagePart::Image { .. }]));
    }

    #[tokio::test]
    async fn a_blind_model_reads_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.png");
        std::fs::write(&p, b"png").unwrap();
        let msgs = vec![Message::user_with_media("x", vec![image(p)])];
        let a = Attachments::load(&msgs, false, MAX_IMAGE_BYTES).await;
        assert_eq!(a.row(0), [ImagePart::Placeholder(NOT_SEEN)]);
        assert_eq!(
            Attachments::load(&[Message::user("x")], true, MAX_IMAGE_BYTES).await,
            Attachments::none()
        );
    }

    #[test]
    fn data_url_is_encoded_in_place() {
        let url = serde_json::to_value(DataUrl {
            mime: "image/png",
            bytes: b"\x89PNG",
        })
        .unwrap();
        assert_eq!(url, "data:image/png;base64,iVBORw==");
    }
}
