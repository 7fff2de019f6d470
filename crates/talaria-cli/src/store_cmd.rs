//! `talaria store migrate`: copying this home's SQLite database into
//! PostgreSQL, for a move from one machine to several gateways sharing one
//! database. The copy itself is the store crate's
//! ([`talaria_store::copy`]); this is the command around it: which files,
//! the checks only a home can make (is its gateway running?), progress and
//! the report, and what to put in `config.yaml` afterwards.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use talaria_core::config::{DATABASE_URL_ENV, StoreBackend};
use talaria_core::{Home, Redactor};
use talaria_gateway::process;
use talaria_store::copy::{CopyOptions, CopyReport, Progress, Table};
use talaria_store::postgres::redact_url;
use talaria_store::{CopyError, PostgresOptions, PostgresStore, SqliteStore, copy_store};

/// `talaria store …`.
#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Copy everything this home's SQLite database holds into PostgreSQL.
    #[command(long_about = MIGRATE_HELP)]
    Migrate(MigrateArgs),
}

const MIGRATE_HELP: &str = "\
Copy everything this home's SQLite database (state.db) holds into a PostgreSQL \
database, so several gateways on several hosts can share it.

Copied without loss: sessions (titles, system prompts, token counters, end \
reasons, parent links), every message with its id and order (compressed-away \
rows, tool calls and reasoning included), session routes, the delivery ledger, \
pairing (pending codes as their salted hashes, approvals, rate limits), inbound \
dedupe ids, adapter cursors, cron jobs and their runs. Not copied: the nodes \
and leases of running gateways, which re-announce themselves.

Stop the gateway first: the copy refuses to run while it does. The SQLite \
file is only read. The target must be empty (a new database or a new \
--schema); the copy refuses anything else and says how to start over. A copy \
that stops halfway (a lost connection, Ctrl-C) resumes when run again with the \
same arguments. At the end every table is counted on both sides.

The password in the URL is never printed. Afterwards the command prints what \
to add to config.yaml; it does not edit it.";

/// `talaria store migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// The PostgreSQL database, as a URL:
    /// postgres://user:password@host:5432/db?sslmode=require. Default: the
    /// TALARIA_DATABASE_URL variable (from the environment or the home's .env),
    /// which keeps the password out of the shell's history.
    #[arg(long, value_name = "URL")]
    pub to: Option<String>,
    /// The schema to copy into (created if missing; lower-case letters, digits
    /// and '_'). Default: the connection's (usually `public`).
    #[arg(long, value_name = "NAME")]
    pub schema: Option<String>,
}

/// Runs a `talaria store` command.
pub async fn run(home: Home, command: StoreCommand) -> anyhow::Result<ExitCode> {
    match command {
        StoreCommand::Migrate(args) => migrate(home, args).await,
    }
}

async fn migrate(home: Home, args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let loaded = crate::sections::load(&home)?;
    let url = match args.to.clone().or_else(|| {
        loaded
            .env
            .get(DATABASE_URL_ENV)
            .map(str::to_owned)
            .filter(|u| !u.trim().is_empty())
    }) {
        Some(url) => url,
        None => bail!(
            "say where to copy to: --to postgres://user:password@host/db, or set \
             {DATABASE_URL_ENV} (in the environment or in {})",
            home.dotenv_file().display()
        ),
    };
    // The URL carries the password: whatever a library logs goes through
    // the redactor with it.
    let redactor = Redactor::new(
        loaded
            .env
            .secret_values()
            .into_iter()
            .chain(loaded.config.secret_values())
            .chain([url.clone()])
            .chain(url_password(&url)),
    );
    crate::logging::init(redactor, crate::logging::DEFAULT_LEVEL);
    let shown_url = redact_url(&url);

    if let Some(info) = process::running_gateway(&home) {
        bail!(
            "the gateway of {} is running (pid {}): stop it first (`talaria gateway stop`), \
             so nothing writes to the database while it is copied",
            home.root().display(),
            info.pid
        );
    }
    let db = home.state_db();
    if !db.is_file() {
        bail!("nothing to copy: {} does not exist", db.display());
    }
    if loaded.config.store.backend == StoreBackend::Postgres {
        eprintln!(
            "note: this home already uses PostgreSQL (store.backend); copying {} anyway",
            db.display()
        );
    }

    let source = {
        let path = db.clone();
        tokio::task::spawn_blocking(move || SqliteStore::open(&path))
            .await
            .context("store task failed")?
            .with_context(|| format!("cannot open {}", db.display()))?
    };
    let mut options = PostgresOptions::new(url.clone());
    options.schema = args.schema.clone();
    options.max_connections = 4;
    eprintln!(
        "Copying {} into {shown_url}{} …",
        db.display(),
        args.schema
            .as_deref()
            .map(|s| format!(" (schema {s})"))
            .unwrap_or_default()
    );
    let target = PostgresStore::connect(options)
        .await
        .with_context(|| format!("cannot open the PostgreSQL database {shown_url}"))?;

    let mut shown = ProgressLine::new();
    let copied = copy_store(&source, &target, &CopyOptions::default(), |p| {
        shown.update(p)
    })
    .await;
    shown.done();
    let report = match copied {
        Ok(report) => report,
        Err(e) => return Err(explain(e, &args)),
    };
    print_report(&report);
    print_config(&home, &url, args.schema.as_deref(), args.to.is_none());
    Ok(ExitCode::SUCCESS)
}

