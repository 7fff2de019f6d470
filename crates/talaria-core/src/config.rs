//! The one typed configuration schema, its defaults, and how it is loaded.
//!
//! Every command reads configuration through [`load`], so defaults live in
//! exactly one place: the `Default` impls below. Unknown keys are reported as
//! warnings that name the key path (a typo must not silently do nothing);
//! values of the wrong form are errors that name the key and the form
//! expected.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::home::Home;

/// Errors reading or validating configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not YAML at all (a tab used for indentation, an unclosed bracket,
    /// a key given twice).
    #[error("{path}{}: {message}", at_line(*.line))]
    Syntax {
        path: PathBuf,
        /// Where, counting from 1, when known.
        line: Option<u64>,
        message: String,
    },
    /// YAML, but a value of the wrong form; `key` is its path
    /// (`agent.max_turns`, `fallback_providers[0].model`).
    #[error("{path}{}: `{key}`: {message}", at_line(*.line))]
    Invalid {
        path: PathBuf,
        key: String,
        /// The key's line, counting from 1, when known.
        line: Option<u64>,
        message: String,
    },
    #[error("cannot read {path}: {message}")]
    DotEnv { path: PathBuf, message: String },
}

/// `, line N` after a file name, when the line is known.
fn at_line(line: Option<u64>) -> String {
    line.map(|n| format!(", line {n}")).unwrap_or_default()
}

/// The environment variable `<PLATFORM>_<suffix>` for a platform name
/// (`telegram` + `HOME_CHANNEL` → `TELEGRAM_HOME_CHANNEL`): upper-cased,
/// anything but letters and digits as `_`, so `whatsapp-cloud` gives a
/// name a shell can set. Every per-platform variable is named this way.
pub fn platform_var(platform: &str, suffix: &str) -> String {
    let prefix: String = platform
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("{prefix}_{suffix}")
}

/// Equality whose time does not depend on where the inputs first differ,
/// so a guesser learns nothing from timing about how close a guess was.
/// Lengths are not hidden: callers compare values whose length is not
/// secret (fixed-size hashes, keys whose length is public).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keeps the optimiser from turning the fold back into an early exit.
    std::hint::black_box(diff) == 0
}

/// A secret string. Its `Debug` and `Serialize` forms are masked so that
/// printing a config (or logging one by accident) never shows the value.
///
/// Every credential in the configuration is held in this type: that is
/// what [`Config::secret_values`] finds (by walking the configuration, not
/// by a list of fields), so a new `Secret` field is redacted everywhere
/// without anyone remembering to add it.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

/// The key of the one-entry object a [`Secret`] becomes while
/// [`collect_secrets`] walks a value. A NUL byte keeps it from ever being a
/// name anybody writes in a config file.
const SECRET_MARK: &str = "\0talaria:secret";

thread_local! {
    /// Set only while [`collect_secrets`] serializes on this thread: then,
    /// and only then, a [`Secret`] serializes its real value (marked).
    static REVEAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Clears [`REVEAL`] however the walk ends (a panic included).
struct RevealGuard;

impl Drop for RevealGuard {
    fn drop(&mut self) {
        REVEAL.with(|r| r.set(false));
    }
}

/// Every secret value inside `value`: each [`Secret`] anywhere in its
/// serialized form, plus the credentials written into URLs (a password in
/// `scheme://user:password@host`, a `?api-key=...` query value) and the
/// values of maps that hold credentials by name (an MCP server's `env`
/// entries named like `*_TOKEN`, its `headers`), which stay plain strings
/// because they may be `${VAR}` references.
///
/// `Secret`'s ordinary serialization is masked, so printing a config never
/// shows a value; this walk alone turns the masking off, on this thread,
/// for its own duration.
pub fn collect_secrets<T: Serialize>(value: &T) -> Vec<String> {
    let tree = {
        REVEAL.with(|r| r.set(true));
        let _guard = RevealGuard;
        serde_json::to_value(value)
    };
    let mut out = Vec::new();
    match tree {
        Ok(tree) => walk_secrets(&tree, None, &mut out),
        // Only a map with non-string keys fails to serialize, and the
        // configuration has none; say so loudly rather than redact nothing.
        Err(e) => tracing::error!("cannot walk the configuration for secrets: {e}"),
    }
    out.retain(|v| !v.is_empty());
    out.sort();
    out.dedup();
    out
}

/// Whether a map key names a credential (`GITHUB_TOKEN`, `X-Api-Key`,
/// `Authorization`).
fn names_a_credential(key: &str) -> bool {
    let k = key.to_ascii_uppercase();
    [
        "KEY",
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "AUTH",
        "CREDENTIAL",
    ]
    .iter()
    .any(|m| k.contains(m))
}

fn walk_secrets(v: &serde_json::Value, key: Option<&str>, out: &mut Vec<String>) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            if map.len() == 1
                && let Some(Value::String(secret)) = map.get(SECRET_MARK)
            {
                out.push(secret.clone());
                return;
            }
            // Header values are credentials whatever the header's name.
            let all_secret = key == Some("headers");
            for (k, child) in map {
                match child {
                    Value::String(s)
                        if (all_secret || names_a_credential(k))
                            && !k.ends_with("_env")
                            && !s.contains("${") =>
                    {
                        out.push(s.clone());
                    }
                    _ => walk_secrets(child, Some(k), out),
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                walk_secrets(item, key, out);
            }
        }
        Value::String(s) => out.extend(url_secrets(s)),
        _ => {}
    }
}

/// The credentials written into a URL: the password of its userinfo
/// (`scheme://user:password@host`) and the values of query parameters whose
/// name says credential (`?api-key=...`, `&token=...`, `&sig=...`). Not a
/// URL, or none of those: nothing.
pub fn url_secrets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let Some(scheme_end) = text.find("://") else {
        return out;
    };
    let rest = &text[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    if let Some((userinfo, _host)) = authority.rsplit_once('@')
        && let Some((_user, password)) = userinfo.split_once(':')
    {
        out.push(password.to_owned());
    }
    if let Some(q) = rest.find('?') {
        let query = &rest[q + 1..];
        let query = query.split('#').next().unwrap_or_default();
        for pair in query.split('&') {
            if let Some((name, value)) = pair.split_once('=')
                && crate::redact::is_credential_param(name)
            {
                out.push(value.to_owned());
            }
        }
    }
    out.retain(|v| !v.is_empty());
    out
}

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The real value, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// A masked rendering that keeps just enough to tell keys apart.
    pub fn masked(&self) -> String {
        mask(&self.0)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Secret {
        Secret(value.to_owned())
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Secret {
        Secret(value)
    }
}

// Tests and settings compare a held credential with the text expected.
impl PartialEq<str> for Secret {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Secret {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for Secret {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

/// A credential from the configuration file, else from the environment
/// variable `var`: each trimmed, and a blank one counts as unset (an empty
/// `token: ""` left in a file must not hide the variable).
pub fn secret_or_env(configured: Option<&Secret>, env: &Env, var: &str) -> Option<Secret> {
    text_or_env(configured.map(Secret::expose), env, var).map(Secret)
}

/// [`secret_or_env`] for a value that is not a secret (a server URL, an
/// account name).
pub fn text_or_env(configured: Option<&str>, env: &Env, var: &str) -> Option<String> {
    let pick = |v: &str| Some(v.trim().to_owned()).filter(|v| !v.is_empty());
    configured
        .and_then(pick)
        .or_else(|| env.get(var).and_then(pick))
}

/// Masks a secret value: short ones entirely, long ones but the last four.
pub fn mask(value: &str) -> String {
    let n = value.chars().count();
    if n <= 8 {
        "****".to_owned()
    } else {
        let tail: String = value.chars().skip(n - 4).collect();
        format!("****{tail}")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.masked())
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if REVEAL.with(std::cell::Cell::get) {
            use serde::ser::SerializeMap;
            let mut map = s.serialize_map(Some(1))?;
            map.serialize_entry(SECRET_MARK, &self.0)?;
            map.end()
        } else {
            s.serialize_str(&self.masked())
        }
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Secret, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

/// Which API a provider speaks and where it lives by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// Any OpenAI-compatible endpoint (llama.cpp, vLLM, Ollama, LM Studio, ...).
    #[default]
    Custom,
    Openai,
    Openrouter,
    Anthropic,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Custom => "custom",
            ProviderKind::Openai => "openai",
            ProviderKind::Openrouter => "openrouter",
            ProviderKind::Anthropic => "anthropic",
        }
    }

    /// The environment variable that holds this provider's key.
    pub fn api_key_env(self) -> &'static str {
        match self {
            ProviderKind::Custom | ProviderKind::Openai => "OPENAI_API_KEY",
            ProviderKind::Openrouter => "OPENROUTER_API_KEY",
            ProviderKind::Anthropic => "ANTHROPIC_API_KEY",
        }
    }

    /// The base URL used when none is configured; `None` for `custom`, which
    /// has no sensible default and must be told where the server is.
    pub fn default_base_url(self) -> Option<&'static str> {
        match self {
            ProviderKind::Custom => None,
            ProviderKind::Openai => Some("https://api.openai.com/v1"),
            ProviderKind::Openrouter => Some("https://openrouter.ai/api/v1"),
            ProviderKind::Anthropic => Some("https://api.anthropic.com"),
        }
    }

    /// Whether the provider speaks the Anthropic Messages API.
    pub fn is_anthropic(self) -> bool {
        matches!(self, ProviderKind::Anthropic)
    }
}

/// The primary model (`model:`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelConfig {
    /// Model name sent to the provider.
    pub default: Option<String>,
    pub provider: ProviderKind,
    pub base_url: Option<String>,
    pub api_key: Option<Secret>,
    /// Context window in tokens; drives compression.
    pub context_length: u64,
    /// Output cap per request; `None` lets the server decide (Anthropic
    /// requires one, so its adapter falls back to 4096).
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
}

impl Default for ModelConfig {
    fn default() -> ModelConfig {
        ModelConfig {
            default: None,
            provider: ProviderKind::Custom,
            base_url: None,
            api_key: None,
            context_length: 128_000,
            max_tokens: None,
            temperature: None,
        }
    }
}

/// One entry of `fallback_providers:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FallbackProvider {
    pub provider: ProviderKind,
    pub model: String,
    #[serde(default)]
    pub base_url: Option<String>,
    #[serde(default)]
    pub api_key: Option<Secret>,
}

/// A fully resolved provider endpoint: everything a client needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    pub provider: ProviderKind,
    pub model: String,
    pub base_url: String,
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
}

