//! `web_extract`'s work: a page fetched through the guard, made readable.
//!
//! HTML goes through a readability pass (`dom_smoothie`, a port of
//! Firefox's reader view) that keeps the article and writes it as
//! Markdown; a page it cannot read (too short, too many elements) falls
//! back to its visible text. PDFs have their text extracted by the media
//! crate's reader, plain text is kept as it is. Everything is bounded:
//! the bytes read ([`crate::Limits`]), the elements parsed, and the
//! characters returned.

use std::fmt;

use serde_json::json;

use crate::fetch::{FetchError, Fetcher, Oversize, human_bytes};

/// HTML elements parsed before the readability pass gives up (the visible
/// text is used instead): bounds the CPU one page costs.
const MAX_ELEMENTS: usize = 60_000;

/// A page as the model gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// Where the content came from, after redirects.
    pub url: String,
    /// The page's title, when it has one.
    pub title: Option<String>,
    /// Markdown (HTML), or text (PDF, plain text).
    pub content: String,
    /// What the content was made from: `html`, `pdf` or `text`.
    pub kind: &'static str,
    /// Whether `content` is cut: the page is longer than what is shown.
    pub truncated: bool,
    /// Characters of the whole readable text before any cut.
    pub full_chars: usize,
}

/// Why a page could not be extracted.
#[derive(Debug)]
pub enum ExtractError {
    /// The fetch failed (the guard, a limit, the server).
    Fetch(FetchError),
    /// The content is not something readable (an image, an archive).
    Unreadable(String),
    /// The Firecrawl service failed.
    Firecrawl(String),
}

impl fmt::Display for ExtractError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExtractError::Fetch(e) => e.fmt(f),
            ExtractError::Unreadable(e) => f.write_str(e),
            ExtractError::Firecrawl(e) => write!(f, "Firecrawl could not scrape it: {e}"),
        }
    }
}

impl std::error::Error for ExtractError {}

impl From<FetchError> for ExtractError {
    fn from(e: FetchError) -> ExtractError {
        ExtractError::Fetch(e)
    }
}

/// Firecrawl's scrape endpoint, for operators who prefer it (pages that
/// need JavaScript, sites that block plain clients).
#[derive(Debug, Clone)]
pub struct Firecrawl {
    /// The API's root.
    pub base_url: String,
    /// The key.
    pub key: String,
}

/// Turns URLs into readable text.
#[derive(Debug, Clone)]
pub struct Extractor {
    fetcher: Fetcher,
    max_chars: usize,
    firecrawl: Option<Firecrawl>,
    client: reqwest::Client,
}

impl Extractor {
    /// An extractor fetching through `fetcher`, returning at most
    /// `max_chars` characters a page; through Firecrawl when given.
    pub fn new(fetcher: Fetcher, max_chars: usize, firecrawl: Option<Firecrawl>) -> Extractor {
        Extractor {
            fetcher,
            max_chars,
            firecrawl,
            client: reqwest::Client::new(),
        }
    }

    /// The most characters a page returns.
    pub fn max_chars(&self) -> usize {
        self.max_chars
    }

    /// The page at `url`, readable.
    ///
    /// # Errors
    /// [`ExtractError`], each a sentence for the model.
    pub async fn extract(&self, url: &str) -> Result<Page, ExtractError> {
        if let Some(fc) = &self.firecrawl {
            // The guard applies to what the model names even when another
            // service fetches it: Firecrawl's own network is not ours to
            // open to it.
            let parsed = reqwest::Url::parse(url.trim())
                .map_err(|e| FetchError::BadUrl(format!("{url}: {e}")))?;
            self.fetcher
                .guard()
                .check_url(&parsed)
                .map_err(FetchError::Guard)?;
            if let Some(host) = parsed.host_str() {
                self.fetcher
                    .guard()
                    .resolve(host)
                    .await
                    .map_err(FetchError::Guard)?;
            }
            return self.firecrawl(fc, parsed.as_str()).await;
        }
        let fetched = self
            .fetcher
            .get(
                url,
                "text/html,application/xhtml+xml,application/pdf;q=0.9,text/plain;q=0.8,*/*;q=0.5",
                Oversize::Truncate,
            )
            .await?;
        let mime = fetched.mime();
        let kind = kind_of(mime.as_deref(), &fetched.body);
        let final_url = fetched.url.to_string();
        let (title, text) = match kind {
            "pdf" => {
                if fetched.truncated {
                    return Err(ExtractError::Unreadable(format!(
                        "the PDF is larger than {} (web.max_bytes) and a PDF cannot be read in part",
                        human_bytes(self.fetcher.limits().max_bytes)
                    )));
                }
                (None, pdf_text(&fetched.body).await?)
            }
            "html" => {
                let body = fetched.body;
                let url = final_url.clone();
                tokio::task::spawn_blocking(move || readable_html(&body, &url))
                    .await
                    .map_err(|_| {
                        ExtractError::Unreadable("the page could not be parsed".to_owned())
                    })?
            }
            "text" => (None, String::from_utf8_lossy(&fetched.body).into_owned()),
            other => {
                let declared = mime.map(|m| format!(" ({m})")).unwrap_or_default();
                return Err(ExtractError::Unreadable(format!(
                    "{final_url} is {other}{declared}, not a page or a document"
                )));
            }
        };
        let mut page = self.page(final_url, title, text, kind);
        if fetched.truncated {
            page.truncated = true;
        }
        Ok(page)
    }

