//! The model, its fallbacks, and how the agent runs: turns, memory,
//! compression, approvals, the terminal tool.

use super::*;

/// Which API a provider speaks and where it lives by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// Any OpenAI-compatible endpoint (llama.cpp, vLLM, Ollama, LM Studio, ...).
    #[default]
    Custom,
    /// OpenAI's own API.
    Openai,
    /// OpenRouter, one key for many models.
    Openrouter,
    /// Anthropic's Messages API.
    Anthropic,
    /// Google Gemini through its OpenAI-compatible endpoint.
    Gemini,
    /// DeepSeek's API.
    Deepseek,
    /// Groq's API.
    Groq,
    /// Mistral's API.
    Mistral,
    /// xAI's API (Grok).
    #[serde(alias = "x-ai", alias = "grok")]
    Xai,
    /// Together AI.
    Together,
    /// Fireworks AI.
    Fireworks,
    /// Nous Research's Portal.
    Nous,
    /// A local Ollama server.
    Ollama,
    /// Ollama's hosted models.
    #[serde(rename = "ollama-cloud", alias = "ollama_cloud")]
    OllamaCloud,
    /// A local LM Studio server.
    #[serde(alias = "lm-studio")]
    Lmstudio,
    /// A local vLLM server.
    Vllm,
    /// A local llama.cpp server (`llama-server`).
    #[serde(alias = "llama.cpp", alias = "llama-cpp")]
    Llamacpp,
}

impl ProviderKind {
    /// Every kind, in the order `talaria setup` offers them.
    pub const ALL: [ProviderKind; 17] = [
        ProviderKind::Custom,
        ProviderKind::Openai,
        ProviderKind::Openrouter,
        ProviderKind::Anthropic,
        ProviderKind::Gemini,
        ProviderKind::Deepseek,
        ProviderKind::Groq,
        ProviderKind::Mistral,
        ProviderKind::Xai,
        ProviderKind::Together,
        ProviderKind::Fireworks,
        ProviderKind::Nous,
        ProviderKind::Ollama,
        ProviderKind::OllamaCloud,
        ProviderKind::Lmstudio,
        ProviderKind::Vllm,
        ProviderKind::Llamacpp,
    ];