impl Default for TerminalConfig {
    fn default() -> TerminalConfig {
        TerminalConfig {
            timeout_secs: 180,
            max_timeout_secs: 3600,
            max_output_chars: 50_000,
            cwd: None,
            env_passthrough: Vec::new(),
        }
    }
}

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    pub model: ModelConfig,
    pub fallback_providers: Vec<FallbackProvider>,
    pub agent: AgentConfig,
    pub memory: MemoryConfig,
    pub compression: CompressionConfig,
    pub approvals: ApprovalsConfig,
    /// Commands that run without asking, written by hand: a command glob
    /// (`git push origin *`) or a guard pattern key (every command of that
    /// kind). Only commands without shell operators match. "Always" answers
    /// are not added here but to `command_allowlist.txt`, as exact commands.
    pub command_allowlist: Vec<String>,
    pub terminal: TerminalConfig,
    /// `talaria gateway run`: routing, busy handling, shutdown.
    pub gateway: GatewayConfig,
    /// When a chat's conversation starts afresh on its own.
    pub session_reset: SessionResetConfig,
    /// The messaging platforms the gateway connects.
    pub platforms: PlatformsConfig,
    /// Scheduled jobs.
    pub cron: CronConfig,
    /// Model Context Protocol servers whose tools the agent may use, by
    /// name.
    pub mcp_servers: BTreeMap<String, McpServerConfig>,
    /// The lifecycle of skills the agent wrote itself.
    pub curator: CuratorConfig,
    /// Skills and the background skill review.
    pub skills: SkillsConfig,
    /// What the user is shown besides answers.
    pub display: DisplayConfig,
    /// Where sessions, the ledger and the rest are kept.
    pub store: StoreConfig,
}

/// Which database keeps Talaria's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    /// `state.db` in the home: one machine, no server to run.
    #[default]
    Sqlite,
    /// A PostgreSQL database several gateways on several hosts share.
    Postgres,
}

/// `store:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StoreConfig {
    pub backend: StoreBackend,
    /// `postgres://user:password@host:5432/db?sslmode=require`; the
    /// `TALARIA_DATABASE_URL` environment variable takes precedence.
    pub postgres_url: Option<Secret>,
    /// The schema Talaria's tables live in (created if missing); unset,
    /// the connection's default (`public`).
    pub postgres_schema: Option<String>,
    /// Most connections one process opens.
    pub postgres_max_connections: usize,
}

impl Default for StoreConfig {
    fn default() -> StoreConfig {
        StoreConfig {
            backend: StoreBackend::Sqlite,
            postgres_url: None,
            postgres_schema: None,
            postgres_max_connections: 16,
        }
    }
}

/// The environment variable that names the PostgreSQL database.
pub const DATABASE_URL_ENV: &str = "TALARIA_DATABASE_URL";

impl StoreConfig {
    /// The PostgreSQL URL: `TALARIA_DATABASE_URL`, else `postgres_url`.
    pub fn postgres_url(&self, env: &Env) -> Option<String> {
        env.get(DATABASE_URL_ENV)
            .map(str::to_owned)
            .or_else(|| self.postgres_url.as_ref().map(|s| s.expose().to_owned()))
    }
}

/// `skills:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SkillsConfig {
    /// Model calls without a `skill_manage` call before a background skill
    /// review; 0 turns it off.
    pub creation_nudge_interval: u32,
}

impl Default for SkillsConfig {
    fn default() -> SkillsConfig {
        SkillsConfig {
            creation_nudge_interval: 10,
        }
    }
}

/// How much the user hears of background learning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryNotifications {
    Off,
    /// One short line of what was learned.
    #[default]
    On,
    /// The line with previews of what was written.
    Verbose,
}

/// `display:`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DisplayConfig {
    pub memory_notifications: MemoryNotifications,
}

/// `curator:`: agent-written skills that go unused turn stale, then are
/// archived (restorable); pinned skills and skills a cron job uses are
/// left alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CuratorConfig {
    pub enabled: bool,
    /// Hours between two runs.
    pub interval_hours: u64,
    /// Days without use before a skill is marked stale.
    pub stale_after_days: u64,
    /// Days without use before a skill is archived.
    pub archive_after_days: u64,
}

impl Default for CuratorConfig {
    fn default() -> CuratorConfig {
        CuratorConfig {
            enabled: true,
            interval_hours: 168,
            stale_after_days: 30,
            archive_after_days: 90,
        }
    }
}

/// One entry of `mcp_servers:`: a local program spoken to over stdio
/// (`command`) or a Streamable HTTP endpoint (`url`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct McpServerConfig {
    /// The program to start (stdio transport).
    pub command: Option<String>,
    pub args: Vec<String>,
    /// Extra environment for the program; values may use `${VAR}`.
    pub env: BTreeMap<String, String>,
    /// Working directory of the program.
    pub cwd: Option<PathBuf>,
    /// The endpoint (Streamable HTTP transport).
    pub url: Option<String>,
    /// HTTP headers sent with every request; values may use `${VAR}`.
    pub headers: BTreeMap<String, String>,
    pub enabled: bool,
    /// Seconds one tool call may take.
    pub timeout: u64,
    /// Seconds starting the server and its handshake may take.
    pub connect_timeout: u64,
    /// Start the server the first time a turn needs tools instead of when
    /// the gateway or chat starts.
    pub lazy: bool,
    /// Which of the server's tools the agent sees.
    pub tools: McpToolFilter,
}

impl Default for McpServerConfig {
    fn default() -> McpServerConfig {
        McpServerConfig {
            command: None,
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: None,
            url: None,
            headers: BTreeMap::new(),
            enabled: true,
            timeout: 120,
            connect_timeout: 60,
            lazy: false,
            tools: McpToolFilter::default(),
        }
    }
}

/// `mcp_servers.<name>.tools`: an allowlist and a denylist of tool names
/// (as the server names them); empty `include` means all.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct McpToolFilter {
    pub include: Vec<String>,
    pub exclude: Vec<String>,
}

impl McpToolFilter {
    /// Whether the server's tool `name` is offered.
    pub fn admits(&self, name: &str) -> bool {
        (self.include.is_empty() || self.include.iter().any(|n| n == name))
            && !self.exclude.iter().any(|n| n == name)
    }
}

/// Whether `name` may name an MCP server: it becomes part of tool names
/// (`mcp_<server>_<tool>`), so letters, digits, `_` and `-` only.
pub fn valid_mcp_server_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// `cron:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CronConfig {
    /// Whether the gateway runs scheduled jobs (`talaria cron run` works
    /// either way).
    pub enabled: bool,
    /// The IANA time zone (`Europe/Berlin`) cron expressions and times
    /// without an offset are read in; unset, the machine's local zone.
    pub timezone: Option<String>,
    /// Output files kept per job, newest first.
    pub output_retention: usize,
    /// Jobs running at once; more wait their turn.
    pub max_parallel: usize,
    /// Seconds one run may take before it is interrupted.
    pub run_timeout_secs: u64,
}

impl Default for CronConfig {
    fn default() -> CronConfig {
        CronConfig {
            enabled: true,
            timezone: None,
            output_retention: 50,
            max_parallel: 4,
            run_timeout_secs: 600,
        }
    }
}

impl CronConfig {
    /// The configured zone; `None` means the machine's local zone.
    pub fn zone(&self) -> Result<Option<chrono_tz::Tz>, String> {
        match self.timezone.as_deref().map(str::trim) {
            None | Some("") => Ok(None),
            Some(name) => name.parse::<chrono_tz::Tz>().map(Some).map_err(|_| {
                format!("`{name}` is not an IANA time zone name (like Europe/Berlin or UTC)")
            }),
        }
    }
}

/// What happens to a message that arrives while the agent is still working
/// on the same chat (`gateway.busy_input_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BusyInputMode {
    /// Cancel the running turn and answer the new message next.
    #[default]
    Interrupt,
    /// Let the turn finish; merge what arrived into the next turn.
    Queue,
    /// Hand the text to the running turn after its next tool call.
    Steer,
}

/// `gateway:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GatewayConfig {
    pub busy_input_mode: BusyInputMode,
    /// In groups, each member gets a conversation of their own.
    pub group_sessions_per_user: bool,
    /// Inside threads and forum topics, each member gets their own too
    /// (by default a thread is one shared conversation).
    pub thread_sessions_per_user: bool,
    /// Seconds a stopping gateway lets running turns finish before it
    /// interrupts them.
    pub drain_timeout_secs: u64,
    /// Tell the user when their message interrupted or was queued behind a
    /// running turn (at most once per 30 s per chat).
    pub busy_ack: bool,
    /// Record every final reply before sending it, so a crash cannot lose it.
    pub delivery_ledger: bool,
    /// Seconds between typing indicators while the agent works.
    pub typing_interval_secs: u64,
    /// Where a platform shows the answer growing (streaming edits), the
    /// least time between two edits of that message, in milliseconds.
    /// Platforms rate-limit edits; about one a second stays clear of it.
    pub stream_edit_interval_ms: u64,
    /// Each platform's home channel, `<chat_id>` or `<chat_id>:<thread_id>`,
    /// where a bare `<platform>` delivery target goes. The environment's
    /// `<PLATFORM>_HOME_CHANNEL` (which `/sethome` writes) wins.
    pub home_channels: std::collections::BTreeMap<String, String>,
}

impl Default for GatewayConfig {
    fn default() -> GatewayConfig {
        GatewayConfig {
            busy_input_mode: BusyInputMode::Interrupt,
            group_sessions_per_user: true,
            thread_sessions_per_user: false,
            drain_timeout_secs: 30,
            busy_ack: true,
            delivery_ledger: true,
            typing_interval_secs: 4,
            stream_edit_interval_ms: 1000,
            home_channels: Default::default(),
        }
    }
}

/// When a conversation resets by itself (`session_reset.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResetMode {
    /// Never: only `/new` starts afresh.
    #[default]
    None,
    /// After `idle_minutes` without a message.
    Idle,
    /// Once a day at `at_hour` (local time).
    Daily,
    /// Whichever of the two comes first.
    Both,
}

/// `session_reset:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionResetConfig {
    pub mode: ResetMode,
    pub idle_minutes: u64,
    /// Hour of the day (0-23, local time) of the daily reset.
    pub at_hour: u32,
}

impl Default for SessionResetConfig {
    fn default() -> SessionResetConfig {
        SessionResetConfig {
            mode: ResetMode::None,
            idle_minutes: 1440,
            at_hour: 4,
        }
    }
}

/// `platforms:`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PlatformsConfig {
    pub telegram: TelegramConfig,
    pub discord: DiscordConfig,
    pub mattermost: MattermostConfig,
    /// Slack over Socket Mode and the Web API.
    pub slack: SlackConfig,
    pub api_server: ApiServerConfig,
    /// Signed HTTP deliveries from other services (GitHub, GitLab, Svix, ...).
    pub webhook: WebhookConfig,
    /// A Matrix account, over the client-server API's `/sync`.
    pub matrix: MatrixConfig,
    /// A Signal account, through a signal-cli REST API server.
    pub signal: SignalConfig,
    /// The WhatsApp Cloud API: Meta's webhook in, the Graph API out.
    pub whatsapp_cloud: WhatsappCloudConfig,
    /// SMS through a Twilio phone number (webhook in, REST out).
    pub sms: SmsConfig,
    /// A mailbox: IMAP in, SMTP out.
    pub email: EmailConfig,
    /// Home Assistant: a conversation endpoint on the webhook listener,
    /// and the `ha_*` tools.
    pub homeassistant: HomeAssistantConfig,
}

/// `platforms.telegram:`. The token may instead come from
/// `TELEGRAM_BOT_TOKEN`; setting it either way enables the platform unless
/// `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TelegramConfig {
    /// `None` means "enabled when a token is set".
    pub enabled: Option<bool>,
    pub token: Option<Secret>,
    /// The Bot API root; requests go to `{base_url}/bot{token}/{method}`.
    pub base_url: String,
    /// In groups, answer only messages that mention the bot or reply to it.
    pub require_mention: bool,
    /// Show the answer growing by editing one message while it streams.
    pub streaming_edits: bool,
    /// Seconds a `getUpdates` long poll waits on the server.
    pub poll_timeout_secs: u64,
}

