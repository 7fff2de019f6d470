//! The `talaria` command: a thin shell over the library crates.
//!
//! # Layout
//!
//! - [`cli`]: the command-line grammar.
//! - [`runtime`]: loading home, configuration, store and provider into one [`runtime::Runtime`].
//! - [`chat`]: `talaria chat`, interactive and one-shot.
//! - [`sources`]: the session sources the CLI stamps (`cli`, `cli-oneshot`).
//! - [`repl_commands`]: the slash commands typed at the chat prompt,
//!   resolved through the registry shared with the gateway.
//! - [`interact`]: terminal prompts for approvals and clarifying questions.
//! - [`gateway_cmd`]: `talaria gateway`, the messaging gateway's process.
//! - [`pairing_cmd`]: approving strangers' pairing codes.
//! - [`approvals_cmd`]: `talaria approvals`, the commands approved with "always".
//! - [`send_cmd`]: `talaria send`, through the running gateway or directly.
//! - [`skills_cmd`]: `talaria skills`, and the curator's look at start-up.
//! - [`mcp_cmd`]: `talaria mcp`, MCP servers' offers and Talaria as one.
//! - [`cron_cmd`]: `talaria cron`, scheduled jobs (run here, or ticked by the gateway).
//! - [`import_cmd`]: `talaria import hermes`, bringing over the ancestor's home.
//! - [`store_cmd`]: `talaria store migrate`, copying the database into PostgreSQL.
//! - [`sessions_cmd`]: `talaria sessions`, browsing, renaming, deleting
//!   and pruning sessions; [`sessions_export`]: writing them out.
//! - [`config_cmd`]: `talaria config show | check`; [`config_write`]:
//!   `config get | set | edit`, over [`yaml_set`], which sets one key in
//!   the file's text with its comments kept.
//! - [`setup`] and the other `*_cmd` modules: the other sub-commands.
//! - [`logging`]: the log (a file, or the gateway's stderr) through the secret redactor.
#![forbid(unsafe_code)]

mod approvals_cmd;
mod attach;
mod backup_cmd;
mod chat;
mod cli;
mod config_cmd;
mod config_write;
mod cron_cmd;
mod doctor;
mod gateway_cmd;
mod hooks_cmd;
mod import_cmd;
mod insights_cmd;
mod interact;
mod logging;
mod logs_cmd;
mod mcp_cmd;
mod model_cmd;
mod pairing_cmd;
mod profile_cmd;
mod repl_commands;
mod runtime;
mod sections;
mod send_cmd;
mod service;
mod sessions_cmd;
mod sessions_export;
mod setup;
mod skills_cmd;
mod sources;
mod store_cmd;
mod terminal_reports;
mod yaml_set;

use std::process::ExitCode;

use clap::Parser;

// Rust's allocations go to mimalloc rather than glibc's malloc: glibc gives
// each thread that allocates (every blocking store read runs on one) an
// arena of its own and keeps what is freed in it, so a gateway under load
// grew by megabytes it never used again (docs/PERFORMANCE.md). SQLite's
// own allocations stay with the C library.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use crate::cli::{Cli, Command, ConfigCommand, GatewayCommand, PairingCommand, SessionsCommand};

