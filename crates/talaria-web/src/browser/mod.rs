//! A headless browser for the `browser_*` tools: one Chromium, one
//! incognito browser context per conversation, every request it makes
//! decided by the [`UrlGuard`].
//!
//! # How it fits together
//!
//! - [`Browser`] is the manager the tools share. Nothing starts until the
//!   first call: then it launches the local Chromium (`browser.chromium_path`,
//!   else `chromium`, `chromium-browser` or `google-chrome` on `PATH`), or
//!   connects to `browser.cdp_url`.
//! - Each conversation key (the session id) gets its own browser context
//!   (`Target.createBrowserContext`: cookies and storage of its own) with one
//!   page. At most `browser.max_contexts` are open; the least recently used
//!   that no call is using is closed to make room (when every one is in
//!   use, the new conversation is told to try again), and a context unused for
//!   `browser.idle_timeout_secs` is closed by a background task.
//! - The guard, for the local Chromium: every request goes through a forward
//!   proxy inside this process (module `proxy`), which connects only to addresses
//!   the guard checked. For a remote browser (`cdp_url`), which cannot reach
//!   that proxy, each page intercepts its requests with the DevTools Fetch
//!   domain and fails those the guard refuses (the remote browser resolves
//!   names itself, so there the check is on the name's addresses as this
//!   machine sees them). In both cases `navigate` checks the URL before the
//!   browser is touched.
//! - The local Chromium dies with this process (module `process`), and
//!   [`Browser::sweep`] kills one a killed predecessor left behind.
//!
//! Everything read from a page (snapshot text, console messages, image
//! alt text, evaluation results) is the page's: untrusted data, which the
//! tool layer marks as such for the model.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use chromiumoxide::Page;
use chromiumoxide::cdp::browser_protocol::accessibility::GetFullAxTreeParams;
use chromiumoxide::cdp::browser_protocol::browser::{
    BrowserContextId, SetDownloadBehaviorBehavior, SetDownloadBehaviorParams,
};
use chromiumoxide::cdp::browser_protocol::dom::{
    BackendNodeId, FocusParams, GetBoxModelParams, ResolveNodeParams, ScrollIntoViewIfNeededParams,
};
use chromiumoxide::cdp::browser_protocol::fetch::{
    self, ContinueRequestParams, EventRequestPaused, FailRequestParams, RequestPattern,
    RequestStage,
};
use chromiumoxide::cdp::browser_protocol::input::{
    DispatchKeyEventParams, DispatchKeyEventType, InsertTextParams,
};
use chromiumoxide::cdp::browser_protocol::network::ErrorReason;
use chromiumoxide::cdp::browser_protocol::page::{
    CaptureScreenshotFormat, EventFrameStartedLoading, EventLoadEventFired,
    GetNavigationHistoryParams, NavigateToHistoryEntryParams,
};
use chromiumoxide::cdp::browser_protocol::target::{
    CreateBrowserContextParams, CreateTargetParams,
};
use chromiumoxide::cdp::js_protocol::runtime::{
    CallFunctionOnParams, EvaluateParams, EventConsoleApiCalled, EventExceptionThrown, RemoteObject,
};
use chromiumoxide::handler::HandlerConfig;
use chromiumoxide::layout::Point;
use chromiumoxide::page::ScreenshotParams;
use futures::StreamExt;
use talaria_core::config::BrowserConfig;
use tokio::task::JoinHandle;
use url::Url;

use crate::guard::{GuardError, UrlGuard};

mod process;
mod proxy;
pub mod snapshot;

pub use process::processes_mentioning;
pub use snapshot::Snapshot;

/// Characters of a snapshot handed back; more is cut with a note.
pub const MAX_SNAPSHOT_CHARS: usize = 15_000;

/// Console messages kept per conversation (the oldest go first).
const CONSOLE_RING: usize = 200;

/// Characters kept of one console message.
const MAX_CONSOLE_TEXT: usize = 2_000;

/// Images listed by [`Browser::images`].
const MAX_IMAGES: usize = 100;

/// Characters of an evaluation result handed back.
const MAX_EVAL_CHARS: usize = 10_000;

/// How long a navigation may take before the page is read as it is.
const NAVIGATION_TIMEOUT: Duration = Duration::from_secs(30);

/// How long any single operation may take in all.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(60);

/// After a click or a key, how long to watch for a navigation starting.
const SETTLE_WINDOW: Duration = Duration::from_millis(700);

/// Labels drawn by an annotated screenshot.
const MAX_LABELS: usize = 200;

/// Why a browser operation failed, in words for the model.
#[derive(Debug, Clone)]
pub enum BrowserError {
    /// The guard refused the URL; its sentence.
    Refused(GuardError),
    /// No browser could be started or reached.
    Unavailable(String),
    /// The model's argument cannot be used (a bad URL, an unknown ref).
    Invalid(String),
    /// The browser failed at the operation.
    Failed(String),
}

impl fmt::Display for BrowserError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BrowserError::Refused(e) => write!(f, "{e}"),
            BrowserError::Unavailable(s) => write!(f, "the browser is not available: {s}"),
            BrowserError::Invalid(s) | BrowserError::Failed(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for BrowserError {}

impl From<GuardError> for BrowserError {
    fn from(e: GuardError) -> BrowserError {
        BrowserError::Refused(e)
    }
}

fn failed(what: &str) -> impl Fn(chromiumoxide::error::CdpError) -> BrowserError + '_ {
    move |e| BrowserError::Failed(format!("{what} failed: {e}"))
}

/// One console message or uncaught exception.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleEntry {
    /// `log`, `warning`, `error`, `info`, `debug`, ..., or `exception`.
    pub level: String,
    /// The message, cut to a bound.
    pub text: String,
}

