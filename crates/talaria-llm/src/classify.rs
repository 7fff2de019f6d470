//! Maps an HTTP status and error body to an [`ErrorKind`].
//!
//! The status decides most cases; the body disambiguates the ones where
//! providers overload a status (billing behind 402/403/429, context overflow
//! behind 400/500).

use crate::ErrorKind;

/// Phrases providers use when an account is out of money or quota.
const BILLING: &[&str] = &[
    "insufficient credit",
    "insufficient_quota",
    "insufficient quota",
    "insufficient balance",
    "insufficient funds",
    "exceeded your current quota",
    "credit balance is too low",
    "out of credits",
    "billing",
    "payment required",
    "requires more credits",
    "quota exceeded",
];

/// Phrases providers use when the prompt does not fit the context window.
const CONTEXT: &[&str] = &[
    "context length",
    "context_length",
    "context window",
    "maximum context",
    "prompt is too long",
    "prompt too long",
    "input is too long",
    "too many tokens",
    "reduce the length",
    "exceeds the context",
    "exceeds the maximum",
    "maximum number of tokens",
    "context size",
    "n_ctx",
];

const MODEL_MISSING: &[&str] = &[
    "model_not_found",
    "model not found",
    "no such model",
    "unknown model",
    "invalid model",
    "does not exist",
];

const OVERLOADED: &[&str] = &["overloaded", "capacity", "try again later"];

fn mentions(body: &str, phrases: &[&str]) -> bool {
    phrases.iter().any(|p| body.contains(p))
}

/// Whether the body names a billing or quota problem.
pub fn is_billing(body: &str) -> bool {
    mentions(&body.to_ascii_lowercase(), BILLING)
}

/// Whether the body says the prompt is larger than the context window.
pub fn is_context_overflow(body: &str) -> bool {
    mentions(&body.to_ascii_lowercase(), CONTEXT)
}

/// Classifies an HTTP error response.
pub fn classify(status: u16, body: &str) -> ErrorKind {
    let b = body.to_ascii_lowercase();
    match status {
        401 => ErrorKind::Auth,
        402 => {
            // Some gateways use 402 for a temporary spend limit that resets.
            if b.contains("rate limit") || b.contains("try again") {
                ErrorKind::RateLimit
            } else {
                ErrorKind::Billing
            }
        }
        403 if mentions(&b, BILLING) => ErrorKind::Billing,
        403 => ErrorKind::Auth,
        404 => ErrorKind::ModelNotFound,
        408 => ErrorKind::Timeout,
        413 => ErrorKind::PayloadTooLarge,
        // OpenAI reports an exhausted quota as 429; waiting will not help.
        429 if mentions(&b, BILLING) => ErrorKind::Billing,
        429 if b.contains("overloaded") => ErrorKind::Overloaded,
        429 => ErrorKind::RateLimit,
        400 | 422 if mentions(&b, CONTEXT) => ErrorKind::ContextOverflow,
        400 | 422 if mentions(&b, MODEL_MISSING) && b.contains("model") => ErrorKind::ModelNotFound,
        400 | 422 => ErrorKind::FormatError,
        500 | 502 if mentions(&b, CONTEXT) => ErrorKind::ContextOverflow,
        500 | 502 if mentions(&b, OVERLOADED) => ErrorKind::Overloaded,
        503 | 529 => ErrorKind::Overloaded,
        504 => ErrorKind::Timeout,
        500..=599 => ErrorKind::ServerError,
        _ => ErrorKind::Unknown,
    }
}

/// Classifies an Anthropic in-stream `error` event by its `error.type`.
pub fn classify_anthropic_error_type(kind: &str, message: &str) -> ErrorKind {
    match kind {
        "overloaded_error" => ErrorKind::Overloaded,
        "rate_limit_error" => ErrorKind::RateLimit,
        "api_error" => ErrorKind::ServerError,
        "authentication_error" => ErrorKind::Auth,
        "permission_error" => ErrorKind::Auth,
        "billing_error" => ErrorKind::Billing,
        "not_found_error" => ErrorKind::ModelNotFound,
        "request_too_large" => ErrorKind::PayloadTooLarge,
        "timeout_error" => ErrorKind::Timeout,
        "invalid_request_error" if is_context_overflow(message) => ErrorKind::ContextOverflow,
        "invalid_request_error" => ErrorKind::FormatError,
        _ => ErrorKind::Unknown,
    }
}

/// Classifies a transport failure (no HTTP status).
pub fn classify_transport(e: &reqwest::Error) -> ErrorKind {
    if e.is_timeout() {
        ErrorKind::Timeout
    } else if e.is_connect() || e.is_request() || e.is_body() {
        ErrorKind::Network
    } else if e.is_decode() {
        ErrorKind::FormatError
    } else {
        ErrorKind::Unknown
    }
}

/// Whether the same provider may be asked again after this kind of failure.
pub fn is_retryable(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::RateLimit
            | ErrorKind::Overloaded
            | ErrorKind::ServerError
            | ErrorKind::Timeout
            | ErrorKind::Network
            | ErrorKind::Unknown
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ErrorKind::*;

    #[test]
    fn status_and_body_table() {
        let table: &[(u16, &str, ErrorKind)] = &[
            (401, r#"{"error":{"message":"Incorrect API key"}}"#, Auth),
            (403, "forbidden", Auth),
            (
                403,
                "Your credit balance is too low to access the API",
                Billing,
            ),
            (402, "Payment Required", Billing),
            (
                402,
                "spend rate limit reached, try again in 1 minute",
                RateLimit,
            ),
            (404, "The model `gpt-9` does not exist", ModelNotFound),
            (408, "", Timeout),
            (413, "request entity too large", PayloadTooLarge),
            (429, "Rate limit reached for requests", RateLimit),
            (
                429,
                "You exceeded your current quota, please check your plan",
                Billing,
            ),
            (429, "model overloaded", Overloaded),
            (
                400,
                "This model's maximum context length is 8192 tokens",
                ContextOverflow,
            ),
            (
                400,
                "prompt is too long: 210000 tokens > 200000 maximum",
                ContextOverflow,
            ),
            (400, "messages: roles must alternate", FormatError),
            (
                400,
                "model_not_found: the model x does not exist",
                ModelNotFound,
            ),
            (
                500,
                "the request exceeds the available context size",
                ContextOverflow,
            ),
            (500, "internal error", ServerError),
            (502, "bad gateway", ServerError),
            (503, "service unavailable", Overloaded),
            (
                529,
                r#"{"type":"error","error":{"type":"overloaded_error"}}"#,
                Overloaded,
            ),
            (504, "", Timeout),
            (418, "teapot", Unknown),
        ];
        for (status, body, want) in table {
            assert_eq!(classify(*status, body), *want, "{status} {body}");
        }
    }

    #[test]
    fn retryable_kinds() {
        for k in [
            RateLimit,
            Overloaded,
            ServerError,
            Timeout,
            Network,
            Unknown,
        ] {
            assert!(is_retryable(k), "{k:?}");
        }
        for k in [
            Auth,
            Billing,
            ContextOverflow,
            PayloadTooLarge,
            ModelNotFound,
            FormatError,
            Interrupted,
        ] {
            assert!(!is_retryable(k), "{k:?}");
        }
    }

    #[test]
    fn anthropic_error_types() {
        assert_eq!(
            classify_anthropic_error_type("overloaded_error", ""),
            Overloaded
        );
        assert_eq!(
            classify_anthropic_error_type("invalid_request_error", "prompt is too long"),
            ContextOverflow
        );
        assert_eq!(classify_anthropic_error_type("weird", ""), Unknown);
    }
}
