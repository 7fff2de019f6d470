//! A real MCP server for `talaria-mcp`'s integration tests.
//!
//! ```text
//! talaria-mcp-fixture [stdio]       MCP over stdin/stdout
//! talaria-mcp-fixture http [PORT]   Streamable HTTP at http://127.0.0.1:PORT/mcp
//!                                   (PORT 0 or absent: ephemeral); prints
//!                                   `listening on http://127.0.0.1:<port>/mcp`
//! ```
//!
//! Environment:
//! - `FIXTURE_STATE_DIR`: append one line per event to `starts.log` (pid),
//!   `calls.log` (tool name), `cancelled.log` (`slow`) and `env.log`
//!   (`secret=<FIXTURE_SECRET>`) in that directory.
//! - `FIXTURE_SECRET`: recorded in `env.log` at start.
//! - `FIXTURE_EXTRA_TOOLS=N`: N more echo-like tools `extra_0` … `extra_{N-1}`.
//! - `FIXTURE_REQUIRE_TOKEN=1`: HTTP requests need `Authorization: Bearer fixture-token`.
//!
//! Tools: `echo`, `add`, `slow`, `crash` (exits with status 3), `fail`
//! (`isError: true`), `grow` (adds a tool, sends `tools/list_changed`) and
//! `schema_zoo` (a schema full of constructs some LLM providers reject).
//! `tools/list` pages 5 tools at a time. One resource (`fixture://readme`) and
//! one prompt (`greet`).
#![forbid(unsafe_code)]