    /// The name used in `config.yaml` and in messages (`custom`, `openai`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Custom => "custom",
            ProviderKind::Openai => "openai",
            ProviderKind::Openrouter => "openrouter",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Gemini => "gemini",
            ProviderKind::Deepseek => "deepseek",
            ProviderKind::Groq => "groq",
            ProviderKind::Mistral => "mistral",
            ProviderKind::Xai => "xai",
            ProviderKind::Together => "together",
            ProviderKind::Fireworks => "fireworks",
            ProviderKind::Nous => "nous",
            ProviderKind::Ollama => "ollama",
            ProviderKind::OllamaCloud => "ollama-cloud",
            ProviderKind::Lmstudio => "lmstudio",
            ProviderKind::Vllm => "vllm",
            ProviderKind::Llamacpp => "llamacpp",
        }
    }

    /// Parses a name as `config.yaml` takes it (aliases included);
    /// `None` for anything else.
    pub fn parse(name: &str) -> Option<ProviderKind> {
        serde_json::from_value(serde_json::Value::String(name.trim().to_ascii_lowercase())).ok()
    }

    /// The environment variables that may hold this provider's key, in
    /// the order they are tried; the first is the one messages name.
    /// Local servers and `custom` take `OPENAI_API_KEY`, the convention
    /// of OpenAI-compatible servers, and need none.
    pub fn api_key_envs(self) -> &'static [&'static str] {
        match self {
            ProviderKind::Custom
            | ProviderKind::Openai
            | ProviderKind::Ollama
            | ProviderKind::Lmstudio
            | ProviderKind::Vllm
            | ProviderKind::Llamacpp => &["OPENAI_API_KEY"],
            ProviderKind::Openrouter => &["OPENROUTER_API_KEY"],
            ProviderKind::Anthropic => &["ANTHROPIC_API_KEY"],
            // Google's own examples use either name.
            ProviderKind::Gemini => &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
            ProviderKind::Deepseek => &["DEEPSEEK_API_KEY"],
            ProviderKind::Groq => &["GROQ_API_KEY"],
            ProviderKind::Mistral => &["MISTRAL_API_KEY"],
            ProviderKind::Xai => &["XAI_API_KEY"],
            ProviderKind::Together => &["TOGETHER_API_KEY"],
            ProviderKind::Fireworks => &["FIREWORKS_API_KEY"],
            ProviderKind::Nous => &["NOUS_API_KEY"],
            ProviderKind::OllamaCloud => &["OLLAMA_API_KEY"],
        }
    }

    /// The environment variable that holds this provider's key (the first
    /// of [`ProviderKind::api_key_envs`]).
    pub fn api_key_env(self) -> &'static str {
        self.api_key_envs()[0]
    }

    /// Whether requests cannot go without a key: hosted services need
    /// one, `custom` and local servers do not.
    pub fn needs_key(self) -> bool {
        !matches!(
            self,
            ProviderKind::Custom
                | ProviderKind::Ollama
                | ProviderKind::Lmstudio
                | ProviderKind::Vllm
                | ProviderKind::Llamacpp
        )
    }

    /// The base URL used when none is configured; `None` for `custom`, which
    /// has no sensible default and must be told where the server is.
    pub fn default_base_url(self) -> Option<&'static str> {
        match self {
            ProviderKind::Custom => None,
            ProviderKind::Openai => Some("https://api.openai.com/v1"),
            ProviderKind::Openrouter => Some("https://openrouter.ai/api/v1"),
            ProviderKind::Anthropic => Some("https://api.anthropic.com"),
            ProviderKind::Gemini => Some("https://generativelanguage.googleapis.com/v1beta/openai"),
            ProviderKind::Deepseek => Some("https://api.deepseek.com/v1"),
            ProviderKind::Groq => Some("https://api.groq.com/openai/v1"),
            ProviderKind::Mistral => Some("https://api.mistral.ai/v1"),
            ProviderKind::Xai => Some("https://api.x.ai/v1"),
            ProviderKind::Together => Some("https://api.together.xyz/v1"),
            ProviderKind::Fireworks => Some("https://api.fireworks.ai/inference/v1"),
            ProviderKind::Nous => Some("https://inference-api.nousresearch.com/v1"),
            ProviderKind::Ollama => Some("http://127.0.0.1:11434/v1"),
            ProviderKind::OllamaCloud => Some("https://ollama.com/v1"),
            ProviderKind::Lmstudio => Some("http://127.0.0.1:1234/v1"),
            ProviderKind::Vllm => Some("http://127.0.0.1:8000/v1"),
            ProviderKind::Llamacpp => Some("http://127.0.0.1:8080/v1"),
        }
    }

    /// Whether the provider speaks the Anthropic Messages API.
    pub fn is_anthropic(self) -> bool {
        matches!(self, ProviderKind::Anthropic)
    }
}

/// `model.prompt_caching`: cache breakpoints on requests to Claude models
/// (Anthropic directly, or through OpenRouter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PromptCachingConfig {
    /// Whether breakpoints are sent.
    pub enabled: bool,
    /// How long a cached prefix lives: `5m` (the API's default) or `1h`.
    pub ttl: CacheTtl,
}

impl Default for PromptCachingConfig {
    fn default() -> PromptCachingConfig {
        PromptCachingConfig {
            enabled: true,
            ttl: CacheTtl::FiveMinutes,
        }
    }
}

/// `model.prompt_caching.ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum CacheTtl {
    /// Five minutes, refreshed on every hit; sent without a `ttl` field.
    #[default]
    #[serde(rename = "5m")]
    FiveMinutes,
    /// One hour: writes cost more, but a prefix outlives a pause.
    #[serde(rename = "1h")]
    OneHour,
}

/// `model.openrouter`: settings only OpenRouter reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct OpenRouterConfig {
    /// Provider routing, sent as the request's `provider` object.
    pub provider: Option<OpenRouterRouting>,
}

/// OpenRouter's provider routing preferences; unset fields are left out
/// of the request so OpenRouter's defaults apply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct OpenRouterRouting {
    /// Provider slugs to try first, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub order: Vec<String>,
    /// Whether other providers may serve when those fail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_fallbacks: Option<bool>,
    /// Only providers that support every request parameter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub require_parameters: Option<bool>,
    /// `allow` or `deny` providers that may store or train on data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_collection: Option<String>,
    /// Only these provider slugs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub only: Vec<String>,
    /// Never these provider slugs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ignore: Vec<String>,
    /// `price`, `throughput` or `latency`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sort: Option<String>,
}

