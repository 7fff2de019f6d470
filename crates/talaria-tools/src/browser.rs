//! The `browser_*` tools (the ancestor's names and arguments): a headless
//! Chromium a conversation drives through element refs from an
//! accessibility snapshot, every request it makes decided by the URL guard
//! (see `talaria_web::browser`).
//!
//! Each conversation (its session id) has its own browser context. What a
//! page says is the page's: every result that carries page content says so
//! first, so the model reads it as data rather than as instructions.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_agent::tools::vision::VisionAnalyzeTool;
use talaria_agent::tools::{Tool, ToolContext, ToolError, ToolResult};
use talaria_media::{Hint, MediaCache};
use talaria_web::browser::{Browser, Direction};

/// Longest text `browser_type` accepts.
const MAX_TYPE_CHARS: usize = 20_000;

/// Longest expression `browser_console` evaluates.
const MAX_EXPRESSION_CHARS: usize = 10_000;

/// The ten tools over one shared `browser`. `vision` (the
/// `vision_analyze` tool, when an auxiliary vision model is configured)
/// answers `browser_vision`'s question about the screenshot; without it
/// `browser_vision` returns the screenshot's path for the model to send or
/// look at otherwise.
pub fn browser_tools(
    browser: Arc<Browser>,
    vision: Option<Arc<VisionAnalyzeTool>>,
) -> Vec<Arc<dyn Tool>> {
    use Kind::*;
    [
        Navigate, Snapshot, Click, Type, Scroll, Back, Press, GetImages, Vision, Console,
    ]
    .into_iter()
    .map(|kind| {
        Arc::new(BrowserTool {
            kind,
            browser: browser.clone(),
            vision: vision.clone(),
        }) as Arc<dyn Tool>
    })
    .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Navigate,
    Snapshot,
    Click,
    Type,
    Scroll,
    Back,
    Press,
    GetImages,
    Vision,
    Console,
}

/// One of the ten tools.
struct BrowserTool {
    kind: Kind,
    browser: Arc<Browser>,
    vision: Option<Arc<VisionAnalyzeTool>>,
}

fn req_str<'a>(args: &'a Value, name: &str) -> Result<&'a str, ToolError> {
    match args.get(name) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(ToolError::new(format!("`{name}` must be a string"))),
        None => Err(ToolError::new(format!("`{name}` is required"))),
    }
}

fn opt_bool(args: &Value, name: &str) -> Result<bool, ToolError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ToolError::new(format!("`{name}` must be true or false"))),
    }
}

fn err(e: talaria_web::browser::BrowserError) -> ToolError {
    ToolError::new(e.to_string())
}

/// Page content as a result: the dispatcher fences it as outside data
/// (every browser tool's output is untrusted).
fn page_text(body: &str) -> String {
    body.to_owned()
}

#[async_trait]
impl Tool for BrowserTool {
    fn untrusted_output(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        match self.kind {
            Kind::Navigate => "browser_navigate",
            Kind::Snapshot => "browser_snapshot",
            Kind::Click => "browser_click",
            Kind::Type => "browser_type",
            Kind::Scroll => "browser_scroll",
            Kind::Back => "browser_back",
            Kind::Press => "browser_press",
            Kind::GetImages => "browser_get_images",
            Kind::Vision => "browser_vision",
            Kind::Console => "browser_console",
        }
    }

