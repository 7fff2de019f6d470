//! Text to speech: an answer spoken, ready to send as a voice note.
//!
//! Two providers (`tts.provider`): `openai`, any server speaking OpenAI's
//! `POST /audio/speech` (OpenAI, a local Kokoro or openedai-speech
//! server), asked for Opus and streamed into the cache; and `command`, a
//! local program (piper, espeak-ng) that writes an audio file, run without
//! a shell and without Talaria's secrets.
//!
//! Chat apps show a voice note only for OGG/Opus. Whatever the provider
//! produced that is not already that is converted with `ffmpeg` when it is
//! on `PATH`; without it the audio goes out as an ordinary audio file
//! ([`Speech::voice_note`] says which).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use talaria_core::config::{TtsConfig, TtsProvider};
use talaria_core::{Env, Secret};
use tokio::io::AsyncReadExt;

use crate::cache::TEMP_PREFIX;
use crate::process::{self, Program};
use crate::{Hint, MediaCache, MediaError, MediaKind, Stored, http};

/// The longest text passed as one argument (`{text}`): Linux refuses a
/// single argument over 128 KB.
const MAX_TEXT_ARG_BYTES: usize = 100 * 1024;

/// The bitrate of a voice note: speech is clear at 24 to 32 kb/s in Opus.
const VOICE_BITRATE: &str = "32k";

/// Where speaking went wrong, in words a user can be shown.
#[derive(Debug, thiserror::Error)]
pub enum TtsError {
    /// `tts:` is set up in a way that cannot work.
    #[error("text to speech is not set up correctly: {0}")]
    Config(String),
    /// There is nothing to say.
    #[error("there is no text to speak")]
    NoText,
    /// The text is too long to pass to the program.
    #[error("the text is too long to speak at once ({bytes} bytes)")]
    TooLong {
        /// The text's length in bytes.
        bytes: usize,
    },
    /// The server could not be reached or did not answer in time.
    #[error("the speech service is unreachable: {0}")]
    Transport(String),
    /// The server refused or failed.
    #[error("the speech service refused: {0}")]
    Server(String),
    /// The local program failed, timed out or could not start.
    #[error("the speech program failed: {0}")]
    Command(String),
    /// What came back is not audio.
    #[error("the speech service produced no audio: {0}")]
    NoAudio(String),
    /// Storing the audio failed.
    #[error("the speech could not be stored: {0}")]
    Cache(#[from] MediaError),
}

/// Speech in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Speech {
    /// The audio file.
    pub stored: Stored,
    /// Whether it is OGG/Opus, which chat apps show as a voice note;
    /// otherwise it is sent as an audio file.
    pub voice_note: bool,
}

/// Speaks text, as `tts:` says.
#[derive(Debug)]
pub struct Synthesizer {
    how: How,
    timeout: Duration,
    ffmpeg: Option<PathBuf>,
}

#[derive(Debug)]
enum How {
    OpenAi {
        client: reqwest::Client,
        url: String,
        key: Option<Secret>,
        model: String,
        voice: String,
    },
    Command {
        words: Vec<String>,
    },
}

impl Synthesizer {
    /// The synthesizer `config` describes; `None` when `tts.provider` is
    /// unset. `ffmpeg` is looked up on `PATH` now.
    ///
    /// For `openai`, the key is `tts.api_key`, else `VOICE_TOOLS_OPENAI_KEY`,
    /// else `OPENAI_API_KEY`; a server of one's own (a `base_url`) may need
    /// none. For `command`, `tts.command` must be set and name `{output}`.
    pub fn from_config(config: &TtsConfig, env: &Env) -> Result<Option<Synthesizer>, TtsError> {
        let Some(provider) = config.provider else {
            return Ok(None);
        };
        let timeout = Duration::from_secs(config.timeout_secs.max(1));
        let how = match provider {
            TtsProvider::Openai => {
                let key = http::key(
                    config.api_key.as_ref(),
                    env,
                    &["VOICE_TOOLS_OPENAI_KEY", "OPENAI_API_KEY"],
                );
                if key.is_none() && config.base_url.is_none() {
                    return Err(TtsError::Config(
                        "tts.provider is openai but no key is set: set tts.api_key, \
                         VOICE_TOOLS_OPENAI_KEY or OPENAI_API_KEY (or tts.base_url for a \
                         server of your own)"
                            .to_owned(),
                    ));
                }
                How::OpenAi {
                    client: http::client(timeout).map_err(TtsError::Config)?,
                    url: format!(
                        "{}/audio/speech",
                        http::base_url(config.base_url.as_deref())
                    ),
                    key,
                    model: config.model.clone(),
                    voice: config.voice.clone(),
                }
            }
            TtsProvider::Command => {
                let line = config.command.as_deref().ok_or_else(|| {
                    TtsError::Config(
                        "tts.provider is command but tts.command is not set".to_owned(),
                    )
                })?;
                let words = process::split_command(line)
                    .map_err(|e| TtsError::Config(format!("tts.command: {e}")))?;
                if !process::mentions(&words, "{output}") {
                    return Err(TtsError::Config(
                        "tts.command must name the audio file it writes as {output}".to_owned(),
                    ));
                }
                How::Command { words }
            }
        };
        Ok(Some(Synthesizer {
            how,
            timeout,
            ffmpeg: process::which("ffmpeg"),
        }))
    }

