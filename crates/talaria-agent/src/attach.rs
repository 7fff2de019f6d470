//! What the model receives for the files that came with a message.
//!
//! A front end (the gateway, the API server, the CLI) puts each file in
//! the media cache first; this module decides what the model gets of it:
//!
//! - an image: a native image part for a model that sees images
//!   (downscaled and re-encoded, so one photo costs a bounded number of
//!   tokens); otherwise a description by the auxiliary vision model when
//!   `media.describe_images` is on, else its path and a hint to use
//!   `vision_analyze`;
//! - a voice note or audio file: its transcript, marked as one;
//! - a text-like document or a PDF: its text, up to a bound;
//! - anything else: its path in the cache, which the file tools can open.
//!
//! Whatever could not be taken (too large, not what it claims to be, a
//! failed transcription) is said to the user as a notice and to the
//! model in words: never silence.

use std::path::Path;
use std::sync::Arc;

use talaria_core::{MediaKind, MediaRef};
use talaria_llm::Provider;
use talaria_media::{Hint, MediaCache, Stored, Transcriber};

/// The most characters of one document's text given to the model.
pub const DOC_MAX_CHARS: usize = 20_000;

/// The most characters of all documents of one message.
const DOCS_TOTAL_CHARS: usize = 60_000;

/// One file that came with a message, as the front end got it.
#[derive(Debug)]
pub struct Received {
    /// How to name it to the user and the model: `voice note`,
    /// `document report.pdf`.
    pub label: String,
    /// What the platform said it is, when it said: a "photo" whose bytes
    /// are something else is pointed out to the user.
    pub claimed: Option<MediaKind>,
    /// The cached file, or why it could not be taken (in the user's words).
    pub file: Result<Stored, String>,
}

/// What the files are turned into with.
pub struct AttachContext<'a> {
    /// The media cache (prepared images are stored in it).
    pub cache: &'a MediaCache,
    /// The longest side of an image given to a model.
    pub image_max_px: u32,
    /// Whether the model takes images.
    pub vision: bool,
    /// The auxiliary vision model, when `media.describe_images` is on.
    pub describer: Option<Arc<dyn Provider>>,
    /// Speech to text, when configured.
    pub transcriber: Option<Arc<Transcriber>>,
}

/// What the model and the user get for a message's files.
#[derive(Debug, Default)]
pub struct Digest {
    /// Lines for the model, after the user's own text.
    pub text: String,
    /// Images for a model that sees them.
    pub media: Vec<MediaRef>,
    /// Said to the user before the answer: what could not be taken.
    pub notices: Vec<String>,
    /// What was heard in voice notes and audio, for `stt.echo_transcript`.
    pub transcripts: Vec<String>,
    /// A voice note came in (a `tts.voice_reply: voice_only` answer is
    /// spoken).
    pub voice: bool,
}

impl Digest {
    /// The user row's text: the user's words, then what the files gave.
    pub fn message_text(&self, user_text: &str) -> String {
        match (user_text.trim().is_empty(), self.text.is_empty()) {
            (_, true) => user_text.to_owned(),
            (true, false) => self.text.clone(),
            (false, false) => format!("{user_text}\n\n{}", self.text),
        }
    }
}

/// Turns `received` into what the model and the user get.
pub async fn digest(received: Vec<Received>, cx: &AttachContext<'_>) -> Digest {
    let mut out = Digest::default();
    let mut doc_budget = DOCS_TOTAL_CHARS;
    for r in received {
        let stored = match r.file {
            Ok(stored) => stored,
            Err(why) => {
                out.notices
                    .push(format!("⚠️ I could not take your {}: {why}.", r.label));
                out.line(format!("[{} could not be received: {why}]", r.label));
                continue;
            }
        };
        if r.claimed == Some(MediaKind::Image) && stored.kind != MediaKind::Image {
            out.notices.push(format!(
                "⚠️ Your {} is not an image: its bytes are {}. I kept it as a file.",
                r.label, stored.mime
            ));
        }
        match stored.kind {
            MediaKind::Image => image(&mut out, &r.label, &stored, cx).await,
            MediaKind::Voice | MediaKind::Audio => {
                out.voice |= stored.kind == MediaKind::Voice;
                audio(&mut out, &r.label, &stored, cx).await
            }
            MediaKind::Document => document(&mut out, &stored, &mut doc_budget).await,
            MediaKind::Video => out.line(format!(
                "[video {} ({}) saved at {}]",
                stored.name,
                stored.mime,
                stored.path.display()
            )),
        }
    }
    out
}

