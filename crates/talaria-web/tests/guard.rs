//! The URL guard against hostile URLs, with a real HTTP server on
//! 127.0.0.1 that counts what reaches it: a refused URL must never get
//! there.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use talaria_web::guard::{Lookup, LookupFuture, StaticLookup};
use talaria_web::{FetchError, Fetcher, GuardError, Limits, Oversize, UrlGuard};

/// Counts every request, whatever its path.
#[derive(Clone, Default)]
struct Hits(Arc<AtomicUsize>);

impl Hits {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A server with the routes the tests need; every request is counted.
async fn serve() -> (SocketAddr, Hits) {
    let hits = Hits::default();
    let app = Router::new()
        .route("/", get(|| async { "hello from the test server" }))
        .route("/secret", get(|| async { "the secret" }))
        .route(
            "/to-localhost",
            get(|State(addr): State<SocketAddr>| async move {
                redirect(&format!("http://localhost:{}/secret", addr.port()))
            }),
        )
        .route(
            "/to-private",
            get(|| async { redirect("http://10.0.0.1/secret") }),
        )
        .route(
            "/to-other-loopback",
            get(|State(addr): State<SocketAddr>| async move {
                redirect(&format!("http://127.0.0.2:{}/secret", addr.port()))
            }),
        )
        .route(
            "/to-metadata",
            get(|| async { redirect("http://169.254.169.254/latest/meta-data/") }),
        )
        .route("/loop-a", get(|| async { redirect("/loop-b") }))
        .route("/loop-b", get(|| async { redirect("/loop-a") }))
        .route(
            "/chain/{n}",
            get(
                |axum::extract::Path(n): axum::extract::Path<u32>| async move {
                    redirect(&format!("/chain/{}", n + 1))
                },
            ),
        )
        .route("/five-gigabytes", get(five_gigabytes))
        .route("/endless", get(endless))
        .route("/stalls", get(stalls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    let counted = hits.clone();
    let app = app.with_state(addr).layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            let counted = counted.clone();
            async move {
                counted.0.fetch_add(1, Ordering::SeqCst);
                next.run(req).await
            }
        },
    ));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, hits)
}

fn redirect(to: &str) -> Response {
    (StatusCode::FOUND, [(header::LOCATION, to.to_owned())]).into_response()
}

/// Declares 5 GB and sends zeros for as long as anyone reads.
async fn five_gigabytes() -> Response {
    let chunk = bytes::Bytes::from(vec![0u8; 64 * 1024]);
    let body = futures::stream::repeat_with(move || Ok::<_, std::io::Error>(chunk.clone()));
    Response::builder()
        .header(header::CONTENT_LENGTH, 5u64 * 1024 * 1024 * 1024)
        .header(header::CONTENT_TYPE, "text/html")
        .body(Body::from_stream(body))
        .unwrap_or_default()
}

/// Zeros without a declared length, for ever.
async fn endless() -> Response {
    let chunk = bytes::Bytes::from(vec![b'a'; 64 * 1024]);
    let body = futures::stream::repeat_with(move || Ok::<_, std::io::Error>(chunk.clone()));
    Response::builder()
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from_stream(body))
        .unwrap_or_default()
}