    /// Sets the `ffmpeg` used to make voice notes; `None` turns the
    /// conversion off (the audio is then sent as it came).
    pub fn with_ffmpeg(mut self, ffmpeg: Option<PathBuf>) -> Synthesizer {
        self.ffmpeg = ffmpeg;
        self
    }

    /// `text` spoken and stored in `cache`: OGG/Opus when the provider
    /// made it or `ffmpeg` could convert it (a voice note), else the audio
    /// file as it came.
    pub async fn speak(&self, text: &str, cache: &MediaCache) -> Result<Speech, TtsError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(TtsError::NoText);
        }
        let stored = match &self.how {
            How::OpenAi {
                client,
                url,
                key,
                model,
                voice,
            } => openai(client, url, key.as_ref(), model, voice, text, cache).await?,
            How::Command { words } => self.command(words, text, cache).await?,
        };
        if !matches!(stored.kind, MediaKind::Audio | MediaKind::Voice) {
            return Err(TtsError::NoAudio(format!(
                "the result is {}, not audio",
                stored.mime
            )));
        }
        if is_ogg_opus(&stored.path).await {
            return Ok(speech(stored, true));
        }
        let Some(ffmpeg) = &self.ffmpeg else {
            return Ok(speech(stored, false));
        };
        match self.convert(ffmpeg, &stored, cache).await {
            Ok(converted) => Ok(speech(converted, true)),
            Err(e) => {
                // The audio is still worth sending, as a file.
                tracing::warn!(error = %e, "tts: cannot convert to OGG/Opus; sending the audio as is");
                Ok(speech(stored, false))
            }
        }
    }

    async fn command(
        &self,
        words: &[String],
        text: &str,
        cache: &MediaCache,
    ) -> Result<Stored, TtsError> {
        let in_argument = process::mentions(words, "{text}");
        if in_argument && text.len() > MAX_TEXT_ARG_BYTES {
            return Err(TtsError::TooLong { bytes: text.len() });
        }
        let scratch = Scratch::create(cache.dir()).await?;
        let output = OsString::from(scratch.path().join("speech.wav"));
        // A text starting with `-` would be read as an option by the
        // program (`-w /somewhere`); a leading blank changes nothing heard.
        let text_arg = if text.starts_with('-') {
            OsString::from(format!(" {text}"))
        } else {
            OsString::from(text)
        };
        let argv = process::fill(words, &[("{text}", &text_arg), ("{output}", &output)]);
        process::run(Program {
            words: argv,
            stdin: (!in_argument).then(|| text.as_bytes().to_vec()),
            max_stdout: 4096,
            timeout: self.timeout,
        })
        .await
        .map_err(|e| TtsError::Command(e.to_string()))?;
        store_file(Path::new(&output), cache).await
    }

    /// `stored` converted to mono OGG/Opus by ffmpeg, in the cache.
    async fn convert(
        &self,
        ffmpeg: &Path,
        stored: &Stored,
        cache: &MediaCache,
    ) -> Result<Stored, TtsError> {
        let scratch = Scratch::create(cache.dir()).await?;
        let output = scratch.path().join("voice.ogg");
        // `file:` so a path is never read as another protocol or option.
        let mut input = OsString::from("file:");
        input.push(&stored.path);
        let mut out_arg = OsString::from("file:");
        out_arg.push(&output);
        let argv: Vec<OsString> = vec![
            ffmpeg.into(),
            "-nostdin".into(),
            "-hide_banner".into(),
            "-loglevel".into(),
            "error".into(),
            "-y".into(),
            "-i".into(),
            input,
            "-vn".into(),
            "-map_metadata".into(),
            "-1".into(),
            "-ac".into(),
            "1".into(),
            "-ar".into(),
            "48000".into(),
            "-c:a".into(),
            "libopus".into(),
            "-b:a".into(),
            VOICE_BITRATE.into(),
            "-application".into(),
            "voip".into(),
            "-f".into(),
            "ogg".into(),
            out_arg,
        ];
        process::run(Program {
            words: argv,
            stdin: None,
            max_stdout: 4096,
            timeout: self.timeout,
        })
        .await
        .map_err(|e| TtsError::Command(e.to_string()))?;
        let converted = store_file(&output, cache).await?;
        if !is_ogg_opus(&converted.path).await {
            return Err(TtsError::NoAudio(
                "ffmpeg did not produce OGG/Opus".to_owned(),
            ));
        }
        Ok(converted)
    }
}

