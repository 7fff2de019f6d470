//! Asynchronous runs through the real binary: `talaria gateway run` with
//! the API server, the testkit's mock model scripted to call `terminal`
//! with a command the dangerous-command guard flags. The API's client is
//! the owner here (`gateway.owners.api_server: ["*"]`), so its commands run
//! on the host (`terminal.backend: local`) and a flagged one waits for an
//! approval; an untrusted client's commands would run in the sandbox,
//! where the guard does not ask.

use crate::api_gateway;

use std::path::Path;
use std::time::{Duration, Instant};

use api_gateway::{ApiGateway, free_port};

use serde_json::{Value, json};
use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};

const KEY: &str = "runs-test-key-0123456789abcdef";

struct Gateway {
    process: ApiGateway,
    dir: tempfile::TempDir,
    http: reqwest::Client,
}

impl Gateway {
    /// A home whose only platform is the API server, pointed at `llm`,
    /// whose client is the owner.
    async fn start(llm: &MockOpenAi) -> Gateway {
        Gateway::start_with(llm, "").await
    }

    /// [`Gateway::start`] with more top-level configuration.
    async fn start_with(llm: &MockOpenAi, extra: &str) -> Gateway {
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
                 platforms:\n  api_server:\n    port: {port}\n{extra}",
                llm.base_url()
            ),
        )
        .unwrap();
        std::fs::write(home.join(".env"), format!("API_SERVER_KEY={KEY}\n")).unwrap();
        let process = ApiGateway::start_in(&home, port, dir.path()).await;
        Gateway {
            process,
            dir,
            http: reqwest::Client::new(),
        }
    }

    fn log(&self) -> String {
        self.process.log()
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.process.url)
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .http
            .post(self.url(path))
            .bearer_auth(KEY)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .http
            .get(self.url(path))
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Starts a run and returns its id and session.
    async fn start_run(&self, body: Value) -> (String, String) {
        let (status, run) = self.post("/v1/runs", body).await;
        assert_eq!(status, 202, "{run}\n{}", self.log());
        assert!(
            ["queued", "running"].contains(&run["status"].as_str().unwrap()),
            "{run}"
        );
        (
            run["run_id"].as_str().unwrap().to_owned(),
            run["session_id"].as_str().unwrap().to_owned(),
        )
    }

    /// Opens a run's event stream; `resume` is sent as `Last-Event-ID`.
    async fn events(&self, run: &str, resume: Option<u64>) -> Events {
        let mut request = self
            .http
            .get(self.url(&format!("/v1/runs/{run}/events")))
            .bearer_auth(KEY);
        if let Some(n) = resume {
            request = request.header("Last-Event-ID", n.to_string());
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        Events {
            response,
            buf: String::new(),
        }
    }

    /// Polls the run until `status`, failing after 30 s.
    async fn wait_status(&self, run: &str, status: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (code, body) = self.get(&format!("/v1/runs/{run}")).await;
            assert_eq!(code, 200, "{body}");
            if body["status"] == status {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "the run never became {status}: {body}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One event as received: its SSE id and its JSON.
#[derive(Debug, Clone, PartialEq)]
struct Received {
    id: u64,
    data: Value,
}

impl Received {
    fn name(&self) -> &str {
        self.data["event"].as_str().unwrap()
    }
}

/// A client reading an SSE stream frame by frame.
struct Events {
    response: reqwest::Response,
    buf: String,
}

impl Events {
    /// The next event, or `None` when the server ended the stream.
    async fn next(&mut self) -> Option<Received> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let frame: String = self.buf.drain(..end + 2).collect();
                let mut id = None;
                let mut data = None;
                for line in frame.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().parse().unwrap());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data = Some(serde_json::from_str(v.trim()).unwrap());
                    }
                }
                // Comments (keepalives) carry neither.
                if let Some(data) = data {
                    let id = id.expect("every event has an id");
                    return Some(Received { id, data });
                }
                continue;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), self.response.chunk())
                .await
                .expect("the event stream went silent")
                .unwrap()?;
            self.buf.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }

    /// Every event until the stream ends.
    async fn rest(&mut self) -> Vec<Received> {
        let mut out = Vec::new();
        while let Some(e) = self.next().await {
            out.push(e);
        }
        out
    }

    /// Events up to and including the first named `name`.
    async fn until(&mut self, name: &str) -> Vec<Received> {
        let mut out = Vec::new();
        loop {
            let e = self
                .next()
                .await
                .unwrap_or_else(|| panic!("the stream ended before {name}: {out:?}"));
            let done = e.name() == name;
            out.push(e);
            if done {
                return out;
            }
        }
    }
}

