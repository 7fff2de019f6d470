//! The tool seam: the [`Tool`] trait, what a call can see ([`ToolContext`]),
//! and the [`Registry`] the turn loop dispatches through.
//!
//! Adding a tool is one file: implement [`Tool`] and register it in
//! [`Registry::with_core_tools`].

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use talaria_core::{Config, Home, Redactor};
use talaria_llm::ToolSpec;
use talaria_store::SessionStore;
use tokio_util::sync::CancellationToken;

use crate::interaction::Interaction;

pub mod clarify;
pub mod delegate;
pub mod execute_code;
pub mod files;
pub mod guard;
pub mod media_out;
pub mod memory;
pub mod patch;
pub mod process;
pub mod search_files;
pub mod secret_files;
pub mod send_message;
pub mod session_search;
pub mod terminal;
pub mod threat;
pub mod todo;
pub mod vision;

/// A failed tool call. The loop turns it into `{"error": "..."}` for the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

impl ToolError {
    /// A failure whose `message` the model will read.
    pub fn new(message: impl Into<String>) -> ToolError {
        ToolError(message.into())
    }
}

/// What a tool call returns: text for the model, or an error it is told about.
pub type ToolResult = Result<String, ToolError>;

/// A capability the model can call.
#[async_trait]
pub trait Tool: Send + Sync {
    /// The name the model calls; ancestor-compatible for the core tools.
    fn name(&self) -> &str;
    /// One or two sentences for the model.
    fn description(&self) -> &str;
    /// JSON schema of the arguments object.
    fn parameters(&self) -> serde_json::Value;
    /// Whether calls may run concurrently with other parallel-safe calls
    /// (true only for tools that change nothing).
    fn parallel_safe(&self) -> bool {
        false
    }
    /// Runs one call. `args` is already a JSON object.
    async fn call(&self, args: serde_json::Value, ctx: &ToolContext) -> ToolResult;

    /// Text the tool adds to the system prompt of each new session (the
    /// skills index), read when the session starts; `None` for most tools.
    fn prompt_block(&self) -> Option<String> {
        None
    }

    /// Another name the model may call the tool by (an older spelling that
    /// skills and prompts still use); offered under [`Tool::name`] only.
    fn alias(&self) -> Option<&str> {
        None
    }

    /// Whether what the tool returns was written by someone outside (a web
    /// page, a search service, an MCP server): its results are then fenced
    /// as data by [`crate::untrusted::wrap`].
    fn untrusted_output(&self) -> bool {
        false
    }

    /// The provider-facing description.
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name().to_owned(),
            description: self.description().to_owned(),
            parameters: self.parameters(),
        }
    }
}

/// State that lives as long as one session in this process.
#[derive(Debug, Default)]
pub struct SessionState {
    /// The `todo` tool's list.
    pub todos: Mutex<Vec<todo::TodoItem>>,
    /// Dangerous-command pattern keys the user approved for this session.
    pub approved_patterns: Mutex<HashSet<String>>,
    /// Text the user sent while a turn was running, waiting to be handed to
    /// the model after the next tool batch.
    pub steer: Mutex<Vec<String>>,
    /// Variables the skills loaded in this session declared they need
    /// (`required_environment_variables`): the owner's commands get them.
    pub skill_env: Mutex<std::collections::BTreeSet<String>>,
}

impl SessionState {
    /// Queues `text` for the running turn: it reaches the model after the
    /// next tool batch. Text left when the turn ends is the caller's to take
    /// back with [`SessionState::take_steer`].
    pub fn push_steer(&self, text: &str) {
        self.steer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(text.to_owned());
    }

