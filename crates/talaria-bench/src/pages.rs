//! `talaria-bench pages`: the dashboard's pages on a large store (issue 27:
//! "the overview and transcript pages render in under 100 ms on a store
//! with 100,000 sessions").
//!
//! A fresh home's `state.db` is filled through the store's own API
//! ([`seed`]): many short sessions from three sources, plus one long
//! transcript with tool calls to open. `talaria gateway run` then starts on
//! that home with the API server, and each page, and each API route behind
//! the pages, is requested one request after another (a warm-up first),
//! with `GET /health` as the same run's floor. Pages are reached the way a
//! browser reaches them: the API key posted to `/ui/login` as a form, the
//! session cookie it sets sent back. A build without the dashboard (its
//! login answers 404) is measured on the API rows alone.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, COOKIE, LOCATION, SET_COOKIE};
use talaria_core::{Message, ToolCall, Usage};
use talaria_store::{ModelCall, NewSession, SessionStore, SqliteStore};

use crate::gateway::{self, API_KEY, Gateway};
use crate::mock::Mock;
use crate::report::{PagesFigures, RouteFigure, RouteKind};

/// Rows of every short session: two exchanges, or one with a tool call.
const ROWS_PER_SESSION: usize = 4;

/// Turns of the long transcript, four rows each (question, tool call,
/// its result, answer): 400 rows, four pages of the API's default 100.
const LONG_TURNS: usize = 100;

/// Sessions being written at once. The store's writer commits whatever
/// operations are queued (up to 64) in one transaction, so the seeders
/// must keep its queue full for the seed to run at its speed rather than
/// at one commit per row.
const SEEDERS: usize = 128;

/// In about one session in five (its first message): far more matches
/// than the store ranks, so a search for it takes the recency path.
pub const COMMON_WORD: &str = "backup";

/// In one session in a thousand: few enough matches to be ranked.
pub const RARE_WORD: &str = "lighthouse";

/// In the long transcript's first message only, so its page can be
/// checked to show that transcript.
const LONG_MARKER: &str = "albatross";

/// The long transcript's id.
pub const LONG_SESSION: &str = "20260101_120000_0000beef";

/// Where sessions come from, in turn.
const SOURCES: [&str; 3] = ["telegram", "api", "cli"];

/// The words messages are made of; none of the marked words above is
/// among them, so each of those is exactly where the seed put it.
const WORDS: &[&str] = &[
    "please",
    "check",
    "the",
    "build",
    "server",
    "logs",
    "for",
    "errors",
    "and",
    "tell",
    "me",
    "what",
    "failed",
    "yesterday",
    "deploy",
    "release",
    "notes",
    "draft",
    "meeting",
    "budget",
    "report",
    "weather",
    "tomorrow",
    "berlin",
    "flight",
    "dentist",
    "reminder",
    "recipe",
    "pasta",
    "garden",
    "python",
    "script",
    "database",
    "migration",
    "invoice",
    "customer",
    "holiday",
    "coffee",
    "bicycle",
    "repair",
    "guitar",
    "lesson",
    "birthday",
    "present",
    "translate",
    "summary",
    "email",
    "calendar",
];

/// How much one run does.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Short sessions seeded (the long one comes on top).
    pub sessions: usize,
    /// Requests per route before measuring, not counted.
    pub warmup: usize,
    /// Requests per route measured.
    pub requests: usize,
}

impl Plan {
    /// The full run (100,000 sessions, 200 requests per route) or the
    /// quick one (seconds in all, for CI), with the amounts given.
    pub fn new(quick: bool, sessions: Option<usize>, requests: Option<usize>) -> Plan {
        let mut plan = if quick {
            Plan {
                sessions: 2_000,
                warmup: 3,
                requests: 20,
            }
        } else {
            Plan {
                sessions: 100_000,
                warmup: 20,
                requests: 200,
            }
        };
        if let Some(n) = sessions {
            plan.sessions = n.max(1);
        }
        if let Some(n) = requests {
            plan.requests = n.max(1);
        }
        plan
    }
}

