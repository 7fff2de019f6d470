//! The text of a document a user sends, for the model to read.
//!
//! Text-like files (notes, Markdown, CSV, JSON, code: anything whose bytes
//! are UTF-8 text) are inlined up to a bound, reading only as much of the
//! file as the bound needs. PDFs have their text extracted by
//! `pdf-extract`, off the async runtime; that crate parses whatever the
//! sender made, and may panic on a malformed file, so it runs on the
//! blocking pool, where a panic ends the task and becomes an error here,
//! never a crash of the gateway. Anything else is refused with
//! [`MediaError::NotADocument`]: the caller hands the agent the file's
//! path instead.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::MediaError;
use crate::sniff::{SNIFF_BYTES, sniff};

/// The largest PDF whose text is extracted: the extractor holds the whole
/// file in memory, and the cache's own limit is 20 MB by default.
pub const MAX_PDF_BYTES: u64 = 64 * 1024 * 1024;

/// The text of a document, possibly cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentText {
    /// The text, at most `max_chars` characters.
    pub text: String,
    /// Whether the document holds more than `text`.
    pub truncated: bool,
}

/// The text of the document at `path`, at most `max_chars` characters.
///
/// What the file is comes from its bytes, not its name: UTF-8 text is
/// read directly (never more than `max_chars` characters' worth of bytes),
/// a PDF has its text extracted on the blocking pool (up to
/// [`MAX_PDF_BYTES`]); a PDF without text is [`MediaError::PdfNoText`], a
/// broken one [`MediaError::BadPdf`], anything else
/// [`MediaError::NotADocument`].
pub async fn read_document(path: &Path, max_chars: usize) -> Result<DocumentText, MediaError> {
    let owned = path.to_owned();
    guarded(path, move || read_blocking(&owned, max_chars)).await
}

/// Runs `work` on the blocking pool: file reads are blocking calls and the
/// PDF parse is CPU work, one trip for both; and a panic inside stays
/// there, turned into [`MediaError::BadPdf`].
async fn guarded<F>(path: &Path, work: F) -> Result<DocumentText, MediaError>
where
    F: FnOnce() -> Result<DocumentText, MediaError> + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(e) if e.is_panic() => {
            tracing::warn!(path = %path.display(), "media: the PDF reader panicked");
            Err(MediaError::BadPdf(
                "the file is malformed in a way the reader cannot handle".to_owned(),
            ))
        }
        Err(e) => Err(MediaError::Cache {
            path: path.to_owned(),
            source: std::io::Error::other(e),
        }),
    }
}

fn read_blocking(path: &Path, max_chars: usize) -> Result<DocumentText, MediaError> {
    let mut file = std::fs::File::open(path).map_err(|e| io_error(path, e))?;
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    (&mut file)
        .take(SNIFF_BYTES as u64)
        .read_to_end(&mut head)
        .map_err(|e| io_error(path, e))?;
    let what = sniff(&head, false);
    if what.mime == "application/pdf" {
        return read_pdf(path, file, head, max_chars);
    }
    if is_text(what.mime, &head) {
        return read_text(path, head, file, max_chars);
    }
    Err(MediaError::NotADocument {
        what: what.mime.to_owned(),
    })
}

/// Whether a file is text to inline: plain text, or a text format the
/// sniffer names by its look (HTML, XML, a shell script, JSON), as long as
/// its first bytes are UTF-8 without NULs. Source code is all of these.
fn is_text(mime: &str, head: &[u8]) -> bool {
    let text_like = mime.starts_with("text/")
        || matches!(
            mime,
            "application/json" | "application/xml" | "application/javascript"
        );
    text_like
        && !head.contains(&0)
        && match std::str::from_utf8(head) {
            Ok(_) => true,
            // The head may end inside a character.
            Err(e) => e.error_len().is_none(),
        }
}