impl Default for TelegramConfig {
    fn default() -> TelegramConfig {
        TelegramConfig {
            enabled: None,
            token: None,
            base_url: "https://api.telegram.org".to_owned(),
            require_mention: false,
            streaming_edits: false,
            poll_timeout_secs: 30,
        }
    }
}

/// `platforms.discord:`. The token may instead come from
/// `DISCORD_BOT_TOKEN`; setting it either way enables the platform unless
/// `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DiscordConfig {
    /// `None` means "enabled when a token is set".
    pub enabled: Option<bool>,
    pub token: Option<Secret>,
    /// The REST API root (`{api_base}/channels/{id}/messages`, ...).
    pub api_base: String,
    /// The gateway WebSocket URL; `None` asks `{api_base}/gateway/bot`.
    pub gateway_url: Option<String>,
    /// In guild channels, answer only messages that mention the bot.
    pub require_mention: bool,
}

impl Default for DiscordConfig {
    fn default() -> DiscordConfig {
        DiscordConfig {
            enabled: None,
            token: None,
            api_base: "https://discord.com/api/v10".to_owned(),
            gateway_url: None,
            require_mention: true,
        }
    }
}

/// `platforms.mattermost:`. The server root may instead come from
/// `MATTERMOST_URL` and the token from `MATTERMOST_TOKEN`; a token set
/// either way enables the platform unless `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MattermostConfig {
    /// `None` means "enabled when a token is set".
    pub enabled: Option<bool>,
    /// The server root, e.g. `https://chat.example.com` (no `/api/v4`).
    pub url: Option<String>,
    /// A bot account's or a personal access token.
    pub token: Option<Secret>,
    /// In channels and group messages, answer only posts that mention the
    /// bot (or continue a thread it answered in).
    pub require_mention: bool,
    /// Seconds between application-level pings on the WebSocket; a socket
    /// silent for two of these is rebuilt.
    pub ping_interval_secs: u64,
}

impl Default for MattermostConfig {
    fn default() -> MattermostConfig {
        MattermostConfig {
            enabled: None,
            url: None,
            token: None,
            require_mention: true,
            ping_interval_secs: 30,
        }
    }
}

/// `platforms.sms:`, text messages through a Twilio phone number. Each
/// value may instead come from the environment: `TWILIO_ACCOUNT_SID`,
/// `TWILIO_AUTH_TOKEN`, `TWILIO_PHONE_NUMBER` and `SMS_WEBHOOK_URL`. An
/// account SID and an auth token set either way enable the platform unless
/// `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SmsConfig {
    /// `None` means "enabled when an account SID and an auth token are set".
    pub enabled: Option<bool>,
    /// The Twilio account SID (`AC...`).
    pub account_sid: Option<String>,
    /// The account's auth token: it authenticates sends and is the key
    /// Twilio signs webhooks with.
    pub auth_token: Option<Secret>,
    /// The Twilio number answers come from, in E.164 (`+15551234567`).
    pub phone_number: Option<String>,
    /// The public URL Twilio posts incoming messages to (as configured on
    /// the number in Twilio's console); signatures are computed over it.
    pub webhook_url: Option<String>,
    /// The REST API root; sends go to
    /// `{api_base}/2010-04-01/Accounts/{sid}/Messages.json`.
    pub api_base: String,
    /// The most segments one SMS may use; longer ones are shortened to
    /// fit. `None` (or 0) means no cap.
    pub max_segments: Option<u32>,
}

impl Default for SmsConfig {
    fn default() -> SmsConfig {
        SmsConfig {
            enabled: None,
            account_sid: None,
            auth_token: None,
            phone_number: None,
            webhook_url: None,
            api_base: "https://api.twilio.com".to_owned(),
            max_segments: None,
        }
    }
}

/// `platforms.matrix:`. The homeserver, access token and user id may
/// instead come from `MATRIX_HOMESERVER`, `MATRIX_ACCESS_TOKEN` and
/// `MATRIX_USER_ID`; a homeserver and a token enable the platform unless
/// `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MatrixConfig {
    /// `None` means "enabled when a homeserver and a token are set".
    pub enabled: Option<bool>,
    /// The homeserver's client-server API root (`https://matrix.example.org`).
    pub homeserver: Option<String>,
    pub access_token: Option<Secret>,
    /// The bot's own user id (`@talaria:example.org`); asked from the
    /// homeserver (`whoami`) when unset.
    pub user_id: Option<String>,
    /// In rooms with more than two members, answer only messages that
    /// mention the bot (or reply to it, or continue a thread it is in).
    pub require_mention: bool,
    /// Milliseconds a `/sync` long poll waits on the server.
    pub sync_timeout_ms: u64,
}

impl Default for MatrixConfig {
    fn default() -> MatrixConfig {
        MatrixConfig {
            enabled: None,
            homeserver: None,
            access_token: None,
            user_id: None,
            require_mention: true,
            sync_timeout_ms: 30_000,
        }
    }
}

/// `platforms.signal:`, a Signal account served by a signal-cli REST API
/// server (`bbernhard/signal-cli-rest-api`). The server root may instead
/// come from `SIGNAL_HTTP_URL` and the account from `SIGNAL_ACCOUNT`; both
/// set either way enable the platform unless `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SignalConfig {
    /// `None` means "enabled when a server and an account are set".
    pub enabled: Option<bool>,
    /// The REST API root, e.g. `http://127.0.0.1:8080`.
    pub http_url: Option<String>,
    /// The bot's number as registered (or linked) on the server, in
    /// international format (`+4915112345678`). YAML reads an unquoted
    /// `+4915112345678` as a number; that is taken back as the number it
    /// was written as.
    #[serde(deserialize_with = "phone_number")]
    pub account: Option<String>,
    /// How messages are received: `websocket` (the server's `json-rpc`
    /// mode) or `poll` (its `normal` and `native` modes). When the server
    /// says which mode it runs in, that wins.
    pub receive_mode: SignalReceiveMode,
    /// Seconds between two receive calls that found nothing (`poll`).
    pub poll_interval_secs: u64,
    /// In groups, answer only messages that mention the bot or quote it.
    pub require_mention: bool,
}

impl Default for SignalConfig {
    fn default() -> SignalConfig {
        SignalConfig {
            enabled: None,
            http_url: None,
            account: None,
            receive_mode: SignalReceiveMode::Websocket,
            poll_interval_secs: 2,
            require_mention: true,
        }
    }
}

/// How a mail connection is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MailTls {
    /// TLS from the first byte (IMAP on 993, SMTP on 465).
    Implicit,
    /// A plain connection upgraded with STARTTLS before logging in.
    Starttls,
    /// No encryption: refused for any host but a loopback address.
    None,
}

/// `platforms.email:`. The account may instead come from `EMAIL_ADDRESS`,
/// `EMAIL_PASSWORD`, `EMAIL_IMAP_HOST` and `EMAIL_SMTP_HOST` (each host
/// may carry a `:port`); an address, a password and both hosts enable the
/// platform unless `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EmailConfig {
    /// `None` means "enabled when the account and both hosts are set".
    pub enabled: Option<bool>,
    /// The bot's address: the IMAP and SMTP login and the `From` of replies.
    pub address: Option<String>,
    pub password: Option<Secret>,
    /// The IMAP server (a host, or `host:port`).
    pub imap_host: Option<String>,
    pub imap_port: u16,
    pub imap_tls: MailTls,
    /// The SMTP submission server (a host, or `host:port`).
    pub smtp_host: Option<String>,
    pub smtp_port: u16,
    pub smtp_tls: MailTls,
    /// The mailbox read for new mail.
    pub mailbox: String,
    /// Seconds between checks for new mail when the server cannot IDLE
    /// (and the longest an IDLE waits before it is renewed).
    pub poll_interval_secs: u64,
}

impl Default for EmailConfig {
    fn default() -> EmailConfig {
        EmailConfig {
            enabled: None,
            address: None,
            password: None,
            imap_host: None,
            imap_port: 993,
            imap_tls: MailTls::Implicit,
            smtp_host: None,
            smtp_port: 587,
            smtp_tls: MailTls::Starttls,
            mailbox: "INBOX".to_owned(),
            poll_interval_secs: 60,
        }
    }
}

/// `platforms.homeassistant:`. The URL and token may instead come from
/// `HASS_URL` and `HASS_TOKEN` (they enable the `ha_*` tools), and the
/// conversation secret from `HASS_CONVERSATION_TOKEN` (it enables the
/// conversation endpoint); `enabled: false` turns both off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HomeAssistantConfig {
    /// `None` means "on when the credentials are set".
    pub enabled: Option<bool>,
    /// Home Assistant's root URL, e.g. `http://homeassistant.local:8123`.
    pub url: Option<String>,
    /// A long-lived access token (a user's profile page in Home Assistant).
    pub token: Option<Secret>,
    /// The bearer secret Home Assistant sends to
    /// `POST /homeassistant/conversation`.
    pub conversation_token: Option<Secret>,
    /// Services `ha_call_service` may call without asking, as
    /// `domain.service` patterns (`light.*`, `media_player.volume_set`);
    /// empty: every call asks.
    pub allowed_services: Vec<String>,
    /// How long a conversation request waits for the answer before it is
    /// answered "still working" (the answer then becomes a notification).
    pub reply_timeout_secs: u64,
}

impl Default for HomeAssistantConfig {
    fn default() -> HomeAssistantConfig {
        HomeAssistantConfig {
            enabled: None,
            url: None,
            token: None,
            conversation_token: None,
            allowed_services: Vec::new(),
            reply_timeout_secs: 60,
        }
    }
}

/// A phone number written as text or, unquoted in YAML, as an integer
/// (whose `+` the YAML reader dropped).
fn phone_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Number {
        Text(String),
        Integer(u64),
    }
    Ok(match Option::<Number>::deserialize(d)? {
        None => None,
        Some(Number::Text(t)) => Some(t),
        Some(Number::Integer(n)) => Some(format!("+{n}")),
    })
}

/// `platforms.signal.receive_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SignalReceiveMode {
    /// `GET /v1/receive/{account}` as a WebSocket.
    Websocket,
    /// `GET /v1/receive/{account}` as plain requests, one after another.
    Poll,
}

/// `platforms.slack:`. The tokens may instead come from `SLACK_BOT_TOKEN`
/// (`xoxb-...`) and `SLACK_APP_TOKEN` (`xapp-...`, for Socket Mode);
/// setting both either way enables the platform unless `enabled: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlackConfig {
    /// `None` means "enabled when both tokens are set".
    pub enabled: Option<bool>,
    /// The bot token (`xoxb-...`), for the Web API.
    pub bot_token: Option<Secret>,
    /// The app-level token (`xapp-...`) with `connections:write`, for
    /// opening Socket Mode connections.
    pub app_token: Option<Secret>,
    /// The Web API root; requests go to `{api_base}/{method}`.
    pub api_base: String,
    /// In channels and group DMs, answer only messages that mention the bot.
    pub require_mention: bool,
    /// The reaction put on a message while its answer is being worked on
    /// (bots cannot show "typing" in Slack); empty for none.
    pub working_reaction: String,
    /// Milliseconds between WebSocket pings on the Socket Mode connection.
    pub ping_interval_ms: u64,
    /// Milliseconds without any answer to a ping after which the connection
    /// counts as dead and is rebuilt.
    pub ping_timeout_ms: u64,
}