/// The primary model (`model:`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelConfig {
    /// Model name sent to the provider.
    pub default: Option<String>,
    /// Which kind of server `base_url` is; decides the default URL, the key's
    /// variable and the wire protocol.
    pub provider: ProviderKind,
    /// The server's root URL (`TALARIA_BASE_URL` overrides it); required for
    /// `custom`.
    pub base_url: Option<String>,
    /// The API key; else the provider's variable (`OPENAI_API_KEY`, ...).
    pub api_key: Option<Secret>,
    /// Context window in tokens; drives compression.
    pub context_length: u64,
    /// Whether `context_length` was written in config.yaml (set when the
    /// file is parsed). When it was not, the window the model server
    /// reports at start replaces the default.
    #[serde(skip)]
    pub context_length_set: bool,
    /// Output cap per request; `None` lets the server decide (Anthropic
    /// requires one, so its adapter falls back to 4096).
    pub max_tokens: Option<u32>,
    /// Sampling temperature; the server's default when unset.
    pub temperature: Option<f32>,
    /// Whether the model sees images: `auto` asks the model's name (a
    /// table of families known to), `on` and `off` decide outright.
    pub vision: VisionMode,
    /// Names an API client may ask for (`"model": "fast"`), each mapped to
    /// a configured model; `/v1/models` lists them beside the default.
    pub routes: BTreeMap<String, ModelRoute>,
    /// How tool calls the model writes as text in its answer are
    /// recognised (local models often do); see [`ToolCallParser`].
    pub tool_call_parser: ToolCallParser,
    /// Cache breakpoints for Claude models (`model.prompt_caching`).
    pub prompt_caching: PromptCachingConfig,
    /// OpenRouter's routing preferences (`model.openrouter`).
    pub openrouter: OpenRouterConfig,
}

/// `model.tool_call_parser`: which text formats of tool calls are turned
/// into real calls when a model writes them in its answer instead of using
/// the API's tool-call field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolCallParser {
    /// Every format, but only when the request offered tools and every
    /// parsed name is one of them.
    #[default]
    Auto,
    /// Answers are never searched for calls.
    Off,
    /// Hermes 2 Pro's `<tool_call>{...}</tool_call>` blocks.
    Hermes,
    /// Qwen 2.5's `<tool_call>` blocks (the Hermes format).
    Qwen,
    /// Llama 3.1's JSON object (bare or after `<|python_tag|>`).
    Llama3,
    /// Mistral's `[TOOL_CALLS]` list or `[TOOL_CALLS]name[ARGS]{...}`.
    Mistral,
    /// A bare JSON object with a name and arguments, optionally fenced.
    Json,
}

impl<'de> Deserialize<'de> for ToolCallParser {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ToolCallParser, D::Error> {
        match switch_word(d)?.as_str() {
            "auto" => Ok(ToolCallParser::Auto),
            "off" | "none" => Ok(ToolCallParser::Off),
            "hermes" => Ok(ToolCallParser::Hermes),
            "qwen" => Ok(ToolCallParser::Qwen),
            "llama3" | "llama" => Ok(ToolCallParser::Llama3),
            "mistral" => Ok(ToolCallParser::Mistral),
            "json" => Ok(ToolCallParser::Json),
            other => Err(serde::de::Error::custom(format!(
                "expected auto, off, hermes, qwen, llama3, mistral or json, not `{other}`"
            ))),
        }
    }
}

/// `model.vision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VisionMode {
    /// Decided from the model's name.
    #[default]
    Auto,
    /// The model takes images.
    On,
    /// It does not: images are described by `auxiliary.vision` instead.
    Off,
}

impl<'de> Deserialize<'de> for VisionMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<VisionMode, D::Error> {
        match switch_word(d)?.as_str() {
            "auto" => Ok(VisionMode::Auto),
            "on" | "true" | "yes" => Ok(VisionMode::On),
            "off" | "false" | "no" => Ok(VisionMode::Off),
            other => Err(serde::de::Error::custom(format!(
                "expected auto, on or off, not `{other}`"
            ))),
        }
    }
}

impl Default for ModelConfig {
    fn default() -> ModelConfig {
        ModelConfig {
            default: None,
            provider: ProviderKind::Custom,
            base_url: None,
            api_key: None,
            context_length: 128_000,
            context_length_set: false,
            max_tokens: None,
            temperature: None,
            vision: VisionMode::Auto,
            routes: BTreeMap::new(),
            tool_call_parser: ToolCallParser::Auto,
            prompt_caching: PromptCachingConfig::default(),
            openrouter: OpenRouterConfig::default(),
        }
    }
}

