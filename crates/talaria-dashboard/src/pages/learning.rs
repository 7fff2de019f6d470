//! The learning log: every change to skills and memory, newest first,
//! who made it and how; any version of a skill's SKILL.md or a memory
//! file it holds can be put back (through `POST /api/learning/rollback`,
//! which the log records too).

use std::sync::Arc;

use askama::Template;
use axum::Extension;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use serde_json::{Map, Value};

use super::Shown;
use crate::Ui;
use crate::auth::Login;
use crate::form::{self, Fields};
use crate::view::{self, Frame, encode, text};

/// Log entries per page.
const PAGE: usize = 50;

pub(crate) struct Change {
    at: String,
    actor: String,
    action: String,
    target: String,
    /// What a restore of this entry's result sends: `skill` or `memory`,
    /// its name, and the version; `None` when there is nothing to put back.
    restore: Option<(String, String, String)>,
}

/// What a rollback names for `target` (`skill:<name>` or
/// `memory:<FILE>.md`), if the API can put it back.
fn restorable(target: &str) -> Option<(String, String)> {
    if let Some(name) = target.strip_prefix("skill:") {
        return (!name.contains('/')).then(|| ("skill".to_owned(), name.to_owned()));
    }
    match target.strip_prefix("memory:")? {
        "MEMORY.md" => Some(("memory".to_owned(), "memory".to_owned())),
        "USER.md" => Some(("memory".to_owned(), "user".to_owned())),
        _ => None,
    }
}

fn change(entry: &Value) -> Change {
    let target = text(entry, "target");
    let after = text(entry, "after");
    let restore = restorable(&target)
        .filter(|_| !after.is_empty())
        .map(|(kind, name)| (kind, name, after));
    Change {
        at: text(entry, "at")
            .replace('T', " ")
            .chars()
            .take(19)
            .collect(),
        actor: text(entry, "actor"),
        action: text(entry, "action"),
        target,
        restore,
    }
}

#[derive(Template)]
#[template(path = "learning.html")]
struct LearningPage {
    frame: Frame,
    target: String,
    changes: Shown<Vec<Change>>,
    previous: Option<String>,
    next: Option<String>,
}

view::framed!(LearningPage);

/// `GET /ui/learning?target=&offset=`.
pub(crate) async fn page(
    State(ui): State<Arc<Ui>>,
    Extension(login): Extension<Login>,
    Query(query): Query<form::Query>,
    headers: HeaderMap,
) -> Response {
    let target = query
        .get("target")
        .map(|t| t.trim().to_owned())
        .unwrap_or_default();
    let offset: usize = query
        .get("offset")
        .and_then(|o| o.trim().parse().ok())
        .unwrap_or(0);
    let mut path = format!("/api/learning?limit={PAGE}&offset={offset}");
    if !target.is_empty() {
        path.push_str(&format!("&target={}", encode(&target)));
    }
    let answer = ui.api.get(&path).await;
    let has_more = answer
        .as_ref()
        .is_ok_and(|v| v["has_more"].as_bool().unwrap_or(false));
    let link = |offset: usize| {
        let mut link = format!("/ui/learning?offset={offset}");
        if !target.is_empty() {
            link.push_str(&format!("&target={}", encode(&target)));
        }
        link
    };
    let page = LearningPage {
        frame: Frame::new("learning", "Learning log", &login, &headers),
        previous: (offset > 0).then(|| link(offset.saturating_sub(PAGE))),
        next: has_more.then(|| link(offset + PAGE)),
        changes: answer
            .map(|v| {
                v["data"]
                    .as_array()
                    .map(|a| a.iter().map(change).collect())
                    .unwrap_or_default()
            })
            .map_err(|e| e.to_string()),
        target,
    };
    view::render(&page)
}

/// `POST /ui/learning/rollback` with `skill` or `memory`, optionally
/// `to` (a version), and `back` (the dashboard page to return to).
pub(crate) async fn rollback(State(ui): State<Arc<Ui>>, body: axum::body::Bytes) -> Response {
    let fields = Fields::parse(&body);
    let mut request = Map::new();
    for key in ["skill", "memory", "to"] {
        if let Some(value) = fields.text(key) {
            request.insert(key.to_owned(), Value::from(value));
        }
    }
    let back = fields
        .text("back")
        .filter(|b| b.starts_with("/ui/") && !b.starts_with("/ui//"))
        .unwrap_or("/ui/learning")
        .to_owned();
    let outcome = ui
        .api
        .send(
            Method::POST,
            "/api/learning/rollback",
            Value::Object(request),
        )
        .await
        .map(|v| {
            let said = text(&v, "message");
            if said.is_empty() {
                "Rolled back.".to_owned()
            } else {
                said
            }
        })
        .map_err(|e| e.message);
    view::after_change(&back, outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_skills_and_memory_files_are_restorable() {
        assert_eq!(
            restorable("skill:deploy"),
            Some(("skill".into(), "deploy".into()))
        );
        assert_eq!(restorable("skill:deploy/notes.md"), None);
        assert_eq!(
            restorable("memory:USER.md"),
            Some(("memory".into(), "user".into()))
        );
        assert_eq!(restorable("memory:OTHER.md"), None);
        assert_eq!(restorable("curator"), None);
    }
}
