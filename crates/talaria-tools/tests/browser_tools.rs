//! The `browser_*` tools: their schemas are the ancestor's, and a
//! conversation drives a real Chromium through them (pages served on
//! 127.0.0.1; Chromium must be installed, `apt-get install chromium`).

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use axum::Router;
use axum::response::Html;
use axum::routing::{get, post};
use serde_json::{Value, json};
use talaria_agent::interaction::{ApprovalDecision, ApprovalRequest, ClarifyRequest, Interaction};
use talaria_agent::tools::vision::VisionAnalyzeTool;
use talaria_agent::tools::{SessionState, Tool, ToolContext};
use talaria_core::config::{BrowserConfig, VisionMode};
use talaria_core::{Config, Endpoint, Home, ProviderKind, Redactor};
use talaria_llm::{HttpOptions, OpenAiProvider};
use talaria_testkit::{MockOpenAi, Reply};
use talaria_tools::browser::browser_tools;
use talaria_web::UrlGuard;
use talaria_web::browser::Browser;
use tokio_util::sync::CancellationToken;

/// The browser toolset, as `platform_toolsets` names it.
fn browser_toolset() -> &'static [&'static str] {
    talaria_core::toolsets::TOOLSETS
        .iter()
        .find(|(set, _)| *set == "browser")
        .map(|(_, tools)| *tools)
        .unwrap_or_default()
}

/// What the comparison keeps of a schema: per property its type, enum and
/// default, and the required list (descriptions are ours).
fn shape(schema: &Value) -> Value {
    let mut props = serde_json::Map::new();
    for (name, p) in schema["properties"].as_object().into_iter().flatten() {
        props.insert(
            name.clone(),
            json!({"type": p["type"], "enum": p["enum"], "default": p["default"], "items": p["items"]}),
        );
    }
    let required: BTreeSet<String> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    json!({"type": schema["type"], "properties": props, "required": required})
}

fn tools(vision: Option<Arc<VisionAnalyzeTool>>, dir: &std::path::Path) -> Vec<Arc<dyn Tool>> {
    let guard = UrlGuard::with_lookup(
        false,
        &["127.0.0.1".to_owned()],
        Arc::new(talaria_web::guard::StaticLookup::default()),
    )
    .expect("guard");
    let browser = Arc::new(Browser::new(
        &BrowserConfig::default(),
        guard,
        dir.join("browser"),
    ));
    browser_tools(browser, vision)
}

#[test]
fn the_schemas_are_the_ancestors() {
    let fixture: Value = serde_json::from_str(include_str!("fixtures/ancestor_tool_schemas.json"))
        .expect("the fixture is JSON");
    let dir = tempfile::tempdir().expect("tempdir");
    let tools = tools(None, dir.path());
    let names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
    assert_eq!(names, browser_toolset());
    for tool in &tools {
        let ancestor = &fixture[tool.name()];
        assert!(ancestor.is_object(), "{} is in the fixture", tool.name());
        assert_eq!(
            shape(&tool.parameters()),
            shape(ancestor),
            "{}'s parameters",
            tool.name()
        );
        assert!(!tool.description().is_empty());
        assert!(!tool.parallel_safe(), "{} shares a page", tool.name());
    }
}

struct Nobody;

#[async_trait]
impl Interaction for Nobody {
    async fn approve(&self, _request: &ApprovalRequest) -> ApprovalDecision {
        ApprovalDecision::Deny
    }

    async fn clarify(&self, _request: &ClarifyRequest) -> Option<String> {
        None
    }
}

fn context(dir: &std::path::Path, session: &str) -> ToolContext {
    let home = Home::at(dir.join("home"));
    home.ensure().expect("home");
    let store = Arc::new(talaria_store::SqliteStore::open(&home.state_db()).expect("store"));
    ToolContext {
        session_id: session.into(),
        home,
        workdir: dir.to_path_buf(),
        config: Arc::new(Config::default()),
        store,
        interaction: Arc::new(Nobody),
        session: Arc::new(SessionState::default()),
        redactor: Redactor::default(),
        cancel: CancellationToken::new(),
        execution: talaria_agent::Execution::local(dir),
        tools: std::sync::Arc::new(talaria_agent::tools::Registry::new()),
        platform: None,
        progress: talaria_agent::Progress::none(),
    }
}

