//! The type of a file from its first bytes.
//!
//! The platform's MIME type and the file's name are claims a sender
//! controls; the bytes are what a decoder or a program will actually see.
//! So the type is read from the bytes (`infer`'s magic numbers), and the
//! claim only chooses between two readings of the same bytes: whether an
//! OGG/Opus file is a voice note.

use infer::MatcherType;

use crate::MediaKind;

/// How many leading bytes are kept for sniffing. The formats recognised
/// here announce themselves in their first few hundred bytes; the rest is
/// room for the container formats (ZIP-based documents) that look a little
/// further in.
pub(crate) const SNIFF_BYTES: usize = 8192;

/// What the bytes say a file is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sniffed {
    /// The MIME type, `application/octet-stream` when unknown.
    pub mime: &'static str,
    /// The file name extension for the cache, `bin` when unknown.
    pub ext: &'static str,
    /// What kind of media it is.
    pub kind: MediaKind,
}

/// Reads the type from `head`, the file's first bytes (all of it when it
/// is shorter than [`SNIFF_BYTES`]).
///
/// The rule for voice notes, kept simple on purpose: an OGG file whose
/// first stream is Opus (what every chat app records voice notes as) is
/// [`MediaKind::Voice`] when the platform says it is a voice note
/// (`voice`), and [`MediaKind::Audio`] otherwise. A voice claim on
/// anything else is ignored: the bytes decide.
pub(crate) fn sniff(head: &[u8], voice: bool) -> Sniffed {
    let Some(found) = infer::get(head) else {
        return unknown_or_text(head);
    };
    // infer names OGG/Opus `audio/opus`, `.opus`; the platforms that send
    // and receive voice notes know the container instead (`audio/ogg`,
    // `.ogg`), so that is what is recorded.
    if found.mime_type() == "audio/opus" {
        return Sniffed {
            mime: "audio/ogg",
            ext: "ogg",
            kind: if voice {
                MediaKind::Voice
            } else {
                MediaKind::Audio
            },
        };
    }
    let kind = match found.matcher_type() {
        MatcherType::Image => MediaKind::Image,
        MatcherType::Audio => MediaKind::Audio,
        MatcherType::Video => MediaKind::Video,
        _ => MediaKind::Document,
    };
    Sniffed {
        mime: found.mime_type(),
        ext: found.extension(),
        kind,
    }
}

/// No magic number: text when the bytes are UTF-8 without NULs (notes,
/// Markdown, CSV, JSON and code are all this), an opaque file otherwise.
fn unknown_or_text(head: &[u8]) -> Sniffed {
    let text = !head.is_empty()
        && !head.contains(&0)
        && match std::str::from_utf8(head) {
            Ok(_) => true,
            // The head may end inside a character when the file is longer.
            Err(e) => e.error_len().is_none(),
        };
    if text {
        Sniffed {
            mime: "text/plain",
            ext: "txt",
            kind: MediaKind::Document,
        }
    } else {
        Sniffed {
            mime: "application/octet-stream",
            ext: "bin",
            kind: MediaKind::Document,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start of an OGG page whose first packet is an Opus header.
    fn ogg_opus() -> Vec<u8> {
        let mut b = b"OggS\x00\x02".to_vec();
        b.resize(28, 0);
        b.extend_from_slice(b"OpusHead\x01\x01\x38\x01\x80\xbb\x00\x00\x00\x00\x00");
        b
    }

    #[test]
    fn an_ogg_opus_file_is_a_voice_note_only_when_the_platform_says_so() {
        let voice = sniff(&ogg_opus(), true);
        assert_eq!(voice.kind, MediaKind::Voice);
        assert_eq!((voice.mime, voice.ext), ("audio/ogg", "ogg"));
        assert_eq!(sniff(&ogg_opus(), false).kind, MediaKind::Audio);
    }

    #[test]
    fn a_voice_claim_does_not_change_what_other_bytes_are() {
        let png = sniff(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", true);
        assert_eq!(
            (png.mime, png.ext, png.kind),
            ("image/png", "png", MediaKind::Image)
        );
        let pdf = sniff(b"%PDF-1.7\n", true);
        assert_eq!(
            (pdf.mime, pdf.kind),
            ("application/pdf", MediaKind::Document)
        );
    }

    #[test]
    fn text_and_opaque_bytes_without_a_magic_number() {
        assert_eq!(sniff("a,b\nç,d\n".as_bytes(), false).mime, "text/plain");
        // Cut inside the two bytes of `ç`: still text.
        assert_eq!(sniff(&"aç".as_bytes()[..2], false).mime, "text/plain");
        let opaque = sniff(&[0x13, 0x00, 0xff, 0xfe, 0x01], false);
        assert_eq!(
            (opaque.mime, opaque.ext),
            ("application/octet-stream", "bin")
        );
        assert_eq!(sniff(b"", false).ext, "bin");
    }
}
