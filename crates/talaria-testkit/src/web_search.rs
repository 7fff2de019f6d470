//! Fake search services on 127.0.0.1 for `web_search`, built from the
//! services' documentation.
//!
//! [`FakeSearxng`] answers SearXNG's search API
//! (docs.searxng.org, "Search API"): `GET /search?q=…&format=json` (also
//! `POST` with a form) → `{"query", "number_of_results", "results":
//! [{"url", "title", "content", "engine", "score", "category"}],
//! "answers", "corrections", "infoboxes", "suggestions",
//! "unresponsive_engines"}`. An instance without `json` among its
//! `search.formats` answers 403 (`FakeSearxng::without_json`); a missing
//! `q` answers 400.
//!
//! [`FakeBrave`] answers Brave Search's web search API
//! (api-dashboard.search.brave.com, "Web Search"): `GET
//! /res/v1/web/search?q=…&count=…` with `X-Subscription-Token` →
//! `{"type": "search", "query": {"original"}, "web": {"type": "search",
//! "results": [{"type": "search_result", "title", "url", "description",
//! "age"}]}}`, descriptions carrying `<strong>` around matches. A wrong
//! token answers 401 with `{"type": "ErrorResponse", "error": {"code":
//! "SUBSCRIPTION_TOKEN_INVALID", "detail", "status": 401}}`; `count` above
//! 20 answers 422; a rate limit answers 429 with `X-RateLimit-Limit`,
//! `X-RateLimit-Remaining` and `X-RateLimit-Reset` (seconds until each
//! window resets, comma-separated), as the documentation describes.
//!
//! Both record every request ([`SearchRequest`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

/// One request as a fake received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchRequest {
    /// `GET` or `POST`.
    pub method: String,
    /// The query parameters.
    pub query: BTreeMap<String, String>,
    /// The subscription token header, when sent (Brave).
    pub token: Option<String>,
}

#[derive(Default)]
struct Book {
    requests: Vec<SearchRequest>,
    /// The next requests answered 429, with this reset.
    rate_limited: usize,
    json_disabled: bool,
}

#[derive(Clone)]
struct Shared {
    book: Arc<Mutex<Book>>,
    /// (title, url, text) per result.
    results: Arc<Vec<(String, String, String)>>,
    token: Option<String>,
}