use std::{
    borrow::Cow,
    fs::{self, OpenOptions},
    io::Write as _,
    net::Ipv4Addr,
    path::PathBuf,
    process::ExitCode,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use axum::{
    Router,
    extract::Request,
    http::{StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use rmcp::{
    ErrorData, RoleServer, ServerHandler, ServiceExt,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock,
        GetPromptRequestParams, GetPromptResponse, GetPromptResult, Implementation, JsonObject,
        ListPromptsResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams, Prompt,
        PromptArgument, PromptMessage, ReadResourceRequestParams, ReadResourceResponse,
        ReadResourceResult, Resource, ResourceContents, Role, ServerCapabilities, ServerConfig,
        Tool, object,
    },
    service::RequestContext,
    transport::{
        StreamableHttpServerConfig, StreamableHttpService,
        streamable_http_server::session::local::LocalSessionManager,
    },
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Most tools in one `tools/list` page.
const PAGE_SIZE: usize = 5;
const README_URI: &str = "fixture://readme";
const BEARER: &str = "Bearer fixture-token";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

enum Mode {
    Stdio,
    Http { port: u16 },
}

/// What calling a tool does.
#[derive(Clone, Copy)]
enum Behaviour {
    Echo,
    Add,
    Slow,
    Crash,
    Fail,
    Grow,
    SchemaZoo,
}

/// State shared by every session of the process.
struct Shared {
    state_dir: Option<PathBuf>,
    /// Every tool in `tools/list` order: built-ins, then grown tools, then extras.
    tools: Mutex<Vec<(Tool, Behaviour)>>,
    extras: usize,
}

impl Shared {
    fn new(state_dir: Option<PathBuf>, extras: usize) -> Self {
        let mut tools = vec![
            (
                echo_tool("echo", "Echoes the text back, prefixed with `echo: `."),
                Behaviour::Echo,
            ),
            (
                Tool::new(
                    "add",
                    "Adds two numbers.",
                    object_schema(
                        json!({
                            "a": {"type": "number", "description": "First addend."},
                            "b": {"type": "number", "description": "Second addend."},
                        }),
                        &["a", "b"],
                    ),
                ),
                Behaviour::Add,
            ),
            (
                Tool::new(
                    "slow",
                    "Waits the given number of seconds, then answers; stops when cancelled.",
                    object_schema(
                        json!({"seconds": {"type": "number", "description": "How long to wait."}}),
                        &["seconds"],
                    ),
                ),
                Behaviour::Slow,
            ),
            (
                Tool::new(
                    "crash",
                    "Makes the server process exit with status 3.",
                    object_schema(json!({}), &[]),
                ),
                Behaviour::Crash,
            ),
            (
                Tool::new(
                    "fail",
                    "Always fails, as a tool error.",
                    object_schema(json!({}), &[]),
                ),
                Behaviour::Fail,
            ),
            (
                Tool::new(
                    "grow",
                    "Adds an echo-like tool with the given name and announces the new tool list.",
                    object_schema(
                        json!({"name": {"type": "string", "description": "Name of the new tool."}}),
                        &["name"],
                    ),
                ),
                Behaviour::Grow,
            ),
            (
                Tool::new(
                    "schema_zoo",
                    "Takes arguments described with schema constructs some LLM providers reject.",
                    Arc::new(object(json!({
                        "$schema": "https://json-schema.org/draft/2020-12/schema",
                        "type": "object",
                        "additionalProperties": false,
                        "properties": {
                            "nickname": {"type": ["string", "null"], "description": "A name, or null."},
                            "target": {
                                "description": "A path or a line number.",
                                "oneOf": [{"type": "string"}, {"type": "integer"}],
                            },
                            "homepage": {"type": "string", "format": "uri", "description": "A URL."},
                            "limit": {"type": "integer", "default": 10, "description": "At most this many."},
                        },
                    }))),
                ),
                Behaviour::SchemaZoo,
            ),
        ];
        tools.extend((0..extras).map(|i| {
            (
                echo_tool(format!("extra_{i}"), format!("extra tool {i}")),
                Behaviour::Echo,
            )
        }));
        Self {
            state_dir,
            tools: Mutex::new(tools),
            extras,
        }
    }

    fn tools(&self) -> std::sync::MutexGuard<'_, Vec<(Tool, Behaviour)>> {
        self.tools.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn find(&self, name: &str) -> Option<(Tool, Behaviour)> {
        self.tools()
            .iter()
            .find(|(tool, _)| tool.name == name)
            .cloned()
    }

    /// Adds an echo-like tool before the extras; false if the name is taken.
    fn grow(&self, name: &str) -> bool {
        let mut tools = self.tools();
        if tools.iter().any(|(tool, _)| tool.name == name) {
            return false;
        }
        let at = tools.len() - self.extras;
        tools.insert(
            at,
            (echo_tool(name.to_owned(), "grown tool"), Behaviour::Echo),
        );
        true
    }

    /// Appends `line` to `file` in the state directory, if there is one.
    fn record(&self, file: &str, line: &str) {
        let Some(dir) = &self.state_dir else { return };
        let path = dir.join(file);
        let written = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| {
                f.write_all(format!("{line}\n").as_bytes())
                    .and_then(|()| f.flush())
            });
        if let Err(error) = written {
            eprintln!("fixture: cannot append to {}: {error}", path.display());
        }
    }
}

fn object_schema(properties: Value, required: &[&str]) -> Arc<JsonObject> {
    let mut schema = object(json!({"type": "object", "properties": properties}));
    if !required.is_empty() {
        schema.insert("required".into(), json!(required));
    }
    Arc::new(schema)
}

fn echo_tool(
    name: impl Into<Cow<'static, str>>,
    description: impl Into<Cow<'static, str>>,
) -> Tool {
    Tool::new(
        name,
        description,
        object_schema(
            json!({"text": {"type": "string", "description": "Text to echo."}}),
            &["text"],
        ),
    )
}

fn text(text: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text)])
}

fn string_arg<'a>(args: &'a JsonObject, name: &str) -> Result<&'a str, ErrorData> {
    args.get(name).and_then(Value::as_str).ok_or_else(|| {
        ErrorData::invalid_params(format!("argument `{name}` must be a string"), None)
    })
}

