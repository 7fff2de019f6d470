//! Images of user rows reach the mock servers as the documented parts:
//! OpenAI's `image_url` with a `data:` URL, Anthropic's base64 `image`
//! block.

use crate::common;

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use common::{endpoint, opts};
use serde_json::{Value, json};
use talaria_core::config::{ModelConfig, VisionMode};
use talaria_core::{Config, Env, MediaKind, MediaRef, Message, ProviderKind};
use talaria_llm::media::{KEEP_IMAGES, NO_LONGER_AVAILABLE, NOT_SEEN, SENT_EARLIER};
use talaria_llm::{
    AnthropicProvider, ChatRequest, HttpOptions, LlmClient, OpenAiProvider, Provider,
    auxiliary_vision_provider,
};
use talaria_testkit::{MockAnthropic, MockOpenAi, Recorded, Reply};
use tokio_util::sync::CancellationToken;

fn vision_opts(stream: bool, vision: VisionMode) -> HttpOptions {
    HttpOptions {
        vision,
        // These tests compare content blocks whole; cache breakpoints
        // (tested in anthropic_caching.rs) would only add noise.
        prompt_caching: talaria_core::config::PromptCachingConfig {
            enabled: false,
            ..Default::default()
        },
        ..opts(stream)
    }
}

fn openai(mock: &MockOpenAi, model: &str, vision: VisionMode) -> OpenAiProvider {
    OpenAiProvider::new(
        &endpoint(ProviderKind::Custom, model, mock.base_url(), None),
        vision_opts(true, vision),
    )
}

fn anthropic(mock: &MockAnthropic, vision: VisionMode) -> AnthropicProvider {
    AnthropicProvider::new(
        &endpoint(
            ProviderKind::Anthropic,
            "claude-mock",
            mock.base_url(),
            Some("sk-ant-test-0123456789abcdefghij"),
        ),
        vision_opts(false, vision),
    )
}

/// A photo as the gateway leaves it in the cache: a PNG with transparency
/// (so it stays a PNG) run through `prepare_image`, which downscales it.
/// Returns the reference and the prepared bytes.
fn cached_png(dir: &Path, name: &str, shade: u8) -> (MediaRef, Vec<u8>) {
    let raw = dir.join(format!("{name}.raw.png"));
    let img = image::RgbaImage::from_fn(300, 200, |x, y| {
        image::Rgba([shade, (x % 256) as u8, (y % 256) as u8, 128])
    });
    img.save(&raw).unwrap();
    let prepared = talaria_media::prepare_image(&raw, 120).unwrap();
    assert_eq!(prepared.mime, "image/png");
    assert_eq!((prepared.width, prepared.height), (120, 80));
    let path = dir.join(format!("{name}.png"));
    std::fs::write(&path, &prepared.bytes).unwrap();
    (
        MediaRef {
            kind: MediaKind::Image,
            path,
            mime: prepared.mime.to_owned(),
        },
        prepared.bytes,
    )
}

fn request(messages: Vec<Message>) -> ChatRequest {
    ChatRequest {
        messages,
        ..ChatRequest::default()
    }
}

async fn send_openai(p: &OpenAiProvider, mock: &MockOpenAi, req: &ChatRequest) -> Recorded {
    mock.push(Reply::text("I see it"));
    let r = p
        .chat(req, &|_| {}, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.message.content, "I see it");
    mock.requests().pop().unwrap()
}

async fn send_anthropic(
    p: &AnthropicProvider,
    mock: &MockAnthropic,
    req: &ChatRequest,
) -> Recorded {
    mock.push(Reply::text("I see it"));
    let r = p
        .chat(req, &|_| {}, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.message.content, "I see it");
    mock.requests().pop().unwrap()
}

/// The bytes of a `data:image/png;base64,...` URL.
fn data_url_bytes(url: &str) -> Vec<u8> {
    let b64 = url
        .strip_prefix("data:image/png;base64,")
        .unwrap_or_else(|| panic!("not a PNG data URL: {}", &url[..url.len().min(40)]));
    STANDARD.decode(b64).unwrap()
}

