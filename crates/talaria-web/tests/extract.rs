//! `web_extract`'s work on pages the testkit serves: an article, a PDF, a
//! 20 MB page, plain text, an image, and a page that never finishes.

use std::sync::Arc;
use std::time::Duration;

use talaria_testkit::web_pages::{ARTICLE_FACT, PDF_FACT, WebPages};
use talaria_web::guard::StaticLookup;
use talaria_web::{ExtractError, Extractor, FetchError, Fetcher, Limits, UrlGuard};

/// An extractor with the test host (and only it) opened.
fn extractor(max_chars: usize) -> Extractor {
    let guard = UrlGuard::with_lookup(
        false,
        &["127.0.0.1".to_owned()],
        Arc::new(StaticLookup::default()),
    )
    .expect("guard");
    let limits = Limits {
        max_bytes: 10 * 1024 * 1024,
        timeout: Duration::from_secs(3),
        max_redirects: 5,
    };
    Extractor::new(
        Fetcher::new(guard, limits).expect("fetcher"),
        max_chars,
        None,
    )
}

#[tokio::test]
async fn an_article_comes_back_as_markdown_without_the_page_chrome() {
    let site = WebPages::start().await;
    let page = extractor(50_000)
        .extract(&site.url("/moved"))
        .await
        .expect("article");
    assert_eq!(page.url, site.url("/article"), "redirect followed");
    assert_eq!(page.kind, "html");
    assert!(
        page.title
            .as_deref()
            .unwrap_or("")
            .contains("Bridge reopens"),
        "{page:?}"
    );
    assert!(page.content.contains(ARTICLE_FACT), "{}", page.content);
    // Markdown: the list and the link survive as such.
    assert!(page.content.contains("New cables"), "{}", page.content);
    assert!(
        page.content
            .contains("[council's notice](https://council.example/bridge)"),
        "{}",
        page.content
    );
    // The navigation, the sidebar, the footer and the script are gone.
    for chrome in ["Most read", "All rights reserved", "analytics", "Sport"] {
        assert!(
            !page.content.contains(chrome),
            "{chrome} in {}",
            page.content
        );
    }
    assert!(!page.truncated);
}

#[tokio::test]
async fn pdfs_and_text_are_read_and_images_refused() {
    let site = WebPages::start().await;
    let x = extractor(50_000);
    let pdf = x.extract(&site.url("/report.pdf")).await.expect("pdf");
    assert_eq!(pdf.kind, "pdf");
    assert!(pdf.content.contains(PDF_FACT), "{}", pdf.content);
    let text = x.extract(&site.url("/notes.txt")).await.expect("text");
    assert_eq!(text.content, "line one\nline two");
    match x.extract(&site.url("/photo.png")).await {
        Err(e @ ExtractError::Unreadable(_)) => {
            assert!(e.to_string().contains("image/png"), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_huge_page_is_cut_twice_and_a_stalled_one_times_out() {
    let site = WebPages::start().await;
    let x = extractor(5_000);
    let page = x.extract(&site.url("/huge")).await.expect("huge page");
    // Only 10 MB of the 20 were read, and 5,000 characters handed on.
    assert!(page.truncated);
    assert_eq!(page.content.chars().count(), 5_000);
    assert!(page.full_chars > 5_000);
    assert!(
        page.content.contains("All work and no play"),
        "{}",
        &page.content[..200]
    );

    match x.extract(&site.url("/never")).await {
        Err(ExtractError::Fetch(e @ FetchError::Timeout(_))) => {
            assert!(e.to_string().contains("3 s"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    // The guard stands before all of it.
    match x
        .extract(&format!("http://localhost:{}/article", site.port()))
        .await
    {
        Err(ExtractError::Fetch(FetchError::Guard(_))) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(site.hits("/article"), 0);
}