/// The event names with runs of `message.delta` folded into one.
fn shape(events: &[Received]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for e in events {
        if e.name() == "message.delta" && out.last().is_some_and(|l| l == "message.delta") {
            continue;
        }
        out.push(e.name().to_owned());
    }
    out
}

/// The ids of a whole stream are 1, 2, 3, ... and match each event's seq.
fn assert_numbered(events: &[Received], from: u64) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.id, from + i as u64, "{events:?}");
        assert_eq!(e.data["seq"], e.id, "{e:?}");
    }
}

fn text_of(events: &[Received]) -> String {
    events
        .iter()
        .filter(|e| e.name() == "message.delta")
        .map(|e| e.data["delta"].as_str().unwrap())
        .collect()
}

/// A call of `terminal` removing `victim` recursively: the guard asks.
fn remove_call(victim: &Path) -> Reply {
    let args = json!({"command": format!("rm -r {}", victim.display())}).to_string();
    Reply::tool_calls(vec![ToolCallReply::new("call_rm", "terminal", args)])
        .with_text("Let me clean up.")
}

fn victim(gateway: &Gateway, name: &str) -> std::path::PathBuf {
    let victim = gateway.dir.path().join(name);
    std::fs::create_dir_all(victim.join("inside")).unwrap();
    victim
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_waits_for_approval_and_its_stream_can_be_resumed() {
    let llm = MockOpenAi::start().await;
    let gateway = Gateway::start(&llm).await;
    let victim = victim(&gateway, "victim");
    llm.push(remove_call(&victim));
    llm.push(Reply::text("Removed the directory."));

    let (run, session) = gateway.start_run(json!({"input": "clean up"})).await;
    let mut stream = gateway.events(&run, None).await;
    let first = stream.until("approval.request").await;
    let request = first.last().unwrap().clone();
    assert!(
        request.data["command"]
            .as_str()
            .unwrap()
            .contains(&format!("rm -r {}", victim.display())),
        "{request:?}"
    );
    assert!(
        request.data["reason"]
            .as_str()
            .unwrap()
            .contains("recursive delete"),
        "{request:?}"
    );
    assert_eq!(
        request.data["choices"],
        json!(["once", "session", "always", "deny"])
    );
    let approval_id = request.data["approval_id"].as_str().unwrap().to_owned();

    // The run waits; the command has not run.
    let waiting = gateway.wait_status(&run, "waiting_for_approval").await;
    assert_eq!(waiting["pending_approval"]["approval_id"], approval_id);
    assert_eq!(waiting["session_id"], session);
    assert!(victim.exists());

    // The client goes away mid-run; the run does not notice.
    drop(stream);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        gateway.get(&format!("/v1/runs/{run}")).await.1["status"],
        "waiting_for_approval"
    );

    let (code, answer) = gateway
        .post(
            &format!("/v1/runs/{run}/approval"),
            json!({"decision": "once", "approval_id": approval_id}),
        )
        .await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["decision"], "once");

    // Re-attached after the last event seen: exactly the rest.
    let last_seen = first.last().unwrap().id;
    let rest = gateway.events(&run, Some(last_seen)).await.rest().await;
    assert_eq!(rest.first().unwrap().id, last_seen + 1, "{rest:?}");
    let whole: Vec<Received> = first.iter().chain(&rest).cloned().collect();
    assert_numbered(&whole, 1);
    assert_eq!(
        shape(&whole),
        [
            "message.delta",
            "tool.started",
            "approval.request",
            "approval.responded",
            "tool.completed",
            "message.delta",
            "run.completed",
        ],
        "{whole:#?}"
    );
    assert_eq!(text_of(&whole), "Let me clean up.Removed the directory.");
    let completed = whole.last().unwrap();
    assert_eq!(completed.data["output"], "Removed the directory.");
    assert!(completed.data["usage"]["total_tokens"].as_u64().unwrap() > 0);
    let tool_end = whole.iter().find(|e| e.name() == "tool.completed").unwrap();
    assert_eq!(tool_end.data["tool"], "terminal");
    assert_eq!(tool_end.data["ok"], true, "{tool_end:?}");
    assert!(!victim.exists(), "the approved command ran");

    let done = gateway.wait_status(&run, "completed").await;
    assert_eq!(done["output"], "Removed the directory.");
    assert!(done["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert!(done["error"].is_null());
    assert!(done["pending_approval"].is_null());

    // Attaching after the end replays everything, then the end; `after`
    // works as the header does.
    let replay = gateway.events(&run, None).await.rest().await;
    assert_eq!(replay, whole);
    let r = gateway
        .http
        .get(gateway.url(&format!("/v1/runs/{run}/events?after=3")))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    let after = Events {
        response: r,
        buf: String::new(),
    }
    .rest()
    .await;
    assert_eq!(after, whole[3..]);

    // Nothing waits now: 409, said plainly.
    let (code, body) = gateway
        .post(
            &format!("/v1/runs/{run}/approval"),
            json!({"decision": "once"}),
        )
        .await;
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["error"]["code"], "no_pending_approval");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not waiting for an approval")
    );

    // A second run continues the session, with instructions for its turn.
    llm.push(Reply::text("Still here."));
    let (second, same) = gateway
        .start_run(json!({
            "input": "are you there?",
            "session_id": session,
            "instructions": "Answer in five words or fewer.",
        }))
        .await;
    assert_eq!(same, session);
    let events = gateway.events(&second, None).await.rest().await;
    assert_eq!(events.last().unwrap().data["output"], "Still here.");
    let sent = llm.requests().last().unwrap().body["messages"].clone();
    let system = sent[0]["content"].as_str().unwrap();
    assert!(
        system.ends_with("Answer in five words or fewer."),
        "{system}"
    );
    let texts: Vec<&str> = sent
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert!(texts.contains(&"clean up"), "{texts:?}");
    assert!(texts.contains(&"Removed the directory."), "{texts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_stops_and_refusals() {
    let llm = MockOpenAi::start().await;
    let gateway = Gateway::start(&llm).await;

    // Deny: the command does not run and the model is told so.
    let kept = victim(&gateway, "kept");
    llm.push(remove_call(&kept));
    llm.push(Reply::text("Understood, I left it alone."));
    let (run, _) = gateway.start_run(json!({"input": "clean up"})).await;
    let mut stream = gateway.events(&run, None).await;
    stream.until("approval.request").await;
    let (code, body) = gateway
        .post(
            &format!("/v1/runs/{run}/approval"),
            json!({"decision": "deny"}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let rest = stream.rest().await;
    assert_eq!(rest[0].name(), "approval.responded");
    assert_eq!(rest[0].data["decision"], "deny");
    let end = rest.last().unwrap();
    assert_eq!(end.name(), "run.completed");
    assert_eq!(end.data["output"], "Understood, I left it alone.");
    assert!(kept.exists());
    let told = llm.requests().last().unwrap().body["messages"].clone();
    let tool_row = told
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap_or_else(|| panic!("no tool row: {told}"));
    assert!(
        tool_row["content"]
            .as_str()
            .unwrap()
            .contains("has NOT consented"),
        "{tool_row}"
    );

    // Bad decisions are refused without losing the pending approval.
    llm.push(remove_call(&kept));
    let (run, _) = gateway.start_run(json!({"input": "try again"})).await;
    let mut stream = gateway.events(&run, None).await;
    stream.until("approval.request").await;
    let (code, body) = gateway
        .post(
            &format!("/v1/runs/{run}/approval"),
            json!({"decision": "maybe"}),
        )
        .await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_decision");
    let (code, body) = gateway
        .post(
            &format!("/v1/runs/{run}/approval"),
            json!({"decision": "once", "approval_id": "appr_other"}),
        )
        .await;
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["error"]["code"], "approval_mismatch");
    gateway.wait_status(&run, "waiting_for_approval").await;

    // Stop while it waits: stopped, the command never ran.
    let (code, body) = gateway
        .post(&format!("/v1/runs/{run}/stop"), json!({}))
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "stopped", "{body}");
    let rest = stream.rest().await;
    assert_eq!(rest.last().unwrap().name(), "run.cancelled", "{rest:?}");
    assert!(kept.exists());
    let (code, body) = gateway
        .post(&format!("/v1/runs/{run}/stop"), json!({}))
        .await;
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["error"]["code"], "run_ended");

    // Stop while the model is still talking.
    llm.push(Reply::text("This answer never finishes").stall_after(1));
    let (run, _) = gateway.start_run(json!({"input": "talk"})).await;
    let mut stream = gateway.events(&run, None).await;
    stream.until("message.delta").await;
    let (code, body) = gateway
        .post(&format!("/v1/runs/{run}/stop"), json!({}))
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "stopped", "{body}");
    assert_eq!(stream.rest().await.last().unwrap().name(), "run.cancelled");

    // Unknown runs: 404 everywhere.
    for (method, path) in [
        ("GET", "/v1/runs/run_nope"),
        ("GET", "/v1/runs/run_nope/events"),
        ("POST", "/v1/runs/run_nope/approval"),
        ("POST", "/v1/runs/run_nope/stop"),
    ] {
        let r = gateway
            .http
            .request(method.parse().unwrap(), gateway.url(path))
            .bearer_auth(KEY)
            .json(&json!({"decision": "once"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{method} {path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "run_not_found", "{path}");
    }

    // Bad input: 400 with a sentence.
    for (body, code) in [
        (json!({}), "missing_input"),
        (json!({"input": "  "}), "missing_input"),
        (
            json!({"input": "x", "session_id": "../etc"}),
            "invalid_session_id",
        ),
        (json!({"input": "x", "model": 5}), "invalid_request"),
        (
            json!({"input": "x", "previous_response_id": "resp_1"}),
            "unsupported_parameter",
        ),
        (json!("just text"), "invalid_json"),
    ] {
        let (status, answer) = gateway.post("/v1/runs", body.clone()).await;
        assert_eq!(status, 400, "{body} -> {answer}");
        assert_eq!(answer["error"]["code"], code, "{body} -> {answer}");
    }

    // No key: 401 on every route.
    for (method, path) in [
        ("POST", "/v1/runs"),
        ("GET", "/v1/runs/run_nope"),
        ("GET", "/v1/runs/run_nope/events"),
        ("POST", "/v1/runs/run_nope/approval"),
        ("POST", "/v1/runs/run_nope/stop"),
        ("POST", "/api/sessions/s1/chat"),
        ("POST", "/api/sessions/s1/chat/stream"),
    ] {
        let r = gateway
            .http
            .request(method.parse().unwrap(), gateway.url(path))
            .json(&json!({"input": "x"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{method} {path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_api_key");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_left_mid_answer_resumes_without_gap_or_repeat() {
    let llm = MockOpenAi::start().await;
    let gateway = Gateway::start(&llm).await;
    let answer = "one two three four five six seven eight nine ten eleven twelve";
    llm.push(Reply::text(answer).with_chunk_pause(Duration::from_millis(150)));
    let (run, session) = gateway.start_run(json!({"input": "count"})).await;

    let mut stream = gateway.events(&run, None).await;
    let first = vec![stream.next().await.unwrap(), stream.next().await.unwrap()];
    drop(stream);
    // Reconnect while the answer is still coming.
    let mut again = gateway.events(&run, Some(first[1].id)).await;
    let second = vec![again.next().await.unwrap()];
    drop(again);
    let rest = gateway.events(&run, Some(second[0].id)).await.rest().await;
    let whole: Vec<Received> = first.into_iter().chain(second).chain(rest).collect();
    assert_numbered(&whole, 1);
    assert_eq!(text_of(&whole), answer);
    assert_eq!(whole.last().unwrap().name(), "run.completed");
    assert!(
        whole.len() > 4,
        "the answer came in several deltas: {whole:?}"
    );
    assert_eq!(gateway.events(&run, None).await.rest().await, whole);

    // One turn in that session over /api/sessions, as JSON...
    llm.push(Reply::text("Thirteen."));
    let (code, body) = gateway
        .post(
            &format!("/api/sessions/{session}/chat"),
            json!({"message": "and next?"}),
        )
        .await;
    assert_eq!(code, 200, "{body}\n{}", gateway.log());
    assert_eq!(body["output"], "Thirteen.");
    assert_eq!(body["status"], "completed");
    assert_eq!(body["session_id"], session);
    let sent = llm.requests().last().unwrap().body["messages"].clone();
    assert!(
        sent.to_string().contains(answer),
        "the session's history went along"
    );

    // ... and as the run's event stream.
    llm.push(Reply::text("Fourteen after that."));
    let r = gateway
        .http
        .post(gateway.url(&format!("/api/sessions/{session}/chat/stream")))
        .bearer_auth(KEY)
        .json(&json!({"message": "then?"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let run_id = r.headers()["x-talaria-run-id"].to_str().unwrap().to_owned();
    let events = Events {
        response: r,
        buf: String::new(),
    }
    .rest()
    .await;
    assert_numbered(&events, 1);
    assert_eq!(text_of(&events), "Fourteen after that.");
    assert_eq!(shape(&events), ["message.delta", "run.completed"]);
    assert!(events.iter().all(|e| e.data["run_id"] == run_id.as_str()));

    // A session that does not exist: 404.
    let (code, body) = gateway
        .post(
            "/api/sessions/no-such-session/chat",
            json!({"message": "hi"}),
        )
        .await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["error"]["code"], "session_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_approval_is_a_denial() {
    let llm = MockOpenAi::start().await;
    let gateway = Gateway::start_with(&llm, "approvals:\n  timeout_secs: 1\n").await;
    let kept = victim(&gateway, "kept");
    llm.push(remove_call(&kept));
    llm.push(Reply::text("Nobody answered, so I did nothing."));
    let (run, _) = gateway.start_run(json!({"input": "clean up"})).await;
    let events = gateway.events(&run, None).await.rest().await;
    let answered = events
        .iter()
        .find(|e| e.name() == "approval.responded")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(answered.data["decision"], "timeout");
    assert_eq!(
        events.last().unwrap().data["output"],
        "Nobody answered, so I did nothing."
    );
    assert!(kept.exists());
    let told = llm.requests().last().unwrap().body["messages"].to_string();
    assert!(told.contains("silence is not consent"), "{told}");
    let (code, body) = gateway
        .post(
            &format!("/v1/runs/{run}/approval"),
            json!({"decision": "once"}),
        )
        .await;
    assert_eq!(code, 409, "{body}");
}