async fn site() -> String {
    let app = Router::new()
        .route(
            "/",
            get(|| async {
                Html(
                    "<!doctype html><html><head><title>Search</title></head><body>\
                     <form method=post action=/found><input name=q aria-label=\"Search for\">\
                     <button>Find</button></form>\
                     <img src=\"data:image/gif;base64,R0lGODlhAQABAAAAACw=\" alt=\"a dot\">\
                     <script>console.error('page says hi')</script></body></html>",
                )
            }),
        )
        .route(
            "/found",
            post(|body: String| async move {
                let q = body.strip_prefix("q=").unwrap_or("").replace('+', " ");
                Html(format!(
                    "<!doctype html><html><head><title>Found</title></head>\
                     <body><p>Results for {q}: none.</p></body></html>"
                ))
            }),
        )
        .route("/page2", get(|| async { Html("<h1>Second</h1>") }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

async fn call(
    tools: &[Arc<dyn Tool>],
    name: &str,
    args: Value,
    ctx: &ToolContext,
) -> Result<String, String> {
    let tool = tools
        .iter()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("no tool {name}"));
    // Through the dispatcher, as the model's calls go: it fences results.
    let (out, ok) = talaria_agent::dispatch::execute(tool.clone(), args, ctx.clone()).await;
    if ok {
        Ok(out)
    } else {
        let v: Value = serde_json::from_str(&out).unwrap_or_default();
        Err(v["error"].as_str().unwrap_or(&out).to_owned())
    }
}

/// What a fenced result holds, without the fence and its preamble.
fn fenced_body(text: &str) -> &str {
    assert!(
        text.starts_with("<untrusted_tool_result"),
        "not fenced: {text}"
    );
    let start = text.find("\n\n").map_or(0, |i| i + 2);
    let end = text
        .rfind("\n</untrusted_tool_result>")
        .unwrap_or(text.len());
    &text[start..end]
}

/// The ref on the line of `text` that mentions `needle`.
fn ref_on(text: &str, needle: &str) -> String {
    let line = text
        .lines()
        .find(|l| l.contains(needle) && l.contains("[@e"))
        .unwrap_or_else(|| panic!("no ref for {needle:?} in:\n{text}"));
    let start = line.find("[@e").map(|i| i + 1).unwrap_or(0);
    let end = line[start..]
        .find(']')
        .map(|i| start + i)
        .unwrap_or(line.len());
    line[start..end].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_searches_a_site_and_asks_about_the_screenshot() {
    let base = site().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = MockOpenAi::start().await;
    let provider = Arc::new(OpenAiProvider::new(
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
    ));
    let ctx = context(dir.path(), "conv-1");
    let vision = Arc::new(VisionAnalyzeTool::new(
        provider,
        vec![ctx.home.media_dir()],
        512,
    ));
    let tools = tools(Some(vision), dir.path());

    // A refused address: the guard's sentence, nothing started.
    let e = call(
        &tools,
        "browser_navigate",
        json!({"url": "http://10.1.2.3/admin"}),
        &ctx,
    )
    .await
    .expect_err("refused");
    assert!(
        e.starts_with("refused to fetch http://10.1.2.3/admin"),
        "{e}"
    );

    let page = call(
        &tools,
        "browser_navigate",
        json!({"url": format!("{base}/")}),
        &ctx,
    )
    .await
    .unwrap_or_else(|e| panic!("navigate: {e}"));
    assert!(
        page.starts_with("<untrusted_tool_result source=\"browser_navigate\">"),
        "page content is marked: {page}"
    );
    assert!(page.contains("Title: Search"), "{page}");
    let field = ref_on(&page, "textbox \"Search for\"");
    call(
        &tools,
        "browser_type",
        json!({"ref": field, "text": "blue whales"}),
        &ctx,
    )
    .await
    .expect("type");
    call(&tools, "browser_press", json!({"key": "Enter"}), &ctx)
        .await
        .expect("press Enter submits the form");
    let page = call(&tools, "browser_snapshot", json!({}), &ctx)
        .await
        .expect("snapshot");
    assert!(page.contains("Results for blue whales: none."), "{page}");

    let page = call(&tools, "browser_back", json!({}), &ctx)
        .await
        .expect("back");
    assert!(page.contains("Title: Search"), "{page}");
    let images = call(&tools, "browser_get_images", json!({}), &ctx)
        .await
        .expect("images");
    let images: Value = serde_json::from_str(fenced_body(&images)).expect("images JSON");
    assert_eq!(images["count"], 1, "{images}");
    assert_eq!(images["images"][0]["alt"], "a dot");

    let console = call(&tools, "browser_console", json!({"clear": true}), &ctx)
        .await
        .expect("console");
    assert!(console.contains("page says hi"), "{console}");
    let console = call(&tools, "browser_console", json!({}), &ctx)
        .await
        .expect("console");
    assert!(!console.contains("page says hi"), "cleared: {console}");
    let title = call(
        &tools,
        "browser_console",
        json!({"expression": "document.title"}),
        &ctx,
    )
    .await
    .expect("evaluate");
    assert!(title.contains(r#"{"result":"Search"}"#), "{title}");

    let scrolled = call(&tools, "browser_scroll", json!({"direction": "down"}), &ctx)
        .await
        .expect("scroll");
    assert!(
        fenced_body(&scrolled).starts_with("Scrolled down"),
        "{scrolled}"
    );
    let e = call(
        &tools,
        "browser_scroll",
        json!({"direction": "sideways"}),
        &ctx,
    )
    .await
    .expect_err("bad direction");
    assert!(e.contains("`up` or `down`"), "{e}");

    // browser_vision: the screenshot goes to the vision model, the answer
    // comes back with the screenshot's path in the media cache.
    mock.push(Reply::text("A search box and a Find button."));
    let answer = call(
        &tools,
        "browser_vision",
        json!({"question": "What is on the page?"}),
        &ctx,
    )
    .await
    .unwrap_or_else(|e| panic!("vision: {e}"));
    let answer: Value = serde_json::from_str(fenced_body(&answer)).expect("vision JSON");
    assert_eq!(answer["analysis"], "A search box and a Find button.");
    let shot = answer["screenshot_path"].as_str().expect("path");
    assert!(
        shot.starts_with(&ctx.home.media_dir().display().to_string()),
        "{shot}"
    );
    assert!(
        std::fs::read(shot)
            .expect("the screenshot")
            .starts_with(b"\x89PNG"),
        "a PNG"
    );
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 1);
    let content = &reqs[0].body["messages"][0]["content"];
    assert_eq!(content[0]["text"], "What is on the page?");
    assert_eq!(content[1]["type"], "image_url");

    // Another conversation has its own page.
    let other = context(dir.path(), "conv-2");
    let page = call(&tools, "browser_snapshot", json!({}), &other)
        .await
        .expect("snapshot");
    assert!(page.contains("URL: about:blank"), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_vision_model_the_screenshot_is_kept_and_said_so() {
    let base = site().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = context(dir.path(), "c");
    let tools = tools(None, dir.path());
    call(
        &tools,
        "browser_navigate",
        json!({"url": format!("{base}/page2")}),
        &ctx,
    )
    .await
    .expect("navigate");
    let out = call(
        &tools,
        "browser_vision",
        json!({"question": "what colour?", "annotate": true}),
        &ctx,
    )
    .await
    .expect("vision");
    let out: Value = serde_json::from_str(fenced_body(&out)).expect("JSON");
    assert!(
        out["note"]
            .as_str()
            .unwrap_or("")
            .contains("auxiliary.vision"),
        "{out}"
    );
    let shot = out["screenshot_path"].as_str().expect("path");
    assert!(
        std::fs::read(shot)
            .expect("screenshot")
            .starts_with(b"\x89PNG")
    );
    assert_eq!(out["media_tag"], format!("MEDIA:{shot}"));
}
