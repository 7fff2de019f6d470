//! A JSON-over-HTTP client of one server root, for the services whose
//! requests are plain JSON under a path prefix with an optional bearer
//! token (Mattermost, the Signal REST API, a Matrix homeserver). Each
//! service supplies only how its refusals read.

use std::time::Duration;

use reqwest::Method;
use serde::de::DeserializeOwned;
use serde_json::Value;
use talaria_core::Secret;

use crate::http::{Answer, Http, HttpError, Service};

/// What a service's error answer says, as [`Rest`] reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Refusal {
    /// The service's own error code (`M_FORBIDDEN`), when it gave one.
    pub code: Option<String>,
    /// What it said; empty reads as `HTTP <status>`.
    pub message: String,
    /// The wait it asked for, from its body or headers.
    pub retry_after: Option<Duration>,
}

/// A client bound to one root URL and, where the service has one, a
/// bearer token (sent in a header, scrubbed from every error).
#[derive(Debug, Clone)]
pub(crate) struct Rest {
    http: Http,
    root: String,
    bearer: Option<Secret>,
    read_refusal: fn(&Answer) -> Refusal,
}

impl Rest {
    /// Requests go to `{root}{path}`; a trailing `/` on `root` is dropped.
    pub(crate) fn new(
        service: Service,
        root: &str,
        bearer: Option<&Secret>,
        read_refusal: fn(&Answer) -> Refusal,
    ) -> Result<Rest, String> {
        let mut http = Http::new(service)?;
        if let Some(token) = bearer {
            http = http.hiding(token, "<token>");
        }
        Ok(Rest {
            http,
            root: root.trim_end_matches('/').to_owned(),
            bearer: bearer.cloned(),
            read_refusal,
        })
    }

    /// `GET {root}{path}`.
    pub(crate) async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        timeout: Duration,
    ) -> Result<T, HttpError> {
        self.request(Method::GET, path, &[], None, timeout).await
    }

    /// `POST {root}{path}` with a JSON body.
    pub(crate) async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<T, HttpError> {
        self.request(Method::POST, path, &[], Some(body), timeout)
            .await
    }

    /// `PUT {root}{path}` with a JSON body.
    pub(crate) async fn put<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<T, HttpError> {
        self.request(Method::PUT, path, &[], Some(body), timeout)
            .await
    }

    /// `method {root}{path}?{query}` with an optional JSON body; the
    /// answer decoded, an empty success body (204) read as `null`.
    pub(crate) async fn request<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<T, HttpError> {
        let mut request = self
            .http
            .client()
            .request(method, format!("{}{path}", self.root));
        if let Some(token) = &self.bearer {
            request = request.bearer_auth(token.expose());
        }
        if !query.is_empty() {
            request = request.query(query);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let mut answer = self.http.send(request, timeout).await?;
        if answer.is_success() {
            if answer.body.iter().all(u8::is_ascii_whitespace) {
                answer.body = bytes::Bytes::from_static(b"null");
            }
            return self.http.decode(&answer);
        }
        let Refusal {
            code,
            message,
            retry_after,
        } = (self.read_refusal)(&answer);
        let message = if message.trim().is_empty() {
            format!("HTTP {}", answer.status)
        } else {
            message
        };
        Err(self
            .http
            .refused(answer.status, code, &message, retry_after))
    }
}
