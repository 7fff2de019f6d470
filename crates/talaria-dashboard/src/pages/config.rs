//! The configuration as `talaria config show` gives it (secrets masked),
//! with what `talaria config check` finds wrong, read from the files at
//! each load of the page.

use std::sync::Arc;

use askama::Template;
use axum::Extension;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::Value;

use super::Shown;
use crate::Ui;
use crate::auth::Login;
use crate::view::{self, Frame, text};

pub(crate) struct FromEnv {
    key: String,
    var: String,
    shown: String,
    origin: String,
    overrode: bool,
}

pub(crate) struct Report {
    file: String,
    errors: Vec<String>,
    warnings: Vec<String>,
    model: String,
    platforms: Vec<String>,
    from_env: Vec<FromEnv>,
    tree: String,
}

#[derive(Template)]
#[template(path = "config.html")]
struct ConfigPage {
    frame: Frame,
    report: Shown<Report>,
}

view::framed!(ConfigPage);

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn report(v: &Value) -> Report {
    let model = &v["model"];
    let model = if model.is_object() {
        format!(
            "{} {} at {} (key: {})",
            text(model, "provider"),
            text(model, "model"),
            text(model, "base_url"),
            model["api_key"].as_str().unwrap_or("none")
        )
    } else {
        String::new()
    };
    Report {
        file: [text(v, "path"), text(v, "config_file")]
            .into_iter()
            .find(|f| !f.is_empty())
            .unwrap_or_default(),
        errors: strings(&v["findings"]["errors"]),
        warnings: strings(&v["findings"]["warnings"]),
        model,
        platforms: strings(&v["platforms"]),
        from_env: v["from_env"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|e| FromEnv {
                        key: text(e, "key"),
                        var: text(e, "var"),
                        shown: text(e, "shown"),
                        origin: text(e, "origin"),
                        overrode: e["overrode"].as_bool().unwrap_or(false),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        tree: match &v["config"] {
            Value::Null => String::new(),
            tree => serde_json::to_string_pretty(tree).unwrap_or_default(),
        },
    }
}

/// `GET /ui/config`.
pub(crate) async fn page(
    State(ui): State<Arc<Ui>>,
    Extension(login): Extension<Login>,
    headers: HeaderMap,
) -> Response {
    let report = ui
        .api
        .get("/api/config")
        .await
        .map(|v| report(&v))
        .map_err(|e| e.to_string());
    view::render(&ConfigPage {
        frame: Frame::new("config", "Configuration", &login, &headers),
        report,
    })
}
