//! The chat: the page's script starts a run (`POST /v1/runs`) through
//! the pass-through, follows its event stream, shows the answer as it
//! streams and the approval buttons when a command waits. A chat
//! continues the session it was opened on, or the one its first run
//! created.

use std::sync::Arc;

use askama::Template;
use axum::Extension;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;

use super::Shown;
use super::sessions::{Entry, entries};
use crate::Ui;
use crate::auth::Login;
use crate::form;
use crate::view::{self, Frame, encode};

/// Earlier messages shown above the chat.
const EARLIER: usize = 100;

#[derive(Template)]
#[template(path = "chat.html")]
struct Chat {
    frame: Frame,
    session: String,
    earlier: Shown<Vec<Entry>>,
    more: bool,
}

view::framed!(Chat);

/// `GET /ui/chat?session=`.
pub(crate) async fn page(
    State(ui): State<Arc<Ui>>,
    Extension(login): Extension<Login>,
    Query(query): Query<form::Query>,
    headers: HeaderMap,
) -> Response {
    let session = query
        .get("session")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let (earlier, more) = if session.is_empty() {
        (Ok(Vec::new()), false)
    } else {
        match ui
            .api
            .get(&format!(
                "/api/sessions/{}/messages?limit={EARLIER}",
                encode(&session)
            ))
            .await
        {
            Ok(v) => (
                Ok(entries(v["data"].as_array().map_or(&[][..], Vec::as_slice))),
                v["has_more"].as_bool().unwrap_or(false),
            ),
            Err(e) => (Err(e.to_string()), false),
        }
    };
    let page = Chat {
        frame: Frame::new("chat", "Chat", &login, &headers),
        session,
        earlier,
        more,
    };
    view::render(&page)
}
