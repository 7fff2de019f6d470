//! The pages, one module each. A page asks the API for what it shows and
//! renders it; a change is a form post that becomes one API call, then a
//! redirect back with its outcome (post, redirect, get: a reload never
//! repeats a change).

pub(crate) mod chat;
pub(crate) mod config;
pub(crate) mod cron;
pub(crate) mod graph;
pub(crate) mod learning;
pub(crate) mod logs;
pub(crate) mod memory;
pub(crate) mod overview;
pub(crate) mod pairing;
pub(crate) mod sessions;
pub(crate) mod skills;

use axum::response::{IntoResponse, Redirect, Response};

/// `GET /ui`: the overview lives at `/ui/`.
pub(crate) async fn to_overview() -> Response {
    Redirect::permanent("/ui/").into_response()
}

/// A failed read shown in place of what it would have shown.
pub(crate) type Shown<T> = Result<T, String>;
