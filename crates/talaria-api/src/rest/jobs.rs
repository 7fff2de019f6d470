//! `/api/jobs`: cron jobs, made and changed through the checks `talaria
//! cron` and the `cronjob` tool share (`talaria_gateway::cron::jobs`), so
//! a job means the same whoever made it; run now through the gateway's
//! scheduler.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use talaria_gateway::cron::{CronError, JobChanges, JobSpec, RunReport, Zone, jobs};
use talaria_store::{CronJob, CronStore, Misfire};

use super::{
    Params, bad_request, count_param, error, gateway, json_body, not_found, query, shown,
    store_error,
};
use crate::AppState;
use crate::error::ApiError;

/// Longest id or name a path may give, in chars (names are at most
/// [`jobs::MAX_NAME_CHARS`]).
const MAX_REF_CHARS: usize = 200;

type PathRef = Result<Path<String>, PathRejection>;

/// A job as clients see it.
fn job_json(job: &CronJob) -> Value {
    json!({
        "id": job.id,
        "object": "talaria.cron_job",
        "name": job.name,
        "prompt": job.prompt,
        "skills": job.skills,
        "schedule": job.schedule,
        "deliver": job.deliver,
        "origin": job.origin,
        "repeat": job.repeat,
        "completed": job.completed,
        "state": job.state.as_str(),
        "misfire": job.misfire.as_str(),
        "next_run_at": job.next_run_at,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "last_run_at": job.last_run_at,
        "last_status": job.last_status.map(|s| s.as_str()),
        "last_error": job.last_error,
    })
}

fn job_answer(job: &CronJob) -> Response {
    Json(job_json(job)).into_response()
}

/// A cron failure as an answer: the checks' sentence as a 400, an unknown
/// job as a 404.
fn cron_error(e: CronError) -> ApiError {
    match e {
        CronError::Invalid(m) => bad_request(m, "invalid_job"),
        CronError::NotFound(r) => not_found(
            format!("No cron job has the id or name {:?}", shown(&r)),
            "job_not_found",
        ),
        CronError::Store(e) => store_error(e),
    }
}

/// The id or name in the path, bounded.
fn job_ref(path: PathRef) -> Result<String, ApiError> {
    let Path(r) = path.map_err(|e| bad_request(e.body_text(), "invalid_path"))?;
    if r.trim().is_empty() || r.chars().count() > MAX_REF_CHARS {
        return Err(bad_request(
            format!("A job is named by its id or name (at most {MAX_REF_CHARS} characters)"),
            "invalid_id",
        ));
    }
    Ok(r)
}

/// The store of jobs and the zone schedules are read in.
fn context(state: &AppState) -> Result<(&dyn CronStore, Zone), ApiError> {
    let services = gateway(state)?;
    let zone = Zone::from_config(&state.agent.parts().config.cron)
        .map_err(|e| ApiError::internal(format!("cron.timezone is unusable: {e}")))?;
    Ok((services.store.as_ref(), zone))
}

fn misfire(raw: &str) -> Result<Misfire, ApiError> {
    Misfire::parse(raw.trim())
        .ok_or_else(|| bad_request("`misfire` is `run_once` or `skip`", "invalid_job"))
}

/// Jobs a list answers with unless `limit` says otherwise.
const DEFAULT_LIMIT: usize = 100;
/// Most jobs one page holds.
const MAX_LIMIT: usize = 500;

