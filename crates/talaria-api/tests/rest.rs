//! The REST routes end to end: a real HTTP client against the server on
//! 127.0.0.1, a real SQLite store, the real agent on the mock model, and
//! the gateway's real cron scheduler, pairing and status board.

use crate::api_support;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use talaria_api::{ApiServer, ApiServerSettings, GatewayServices};
use talaria_core::{Config, Home, Message, Secret, ToolCall};
use talaria_gateway::cron::{Scheduler, SchedulerParts};
use talaria_gateway::delivery::Delivery;
use talaria_gateway::hooks::Hooks;
use talaria_gateway::supervisor::StatusBoard;
use talaria_store::{
    GatewayStore, NewSession, PairingLimits, PairingStore, RouteStore, SessionStore, SqliteStore,
};
use talaria_testkit::{MockOpenAi, Reply};
use tokio_util::sync::CancellationToken;

const KEY: &str = "rest-key-0123456789abcdef";

/// Routes described in the OpenAPI document that the other two parts of
/// issue 27 add (Responses and runs; a session's chat). They must not be
/// served yet here; once merged they are, and this test says to empty the
/// list.
const NOT_YET_SERVED: &[(&str, &str)] = &[];

struct Rig {
    mock: MockOpenAi,
    _dir: tempfile::TempDir,
    home: Home,
    store: Arc<SqliteStore>,
    board: Arc<StatusBoard>,
    base: String,
    client: reqwest::Client,
    shutdown: CancellationToken,
}

async fn rig(with_gateway: bool, configure: impl FnOnce(&mut Config)) -> Rig {
    let mock = MockOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    home.ensure().unwrap();
    let store = Arc::new(SqliteStore::open(&home.state_db()).unwrap());
    let agent = api_support::agent_over(&mock, dir.path(), home.clone(), store.clone(), configure);
    let config = agent.parts().config.clone();
    let settings = ApiServerSettings {
        host: "127.0.0.1".into(),
        port: 0,
        key: Secret::new(KEY),
        max_concurrent_runs: 0,
        busy_wait: std::time::Duration::from_secs(60),
    };
    let board = Arc::new(StatusBoard::default());
    let mut server = ApiServer::bind(settings, agent.clone()).await.unwrap();
    if with_gateway {
        let gateway_store: Arc<dyn GatewayStore> = store.clone();
        let scheduler = Scheduler::new(SchedulerParts {
            config: config.clone(),
            home: home.clone(),
            agent: agent.clone(),
            store: gateway_store.clone(),
            delivery: Delivery::new(vec![], None).with_local_dir(home.cron_output_dir()),
            hooks: Arc::new(Hooks::load(&home)),
            await_hooks: true,
            backends: None,
        })
        .unwrap();
        server = server.with_gateway(GatewayServices {
            store: gateway_store,
            // As the gateway: no scheduler while cron is disabled.
            scheduler: config.cron.enabled.then_some(scheduler),
            board: board.clone(),
            platforms: Vec::new(),
            running_turns: Arc::new(|| 0),
            config_report: Arc::new(|| json!({"config": {"probe": true}})),
            metrics: None,
        });
    }
    let base = format!("http://{}", server.local_addr());
    let shutdown = CancellationToken::new();
    tokio::spawn(server.serve(shutdown.clone()));
    Rig {
        mock,
        _dir: dir,
        home,
        store,
        board,
        base,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
        shutdown,
    }
}

impl Rig {
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(KEY);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, body)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(body)).await
    }

    async fn session(&self, id: &str, source: &str, lines: &[&str]) {
        self.store
            .create_session(NewSession {
                id: id.into(),
                source: source.into(),
                ..NewSession::default()
            })
            .await
            .unwrap();
        for line in lines {
            self.store
                .append_message(id, &Message::user(*line))
                .await
                .unwrap();
        }
    }

    fn stop(self) {
        self.shutdown.cancel();
    }
}

/// The error code of an OpenAI-shaped error body (and that it is one).
fn code(body: &Value) -> &str {
    assert!(body["error"]["message"].is_string(), "not an error: {body}");
    assert!(body["error"]["type"].is_string(), "not an error: {body}");
    body["error"]["code"].as_str().unwrap_or("")
}

