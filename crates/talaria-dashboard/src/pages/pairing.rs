//! Pairing: who asked to talk to the bot (never their code: the operator
//! types the code the user was given), who is approved, which platforms
//! are locked after wrong codes.

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
use crate::view::{self, Frame, text, when_value};

pub(crate) struct Person {
    platform: String,
    user_id: String,
    user_name: String,
    at: String,
}

pub(crate) struct Lockout {
    platform: String,
    until: String,
}

pub(crate) struct Pairing {
    pending: Vec<Person>,
    approved: Vec<Person>,
    lockouts: Vec<Lockout>,
}

#[derive(Template)]
#[template(path = "pairing.html")]
struct PairingPage {
    frame: Frame,
    pairing: Shown<Pairing>,
}

view::framed!(PairingPage);

fn people(list: &Value, at: &str) -> Vec<Person> {
    list.as_array()
        .map(|a| {
            a.iter()
                .map(|p| Person {
                    platform: text(p, "platform"),
                    user_id: text(p, "user_id"),
                    user_name: text(p, "user_name"),
                    at: when_value(&p[at]),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `GET /ui/pairing`.
pub(crate) async fn page(
    State(ui): State<Arc<Ui>>,
    Extension(login): Extension<Login>,
    headers: HeaderMap,
) -> Response {
    let pairing = ui
        .api
        .get("/api/pairing")
        .await
        .map(|v| Pairing {
            pending: people(&v["pending"], "expires_at"),
            approved: people(&v["approved"], "approved_at"),
            lockouts: v["lockouts"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|l| Lockout {
                            platform: text(l, "platform"),
                            until: when_value(&l["until"]),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .map_err(|e| e.to_string());
    view::render(&PairingPage {
        frame: Frame::new("pairing", "Pairing", &login, &headers),
        pairing,
    })
}

/// `POST /ui/pairing/{approve|deny|revoke}` with `platform` and `code`
/// (approve) or `user_id`.
pub(crate) async fn act(
    State(ui): State<Arc<Ui>>,
    Path(action): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let fields = Fields::parse(&body);
    let platform = fields.text("platform").unwrap_or("").to_owned();
    let (request, done) = match action.as_str() {
        "approve" => {
            let code = fields.text("code").unwrap_or("").to_owned();
            (json!({"platform": platform, "code": code}), "Approved")
        }
        "deny" | "revoke" => {
            let user = fields.text("user_id").unwrap_or("").to_owned();
            let done = if action == "deny" {
                "Denied"
            } else {
                "Revoked"
            };
            (json!({"platform": platform, "user_id": user}), done)
        }
        _ => {
            return view::after_change("/ui/pairing", Err(format!("Unknown action {action:?}.")));
        }
    };
    let outcome = ui
        .api
        .send(Method::POST, &format!("/api/pairing/{action}"), request)
        .await
        .map(|v| {
            let who = [text(&v, "user_name"), text(&v, "user_id")]
                .into_iter()
                .find(|s| !s.is_empty())
                .unwrap_or_default();
            format!("{done} {who} on {platform}.")
        })
        .map_err(|e| e.message);
    view::after_change("/ui/pairing", outcome)
}
