//! Speech to text: a voice note or audio file turned into words.
//!
//! Two providers (`stt.provider`): `openai`, any server speaking OpenAI's
//! `POST /audio/transcriptions` (OpenAI, Groq, a local faster-whisper or
//! whisper.cpp server), the file streamed from disk as a multipart part;
//! and `command`, a local program given the file's path that prints the
//! transcript, run without a shell and without Talaria's secrets.

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use reqwest::multipart::{Form, Part};
use talaria_core::config::{SttConfig, SttProvider};
use talaria_core::{Env, Secret};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_util::io::ReaderStream;

use crate::http;
use crate::process::{self, Program, RunError};
use crate::sniff::{SNIFF_BYTES, sniff};

/// The most of a command's output taken as the transcript.
const MAX_COMMAND_OUTPUT: usize = 64 * 1024;

/// The most of a server's answer read: a transcript of hours of speech.
const MAX_RESPONSE: usize = 4 * 1024 * 1024;

/// Where a transcription went wrong, in words a user can be shown.
#[derive(Debug, thiserror::Error)]
pub enum SttError {
    /// `stt:` is set up in a way that cannot work.
    #[error("speech to text is not set up correctly: {0}")]
    Config(String),
    /// The audio file could not be read.
    #[error("cannot read the audio file: {0}")]
    File(#[source] std::io::Error),
    /// The server could not be reached or did not answer in time.
    #[error("the transcription service is unreachable: {0}")]
    Transport(String),
    /// The server refused or failed.
    #[error("the transcription service refused: {0}")]
    Server(String),
    /// The server's answer was not a transcript.
    #[error("the transcription service gave an answer that cannot be read: {0}")]
    BadAnswer(String),
    /// The local program failed, timed out or could not start.
    #[error("the transcription program failed: {0}")]
    Command(String),
    /// Nothing was heard.
    #[error("no speech was recognised in the recording")]
    Empty,
}

/// Transcribes audio files, as `stt:` says.
#[derive(Debug)]
pub struct Transcriber {
    how: How,
    timeout: Duration,
}

#[derive(Debug)]
enum How {
    OpenAi {
        client: reqwest::Client,
        url: String,
        key: Option<Secret>,
        model: String,
    },
    Command {
        words: Vec<String>,
    },
}

impl Transcriber {
    /// The transcriber `config` describes; `None` when `stt.provider` is
    /// unset (voice notes then stay untranscribed).
    ///
    /// For `openai`, the key is `stt.api_key`, else `VOICE_TOOLS_OPENAI_KEY`,
    /// else `OPENAI_API_KEY`; a server of one's own (a `base_url`) may need
    /// none, OpenAI's does. For `command`, `stt.command` must be set.
    pub fn from_config(config: &SttConfig, env: &Env) -> Result<Option<Transcriber>, SttError> {
        let Some(provider) = config.provider else {
            return Ok(None);
        };
        let timeout = Duration::from_secs(config.timeout_secs.max(1));
        let how = match provider {
            SttProvider::Openai => {
                let key = http::key(
                    config.api_key.as_ref(),
                    env,
                    &["VOICE_TOOLS_OPENAI_KEY", "OPENAI_API_KEY"],
                );
                if key.is_none() && config.base_url.is_none() {
                    return Err(SttError::Config(
                        "stt.provider is openai but no key is set: set stt.api_key, \
                         VOICE_TOOLS_OPENAI_KEY or OPENAI_API_KEY (or stt.base_url for a \
                         server of your own)"
                            .to_owned(),
                    ));
                }
                How::OpenAi {
                    client: http::client(timeout).map_err(SttError::Config)?,
                    url: format!(
                        "{}/audio/transcriptions",
                        http::base_url(config.base_url.as_deref())
                    ),
                    key,
                    model: config.model.clone(),
                }
            }
            SttProvider::Command => {
                let line = config.command.as_deref().ok_or_else(|| {
                    SttError::Config(
                        "stt.provider is command but stt.command is not set".to_owned(),
                    )
                })?;
                let words = process::split_command(line)
                    .map_err(|e| SttError::Config(format!("stt.command: {e}")))?;
                How::Command { words }
            }
        };
        Ok(Some(Transcriber { how, timeout }))
    }

