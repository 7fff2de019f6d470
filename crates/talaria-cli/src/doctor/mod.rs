//! `talaria doctor`: one line per thing that must be right for the agent
//! to work, each checked against the real thing where it can be (the
//! model is asked to call a tool, each platform whom its token belongs
//! to), and an exit status a script can act on.
//!
//! The checks only look: nothing is written to the home, the database is
//! opened without migrating, and platforms are asked one question each,
//! without receiving. `doctor auth` ([`auth`]) explains one sender's
//! authorization rule by rule.

pub mod auth;
mod checks;

use std::process::ExitCode;

use serde_json::{Value, json};
use talaria_core::{Home, Redactor};

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// As it should be.
    Ok,
    /// Works, but something deserves a look.
    Warn,
    /// Broken: the agent or a platform will not work as configured.
    Fail,
    /// Not checked, and why is said (offline, nothing to ask).
    Skip,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
            Status::Skip => "skip",
        }
    }

    /// The column printed: failures stand out.
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok  ",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone)]
pub struct Finding {
    /// What was checked (`config`, `model`, `telegram`, `database`).
    pub check: String,
    /// How it came out.
    pub status: Status,
    /// What was found, in a sentence; what to do about it when broken.
    pub detail: String,
}

impl Finding {
    fn new(check: impl Into<String>, status: Status, detail: impl Into<String>) -> Finding {
        Finding {
            check: check.into(),
            status,
            detail: detail.into(),
        }
    }
}

/// What the doctor is told to do.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Ask nothing over the network: the model and platform checks are
    /// skipped with a note.
    pub offline: bool,
}

/// Runs every check on `home` and prints the report (as JSON with
/// `json`). Exits 1 when any check failed.
pub async fn run(home: &Home, options: Options, json: bool) -> anyhow::Result<ExitCode> {
    let (findings, redactor) = checks::all(home, options).await;
    // Error texts quote what servers said; a key must never reach the
    // terminal or a log collector through them.
    let findings: Vec<Finding> = findings
        .into_iter()
        .map(|f| Finding {
            detail: redactor.redact(&f.detail),
            ..f
        })
        .collect();
    let failed = findings.iter().filter(|f| f.status == Status::Fail).count();
    let warned = findings.iter().filter(|f| f.status == Status::Warn).count();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&to_json(home, &findings))?
        );
    } else {
        print_report(home, &findings, failed, warned);
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_report(home: &Home, findings: &[Finding], failed: usize, warned: usize) {
    println!("talaria doctor: {}", home.root().display());
    let width = findings
        .iter()
        .map(|f| f.check.chars().count())
        .max()
        .unwrap_or(0);
    for f in findings {
        println!("  {}  {:<width$}  {}", f.status.label(), f.check, f.detail);
    }
    let plural = |n: usize, one: &str| {
        if n == 1 {
            format!("1 {one}")
        } else {
            format!("{n} {one}s")
        }
    };
    if failed == 0 && warned == 0 {
        println!("everything checked is fine");
    } else {
        println!(
            "{}, {}",
            plural(failed, "problem"),
            plural(warned, "warning")
        );
    }
}

fn to_json(home: &Home, findings: &[Finding]) -> Value {
    let count = |s: Status| findings.iter().filter(|f| f.status == s).count();
    json!({
        "home": home.root().display().to_string(),
        "ok": count(Status::Fail) == 0,
        "failures": count(Status::Fail),
        "warnings": count(Status::Warn),
        "checks": findings.iter().map(|f| json!({
            "check": f.check,
            "status": f.status.as_str(),
            "detail": f.detail,
        })).collect::<Vec<_>>(),
    })
}

/// The redactor for a home whose configuration may not load: the values
/// of `.env` at least.
fn dotenv_redactor(home: &Home) -> Redactor {
    Redactor::new(
        talaria_core::Env::load(&home.dotenv_file())
            .map(|env| env.secret_values())
            .unwrap_or_default(),
    )
}