    fn page(&self, url: String, title: Option<String>, text: String, kind: &'static str) -> Page {
        let text = tidy(&text);
        let full_chars = text.chars().count();
        let (content, truncated) = match text.char_indices().nth(self.max_chars) {
            Some((cut, _)) => (text[..cut].to_owned(), true),
            None => (text, false),
        };
        Page {
            url,
            title: title.filter(|t| !t.trim().is_empty()),
            content,
            kind,
            truncated,
            full_chars,
        }
    }

    async fn firecrawl(&self, fc: &Firecrawl, url: &str) -> Result<Page, ExtractError> {
        let fail = |e: String| ExtractError::Firecrawl(e);
        let response = self
            .client
            .post(format!("{}/v2/scrape", fc.base_url.trim_end_matches('/')))
            .bearer_auth(&fc.key)
            .timeout(self.fetcher.limits().timeout)
            .json(&json!({"url": url, "formats": ["markdown"], "onlyMainContent": true}))
            .send()
            .await
            .map_err(|e| fail(e.without_url().to_string()))?;
        let status = response.status();
        let body: serde_json::Value = response
            .json()
            .await
            .map_err(|e| fail(format!("HTTP {}, {}", status.as_u16(), e.without_url())))?;
        if !status.is_success() {
            let message = body
                .get("error")
                .and_then(|v| v.as_str())
                .unwrap_or("no message");
            return Err(fail(format!("HTTP {}: {message}", status.as_u16())));
        }
        let markdown = body
            .pointer("/data/markdown")
            .and_then(|v| v.as_str())
            .ok_or_else(|| fail("the answer has no markdown".to_owned()))?;
        let title = body
            .pointer("/data/metadata/title")
            .and_then(|v| v.as_str())
            .map(str::to_owned);
        Ok(self.page(url.to_owned(), title, markdown.to_owned(), "html"))
    }
}

/// What a body is: from its declared type, else from its first bytes.
fn kind_of(mime: Option<&str>, body: &[u8]) -> &'static str {
    let head = &body[..body.len().min(1024)];
    if head.starts_with(b"%PDF-") || mime == Some("application/pdf") {
        return "pdf";
    }
    match mime {
        Some("text/html" | "application/xhtml+xml") => "html",
        Some(m) if m.starts_with("text/") || m.ends_with("json") || m.ends_with("xml") => "text",
        Some(m) if !m.is_empty() && m != "application/octet-stream" => "binary content",
        _ => {
            let lower = String::from_utf8_lossy(head).to_ascii_lowercase();
            if lower.contains("<html") || lower.contains("<!doctype html") {
                "html"
            } else if std::str::from_utf8(head).is_ok() {
                "text"
            } else {
                "binary content"
            }
        }
    }
}

/// The article of an HTML page as Markdown, with its title; the page's
/// visible text when the readability pass finds no article.
fn readable_html(body: &[u8], url: &str) -> (Option<String>, String) {
    let html = String::from_utf8_lossy(body);
    let config = dom_smoothie::Config {
        max_elements_to_parse: MAX_ELEMENTS,
        text_mode: dom_smoothie::TextMode::Markdown,
        ..dom_smoothie::Config::default()
    };
    let parsed = dom_smoothie::Readability::new(html.as_ref(), Some(url), Some(config))
        .and_then(|mut r| r.parse());
    match parsed {
        Ok(article) if !article.text_content.trim().is_empty() => {
            (Some(article.title), article.text_content.to_string())
        }
        _ => (None, visible_text(&html)),
    }
}