/// An image on the page.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct PageImage {
    /// Where it was loaded from (cut to a bound; `data:` URLs are long).
    pub src: String,
    /// Its alternative text.
    pub alt: String,
}

/// Which way [`Browser::scroll`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Towards the top.
    Up,
    /// Towards the bottom.
    Down,
}

/// A page's address, title and snapshot.
#[derive(Debug, Clone)]
pub struct PageView {
    /// The URL the page is at now.
    pub url: String,
    /// Its title.
    pub title: String,
    /// Its accessibility tree as text.
    pub snapshot: Snapshot,
}

impl PageView {
    /// The view as the model reads it: address, title, tree, and a note
    /// when the tree was cut.
    pub fn render(&self) -> String {
        let mut out = format!(
            "URL: {}\nTitle: {}\n\n{}",
            self.url, self.title, self.snapshot.text
        );
        if self.snapshot.truncated {
            out.push_str(&format!(
                "\n[snapshot cut at {MAX_SNAPSHOT_CHARS} characters; scroll or use \
                 browser_console with an expression to read more]\n"
            ));
        }
        if self.snapshot.text.trim().is_empty() {
            out.push_str("(the page shows nothing readable yet)\n");
        }
        out
    }
}

/// What [`Browser::new`] needs.
#[derive(Debug, Clone)]
struct Settings {
    program: Option<PathBuf>,
    cdp_url: Option<String>,
    idle: Duration,
    max_contexts: usize,
}

/// The browser manager the `browser_*` tools share (see the module doc).
/// Cheap to share behind an `Arc`; dropping the last handle kills the local
/// Chromium.
pub struct Browser {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Settings,
    guard: UrlGuard,
    data_dir: PathBuf,
    state: tokio::sync::Mutex<State>,
    reaper: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct State {
    engine: Option<Engine>,
    tabs: HashMap<String, Arc<Tab>>,
}

/// A connected browser.
struct Engine {
    browser: chromiumoxide::Browser,
    /// Drives the DevTools connection; ends when it drops.
    _handler: AbortOnDrop,
    alive: Arc<AtomicBool>,
    /// The local Chromium, when this process started it.
    process: Option<process::ChromiumProcess>,
    /// The guard's proxy, for the local Chromium (held: it stops when
    /// dropped).
    _proxy: Option<proxy::Proxy>,
}

/// A task that ends when its handle is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One conversation's context and page.
struct Tab {
    context: BrowserContextId,
    page: Page,
    last_used: Mutex<Instant>,
    refs: Mutex<Vec<BackendNodeId>>,
    console: Arc<Mutex<VecDeque<ConsoleEntry>>>,
    /// One operation at a time on a page.
    busy: tokio::sync::Mutex<()>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Tab {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Tab {
    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }
}

impl Browser {
    /// The manager for `browser:` (`config`), deciding addresses with
    /// `guard`, keeping the local Chromium's profile under `data_dir`
    /// (`<TALARIA_HOME>/browser`). Starts nothing: Chromium is launched (or
    /// `cdp_url` connected to) on the first call. Run [`Browser::sweep`]
    /// on the same directory once at start, before the first call.
    pub fn new(config: &BrowserConfig, guard: UrlGuard, data_dir: impl Into<PathBuf>) -> Browser {
        let settings = Settings {
            program: config.chromium_path.clone(),
            cdp_url: config.cdp_url.clone().filter(|u| !u.trim().is_empty()),
            idle: Duration::from_secs(config.idle_timeout_secs.max(1)),
            max_contexts: config.max_contexts.max(1),
        };
        Browser {
            inner: Arc::new(Inner {
                settings,
                guard,
                data_dir: data_dir.into(),
                state: tokio::sync::Mutex::new(State::default()),
                reaper: Mutex::new(None),
            }),
        }
    }

    /// Whether `browser:` can work here: a `cdp_url`, or a Chromium to
    /// start (`chromium_path`, else one on `PATH`). The error says what to
    /// install or set.
    ///
    /// # Errors
    /// No Chromium and no `cdp_url`.
    pub fn available(config: &BrowserConfig) -> Result<(), String> {
        if config
            .cdp_url
            .as_deref()
            .is_some_and(|u| !u.trim().is_empty())
        {
            return Ok(());
        }
        process::find_program(config.chromium_path.as_deref())
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// Kills Chromium processes that a previous process left running with
    /// a profile under `data_dir` (it was killed before it could end them)
    /// and removes their profiles. Returns how many processes were killed.
    /// Blocking (reads `/proc`); call once at start.
    pub fn sweep(data_dir: &Path) -> usize {
        process::sweep(data_dir)
    }

    /// The profile directory the local Chromium of this process uses:
    /// every Chromium process of ours names it on its command line.
    pub fn profile_dir(&self) -> PathBuf {
        process::profile_dir(&self.inner.data_dir)
    }

    /// The conversation keys with an open context, most recently used
    /// first.
    pub async fn open_contexts(&self) -> Vec<String> {
        let st = self.inner.state.lock().await;
        let mut keys: Vec<(Duration, String)> = st
            .tabs
            .iter()
            .map(|(k, t)| (t.idle_for(), k.clone()))
            .collect();
        keys.sort();
        keys.into_iter().map(|(_, k)| k).collect()
    }

    /// Closes `key`'s context (its cookies and pages go with it).
    pub async fn close(&self, key: &str) {
        let mut st = self.inner.state.lock().await;
        if let Some(tab) = st.tabs.remove(key) {
            close_tab(st.engine.as_ref(), &tab).await;
        }
    }

    /// Closes every context and the browser: the local Chromium is ended
    /// and its profile removed; a remote browser is left running without
    /// our contexts. For the gateway's stop. The manager can be used again
    /// afterwards (it starts afresh).
    pub async fn close_all(&self) {
        let mut st = self.inner.state.lock().await;
        let tabs: Vec<Arc<Tab>> = st.tabs.drain().map(|(_, t)| t).collect();
        let engine = st.engine.take();
        if let Some(engine) = engine {
            if engine.process.is_none() {
                for tab in &tabs {
                    close_tab(Some(&engine), tab).await;
                }
            }
            let Engine {
                mut browser,
                process,
                ..
            } = engine;
            if let Some(process) = process {
                let _ = tokio::time::timeout(Duration::from_secs(2), browser.close()).await;
                process.shutdown().await;
            }
        }
        if let Some(r) = self
            .inner
            .reaper
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            r.abort();
        }
    }