fn ids(body: &Value) -> Vec<String> {
    body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_are_listed_newest_first_paged_and_searched() {
    let rig = rig(true, |_| {}).await;
    rig.session("20260101_000001_aaaaaa", "telegram", &["about otters"])
        .await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    rig.session("20260101_000002_bbbbbb", "cli", &["about badgers", "more"])
        .await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    rig.session("20260101_000003_cccccc", "telegram", &["otters again"])
        .await;

    let (status, all) = rig.get("/api/sessions").await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(all["object"], "list");
    assert_eq!(
        ids(&all),
        [
            "20260101_000003_cccccc",
            "20260101_000002_bbbbbb",
            "20260101_000001_aaaaaa"
        ]
    );
    assert_eq!(all["data"][1]["message_count"], 2);
    assert_eq!(all["data"][1]["source"], "cli");
    assert_eq!(all["data"][1]["cost_usd"], 0.0);
    assert_eq!(all["has_more"], false);

    let (_, first) = rig.get("/api/sessions?limit=2").await;
    assert_eq!(ids(&first).len(), 2);
    assert_eq!(first["has_more"], true);
    let (_, second) = rig.get("/api/sessions?limit=2&offset=2").await;
    assert_eq!(ids(&second), ["20260101_000001_aaaaaa"]);
    assert_eq!(second["has_more"], false);

    let (_, telegram) = rig.get("/api/sessions?source=telegram").await;
    assert_eq!(
        ids(&telegram),
        ["20260101_000003_cccccc", "20260101_000001_aaaaaa"]
    );

    let (status, found) = rig.get("/api/sessions?q=otters").await;
    assert_eq!(status, 200, "{found}");
    let mut hits = ids(&found);
    hits.sort();
    assert_eq!(hits, ["20260101_000001_aaaaaa", "20260101_000003_cccccc"]);
    assert!(
        found["data"][0]["match"]["snippet"]
            .as_str()
            .unwrap()
            .contains("otters"),
        "{found}"
    );
    let (_, none) = rig.get("/api/sessions?q=otters&source=cli").await;
    assert!(ids(&none).is_empty());

    for bad in ["limit=201", "limit=-1", "offset=x"] {
        let (status, body) = rig.get(&format!("/api/sessions?{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(code(&body), "invalid_query");
    }
    rig.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_is_created_renamed_forked_and_deleted_for_good() {
    let rig = rig(true, |_| {}).await;
    let (status, made) = rig
        .post("/api/sessions", json!({"title": "  Planning  "}))
        .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["object"], "talaria.session");
    assert_eq!(made["session"]["title"], "Planning");
    assert_eq!(made["session"]["source"], "api_server");
    assert_eq!(made["session"]["message_count"], 0);
    let id = made["session"]["id"].as_str().unwrap().to_owned();

    let (status, body) = rig.post("/api/sessions", json!({"titel": "x"})).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(code(&body), "invalid_body");

    // A transcript with a tool call and its result.
    let store = &rig.store;
    store
        .append_message(&id, &Message::user("list the files, zanzibar"))
        .await
        .unwrap();
    store
        .append_message(
            &id,
            &Message::assistant_tool_calls(
                "",
                vec![ToolCall {
                    id: "call_1".into(),
                    name: "terminal".into(),
                    arguments: r#"{"command":"ls"}"#.into(),
                }],
            ),
        )
        .await
        .unwrap();
    store
        .append_message(&id, &Message::tool_result("call_1", "terminal", "a.txt"))
        .await
        .unwrap();
    store
        .append_message(&id, &Message::assistant("There is a.txt."))
        .await
        .unwrap();

    let (status, page) = rig
        .get(&format!("/api/sessions/{id}/messages?limit=2"))
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["data"].as_array().unwrap().len(), 2);
    assert_eq!(page["has_more"], true);
    let call = &page["data"][1];
    assert_eq!(call["role"], "assistant");
    assert_eq!(call["tool_calls"][0]["id"], "call_1");
    assert_eq!(call["tool_calls"][0]["type"], "function");
    assert_eq!(call["tool_calls"][0]["function"]["name"], "terminal");
    let after = page["next_after"].as_i64().unwrap();
    let (_, rest) = rig
        .get(&format!("/api/sessions/{id}/messages?after={after}"))
        .await;
    assert_eq!(rest["has_more"], false);
    assert_eq!(rest["next_after"], Value::Null);
    assert_eq!(rest["data"][0]["role"], "tool");
    assert_eq!(rest["data"][0]["tool_call_id"], "call_1");
    assert_eq!(rest["data"][0]["tool_name"], "terminal");
    assert_eq!(rest["data"][1]["content"], "There is a.txt.");

    let (status, renamed) = rig
        .call(
            Method::PATCH,
            &format!("/api/sessions/{id}"),
            Some(json!({"title": "Files"})),
        )
        .await;
    assert_eq!(status, 200, "{renamed}");
    assert_eq!(renamed["session"]["title"], "Files");
    let (_, shown) = rig.get(&format!("/api/sessions/{id}")).await;
    assert_eq!(shown["session"]["title"], "Files");
    assert_eq!(shown["session"]["message_count"], 4);
    let (status, body) = rig
        .call(
            Method::PATCH,
            &format!("/api/sessions/{id}"),
            Some(json!({"title": "  "})),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(code(&body), "invalid_title");

    let (status, forked) = rig
        .post(&format!("/api/sessions/{id}/fork"), json!({}))
        .await;
    assert_eq!(status, 201, "{forked}");
    let fork_id = forked["session"]["id"].as_str().unwrap().to_owned();
    assert_ne!(fork_id, id);
    assert_eq!(forked["session"]["parent_session_id"], id.as_str());
    assert_eq!(forked["session"]["title"], "Files (fork)");
    assert_eq!(forked["copied_messages"], 4);
    let copied: Vec<Message> = store
        .messages(&fork_id)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.message)
        .collect();
    let original: Vec<Message> = store
        .messages(&id)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.message)
        .collect();
    assert_eq!(copied, original);

    // A chat route pointing at it goes with it.
    store.set_route("telegram:dm:7", &id).await.unwrap();
    let (status, deleted) = rig
        .call(Method::DELETE, &format!("/api/sessions/{id}"), None)
        .await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["deleted"], true);
    let (status, body) = rig.get(&format!("/api/sessions/{id}")).await;
    assert_eq!(status, 404);
    assert_eq!(code(&body), "session_not_found");
    let (status, body) = rig.get(&format!("/api/sessions/{id}/messages")).await;
    assert_eq!(status, 404);
    assert_eq!(code(&body), "session_not_found");
    assert!(store.route("telegram:dm:7").await.unwrap().is_none());
    // Search finds only the fork now.
    let (_, found) = rig.get("/api/sessions?q=zanzibar").await;
    assert_eq!(ids(&found), [fork_id.as_str()]);
    let (status, _) = rig
        .call(Method::DELETE, &format!("/api/sessions/{id}"), None)
        .await;
    assert_eq!(status, 404);
    // The fork stands on its own.
    assert_eq!(store.messages(&fork_id).await.unwrap().len(), 4);

    for path in ["/api/sessions/nope", "/api/sessions/nope/messages"] {
        let (status, body) = rig.get(path).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert_eq!(code(&body), "session_not_found");
    }
    let (status, body) = rig.post("/api/sessions/nope/fork", json!({})).await;
    assert_eq!(status, 404, "{body}");
    // An id that could leave a directory is refused before any lookup.
    let (status, body) = rig.get("/api/sessions/a%2F..%2Fb").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(code(&body), "invalid_id");
    rig.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn cron_jobs_are_made_paused_resumed_run_changed_and_removed() {
    let rig = rig(true, |_| {}).await;
    let (status, job) = rig
        .post(
            "/api/jobs",
            json!({"schedule": "every 2h", "prompt": "Say the weather", "name": "weather"}),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    assert_eq!(job["object"], "talaria.cron_job");
    assert_eq!(job["state"], "scheduled");
    assert_eq!(job["schedule"], "every 2h");
    assert_eq!(job["deliver"], json!(["local"]));
    assert!(job["next_run_at"].is_i64());
    let id = job["id"].as_str().unwrap().to_owned();

    // The same checks as `talaria cron add`.
    let (status, body) = rig
        .post(
            "/api/jobs",
            json!({"schedule": "every blue moon", "prompt": "x"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(code(&body), "invalid_job");
    let (status, body) = rig.post("/api/jobs", json!({"schedule": "every 1h"})).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("needs a prompt"),
        "{body}"
    );
    let (status, body) = rig
        .post(
            "/api/jobs",
            json!({"schedule": "every 1h", "prompt": "x", "when": 1}),
        )
        .await;
    assert_eq!(status, 400, "{body}");

    let (_, list) = rig.get("/api/jobs").await;
    assert_eq!(ids(&list), [id.as_str()]);
    assert_eq!(list["has_more"], false);
    let (_, none) = rig.get("/api/jobs?limit=0").await;
    assert!(ids(&none).is_empty());
    assert_eq!(none["has_more"], true);
    let (status, _) = rig.get("/api/jobs?limit=501").await;
    assert_eq!(status, 400);
    let (status, by_name) = rig.get("/api/jobs/weather").await;
    assert_eq!(status, 200);
    assert_eq!(by_name["id"], id.as_str());

    let (status, paused) = rig.post(&format!("/api/jobs/{id}/pause"), json!({})).await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["state"], "paused");
    let (_, again) = rig.get(&format!("/api/jobs/{id}")).await;
    assert_eq!(again["state"], "paused");
    let (status, resumed) = rig.post(&format!("/api/jobs/{id}/resume"), json!({})).await;
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(resumed["state"], "scheduled");
    let (status, body) = rig.post(&format!("/api/jobs/{id}/resume"), json!({})).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not paused")
    );

    // Run now, waiting for the report: the mock model answers.
    rig.mock.push(Reply::text("Sunny, 21 degrees."));
    let (status, report) = rig
        .post(&format!("/api/jobs/{id}/run?wait=true"), json!({}))
        .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["status"], "ok", "{report}");
    assert_eq!(report["answer"], "Sunny, 21 degrees.");
    let session = report["session_id"].as_str().unwrap();
    let stored = rig.store.session(session).await.unwrap().unwrap();
    assert_eq!(stored.source, "cron");
    // Its schedule is left alone.
    let (_, after_run) = rig.get(&format!("/api/jobs/{id}")).await;
    assert_eq!(after_run["state"], "scheduled");
    assert_eq!(after_run["completed"], 0);

    // Run now in the background: 202 at once, the run lands in a session.
    rig.mock.push(Reply::text("Rain later."));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, started) = rig.post(&format!("/api/jobs/{id}/run"), json!({})).await;
    assert_eq!(status, 202, "{started}");
    assert_eq!(started["status"], "started");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, job) = rig.get(&format!("/api/jobs/{id}")).await;
        if job["last_status"] == "ok" && job["last_run_at"] != after_run["last_run_at"] {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{job}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (status, changed) = rig
        .call(
            Method::PATCH,
            &format!("/api/jobs/{id}"),
            Some(json!({"name": "forecast", "repeat": 3})),
        )
        .await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["name"], "forecast");
    assert_eq!(changed["repeat"], 3);
    let (_, unlimited) = rig
        .call(
            Method::PATCH,
            &format!("/api/jobs/{id}"),
            Some(json!({"repeat": null})),
        )
        .await;
    assert_eq!(unlimited["repeat"], Value::Null);
    let (status, body) = rig
        .call(
            Method::PATCH,
            &format!("/api/jobs/{id}"),
            Some(json!({"colour": "red"})),
        )
        .await;
    assert_eq!(status, 400, "{body}");

    let (status, gone) = rig
        .call(Method::DELETE, &format!("/api/jobs/{id}"), None)
        .await;
    assert_eq!(status, 200, "{gone}");
    for (method, path) in [
        (Method::GET, format!("/api/jobs/{id}")),
        (Method::DELETE, format!("/api/jobs/{id}")),
        (Method::POST, format!("/api/jobs/{id}/pause")),
        (Method::POST, format!("/api/jobs/{id}/run")),
    ] {
        let (status, body) = rig.call(method, &path, None).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert_eq!(code(&body), "job_not_found");
    }
    rig.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn pairing_requests_are_approved_denied_and_revoked() {
    let rig = rig(true, |_| {}).await;
    let limits = PairingLimits::default();
    for (user, code) in [("111", "ABCD2345"), ("222", "EFGH2345")] {
        rig.store
            .pairing_offer("telegram", user, Some("Ann"), "chat", code, limits)
            .await
            .unwrap();
    }
    let (status, shown) = rig.get("/api/pairing").await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["pending"].as_array().unwrap().len(), 2);
    // The codes themselves are never shown.
    assert!(!shown.to_string().contains("ABCD2345"), "{shown}");
    assert!(shown["approved"].as_array().unwrap().is_empty());

    let (status, body) = rig
        .post(
            "/api/pairing/approve",
            json!({"platform": "telegram", "code": "ZZZZ9999"}),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(code(&body), "pairing_code_not_found");
    let (status, body) = rig
        .post(
            "/api/pairing/approve",
            json!({"platform": "telgram", "code": "abcd2345"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(code(&body), "invalid_platform");
    let (status, approved) = rig
        .post(
            "/api/pairing/approve",
            json!({"platform": "Telegram", "code": "abcd2345"}),
        )
        .await;
    assert_eq!(status, 200, "{approved}");
    assert_eq!(approved["user_id"], "111");
    assert!(
        rig.store
            .pairing_is_approved("telegram", "111")
            .await
            .unwrap()
    );

    let (status, denied) = rig
        .post(
            "/api/pairing/deny",
            json!({"platform": "telegram", "user_id": "222"}),
        )
        .await;
    assert_eq!(status, 200, "{denied}");
    let (status, body) = rig
        .post(
            "/api/pairing/deny",
            json!({"platform": "telegram", "user_id": "222"}),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    let (_, shown) = rig.get("/api/pairing").await;
    assert!(shown["pending"].as_array().unwrap().is_empty(), "{shown}");
    assert_eq!(shown["approved"][0]["user_id"], "111");

    let (status, revoked) = rig
        .post(
            "/api/pairing/revoke",
            json!({"platform": "telegram", "user_id": "111"}),
        )
        .await;
    assert_eq!(status, 200, "{revoked}");
    assert!(
        !rig.store
            .pairing_is_approved("telegram", "111")
            .await
            .unwrap()
    );
    let (status, body) = rig
        .post(
            "/api/pairing/revoke",
            json!({"platform": "telegram", "user_id": "111"}),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = rig
        .post("/api/pairing/revoke", json!({"platform": "telegram"}))
        .await;
    assert_eq!(status, 400, "{body}");
    rig.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn capabilities_skills_and_toolsets_describe_this_server() {
    let rig = rig(true, |c| {
        c.platform_toolsets
            .insert("api_server".into(), vec!["web".into(), "file".into()]);
    })
    .await;
    let (status, caps) = rig.get("/v1/capabilities").await;
    assert_eq!(status, 200, "{caps}");
    assert_eq!(caps["object"], "talaria.api_server.capabilities");
    assert_eq!(caps["model"], "test-model");
    assert_eq!(caps["auth"]["type"], "bearer");
    assert_eq!(caps["features"]["sessions_api"], true);
    assert_eq!(caps["features"]["gateway"], true);
    assert_eq!(
        caps["endpoints"]["chat_completions"],
        json!({"method": "POST", "path": "/v1/chat/completions"})
    );
    assert_eq!(
        caps["endpoints"]["job_pause"],
        json!({"method": "POST", "path": "/api/jobs/{id}/pause"})
    );

    let skill = rig.home.skills_dir().join("research").join("otter-facts");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: otter-facts\ndescription: Knows about otters.\n---\nSay otter facts.\n",
    )
    .unwrap();
    let (status, skills) = rig.get("/v1/skills").await;
    assert_eq!(status, 200, "{skills}");
    let mine = skills["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "otter-facts")
        .unwrap_or_else(|| panic!("{skills}"));
    assert_eq!(mine["description"], "Knows about otters.");
    assert_eq!(mine["category"], "research");
    assert_eq!(mine["origin"], "user");

    let (status, sets) = rig.get("/v1/toolsets").await;
    assert_eq!(status, 200, "{sets}");
    assert_eq!(sets["platform"], "api_server");
    let set = |name: &str| {
        sets["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(set("web")["enabled"], true);
    assert_eq!(set("file")["enabled"], true);
    assert_eq!(set("terminal")["enabled"], false);
    assert!(
        set("file")["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("read_file"))
    );
    assert!(
        set("file")["available_tools"]
            .as_array()
            .unwrap()
            .contains(&json!("read_file")),
        "{sets}"
    );
    rig.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn detailed_health_shows_platforms_ledger_cron_and_turns() {
    let rig = rig(true, |_| {}).await;
    rig.board
        .set("telegram", talaria_gateway::Liveness::Live, None);
    rig.board.set(
        "discord",
        talaria_gateway::Liveness::Backoff,
        Some("401 from discord".into()),
    );
    rig.post("/api/jobs", json!({"schedule": "every 1h", "prompt": "a"}))
        .await;
    let (_, paused) = rig
        .post("/api/jobs", json!({"schedule": "every 1h", "prompt": "b"}))
        .await;
    rig.post(
        &format!("/api/jobs/{}/pause", paused["id"].as_str().unwrap()),
        json!({}),
    )
    .await;

    let (status, health) = rig.get("/health/detailed").await;
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["status"], "ok");
    assert_eq!(health["platforms"]["telegram"]["liveness"], "live");
    assert_eq!(health["platforms"]["discord"]["liveness"], "backoff");
    assert_eq!(
        health["platforms"]["discord"]["last_error"],
        "401 from discord"
    );
    assert!(health["nodes"].is_array());
    assert!(health["ledger"].is_object());
    assert_eq!(health["cron"]["jobs"], 2);
    assert_eq!(health["cron"]["by_state"]["paused"], 1);
    assert_eq!(health["cron"]["by_state"]["scheduled"], 1);
    assert!(health["cron"]["next_run"]["at"].is_i64(), "{health}");
    assert_eq!(health["running_turns"]["gateway"], 0);
    rig.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_gateway_its_routes_say_so() {
    let rig = rig(false, |_| {}).await;
    for (method, path) in [
        (Method::GET, "/api/jobs"),
        (Method::POST, "/api/jobs/x/run"),
        (Method::GET, "/api/pairing"),
        (Method::GET, "/health/detailed"),
    ] {
        let (status, body) = rig.call(method, path, None).await;
        assert_eq!(status, 503, "{path}: {body}");
        assert_eq!(code(&body), "gateway_unavailable");
    }
    // Sessions need only the agent's store.
    let (status, _) = rig.get("/api/sessions").await;
    assert_eq!(status, 200);
    rig.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn with_cron_disabled_jobs_are_kept_but_not_run() {
    let rig = rig(true, |c| c.cron.enabled = false).await;
    let (status, job) = rig
        .post("/api/jobs", json!({"schedule": "every 1h", "prompt": "a"}))
        .await;
    assert_eq!(status, 201, "{job}");
    let id = job["id"].as_str().unwrap();
    let (status, body) = rig
        .post(&format!("/api/jobs/{id}/run?wait=true"), json!({}))
        .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(code(&body), "cron_disabled");
    assert!(rig.mock.requests().is_empty());
    let (_, health) = rig.get("/health/detailed").await;
    assert_eq!(health["cron"]["enabled"], false);
    rig.stop();
}

/// `(method, path)` of every `.route("…", …)` in the crate's source: the
/// routes the router serves, found where they are written, so a route
/// added anywhere is seen.
fn routes_in_source() -> BTreeSet<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                // Comments may mention `.route(`; only code counts.
                let text = std::fs::read_to_string(&path).unwrap();
                let code: Vec<&str> = text
                    .lines()
                    .filter(|l| !l.trim_start().starts_with("//"))
                    .collect();
                out.push(code.join("\n"));
            }
        }
    }
    let mut sources = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut sources,
    );
    let mut found = BTreeSet::new();
    for text in &sources {
        let mut rest = text.as_str();
        while let Some(at) = rest.find(".route(") {
            rest = &rest[at + ".route(".len()..];
            let call = rest.trim_start();
            let literal = call.strip_prefix('"').unwrap_or_else(|| {
                panic!(
                    "a route's path must be a string literal, so this test can read it: {}",
                    &call[..call.len().min(80)]
                )
            });
            let end = literal.find('"').unwrap();
            let path = literal[..end].to_owned();
            // The rest of the call: up to the `)` closing `.route(`.
            let mut depth = 1;
            let mut close = 0;
            for (i, c) in literal[end + 1..].char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            close = i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let handlers = &literal[end + 1..end + 1 + close];
            let mut methods = 0;
            for method in ["get", "post", "put", "patch", "delete"] {
                let needle = format!("{method}(");
                let mut from = 0;
                while let Some(i) = handlers[from..].find(&needle) {
                    let i = from + i;
                    let before = handlers[..i].chars().next_back();
                    if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                        found.insert((method.to_owned(), path.clone()));
                        methods += 1;
                    }
                    from = i + needle.len();
                }
            }
            assert!(methods > 0, "no method found for route {path}: {handlers}");
        }
    }
    found
}

fn probe_path(path: &str) -> String {
    path.replace("{id}", "probe")
}

#[tokio::test(flavor = "multi_thread")]
async fn openapi_describes_every_route() {
    let rig = rig(true, |_| {}).await;
    let (status, doc) = rig.get("/openapi.json").await;
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    let mut described = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            assert!(op["operationId"].is_string(), "{method} {path}");
            assert!(op["responses"].is_object(), "{method} {path}");
            described.insert((method.clone(), path.clone()));
        }
    }
    // Every reference points at a schema that exists.
    let text = doc.to_string();
    for piece in text.split("#/components/schemas/").skip(1) {
        let name: String = piece.chars().take_while(|c| *c != '"').collect();
        assert!(
            doc["components"]["schemas"][&name].is_object(),
            "missing schema {name}"
        );
    }

    let pending: BTreeSet<(String, String)> = NOT_YET_SERVED
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    let served = routes_in_source();
    let undescribed: Vec<_> = served.difference(&described).collect();
    assert!(
        undescribed.is_empty(),
        "served but not in /openapi.json (add them to rest/openapi.rs): {undescribed:?}"
    );
    let unserved: Vec<_> = described
        .difference(&served)
        .filter(|r| !pending.contains(*r))
        .collect();
    assert!(
        unserved.is_empty(),
        "described but no `.route` serves them: {unserved:?}"
    );

    // And the server answers each one: not the fallback's 404, not 405.
    for (method, path) in &described {
        let m = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap();
        let (status, body) = rig.call(m, &probe_path(path), None).await;
        let fallback = status == 404 && body["error"]["code"] == "not_found";
        if pending.contains(&(method.clone(), path.clone())) {
            assert!(
                fallback,
                "{method} {path} is served now: take it out of NOT_YET_SERVED ({status} {body})"
            );
        } else {
            assert!(
                !fallback && status != 405,
                "{method} {path} is described but not served: {status} {body}"
            );
        }
    }
    rig.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn every_route_but_health_needs_the_key() {
    let rig = rig(true, |_| {}).await;
    let (_, doc) = rig.get("/openapi.json").await;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let m = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap();
            let url = format!("{}{}", rig.base, probe_path(path));
            for key in [None, Some("wrong-key-0123456789abcdef")] {
                let mut req = rig.client.request(m.clone(), &url);
                if let Some(key) = key {
                    req = req.bearer_auth(key);
                }
                let resp = req.send().await.unwrap();
                let status = resp.status();
                let body: Value = resp.json().await.unwrap_or(Value::Null);
                if path == "/health" || path == "/v1/health" || path == "/readyz" {
                    assert_eq!(status, 200, "{method} {path}");
                } else if NOT_YET_SERVED.contains(&(method.as_str(), path.as_str())) {
                    assert_eq!(status, 404, "{method} {path}");
                } else {
                    assert_eq!(status, 401, "{method} {path}: {body}");
                    assert_eq!(code(&body), "invalid_api_key");
                }
            }
        }
    }
    // Nothing was created by the refused requests.
    assert!(
        rig.store
            .list_sessions(Default::default())
            .await
            .unwrap()
            .is_empty()
    );
    rig.stop();
}
