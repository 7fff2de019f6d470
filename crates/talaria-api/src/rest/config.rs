//! `GET /api/config`: the configuration as `talaria config show` prints it
//! (the file merged over the defaults, the environment's values filled
//! in, secrets masked) with what `talaria config check` finds in it.
//!
//! The report is made by the binary, which knows every crate's section
//! (`GatewayServices::config_report`); this route only runs it off the
//! async threads, since it reads the files anew for every request.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::gateway;
use crate::AppState;
use crate::error::ApiError;

/// `GET /api/config`: `{object, path, config, from_env, model, platforms,
/// findings: {errors, warnings}}`, or 503 without a gateway.
pub(super) async fn show(State(state): State<Arc<AppState>>) -> Response {
    let report = match gateway(&state) {
        Ok(services) => services.config_report.clone(),
        Err(e) => return e.into_response(),
    };
    match tokio::task::spawn_blocking(move || report()).await {
        Ok(mut report) => {
            if let Value::Object(fields) = &mut report {
                fields.insert("object".into(), Value::from("talaria.config"));
            }
            Json(report).into_response()
        }
        Err(e) => ApiError::internal(format!("Cannot read the configuration: {e}")).into_response(),
    }
}
