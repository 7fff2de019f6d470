//! The gateway's side of media: fetching a message's attachments into
//! the media cache when its turn runs, and the services that turn them
//! into what the model gets (see [`talaria_agent::attach`]) or speak an
//! answer.
//!
//! Attachments are fetched in the turn, not at intake: intake stays fast
//! (a webhook must be answered within seconds), and a message owed after
//! a restart is fetched again rather than lost. A file over
//! `media.max_bytes` is refused from what the platform claims, then from
//! `Content-Length`, and finally while streaming; in every case nothing of
//! it is kept and the user is told.

use std::sync::Arc;

use talaria_adapter::{Adapter, Attachment, AttachmentSource, MediaKind};
use talaria_agent::attach::{AttachContext, Received};
use talaria_core::config::VoiceReply;
use talaria_core::{Config, Env, Home};
use talaria_llm::Provider;
use talaria_media::{Hint, MediaCache, MediaError, Stored, Synthesizer, Transcriber};

/// What the gateway handles media with, built once from the configuration.
pub struct MediaServices {
    /// Where files go.
    pub cache: MediaCache,
    /// The longest side of an image given to a model.
    pub image_max_px: u32,
    /// The model takes images (`model.vision`).
    pub vision: bool,
    /// The auxiliary vision model, when images are described for a model
    /// without vision (`media.describe_images`).
    pub describer: Option<Arc<dyn Provider>>,
    /// Speech to text (`stt:`), when configured.
    pub transcriber: Option<Arc<Transcriber>>,
    /// Text to speech (`tts:`), when configured.
    pub synthesizer: Option<Arc<Synthesizer>>,
    /// Send the transcript of a voice note back (`stt.echo_transcript`).
    pub echo_transcript: bool,
    /// When answers are spoken (`tts.voice_reply`).
    pub voice_reply: VoiceReply,
}

impl MediaServices {
    /// The services `config` sets up for the model `model`, and what could
    /// not be set up (logged by the caller; the rest still works).
    pub fn from_config(
        config: &Config,
        env: &Env,
        home: &Home,
        model: &str,
    ) -> (MediaServices, Vec<String>) {
        let mut problems = Vec::new();
        let describer = if config.media.describe_images {
            match talaria_llm::auxiliary_vision_provider(config, env) {
                Some(Ok(provider)) => Some(provider),
                Some(Err(e)) => {
                    problems.push(format!("images will not be described: {e}"));
                    None
                }
                None => {
                    problems.push(
                        "media.describe_images is on, but no `auxiliary.vision` model is configured"
                            .to_owned(),
                    );
                    None
                }
            }
        } else {
            None
        };
        let transcriber = match Transcriber::from_config(&config.stt, env) {
            Ok(t) => t.map(Arc::new),
            Err(e) => {
                problems.push(format!("voice notes will not be transcribed: {e}"));
                None
            }
        };
        let synthesizer = match Synthesizer::from_config(&config.tts, env) {
            Ok(s) => s.map(Arc::new),
            Err(e) => {
                problems.push(format!("answers will not be spoken: {e}"));
                None
            }
        };
        let services = MediaServices {
            cache: MediaCache::for_home(home, &config.media),
            image_max_px: config.media.image_max_px,
            vision: talaria_llm::vision::sees_images(config.model.vision, model),
            describer,
            transcriber,
            synthesizer,
            echo_transcript: config.stt.echo_transcript,
            voice_reply: config.tts.voice_reply,
        };
        (services, problems)
    }

    /// What [`talaria_agent::attach::digest`] works with.
    pub fn attach_context(&self) -> AttachContext<'_> {
        AttachContext {
            cache: &self.cache,
            image_max_px: self.image_max_px,
            vision: self.vision,
            describer: self.describer.clone(),
            transcriber: self.transcriber.clone(),
        }
    }

    /// Whether an answer to a message (that came as a voice note or not)
    /// is spoken as well.
    pub fn speaks(&self, voice_in: bool) -> bool {
        self.synthesizer.is_some()
            && match self.voice_reply {
                VoiceReply::Off => false,
                VoiceReply::VoiceOnly => voice_in,
                VoiceReply::Always => true,
            }
    }
}

/// Fetches each attachment into the cache through `adapter` (the one its
/// event came from), in order. A file that cannot be had is a refusal in
/// words, never an error that drops the message.
pub async fn receive(
    adapter: Option<&Arc<dyn Adapter>>,
    attachments: &[Attachment],
    cache: &MediaCache,
) -> Vec<Received> {
    let mut out = Vec::with_capacity(attachments.len());
    for a in attachments {
        let file = fetch(adapter, a, cache).await;
        if let Err(why) = &file {
            tracing::info!(attachment = %a.label(), reason = %why, "an attachment was not taken");
        }
        out.push(Received {
            label: a.label(),
            claimed: Some(a.kind),
            file,
        });
    }
    out
}

async fn fetch(
    adapter: Option<&Arc<dyn Adapter>>,
    a: &Attachment,
    cache: &MediaCache,
) -> Result<Stored, String> {
    let too_large = |size: u64| {
        format!(
            "it is {}, and the limit is {}",
            talaria_media::human_size(size),
            talaria_media::human_size(cache.max_bytes())
        )
    };
    let locator = match &a.source {
        AttachmentSource::Refused(why) => return Err(why.clone()),
        AttachmentSource::Cached(r) => return cached(r, a),
        AttachmentSource::Remote(locator) => locator,
    };
    if let Some(size) = a.size.filter(|s| *s > cache.max_bytes()) {
        return Err(too_large(size));
    }
    let adapter = adapter.ok_or("its platform is not connected to this gateway")?;
    let download = adapter.download(locator).await.map_err(|e| e.to_string())?;
    if let Some(size) = download.length.filter(|s| *s > cache.max_bytes()) {
        return Err(too_large(size));
    }
    let hint = Hint {
        name: a.name.as_deref(),
        mime: a.mime.as_deref(),
        voice: a.kind == MediaKind::Voice,
    };
    cache
        .store(download.reader, hint)
        .await
        .map_err(|e| match e {
            MediaError::TooLarge { .. } => e.to_string().replace("the file is too large: ", ""),
            other => other.to_string(),
        })
}

/// An attachment its adapter already put in the cache.
fn cached(r: &talaria_core::MediaRef, a: &Attachment) -> Result<Stored, String> {
    let meta = std::fs::metadata(&r.path).map_err(|_| "the file is no longer kept".to_owned())?;
    let ext = r.path.extension().and_then(|e| e.to_str()).unwrap_or("bin");
    Ok(Stored {
        sha256: r
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
        bytes: meta.len(),
        mime: r.mime.clone(),
        kind: r.kind,
        name: talaria_media::sanitize_name(a.name.as_deref(), ext),
        path: r.path.clone(),
    })
}