/// One entry of `fallback_providers:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FallbackProvider {
    /// Which kind of server this fallback is.
    pub provider: ProviderKind,
    /// The model name sent to it.
    pub model: String,
    #[serde(default)]
    /// Its root URL; the provider's default when unset.
    pub base_url: Option<String>,
    #[serde(default)]
    /// Its API key; else the provider's variable.
    pub api_key: Option<Secret>,
}

/// A fully resolved provider endpoint: everything a client needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    /// Which wire protocol to speak.
    pub provider: ProviderKind,
    /// The model name sent in every request.
    pub model: String,
    /// The server's root URL, resolved.
    pub base_url: String,
    /// The key, when the server needs one.
    pub api_key: Option<Secret>,
}

/// The agent loop (`agent:`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentConfig {
    /// Model calls allowed in one turn before a final summary is forced.
    pub max_turns: u32,
    /// Tool output above this many characters is spilled to a file.
    pub tool_output_max_chars: usize,
    /// Attempts per model call, the first one included, before falling
    /// back (3: one call and up to two retries). The name is hermes'.
    pub api_max_retries: u32,
    /// Seconds to establish a connection to the model server.
    pub connect_timeout_secs: u64,
    /// Seconds without a byte on a streaming response before it is dropped.
    pub stream_stale_timeout_secs: u64,
    /// Seconds a non-streaming request may take in total.
    pub request_timeout_secs: u64,
    /// Prefer streaming; a server that refuses it falls back automatically.
    pub stream: bool,
}

impl Default for AgentConfig {
    fn default() -> AgentConfig {
        AgentConfig {
            max_turns: 90,
            tool_output_max_chars: 100_000,
            api_max_retries: 3,
            connect_timeout_secs: 15,
            stream_stale_timeout_secs: 180,
            request_timeout_secs: 600,
            stream: true,
        }
    }
}

/// Built-in memory (`memory:`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MemoryConfig {
    /// Whether the `memory` tool and MEMORY.md/USER.md in the prompt are on.
    pub enabled: bool,
    /// Limit on the whole joined text of MEMORY.md.
    pub memory_char_limit: usize,
    /// Limit on the whole joined text of USER.md.
    pub user_char_limit: usize,
    /// User turns between two background memory reviews; 0 turns them off.
    pub nudge_interval: u32,
    /// The external memory provider, if any (`mem0`).
    pub provider: Option<String>,
    /// Milliseconds a provider's recall may take before the turn goes on
    /// without it.
    pub prefetch_timeout_ms: u64,
    /// The mem0-compatible service, for `provider: mem0`.
    pub mem0: Mem0Config,
}

/// `memory.mem0:`: a mem0-compatible memory service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Mem0Config {
    /// The service's root URL.
    pub base_url: String,
    /// Whose memories: one user per Talaria home.
    pub user_id: String,
    /// Or `MEM0_API_KEY`.
    pub api_key: Option<Secret>,
    /// Memories recalled per turn.
    pub limit: u32,
}

impl Default for Mem0Config {
    fn default() -> Mem0Config {
        Mem0Config {
            base_url: "https://api.mem0.ai".into(),
            user_id: "talaria".into(),
            api_key: None,
            limit: 5,
        }
    }
}

impl Default for MemoryConfig {
    fn default() -> MemoryConfig {
        MemoryConfig {
            enabled: true,
            nudge_interval: 10,
            provider: None,
            prefetch_timeout_ms: 1500,
            mem0: Mem0Config::default(),
            memory_char_limit: 2200,
            user_char_limit: 1375,
        }
    }
}

/// Context compression (`compression:`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CompressionConfig {
    /// Whether long conversations are summarised to fit the context window.
    pub enabled: bool,
    /// Share of the context window at which older turns are summarised.
    pub threshold: f64,
    /// Non-system messages at the start that are never summarised.
    pub protect_first_n: usize,
    /// Messages at the end that are never summarised.
    pub protect_last_n: usize,
}

impl Default for CompressionConfig {
    fn default() -> CompressionConfig {
        CompressionConfig {
            enabled: true,
            threshold: 0.75,
            protect_first_n: 3,
            protect_last_n: 8,
        }
    }
}

