//! `web_search`'s services: SearXNG, Brave Search, Tavily, Exa and
//! Firecrawl, each reduced to title, URL and snippet.
//!
//! The service is the operator's choice, set in `web.search`, so its
//! address is trusted and not put through the [`crate::UrlGuard`]: a
//! self-hosted SearXNG usually lives on the operator's own network. What
//! it answers is not trusted: results are text for the model, never
//! fetched by this module.

use std::fmt;
use std::time::Duration;

use serde_json::{Value, json};
use talaria_core::config::{Env, SearchBackend, WebSearchConfig};

/// One result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchHit {
    /// The page's title.
    pub title: String,
    /// Where it is.
    pub url: String,
    /// What the service quotes from it, without markup.
    pub snippet: String,
}

/// Why a search failed, in words for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SearchError {
    /// The service is not configured well enough to ask.
    NotConfigured(String),
    /// The service says to slow down.
    RateLimited {
        /// The service's name.
        service: &'static str,
        /// Seconds it asked to wait, when it said.
        retry_after: Option<u64>,
    },
    /// The service refused the key.
    Unauthorized {
        /// The service's name.
        service: &'static str,
    },
    /// Any other failure the service reported, or no answer.
    Failed {
        /// The service's name.
        service: &'static str,
        /// What happened.
        detail: String,
    },
}

impl fmt::Display for SearchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SearchError::NotConfigured(e) => f.write_str(e),
            SearchError::RateLimited {
                service,
                retry_after,
            } => {
                write!(f, "{service} is rate limiting searches")?;
                match retry_after {
                    Some(s) => write!(f, "; it asks to wait {s} s before the next one"),
                    None => f.write_str("; wait before searching again"),
                }
            }
            SearchError::Unauthorized { service } => write!(
                f,
                "{service} refused the API key (web.search.api_key or its environment variable)"
            ),
            SearchError::Failed { service, detail } => {
                write!(f, "{service} search failed: {detail}")
            }
        }
    }
}

impl std::error::Error for SearchError {}

/// A configured search service.
#[derive(Debug, Clone)]
pub struct Searcher {
    backend: SearchBackend,
    base_url: String,
    key: Option<String>,
    client: reqwest::Client,
    default_results: usize,
}

/// Most results one search returns, whatever the model asks.
pub const MAX_RESULTS: usize = 20;

/// Longest snippet kept, in characters.
const SNIPPET_CHARS: usize = 400;

impl Searcher {
    /// The service `web.search` names, with its key from the section or
    /// the environment. `Ok(None)` when no service is chosen and none can
    /// be inferred (no `SEARXNG_URL`, no service key set).
    ///
    /// # Errors
    /// A chosen service that lacks its address or key.
    pub fn from_config(
        config: &WebSearchConfig,
        env: &Env,
    ) -> Result<Option<Searcher>, SearchError> {
        let var = |name: &str| {
            env.get(name)
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let backend = match config.backend {
            Some(b) => b,
            None => {
                let inferred = if config.base_url.is_some() || var("SEARXNG_URL").is_some() {
                    Some(SearchBackend::Searxng)
                } else {
                    [
                        SearchBackend::Brave,
                        SearchBackend::Tavily,
                        SearchBackend::Exa,
                        SearchBackend::Firecrawl,
                    ]
                    .into_iter()
                    .find(|b| b.key_variable().and_then(var).is_some())
                };
                match inferred {
                    Some(b) => b,
                    None => return Ok(None),
                }
            }
        };
        let base_url = config
            .base_url
            .clone()
            .or_else(|| (backend == SearchBackend::Searxng).then(|| var("SEARXNG_URL")).flatten())
            .or_else(|| backend.default_base_url().map(str::to_owned))
            .ok_or_else(|| {
                SearchError::NotConfigured(
                    "web.search.backend is searxng but no instance is named: set web.search.base_url \
                     (or SEARXNG_URL) to its address"
                        .to_owned(),
                )
            })?;
        let key = config
            .api_key
            .as_ref()
            .map(|k| k.expose().to_owned())
            .or_else(|| backend.key_variable().and_then(var));
        if key.is_none()
            && let Some(name) = backend.key_variable()
        {
            return Err(SearchError::NotConfigured(format!(
                "web.search.backend is {} but it has no key: set web.search.api_key or {name}",
                backend.as_str()
            )));
        }
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("Talaria/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| {
                SearchError::NotConfigured(format!("cannot start the HTTP client: {e}"))
            })?;
        Ok(Some(Searcher {
            backend,
            base_url: base_url.trim_end_matches('/').to_owned(),
            key,
            client,
            default_results: config.max_results,
        }))
    }

    /// The service's name, as written in `web.search.backend`.
    pub fn backend(&self) -> SearchBackend {
        self.backend
    }

    /// Results the model gets when it does not say.
    pub fn default_results(&self) -> usize {
        self.default_results
    }