/// The images of a Chat Completions body, in order: `image N` for each
/// image part (N read back from the pixel shade), the text of text parts.
fn openai_parts(body: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for m in body["messages"].as_array().unwrap() {
        match &m["content"] {
            Value::String(s) => out.push(s.clone()),
            Value::Array(parts) => {
                for p in parts {
                    match p["type"].as_str().unwrap() {
                        "text" => out.push(p["text"].as_str().unwrap().to_owned()),
                        "image_url" => {
                            let bytes = data_url_bytes(p["image_url"]["url"].as_str().unwrap());
                            out.push(format!("image {}", shade_of(&bytes)));
                        }
                        other => panic!("unexpected part type {other}"),
                    }
                }
            }
            other => panic!("unexpected content {other}"),
        }
    }
    out
}

/// The red channel of a prepared photo's first pixel: which photo it is.
fn shade_of(png: &[u8]) -> u8 {
    image::load_from_memory(png)
        .unwrap()
        .to_rgba8()
        .get_pixel(0, 0)[0]
}

#[tokio::test]
async fn openai_gets_the_photo_as_an_image_url_part() {
    let dir = tempfile::tempdir().unwrap();
    let (photo, prepared) = cached_png(dir.path(), "cat", 10);
    let mock = MockOpenAi::start().await;
    let p = openai(&mock, "mock-1", VisionMode::On);
    assert!(p.sees_images());
    let req = request(vec![
        Message::system("You look at photos."),
        Message::user_with_media("what is this?", vec![photo]),
    ]);
    let got = send_openai(&p, &mock, &req).await;
    let content = &got.body["messages"][1]["content"];
    let url = content[1]["image_url"]["url"].as_str().unwrap().to_owned();
    assert_eq!(
        content,
        &json!([
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": url}},
        ])
    );
    assert_eq!(got.body["messages"][1]["role"], "user");
    assert_eq!(
        data_url_bytes(&url),
        prepared,
        "the prepared bytes, unchanged"
    );
    // The system row is untouched.
    assert_eq!(got.body["messages"][0]["content"], "You look at photos.");
}

#[tokio::test]
async fn anthropic_gets_the_photo_as_an_image_block_before_the_text() {
    let dir = tempfile::tempdir().unwrap();
    let (photo, prepared) = cached_png(dir.path(), "cat", 10);
    let mock = MockAnthropic::start().await;
    let p = anthropic(&mock, VisionMode::Auto);
    assert!(p.sees_images(), "Claude models see images");
    let req = request(vec![
        Message::system("You look at photos."),
        Message::user_with_media("what is this?", vec![photo]),
    ]);
    let got = send_anthropic(&p, &mock, &req).await;
    let content = &got.body["messages"][0]["content"];
    let data = content[0]["source"]["data"].as_str().unwrap().to_owned();
    assert_eq!(
        content,
        &json!([
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
            {"type": "text", "text": "what is this?"},
        ])
    );
    assert_eq!(STANDARD.decode(&data).unwrap(), prepared);
    assert_eq!(got.body["system"], "You look at photos.");
}

/// Five photos, one a row: the newest four go as parts, the first as a
/// placeholder in its row's text.
fn five_photo_chat(dir: &Path) -> ChatRequest {
    let mut msgs = vec![Message::system("s")];
    for i in 0..5u8 {
        let (photo, _) = cached_png(dir, &format!("p{i}"), i * 10);
        msgs.push(Message::user_with_media(format!("photo {i}"), vec![photo]));
        msgs.push(Message::assistant(format!("seen {i}")));
    }
    msgs.push(Message::user("compare them"));
    request(msgs)
}

#[tokio::test]
async fn only_the_last_four_photos_are_sent_to_openai() {
    assert_eq!(KEEP_IMAGES, 4);
    let dir = tempfile::tempdir().unwrap();
    let req = five_photo_chat(dir.path());
    let mock = MockOpenAi::start().await;
    let p = openai(&mock, "gpt-4o", VisionMode::Auto);
    let got = send_openai(&p, &mock, &req).await;
    let s = |x: &str| x.to_owned();
    assert_eq!(
        openai_parts(&got.body),
        vec![
            s("s"),
            format!("{SENT_EARLIER}\nphoto 0"),
            s("seen 0"),
            s("photo 1"),
            s("image 10"),
            s("seen 1"),
            s("photo 2"),
            s("image 20"),
            s("seen 2"),
            s("photo 3"),
            s("image 30"),
            s("seen 3"),
            s("photo 4"),
            s("image 40"),
            s("seen 4"),
            s("compare them"),
        ]
    );
    // The old row went as a plain string, not parts.
    assert!(got.body["messages"][1]["content"].is_string());
}

