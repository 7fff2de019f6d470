//! Files in and out: which message type carries a file, and what a failed
//! fetch means.
//!
//! WhatsApp takes a file under one of four message types, each with its
//! own formats and size cap (Meta's "supported media types"): `image`
//! (JPEG, PNG; 5 MB), `audio` (AAC, AMR, MP3, MP4 audio, OGG with Opus;
//! 16 MB), `video` (MP4, 3GPP; 16 MB) and `document` (anything; 100 MB).
//! A file its kind's type cannot carry goes as a document, the way a
//! person sends a large photo uncompressed; past 100 MB nothing can.

use talaria_adapter::{DownloadError, MediaKind};

use super::api::{self, ApiError};

/// The largest file WhatsApp carries at all, as a document.
pub(crate) const MAX_DOCUMENT_BYTES: u64 = 100 * 1024 * 1024;
const MAX_IMAGE_BYTES: u64 = 5 * 1024 * 1024;
const MAX_AV_BYTES: u64 = 16 * 1024 * 1024;

/// The message type to send a file as: `image`, `audio`, `video` or
/// `document`; `None` when it is too large for any.
pub(crate) fn message_type(kind: MediaKind, mime: &str, size: u64) -> Option<&'static str> {
    let mime = mime.to_ascii_lowercase();
    let base = mime.split(';').next().unwrap_or("").trim();
    let native = match kind {
        MediaKind::Image => {
            { matches!(base, "image/jpeg" | "image/png") && size <= MAX_IMAGE_BYTES }
                .then_some("image")
        }
        MediaKind::Voice | MediaKind::Audio => matches!(
            base,
            "audio/aac" | "audio/amr" | "audio/mpeg" | "audio/mp4" | "audio/ogg"
        )
        .then_some("audio")
        .filter(|_| size <= MAX_AV_BYTES),
        MediaKind::Video => matches!(base, "video/mp4" | "video/3gpp")
            .then_some("video")
            .filter(|_| size <= MAX_AV_BYTES),
        MediaKind::Document => None,
    };
    native.or((size <= MAX_DOCUMENT_BYTES).then_some("document"))
}

/// Whether a message type shows a caption (audio does not).
pub(crate) fn has_caption(message_type: &str) -> bool {
    message_type != "audio"
}

/// Whether a locator can be a Graph media id (digits, as Graph writes
/// them), so it is safe in a URL path.
pub(crate) fn is_media_id(locator: &str) -> bool {
    !locator.is_empty() && locator.len() <= 64 && locator.chars().all(|c| c.is_ascii_digit())
}

/// What a failed `GET /{media_id}` means to the gateway. Graph answers a
/// media id it does not know (expired after 30 days, or another number's)
/// with 400 and code 100, or 404.
pub(crate) fn lookup_failed(e: &ApiError) -> DownloadError {
    let why = e.to_string();
    match (e.status(), api::graph_code(e)) {
        (_, Some(api::BAD_TOKEN)) => DownloadError::Unavailable(format!(
            "the WhatsApp Cloud access token is invalid or expired ({why})"
        )),
        (Some(s), _) if s >= 500 || s == 429 => DownloadError::Unavailable(why),
        (Some(400 | 403 | 404 | 410), _) => DownloadError::Gone(why),
        _ => DownloadError::Unavailable(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_goes_as_the_type_that_carries_it() {
        let mb = 1024 * 1024;
        assert_eq!(
            message_type(MediaKind::Image, "image/png", 10),
            Some("image")
        );
        assert_eq!(
            message_type(MediaKind::Image, "image/gif", 10),
            Some("document")
        );
        assert_eq!(
            message_type(MediaKind::Image, "image/jpeg", 6 * mb),
            Some("document")
        );
        assert_eq!(
            message_type(MediaKind::Voice, "audio/ogg; codecs=opus", 10),
            Some("audio")
        );
        assert_eq!(
            message_type(MediaKind::Audio, "audio/wav", 10),
            Some("document")
        );
        assert_eq!(
            message_type(MediaKind::Video, "video/mp4", 17 * mb),
            Some("document")
        );
        assert_eq!(
            message_type(MediaKind::Document, "application/pdf", 10),
            Some("document")
        );
        assert_eq!(
            message_type(MediaKind::Document, "application/pdf", 101 * mb),
            None
        );
        assert!(!has_caption("audio") && has_caption("document"));
    }

    #[test]
    fn only_graph_ids_are_media_ids() {
        assert!(is_media_id("1037543291543636"));
        for bad in ["", "../x", "12/34", "http://x", "abc"] {
            assert!(!is_media_id(bad), "{bad}");
        }
    }
}
