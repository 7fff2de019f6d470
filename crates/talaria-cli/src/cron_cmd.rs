//! `talaria cron list | add | remove | pause | resume | run | logs`.
//!
//! Everything but `run` only reads and writes the jobs in the database, so
//! a running gateway picks the change up at its next tick. `run` runs the
//! job in this process, so it works without a gateway; its output is
//! delivered the way `talaria send` sends, through the ledger.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use chrono::{DateTime, Utc};
use talaria_agent::interaction::NoHuman;
use talaria_core::Home;
use talaria_gateway::cron::{CronError, JobSpec, Scheduler, SchedulerParts, Zone, jobs};
use talaria_gateway::hooks::Hooks;
use talaria_store::{CronJob, CronStore, OccurrenceStatus};

use crate::cli::{CronAddArgs, CronCommand};
use crate::runtime::Runtime;
use crate::sessions_cmd::when;
use crate::{clip_words, gateway_cmd};

pub async fn run(home: Home, command: CronCommand) -> anyhow::Result<ExitCode> {
    let rt = Runtime::load_without_model(home).await?;
    let zone = Zone::from_config(&rt.config.cron).map_err(anyhow::Error::msg)?;
    let store: &dyn CronStore = rt.gateway_store.as_ref();
    let now = Utc::now();
    let result = match command {
        CronCommand::List => return list(store, zone).await,
        CronCommand::Add(args) => add(&rt, store, zone, args, now).await,
        CronCommand::Remove { job } => jobs::remove(store, &job).await.map(|j| {
            println!(
                "removed {} ({}); its output files stay in {}",
                j.name,
                j.id,
                output_dir(&rt, &j)
            );
        }),
        CronCommand::Pause { job } => jobs::pause(store, &job).await.map(|j| {
            println!("paused {} ({})", j.name, j.id);
        }),
        CronCommand::Resume { job } => jobs::resume(store, zone, &job, now).await.map(|j| {
            println!(
                "resumed {} ({}); next run {}",
                j.name,
                j.id,
                next_run(&j, zone)
            );
        }),
        CronCommand::Run { job } => return run_now(&rt, &job).await,
        CronCommand::Logs { job, limit } => return logs(store, zone, &job, limit).await,
    };
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("talaria: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

fn next_run(job: &CronJob, zone: Zone) -> String {
    job.next_run_at
        .and_then(|t| DateTime::from_timestamp(t, 0))
        .map(|t| zone.format(t))
        .unwrap_or_else(|| "never".into())
}

fn output_dir(rt: &Runtime, job: &CronJob) -> String {
    rt.home
        .cron_output_dir()
        .join(&job.id)
        .display()
        .to_string()
}

async fn list(store: &dyn CronStore, zone: Zone) -> anyhow::Result<ExitCode> {
    let all = store.jobs().await?;
    if all.is_empty() {
        println!("no cron jobs; add one with `talaria cron add \"every 1d\" \"...\"`");
        return Ok(ExitCode::SUCCESS);
    }
    let mut rows = vec![
        [
            "id", "name", "schedule", "state", "next run", "last", "deliver",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for job in all {
        rows.push(vec![
            job.id.clone(),
            clip_words(&job.name, 32),
            job.schedule.clone(),
            job.state.as_str().to_owned(),
            next_run(&job, zone),
            job.last_status
                .map(|s| s.as_str())
                .unwrap_or("-")
                .to_owned(),
            job.deliver.join(","),
        ]);
    }
    print!("{}", crate::columns(&rows));
    Ok(ExitCode::SUCCESS)
}

async fn add(
    rt: &Runtime,
    store: &dyn CronStore,
    zone: Zone,
    args: CronAddArgs,
    now: DateTime<Utc>,
) -> Result<(), CronError> {
    // Checked here so the message names the command that lists skills
    // (the scheduler's own names the agent's tool).
    if let Some(name) = args.skill.iter().find(|s| rt.skills.find(s).is_none()) {
        return Err(CronError::Invalid(format!(
            "no skill named `{name}`; `talaria skills list` shows them"
        )));
    }
    let prompt = (!args.prompt.is_empty()).then(|| args.prompt.join(" "));
    let spec = JobSpec {
        name: args.name,
        prompt,
        skills: args.skill,
        schedule: args.schedule,
        deliver: args.deliver,
        repeat: args.repeat,
        misfire: args.misfire.map(Into::into),
        origin: None,
    };
    let job = jobs::create(store, &rt.home, zone, spec, now).await?;
    println!(
        "added {} ({}): {}, next run {}, delivered to {}",
        job.name,
        job.id,
        job.schedule,
        next_run(&job, zone),
        job.deliver.join(", ")
    );
    if !rt.config.cron.enabled {
        println!(
            "note: cron.enabled is false, so the gateway will not run it; `talaria cron run` still can"
        );
    }
    Ok(())
}

/// Runs a job now in this process and prints what it answered.
async fn run_now(rt: &Runtime, job: &str) -> anyhow::Result<ExitCode> {
    // Runs go without the `cronjob` tool, so the agent needs no binding.
    let (agent, _client) = rt.agent(Arc::new(NoHuman))?;
    let delivery = gateway_cmd::standalone_delivery(rt)?;
    let scheduler = Scheduler::new(SchedulerParts {
        config: rt.config.clone(),
        home: rt.home.clone(),
        agent,
        store: rt.gateway_store.clone(),
        delivery,
        hooks: Arc::new(Hooks::load(&rt.home)),
        await_hooks: true,
        backends: None,
    })
    .map_err(anyhow::Error::msg)?;
    let report = scheduler.run_now(job, Utc::now()).await;
    rt.mcp.shutdown().await;
    let report = match report {
        Ok(report) => report,
        Err(e) => {
            eprintln!("talaria: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    match &report.error {
        None => println!("{}", report.answer.trim()),
        Some(e) => eprintln!("talaria: the run failed: {e}"),
    }
    if let Some(path) = &report.output_path {
        eprintln!("output saved to {}", path.display());
    }
    if report.status == OccurrenceStatus::Silent {
        eprintln!("the answer was [SILENT]: nothing was delivered");
    } else if !report.delivered.is_empty() {
        eprintln!("delivered to {}", report.delivered.join(", "));
    }
    for e in &report.delivery_errors {
        eprintln!("talaria: not delivered to {e}");
    }
    let ok = report.error.is_none() && report.delivery_errors.is_empty();
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The job's recent runs, newest first, and the newest output.
async fn logs(
    store: &dyn CronStore,
    zone: Zone,
    job: &str,
    limit: usize,
) -> anyhow::Result<ExitCode> {
    let job = match jobs::find(store, job).await {
        Ok(job) => job,
        Err(e) => {
            eprintln!("talaria: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let runs = store.occurrences(&job.id, limit.max(1)).await?;
    println!(
        "{} ({}): {}, {}, next run {}",
        job.name,
        job.id,
        job.schedule,
        job.state.as_str(),
        next_run(&job, zone)
    );
    if runs.is_empty() {
        println!("no runs yet");
        return Ok(ExitCode::SUCCESS);
    }
    for run in &runs {
        let due = DateTime::from_timestamp(run.scheduled_at, 0)
            .map(|t| zone.format(t))
            .unwrap_or_default();
        let mut line = format!(
            "{due}  {:<11}  {:<8}  started {}",
            run.status.as_str(),
            run.trigger.as_str(),
            when(run.started_at)
        );
        if let Some(e) = &run.error {
            line.push_str(&format!("  error: {}", clip_words(e, 120)));
        }
        if let Some(e) = &run.delivery_error {
            line.push_str(&format!("  not delivered: {}", clip_words(e, 120)));
        }
        println!("{line}");
    }
    if let Some(path) = runs.iter().find_map(|r| r.output_path.clone()) {
        let text = tokio::fs::read_to_string(&path)
            .await
            .with_context(|| format!("cannot read {path}"))?;
        println!("\n--- {path}\n{}", text.trim_end());
    }
    Ok(ExitCode::SUCCESS)
}
