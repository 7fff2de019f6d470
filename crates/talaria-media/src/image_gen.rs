//! Image generation: a prompt turned into an image in the cache.
//!
//! Any server speaking OpenAI's `POST /images/generations`. The image
//! comes back either inline, base64 in `data[0].b64_json` (OpenAI's GPT
//! image models always answer so), or as `data[0].url` to fetch (DALL·E
//! and many local servers). The answer's body is read bounded by the
//! cache's limit (base64 is a third larger than what it encodes); a URL is
//! fetched streamed into the cache, from http or https only, and without
//! the key, which belongs to the API and not to wherever the image is.

use std::time::Duration;

use base64::Engine;
use talaria_core::config::ImageGenConfig;
use talaria_core::{Env, Secret};

use crate::{Hint, MediaCache, MediaError, MediaKind, Stored, http};

/// Room in the answer beside the image: `created`, `revised_prompt`, usage.
const ANSWER_OVERHEAD: usize = 64 * 1024;

/// Where generating an image went wrong, in words a user can be shown.
#[derive(Debug, thiserror::Error)]
pub enum ImageGenError {
    /// `image_gen:` is set up in a way that cannot work.
    #[error("image generation is not set up correctly: {0}")]
    Config(String),
    /// There is no prompt.
    #[error("there is no description of the image to make")]
    NoPrompt,
    /// The server could not be reached or did not answer in time.
    #[error("the image service is unreachable: {0}")]
    Transport(String),
    /// The server refused or failed (a refused prompt included).
    #[error("the image service refused: {0}")]
    Server(String),
    /// The answer holds no image that can be used.
    #[error("the image service gave an answer that cannot be used: {0}")]
    BadAnswer(String),
    /// What came back is not an image.
    #[error("the image service sent something that is not an image ({what})")]
    NotAnImage {
        /// What the bytes say it is, as a MIME type.
        what: String,
    },
    /// Storing the image failed (too large, among others).
    #[error("the image could not be stored: {0}")]
    Cache(#[from] MediaError),
}

/// Makes images, as `image_gen:` says.
#[derive(Debug)]
pub struct ImageGenerator {
    client: reqwest::Client,
    url: String,
    key: Option<Secret>,
    model: String,
}

impl ImageGenerator {
    /// The generator `config` describes; `None` when neither
    /// `image_gen.base_url` nor a key (`image_gen.api_key`, else
    /// `OPENAI_API_KEY`) is set: the tool is then left out.
    pub fn from_config(
        config: &ImageGenConfig,
        env: &Env,
    ) -> Result<Option<ImageGenerator>, ImageGenError> {
        let key = http::key(config.api_key.as_ref(), env, &["OPENAI_API_KEY"]);
        if key.is_none() && config.base_url.is_none() {
            return Ok(None);
        }
        let timeout = Duration::from_secs(config.timeout_secs.max(1));
        Ok(Some(ImageGenerator {
            client: http::client(timeout).map_err(ImageGenError::Config)?,
            url: format!(
                "{}/images/generations",
                http::base_url(config.base_url.as_deref())
            ),
            key,
            model: config.model.clone(),
        }))
    }

