//! The dashboard in a real browser: Debian's headless Chromium, driven
//! over the DevTools protocol (through `talaria_web::Browser`, the
//! browser tools' own driver), against `talaria gateway run` with the
//! testkit's mock model. It logs in, finds a session by search and opens
//! its transcript (whose markup stays inert), chats and sees the answer
//! stream in after approving a command, approves a pairing request,
//! pauses a cron job and edits a memory entry. A screenshot of each page
//! is kept in `target/tmp/dashboard-screenshots/`.

use crate::api_gateway;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use api_gateway::{ApiGateway, free_port};
use serde_json::{Value, json};
use talaria_core::config::{BrowserConfig, WebConfig};
use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};
use talaria_web::UrlGuard;
use talaria_web::browser::Browser;

const KEY: &str = "dashboard-browser-key-0123456789ab";
const TAB: &str = "dashboard";

struct Setup {
    process: ApiGateway,
    dir: tempfile::TempDir,
    home: PathBuf,
    http: reqwest::Client,
    browser: Browser,
    shots: PathBuf,
}

impl Setup {
    async fn start(llm: &MockOpenAi) -> Setup {
        let browser_config = BrowserConfig::default();
        if let Err(e) = Browser::available(&browser_config) {
            panic!(
                "the dashboard's browser test needs Chromium (apt install chromium; scripts/test installs it): {e}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let port = free_port();
        std::fs::write(
            home.join("config.yaml"),
            format!(
                "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n  \
                 api_key: sk-test-secret-key-0123456789\nagent:\n  api_max_retries: 0\n\
                 gateway:\n  owners:\n    api_server: [\"*\"]\n\
                 platforms:\n  api_server:\n    port: {port}\n",
                llm.base_url()
            ),
        )
        .unwrap();
        std::fs::write(home.join(".env"), format!("API_SERVER_KEY={KEY}\n")).unwrap();
        let process = ApiGateway::start_in(&home, port, dir.path()).await;
        // The dashboard is on 127.0.0.1, which the browser tools' guard
        // refuses unless told.
        let web = WebConfig {
            allow_private: true,
            ..WebConfig::default()
        };
        let guard = UrlGuard::from_config(&web).unwrap();
        let browser = Browser::new(&browser_config, guard, dir.path().join("browser"));
        let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
        std::fs::create_dir_all(&shots).unwrap();
        Setup {
            process,
            dir,
            home,
            http: reqwest::Client::new(),
            browser,
            shots,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.process.url)
    }

    async fn api(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let response = self
            .http
            .request(method, self.url(path))
            .bearer_auth(KEY)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "{path}: {status} {body}");
        body
    }

    async fn open(&self, path: &str) {
        self.browser.navigate(TAB, &self.url(path)).await.unwrap();
    }

    /// Runs `script` in the page; its value as text.
    async fn eval(&self, script: &str) -> String {
        self.browser.evaluate(TAB, script).await.unwrap()
    }

    /// Waits until `condition` (a JavaScript expression) is true in the
    /// page; a navigation in between is waited out.
    async fn wait_for(&self, condition: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(v) = self
                .browser
                .evaluate(TAB, &format!("!!({condition})"))
                .await
                && v == "true"
            {
                return;
            }
            if Instant::now() > deadline {
                let body = self
                    .browser
                    .evaluate(TAB, "document.body ? document.body.innerText : ''")
                    .await
                    .unwrap_or_default();
                panic!(
                    "never true in the page: {condition}\npage text:\n{body}\ngateway log:\n{}",
                    self.process.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Keeps a screenshot of what the page shows now.
    async fn shot(&self, name: &str) {
        let png = self.browser.screenshot(TAB, false).await.unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{name} is not a PNG");
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        eprintln!("screenshot: {}", path.display());
    }
}

/// A JavaScript string literal of `text`.
fn js(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_uses_the_dashboard_in_chromium() {
    let llm = MockOpenAi::start().await;
    let setup = Setup::start(&llm).await;

    // A conversation to find, with markup in it that must stay inert.
    llm.push_when(
        "zanzibar",
        Reply::text(
            "Zanzibar is an archipelago. <img src=x onerror=\"window.pwned=2\"> \
             [more](javascript:window.pwned=3)",
        ),
    );
    let found = setup
        .api(
            reqwest::Method::POST,
            "/api/sessions",
            json!({"title": "Island trip"}),
        )
        .await;
    let found_id = found["session"]["id"].as_str().unwrap().to_owned();
    setup
        .api(
            reqwest::Method::POST,
            &format!("/api/sessions/{found_id}/chat"),
            json!({"input": "Tell me about zanzibar <script>window.pwned=1</script>"}),
        )
        .await;
    // Others, so the search has something to leave out.
    for title in ["Groceries", "Taxes"] {
        setup
            .api(
                reqwest::Method::POST,
                "/api/sessions",
                json!({"title": title}),
            )
            .await;
    }

    // Log in.
    setup.open("/ui/").await;
    setup.wait_for("location.pathname === '/ui/login'").await;
    setup.shot("login").await;
    setup
        .eval(&format!(
            "document.getElementById('secret').value = {}; \
             document.getElementById('login-form').requestSubmit(); 1",
            js(KEY)
        ))
        .await;
    setup
        .wait_for("location.pathname === '/ui/' && document.getElementById('platforms')")
        .await;
    setup
        .wait_for("document.body.innerText.includes('api_server')")
        .await;
    setup.shot("overview").await;

    // Find the session by a word of its transcript and open it.
    setup.open("/ui/sessions").await;
    setup
        .eval(
            "document.getElementById('session-search').value = 'zanzibar'; \
             document.querySelector('form.search').requestSubmit(); 1",
        )
        .await;
    // The address changes when the results page commits, before its
    // document is parsed: wait for the whole page.
    setup
        .wait_for("location.search.includes('q=zanzibar') && document.readyState === 'complete'")
        .await;
    let links = setup
        .eval("Array.from(document.querySelectorAll('.session-link')).map(a => a.textContent.trim()).join('|')")
        .await;
    assert_eq!(links, "Island trip");
    setup.shot("sessions").await;
    setup
        .eval("document.querySelector('.session-link').click(); 1")
        .await;
    setup
        .wait_for(&format!(
            "location.pathname === {}",
            js(&format!("/ui/sessions/{found_id}"))
        ))
        .await;
    setup
        .wait_for("document.getElementById('transcript')")
        .await;
    let transcript = setup
        .eval("document.getElementById('transcript').innerText")
        .await;
    assert!(
        transcript.contains("<script>window.pwned=1</script>"),
        "{transcript}"
    );
    assert!(
        transcript.contains("Zanzibar is an archipelago."),
        "{transcript}"
    );
    // Shown as text, run as nothing.
    assert_eq!(setup.eval("String(window.pwned)").await, "undefined");
    assert_eq!(
        setup.eval("document.querySelectorAll('#transcript img, #transcript script, #transcript a').length").await,
        "0"
    );
    setup.shot("transcript").await;

    // Chat: the model asks to run a command the guard flags; the
    // operator approves it in the page; the answer streams in.
    let victim = setup.dir.path().join("victim");
    std::fs::create_dir_all(victim.join("inside")).unwrap();
    let args = json!({"command": format!("rm -r {}", victim.display())}).to_string();
    llm.push_when(
        "clean up the victim",
        Reply::tool_calls(vec![ToolCallReply::new("call_rm", "terminal", args)])
            .with_text("Let me clean up."),
    );
    let answer = "Removed the directory. Everything that was inside it is gone now, and the \
                  workspace is clean again.";
    llm.push_when(
        "call_rm",
        Reply::text(answer).with_chunk_pause(Duration::from_millis(120)),
    );
    setup.open("/ui/chat").await;
    setup
        .eval(
            "document.getElementById('chat-input').value = 'Please clean up the victim folder'; \
             document.getElementById('chat-send').click(); 1",
        )
        .await;
    setup
        .wait_for("document.querySelector('[data-decision=\"once\"]')")
        .await;
    let asked = setup
        .eval("document.querySelector('.approval').innerText")
        .await;
    assert!(
        asked.contains(&format!("rm -r {}", victim.display())),
        "{asked}"
    );
    assert!(victim.exists(), "nothing runs before the approval");
    setup.shot("chat-approval").await;
    setup
        .eval("document.querySelector('[data-decision=\"once\"]').click(); 1")
        .await;
    // Watch the answer grow: several partial lengths before the end.
    let mut partial = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let shown = setup
            .eval("(document.querySelector('.msg.assistant:last-child .text') || {}).textContent || ''")
            .await;
        if shown == answer {
            break;
        }
        if !shown.is_empty() {
            partial.insert(shown.len());
        }
        assert!(
            Instant::now() < deadline,
            "the answer never completed: {shown:?}"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(
        partial.len() >= 2,
        "the answer should appear piece by piece, saw {partial:?}"
    );
    setup
        .wait_for("document.getElementById('chat-send').disabled === false")
        .await;
    assert!(!victim.exists(), "the approved command ran");
    let url = setup.eval("location.search").await;
    assert!(url.starts_with("?session="), "{url}");
    setup.shot("chat").await;

    // An attachment: a text file picked in the page reaches the model
    // with the message, through the media cache like a file sent in a
    // chat app.
    llm.push_when("cardamom", Reply::text("Your notes name cardamom."));
    setup
        .eval(
            "const file = new File(['The secret ingredient is cardamom.'], 'notes.txt', \
             {type: 'text/plain'}); \
             const picked = new DataTransfer(); picked.items.add(file); \
             const input = document.getElementById('chat-file'); input.files = picked.files; \
             input.dispatchEvent(new Event('change')); \
             document.getElementById('chat-input').value = 'What do my notes say?'; \
             document.getElementById('chat-send').click(); 1",
        )
        .await;
    setup
        .wait_for("(document.querySelector('.msg.assistant:last-child .text') || {}).textContent === 'Your notes name cardamom.'")
        .await;
    let shown = setup
        .eval("document.getElementById('conversation').innerText")
        .await;
    assert!(shown.contains("[notes.txt]"), "{shown}");
    setup.shot("chat-attachment").await;

    // Pairing: a stranger asked on Telegram and was given a code.
    let store = talaria_store::SqliteStore::open(&setup.home.join("state.db")).unwrap();
    let pairing = talaria_gateway::pairing::Pairing::new(Arc::new(store));
    let offered = pairing
        .offer("telegram", "4242", Some("Ada"), "4242")
        .await
        .unwrap();
    let Some(talaria_gateway::pairing::OfferReply::Code(text)) = offered else {
        panic!("no code offered: {offered:?}");
    };
    let code = text
        .split("pairing code: `")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .unwrap()
        .to_owned();
    setup.open("/ui/pairing").await;
    setup
        .wait_for("document.getElementById('pending').innerText.includes('4242')")
        .await;
    setup
        .eval(&format!(
            "document.getElementById('approve-platform').value = 'telegram'; \
             document.getElementById('approve-code').value = {}; \
             document.getElementById('approve-form').requestSubmit(); 1",
            js(&code)
        ))
        .await;
    setup.wait_for("document.getElementById('flash') && document.getElementById('flash').innerText.includes('Approved')").await;
    setup
        .wait_for("document.getElementById('approved').innerText.includes('4242')")
        .await;
    setup.shot("pairing").await;
    let state = setup
        .api(reqwest::Method::GET, "/api/pairing", json!({}))
        .await;
    assert_eq!(state["approved"][0]["user_id"], "4242", "{state}");

    // Cron: pause a job.
    let job = setup
        .api(
            reqwest::Method::POST,
            "/api/jobs",
            json!({"schedule": "every 2h", "prompt": "Water the plants", "name": "plants"}),
        )
        .await;
    let job_id = job["id"].as_str().unwrap().to_owned();
    setup.open("/ui/cron").await;
    setup
        .eval(&format!(
            "document.querySelector('tr[data-job=' + JSON.stringify({}) + '] form[action$=\"/pause\"] button').click(); 1",
            js(&job_id)
        ))
        .await;
    setup.wait_for("document.getElementById('flash') && document.getElementById('flash').innerText.includes('Paused')").await;
    setup.shot("cron").await;
    let job = setup
        .api(
            reqwest::Method::GET,
            &format!("/api/jobs/{job_id}"),
            json!({}),
        )
        .await;
    assert_eq!(job["state"], "paused");

    // Memory: edit an entry in the page; the memory tool makes the change
    // and the learning log records it.
    setup
        .api(
            reqwest::Method::POST,
            "/api/memory",
            json!({"action": "add", "target": "user", "content": "Prefers tea in the morning"}),
        )
        .await;
    setup.open("/ui/memory").await;
    setup
        .eval(
            "const box = document.querySelector('#memory-user textarea[name=content]');              box.value = 'Prefers coffee in the morning';              box.form.requestSubmit(); 1",
        )
        .await;
    setup.wait_for("document.getElementById('flash') && document.getElementById('flash').className.includes('ok')").await;
    setup.wait_for("document.querySelector('#memory-user textarea[name=content]').value === 'Prefers coffee in the morning'").await;
    setup.shot("memory").await;
    let memory = setup
        .api(reqwest::Method::GET, "/api/memory", json!({}))
        .await;
    let user = memory["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["target"] == "user")
        .unwrap();
    assert_eq!(
        user["entries"],
        json!(["Prefers coffee in the morning"]),
        "{memory}"
    );
    let log = setup
        .api(reqwest::Method::GET, "/api/learning?limit=5", json!({}))
        .await;
    assert_eq!(log["data"][0]["target"], "memory:USER.md", "{log}");
    assert_eq!(log["data"][0]["actor"], "api", "{log}");

    // Skills, the learning log and the graph show what was learned.
    setup
        .api(
            reqwest::Method::POST,
            "/api/skills",
            json!({"name": "brew-coffee", "content": "---\nname: brew-coffee\ndescription: How the user likes coffee made\n---\n\nGrind fine, brew four minutes.\n"}),
        )
        .await;
    setup.open("/ui/skills/brew-coffee").await;
    setup
        .wait_for("document.getElementById('skill-content').value.includes('Grind fine')")
        .await;
    setup.shot("skill").await;
    setup.open("/ui/learning").await;
    setup
        .wait_for("document.getElementById('learning-log').innerText.includes('skill:brew-coffee')")
        .await;
    setup.shot("learning").await;
    setup.open("/ui/graph").await;
    setup
        .wait_for("document.querySelector('#learning-graph .node.yours')")
        .await;
    setup.shot("graph").await;

    // The configuration, masked, with the check's findings.
    setup.open("/ui/config").await;
    setup.wait_for("document.getElementById('findings')").await;
    let shown = setup.eval("document.body.innerText").await;
    for secret in [KEY, "sk-test-secret-key-0123456789"] {
        assert!(
            !shown.contains(secret),
            "a secret on the config page:\n{shown}"
        );
    }
    assert!(shown.contains("mock-model"), "{shown}");
    setup.shot("config").await;

    // The logs: the gateway's own lines, as `gateway start` keeps them in
    // logs/gateway.log, filtered by level and text.
    let logs = setup.home.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::copy(setup.home.join("gateway.log"), logs.join("gateway.log")).unwrap();
    setup.open("/ui/logs").await;
    setup
        .eval(
            "document.getElementById('log-text').value = 'listening';              document.querySelector('#log-filter select[name=level]').value = 'info';              document.getElementById('log-filter').requestSubmit(); 1",
        )
        .await;
    setup
        .wait_for("location.search.includes('filter=listening')")
        .await;
    setup
        .wait_for("document.getElementById('log-lines').innerText.includes('API server listening')")
        .await;
    let lines = setup
        .eval("document.getElementById('log-lines').innerText")
        .await;
    assert!(
        lines
            .lines()
            .filter(|l| !l.trim().is_empty())
            .all(|l| l.contains("listening")),
        "{lines}"
    );
    setup.shot("logs").await;

    setup.browser.close_all().await;
}
