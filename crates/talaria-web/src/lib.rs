//! The web, made safe to hand to a chat.
//!
//! # Layout
//!
//! - [`guard`]: [`UrlGuard`], which addresses a fetch a chat can steer may
//!   reach, decided on resolved addresses; the HTTP client that connects
//!   only to what it checked.
//! - [`fetch`]: [`Fetcher`], a GET through the guard within limits of
//!   redirects, bytes and time.
//! - [`search`]: [`Searcher`], `web_search`'s services (SearXNG, Brave,
//!   Tavily, Exa, Firecrawl) reduced to title, URL and snippet.
#![forbid(unsafe_code)]

pub mod fetch;
pub mod guard;
pub mod search;

pub use fetch::{FetchError, Fetched, Fetcher, Limits, Oversize};
pub use guard::{GuardError, UrlGuard};
pub use search::{SearchError, SearchHit, Searcher};