/// Headers and a first line, then nothing more, ever.
async fn stalls() -> Response {
    let first =
        futures::stream::once(async { Ok::<_, std::io::Error>(bytes::Bytes::from("<html>")) });
    let body = futures::StreamExt::chain(first, futures::stream::pending());
    Response::builder()
        .header(header::CONTENT_TYPE, "text/html")
        .body(Body::from_stream(body))
        .unwrap_or_default()
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

/// Names for the tests, resolved without DNS.
fn names() -> StaticLookup {
    StaticLookup::default()
        .with("loopback.test", &[ip("127.0.0.1")])
        .with("private.test", &[ip("192.168.0.10")])
        .with("mixed.test", &[ip("93.184.216.34"), ip("10.0.0.1")])
        .with("v6-loopback.test", &[ip("::1")])
        .with("mapped.test", &[ip("::ffff:127.0.0.1")])
        .with("metadata.test", &[ip("169.254.169.254")])
        .with("localhost", &[ip("127.0.0.1")])
}

fn limits() -> Limits {
    Limits {
        max_bytes: 1024 * 1024,
        timeout: Duration::from_secs(3),
        max_redirects: 5,
    }
}

fn fetcher(allow_private: bool, allow_hosts: &[&str], lookup: Arc<dyn Lookup>) -> Fetcher {
    let hosts: Vec<String> = allow_hosts.iter().map(|h| (*h).to_owned()).collect();
    let guard = UrlGuard::with_lookup(allow_private, &hosts, lookup).expect("a guard");
    Fetcher::new(guard, limits()).expect("a fetcher")
}

async fn fetch(f: &Fetcher, url: &str) -> Result<talaria_web::Fetched, FetchError> {
    f.get(url, "*/*", Oversize::Refuse).await
}

#[tokio::test]
async fn hostile_urls_are_refused_before_anything_is_sent() {
    let (addr, hits) = serve().await;
    let p = addr.port();
    let f = fetcher(false, &[], Arc::new(names()));
    let hostile = [
        // Loopback, spelled every way a URL parser accepts.
        format!("http://127.0.0.1:{p}/"),
        format!("http://127.1:{p}/"),
        format!("http://127.0.0.2:{p}/"),
        format!("http://0x7f.1:{p}/"),
        format!("http://0x7f000001:{p}/"),
        format!("http://2130706433:{p}/"),
        format!("http://017700000001:{p}/"),
        format!("http://0177.0.0.1:{p}/"),
        format!("http://0177.00.00.01:{p}/"),
        format!("http://[::1]:{p}/"),
        format!("http://[::ffff:127.0.0.1]:{p}/"),
        format!("http://[::ffff:7f00:1]:{p}/"),
        format!("http://[0:0:0:0:0:ffff:127.0.0.1]:{p}/"),
        format!("http://[::127.0.0.1]:{p}/"),
        format!("http://0.0.0.0:{p}/"),
        format!("http://0:{p}/"),
        format!("http://localhost:{p}/"),
        format!("http://LOCALHOST:{p}/"),
        format!("http://localhost.:{p}/"),
        format!("http://app.localhost:{p}/"),
        format!("http://user:pass@127.0.0.1:{p}/"),
        format!("http://example.com@127.0.0.1:{p}/"),
        // Names that resolve to what is refused.
        format!("http://loopback.test:{p}/"),
        format!("http://v6-loopback.test:{p}/"),
        format!("http://mapped.test:{p}/"),
        "http://private.test/".to_owned(),
        "http://mixed.test/".to_owned(),
        "http://metadata.test/latest/meta-data/".to_owned(),
        // Private, shared and link-local ranges.
        "http://10.0.0.1/".to_owned(),
        "http://10.255.255.255/".to_owned(),
        "http://172.16.0.1/".to_owned(),
        "http://172.31.255.254/".to_owned(),
        "http://192.168.1.1/".to_owned(),
        "http://100.64.0.1/".to_owned(),
        "http://198.18.0.1/".to_owned(),
        "http://[fc00::1]/".to_owned(),
        "http://[fd12:3456::1]/".to_owned(),
        "http://[fe80::1]/".to_owned(),
        "http://[fec0::1]/".to_owned(),
        "http://[64:ff9b::7f00:1]/".to_owned(),
        "http://[2002:7f00:1::1]/".to_owned(),
        "http://[2002:c0a8:101::1]/".to_owned(),
        // Cloud metadata.
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://169.254.170.2/v2/credentials".to_owned(),
        "http://100.100.100.200/latest/meta-data/".to_owned(),
        "http://192.0.0.192/opc/v2/instance/".to_owned(),
        "http://[fd00:ec2::254]/latest/meta-data/".to_owned(),
        "http://metadata.google.internal/computeMetadata/v1/".to_owned(),
        "http://metadata/computeMetadata/v1/".to_owned(),
        // Multicast, broadcast, reserved.
        "http://224.0.0.1/".to_owned(),
        "http://239.255.255.250/".to_owned(),
        "http://255.255.255.255/".to_owned(),
        "http://240.0.0.1/".to_owned(),
        "http://[ff02::1]/".to_owned(),
        // Schemes other than http and https.
        "file:///etc/passwd".to_owned(),
        "ftp://example.com/pub/".to_owned(),
        format!("gopher://127.0.0.1:{p}/"),
        "data:text/html,<script>1</script>".to_owned(),
        "javascript:alert(1)".to_owned(),
    ];
    assert!(hostile.len() >= 40, "the table holds {}", hostile.len());
    for url in &hostile {
        match fetch(&f, url).await {
            Err(FetchError::Guard(GuardError::Refused { reason, .. })) => {
                assert!(!reason.is_empty(), "{url}");
            }
            other => panic!("{url} was not refused by the guard: {other:?}"),
        }
    }
    assert_eq!(hits.count(), 0, "a refused URL reached the server");
}

#[tokio::test]
async fn refusals_say_what_and_why_without_the_query() {
    let f = fetcher(false, &[], Arc::new(names()));
    let e = fetch(&f, "http://0x7f.1/admin?token=hunter2")
        .await
        .expect_err("refused");
    let text = e.to_string();
    assert!(text.contains("127.0.0.1 is a loopback address"), "{text}");
    assert!(text.contains("web.allow_private"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    let e = fetch(&f, "http://mixed.test/").await.expect_err("refused");
    assert!(
        e.to_string()
            .contains("mixed.test resolves to 10.0.0.1, a private address"),
        "{e}"
    );
}

#[tokio::test]
async fn redirects_are_checked_one_by_one() {
    let (addr, hits) = serve().await;
    let base = format!("http://127.0.0.1:{}", addr.port());
    // The test host, and only it, is opened.
    let f = fetcher(false, &["127.0.0.1"], Arc::new(names()));
    let page = fetch(&f, &format!("{base}/"))
        .await
        .expect("the allowed host");
    assert_eq!(page.body, b"hello from the test server");
    let before = hits.count();
    for (path, why) in [
        ("/to-localhost", "loopback"),
        ("/to-private", "10.0.0.1 is a private address"),
        ("/to-other-loopback", "127.0.0.2 is a loopback address"),
        ("/to-metadata", "cloud metadata"),
    ] {
        match fetch(&f, &format!("{base}{path}")).await {
            Err(FetchError::Guard(e)) => assert!(e.to_string().contains(why), "{path}: {e}"),
            other => panic!("{path}: {other:?}"),
        }
    }
    // Each redirecting page was asked once; /secret never.
    assert_eq!(hits.count(), before + 4);

    match fetch(&f, &format!("{base}/loop-a")).await {
        Err(FetchError::Redirect(e)) => assert!(e.contains("loop"), "{e}"),
        other => panic!("loop: {other:?}"),
    }
    match fetch(&f, &format!("{base}/chain/0")).await {
        Err(FetchError::Redirect(e)) => assert!(e.contains("more than 5 redirects"), "{e}"),
        other => panic!("chain: {other:?}"),
    }
}

#[tokio::test]
async fn bodies_and_time_are_bounded() {
    let (addr, _) = serve().await;
    let base = format!("http://127.0.0.1:{}", addr.port());
    let f = fetcher(false, &["127.0.0.1"], Arc::new(names()));
    // Refused on the declared length, before reading.
    match fetch(&f, &format!("{base}/five-gigabytes")).await {
        Err(FetchError::TooLarge { limit }) => assert_eq!(limit, 1024 * 1024),
        other => panic!("5 GB: {other:?}"),
    }
    // No declared length: the stream itself is cut.
    match fetch(&f, &format!("{base}/endless")).await {
        Err(e @ FetchError::TooLarge { .. }) => assert!(e.to_string().contains("1 MB"), "{e}"),
        other => panic!("endless: {other:?}"),
    }
    // Or its beginning is kept, when the caller says so.
    let cut = f
        .get(&format!("{base}/five-gigabytes"), "*/*", Oversize::Truncate)
        .await
        .expect("a truncated body");
    assert!(cut.truncated);
    assert_eq!(cut.body.len(), 1024 * 1024);
    match fetch(&f, &format!("{base}/stalls")).await {
        Err(e @ FetchError::Timeout(_)) => assert!(e.to_string().contains("3 s"), "{e}"),
        other => panic!("stalls: {other:?}"),
    }
}

/// Answers `first` to the first lookup and `then` to every later one,
/// counting them: a rebinding name.
struct Rebinding {
    calls: AtomicUsize,
    first: IpAddr,
    then: IpAddr,
}

impl Lookup for Rebinding {
    fn lookup(&self, _host: &str) -> LookupFuture {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let ip = if n == 0 { self.first } else { self.then };
        Box::pin(async move { Ok(vec![ip]) })
    }
}

#[tokio::test]
async fn a_name_is_looked_up_once_and_connected_to_as_checked() {
    let (addr, hits) = serve().await;
    // The first answer is public-looking only to this guard (its network
    // is opened), the second private: a second lookup at connect time
    // would go to 10.0.0.1 and fail to connect or be refused.
    let lookup = Arc::new(Rebinding {
        calls: AtomicUsize::new(0),
        first: ip("127.0.0.1"),
        then: ip("10.0.0.1"),
    });
    let f = fetcher(false, &["127.0.0.0/8"], lookup.clone());
    let page = fetch(&f, &format!("http://rebind.test:{}/", addr.port()))
        .await
        .expect("connected to the checked address");
    assert_eq!(page.body, b"hello from the test server");
    assert_eq!(lookup.calls.load(Ordering::SeqCst), 1);
    assert_eq!(hits.count(), 1);
    // A new client (no pooled connection) looks up again, gets 10.0.0.1,
    // and is refused.
    let f = fetcher(false, &["127.0.0.0/8"], lookup.clone());
    let e = fetch(&f, &format!("http://rebind.test:{}/", addr.port()))
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("10.0.0.1"), "{e}");
    assert_eq!(hits.count(), 1);
}

#[tokio::test]
async fn a_home_lab_opens_private_addresses_but_never_metadata() {
    let (addr, _) = serve().await;
    let f = fetcher(true, &[], Arc::new(names()));
    let page = fetch(&f, &format!("http://loopback.test:{}/", addr.port()))
        .await
        .expect("private allowed");
    assert_eq!(page.body, b"hello from the test server");
    for url in [
        "http://169.254.169.254/latest/meta-data/",
        "http://metadata.test/",
        "http://metadata.google.internal/",
    ] {
        assert!(
            matches!(fetch(&f, url).await, Err(FetchError::Guard(_))),
            "{url}"
        );
    }
    // Named in allow_hosts, the address is reachable even so.
    let f = fetcher(false, &["loopback.test"], Arc::new(names()));
    assert!(
        fetch(&f, &format!("http://loopback.test:{}/", addr.port()))
            .await
            .is_ok()
    );
    assert!(UrlGuard::with_lookup(false, &["http://x".to_owned()], Arc::new(names())).is_err());
}