/// Text outside tags, scripts and styles, whitespace folded by line.
fn visible_text(html: &str) -> String {
    let mut out = String::new();
    let mut rest = html;
    while let Some(open) = rest.find('<') {
        out.push_str(&rest[..open]);
        rest = &rest[open..];
        let lower: String = rest
            .chars()
            .take(8)
            .collect::<String>()
            .to_ascii_lowercase();
        let skip_to = if lower.starts_with("<script") {
            Some("</script>")
        } else if lower.starts_with("<style") {
            Some("</style>")
        } else {
            None
        };
        if let Some(end) = skip_to {
            match rest.to_ascii_lowercase().find(end) {
                Some(i) => rest = &rest[i + end.len()..],
                None => rest = "",
            }
            continue;
        }
        match rest.find('>') {
            Some(close) => {
                let tag = rest[..close].to_ascii_lowercase();
                if ["<p", "<br", "<div", "<li", "<h", "<tr", "</p", "</div"]
                    .iter()
                    .any(|t| tag.starts_with(t))
                {
                    out.push('\n');
                }
                rest = &rest[close + 1..];
            }
            None => rest = "",
        }
    }
    out.push_str(rest);
    decode_entities(&out)
}

/// Text with HTML's character references decoded in one pass (so `&amp;lt;`
/// stays `&lt;`): the common named ones and numeric ones; anything else is
/// kept as written.
pub(crate) fn decode_entities(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let decoded = rest.find(';').filter(|&end| end <= 10).and_then(|end| {
            let name = &rest[1..end];
            let c = match name {
                "amp" => Some('&'),
                "lt" => Some('<'),
                "gt" => Some('>'),
                "quot" => Some('"'),
                "apos" => Some('\''),
                "nbsp" => Some(' '),
                _ => {
                    let code = match name.strip_prefix("#x").or_else(|| name.strip_prefix("#X")) {
                        Some(hex) => u32::from_str_radix(hex, 16).ok(),
                        None => name.strip_prefix('#').and_then(|d| d.parse().ok()),
                    };
                    code.and_then(char::from_u32)
                }
            };
            c.map(|c| (c, end))
        });
        match decoded {
            Some((c, end)) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Trailing spaces gone, runs of blank lines folded to one.
fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank = 0;
    for line in text.lines() {
        let line = line.trim_end();
        if line.trim().is_empty() {
            blank += 1;
            if blank > 1 {
                continue;
            }
        } else {
            blank = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.trim().to_owned()
}

/// A fetched PDF's text, through the media crate's reader (off the
/// runtime, its panics turned into errors).
async fn pdf_text(body: &[u8]) -> Result<String, ExtractError> {
    let file = tempfile::NamedTempFile::new()
        .map_err(|e| ExtractError::Unreadable(format!("cannot hold the PDF: {e}")))?;
    tokio::fs::write(file.path(), body)
        .await
        .map_err(|e| ExtractError::Unreadable(format!("cannot hold the PDF: {e}")))?;
    let doc = talaria_media::read_document(file.path(), usize::MAX / 2)
        .await
        .map_err(|e| ExtractError::Unreadable(format!("the PDF cannot be read: {e}")))?;
    Ok(doc.text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_come_from_the_type_or_the_bytes() {
        assert_eq!(kind_of(Some("text/html"), b"x"), "html");
        assert_eq!(kind_of(None, b"%PDF-1.4"), "pdf");
        assert_eq!(kind_of(None, b"<!DOCTYPE html><html>"), "html");
        assert_eq!(kind_of(Some("application/json"), b"{}"), "text");
        assert_eq!(kind_of(Some("image/png"), b"\x89PNG"), "binary content");
        assert_eq!(kind_of(None, &[0xff, 0xfe, 0x00, 0x80]), "binary content");
    }

    #[test]
    fn entities_are_decoded_once() {
        assert_eq!(
            decode_entities("a &amp;lt; b &#39;c&#x27; &nbsp;&bogus; & d"),
            "a &lt; b 'c'  &bogus; & d"
        );
    }

    #[test]
    fn visible_text_skips_scripts_and_tags() {
        let t = visible_text(
            "<p>One</p><script>var x = '<p>';</script><style>p{}</style><div>Two &amp; three</div>",
        );
        assert_eq!(tidy(&t), "One\n\nTwo & three");
    }
}