#[tokio::test]
async fn only_the_last_four_photos_are_sent_to_anthropic() {
    let dir = tempfile::tempdir().unwrap();
    let req = five_photo_chat(dir.path());
    let mock = MockAnthropic::start().await;
    let p = anthropic(&mock, VisionMode::On);
    let got = send_anthropic(&p, &mock, &req).await;
    let msgs = got.body["messages"].as_array().unwrap();
    assert_eq!(
        msgs[0]["content"],
        json!([{"type": "text", "text": format!("{SENT_EARLIER}\nphoto 0")}])
    );
    let images: Vec<u8> = msgs
        .iter()
        .flat_map(|m| m["content"].as_array().unwrap().iter())
        .filter(|b| b["type"] == "image")
        .map(|b| {
            shade_of(
                &STANDARD
                    .decode(b["source"]["data"].as_str().unwrap())
                    .unwrap(),
            )
        })
        .collect();
    assert_eq!(images, [10, 20, 30, 40]);
}

#[tokio::test]
async fn a_photo_the_cache_forgot_becomes_a_placeholder() {
    let dir = tempfile::tempdir().unwrap();
    let (photo, _) = cached_png(dir.path(), "old", 7);
    std::fs::remove_file(&photo.path).unwrap();
    let req = request(vec![Message::user_with_media("and this?", vec![photo])]);

    let mock = MockOpenAi::start().await;
    let got = send_openai(&openai(&mock, "m", VisionMode::On), &mock, &req).await;
    assert_eq!(
        got.body["messages"][0]["content"],
        format!("{NO_LONGER_AVAILABLE}\nand this?")
    );

    let mock = MockAnthropic::start().await;
    let got = send_anthropic(&anthropic(&mock, VisionMode::On), &mock, &req).await;
    assert_eq!(
        got.body["messages"][0]["content"],
        json!([{"type": "text", "text": format!("{NO_LONGER_AVAILABLE}\nand this?")}])
    );
}

#[tokio::test]
async fn a_photo_alone_is_sent_without_an_empty_text_part() {
    let dir = tempfile::tempdir().unwrap();
    let (photo, _) = cached_png(dir.path(), "solo", 3);
    let req = request(vec![Message::user_with_media("", vec![photo])]);
    let mock = MockOpenAi::start().await;
    let got = send_openai(&openai(&mock, "m", VisionMode::On), &mock, &req).await;
    let parts = got.body["messages"][0]["content"].as_array().unwrap();
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0]["type"], "image_url");
}

#[tokio::test]
async fn a_model_without_vision_gets_no_image_parts() {
    let dir = tempfile::tempdir().unwrap();
    let (photo, _) = cached_png(dir.path(), "cat", 1);
    let req = request(vec![Message::user_with_media("what is it?", vec![photo])]);
    let expected = format!("{NOT_SEEN}\nwhat is it?");

    let mock = MockOpenAi::start().await;
    // `auto` on a name the table does not know, and `off` on one it does.
    for p in [
        openai(&mock, "mock-text-model", VisionMode::Auto),
        openai(&mock, "gpt-4o", VisionMode::Off),
    ] {
        assert!(!p.sees_images());
        let got = send_openai(&p, &mock, &req).await;
        assert_eq!(got.body["messages"][0]["content"], expected.as_str());
    }

    let mock = MockAnthropic::start().await;
    let got = send_anthropic(&anthropic(&mock, VisionMode::Off), &mock, &req).await;
    assert_eq!(
        got.body["messages"][0]["content"],
        json!([{"type": "text", "text": expected}])
    );
}

