//! `GET /api/logs` (the tail of a log file under `$TALARIA_HOME/logs/`,
//! with a text and a level filter) and `GET /api/logs/files` (the files
//! there with their sizes).
//!
//! The reading is `talaria_core::logs`' (shared with `talaria logs`): a
//! tail is read backwards from the end in chunks, never the whole file,
//! and a search reads at most [`SCAN_LIMIT`] bytes before it gives up and
//! says the answer is truncated. Lines are returned as written: what
//! reaches a log has already passed the secret redactor, so nothing is
//! masked again here.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use talaria_core::logs::{self, GATEWAY_LOG, Level, valid_name};

use super::{Params, bad_request, count_param, not_found, query, shown};
use crate::AppState;
use crate::error::ApiError;

/// Lines returned when the request does not say.
const DEFAULT_LINES: usize = 200;

/// The most lines one request may ask for.
const MAX_LINES: usize = 1000;

/// The most bytes one request reads: a filter that matches little stops
/// here rather than reading a log of gigabytes.
const SCAN_LIMIT: u64 = 16 * 1024 * 1024;

/// The longest `filter` accepted, in characters.
const MAX_FILTER_CHARS: usize = 500;

/// The most files `/api/logs/files` lists.
const MAX_FILES: usize = 500;

/// `GET /api/logs/files`: `{object, data: [{name, size, modified}],
/// has_more}`; an empty list when there is no `logs/` yet.
pub(super) async fn files(State(state): State<Arc<AppState>>) -> Response {
    let dir = state.agent.parts().home.logs_dir();
    let listed = tokio::task::spawn_blocking(move || logs::list(&dir, MAX_FILES)).await;
    let (files, more) = match listed {
        Ok(Ok(listed)) => listed,
        Ok(Err(e)) => {
            return ApiError::internal(format!("Cannot list the log files: {e}")).into_response();
        }
        Err(e) => {
            return ApiError::internal(format!("Cannot list the log files: {e}")).into_response();
        }
    };
    let data: Vec<Value> = files
        .iter()
        .map(|f| json!({"name": f.name, "size": f.size, "modified": f.modified}))
        .collect();
    Json(json!({"object": "list", "data": data, "has_more": more})).into_response()
}

/// `GET /api/logs?lines=N&filter=TEXT&level=LEVEL&file=NAME`: the last
/// `lines` lines (default 200, at most 1000) of `file` (default
/// `gateway.log`, else the log written last) that contain `filter` (any
/// case) and are at `level` or above, oldest first: `{object, file,
/// size, lines, truncated}`. `truncated` says lines before the first one
/// returned were not looked at.
pub(super) async fn tail(
    State(state): State<Arc<AppState>>,
    params: Result<Query<Params>, QueryRejection>,
) -> Response {
    let dir = state.agent.parts().home.logs_dir();
    async move {
        let params = query(params)?;
        let lines = count_param(&params, "lines", DEFAULT_LINES, MAX_LINES)?;
        let filter = match params.get("filter").filter(|f| !f.is_empty()) {
            Some(f) if f.chars().count() > MAX_FILTER_CHARS => {
                return Err(bad_request(
                    format!("`filter` may be at most {MAX_FILTER_CHARS} characters long"),
                    "invalid_query",
                ));
            }
            Some(f) => Some(f.to_lowercase()),
            None => None,
        };
        let level = match params.get("level").filter(|l| !l.trim().is_empty()) {
            Some(raw) => Some(Level::parse(raw).ok_or_else(|| {
                bad_request(
                    format!(
                        "`level` is {:?}; use trace, debug, info, warn or error",
                        shown(raw)
                    ),
                    "invalid_query",
                )
            })?),
            None => None,
        };
        let file = params.get("file").cloned();
        if let Some(name) = &file
            && !valid_name(name)
        {
            return Err(bad_request(
                format!(
                    "`file` must be the name of a file in the logs directory, not a path: {:?}",
                    shown(name)
                ),
                "invalid_log_file",
            ));
        }
        let ask = logs::Query {
            text: filter,
            level,
            ..logs::Query::last(lines, SCAN_LIMIT)
        };
        tokio::task::spawn_blocking(move || read_tail(&dir, file, &ask))
            .await
            .map_err(|e| ApiError::internal(format!("Cannot read the log: {e}")))?
            .map(|v| Json(v).into_response())
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// The tail of the chosen file as the route answers it.
fn read_tail(dir: &Path, file: Option<String>, ask: &logs::Query) -> Result<Value, ApiError> {
    let empty = |name: Option<String>| json!({"object": "talaria.log", "file": name, "size": 0, "lines": [], "truncated": false});
    let name = match file {
        Some(name) => name,
        None => match default_file(dir)
            .map_err(|e| ApiError::internal(format!("Cannot list the log files: {e}")))?
        {
            Some(name) => name,
            None => return Ok(empty(None)),
        },
    };
    let path = dir.join(&name);
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(not_found(
                format!("There is no log file {:?}", shown(&name)),
                "log_not_found",
            ));
        }
        Err(e) => return Err(ApiError::internal(format!("Cannot read the log: {e}"))),
    };
    if !meta.is_file() {
        return Err(bad_request(
            format!(
                "{:?} is not a plain file in the logs directory",
                shown(&name)
            ),
            "invalid_log_file",
        ));
    }
    let opened = File::open(&path)
        .and_then(|f| f.metadata().map(|m| (m.len(), f)))
        .map_err(|e| ApiError::internal(format!("Cannot read the log: {e}")))?;
    let (size, handle) = opened;
    let tail = logs::tail(&handle, size, ask)
        .map_err(|e| ApiError::internal(format!("Cannot read the log: {e}")))?;
    Ok(json!({
        "object": "talaria.log",
        "file": name,
        "size": size,
        "lines": tail.lines,
        "truncated": tail.truncated,
    }))
}

/// `gateway.log` when it is there, else the file written last; `None`
/// when `logs/` holds no file.
fn default_file(dir: &Path) -> io::Result<Option<String>> {
    let (files, _) = logs::list(dir, MAX_FILES)?;
    if files.iter().any(|f| f.name == GATEWAY_LOG) {
        return Ok(Some(GATEWAY_LOG.to_owned()));
    }
    Ok(files
        .into_iter()
        .max_by(|a, b| a.modified.total_cmp(&b.modified))
        .map(|f| f.name))
}
