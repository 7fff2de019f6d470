//! Memory: both files entry by entry, each editable and removable, a
//! form to add one, and an undo of the file's last change. Every change
//! is the `memory` tool's own operation through `/api/memory`, so the
//! learning log records it.

use std::sync::Arc;

use askama::Template;
use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use serde_json::{Map, Value};

use super::Shown;
use crate::Ui;
use crate::auth::Login;
use crate::form::Fields;
use crate::view::{self, Frame, count, text};

pub(crate) struct Target {
    target: String,
    file: String,
    entries: Vec<String>,
    used: u64,
    limit: u64,
    percent: u64,
}

#[derive(Template)]
#[template(path = "memory.html")]
struct MemoryPage {
    frame: Frame,
    targets: Shown<Vec<Target>>,
    enabled: bool,
}

view::framed!(MemoryPage);

/// `GET /ui/memory`.
pub(crate) async fn page(
    State(ui): State<Arc<Ui>>,
    Extension(login): Extension<Login>,
    headers: HeaderMap,
) -> Response {
    let answer = ui.api.get("/api/memory").await;
    let enabled = answer
        .as_ref()
        .map_or(true, |v| v["enabled"].as_bool().unwrap_or(true));
    let targets = answer
        .map(|v| {
            v["targets"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|t| Target {
                            target: text(t, "target"),
                            file: text(t, "file"),
                            entries: t["entries"]
                                .as_array()
                                .map(|e| {
                                    e.iter()
                                        .filter_map(Value::as_str)
                                        .map(str::to_owned)
                                        .collect()
                                })
                                .unwrap_or_default(),
                            used: count(t, "chars_used"),
                            limit: count(t, "char_limit"),
                            percent: t["usage_percent"].as_f64().unwrap_or(0.0).round() as u64,
                        })
                        .collect()
                })
                .unwrap_or_default()
        })
        .map_err(|e| e.to_string());
    view::render(&MemoryPage {
        frame: Frame::new("memory", "Memory", &login, &headers),
        targets,
        enabled,
    })
}

/// `POST /ui/memory` with the memory tool's `action`, `target`,
/// `content` and `old_text`.
pub(crate) async fn change(State(ui): State<Arc<Ui>>, body: axum::body::Bytes) -> Response {
    let fields = Fields::parse(&body);
    let mut change = Map::new();
    for key in ["action", "target"] {
        change.insert(key.to_owned(), Value::from(fields.text(key).unwrap_or("")));
    }
    // The entry's text is kept as typed (inner spacing matters to the
    // match), trimmed at its ends only.
    for key in ["content", "old_text"] {
        if let Some(value) = fields.get(key).map(str::trim).filter(|v| !v.is_empty()) {
            change.insert(key.to_owned(), Value::from(value));
        }
    }
    let outcome = ui
        .api
        .send(Method::POST, "/api/memory", Value::Object(change))
        .await
        .map(|v| {
            let said = text(&v, "message");
            if said.is_empty() {
                "Saved.".to_owned()
            } else {
                said
            }
        })
        .map_err(|e| e.message);
    view::after_change("/ui/memory", outcome)
}