/// Rows without images (and media that are not images) are sent exactly as
/// the body without any images is: text content stays a plain string.
#[tokio::test]
async fn text_only_requests_are_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let voice = MediaRef {
        kind: MediaKind::Voice,
        path: write(dir.path(), "note.ogg", b"OggS"),
        mime: "audio/ogg".into(),
    };
    let req = request(vec![
        Message::system("s"),
        Message::user("hello"),
        Message::assistant("hi"),
        Message::user_with_media("(voice note) call me", vec![voice]),
    ]);

    let mock = MockOpenAi::start().await;
    let p = openai(&mock, "gpt-4o", VisionMode::On);
    let got = send_openai(&p, &mock, &req).await;
    let plain = serde_json::to_value(p.request_body(&req, true)).unwrap();
    assert_eq!(got.body, plain);
    assert_eq!(got.body["messages"][3]["content"], "(voice note) call me");

    let mock = MockAnthropic::start().await;
    let p = anthropic(&mock, VisionMode::On);
    let got = send_anthropic(&p, &mock, &req).await;
    assert_eq!(got.body, p.request_body(&req, false));
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn photo_request(dir: &Path) -> ChatRequest {
    let (photo, _) = cached_png(dir, "cfg", 5);
    request(vec![Message::user_with_media("see?", vec![photo])])
}

fn has_image_part(got: &Recorded) -> bool {
    got.body["messages"][0]["content"]
        .as_array()
        .is_some_and(|parts| parts.iter().any(|p| p["type"] == "image_url"))
}

#[tokio::test]
async fn from_config_follows_model_vision() {
    let dir = tempfile::tempdir().unwrap();
    let req = photo_request(dir.path());
    let mock = MockOpenAi::start().await;
    let mut config = Config::default();
    config.model.default = Some("local-model".into());
    config.model.base_url = Some(mock.base_url());
    for (mode, sent) in [
        (VisionMode::Auto, false),
        (VisionMode::On, true),
        (VisionMode::Off, false),
    ] {
        config.model.vision = mode;
        let client = LlmClient::from_config(&config, &Env::default()).unwrap();
        mock.push(Reply::text("ok"));
        client
            .chat(&req, &|_| {}, &CancellationToken::new())
            .await
            .unwrap();
        let got = mock.requests().pop().unwrap();
        assert_eq!(has_image_part(&got), sent, "{mode:?}: {}", got.body);
    }
}

#[tokio::test]
async fn the_auxiliary_vision_model_is_sent_images_unless_told_off() {
    let mut config = Config::default();
    assert!(auxiliary_vision_provider(&config, &Env::default()).is_none());
    config.auxiliary.vision = Some(ModelConfig::default());
    let e = auxiliary_vision_provider(&config, &Env::default())
        .unwrap()
        .err()
        .unwrap();
    assert!(e.contains("`auxiliary.vision` needs `default`"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    let req = photo_request(dir.path());
    let mock = MockOpenAi::start().await;
    for (mode, sent) in [
        (VisionMode::Auto, true),
        (VisionMode::On, true),
        (VisionMode::Off, false),
    ] {
        config.auxiliary.vision = Some(ModelConfig {
            default: Some("my-local-vlm-q4".into()),
            base_url: Some(mock.base_url()),
            max_tokens: Some(300),
            vision: mode,
            ..ModelConfig::default()
        });
        let p = auxiliary_vision_provider(&config, &Env::default())
            .unwrap()
            .unwrap();
        assert_eq!(p.model(), "my-local-vlm-q4");
        mock.push(Reply::text("ok"));
        p.chat(&req, &|_| {}, &CancellationToken::new())
            .await
            .unwrap();
        let got = mock.requests().pop().unwrap();
        assert_eq!(has_image_part(&got), sent, "{mode:?}");
        assert_eq!(got.body["max_tokens"], 300);
    }
}

#[tokio::test]
async fn anthropic_refuses_an_image_over_its_api_limit_with_a_placeholder() {
    let dir = tempfile::tempdir().unwrap();
    // Sent by OpenAI's rules, over Anthropic's 5 MB of base64.
    let big = dir.path().join("big.png");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(talaria_llm::anthropic::MAX_IMAGE_BYTES + 1)
        .unwrap();
    const { assert!(talaria_llm::anthropic::MAX_IMAGE_BYTES + 1 < talaria_llm::media::MAX_IMAGE_BYTES) };
    let photo = MediaRef {
        kind: MediaKind::Image,
        path: big,
        mime: "image/png".into(),
    };
    let req = request(vec![Message::user_with_media("huge", vec![photo])]);
    let mock = MockAnthropic::start().await;
    let got = send_anthropic(&anthropic(&mock, VisionMode::On), &mock, &req).await;
    assert_eq!(
        got.body["messages"][0]["content"],
        json!([{"type": "text", "text": format!("{}\nhuge", talaria_llm::media::TOO_LARGE)}])
    );
}
