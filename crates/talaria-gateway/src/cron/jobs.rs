//! Creating and changing jobs: the validation shared by `talaria cron`
//! and the agent's `cronjob` tool, so a job means the same whoever made it.

use chrono::{DateTime, Utc};
use talaria_core::Home;
use talaria_store::{CronJob, CronStore, JobOrigin, JobState, Misfire, NewCronJob, StoreError};

use super::schedule::{ONESHOT_GRACE, Schedule, Zone};
use crate::target::Target;

/// Longest prompt, in chars.
pub const MAX_PROMPT_CHARS: usize = 20_000;

/// Longest job name, in chars.
pub const MAX_NAME_CHARS: usize = 100;

/// Skills a job may load.
pub const MAX_SKILLS: usize = 8;

/// Delivery targets a job may have.
pub const MAX_TARGETS: usize = 8;

/// Why a job could not be made, found or run.
#[derive(Debug, thiserror::Error)]
pub enum CronError {
    /// Something the user gave is not acceptable; the text says what.
    #[error("{0}")]
    Invalid(String),
    /// No job has this id or name.
    #[error("no cron job has the id or name `{0}`")]
    NotFound(String),
    /// The store failed.
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for CronError {
    fn from(e: StoreError) -> CronError {
        match e {
            StoreError::Conflict(message) => CronError::Invalid(message),
            e => CronError::Store(e),
        }
    }
}

/// What a new job is made from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobSpec {
    /// Defaults to the start of the prompt (or the first skill's name).
    pub name: Option<String>,
    /// The instruction the agent runs; optional when `skills` say what to do.
    pub prompt: Option<String>,
    /// Skills loaded into the run, by name.
    pub skills: Vec<String>,
    /// The schedule text (`every 2h`, a cron expression, a time, ...).
    pub schedule: String,
    /// Empty: `origin` for a job made in a chat, else `local`.
    pub deliver: Vec<String>,
    /// How many runs before the job ends; `None` for no limit.
    pub repeat: Option<u32>,
    /// What to do with a run missed while the gateway was down; `None` for the default.
    pub misfire: Option<Misfire>,
    /// The chat the job was made in, if any.
    pub origin: Option<JobOrigin>,
}

/// Changes to a job; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobChanges {
    /// A new name.
    pub name: Option<String>,
    /// A new prompt.
    pub prompt: Option<String>,
    /// A new list of skills (replaces the old one).
    pub skills: Option<Vec<String>>,
    /// A new schedule text; the next run is computed from it.
    pub schedule: Option<String>,
    /// New delivery targets (replaces the old ones).
    pub deliver: Option<Vec<String>>,
    /// `Some(None)` removes the limit.
    pub repeat: Option<Option<u32>>,
    /// A new misfire policy.
    pub misfire: Option<Misfire>,
}

/// Creates a job from `spec` at `now`.
pub async fn create(
    store: &dyn CronStore,
    home: &Home,
    zone: Zone,
    spec: JobSpec,
    now: DateTime<Utc>,
) -> Result<CronJob, CronError> {
    let prompt = clean_prompt(spec.prompt)?;
    let skills = check_skills(home, spec.skills)?;
    if prompt.is_none() && skills.is_empty() {
        return Err(CronError::Invalid(
            "a job needs a prompt, a skill, or both".into(),
        ));
    }
    let schedule = parse_schedule(&spec.schedule, now, zone)?;
    let deliver = check_targets(spec.deliver, spec.origin.is_some())?;
    let repeat = check_repeat(spec.repeat)?;
    let name = match spec.name {
        Some(name) => check_name(&name)?,
        None => default_name(prompt.as_deref(), &skills),
    };
    let job = NewCronJob {
        id: new_job_id(),
        name,
        prompt,
        skills,
        schedule: schedule.canonical(),
        deliver,
        origin: spec.origin,
        // A one-shot runs once unless told otherwise.
        repeat: repeat.or(schedule.is_once().then_some(1)),
        misfire: spec.misfire.unwrap_or_default(),
        next_run_at: schedule.first(now, zone).map(|t| t.timestamp()),
    };
    let id = job.id.clone();
    store.create_job(job).await?;
    store
        .job(&id)
        .await?
        .ok_or_else(|| CronError::NotFound(id.clone()))
}

