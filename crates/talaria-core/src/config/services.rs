//! The store, skills, display, the curator, MCP servers and cron.

use super::*;

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
    /// SQLite in the home (the default) or a shared PostgreSQL.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryNotifications {
    /// Nothing is said.
    Off,
    /// One short line of what was learned.
    #[default]
    On,
    /// The line with previews of what was written.
    Verbose,
}

impl<'de> Deserialize<'de> for MemoryNotifications {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<MemoryNotifications, D::Error> {
        match switch_word(d)?.as_str() {
            "off" => Ok(MemoryNotifications::Off),
            "on" => Ok(MemoryNotifications::On),
            "verbose" => Ok(MemoryNotifications::Verbose),
            other => Err(serde::de::Error::custom(format!(
                "expected off, on or verbose, not `{other}`"
            ))),
        }
    }
}

/// What a chat is shown of the work inside a turn (`display.tool_progress`,
/// the ancestor's values). Today that is what the subagents of
/// `delegate_task` do; the answer itself always comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolProgress {
    /// Nothing: the typing indicator only.
    #[default]
    Off,
    /// A line when a different tool starts.
    New,
    /// A line for every step.
    All,
}

impl<'de> Deserialize<'de> for ToolProgress {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ToolProgress, D::Error> {
        match switch_word(d)?.as_str() {
            "off" => Ok(ToolProgress::Off),
            "new" => Ok(ToolProgress::New),
            "all" | "on" | "verbose" => Ok(ToolProgress::All),
            other => Err(serde::de::Error::custom(format!(
                "expected off, new or all, not `{other}`"
            ))),
        }
    }
}

/// `display:`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DisplayConfig {
    /// How much of background learning is shown under an answer.
    pub memory_notifications: MemoryNotifications,
    /// What a chat is shown of the steps inside a turn.
    pub tool_progress: ToolProgress,
}

/// `curator:`: agent-written skills that go unused turn stale, then are
/// archived (restorable); pinned skills and skills a cron job uses are
/// left alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CuratorConfig {
    /// Whether unused agent-written skills are marked stale and archived.
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
    /// Arguments to `command`.
    pub args: Vec<String>,
    /// Extra environment for the program; values may use `${VAR}`.
    pub env: BTreeMap<String, String>,
    /// Working directory of the program.
    pub cwd: Option<PathBuf>,
    /// The endpoint (Streamable HTTP transport).
    pub url: Option<String>,
    /// HTTP headers sent with every request; values may use `${VAR}`.
    pub headers: BTreeMap<String, String>,
    /// A server can be kept in the file but switched off.
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
    /// Tool names to offer; empty offers all.
    pub include: Vec<String>,
    /// Tool names never to offer, applied after `include`.
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
