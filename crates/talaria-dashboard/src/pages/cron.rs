//! Cron jobs: the list with their state and next run, pause, resume, run
//! now, delete, and a form for a new job.

use std::sync::Arc;

use askama::Template;
use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use serde_json::{Map, Value, json};

use super::Shown;
use crate::Ui;
use crate::auth::Login;
use crate::form::Fields;
use crate::view::{self, Frame, encode, text, when_value};

pub(crate) struct Job {
    id: String,
    name: String,
    schedule: String,
    prompt: String,
    state: String,
    next_run: String,
    last_run: String,
    last_status: String,
    last_error: String,
}

#[derive(Template)]
#[template(path = "cron.html")]
struct CronPage {
    frame: Frame,
    jobs: Shown<Vec<Job>>,
    more: bool,
}

view::framed!(CronPage);

fn schedule_text(schedule: &Value) -> String {
    match schedule {
        Value::String(s) => s.clone(),
        Value::Object(o) => o
            .get("display")
            .or_else(|| o.get("expr"))
            .and_then(Value::as_str)
            .map_or_else(|| schedule.to_string(), str::to_owned),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// `GET /ui/cron`.
pub(crate) async fn page(
    State(ui): State<Arc<Ui>>,
    Extension(login): Extension<Login>,
    headers: HeaderMap,
) -> Response {
    let answer = ui.api.get("/api/jobs?limit=200").await;
    let more = answer
        .as_ref()
        .is_ok_and(|v| v["has_more"].as_bool().unwrap_or(false));
    let jobs = answer
        .map(|v| {
            v["data"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|j| Job {
                            id: text(j, "id"),
                            name: text(j, "name"),
                            schedule: schedule_text(&j["schedule"]),
                            prompt: text(j, "prompt"),
                            state: text(j, "state"),
                            next_run: when_value(&j["next_run_at"]),
                            last_run: when_value(&j["last_run_at"]),
                            last_status: text(j, "last_status"),
                            last_error: text(j, "last_error"),
                        })
                        .collect()
                })
                .unwrap_or_default()
        })
        .map_err(|e| e.to_string());
    view::render(&CronPage {
        frame: Frame::new("cron", "Cron jobs", &login, &headers),
        jobs,
        more,
    })
}

/// `POST /ui/cron/{id}/{pause|resume|run|delete}`.
pub(crate) async fn act(
    State(ui): State<Arc<Ui>>,
    Path((id, action)): Path<(String, String)>,
) -> Response {
    let path = format!("/api/jobs/{}", encode(&id));
    let (method, path, done) = match action.as_str() {
        "pause" => (Method::POST, format!("{path}/pause"), "Paused"),
        "resume" => (Method::POST, format!("{path}/resume"), "Resumed"),
        "run" => (Method::POST, format!("{path}/run"), "Started"),
        "delete" => (Method::DELETE, path, "Deleted"),
        _ => return view::after_change("/ui/cron", Err(format!("Unknown action {action:?}."))),
    };
    let outcome = ui
        .api
        .send(method, &path, json!({}))
        .await
        .map(|v| {
            let name = text(&v, "name");
            format!("{done} {}.", if name.is_empty() { &id } else { &name })
        })
        .map_err(|e| e.message);
    view::after_change("/ui/cron", outcome)
}

/// `POST /ui/cron` with `schedule`, `prompt` and optionally `name` and
/// `deliver`: a new job, through the same checks as `talaria cron add`.
pub(crate) async fn create(State(ui): State<Arc<Ui>>, body: axum::body::Bytes) -> Response {
    let fields = Fields::parse(&body);
    let mut job = Map::new();
    for key in ["schedule", "prompt", "name"] {
        if let Some(value) = fields.text(key) {
            job.insert(key.to_owned(), Value::from(value));
        }
    }
    if let Some(deliver) = fields.text("deliver") {
        job.insert("deliver".to_owned(), json!([deliver]));
    }
    let outcome = ui
        .api
        .send(Method::POST, "/api/jobs", Value::Object(job))
        .await
        .map(|v| {
            format!(
                "Created {}; next run {}.",
                text(&v, "name"),
                when_value(&v["next_run_at"])
            )
        })
        .map_err(|e| e.message);
    view::after_change("/ui/cron", outcome)
}