/// Text: the head already read, then only as many more bytes as
/// `max_chars` characters can take (4 bytes each at most in UTF-8), plus
/// one to tell whether there is more.
fn read_text(
    path: &Path,
    mut bytes: Vec<u8>,
    file: std::fs::File,
    max_chars: usize,
) -> Result<DocumentText, MediaError> {
    let limit = max_chars.saturating_mul(4);
    if bytes.len() <= limit {
        let more = (limit - bytes.len()) as u64 + 1;
        file.take(more)
            .read_to_end(&mut bytes)
            .map_err(|e| io_error(path, e))?;
    }
    let mut truncated = bytes.len() > limit;
    bytes.truncate(limit);
    let text = decode_utf8(&bytes);
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let (text, cut) = cut_chars(text, max_chars);
    truncated |= cut;
    Ok(DocumentText { text, truncated })
}

/// UTF-8 that may end inside a character (the read stopped there) or hold
/// a stray invalid byte further on (shown as `�`).
fn decode_utf8(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(e) if e.error_len().is_none() => {
            String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned()
        }
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// `text` cut to `max` characters, and whether it was cut.
fn cut_chars(text: &str, max: usize) -> (String, bool) {
    match text.char_indices().nth(max) {
        Some((at, _)) => (text[..at].to_owned(), true),
        None => (text.to_owned(), false),
    }
}

fn read_pdf(
    path: &Path,
    file: std::fs::File,
    mut bytes: Vec<u8>,
    max_chars: usize,
) -> Result<DocumentText, MediaError> {
    file.take(MAX_PDF_BYTES + 1 - bytes.len() as u64)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(path, e))?;
    if bytes.len() as u64 > MAX_PDF_BYTES {
        return Err(MediaError::TooLarge {
            limit: MAX_PDF_BYTES,
        });
    }
    let text = pdf_extract::extract_text_from_mem(&bytes)
        .map_err(|e| MediaError::BadPdf(short(&e.to_string())))?;
    let text = tidy(&text);
    if text.is_empty() {
        return Err(MediaError::PdfNoText);
    }
    let (text, truncated) = cut_chars(&text, max_chars);
    Ok(DocumentText { text, truncated })
}

/// The extractor's text without its runs of blank lines and trailing
/// blanks, which cost tokens and say nothing.
fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank_run = 0;
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank_run += 1;
            if blank_run > 1 || out.is_empty() {
                continue;
            }
        } else {
            blank_run = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.trim_end().to_owned()
}

/// A parser's message cut to something a person reads.
fn short(message: &str) -> String {
    const MAX: usize = 200;
    let mut s: String = message
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX)
        .collect();
    if message.chars().count() > MAX {
        s.push('…');
    }
    s
}

