//! The REST side of the server: stored sessions, cron jobs, DM pairing,
//! what the server offers (capabilities, skills, toolsets), the detailed
//! health report, the configuration and the logs, and the OpenAPI
//! description.
//!
//! # Layout
//!
//! - this file: [`GatewayServices`] (the gateway's parts these routes
//!   use), the routes, and what every handler shares: reading bodies,
//!   queries and ids, and turning store errors into answers.
//! - `sessions`: `/api/sessions` (list, search, create, get, rename,
//!   delete, messages, fork).
//! - `jobs`: `/api/jobs` (cron jobs through the gateway's checks).
//! - `pairing`: `/api/pairing` (pending codes, approve, deny, revoke).
//! - `catalog`: `/v1/capabilities`, `/v1/skills`, `/v1/toolsets`.
//! - `learning`: `/api/memory` (the memory files, changed through the
//!   `memory` tool), `/api/skills` (a skill read, created, rewritten
//!   through `skill_manage`), `/api/learning` (the learning log, rollback,
//!   the learning graph).
//! - `health`: `/health/detailed`.
//! - `config`: `/api/config` (the effective configuration, masked, with
//!   `talaria config check`'s findings, through the gateway's hook).
//! - `logs`: `/api/logs` (a log's tail, read backwards within bounds,
//!   with a text and a level filter) and `/api/logs/files`.
//! - `openapi`: `/openapi.json`, the description of every route.
//!
//! Every route here is behind the API key; the ones that need the gateway
//! answer 503 when the server runs without one (tests, embedding).

mod catalog;
mod config;
mod health;
mod jobs;
mod learning;
mod logs;
pub(crate) mod openapi;
mod pairing;
mod sessions;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::de::DeserializeOwned;
use talaria_gateway::cron::Scheduler;
use talaria_gateway::supervisor::StatusBoard;
use talaria_store::{GatewayStore, StoreError};

use super::AppState;
use super::error::ApiError;

/// What the jobs, pairing, detailed-health and configuration routes use
/// of the gateway the server runs beside. Without it those routes answer
/// 503.
pub struct GatewayServices {
    /// The gateway's store: cron jobs, pairing, the ledger, the nodes.
    pub store: Arc<dyn GatewayStore>,
    /// The running cron scheduler (`None` when `cron.enabled` is false):
    /// `POST /api/jobs/{id}/run` runs jobs through it.
    pub scheduler: Option<Scheduler>,
    /// The platforms' liveness.
    pub board: Arc<StatusBoard>,
    /// The platforms the gateway runs, which `/readyz` waits for: known
    /// before any has reported to the board.
    pub platforms: Vec<String>,
    /// How many chats have a turn running now.
    pub running_turns: Arc<dyn Fn() -> usize + Send + Sync>,
    /// The configuration's report as `GET /api/config` answers it: read
    /// from the files on disk at each call (so an edit shows at the next
    /// request), secrets masked, with `talaria config check`'s findings.
    /// The checks need every crate's sections, which this crate cannot
    /// reach, so the binary hands them in. It blocks (it reads files):
    /// call it off the async threads.
    pub config_report: Arc<dyn Fn() -> serde_json::Value + Send + Sync>,
    /// The process's metrics in Prometheus' text format, as `/metrics`
    /// serves them; `None` where no recorder is installed.
    pub metrics: Option<Arc<dyn Fn() -> String + Send + Sync>>,
}

impl std::fmt::Debug for GatewayServices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayServices")
            .field("scheduler", &self.scheduler.is_some())
            .finish_non_exhaustive()
    }
}

/// The REST routes; the caller puts them behind the key.
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/api/sessions", get(sessions::list).post(sessions::create))
        .route(
            "/api/sessions/{id}",
            get(sessions::show)
                .patch(sessions::rename)
                .delete(sessions::remove),
        )
        .route("/api/sessions/{id}/messages", get(sessions::messages))
        .route("/api/sessions/{id}/fork", post(sessions::fork))
        .route("/api/jobs", get(jobs::list).post(jobs::create))
        .route(
            "/api/jobs/{id}",
            get(jobs::show).patch(jobs::update).delete(jobs::remove),
        )
        .route("/api/jobs/{id}/pause", post(jobs::pause))
        .route("/api/jobs/{id}/resume", post(jobs::resume))
        .route("/api/jobs/{id}/run", post(jobs::run))
        .route("/api/pairing", get(pairing::show))
        .route("/api/pairing/approve", post(pairing::approve))
        .route("/api/pairing/deny", post(pairing::deny))
        .route("/api/pairing/revoke", post(pairing::revoke))
        .route("/v1/capabilities", get(catalog::capabilities))
        .route("/v1/skills", get(catalog::skills))
        .route("/v1/toolsets", get(catalog::toolsets))
        .route(
            "/api/memory",
            get(learning::memory).post(learning::memory_change),
        )
        .route("/api/skills", post(learning::skill_create))
        .route(
            "/api/skills/{name}",
            get(learning::skill).put(learning::skill_edit),
        )
        .route("/api/learning", get(learning::log))
        .route("/api/learning/rollback", post(learning::rollback))
        .route("/api/learning/graph", get(learning::graph))
        .route("/health/detailed", get(health::detailed))
        .route("/api/config", get(config::show))
        .route("/api/logs", get(logs::tail))
        .route("/api/logs/files", get(logs::files))
        .route("/openapi.json", get(openapi::document))
}

