//! Files out of the self-built app: which kind of temporary media a file
//! is uploaded as, within WeCom's documented limits.
//!
//! `cgi-bin/media/upload` takes an image (JPG or PNG) up to 10 MB, a voice
//! message (AMR only) up to 2 MB, a video (MP4) up to 10 MB and any file up
//! to 20 MB, each over 5 bytes. A file that does not fit its kind's limit
//! but fits a file's (a large photo, an OGG voice note) goes as a file,
//! which every client can open; past 20 MB nothing goes, with the limit
//! named.

use talaria_adapter::{MediaKind, OutboundFile};

const MB: u64 = 1024 * 1024;

/// The largest image.
pub(crate) const MAX_IMAGE_BYTES: u64 = 10 * MB;
/// The largest voice message.
pub(crate) const MAX_VOICE_BYTES: u64 = 2 * MB;
/// The largest video.
pub(crate) const MAX_VIDEO_BYTES: u64 = 10 * MB;
/// The largest file.
pub(crate) const MAX_FILE_BYTES: u64 = 20 * MB;
/// WeCom refuses media of 5 bytes or fewer.
const MIN_BYTES: u64 = 6;

/// What a file is uploaded and sent as: the `type` of the upload, which is
/// also the message's `msgtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Image,
    Voice,
    Video,
    File,
}

impl Kind {
    /// The upload's `type` and the message's `msgtype`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Image => "image",
            Kind::Voice => "voice",
            Kind::Video => "video",
            Kind::File => "file",
        }
    }
}

/// The file's format: its name's extension, else its type's subtype.
fn format_of(file: &OutboundFile) -> String {
    match file.name.rsplit_once('.') {
        Some((_, ext)) if !ext.is_empty() => ext.to_ascii_lowercase(),
        _ => file
            .mime
            .rsplit_once('/')
            .map(|(_, sub)| sub.to_ascii_lowercase())
            .unwrap_or_default(),
    }
}

/// How `file` of `size` bytes goes out, or why it cannot.
pub(crate) fn choose(file: &OutboundFile, size: u64) -> Result<Kind, String> {
    if size < MIN_BYTES {
        return Err(format!(
            "{} is {size} bytes; WeCom takes no file of 5 bytes or fewer",
            file.name
        ));
    }
    let format = format_of(file);
    let preferred = match file.kind {
        MediaKind::Image if matches!(format.as_str(), "jpg" | "jpeg" | "png") => {
            Some((Kind::Image, MAX_IMAGE_BYTES))
        }
        MediaKind::Voice if format == "amr" => Some((Kind::Voice, MAX_VOICE_BYTES)),
        MediaKind::Video if format == "mp4" => Some((Kind::Video, MAX_VIDEO_BYTES)),
        _ => None,
    };
    match preferred {
        Some((kind, max)) if size <= max => Ok(kind),
        _ if size <= MAX_FILE_BYTES => Ok(Kind::File),
        _ => Err(format!(
            "{} is {size} bytes; WeCom takes files up to {MAX_FILE_BYTES} bytes (20 MB)",
            file.name
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(kind: MediaKind, name: &str, mime: &str) -> OutboundFile {
        OutboundFile {
            chat_id: "ww1:zhang".into(),
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
    fn each_kind_goes_as_itself_within_its_limit_and_as_a_file_beyond() {
        let png = file(MediaKind::Image, "chart.png", "image/png");
        assert_eq!(choose(&png, 100), Ok(Kind::Image));
        assert_eq!(choose(&png, MAX_IMAGE_BYTES), Ok(Kind::Image));
        assert_eq!(choose(&png, MAX_IMAGE_BYTES + 1), Ok(Kind::File));
        let gif = file(MediaKind::Image, "a.gif", "image/gif");
        assert_eq!(choose(&gif, 100), Ok(Kind::File));
        let amr = file(MediaKind::Voice, "note.amr", "audio/amr");
        assert_eq!(choose(&amr, 100), Ok(Kind::Voice));
        assert_eq!(choose(&amr, MAX_VOICE_BYTES + 1), Ok(Kind::File));
        let ogg = file(MediaKind::Voice, "note.ogg", "audio/ogg");
        assert_eq!(choose(&ogg, 100), Ok(Kind::File));
        let mp4 = file(MediaKind::Video, "clip", "video/mp4");
        assert_eq!(choose(&mp4, 100), Ok(Kind::Video));
        assert_eq!(choose(&mp4, MAX_VIDEO_BYTES + 1), Ok(Kind::File));
        let pdf = file(MediaKind::Document, "q3.pdf", "application/pdf");
        assert_eq!(choose(&pdf, MAX_FILE_BYTES), Ok(Kind::File));
        let big = choose(&pdf, MAX_FILE_BYTES + 1).unwrap_err();
        assert!(big.contains("20 MB") && big.contains("q3.pdf"), "{big}");
        let tiny = choose(&pdf, 5).unwrap_err();
        assert!(tiny.contains("5 bytes"), "{tiny}");
    }
}
