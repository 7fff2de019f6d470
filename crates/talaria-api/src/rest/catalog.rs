//! What this server offers: `/v1/capabilities` (with the ancestor's field
//! names), `/v1/skills` (the skills library) and `/v1/toolsets` (the
//! toolsets and which the API server's turns get).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use talaria_core::toolsets::{TOOLSETS, offers};
use talaria_learning::skills::{Library, Origin};

use super::openapi::OPERATIONS;
use crate::AppState;
use crate::error::ApiError;

/// The platform name the API server's turns run as (its
/// `platform_toolsets` entry).
const PLATFORM: &str = "api_server";

/// Whether the server answers `method` on `path`.
fn serves(method: &str, path: &str) -> bool {
    OPERATIONS
        .iter()
        .any(|o| o.method == method && o.path == path)
}

/// `GET /v1/capabilities`: the ancestor's shape (`object`, `platform`,
/// `model`, `auth`, `runtime`, `features`, `endpoints`), the endpoints
/// taken from the OpenAPI description so the two never disagree.
pub(super) async fn capabilities(State(state): State<Arc<AppState>>) -> Response {
    let mut endpoints = Map::new();
    for o in OPERATIONS {
        endpoints.insert(
            o.id.to_owned(),
            json!({"method": o.method.to_ascii_uppercase(), "path": o.path}),
        );
    }
    let features = json!({
        "chat_completions": serves("post", "/v1/chat/completions"),
        "chat_completions_streaming": serves("post", "/v1/chat/completions"),
        "responses_api": serves("post", "/v1/responses"),
        "responses_streaming": serves("post", "/v1/responses"),
        "run_submission": serves("post", "/v1/runs"),
        "run_status": serves("get", "/v1/runs/{id}"),
        "run_events_sse": serves("get", "/v1/runs/{id}/events"),
        "run_stop": serves("post", "/v1/runs/{id}/stop"),
        "run_approval_response": serves("post", "/v1/runs/{id}/approval"),
        "tool_progress_events": true,
        "approval_events": serves("get", "/v1/runs/{id}/events"),
        "session_continuity_header": "X-Talaria-Session-Id",
        "sessions_api": serves("get", "/api/sessions"),
        "session_chat": serves("post", "/api/sessions/{id}/chat"),
        "jobs_api": serves("get", "/api/jobs"),
        "pairing_api": serves("get", "/api/pairing"),
        "skills_api": serves("get", "/v1/skills"),
        "toolsets_api": serves("get", "/v1/toolsets"),
        "openapi": serves("get", "/openapi.json"),
        "gateway": state.gateway.get().is_some(),
        "cors": false,
    });
    Json(json!({
        "object": "talaria.api_server.capabilities",
        "platform": "talaria",
        "version": env!("CARGO_PKG_VERSION"),
        "model": state.agent.parts().provider.model(),
        "auth": {"type": "bearer", "required": true},
        "runtime": {
            "mode": "server_agent",
            "tool_execution": "server",
            "split_runtime": false,
            "description": "Turns run in the server's agent: tools run where the server runs \
                            (or in its configured terminal backend), never on the client.",
        },
        "features": features,
        "endpoints": endpoints,
    }))
    .into_response()
}

/// `GET /v1/skills`: every skill the agent can load (the user's over the
/// bundled ones), sorted by category and name.
pub(super) async fn skills(State(state): State<Arc<AppState>>) -> Response {
    let home = state.agent.parts().home.clone();
    // The library reads folders and files: off the async threads.
    let listed = tokio::task::spawn_blocking(move || Library::new(&home).list()).await;
    let skills = match listed {
        Ok(skills) => skills,
        Err(e) => {
            return ApiError::internal(format!("Cannot list the skills: {e}")).into_response();
        }
    };
    let data: Vec<Value> = skills
        .iter()
        .map(|s| {
            json!({
                "name": s.name,
                "description": s.description,
                "category": s.category,
                "origin": match s.origin {
                    Origin::User => "user",
                    Origin::Bundled => "bundled",
                },
            })
        })
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/toolsets`: each toolset with its tools, whether the API
/// server's turns get it (`platform_toolsets.api_server`; every toolset
/// when unset), and which of its tools this agent actually has.
pub(super) async fn toolsets(State(state): State<Arc<AppState>>) -> Response {
    let parts = state.agent.parts();
    let enabled = parts.config.platform_toolsets.get(PLATFORM);
    let registered = parts.registry.names();
    let data: Vec<Value> = TOOLSETS
        .iter()
        .map(|(name, tools)| {
            let on = match enabled {
                Some(list) => tools.first().is_some_and(|t| offers(list, t)),
                None => true,
            };
            let available: Vec<&str> = tools
                .iter()
                .copied()
                .filter(|t| registered.contains(t))
                .collect();
            json!({
                "name": name,
                "enabled": on,
                "tools": tools,
                "available_tools": available,
            })
        })
        .collect();
    Json(json!({
        "object": "list",
        "platform": PLATFORM,
        "configured": enabled.is_some(),
        "data": data,
    }))
    .into_response()
}