/// Seeds a store, starts the gateway on it and measures every route.
pub async fn run(talaria: &Path, plan: Plan) -> anyhow::Result<PagesFigures> {
    let mut figures = PagesFigures {
        machine: crate::report::Figures::describe_machine().machine,
        plan: format!("{plan:?}"),
        goal_ms: GOAL_MS,
        ..PagesFigures::default()
    };
    let home = gateway::new_home()?;
    let db = home.path().join("state.db");
    eprintln!("seeding {} sessions", plan.sessions);
    let started = Instant::now();
    figures.messages = seed(&db, plan.sessions).await?;
    figures.seed_seconds = started.elapsed().as_secs_f64();
    figures.sessions = plan.sessions + 1;
    figures.db_mb = ["state.db", "state.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(home.path().join(f)).ok())
        .map(|m| m.len() as f64)
        .sum::<f64>()
        / (1024.0 * 1024.0);

    // The gateway needs a model to start; no turn is made.
    let mock = Mock::start().await?;
    let mut gw = Gateway::launch_in(home, talaria, &mock.base_url(), "", "")?;
    let http = reqwest::Client::builder()
        // The login's 303 is read, not followed: its cookie is the point.
        .redirect(reqwest::redirect::Policy::none())
        // Below the server's keep-alive limit, as in the load client.
        .pool_idle_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .build()?;
    figures.launch_to_health_ms = ms(gw.wait_healthy(&http, Duration::from_secs(60)).await?);
    let result = measure_all(&http, &gw, plan, &mut figures).await;
    if result.is_err() {
        eprintln!("{}", gw.log_tail());
    }
    gw.stop();
    result.map(|()| figures)
}

/// The page goal, judged on each route's p95.
pub const GOAL_MS: f64 = 100.0;

async fn measure_all(
    http: &reqwest::Client,
    gw: &Gateway,
    plan: Plan,
    figures: &mut PagesFigures,
) -> anyhow::Result<()> {
    let cookie = login(http, &gw.base).await?;
    figures.dashboard = cookie.is_some();
    if cookie.is_none() {
        eprintln!("the dashboard is not served (POST /ui/login is 404): API routes only");
    }
    for route in routes(cookie.is_some()) {
        eprintln!("{} ({} requests)", route.path, plan.requests);
        let figure = measure(http, gw, &route, cookie.as_deref(), plan)
            .await
            .with_context(|| format!("measuring {}", route.path))?;
        figures.routes.push(figure);
    }
    Ok(())
}

/// What a response must show, checked on the first one: that the route
/// measured does the work it is named for.
#[derive(Debug, Clone, Copy)]
enum Check {
    /// Any 200.
    Ok,
    /// JSON whose `data` array has at least this many items.
    List(usize),
    /// JSON with a `session` object.
    Session,
    /// An HTML page.
    Html,
    /// An HTML page holding this text.
    HtmlWith(&'static str),
}

/// One route of the table.
#[derive(Debug, Clone)]
struct Route {
    name: &'static str,
    path: String,
    kind: RouteKind,
    check: Check,
}

/// The routes, in the order measured: the floor, the dashboard's pages
/// (when served), then the API routes the pages call.
fn routes(dashboard: bool) -> Vec<Route> {
    let route = |name, path: String, kind, check| Route {
        name,
        path,
        kind,
        check,
    };
    let mut out = vec![route(
        "floor",
        "/health".into(),
        RouteKind::Baseline,
        Check::Ok,
    )];
    if dashboard {
        out.extend([
            route("overview page", "/ui/".into(), RouteKind::Page, Check::Html),
            route(
                "transcript page (400 rows, tool calls)",
                format!("/ui/sessions/{LONG_SESSION}"),
                RouteKind::Page,
                Check::HtmlWith(LONG_MARKER),
            ),
            route(
                "sessions page",
                "/ui/sessions".into(),
                RouteKind::Page,
                Check::Html,
            ),
            route(
                "sessions page, search for a common word",
                format!("/ui/sessions?q={COMMON_WORD}"),
                RouteKind::Page,
                Check::Html,
            ),
            route(
                "sessions page, search for a rare word",
                format!("/ui/sessions?q={RARE_WORD}"),
                RouteKind::Page,
                Check::Html,
            ),
        ]);
    }
    out.extend([
        route(
            "detailed health",
            "/health/detailed".into(),
            RouteKind::Api,
            Check::Ok,
        ),
        route(
            "newest sessions",
            "/api/sessions?limit=20".into(),
            RouteKind::Api,
            Check::List(20),
        ),
        route(
            "search, a common word",
            format!("/api/sessions?q={COMMON_WORD}&limit=20"),
            RouteKind::Api,
            Check::List(20),
        ),
        route(
            "search, a rare word",
            format!("/api/sessions?q={RARE_WORD}&limit=20"),
            RouteKind::Api,
            Check::List(1),
        ),
        route(
            "one session",
            format!("/api/sessions/{LONG_SESSION}"),
            RouteKind::Api,
            Check::Session,
        ),
        route(
            "its first 100 messages",
            format!("/api/sessions/{LONG_SESSION}/messages?limit=100"),
            RouteKind::Api,
            Check::List(100),
        ),
    ]);
    out
}

/// Logs in as the dashboard's form does; returns the cookie to send back
/// (`talaria_session=…`), or `None` when this build has no dashboard.
async fn login(http: &reqwest::Client, base: &str) -> anyhow::Result<Option<String>> {
    let response = http
        .post(format!("{base}/ui/login"))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(format!("secret={}", form_encode(API_KEY)))
        .send()
        .await
        .context("the login request failed")?;
    let status = response.status();
    if status == StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if status != StatusCode::SEE_OTHER {
        let body = response.text().await.unwrap_or_default();
        bail!(
            "POST /ui/login answered {status}, not 303: {}",
            excerpt(&body)
        );
    }
    let location = response
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if location != "/ui/" {
        eprintln!("note: the login redirects to {location:?}, not \"/ui/\"");
    }
    response
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(session_cookie)
        .context("the login set no talaria_session cookie")
        .map(Some)
}

/// `name=value` of a `Set-Cookie` line when it sets a non-empty
/// `talaria_session`.
fn session_cookie(set_cookie: &str) -> Option<String> {
    let pair = set_cookie.split(';').next()?.trim();
    let (name, value) = pair.split_once('=')?;
    (name.trim() == "talaria_session" && !value.trim().is_empty()).then(|| pair.to_owned())
}

/// `application/x-www-form-urlencoded` for one value: unreserved bytes as
/// they are, everything else as `%XX`.
fn form_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One response as the client saw it.
struct Fetched {
    latency: Duration,
    status: StatusCode,
    content_type: String,
    body: Vec<u8>,
}

async fn fetch(
    http: &reqwest::Client,
    url: &str,
    kind: RouteKind,
    cookie: Option<&str>,
) -> anyhow::Result<Fetched> {
    let mut request = http.get(url);
    // Pages are a browser's: the cookie only. The API's routes take the key.
    request = match (kind, cookie) {
        (RouteKind::Page, Some(cookie)) => request.header(COOKIE, cookie),
        _ => request.bearer_auth(API_KEY),
    };
    let started = Instant::now();
    let mut response = request.send().await.context("request failed")?;
    let status = response.status();
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.context("body failed")? {
        body.extend_from_slice(&chunk);
    }
    Ok(Fetched {
        latency: started.elapsed(),
        status,
        content_type,
        body,
    })
}

/// Warm-up, then `plan.requests` requests one after another, each read to
/// its last byte.
async fn measure(
    http: &reqwest::Client,
    gw: &Gateway,
    route: &Route,
    cookie: Option<&str>,
    plan: Plan,
) -> anyhow::Result<RouteFigure> {
    let url = format!("{}{}", gw.base, route.path);
    for i in 0..plan.warmup.max(1) {
        let response = fetch(http, &url, route.kind, cookie).await?;
        ensure_ok(&response)?;
        if i == 0 {
            check(route.check, &response)?;
        }
    }
    let before = gw.sample()?;
    let mut latencies = Vec::with_capacity(plan.requests);
    let mut body_bytes = 0;
    for _ in 0..plan.requests {
        let response = fetch(http, &url, route.kind, cookie).await?;
        ensure_ok(&response)?;
        latencies.push(response.latency);
        body_bytes = response.body.len();
    }
    let after = gw.sample()?;
    let cpu_ms = (after.cpu_secs - before.cpu_secs) * 1000.0 / plan.requests.max(1) as f64;
    Ok(RouteFigure::from_samples(
        route.name,
        &route.path,
        route.kind,
        &mut latencies,
        body_bytes,
        cpu_ms,
    ))
}

fn ensure_ok(response: &Fetched) -> anyhow::Result<()> {
    if response.status != StatusCode::OK {
        bail!(
            "HTTP {}: {}",
            response.status,
            excerpt(&String::from_utf8_lossy(&response.body))
        );
    }
    Ok(())
}

/// Fails unless `response` shows what `check` asks for.
fn check(check: Check, response: &Fetched) -> anyhow::Result<()> {
    let html = || {
        if !response.content_type.starts_with("text/html") {
            bail!("expected an HTML page, got {:?}", response.content_type);
        }
        Ok(String::from_utf8_lossy(&response.body))
    };
    let json = || -> anyhow::Result<serde_json::Value> {
        serde_json::from_slice(&response.body).context("the answer is not JSON")
    };
    match check {
        Check::Ok => {}
        Check::Html => {
            html()?;
        }
        Check::HtmlWith(text) => {
            if !html()?.contains(text) {
                bail!("the page does not show {text:?}");
            }
        }
        Check::List(min) => {
            let v = json()?;
            let n = v["data"].as_array().map_or(0, Vec::len);
            if n < min {
                bail!(
                    "expected at least {min} items, got {n}: {}",
                    excerpt(&v.to_string())
                );
            }
        }
        Check::Session => {
            let v = json()?;
            if !v["session"].is_object() {
                bail!("no session in {}", excerpt(&v.to_string()));
            }
        }
    }
    Ok(())
}

fn excerpt(text: &str) -> String {
    text.chars().take(300).collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Fills a new store at `db` with `sessions` short sessions and the long
/// one, through the store's API; returns the rows written. The writes of
/// [`SEEDERS`] sessions at a time go to the store's writer together, so
/// they are committed in batches.
pub async fn seed(db: &Path, sessions: usize) -> anyhow::Result<usize> {
    let store = SqliteStore::open(db).with_context(|| format!("cannot open {}", db.display()))?;
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..SEEDERS {
        let (store, next) = (store.clone(), Arc::clone(&next));
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= sessions {
                    return anyhow::Ok(());
                }
                seed_short(&store, i).await?;
                if i > 0 && i.is_multiple_of(10_000) {
                    eprintln!("  {i} sessions");
                }
            }
        });
    }
    let long_store = store.clone();
    tasks.spawn(async move { seed_long(&long_store).await });
    while let Some(joined) = tasks.join_next().await {
        joined.context("a seeding task failed")??;
    }
    // The last handle: closing it waits for the writer thread, which
    // checkpoints the WAL, so the gateway opens a settled file.
    tokio::task::spawn_blocking(move || drop(store)).await?;
    Ok(sessions * ROWS_PER_SESSION + LONG_TURNS * 4)
}

