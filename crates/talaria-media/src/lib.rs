//! The media cache: the photos, voice notes and files users send, and
//! images made ready for a model.
//!
//! A platform adapter hands [`MediaCache::store`] the body of a download as
//! a stream. The bytes go to a temporary file inside the cache while they
//! are hashed and counted; only a complete file under the size limit is
//! renamed to its final name, `<sha256>.<ext>`, so the cache never holds a
//! half-written file and the same content is one file however often it is
//! sent. What a file *is* comes from its bytes, never from what the
//! platform or the sender claims: a `photo.jpg` that is a program is
//! recorded as a program.
//!
//! The agent turns a cached image into what a model accepts with
//! [`prepare_image`] (bounded decoding, downscaling, re-encoding), and the
//! gateway's maintenance calls [`MediaCache::sweep`] to forget old files.
//!
//! What is done with the files: [`read_document`] inlines a text file or a
//! PDF's text; a [`Transcriber`] turns a voice note into words (`stt:`); a
//! [`Synthesizer`] speaks an answer as a voice note (`tts:`); an
//! [`ImageGenerator`] makes an image (`image_gen:`). The local programs
//! they run (`stt.command`, `tts.command`, ffmpeg) get no shell, none of
//! Talaria's secrets, and a deadline.
//!
//! This crate knows no platform and no model: it depends on core only
//! (checked by `scripts/check-deps`), so the adapters and the agent can
//! both use it.
//!
//! # Layout
//!
//! - `cache`: [`MediaCache`], [`Hint`], [`Stored`]: streaming a file in.
//! - `sniff`: the type of a file from its first bytes, and its
//!   [`MediaKind`].
//! - `name`: [`sanitize_name`], an original file name made safe to show
//!   and to upload.
//! - `prepare`: [`prepare_image`], an image made small enough for a model.
//! - `sweep`: [`MediaCache::sweep`] and its [`SweepReport`].
//! - `document`: [`read_document`], the text of a text file or a PDF.
//! - `stt`: [`Transcriber`], speech to text.
//! - `tts`: [`Synthesizer`], text to speech, and [`audio_duration`].
//! - `image_gen`: [`ImageGenerator`], images from a prompt.
//! - `http`, `process`: what the clients of OpenAI-compatible servers and
//!   the runners of local programs share.
//! - `error`: [`MediaError`], in words a user can be shown.

#![forbid(unsafe_code)]

mod cache;
mod document;
mod error;
mod http;
mod image_gen;
mod name;
mod prepare;
mod process;
mod sniff;
mod stt;
mod sweep;
mod tts;

pub use cache::{Hint, MediaCache, Stored};
pub use document::{DocumentText, MAX_PDF_BYTES, read_document};
pub use error::{MediaError, human_bytes as human_size};
pub use image_gen::{ImageGenError, ImageGenerator};
pub use name::sanitize_name;
pub use prepare::{PreparedImage, identify, prepare_image};
pub use stt::{SttError, Transcriber};
pub use sweep::SweepReport;
pub use talaria_core::MediaKind;
pub use tts::{Speech, Synthesizer, TtsError, audio_duration};
