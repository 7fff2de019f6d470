//! What can go wrong with a file, said so that a user can be shown it.

use std::io;
use std::path::PathBuf;

/// Why a file was not stored, an image not prepared or a document not
/// read.
///
/// The `Display` text of each variant is meant for the person who sent the
/// file: it says what was wrong, not how the code failed.
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    /// The file is bigger than `media.max_bytes`; nothing of it was kept.
    #[error("the file is too large: the limit is {}", human_bytes(*limit))]
    TooLarge {
        /// The limit, in bytes.
        limit: u64,
    },
    /// Reading the file from the platform failed part-way; nothing of it
    /// was kept.
    #[error("the file could not be received completely: {0}")]
    Read(#[source] io::Error),
    /// The cache directory could not be written or read.
    #[error("the media cache at {path} is not usable: {source}")]
    Cache {
        /// The file or directory involved.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// The file is not an image in a format that can be read, whatever it
    /// was called.
    #[error("the file is not an image that can be opened (JPEG, PNG, GIF or WebP); it is {what}")]
    NotAnImage {
        /// What the bytes say it is, as a MIME type.
        what: String,
    },
    /// The image's dimensions (or the memory decoding it would take) are
    /// beyond what is opened: the mark of a decompression bomb.
    #[error(
        "the image is too large to open: at most {max_side} pixels on a side and {} once decoded",
        human_bytes(*max_decoded)
    )]
    ImageTooLarge {
        /// The longest side allowed, in pixels.
        max_side: u32,
        /// The most memory a decoded image may take, in bytes.
        max_decoded: u64,
    },
    /// The image is damaged or incomplete.
    #[error("the image is damaged or incomplete and cannot be read ({0})")]
    BadImage(String),
    /// Re-encoding the image failed.
    #[error("the image could not be converted for the model ({0})")]
    Encode(String),
    /// The file is neither text nor a PDF: its text cannot be read here
    /// (the agent gets its path instead).
    #[error("the file is not a document whose text can be read; it is {what}")]
    NotADocument {
        /// What the bytes say it is, as a MIME type.
        what: String,
    },
    /// The PDF is damaged, encrypted or beyond what the reader handles.
    #[error("the PDF cannot be read: {0}")]
    BadPdf(String),
    /// The PDF is readable but holds no text: scanned pages are images.
    #[error("the PDF holds no text that can be extracted (its pages may be scanned images)")]
    PdfNoText,
}

/// `20 MB`, `512 KB`, `300 bytes`: sizes as a person reads them (binary
/// units, as `media.max_bytes` is usually written in MiB).
pub fn human_bytes(n: u64) -> String {
    const KB: u64 = 1024;
    const MB: u64 = 1024 * KB;
    if n >= MB && n.is_multiple_of(MB) {
        format!("{} MB", n / MB)
    } else if n >= MB {
        format!("{:.1} MB", n as f64 / MB as f64)
    } else if n >= KB {
        format!("{} KB", n / KB)
    } else {
        format!("{n} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_a_person_writes_them() {
        assert_eq!(human_bytes(20 * 1024 * 1024), "20 MB");
        assert_eq!(human_bytes(1536 * 1024), "1.5 MB");
        assert_eq!(human_bytes(4096), "4 KB");
        assert_eq!(human_bytes(12), "12 bytes");
        let e = MediaError::TooLarge {
            limit: 20 * 1024 * 1024,
        };
        assert_eq!(e.to_string(), "the file is too large: the limit is 20 MB");
    }
}