fn main() -> ExitCode {
    let cli = Cli::parse();
    end_quietly_on_a_closed_stdout();
    // Needs no home, no runtime: nothing is created for it.
    if let Command::Completions { shell } = &cli.command {
        use clap::CommandFactory;
        clap_complete::generate(
            *shell,
            &mut Cli::command(),
            "talaria",
            &mut std::io::stdout(),
        );
        return ExitCode::SUCCESS;
    }
    // Before any thread or descriptor exists; logged by the gateway once
    // logging is set up.
    let _ = OPEN_FILES.set(raise_open_file_limit());
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("talaria: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(run(cli));
    // Tools may leave blocking readers (stdin prompts) behind; don't wait on them.
    rt.shutdown_background();
    match result {
        Ok(code) => code,
        Err(e) if closed_pipe(&e) => ExitCode::from(CLOSED_PIPE_STATUS),
        Err(e) => {
            eprintln!("talaria: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The status of a command whose reader went away (`talaria sessions show
/// ID | head`): what a Unix tool killed by SIGPIPE reports (128 + 13), so
/// `set -o pipefail` scripts see the usual value and a supervisor sees a
/// failure, not success.
const CLOSED_PIPE_STATUS: u8 = 141;

/// Makes a closed stdout end the command quietly. Rust ignores SIGPIPE,
/// so writing to a pipe whose reader has gone fails, and `println!` turns
/// that failure into a panic with a backtrace. Every command prints with
/// `println!`, so the one place to catch it is the panic hook: that panic,
/// and only that one, exits with [`CLOSED_PIPE_STATUS`] and says nothing.
fn end_quietly_on_a_closed_stdout() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        // std's wording: "failed printing to stdout: Broken pipe (os error 32)".
        if message.starts_with("failed printing to stdout") && message.contains("os error 32") {
            std::process::exit(i32::from(CLOSED_PIPE_STATUS));
        }
        default_hook(info);
    }));
}

/// Whether `error` is a write to a pipe whose reader went away.
fn closed_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The soft open-file limit as found at start and as raised.
#[derive(Debug, Clone)]
pub(crate) struct OpenFiles {
    /// The soft limit the process started with.
    pub was: u64,
    /// The soft limit now.
    pub soft: u64,
    /// The hard limit, the most the soft one may be raised to.
    pub hard: u64,
    /// Why the limit could not be read or raised, if it could not.
    pub error: Option<String>,
}

static OPEN_FILES: std::sync::OnceLock<OpenFiles> = std::sync::OnceLock::new();

/// What [`raise_open_file_limit`] did at start.
pub(crate) fn open_files() -> Option<&'static OpenFiles> {
    OPEN_FILES.get()
}