/// An error answer with any status and code.
pub(crate) fn error(
    status: StatusCode,
    message: impl Into<String>,
    code: &'static str,
) -> ApiError {
    let kind = if status.is_server_error() {
        "server_error"
    } else {
        "invalid_request_error"
    };
    ApiError {
        status,
        message: message.into(),
        kind,
        code: Some(code),
        retry_after: None,
    }
}

/// 400 with `code`.
pub(crate) fn bad_request(message: impl Into<String>, code: &'static str) -> ApiError {
    error(StatusCode::BAD_REQUEST, message, code)
}

/// 404 for an id the store does not know.
pub(crate) fn not_found(message: impl Into<String>, code: &'static str) -> ApiError {
    error(StatusCode::NOT_FOUND, message, code)
}

/// A store failure as an answer: a busy database is worth a retry (503),
/// an unknown session is the client's 404, the rest is ours (500).
pub(crate) fn store_error(e: StoreError) -> ApiError {
    match e {
        StoreError::NoSuchSession(id) => not_found(
            format!("No session with id {:?}", shown(&id)),
            "session_not_found",
        ),
        StoreError::InvalidId(e) => bad_request(format!("Invalid id: {e}"), "invalid_id"),
        StoreError::Busy => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "The database is busy; try again",
            "store_busy",
        ),
        StoreError::Conflict(m) => error(StatusCode::CONFLICT, m, "conflict"),
        other => {
            tracing::warn!(error = %other, "a REST request failed in the store");
            ApiError::internal(format!("The store failed: {other}"))
        }
    }
}

/// The gateway's parts, or 503 saying why there are none.
pub(crate) fn gateway(state: &AppState) -> Result<&GatewayServices, ApiError> {
    state.gateway.get().map(Arc::as_ref).ok_or_else(|| {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "This API server runs without a gateway, so it has no cron jobs, pairing, \
             platform status or configuration report; run it with `talaria gateway run`",
            "gateway_unavailable",
        )
    })
}

/// A client's text cut short for a message, so an error stays one
/// readable line.
pub(crate) fn shown(text: &str) -> String {
    text.chars().take(100).collect()
}

/// The body as `T`: 400 when it is not JSON of that shape (unknown fields
/// included, so a misspelt field is not silently ignored). An empty body
/// reads as `{}`.
pub(crate) fn json_body<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    let text: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    serde_json::from_slice(text).map_err(|e| {
        bad_request(
            format!("The request body is not valid: {e}"),
            "invalid_body",
        )
    })
}

/// The path's one parameter, checked to be a safe id.
pub(crate) fn path_id(
    path: Result<axum::extract::Path<String>, PathRejection>,
) -> Result<String, ApiError> {
    let axum::extract::Path(id) = path.map_err(|e| bad_request(e.body_text(), "invalid_path"))?;
    talaria_core::ids::validate_path_component(&id)
        .map_err(|e| bad_request(format!("Invalid id {:?}: {e}", shown(&id)), "invalid_id"))?;
    Ok(id)
}

/// The query string's parameters.
pub(crate) type Params = std::collections::HashMap<String, String>;

/// The query's parameters, or 400.
pub(crate) fn query(
    query: Result<axum::extract::Query<Params>, QueryRejection>,
) -> Result<Params, ApiError> {
    query
        .map(|q| q.0)
        .map_err(|e| bad_request(e.body_text(), "invalid_query"))
}

/// A whole-number parameter within `0..=max`, `default` when absent.
pub(crate) fn count_param(
    params: &Params,
    name: &str,
    default: usize,
    max: usize,
) -> Result<usize, ApiError> {
    let Some(raw) = params.get(name) else {
        return Ok(default);
    };
    match raw.trim().parse::<usize>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(bad_request(
            format!("`{name}` must be a whole number from 0 to {max}"),
            "invalid_query",
        )),
    }
}

/// Micro-dollars as dollars.
pub(crate) fn usd(micros: u64) -> f64 {
    micros as f64 / 1_000_000.0
}