/// The password of `url`, if it has one, for the redactor.
fn url_password(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))?;
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let userinfo = &authority[..authority.rfind('@')?];
    let (_, password) = userinfo.split_once(':')?;
    Some(password.to_owned())
}

/// The error, with the command to run again when running it again helps.
fn explain(e: CopyError, args: &MigrateArgs) -> anyhow::Error {
    let again = matches!(
        &e,
        CopyError::Interrupted { .. }
            | CopyError::Finishing { .. }
            | CopyError::Store(talaria_store::StoreError::Busy)
    );
    if !again {
        return anyhow::Error::new(e);
    }
    let mut command = "talaria store migrate".to_owned();
    if args.to.is_some() {
        command.push_str(" --to <the same URL>");
    }
    if let Some(schema) = &args.schema {
        command.push_str(&format!(" --schema {schema}"));
    }
    anyhow::anyhow!("{e}\nTo resume: {command}")
}

/// Progress on stderr: one line per table, rewritten in place on a
/// terminal, at most every half second.
struct ProgressLine {
    terminal: bool,
    last: Option<Instant>,
    open: Option<Table>,
}

impl ProgressLine {
    fn new() -> ProgressLine {
        ProgressLine {
            terminal: std::io::stderr().is_terminal(),
            last: None,
            open: None,
        }
    }

    fn update(&mut self, p: Progress) {
        let finished = p.copied >= p.total;
        let due = self
            .last
            .is_none_or(|at| at.elapsed() >= Duration::from_millis(500));
        if !finished && !due {
            return;
        }
        self.last = Some(Instant::now());
        let line = format!("  {:<22} {:>12} of {}", p.table.name(), p.copied, p.total);
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(err, "\r{line}\x1b[K");
            if finished {
                let _ = writeln!(err);
                self.open = None;
            } else {
                self.open = Some(p.table);
            }
        } else if finished {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }

    /// Ends a line left open by an interrupted table.
    fn done(&mut self) {
        if self.open.take().is_some() {
            let _ = writeln!(std::io::stderr());
        }
    }
}

fn print_report(report: &CopyReport) {
    println!(
        "{} {}\n  into {}",
        if report.resumed {
            "Finished copying"
        } else {
            "Copied"
        },
        report.source,
        report.target
    );
    let mut total = 0u64;
    for (table, rows) in &report.tables {
        println!("  {:<22} {:>12}", table.name(), rows);
        total += rows;
    }
    println!("  {:<22} {:>12}", "(all rows)", total);
    println!(
        "Every table holds the same number of rows on both sides. Took {:.1} s.",
        report.elapsed.as_secs_f64()
    );
}

/// What to add to `config.yaml` (and `.env`) to use the copy. `from_env`:
/// the URL came from `TALARIA_DATABASE_URL`, which already names it.
fn print_config(home: &Home, url: &str, schema: Option<&str>, from_env: bool) {
    let has_password = redact_url(url) != url;
    println!();
    println!(
        "To use it, stop every gateway on the old database and add to {}:",
        home.config_file().display()
    );
    println!();
    println!("store:");
    println!("  backend: postgres");
    if let Some(schema) = schema {
        println!("  postgres_schema: {schema}");
    }
    if from_env {
        println!();
        println!("({DATABASE_URL_ENV} names the database already.)");
    } else if has_password {
        println!();
        println!(
            "and keep the URL, with its password, out of config.yaml: put it in {} as",
            home.dotenv_file().display()
        );
        println!();
        println!("{DATABASE_URL_ENV}={}", redact_url(url));
        println!();
        println!("(the password is shown as *** here: write the real one).");
    } else {
        println!("  postgres_url: {url}");
    }
}