    /// Opens `url` in `key`'s page, waits for it to load (at most
    /// 30 seconds) and returns the page's compact snapshot.
    /// A URL the guard refuses is refused before the browser is touched.
    ///
    /// # Errors
    /// [`BrowserError::Refused`] with the guard's sentence, a URL that is
    /// not one, or the browser failing.
    pub async fn navigate(&self, key: &str, url: &str) -> Result<PageView, BrowserError> {
        let url = url.trim();
        let parsed = Url::parse(url).or_else(|e| {
            // "example.com/page" is what people write.
            if !url.contains("://") {
                Url::parse(&format!("https://{url}"))
            } else {
                Err(e)
            }
        });
        let parsed = parsed.map_err(|e| {
            BrowserError::Invalid(format!(
                "`{url}` is not a URL ({e}): pass a full http(s) address"
            ))
        })?;
        self.inner.guard.check_url(&parsed)?;
        if let Some(host) = parsed.host_str() {
            self.inner.guard.resolve(host).await?;
        }
        self.run(key, |tab| async move {
            let nav = tokio::time::timeout(NAVIGATION_TIMEOUT, tab.page.goto(parsed.as_str())).await;
            let note = match nav {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => {
                    let text = e.to_string();
                    return Err(BrowserError::Failed(format!(
                        "loading {parsed} failed: {text}{}",
                        if text.contains("TUNNEL") || text.contains("PROXY") {
                            " (the address may have been refused by the guard)"
                        } else {
                            ""
                        }
                    )));
                }
                Err(_) => Some(format!(
                    "the page had not finished loading after {} seconds; this is what it shows so far",
                    NAVIGATION_TIMEOUT.as_secs()
                )),
            };
            let mut view = view(&tab, false).await?;
            if let Some(note) = note {
                view.snapshot.text = format!("[{note}]\n{}", view.snapshot.text);
            }
            Ok(view)
        })
        .await
    }

    /// The page's accessibility tree: compact (controls, links, headings,
    /// text) or `full` (every node with a role). Refs from it stay valid
    /// until the next snapshot.
    ///
    /// # Errors
    /// The browser failing.
    pub async fn snapshot(&self, key: &str, full: bool) -> Result<PageView, BrowserError> {
        self.run(key, |tab| async move { view(&tab, full).await })
            .await
    }

    /// Clicks the element `r` (`@e5`) from the last snapshot: scrolled into
    /// view, clicked at its centre; waits for a navigation it starts.
    ///
    /// # Errors
    /// An unknown ref, or the browser failing.
    pub async fn click(&self, key: &str, r: &str) -> Result<String, BrowserError> {
        let r = r.to_owned();
        self.run(key, |tab| async move {
            let node = node_of(&tab, &r)?;
            let navigation = Navigation::watch(&tab).await?;
            let _ = tab
                .page
                .execute(ScrollIntoViewIfNeededParams {
                    backend_node_id: Some(node),
                    ..Default::default()
                })
                .await;
            let point = match tab
                .page
                .execute(GetBoxModelParams {
                    backend_node_id: Some(node),
                    ..Default::default()
                })
                .await
            {
                Ok(model) => centre(model.result.model.content.inner()),
                Err(_) => None,
            };
            match point {
                Some(p) => {
                    tab.page.click(p).await.map_err(failed("clicking"))?;
                }
                // No box (a zero-size or hidden element): the DOM's own
                // click, as a script would.
                None => {
                    call_on(&tab, node, "function() { this.click(); }").await?;
                }
            }
            navigation.settle().await;
            Ok(format!("Clicked {r}."))
        })
        .await
    }

    /// Types `text` into the element `r` (`@e3`): focused, cleared, then
    /// the text inserted as typed input.
    ///
    /// # Errors
    /// An unknown ref, or the browser failing.
    pub async fn type_text(&self, key: &str, r: &str, text: &str) -> Result<String, BrowserError> {
        let (r, text) = (r.to_owned(), text.to_owned());
        self.run(key, |tab| async move {
            let node = node_of(&tab, &r)?;
            let _ = tab
                .page
                .execute(ScrollIntoViewIfNeededParams {
                    backend_node_id: Some(node),
                    ..Default::default()
                })
                .await;
            tab.page
                .execute(FocusParams {
                    backend_node_id: Some(node),
                    ..Default::default()
                })
                .await
                .map_err(|e| {
                    BrowserError::Failed(format!(
                        "{r} cannot take text ({e}): pick a text field from a fresh browser_snapshot"
                    ))
                })?;
            call_on(
                &tab,
                node,
                "function() { if ('value' in this) { this.value = ''; \
                 this.dispatchEvent(new Event('input', { bubbles: true })); } \
                 else if (this.isContentEditable) { this.textContent = ''; } }",
            )
            .await?;
            tab.page
                .execute(InsertTextParams::new(text.clone()))
                .await
                .map_err(failed("typing"))?;
            Ok(format!("Typed {} characters into {r}.", text.chars().count()))
        })
        .await
    }

