//! `media:`: the cache of photos, voice notes and files users send.

use super::*;

/// `media:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MediaConfig {
    /// The largest file accepted, in bytes; a bigger one is refused and
    /// nothing of it is kept.
    pub max_bytes: u64,
    /// The longest side, in pixels, of an image handed to a model (larger
    /// ones are downscaled, which bounds what one photo costs in tokens).
    pub image_max_px: u32,
    /// Days a cached file is kept; 0 keeps files forever.
    pub retention_days: u64,
    /// Whether images are described in words for a model without vision.
    pub describe_images: bool,
}

impl Default for MediaConfig {
    fn default() -> MediaConfig {
        MediaConfig {
            max_bytes: 20 * 1024 * 1024,
            image_max_px: 1568,
            retention_days: 7,
            describe_images: false,
        }
    }
}

/// `auxiliary:`: side models the agent calls for one job each.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AuxiliaryConfig {
    /// The model that looks at images for a main model without vision
    /// (`vision_analyze`, `media.describe_images`); a block like `model:`.
    pub vision: Option<ModelConfig>,
    /// The model that summarises long pages for `web_extract` when
    /// `web.extract.summarize` is on (else the main model); a block like
    /// `model:`.
    pub web: Option<ModelConfig>,
}

/// Which speech-to-text service transcribes voice notes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SttProvider {
    /// An OpenAI-compatible `/v1/audio/transcriptions` endpoint (OpenAI,
    /// Groq, a local faster-whisper or whisper.cpp server).
    Openai,
    /// A local program, `stt.command`, that prints the transcript.
    Command,
}

/// `stt:`: speech to text for voice notes and audio files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SttConfig {
    /// The service; unset leaves voice notes untranscribed (the agent is
    /// told so, and gets the file's path).
    pub provider: Option<SttProvider>,
    /// The server's root (`…/v1`); OpenAI's when unset.
    pub base_url: Option<String>,
    /// The model name sent to the server.
    pub model: String,
    /// The key; else `VOICE_TOOLS_OPENAI_KEY`, else `OPENAI_API_KEY`.
    pub api_key: Option<Secret>,
    /// For `command`: the program and its arguments, `{path}` standing for
    /// the audio file. It prints the transcript on standard output.
    pub command: Option<String>,
    /// Send the transcript back, so the user sees what was heard.
    pub echo_transcript: bool,
    /// Seconds a transcription may take.
    pub timeout_secs: u64,
}

impl Default for SttConfig {
    fn default() -> SttConfig {
        SttConfig {
            provider: None,
            base_url: None,
            model: "whisper-1".to_owned(),
            api_key: None,
            command: None,
            echo_transcript: false,
            timeout_secs: 120,
        }
    }
}

/// Which text-to-speech service speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TtsProvider {
    /// An OpenAI-compatible `/v1/audio/speech` endpoint (OpenAI, a local
    /// Kokoro or openedai-speech server).
    Openai,
    /// A local program, `tts.command` (piper, espeak-ng), that writes the
    /// audio to `{output}`.
    Command,
}

/// When an answer is spoken as well as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VoiceReply {
    /// Never: the agent may still call `text_to_speech`.
    #[default]
    Off,
    /// A voice note is answered with a voice note.
    VoiceOnly,
    /// Every answer.
    Always,
}

impl<'de> Deserialize<'de> for VoiceReply {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<VoiceReply, D::Error> {
        match switch_word(d)?.as_str() {
            "off" => Ok(VoiceReply::Off),
            "voice_only" => Ok(VoiceReply::VoiceOnly),
            "always" => Ok(VoiceReply::Always),
            other => Err(serde::de::Error::custom(format!(
                "expected off, voice_only or always, not `{other}`"
            ))),
        }
    }
}

/// `tts:`: text to speech.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TtsConfig {
    /// The service; unset turns speech off.
    pub provider: Option<TtsProvider>,
    /// The server's root (`…/v1`); OpenAI's when unset.
    pub base_url: Option<String>,
    /// The model name sent to the server.
    pub model: String,
    /// The voice.
    pub voice: String,
    /// The key; else `VOICE_TOOLS_OPENAI_KEY`, else `OPENAI_API_KEY`.
    pub api_key: Option<Secret>,
    /// For `command`: the program and its arguments; `{text}` stands for
    /// the text (else it is written to standard input) and `{output}` for
    /// the audio file the program writes.
    pub command: Option<String>,
    /// When answers are spoken without being asked.
    pub voice_reply: VoiceReply,
    /// Seconds a synthesis may take.
    pub timeout_secs: u64,
}

impl Default for TtsConfig {
    fn default() -> TtsConfig {
        TtsConfig {
            provider: None,
            base_url: None,
            model: "tts-1".to_owned(),
            voice: "alloy".to_owned(),
            api_key: None,
            command: None,
            voice_reply: VoiceReply::Off,
            timeout_secs: 120,
        }
    }
}

/// `image_gen:`: the `image_generate` tool's server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ImageGenConfig {
    /// An OpenAI-compatible root (`…/v1`) with `/images/generations`;
    /// unset leaves the tool out, unless a key for OpenAI is set.
    pub base_url: Option<String>,
    /// The model name sent to the server.
    pub model: String,
    /// The key; else `OPENAI_API_KEY`.
    pub api_key: Option<Secret>,
    /// Seconds a generation may take.
    pub timeout_secs: u64,
}

impl Default for ImageGenConfig {
    fn default() -> ImageGenConfig {
        ImageGenConfig {
            base_url: None,
            model: "gpt-image-1".to_owned(),
            api_key: None,
            timeout_secs: 180,
        }
    }
}
