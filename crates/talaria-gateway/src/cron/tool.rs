//! `cronjob`: the agent schedules, lists, changes and runs jobs for its
//! user ("remind me every morning at 9 to ...").
//!
//! A job made in a chat remembers that chat as its `origin`, and delivers
//! there unless told otherwise.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use chrono::Utc;
use serde_json::{Value, json};
use talaria_agent::tools::{Tool, ToolContext, ToolError, ToolResult};
use talaria_core::Home;
use talaria_store::{CronJob, CronStore, JobOrigin, Misfire};

use super::jobs::{self, CronError, JobChanges, JobSpec};
use super::schedule::Zone;
use super::scheduler::{self, Scheduler};

/// The `cronjob` tool.
pub struct CronTool {
    store: Arc<dyn CronStore>,
    home: Home,
    zone: Zone,
    /// Runs `run` requests; bound once the gateway has built its scheduler
    /// (the scheduler needs the agent, which needs this tool first).
    scheduler: OnceLock<Scheduler>,
}

impl CronTool {
    /// The tool over `store`, reading times in `zone`. Its `run` action
    /// needs a scheduler bound later, once the gateway has built one.
    pub fn new(store: Arc<dyn CronStore>, home: Home, zone: Zone) -> Arc<CronTool> {
        Arc::new(CronTool {
            store,
            home,
            zone,
            scheduler: OnceLock::new(),
        })
    }

    /// Lets `run` start jobs through `scheduler`; later calls change
    /// nothing.
    pub fn bind(&self, scheduler: Scheduler) {
        let _ = self.scheduler.set(scheduler);
    }

    /// The chat a session belongs to, when it is one.
    async fn origin(&self, ctx: &ToolContext) -> Option<JobOrigin> {
        let session = ctx.store.session(&ctx.session_id).await.ok().flatten()?;
        // Only a platform adapter that says it is a chat can take the
        // answer later; the terminal, cron itself and the API server have
        // no adapter, and a webhook's adapter is not a chat.
        let scheduler = self.scheduler.get()?;
        let is_chat = scheduler
            .delivery()
            .adapter(&session.source)
            .is_some_and(|a| a.capabilities().chat);
        if !is_chat {
            return None;
        }
        Some(JobOrigin {
            platform: session.source,
            chat_id: session.chat_id?,
            thread_id: session.thread_id,
        })
    }

    fn describe(&self, job: &CronJob) -> Value {
        json!({
            "job_id": job.id,
            "name": job.name,
            "schedule": job.schedule,
            "state": job.state.as_str(),
            "next_run": job
                .next_run_at
                .and_then(|t| chrono::DateTime::from_timestamp(t, 0))
                .map(|t| self.zone.format(t)),
            "deliver": job.deliver,
            "prompt": job.prompt,
            "skills": job.skills,
            "repeat": job.repeat,
            "runs_done": job.completed,
            "misfire": job.misfire.as_str(),
            "last_status": job.last_status.map(|s| s.as_str()),
            "last_error": job.last_error,
        })
    }
}

fn string_list(args: &Value, name: &str) -> Result<Option<Vec<String>>, ToolError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(vec![s.clone()])),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                _ => Err(ToolError::new(format!(
                    "`{name}` must be a string or a list of strings"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(ToolError::new(format!(
            "`{name}` must be a string or a list of strings"
        ))),
    }
}

fn string(args: &Value, name: &str) -> Result<Option<String>, ToolError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ToolError::new(format!("`{name}` must be a string"))),
    }
}

fn repeat(args: &Value) -> Result<Option<u32>, ToolError> {
    match args.get("repeat") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| ToolError::new("`repeat` must be a positive whole number")),
        Some(Value::String(s)) => s
            .trim()
            .parse::<u32>()
            .map(Some)
            .map_err(|_| ToolError::new("`repeat` must be a positive whole number")),
        Some(_) => Err(ToolError::new("`repeat` must be a positive whole number")),
    }
}

fn misfire(args: &Value) -> Result<Option<Misfire>, ToolError> {
    string(args, "misfire")?
        .map(|m| {
            Misfire::parse(m.trim())
                .ok_or_else(|| ToolError::new("`misfire` is `run_once` or `skip`"))
        })
        .transpose()
}

fn skills(args: &Value) -> Result<Option<Vec<String>>, ToolError> {
    let mut all = string_list(args, "skills")?;
    if let Some(one) = string(args, "skill")? {
        all.get_or_insert_with(Vec::new).push(one);
    }
    Ok(all)
}

fn job_id(args: &Value) -> Result<String, ToolError> {
    string(args, "job_id")?
        .or(string(args, "name")?)
        .ok_or_else(|| ToolError::new("this action needs `job_id` (the job's id or name)"))
}

fn tool_error(e: CronError) -> ToolError {
    ToolError::new(e.to_string())
}

