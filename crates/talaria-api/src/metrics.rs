//! `GET /metrics`: the gateway's numbers in Prometheus' text format.
//!
//! Behind the API key like the other routes (a scrape config sends it as
//! `authorization: { credentials: ... }`), unless `metrics.public` is set
//! on a loopback listener.

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::auth::has_key;
use super::error::ApiError;

/// The text format's media type, version 0.0.4.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

pub(crate) async fn scrape(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if !state.metrics_public && !has_key(&state, &headers) {
        return ApiError::invalid_key().into_response();
    }
    let Some(render) = state.gateway.get().and_then(|g| g.metrics.clone()) else {
        return ApiError::unavailable(
            "metrics are recorded by `talaria gateway run`; this server runs without them",
        )
        .into_response();
    };
    ([(CONTENT_TYPE, TEXT_FORMAT)], render()).into_response()
}