/// `GET /api/jobs`: the jobs as `talaria cron list` shows them, a page
/// at a time (`limit`, `offset`). The store reads them all (its
/// `jobs()`, which the CLI and the scheduler's tool use too); the answer
/// holds one page.
pub(super) async fn list(
    State(state): State<Arc<AppState>>,
    params: Result<Query<Params>, QueryRejection>,
) -> Response {
    async {
        let (store, _) = context(&state)?;
        let params = query(params)?;
        let limit = count_param(&params, "limit", DEFAULT_LIMIT, MAX_LIMIT)?;
        let offset = count_param(&params, "offset", 0, usize::MAX)?;
        let all = store.jobs().await.map_err(store_error)?;
        let has_more = all.len() > offset.saturating_add(limit);
        let page: Vec<Value> = all.iter().skip(offset).take(limit).map(job_json).collect();
        Ok::<_, ApiError>(
            Json(json!({
                "object": "list",
                "data": page,
                "limit": limit,
                "offset": offset,
                "has_more": has_more,
            }))
            .into_response(),
        )
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// What `POST /api/jobs` takes: `talaria cron add`'s options.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewJob {
    schedule: String,
    name: Option<String>,
    prompt: Option<String>,
    #[serde(default)]
    skills: Vec<String>,
    #[serde(default)]
    deliver: Vec<String>,
    repeat: Option<u32>,
    misfire: Option<String>,
}

/// `POST /api/jobs`: 201 with the job.
pub(super) async fn create(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    async {
        let (store, zone) = context(&state)?;
        let body: NewJob = json_body(&body)?;
        let spec = JobSpec {
            name: body.name,
            prompt: body.prompt,
            skills: body.skills,
            schedule: body.schedule,
            deliver: body.deliver,
            repeat: body.repeat,
            misfire: body.misfire.as_deref().map(misfire).transpose()?,
            origin: None,
        };
        let home = &state.agent.parts().home;
        let job = jobs::create(store, home, zone, spec, Utc::now())
            .await
            .map_err(cron_error)?;
        Ok::<_, ApiError>((StatusCode::CREATED, Json(job_json(&job))).into_response())
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// `GET /api/jobs/{id}` (an id or a name).
pub(super) async fn show(State(state): State<Arc<AppState>>, path: PathRef) -> Response {
    async {
        let (store, _) = context(&state)?;
        let r = job_ref(path)?;
        let job = jobs::find(store, &r).await.map_err(cron_error)?;
        Ok::<_, ApiError>(job_answer(&job))
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// The changes a `PATCH` body asks for. Read by hand: `repeat: null`
/// (remove the limit) must differ from no `repeat` at all.
fn changes(body: Map<String, Value>) -> Result<JobChanges, ApiError> {
    fn text(key: &str, v: Value) -> Result<String, ApiError> {
        match v {
            Value::String(s) => Ok(s),
            _ => Err(bad_request(
                format!("`{key}` must be a string"),
                "invalid_job",
            )),
        }
    }
    fn texts(key: &str, v: Value) -> Result<Vec<String>, ApiError> {
        serde_json::from_value(v)
            .map_err(|_| bad_request(format!("`{key}` must be a list of strings"), "invalid_job"))
    }
    let mut c = JobChanges::default();
    for (key, v) in body {
        match key.as_str() {
            "name" => c.name = Some(text(&key, v)?),
            "prompt" => c.prompt = Some(text(&key, v)?),
            "schedule" => c.schedule = Some(text(&key, v)?),
            "skills" => c.skills = Some(texts(&key, v)?),
            "deliver" => c.deliver = Some(texts(&key, v)?),
            "misfire" => c.misfire = Some(misfire(&text(&key, v)?)?),
            "repeat" => {
                c.repeat = Some(match v {
                    Value::Null => None,
                    v => Some(serde_json::from_value::<u32>(v).map_err(|_| {
                        bad_request("`repeat` must be a whole number or null", "invalid_job")
                    })?),
                })
            }
            other => {
                return Err(bad_request(
                    format!(
                        "Unknown field {:?}: a job's name, prompt, skills, schedule, deliver, \
                         repeat and misfire can be changed",
                        shown(other)
                    ),
                    "invalid_job",
                ));
            }
        }
    }
    Ok(c)
}

/// `PATCH /api/jobs/{id}`: changes the fields given; a new schedule
/// starts afresh from now.
pub(super) async fn update(
    State(state): State<Arc<AppState>>,
    path: PathRef,
    body: Bytes,
) -> Response {
    async {
        let (store, zone) = context(&state)?;
        let r = job_ref(path)?;
        let body: Map<String, Value> = json_body(&body)?;
        let changes = changes(body)?;
        let home = &state.agent.parts().home;
        let job = jobs::update(store, home, zone, &r, changes, Utc::now())
            .await
            .map_err(cron_error)?;
        Ok::<_, ApiError>(job_answer(&job))
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// `DELETE /api/jobs/{id}`: the job and the record of its runs (its
/// output files stay).
pub(super) async fn remove(State(state): State<Arc<AppState>>, path: PathRef) -> Response {
    async {
        let (store, _) = context(&state)?;
        let r = job_ref(path)?;
        let job = jobs::remove(store, &r).await.map_err(cron_error)?;
        Ok::<_, ApiError>(
            Json(json!({"object": "talaria.cron_job.deleted", "id": job.id, "deleted": true}))
                .into_response(),
        )
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// `POST /api/jobs/{id}/pause`.
pub(super) async fn pause(State(state): State<Arc<AppState>>, path: PathRef) -> Response {
    async {
        let (store, _) = context(&state)?;
        let r = job_ref(path)?;
        let job = jobs::pause(store, &r).await.map_err(cron_error)?;
        Ok::<_, ApiError>(job_answer(&job))
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// `POST /api/jobs/{id}/resume`: from now; runs missed while paused are
/// not made up.
pub(super) async fn resume(State(state): State<Arc<AppState>>, path: PathRef) -> Response {
    async {
        let (store, zone) = context(&state)?;
        let r = job_ref(path)?;
        let job = jobs::resume(store, zone, &r, Utc::now())
            .await
            .map_err(cron_error)?;
        Ok::<_, ApiError>(job_answer(&job))
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

fn report_json(r: &RunReport) -> Value {
    json!({
        "object": "talaria.cron_job.run",
        "job_id": r.job_id,
        "job_name": r.job_name,
        "scheduled_at": r.scheduled_at,
        "status": r.status.as_str(),
        "session_id": r.session_id,
        "answer": r.answer,
        "error": r.error,
        "delivered": r.delivered,
        "delivery_errors": r.delivery_errors,
    })
}

/// `POST /api/jobs/{id}/run`: runs the job now, outside its schedule (its
/// schedule and repeat count stay), as `talaria cron run` does, through
/// the gateway's scheduler. Answers 202 at once; with `?wait=true` it
/// waits for the run and answers with its report.
pub(super) async fn run(
    State(state): State<Arc<AppState>>,
    path: PathRef,
    params: Result<Query<Params>, QueryRejection>,
) -> Response {
    async {
        let services = gateway(&state)?;
        let r = job_ref(path)?;
        let params = query(params)?;
        let wait = match params.get("wait").map(|w| w.trim()) {
            None | Some("false") | Some("0") => false,
            Some("true") | Some("1") => true,
            Some(_) => return Err(bad_request("`wait` is true or false", "invalid_query")),
        };
        let Some(scheduler) = &services.scheduler else {
            return Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "cron.enabled is false, so this gateway runs no jobs; enable it, or run the \
                 job with `talaria cron run`",
                "cron_disabled",
            ));
        };
        let job = jobs::find(services.store.as_ref(), &r)
            .await
            .map_err(cron_error)?;
        if wait {
            let report = scheduler
                .run_now(&job.id, Utc::now())
                .await
                .map_err(cron_error)?;
            return Ok(Json(report_json(&report)).into_response());
        }
        scheduler.spawn_run_now(job.id.clone(), Utc::now());
        Ok((
            StatusCode::ACCEPTED,
            Json(json!({
                "object": "talaria.cron_job.run",
                "job_id": job.id,
                "job_name": job.name,
                "status": "started",
            })),
        )
            .into_response())
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}
