//! The dashboard's protections through the real binary, over plain HTTP:
//! nothing answers without a login, a change without the page's CSRF
//! token (or from another origin) is refused and changes nothing, what a
//! chat wrote reaches the page escaped, logins are throttled and end on
//! logout, and the dashboard can have a port of its own. The browser test
//! (`dashboard_browser.rs`) drives the pages themselves.

use crate::api_gateway;

use api_gateway::{ApiGateway, free_port};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_SECURITY_POLICY, LOCATION, SET_COOKIE};
use serde_json::{Value, json};
use talaria_testkit::{MockOpenAi, Reply};

const KEY: &str = "dashboard-test-key-0123456789abcdef";

struct Ui {
    process: ApiGateway,
    _dir: tempfile::TempDir,
    /// Never follows redirects: the tests look at them.
    http: reqwest::Client,
    /// Where the dashboard is (the API's address unless it has its own).
    ui: String,
}

impl Ui {
    async fn start(llm: &MockOpenAi, extra: &str) -> Ui {
        Ui::start_with(llm, extra, None).await
    }

    async fn start_with(llm: &MockOpenAi, extra: &str, own_port: Option<u16>) -> Ui {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let port = free_port();
        let own = own_port
            .map(|p| format!("dashboard:\n  port: {p}\n"))
            .unwrap_or_default();
        std::fs::write(
            home.join("config.yaml"),
            format!(
                "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n  \
                 api_key: sk-test-secret-key-0123456789\nagent:\n  api_max_retries: 0\n\
                 platforms:\n  api_server:\n    port: {port}\n{own}{extra}",
                llm.base_url()
            ),
        )
        .unwrap();
        std::fs::write(home.join(".env"), format!("API_SERVER_KEY={KEY}\n")).unwrap();
        let process = ApiGateway::start_in(&home, port, dir.path()).await;
        let ui = match own_port {
            Some(p) => format!("http://127.0.0.1:{p}"),
            None => process.url.clone(),
        };
        Ui {
            process,
            _dir: dir,
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            ui,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.ui)
    }

    /// Logs in with `secret`: the answer, and the session cookie if one
    /// was set.
    async fn login(&self, secret: &str) -> (reqwest::Response, Option<String>) {
        let response = self
            .http
            .post(self.url("/ui/login"))
            .form(&[("secret", secret)])
            .send()
            .await
            .unwrap();
        let cookie = response
            .headers()
            .get_all(SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|v| v.starts_with("talaria_session="))
            .map(|v| v.split(';').next().unwrap().to_owned());
        (response, cookie)
    }

    async fn logged_in(&self) -> String {
        let (response, cookie) = self.login(KEY).await;
        assert_eq!(
            response.status(),
            StatusCode::SEE_OTHER,
            "{}",
            self.process.log()
        );
        cookie.expect("a session cookie")
    }

    async fn get(&self, cookie: Option<&str>, path: &str) -> reqwest::Response {
        let mut request = self.http.get(self.url(path));
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie);
        }
        request.send().await.unwrap()
    }

    async fn page(&self, cookie: &str, path: &str) -> String {
        let response = self.get(Some(cookie), path).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        response.text().await.unwrap()
    }

    async fn post_form(
        &self,
        cookie: Option<&str>,
        path: &str,
        fields: &[(&str, &str)],
        origin: Option<&str>,
    ) -> reqwest::Response {
        let mut request = self.http.post(self.url(path)).form(fields);
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie);
        }
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send().await.unwrap()
    }

    /// The API itself, with the key.
    async fn api(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let response = self
            .http
            .request(method, format!("{}{path}", self.process.url))
            .bearer_auth(KEY)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
        response.json().await.unwrap()
    }
}

/// The CSRF token a page carries.
fn csrf_of(html: &str) -> String {
    let start = html
        .find("name=\"csrf-token\" content=\"")
        .expect("a csrf meta tag")
        + 27;
    html[start..][..64].to_owned()
}