    /// Searches for `query`, at most `limit` results (1 to
    /// [`MAX_RESULTS`]).
    ///
    /// # Errors
    /// [`SearchError`], with the service's own message where it gave one.
    pub async fn search(&self, query: &str, limit: usize) -> Result<Vec<SearchHit>, SearchError> {
        let limit = limit.clamp(1, MAX_RESULTS);
        let key = self.key.as_deref().unwrap_or_default();
        let base = &self.base_url;
        let request = match self.backend {
            SearchBackend::Searxng => self
                .client
                .get(format!("{base}/search"))
                .query(&[("q", query), ("format", "json")]),
            SearchBackend::Brave => self
                .client
                .get(format!("{base}/res/v1/web/search"))
                .query(&[("q", query), ("count", &limit.to_string())])
                .header("X-Subscription-Token", key),
            SearchBackend::Tavily => self
                .client
                .post(format!("{base}/search"))
                .bearer_auth(key)
                .json(&json!({"query": query, "max_results": limit})),
            SearchBackend::Exa => self
                .client
                .post(format!("{base}/search"))
                .header("x-api-key", key)
                .json(&json!({
                    "query": query,
                    "numResults": limit,
                    "contents": {"text": {"maxCharacters": SNIPPET_CHARS}},
                })),
            SearchBackend::Firecrawl => self
                .client
                .post(format!("{base}/v2/search"))
                .bearer_auth(key)
                .json(&json!({"query": query, "limit": limit})),
        };
        let body = self.send(request).await?;
        let mut hits = self.parse(&body)?;
        hits.truncate(limit);
        Ok(hits)
    }

    fn service(&self) -> &'static str {
        match self.backend {
            SearchBackend::Searxng => "SearXNG",
            SearchBackend::Brave => "Brave Search",
            SearchBackend::Tavily => "Tavily",
            SearchBackend::Exa => "Exa",
            SearchBackend::Firecrawl => "Firecrawl",
        }
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value, SearchError> {
        let service = self.service();
        let failed = |detail: String| SearchError::Failed { service, detail };
        let response = request
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| failed(e.without_url().to_string()))?;
        let status = response.status();
        // `Retry-After`, or Brave's `X-RateLimit-Reset` (seconds until each
        // window resets, the shortest window first).
        let header_secs = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(',').next())
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let retry_after = header_secs("retry-after").or_else(|| header_secs("x-ratelimit-reset"));
        // Bounded: a search answer is small, and a service gone wrong must
        // not fill memory.
        let bytes = read_bounded(response, 4 * 1024 * 1024)
            .await
            .map_err(&failed)?;
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Err(SearchError::RateLimited {
                service,
                retry_after,
            });
        }
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            if self.backend == SearchBackend::Searxng {
                return Err(failed(format!(
                    "HTTP {} (is `json` listed under search.formats in the instance's settings.yml?)",
                    status.as_u16()
                )));
            }
            return Err(SearchError::Unauthorized { service });
        }
        if !status.is_success() {
            return Err(failed(format!(
                "HTTP {}{}",
                status.as_u16(),
                service_message(&bytes)
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            )));
        }
        serde_json::from_slice(&bytes).map_err(|e| failed(format!("the answer is not JSON ({e})")))
    }

    fn parse(&self, body: &Value) -> Result<Vec<SearchHit>, SearchError> {
        let (list, snippet_key) = match self.backend {
            SearchBackend::Searxng => (body.get("results"), "content"),
            SearchBackend::Brave => (body.pointer("/web/results"), "description"),
            SearchBackend::Tavily => (body.get("results"), "content"),
            SearchBackend::Exa => (body.get("results"), "text"),
            SearchBackend::Firecrawl => (body.pointer("/data/web"), "description"),
        };
        let list = match list {
            Some(Value::Array(items)) => items,
            // Brave answers a query with no web results without `web`.
            None if self.backend == SearchBackend::Brave => return Ok(Vec::new()),
            _ => {
                return Err(SearchError::Failed {
                    service: self.service(),
                    detail: "the answer has no list of results".to_owned(),
                });
            }
        };
        let text = |item: &Value, key: &str| {
            item.get(key)
                .and_then(Value::as_str)
                .map(|s| clean(s, SNIPPET_CHARS))
                .unwrap_or_default()
        };
        Ok(list
            .iter()
            .filter_map(|item| {
                let url = item.get("url").and_then(Value::as_str)?.trim().to_owned();
                if url.is_empty() {
                    return None;
                }
                Some(SearchHit {
                    title: text(item, "title"),
                    url,
                    snippet: text(item, snippet_key),
                })
            })
            .collect())
    }
}

/// Reads a response body, failing past `limit` bytes.
async fn read_bounded(response: reqwest::Response, limit: usize) -> Result<Vec<u8>, String> {
    use futures::StreamExt;
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| e.without_url().to_string())?;
        if body.len() + chunk.len() > limit {
            return Err(format!("the answer is larger than {} bytes", limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The message a service put in its error body (`error`, `message`,
/// `detail`), short.
fn service_message(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let m = ["error", "message", "detail"]
        .iter()
        .find_map(|k| match v.get(*k) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Object(o)) => o
                .get("message")
                .or_else(|| o.get("detail"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            _ => None,
        })?;
    Some(clean(&m, 200))
}

/// Text without markup (Brave wraps matches in `<strong>`), entities
/// decoded, whitespace folded, cut to `max` characters.
fn clean(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max * 4));
    let mut in_tag = false;
    for c in s.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    let out = crate::extract::decode_entities(&out);
    let folded = out.split_whitespace().collect::<Vec<_>>().join(" ");
    match folded.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &folded[..cut]),
        None => folded,
    }
}

/// The results as the model reads them: numbered, title, URL, snippet.
pub fn render(query: &str, hits: &[SearchHit]) -> String {
    if hits.is_empty() {
        return format!("No results for \"{query}\".");
    }
    let mut out = format!("Results for \"{query}\":\n");
    for (i, h) in hits.iter().enumerate() {
        out.push_str(&format!("\n{}. {}\n   {}\n", i + 1, h.title, h.url));
        if !h.snippet.is_empty() {
            out.push_str(&format!("   {}\n", h.snippet));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snippets_lose_markup_and_length() {
        assert_eq!(
            clean("a <strong>bold</strong>\n  move &amp; more", 100),
            "a bold move & more"
        );
        assert_eq!(clean("abcdef", 3), "abc…");
    }
}