impl Default for SlackConfig {
    fn default() -> SlackConfig {
        SlackConfig {
            enabled: None,
            bot_token: None,
            app_token: None,
            api_base: "https://slack.com/api".to_owned(),
            require_mention: true,
            working_reaction: "eyes".to_owned(),
            ping_interval_ms: 10_000,
            ping_timeout_ms: 30_000,
        }
    }
}

/// `platforms.api_server:`, the OpenAI-compatible HTTP endpoint. The key
/// may instead come from `API_SERVER_KEY`, host and port from
/// `API_SERVER_HOST` and `API_SERVER_PORT`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ApiServerConfig {
    /// `None` means "enabled when a key is set".
    pub enabled: Option<bool>,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub key: Option<Secret>,
    /// Turns running at once; more get 429. 0 means no cap.
    pub max_concurrent_runs: usize,
    /// Seconds a client may take to send a request head (also the most a
    /// kept-alive connection idles); then the connection is closed.
    pub header_timeout_secs: u64,
    /// Seconds a client may take to send a request body; then the
    /// request fails and the connection is closed.
    pub body_timeout_secs: u64,
}

impl Default for ApiServerConfig {
    fn default() -> ApiServerConfig {
        ApiServerConfig {
            enabled: None,
            host: None,
            port: None,
            key: None,
            max_concurrent_runs: 10,
            header_timeout_secs: 10,
            body_timeout_secs: 30,
        }
    }
}

/// `platforms.whatsapp_cloud:`, a WhatsApp Business number through Meta's
/// Cloud API. Each secret may instead come from `WHATSAPP_CLOUD_TOKEN`,
/// `WHATSAPP_CLOUD_PHONE_NUMBER_ID`, `WHATSAPP_CLOUD_APP_SECRET` and
/// `WHATSAPP_CLOUD_VERIFY_TOKEN`; setting any of them enables the platform
/// unless `enabled: false`, and then all four are required. Deliveries
/// arrive on the shared webhook listener (`platforms.webhook.host`/`port`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WhatsappCloudConfig {
    /// `None` means "enabled when any of the four credentials is set".
    pub enabled: Option<bool>,
    /// A system user's access token with `whatsapp_business_messaging`.
    pub token: Option<Secret>,
    /// The business phone number's id (not the phone number itself).
    pub phone_number_id: Option<String>,
    /// The Meta app's secret, which signs every webhook delivery.
    pub app_secret: Option<Secret>,
    /// The token Meta echoes in the webhook verification handshake.
    pub verify_token: Option<Secret>,
    /// The Graph API root; sends go to
    /// `{graph_base}/{api_version}/{phone_number_id}/messages`.
    pub graph_base: String,
    /// The Graph API version, e.g. `v21.0`.
    pub api_version: String,
    /// Larger webhook bodies get 413 without being read further.
    pub max_body_bytes: usize,
}

impl Default for WhatsappCloudConfig {
    fn default() -> WhatsappCloudConfig {
        WhatsappCloudConfig {
            enabled: None,
            token: None,
            phone_number_id: None,
            app_secret: None,
            verify_token: None,
            graph_base: "https://graph.facebook.com".to_owned(),
            api_version: "v21.0".to_owned(),
            max_body_bytes: 1024 * 1024,
        }
    }
}

/// `platforms.webhook:`, the HTTP endpoint that turns signed deliveries
/// from other services into agent turns (`POST /webhooks/<route>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WebhookConfig {
    /// `None` means "enabled when at least one route is configured".
    pub enabled: Option<bool>,
    /// The interface to listen on. Loopback by default: put a reverse proxy
    /// with TLS in front rather than exposing the port directly.
    pub host: String,
    pub port: u16,
    /// Larger request bodies get 413 without being read further.
    pub max_body_bytes: usize,
    /// Accepted deliveries per route in any 60 s; more get 429. 0 means no
    /// limit.
    pub rate_limit_per_minute: u32,
    /// Seconds a client may take to send a request head to the listener
    /// (also the most a kept-alive connection idles).
    pub header_timeout_secs: u64,
    /// Seconds a client may take to send a request body.
    pub body_timeout_secs: u64,
    /// The routes by name; each is served at `/webhooks/<name>`. Names pass
    /// the strict id validator, since they become part of a URL path and of
    /// session keys.
    #[serde(deserialize_with = "webhook_routes")]
    pub routes: BTreeMap<String, WebhookRouteConfig>,
}

impl Default for WebhookConfig {
    fn default() -> WebhookConfig {
        WebhookConfig {
            enabled: None,
            host: "127.0.0.1".to_owned(),
            port: 8644,
            max_body_bytes: 1024 * 1024,
            rate_limit_per_minute: 30,
            header_timeout_secs: 10,
            body_timeout_secs: 30,
            routes: BTreeMap::new(),
        }
    }
}

/// Which signature check a webhook route applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WebhookScheme {
    /// `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`.
    Github,
    /// `X-Gitlab-Token` equal to the secret.
    Gitlab,
    /// Svix / Standard Webhooks: `svix-id`, `svix-timestamp`,
    /// `svix-signature` (base64 HMAC-SHA256 of `id.timestamp.body`).
    Svix,
    /// `X-Webhook-Timestamp` and `X-Webhook-Signature: sha256=<hex
    /// HMAC-SHA256 of timestamp.body>`.
    Hmac,
}

/// One entry of `platforms.webhook.routes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookRouteConfig {
    /// The shared secret the sender signs with.
    #[serde(default)]
    pub secret: Option<Secret>,
    /// The environment variable holding the secret, instead of `secret`.
    #[serde(default)]
    pub secret_env: Option<String>,
    /// Which signature check applies; there is no default, so a route
    /// cannot end up checked by a scheme its sender does not use.
    pub scheme: WebhookScheme,
    /// The prompt template: `{payload.a.b}`, `{event_type}`, `{route}`,
    /// `{__raw__}`. Empty gives a default that shows the whole payload.
    #[serde(default)]
    pub prompt: String,
    /// Where the answer goes: `local`, `telegram` (its home channel) or
    /// `telegram:<chat_id>`.
    #[serde(default = "default_webhook_deliver")]
    pub deliver: String,
    /// Event types to act on; others are answered `ignored`. Empty means
    /// every event.
    #[serde(default)]
    pub events: Vec<String>,
    /// `false` answers every delivery with 403.
    #[serde(default = "default_true")]
    pub enabled: bool,
}

fn default_webhook_deliver() -> String {
    "local".to_owned()
}

fn default_true() -> bool {
    true
}

/// Reads the route map, refusing names that are not strict ids.
fn webhook_routes<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, WebhookRouteConfig>, D::Error> {
    let routes = BTreeMap::<String, WebhookRouteConfig>::deserialize(d)?;
    for name in routes.keys() {
        if let Err(e) = crate::ids::validate_path_component(name) {
            return Err(serde::de::Error::custom(format!(
                "route name `{name}` is not usable in a URL path ({e}); use letters, digits, \
                 `_`, `-` and `.`"
            )));
        }
    }
    Ok(routes)
}

/// A parsed configuration with what was noticed on the way.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    /// Human-readable warnings (unknown keys), one per line.
    pub warnings: Vec<String>,
    /// Merged environment: `.env` overlaid by the process environment.
    pub env: Env,
    /// The file read, when one existed.
    pub path: Option<PathBuf>,
}

/// Environment variables visible to Talaria: the home's `.env` file with the
/// process environment on top. Kept as a map instead of being written into
/// the process environment, which is not thread-safe to mutate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Env {
    vars: BTreeMap<String, String>,
    /// Keys that came from `.env`; their values are treated as secrets.
    from_file: Vec<String>,
}

impl Env {
    /// The process environment alone.
    pub fn from_process() -> Env {
        Env {
            vars: std::env::vars().collect(),
            from_file: Vec::new(),
        }
    }

    /// `.env` at `path` (if present) overlaid by the process environment.
    pub fn load(path: &Path) -> Result<Env, ConfigError> {
        let mut vars = BTreeMap::new();
        let mut from_file = Vec::new();
        match dotenvy::from_path_iter(path) {
            Ok(iter) => {
                for item in iter {
                    let (k, v) = item.map_err(|e| ConfigError::DotEnv {
                        path: path.to_owned(),
                        message: e.to_string(),
                    })?;
                    from_file.push(k.clone());
                    vars.insert(k, v);
                }
            }
            Err(dotenvy::Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(ConfigError::DotEnv {
                    path: path.to_owned(),
                    message: e.to_string(),
                });
            }
        }
        vars.extend(std::env::vars());
        Ok(Env { vars, from_file })
    }

    /// An environment with exactly these variables (for tests).
    pub fn from_pairs<I, K, V>(pairs: I) -> Env
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Env {
            vars: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            from_file: Vec::new(),
        }
    }

    /// A non-empty variable.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.vars
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// A yes/no variable: `1`, `true`, `yes`, `on` or `0`, `false`, `no`,
    /// `off` (any case); anything else, or unset, is `None`.
    pub fn flag(&self, key: &str) -> Option<bool> {
        match self.get(key)?.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Some(true),
            "0" | "false" | "no" | "off" => Some(false),
            _ => None,
        }
    }

    /// Where variable `key` came from, for people: `.env` when the file
    /// set it and the process did not, else `the environment`.
    pub fn origin(&self, key: &str) -> &'static str {
        if self.from_file.iter().any(|k| k == key) && std::env::var_os(key).is_none() {
            ".env"
        } else {
            "the environment"
        }
    }

    /// Values that must never appear in output: everything loaded from
    /// `.env` and every variable whose name marks it as a credential.
    pub fn secret_values(&self) -> Vec<String> {
        let named_secret = |k: &str| {
            let k = k.to_ascii_uppercase();
            ["KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD"]
                .iter()
                .any(|m| k.contains(m))
        };
        self.vars
            .iter()
            .filter(|(k, _)| self.from_file.contains(k) || named_secret(k))
            .map(|(_, v)| v.clone())
            .filter(|v| v.len() >= 8)
            .collect()
    }
}

impl Config {
    /// Parses YAML text. `origin` names the file in messages.
    pub fn parse(text: &str, origin: &Path) -> Result<(Config, Vec<String>), ConfigError> {
        let value: serde_json::Value =
            serde_saphyr::from_str(text).map_err(|e| yaml_errors::syntax(text, origin, &e))?;
        // An empty file parses as null: that is "all defaults", not an error.
        let value = if value.is_null() {
            serde_json::Value::Object(Default::default())
        } else {
            value
        };
        let mut unknown = Vec::new();
        let mut on_unknown = |path: serde_ignored::Path<'_>| unknown.push(path.to_string());
        let de = serde_ignored::Deserializer::new(value, &mut on_unknown);
        let config: Config = serde_path_to_error::deserialize(de)
            .map_err(|e| yaml_errors::invalid(text, origin, e))?;
        config
            .validate(origin)
            .map_err(|e| yaml_errors::with_line(text, e))?;
        let warnings = unknown
            .into_iter()
            .map(|k| format!("{}: unknown key `{k}` (ignored)", origin.display()))
            .collect();
        Ok((config, warnings))
    }