/// Raises the soft open-file limit to the hard one. Every connection, to
/// the gateway's listeners and from it to the model and the platforms,
/// costs a descriptor, and a systemd user unit starts with a soft limit
/// of 1,024 (the hard one is usually far higher): the listeners derive
/// their connection caps from the raised limit.
fn raise_open_file_limit() -> OpenFiles {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (was, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            return OpenFiles {
                was: 0,
                soft: 0,
                hard: 0,
                error: Some(format!("cannot read the open-file limit: {e}")),
            };
        }
    };
    let mut error = None;
    if was < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        error = Some(format!(
            "cannot raise the open-file limit from {was} to {hard}: {e}"
        ));
    }
    let soft = getrlimit(Resource::RLIMIT_NOFILE).map_or(was, |(soft, _)| soft);
    OpenFiles {
        was,
        soft,
        hard,
        error,
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let base = runtime::resolve_home(cli.home.as_deref())?;
    let home = profile_cmd::select(base.clone(), cli.profile.as_deref())?;
    let profile = cli.profile.clone();
    // The gateway's stderr is its log; every other command keeps the
    // terminal for the person and logs to a file.
    logging::choose(
        &home,
        matches!(
            cli.command,
            Command::Gateway {
                command: GatewayCommand::Run
            }
        ),
    );
    match cli.command {
        Command::Chat(args) if !args.stray.is_empty() => {
            let words = args.stray.join(" ");
            eprintln!(
                "talaria: `talaria chat` starts a conversation and takes no message of its own.\n\
                 To ask one question and get the answer, use -q:\n  talaria chat -q {}",
                shell_quote(&words)
            );
            Ok(ExitCode::from(2))
        }
        Command::Chat(args) => chat::run(home, args).await,
        Command::Config {
            command: ConfigCommand::Show,
        } => config_cmd::show(&home),
        Command::Config {
            command: ConfigCommand::Check,
        } => config_cmd::check(&home),
        Command::Config {
            command: ConfigCommand::Path,
        } => {
            println!("{}", home.config_file().display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Config {
            command: ConfigCommand::Get { key },
        } => config_write::get(&home, &key),
        Command::Config {
            command: ConfigCommand::Set { key, value },
        } => config_write::set(&home, &key, &value),
        Command::Config {
            command: ConfigCommand::Edit,
        } => config_write::edit(&home).await,
        Command::Sessions { command } => {
            let rt = runtime::Runtime::load_without_model(home).await?;
            match command {
                SessionsCommand::List { limit, source } => {
                    sessions_cmd::list(&rt, limit, source).await
                }
                SessionsCommand::Show { id } => sessions_cmd::show(&rt, &id).await,
                SessionsCommand::Search { query, limit } => {
                    sessions_cmd::search(&rt, &query.join(" "), limit).await
                }
                SessionsCommand::Export {
                    id,
                    all: _,
                    source,
                    format,
                    output,
                } => {
                    let export = sessions_export::Export {
                        id,
                        source,
                        format,
                        output,
                    };
                    sessions_export::export(&rt, export).await
                }
                SessionsCommand::Delete { id, yes } => sessions_cmd::delete(&rt, &id, yes).await,
                SessionsCommand::Prune {
                    older_than,
                    source,
                    dry_run,
                    yes,
                } => {
                    let prune = sessions_cmd::Prune {
                        older_than,
                        source,
                        dry_run,
                        yes,
                    };
                    sessions_cmd::prune(&rt, prune).await
                }
                SessionsCommand::Rename { id, title } => {
                    sessions_cmd::rename(&rt, &id, &title).await
                }
                SessionsCommand::Stats { json } => sessions_cmd::stats(&rt, json).await,
            }
        }
        Command::Insights { days, json } => {
            let rt = runtime::Runtime::load_without_model(home).await?;
            insights_cmd::run(&rt, days, json).await
        }
        Command::Setup(args) => setup::run(&home, args).await,
        Command::Model { name } => model_cmd::run(&home, name).await,
        Command::Gateway { command } => match command {
            GatewayCommand::Run => gateway_cmd::run(home).await,
            GatewayCommand::Start => gateway_cmd::start(home).await,
            GatewayCommand::Stop { all: false } => gateway_cmd::stop(home).await,
            GatewayCommand::Stop { all: true } => profile_cmd::stop_all(&base).await,
            GatewayCommand::Status => gateway_cmd::status(&home).await,
            GatewayCommand::Restart => gateway_cmd::restart(home).await,
            GatewayCommand::Uninstall => {
                gateway_cmd::uninstall(&profile_cmd::unit_name(profile.as_deref()))
            }
            GatewayCommand::Install { force } => {
                gateway_cmd::install(&home, force, &profile_cmd::unit_name(profile.as_deref()))
            }
        },
        Command::Pairing { command } => {
            let rt = runtime::Runtime::load_without_model(home).await?;
            match command {
                PairingCommand::List => pairing_cmd::list(&rt).await,
                PairingCommand::Approve { platform, code } => {
                    pairing_cmd::approve(&rt, &platform, &code).await
                }
                PairingCommand::Revoke { platform, user_id } => {
                    pairing_cmd::revoke(&rt, &platform, &user_id).await
                }
                PairingCommand::ClearPending { platform } => {
                    pairing_cmd::clear_pending(&rt, platform.as_deref()).await
                }
            }
        }
        Command::Approvals { command } => approvals_cmd::run(&home, command),
        Command::Dashboard {
            command: cli::DashboardCommand::HashPassword,
        } => hash_password(),
        Command::Send { target, text } => send_cmd::run(home, &target, &text).await,
        Command::Logs(args) => logs_cmd::run(&home, args).await,
        Command::Cron { command } => cron_cmd::run(home, command).await,
        Command::Mcp { command } => mcp_cmd::run(home, command).await,
        Command::Store { command } => store_cmd::run(home, command).await,
        // Answered in `main`, before a home is resolved.
        Command::Completions { .. } => Ok(ExitCode::SUCCESS),
        Command::Doctor {
            command: None,
            json,
            offline,
        } => doctor::run(&home, doctor::Options { offline }, json).await,
        Command::Doctor {
            command:
                Some(cli::DoctorCommand::Auth {
                    who,
                    chat,
                    chat_type,
                    bot,
                }),
            ..
        } => {
            let chat_type = match chat_type {
                cli::ChatKind::Dm => talaria_gateway::event::ChatType::Dm,
                cli::ChatKind::Group => talaria_gateway::event::ChatType::Group,
                cli::ChatKind::Channel => talaria_gateway::event::ChatType::Channel,
                cli::ChatKind::Thread => talaria_gateway::event::ChatType::Thread,
                cli::ChatKind::Forum => talaria_gateway::event::ChatType::Forum,
            };
            let sender = doctor::auth::Sender {
                who,
                chat,
                chat_type,
                bot,
            };
            doctor::auth::run(&home, sender).await
        }
        Command::Hooks { command } => hooks_cmd::run(&home, command).await,
        Command::Profile { command } => profile_cmd::run(&base, &home, command),
        Command::Import {
            command: cli::ImportCommand::Hermes { from, dry_run },
        } => import_cmd::hermes(home, from, dry_run).await,
        Command::Backup { file, with_secrets } => backup_cmd::backup(&home, file, with_secrets),
        Command::Restore { file, force } => backup_cmd::restore(&home, &file, force),
        Command::Memory { command } => {
            let rt = runtime::Runtime::load_without_model(home).await?;
            skills_cmd::memory(&rt, command).await
        }
        Command::Learn {
            command: cli::LearnCommand::Graph { format, output },
        } => {
            let rt = runtime::Runtime::load_without_model(home).await?;
            skills_cmd::graph(&rt, format, output).await
        }
        Command::Skills { command } => {
            let rt = runtime::Runtime::load_without_model(home).await?;
            skills_cmd::run(&rt, command).await
        }
    }
}

/// `text` quoted for a POSIX shell, for commands shown to people.
fn shell_quote(text: &str) -> String {
    if !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@".contains(c))
    {
        return text.to_owned();
    }
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// `n` and the noun that goes with it: `1 entry`, `2 entries`, `0 entries`.
pub(crate) fn count(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// A size in bytes for people: `512 B`, `3.4 KiB`, `12.0 MiB`.
pub(crate) fn human_bytes(n: u64) -> String {
    const KIB: f64 = 1024.0;
    let n = n as f64;
    if n < KIB {
        format!("{n} B")
    } else if n < KIB * KIB {
        format!("{:.1} KiB", n / KIB)
    } else if n < KIB * KIB * KIB {
        format!("{:.1} MiB", n / (KIB * KIB))
    } else {
        format!("{:.1} GiB", n / (KIB * KIB * KIB))
    }
}

/// Rows laid out in columns, each as wide as its widest cell, two spaces
/// apart; the last column is not padded. Long ids widen their column
/// instead of pushing the rest of their row out of line.
pub(crate) fn columns(rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            let w = cell.chars().count();
            match widths.get_mut(i) {
                Some(width) => *width = (*width).max(w),
                None => widths.push(w),
            }
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            if i + 1 < row.len() {
                let pad = widths[i].saturating_sub(cell.chars().count());
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `text` on one line, at most `max` characters, cut at a word boundary
/// with an ellipsis when it is longer.
pub(crate) fn clip_words(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        return flat;
    }
    let head: String = flat.chars().take(max.saturating_sub(1)).collect();
    // Back to the last space, unless that would leave almost nothing.
    let cut = match head.rfind(' ') {
        Some(i) if i >= head.len() / 2 => &head[..i],
        _ => head.as_str(),
    };
    format!("{}…", cut.trim_end_matches([',', ';', ':', '.', ' ']))
}

/// `talaria dashboard hash-password`: the password is read from standard
/// input (its first line), never from the command line, where other users
/// of the machine could see it.
fn hash_password() -> anyhow::Result<ExitCode> {
    use std::io::{BufRead, IsTerminal};
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprint!("Password for the dashboard (it is shown as you type): ");
    }
    let mut line = String::new();
    stdin.lock().read_line(&mut line)?;
    let password = line.trim_end_matches(['\n', '\r']);
    let hash = talaria_dashboard::hash_password(password)?;
    println!("{hash}");
    eprintln!("Put it in config.yaml as dashboard.password_hash (quoted).");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_widen_to_the_longest_cell() {
        let rows = vec![
            vec!["id".to_owned(), "name".to_owned(), "state".to_owned()],
            vec![
                "a-very-long-identifier".to_owned(),
                "x".to_owned(),
                "on".to_owned(),
            ],
            vec!["b".to_owned(), "longer name".to_owned(), "off".to_owned()],
        ];
        let text = columns(&rows);
        let starts: Vec<usize> = text.lines().map(|l| l.rfind(' ').unwrap()).collect();
        assert!(starts.windows(2).all(|w| w[0] == w[1]), "{text}");
    }

    #[test]
    fn clipping_stops_at_a_word() {
        assert_eq!(clip_words("short", 10), "short");
        assert_eq!(clip_words("one two three four", 12), "one two…");
        assert_eq!(clip_words("averyveryverylongword", 8), "averyve…");
        assert_eq!(count(1, "entry", "entries"), "1 entry");
        assert_eq!(count(0, "entry", "entries"), "0 entries");
        assert_eq!(shell_quote("hello"), "hello");
        assert_eq!(shell_quote("it's here"), r"'it'\''s here'");
    }
}
