//! `web_search`'s services against fakes built from their documentation:
//! SearXNG and Brave Search on 127.0.0.1.

use talaria_core::config::{Env, SearchBackend, WebSearchConfig};
use talaria_testkit::web_search::{FakeBrave, FakeSearxng};
use talaria_web::search::render;
use talaria_web::{SearchError, Searcher};

fn env(vars: &[(&str, &str)]) -> Env {
    Env::from_pairs(vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())))
}

fn searcher(config: WebSearchConfig, env: &Env) -> Searcher {
    Searcher::from_config(&config, env)
        .expect("configured")
        .expect("a service")
}

#[tokio::test]
async fn searxng_answers_title_url_and_snippet() {
    let fake = FakeSearxng::start().await;
    // SEARXNG_URL alone chooses SearXNG.
    let s = searcher(
        WebSearchConfig::default(),
        &env(&[("SEARXNG_URL", &fake.base_url())]),
    );
    assert_eq!(s.backend(), SearchBackend::Searxng);
    let hits = s.search("rust language", 2).await.expect("results");
    assert_eq!(hits.len(), 2);
    assert_eq!(hits[0].title, "Rust Programming Language");
    assert_eq!(hits[0].url, "https://www.rust-lang.org/");
    assert!(hits[0].snippet.starts_with("A language empowering"));
    let req = &fake.requests()[0];
    assert_eq!(
        req.query.get("q").map(String::as_str),
        Some("rust language")
    );
    assert_eq!(req.query.get("format").map(String::as_str), Some("json"));
    let text = render("rust language", &hits);
    assert!(
        text.contains("1. Rust Programming Language\n   https://www.rust-lang.org/"),
        "{text}"
    );

    fake.without_json();
    let e = s.search("rust", 5).await.expect_err("403");
    assert!(e.to_string().contains("search.formats"), "{e}");
}

#[tokio::test]
async fn brave_sends_its_token_and_reports_limits_and_bad_keys() {
    let fake = FakeBrave::start("brave-token").await;
    let config = WebSearchConfig {
        backend: Some(SearchBackend::Brave),
        base_url: Some(fake.base_url()),
        ..WebSearchConfig::default()
    };
    let s = searcher(config.clone(), &env(&[("BRAVE_API_KEY", "brave-token")]));
    let hits = s.search("rust", 5).await.expect("results");
    assert_eq!(hits.len(), 3);
    // Markup and entities are gone from snippets.
    assert_eq!(
        hits[1].snippet,
        "An introductory book about Rust & its ownership model."
    );
    let req = &fake.requests()[0];
    assert_eq!(req.token.as_deref(), Some("brave-token"));
    assert_eq!(req.query.get("count").map(String::as_str), Some("5"));

    // More than the service allows is clamped, not refused.
    assert!(s.search("rust", 50).await.is_ok());
    assert_eq!(
        fake.requests()[1].query.get("count").map(String::as_str),
        Some("20")
    );

    fake.rate_limit(1);
    match s.search("rust", 5).await {
        Err(e @ SearchError::RateLimited { .. }) => {
            assert!(e.to_string().contains("wait 1 s"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(s.search("rust", 5).await.is_ok(), "the limit passed");

    let wrong = searcher(config.clone(), &env(&[("BRAVE_API_KEY", "wrong")]));
    let e = wrong.search("rust", 5).await.expect_err("401");
    assert!(matches!(e, SearchError::Unauthorized { .. }), "{e:?}");
    assert!(
        e.to_string().contains("BRAVE") || e.to_string().contains("api_key"),
        "{e}"
    );

    // No key at all: said before any request.
    let e = Searcher::from_config(&config, &env(&[])).expect_err("no key");
    assert!(e.to_string().contains("BRAVE_API_KEY"), "{e}");
}

#[tokio::test]
async fn nothing_configured_offers_no_search_and_a_dead_service_says_so() {
    assert!(
        Searcher::from_config(&WebSearchConfig::default(), &env(&[]))
            .expect("fine")
            .is_none()
    );
    let e = Searcher::from_config(
        &WebSearchConfig {
            backend: Some(SearchBackend::Searxng),
            ..WebSearchConfig::default()
        },
        &env(&[]),
    )
    .expect_err("searxng without an address");
    assert!(e.to_string().contains("web.search.base_url"), "{e}");
    // A closed port.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let s = searcher(
        WebSearchConfig {
            backend: Some(SearchBackend::Searxng),
            base_url: Some(format!("http://127.0.0.1:{port}")),
            ..WebSearchConfig::default()
        },
        &env(&[]),
    );
    let e = s.search("rust", 5).await.expect_err("down");
    assert!(e.to_string().starts_with("SearXNG search failed"), "{e}");
}
