//! `vision_analyze`: a model without vision asks an auxiliary vision model
//! (`auxiliary.vision`) one question about one image; and
//! [`describe_image`], the short description that stands in for a photo
//! when `media.describe_images` is on.
//!
//! The image must be a file inside the roots given at construction (the
//! media cache, the workspace): the tool sends a file's content to another
//! server, so the model may not point it at any file the process can read.
//! The image is prepared as the gateway prepares a photo (bounded decode,
//! downscaled to `media.image_max_px`, re-encoded), so a huge or hostile
//! file is refused here rather than sent.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;
use talaria_core::{MediaKind, MediaRef, Message};
use talaria_llm::{ChatRequest, Provider};
use tokio_util::sync::CancellationToken;

use super::{Tool, ToolContext, ToolError, ToolResult, req_str, resolve_path};

/// Longest question accepted, in characters: a question, not a document.
const MAX_QUESTION_CHARS: usize = 4_000;

/// Cap on the vision model's answer, in tokens: an answer to one question.
const ANSWER_MAX_TOKENS: u32 = 1_024;

/// What [`describe_image`] asks.
const DESCRIBE_PROMPT: &str = "Describe this image for someone who cannot see it, in at most \
     three sentences: what it shows, any text in it, and anything notable.";

/// The `vision_analyze` tool.
pub struct VisionAnalyzeTool {
    provider: Arc<dyn Provider>,
    roots: Vec<PathBuf>,
    image_max_px: u32,
}

impl VisionAnalyzeTool {
    /// The tool, asking `provider` (the `auxiliary.vision` model, as
    /// `talaria_llm::auxiliary_vision_provider` builds it: sending images) about
    /// images found inside `roots` (the media cache directory, the
    /// workspace), downscaled to `image_max_px` (`media.image_max_px`).
    pub fn new(
        provider: Arc<dyn Provider>,
        roots: Vec<PathBuf>,
        image_max_px: u32,
    ) -> VisionAnalyzeTool {
        VisionAnalyzeTool {
            provider,
            roots,
            image_max_px,
        }
    }

    /// Asks the vision model `question` about the image at `path` (already
    /// resolved against the working directory). Refuses a path outside the
    /// roots, a missing file or a file that is not an image before any
    /// request is made.
    pub async fn analyze(
        &self,
        path: &Path,
        question: &str,
        cancel: &CancellationToken,
    ) -> ToolResult {
        self.analyze_within(path, question, &self.roots, cancel)
            .await
    }

    /// [`VisionAnalyzeTool::analyze`] with other roots (a confined
    /// conversation's workspace instead of the working directory).
    async fn analyze_within(
        &self,
        path: &Path,
        question: &str,
        roots: &[PathBuf],
        cancel: &CancellationToken,
    ) -> ToolResult {
        let question = question.trim();
        if question.is_empty() {
            return Err(ToolError::new("`question` is empty: say what to look for"));
        }
        if question.chars().count() > MAX_QUESTION_CHARS {
            return Err(ToolError::new(format!(
                "`question` is too long: at most {MAX_QUESTION_CHARS} characters"
            )));
        }
        let real = allowed(path, roots).await?;
        ask(
            self.provider.as_ref(),
            &real,
            self.image_max_px,
            question,
            cancel,
        )
        .await
    }
}

/// `path` with its links resolved, when it names a file inside one of
/// the roots. Resolving first means a link inside a root that points
/// outside it is refused too.
async fn allowed(path: &Path, roots: &[PathBuf]) -> Result<PathBuf, ToolError> {
    let real = match tokio::fs::canonicalize(path).await {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ToolError::new(format!(
                "there is no file at {}",
                path.display()
            )));
        }
        Err(e) => {
            return Err(ToolError::new(format!(
                "{} cannot be opened: {e}",
                path.display()
            )));
        }
    };
    for root in roots {
        // A root that does not exist (yet) holds nothing.
        if let Ok(root) = tokio::fs::canonicalize(root).await
            && real.starts_with(&root)
        {
            if !tokio::fs::metadata(&real).await.is_ok_and(|m| m.is_file()) {
                return Err(ToolError::new(format!("{} is not a file", path.display())));
            }
            return Ok(real);
        }
    }
    let roots: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    Err(ToolError::new(format!(
        "{} is outside the places images may be read from ({}): use a file the user sent \
             or one in the workspace",
        path.display(),
        roots.join(", ")
    )))
}