    /// Scrolls the page by most of a screen.
    ///
    /// # Errors
    /// The browser failing.
    pub async fn scroll(&self, key: &str, direction: Direction) -> Result<String, BrowserError> {
        self.run(key, |tab| async move {
            let sign = if direction == Direction::Down { "" } else { "-" };
            let expr = format!(
                "(() => {{ window.scrollBy(0, {sign}Math.round(window.innerHeight * 0.8)); \
                 return JSON.stringify([Math.round(window.scrollY), \
                 Math.round(document.documentElement.scrollHeight), Math.round(window.innerHeight)]); }})()"
            );
            let out = eval_value(&tab, &expr).await?;
            let nums: Vec<i64> = out
                .as_str()
                .and_then(|s| serde_json::from_str(s).ok())
                .unwrap_or_default();
            Ok(match nums.as_slice() {
                [y, h, v] => format!(
                    "Scrolled {}. Now at {y} of {h} pixels (a screen is {v}).",
                    if direction == Direction::Down { "down" } else { "up" }
                ),
                _ => "Scrolled.".to_owned(),
            })
        })
        .await
    }

    /// Goes back one page in the history and waits for it to load.
    ///
    /// # Errors
    /// No previous page, or the browser failing.
    pub async fn back(&self, key: &str) -> Result<PageView, BrowserError> {
        self.run(key, |tab| async move {
            let history = tab
                .page
                .execute(GetNavigationHistoryParams::default())
                .await
                .map_err(failed("reading the history"))?;
            let index = history.result.current_index;
            let Some(entry) = usize::try_from(index - 1)
                .ok()
                .and_then(|i| history.result.entries.get(i))
            else {
                return Err(BrowserError::Invalid(
                    "there is no previous page in this browser's history".into(),
                ));
            };
            let loaded = tab
                .page
                .event_listener::<EventLoadEventFired>()
                .await
                .map_err(failed("watching the page"))?;
            tab.page
                .execute(NavigateToHistoryEntryParams::new(entry.id))
                .await
                .map_err(failed("going back"))?;
            let mut loaded = loaded;
            let _ = tokio::time::timeout(NAVIGATION_TIMEOUT, loaded.next()).await;
            view(&tab, false).await
        })
        .await
    }

    /// Presses a key (`Enter`, `Tab`, `Escape`, `ArrowDown`, a character)
    /// in the focused element; waits for a navigation it starts.
    ///
    /// # Errors
    /// A key with no name known here, or the browser failing.
    pub async fn press(&self, key: &str, name: &str) -> Result<String, BrowserError> {
        let name = name.trim().to_owned();
        let Some(k) = key_def(&name) else {
            return Err(BrowserError::Invalid(format!(
                "`{name}` is not a key this tool knows: use Enter, Tab, Escape, Backspace, \
                 Delete, Space, ArrowUp/Down/Left/Right, Home, End, PageUp, PageDown or a \
                 single character"
            )));
        };
        self.run(key, |tab| async move {
            let navigation = Navigation::watch(&tab).await?;
            let down = DispatchKeyEventParams {
                r#type: if k.text.is_some() {
                    DispatchKeyEventType::KeyDown
                } else {
                    DispatchKeyEventType::RawKeyDown
                },
                key: Some(k.key.clone()),
                code: Some(k.code.clone()),
                text: k.text.clone(),
                unmodified_text: k.text.clone(),
                windows_virtual_key_code: Some(k.key_code),
                native_virtual_key_code: Some(k.key_code),
                ..DispatchKeyEventParams::new(DispatchKeyEventType::KeyDown)
            };
            let up = DispatchKeyEventParams {
                r#type: DispatchKeyEventType::KeyUp,
                key: Some(k.key.clone()),
                code: Some(k.code.clone()),
                windows_virtual_key_code: Some(k.key_code),
                native_virtual_key_code: Some(k.key_code),
                ..DispatchKeyEventParams::new(DispatchKeyEventType::KeyUp)
            };
            tab.page
                .execute(down)
                .await
                .map_err(failed("pressing the key"))?;
            tab.page
                .execute(up)
                .await
                .map_err(failed("pressing the key"))?;
            navigation.settle().await;
            Ok(format!("Pressed {}.", k.key))
        })
        .await
    }

    /// The images on the page (at most 100).
    ///
    /// # Errors
    /// The browser failing.
    pub async fn images(&self, key: &str) -> Result<Vec<PageImage>, BrowserError> {
        self.run(key, |tab| async move {
            let expr = format!(
                "JSON.stringify(Array.from(document.images).slice(0, {MAX_IMAGES}).map(i => ({{ \
                 src: String(i.currentSrc || i.src || '').slice(0, 500), \
                 alt: String(i.alt || '').slice(0, 300) }})))"
            );
            let out = eval_value(&tab, &expr).await?;
            let images: Vec<PageImage> = out
                .as_str()
                .and_then(|s| serde_json::from_str(s).ok())
                .unwrap_or_default();
            Ok(images)
        })
        .await
    }

    /// A PNG of what the page shows. With `annotate`, each element with a
    /// ref gets a numbered label (`N` is `@eN`) drawn over it first.
    ///
    /// # Errors
    /// The browser failing.
    pub async fn screenshot(&self, key: &str, annotate: bool) -> Result<Vec<u8>, BrowserError> {
        self.run(key, |tab| async move {
            if annotate {
                draw_labels(&tab).await?;
            }
            let png = tab
                .page
                .screenshot(
                    ScreenshotParams::builder()
                        .format(CaptureScreenshotFormat::Png)
                        .build(),
                )
                .await
                .map_err(failed("taking the screenshot"));
            if annotate {
                let _ = eval_value(
                    &tab,
                    "(() => { const o = document.getElementById('__talaria_labels'); if (o) o.remove(); return 1; })()",
                )
                .await;
            }
            png
        })
        .await
    }

