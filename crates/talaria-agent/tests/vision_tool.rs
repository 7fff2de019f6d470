//! `vision_analyze` called as the model calls it: arguments as JSON, paths
//! relative to the working directory, against the mock OpenAI server.

use crate::tools_support;

use std::sync::Arc;

use serde_json::json;
use talaria_agent::tools::Tool;
use talaria_agent::tools::vision::VisionAnalyzeTool;
use talaria_core::config::VisionMode;
use talaria_core::{Endpoint, ProviderKind};
use talaria_llm::{HttpOptions, OpenAiProvider};
use talaria_testkit::{MockOpenAi, Reply};
use tools_support::Env;

fn tool(env: &Env, mock: &MockOpenAi) -> VisionAnalyzeTool {
    let provider = OpenAiProvider::new(
        &Endpoint {
            provider: ProviderKind::Custom,
            model: "aux-vision".into(),
            base_url: mock.base_url(),
            api_key: None,
        },
        HttpOptions {
            vision: VisionMode::On,
            ..HttpOptions::default()
        },
    );
    let cache = env.dir.path().join("home/media");
    std::fs::create_dir_all(&cache).unwrap();
    VisionAnalyzeTool::new(Arc::new(provider), vec![cache, env.work()], 512)
}

fn photo(path: &std::path::Path) {
    image::RgbImage::from_fn(64, 48, |x, _| image::Rgb([0, 0, (x * 4) as u8]))
        .save(path)
        .unwrap();
}

#[tokio::test]
async fn a_relative_path_in_the_workspace_is_analysed() {
    let env = Env::new();
    let mock = MockOpenAi::start().await;
    let t = tool(&env, &mock);
    assert_eq!(t.name(), "vision_analyze");
    assert!(t.parallel_safe());
    assert_eq!(t.parameters()["required"], json!(["image_url", "question"]));
    photo(&env.work().join("chart.png"));
    mock.push(Reply::text("A blue gradient."));
    let out = t
        .call(
            json!({"image_url": "chart.png", "question": "Which colour?"}),
            &env.ctx,
        )
        .await
        .unwrap();
    assert_eq!(out, "A blue gradient.");
    let body = &mock.requests()[0].body;
    assert_eq!(body["messages"][0]["content"][0]["text"], "Which colour?");
    assert!(
        body["messages"][0]["content"][1]["image_url"]["url"]
            .as_str()
            .unwrap()
            .starts_with("data:image/jpeg;base64,")
    );
}

#[tokio::test]
async fn a_file_url_in_the_media_cache_is_analysed() {
    let env = Env::new();
    let mock = MockOpenAi::start().await;
    let t = tool(&env, &mock);
    let sent = env.dir.path().join("home/media/ab12.jpg");
    photo(&sent);
    mock.push(Reply::text("ok"));
    let url = format!("file://{}", sent.display());
    let out = t
        .call(json!({"image_url": url, "question": "?"}), &env.ctx)
        .await
        .unwrap();
    assert_eq!(out, "ok");
}

#[tokio::test]
async fn bad_arguments_and_foreign_paths_make_no_request() {
    let env = Env::new();
    let mock = MockOpenAi::start().await;
    let t = tool(&env, &mock);
    photo(&env.work().join("a.png"));
    // In the home, but not in its media cache.
    photo(&env.dir.path().join("home/elsewhere.png"));
    let cases = [
        (
            json!({"question": "q"}),
            "missing required argument `image_url`",
        ),
        (
            json!({"image_url": "a.png"}),
            "missing required argument `question`",
        ),
        (
            json!({"image_url": "https://example.com/a.png", "question": "q"}),
            "must be a local file",
        ),
        (
            json!({"image_url": "../home/elsewhere.png", "question": "q"}),
            "outside",
        ),
        (
            json!({"image_url": "../home/media/never-sent.png", "question": "q"}),
            "no file",
        ),
    ];
    for (args, want) in cases {
        let e = t.call(args.clone(), &env.ctx).await.unwrap_err();
        assert!(e.0.contains(want), "{args}: {e}");
    }
    assert!(mock.requests().is_empty());
}
