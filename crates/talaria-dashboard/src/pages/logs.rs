//! The logs: the end of a log file, filtered by text and level, read
//! backwards within the API's bounds.

use std::sync::Arc;

use askama::Template;
use axum::Extension;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::Value;

use super::Shown;
use crate::Ui;
use crate::auth::Login;
use crate::form;
use crate::view::{self, Frame, encode, text};

/// The levels offered, most verbose first.
const LEVELS: &[&str] = &["trace", "debug", "info", "warn", "error"];

pub(crate) struct Tail {
    file: String,
    lines: Vec<String>,
    truncated: bool,
}

#[derive(Template)]
#[template(path = "logs.html")]
struct LogsPage {
    frame: Frame,
    files: Vec<String>,
    file: String,
    filter: String,
    level: String,
    lines: usize,
    levels: &'static [&'static str],
    tail: Shown<Tail>,
}

view::framed!(LogsPage);

/// `GET /ui/logs?file=&filter=&level=&lines=`.
pub(crate) async fn page(
    State(ui): State<Arc<Ui>>,
    Extension(login): Extension<Login>,
    Query(query): Query<form::Query>,
    headers: HeaderMap,
) -> Response {
    let get = |name: &str| {
        query
            .get(name)
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    let (file, filter, level) = (get("file"), get("filter"), get("level"));
    let lines: usize = query
        .get("lines")
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(200)
        .min(1000);
    let mut path = format!("/api/logs?lines={lines}");
    for (name, value) in [("file", &file), ("filter", &filter), ("level", &level)] {
        if !value.is_empty() {
            path.push_str(&format!("&{name}={}", encode(value)));
        }
    }
    let (tail, files) = tokio::join!(ui.api.get(&path), ui.api.get("/api/logs/files"));
    let files = files
        .map(|v| {
            v["data"]
                .as_array()
                .map(|a| a.iter().map(|f| text(f, "name")).collect())
                .unwrap_or_default()
        })
        .unwrap_or_default();
    let tail = tail
        .map(|v| Tail {
            file: text(&v, "file"),
            lines: v["lines"]
                .as_array()
                .map(|l| {
                    l.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
            truncated: v["truncated"].as_bool().unwrap_or(false),
        })
        .map_err(|e| e.to_string());
    view::render(&LogsPage {
        frame: Frame::new("logs", "Logs", &login, &headers),
        files,
        file,
        filter,
        level,
        lines,
        levels: LEVELS,
        tail,
    })
}