#[async_trait]
impl Tool for CronTool {
    fn name(&self) -> &str {
        "cronjob"
    }

    fn description(&self) -> &str {
        "Schedule tasks that run by themselves later or repeatedly (reminders, daily reports, checks), each as a fresh conversation whose answer is delivered to a chat. Actions: create, list, update, pause, resume, remove, run (now)."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "action": {
                    "type": "string",
                    "enum": ["create", "list", "update", "pause", "resume", "remove", "run"],
                    "description": "What to do"
                },
                "job_id": {"type": "string", "description": "The job's id or name (update, pause, resume, remove, run)"},
                "name": {"type": "string", "description": "A short name for the job"},
                "prompt": {"type": "string", "description": "What to do at each run, written so it makes sense with no other context"},
                "schedule": {"type": "string", "description": "`every 30m` / `every 2h` / `every 1d`; a five-field cron expression like `0 9 * * 1-5`; `in 2h` or `30m` (once); or a time like `2026-12-24T18:00` (once)"},
                "repeat": {"type": "integer", "description": "How many runs in all (leave out to repeat forever; one-shots run once)"},
                "deliver": {
                    "description": "Where answers go: origin (this chat, the default here), local (a file), <platform> (its home channel), <platform>:<chat_id>[:<thread_id>]; several allowed",
                    "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]
                },
                "skills": {"type": "array", "items": {"type": "string"}, "description": "Skills whose instructions each run follows"},
                "misfire": {"type": "string", "enum": ["run_once", "skip"], "description": "After downtime: run once late (default) or skip the missed run"}
            },
            "required": ["action"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolResult {
        let action = string(&args, "action")?
            .ok_or_else(|| ToolError::new("missing required argument `action`"))?;
        let store = self.store.as_ref();
        let now = Utc::now();
        let job = match action.trim() {
            "create" => {
                let spec = JobSpec {
                    name: string(&args, "name")?,
                    prompt: string(&args, "prompt")?,
                    skills: skills(&args)?.unwrap_or_default(),
                    schedule: string(&args, "schedule")?
                        .ok_or_else(|| ToolError::new("`create` needs a `schedule`"))?,
                    deliver: string_list(&args, "deliver")?.unwrap_or_default(),
                    repeat: repeat(&args)?,
                    misfire: misfire(&args)?,
                    origin: self.origin(ctx).await,
                };
                let job = jobs::create(store, &self.home, self.zone, spec, now)
                    .await
                    .map_err(tool_error)?;
                return Ok(json!({"success": true, "created": self.describe(&job)}).to_string());
            }
            "list" => {
                let all = store
                    .jobs()
                    .await
                    .map_err(|e| ToolError::new(e.to_string()))?;
                let listed: Vec<Value> = all.iter().map(|j| self.describe(j)).collect();
                return Ok(json!({"jobs": listed, "count": listed.len()}).to_string());
            }
            "update" => {
                let changes = JobChanges {
                    name: string(&args, "name")?.filter(|_| args.get("job_id").is_some()),
                    prompt: string(&args, "prompt")?,
                    skills: skills(&args)?,
                    schedule: string(&args, "schedule")?,
                    deliver: string_list(&args, "deliver")?,
                    repeat: repeat(&args)?.map(Some),
                    misfire: misfire(&args)?,
                };
                jobs::update(store, &self.home, self.zone, &job_id(&args)?, changes, now)
                    .await
                    .map_err(tool_error)?
            }
            "pause" => jobs::pause(store, &job_id(&args)?)
                .await
                .map_err(tool_error)?,
            "resume" => jobs::resume(store, self.zone, &job_id(&args)?, now)
                .await
                .map_err(tool_error)?,
            "remove" => {
                let job = jobs::remove(store, &job_id(&args)?)
                    .await
                    .map_err(tool_error)?;
                return Ok(json!({"success": true, "removed": job.name}).to_string());
            }
            "run" => {
                let scheduler = self.scheduler.get().ok_or_else(|| {
                    ToolError::new(
                        "jobs can only be run from here inside the gateway; run `talaria cron run <job>` in a terminal",
                    )
                })?;
                let job = jobs::find(store, &job_id(&args)?)
                    .await
                    .map_err(tool_error)?;
                scheduler.spawn_run_now(job.id.clone(), now);
                return Ok(json!({
                    "success": true,
                    "started": job.name,
                    "note": format!("it runs in its own session ({}...) and its answer goes to {}", scheduler::SOURCE, job.deliver.join(", ")),
                })
                .to_string());
            }
            other => {
                return Err(ToolError::new(format!(
                    "unknown action `{other}`: use create, list, update, pause, resume, remove or run"
                )));
            }
        };
        Ok(json!({"success": true, "job": self.describe(&job)}).to_string())
    }
}