    /// Everything queued by [`SessionState::push_steer`], oldest first.
    pub fn take_steer(&self) -> Vec<String> {
        std::mem::take(&mut *self.steer.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// What a tool call can see and use.
#[derive(Clone)]
pub struct ToolContext {
    /// The session the call belongs to (memory, todo and spill files key on it).
    pub session_id: String,
    /// `TALARIA_HOME`: memory, skills and spilled output live under it.
    pub home: Home,
    /// Working directory for relative paths and commands.
    pub workdir: PathBuf,
    /// The loaded configuration (timeouts, output limits, approval mode).
    pub config: Arc<Config>,
    /// The session store, for tools that read past conversations.
    pub store: Arc<dyn SessionStore>,
    /// Asks the human (approvals, clarifying questions).
    pub interaction: Arc<dyn Interaction>,
    /// The session's process-local state (todo list, approvals granted).
    pub session: Arc<SessionState>,
    /// Applied to tool output before the model sees it.
    pub redactor: Redactor,
    /// Fires when the turn is interrupted; long tools must watch it.
    pub cancel: CancellationToken,
    /// Where commands run and which files the tools may touch.
    pub execution: crate::execution::Execution,
    /// The tools offered in this turn: what `execute_code` may call and
    /// what a subagent may inherit.
    pub tools: Arc<Registry>,
    /// The platform the conversation is on (`telegram`, `cli`,
    /// `api_server`); `None` for scheduled jobs and subagents.
    pub platform: Option<String>,
    /// Lines for the turn's observer while this call runs.
    pub progress: crate::observer::Progress,
}

/// Tools that come and go while the agent runs (an MCP server's): asked
/// for its current tools at the start of every turn.
#[async_trait]
pub trait ToolSource: Send + Sync {
    /// What to call the source in logs.
    fn name(&self) -> &str;
    /// The tools offered now. A source bounds its own wait (a server that
    /// is slow to start) and, when it cannot answer, logs why and returns
    /// what it has: a broken source costs its tools, never the turn.
    async fn tools(&self) -> Vec<Arc<dyn Tool>>;
    /// Re-reads the source's configuration (`/reload-mcp`); says what
    /// changed, or why it could not. Sources without one say so.
    async fn reload(&self) -> Result<String, String> {
        Ok(format!("{} has nothing to reload", self.name()))
    }
}

/// The tools available to the model, by name.
#[derive(Clone, Default)]
pub struct Registry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    /// Asked for more tools at each turn (see [`Registry::for_turn`]).
    sources: Vec<Arc<dyn ToolSource>>,
    /// Names withheld with [`Registry::without`], from sources too.
    withheld: Vec<String>,
    /// The toolsets offered ([`Registry::offered`]), from sources too;
    /// `None` offers every one.
    toolsets: Option<Vec<String>>,
    /// Source tools already reported for clashing with a built-in, so a
    /// clash is logged once, not every turn.
    clashes: Arc<Mutex<HashSet<String>>>,
}

impl Registry {
    /// An empty registry; front ends register the tools they offer.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Adds a tool. A name already taken is refused: the first one stays.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), String> {
        let name = tool.name().to_owned();
        if self.tools.contains_key(&name) {
            return Err(format!("a tool named `{name}` is already registered"));
        }
        self.tools.insert(name, tool);
        Ok(())
    }

    /// Puts `tool` in place of the tool of the same name (or adds it): a
    /// front end wrapping a core tool (the learning log wraps `memory`).
    pub fn replace(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.name().to_owned(), tool);
    }

