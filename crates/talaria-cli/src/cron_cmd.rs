//! `talaria cron list | add | edit | status | remove | pause | resume | run
//! | logs`.
//!
//! Everything but `run` only reads and writes the jobs in the database, so
//! a running gateway picks the change up at its next tick. `run` runs the
//! job in this process, so it works without a gateway; its output is
//! delivered the way `talaria send` sends, through the ledger.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use talaria_agent::interaction::NoHuman;
use talaria_core::Home;
use talaria_gateway::cron::{CronError, JobSpec, Scheduler, SchedulerParts, Zone, jobs};
use talaria_gateway::hooks::Hooks;
use talaria_store::{CronJob, CronStore, JobState, Occurrence, OccurrenceStatus};

use crate::cli::{CronAddArgs, CronCommand, CronEditArgs};
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
        CronCommand::Edit(args) => edit(&rt, store, zone, args, now).await,
        CronCommand::Status { json, runs } => return status(&rt, zone, json, runs, now).await,
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
    known_skills(rt, &args.skill)?;
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

/// Checked here so the message names the command that lists skills (the
/// scheduler's own names the agent's tool).
fn known_skills(rt: &Runtime, skills: &[String]) -> Result<(), CronError> {
    match skills.iter().find(|s| rt.skills.find(s).is_none()) {
        Some(name) => Err(CronError::Invalid(format!(
            "no skill named `{name}`; `talaria skills list` shows them"
        ))),
        None => Ok(()),
    }
}

/// Changes a job in place, through the checks `add` makes, and says what
/// changed.
async fn edit(
    rt: &Runtime,
    store: &dyn CronStore,
    zone: Zone,
    args: CronEditArgs,
    now: DateTime<Utc>,
) -> Result<(), CronError> {
    known_skills(rt, &args.skill)?;
    let changes = jobs::JobChanges {
        name: args.name,
        prompt: args.prompt,
        skills: if args.no_skills {
            Some(Vec::new())
        } else {
            (!args.skill.is_empty()).then_some(args.skill)
        },
        schedule: args.schedule,
        deliver: (!args.deliver.is_empty()).then_some(args.deliver),
        repeat: if args.no_repeat_limit {
            Some(None)
        } else {
            args.repeat.map(Some)
        },
        misfire: args.misfire.map(Into::into),
    };
    if changes == jobs::JobChanges::default() {
        return Err(CronError::Invalid(
            "nothing to change: give at least one of --schedule, --prompt, --name, --skill, \
             --no-skills, --deliver, --repeat, --no-repeat-limit or --misfire"
                .into(),
        ));
    }
    let before = jobs::find(store, &args.job).await?;
    let after = jobs::update(store, &rt.home, zone, &before.id, changes, now).await?;
    let differences = differences(&before, &after, zone);
    if differences.is_empty() {
        println!(
            "{} ({}) already had those settings; nothing changed",
            after.name, after.id
        );
        return Ok(());
    }
    println!("changed {} ({}):", after.name, after.id);
    for (what, was, is) in differences {
        println!("  {what}: {was} -> {is}");
    }
    Ok(())
}

/// The settings that differ between two versions of a job, as shown.
fn differences(
    before: &CronJob,
    after: &CronJob,
    zone: Zone,
) -> Vec<(&'static str, String, String)> {
    let shown = |job: &CronJob| {
        [
            ("name", job.name.clone()),
            (
                "prompt",
                job.prompt
                    .as_deref()
                    .map_or_else(|| "(none)".to_owned(), |p| clip_words(p, 60)),
            ),
            ("skills", list_or_none(&job.skills)),
            ("schedule", job.schedule.clone()),
            ("next run", next_run(job, zone)),
            ("state", job.state.as_str().to_owned()),
            ("deliver", job.deliver.join(", ")),
            (
                "repeat",
                job.repeat
                    .map_or_else(|| "no limit".to_owned(), |n| format!("{n} runs in all")),
            ),
            ("misfire", job.misfire.as_str().to_owned()),
        ]
    };
    shown(before)
        .into_iter()
        .zip(shown(after))
        .filter(|((_, was), (_, is))| was != is)
        .map(|((what, was), (_, is))| (what, was, is))
        .collect()
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "(none)".to_owned()
    } else {
        items.join(", ")
    }
}

