//! The command-line grammar.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Talaria: a self-hosted AI agent that lives in your terminal and chat apps.
///
/// It talks to any OpenAI-compatible model server or to Anthropic, runs
/// tools on your machine, remembers across sessions, and keeps every
/// conversation searchable. Start with `talaria setup`, then `talaria chat`.
// No bare `about` here: it would show the crate's description
// ("The `talaria` command.") instead of the words above.
#[derive(Debug, Parser)]
#[command(name = "talaria", version, propagate_version = true)]
pub struct Cli {
    /// The Talaria home (config, database, memories). Default: $TALARIA_HOME or ~/.talaria.
    #[arg(long, global = true, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// Use the profile NAME: a separate agent with its own home under
    /// <home>/profiles/NAME (`default` is the home itself).
    #[arg(
        short = 'p',
        long,
        global = true,
        value_name = "NAME",
        env = "TALARIA_PROFILE"
    )]
    pub profile: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Talk to the agent: an interactive session, or one prompt with -q.
    Chat(ChatArgs),
    /// Show, check, read, set or edit the configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Browse, search, export, rename, delete and prune past sessions.
    Sessions {
        #[command(subcommand)]
        command: SessionsCommand,
    },
    /// Set up the model (config.yaml) and optionally a Telegram bot (.env),
    /// interactively or from flags.
    Setup(SetupArgs),
    /// List the models the configured server offers, or set the default.
    Model {
        /// The new default: a model name, or `provider:name` for another
        /// provider (`openrouter:anthropic/claude-sonnet-4`).
        name: Option<String>,
    },
    /// Run and manage the messaging gateway.
    Gateway {
        #[command(subcommand)]
        command: GatewayCommand,
    },
    /// Commands approved with "always": list them, take one back.
    Approvals {
        #[command(subcommand)]
        command: crate::approvals_cmd::ApprovalsCommand,
    },
    /// Approve strangers who asked for access with a pairing code.
    Pairing {
        #[command(subcommand)]
        command: PairingCommand,
    },
    /// Tokens, cost, turns and tool calls by day, model, platform and chat.
    Insights {
        /// How many days back, today included (UTC).
        #[arg(long, default_value_t = 30)]
        days: u32,
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Send a message to a chat: through the running gateway, or directly
    /// when none runs.
    Send {
        /// Where: `telegram` (its home channel), `telegram:<chat_id>`,
        /// `telegram:<chat_id>:<thread_id>`, or `local` (a file).
        target: String,
        /// The message; `-` reads it from standard input.
        #[arg(required = true, num_args = 1..)]
        text: Vec<String>,
    },
    /// Show a log under $TALARIA_HOME/logs/ (gateway.log unless FILE is
    /// named): its last lines, filtered by level and time, or followed as
    /// it grows.
    Logs(LogsArgs),
    /// Scheduled jobs: prompts that run by themselves and deliver their answer.
    Cron {
        #[command(subcommand)]
        command: CronCommand,
    },
    /// The agent's memory files (MEMORY.md: its notes; USER.md: about you).
    Memory {
        #[command(subcommand)]
        command: MemoryCommand,
    },
    /// What the agent has learned.
    Learn {
        #[command(subcommand)]
        command: LearnCommand,
    },
    /// Skills: list, read, pin, archive and restore them.
    Skills {
        #[command(subcommand)]
        command: SkillsCommand,
    },
    /// MCP servers: what the configured ones offer, and Talaria as one.
    Mcp {
        #[command(subcommand)]
        command: McpCommand,
    },
    /// Write one archive of the home (database, config, memories, skills,
    /// learning log, hooks, cron output); a running gateway is fine.
    Backup {
        /// The archive to write (default: talaria-backup-DATE-TIME.tar.gz
        /// here). It must not exist.
        file: Option<std::path::PathBuf>,
        /// Include .env (API keys, platform tokens) in the archive.
        #[arg(long)]
        with_secrets: bool,
    },
    /// Make the home again from an archive `talaria backup` wrote; every
    /// file is checked against the archive's manifest before anything is
    /// written.
    Restore {
        /// The archive.
        file: std::path::PathBuf,
        /// Replace a home that is not empty (it is kept beside, renamed).
        #[arg(long)]
        force: bool,
    },
    /// Print the shell completion script for SHELL (bash, zsh, fish,
    /// elvish, powershell). For bash: `source <(talaria completions bash)`
    /// in ~/.bashrc; zsh: write it as `_talaria` in a folder of $fpath.
    Completions {
        /// The shell to complete in.
        shell: clap_complete::Shell,
    },
    /// Check that everything the agent needs works: the configuration,
    /// the database, the model (asked to call a tool), each platform's
    /// credentials (asked of the platform), the home's permissions, disk
    /// space, the sandbox and the MCP servers. Exits 1 on any failure.
    Doctor {
        #[command(subcommand)]
        command: Option<DoctorCommand>,
        /// Print the findings as JSON.
        #[arg(long, global = true)]
        json: bool,
        /// Ask nothing over the network (model and platforms skipped).
        #[arg(long)]
        offline: bool,
    },
    /// The gateway's hooks: which load, and one run by hand.
    Hooks {
        #[command(subcommand)]
        command: HooksCommand,
    },
    /// Profiles: separate agents on one machine, each with its own
    /// configuration, database, memory, skills and gateway.
    Profile {
        #[command(subcommand)]
        command: ProfileCommand,
    },
    /// The database: copy this home's SQLite file into PostgreSQL.
    Store {
        #[command(subcommand)]
        command: crate::store_cmd::StoreCommand,
    },
    /// Bring another agent's home into this one.
    Import {
        #[command(subcommand)]
        command: ImportCommand,
    },
    /// The web dashboard (served by `gateway run` under /ui).
    Dashboard {
        #[command(subcommand)]
        command: DashboardCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum HooksCommand {
    /// The hooks under $TALARIA_HOME/hooks/ that load, with their events;
    /// folders that do not load are named (exit 1).
    List,
    /// Run one hook with an event, as the gateway would, and show its answer.
    Test {
        /// The hook's name.
        name: String,
        /// The event (`agent:end`, `command:new`, ...).
        event: String,
        /// The event's payload as JSON (default `{"test": true}`).
        #[arg(long)]
        payload: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ImportCommand {
    /// A hermes-agent home: its config (mapped to Talaria's keys), .env,
    /// SOUL.md, memories, skills, sessions, cron jobs and pairing
    /// approvals. What is here already is kept; running it twice adds
    /// nothing.
    Hermes {
        /// The hermes-agent home (default: $HERMES_HOME or ~/.hermes).
        #[arg(long, value_name = "DIR")]
        from: Option<PathBuf>,
        /// Print what would be imported, per category, and change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ProfileCommand {
    /// Every profile, the active one marked, with its gateway's state.
    List,
    /// Make a new profile (an empty home; `--copy-config` starts it with
    /// this profile's config.yaml and .env).
    Create {
        name: String,
        /// Copy config.yaml and .env from the profile in use.
        #[arg(long)]
        copy_config: bool,
    },
    /// Delete a profile and everything in it (its gateway must be stopped).
    Delete {
        name: String,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
    },
    /// Where a profile lives, its model, platforms and gateway.
    Show { name: Option<String> },
}

#[derive(Debug, Subcommand)]
pub enum DoctorCommand {
    /// Explain, rule by rule, whether a sender is let in: `talaria doctor
    /// auth telegram:123456789`.
    Auth {
        /// `<platform>:<user_id>`.
        who: String,
        /// The chat the message comes from (default: the user's DM).
        /// Telegram's group ids are negative, hence hyphens are taken.
        #[arg(long, allow_hyphen_values = true)]
        chat: Option<String>,
        /// The kind of chat.
        #[arg(long, value_enum, default_value_t = ChatKind::Dm)]
        chat_type: ChatKind,
        /// The sender is a bot.
        #[arg(long)]
        bot: bool,
    },
}

/// The kinds of chat a sender can write from.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ChatKind {
    Dm,
    Group,
    Channel,
    Thread,
    Forum,
}

#[derive(Debug, Subcommand)]
pub enum DashboardCommand {
    /// Print the argon2 hash of a password (read from standard input) for
    /// `dashboard.password_hash`.
    HashPassword,
}

#[derive(Debug, Subcommand)]
pub enum MemoryCommand {
    /// Print both memory files, entry by entry.
    Show,
    /// Open one in $EDITOR (`memory`, the default, or `user`).
    Edit {
        #[arg(value_enum, default_value_t = MemoryFile::Memory)]
        file: MemoryFile,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum MemoryFile {
    Memory,
    User,
}

#[derive(Debug, Subcommand)]
pub enum LearnCommand {
    /// The learning graph: learned skills and memory cards, and their links.
    Graph {
        /// json, dot, or html (one self-contained page to open in a browser).
        #[arg(long, value_enum, default_value_t = GraphFormat::Json)]
        format: GraphFormat,
        /// Write here instead of standard output.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum GraphFormat {
    Json,
    Dot,
    Html,
}

#[derive(Debug, Subcommand)]
pub enum SkillsCommand {
    /// Every skill with its category, use count and notes.
    List,
    /// A skill's SKILL.md.
    Show {
        name: String,
    },
    /// Keep a skill: the curator leaves it alone and it cannot be deleted.
    Pin {
        name: String,
    },
    Unpin {
        name: String,
    },
    /// Move one of your skills to skills/.archive/.
    Archive {
        name: String,
    },
    /// Bring an archived skill back.
    Restore {
        name: String,
    },
    /// Changes to skills and memory by the agent and its reviews, oldest
    /// first (all, or one skill's).
    History {
        name: Option<String>,
    },
    /// Undo the latest change the agent made to a skill.
    Rollback {
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// The configured servers (nothing is started).
    List,
    /// Start a server and show what it offers.
    Test { server: String },
    /// A server's tools, with the names the model sees.
    Tools { server: String },
    /// Be an MCP server on stdin/stdout: session_search and send_message.
    Serve,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The file in $TALARIA_HOME/logs/: gateway.log (the default; the
    /// gateway's, when `gateway start` runs it), talaria.log (every other
    /// command's), a rotated one (talaria.log.1).
    pub file: Option<String>,
    /// Keep printing lines as they are written, across the file's rotation
    /// or truncation, until Ctrl-C.
    #[arg(short, long)]
    pub follow: bool,
    /// Only records at LEVEL or more severe: trace, debug, info, warn,
    /// error.
    #[arg(long, value_name = "LEVEL")]
    pub level: Option<talaria_core::logs::Level>,
    /// Only records since WHEN: a span back from now (30s, 10m, 2h, 1d,
    /// 1w) or an RFC 3339 time (2026-12-07T09:30:00Z).
    #[arg(long, value_name = "WHEN", value_parser = since)]
    pub since: Option<chrono::DateTime<chrono::Utc>>,
    /// How many of the last lines to show (at most 10000; 0 with -f shows
    /// only new ones).
    #[arg(
        short = 'n',
        long = "lines",
        value_name = "LINES",
        default_value_t = 100
    )]
    pub lines: usize,
}

fn since(text: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    talaria_core::logs::parse_since(text, chrono::Utc::now())
}

#[derive(Debug, Subcommand)]
pub enum CronCommand {
    /// Every job with its schedule, state and next run.
    List,
    /// Add a job.
    Add(CronAddArgs),
    /// Change a job in place (by id or name): only what is given changes.
    /// A new schedule is checked as `add` checks one and its next run
    /// computed afresh; the record of its runs is kept.
    Edit(CronEditArgs),
    /// Whether the scheduler runs (a gateway for this home with
    /// cron.enabled), the jobs by state, the next one due and the latest
    /// runs.
    Status {
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
        /// How many of the latest runs to show.
        #[arg(short = 'n', long, default_value_t = 5)]
        runs: usize,
    },
    /// Delete a job (its output files stay).
    Remove {
        /// The job's id or name.
        job: String,
    },
    /// Stop a job from running until it is resumed.
    Pause { job: String },
    /// Let a paused job run again, from now on.
    Resume { job: String },
    /// Run a job now, in this process (no gateway needed), and print its answer.
    Run { job: String },
    /// A job's recent runs and its newest output.
    Logs {
        job: String,
        /// How many runs to show.
        #[arg(short = 'n', long, default_value_t = 10)]
        limit: usize,
    },
}

#[derive(Debug, Args)]
pub struct CronAddArgs {
    /// When: `every 30m`, `0 9 * * 1-5` (cron, in cron.timezone), `in 2h`, or `2026-12-24T18:00`.
    pub schedule: String,
    /// What the agent is asked at each run.
    pub prompt: Vec<String>,
    /// A short name (default: the start of the prompt).
    #[arg(long)]
    pub name: Option<String>,
    /// A skill whose instructions each run follows (repeatable, or
    /// several separated by commas).
    #[arg(long, value_delimiter = ',')]
    pub skill: Vec<String>,
    /// Where answers go: local (default), telegram, telegram:<chat_id>[:<thread_id>] (repeatable).
    #[arg(long)]
    pub deliver: Vec<String>,
    /// How many runs in all (default: forever; once for one-shot schedules).
    #[arg(long)]
    pub repeat: Option<u32>,
    /// After downtime: run once late (`run-once`, the default) or skip the missed run.
    #[arg(long, value_enum)]
    pub misfire: Option<MisfireArg>,
}

#[derive(Debug, Args)]
pub struct CronEditArgs {
    /// The job's id or name.
    pub job: String,
    /// A new schedule, as `add` takes it: `every 30m`, `0 9 * * 1-5`, `in 2h`, `2026-12-24T18:00`.
    #[arg(long)]
    pub schedule: Option<String>,
    /// A new prompt (`""` removes it, when the job has a skill).
    #[arg(long)]
    pub prompt: Option<String>,
    /// A new name.
    #[arg(long)]
    pub name: Option<String>,
    /// The skills each run follows, replacing the job's (repeatable, or
    /// several separated by commas).
    #[arg(long, conflicts_with = "no_skills", value_delimiter = ',')]
    pub skill: Vec<String>,
    /// Follow no skill any more.
    #[arg(long)]
    pub no_skills: bool,
    /// Where answers go, replacing the job's targets (repeatable).
    #[arg(long)]
    pub deliver: Vec<String>,
    /// How many runs in all.
    #[arg(long, conflicts_with = "no_repeat_limit")]
    pub repeat: Option<u32>,
    /// Run for as long as the schedule lasts (no repeat limit).
    #[arg(long)]
    pub no_repeat_limit: bool,
    /// After downtime: run once late (`run-once`) or skip the missed run.
    #[arg(long, value_enum)]
    pub misfire: Option<MisfireArg>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum MisfireArg {
    /// `run_once` too: the spelling the database and the cronjob tool use.
    #[value(alias = "run_once")]
    RunOnce,
    Skip,
}

impl From<MisfireArg> for talaria_store::Misfire {
    fn from(m: MisfireArg) -> talaria_store::Misfire {
        match m {
            MisfireArg::RunOnce => talaria_store::Misfire::RunOnce,
            MisfireArg::Skip => talaria_store::Misfire::Skip,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum GatewayCommand {
    /// Run in the foreground until SIGTERM or Ctrl-C.
    Run,
    /// Run in the background (log: $TALARIA_HOME/logs/gateway.log).
    Start,
    /// Stop the background gateway gracefully.
    Stop {
        /// Stop the gateway of every profile of the home, the default's too.
        #[arg(long)]
        all: bool,
    },
    /// Show whether it runs, its platforms, running turns and the ledger.
    Status,
    /// Stop the background gateway (letting running turns finish), then
    /// start it again: after a configuration change, say.
    Restart,
    /// Write a systemd user unit that runs the gateway.
    Install {
        /// Replace an existing unit file.
        #[arg(long)]
        force: bool,
    },
    /// Remove the systemd user unit `install` wrote.
    Uninstall,
}

#[derive(Debug, Subcommand)]
pub enum PairingCommand {
    /// Pending requests, approved users and locks.
    List,
    /// Approve the user who was given CODE on PLATFORM (case-insensitive).
    Approve { platform: String, code: String },
    /// Take an approval back.
    Revoke { platform: String, user_id: String },
    /// Drop pending codes (of one platform, or all).
    ClearPending { platform: Option<String> },
}

#[derive(Debug, Args)]
pub struct ChatArgs {
    /// Ask one question, print only the answer on stdout, and exit.
    #[arg(short = 'q', long = "query", value_name = "PROMPT")]
    pub query: Option<String>,
    /// Continue the last conversation you had here: the chat session
    /// answered last (with `-q`, one-shot sessions count too, so a script
    /// can chain them).
    #[arg(short = 'c', long = "continue", conflicts_with = "resume")]
    pub continue_last: bool,
    /// Resume a session by id or by title.
    #[arg(short = 'r', long, value_name = "ID_OR_TITLE")]
    pub resume: Option<String>,
    /// Attach an image (or any file) to the first message; may be given
    /// more than once.
    #[arg(long = "image", value_name = "PATH")]
    pub images: Vec<std::path::PathBuf>,
    /// Show tool calls on stderr in one-shot mode.
    #[arg(short, long)]
    pub verbose: bool,
    /// Words after `chat` without `-q`: not accepted, but answered with a
    /// hint at `-q` rather than clap's "unexpected argument".
    #[arg(hide = true)]
    pub stray: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the effective configuration, secrets masked.
    Show,
    /// Validate the configuration; exits non-zero on errors.
    Check,
    /// Print the path of config.yaml.
    Path,
    /// Print one setting as it takes effect (secrets masked):
    /// `talaria config get agent.max_turns`.
    Get {
        /// The setting's dotted name.
        key: String,
    },
    /// Set one setting in config.yaml, keeping its comments and layout:
    /// `talaria config set agent.max_turns 30`. Nothing is written unless
    /// the result passes `config check`; the old file is kept as
    /// config.yaml.bak.
    Set {
        /// The setting's dotted name.
        key: String,
        /// The value, read as YAML: a number, true/false, null or text
        /// (quote text that would read as something else: '"30"').
        #[arg(allow_hyphen_values = true)]
        value: String,
    },
    /// Edit config.yaml in $VISUAL or $EDITOR (default vi); the result is
    /// checked, and an invalid one is never left in place.
    Edit,
}

#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// List recent sessions, newest first.
    List {
        #[arg(short = 'n', long, default_value_t = 20)]
        limit: usize,
        /// Only sessions from this source (cli, telegram, api, ...).
        #[arg(long)]
        source: Option<String>,
    },
    /// Print one session's transcript (by id, or by a recent session's title).
    Show { id: String },
    /// Full-text search over all sessions.
    Search {
        #[arg(required = true)]
        query: Vec<String>,
        #[arg(short = 'n', long, default_value_t = 10)]
        limit: usize,
    },
    /// Write sessions out with their messages: one, or all of them.
    /// JSONL (the default) is one object per line and session, every row
    /// included, for other programs; markdown is for reading.
    #[command(group(clap::ArgGroup::new("which").required(true).args(["id", "all"])))]
    Export {
        /// The session's id, or a recent session's title (see `talaria sessions list`).
        id: Option<String>,
        /// Every session, oldest id first.
        #[arg(long)]
        all: bool,
        /// With --all: only sessions from this source (cli, telegram, ...).
        #[arg(long, requires = "all")]
        source: Option<String>,
        #[arg(long, value_enum, default_value_t = ExportFormat::Jsonl)]
        format: ExportFormat,
        /// Write to this new file (readable by you only) instead of
        /// standard output; it must not exist.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Delete a session and its messages (the spend ledger keeps its
    /// costs). Asks first, on a terminal.
    Delete {
        id: String,
        /// Don't ask (needed without a terminal).
        #[arg(short, long)]
        yes: bool,
    },
    /// Delete the sessions nobody has used for DAYS days: no message, no
    /// start and no end since. Sessions a running gateway still owes an
    /// answer are kept. Asks first, on a terminal.
    Prune {
        /// Days since a session's last activity.
        #[arg(long, value_name = "DAYS", value_parser = clap::value_parser!(u32).range(1..))]
        older_than: u32,
        /// Only sessions from this source (cli, telegram, ...).
        #[arg(long)]
        source: Option<String>,
        /// List what would be deleted and delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Don't ask (needed without a terminal).
        #[arg(short, long)]
        yes: bool,
    },
    /// Give a session a new title.
    Rename {
        id: String,
        #[arg(required = true, num_args = 1..)]
        title: Vec<String>,
    },
    /// Sessions and messages by source, first and last activity, and the
    /// database's size.
    Stats {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// What `sessions export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// One JSON object per line and session, with every row.
    Jsonl,
    /// The conversations as they stand, for reading.
    Markdown,
}

#[derive(Debug, Args)]
pub struct SetupArgs {
    /// custom (any OpenAI-compatible server), openai, openrouter or anthropic.
    #[arg(long)]
    pub provider: Option<String>,
    /// Model name as the server knows it.
    #[arg(long)]
    pub model: Option<String>,
    /// Base URL of the server (required for custom).
    #[arg(long)]
    pub base_url: Option<String>,
    /// API key; stored in $TALARIA_HOME/.env, not in config.yaml.
    #[arg(long)]
    pub api_key: Option<String>,
    /// A Telegram bot's token from @BotFather; stored in .env.
    #[arg(long, value_name = "TOKEN")]
    pub telegram_token: Option<String>,
    /// Your numeric Telegram user id: the bot answers you (TELEGRAM_ALLOWED_USERS).
    #[arg(long, value_name = "ID")]
    pub telegram_user: Option<String>,
    /// Don't ask anything; use the flags and defaults.
    #[arg(long)]
    pub non_interactive: bool,
    /// Replace an existing config.yaml (a backup is kept).
    #[arg(long)]
    pub force: bool,
}
