//! The one typed configuration schema, its defaults, and how it is loaded.
//!
//! Every command reads configuration through [`load`], so defaults live in
//! exactly one place: the `Default` impls below. Unknown keys are reported as
//! warnings that name the key path (a typo must not silently do nothing);
//! values of the wrong form are errors that name the key and the form
//! expected.
//!
//! The sections under `platforms:` are not part of this schema: each
//! belongs to the crate of the platform (or front end) it configures, and
//! is kept here as written until its owner reads it with
//! [`parse_section`], which reports its keys in the same words.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::home::Home;

/// Errors reading or validating configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file exists but could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not YAML at all (a tab used for indentation, an unclosed bracket,
    /// a key given twice).
    #[error("{path}{}: {message}", at_line(*.line))]
    Syntax {
        /// The file.
        path: PathBuf,
        /// Where, counting from 1, when known.
        line: Option<u64>,
        /// The parser's complaint, in plain words.
        message: String,
    },
    /// YAML, but a value of the wrong form; `key` is its path
    /// (`agent.max_turns`, `fallback_providers[0].model`).
    #[error("{path}{}: `{key}`: {message}", at_line(*.line))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The key's path.
        key: String,
        /// The key's line, counting from 1, when known.
        line: Option<u64>,
        /// What is wrong with the value.
        message: String,
    },
    /// The `.env` file could not be read or parsed.
    #[error("cannot read {path}: {message}")]
    DotEnv {
        /// The file.
        path: PathBuf,
        /// The parser's complaint.
        message: String,
    },
}

impl fmt::Debug for Loaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The file's text may hold credentials in plain: its size only.
        f.debug_struct("Loaded")
            .field("config", &self.config)
            .field("warnings", &self.warnings)
            .field("env", &self.env)
            .field("path", &self.path)
            .field("text", &self.text.as_ref().map(|t| t.len()))
            .finish()
    }
}

/// A setting written as a word that YAML may read as a boolean first:
/// `on`, `off`, `yes` and `no` are booleans to YAML 1.1 parsers, so a
/// user's `vision: on` arrives as `true`. Booleans come back as `on` and
/// `off`; words come back lowercased.
pub(crate) fn switch_word<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Bool(bool),
        Word(String),
    }
    Ok(match Raw::deserialize(d)? {
        Raw::Bool(true) => "on".to_owned(),
        Raw::Bool(false) => "off".to_owned(),
        Raw::Word(w) => w.trim().to_ascii_lowercase(),
    })
}

/// `, line N` after a file name, when the line is known.
fn at_line(line: Option<u64>) -> String {
    line.map(|n| format!(", line {n}")).unwrap_or_default()
}

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    /// The model and the server it is on (`model:`).
    pub model: ModelConfig,
    /// Servers tried in order when the primary fails.
    pub fallback_providers: Vec<FallbackProvider>,
    /// How a turn runs (`agent:`).
    pub agent: AgentConfig,
    /// Built-in memory (`memory:`).
    pub memory: MemoryConfig,
    /// Context compression (`compression:`).
    pub compression: CompressionConfig,
    /// Approvals of dangerous commands (`approvals:`).
    pub approvals: ApprovalsConfig,
    /// Commands that run without asking, written by hand: a command glob
    /// (`git push origin *`) or a guard pattern key (every command of that
    /// kind). Only commands without shell operators match. "Always" answers
    /// are not added here but to `command_allowlist.txt`, as exact commands.
    pub command_allowlist: Vec<String>,
    /// The `terminal` tool (`terminal:`).
    pub terminal: TerminalConfig,
    /// `talaria gateway run`: routing, busy handling, shutdown.
    pub gateway: GatewayConfig,
    /// When a chat's conversation starts afresh on its own.
    pub session_reset: SessionResetConfig,
    /// `platforms:`: a section per messaging platform the gateway
    /// connects and per front end (the API server), as written; each is
    /// read by its owner with [`parse_section`].
    pub platforms: PlatformSections,
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
    /// Photos, voice notes and files users send (`media:`).
    pub media: MediaConfig,
    /// Side models for single jobs (`auxiliary:`).
    pub auxiliary: AuxiliaryConfig,
    /// Speech to text (`stt:`).
    pub stt: SttConfig,
    /// Text to speech (`tts:`).
    pub tts: TtsConfig,
    /// The image generation server (`image_gen:`).
    pub image_gen: ImageGenConfig,
    /// The web tools and the guard on fetches a chat can steer (`web:`).
    pub web: WebConfig,
    /// The browser tools (`browser:`).
    pub browser: BrowserConfig,
    /// The `execute_code` tool: its time limit, tool-call budget and
    /// Python interpreter (`code_execution:`).
    pub code_execution: CodeExecutionConfig,
    /// Per platform (`telegram`, `cli`, `api_server`, ...), the toolsets
    /// its conversations get (`[terminal, file, web]`), as the ancestor
    /// writes it; a platform left out gets every toolset.
    pub platform_toolsets: BTreeMap<String, Vec<String>>,
    /// Subagents of `delegate_task`: how many at once, their step budget,
    /// their model, whether their commands need no approval
    /// (`delegation:`).
    pub delegation: DelegationConfig,
    /// Prices per million tokens by model, over the built-in table
    /// (`prices:`).
    pub prices: BTreeMap<String, ModelPrice>,
    /// Spending limits for the home and per chat (`budget:`).
    pub budget: BudgetConfig,
    /// The web dashboard (`dashboard:`).
    pub dashboard: DashboardConfig,
    /// What `/metrics` serves and to whom (`metrics:`).
    pub metrics: MetricsConfig,
}

/// A parsed configuration with what was noticed on the way.
#[derive(Clone)]
pub struct Loaded {
    /// The configuration, defaults filled in.
    pub config: Config,
    /// Human-readable warnings (unknown keys), one per line.
    pub warnings: Vec<String>,
    /// Merged environment: `.env` overlaid by the process environment.
    pub env: Env,
    /// The file read, when one existed.
    pub path: Option<PathBuf>,
    /// Its text, so that the sections read later name lines in errors.
    pub text: Option<String>,
}

/// Configuration errors in words a person reads: the line of the key an
/// error is about, and serde's and the YAML parser's phrasing ("invalid
/// type: string \"x\", expected u32", "set DuplicateKeyPolicy in Options")
/// said plainly.
mod yaml_errors;

mod agent;
mod code_execution;
mod dashboard;
mod delegation;
mod env;
mod gateway;
mod load;
mod media;
mod metrics;
mod pricing;
mod routes;
mod secret;
mod sections;
mod services;
mod web;

pub use agent::*;
pub use code_execution::*;
pub use dashboard::*;
pub use delegation::*;
pub use env::*;
pub use gateway::*;
pub use load::*;
pub use media::*;
pub use metrics::*;
pub use pricing::*;
pub use routes::*;
pub use secret::*;
pub use sections::*;
pub use services::*;
pub use web::*;

#[cfg(test)]
mod tests;