/// How the dangerous-command guard asks (`approvals:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalMode {
    /// Ask a human for every command on the pattern list.
    #[default]
    Manual,
    /// Run pattern-list commands without asking. The hardline list still blocks.
    Off,
}

/// `approvals:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ApprovalsConfig {
    /// Whether dangerous commands ask first (`manual`) or run (`off`).
    pub mode: ApprovalMode,
    /// Seconds to wait for an answer; silence is a denial.
    pub timeout_secs: u64,
}

impl Default for ApprovalsConfig {
    fn default() -> ApprovalsConfig {
        ApprovalsConfig {
            mode: ApprovalMode::Manual,
            timeout_secs: 60,
        }
    }
}

/// The `terminal` tool (`terminal:`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TerminalConfig {
    /// Default command timeout in seconds (a call may ask for less or more,
    /// up to `max_timeout_secs`).
    pub timeout_secs: u64,
    /// The longest timeout a single call may ask for, in seconds.
    pub max_timeout_secs: u64,
    /// Output kept from one command, head and tail.
    pub max_output_chars: usize,
    /// Working directory; `None` means the directory Talaria was started in.
    pub cwd: Option<PathBuf>,
    /// Names of environment variables a command inherits besides the
    /// harmless base set (`PATH`, `HOME`, `LANG`, ...). Nothing else of
    /// Talaria's environment reaches a command, so provider keys and bot
    /// tokens stay out of `env` unless named here.
    pub env_passthrough: Vec<String>,
    /// Where the owner's commands run: the terminal, and DMs from the
    /// people `gateway.owners` names.
    pub backend: BackendKind,
    /// Where everyone else's commands run: group chats, paired users who
    /// are not owners, cron jobs made from a chat, webhooks, the API
    /// server. When it cannot start, the `terminal` tool is withheld from
    /// those conversations, never run on the host instead.
    pub untrusted_backend: BackendKind,
    /// Whether an isolated conversation's workspace (and container) is
    /// its session's or its chat's (kept across `/new`).
    pub workspace_scope: WorkspaceScope,
    /// Where workspaces live; `None` is `<home>/workspaces`.
    pub workspaces_dir: Option<PathBuf>,
    /// The bubblewrap sandbox (`terminal.sandbox:`).
    pub sandbox: SandboxConfig,
    /// Containers (`terminal.docker:`).
    pub docker: DockerConfig,
    /// A remote host (`terminal.ssh:`).
    pub ssh: SshConfig,
    /// Commands started with `terminal(background=true)`
    /// (`terminal.background:`).
    pub background: BackgroundProcessConfig,
}

impl Default for TerminalConfig {
    fn default() -> TerminalConfig {
        TerminalConfig {
            timeout_secs: 180,
            max_timeout_secs: 3600,
            max_output_chars: 50_000,
            cwd: None,
            env_passthrough: Vec::new(),
            backend: BackendKind::Local,
            untrusted_backend: BackendKind::Sandbox,
            workspace_scope: WorkspaceScope::Chat,
            workspaces_dir: None,
            sandbox: SandboxConfig::default(),
            docker: DockerConfig::default(),
            ssh: SshConfig::default(),
            background: BackgroundProcessConfig::default(),
        }
    }
}

/// `terminal.background:`: commands left running after their call returns
/// (`terminal(background=true)`, managed with the `process` tool).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BackgroundProcessConfig {
    /// Running background processes one session may have; the next is
    /// refused until one ends or is killed.
    pub max_per_session: usize,
    /// Running background processes of every session together.
    pub max_total: usize,
    /// Kill a session's background processes when it is reset (`/new`);
    /// off, they run on unseen and count against the limits until they
    /// end.
    pub kill_on_reset: bool,
    /// The most one process's log file under `<home>/processes/` keeps, in
    /// bytes; past it a note ends the file and later output is only in the
    /// memory buffer of recent output.
    pub log_max_bytes: u64,
}

impl Default for BackgroundProcessConfig {
    fn default() -> BackgroundProcessConfig {
        BackgroundProcessConfig {
            max_per_session: 8,
            max_total: 32,
            kill_on_reset: true,
            log_max_bytes: 20 * 1024 * 1024,
        }
    }
}

