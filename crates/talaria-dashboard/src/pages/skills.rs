//! Skills: the list, and one skill's SKILL.md in an editor. A save is
//! `skill_manage`'s `edit` through `PUT /api/skills/{name}` (validated,
//! logged); bundled skills are shown read-only.

use std::sync::Arc;

use askama::Template;
use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use serde_json::{Value, json};

use super::Shown;
use crate::Ui;
use crate::auth::Login;
use crate::form::Fields;
use crate::view::{self, Frame, encode, text};

pub(crate) struct SkillRow {
    name: String,
    description: String,
    category: String,
    origin: String,
}

#[derive(Template)]
#[template(path = "skills.html")]
struct List {
    frame: Frame,
    skills: Shown<Vec<SkillRow>>,
}

view::framed!(List);

/// `GET /ui/skills`.
pub(crate) async fn list(
    State(ui): State<Arc<Ui>>,
    Extension(login): Extension<Login>,
    headers: HeaderMap,
) -> Response {
    let skills = ui
        .api
        .get("/v1/skills")
        .await
        .map(|v| {
            v["data"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|s| SkillRow {
                            name: text(s, "name"),
                            description: text(s, "description"),
                            category: text(s, "category"),
                            origin: [text(s, "origin"), text(s, "source")]
                                .into_iter()
                                .find(|o| !o.is_empty())
                                .unwrap_or_default(),
                        })
                        .collect()
                })
                .unwrap_or_default()
        })
        .map_err(|e| e.to_string());
    view::render(&List {
        frame: Frame::new("skills", "Skills", &login, &headers),
        skills,
    })
}

pub(crate) struct Skill {
    description: String,
    origin: String,
    read_only: bool,
    content: String,
    files: Vec<String>,
}

#[derive(Template)]
#[template(path = "skill.html")]
struct Show {
    frame: Frame,
    name: String,
    skill: Shown<Skill>,
}

view::framed!(Show);

/// `GET /ui/skills/{name}`.
pub(crate) async fn show(
    State(ui): State<Arc<Ui>>,
    Extension(login): Extension<Login>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let skill = ui
        .api
        .get(&format!("/api/skills/{}", encode(&name)))
        .await
        .map(|v| Skill {
            description: text(&v, "description"),
            origin: text(&v, "origin"),
            read_only: v["read_only"].as_bool().unwrap_or(true),
            content: text(&v, "content"),
            files: v["files"]
                .as_array()
                .map(|f| {
                    f.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
        })
        .map_err(|e| e.to_string());
    view::render(&Show {
        frame: Frame::new("skills", format!("Skill: {name}"), &login, &headers),
        name,
        skill,
    })
}

/// `POST /ui/skills/{name}` with `content`: the new SKILL.md.
pub(crate) async fn save(
    State(ui): State<Arc<Ui>>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let fields = Fields::parse(&body);
    // Browsers send textarea lines ending in CRLF.
    let content = fields.get("content").unwrap_or("").replace("\r\n", "\n");
    let outcome = ui
        .api
        .send(
            Method::PUT,
            &format!("/api/skills/{}", encode(&name)),
            json!({ "content": content }),
        )
        .await
        .map(|v| {
            let said = text(&v, "message");
            if said.is_empty() {
                format!("Saved {name}.")
            } else {
                said
            }
        })
        .map_err(|e| e.message);
    view::after_change(&format!("/ui/skills/{}", encode(&name)), outcome)
}
