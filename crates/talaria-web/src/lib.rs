//! The web, made safe to hand to a chat.
//!
//! # Layout
//!
//! - [`guard`]: [`UrlGuard`], which addresses a fetch a chat can steer may
//!   reach, decided on resolved addresses; the HTTP client that connects
//!   only to what it checked.
//! - [`browser`]: [`browser::Browser`], headless Chromium over the DevTools protocol
//!   for the `browser_*` tools, one context per conversation, every request
//!   it makes through the guard.
//! - [`fetch`]: [`Fetcher`], a GET through the guard within limits of
//!   redirects, bytes and time.
//! - [`extract`]: [`Extractor`], a page made readable: HTML to Markdown
//!   through a readability pass, PDFs to text, bounded.
//! - [`search`]: [`Searcher`], `web_search`'s services (SearXNG, Brave,
//!   Tavily, Exa, Firecrawl) reduced to title, URL and snippet.
#![forbid(unsafe_code)]

pub mod browser;
pub mod extract;
pub mod fetch;
pub mod guard;
pub mod search;

pub use extract::{ExtractError, Extractor, Page};
pub use fetch::{FetchError, Fetched, Fetcher, Limits, Oversize};
pub use guard::{GuardError, UrlGuard};
pub use search::{SearchError, SearchHit, Searcher};