/// A small deterministic generator (xorshift), so every run seeds the
/// same text.
struct Words(u64);

impl Words {
    fn new(seed: u64) -> Words {
        // Never zero: xorshift would stay at zero.
        Words(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// `n` words from [`WORDS`], space-separated.
    fn sentence(&mut self, n: usize) -> String {
        let words: Vec<&str> = (0..n)
            .map(|_| WORDS[(self.next() % WORDS.len() as u64) as usize])
            .collect();
        words.join(" ")
    }
}

/// The id of short session `i`, in the shape of real ids.
fn session_id(i: usize) -> String {
    format!("20260101_000000_{i:08x}")
}

/// The first message of short session `i`: [`COMMON_WORD`] in every fifth,
/// [`RARE_WORD`] in one in a thousand.
fn first_message(i: usize, words: &mut Words) -> String {
    let mut text = words.sentence(10);
    if i.is_multiple_of(5) {
        text.push_str(&format!(" {COMMON_WORD}"));
    }
    if i % 1000 == 7 {
        text.push_str(&format!(" {RARE_WORD}"));
    }
    text
}

/// One model call as the gateway records it with an answer.
fn call(tool_calls: u32, starts_turn: bool) -> Vec<ModelCall> {
    vec![ModelCall {
        provider: "custom".to_owned(),
        model: "bench-model".to_owned(),
        kind: "turn".to_owned(),
        usage: Usage {
            input_tokens: 1_200,
            output_tokens: 80,
            ..Usage::default()
        },
        cost_micros: 450,
        tool_calls,
        starts_turn,
    }]
}

async fn seed_short(store: &SqliteStore, i: usize) -> anyhow::Result<()> {
    let id = session_id(i);
    let source = SOURCES[i % SOURCES.len()];
    let chat = (i % 5_000 + 100_000).to_string();
    let from_chat = source == "telegram";
    store
        .create_session(NewSession {
            id: id.clone(),
            source: source.to_owned(),
            session_key: from_chat.then(|| format!("agent:main:telegram:dm:{chat}")),
            chat_id: from_chat.then(|| chat.clone()),
            user_id: from_chat.then_some(chat),
            model: Some("bench-model".to_owned()),
            ..NewSession::default()
        })
        .await?;
    let mut words = Words::new(i as u64);
    let first = first_message(i, &mut words);
    let title: String = first.chars().take(40).collect();
    store.set_title(&id, &title).await?;
    store.append_message(&id, &Message::user(first)).await?;
    if i.is_multiple_of(10) {
        let call_id = format!("call_{i}");
        let request = Message::assistant_tool_calls(
            "",
            vec![ToolCall {
                id: call_id.clone(),
                name: "terminal".to_owned(),
                arguments: r#"{"command":"ls -la"}"#.to_owned(),
            }],
        );
        store
            .append_message_with_calls(&id, &request, &call(1, true))
            .await?;
        let listing = (0..8)
            .map(|n| {
                format!(
                    "-rw-r--r-- 1 user user {} {}.txt",
                    100 * n,
                    words.sentence(1)
                )
            })
            .collect::<Vec<_>>()
            .join("\n");
        store
            .append_message(&id, &Message::tool_result(call_id, "terminal", listing))
            .await?;
    } else {
        let answer = Message::assistant(words.sentence(24));
        store
            .append_message_with_calls(&id, &answer, &call(0, true))
            .await?;
        store
            .append_message(&id, &Message::user(words.sentence(8)))
            .await?;
    }
    let answer = Message::assistant(words.sentence(30));
    let starts = !i.is_multiple_of(10);
    store
        .append_message_with_calls(&id, &answer, &call(0, starts))
        .await?;
    Ok(())
}

/// [`LONG_SESSION`]: [`LONG_TURNS`] turns of a question, a `read_file`
/// call, its result (a 40-line file) and an answer with a code block.
async fn seed_long(store: &SqliteStore) -> anyhow::Result<()> {
    store
        .create_session(NewSession {
            id: LONG_SESSION.to_owned(),
            source: "api".to_owned(),
            model: Some("bench-model".to_owned()),
            ..NewSession::default()
        })
        .await?;
    store
        .set_title(LONG_SESSION, "Refactoring the module tree")
        .await?;
    let mut words = Words::new(u64::MAX / 3);
    for turn in 0..LONG_TURNS {
        let mut question = format!("Step {turn}: {}", words.sentence(14));
        if turn == 0 {
            question.push_str(&format!(" ({LONG_MARKER})"));
        }
        store
            .append_message(LONG_SESSION, &Message::user(question))
            .await?;
        let call_id = format!("call_long_{turn}");
        let request = Message::assistant_tool_calls(
            "Let me read the file first.",
            vec![ToolCall {
                id: call_id.clone(),
                name: "read_file".to_owned(),
                arguments: format!(r#"{{"path":"src/module_{turn}.rs"}}"#),
            }],
        );
        store
            .append_message_with_calls(LONG_SESSION, &request, &call(1, true))
            .await?;
        let file = (1..=40)
            .map(|n| {
                format!(
                    "{n:4}| let {} = {}; // {}",
                    words.sentence(1),
                    n * turn,
                    words.sentence(5)
                )
            })
            .collect::<Vec<_>>()
            .join("\n");
        store
            .append_message(
                LONG_SESSION,
                &Message::tool_result(call_id, "read_file", file),
            )
            .await?;
        let answer = format!(
            "{}\n\n```rust\nfn step_{turn}() -> usize {{\n    {turn}\n}}\n```\n\n{}",
            words.sentence(30),
            words.sentence(20)
        );
        store
            .append_message_with_calls(LONG_SESSION, &Message::assistant(answer), &call(0, false))
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use talaria_core::Role;
    use talaria_store::{SearchQuery, SessionFilter};

    #[test]
    fn the_session_cookie_is_read_from_its_set_cookie_line() {
        assert_eq!(
            session_cookie("talaria_session=abc123; HttpOnly; SameSite=Strict; Path=/ui")
                .as_deref(),
            Some("talaria_session=abc123")
        );
        assert_eq!(session_cookie("other=abc; Path=/"), None);
        assert_eq!(session_cookie("talaria_session=; Max-Age=0"), None);
        assert_eq!(session_cookie("garbage"), None);
    }

    #[test]
    fn form_values_are_percent_encoded() {
        assert_eq!(form_encode("bench-key_0.9~"), "bench-key_0.9~");
        assert_eq!(form_encode("a b&c=d+é"), "a%20b%26c%3Dd%2B%C3%A9");
    }

    #[test]
    fn the_marked_words_are_where_the_seed_puts_them() {
        for marked in [COMMON_WORD, RARE_WORD, LONG_MARKER] {
            assert!(!WORDS.contains(&marked), "{marked}");
        }
        let (mut common, mut rare) = (0, 0);
        for i in 0..10_000 {
            let text = first_message(i, &mut Words::new(i as u64));
            common += usize::from(text.contains(COMMON_WORD));
            rare += usize::from(text.contains(RARE_WORD));
        }
        assert_eq!((common, rare), (2_000, 10));
        // The same text on every run.
        assert_eq!(
            Words::new(42).sentence(6),
            Words::new(42).sentence(6),
            "deterministic"
        );
        assert_ne!(Words::new(1).sentence(6), Words::new(2).sentence(6));
    }

    #[test]
    fn the_quick_plan_is_small_and_amounts_can_be_set() {
        let quick = Plan::new(true, None, None);
        assert!(quick.sessions <= 2_000 && quick.requests <= 20);
        let full = Plan::new(false, None, None);
        assert_eq!((full.sessions, full.requests), (100_000, 200));
        let set = Plan::new(false, Some(5), Some(0));
        assert_eq!((set.sessions, set.requests), (5, 1));
    }

    #[tokio::test]
    async fn the_seed_writes_every_session_and_the_long_transcript() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let rows = seed(&db, 1_010).await.unwrap();
        assert_eq!(rows, 1_010 * ROWS_PER_SESSION + LONG_TURNS * 4);

        let store = SqliteStore::open(&db).unwrap();
        let all = store.list_sessions(SessionFilter::default()).await.unwrap();
        assert_eq!(all.len(), 1_011);
        let sources = store.session_sources().await.unwrap();
        assert_eq!(sources.len(), 3, "{sources:?}");
        let one = store.session(&session_id(10)).await.unwrap().unwrap();
        assert_eq!(one.message_count, ROWS_PER_SESSION as u64);
        assert!(one.title.is_some());
        assert!(one.output_tokens > 0);
        // Every tenth session has a tool call and its result.
        let rows = store.messages(&session_id(10)).await.unwrap();
        assert!(rows[1].message.has_tool_calls());
        assert_eq!(rows[2].message.role, Role::Tool);

        let long = store.messages(LONG_SESSION).await.unwrap();
        assert_eq!(long.len(), LONG_TURNS * 4);
        assert!(long[0].message.content.contains(LONG_MARKER));
        assert_eq!(
            long.iter().filter(|m| m.message.has_tool_calls()).count(),
            LONG_TURNS
        );

        // Sessions 7 and 1007 hold the rare word; searches find them.
        let hits = store
            .search(SearchQuery {
                text: RARE_WORD.to_owned(),
                sources: vec![],
                exclude_session: None,
                limit: 20,
            })
            .await
            .unwrap();
        let mut found: Vec<String> = hits.into_iter().map(|h| h.session.id).collect();
        found.sort();
        assert_eq!(found, vec![session_id(7), session_id(1007)]);
        let common = store
            .search(SearchQuery {
                text: COMMON_WORD.to_owned(),
                sources: vec![],
                exclude_session: None,
                limit: 20,
            })
            .await
            .unwrap();
        assert_eq!(common.len(), 20);
    }
}