    fn description(&self) -> &str {
        match self.kind {
            Kind::Navigate => {
                "Open a URL in this conversation's headless browser and wait for it to load. \
                 Answers with the page's compact snapshot: its text and its interactive \
                 elements, each with a ref like @e3 for browser_click and browser_type. To just \
                 read a page, web_extract is faster; use the browser to click, fill forms or \
                 read pages built by scripts. Private and local addresses are refused."
            }
            Kind::Snapshot => {
                "Read the current page as an accessibility tree: headings, text, links and \
                 form controls, interactive ones marked with refs (@e1, @e2...). Take a new one \
                 after the page changes; refs from an older snapshot may be stale. full=true \
                 lists every element instead of the compact view."
            }
            Kind::Click => {
                "Click the element with the given ref from the latest snapshot (for example \
                 @e5): a link, a button, a checkbox. Waits for a page it opens to load."
            }
            Kind::Type => {
                "Type text into the input field with the given ref from the latest snapshot. \
                 What the field held is cleared first. Press Enter with browser_press or click \
                 the form's button to submit."
            }
            Kind::Scroll => {
                "Scroll the current page up or down by most of a screen, to bring more of it \
                 into view."
            }
            Kind::Back => "Go back to the previous page in this browser's history.",
            Kind::Press => {
                "Press a key in the focused element: Enter (submits a form), Tab, Escape, \
                 Backspace, ArrowDown and the other arrows, PageUp, PageDown, or a single \
                 character."
            }
            Kind::GetImages => {
                "List the images on the current page with their addresses and alt text."
            }
            Kind::Vision => {
                "Take a screenshot of the current page and have a vision model answer a \
                 question about it: for layouts, charts, CAPTCHAs or anything the text \
                 snapshot misses. The answer comes with the screenshot's path, which you can \
                 send to the user with a MEDIA:<path> line. annotate=true draws each element's \
                 ref number on the screenshot."
            }
            Kind::Console => {
                "Read the current page's console: its log, warning and error messages and \
                 uncaught script errors. clear=true empties the list after reading. With \
                 expression, evaluates that JavaScript in the page and answers with its value \
                 (as JSON) instead."
            }
        }
    }