    /// The console messages and uncaught exceptions collected since the
    /// page opened (or the last clear), oldest first; with `clear`, the
    /// buffer is emptied after reading.
    ///
    /// # Errors
    /// The browser failing.
    pub async fn console(&self, key: &str, clear: bool) -> Result<Vec<ConsoleEntry>, BrowserError> {
        self.run(key, |tab| async move {
            let mut ring = tab.console.lock().unwrap_or_else(|p| p.into_inner());
            let entries: Vec<ConsoleEntry> = ring.iter().cloned().collect();
            if clear {
                ring.clear();
            }
            Ok(entries)
        })
        .await
    }

    /// Evaluates `expression` in the page and returns its value as JSON
    /// (cut to a bound), or the exception it threw.
    ///
    /// # Errors
    /// The expression throwing, or the browser failing.
    pub async fn evaluate(&self, key: &str, expression: &str) -> Result<String, BrowserError> {
        let expression = expression.to_owned();
        self.run(key, |tab| async move {
            let value = eval_value(&tab, &expression).await?;
            let mut text = match value {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            if text.chars().count() > MAX_EVAL_CHARS {
                text = text.chars().take(MAX_EVAL_CHARS).collect();
                text.push_str(&format!("\n[cut at {MAX_EVAL_CHARS} characters]"));
            }
            Ok(text)
        })
        .await
    }

    /// Runs `op` on `key`'s page (opened if need be), one operation at a
    /// time per page, within [`OPERATION_TIMEOUT`].
    async fn run<T, F, Fut>(&self, key: &str, op: F) -> Result<T, BrowserError>
    where
        F: FnOnce(Arc<Tab>) -> Fut,
        Fut: std::future::Future<Output = Result<T, BrowserError>>,
    {
        let tab = self.tab(key).await?;
        let _busy = tab.busy.lock().await;
        tab.touch();
        let out = tokio::time::timeout(OPERATION_TIMEOUT, op(tab.clone()))
            .await
            .unwrap_or_else(|_| {
                Err(BrowserError::Failed(format!(
                    "the browser did not finish within {} seconds",
                    OPERATION_TIMEOUT.as_secs()
                )))
            });
        tab.touch();
        if matches!(out, Err(BrowserError::Failed(_))) && !page_alive(&tab).await {
            // The page is gone (it closed itself, or its renderer died):
            // the next call opens a fresh one rather than failing forever.
            let mut st = self.inner.state.lock().await;
            if st.tabs.get(key).is_some_and(|t| Arc::ptr_eq(t, &tab)) {
                st.tabs.remove(key);
                close_tab(st.engine.as_ref(), &tab).await;
            }
            return out.map_err(|e| {
                BrowserError::Failed(format!(
                    "{e}; the page was closed, so the next browser call starts on a blank page"
                ))
            });
        }
        out
    }

    /// `key`'s tab, opened (and the browser started) when there is none.
    async fn tab(&self, key: &str) -> Result<Arc<Tab>, BrowserError> {
        self.start_reaper();
        let mut st = self.inner.state.lock().await;
        if st
            .engine
            .as_ref()
            .is_some_and(|e| !e.alive.load(Ordering::SeqCst))
        {
            tracing::warn!("the browser connection was lost; starting again");
            st.tabs.clear();
            if let Some(engine) = st.engine.take()
                && let Some(p) = engine.process
            {
                p.shutdown().await;
            }
        }
        if let Some(tab) = st.tabs.get(key) {
            tab.touch();
            return Ok(tab.clone());
        }
        if st.engine.is_none() {
            st.engine = Some(self.start().await?);
        }
        while st.tabs.len() >= self.inner.settings.max_contexts {
            // A tab an operation holds (the map's is the only other
            // reference) is in use however long ago it was touched:
            // closing it would fail another conversation's call.
            let Some(oldest) = st
                .tabs
                .iter()
                .filter(|(_, t)| Arc::strong_count(t) == 1)
                .max_by_key(|(_, t)| t.idle_for())
                .map(|(k, _)| k.clone())
            else {
                return Err(BrowserError::Unavailable(format!(
                    "every browser context is in use by another conversation \
                     (browser.max_contexts: {}); try again in a moment",
                    self.inner.settings.max_contexts
                )));
            };
            if let Some(tab) = st.tabs.remove(&oldest) {
                tracing::debug!(key = %oldest, "closing the least recently used browser context");
                close_tab(st.engine.as_ref(), &tab).await;
            }
        }
        let Some(engine) = st.engine.as_ref() else {
            return Err(BrowserError::Unavailable(
                "the browser did not start".into(),
            ));
        };
        let tab = Arc::new(open_tab(engine, &self.inner.guard).await?);
        st.tabs.insert(key.to_owned(), tab.clone());
        Ok(tab)
    }

    /// Launches the local Chromium (with its proxy) or connects to
    /// `cdp_url`.
    async fn start(&self) -> Result<Engine, BrowserError> {
        let handler_config = HandlerConfig {
            // Certificate errors stay errors: a page with a bad
            // certificate is not the page it claims to be.
            ignore_https_errors: false,
            viewport: None,
            request_timeout: NAVIGATION_TIMEOUT,
            ..HandlerConfig::default()
        };
        let (ws, process, proxy) = match &self.inner.settings.cdp_url {
            // The DevTools client here speaks plain WebSocket and HTTP
            // only (a remote browser is reached over a trusted network or
            // a tunnel).
            Some(url) if !(url.starts_with("ws://") || url.starts_with("http://")) => {
                return Err(BrowserError::Unavailable(format!(
                    "browser.cdp_url must start with ws:// or http:// (got {}); for a browser \
                     elsewhere, reach it through an SSH tunnel",
                    url.split("://").next().unwrap_or("no scheme")
                )));
            }
            Some(url) => (url.clone(), None, None),
            None => {
                let program = process::find_program(self.inner.settings.program.as_deref())?;
                let proxy = proxy::Proxy::start(self.inner.guard.clone())
                    .await
                    .map_err(|e| {
                        BrowserError::Unavailable(format!("cannot start the browser's proxy: {e}"))
                    })?;
                let profile = process::profile_dir(&self.inner.data_dir);
                let (process, ws) =
                    process::ChromiumProcess::start(&program, &profile, proxy.port()).await?;
                (ws, Some(process), Some(proxy))
            }
        };
        let (browser, mut handler) =
            chromiumoxide::Browser::connect_with_config(ws.clone(), handler_config)
                .await
                .map_err(|e| {
                    let which = if process.is_some() {
                        "the local Chromium".to_owned()
                    } else {
                        "browser.cdp_url".to_owned()
                    };
                    BrowserError::Unavailable(format!("cannot connect to {which}: {e}"))
                })?;
        let alive = Arc::new(AtomicBool::new(true));
        let flag = alive.clone();
        let handler = tokio::spawn(async move {
            // Errors here are single messages the library could not read;
            // the stream ending is the connection ending.
            while let Some(event) = handler.next().await {
                if let Err(e) = event {
                    tracing::debug!("browser connection: {e}");
                }
            }
            flag.store(false, Ordering::SeqCst);
        });
        Ok(Engine {
            browser,
            _handler: AbortOnDrop(handler),
            alive,
            process,
            _proxy: proxy,
        })
    }

    /// Starts the idle reaper once (it needs a runtime, which `new` does
    /// not).
    fn start_reaper(&self) {
        let mut slot = self.inner.reaper.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let idle = self.inner.settings.idle;
        let tick = (idle / 4).clamp(Duration::from_millis(200), Duration::from_secs(30));
        *slot = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(tick).await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let mut st = inner.state.lock().await;
                let idle_keys: Vec<String> = st
                    .tabs
                    .iter()
                    // A tab whose operation outlasts the idle time is in
                    // use, not idle: closing it would fail the operation.
                    .filter(|(_, t)| t.idle_for() >= idle && t.busy.try_lock().is_ok())
                    .map(|(k, _)| k.clone())
                    .collect();
                for key in idle_keys {
                    if let Some(tab) = st.tabs.remove(&key) {
                        tracing::debug!(key = %key, "closing an idle browser context");
                        close_tab(st.engine.as_ref(), &tab).await;
                    }
                }
            }
        }));
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(r) = self
            .reaper
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            r.abort();
        }
        // The engine's process kills its group as it drops; its profile
        // is left for the next start's sweep (no blocking work in drop).
    }
}