fn speech(mut stored: Stored, voice_note: bool) -> Speech {
    let ext = stored
        .path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("bin");
    stored.name = format!("speech.{ext}");
    Speech { stored, voice_note }
}

/// `POST {base}/audio/speech`, the answer streamed into the cache.
async fn openai(
    client: &reqwest::Client,
    url: &str,
    key: Option<&Secret>,
    model: &str,
    voice: &str,
    text: &str,
    cache: &MediaCache,
) -> Result<Stored, TtsError> {
    let body = serde_json::json!({
        "model": model,
        "input": text,
        "voice": voice,
        "response_format": "opus",
    });
    let mut request = client.post(url).json(&body);
    if let Some(key) = key {
        request = request.bearer_auth(key.expose());
    }
    let response = request
        .send()
        .await
        .map_err(|e| TtsError::Transport(http::transport_error(&e, key)))?;
    if !response.status().is_success() {
        return Err(TtsError::Server(http::error_message(response, key).await));
    }
    let claimed = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let stored = cache
        .store(
            http::body_reader(response),
            Hint {
                name: None,
                mime: claimed.as_deref(),
                voice: false,
            },
        )
        .await?;
    if stored.bytes == 0 {
        return Err(TtsError::NoAudio("the answer was empty".to_owned()));
    }
    Ok(stored)
}

/// The file a program wrote, streamed into the cache.
async fn store_file(path: &Path, cache: &MediaCache) -> Result<Stored, TtsError> {
    let file = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(TtsError::NoAudio(
                "the program wrote no file at {output}".to_owned(),
            ));
        }
        Err(e) => return Err(TtsError::NoAudio(format!("cannot read its file: {e}"))),
    };
    let stored = cache.store(file, Hint::default()).await?;
    if stored.bytes == 0 {
        return Err(TtsError::NoAudio(
            "the program wrote an empty file".to_owned(),
        ));
    }
    Ok(stored)
}

/// Whether the file is OGG with an Opus first stream: the container's
/// first page starts `OggS`, and its first packet, `OpusHead`, follows the
/// 27-byte page header and the segment table (byte 26 says how long).
async fn is_ogg_opus(path: &Path) -> bool {
    let Ok(file) = tokio::fs::File::open(path).await else {
        return false;
    };
    // The longest segment table is 255 bytes.
    let mut head = Vec::with_capacity(27 + 255 + 8);
    if file
        .take(27 + 255 + 8)
        .read_to_end(&mut head)
        .await
        .is_err()
    {
        return false;
    }
    ogg_opus_head(&head)
}

fn ogg_opus_head(head: &[u8]) -> bool {
    if !head.starts_with(b"OggS") || head.len() < 27 {
        return false;
    }
    let start = 27 + usize::from(head[26]);
    head.get(start..start + 8) == Some(b"OpusHead".as_slice())
}