    /// The tool registered under `name`, as the model calls it, or whose
    /// [`Tool::alias`] it is.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        // Aliases are the rare path (an older spelling): looked for only
        // when no tool has the name.
        self.tools
            .get(name)
            .or_else(|| self.tools.values().find(|t| t.alias() == Some(name)))
    }

    /// Tool names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.tools.keys().map(String::as_str).collect()
    }

    /// Provider-facing specs, sorted by name (a stable order keeps the
    /// provider's prompt cache warm).
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.values().map(|t| t.spec()).collect()
    }

    /// Whether no tool is registered (the model is then offered none).
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The registered tools, in name order.
    pub fn tools(&self) -> impl Iterator<Item = &Arc<dyn Tool>> {
        self.tools.values()
    }

    /// This registry without the tools named in `names` (names it does not
    /// hold are ignored), also when a source offers them.
    pub fn without(&self, names: &[&str]) -> Registry {
        let mut registry = self.clone();
        for name in names {
            registry.tools.remove(*name);
            registry.withheld.push((*name).to_owned());
        }
        registry
    }

    /// This registry with only the tools of the `enabled` toolsets (a
    /// platform's `platform_toolsets` entry), also when a source offers
    /// them; see [`talaria_core::toolsets::offers`].
    pub fn offered(&self, enabled: &[String]) -> Registry {
        let mut registry = self.clone();
        registry
            .tools
            .retain(|name, _| talaria_core::toolsets::offers(enabled, name));
        registry.toolsets = Some(enabled.to_vec());
        registry
    }

    /// Adds a source of tools that may change between turns.
    pub fn add_source(&mut self, source: Arc<dyn ToolSource>) {
        self.sources.push(source);
    }

    /// Reloads every source (`/reload-mcp`, the same in the terminal and
    /// in chats): a line each, saying what changed or why it could not.
    pub async fn reload_sources(&self) -> String {
        if self.sources.is_empty() {
            return "No MCP servers are configured (mcp_servers: in config.yaml).".to_owned();
        }
        let mut out = Vec::new();
        for source in &self.sources {
            out.push(match source.reload().await {
                Ok(summary) => summary,
                Err(e) => format!("{}: {e}", source.name()),
            });
        }
        out.join("\n")
    }

    /// Whether any tool comes from a source (the turn must ask them).
    pub fn has_sources(&self) -> bool {
        !self.sources.is_empty()
    }

    /// The tools of one turn: these tools plus what each source offers
    /// now. A source tool named like a tool already present is left out
    /// (built-ins win) and the clash is logged once.
    pub async fn for_turn(&self) -> Registry {
        let mut tools = self.tools.clone();
        for source in &self.sources {
            for tool in source.tools().await {
                let name = tool.name().to_owned();
                if self.withheld.contains(&name)
                    || self
                        .toolsets
                        .as_ref()
                        .is_some_and(|sets| !talaria_core::toolsets::offers(sets, &name))
                {
                    continue;
                }
                if tools.contains_key(&name) {
                    let first = self
                        .clashes
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(name.clone());
                    if first {
                        tracing::warn!(tool = %name, source = source.name(), "a tool from this source has the name of a tool already present; the source's is left out");
                    }
                    continue;
                }
                tools.insert(name, tool);
            }
        }
        Registry {
            tools,
            sources: Vec::new(),
            withheld: Vec::new(),
            toolsets: None,
            clashes: self.clashes.clone(),
        }
    }
}

impl Registry {
    /// The built-in tools: `terminal`, `read_file`, `write_file`, `patch`,
    /// `search_files`, `session_search`, `todo`, `clarify`, and `memory`
    /// when `config.memory.enabled`.
    pub fn with_core_tools(config: &Config) -> Registry {
        let mut tools: Vec<Arc<dyn Tool>> = vec![
            Arc::new(terminal::TerminalTool::default()),
            Arc::new(files::ReadFileTool),
            Arc::new(files::WriteFileTool),
            Arc::new(files::PatchTool),
            Arc::new(search_files::SearchFilesTool),
            Arc::new(session_search::SessionSearchTool),
            Arc::new(todo::TodoTool),
            Arc::new(clarify::ClarifyTool),
        ];
        if config.memory.enabled {
            tools.push(Arc::new(memory::MemoryTool));
        }
        let mut registry = Registry::new();
        for tool in tools {
            // The names above are distinct constants, so a refusal here would
            // be a programming error caught by the registry tests; it is not
            // worth failing agent start-up over.
            if let Err(e) = registry.register(tool) {
                tracing::error!("{e}");
            }
        }
        registry
    }
}

/// The value of argument `name`, treating JSON `null` as absent (models often
/// send `null` for optional fields).
fn arg<'a>(args: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    args.get(name).filter(|v| !v.is_null())
}

/// An optional string argument; any other JSON type is an error naming it.
pub(crate) fn opt_str<'a>(
    args: &'a serde_json::Value,
    name: &str,
) -> Result<Option<&'a str>, ToolError> {
    match arg(args, name) {
        None => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ToolError::new(format!(
            "argument `{name}` must be a string, got {}",
            json_type(other)
        ))),
    }
}

/// A required string argument.
pub(crate) fn req_str<'a>(args: &'a serde_json::Value, name: &str) -> Result<&'a str, ToolError> {
    opt_str(args, name)?
        .ok_or_else(|| ToolError::new(format!("missing required argument `{name}` (a string)")))
}

