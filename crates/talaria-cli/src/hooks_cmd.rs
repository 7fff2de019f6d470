//! `talaria hooks list | test`: the gateway's hooks as it would load them,
//! and one hook run by hand with an event of the operator's choosing.

use std::process::ExitCode;

use anyhow::{Context, bail};
use talaria_core::Home;
use talaria_gateway::hooks::Hooks;

use crate::cli::HooksCommand;

pub async fn run(home: &Home, command: HooksCommand) -> anyhow::Result<ExitCode> {
    let hooks = Hooks::load(home);
    match command {
        HooksCommand::List => list(home, &hooks),
        HooksCommand::Test {
            name,
            event,
            payload,
        } => test(home, &hooks, &name, &event, payload.as_deref()).await,
    }
}

fn list(home: &Home, hooks: &Hooks) -> anyhow::Result<ExitCode> {
    let dir = home.hooks_dir();
    let mut loaded = Vec::new();
    for hook in hooks.hooks() {
        let events: Vec<String> = hook.events().iter().map(ToString::to_string).collect();
        println!("{}  ({})", hook.name(), hook.dir().display());
        if !hook.description().is_empty() {
            println!("    {}", hook.description());
        }
        println!(
            "    events: {}; timeout {} s",
            events.join(", "),
            hook.timeout().as_secs()
        );
        loaded.push(hook.dir().to_path_buf());
    }
    // Folders that did not load: the reason is in the log, where the
    // gateway writes it too.
    let mut skipped = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            let canonical = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
            if path.is_dir() && !loaded.iter().any(|l| *l == path || *l == canonical) {
                skipped.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
    }
    skipped.sort();
    if loaded.is_empty() && skipped.is_empty() {
        println!("no hooks in {}", dir.display());
    }
    for folder in &skipped {
        println!(
            "{folder}: not loaded (why is in {})",
            crate::logging::log_file()
                .map_or_else(|| "the log".to_owned(), |p| p.display().to_string())
        );
    }
    Ok(if skipped.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn test(
    home: &Home,
    hooks: &Hooks,
    name: &str,
    event: &str,
    payload: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let Some(one) = hooks.only(name) else {
        let names: Vec<&str> = hooks.hooks().map(|h| h.name()).collect();
        bail!(
            "no hook named `{name}` loaded from {} (loaded: {})",
            home.hooks_dir().display(),
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        );
    };
    if !one.wants(event) {
        bail!("the hook `{name}` does not subscribe to `{event}` (see `talaria hooks list`)");
    }
    let payload: serde_json::Value = match payload {
        Some(text) => serde_json::from_str(text).context("--payload is not JSON")?,
        None => serde_json::json!({"test": true}),
    };
    let answers = one.emit_and_wait(event, payload).await;
    match answers.into_iter().next() {
        Some((_, Some(answer))) => {
            println!("{name} answered: {answer}");
            Ok(ExitCode::SUCCESS)
        }
        _ => {
            println!(
                "{name} ran and gave no answer (it printed nothing, failed or timed out; what it wrote to stderr is in {})",
                crate::logging::log_file()
                    .map_or_else(|| "the log".to_owned(), |p| p.display().to_string())
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
