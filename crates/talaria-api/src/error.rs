//! Errors in the shape OpenAI clients parse:
//! `{"error": {"message", "type", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answer: a status and the OpenAI error object.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    pub(crate) kind: &'static str,
    pub(crate) code: Option<&'static str>,
    /// Seconds for a `Retry-After` header, when the client should retry.
    pub(crate) retry_after: Option<u64>,
}

impl ApiError {
    /// An error of any status, for answers the helpers below do not cover.
    pub(crate) fn new(
        status: StatusCode,
        message: impl Into<String>,
        kind: &'static str,
        code: Option<&'static str>,
    ) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            code,
            retry_after: None,
        }
    }

    /// 429: the session is running a turn on another node and did not
    /// come free within `waited`; retry after about as long.
    pub(crate) fn session_busy(waited: std::time::Duration) -> ApiError {
        ApiError {
            retry_after: Some(waited.as_secs().max(1)),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "This session is running a turn on another node and was not free within {} s; try again later",
                    waited.as_secs()
                ),
                "rate_limit_error",
                Some("session_busy"),
            )
        }
    }

    /// 400 for a request the client must fix.
    pub(crate) fn bad_request(message: impl Into<String>, code: &'static str) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            message,
            "invalid_request_error",
            Some(code),
        )
    }

    /// 401: missing or wrong bearer key. The same answer for both, so a
    /// caller learns nothing about which it was.
    pub(crate) fn invalid_key() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "Invalid API key",
            "invalid_request_error",
            Some("invalid_api_key"),
        )
    }

    /// 404 for an unknown route.
    pub(crate) fn not_found() -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "Not found",
            "invalid_request_error",
            Some("not_found"),
        )
    }

    /// 404 for a model this server does not serve.
    pub(crate) fn model_not_found(id: &str) -> ApiError {
        // The id comes from the client: quoted with escapes, cut short, so
        // the message stays one readable line.
        let shown: String = id.chars().take(100).collect();
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("The model {shown:?} does not exist"),
            "invalid_request_error",
            Some("model_not_found"),
        )
    }

    /// 413: the body is over `limit` bytes.
    pub(crate) fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("Request body is larger than {limit} bytes"),
            "invalid_request_error",
            Some("request_too_large"),
        )
    }

    /// 429: the concurrency cap is reached.
    pub(crate) fn too_many_runs() -> ApiError {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "Too many concurrent runs; try again later",
            "rate_limit_error",
            Some("rate_limit_exceeded"),
        )
    }

    /// 500: something on our side (the store, a crashed task).
    pub(crate) fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            message,
            "server_error",
            Some("internal_error"),
        )
    }

    /// 503: the server is stopping and takes no new turn.
    pub(crate) fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            message,
            "server_error",
            Some("shutting_down"),
        )
    }

    /// 502: the turn ended without an answer (the model failed).
    pub(crate) fn incomplete(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            message,
            "server_error",
            Some("agent_incomplete"),
        )
    }

    /// The JSON body, also used inside a stream's final chunk.
    pub(crate) fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs),
            );
        }
        response
    }
}