/// Whether the page still answers.
async fn page_alive(tab: &Tab) -> bool {
    let probe = tab.page.execute(EvaluateParams::new("1"));
    matches!(
        tokio::time::timeout(Duration::from_secs(5), probe).await,
        Ok(Ok(_))
    )
}

/// Opens a context and its page; for a remote browser, the page's
/// requests are intercepted and checked.
async fn open_tab(engine: &Engine, guard: &UrlGuard) -> Result<Tab, BrowserError> {
    let context = engine
        .browser
        .create_browser_context(CreateBrowserContextParams::default())
        .await
        .map_err(failed("opening a browser context"))?;
    // A page must not write files where we run: downloads are refused.
    let mut downloads = SetDownloadBehaviorParams::new(SetDownloadBehaviorBehavior::Deny);
    downloads.browser_context_id = Some(context.clone());
    if let Err(e) = engine.browser.execute(downloads).await {
        tracing::debug!("refusing downloads: {e}");
    }
    let mut params = CreateTargetParams::new("about:blank");
    params.browser_context_id = Some(context.clone());
    let page = match engine.browser.new_page(params).await {
        Ok(p) => p,
        Err(e) => {
            let _ = engine.browser.dispose_browser_context(context).await;
            return Err(BrowserError::Failed(format!("opening a page failed: {e}")));
        }
    };
    let console = Arc::new(Mutex::new(VecDeque::new()));
    let mut tasks = Vec::new();
    let logs = page
        .event_listener::<EventConsoleApiCalled>()
        .await
        .map_err(failed("watching the console"))?;
    let exceptions = page
        .event_listener::<EventExceptionThrown>()
        .await
        .map_err(failed("watching the console"))?;
    tasks.push(tokio::spawn(collect_console(
        logs,
        exceptions,
        console.clone(),
    )));
    if engine.process.is_none() {
        let paused = page
            .event_listener::<EventRequestPaused>()
            .await
            .map_err(failed("watching requests"))?;
        page.execute(fetch::EnableParams {
            patterns: Some(vec![RequestPattern {
                url_pattern: Some("*".into()),
                request_stage: Some(RequestStage::Request),
                ..Default::default()
            }]),
            ..Default::default()
        })
        .await
        .map_err(failed("intercepting requests"))?;
        tasks.push(tokio::spawn(check_requests(
            page.clone(),
            paused,
            guard.clone(),
        )));
    }
    let _ = page.enable_runtime().await;
    Ok(Tab {
        context,
        page,
        last_used: Mutex::new(Instant::now()),
        refs: Mutex::new(Vec::new()),
        console,
        busy: tokio::sync::Mutex::new(()),
        tasks,
    })
}

async fn close_tab(engine: Option<&Engine>, tab: &Tab) {
    for t in &tab.tasks {
        t.abort();
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), tab.page.clone().close()).await;
    if let Some(engine) = engine {
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            engine.browser.dispose_browser_context(tab.context.clone()),
        )
        .await;
    }
}