fn number_arg(args: &JsonObject, name: &str) -> Result<f64, ErrorData> {
    args.get(name).and_then(Value::as_f64).ok_or_else(|| {
        ErrorData::invalid_params(format!("argument `{name}` must be a number"), None)
    })
}

/// One MCP session's handler; all sessions of the process share the tools.
#[derive(Clone)]
struct Fixture(Arc<Shared>);

impl Fixture {
    async fn slow(
        &self,
        args: &JsonObject,
        ct: &CancellationToken,
    ) -> Result<CallToolResult, ErrorData> {
        let seconds = number_arg(args, "seconds")?;
        let duration = Duration::try_from_secs_f64(seconds).map_err(|_| {
            ErrorData::invalid_params("argument `seconds` must be a non-negative number", None)
        })?;
        tokio::select! {
            () = tokio::time::sleep(duration) => Ok(text(format!("done after {seconds}s"))),
            // rmcp cancels the request's token on `notifications/cancelled`
            // (and when the session or transport closes); the reply is dropped.
            () = ct.cancelled() => {
                self.0.record("cancelled.log", "slow");
                Ok(CallToolResult::error(vec![ContentBlock::text("cancelled")]))
            }
        }
    }

    async fn grow(
        &self,
        args: &JsonObject,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let name = string_arg(args, "name")?;
        if name.is_empty() {
            return Err(ErrorData::invalid_params(
                "argument `name` must not be empty",
                None,
            ));
        }
        if !self.0.grow(name) {
            return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                "tool {name} already exists"
            ))]));
        }
        // On stdio this goes out before the reply; over Streamable HTTP rmcp
        // routes it to the session's standalone GET stream, unordered with it.
        if let Err(error) = context.peer.notify_tool_list_changed().await {
            eprintln!("fixture: cannot send tools/list_changed: {error}");
        }
        Ok(text(format!("grew {name}")))
    }
}