/// How long the audio file at `path` plays, as `ffprobe` measures it;
/// `None` when ffprobe is missing or cannot read the file. A blocking call
/// (it waits for ffprobe): use `spawn_blocking` in async code.
pub fn audio_duration(path: &Path) -> Option<Duration> {
    let ffprobe = process::which("ffprobe")?;
    let mut input = OsString::from("file:");
    input.push(path);
    let output = std::process::Command::new(ffprobe)
        .args([
            "-v",
            "error",
            "-show_entries",
            "format=duration",
            "-of",
            "default=noprint_wrappers=1:nokey=1",
        ])
        .arg(input)
        .env_clear()
        .envs(process::kept_env())
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let secs: f64 = text.trim().parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

/// A private directory in the cache for one program's output, removed
/// with everything in it when dropped. Its name starts like the cache's
/// temporary files, so nothing takes it for content.
struct Scratch {
    path: PathBuf,
}

impl Scratch {
    async fn create(cache_dir: &Path) -> Result<Scratch, TtsError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = cache_dir.join(format!(
            "{TEMP_PREFIX}tts-{}-{n}-{nanos:09}",
            std::process::id()
        ));
        let mut builder = tokio::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        builder.mode(0o700);
        builder.create(&path).await.map_err(|source| {
            TtsError::Cache(MediaError::Cache {
                path: path.clone(),
                source,
            })
        })?;
        Ok(Scratch { path })
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Blocking, but a directory of one or two files; Drop cannot await.
        if let Err(e) = std::fs::remove_dir_all(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), error = %e, "tts: cannot remove a scratch directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use talaria_testkit::openai_media::{FakeOpenAiMedia, MediaReply};

    fn cache(dir: &tempfile::TempDir) -> MediaCache {
        MediaCache::new(dir.path().join("media"), 20 * 1024 * 1024)
    }

    /// A real WAV file: `secs` seconds of a 440 Hz tone, 16-bit mono at
    /// 16 kHz.
    fn wav(secs: f64) -> Vec<u8> {
        let rate = 16_000u32;
        let samples = (f64::from(rate) * secs) as u32;
        let data_len = samples * 2;
        let mut b = Vec::new();
        b.extend_from_slice(b"RIFF");
        b.extend_from_slice(&(36 + data_len).to_le_bytes());
        b.extend_from_slice(b"WAVEfmt ");
        b.extend_from_slice(&16u32.to_le_bytes());
        b.extend_from_slice(&1u16.to_le_bytes()); // PCM
        b.extend_from_slice(&1u16.to_le_bytes()); // mono
        b.extend_from_slice(&rate.to_le_bytes());
        b.extend_from_slice(&(rate * 2).to_le_bytes());
        b.extend_from_slice(&2u16.to_le_bytes());
        b.extend_from_slice(&16u16.to_le_bytes());
        b.extend_from_slice(b"data");
        b.extend_from_slice(&data_len.to_le_bytes());
        for i in 0..samples {
            let t = f64::from(i) / f64::from(rate);
            let v = (t * 440.0 * std::f64::consts::TAU).sin() * 8000.0;
            b.extend_from_slice(&(v as i16).to_le_bytes());
        }
        b
    }

    fn require(program: &str, package: &str) -> PathBuf {
        process::which(program).unwrap_or_else(|| {
            panic!("`{program}` is not installed: install the Debian package `{package}` (scripts/test does)")
        })
    }

    fn assert_voice_note(speech: &Speech, min: Duration, max: Duration) {
        assert!(speech.voice_note);
        let bytes = std::fs::read(&speech.stored.path).unwrap();
        assert!(bytes.starts_with(b"OggS"), "not OGG");
        assert!(bytes.windows(8).any(|w| w == b"OpusHead"), "no Opus stream");
        assert_eq!(speech.stored.mime, "audio/ogg");
        assert_eq!(speech.stored.name, "speech.ogg");
        let duration = audio_duration(&speech.stored.path).expect("ffprobe reads the voice note");
        assert!(
            duration >= min && duration <= max,
            "implausible duration {duration:?}"
        );
    }

    #[test]
    fn ogg_opus_is_read_from_the_first_page() {
        let page = |segments: u8, packet: &[u8]| {
            let mut b = b"OggS\x00\x02".to_vec();
            b.resize(26, 0);
            b.push(segments);
            b.extend(std::iter::repeat_n(0u8, usize::from(segments)));
            b.extend_from_slice(packet);
            b
        };
        assert!(ogg_opus_head(&page(1, b"OpusHead\x01")));
        assert!(ogg_opus_head(&page(3, b"OpusHead\x01")));
        assert!(!ogg_opus_head(&page(1, b"\x01vorbis")));
        assert!(!ogg_opus_head(&page(200, b"OpusHe")));
        assert!(!ogg_opus_head(b"RIFF"));
    }

    #[tokio::test]
    async fn espeak_ng_round_trip_makes_a_real_voice_note() {
        require("espeak-ng", "espeak-ng");
        require("ffmpeg", "ffmpeg");
        require("ffprobe", "ffmpeg");
        let dir = tempfile::tempdir().unwrap();
        let cache = cache(&dir);
        let config = TtsConfig {
            provider: Some(TtsProvider::Command),
            command: Some("espeak-ng -w {output} {text}".to_owned()),
            timeout_secs: 60,
            ..TtsConfig::default()
        };
        let tts = Synthesizer::from_config(&config, &Env::default())
            .unwrap()
            .unwrap();
        let speech = tts
            .speak(
                "Hello, this is Talaria speaking a short sentence for you.",
                &cache,
            )
            .await
            .unwrap();
        assert_voice_note(&speech, Duration::from_secs(1), Duration::from_secs(10));
        // The scratch directory is gone; only cached files remain.
        for entry in std::fs::read_dir(cache.dir()).unwrap() {
            let entry = entry.unwrap();
            assert!(
                entry.file_type().unwrap().is_file(),
                "{:?} left",
                entry.path()
            );
        }
    }

    #[tokio::test]
    async fn text_goes_to_stdin_without_the_placeholder() {
        require("ffmpeg", "ffmpeg");
        let dir = tempfile::tempdir().unwrap();
        let cache = cache(&dir);
        // A "speech engine" that writes its 2-second WAV only when it read
        // the text's 20 bytes on standard input.
        let tone = dir.path().join("tone.wav");
        std::fs::write(&tone, wav(2.0)).unwrap();
        let script = format!("test \"$(wc -c)\" -eq 20 && cp '{}' \"$1\"", tone.display());
        let config = TtsConfig {
            provider: Some(TtsProvider::Command),
            command: Some(format!("sh -c {} sh {{output}}", shell_quote(&script))),
            timeout_secs: 60,
            ..TtsConfig::default()
        };
        let tts = Synthesizer::from_config(&config, &Env::default())
            .unwrap()
            .unwrap();
        let speech = tts.speak("twenty bytes of text", &cache).await.unwrap();
        assert_voice_note(
            &speech,
            Duration::from_millis(1900),
            Duration::from_millis(2200),
        );
    }

    #[tokio::test]
    async fn a_text_that_looks_like_an_option_stays_text() {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache(&dir);
        let tone = dir.path().join("tone.wav");
        std::fs::write(&tone, wav(0.2)).unwrap();
        // Writes the WAV only when its first argument is not an option.
        let script = format!(
            "case \"$1\" in -*) exit 9;; esac; cp '{}' \"$2\"",
            tone.display()
        );
        let config = TtsConfig {
            provider: Some(TtsProvider::Command),
            command: Some(format!(
                "sh -c {} sh {{text}} {{output}}",
                shell_quote(&script)
            )),
            ..TtsConfig::default()
        };
        let tts = Synthesizer::from_config(&config, &Env::default())
            .unwrap()
            .unwrap()
            .with_ffmpeg(None);
        tts.speak("--help me", &cache).await.unwrap();
    }

    fn shell_quote(s: &str) -> String {
        format!("'{}'", s.replace('\'', "'\\''"))
    }

    #[tokio::test]
    async fn without_ffmpeg_the_audio_goes_as_it_came() {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache(&dir);
        let tone = dir.path().join("tone.wav");
        std::fs::write(&tone, wav(0.5)).unwrap();
        let config = TtsConfig {
            provider: Some(TtsProvider::Command),
            command: Some(format!("cp {} {{output}}", tone.display())),
            ..TtsConfig::default()
        };
        let tts = Synthesizer::from_config(&config, &Env::default())
            .unwrap()
            .unwrap()
            .with_ffmpeg(None);
        let speech = tts.speak("anything", &cache).await.unwrap();
        assert!(!speech.voice_note);
        assert_eq!(speech.stored.kind, MediaKind::Audio);
        assert_eq!(speech.stored.name, "speech.wav");
        assert_eq!(std::fs::read(&speech.stored.path).unwrap(), wav(0.5));
    }

    #[tokio::test]
    async fn openai_asks_for_opus_and_streams_it_into_the_cache() {
        let fake = FakeOpenAiMedia::start().await;
        // An OGG/Opus answer needs no conversion.
        let mut ogg = b"OggS\x00\x02".to_vec();
        ogg.resize(28, 0);
        ogg[26] = 1; // one segment: the packet starts at byte 28
        ogg.extend_from_slice(b"OpusHead\x01\x01\x38\x01\x80\xbb\x00\x00\x00\x00\x00");
        ogg.resize(50_000, 3);
        fake.push(MediaReply::speech(ogg.clone(), "audio/ogg"));
        let dir = tempfile::tempdir().unwrap();
        let cache = cache(&dir);
        let config = TtsConfig {
            provider: Some(TtsProvider::Openai),
            base_url: Some(fake.base_url()),
            voice: "nova".to_owned(),
            ..TtsConfig::default()
        };
        let env = Env::from_pairs([("OPENAI_API_KEY", "sk-tts")]);
        let tts = Synthesizer::from_config(&config, &env).unwrap().unwrap();
        let speech = tts.speak("  Good morning.  ", &cache).await.unwrap();
        assert!(speech.voice_note);
        assert_eq!(std::fs::read(&speech.stored.path).unwrap(), ogg);

        let r = &fake.requests()[0];
        assert_eq!(r.path, "/v1/audio/speech");
        assert_eq!(r.header("authorization"), Some("Bearer sk-tts"));
        assert_eq!(
            r.json,
            serde_json::json!({"model": "tts-1", "input": "Good morning.", "voice": "nova", "response_format": "opus"})
        );
    }

    #[tokio::test]
    async fn a_wav_from_the_server_is_converted() {
        require("ffmpeg", "ffmpeg");
        let fake = FakeOpenAiMedia::start().await;
        fake.push(MediaReply::speech(wav(1.5), "audio/wav"));
        let dir = tempfile::tempdir().unwrap();
        let cache = cache(&dir);
        let config = TtsConfig {
            provider: Some(TtsProvider::Openai),
            base_url: Some(fake.base_url()),
            ..TtsConfig::default()
        };
        let tts = Synthesizer::from_config(&config, &Env::default())
            .unwrap()
            .unwrap();
        let speech = tts.speak("hi", &cache).await.unwrap();
        assert_voice_note(
            &speech,
            Duration::from_millis(1400),
            Duration::from_millis(1700),
        );
    }

    #[tokio::test]
    async fn refusals_and_non_audio_are_clear_errors() {
        let fake = FakeOpenAiMedia::start().await;
        fake.push(MediaReply::error(
            400,
            "Input is too long",
            "invalid_request_error",
        ));
        fake.push(MediaReply::speech(
            b"<html>oops</html>".to_vec(),
            "text/html",
        ));
        let dir = tempfile::tempdir().unwrap();
        let cache = cache(&dir);
        let config = TtsConfig {
            provider: Some(TtsProvider::Openai),
            base_url: Some(fake.base_url()),
            ..TtsConfig::default()
        };
        let tts = Synthesizer::from_config(&config, &Env::default())
            .unwrap()
            .unwrap();
        let err = tts.speak("hi", &cache).await.unwrap_err();
        assert!(err.to_string().contains("Input is too long"), "{err}");
        let err = tts.speak("hi", &cache).await.unwrap_err();
        assert!(matches!(err, TtsError::NoAudio(_)), "{err}");
        assert!(matches!(
            tts.speak("  ", &cache).await.unwrap_err(),
            TtsError::NoText
        ));
    }

    #[tokio::test]
    async fn a_command_that_writes_nothing_or_fails_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache(&dir);
        let make = |line: &str| {
            let config = TtsConfig {
                provider: Some(TtsProvider::Command),
                command: Some(line.to_owned()),
                timeout_secs: 2,
                ..TtsConfig::default()
            };
            Synthesizer::from_config(&config, &Env::default())
                .unwrap()
                .unwrap()
        };
        let err = make("true {output}").speak("hi", &cache).await.unwrap_err();
        assert!(err.to_string().contains("wrote no file"), "{err}");
        let err = make("sh -c 'echo voice model missing >&2; exit 1' sh {output}")
            .speak("hi", &cache)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("voice model missing"), "{err}");
        let err = make("sh -c 'sleep 30' sh {output}")
            .speak("hi", &cache)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("did not finish"), "{err}");

        let no_output = TtsConfig {
            provider: Some(TtsProvider::Command),
            command: Some("espeak-ng {text}".to_owned()),
            ..TtsConfig::default()
        };
        let err = Synthesizer::from_config(&no_output, &Env::default()).unwrap_err();
        assert!(err.to_string().contains("{output}"), "{err}");
        assert!(
            Synthesizer::from_config(&TtsConfig::default(), &Env::default())
                .unwrap()
                .is_none()
        );
    }
}
