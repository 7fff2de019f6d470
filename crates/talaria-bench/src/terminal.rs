//! The latency a sandbox adds to a `terminal` call: the agent's real tool
//! ([`TerminalTool`]) called with the same context twice over, once with
//! the owner's local execution and once with an untrusted conversation's
//! bubblewrap sandbox, the two alternated call by call so whatever else
//! the machine does falls on both alike.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use talaria_agent::Execution;
use talaria_agent::interaction::NoHuman;
use talaria_agent::tools::terminal::TerminalTool;
use talaria_agent::tools::{SessionState, Tool, ToolContext};
use talaria_core::{Config, Home, Redactor};
use talaria_exec::{BackendKind, Backends, Trust};
use talaria_store::SqliteStore;
use tokio_util::sync::CancellationToken;

use crate::report::TerminalFigure;

/// The commands measured, with the output each must give: one that does
/// nothing, and one that prints a line (a pipe read to its end).
const COMMANDS: &[(&str, &str)] = &[("true", ""), ("echo talaria-bench", "talaria-bench\n")];

/// Calls of each kind made before measuring, so first-use costs (page
/// faults in `bwrap` and `sh`, the sandbox's probe) are not counted.
const WARMUP_CALLS: usize = 5;

/// An error unless `bwrap` is on `PATH`: checked when the benchmark
/// starts too, so a missing one stops it before the long phases, not after.
pub fn require_bubblewrap() -> anyhow::Result<()> {
    if talaria_exec::find_program("bwrap").is_none() {
        bail!(
            "bubblewrap (bwrap) is not installed or not on PATH, and the benchmark measures \
             sandboxed terminal calls: install it (Debian: apt install bubblewrap; \
             scripts/test does)"
        );
    }
    Ok(())
}

/// `calls` local and `calls` sandboxed `terminal` calls of each command.
/// bubblewrap missing, or a sandbox that cannot start here, is an error:
/// the figure is the point of the phase.
pub async fn measure(calls: usize) -> anyhow::Result<Vec<TerminalFigure>> {
    require_bubblewrap()?;
    let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
    let home = Home::at(dir.path().join("home"));
    home.ensure()
        .with_context(|| format!("cannot create {}", home.root().display()))?;
    let workdir = dir.path().join("work");
    std::fs::create_dir_all(&workdir)
        .with_context(|| format!("cannot create {}", workdir.display()))?;
    // The terminal tool never reads the store; a real one keeps the
    // context the same as the agent builds it.
    let store = SqliteStore::open(&dir.path().join("state.db"))
        .context("cannot open a store for the tool context")?;
    let config = Config::default();
    let backends = Backends::new(&config.terminal, &home, workdir.clone());
    let local = ToolContext {
        session_id: "20260101_000000_bench0".to_owned(),
        home: home.clone(),
        workdir: workdir.clone(),
        config: Arc::new(config),
        store: Arc::new(store),
        interaction: Arc::new(NoHuman),
        session: Arc::new(SessionState::default()),
        redactor: Redactor::new(Vec::new()),
        cancel: CancellationToken::new(),
        execution: Execution::local(workdir),
        tools: std::sync::Arc::new(talaria_agent::tools::Registry::new()),
        platform: None,
        progress: talaria_agent::Progress::none(),
    };
    let execution = Execution::for_conversation(&backends, Trust::Untrusted, "bench").await;
    if let Err(e) = &execution.backend {
        bail!("the bubblewrap sandbox cannot start on this machine: {e}");
    }
    if execution.kind != BackendKind::Sandbox {
        bail!(
            "an untrusted conversation got the {} backend, not the sandbox",
            execution.kind
        );
    }
    let sandboxed = ToolContext {
        execution,
        ..local.clone()
    };

    let mut figures = Vec::new();
    for &(command, expected) in COMMANDS {
        for _ in 0..WARMUP_CALLS {
            call(&local, command, expected).await?;
            call(&sandboxed, command, expected).await?;
        }
        let (mut on_host, mut in_sandbox) = (Vec::new(), Vec::new());
        for i in 0..calls {
            // Which goes first alternates, so neither always runs right
            // after the other's process exit.
            if i % 2 == 0 {
                on_host.push(call(&local, command, expected).await?);
                in_sandbox.push(call(&sandboxed, command, expected).await?);
            } else {
                in_sandbox.push(call(&sandboxed, command, expected).await?);
                on_host.push(call(&local, command, expected).await?);
            }
        }
        figures.push(TerminalFigure::from_samples(
            command,
            &mut on_host,
            &mut in_sandbox,
        ));
    }
    Ok(figures)
}

/// One `terminal` call, timed; an error unless it exited 0 with `expected`
/// as its output (a call that failed fast would flatter the figure).
async fn call(ctx: &ToolContext, command: &str, expected: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let result = TerminalTool::default()
        .call(json!({"command": command, "timeout": 30}), ctx)
        .await;
    let elapsed = started.elapsed();
    let text =
        result.map_err(|e| anyhow::anyhow!("the terminal tool failed on `{command}`: {e}"))?;
    let value: Value = serde_json::from_str(&text)
        .with_context(|| format!("the terminal tool's answer is not JSON: {text}"))?;
    if value["exit_code"] != json!(0) || value["output"] != json!(expected) {
        bail!(
            "`{command}` ({}) did not exit 0 with {expected:?}: {text}",
            ctx.execution.describe()
        );
    }
    Ok(elapsed)
}