/// Where commands run (`terminal.backend`, `terminal.untrusted_backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// On the host, as Talaria's user.
    Local,
    /// In a bubblewrap sandbox on the host.
    Sandbox,
    /// In a Docker or Podman container.
    Docker,
    /// On another machine over SSH.
    Ssh,
}

impl BackendKind {
    /// Whether commands of this kind are kept from the host (the sandbox, a
    /// container): the dangerous-command prompt is skipped there and file
    /// tools stay in the workspace.
    pub fn is_isolated(self) -> bool {
        matches!(self, BackendKind::Sandbox | BackendKind::Docker)
    }

    /// The name used in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Local => "local",
            BackendKind::Sandbox => "sandbox",
            BackendKind::Docker => "docker",
            BackendKind::Ssh => "ssh",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one workspace belongs to (`terminal.workspace_scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkspaceScope {
    /// One per session: `/new` starts with an empty one.
    Session,
    /// One per chat (per member in a group with per-user sessions).
    #[default]
    Chat,
}

/// `terminal.sandbox:`: the bubblewrap sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SandboxConfig {
    /// Give commands the host's network (off: only a loopback of their own).
    pub network: bool,
    /// CPU seconds a command may use (0: no limit).
    pub cpu_secs: u64,
    /// The largest file a command may write, in MiB (0: no limit).
    pub file_size_mb: u64,
    /// Address space per process, in MiB (0: no limit).
    pub memory_mb: u64,
    /// Processes of the sandbox's user (0: no limit). The kernel counts
    /// every process of the user, and does not apply it to root.
    pub processes: u64,
    /// More host directories commands may read (mounted read-only at the
    /// same path), such as `/opt/tools`.
    pub read_only_paths: Vec<PathBuf>,
    /// Refuse system calls commands have no business making (tracing
    /// other processes, loading kernel code, new namespaces and mounts,
    /// ...) with a seccomp filter, as defence in depth.
    pub seccomp: bool,
}

impl Default for SandboxConfig {
    fn default() -> SandboxConfig {
        SandboxConfig {
            network: false,
            cpu_secs: 600,
            file_size_mb: 1024,
            memory_mb: 4096,
            processes: 0,
            read_only_paths: Vec::new(),
            seccomp: true,
        }
    }
}

/// `terminal.docker:`: containers through the Docker Engine API (Podman's
/// compatible socket works too).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DockerConfig {
    /// The Engine API socket (`unix:///run/podman/podman.sock` for Podman);
    /// `None` is `DOCKER_HOST`, else `unix:///var/run/docker.sock`.
    pub host: Option<String>,
    /// The image containers start from. It is never pulled: build or pull
    /// it yourself, so what runs is what you chose.
    pub image: String,
    /// Give containers a network (`bridge`); off is `none`.
    pub network: bool,
    /// Memory per container, in MiB (0: no limit).
    pub memory_mb: u64,
    /// CPUs per container (0: no limit).
    pub cpus: f64,
    /// Processes per container (0: no limit).
    pub pids: i64,
    /// A container idle this long is removed (its workspace is kept).
    pub idle_timeout_secs: u64,
}

impl Default for DockerConfig {
    fn default() -> DockerConfig {
        DockerConfig {
            host: None,
            image: "debian:bookworm-slim".to_owned(),
            network: false,
            memory_mb: 1024,
            cpus: 1.0,
            pids: 256,
            idle_timeout_secs: 1800,
        }
    }
}

/// `terminal.ssh:`: commands on another machine, through the system `ssh`
/// with `BatchMode` and host key checking on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SshConfig {
    /// The host name or address.
    pub host: Option<String>,
    /// The port.
    pub port: u16,
    /// The remote user; `None` is ssh's default.
    pub user: Option<String>,
    /// The private key file (a path, not the key itself).
    pub identity_file: Option<PathBuf>,
    /// A known-hosts file to check the host's key against; `None` is the
    /// user's own (`~/.ssh/known_hosts`). An unknown key is refused.
    pub known_hosts: Option<PathBuf>,
    /// The remote directory commands run in (created if missing).
    pub workdir: String,
    /// Seconds to wait for the connection.
    pub connect_timeout_secs: u64,
}

impl Default for SshConfig {
    fn default() -> SshConfig {
        SshConfig {
            host: None,
            port: 22,
            user: None,
            identity_file: None,
            known_hosts: None,
            workdir: "talaria-workspace".to_owned(),
            connect_timeout_secs: 10,
        }
    }
}