impl Shared {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

async fn start(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1 for a fake search service: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("no local address: {e}"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    addr
}

/// The results both fakes answer with: three pages about the query.
fn default_results() -> Vec<(String, String, String)> {
    vec![
        (
            "Rust Programming Language".to_owned(),
            "https://www.rust-lang.org/".to_owned(),
            "A language empowering everyone to build reliable and efficient software.".to_owned(),
        ),
        (
            "The Rust Book".to_owned(),
            "https://doc.rust-lang.org/book/".to_owned(),
            "An introductory book about Rust & its ownership model.".to_owned(),
        ),
        (
            "Rust (programming language) - Wikipedia".to_owned(),
            "https://en.wikipedia.org/wiki/Rust_(programming_language)".to_owned(),
            "Rust is a general-purpose programming language.".to_owned(),
        ),
    ]
}

/// A fake SearXNG instance.
pub struct FakeSearxng {
    addr: SocketAddr,
    shared: Shared,
}

impl FakeSearxng {
    /// Starts one answering with three results.
    pub async fn start() -> FakeSearxng {
        let shared = Shared {
            book: Arc::default(),
            results: Arc::new(default_results()),
            token: None,
        };
        let router = Router::new()
            .route("/search", get(searxng).post(searxng))
            .with_state(shared.clone());
        FakeSearxng {
            addr: start(router).await,
            shared,
        }
    }

    /// The instance's root (`http://127.0.0.1:PORT`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on, answers as an instance without the JSON format: 403.
    pub fn without_json(&self) {
        self.shared.book().json_disabled = true;
    }

    /// What it received.
    pub fn requests(&self) -> Vec<SearchRequest> {
        self.shared.book().requests.clone()
    }
}

async fn searxng(
    State(shared): State<Shared>,
    method: Method,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    shared.book().requests.push(SearchRequest {
        method: method.to_string(),
        query: query.clone(),
        token: None,
    });
    if shared.book().json_disabled && query.get("format").map(String::as_str) == Some("json") {
        return (StatusCode::FORBIDDEN, "403 Forbidden").into_response();
    }
    let Some(q) = query.get("q").filter(|q| !q.is_empty()) else {
        return (StatusCode::BAD_REQUEST, "400 Bad Request").into_response();
    };
    if query.get("format").map(String::as_str) != Some("json") {
        return (
            [(header::CONTENT_TYPE, "text/html")],
            "<html><body>results page</body></html>",
        )
            .into_response();
    }
    let results: Vec<Value> = shared
        .results
        .iter()
        .map(|(title, url, content)| {
            json!({
                "url": url, "title": title, "content": content,
                "engine": "duckduckgo", "engines": ["duckduckgo"],
                "score": 1.0, "category": "general", "positions": [1],
            })
        })
        .collect();
    axum::Json(json!({
        "query": q,
        "number_of_results": 0,
        "results": results,
        "answers": [],
        "corrections": [],
        "infoboxes": [],
        "suggestions": [],
        "unresponsive_engines": [],
    }))
    .into_response()
}

/// A fake Brave Search API.
pub struct FakeBrave {
    addr: SocketAddr,
    shared: Shared,
}

impl FakeBrave {
    /// Starts one that accepts `token` and answers with three results.
    pub async fn start(token: &str) -> FakeBrave {
        let shared = Shared {
            book: Arc::default(),
            results: Arc::new(default_results()),
            token: Some(token.to_owned()),
        };
        let router = Router::new()
            .route("/res/v1/web/search", get(brave))
            .with_state(shared.clone());
        FakeBrave {
            addr: start(router).await,
            shared,
        }
    }

    /// The API's root (`http://127.0.0.1:PORT`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next `n` requests are answered 429.
    pub fn rate_limit(&self, n: usize) {
        self.shared.book().rate_limited = n;
    }

    /// What it received.
    pub fn requests(&self) -> Vec<SearchRequest> {
        self.shared.book().requests.clone()
    }
}

async fn brave(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let token = headers
        .get("x-subscription-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    shared.book().requests.push(SearchRequest {
        method: "GET".to_owned(),
        query: query.clone(),
        token: token.clone(),
    });
    if token != shared.token {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({
                "type": "ErrorResponse",
                "error": {
                    "id": "00000000-0000-0000-0000-000000000000",
                    "status": 401,
                    "code": "SUBSCRIPTION_TOKEN_INVALID",
                    "detail": "The provided subscription token is invalid.",
                    "meta": {"component": "authentication"},
                },
                "time": 0,
            })),
        )
            .into_response();
    }
    {
        let mut book = shared.book();
        if book.rate_limited > 0 {
            book.rate_limited -= 1;
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [
                    ("x-ratelimit-limit", "1, 15000"),
                    ("x-ratelimit-remaining", "0, 14000"),
                    ("x-ratelimit-reset", "1, 1419704"),
                ],
                axum::Json(json!({
                    "type": "ErrorResponse",
                    "error": {"status": 429, "code": "RATE_LIMITED", "detail": "Request rate limit exceeded for plan."},
                })),
            )
                .into_response();
        }
    }
    let Some(q) = query.get("q").filter(|q| !q.is_empty()) else {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(json!({"type": "ErrorResponse", "error": {"status": 422, "code": "VALIDATION", "detail": "Unable to validate request parameter(s)"}})),
        )
            .into_response();
    };
    let count: usize = match query.get("count").map(|c| c.parse::<usize>()) {
        None => 20,
        Some(Ok(n)) if (1..=20).contains(&n) => n,
        Some(_) => {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                axum::Json(json!({"type": "ErrorResponse", "error": {"status": 422, "code": "VALIDATION", "detail": "count must be between 1 and 20"}})),
            )
                .into_response();
        }
    };
    let results: Vec<Value> = shared
        .results
        .iter()
        .take(count)
        .map(|(title, url, text)| {
            json!({
                "type": "search_result",
                "title": title,
                "url": url,
                "description": text.replacen("Rust", "<strong>Rust</strong>", 1).replace('&', "&amp;"),
                "age": "2 days ago",
                "language": "en",
            })
        })
        .collect();
    axum::Json(json!({
        "type": "search",
        "query": {"original": q, "more_results_available": false},
        "mixed": {"type": "mixed", "main": []},
        "web": {"type": "search", "results": results, "family_friendly": true},
    }))
    .into_response()
}