    fn validate(&self, origin: &Path) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: &str| ConfigError::Invalid {
            path: origin.to_owned(),
            key: key.to_owned(),
            line: None,
            message: message.to_owned(),
        };
        let url_ok = |u: &str| u.starts_with("http://") || u.starts_with("https://");
        if let Some(u) = &self.model.base_url
            && !url_ok(u)
        {
            return Err(invalid(
                "model.base_url",
                "expected an http:// or https:// URL",
            ));
        }
        for (i, f) in self.fallback_providers.iter().enumerate() {
            if let Some(u) = &f.base_url
                && !url_ok(u)
            {
                return Err(invalid(
                    &format!("fallback_providers[{i}].base_url"),
                    "expected an http:// or https:// URL",
                ));
            }
            if f.model.trim().is_empty() {
                return Err(invalid(
                    &format!("fallback_providers[{i}].model"),
                    "expected a model name",
                ));
            }
        }
        if self.session_reset.at_hour > 23 {
            return Err(invalid(
                "session_reset.at_hour",
                "expected an hour from 0 to 23",
            ));
        }
        if !url_ok(&self.platforms.telegram.base_url) {
            return Err(invalid(
                "platforms.telegram.base_url",
                "expected an http:// or https:// URL",
            ));
        }
        if self
            .platforms
            .matrix
            .homeserver
            .as_deref()
            .is_some_and(|u| !url_ok(u))
        {
            return Err(invalid(
                "platforms.matrix.homeserver",
                "expected an http:// or https:// URL",
            ));
        }
        if self
            .platforms
            .signal
            .http_url
            .as_deref()
            .is_some_and(|u| !url_ok(u))
        {
            return Err(invalid(
                "platforms.signal.http_url",
                "expected an http:// or https:// URL",
            ));
        }
        if !url_ok(&self.platforms.slack.api_base) {
            return Err(invalid(
                "platforms.slack.api_base",
                "expected an http:// or https:// URL",
            ));
        }
        if !url_ok(&self.platforms.sms.api_base) {
            return Err(invalid(
                "platforms.sms.api_base",
                "expected an http:// or https:// URL",
            ));
        }
        if self.agent.max_turns == 0 {
            return Err(invalid(
                "agent.max_turns",
                "expected an integer of at least 1",
            ));
        }
        if self.agent.tool_output_max_chars < 1000 {
            return Err(invalid(
                "agent.tool_output_max_chars",
                "expected an integer of at least 1000",
            ));
        }
        if !(self.compression.threshold > 0.0 && self.compression.threshold <= 1.0) {
            return Err(invalid(
                "compression.threshold",
                "expected a number above 0 and at most 1",
            ));
        }
        for (name, server) in &self.mcp_servers {
            let key = |field: &str| format!("mcp_servers.{name}{field}");
            if !valid_mcp_server_name(name) {
                return Err(invalid(
                    &key(""),
                    "a server name is letters, digits, `_` and `-` (at most 32)",
                ));
            }
            match (&server.command, &server.url) {
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        &key(""),
                        "give either `command` (stdio) or `url` (HTTP), not both",
                    ));
                }
                (None, None) => {
                    return Err(invalid(
                        &key(""),
                        "give `command` (a program spoken to over stdio) or `url` (a Streamable HTTP endpoint)",
                    ));
                }
                (Some(c), None) if c.trim().is_empty() => {
                    return Err(invalid(&key(".command"), "expected a program to run"));
                }
                (None, Some(u)) if !url_ok(u) => {
                    return Err(invalid(&key(".url"), "expected an http:// or https:// URL"));
                }
                _ => {}
            }
            if server.timeout == 0 || server.connect_timeout == 0 {
                return Err(invalid(
                    &key(".timeout"),
                    "timeouts are whole seconds, at least 1",
                ));
            }
        }
        if self.curator.archive_after_days <= self.curator.stale_after_days {
            return Err(invalid(
                "curator.archive_after_days",
                "expected more days than curator.stale_after_days",
            ));
        }
        match self.memory.provider.as_deref() {
            None | Some("mem0") => {}
            Some(other) => {
                return Err(invalid(
                    "memory.provider",
                    &format!("`{other}` is not a memory provider Talaria knows (mem0)"),
                ));
            }
        }
        if !url_ok(&self.memory.mem0.base_url) {
            return Err(invalid(
                "memory.mem0.base_url",
                "expected an http:// or https:// URL",
            ));
        }
        if let Err(e) = self.cron.zone() {
            return Err(invalid("cron.timezone", &e));
        }
        if self.cron.max_parallel == 0 {
            return Err(invalid(
                "cron.max_parallel",
                "expected an integer of at least 1",
            ));
        }
        if self.cron.output_retention == 0 {
            return Err(invalid(
                "cron.output_retention",
                "expected an integer of at least 1",
            ));
        }
        if self.model.context_length < 1024 {
            return Err(invalid(
                "model.context_length",
                "expected an integer of at least 1024",
            ));
        }
        Ok(())
    }

    /// The primary endpoint, or a message saying exactly what to set.
    pub fn primary_endpoint(&self, env: &Env) -> Result<Endpoint, String> {
        let provider = self.model.provider;
        // The environment wins over the file, so one run can point at
        // another model or server without editing config.yaml.
        let model = env
            .get("TALARIA_MODEL")
            .map(str::to_owned)
            .or_else(|| self.model.default.clone())
            .ok_or_else(|| {
                "no model is configured: set `model.default` (and `model.base_url` for a \
                 custom OpenAI-compatible server) in config.yaml, or run `talaria setup`"
                    .to_owned()
            })?;
        let base_url = env
            .get("TALARIA_BASE_URL")
            .map(str::to_owned)
            .or_else(|| self.model.base_url.clone())
            .or_else(|| provider.default_base_url().map(str::to_owned))
            .ok_or_else(|| {
                "provider `custom` needs `model.base_url` in config.yaml, for example \
                 http://127.0.0.1:8080/v1 for llama.cpp"
                    .to_owned()
            })?;
        let api_key = self
            .model
            .api_key
            .clone()
            .or_else(|| env.get(provider.api_key_env()).map(Secret::new));
        if api_key.is_none() && provider != ProviderKind::Custom {
            return Err(format!(
                "provider `{}` needs an API key: set `model.api_key` or {}",
                provider.as_str(),
                provider.api_key_env()
            ));
        }
        Ok(Endpoint {
            provider,
            model,
            base_url,
            api_key,
        })
    }

    /// The fallback endpoints in order. Entries that cannot be used (no key)
    /// are skipped with a warning instead of failing the primary.
    pub fn fallback_endpoints(&self, env: &Env) -> (Vec<Endpoint>, Vec<String>) {
        let mut out = Vec::new();
        let mut warnings = Vec::new();
        for (i, f) in self.fallback_providers.iter().enumerate() {
            let base_url = f
                .base_url
                .clone()
                .or_else(|| f.provider.default_base_url().map(str::to_owned));
            let Some(base_url) = base_url else {
                warnings.push(format!(
                    "fallback_providers[{i}] is skipped: provider `custom` needs base_url"
                ));
                continue;
            };
            let api_key = f
                .api_key
                .clone()
                .or_else(|| env.get(f.provider.api_key_env()).map(Secret::new));
            if api_key.is_none() && f.provider != ProviderKind::Custom {
                warnings.push(format!(
                    "fallback_providers[{i}] is skipped: no api_key and {} is not set",
                    f.provider.api_key_env()
                ));
                continue;
            }
            out.push(Endpoint {
                provider: f.provider,
                model: f.model.clone(),
                base_url,
                api_key,
            });
        }
        (out, warnings)
    }

    /// Every secret value written in the file itself: every [`Secret`]
    /// field, wherever it is (found by [`collect_secrets`], so no list of
    /// fields can fall behind the schema), the credentials inside URLs, and
    /// literal MCP credentials (`${VAR}` references are resolved, and
    /// redacted, from the environment instead).
    pub fn secret_values(&self) -> Vec<String> {
        collect_secrets(self)
    }
}

/// Loads `config.yaml` and `.env` from the home. A missing config file is not
/// an error: it means "all defaults".
pub fn load(home: &Home) -> Result<Loaded, ConfigError> {
    let path = home.config_file();
    let env = Env::load(&home.dotenv_file())?;
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(ConfigError::Read { path, source }),
    };
    let (config, warnings, found) = match text {
        Some(t) => {
            let (c, w) = Config::parse(&t, &path)?;
            (c, w, Some(path))
        }
        None => (Config::default(), Vec::new(), None),
    };
    Ok(Loaded {
        config,
        warnings,
        env,
        path: found,
    })
}

/// Configuration errors in words a person reads: the line of the key an
/// error is about, and serde's and the YAML parser's phrasing ("invalid
/// type: string \"x\", expected u32", "set DuplicateKeyPolicy in Options")
/// said plainly.
mod yaml_errors {
    use std::path::Path;

    use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
    use serde_saphyr::{DuplicateKeyPolicy, MessageFormatter, Spanned, UserMessageFormatter};

    use super::ConfigError;

    /// A document that is not YAML.
    pub(super) fn syntax(text: &str, origin: &Path, e: &serde_saphyr::Error) -> ConfigError {
        let location = e.location().filter(|l| l.line() > 0);
        let mut line = location.map(|l| l.line());
        let raw: String = UserMessageFormatter
            .format_message(e)
            .chars()
            .filter(|c| !c.is_control())
            .collect();
        // The error itself, under the snippet and alias wrappers.
        let mut inner = e;
        while let serde_saphyr::Error::WithSnippet { error, .. }
        | serde_saphyr::Error::AliasError { error, .. } = inner
        {
            inner = error;
        }
        let message = if let serde_saphyr::Error::DuplicateMappingKey { key, .. } = inner {
            duplicate(
                text,
                key.as_deref(),
                location.map(|l| (l.line(), l.column())),
            )
        } else if let Some(tab) = tab_indentation(text, line) {
            line = Some(tab);
            "a tab is used for indentation; YAML indents with spaces only (replace the tab \
             with spaces)"
                .to_owned()
        } else {
            format!("this is not valid YAML: {raw}")
        };
        ConfigError::Syntax {
            path: origin.to_owned(),
            line,
            message,
        }
    }

    /// The same key twice in one mapping, which a pasted snippet causes
    /// (a second `model:` block).
    fn duplicate(text: &str, key: Option<&str>, at: Option<(u64, u64)>) -> String {
        let Some(key) = key else {
            return "a key appears twice in the same place; keep one of them".to_owned();
        };
        // The later one is where the parser stopped; keeping it shows the
        // path, keeping the first shows where that one is.
        let found = at.and_then(|(line, column)| {
            let last = outline(text, DuplicateKeyPolicy::LastWins)?;
            let path = path_of_key(&last, line, column)?;
            let block = node_at(&last, &path).is_some_and(|n| matches!(n.kind, Kind::Map(_)));
            let first = outline(text, DuplicateKeyPolicy::FirstWins)
                .and_then(|first| line_of_path(&first, &path));
            Some((render(&path), block, first))
        });
        // A block (a pasted `model:` section) is merged; a plain value is
        // given once.
        let fix = |block: bool| {
            if block {
                format!("keep one `{key}:` block and move the other's settings into it")
            } else {
                "keep only one of them".to_owned()
            }
        };
        match found {
            Some((path, block, Some(first))) => {
                format!(
                    "`{path}` is given twice (also on line {first}); {}",
                    fix(block)
                )
            }
            Some((path, block, None)) => format!("`{path}` is given twice; {}", fix(block)),
            None => format!("`{key}` is given twice in the same place; {}", fix(false)),
        }
    }