/// A new or changed job's schedule, read at `now`: a one-shot time must
/// not be past (beyond [`ONESHOT_GRACE`]).
fn parse_schedule(text: &str, now: DateTime<Utc>, zone: Zone) -> Result<Schedule, CronError> {
    let schedule =
        Schedule::parse(text, now, zone).map_err(|e| CronError::Invalid(e.to_string()))?;
    if let Schedule::Once(at) = schedule
        && at < now - chrono::Duration::from_std(ONESHOT_GRACE).unwrap_or_default()
    {
        return Err(CronError::Invalid(format!(
            "{} is in the past",
            zone.format(at)
        )));
    }
    Ok(schedule)
}

/// The job named by `id_or_name`.
pub async fn find(store: &dyn CronStore, id_or_name: &str) -> Result<CronJob, CronError> {
    store
        .job(id_or_name.trim())
        .await?
        .ok_or_else(|| CronError::NotFound(id_or_name.trim().to_owned()))
}

/// Applies `changes` to a job, checked as [`create`] checks a new one. A
/// new schedule starts afresh from `now` (a completed job is scheduled
/// again); the record of its runs is kept.
pub async fn update(
    store: &dyn CronStore,
    home: &Home,
    zone: Zone,
    id_or_name: &str,
    changes: JobChanges,
    now: DateTime<Utc>,
) -> Result<CronJob, CronError> {
    let mut job = find(store, id_or_name).await?;
    if let Some(name) = changes.name {
        job.name = check_name(&name)?;
    }
    if let Some(prompt) = changes.prompt {
        job.prompt = clean_prompt(Some(prompt))?;
    }
    if let Some(skills) = changes.skills {
        job.skills = check_skills(home, skills)?;
    }
    if job.prompt.is_none() && job.skills.is_empty() {
        return Err(CronError::Invalid(
            "a job needs a prompt, a skill, or both".into(),
        ));
    }
    if let Some(deliver) = changes.deliver {
        job.deliver = check_targets(deliver, job.origin.is_some())?;
    }
    if let Some(repeat) = changes.repeat {
        job.repeat = check_repeat(repeat)?;
    }
    if let Some(misfire) = changes.misfire {
        job.misfire = misfire;
    }
    if let Some(text) = changes.schedule {
        let schedule = parse_schedule(&text, now, zone)?;
        job.schedule = schedule.canonical();
        job.next_run_at = schedule.first(now, zone).map(|t| t.timestamp());
        if job.state == JobState::Completed {
            job.state = JobState::Scheduled;
        }
    }
    if job.state == JobState::Scheduled && job.next_run_at.is_none() {
        job.state = JobState::Completed;
    }
    if !store.update_job(&job).await? {
        return Err(CronError::NotFound(id_or_name.to_owned()));
    }
    find(store, &job.id).await
}

/// Pauses a job: it keeps its settings and runs no more until resumed.
pub async fn pause(store: &dyn CronStore, id_or_name: &str) -> Result<CronJob, CronError> {
    let mut job = find(store, id_or_name).await?;
    if job.state == JobState::Completed {
        return Err(CronError::Invalid(format!(
            "`{}` has completed; give it a new schedule instead",
            job.name
        )));
    }
    job.state = JobState::Paused;
    store.update_job(&job).await?;
    find(store, &job.id).await
}

/// Resumes a paused job from `now`: runs missed while it was paused are
/// not made up.
pub async fn resume(
    store: &dyn CronStore,
    zone: Zone,
    id_or_name: &str,
    now: DateTime<Utc>,
) -> Result<CronJob, CronError> {
    let mut job = find(store, id_or_name).await?;
    if job.state != JobState::Paused {
        return Err(CronError::Invalid(format!(
            "`{}` is not paused (it is {})",
            job.name,
            job.state.as_str()
        )));
    }
    let schedule = Schedule::from_stored(&job.schedule)
        .map_err(|e| CronError::Invalid(format!("the stored schedule is unreadable: {e}")))?;
    job.next_run_at = match schedule {
        // A one-shot keeps its time; if that passed, the misfire policy
        // decides at the next tick.
        Schedule::Once(at) => Some(at.timestamp()),
        ref s => s.first(now, zone).map(|t| t.timestamp()),
    };
    job.state = if job.next_run_at.is_some() {
        JobState::Scheduled
    } else {
        JobState::Completed
    };
    store.update_job(&job).await?;
    find(store, &job.id).await
}

/// Removes a job and the record of its runs (its output files stay).
pub async fn remove(store: &dyn CronStore, id_or_name: &str) -> Result<CronJob, CronError> {
    let job = find(store, id_or_name).await?;
    store.delete_job(&job.id).await?;
    Ok(job)
}

/// The name of a job without one: the start of its prompt, else its first
/// skill.
fn default_name(prompt: Option<&str>, skills: &[String]) -> String {
    match prompt {
        Some(p) => {
            let line: String = p
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .chars()
                .take(50)
                .collect();
            line
        }
        None => skills.first().cloned().unwrap_or_else(|| "job".into()),
    }
}