impl Digest {
    fn line(&mut self, line: String) {
        if !self.text.is_empty() {
            self.text.push('\n');
        }
        self.text.push_str(&line);
    }
}

/// An image: a part for a model that sees, else words about it.
async fn image(out: &mut Digest, label: &str, stored: &Stored, cx: &AttachContext<'_>) {
    let path = stored.path.clone();
    let max_px = cx.image_max_px;
    // Decoding is CPU work, and a hostile image is refused here (its
    // dimensions are checked before any pixel is decoded).
    let prepared =
        tokio::task::spawn_blocking(move || talaria_media::prepare_image(&path, max_px)).await;
    let prepared = match prepared {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            out.notices
                .push(format!("⚠️ I could not open your {label}: {e}."));
            out.line(format!("[{label} could not be opened: {e}]"));
            return;
        }
        Err(e) => {
            tracing::error!(error = %e, "preparing an image failed");
            out.notices
                .push(format!("⚠️ I could not open your {label}."));
            return;
        }
    };
    if cx.vision {
        let hint = Hint {
            name: None,
            mime: Some(prepared.mime),
            voice: false,
        };
        match cx.cache.store(&prepared.bytes[..], hint).await {
            Ok(p) => {
                out.media.push(MediaRef {
                    kind: MediaKind::Image,
                    path: p.path,
                    mime: p.mime,
                });
                out.line(format!(
                    "[image attached; the original is saved at {}]",
                    stored.path.display()
                ));
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot store a prepared image");
                out.notices
                    .push(format!("⚠️ I could not keep your {label}: {e}."));
            }
        }
        return;
    }
    let shown = stored.path.display();
    match &cx.describer {
        Some(provider) => {
            match crate::tools::vision::describe_image(provider.as_ref(), &stored.path, max_px)
                .await
            {
                Ok(words) => out.line(format!(
                    "[image saved at {shown}, described by a vision model: {}]",
                    words.trim()
                )),
                Err(e) => {
                    tracing::warn!(error = %e, "the vision model could not describe an image");
                    out.line(format!(
                        "[image saved at {shown}; it could not be described ({e}); vision_analyze can look at it]"
                    ));
                }
            }
        }
        None => out.line(format!(
            "[image saved at {shown}; this model cannot see images: use vision_analyze to ask about it]"
        )),
    }
}

/// A voice note or audio file: its transcript.
async fn audio(out: &mut Digest, label: &str, stored: &Stored, cx: &AttachContext<'_>) {
    let shown = stored.path.display();
    let Some(stt) = &cx.transcriber else {
        out.notices.push(format!(
            "🎤 I cannot listen to your {label}: speech to text is not set up here (stt.provider)."
        ));
        out.line(format!(
            "[{label} saved at {shown}; it was not transcribed: speech to text is not configured]"
        ));
        return;
    };
    match stt.transcribe(&stored.path).await {
        Ok(words) => {
            let words = words.trim().to_owned();
            out.line(format!("[transcript of a {label}]: {words}"));
            out.transcripts.push(words);
        }
        Err(e) => {
            out.notices
                .push(format!("⚠️ I could not transcribe your {label}: {e}."));
            out.line(format!(
                "[{label} saved at {shown}; transcription failed: {e}]"
            ));
        }
    }
}

/// A document: its text when it has one, else its path.
async fn document(out: &mut Digest, stored: &Stored, budget: &mut usize) {
    let shown = stored.path.display();
    let name = &stored.name;
    if *budget == 0 {
        out.line(format!(
            "[document {name} ({}) saved at {shown}; not inlined: this message's documents already filled the space for text]",
            stored.mime
        ));
        return;
    }
    let bound = (*budget).min(DOC_MAX_CHARS);
    match talaria_media::read_document(Path::new(&stored.path), bound).await {
        Ok(doc) => {
            *budget = budget.saturating_sub(doc.text.chars().count());
            let cut = if doc.truncated {
                format!(" (cut at {bound} characters; the whole file is at {shown})")
            } else {
                String::new()
            };
            out.line(format!(
                "[document {name} ({}), its text{cut}:]\n{}\n[end of {name}]",
                stored.mime, doc.text
            ));
        }
        Err(e) => out.line(format!(
            "[file {name} ({}, {} bytes) saved at {shown}; its text cannot be read here: {e}]",
            stored.mime, stored.bytes
        )),
    }
}