/// An optional non-negative integer argument. Integral floats and numeric
/// strings are accepted because models produce both.
pub(crate) fn opt_u64(args: &serde_json::Value, name: &str) -> Result<Option<u64>, ToolError> {
    let bad = |v: &serde_json::Value| {
        ToolError::new(format!(
            "argument `{name}` must be a non-negative integer, got {}",
            json_type(v)
        ))
    };
    match arg(args, name) {
        None => Ok(None),
        Some(v @ serde_json::Value::Number(n)) => {
            if let Some(u) = n.as_u64() {
                Ok(Some(u))
            } else if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0) {
                // Saturating: an absurdly large value is clamped by callers.
                Ok(Some(if f >= u64::MAX as f64 {
                    u64::MAX
                } else {
                    f as u64
                }))
            } else {
                Err(bad(v))
            }
        }
        Some(v @ serde_json::Value::String(s)) => {
            s.trim().parse::<u64>().map(Some).map_err(|_| bad(v))
        }
        Some(v) => Err(bad(v)),
    }
}

/// An optional boolean argument; `"true"`/`"false"` strings are accepted.
pub(crate) fn opt_bool(args: &serde_json::Value, name: &str) -> Result<Option<bool>, ToolError> {
    match arg(args, name) {
        None => Ok(None),
        Some(serde_json::Value::Bool(b)) => Ok(Some(*b)),
        Some(serde_json::Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(Some(true)),
        Some(serde_json::Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(Some(false)),
        Some(v) => Err(ToolError::new(format!(
            "argument `{name}` must be true or false, got {}",
            json_type(v)
        ))),
    }
}

/// An optional array argument.
pub(crate) fn opt_array<'a>(
    args: &'a serde_json::Value,
    name: &str,
) -> Result<Option<&'a Vec<serde_json::Value>>, ToolError> {
    match arg(args, name) {
        None => Ok(None),
        Some(serde_json::Value::Array(a)) => Ok(Some(a)),
        Some(v) => Err(ToolError::new(format!(
            "argument `{name}` must be an array, got {}",
            json_type(v)
        ))),
    }
}

/// A JSON type name for error messages.
pub(crate) fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Resolves a path argument. In a confined conversation (isolated or not
/// the owner's) the path must lie inside the workspace: relative paths
/// start there, `/workspace/...` and `~` name it, and anything leading out
/// (by `..` or a symlink) is refused. Otherwise `~/` is the user's home and
/// relative paths are against the working directory; `..` is allowed on
/// purpose, since the agent edits wherever its owner could.
pub(crate) fn resolve_path(ctx: &ToolContext, raw: &str) -> Result<PathBuf, ToolError> {
    if let Some(ws) = &ctx.execution.workspace {
        return ws.resolve(raw).map_err(ToolError::new);
    }
    if ctx.execution.confined() {
        // No workspace to confine to: the tool should have been withheld.
        return Err(ToolError::new(
            "file tools are not available in this conversation (its commands run elsewhere)",
        ));
    }
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
    if raw == "~" {
        if let Some(h) = home {
            return Ok(PathBuf::from(h));
        }
    } else if let Some(rest) = raw.strip_prefix("~/")
        && let Some(h) = home
    {
        return Ok(PathBuf::from(h).join(rest));
    }
    Ok(ctx.workdir.join(raw))
}

/// `path` as the model should see it: inside a workspace, the path its
/// commands see (`/workspace/...`), not where it lies on the host.
pub(crate) fn shown_path(ctx: &ToolContext, path: &std::path::Path) -> String {
    match &ctx.execution.workspace {
        Some(ws) => ws.to_inner(path).display().to_string(),
        None => path.display().to_string(),
    }
}

/// The directory relative paths start from: the workspace in a confined
/// conversation, the working directory otherwise.
pub(crate) fn base_dir(ctx: &ToolContext) -> PathBuf {
    match &ctx.execution.workspace {
        Some(ws) => ws.host().to_path_buf(),
        None => ctx.workdir.clone(),
    }
}

/// Replaces `path` with `bytes` so that readers see the old or the new file,
/// never a torn one: temp file in the same directory, fsync, rename. An
/// existing file's permissions are carried over.
pub(crate) fn atomic_write(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".talaria-")
        .suffix(".tmp")
        .tempfile_in(&dir)?;
    tmp.write_all(bytes)?;
    if let Ok(meta) = std::fs::metadata(path) {
        // Best effort: a file we may not chmod is still worth writing.
        let _ = std::fs::set_permissions(tmp.path(), meta.permissions());
    }
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    // The rename is durable only once the directory entry is on disk.
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// At most `max` characters of `text`, with a marker saying how much was cut.
pub(crate) fn truncate_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((cut, _)) => {
            let rest = text[cut..].chars().count();
            format!("{}… [{rest} more chars]", &text[..cut])
        }
    }
}