#[async_trait]
impl Tool for VisionAnalyzeTool {
    fn name(&self) -> &str {
        "vision_analyze"
    }

    fn description(&self) -> &str {
        "Look at an image and answer a question about it, using a vision model. Pass the path \
         of an image the user sent (as given in the conversation) or of one in the workspace, \
         and what you want to know about it."
    }

    fn parameters(&self) -> serde_json::Value {
        json!({
            "type": "object",
            "properties": {
                "image_url": {
                    "type": "string",
                    "description": "the image: a local path (a file the user sent, or one in the workspace)"
                },
                "question": {
                    "type": "string",
                    "description": "what to find out about the image (\"describe it\", \"what does the sign say?\")"
                }
            },
            "required": ["image_url", "question"]
        })
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    async fn call(&self, args: serde_json::Value, ctx: &ToolContext) -> ToolResult {
        let raw = req_str(&args, "image_url")?.trim();
        let question = req_str(&args, "question")?;
        let lower = raw.to_ascii_lowercase();
        if ["http://", "https://", "data:"]
            .iter()
            .any(|p| lower.starts_with(p))
        {
            return Err(ToolError::new(
                "`image_url` must be a local file (one the user sent or one in the workspace); \
                 web addresses and data URLs are not fetched",
            ));
        }
        let raw = raw.strip_prefix("file://").unwrap_or(raw);
        if raw.is_empty() {
            return Err(ToolError::new("`image_url` is empty"));
        }
        match &ctx.execution.workspace {
            // A confined conversation sees its workspace and the files its
            // users sent (the media cache), never the host's working
            // directory.
            Some(ws) => {
                let in_cache = Path::new(raw).is_absolute()
                    && Path::new(raw).starts_with(ctx.home.media_dir());
                let path = if in_cache {
                    PathBuf::from(raw)
                } else {
                    resolve_path(ctx, raw)?
                };
                let roots = [ws.host().to_path_buf(), ctx.home.media_dir()];
                self.analyze_within(&path, question, &roots, &ctx.cancel)
                    .await
            }
            None => {
                let path = resolve_path(ctx, raw)?;
                self.analyze(&path, question, &ctx.cancel).await
            }
        }
    }
}

/// A short description of the image at `path`, from `provider` (the
/// `auxiliary.vision` model): what a model without vision is told instead
/// of the photo when `media.describe_images` is on. The caller has chosen
/// the file (a photo in the media cache), so no roots are checked; the
/// image is prepared to `image_max_px` as for `vision_analyze`. The error
/// says, in words a user can be shown, why there is no description.
pub async fn describe_image(
    provider: &dyn Provider,
    path: &Path,
    image_max_px: u32,
) -> Result<String, ToolError> {
    ask(
        provider,
        path,
        image_max_px,
        DESCRIBE_PROMPT,
        &CancellationToken::new(),
    )
    .await
}

/// Prepares the image at `path` and asks `provider` `question` about it.
async fn ask(
    provider: &dyn Provider,
    path: &Path,
    image_max_px: u32,
    question: &str,
    cancel: &CancellationToken,
) -> ToolResult {
    let source = path.to_path_buf();
    // Decoding is CPU work (tens of milliseconds): off the async threads.
    let prepared = tokio::task::spawn_blocking(move || prepare_to_file(&source, image_max_px))
        .await
        .map_err(|e| ToolError::new(format!("preparing the image failed: {e}")))??;
    let (mime, file) = prepared;
    let request = ChatRequest {
        messages: vec![Message::user_with_media(
            question,
            vec![MediaRef {
                kind: MediaKind::Image,
                path: file.path().to_path_buf(),
                mime: mime.to_owned(),
            }],
        )],
        tools: Vec::new(),
        max_tokens: Some(ANSWER_MAX_TOKENS),
        temperature: None,
    };
    let response = provider
        .chat(&request, &|_| {}, cancel)
        .await
        .map_err(|e| {
            tracing::warn!(provider = %provider.describe(), "vision model call failed: {e}");
            ToolError::new(format!(
                "the vision model could not answer: {}",
                e.summary()
            ))
        })?;
    // The prepared copy is only for this request.
    drop(file);
    let answer = response.message.content.trim();
    if answer.is_empty() {
        return Err(ToolError::new("the vision model gave an empty answer"));
    }
    Ok(answer.to_owned())
}

/// The image at `path`, prepared for a model and written to a temporary
/// file (which the request refers to, as a transcript row refers to the
/// media cache); the file is removed when the handle is dropped.
fn prepare_to_file(
    path: &Path,
    max_px: u32,
) -> Result<(&'static str, tempfile::NamedTempFile), ToolError> {
    use std::io::Write;
    let prepared = talaria_media::prepare_image(path, max_px)
        .map_err(|e| ToolError::new(format!("{}: {e}", path.display())))?;
    let suffix = if prepared.mime == "image/png" {
        ".png"
    } else {
        ".jpg"
    };
    let mut file = tempfile::Builder::new()
        .prefix(".talaria-vision-")
        .suffix(suffix)
        .tempfile()
        .and_then(|mut f| f.write_all(&prepared.bytes).map(|()| f))
        .map_err(|e| ToolError::new(format!("could not keep the prepared image: {e}")))?;
    file.flush()
        .map_err(|e| ToolError::new(format!("could not keep the prepared image: {e}")))?;
    Ok((prepared.mime, file))
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use talaria_core::config::VisionMode;
    use talaria_core::{Endpoint, ProviderKind};
    use talaria_llm::{HttpOptions, OpenAiProvider};
    use talaria_testkit::{MockOpenAi, Reply};

    use super::*;

    fn provider(mock: &MockOpenAi) -> Arc<dyn Provider> {
        Arc::new(OpenAiProvider::new(
            &Endpoint {
                provider: ProviderKind::Custom,
                model: "aux-vision".into(),
                base_url: mock.base_url(),
                api_key: None,
            },
            HttpOptions {
                stream: false,
                vision: VisionMode::On,
                ..HttpOptions::default()
            },
        ))
    }

    /// A 400 × 300 opaque photo (prepared as JPEG).
    fn photo(path: &Path) {
        image::RgbImage::from_fn(400, 300, |x, y| {
            image::Rgb([200, (x % 256) as u8, (y % 256) as u8])
        })
        .save(path)
        .unwrap();
    }

    struct Setup {
        dir: tempfile::TempDir,
        mock: MockOpenAi,
        tool: VisionAnalyzeTool,
    }

    async fn setup() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("media");
        let work = dir.path().join("work");
        std::fs::create_dir_all(&cache).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        let mock = MockOpenAi::start().await;
        let tool = VisionAnalyzeTool::new(provider(&mock), vec![cache, work], 100);
        Setup { dir, mock, tool }
    }