/// Whether the scheduler runs, the jobs by state, the next one due and the
/// latest runs.
async fn status(
    rt: &Runtime,
    zone: Zone,
    json: bool,
    runs: usize,
    now: DateTime<Utc>,
) -> anyhow::Result<ExitCode> {
    let store = rt.gateway_store.as_ref();
    let enabled = rt.config.cron.enabled;
    let gateway = talaria_gateway::process::running_gateway(&rt.home);
    let all = store.jobs().await.context("cannot list the cron jobs")?;
    let recent = store
        .recent_occurrences(runs)
        .await
        .context("cannot read the latest runs")?;
    let nodes_alive = if rt.config.store.backend == talaria_core::config::StoreBackend::Postgres {
        let clock = store
            .clock()
            .await
            .context("cannot read the store's clock")?;
        let nodes = store.nodes().await.context("cannot list the nodes")?;
        Some(nodes.iter().filter(|n| n.lease_until > clock).count())
    } else {
        None
    };
    let count = |state: JobState| all.iter().filter(|j| j.state == state).count();
    let next = all
        .iter()
        .filter(|j| j.state == JobState::Scheduled)
        .filter_map(|j| Some((j.next_run_at?, j)))
        .min_by_key(|(at, _)| *at);
    let name_of = |id: &str| {
        all.iter()
            .find(|j| j.id == id)
            .map_or_else(|| id.to_owned(), |j| j.name.clone())
    };
    let running = enabled && gateway.is_some();
    if json {
        let rfc3339 = |t: i64| {
            DateTime::from_timestamp(t, 0)
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        };
        let runs: Vec<Value> = recent
            .iter()
            .map(|r| {
                json!({
                    "job_id": r.job_id,
                    "job_name": name_of(&r.job_id),
                    "scheduled_at": rfc3339(r.scheduled_at),
                    "trigger": r.trigger.as_str(),
                    "status": r.status.as_str(),
                    "started_at": r.started_at,
                    "finished_at": r.finished_at,
                    "error": r.error,
                    "delivery_error": r.delivery_error,
                })
            })
            .collect();
        let out = json!({
            "scheduler": {
                "running": running,
                "enabled": enabled,
                "gateway_pid": gateway.as_ref().map(|g| g.pid),
                "nodes_alive": nodes_alive,
            },
            "jobs": {
                "total": all.len(),
                "scheduled": count(JobState::Scheduled),
                "paused": count(JobState::Paused),
                "completed": count(JobState::Completed),
            },
            "next": next.map(|(at, job)| json!({
                "id": job.id,
                "name": job.name,
                "at": rfc3339(at),
                "in_secs": at - now.timestamp(),
            })),
            "recent_runs": runs,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    let scheduler = match (&gateway, enabled) {
        (Some(g), true) => format!("running, in the gateway (pid {})", g.pid),
        (Some(g), false) => format!(
            "off: the gateway runs (pid {}) but cron.enabled is false; \
             `talaria cron run <job>` still runs a job by hand",
            g.pid
        ),
        (None, true) => "not running: no gateway runs for this home \
                         (`talaria gateway start` starts one)"
            .to_owned(),
        (None, false) => {
            "not running: no gateway runs for this home, and cron.enabled is false".to_owned()
        }
    };
    println!("Scheduler: {scheduler}");
    if let Some(alive) = nodes_alive {
        println!(
            "Nodes sharing the store: {alive} alive (each one with cron.enabled runs the jobs)"
        );
    }
    if all.is_empty() {
        println!("Jobs: none");
    } else {
        println!(
            "Jobs: {} ({} scheduled, {} paused, {} completed)",
            all.len(),
            count(JobState::Scheduled),
            count(JobState::Paused),
            count(JobState::Completed)
        );
    }
    match next {
        Some((at, job)) => {
            let left = at - now.timestamp();
            let relative = if left >= 0 {
                format!("in {}", crate::gateway_cmd::human_duration(left as f64))
            } else {
                format!(
                    "due {} ago",
                    crate::gateway_cmd::human_duration(-left as f64)
                )
            };
            println!(
                "Next due: {} ({}) at {}, {relative}",
                job.name,
                job.id,
                next_run(job, zone)
            );
        }
        None => println!("Next due: nothing is scheduled"),
    }
    if recent.is_empty() {
        println!("Latest runs: none yet");
        return Ok(ExitCode::SUCCESS);
    }
    println!("Latest runs:");
    for run in &recent {
        println!("  {}", run_line(run, &name_of(&run.job_id), zone));
    }
    Ok(ExitCode::SUCCESS)
}

/// One run as `status` lists it: when it was due, the job, how it went.
fn run_line(run: &Occurrence, name: &str, zone: Zone) -> String {
    let due = DateTime::from_timestamp(run.scheduled_at, 0)
        .map(|t| zone.format(t))
        .unwrap_or_default();
    let mut line = format!(
        "{due}  {name}  {}  {}",
        run.status.as_str(),
        run.trigger.as_str()
    );
    if let Some(e) = &run.error {
        line.push_str(&format!("  error: {}", clip_words(e, 120)));
    }
    if let Some(e) = &run.delivery_error {
        line.push_str(&format!("  not delivered: {}", clip_words(e, 120)));
    }
    line
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
