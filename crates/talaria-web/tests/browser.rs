//! The browser manager against a real Chromium and real pages served on
//! 127.0.0.1, with the guard opened for 127.0.0.1 only.
//!
//! Chromium must be installed (Debian: `apt-get install chromium`); these
//! tests fail, saying so, when it is not.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{Html, IntoResponse};
use axum::routing::{get, post};
use talaria_core::config::BrowserConfig;
use talaria_web::UrlGuard;
use talaria_web::browser::{Browser, BrowserError, Direction, processes_mentioning};

#[derive(Default)]
struct Counters {
    /// Requests for /x.png that came through the allowed host.
    allowed: AtomicUsize,
    /// Requests for /x.png that named the refused host (`localhost`).
    refused: AtomicUsize,
}

struct Site {
    addr: SocketAddr,
    counters: Arc<Counters>,
}

impl Site {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

const FORM: &str = r#"<!doctype html>
<html><head><title>The form</title></head>
<body>
<h1>Sign the guest book</h1>
<form method="post" action="/result">
  <label for="name">Your name</label>
  <input id="name" name="name" type="text" value="old text">
  <button type="submit">Send it</button>
</form>
<p><a href="/other">Go to the other page</a></p>
<img src="/img/cat.svg" alt="a drawn cat">
<div style="height: 3000px">tall</div>
<script>console.log("hello from the page", 42); console.warn("careful");</script>
</body></html>"#;

const OTHER: &str = r#"<!doctype html>
<html><head><title>Other</title></head>
<body><h1>The other page</h1><input id="q" aria-label="Search words"></body></html>"#;

const CAT: &str = r#"<svg xmlns="http://www.w3.org/2000/svg" width="40" height="40">
<circle cx="20" cy="20" r="18" fill="orange"/></svg>"#;

async fn serve() -> Site {
    let counters = Arc::new(Counters::default());
    let app = Router::new()
        .route("/form", get(|| async { Html(FORM) }))
        .route("/other", get(|| async { Html(OTHER) }))
        .route(
            "/result",
            post(|body: String| async move {
                let name = body
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("name="))
                    .unwrap_or("")
                    .replace('+', " ");
                Html(format!(
                    "<!doctype html><html><head><title>Thanks</title></head>\
                     <body><p>Thank you, {name}, for signing.</p></body></html>"
                ))
            }),
        )
        .route(
            "/img/cat.svg",
            get(|| async { ([(header::CONTENT_TYPE, "image/svg+xml")], CAT) }),
        )
        .route(
            "/x.png",
            get(
                |State(c): State<Arc<Counters>>, headers: HeaderMap| async move {
                    let host = headers
                        .get(header::HOST)
                        .and_then(|h| h.to_str().ok())
                        .unwrap_or("");
                    if host.starts_with("localhost") {
                        c.refused.fetch_add(1, Ordering::SeqCst);
                    } else {
                        c.allowed.fetch_add(1, Ordering::SeqCst);
                    }
                    ([(header::CONTENT_TYPE, "image/svg+xml")], CAT).into_response()
                },
            ),
        )
        .route(
            "/leak",
            get(|headers: HeaderMap| async move {
                let host = headers
                    .get(header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                let port = host.rsplit(':').next().unwrap_or("80").to_owned();
                Html(format!(
                    "<!doctype html><html><head><title>Leak</title></head><body>\
                     <img alt=\"allowed\" src=\"/x.png?a\">\
                     <img alt=\"refused\" src=\"http://localhost:{port}/x.png?img\">\
                     <script>fetch('http://localhost:{port}/x.png?fetch').catch(e => \
                     console.log('fetch refused'));</script>\
                     <p>leak page</p></body></html>"
                ))
            }),
        )
        .with_state(counters.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Site { addr, counters }
}

fn guard() -> UrlGuard {
    UrlGuard::with_lookup(
        false,
        &["127.0.0.1".to_owned()],
        Arc::new(talaria_web::guard::StaticLookup::default()),
    )
    .expect("guard")
}

fn config(idle: u64, max: usize) -> BrowserConfig {
    BrowserConfig {
        idle_timeout_secs: idle,
        max_contexts: max,
        ..BrowserConfig::default()
    }
}

/// The line of `text` that mentions `needle`, and the ref on it.
fn ref_on(text: &str, needle: &str) -> String {
    let line = text
        .lines()
        .find(|l| l.contains(needle) && l.contains("[@e"))
        .unwrap_or_else(|| panic!("no ref on a line with {needle:?} in:\n{text}"));
    let start = line.find("[@e").map(|i| i + 1).unwrap_or(0);
    let end = line[start..]
        .find(']')
        .map(|i| start + i)
        .unwrap_or(line.len());
    line[start..end].to_owned()
}

/// Waits (bounded) until `check` holds.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("gave up waiting: {what}");
}

fn no_process_of(profile: &Path) -> bool {
    processes_mentioning(&profile.display().to_string())
        .map(|p| p.is_empty())
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_is_filled_submitted_and_read_back() {
    let site = serve().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let browser = Browser::new(&config(300, 4), guard(), dir.path());
    let key = "session-1";

    let view = browser
        .navigate(key, &site.url("/form"))
        .await
        .unwrap_or_else(|e| panic!("navigate: {e}"));
    let text = view.render();
    assert!(text.contains("Title: The form"), "{text}");
    assert!(text.contains("heading \"Sign the guest book\""), "{text}");
    let field = ref_on(&text, "textbox \"Your name\"");
    let send = ref_on(&text, "button \"Send it\"");
    assert!(
        text.contains("= \"old text\""),
        "the field's value is shown: {text}"
    );

    // Typing replaces what was there.
    browser
        .type_text(key, &field, "Ada Lovelace")
        .await
        .unwrap_or_else(|e| panic!("type: {e}"));
    let view = browser.snapshot(key, false).await.expect("snapshot");
    assert!(
        view.render().contains("= \"Ada Lovelace\""),
        "{}",
        view.render()
    );
    assert!(!view.render().contains("old text"), "{}", view.render());

    let send_again = ref_on(&view.render(), "button \"Send it\"");
    assert_eq!(send, send_again, "refs are stable for the same page");
    browser
        .click(key, &send_again)
        .await
        .unwrap_or_else(|e| panic!("click: {e}"));
    let view = browser.snapshot(key, false).await.expect("snapshot");
    let text = view.render();
    assert!(
        text.contains("Thank you, Ada Lovelace, for signing."),
        "{text}"
    );
    assert!(text.contains("Title: Thanks"), "{text}");

    // Back to the form, then follow the link by its ref.
    let view = browser
        .back(key)
        .await
        .unwrap_or_else(|e| panic!("back: {e}"));
    assert!(
        view.render().contains("Title: The form"),
        "{}",
        view.render()
    );
    let link = ref_on(&view.render(), "link \"Go to the other page\"");
    browser.click(key, &link).await.expect("click link");
    let view = browser.snapshot(key, false).await.expect("snapshot");
    assert!(view.url.ends_with("/other"), "{}", view.url);
    assert!(
        view.render().contains("heading \"The other page\""),
        "{}",
        view.render()
    );

    // A key press: typing into the search field then Tab moves the focus
    // away (the field is no longer focused).
    let search = ref_on(&view.render(), "Search words");
    browser.type_text(key, &search, "cats").await.expect("type");
    let focused = browser
        .evaluate(key, "document.activeElement && document.activeElement.id")
        .await
        .expect("evaluate");
    assert_eq!(focused, "q");
    browser.press(key, "Tab").await.expect("press");
    let focused = browser
        .evaluate(
            key,
            "String(document.activeElement && document.activeElement.id)",
        )
        .await
        .expect("evaluate");
    assert_ne!(focused, "q", "Tab moved the focus");
    assert!(browser.press(key, "NotAKey").await.is_err());

    // Refs that are not in the snapshot are refused with a way out.
    let e = browser.click(key, "@e999").await.expect_err("unknown ref");
    assert!(e.to_string().contains("browser_snapshot"), "{e}");

    browser.close_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_console_scroll_and_screenshot() {
    let site = serve().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let browser = Browser::new(&config(300, 4), guard(), dir.path());
    let key = "k";
    browser
        .navigate(key, &site.url("/form"))
        .await
        .unwrap_or_else(|e| panic!("navigate: {e}"));

    let images = browser.images(key).await.expect("images");
    assert_eq!(images.len(), 1, "{images:?}");
    assert!(images[0].src.ends_with("/img/cat.svg"), "{images:?}");
    assert_eq!(images[0].alt, "a drawn cat");

    let console = browser.console(key, false).await.expect("console");
    assert!(
        console
            .iter()
            .any(|c| c.level == "log" && c.text == "hello from the page 42"),
        "{console:?}"
    );
    assert!(
        console
            .iter()
            .any(|c| c.level == "warning" && c.text == "careful"),
        "{console:?}"
    );
    // An exception thrown by the page is collected too.
    let _ = browser
        .evaluate(
            key,
            "setTimeout(() => { throw new Error('boom in a timer'); }, 0); 1",
        )
        .await
        .expect("evaluate");
    eventually("the exception reaches the console", || async {
        browser
            .console(key, false)
            .await
            .map(|c| {
                c.iter()
                    .any(|e| e.level == "exception" && e.text.contains("boom in a timer"))
            })
            .unwrap_or(false)
    })
    .await;
    // Clearing empties the buffer after reading it.
    assert!(
        !browser
            .console(key, true)
            .await
            .expect("console")
            .is_empty()
    );
    assert!(
        browser
            .console(key, false)
            .await
            .expect("console")
            .is_empty()
    );

    let down = browser.scroll(key, Direction::Down).await.expect("scroll");
    assert!(down.starts_with("Scrolled down. Now at "), "{down}");
    assert!(!down.starts_with("Scrolled down. Now at 0 "), "{down}");
    let up = browser.scroll(key, Direction::Up).await.expect("scroll");
    assert!(up.starts_with("Scrolled up. Now at 0 "), "{up}");

    let png = browser.screenshot(key, false).await.expect("screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    let annotated = browser.screenshot(key, true).await.expect("screenshot");
    assert!(annotated.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert_ne!(png, annotated, "the labels are drawn");
    // ... and removed afterwards.
    let left = browser
        .evaluate(key, "String(!!document.getElementById('__talaria_labels'))")
        .await
        .expect("evaluate");
    assert_eq!(left, "false");

    let thrown = browser
        .evaluate(key, "(() => { throw new Error('nope'); })()")
        .await;
    assert!(
        matches!(&thrown, Err(BrowserError::Failed(s)) if s.contains("nope")),
        "{thrown:?}"
    );
    browser.close_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_refuses_navigations_and_every_request_a_page_makes() {
    let site = serve().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let browser = Browser::new(&config(300, 4), guard(), dir.path());
    let key = "k";

    // Refused before the browser is touched: nothing was started.
    let port = site.addr.port();
    for url in [
        format!("http://localhost:{port}/form"),
        "http://10.0.0.1/".to_owned(),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "file:///etc/passwd".to_owned(),
    ] {
        let e = browser.navigate(key, &url).await.expect_err("refused");
        assert!(matches!(e, BrowserError::Refused(_)), "{url}: {e:?}");
        assert!(e.to_string().starts_with("refused to fetch"), "{e}");
    }
    assert!(browser.open_contexts().await.is_empty());
    assert!(
        no_process_of(&browser.profile_dir()),
        "no Chromium was started"
    );

    // A page on the allowed host asks for an image and a fetch from a
    // refused one: the proxy refuses both, the server never sees them.
    let view = browser
        .navigate(key, &site.url("/leak"))
        .await
        .unwrap_or_else(|e| panic!("navigate: {e}"));
    assert!(view.render().contains("leak page"), "{}", view.render());
    eventually("the page's fetch has failed", || async {
        browser
            .console(key, false)
            .await
            .map(|c| c.iter().any(|e| e.text == "fetch refused"))
            .unwrap_or(false)
    })
    .await;
    assert!(
        site.counters.allowed.load(Ordering::SeqCst) >= 1,
        "the allowed image was loaded through the proxy"
    );
    assert_eq!(
        site.counters.refused.load(Ordering::SeqCst),
        0,
        "nothing reached the server under the refused name"
    );
    browser.close_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_contexts_close_and_the_cap_closes_the_least_recent() {
    let site = serve().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let browser = Browser::new(&config(1, 2), guard(), dir.path());

    browser.navigate("a", &site.url("/form")).await.expect("a");
    assert_eq!(browser.open_contexts().await, vec!["a".to_owned()]);
    assert!(
        !browser
            .console("a", false)
            .await
            .expect("console")
            .is_empty()
    );
    eventually("the idle context is closed", || async {
        browser.open_contexts().await.is_empty()
    })
    .await;
    // A new call opens a fresh context: the old page's console is gone.
    let fresh = browser.console("a", false).await.expect("console");
    assert!(fresh.is_empty(), "{fresh:?}");
    let view = browser.snapshot("a", false).await.expect("snapshot");
    assert_eq!(view.url, "about:blank");
    browser.close_all().await;

    // The cap: with two open, a third closes the least recently used.
    let browser = Browser::new(&config(300, 2), guard(), dir.path());
    browser.navigate("a", &site.url("/form")).await.expect("a");
    browser.navigate("b", &site.url("/other")).await.expect("b");
    // `a` is used again, so `b` is now the least recent.
    browser.snapshot("a", false).await.expect("a again");
    browser.navigate("c", &site.url("/other")).await.expect("c");
    let mut open = browser.open_contexts().await;
    open.sort();
    assert_eq!(open, vec!["a".to_owned(), "c".to_owned()]);
    // `a` kept its page.
    let view = browser.snapshot("a", false).await.expect("a");
    assert!(view.url.ends_with("/form"), "{}", view.url);
    // Contexts keep their own cookies: one set in `a` is not seen in `c`.
    browser
        .evaluate("a", "document.cookie = 'who=a'; document.cookie")
        .await
        .expect("cookie");
    let other = browser
        .evaluate("c", "document.cookie")
        .await
        .expect("cookie");
    assert_eq!(other, "");
    browser.close_all().await;

    // A context in use is never the one closed: while `a` waits on a slow
    // script, `b` is the least recent idle one and makes room for `c`;
    // with both left busy, a fourth conversation is told to wait.
    let browser = Arc::new(Browser::new(&config(300, 2), guard(), dir.path()));
    browser.navigate("a", &site.url("/form")).await.expect("a");
    browser.navigate("b", &site.url("/other")).await.expect("b");
    let slow = |key: &'static str| {
        let browser = browser.clone();
        tokio::spawn(async move {
            browser
                .evaluate(key, "new Promise(r => setTimeout(() => r('done'), 3000))")
                .await
        })
    };
    let waiting_a = slow("a");
    tokio::time::sleep(Duration::from_millis(500)).await;
    browser.navigate("c", &site.url("/other")).await.expect("c");
    let mut open = browser.open_contexts().await;
    open.sort();
    assert_eq!(open, vec!["a".to_owned(), "c".to_owned()]);
    let waiting_c = slow("c");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let refused = browser.navigate("d", &site.url("/other")).await;
    assert!(
        matches!(&refused, Err(BrowserError::Unavailable(m)) if m.contains("in use")),
        "{refused:?}"
    );
    assert_eq!(waiting_a.await.expect("join").expect("a's script"), "done");
    assert_eq!(waiting_c.await.expect("join").expect("c's script"), "done");
    browser
        .navigate("d", &site.url("/other"))
        .await
        .expect("d later");
    browser.close_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_or_dropping_the_manager_leaves_no_chromium() {
    let site = serve().await;
    let dir = tempfile::tempdir().expect("tempdir");

    let browser = Browser::new(&config(300, 4), guard(), dir.path());
    browser
        .navigate("k", &site.url("/form"))
        .await
        .expect("navigate");
    let profile = browser.profile_dir();
    assert!(
        !no_process_of(&profile),
        "Chromium runs with the profile on its command line"
    );
    browser.close_all().await;
    eventually("close_all ended Chromium", || async {
        no_process_of(&profile)
    })
    .await;
    assert!(!profile.exists(), "the profile is removed");

    // Usable again after close_all; then dropped without closing.
    browser
        .navigate("k", &site.url("/other"))
        .await
        .expect("navigate again");
    assert!(!no_process_of(&profile));
    drop(browser);
    eventually("dropping the manager ended Chromium", || async {
        no_process_of(&profile)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_sweep_kills_a_chromium_left_by_a_killed_owner() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A process id that is no longer running: a child that has exited.
    let mut gone = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let dead_pid = gone.id();
    gone.wait().expect("wait");
    let profile = dir.path().join(format!("chromium-{dead_pid}"));
    let program = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|p| which(p))
        .expect("Chromium is not installed: apt-get install chromium");
    use std::os::unix::process::CommandExt;
    let orphan = std::process::Command::new(program)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-port=0",
            &format!("--user-data-dir={}", profile.display()),
            "about:blank",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start Chromium");
    let mut orphan = Started(orphan);
    eventually("the orphan runs", || async { !no_process_of(&profile) }).await;

    // A profile of a live owner (this test process) is left alone.
    let own = dir.path().join(format!("chromium-{}", std::process::id()));
    std::fs::create_dir_all(&own).expect("own profile");

    let killed = Browser::sweep(dir.path());
    assert!(killed >= 1, "the sweep killed the orphan");
    let _ = orphan.0.wait();
    eventually("the orphan and its children are gone", || async {
        no_process_of(&profile)
    })
    .await;
    assert!(!profile.exists(), "the orphan's profile is removed");
    assert!(own.exists(), "the live owner's profile stays");
    assert_eq!(Browser::sweep(dir.path()), 0, "nothing left to sweep");
}

/// A Chromium this test started itself, in a process group of its own:
/// the group is killed when the test ends, even by a failed assertion.
struct Started(std::process::Child);

impl Drop for Started {
    fn drop(&mut self) {
        let pgid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The variable that makes [`owner_process`] run: the data directory.
const OWNER_DIR: &str = "TALARIA_TEST_BROWSER_OWNER_DIR";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_dies_with_an_owner_killed_by_sigkill() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("the test binary");
    let mut owner = std::process::Command::new(exe)
        .args([
            "browser::owner_process",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(OWNER_DIR, dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the owner");
    let stdout = owner.stdout.take().expect("owner stdout");
    // Read on a thread: the owner's output is a blocking pipe.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            // The harness prints the test's name on the same line first.
            if let Some(at) = line.find("READY ") {
                let _ = tx.send(line[at + "READY ".len()..].trim().to_owned());
            }
        }
    });
    let profile = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(p) => std::path::PathBuf::from(p),
        Err(_) => {
            let _ = owner.kill();
            panic!("the owner process did not get its browser ready");
        }
    };
    assert!(!no_process_of(&profile), "the owner's Chromium runs");
    // SIGKILL: the owner runs no code of its own on the way out.
    owner.kill().expect("kill the owner");
    owner.wait().expect("reap the owner");
    eventually("Chromium ended with its owner", || async {
        no_process_of(&profile)
    })
    .await;
    // Its profile is what the next start's sweep clears.
    assert!(profile.exists());
    assert_eq!(Browser::sweep(dir.path()), 0, "no process was left to kill");
    assert!(
        !profile.exists(),
        "the sweep removes the dead owner's profile"
    );
}

/// Run only by [`chromium_dies_with_an_owner_killed_by_sigkill`], as its
/// child: starts a browser, says where its profile is, and waits to be
/// killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of chromium_dies_with_an_owner_killed_by_sigkill"]
async fn owner_process() {
    use std::io::Write;
    let dir = std::env::var_os(OWNER_DIR).unwrap_or_else(|| {
        panic!("run only as the child of chromium_dies_with_an_owner_killed_by_sigkill")
    });
    let site = serve().await;
    let browser = Browser::new(&config(300, 4), guard(), std::path::PathBuf::from(dir));
    browser
        .navigate("k", &site.url("/form"))
        .await
        .expect("navigate");
    println!("READY {}", browser.profile_dir().display());
    let _ = std::io::stdout().flush();
    tokio::time::sleep(Duration::from_secs(120)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_that_closes_itself_is_replaced_on_the_next_call() {
    let dir = tempfile::tempdir().expect("tempdir");
    let browser = Browser::new(&config(300, 4), guard(), dir.path());
    // A page with one history entry may close itself.
    let _ = browser
        .evaluate("k", "setTimeout(() => window.close(), 0); 1")
        .await;
    eventually("a call fails once the page is gone", || {
        let browser = &browser;
        async move { browser.evaluate("k", "1").await.is_err() }
    })
    .await;
    // The next call has a fresh page.
    let again = browser.evaluate("k", "document.URL").await;
    assert_eq!(again.as_deref().ok(), Some("about:blank"), "{again:?}");
    browser.close_all().await;
}

/// A Chromium started here without the guard's proxy, driven through
/// `browser.cdp_url`: the guard works through request interception.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_browser_is_guarded_by_request_interception() {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let site = serve().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let program = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|p| which(p))
        .expect("Chromium is not installed: apt-get install chromium");
    let remote = std::process::Command::new(program)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-crash-reporter",
            "--remote-debugging-port=0",
            "--remote-debugging-address=127.0.0.1",
            &format!("--user-data-dir={}", dir.path().join("remote").display()),
            "about:blank",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("start Chromium");
    let mut remote = Started(remote);
    let stderr = remote.0.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(at) = line.find("ws://") {
                let _ = tx.send(line[at..].trim().to_owned());
            }
        }
    });
    let ws = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the remote Chromium's DevTools address");
    // The http:// discovery form of the address.
    let port = ws
        .trim_start_matches("ws://127.0.0.1:")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let cfg = BrowserConfig {
        cdp_url: Some(format!("http://127.0.0.1:{port}")),
        ..config(300, 4)
    };
    let browser = Browser::new(&cfg, guard(), dir.path().join("data"));

    let e = browser
        .navigate("k", &format!("http://localhost:{}/form", site.addr.port()))
        .await
        .expect_err("refused");
    assert!(matches!(e, BrowserError::Refused(_)), "{e:?}");
    let view = browser
        .navigate("k", &site.url("/leak"))
        .await
        .unwrap_or_else(|e| panic!("navigate: {e}"));
    assert!(view.render().contains("leak page"), "{}", view.render());
    eventually("the page's fetch has failed", || async {
        browser
            .console("k", false)
            .await
            .map(|c| c.iter().any(|e| e.text == "fetch refused"))
            .unwrap_or(false)
    })
    .await;
    assert!(site.counters.allowed.load(Ordering::SeqCst) >= 1);
    assert_eq!(site.counters.refused.load(Ordering::SeqCst), 0);
    // Our contexts go; the remote browser stays up.
    browser.close_all().await;
    assert!(
        remote.0.try_wait().expect("try_wait").is_none(),
        "the remote browser still runs"
    );
}
