//! The API, called in-process: pages read and change everything through
//! the API server's own routes (with its key), so the dashboard can do
//! nothing the API cannot, and `/ui/api/...` lets the page's script use
//! the same routes with the login instead of the key.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use talaria_core::Secret;
use tower::ServiceExt;

use crate::Ui;

/// Largest API answer a page reads (a page of messages with long tool
/// results is the biggest).
const MAX_ANSWER_BYTES: usize = 32 * 1024 * 1024;

/// Why an API call gave no usable answer, in the API's words.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status.as_u16())
    }
}

/// The API server's router and its key.
pub(crate) struct Api {
    router: Router,
    key: HeaderValue,
}

impl Api {
    pub(crate) fn new(router: Router, key: Secret) -> Api {
        let key = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
            .unwrap_or_else(|_| HeaderValue::from_static(""));
        Api { router, key }
    }

    /// `GET path` (with its query), as JSON.
    pub(crate) async fn get(&self, path: &str) -> Result<Value, Failure> {
        self.call(Method::GET, path, None).await
    }

    /// `method path` with a JSON body, as JSON.
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        body: Value,
    ) -> Result<Value, Failure> {
        self.call(method, path, Some(body)).await
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Failure> {
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::AUTHORIZATION, self.key.clone());
        let body = match body {
            Some(body) => {
                request = request.header(header::CONTENT_TYPE, "application/json");
                Body::from(body.to_string())
            }
            None => Body::empty(),
        };
        let request = request.body(body).map_err(|e| Failure {
            status: StatusCode::BAD_REQUEST,
            message: format!("cannot ask the API for {path}: {e}"),
        })?;
        let response = self.forward(request).await;
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), MAX_ANSWER_BYTES)
            .await
            .map_err(|e| Failure {
                status: StatusCode::BAD_GATEWAY,
                message: format!("the API's answer could not be read: {e}"),
            })?;
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(value);
        }
        let message = value
            .pointer("/error/message")
            .and_then(Value::as_str)
            .map_or_else(
                || String::from_utf8_lossy(&bytes).chars().take(300).collect(),
                str::to_owned,
            );
        Err(Failure { status, message })
    }

    /// Sends `request` to the API's router as it is (the caller set the
    /// key) and answers with what it answers, streams included.
    async fn forward(&self, request: Request) -> Response {
        match self.router.clone().oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }
}

/// `/ui/api/{path}`: the API route `/{path}` for the page's script, with
/// the login (checked by the guard) standing in for the key. The cookie
/// and the CSRF header are not passed on.
pub(crate) async fn pass_through(State(ui): State<Arc<Ui>>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let Some(rest) = parts
        .uri
        .path_and_query()
        .and_then(|p| p.as_str().strip_prefix("/ui/api"))
        .map(str::to_owned)
    else {
        return StatusCode::NOT_FOUND.into_response();
    };
    parts.uri = match rest.parse() {
        Ok(uri) => uri,
        Err(_) => return StatusCode::BAD_REQUEST.into_response(),
    };
    // The dashboard's route left its own path parameters (and the login)
    // in the extensions; the API's router must match afresh.
    parts.extensions = axum::http::Extensions::new();
    parts.headers.remove(header::COOKIE);
    parts.headers.remove("x-csrf-token");
    parts
        .headers
        .insert(header::AUTHORIZATION, ui.api.key.clone());
    ui.api.forward(Request::from_parts(parts, body)).await
}