    /// An image for `prompt` (of `size`, such as `1024x1024`, when given),
    /// stored in `cache`. Whatever the server sends must be an image by
    /// its bytes.
    pub async fn generate(
        &self,
        prompt: &str,
        size: Option<&str>,
        cache: &MediaCache,
    ) -> Result<Stored, ImageGenError> {
        let prompt = prompt.trim();
        if prompt.is_empty() {
            return Err(ImageGenError::NoPrompt);
        }
        let mut body = serde_json::json!({
            "model": self.model,
            "prompt": prompt,
            "n": 1,
        });
        if let Some(size) = size.map(str::trim).filter(|s| !s.is_empty()) {
            body["size"] = serde_json::Value::from(size);
        }
        let key = self.key.as_ref();
        let mut request = self.client.post(&self.url).json(&body);
        if let Some(key) = key {
            request = request.bearer_auth(key.expose());
        }
        let response = request
            .send()
            .await
            .map_err(|e| ImageGenError::Transport(http::transport_error(&e, key)))?;
        if !response.status().is_success() {
            return Err(ImageGenError::Server(
                http::error_message(response, key).await,
            ));
        }
        // Base64 is 4/3 of the bytes it encodes; 1.4 leaves room for
        // line breaks some servers add.
        let max_image = usize::try_from(cache.max_bytes()).unwrap_or(usize::MAX);
        let limit = max_image
            .saturating_mul(7)
            .checked_div(5)
            .unwrap_or(usize::MAX)
            .saturating_add(ANSWER_OVERHEAD);
        let answer = http::read_bounded(response, limit).await.ok_or_else(|| {
            ImageGenError::BadAnswer(
                "the answer is larger than the image size limit allows, or broke off".to_owned(),
            )
        })?;
        let answer: Answer = serde_json::from_slice(&answer)
            .map_err(|e| ImageGenError::BadAnswer(format!("expected JSON with `data`: {e}")))?;
        let Some(first) = answer.data.into_iter().next() else {
            return Err(ImageGenError::BadAnswer("no image in `data`".to_owned()));
        };
        let stored = match (first.b64_json, first.url) {
            (Some(b64), _) => {
                let bytes = decode_base64(&b64)?;
                // Dropped as soon as it is stored: at most one copy of the
                // decoded image besides the answer's text.
                cache.store(&bytes[..], hint()).await?
            }
            (None, Some(url)) => self.fetch(&url, cache).await?,
            (None, None) => {
                return Err(ImageGenError::BadAnswer(
                    "the image has neither `b64_json` nor `url`".to_owned(),
                ));
            }
        };
        if stored.kind != MediaKind::Image {
            return Err(ImageGenError::NotAnImage { what: stored.mime });
        }
        let mut stored = stored;
        // The name it is sent under: `image.png`, `image.jpg`.
        let ext = stored
            .path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("png")
            .to_owned();
        stored.name = format!("image.{ext}");
        Ok(stored)
    }

    /// The image at `url`, streamed into the cache.
    async fn fetch(&self, url: &str, cache: &MediaCache) -> Result<Stored, ImageGenError> {
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| ImageGenError::BadAnswer(format!("the image URL is not valid: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(ImageGenError::BadAnswer(format!(
                "the image URL must be http or https, not {}",
                parsed.scheme()
            )));
        }
        // No key: it is for the API, not for wherever the image is kept.
        let response =
            self.client.get(parsed).send().await.map_err(|e| {
                ImageGenError::Transport(http::transport_error(&e, self.key.as_ref()))
            })?;
        if !response.status().is_success() {
            return Err(ImageGenError::Server(format!(
                "fetching the image: {}",
                http::error_message(response, self.key.as_ref()).await
            )));
        }
        Ok(cache.store(http::body_reader(response), hint()).await?)
    }
}

fn hint() -> Hint<'static> {
    Hint::default()
}

/// Standard base64, with any line breaks or blanks a server put in.
fn decode_base64(text: &str) -> Result<Vec<u8>, ImageGenError> {
    let engine = &base64::engine::general_purpose::STANDARD;
    match engine.decode(text) {
        Ok(bytes) => Ok(bytes),
        Err(_) => {
            let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
            engine.decode(compact).map_err(|e| {
                ImageGenError::BadAnswer(format!("`b64_json` is not valid base64: {e}"))
            })
        }
    }
}

#[derive(serde::Deserialize)]
struct Answer {
    #[serde(default)]
    data: Vec<Item>,
}

#[derive(serde::Deserialize)]
struct Item {
    b64_json: Option<String>,
    url: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use talaria_testkit::openai_media::{FakeOpenAiMedia, MediaReply};

