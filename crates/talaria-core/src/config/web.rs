//! `web:` and `browser:`: the web tools, the browser tools, and the guard
//! every fetch a chat can steer goes through.

use super::*;

/// Which service answers `web_search`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchBackend {
    /// A SearXNG instance (self-hosted, keyless): `GET /search?format=json`.
    Searxng,
    /// Brave Search's web search API.
    Brave,
    /// Tavily's search API.
    Tavily,
    /// Exa's search API.
    Exa,
    /// Firecrawl's search endpoint.
    Firecrawl,
}

impl SearchBackend {
    /// The name as written in `web.search.backend`.
    pub fn as_str(self) -> &'static str {
        match self {
            SearchBackend::Searxng => "searxng",
            SearchBackend::Brave => "brave",
            SearchBackend::Tavily => "tavily",
            SearchBackend::Exa => "exa",
            SearchBackend::Firecrawl => "firecrawl",
        }
    }

    /// The service's own root when `web.search.base_url` is unset; SearXNG
    /// has none (it is the operator's own instance).
    pub fn default_base_url(self) -> Option<&'static str> {
        match self {
            SearchBackend::Searxng => None,
            SearchBackend::Brave => Some("https://api.search.brave.com"),
            SearchBackend::Tavily => Some("https://api.tavily.com"),
            SearchBackend::Exa => Some("https://api.exa.ai"),
            SearchBackend::Firecrawl => Some("https://api.firecrawl.dev"),
        }
    }

    /// The environment variable the key is read from when
    /// `web.search.api_key` is unset (the ancestor's names).
    pub fn key_variable(self) -> Option<&'static str> {
        match self {
            SearchBackend::Searxng => None,
            SearchBackend::Brave => Some("BRAVE_API_KEY"),
            SearchBackend::Tavily => Some("TAVILY_API_KEY"),
            SearchBackend::Exa => Some("EXA_API_KEY"),
            SearchBackend::Firecrawl => Some("FIRECRAWL_API_KEY"),
        }
    }
}

/// `web:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WebConfig {
    /// Lets the web tools, the browser and media URLs reach private,
    /// loopback and link-local addresses (a home lab). Cloud metadata
    /// addresses stay refused unless listed in `allow_hosts`.
    pub allow_private: bool,
    /// Hosts reachable even at private addresses: names (`nas.lan`), IP
    /// addresses (`192.168.1.10`) or networks (`10.0.0.0/8`).
    pub allow_hosts: Vec<String>,
    /// `web_search`.
    pub search: WebSearchConfig,
    /// `web_extract`.
    pub extract: WebExtractConfig,
    /// Largest body one fetch reads, in bytes.
    pub max_bytes: u64,
    /// Seconds one fetch may take, redirects included.
    pub timeout_secs: u64,
    /// Redirects one fetch follows.
    pub max_redirects: usize,
}

impl Default for WebConfig {
    fn default() -> WebConfig {
        WebConfig {
            allow_private: false,
            allow_hosts: Vec::new(),
            search: WebSearchConfig::default(),
            extract: WebExtractConfig::default(),
            max_bytes: 10 * 1024 * 1024,
            timeout_secs: 30,
            max_redirects: 5,
        }
    }
}

/// `web.search:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WebSearchConfig {
    /// The service; unset, `web_search` is offered when SearXNG's
    /// `SEARXNG_URL` or one of the services' keys is set.
    pub backend: Option<SearchBackend>,
    /// The service's root (required for SearXNG, else `SEARXNG_URL`).
    pub base_url: Option<String>,
    /// The key; else the service's variable (`BRAVE_API_KEY`, ...).
    pub api_key: Option<Secret>,
    /// Results returned when the model does not say.
    pub max_results: usize,
}

impl Default for WebSearchConfig {
    fn default() -> WebSearchConfig {
        WebSearchConfig {
            backend: None,
            base_url: None,
            api_key: None,
            max_results: 5,
        }
    }
}

/// `web.extract:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WebExtractConfig {
    /// Long pages are summarised by the auxiliary model (`auxiliary.web`,
    /// else the main model) instead of being cut.
    pub summarize: bool,
    /// Characters of one page's text handed to the model.
    pub max_chars: usize,
    /// Pages go through Firecrawl's scrape endpoint instead of being
    /// fetched here (uses `web.search`'s Firecrawl key and root when that
    /// is the backend, else `FIRECRAWL_API_KEY` and its public root).
    pub firecrawl: bool,
}

impl Default for WebExtractConfig {
    fn default() -> WebExtractConfig {
        WebExtractConfig {
            summarize: false,
            max_chars: 50_000,
            firecrawl: false,
        }
    }
}

/// `browser:`: the `browser_*` tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BrowserConfig {
    /// The Chromium (or Chrome) program; found on `PATH` when unset.
    pub chromium_path: Option<PathBuf>,
    /// A browser already running elsewhere, by its DevTools endpoint
    /// (`ws://host:9222/devtools/browser/...` or `http://host:9222`);
    /// no local Chromium is started.
    pub cdp_url: Option<String>,
    /// Seconds a session's browser context stays open unused.
    pub idle_timeout_secs: u64,
    /// Browser contexts open at once; the least recently used one is
    /// closed to make room.
    pub max_contexts: usize,
}

impl Default for BrowserConfig {
    fn default() -> BrowserConfig {
        BrowserConfig {
            chromium_path: None,
            cdp_url: None,
            idle_timeout_secs: 300,
            max_contexts: 4,
        }
    }
}