fn check_name(name: &str) -> Result<String, CronError> {
    let name = name.trim();
    if name.is_empty() {
        return Err(CronError::Invalid("the job name is empty".into()));
    }
    if name.chars().count() > MAX_NAME_CHARS {
        return Err(CronError::Invalid(format!(
            "the job name is longer than {MAX_NAME_CHARS} characters"
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(CronError::Invalid(
            "the job name has control characters".into(),
        ));
    }
    Ok(name.to_owned())
}

fn clean_prompt(prompt: Option<String>) -> Result<Option<String>, CronError> {
    let Some(prompt) = prompt
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
    else {
        return Ok(None);
    };
    if prompt.chars().count() > MAX_PROMPT_CHARS {
        return Err(CronError::Invalid(format!(
            "the prompt is longer than {MAX_PROMPT_CHARS} characters"
        )));
    }
    Ok(Some(prompt))
}

fn check_repeat(repeat: Option<u32>) -> Result<Option<u32>, CronError> {
    match repeat {
        Some(0) => Err(CronError::Invalid(
            "repeat must be at least 1 (leave it out to repeat forever)".into(),
        )),
        r => Ok(r),
    }
}

fn check_targets(deliver: Vec<String>, has_origin: bool) -> Result<Vec<String>, CronError> {
    let mut out: Vec<String> = Vec::new();
    for raw in deliver.iter().flat_map(|d| d.split(',')) {
        let raw = raw.trim();
        if raw.is_empty() {
            continue;
        }
        let target: Target = raw
            .parse()
            .map_err(|e| CronError::Invalid(format!("{e}")))?;
        if target == Target::Origin && !has_origin {
            return Err(CronError::Invalid(
                "`origin` means the chat a job was made in, and this one was not made in a chat; name a target like telegram:<chat_id>, telegram (its home channel) or local".into(),
            ));
        }
        let printed = target.to_string();
        if !out.contains(&printed) {
            out.push(printed);
        }
    }
    if out.len() > MAX_TARGETS {
        return Err(CronError::Invalid(format!(
            "a job delivers to at most {MAX_TARGETS} targets"
        )));
    }
    if out.is_empty() {
        out.push(if has_origin { "origin" } else { "local" }.to_owned());
    }
    Ok(out)
}

fn check_skills(home: &Home, skills: Vec<String>) -> Result<Vec<String>, CronError> {
    let mut out: Vec<String> = Vec::new();
    for name in skills.iter().flat_map(|s| s.split(',')) {
        let name = name.trim();
        if name.is_empty() || out.iter().any(|s| s == name) {
            continue;
        }
        if talaria_learning::Library::new(home).find(name).is_none() {
            return Err(CronError::Invalid(format!(
                "no skill named `{name}` (the skills_list tool lists them)"
            )));
        }
        out.push(name.to_owned());
    }
    if out.len() > MAX_SKILLS {
        return Err(CronError::Invalid(format!(
            "a job loads at most {MAX_SKILLS} skills"
        )));
    }
    Ok(out)
}

/// A skill's SKILL.md text (the user's skills or the bundled ones), for
/// loading into a run.
pub fn skill_text(home: &Home, name: &str) -> Result<String, CronError> {
    talaria_learning::Library::new(home)
        .read(name)
        .map(|skill| skill.text)
        .map_err(|e| CronError::Invalid(e.to_string()))
}

/// 12 random lower-case hex digits.
fn new_job_id() -> String {
    format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_checked_split_deduplicated_and_defaulted() {
        assert_eq!(check_targets(vec![], false).unwrap(), vec!["local"]);
        assert_eq!(check_targets(vec![], true).unwrap(), vec!["origin"]);
        assert_eq!(
            check_targets(
                vec!["Telegram, telegram:5".into(), "telegram".into()],
                false
            )
            .unwrap(),
            vec!["telegram", "telegram:5"]
        );
        assert!(check_targets(vec!["origin".into()], false).is_err());
        assert!(check_targets(vec!["tele gram".into()], false).is_err());
    }

    #[test]
    fn default_names_come_from_the_prompt_or_the_skill() {
        assert_eq!(
            default_name(Some("Check the\n weather   in Paris"), &[]),
            "Check the weather in Paris"
        );
        assert_eq!(default_name(None, &["digest".into()]), "digest");
        assert_eq!(default_name(Some(&"x".repeat(80)), &[]).len(), 50);
    }
}