/// For a remote browser: each request the page makes waits here until the
/// guard has looked at it.
async fn check_requests(
    page: Page,
    mut paused: chromiumoxide::listeners::EventStream<EventRequestPaused>,
    guard: UrlGuard,
) {
    while let Some(event) = paused.next().await {
        let verdict = request_verdict(&guard, &event.request.url).await;
        let id = event.request_id.clone();
        let sent = match verdict {
            Ok(()) => page
                .execute(ContinueRequestParams::new(id))
                .await
                .map(|_| ()),
            Err(e) => {
                tracing::info!("browser request refused: {e}");
                page.execute(FailRequestParams::new(id, ErrorReason::AccessDenied))
                    .await
                    .map(|_| ())
            }
        };
        if let Err(e) = sent {
            tracing::debug!("answering a paused request: {e}");
        }
    }
}

async fn request_verdict(guard: &UrlGuard, raw: &str) -> Result<(), GuardError> {
    let Ok(mut url) = Url::parse(raw) else {
        return Err(GuardError::Refused {
            target: raw.chars().take(200).collect(),
            reason: "not a URL".into(),
        });
    };
    match url.scheme() {
        // Served from the page's own memory, no network.
        "data" | "blob" | "about" => return Ok(()),
        "ws" => {
            let _ = url.set_scheme("http");
        }
        "wss" => {
            let _ = url.set_scheme("https");
        }
        _ => {}
    }
    guard.check_url(&url)?;
    if let Some(host) = url.host_str() {
        guard.resolve(host).await?;
    }
    Ok(())
}

async fn collect_console(
    mut logs: chromiumoxide::listeners::EventStream<EventConsoleApiCalled>,
    mut exceptions: chromiumoxide::listeners::EventStream<EventExceptionThrown>,
    ring: Arc<Mutex<VecDeque<ConsoleEntry>>>,
) {
    loop {
        let entry = tokio::select! {
            Some(e) = logs.next() => ConsoleEntry {
                level: e.r#type.as_ref().to_owned(),
                text: e.args.iter().map(remote_text).collect::<Vec<_>>().join(" "),
            },
            Some(e) = exceptions.next() => {
                let d = &e.exception_details;
                let text = d
                    .exception
                    .as_ref()
                    .and_then(|x| x.description.clone())
                    .unwrap_or_else(|| d.text.clone());
                ConsoleEntry { level: "exception".into(), text }
            }
            else => return,
        };
        let mut entry = entry;
        if entry.text.chars().count() > MAX_CONSOLE_TEXT {
            entry.text = entry.text.chars().take(MAX_CONSOLE_TEXT).collect();
            entry.text.push('…');
        }
        let mut ring = ring.lock().unwrap_or_else(|p| p.into_inner());
        if ring.len() == CONSOLE_RING {
            ring.pop_front();
        }
        ring.push_back(entry);
    }
}

