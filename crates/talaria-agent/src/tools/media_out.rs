//! Tools that make a file to send: `text_to_speech` and `image_generate`
//! (the ancestor's names and arguments).
//!
//! Each puts its file in the media cache and answers with the path and a
//! `MEDIA:<path>` line: the model writes that line in its answer and the
//! gateway sends the file (a voice note, a photo) after the text. Neither
//! sends anything itself, so a file is delivered once, through the ledger,
//! with the answer it belongs to.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;
use talaria_media::{ImageGenerator, MediaCache, Synthesizer};

use super::{Tool, ToolContext, ToolError, ToolResult, opt_str, req_str};

/// The longest text spoken in one call.
const MAX_SPEECH_CHARS: usize = 4096;

/// The longest image prompt accepted.
const MAX_PROMPT_CHARS: usize = 4000;

/// The result both tools give: where the file is and how to send it.
fn made(path: &std::path::Path, what: &str) -> String {
    let tag = format!("MEDIA:{}", path.display());
    json!({
        "success": true,
        "file": path.display().to_string(),
        "media_tag": tag,
        "note": format!("To send the {what}, put the media_tag line on a line of its own in your answer."),
    })
    .to_string()
}

/// `text_to_speech`: speaks text with the configured `tts:` service.
pub struct TextToSpeechTool {
    tts: Arc<Synthesizer>,
    cache: MediaCache,
}

impl TextToSpeechTool {
    /// The tool, speaking with `tts` into `cache`.
    pub fn new(tts: Arc<Synthesizer>, cache: MediaCache) -> TextToSpeechTool {
        TextToSpeechTool { tts, cache }
    }
}

#[async_trait]
impl Tool for TextToSpeechTool {
    fn name(&self) -> &str {
        "text_to_speech"
    }

    fn description(&self) -> &str {
        "Turn text into speech. Returns an audio file (a voice note where the chat shows them) and the MEDIA: line that sends it with your answer."
    }

    fn parameters(&self) -> serde_json::Value {
        json!({
            "type": "object",
            "properties": {
                "text": {"type": "string", "description": "what to say"}
            },
            "required": ["text"]
        })
    }

    async fn call(&self, args: serde_json::Value, _ctx: &ToolContext) -> ToolResult {
        let text = req_str(&args, "text")?.trim();
        if text.is_empty() {
            return Err(ToolError::new("`text` must not be empty"));
        }
        if text.chars().count() > MAX_SPEECH_CHARS {
            return Err(ToolError::new(format!(
                "the text is longer than {MAX_SPEECH_CHARS} characters; speak less at once"
            )));
        }
        let speech = self
            .tts
            .speak(text, &self.cache)
            .await
            .map_err(|e| ToolError::new(format!("speech failed: {e}")))?;
        let what = if speech.voice_note {
            "voice note"
        } else {
            "audio file"
        };
        Ok(made(&speech.stored.path, what))
    }
}

/// `image_generate`: makes an image with the configured `image_gen:`
/// server.
pub struct ImageGenerateTool {
    generator: Arc<ImageGenerator>,
    cache: MediaCache,
}

impl ImageGenerateTool {
    /// The tool, generating with `generator` into `cache`.
    pub fn new(generator: Arc<ImageGenerator>, cache: MediaCache) -> ImageGenerateTool {
        ImageGenerateTool { generator, cache }
    }
}

/// The image size asked for an aspect ratio (the sizes OpenAI-compatible
/// servers accept).
fn size_of(aspect: &str) -> Result<&'static str, ToolError> {
    match aspect {
        "square" => Ok("1024x1024"),
        "landscape" => Ok("1536x1024"),
        "portrait" => Ok("1024x1536"),
        other => Err(ToolError::new(format!(
            "unknown aspect_ratio `{other}`: use landscape, square or portrait"
        ))),
    }
}

#[async_trait]
impl Tool for ImageGenerateTool {
    fn name(&self) -> &str {
        "image_generate"
    }

    fn description(&self) -> &str {
        "Generate an image from a text prompt. Returns the image file and the MEDIA: line that sends it with your answer."
    }

    fn parameters(&self) -> serde_json::Value {
        json!({
            "type": "object",
            "properties": {
                "prompt": {"type": "string", "description": "what the image shows, in detail"},
                "aspect_ratio": {
                    "type": "string",
                    "enum": ["landscape", "square", "portrait"],
                    "description": "the image's shape (default landscape)"
                }
            },
            "required": ["prompt"]
        })
    }

    async fn call(&self, args: serde_json::Value, _ctx: &ToolContext) -> ToolResult {
        let prompt = req_str(&args, "prompt")?.trim();
        if prompt.is_empty() {
            return Err(ToolError::new("`prompt` must not be empty"));
        }
        if prompt.chars().count() > MAX_PROMPT_CHARS {
            return Err(ToolError::new(format!(
                "the prompt is longer than {MAX_PROMPT_CHARS} characters"
            )));
        }
        let size = size_of(opt_str(&args, "aspect_ratio")?.unwrap_or("landscape"))?;
        let stored = self
            .generator
            .generate(prompt, Some(size), &self.cache)
            .await
            .map_err(|e| ToolError::new(format!("image generation failed: {e}")))?;
        Ok(made(&stored.path, "image"))
    }
}

/// The media tools the configuration turns on: `text_to_speech` with a
/// `tts:` service, `image_generate` with an `image_gen:` server, and
/// `vision_analyze` with an `auxiliary.vision` model. What is configured
/// but unusable comes back as a problem to show; the rest still works.
pub fn media_tools(
    config: &talaria_core::Config,
    env: &talaria_core::Env,
    home: &talaria_core::Home,
    workdir: &std::path::Path,
) -> (Vec<Arc<dyn Tool>>, Vec<String>) {
    let cache = MediaCache::for_home(home, &config.media);
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    let mut problems = Vec::new();
    match Synthesizer::from_config(&config.tts, env) {
        Ok(Some(tts)) => tools.push(Arc::new(TextToSpeechTool::new(
            Arc::new(tts),
            cache.clone(),
        ))),
        Ok(None) => {}
        Err(e) => problems.push(format!("text_to_speech is off: {e}")),
    }
    match ImageGenerator::from_config(&config.image_gen, env) {
        Ok(Some(g)) => tools.push(Arc::new(ImageGenerateTool::new(Arc::new(g), cache.clone()))),
        Ok(None) => {}
        Err(e) => problems.push(format!("image_generate is off: {e}")),
    }
    match talaria_llm::auxiliary_vision_provider(config, env) {
        Some(Ok(provider)) => tools.push(Arc::new(super::vision::VisionAnalyzeTool::new(
            provider,
            vec![cache.dir().to_path_buf(), workdir.to_path_buf()],
            config.media.image_max_px,
        ))),
        Some(Err(e)) => problems.push(format!("vision_analyze is off: {e}")),
        None => {}
    }
    (tools, problems)
}