    /// The line of the first tab in the indentation at or above the line
    /// the parser complained about: a parser reports a tab where the
    /// indentation stops making sense, often the line after.
    fn tab_indentation(text: &str, reported: Option<u64>) -> Option<u64> {
        let lines: Vec<&str> = text.lines().collect();
        let last = reported
            .and_then(|l| usize::try_from(l).ok())
            .unwrap_or(lines.len())
            .min(lines.len());
        let indented_with_tab = |l: &&str| {
            l.chars()
                .take_while(|c| c.is_whitespace())
                .any(|c| c == '\t')
        };
        // Nearest to the reported line first.
        (0..last)
            .rev()
            .find(|&i| lines.get(i).is_some_and(indented_with_tab))
            .or_else(|| lines.iter().position(indented_with_tab))
            .and_then(|i| u64::try_from(i + 1).ok())
    }

    /// A value of the wrong form, found while reading the schema.
    pub(super) fn invalid(
        text: &str,
        origin: &Path,
        e: serde_path_to_error::Error<serde_json::Error>,
    ) -> ConfigError {
        let mut path: Vec<Part> = e
            .path()
            .iter()
            .filter_map(|segment| match segment {
                serde_path_to_error::Segment::Map { key } => Some(Part::Key(key.clone())),
                serde_path_to_error::Segment::Seq { index } => Some(Part::Index(*index)),
                serde_path_to_error::Segment::Enum { variant } => Some(Part::Key(variant.clone())),
                serde_path_to_error::Segment::Unknown => None,
            })
            .collect();
        let mut message = plain(&e.into_inner().to_string());
        // A missing key is reported on its parent; name it instead.
        if let Some(field) = missing_field(&message) {
            path.push(Part::Key(field));
            message = "this key is required here but missing".to_owned();
        }
        let line =
            outline(text, DuplicateKeyPolicy::LastWins).and_then(|root| line_of_path(&root, &path));
        ConfigError::Invalid {
            path: origin.to_owned(),
            key: if path.is_empty() {
                "(top level)".to_owned()
            } else {
                render(&path)
            },
            line,
            message,
        }
    }

    /// Adds the key's line to an error of [`super::Config::validate`].
    pub(super) fn with_line(text: &str, e: ConfigError) -> ConfigError {
        match e {
            ConfigError::Invalid {
                path,
                key,
                line: None,
                message,
            } => {
                let line = outline(text, DuplicateKeyPolicy::LastWins)
                    .and_then(|root| line_of_dotted(&root, &key));
                ConfigError::Invalid {
                    path,
                    key,
                    line,
                    message,
                }
            }
            other => other,
        }
    }

    fn missing_field(message: &str) -> Option<String> {
        let rest = message.strip_prefix("missing field `")?;
        Some(rest.strip_suffix('`')?.to_owned())
    }

    /// serde's message in plain words: what was expected and what was
    /// found.
    fn plain(message: &str) -> String {
        for prefix in ["invalid type: ", "invalid value: "] {
            if let Some(rest) = message.strip_prefix(prefix)
                && let Some((found, expected)) = rest.rsplit_once(", expected ")
            {
                return format!(
                    "expected {}, not {}",
                    expected_words(expected),
                    found_words(found)
                );
            }
        }
        if let Some(rest) = message.strip_prefix("unknown variant `")
            && let Some((given, choices)) = rest.split_once("`, expected ")
        {
            let choices = choices
                .trim_start_matches("one of ")
                .replace(" or ", ", ")
                .replace('`', "");
            return format!("`{given}` is not one of the choices: {choices}");
        }
        message.to_owned()
    }

    fn expected_words(expected: &str) -> String {
        let whole = |max: &str| format!("a whole number from 0 to {max}");
        match expected {
            "u8" => whole("255"),
            "u16" => whole("65535"),
            "u32" => whole("4294967295"),
            "u64" | "u128" | "usize" => "a whole number (0 or more)".to_owned(),
            "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "a whole number".to_owned(),
            "f32" | "f64" => "a number".to_owned(),
            "a boolean" => "true or false".to_owned(),
            "a string" | "a borrowed string" | "a character" => "text".to_owned(),
            "a sequence" => "a list".to_owned(),
            e if e == "a map" || e.starts_with("struct ") || e.starts_with("map") => {
                "indented `key: value` settings".to_owned()
            }
            e => e.to_owned(),
        }
    }

    fn found_words(found: &str) -> String {
        let quoted = |prefix: &str| {
            found
                .strip_prefix(prefix)
                .map(|v| v.trim_matches('`').to_owned())
        };
        if let Some(s) = found.strip_prefix("string ") {
            format!("the text {s}")
        } else if let Some(n) = quoted("integer ").or_else(|| quoted("floating point ")) {
            format!("the number {n}")
        } else if let Some(b) = quoted("boolean ") {
            format!("`{b}`")
        } else {
            match found {
                "unit value" => "empty".to_owned(),
                "sequence" => "a list".to_owned(),
                "map" => "indented settings".to_owned(),
                other => other.to_owned(),
            }
        }
    }

    /// One step of a key path.
    #[derive(Debug, Clone, PartialEq)]
    enum Part {
        Key(String),
        Index(usize),
    }