fn remote_text(o: &RemoteObject) -> String {
    match &o.value {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => o
            .description
            .clone()
            .or_else(|| o.unserializable_value.as_ref().map(|u| u.inner().clone()))
            .unwrap_or_else(|| o.r#type.as_ref().to_owned()),
    }
}

/// The page's view now; its refs replace the tab's.
async fn view(tab: &Tab, full: bool) -> Result<PageView, BrowserError> {
    let tree = tab
        .page
        .execute(GetFullAxTreeParams::default())
        .await
        .map_err(failed("reading the page"))?;
    let snapshot = snapshot::render(&tree.result.nodes, full, MAX_SNAPSHOT_CHARS);
    *tab.refs.lock().unwrap_or_else(|p| p.into_inner()) = snapshot.refs.clone();
    let url = tab.page.url().await.ok().flatten().unwrap_or_default();
    let title = tab
        .page
        .get_title()
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    Ok(PageView {
        url,
        title,
        snapshot,
    })
}

fn node_of(tab: &Tab, r: &str) -> Result<BackendNodeId, BrowserError> {
    let refs = tab.refs.lock().unwrap_or_else(|p| p.into_inner());
    let index = snapshot::parse_ref(r).ok_or_else(|| {
        BrowserError::Invalid(format!(
            "`{r}` is not an element ref: use one like @e5 from browser_snapshot"
        ))
    })?;
    refs.get(index).copied().ok_or_else(|| {
        if refs.is_empty() {
            BrowserError::Invalid(format!(
                "{r} is unknown: call browser_navigate or browser_snapshot first, then use a ref it shows"
            ))
        } else {
            BrowserError::Invalid(format!(
                "{r} is not in the last snapshot (it has @e1 to @e{}): take a fresh browser_snapshot",
                refs.len()
            ))
        }
    })
}

/// The centre of a quad (`x1 y1 x2 y2 x3 y3 x4 y4`).
fn centre(quad: &[f64]) -> Option<Point> {
    if quad.len() < 8 {
        return None;
    }
    let x = (quad[0] + quad[2] + quad[4] + quad[6]) / 4.0;
    let y = (quad[1] + quad[3] + quad[5] + quad[7]) / 4.0;
    Some(Point { x, y })
}

/// Calls `function` with `this` bound to the DOM node.
async fn call_on(tab: &Tab, node: BackendNodeId, function: &str) -> Result<(), BrowserError> {
    let object = tab
        .page
        .execute(ResolveNodeParams {
            backend_node_id: Some(node),
            ..Default::default()
        })
        .await
        .map_err(|e| {
            BrowserError::Failed(format!(
                "the element is gone ({e}): take a fresh browser_snapshot"
            ))
        })?;
    let Some(id) = object.result.object.object_id.clone() else {
        return Err(BrowserError::Failed(
            "the element is gone: take a fresh browser_snapshot".into(),
        ));
    };
    let mut call = CallFunctionOnParams::new(function);
    call.object_id = Some(id);
    call.user_gesture = Some(true);
    tab.page
        .execute(call)
        .await
        .map_err(failed("acting on the element"))?;
    Ok(())
}

/// Evaluates `expression` and returns its value (promises awaited).
async fn eval_value(tab: &Tab, expression: &str) -> Result<serde_json::Value, BrowserError> {
    let mut params = EvaluateParams::new(expression);
    params.return_by_value = Some(true);
    params.await_promise = Some(true);
    params.user_gesture = Some(true);
    let out = tab
        .page
        .execute(params)
        .await
        .map_err(failed("evaluating the expression"))?;
    if let Some(ex) = &out.result.exception_details {
        let text = ex
            .exception
            .as_ref()
            .and_then(|x| x.description.clone())
            .unwrap_or_else(|| ex.text.clone());
        return Err(BrowserError::Failed(format!(
            "the expression threw: {text}"
        )));
    }
    Ok(out
        .result
        .result
        .value
        .clone()
        .unwrap_or(serde_json::Value::Null))
}

/// A watch, set before an action, on the navigation it may start.
struct Navigation {
    started: chromiumoxide::listeners::EventStream<EventFrameStartedLoading>,
    loaded: chromiumoxide::listeners::EventStream<EventLoadEventFired>,
}

impl Navigation {
    /// Starts watching `tab`'s page.
    async fn watch(tab: &Tab) -> Result<Navigation, BrowserError> {
        let started = tab
            .page
            .event_listener::<EventFrameStartedLoading>()
            .await
            .map_err(failed("watching the page"))?;
        let loaded = tab
            .page
            .event_listener::<EventLoadEventFired>()
            .await
            .map_err(failed("watching the page"))?;
        Ok(Navigation { started, loaded })
    }

    /// After the action: when a navigation starts soon after, waits for
    /// its load event.
    async fn settle(mut self) {
        if let Ok(Some(_)) = tokio::time::timeout(SETTLE_WINDOW, self.started.next()).await {
            let _ = tokio::time::timeout(NAVIGATION_TIMEOUT, self.loaded.next()).await;
        }
    }
}

/// Draws a numbered label over each element of a fresh compact snapshot.
async fn draw_labels(tab: &Tab) -> Result<(), BrowserError> {
    view(tab, false).await?;
    let refs = tab.refs.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut labels = Vec::new();
    for (i, node) in refs.iter().enumerate().take(MAX_LABELS) {
        if let Ok(model) = tab
            .page
            .execute(GetBoxModelParams {
                backend_node_id: Some(*node),
                ..Default::default()
            })
            .await
        {
            let q = model.result.model.border.inner();
            if q.len() >= 2 {
                labels.push(serde_json::json!([i + 1, q[0], q[1]]));
            }
        }
    }
    let expr = format!(
        "(() => {{ const labels = {}; const o = document.createElement('div'); \
         o.id = '__talaria_labels'; o.style.cssText = 'position:fixed;left:0;top:0;width:0;height:0;\
         z-index:2147483647;pointer-events:none'; \
         for (const [n, x, y] of labels) {{ const s = document.createElement('span'); \
         s.textContent = '[' + n + ']'; s.style.cssText = 'position:fixed;left:' + x + 'px;top:' + y + \
         'px;background:#ffd400;color:#000;font:bold 11px monospace;padding:0 2px;border:1px solid #000'; \
         o.appendChild(s); }} document.documentElement.appendChild(o); return labels.length; }})()",
        serde_json::Value::Array(labels)
    );
    eval_value(tab, &expr).await?;
    Ok(())
}

/// A key as the DevTools protocol wants it.
struct KeyDef {
    key: String,
    code: String,
    key_code: i64,
    text: Option<String>,
}

fn key_def(name: &str) -> Option<KeyDef> {
    let named = |key: &str, code: &str, key_code: i64, text: Option<&str>| KeyDef {
        key: key.to_owned(),
        code: code.to_owned(),
        key_code,
        text: text.map(str::to_owned),
    };
    let lower = name.to_ascii_lowercase();
    Some(match lower.as_str() {
        "enter" | "return" => named("Enter", "Enter", 13, Some("\r")),
        "tab" => named("Tab", "Tab", 9, None),
        "escape" | "esc" => named("Escape", "Escape", 27, None),
        "backspace" => named("Backspace", "Backspace", 8, None),
        "delete" | "del" => named("Delete", "Delete", 46, None),
        "space" | " " => named(" ", "Space", 32, Some(" ")),
        "arrowup" | "up" => named("ArrowUp", "ArrowUp", 38, None),
        "arrowdown" | "down" => named("ArrowDown", "ArrowDown", 40, None),
        "arrowleft" | "left" => named("ArrowLeft", "ArrowLeft", 37, None),
        "arrowright" | "right" => named("ArrowRight", "ArrowRight", 39, None),
        "home" => named("Home", "Home", 36, None),
        "end" => named("End", "End", 35, None),
        "pageup" => named("PageUp", "PageUp", 33, None),
        "pagedown" => named("PageDown", "PageDown", 34, None),
        _ => {
            let mut chars = name.chars();
            let c = chars.next()?;
            if chars.next().is_some() {
                return None;
            }
            let upper = c.to_ascii_uppercase();
            let (code, key_code) = if c.is_ascii_alphabetic() {
                (format!("Key{upper}"), upper as i64)
            } else if c.is_ascii_digit() {
                (format!("Digit{c}"), c as i64)
            } else {
                (String::new(), 0)
            };
            KeyDef {
                key: c.to_string(),
                code,
                key_code,
                text: Some(c.to_string()),
            }
        }
    })
}