const PAGES: &[&str] = &[
    "/ui/",
    "/ui/sessions",
    "/ui/sessions?q=secret",
    "/ui/chat",
    "/ui/pairing",
    "/ui/cron",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_login_every_page_and_route_refuses() {
    let llm = MockOpenAi::start().await;
    llm.push(Reply::text("the secret answer"));
    let ui = Ui::start(&llm, "").await;
    let session = ui
        .api(
            reqwest::Method::POST,
            "/api/sessions",
            json!({"title": "secret title"}),
        )
        .await;
    let id = session["session"]["id"].as_str().unwrap().to_owned();
    let transcript = format!("/ui/sessions/{id}");

    for cookie in [None, Some("talaria_session=forged0000"), Some("other=1")] {
        for path in PAGES.iter().copied().chain([transcript.as_str()]) {
            let response = ui.get(cookie, path).await;
            assert_eq!(response.status(), StatusCode::SEE_OTHER, "{path}");
            let to = response.headers()[LOCATION].to_str().unwrap().to_owned();
            assert!(to.starts_with("/ui/login?next="), "{path} -> {to}");
            let body = response.text().await.unwrap();
            assert!(!body.contains("secret"), "{path}: {body}");
        }
        for path in [
            "/ui/api/v1/models",
            "/ui/api/api/sessions",
            "/ui/api/health/detailed",
        ] {
            let response = ui.get(cookie, path).await;
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path}");
        }
        for path in [
            "/ui/cron",
            "/ui/pairing/approve",
            &format!("/ui/sessions/{id}/delete"),
            "/ui/logout",
        ] {
            let response = ui.post_form(cookie, path, &[("csrf", "x")], None).await;
            assert_ne!(response.status(), StatusCode::SEE_OTHER, "{path}");
            assert!(
                response.status().is_client_error(),
                "{path}: {}",
                response.status()
            );
        }
    }
    // The session is still there.
    ui.api(
        reqwest::Method::GET,
        &format!("/api/sessions/{id}"),
        json!({}),
    )
    .await;

    // The login page and the assets answer to anyone; the pages, once
    // logged in.
    assert_eq!(ui.get(None, "/ui/login").await.status(), StatusCode::OK);
    assert_eq!(
        ui.get(None, "/ui/assets/app.css").await.status(),
        StatusCode::OK
    );
    let cookie = ui.logged_in().await;
    for path in PAGES.iter().copied().chain([transcript.as_str()]) {
        ui.page(&cookie, path).await;
    }
    assert!(ui.page(&cookie, &transcript).await.contains("secret title"));

    // Logging out ends the login: the same cookie no longer opens a page.
    let csrf = csrf_of(&ui.page(&cookie, "/ui/").await);
    let out = ui
        .post_form(Some(&cookie), "/ui/logout", &[("csrf", &csrf)], None)
        .await;
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        ui.get(Some(&cookie), "/ui/").await.status(),
        StatusCode::SEE_OTHER
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_change_is_refused_and_changes_nothing() {
    let llm = MockOpenAi::start().await;
    let ui = Ui::start(&llm, "").await;
    let job = ui
        .api(
            reqwest::Method::POST,
            "/api/jobs",
            json!({"schedule": "every 30m", "prompt": "say hi", "name": "nightly"}),
        )
        .await;
    let job_id = job["id"].as_str().unwrap().to_owned();
    let cookie = ui.logged_in().await;
    let csrf = csrf_of(&ui.page(&cookie, "/ui/cron").await);
    let pause = format!("/ui/cron/{job_id}/pause");
    // Each forgery: the form's fields and the Origin sent.
    type Forgery<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
    let forged: [Forgery; 4] = [
        (&[], None),
        (&[("csrf", "0123")], None),
        (&[("csrf", &csrf[..63])], None),
        (&[("csrf", &csrf)], Some("http://evil.example")),
    ];
    for (fields, origin) in forged {
        let response = ui.post_form(Some(&cookie), &pause, fields, origin).await;
        assert_eq!(
            response.status(),
            StatusCode::FORBIDDEN,
            "{fields:?} {origin:?}"
        );
    }
    let state = ui
        .api(
            reqwest::Method::GET,
            &format!("/api/jobs/{job_id}"),
            json!({}),
        )
        .await;
    assert_eq!(state["state"], "scheduled");

    // The script's route needs the token as a header.
    let bare = ui
        .http
        .post(ui.url(&format!("/ui/api/api/jobs/{job_id}/pause")))
        .header("cookie", &cookie)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status(), StatusCode::FORBIDDEN);
    let state = ui
        .api(
            reqwest::Method::GET,
            &format!("/api/jobs/{job_id}"),
            json!({}),
        )
        .await;
    assert_eq!(state["state"], "scheduled");

    // With the token, from this origin, it is done.
    let origin = ui.ui.clone();
    let done = ui
        .post_form(Some(&cookie), &pause, &[("csrf", &csrf)], Some(&origin))
        .await;
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let state = ui
        .api(
            reqwest::Method::GET,
            &format!("/api/jobs/{job_id}"),
            json!({}),
        )
        .await;
    assert_eq!(state["state"], "paused");
    // And the page after it says so, once.
    let flash_cookie = done
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .find_map(|v| v.to_str().ok().filter(|v| v.starts_with("talaria_flash=")))
        .map(|v| v.split(';').next().unwrap().to_owned())
        .expect("the outcome is carried to the next page");
    let page = ui
        .page(&format!("{cookie}; {flash_cookie}"), "/ui/cron")
        .await;
    assert!(page.contains("Paused nightly."), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transcript_with_markup_renders_inert() {
    let llm = MockOpenAi::start().await;
    llm.push(Reply::text(
        "Sure: <img src=x onerror=\"window.pwned=2\"> and [click](javascript:window.pwned=3) \
         and <a href=\"javascript:window.pwned=4\">this</a>",
    ));
    let ui = Ui::start(&llm, "").await;
    let session = ui
        .api(
            reqwest::Method::POST,
            "/api/sessions",
            json!({"title": "<b>bold</b>"}),
        )
        .await;
    let id = session["session"]["id"].as_str().unwrap().to_owned();
    ui.api(
        reqwest::Method::POST,
        &format!("/api/sessions/{id}/chat"),
        json!({"input": "<script>window.pwned=1</script> hello"}),
    )
    .await;
    let cookie = ui.logged_in().await;
    let response = ui.get(Some(&cookie), &format!("/ui/sessions/{id}")).await;
    let policy = response.headers()[CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(policy.contains("script-src 'self'"), "{policy}");
    // Named or numeric entities are both escaping; read them one way.
    let html = response
        .text()
        .await
        .unwrap()
        .replace("&#60;", "&lt;")
        .replace("&#62;", "&gt;")
        .replace("&#34;", "&quot;");
    assert!(
        html.contains("&lt;script&gt;window.pwned=1&lt;/script&gt; hello"),
        "{html}"
    );
    assert!(html.contains("&lt;b&gt;bold&lt;/b&gt;"), "{html}");
    assert!(html.contains("&lt;img src=x onerror="), "{html}");
    let lower = html.to_ascii_lowercase();
    for forbidden in [
        "<script>window",
        "<img src=x",
        "href=\"javascript:",
        "<b>bold",
        "onerror=\"",
    ] {
        assert!(!lower.contains(forbidden), "{forbidden} in {html}");
    }
    // The only script is the dashboard's own file.
    assert_eq!(lower.matches("<script").count(), 1, "{html}");
    assert!(lower.contains("<script src=\"/ui/assets/app.js\" defer></script>"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_logs_in_and_failed_logins_are_throttled() {
    let llm = MockOpenAi::start().await;
    // The hash comes from the command an operator runs.
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_talaria"))
        .args(["dashboard", "hash-password"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    command
        .stdin
        .take()
        .unwrap()
        .write_all(b"correct horse battery\n")
        .unwrap();
    let out = command.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hash = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(hash.starts_with("$argon2id$"), "{hash}");
    let ui = Ui::start(&llm, &format!("dashboard:\n  password_hash: '{hash}'\n")).await;

    let (response, cookie) = ui.login("correct horse battery").await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let set = response
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|v| v.starts_with("talaria_session="))
        .unwrap();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(set.contains(flag), "{set}");
    }
    let password_cookie = cookie.unwrap();
    assert!(!password_cookie.contains(KEY) && !set.contains("correct horse"));
    ui.page(&password_cookie, "/ui/").await;

    // A login goes on to the page it was asked from, never elsewhere.
    let next = ui
        .http
        .post(ui.url("/ui/login"))
        .form(&[("secret", KEY), ("next", "/ui/cron")])
        .send()
        .await
        .unwrap();
    assert_eq!(next.headers()[LOCATION], "/ui/cron");
    let away = ui
        .http
        .post(ui.url("/ui/login"))
        .form(&[("secret", KEY), ("next", "//evil.example/")])
        .send()
        .await
        .unwrap();
    assert_eq!(away.headers()[LOCATION], "/ui/");

    for _ in 0..10 {
        let (response, cookie) = ui.login("wrong password").await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert!(cookie.is_none());
        let body = response.text().await.unwrap();
        assert!(
            body.contains("neither the API key nor the password"),
            "{body}"
        );
    }
    // Now even the right key waits.
    let (response, cookie) = ui.login(KEY).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(cookie.is_none());
    // A login made before goes on working.
    ui.page(&password_cookie, "/ui/").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_can_have_a_port_of_its_own() {
    let llm = MockOpenAi::start().await;
    let own = free_port();
    let ui = Ui::start_with(&llm, "", Some(own)).await;
    // Not on the API's port...
    let on_api = ui
        .http
        .get(format!("{}/ui/login", ui.process.url))
        .send()
        .await
        .unwrap();
    assert_eq!(on_api.status(), StatusCode::NOT_FOUND);
    // ...but on its own, calling the API in-process.
    let cookie = ui.logged_in().await;
    let page = ui.page(&cookie, "/ui/").await;
    assert!(page.contains("Platforms"), "{page}");
    let models = ui.get(Some(&cookie), "/ui/api/v1/models").await;
    assert_eq!(models.status(), StatusCode::OK);
    let models: Value = models.json().await.unwrap();
    assert_eq!(models["data"][0]["id"], "mock-model");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_of_a_shared_store_serve_the_same_dashboard_and_logins() {
    let llm = MockOpenAi::start().await;
    let schema = talaria_testkit::postgres::fresh_schema().await;
    let store = format!(
        "store:\n  backend: postgres\n  postgres_url: {}\n  postgres_schema: {schema}\n  \
         postgres_max_connections: 4\n",
        talaria_testkit::postgres::url()
    );
    let a = Ui::start(&llm, &store).await;
    let b = Ui::start(&llm, &store).await;
    let made = a
        .api(
            reqwest::Method::POST,
            "/api/sessions",
            json!({"title": "made on node a"}),
        )
        .await;
    let id = made["session"]["id"].as_str().unwrap().to_owned();

    // Logged in on one node, known on the other.
    let cookie = a.logged_in().await;
    let page = b.page(&cookie, "/ui/sessions").await;
    assert!(page.contains("made on node a"), "{page}");
    let transcript = b.page(&cookie, &format!("/ui/sessions/{id}")).await;
    assert!(transcript.contains("made on node a"));

    // A change made through one node's page, with its token, is done.
    let csrf = csrf_of(&b.page(&cookie, "/ui/").await);
    let renamed = b
        .post_form(
            Some(&cookie),
            &format!("/ui/sessions/{id}/rename"),
            &[("csrf", &csrf), ("title", "renamed on node b")],
            None,
        )
        .await;
    assert_eq!(renamed.status(), StatusCode::SEE_OTHER);
    assert!(
        a.page(&cookie, &format!("/ui/sessions/{id}"))
            .await
            .contains("renamed on node b")
    );

    // Logging out on one node ends the login on both.
    let out = b
        .post_form(Some(&cookie), "/ui/logout", &[("csrf", &csrf)], None)
        .await;
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    for node in [&a, &b] {
        assert_eq!(
            node.get(Some(&cookie), "/ui/").await.status(),
            StatusCode::SEE_OTHER
        );
    }
}