    /// The words spoken in the audio file at `path`, trimmed; an empty
    /// transcript is [`SttError::Empty`].
    pub async fn transcribe(&self, path: &Path) -> Result<String, SttError> {
        let text = match &self.how {
            How::OpenAi {
                client,
                url,
                key,
                model,
            } => openai(client, url, key.as_ref(), model, path).await?,
            How::Command { words } => self.command(words, path).await?,
        };
        let text = text.trim();
        if text.is_empty() {
            return Err(SttError::Empty);
        }
        Ok(text.to_owned())
    }

    async fn command(&self, words: &[String], path: &Path) -> Result<String, SttError> {
        let path = OsString::from(path);
        let mut argv = process::fill(words, &[("{path}", &path)]);
        if !process::mentions(words, "{path}") {
            // A command without the placeholder gets the file last, the
            // way most transcribers take it.
            argv.push(path);
        }
        let out = process::run(Program {
            words: argv,
            stdin: None,
            max_stdout: MAX_COMMAND_OUTPUT,
            timeout: self.timeout,
        })
        .await
        .map_err(command_error)?;
        let mut bytes = out.stdout;
        if out.truncated {
            tracing::debug!("stt: the command's output was cut at {MAX_COMMAND_OUTPUT} bytes");
            // Cut on a character boundary.
            let valid = match std::str::from_utf8(&bytes) {
                Ok(_) => bytes.len(),
                Err(e) => e.valid_up_to(),
            };
            bytes.truncate(valid);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

fn command_error(e: RunError) -> SttError {
    SttError::Command(e.to_string())
}

/// `POST {base}/audio/transcriptions`: the file streamed from disk under
/// its own name and type, the model, JSON asked for.
async fn openai(
    client: &reqwest::Client,
    url: &str,
    key: Option<&Secret>,
    model: &str,
    path: &Path,
) -> Result<String, SttError> {
    let mut file = tokio::fs::File::open(path).await.map_err(SttError::File)?;
    let len = file.metadata().await.map_err(SttError::File)?.len();
    // The type from the first bytes: servers decide the decoder from the
    // name's extension and the part's type.
    let mut head = vec![0u8; SNIFF_BYTES];
    let mut got = 0;
    while got < head.len() {
        let n = file.read(&mut head[got..]).await.map_err(SttError::File)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    head.truncate(got);
    let what = sniff(&head, false);
    file.seek(std::io::SeekFrom::Start(0))
        .await
        .map_err(SttError::File)?;
    let name = upload_name(path, what.ext);
    let part = Part::stream_with_length(reqwest::Body::wrap_stream(ReaderStream::new(file)), len)
        .file_name(name)
        .mime_str(what.mime)
        .map_err(|e| SttError::Config(e.to_string()))?;
    let form = Form::new()
        .part("file", part)
        .text("model", model.to_owned())
        .text("response_format", "json");
    let mut request = client.post(url).multipart(form);
    if let Some(key) = key {
        request = request.bearer_auth(key.expose());
    }
    let response = request
        .send()
        .await
        .map_err(|e| SttError::Transport(http::transport_error(&e, key)))?;
    if !response.status().is_success() {
        return Err(SttError::Server(http::error_message(response, key).await));
    }
    let body = http::read_bounded(response, MAX_RESPONSE)
        .await
        .ok_or_else(|| SttError::BadAnswer("the answer is too long or broke off".to_owned()))?;
    #[derive(serde::Deserialize)]
    struct Transcription {
        text: String,
    }
    let parsed: Transcription = serde_json::from_slice(&body)
        .map_err(|e| SttError::BadAnswer(format!("expected JSON with `text`: {e}")))?;
    Ok(parsed.text)
}

/// The name the file is uploaded under: the cache's `<sha256>.<ext>` is
/// fine, but a file without a known extension gets the sniffed one.
fn upload_name(path: &Path, ext: &str) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let has_ext = Path::new(&name)
        .extension()
        .is_some_and(|e| !e.is_empty() && e != "bin");
    if name.is_empty() {
        format!("audio.{ext}")
    } else if has_ext {
        name
    } else {
        format!("{name}.{ext}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use talaria_testkit::openai_media::{FakeOpenAiMedia, MediaReply};

    fn config(provider: SttProvider) -> SttConfig {
        SttConfig {
            provider: Some(provider),
            ..SttConfig::default()
        }
    }

    /// An OGG/Opus voice note's first bytes, and some more.
    fn voice_note(dir: &tempfile::TempDir) -> std::path::PathBuf {
        let mut b = b"OggS\x00\x02".to_vec();
        b.resize(28, 0);
        b.extend_from_slice(b"OpusHead\x01\x01\x38\x01\x80\xbb\x00\x00\x00\x00\x00");
        b.resize(100_000, 7);
        let path = dir.path().join("0123abcd.ogg");
        std::fs::write(&path, b).unwrap();
        path
    }

    #[test]
    fn unset_provider_means_no_transcriber_and_bad_setups_say_why() {
        let env = Env::from_pairs([("OPENAI_API_KEY", "sk-x")]);
        assert!(
            Transcriber::from_config(&SttConfig::default(), &env)
                .unwrap()
                .is_none()
        );
        let err =
            Transcriber::from_config(&config(SttProvider::Openai), &Env::default()).unwrap_err();
        assert!(err.to_string().contains("VOICE_TOOLS_OPENAI_KEY"), "{err}");
        let err = Transcriber::from_config(&config(SttProvider::Command), &env).unwrap_err();
        assert!(err.to_string().contains("stt.command"), "{err}");
        let mut unbalanced = config(SttProvider::Command);
        unbalanced.command = Some("whisper 'oops".to_owned());
        assert!(Transcriber::from_config(&unbalanced, &env).is_err());
    }

    #[tokio::test]
    async fn openai_uploads_the_file_as_multipart_with_the_key() {
        let fake = FakeOpenAiMedia::start().await;
        fake.push(MediaReply::transcript("  hello from the voice note \n"));
        let dir = tempfile::tempdir().unwrap();
        let path = voice_note(&dir);
        let mut cfg = config(SttProvider::Openai);
        cfg.base_url = Some(fake.base_url());
        cfg.model = "whisper-large-v3".to_owned();
        // The second variable in line is used when the first is absent.
        let env = Env::from_pairs([("OPENAI_API_KEY", "sk-stt-key")]);
        let stt = Transcriber::from_config(&cfg, &env).unwrap().unwrap();
        assert_eq!(
            stt.transcribe(&path).await.unwrap(),
            "hello from the voice note"
        );

        let reqs = fake.requests();
        assert_eq!(reqs.len(), 1);
        let r = &reqs[0];
        assert_eq!(r.path, "/v1/audio/transcriptions");
        assert_eq!(r.header("authorization"), Some("Bearer sk-stt-key"));
        assert_eq!(r.field("model"), Some("whisper-large-v3"));
        assert_eq!(r.field("response_format"), Some("json"));
        let file = r.file.as_ref().unwrap();
        assert_eq!(file.name, "0123abcd.ogg");
        assert_eq!(file.content_type, "audio/ogg");
        assert_eq!(file.len, 100_000);
        let expected = {
            use sha2::Digest;
            let bytes = std::fs::read(&path).unwrap();
            format!("{:x}", sha2::Sha256::digest(&bytes))
        };
        assert_eq!(file.sha256, expected);
    }

    #[tokio::test]
    async fn the_voice_key_wins_over_the_general_one() {
        let fake = FakeOpenAiMedia::start().await;
        fake.push(MediaReply::transcript("hi"));
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(SttProvider::Openai);
        cfg.base_url = Some(fake.base_url());
        let env = Env::from_pairs([
            ("OPENAI_API_KEY", "sk-general"),
            ("VOICE_TOOLS_OPENAI_KEY", "sk-voice"),
        ]);
        let stt = Transcriber::from_config(&cfg, &env).unwrap().unwrap();
        stt.transcribe(&voice_note(&dir)).await.unwrap();
        assert_eq!(
            fake.requests()[0].header("authorization"),
            Some("Bearer sk-voice")
        );
    }

    #[tokio::test]
    async fn the_servers_error_is_surfaced_without_the_key() {
        let fake = FakeOpenAiMedia::start().await;
        fake.push(MediaReply::error(
            401,
            "Incorrect API key provided: sk-secret-abcdefghijkl. You can find your API key at …",
            "invalid_request_error",
        ));
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(SttProvider::Openai);
        cfg.base_url = Some(fake.base_url());
        cfg.api_key = Some(Secret::new("sk-secret-abcdefghijkl"));
        let stt = Transcriber::from_config(&cfg, &Env::default())
            .unwrap()
            .unwrap();
        let err = stt.transcribe(&voice_note(&dir)).await.unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, SttError::Server(_)), "{text}");
        assert!(text.contains("401"), "{text}");
        assert!(text.contains("Incorrect API key provided"), "{text}");
        assert!(!text.contains("abcdefghijkl"), "{text}");
    }

    #[tokio::test]
    async fn an_empty_transcript_is_an_error() {
        let fake = FakeOpenAiMedia::start().await;
        fake.push(MediaReply::transcript("   "));
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(SttProvider::Openai);
        cfg.base_url = Some(fake.base_url());
        let stt = Transcriber::from_config(&cfg, &Env::default())
            .unwrap()
            .unwrap();
        let err = stt.transcribe(&voice_note(&dir)).await.unwrap_err();
        assert!(matches!(err, SttError::Empty));
        assert_eq!(err.to_string(), "no speech was recognised in the recording");
    }

    #[tokio::test]
    async fn a_slow_server_times_out() {
        let fake = FakeOpenAiMedia::start().await;
        fake.push(MediaReply::transcript("late").with_delay(Duration::from_secs(5)));
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(SttProvider::Openai);
        cfg.base_url = Some(fake.base_url());
        cfg.timeout_secs = 1;
        let stt = Transcriber::from_config(&cfg, &Env::default())
            .unwrap()
            .unwrap();
        let err = stt.transcribe(&voice_note(&dir)).await.unwrap_err();
        assert!(matches!(err, SttError::Transport(_)), "{err}");
        assert!(err.to_string().contains("in time"), "{err}");
    }

    fn command_transcriber(line: &str) -> Transcriber {
        let mut cfg = config(SttProvider::Command);
        cfg.command = Some(line.to_owned());
        cfg.timeout_secs = 2;
        Transcriber::from_config(&cfg, &Env::default())
            .unwrap()
            .unwrap()
    }

    #[tokio::test]
    async fn a_command_gets_the_path_as_one_argument() {
        let dir = tempfile::tempdir().unwrap();
        // A path with a space and shell syntax: still one argument.
        let path = dir.path().join("voice note; echo pwned.ogg");
        std::fs::write(&path, b"audio").unwrap();
        // Prints its argument count, then the file's content.
        let stt = command_transcriber("sh -c 'echo \"$#\"; cat \"$1\"' sh {path}");
        let text = stt.transcribe(&path).await.unwrap();
        assert_eq!(text, "1\naudio");
    }

    #[tokio::test]
    async fn a_command_sees_no_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let path = voice_note(&dir);
        // OPENAI_API_KEY may be set in the test's environment or not; the
        // child must see neither it nor anything but the kept variables.
        let stt =
            command_transcriber("sh -c 'env | cut -d= -f1 | sort | tr \"\\n\" \" \"' sh {path}");
        let text = stt.transcribe(&path).await.unwrap();
        for name in text.split_whitespace() {
            assert!(
                [
                    "PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PWD", "SHLVL", "_"
                ]
                .contains(&name),
                "a child saw {name}"
            );
        }
    }

    #[tokio::test]
    async fn a_failing_command_says_why_and_a_silent_one_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = voice_note(&dir);
        let stt = command_transcriber("sh -c 'echo model file missing >&2; exit 2' sh {path}");
        let err = stt.transcribe(&path).await.unwrap_err();
        assert!(err.to_string().contains("model file missing"), "{err}");

        let stt = command_transcriber("true {path}");
        assert!(matches!(
            stt.transcribe(&path).await.unwrap_err(),
            SttError::Empty
        ));

        let stt = command_transcriber("sh -c 'sleep 30' sh {path}");
        let err = stt.transcribe(&path).await.unwrap_err();
        assert!(err.to_string().contains("did not finish"), "{err}");
    }

    #[test]
    fn upload_names_keep_a_known_extension() {
        assert_eq!(upload_name(Path::new("/c/ab.ogg"), "ogg"), "ab.ogg");
        assert_eq!(upload_name(Path::new("/c/ab.bin"), "wav"), "ab.bin.wav");
        assert_eq!(upload_name(Path::new("/c/ab"), "mp3"), "ab.mp3");
    }
}