    fn parameters(&self) -> Value {
        let reference = json!({
            "type": "string",
            "description": "an element ref from the latest snapshot, like @e5"
        });
        match self.kind {
            Kind::Navigate => json!({
                "type": "object",
                "properties": {
                    "url": {"type": "string", "description": "the address to open (https://...)"}
                },
                "required": ["url"]
            }),
            Kind::Snapshot => json!({
                "type": "object",
                "properties": {
                    "full": {
                        "type": "boolean",
                        "default": false,
                        "description": "every element of the page instead of the compact view"
                    }
                },
                "required": []
            }),
            Kind::Click => json!({
                "type": "object",
                "properties": {"ref": reference},
                "required": ["ref"]
            }),
            Kind::Type => json!({
                "type": "object",
                "properties": {
                    "ref": reference,
                    "text": {"type": "string", "description": "what to type into the field"}
                },
                "required": ["ref", "text"]
            }),
            Kind::Scroll => json!({
                "type": "object",
                "properties": {
                    "direction": {
                        "type": "string",
                        "enum": ["up", "down"],
                        "description": "which way to scroll"
                    }
                },
                "required": ["direction"]
            }),
            Kind::Back | Kind::GetImages => json!({
                "type": "object",
                "properties": {},
                "required": []
            }),
            Kind::Press => json!({
                "type": "object",
                "properties": {
                    "key": {
                        "type": "string",
                        "description": "the key's name (Enter, Tab, Escape, ArrowDown...) or one character"
                    }
                },
                "required": ["key"]
            }),
            Kind::Vision => json!({
                "type": "object",
                "properties": {
                    "question": {
                        "type": "string",
                        "description": "what to find out from the page's appearance; be specific"
                    },
                    "annotate": {
                        "type": "boolean",
                        "default": false,
                        "description": "label each interactive element with its ref number [N] (@eN)"
                    }
                },
                "required": ["question"]
            }),
            Kind::Console => json!({
                "type": "object",
                "properties": {
                    "clear": {
                        "type": "boolean",
                        "default": false,
                        "description": "empty the collected messages after reading them"
                    },
                    "expression": {
                        "type": "string",
                        "description": "JavaScript to evaluate in the page (document.title, ...); its value is returned as JSON"
                    }
                },
                "required": []
            }),
        }
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolResult {
        let key = ctx.session_id.as_str();
        let b = &self.browser;
        let work = async {
            match self.kind {
                Kind::Navigate => {
                    let url = req_str(&args, "url")?;
                    let view = b.navigate(key, url).await.map_err(err)?;
                    Ok(page_text(&view.render()))
                }
                Kind::Snapshot => {
                    let full = opt_bool(&args, "full")?;
                    let view = b.snapshot(key, full).await.map_err(err)?;
                    Ok(page_text(&view.render()))
                }
                Kind::Click => {
                    let r = req_str(&args, "ref")?;
                    b.click(key, r).await.map_err(err)
                }
                Kind::Type => {
                    let r = req_str(&args, "ref")?;
                    let text = req_str(&args, "text")?;
                    if text.chars().count() > MAX_TYPE_CHARS {
                        return Err(ToolError::new(format!(
                            "`text` is too long: at most {MAX_TYPE_CHARS} characters"
                        )));
                    }
                    b.type_text(key, r, text).await.map_err(err)
                }
                Kind::Scroll => {
                    let direction = match req_str(&args, "direction")? {
                        "up" => Direction::Up,
                        "down" => Direction::Down,
                        other => {
                            return Err(ToolError::new(format!(
                                "`direction` is `up` or `down`, not `{other}`"
                            )));
                        }
                    };
                    b.scroll(key, direction).await.map_err(err)
                }
                Kind::Back => {
                    let view = b.back(key).await.map_err(err)?;
                    Ok(page_text(&view.render()))
                }
                Kind::Press => {
                    let name = req_str(&args, "key")?;
                    b.press(key, name).await.map_err(err)
                }
                Kind::GetImages => {
                    let images = b.images(key).await.map_err(err)?;
                    let list: Vec<Value> = images
                        .iter()
                        .map(|i| json!({"src": i.src, "alt": i.alt}))
                        .collect();
                    Ok(page_text(
                        &json!({"count": list.len(), "images": list}).to_string(),
                    ))
                }
                Kind::Vision => self.vision(&args, ctx).await,
                Kind::Console => {
                    let clear = opt_bool(&args, "clear")?;
                    match args.get("expression") {
                        Some(Value::String(expr)) if !expr.trim().is_empty() => {
                            if expr.chars().count() > MAX_EXPRESSION_CHARS {
                                return Err(ToolError::new(format!(
                                    "`expression` is too long: at most {MAX_EXPRESSION_CHARS} characters"
                                )));
                            }
                            let value = b.evaluate(key, expr).await.map_err(err)?;
                            if clear {
                                b.console(key, true).await.map_err(err)?;
                            }
                            Ok(page_text(&json!({"result": value}).to_string()))
                        }
                        Some(Value::String(_)) | None | Some(Value::Null) => {
                            let entries = b.console(key, clear).await.map_err(err)?;
                            let list: Vec<Value> = entries
                                .iter()
                                .map(|e| json!({"level": e.level, "text": e.text}))
                                .collect();
                            Ok(page_text(
                                &json!({"count": list.len(), "messages": list}).to_string(),
                            ))
                        }
                        Some(_) => Err(ToolError::new("`expression` must be a string")),
                    }
                }
            }
        };
        tokio::select! {
            out = work => out,
            () = ctx.cancel.cancelled() => Err(ToolError::new("interrupted")),
        }
    }
}

impl BrowserTool {
    /// `browser_vision`: a screenshot into the media cache, then the
    /// question to the vision model about it.
    async fn vision(&self, args: &Value, ctx: &ToolContext) -> ToolResult {
        let question = req_str(args, "question")?;
        let annotate = opt_bool(args, "annotate")?;
        let png = self
            .browser
            .screenshot(&ctx.session_id, annotate)
            .await
            .map_err(err)?;
        let cache = MediaCache::for_home(&ctx.home, &ctx.config.media);
        let stored = cache
            .store(
                png.as_slice(),
                Hint {
                    name: Some("screenshot.png"),
                    mime: Some("image/png"),
                    voice: false,
                },
            )
            .await
            .map_err(|e| ToolError::new(format!("the screenshot could not be kept: {e}")))?;
        let path = stored.path.display().to_string();
        let Some(vision) = &self.vision else {
            return Ok(json!({
                "success": true,
                "screenshot_path": path,
                "media_tag": format!("MEDIA:{path}"),
                "note": "No vision model is configured (auxiliary.vision), so the screenshot \
                         was not analysed. Use browser_snapshot to read the page as text, or \
                         send the screenshot to the user with the media_tag line."
            })
            .to_string());
        };
        let answer = vision.analyze(&stored.path, question, &ctx.cancel).await?;
        // The answer describes the page, and may quote it.
        Ok(page_text(
            &json!({
                "success": true,
                "analysis": answer,
                "screenshot_path": path,
                "media_tag": format!("MEDIA:{path}"),
            })
            .to_string(),
        ))
    }
}
