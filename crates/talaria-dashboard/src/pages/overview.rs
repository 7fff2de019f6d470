//! The overview: platforms and their liveness, the nodes, running turns,
//! the delivery ledger, cron, the newest sessions and the latest errors
//! in the log. Its cost does not grow with the number of sessions: each
//! part is one bounded API call.

use std::sync::Arc;

use askama::Template;
use axum::Extension;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::Value;

use super::Shown;
use super::sessions::{SessionRow, session_rows};
use crate::Ui;
use crate::auth::Login;
use crate::view::{self, Frame, count, text, when_value};

/// Sessions the overview lists.
const RECENT_SESSIONS: usize = 8;
/// Error lines the overview shows.
const RECENT_ERRORS: usize = 10;

pub(crate) struct Platform {
    name: String,
    liveness: String,
    since: String,
    last_error: String,
}

pub(crate) struct Node {
    id: String,
    host: String,
    pid: u64,
    version: String,
    alive: bool,
    heartbeat: String,
}

pub(crate) struct Count {
    name: String,
    n: u64,
}

pub(crate) struct Health {
    version: String,
    platforms: Vec<Platform>,
    nodes: Vec<Node>,
    ledger: Vec<Count>,
    running_turns: u64,
    cron_enabled: bool,
    cron_jobs: u64,
    cron_states: Vec<Count>,
    next_run: String,
}

#[derive(Template)]
#[template(path = "overview.html")]
struct Overview {
    frame: Frame,
    health: Shown<Health>,
    sessions: Shown<Vec<SessionRow>>,
    errors: Shown<Vec<String>>,
}

view::framed!(Overview);

fn counts(value: &Value) -> Vec<Count> {
    value
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(name, n)| Count {
                    name: name.clone(),
                    n: n.as_u64().unwrap_or(0),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn health(v: &Value) -> Health {
    let platforms = v["platforms"]
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(name, p)| Platform {
                    name: name.clone(),
                    liveness: text(p, "liveness"),
                    since: when_value(&p["since"]),
                    last_error: text(p, "last_error"),
                })
                .collect()
        })
        .unwrap_or_default();
    let nodes = v["nodes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|n| Node {
                    id: text(n, "id"),
                    host: text(n, "host"),
                    pid: count(n, "pid"),
                    version: text(n, "version"),
                    alive: n["alive"].as_bool().unwrap_or(false),
                    heartbeat: when_value(&n["heartbeat_at"]),
                })
                .collect()
        })
        .unwrap_or_default();
    let cron = &v["cron"];
    let next_run = match cron["next_run"].as_object() {
        Some(next) => format!(
            "{} at {}",
            next.get("name").and_then(Value::as_str).unwrap_or(""),
            view::when_value(next.get("at").unwrap_or(&Value::Null))
        ),
        None => String::new(),
    };
    Health {
        version: text(v, "version"),
        platforms,
        nodes,
        ledger: counts(&v["ledger"]),
        running_turns: count(&v["running_turns"], "gateway"),
        cron_enabled: cron["enabled"].as_bool().unwrap_or(false),
        cron_jobs: count(cron, "jobs"),
        cron_states: counts(&cron["by_state"]),
        next_run,
    }
}

/// `GET /ui/`.
pub(crate) async fn page(
    State(ui): State<Arc<Ui>>,
    Extension(login): Extension<Login>,
    headers: HeaderMap,
) -> Response {
    let sessions_path = format!("/api/sessions?limit={RECENT_SESSIONS}");
    let errors_path = format!("/api/logs?level=error&lines={RECENT_ERRORS}");
    let (health_answer, sessions_answer, errors_answer) = tokio::join!(
        ui.api.get("/health/detailed"),
        ui.api.get(&sessions_path),
        ui.api.get(&errors_path),
    );
    let page = Overview {
        frame: Frame::new("overview", "Overview", &login, &headers),
        health: health_answer.map(|v| health(&v)).map_err(|e| e.to_string()),
        sessions: sessions_answer
            .map(|v| session_rows(&v))
            .map_err(|e| e.to_string()),
        errors: errors_answer
            .map(|v| {
                v["lines"]
                    .as_array()
                    .map(|lines| {
                        lines
                            .iter()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .map_err(|e| e.to_string()),
    };
    view::render(&page)
}