    /// A real 8×8 PNG.
    fn png() -> Vec<u8> {
        let img =
            image::RgbImage::from_fn(8, 8, |x, y| image::Rgb([x as u8 * 30, y as u8 * 30, 90]));
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Png).unwrap();
        out.into_inner()
    }

    fn generator(fake: &FakeOpenAiMedia) -> ImageGenerator {
        let config = ImageGenConfig {
            base_url: Some(fake.base_url()),
            model: "gpt-image-1".to_owned(),
            ..ImageGenConfig::default()
        };
        let env = Env::from_pairs([("OPENAI_API_KEY", "sk-img")]);
        ImageGenerator::from_config(&config, &env).unwrap().unwrap()
    }

    #[test]
    fn no_server_and_no_key_leaves_the_tool_out() {
        assert!(
            ImageGenerator::from_config(&ImageGenConfig::default(), &Env::default())
                .unwrap()
                .is_none()
        );
        let env = Env::from_pairs([("OPENAI_API_KEY", "sk-x")]);
        assert!(
            ImageGenerator::from_config(&ImageGenConfig::default(), &env)
                .unwrap()
                .is_some()
        );
    }

    #[tokio::test]
    async fn a_b64_image_is_decoded_into_the_cache() {
        let fake = FakeOpenAiMedia::start().await;
        fake.push(MediaReply::image_b64(png()));
        let dir = tempfile::tempdir().unwrap();
        let cache = MediaCache::new(dir.path(), 1024 * 1024);
        let stored = generator(&fake)
            .generate("a red fox in snow", Some("1024x1024"), &cache)
            .await
            .unwrap();
        assert_eq!(stored.mime, "image/png");
        assert_eq!(stored.kind, MediaKind::Image);
        assert_eq!(stored.name, "image.png");
        assert_eq!(std::fs::read(&stored.path).unwrap(), png());
        let r = &fake.requests()[0];
        assert_eq!(r.path, "/v1/images/generations");
        assert_eq!(r.header("authorization"), Some("Bearer sk-img"));
        assert_eq!(
            r.json,
            serde_json::json!({"model": "gpt-image-1", "prompt": "a red fox in snow", "n": 1, "size": "1024x1024"})
        );
    }

    #[tokio::test]
    async fn a_url_image_is_fetched_without_the_key() {
        let fake = FakeOpenAiMedia::start().await;
        fake.push(MediaReply::image_url(png(), "image/png"));
        let dir = tempfile::tempdir().unwrap();
        let cache = MediaCache::new(dir.path(), 1024 * 1024);
        let stored = generator(&fake)
            .generate("a fox", None, &cache)
            .await
            .unwrap();
        assert_eq!(std::fs::read(&stored.path).unwrap(), png());
        let reqs = fake.requests();
        assert!(reqs[0].json.get("size").is_none());
        assert_eq!(reqs[1].path, "/files/0");
        assert_eq!(reqs[1].header("authorization"), None);
    }

    #[tokio::test]
    async fn what_is_not_an_image_or_too_large_is_refused() {
        let fake = FakeOpenAiMedia::start().await;
        fake.push(MediaReply::image_b64(b"just some words\n".to_vec()));
        fake.push(MediaReply::image_url(
            b"MZ\x90\x00\x03\x00\x00\x00".to_vec(),
            "image/png",
        ));
        // Larger than the cache takes: refused while reading the answer.
        fake.push(MediaReply::image_b64(vec![0x89; 300 * 1024]));
        fake.push(MediaReply::error(
            400,
            "Your request was rejected by the safety system",
            "image_generation_user_error",
        ));
        let dir = tempfile::tempdir().unwrap();
        let cache = MediaCache::new(dir.path(), 100 * 1024);
        let generator = generator(&fake);
        let err = generator.generate("x", None, &cache).await.unwrap_err();
        assert!(
            matches!(&err, ImageGenError::NotAnImage { what } if what == "text/plain"),
            "{err}"
        );
        let err = generator.generate("x", None, &cache).await.unwrap_err();
        assert!(matches!(err, ImageGenError::NotAnImage { .. }), "{err}");
        let err = generator.generate("x", None, &cache).await.unwrap_err();
        assert!(matches!(err, ImageGenError::BadAnswer(_)), "{err}");
        let err = generator.generate("x", None, &cache).await.unwrap_err();
        assert!(err.to_string().contains("safety system"), "{err}");
        assert!(matches!(
            generator.generate(" ", None, &cache).await.unwrap_err(),
            ImageGenError::NoPrompt
        ));
    }

    #[tokio::test]
    async fn a_url_that_is_not_http_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = MediaCache::new(dir.path(), 1024 * 1024);
        let fake = FakeOpenAiMedia::start().await;
        let err = generator(&fake)
            .fetch("file:///etc/passwd", &cache)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("http or https"), "{err}");
    }

    #[test]
    fn base64_with_line_breaks_is_accepted() {
        let b64 = base64::engine::general_purpose::STANDARD.encode(png());
        let wrapped: String = b64
            .as_bytes()
            .chunks(76)
            .map(|c| format!("{}\n", String::from_utf8_lossy(c)))
            .collect();
        assert_eq!(decode_base64(&wrapped).unwrap(), png());
        assert!(decode_base64("not base64!").is_err());
    }
}
