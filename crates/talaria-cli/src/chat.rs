//! `talaria chat`: the interactive REPL and the one-shot `-q` mode.

use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;
use talaria_agent::{Agent, SessionHandle, TurnExit, TurnObserver, TurnOutcome};
use talaria_core::Home;
use talaria_llm::LlmClient;
use tokio_util::sync::CancellationToken;

use crate::cli::ChatArgs;
use crate::interact::CliInteraction;
use crate::repl_commands::{Commands, Outcome};
use crate::runtime::Runtime;
use crate::sources::{ONE_SHOT_SOURCE, SOURCE};

pub async fn run(home: Home, args: ChatArgs) -> anyhow::Result<ExitCode> {
    let mut rt = Runtime::load_without_model(home).await?;
    rt.probe_model().await;
    retire_old_approvals(&rt.home);
    let interactive = io::stdin().is_terminal();
    let interaction = Arc::new(CliInteraction::new(
        interactive,
        Duration::from_secs(rt.config.approvals.timeout_secs),
    ));
    // Jobs made here have no chat to answer in: they are saved under
    // cron/output unless told where to deliver, and the gateway runs them.
    let zone =
        talaria_gateway::cron::Zone::from_config(&rt.config.cron).map_err(anyhow::Error::msg)?;
    let cron_tool: Arc<dyn talaria_agent::tools::Tool> =
        talaria_gateway::cron::CronTool::new(rt.gateway_store.clone(), rt.home.clone(), zone);
    let (agent, client) = match rt.agent_with_tools(interaction, vec![cron_tool]) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("talaria: {e:#}");
            return Ok(ExitCode::FAILURE);
        }
    };
    if let Some(memory) = agent.memory() {
        memory.initialize().await;
    }
    // Background work reports here, beside the conversation.
    rt.background
        .reports
        .bind(Arc::new(crate::terminal_reports::TerminalReports));
    let review = rt.attach_review(
        &agent,
        client.clone(),
        std::sync::Arc::new(|_session: &str, line: &str| eprintln!("  {line}")),
    );
    crate::skills_cmd::curate_at_start(&rt).await;
    let session = open_session(&rt, &agent, &args).await?;
    let mut commands = Commands::new(&rt, &agent, &client, session);
    if !args.images.is_empty() {
        let paths: Vec<&std::path::Path> = args.images.iter().map(|p| p.as_path()).collect();
        match crate::attach::attach_files(&rt, client.model(), &paths).await {
            Ok(digest) => commands.staged().add(digest),
            Err(e) => {
                eprintln!("talaria: {e}");
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    let result = match args.query {
        Some(prompt) => one_shot(&rt, &agent, &client, commands, &prompt, args.verbose).await,
        None => repl(&rt, &agent, &client, commands).await,
    };
    // A one-shot's review finishes before the process ends (bounded); MCP
    // servers started for this chat stop with it.
    let _ = tokio::time::timeout(Duration::from_secs(60), review.idle()).await;
    rt.background.shutdown().await;
    rt.mcp.shutdown().await;
    // A container made for this chat would otherwise wait for a gateway's
    // sweep.
    rt.backends.release_all().await;
    rt.close_browser().await;
    if let Some(memory) = agent.memory() {
        memory.shutdown(Duration::from_secs(5)).await;
    }
    result
}

/// Upgrades an allowlist file an older version wrote, telling the person
/// once that its "always" entries for whole kinds of command are no longer
/// honoured.
fn retire_old_approvals(home: &Home) {
    match talaria_agent::tools::terminal::upgrade_allowlist(home) {
        Ok(keys) if !keys.is_empty() => {
            eprintln!(
                "{} `talaria approvals list` shows what stays allowed.",
                talaria_agent::tools::terminal::retired_notice(&keys)
            );
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot upgrade the command allowlist: {e}"),
    }
}

async fn open_session(
    rt: &Runtime,
    agent: &Agent,
    args: &ChatArgs,
) -> anyhow::Result<SessionHandle> {
    if let Some(wanted) = &args.resume {
        let id = resume_target(rt, wanted).await?;
        return agent
            .resume_session(&id)
            .await
            .with_context(|| format!("cannot resume session `{id}`"));
    }
    if args.continue_last {
        // A person reopening the chat goes back to their conversation; a
        // script chaining one-shots (`-q`, then `-q --continue`) goes back
        // to whichever was answered last, its own chain included.
        let sources: &[&str] = if args.query.is_some() {
            &[SOURCE, ONE_SHOT_SOURCE]
        } else {
            &[SOURCE]
        };
        let Some(last) = rt.store.last_answered_session(sources).await? else {
            bail!(
                "there is no earlier conversation to continue (`talaria sessions list` shows every session)"
            );
        };
        return agent
            .resume_session(&last.id)
            .await
            .with_context(|| format!("cannot resume session `{}`", last.id));
    }
    let source = if args.query.is_some() {
        ONE_SHOT_SOURCE
    } else {
        SOURCE
    };
    Ok(agent.new_session(source).await?)
}

/// How many recent CLI sessions `--resume <title>` looks through.
const TITLE_SEARCH_DEPTH: usize = 200;

/// The session `--resume` names: an id, or the title of a recent CLI
/// session (ignoring case), as `/resume` takes them.
async fn resume_target(rt: &Runtime, wanted: &str) -> anyhow::Result<String> {
    let wanted = wanted.trim();
    if rt.store.session(wanted).await?.is_some() {
        return Ok(wanted.to_owned());
    }
    let mut recent = Vec::new();
    for source in [SOURCE, ONE_SHOT_SOURCE] {
        recent.extend(
            rt.store
                .list_sessions(talaria_store::SessionFilter {
                    source: Some(source.to_owned()),
                    limit: TITLE_SEARCH_DEPTH,
                    ..Default::default()
                })
                .await?,
        );
    }
    recent.sort_by(|a, b| b.started_at.total_cmp(&a.started_at));
    let lower = wanted.to_lowercase();
    match recent.iter().find(|s| {
        s.title
            .as_deref()
            .is_some_and(|t| t.to_lowercase() == lower)
    }) {
        Some(s) => Ok(s.id.clone()),
        None => {
            bail!("no session has the id or title `{wanted}` (`talaria sessions list` shows them)")
        }
    }
}

/// Runs one turn, interrupting it (not the program) on Ctrl-C.
async fn turn(
    backends: &talaria_exec::Backends,
    agent: &Agent,
    client: &LlmClient,
    session: &SessionHandle,
    (text, media): (String, Vec<talaria_core::MediaRef>),
    observer: &dyn TurnObserver,
) -> anyhow::Result<TurnOutcome> {
    client.begin_turn();
    let cancel = CancellationToken::new();
    // The terminal is the owner's own: `terminal.backend`, with a
    // workspace per session when that is isolated.
    let execution = talaria_agent::Execution::for_conversation(
        backends,
        talaria_exec::Trust::Owner,
        &session.id,
    )
    .await;
    let options = talaria_agent::TurnOptions {
        media,
        execution: Some(execution),
        platform: Some("cli".to_owned()),
        ..talaria_agent::TurnOptions::default()
    };
    let run = agent.run_turn_with(session, &text, observer, cancel.clone(), options);
    tokio::pin!(run);
    loop {
        tokio::select! {
            outcome = &mut run => return Ok(outcome?),
            r = tokio::signal::ctrl_c() => {
                if r.is_err() {
                    // No signal handling available: just wait for the turn.
                    return Ok((&mut run).await?);
                }
                // The outcome says "interrupted" once the turn has
                // stopped; nothing more to print here.
                cancel.cancel();
            }
        }
    }
}

/// `chat -q`: a slash command runs as it would at the prompt (a command
/// answered here makes no model call; `/<skill>`, `/retry` and the like run
/// their turn), anything else is one turn.
async fn one_shot(
    rt: &Runtime,
    agent: &Agent,
    client: &LlmClient,
    mut commands: Commands<'_>,
    prompt: &str,
    verbose: bool,
) -> anyhow::Result<ExitCode> {
    let prompt = match commands.handle(prompt).await {
        Outcome::Handled | Outcome::Exit => return Ok(ExitCode::SUCCESS),
        Outcome::Refused => return Ok(ExitCode::FAILURE),
        Outcome::RunTurn(prompt) => prompt,
    };
    let observer = QuietObserver { verbose };
    let message = commands.staged().take(&prompt);
    let outcome = turn(
        &rt.backends,
        agent,
        client,
        commands.session(),
        message,
        &observer,
    )
    .await?;
    match outcome.exit {
        TurnExit::Completed | TurnExit::BudgetExhausted => {
            if matches!(outcome.exit, TurnExit::BudgetExhausted) {
                eprintln!(
                    "talaria: the iteration budget ran out; this is the agent's summary so far"
                );
            }
            println!("{}", outcome.answer);
            Ok(ExitCode::SUCCESS)
        }
        TurnExit::Interrupted => {
            eprintln!("talaria: interrupted");
            Ok(ExitCode::from(130))
        }
        TurnExit::Failed(reason) => {
            eprintln!("talaria: the model call failed: {reason}");
            Ok(ExitCode::FAILURE)
        }
    }
}

async fn repl(
    rt: &Runtime,
    agent: &Agent,
    client: &LlmClient,
    mut commands: Commands<'_>,
) -> anyhow::Result<ExitCode> {
    let mut editor = DefaultEditor::new().context("cannot start the line editor")?;
    let history = rt.home.chat_history_file();
    let _ = editor.load_history(&history);
    println!(
        "Talaria · {} · session {}",
        client.describe(),
        commands.session().id
    );
    println!("Type /help for commands.");
    let observer = StreamingObserver::default();
    loop {
        let line = tokio::task::block_in_place(|| editor.readline("› "));
        let line = match line {
            Ok(l) => l,
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e).context("cannot read input"),
        };
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        let _ = editor.add_history_entry(text);
        let prompt = match commands.handle(text).await {
            Outcome::Handled | Outcome::Refused => continue,
            Outcome::Exit => break,
            Outcome::RunTurn(prompt) => prompt,
        };
        observer.reset();
        let message = commands.staged().take(&prompt);
        match turn(
            &rt.backends,
            agent,
            client,
            commands.session(),
            message,
            &observer,
        )
        .await
        {
            Ok(outcome) => observer.finish(&outcome),
            Err(e) => eprintln!("\nerror: {e:#}"),
        }
    }
    let _ = editor.save_history(&history);
    Ok(ExitCode::SUCCESS)
}

/// One-shot mode: nothing on stdout but the answer.
struct QuietObserver {
    verbose: bool,
}

impl TurnObserver for QuietObserver {
    fn tool_started(&self, name: &str, args: &str) {
        if self.verbose {
            eprintln!("⚙ {name} {}", preview(args, 100));
        }
    }

    fn notice(&self, msg: &str) {
        if self.verbose {
            eprintln!("{msg}");
        }
    }

    fn progress(&self, line: &str) {
        if self.verbose {
            eprintln!("  {line}");
        }
    }
}

/// Interactive mode: tokens as they arrive, one line per tool call.
#[derive(Default)]
struct StreamingObserver {
    state: Mutex<StreamState>,
}

#[derive(Default)]
struct StreamState {
    /// Whether anything was streamed in this turn.
    streamed: bool,
    /// Whether the cursor is at the start of a line.
    mid_line: bool,
}

impl StreamingObserver {
    fn reset(&self) {
        if let Ok(mut s) = self.state.lock() {
            *s = StreamState::default();
        }
    }

    fn newline_if_needed(&self) {
        if let Ok(mut s) = self.state.lock()
            && s.mid_line
        {
            println!();
            s.mid_line = false;
        }
    }

    /// Prints what streaming did not already show. An interrupted turn's
    /// stand-in answer is not shown: "(interrupted)" says it once.
    fn finish(&self, outcome: &TurnOutcome) {
        let streamed = self.state.lock().map(|s| s.streamed).unwrap_or(false);
        let interrupted = matches!(outcome.exit, TurnExit::Interrupted);
        if !streamed && !interrupted && !outcome.answer.is_empty() {
            println!("{}", outcome.answer);
        } else {
            self.newline_if_needed();
        }
        match &outcome.exit {
            TurnExit::Completed => {}
            TurnExit::BudgetExhausted => eprintln!("(the iteration budget ran out)"),
            TurnExit::Interrupted => eprintln!("(interrupted)"),
            TurnExit::Failed(reason) => eprintln!("error: {reason}"),
        }
    }
}

impl TurnObserver for StreamingObserver {
    fn text(&self, delta: &str) {
        if let Ok(mut s) = self.state.lock() {
            s.streamed = true;
            s.mid_line = !delta.ends_with('\n');
        }
        print!("{delta}");
        let _ = io::stdout().flush();
    }

    fn tool_started(&self, name: &str, args: &str) {
        self.newline_if_needed();
        println!("  ⚙ {name} {}", preview(args, 100));
    }

    fn notice(&self, msg: &str) {
        self.newline_if_needed();
        eprintln!("{msg}");
    }

    fn progress(&self, line: &str) {
        self.newline_if_needed();
        println!("    {}", preview(line, 160));
    }
}

fn preview(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        flat
    } else {
        format!("{}…", flat.chars().take(max).collect::<String>())
    }
}