    #[tokio::test]
    async fn the_question_and_the_prepared_image_reach_the_vision_model() {
        let s = setup().await;
        let path = s.dir.path().join("media/cat.png");
        photo(&path);
        s.mock
            .push(Reply::text("  A red square with a gradient.  "));
        let answer = s
            .tool
            .analyze(&path, "What colour is it?", &CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(answer, "A red square with a gradient.");

        let reqs = s.mock.requests();
        assert_eq!(reqs.len(), 1);
        let body = &reqs[0].body;
        assert_eq!(body["model"], "aux-vision");
        assert_eq!(body["max_tokens"], ANSWER_MAX_TOKENS);
        let content = &body["messages"][0]["content"];
        assert_eq!(
            content[0],
            json!({"type": "text", "text": "What colour is it?"})
        );
        assert_eq!(content[1]["type"], "image_url");
        let url = content[1]["image_url"]["url"].as_str().unwrap();
        let b64 = url.strip_prefix("data:image/jpeg;base64,").unwrap();
        let sent = image::load_from_memory(&STANDARD.decode(b64).unwrap()).unwrap();
        // Downscaled to the tool's 100 px, proportions kept.
        assert_eq!((sent.width(), sent.height()), (100, 75));
    }

    #[tokio::test]
    async fn a_path_outside_the_roots_is_refused_without_a_request() {
        let s = setup().await;
        let outside = s.dir.path().join("secret.png");
        photo(&outside);
        let e = s
            .tool
            .analyze(&outside, "what is it?", &CancellationToken::new())
            .await
            .unwrap_err();
        assert!(
            e.0.contains("outside the places images may be read from"),
            "{e}"
        );
        // A link inside a root that points outside is refused too.
        let link = s.dir.path().join("work/innocent.png");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        let e = s
            .tool
            .analyze(&link, "what is it?", &CancellationToken::new())
            .await
            .unwrap_err();
        assert!(e.0.contains("outside"), "{e}");
        // `..` out of a root as well.
        let dotted = s.dir.path().join("work/../secret.png");
        assert!(
            s.tool
                .analyze(&dotted, "q", &CancellationToken::new())
                .await
                .is_err()
        );
        assert!(s.mock.requests().is_empty());
    }

    #[tokio::test]
    async fn missing_files_and_non_images_are_refused_without_a_request() {
        let s = setup().await;
        let cancel = CancellationToken::new();
        let missing = s.dir.path().join("media/gone.jpg");
        let e = s.tool.analyze(&missing, "q", &cancel).await.unwrap_err();
        assert!(e.0.starts_with("there is no file at"), "{e}");

        let fake = s.dir.path().join("work/photo.jpg");
        std::fs::write(&fake, "#!/bin/sh\necho not a photo\n").unwrap();
        let e = s.tool.analyze(&fake, "q", &cancel).await.unwrap_err();
        assert!(e.0.contains("is not an image"), "{e}");

        let dir = s.dir.path().join("work");
        let e = s.tool.analyze(&dir, "q", &cancel).await.unwrap_err();
        assert!(e.0.contains("is not a file"), "{e}");

        let good = s.dir.path().join("work/ok.png");
        photo(&good);
        let e = s.tool.analyze(&good, "   ", &cancel).await.unwrap_err();
        assert!(e.0.contains("empty"), "{e}");
        assert!(s.mock.requests().is_empty());
    }

    #[tokio::test]
    async fn a_failing_vision_model_is_a_tool_error_in_words() {
        let s = setup().await;
        let path = s.dir.path().join("media/a.png");
        photo(&path);
        s.mock
            .push(Reply::error(401, r#"{"error":{"message":"bad key"}}"#));
        let e = s
            .tool
            .analyze(&path, "q", &CancellationToken::new())
            .await
            .unwrap_err();
        assert!(e.0.starts_with("the vision model could not answer"), "{e}");
        assert!(e.0.contains("API key"), "{e}");
    }

    #[tokio::test]
    async fn describe_image_asks_for_a_short_description() {
        let s = setup().await;
        let path = s.dir.path().join("media/a.png");
        photo(&path);
        s.mock.push(Reply::text("A gradient on red."));
        let p = provider(&s.mock);
        let d = describe_image(p.as_ref(), &path, 64).await.unwrap();
        assert_eq!(d, "A gradient on red.");
        let body = &s.mock.requests()[0].body;
        assert_eq!(body["messages"][0]["content"][0]["text"], DESCRIBE_PROMPT);
        assert_eq!(body["messages"][0]["content"][1]["type"], "image_url");
    }
}