    /// `a.b[0].c`, as the errors name keys.
    fn render(path: &[Part]) -> String {
        let mut out = String::new();
        for part in path {
            match part {
                Part::Key(k) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(k);
                }
                Part::Index(i) => out.push_str(&format!("[{i}]")),
            }
        }
        out
    }

    /// A YAML document reduced to where its keys and items are.
    struct Node {
        line: u64,
        kind: Kind,
    }

    enum Kind {
        /// Each key with its own position (line, column) and its value.
        Map(Vec<(String, (u64, u64), Node)>),
        Seq(Vec<Node>),
        Leaf,
    }

    fn outline(text: &str, duplicates: DuplicateKeyPolicy) -> Option<Node> {
        let options = serde_saphyr::options! { duplicate_keys: duplicates };
        let root: Spanned<Shape> = serde_saphyr::from_str_with_options(text, options).ok()?;
        Some(node(root))
    }

    fn node(spanned: Spanned<Shape>) -> Node {
        let line = spanned.referenced.line();
        let kind = match spanned.value {
            Shape::Map(entries) => Kind::Map(
                entries
                    .into_iter()
                    .map(|(k, v)| {
                        let at = (k.referenced.line(), k.referenced.column());
                        (k.value.0, at, node(v))
                    })
                    .collect(),
            ),
            Shape::Seq(items) => Kind::Seq(items.into_iter().map(node).collect()),
            Shape::Leaf => Kind::Leaf,
        };
        Node { line, kind }
    }

    /// The line of the deepest part of `path` the document has: the key
    /// itself, or its nearest parent when the key is missing.
    fn line_of_path(root: &Node, path: &[Part]) -> Option<u64> {
        let mut here = root;
        let mut line = None;
        for part in path {
            let next = match (&here.kind, part) {
                (Kind::Map(entries), Part::Key(key)) => entries
                    .iter()
                    .find(|(k, _, _)| k == key)
                    .map(|(_, (l, _), v)| (*l, v)),
                (Kind::Seq(items), Part::Index(i)) => items.get(*i).map(|v| (v.line, v)),
                _ => None,
            };
            match next {
                Some((l, node)) => {
                    line = Some(l).filter(|l| *l > 0);
                    here = node;
                }
                None => break,
            }
        }
        line
    }

    /// The node at `path`, if the document has it.
    fn node_at<'a>(root: &'a Node, path: &[Part]) -> Option<&'a Node> {
        path.iter()
            .try_fold(root, |here, part| match (&here.kind, part) {
                (Kind::Map(entries), Part::Key(key)) => {
                    entries.iter().find(|(k, _, _)| k == key).map(|(_, _, v)| v)
                }
                (Kind::Seq(items), Part::Index(i)) => items.get(*i),
                _ => None,
            })
    }

    /// [`line_of_path`] for a key written `a.b[0].c`, where a key may itself
    /// hold dots (a server or route name): the longest key that fits wins.
    fn line_of_dotted(root: &Node, dotted: &str) -> Option<u64> {
        let mut here = root;
        let mut rest = dotted;
        let mut line = None;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix('[') {
                let (index, tail) = after.split_once(']')?;
                let Kind::Seq(items) = &here.kind else {
                    break;
                };
                let Some(item) = index.parse::<usize>().ok().and_then(|i| items.get(i)) else {
                    break;
                };
                line = Some(item.line).filter(|l| *l > 0).or(line);
                here = item;
                rest = tail.strip_prefix('.').unwrap_or(tail);
                continue;
            }
            let Kind::Map(entries) = &here.kind else {
                break;
            };
            let fits = |k: &str| {
                rest.strip_prefix(k)
                    .is_some_and(|t| t.is_empty() || t.starts_with('.') || t.starts_with('['))
            };
            let Some((key, (l, _), value)) = entries
                .iter()
                .filter(|(k, _, _)| fits(k))
                .max_by_key(|(k, _, _)| k.len())
            else {
                break;
            };
            line = Some(*l).filter(|l| *l > 0).or(line);
            here = value;
            let tail = &rest[key.len()..];
            rest = tail.strip_prefix('.').unwrap_or(tail);
        }
        line
    }

    /// The path of the key written at `line`, `column`.
    fn path_of_key(root: &Node, line: u64, column: u64) -> Option<Vec<Part>> {
        fn walk(node: &Node, line: u64, column: u64, path: &mut Vec<Part>) -> bool {
            match &node.kind {
                Kind::Map(entries) => {
                    for (key, at, value) in entries {
                        path.push(Part::Key(key.clone()));
                        if at.0 == line && (at.1 == column || column == 0)
                            || walk(value, line, column, path)
                        {
                            return true;
                        }
                        path.pop();
                    }
                    false
                }
                Kind::Seq(items) => {
                    for (i, item) in items.iter().enumerate() {
                        path.push(Part::Index(i));
                        if walk(item, line, column, path) {
                            return true;
                        }
                        path.pop();
                    }
                    false
                }
                Kind::Leaf => false,
            }
        }
        let mut path = Vec::new();
        (walk(root, line, column, &mut path) || walk(root, line, 0, &mut path)).then_some(path)
    }

    /// What a YAML node is, read through [`Spanned`] for the positions.
    enum Shape {
        Map(Vec<(Spanned<KeyText>, Spanned<Shape>)>),
        Seq(Vec<Spanned<Shape>>),
        Leaf,
    }

    impl<'de> de::Deserialize<'de> for Shape {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Shape, D::Error> {
            d.deserialize_any(ShapeVisitor)
        }
    }

    struct ShapeVisitor;

    impl<'de> Visitor<'de> for ShapeVisitor {
        type Value = Shape;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("any YAML value")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
            let mut entries = Vec::new();
            while let Some(entry) = map.next_entry()? {
                entries.push(entry);
            }
            Ok(Shape::Map(entries))
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element()? {
                items.push(item);
            }
            Ok(Shape::Seq(items))
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Shape, D::Error> {
            d.deserialize_any(ShapeVisitor)
        }

        fn visit_bool<E>(self, _: bool) -> Result<Shape, E> {
            Ok(Shape::Leaf)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Shape, E> {
            Ok(Shape::Leaf)
        }
        fn visit_i128<E>(self, _: i128) -> Result<Shape, E> {
            Ok(Shape::Leaf)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Shape, E> {
            Ok(Shape::Leaf)
        }
        fn visit_u128<E>(self, _: u128) -> Result<Shape, E> {
            Ok(Shape::Leaf)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Shape, E> {
            Ok(Shape::Leaf)
        }
        fn visit_str<E>(self, _: &str) -> Result<Shape, E> {
            Ok(Shape::Leaf)
        }
        fn visit_bytes<E>(self, _: &[u8]) -> Result<Shape, E> {
            Ok(Shape::Leaf)
        }
        fn visit_unit<E>(self) -> Result<Shape, E> {
            Ok(Shape::Leaf)
        }
        fn visit_none<E>(self) -> Result<Shape, E> {
            Ok(Shape::Leaf)
        }
    }

    /// A mapping key as text, whatever scalar it is written as.
    struct KeyText(String);

    impl<'de> de::Deserialize<'de> for KeyText {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<KeyText, D::Error> {
            struct KeyVisitor;
            impl Visitor<'_> for KeyVisitor {
                type Value = KeyText;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a key")
                }
                fn visit_str<E>(self, v: &str) -> Result<KeyText, E> {
                    Ok(KeyText(v.to_owned()))
                }
                fn visit_bool<E>(self, v: bool) -> Result<KeyText, E> {
                    Ok(KeyText(v.to_string()))
                }
                fn visit_i64<E>(self, v: i64) -> Result<KeyText, E> {
                    Ok(KeyText(v.to_string()))
                }
                fn visit_u64<E>(self, v: u64) -> Result<KeyText, E> {
                    Ok(KeyText(v.to_string()))
                }
                fn visit_f64<E>(self, v: f64) -> Result<KeyText, E> {
                    Ok(KeyText(v.to_string()))
                }
                fn visit_unit<E>(self) -> Result<KeyText, E> {
                    Ok(KeyText(String::new()))
                }
            }
            d.deserialize_any(KeyVisitor)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platform_variables_are_shell_names() {
        assert_eq!(
            platform_var("telegram", "HOME_CHANNEL"),
            "TELEGRAM_HOME_CHANNEL"
        );
        assert_eq!(
            platform_var("whatsapp-cloud", "ALLOWED_USERS"),
            "WHATSAPP_CLOUD_ALLOWED_USERS"
        );
    }

    #[test]
    fn constant_time_eq_is_plain_equality() {
        assert!(constant_time_eq(b"abcd", b"abcd"));
        assert!(!constant_time_eq(b"abcd", b"abce"));
        assert!(!constant_time_eq(b"xbcd", b"abcd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"0123456789abcdef"));
        assert!(constant_time_eq(b"", b""));
    }

    fn parse(text: &str) -> Result<(Config, Vec<String>), ConfigError> {
        Config::parse(text, Path::new("config.yaml"))
    }

    #[test]
    fn homeassistant_keys_are_read_and_their_tokens_redacted() {
        let (c, w) = parse(
            "platforms:\n  homeassistant:\n    url: http://ha.local:8123\n    token: ha-token-0123456789\n    conversation_token: conv-secret-0123456789\n    allowed_services: [light.*]\n    reply_timeout_secs: 30\n",
        )
        .unwrap();
        assert!(w.is_empty(), "{w:?}");
        let ha = &c.platforms.homeassistant;
        assert_eq!(ha.url.as_deref(), Some("http://ha.local:8123"));
        assert_eq!(ha.allowed_services, ["light.*"]);
        assert_eq!(ha.reply_timeout_secs, 30);
        assert_eq!(HomeAssistantConfig::default().reply_timeout_secs, 60);
        let secrets = c.secret_values();
        assert!(secrets.contains(&"ha-token-0123456789".to_owned()));
        assert!(secrets.contains(&"conv-secret-0123456789".to_owned()));
        assert!(!format!("{ha:?}").contains("ha-token-0123456789"));
    }

    #[test]
    fn mcp_servers_are_read_and_checked() {
        let (c, w) = parse(
            "mcp_servers:\n  github:\n    command: npx\n    args: [-y, server-github]\n    env: {GITHUB_TOKEN: \"${GH_TOKEN}\"}\n    tools: {exclude: [delete_repo]}\n  remote:\n    url: https://mcp.example.com/mcp\n    headers: {Authorization: Bearer literal-token-123456}\n    lazy: true\n",
        )
        .unwrap();
        assert!(w.is_empty(), "{w:?}");
        let gh = &c.mcp_servers["github"];
        assert_eq!(gh.args, ["-y", "server-github"]);
        assert!(gh.enabled && !gh.lazy && gh.timeout == 120);
        assert!(gh.tools.admits("create_issue") && !gh.tools.admits("delete_repo"));
        assert!(c.mcp_servers["remote"].lazy);
        // A literal header is a secret; a `${VAR}` reference is not a value.
        let secrets = c.secret_values();
        assert!(secrets.contains(&"Bearer literal-token-123456".to_owned()));
        assert!(!secrets.iter().any(|s| s.contains("${")));

        for (bad, key) in [
            ("mcp_servers:\n  x:\n    args: [a]\n", "mcp_servers.x"),
            (
                "mcp_servers:\n  x:\n    command: a\n    url: http://b\n",
                "mcp_servers.x",
            ),
            (
                "mcp_servers:\n  x:\n    url: ftp://b\n",
                "mcp_servers.x.url",
            ),
            (
                "mcp_servers:\n  bad name:\n    command: a\n",
                "mcp_servers.bad name",
            ),
            (
                "mcp_servers:\n  x:\n    command: a\n    timeout: 0\n",
                "mcp_servers.x.timeout",
            ),
        ] {
            match parse(bad) {
                Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{bad}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_signal_section_is_read_and_checked() {
        let (c, w) = parse(
            "platforms:\n  signal:\n    http_url: http://127.0.0.1:8080\n    account: \"+4915112345678\"\n    receive_mode: poll\n    poll_interval_secs: 5\n    require_mention: false\n",
        )
        .unwrap();
        assert!(w.is_empty(), "{w:?}");
        let s = &c.platforms.signal;
        assert_eq!(s.http_url.as_deref(), Some("http://127.0.0.1:8080"));
        assert_eq!(s.account.as_deref(), Some("+4915112345678"));
        assert_eq!(s.receive_mode, SignalReceiveMode::Poll);
        assert_eq!((s.poll_interval_secs, s.require_mention), (5, false));
        // Unquoted, YAML reads a number; it comes back with its `+`.
        let (c, _) = parse("platforms:\n  signal:\n    account: +4915112345678\n").unwrap();
        assert_eq!(
            c.platforms.signal.account.as_deref(),
            Some("+4915112345678")
        );
        let (c, _) = parse("platforms:\n  signal: {}\n").unwrap();
        assert_eq!(c.platforms.signal, SignalConfig::default());
        assert_eq!(
            c.platforms.signal.receive_mode,
            SignalReceiveMode::Websocket
        );
        match parse("platforms:\n  signal:\n    http_url: localhost:8080\n") {
            Err(ConfigError::Invalid { key, .. }) => assert_eq!(key, "platforms.signal.http_url"),
            other => panic!("{other:?}"),
        }
        assert!(parse("platforms:\n  signal:\n    receive_mode: sse\n").is_err());
    }

    #[test]
    fn empty_file_means_defaults() {
        let (c, w) = parse("").unwrap();
        assert_eq!(c, Config::default());
        assert!(w.is_empty());
        assert_eq!(c.agent.max_turns, 90);
    }

    #[test]
    fn reads_the_model_section() {
        let (c, w) = parse(
            "model:\n  default: qwen3\n  provider: custom\n  base_url: http://127.0.0.1:8000/v1\n  api_key: sk-local-123456789\nfallback_providers:\n  - {provider: openrouter, model: meta/llama, api_key: or-key-123456789}\nagent:\n  max_turns: 12\n",
        )
        .unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(c.model.default.as_deref(), Some("qwen3"));
        assert_eq!(c.agent.max_turns, 12);
        assert_eq!(c.fallback_providers[0].provider, ProviderKind::Openrouter);
        let ep = c.primary_endpoint(&Env::default()).unwrap();
        assert_eq!(ep.base_url, "http://127.0.0.1:8000/v1");
        assert_eq!(ep.api_key.unwrap().expose(), "sk-local-123456789");
    }

    #[test]
    fn unknown_keys_warn_with_their_path() {
        let (_, w) = parse("agent:\n  max_turn: 5\nmodle: x\n").unwrap();
        assert!(w.iter().any(|l| l.contains("agent.max_turn")), "{w:?}");
        assert!(w.iter().any(|l| l.contains("modle")), "{w:?}");
    }

    #[test]
    fn invalid_values_name_key_and_form() {
        let e = parse("agent:\n  max_turns: lots\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("agent.max_turns"), "{e}");
        let e = parse("model:\n  provider: skynet\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("model.provider"), "{e}");
        assert!(e.contains("custom"), "{e}");
        let e = parse("model:\n  base_url: ftp://x\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("model.base_url") && e.contains("http"), "{e}");
        let e = parse("compression:\n  threshold: 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("compression.threshold"), "{e}");
    }

    #[test]
    fn errors_name_the_line_of_their_key_even_when_a_name_holds_dots() {
        let e = parse(
            "agent:\n  max_turns: 5\nmcp_servers:\n  my.tools:\n    command: a\n    timeout: 0\n",
        )
        .unwrap_err();
        match e {
            // Dots are not allowed in a server's name: the error is on
            // the name, whose key holds a dot.
            ConfigError::Invalid { key, line, .. } => {
                assert_eq!(key, "mcp_servers.my.tools");
                assert_eq!(line, Some(4));
            }
            other => panic!("{other:?}"),
        }
        let e = parse("model:\n  default: m\n  temperature: warm\n").unwrap_err();
        assert!(
            e.to_string().ends_with(
                ", line 3: `model.temperature`: expected a number, not the text \"warm\""
            ),
            "{e}"
        );
    }

    #[test]
    fn broken_yaml_is_a_syntax_error() {
        let e = parse("model: [unclosed\n").unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { .. }), "{e}");
    }

    #[test]
    fn missing_model_says_what_to_set() {
        let e = Config::default()
            .primary_endpoint(&Env::default())
            .unwrap_err();
        assert!(e.contains("model.default"), "{e}");
        let mut c = Config::default();
        c.model.default = Some("m".into());
        let e = c.primary_endpoint(&Env::default()).unwrap_err();
        assert!(e.contains("model.base_url"), "{e}");
        c.model.provider = ProviderKind::Anthropic;
        let e = c.primary_endpoint(&Env::default()).unwrap_err();
        assert!(e.contains("ANTHROPIC_API_KEY"), "{e}");
        let ep = c
            .primary_endpoint(&Env::from_pairs([("ANTHROPIC_API_KEY", "k-123456789")]))
            .unwrap();
        assert_eq!(ep.base_url, "https://api.anthropic.com");
    }

    #[test]
    fn the_environment_overrides_the_files_model_and_server() {
        let mut c = Config::default();
        c.model.default = Some("from-file".into());
        c.model.base_url = Some("http://127.0.0.1:8080/v1".into());
        let ep = c.primary_endpoint(&Env::default()).unwrap();
        assert_eq!(
            (ep.model.as_str(), ep.base_url.as_str()),
            ("from-file", "http://127.0.0.1:8080/v1")
        );
        let env = Env::from_pairs([
            ("TALARIA_MODEL", "from-env"),
            ("TALARIA_BASE_URL", "http://127.0.0.1:9999/v1"),
        ]);
        let ep = c.primary_endpoint(&env).unwrap();
        assert_eq!(
            (ep.model.as_str(), ep.base_url.as_str()),
            ("from-env", "http://127.0.0.1:9999/v1")
        );
        // Set but empty is not set.
        let env = Env::from_pairs([("TALARIA_MODEL", "")]);
        assert_eq!(c.primary_endpoint(&env).unwrap().model, "from-file");
    }

    /// Plants a distinct value in every leaf of `tree` that holds a
    /// credential by its name (and a URL with credentials in every URL
    /// leaf), recording `(path, value, is_url)`. The leaves come from the
    /// serialized configuration itself, so a field added to the schema is
    /// planted without this test naming it.
    fn plant(tree: &mut serde_json::Value, path: &str, planted: &mut Vec<(String, String, bool)>) {
        use serde_json::Value;
        match tree {
            Value::Object(map) => {
                for (k, v) in map.iter_mut() {
                    let here = format!("{path}.{k}");
                    let tag: String = here
                        .chars()
                        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                        .collect();
                    let leaf = v.is_null() || v.is_string();
                    let low = k.to_ascii_lowercase();
                    if leaf
                        && (path.ends_with(".headers") || names_a_credential(k))
                        && !low.ends_with("_env")
                    {
                        let value = format!("planted{tag}-0123456789");
                        *v = Value::String(value.clone());
                        planted.push((here, value, false));
                    } else if leaf
                        // An unset MCP `url` stays unset: a server has
                        // `command` or `url`, not both.
                        && (v.is_string() || !path.starts_with(".mcp_servers"))
                        && (low.contains("url") || low.ends_with("base") || low == "homeserver")
                    {
                        let value = format!(
                            "https://bot:pw{tag}-0123456789@h.example/v1?api-key=qk{tag}-0123456789"
                        );
                        *v = Value::String(value.clone());
                        planted.push((here, value, true));
                    } else {
                        plant(v, &here, planted);
                    }
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter_mut().enumerate() {
                    plant(item, &format!("{path}[{i}]"), planted);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn every_credential_in_the_config_is_a_secret_and_redacted() {
        // One entry in every map and list, so their fields are walked too;
        // numbers set where a field's name only sounds like a credential
        // (`max_tokens`).
        let (base, w) = parse(
            "model:\n  max_tokens: 100\nfallback_providers:\n  - {provider: openai, model: m}\nmcp_servers:\n  s:\n    command: x\n    env: {SOME_TOKEN: a, PLAIN: b}\n    headers: {X-Trace: c}\n  h: {url: \"https://mcp.example/mcp\"}\nplatforms:\n  webhook:\n    routes:\n      r: {scheme: github}\n",
        )
        .unwrap();
        assert!(w.is_empty(), "{w:?}");
        let mut tree = serde_json::to_value(&base).unwrap();
        let mut planted = Vec::new();
        plant(&mut tree, "", &mut planted);
        let paths: Vec<&str> = planted.iter().map(|(p, _, _)| p.as_str()).collect();
        // The walk reaches every kind of credential the issue names.
        for want in [
            ".model.api_key",
            ".model.base_url",
            ".fallback_providers[0].api_key",
            ".memory.mem0.api_key",
            ".store.postgres_url",
            ".platforms.telegram.token",
            ".platforms.discord.token",
            ".platforms.mattermost.token",
            ".platforms.slack.bot_token",
            ".platforms.slack.app_token",
            ".platforms.api_server.key",
            ".platforms.webhook.routes.r.secret",
            ".platforms.matrix.access_token",
            ".platforms.whatsapp_cloud.token",
            ".platforms.whatsapp_cloud.app_secret",
            ".platforms.whatsapp_cloud.verify_token",
            ".platforms.sms.auth_token",
            ".platforms.email.password",
            ".platforms.homeassistant.token",
            ".platforms.homeassistant.conversation_token",
            ".mcp_servers.s.env.SOME_TOKEN",
            ".mcp_servers.s.headers.X-Trace",
            ".mcp_servers.h.url",
        ] {
            assert!(paths.contains(&want), "{want} was not planted: {paths:?}");
        }
        let text = serde_json::to_string(&tree).unwrap();
        let (c, w) = parse(&text).unwrap();
        assert!(w.is_empty(), "{w:?}");
        let redactor = crate::Redactor::new(c.secret_values());
        let printed = serde_saphyr::to_string(&c).unwrap();
        let debugged = format!("{c:?}");
        for (path, value, is_url) in &planted {
            let parts: Vec<String> = if *is_url {
                let url = url_secrets(value);
                assert_eq!(url.len(), 2, "{path}: {url:?}");
                url
            } else {
                vec![value.clone()]
            };
            let shown = redactor.redact(&format!("the model read: {value}."));
            for part in &parts {
                assert!(
                    !shown.contains(part.as_str()),
                    "{path}: {part} survives as {shown}"
                );
            }
            // A credential held by name must be a `Secret` (an MCP map's
            // values excepted: they may be `${VAR}` references): printing
            // or logging the config masks it.
            if !is_url && !path.starts_with(".mcp_servers") {
                assert!(
                    !printed.contains(value.as_str()),
                    "{path} is printed in plain: not a Secret"
                );
                assert!(
                    !debugged.contains(value.as_str()),
                    "{path} is in Debug in plain: not a Secret"
                );
            }
        }
        // An MCP env value not named as a credential is not redacted.
        assert!(!c.secret_values().iter().any(|v| v == "b"));
    }

    #[test]
    fn the_secret_walk_leaves_printing_masked() {
        let (c, _) = parse("platforms:\n  telegram:\n    token: tg-token-0123456789\n").unwrap();
        assert_eq!(c.secret_values(), ["tg-token-0123456789"]);
        // The walk turned revealing off again.
        let shown = serde_saphyr::to_string(&c).unwrap();
        assert!(!shown.contains("tg-token-0123456789"), "{shown}");
        assert!(shown.contains("****6789"), "{shown}");
    }

    #[test]
    fn secrets_are_masked_when_printed() {
        let (c, _) = parse("model:\n  api_key: sk-abcdefghijklmnop\n").unwrap();
        let shown = serde_saphyr::to_string(&c).unwrap();
        assert!(!shown.contains("sk-abcdefghijklmnop"), "{shown}");
        assert!(shown.contains("****mnop"), "{shown}");
        assert!(!format!("{c:?}").contains("sk-abcdefghijklmnop"));
    }

    #[test]
    fn dotenv_is_overridden_by_process_env() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(".env");
        std::fs::write(&p, "TALARIA_TEST_ONLY_IN_FILE=from-file-value\nPATH=nope\n").unwrap();
        let env = Env::load(&p).unwrap();
        assert_eq!(
            env.get("TALARIA_TEST_ONLY_IN_FILE"),
            Some("from-file-value")
        );
        assert_ne!(env.get("PATH"), Some("nope"));
        assert!(env.secret_values().contains(&"from-file-value".to_owned()));
    }

    #[test]
    fn webhook_defaults_and_routes() {
        let (c, w) = parse("").unwrap();
        assert!(w.is_empty());
        let wh = &c.platforms.webhook;
        assert_eq!(wh.enabled, None);
        assert_eq!(wh.host, "127.0.0.1");
        assert_eq!(wh.port, 8644);
        assert_eq!(wh.max_body_bytes, 1024 * 1024);
        assert_eq!(wh.rate_limit_per_minute, 30);
        assert_eq!((wh.header_timeout_secs, wh.body_timeout_secs), (10, 30));
        let api = &c.platforms.api_server;
        assert_eq!((api.header_timeout_secs, api.body_timeout_secs), (10, 30));
        assert!(wh.routes.is_empty());

        let (c, w) = parse(
            "platforms:\n  webhook:\n    routes:\n      gh-push:\n        secret: s3cr3t-value-123\n        scheme: github\n        events: [push]\n      alerts:\n        secret_env: ALERTS_SECRET\n        scheme: svix\n        deliver: telegram:42\n        prompt: 'Alert {payload.title}'\n        enabled: false\n        colour: red\n",
        )
        .unwrap();
        assert!(
            w.iter()
                .any(|l| l.contains("platforms.webhook.routes.alerts.colour")),
            "{w:?}"
        );
        let routes = &c.platforms.webhook.routes;
        let gh = &routes["gh-push"];
        assert_eq!(gh.scheme, WebhookScheme::Github);
        assert_eq!(gh.deliver, "local");
        assert_eq!(gh.events, vec!["push".to_owned()]);
        assert!(gh.enabled);
        assert_eq!(gh.prompt, "");
        assert!(!format!("{gh:?}").contains("s3cr3t-value-123"));
        let alerts = &routes["alerts"];
        assert_eq!(alerts.scheme, WebhookScheme::Svix);
        assert_eq!(alerts.secret, None);
        assert_eq!(alerts.secret_env.as_deref(), Some("ALERTS_SECRET"));
        assert_eq!(alerts.deliver, "telegram:42");
        assert!(!alerts.enabled);
    }

    #[test]
    fn webhook_routes_need_a_scheme_and_a_strict_name() {
        let e = parse("platforms:\n  webhook:\n    routes:\n      a:\n        secret: x\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("platforms.webhook.routes") && e.contains("scheme"),
            "{e}"
        );
        let e = parse(
            "platforms:\n  webhook:\n    routes:\n      a:\n        secret: x\n        scheme: md5\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("scheme") && e.contains("github"), "{e}");
        for bad in ["'../x'", "'a b'", "'.hidden'", "'a/b'"] {
            let e = parse(&format!(
                "platforms:\n  webhook:\n    routes:\n      {bad}:\n        secret: x\n        scheme: hmac\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(e.contains("route name"), "{bad}: {e}");
        }
    }

    #[test]
    fn email_settings_and_tls_modes_are_read() {
        let (c, w) = parse(
            "platforms:\n  email:\n    address: bot@example.org\n    imap_host: imap.example.org\n    imap_tls: starttls\n    smtp_tls: none\n    poll_interval_secs: 30\n",
        )
        .unwrap();
        assert!(w.is_empty(), "{w:?}");
        let e = &c.platforms.email;
        assert_eq!(e.address.as_deref(), Some("bot@example.org"));
        assert_eq!(e.imap_tls, MailTls::Starttls);
        assert_eq!(e.smtp_tls, MailTls::None);
        assert_eq!((e.imap_port, e.smtp_port), (993, 587));
        assert_eq!(e.mailbox, "INBOX");
        assert_eq!(e.poll_interval_secs, 30);
        let err = parse("platforms:\n  email:\n    imap_tls: maybe\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("platforms.email.imap_tls"), "{err}");
    }
}