fn io_error(path: &Path, source: std::io::Error) -> MediaError {
    MediaError::Cache {
        path: PathBuf::from(path),
        source,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A one-page PDF showing `lines` (the testkit's builder).
    pub(crate) fn pdf_with_text(lines: &[&str]) -> Vec<u8> {
        talaria_testkit::pdf::with_text(lines)
    }

    fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[tokio::test]
    async fn a_text_file_is_inlined_whatever_its_name() {
        let dir = tempfile::tempdir().unwrap();
        // Named like a picture, but the bytes are CSV.
        let path = write(&dir, "data.jpg", "name,city\nZoë,Zürich\n".as_bytes());
        let doc = read_document(&path, 1000).await.unwrap();
        assert_eq!(doc.text, "name,city\nZoë,Zürich\n");
        assert!(!doc.truncated);
    }

    #[tokio::test]
    async fn code_and_markup_are_text_too() {
        let dir = tempfile::tempdir().unwrap();
        for (name, body) in [
            ("deploy", "#!/bin/sh\nset -e\necho deploying\n"),
            ("page", "<!DOCTYPE html>\n<html><body>Hi</body></html>\n"),
            ("feed", "<?xml version=\"1.0\"?>\n<feed/>\n"),
            ("config", "{\"retries\": 3, \"name\": \"talaria\"}\n"),
            ("main", "fn main() {\n    println!(\"hi\");\n}\n"),
        ] {
            let path = write(&dir, name, body.as_bytes());
            let doc = read_document(&path, 1000).await.unwrap();
            assert_eq!(doc.text, body, "{name}");
        }
    }

    #[tokio::test]
    async fn a_large_text_file_is_cut_at_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        // 2 MB of text of two-byte characters.
        let body = "é".repeat(1024 * 1024);
        let path = write(&dir, "big.md", body.as_bytes());
        let doc = read_document(&path, 5000).await.unwrap();
        assert!(doc.truncated);
        assert_eq!(doc.text.chars().count(), 5000);
        assert!(doc.text.chars().all(|c| c == 'é'));

        // Exactly at the bound: not cut.
        let path = write(&dir, "exact.txt", "abc".as_bytes());
        let doc = read_document(&path, 3).await.unwrap();
        assert_eq!((doc.text.as_str(), doc.truncated), ("abc", false));
        let doc = read_document(&path, 2).await.unwrap();
        assert_eq!((doc.text.as_str(), doc.truncated), ("ab", true));
    }

    #[tokio::test]
    async fn a_panic_in_the_reader_is_a_clean_error() {
        let err = guarded(Path::new("x.pdf"), || panic!("the parser tripped"))
            .await
            .unwrap_err();
        assert!(matches!(err, MediaError::BadPdf(_)), "{err}");
    }

    #[test]
    fn a_character_cut_by_the_bounded_read_is_dropped() {
        assert_eq!(decode_utf8(&"aé".as_bytes()[..2]), "a");
        assert_eq!(cut_chars("héllo", 2), ("hé".to_owned(), true));
        assert_eq!(cut_chars("hé", 2), ("hé".to_owned(), false));
    }

    #[tokio::test]
    async fn a_pdf_has_its_text_extracted() {
        let dir = tempfile::tempdir().unwrap();
        let pdf = pdf_with_text(&["Quarterly report", "Revenue grew by 12 percent"]);
        let path = write(&dir, "report.bin", &pdf);
        let doc = read_document(&path, 10_000).await.unwrap();
        assert!(doc.text.contains("Quarterly report"), "{:?}", doc.text);
        assert!(
            doc.text.contains("Revenue grew by 12 percent"),
            "{:?}",
            doc.text
        );
        assert!(!doc.truncated);

        let doc = read_document(&path, 9).await.unwrap();
        assert_eq!(doc.text.chars().count(), 9);
        assert!(doc.truncated);
    }

    #[tokio::test]
    async fn a_pdf_without_text_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "scan.pdf", &pdf_with_text(&[]));
        let err = read_document(&path, 1000).await.unwrap_err();
        assert!(matches!(err, MediaError::PdfNoText), "{err}");
    }

    #[tokio::test]
    async fn a_broken_pdf_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let whole = pdf_with_text(&["Hello"]);
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("truncated", whole[..whole.len() / 2].to_vec()),
            ("header-only", b"%PDF-1.7\n".to_vec()),
            ("garbage", {
                let mut b = b"%PDF-1.4\n".to_vec();
                b.extend((0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
                b
            }),
            ("bad-xref", {
                let mut b = whole.clone();
                let at = b.len() - 20;
                b[at..at + 6].copy_from_slice(b"999999");
                b
            }),
        ];
        for (name, bytes) in cases {
            let path = write(&dir, name, &bytes);
            match read_document(&path, 1000).await {
                Err(MediaError::BadPdf(_) | MediaError::PdfNoText) => {}
                // A reader that repairs a damaged file may still find the
                // text; what matters is no panic and no garbage claim.
                Ok(doc) => assert!(doc.text.contains("Hello"), "{name}: {doc:?}"),
                Err(other) => panic!("{name}: unexpected error {other}"),
            }
        }
    }

    #[tokio::test]
    async fn anything_else_is_not_a_document() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "notes.txt", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR");
        let err = read_document(&path, 1000).await.unwrap_err();
        assert!(
            matches!(&err, MediaError::NotADocument { what } if what == "image/png"),
            "{err}"
        );
        let path = write(&dir, "blob", &[0u8, 1, 2, 3, 0xff]);
        let err = read_document(&path, 1000).await.unwrap_err();
        assert!(err.to_string().contains("not a document"), "{err}");
    }
}