impl ServerHandler for Fixture {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_prompts()
            .enable_resources()
            .enable_tools()
            .enable_tool_list_changed()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("talaria-fixture", "1.0.0"))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.0.find(name).map(|(tool, _)| tool)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = self.0.tools();
        let start = match request.and_then(|r| r.cursor) {
            None => 0,
            Some(cursor) => cursor
                .parse::<usize>()
                .ok()
                .filter(|&i| i > 0 && i < tools.len() && i % PAGE_SIZE == 0)
                .ok_or_else(|| {
                    ErrorData::invalid_params(format!("unknown cursor {cursor:?}"), None)
                })?,
        };
        let end = tools.len().min(start + PAGE_SIZE);
        let mut page = ListToolsResult::with_all_items(
            tools[start..end]
                .iter()
                .map(|(tool, _)| tool.clone())
                .collect(),
        );
        page.next_cursor = (end < tools.len()).then(|| end.to_string());
        Ok(page)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.as_ref();
        self.0.record("calls.log", name);
        let (_, behaviour) = self
            .0
            .find(name)
            .ok_or_else(|| ErrorData::invalid_params(format!("tool not found: {name}"), None))?;
        let args = request.arguments.unwrap_or_default();
        let result = match behaviour {
            Behaviour::Echo => text(format!("echo: {}", string_arg(&args, "text")?)),
            Behaviour::Add => text((number_arg(&args, "a")? + number_arg(&args, "b")?).to_string()),
            Behaviour::Slow => self.slow(&args, &context.ct).await?,
            Behaviour::Crash => {
                eprintln!("fixture: crashing on purpose");
                std::process::exit(3)
            }
            Behaviour::Fail => {
                CallToolResult::error(vec![ContentBlock::text("it failed on purpose")])
            }
            Behaviour::Grow => self.grow(&args, &context).await?,
            Behaviour::SchemaZoo => text("zoo"),
        };
        Ok(result.into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let readme = Resource::new(README_URI, "readme").with_mime_type("text/plain");
        Ok(ListResourcesResult::with_all_items(vec![readme]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        if request.uri != README_URI {
            return Err(ErrorData::resource_not_found(
                format!("no resource {}", request.uri),
                None,
            ));
        }
        let contents = ResourceContents::text("the fixture readme", README_URI);
        Ok(ReadResourceResult::new(vec![contents]).into())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let name = PromptArgument::new("name")
            .with_description("Who to greet.")
            .with_required(true);
        let greet = Prompt::new("greet", Some("Greets someone by name."), Some(vec![name]));
        Ok(ListPromptsResult::with_all_items(vec![greet]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        if request.name != "greet" {
            return Err(ErrorData::invalid_params(
                format!("prompt not found: {}", request.name),
                None,
            ));
        }
        let args = request.arguments.unwrap_or_default();
        let name = string_arg(&args, "name")?;
        let message = PromptMessage::new_text(Role::User, format!("Hello, {name}!"));
        Ok(GetPromptResult::new(vec![message]).into())
    }
}

/// Answers 401 unless the request carries the fixture's bearer token.
async fn require_token(request: Request, next: Next) -> Response {
    if request
        .headers()
        .get(header::AUTHORIZATION)
        .is_some_and(|value| value == BEARER)
    {
        next.run(request).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "bearer token required\n",
        )
            .into_response()
    }
}

async fn serve_http(shared: Arc<Shared>, port: u16) -> Result<(), BoxError> {
    let service = StreamableHttpService::new(
        move || Ok(Fixture(shared.clone())),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let mut router = Router::new().route_service("/mcp", service);
    if std::env::var("FIXTURE_REQUIRE_TOKEN").is_ok_and(|v| v == "1") {
        router = router.layer(middleware::from_fn(require_token));
    }
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await?;
    let port = listener.local_addr()?.port();
    let mut stdout = std::io::stdout();
    writeln!(stdout, "listening on http://127.0.0.1:{port}/mcp")?;
    stdout.flush()?;
    axum::serve(listener, router).await?;
    Ok(())
}

fn parse_args(args: &[String]) -> Option<Mode> {
    match args {
        [] => Some(Mode::Stdio),
        [mode] if mode == "stdio" => Some(Mode::Stdio),
        [mode] if mode == "http" => Some(Mode::Http { port: 0 }),
        [mode, port] if mode == "http" => port.parse().ok().map(|port| Mode::Http { port }),
        _ => None,
    }
}

async fn run(mode: Mode) -> Result<(), BoxError> {
    let extras = match std::env::var("FIXTURE_EXTRA_TOOLS") {
        Ok(n) => n
            .parse()
            .map_err(|_| format!("FIXTURE_EXTRA_TOOLS must be a count, not {n:?}"))?,
        Err(_) => 0,
    };
    let state_dir = std::env::var_os("FIXTURE_STATE_DIR").map(PathBuf::from);
    if let Some(dir) = &state_dir {
        fs::create_dir_all(dir)?;
    }
    let shared = Arc::new(Shared::new(state_dir, extras));
    shared.record("starts.log", &std::process::id().to_string());
    if let Ok(secret) = std::env::var("FIXTURE_SECRET") {
        shared.record("env.log", &format!("secret={secret}"));
    }
    match mode {
        Mode::Stdio => {
            let running = Fixture(shared).serve(rmcp::transport::stdio()).await?;
            running.waiting().await?;
            Ok(())
        }
        Mode::Http { port } => serve_http(shared, port).await,
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Result<Vec<String>, _> = std::env::args_os()
        .skip(1)
        .map(|a| a.into_string())
        .collect();
    let Some(mode) = args.ok().as_deref().and_then(parse_args) else {
        eprintln!("usage: talaria-mcp-fixture [stdio | http [PORT]]");
        return ExitCode::from(2);
    };
    eprintln!("fixture started pid={}", std::process::id());
    match run(mode).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("fixture: {error}");
            ExitCode::FAILURE
        }
    }
}
