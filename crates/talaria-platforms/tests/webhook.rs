//! The webhook adapter over real HTTP on 127.0.0.1, with a real inbox and
//! an injected clock.
#![cfg(feature = "webhook")]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use talaria_core::{Env, Secret};
use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, Admission, ChatType, Inbox, KeyPolicy, Liveness,
    LivenessReporter, MessageEvent, OutboundMessage, SessionKey,
};
use talaria_platforms::ingress::Ingress;
use talaria_platforms::webhook::{
    RouteSettings, TOLERANCE_SECS, WebhookAdapter, WebhookError, WebhookSettings,
};
use talaria_platforms::webhook::{WebhookConfig, WebhookRouteConfig, WebhookScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

const WAIT: Duration = Duration::from_secs(10);
const START: i64 = 1_750_000_000;
const GH_SECRET: &str = "gh-secret-0123456789";
const GL_TOKEN: &str = "gitlab-token-0123456789";
const SVIX_KEY: &[u8] = b"svix-signing-key-bytes";
const HMAC_SECRET: &str = "generic-secret-0123456789";

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A delivery's key as the adapter documents it: the hex SHA-256 of the
/// route, a 0x1f byte, and what the scheme signs (`<timestamp>.<body>`, or
/// the body when no timestamp is signed). It is the event's message id and
/// the tail of its chat id, whatever id header came with it.
fn signed_key(route: &str, timestamp: Option<i64>, body: &[u8]) -> String {
    use sha2::Digest;
    let mut h = Sha256::new();
    h.update(route.as_bytes());
    h.update([0x1f]);
    if let Some(ts) = timestamp {
        h.update(format!("{ts}.").as_bytes());
    }
    h.update(body);
    hex(&h.finalize())
}

fn route(scheme: WebhookScheme, secret: &str) -> RouteSettings {
    RouteSettings::new(scheme, secret)
}

/// The routes most tests use: one per scheme.
fn routes() -> BTreeMap<String, RouteSettings> {
    let mut r = BTreeMap::new();
    r.insert(
        "gh".to_owned(),
        RouteSettings {
            prompt: "PR #{payload.number} \"{payload.pull_request.title}\" by \
                     {payload.pull_request.user.login} ({event_type} on {route}); \
                     first label {payload.pull_request.labels.0.name}, {payload.missing}"
                .to_owned(),
            deliver: "telegram:12345".to_owned(),
            events: vec!["pull_request".to_owned(), "ping".to_owned()],
            ..route(WebhookScheme::Github, GH_SECRET)
        },
    );
    r.insert(
        "gl".to_owned(),
        RouteSettings {
            prompt: "GitLab {event_type}: {payload.project.name}".to_owned(),
            deliver: "telegram".to_owned(),
            ..route(WebhookScheme::Gitlab, GL_TOKEN)
        },
    );
    let svix_secret = format!("whsec_{}", BASE64.encode(SVIX_KEY));
    r.insert(
        "svix".to_owned(),
        RouteSettings {
            prompt: "Svix {event_type}: {payload.data.id}".to_owned(),
            ..route(WebhookScheme::Svix, &svix_secret)
        },
    );
    r.insert(
        "generic".to_owned(),
        RouteSettings {
            prompt: "Alert: {payload.alert.name} = {payload.alert.value}".to_owned(),
            deliver: "local".to_owned(),
            ..route(WebhookScheme::Hmac, HMAC_SECRET)
        },
    );
    r.insert(
        "off".to_owned(),
        RouteSettings {
            enabled: false,
            ..route(WebhookScheme::Hmac, HMAC_SECRET)
        },
    );
    r
}

struct Running {
    base: String,
    http: reqwest::Client,
    clock: Arc<AtomicI64>,
    events: mpsc::Receiver<MessageEvent>,
    liveness: watch::Receiver<Liveness>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AdapterError>>,
    adapter: Arc<WebhookAdapter>,
    addr: SocketAddr,
    /// Stops the shared listener when the test ends.
    _server: DropGuard,
}

async fn start_with(settings: WebhookSettings) -> Running {
    let clock = Arc::new(AtomicI64::new(START));
    let c = clock.clone();
    let settings = settings.with_clock(move || c.load(Ordering::SeqCst));
    let adapter = Arc::new(WebhookAdapter::new(settings).unwrap());
    let mut ingress = Ingress::bind("127.0.0.1", 0).await.unwrap();
    ingress.mount(adapter.mount());
    let addr = ingress.local_addr();
    let server = CancellationToken::new();
    tokio::spawn(ingress.serve(server.clone()));
    let (inbox, events) = Inbox::channel(16);
    let (reporter, mut liveness) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let ctx = AdapterContext {
        inbox,
        liveness: reporter,
        shutdown: shutdown.clone(),
    };
    let a = adapter.clone();
    let task = tokio::spawn(async move { a.run(ctx).await });
    tokio::time::timeout(WAIT, liveness.wait_for(|l| *l == Liveness::Live))
        .await
        .expect("never live")
        .expect("reporter dropped");
    Running {
        base: format!("http://{addr}"),
        addr,
        _server: server.drop_guard(),
        http: reqwest::Client::new(),
        clock,
        events,
        liveness,
        shutdown,
        task,
        adapter,
    }
}

async fn start() -> Running {
    start_with(WebhookSettings::new(routes())).await
}

impl Running {
    fn now(&self) -> i64 {
        self.clock.load(Ordering::SeqCst)
    }

    fn advance(&self, secs: i64) {
        self.clock.fetch_add(secs, Ordering::SeqCst);
    }

    async fn post(&self, route: &str, headers: &[(&str, String)], body: &[u8]) -> (u16, Value) {
        let mut req = self
            .http
            .post(format!("{}/webhooks/{route}", self.base))
            .header("content-type", "application/json")
            .body(body.to_vec());
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let resp = tokio::time::timeout(WAIT, req.send())
            .await
            .expect("no answer in time")
            .unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// A request written byte for byte, for paths an HTTP client would
    /// normalise before sending (`%2e%2e` is `..` to a URL parser).
    async fn post_raw(&self, path: &str, body: &[u8]) -> (u16, Value) {
        let addr = self.addr;
        let exchange = async {
            let mut conn = tokio::net::TcpStream::connect(addr).await?;
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            conn.write_all(head.as_bytes()).await?;
            conn.write_all(body).await?;
            let mut answer = Vec::new();
            conn.read_to_end(&mut answer).await?;
            std::io::Result::Ok(answer)
        };
        let answer = tokio::time::timeout(WAIT, exchange)
            .await
            .expect("no answer in time")
            .unwrap();
        let text = String::from_utf8(answer).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").expect("no end of headers");
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("no status");
        (status, serde_json::from_str(body).unwrap_or(Value::Null))
    }

    fn github(&self, body: &[u8], event: &str, delivery: &str) -> Vec<(&'static str, String)> {
        vec![
            ("X-GitHub-Event", event.to_owned()),
            ("X-GitHub-Delivery", delivery.to_owned()),
            (
                "X-Hub-Signature-256",
                format!("sha256={}", hex(&hmac(GH_SECRET.as_bytes(), body))),
            ),
        ]
    }

    fn svix(&self, body: &[u8], id: &str, ts: i64) -> Vec<(&'static str, String)> {
        let signed = [id.as_bytes(), b".", ts.to_string().as_bytes(), b".", body].concat();
        let sig = BASE64.encode(hmac(SVIX_KEY, &signed));
        vec![
            ("svix-id", id.to_owned()),
            ("svix-timestamp", ts.to_string()),
            (
                "svix-signature",
                format!("v1,{} v1,{sig}", BASE64.encode([7u8; 32])),
            ),
        ]
    }

    fn generic(&self, body: &[u8], ts: i64) -> Vec<(&'static str, String)> {
        let signed = [ts.to_string().as_bytes(), b".", body].concat();
        vec![
            ("X-Webhook-Timestamp", ts.to_string()),
            (
                "X-Webhook-Signature",
                format!("sha256={}", hex(&hmac(HMAC_SECRET.as_bytes(), &signed))),
            ),
        ]
    }

    async fn next(&mut self) -> MessageEvent {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("no event in time")
            .expect("inbox closed")
    }

    /// Nothing was submitted: every accepted delivery is in the channel
    /// before its 202, so an empty channel now means none came.
    fn assert_no_event(&mut self) {
        if let Ok(ev) = self.events.try_recv() {
            panic!("unexpected event: {ev:?}");
        }
    }

    async fn stop(self) -> Result<(), AdapterError> {
        self.shutdown.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("run did not return")
            .expect("run panicked")
    }
}

fn pr_body() -> Vec<u8> {
    serde_json::to_vec(&json!({
        "action": "opened",
        "number": 42,
        "pull_request": {
            "title": "Add webhooks",
            "user": {"login": "octocat"},
            "labels": [{"name": "feature"}, {"name": "gateway"}],
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn health_answers() {
    let run = start().await;
    let resp = run
        .http
        .get(format!("{}/health", run.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(*run.liveness.borrow(), Liveness::Live);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn github_delivery_becomes_an_event() {
    let mut run = start().await;
    let body = pr_body();
    let delivery = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
    let (status, json) = run
        .post("gh", &run.github(&body, "pull_request", delivery), &body)
        .await;
    assert_eq!(status, 202, "{json}");
    assert_eq!(
        json,
        json!({"status": "accepted", "route": "gh", "event": "pull_request", "delivery_id": delivery})
    );
    let ev = run.next().await;
    assert_eq!(
        ev.text,
        "PR #42 \"Add webhooks\" by octocat (pull_request on gh); first label feature, \
         {payload.missing}"
    );
    assert_eq!(ev.reply_target.as_deref(), Some("telegram:12345"));
    // Named by what is signed, not by the unsigned delivery header.
    let key = signed_key("gh", None, &body);
    assert_eq!(ev.message_id.as_deref(), Some(key.as_str()));
    let s = &ev.source;
    assert_eq!(s.platform, "webhook");
    assert_eq!(s.chat_id, format!("gh:{key}"));
    assert_eq!(s.chat_type, ChatType::Dm);
    assert_eq!(s.user_id.as_deref(), Some("webhook:gh"));
    assert_eq!(s.user_name.as_deref(), Some("webhook gh"));
    assert_eq!(s.chat_name.as_deref(), Some("gh"));
    assert_eq!(s.thread_id, None);
    assert!(!s.is_bot);
    let session = SessionKey::for_source(s, KeyPolicy::default()).unwrap();
    assert_eq!(session.as_str(), format!("agent:main:webhook:dm:gh:{key}"));
    assert!(run.adapter.verifies_senders());
    run.stop().await.unwrap();
}

#[tokio::test]
async fn github_bad_signatures_are_refused() {
    // A budget of one delivery, so a refused attempt that counted would
    // leave none for the real one below.
    let mut settings = WebhookSettings::new(routes());
    settings.rate_limit_per_minute = 1;
    let mut run = start_with(settings).await;
    let body = pr_body();
    let good = run.github(&body, "pull_request", "d-1");
    // Signed with another secret.
    let mut wrong = good.clone();
    wrong[2].1 = format!("sha256={}", hex(&hmac(b"not-the-secret", &body)));
    let (status, json) = run.post("gh", &wrong, &body).await;
    assert_eq!(status, 401, "{json}");
    // No signature at all.
    let (status, _) = run.post("gh", &good[..2], &body).await;
    assert_eq!(status, 401);
    // A good signature over a different body.
    let mut tampered = body.clone();
    tampered.extend_from_slice(b" ");
    let (status, _) = run.post("gh", &good, &tampered).await;
    assert_eq!(status, 401);
    // Not hex.
    let mut junk = good.clone();
    junk[2].1 = "sha256=zz".to_owned();
    let (status, _) = run.post("gh", &junk, &body).await;
    assert_eq!(status, 401);
    run.assert_no_event();
    // The refused attempts spent nothing: the real delivery goes through.
    let (status, json) = run.post("gh", &good, &body).await;
    assert_eq!(status, 202);
    assert_eq!(json["delivery_id"], "d-1");
    let key = signed_key("gh", None, &body);
    assert_eq!(run.next().await.message_id, Some(key));
    run.stop().await.unwrap();
}

#[tokio::test]
async fn gitlab_token_is_checked() {
    let mut run = start().await;
    let body = serde_json::to_vec(&json!({"object_kind": "push", "project": {"name": "talaria"}}))
        .unwrap();
    let headers = |token: &str| {
        vec![
            ("X-Gitlab-Event", "Push Hook".to_owned()),
            ("X-Gitlab-Token", token.to_owned()),
            ("X-Gitlab-Event-UUID", "gl-uuid-1".to_owned()),
        ]
    };
    let (status, _) = run.post("gl", &headers("wrong-token"), &body).await;
    assert_eq!(status, 401);
    let (status, _) = run.post("gl", &headers(GL_TOKEN)[..1], &body).await;
    assert_eq!(status, 401);
    run.assert_no_event();
    let (status, json) = run.post("gl", &headers(GL_TOKEN), &body).await;
    assert_eq!(status, 202, "{json}");
    assert_eq!(json["event"], "Push Hook");
    let ev = run.next().await;
    assert_eq!(ev.text, "GitLab Push Hook: talaria");
    assert_eq!(ev.reply_target.as_deref(), Some("telegram"));
    assert_eq!(json["delivery_id"], "gl-uuid-1");
    assert_eq!(
        ev.source.chat_id,
        format!("gl:{}", signed_key("gl", None, &body))
    );
    run.stop().await.unwrap();
}

#[tokio::test]
async fn svix_signatures_and_their_window() {
    let mut run = start().await;
    let body =
        serde_json::to_vec(&json!({"type": "invoice.paid", "data": {"id": "inv_9"}})).unwrap();
    // Signed with another key.
    let mut wrong = run.svix(&body, "msg_1", run.now());
    wrong[2].1 = format!("v1,{}", BASE64.encode(hmac(b"other", &body)));
    let (status, _) = run.post("svix", &wrong, &body).await;
    assert_eq!(status, 401);
    // A header missing.
    let good = run.svix(&body, "msg_1", run.now());
    let (status, _) = run.post("svix", &good[..2], &body).await;
    assert_eq!(status, 401);
    // Signed correctly, but a second too long ago by our clock.
    let stale = run.svix(&body, "msg_1", run.now() - TOLERANCE_SECS - 1);
    let (status, _) = run.post("svix", &stale, &body).await;
    assert_eq!(status, 401);
    // ...or too far ahead.
    let early = run.svix(&body, "msg_1", run.now() + TOLERANCE_SECS + 1);
    let (status, _) = run.post("svix", &early, &body).await;
    assert_eq!(status, 401);
    run.assert_no_event();
    // A second short of the edge is still inside the window.
    let old_but_ok = run.svix(&body, "msg_1", run.now() - TOLERANCE_SECS + 1);
    let (status, json) = run.post("svix", &old_but_ok, &body).await;
    assert_eq!(status, 202, "{json}");
    assert_eq!(json["event"], "invoice.paid");
    assert_eq!(json["delivery_id"], "msg_1");
    let ev = run.next().await;
    assert_eq!(ev.text, "Svix invoice.paid: inv_9");
    assert_eq!(ev.reply_target.as_deref(), Some("local"));
    assert_eq!(ev.source.chat_id, "svix:msg_1");
    // The same signed delivery once the clock has moved on is stale.
    run.advance(600);
    let (status, _) = run.post("svix", &old_but_ok, &body).await;
    assert_eq!(status, 401);
    run.assert_no_event();
    run.stop().await.unwrap();
}

#[tokio::test]
async fn generic_hmac_signatures_and_their_window() {
    let mut run = start().await;
    let body =
        serde_json::to_vec(&json!({"event_type": "alert", "alert": {"name": "disk", "value": 97}}))
            .unwrap();
    let good = run.generic(&body, run.now());
    // Missing timestamp.
    let (status, _) = run.post("generic", &good[1..], &body).await;
    assert_eq!(status, 401);
    // Missing signature.
    let (status, _) = run.post("generic", &good[..1], &body).await;
    assert_eq!(status, 401);
    // Wrong secret.
    let mut wrong = good.clone();
    wrong[1].1 = hex(&hmac(b"nope", &body));
    let (status, _) = run.post("generic", &wrong, &body).await;
    assert_eq!(status, 401);
    // The timestamp is signed: moving it breaks the signature.
    let mut moved = good.clone();
    moved[0].1 = (run.now() + 1).to_string();
    let (status, _) = run.post("generic", &moved, &body).await;
    assert_eq!(status, 401);
    // Stale by the injected clock.
    let stale = run.generic(&body, run.now() - TOLERANCE_SECS - 1);
    let (status, _) = run.post("generic", &stale, &body).await;
    assert_eq!(status, 401);
    run.assert_no_event();
    // Bare hex works as well as `sha256=`.
    let mut bare = good.clone();
    bare[1].1 = bare[1].1.trim_start_matches("sha256=").to_owned();
    let (status, json) = run.post("generic", &bare, &body).await;
    assert_eq!(status, 202, "{json}");
    assert_eq!(json["event"], "alert");
    let ev = run.next().await;
    assert_eq!(ev.text, "Alert: disk = 97");
    // The key covers the signed timestamp and body.
    let key = signed_key("generic", Some(run.now()), &body);
    assert_eq!(json["delivery_id"], key.as_str());
    assert_eq!(ev.message_id.as_deref(), Some(key.as_str()));
    assert_eq!(ev.source.chat_id, format!("generic:{key}"));
    run.stop().await.unwrap();
}

#[tokio::test]
async fn a_replayed_delivery_is_a_duplicate() {
    let mut run = start().await;
    let body = pr_body();
    let headers = run.github(&body, "pull_request", "same-id");
    let (status, _) = run.post("gh", &headers, &body).await;
    assert_eq!(status, 202);
    let (status, json) = run.post("gh", &headers, &body).await;
    assert_eq!(status, 200);
    assert_eq!(json["status"], "duplicate");
    assert_eq!(json["delivery_id"], "same-id");
    // A captured delivery resent under a fresh id is caught by its body.
    let renamed = run.github(&body, "pull_request", "fresh-id");
    let (status, json) = run.post("gh", &renamed, &body).await;
    assert_eq!((status, json["status"].as_str()), (200, Some("duplicate")));
    let key = signed_key("gh", None, &body);
    assert_eq!(run.next().await.message_id, Some(key));
    run.assert_no_event();
    // After an hour the id is forgotten.
    run.advance(3601);
    let (status, _) = run.post("gh", &headers, &body).await;
    assert_eq!(status, 202);
    run.next().await;
    run.stop().await.unwrap();
}

#[tokio::test]
async fn an_added_unsigned_id_header_does_not_make_a_replay_new() {
    let mut run = start().await;
    // Svix signs its id: another scheme's id header added to a captured
    // delivery changes nothing.
    let body = serde_json::to_vec(&json!({"type": "invoice.paid", "data": {"id": "i"}})).unwrap();
    let signed = run.svix(&body, "msg_replayed", run.now());
    let (status, _) = run.post("svix", &signed, &body).await;
    assert_eq!(status, 202);
    let mut replay = signed.clone();
    replay.push(("X-GitHub-Delivery", "other".to_owned()));
    let (status, json) = run.post("svix", &replay, &body).await;
    assert_eq!((status, json["status"].as_str()), (200, Some("duplicate")));
    assert_eq!(json["delivery_id"], "msg_replayed");
    assert_eq!(run.next().await.message_id.as_deref(), Some("msg_replayed"));
    run.assert_no_event();
    // The generic scheme signs its timestamp and body: those are claimed,
    // whatever id headers are added.
    let body = serde_json::to_vec(&json!({"alert": {"name": "cpu", "value": 1}})).unwrap();
    let signed = run.generic(&body, run.now());
    let (status, _) = run.post("generic", &signed, &body).await;
    assert_eq!(status, 202);
    for (header, value) in [("X-Request-Id", "other"), ("X-Webhook-Id", "other")] {
        let mut replay = signed.clone();
        replay.push((header, value.to_owned()));
        let (status, json) = run.post("generic", &replay, &body).await;
        assert_eq!(
            (status, json["status"].as_str()),
            (200, Some("duplicate")),
            "{header}"
        );
    }
    run.next().await;
    run.assert_no_event();
    run.stop().await.unwrap();
}

#[tokio::test]
async fn only_deliveries_handed_over_spend_the_rate_limit() {
    let mut settings = WebhookSettings::new(routes());
    settings.rate_limit_per_minute = 2;
    let mut run = start_with(settings).await;
    let body = pr_body();
    let first = run.github(&body, "pull_request", "first");
    let (status, _) = run.post("gh", &first, &body).await;
    assert_eq!(status, 202);
    run.next().await;
    // Retries of it and events the route ignores are answered without
    // spending anything.
    for _ in 0..3 {
        let (status, json) = run.post("gh", &first, &body).await;
        assert_eq!((status, json["status"].as_str()), (200, Some("duplicate")));
        let other = serde_json::to_vec(&json!({"n": 1})).unwrap();
        let (status, json) = run
            .post("gh", &run.github(&other, "issues", "ignored"), &other)
            .await;
        assert_eq!((status, json["status"].as_str()), (200, Some("ignored")));
    }
    // So the second of two allowed still goes through.
    let second_body = serde_json::to_vec(&json!({"number": 2})).unwrap();
    let second = run.github(&second_body, "pull_request", "second");
    let (status, _) = run.post("gh", &second, &second_body).await;
    assert_eq!(status, 202);
    run.next().await;
    // A third is refused, and forgotten: its retry after the window is not
    // a duplicate.
    let third_body = serde_json::to_vec(&json!({"number": 3})).unwrap();
    let third = run.github(&third_body, "pull_request", "third");
    let (status, _) = run.post("gh", &third, &third_body).await;
    assert_eq!(status, 429);
    run.assert_no_event();
    run.advance(60);
    let (status, json) = run.post("gh", &third, &third_body).await;
    assert_eq!(status, 202, "{json}");
    let key = signed_key("gh", None, &third_body);
    assert_eq!(run.next().await.message_id, Some(key));
    run.stop().await.unwrap();
}

#[tokio::test]
async fn the_rate_limit_applies_per_route() {
    let mut settings = WebhookSettings::new(routes());
    settings.rate_limit_per_minute = 3;
    let mut run = start_with(settings).await;
    fn send(run: &Running, n: u32) -> (Vec<(&'static str, String)>, Vec<u8>) {
        let body = serde_json::to_vec(&json!({"alert": {"name": "n", "value": n}})).unwrap();
        (run.generic(&body, run.now()), body)
    }
    for n in 0..3 {
        let (h, b) = send(&run, n);
        let (status, json) = run.post("generic", &h, &b).await;
        assert_eq!(status, 202, "{n}: {json}");
    }
    let (h, b) = send(&run, 3);
    let mut req = run
        .http
        .post(format!("{}/webhooks/generic", run.base))
        .body(b);
    for (k, v) in &h {
        req = req.header(*k, v);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(
        resp.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("60")
    );
    // Another route has its own budget.
    let body = pr_body();
    let (status, _) = run
        .post("gh", &run.github(&body, "pull_request", "x"), &body)
        .await;
    assert_eq!(status, 202);
    for _ in 0..4 {
        run.next().await;
    }
    run.assert_no_event();
    // A minute later the window has room again.
    run.advance(60);
    let (h, b) = send(&run, 4);
    let (status, _) = run.post("generic", &h, &b).await;
    assert_eq!(status, 202);
    run.next().await;
    run.stop().await.unwrap();
}

#[tokio::test]
async fn bodies_over_the_limit_are_refused() {
    let mut settings = WebhookSettings::new(routes());
    settings.max_body_bytes = 64;
    let mut run = start_with(settings).await;
    let big = serde_json::to_vec(&json!({"alert": {"name": "x".repeat(500), "value": 1}})).unwrap();
    let (status, json) = run
        .post("generic", &run.generic(&big, run.now()), &big)
        .await;
    assert_eq!(status, 413, "{json}");
    // The limit comes before the signature: unsigned is 413 too.
    let (status, _) = run.post("generic", &[], &big).await;
    assert_eq!(status, 413);
    // Without a Content-Length the body is counted as it arrives.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        big.chunks(40).map(|c| Ok(c.to_vec())).collect();
    let resp = run
        .http
        .post(format!("{}/webhooks/generic", run.base))
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    run.assert_no_event();
    let small = br#"{"alert":{"name":"ok","value":1}}"#;
    let (status, _) = run
        .post("generic", &run.generic(small, run.now()), small)
        .await;
    assert_eq!(status, 202);
    assert_eq!(run.next().await.text, "Alert: ok = 1");
    run.stop().await.unwrap();
}

#[tokio::test]
async fn unknown_disabled_ignored_and_unparsable() {
    let mut run = start().await;
    let body = pr_body();
    let (status, _) = run
        .post("nope", &run.generic(&body, run.now()), &body)
        .await;
    assert_eq!(status, 404);
    // `..` reaches the route lookup (its "unknown webhook route", not the
    // router's fallback) and is no route.
    let (status, json) = run.post_raw("/webhooks/%2e%2e", &body).await;
    assert_eq!(status, 404, "{json}");
    assert_eq!(json["error"], "unknown webhook route");
    let (status, _) = run.post("off", &run.generic(&body, run.now()), &body).await;
    assert_eq!(status, 403);
    // A properly signed event the route does not subscribe to.
    let (status, json) = run
        .post("gh", &run.github(&body, "issues", "i-1"), &body)
        .await;
    assert_eq!(status, 200);
    assert_eq!(json["status"], "ignored");
    // Signed, but not JSON.
    let text = b"hello=world";
    let (status, _) = run
        .post("generic", &run.generic(text, run.now()), text)
        .await;
    assert_eq!(status, 400);
    run.assert_no_event();
    // GET is not a delivery.
    let resp = run
        .http
        .get(format!("{}/webhooks/gh", run.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn a_closed_inbox_is_503_and_the_retry_is_not_a_duplicate() {
    let mut run = start().await;
    let body = pr_body();
    let headers = run.github(&body, "pull_request", "retry-me");
    // The runner is gone: nothing can take the event.
    run.events.close();
    let (status, json) = run.post("gh", &headers, &body).await;
    assert_eq!(status, 503, "{json}");
    // Once a runner takes events again (a restarted run with a new inbox),
    // the sender's retry is accepted.
    run.shutdown.cancel();
    (&mut run.task).await.unwrap().unwrap();
    // Between runs no inbox is attached: the listener still answers, 503.
    let (status, _) = run.post("gh", &headers, &body).await;
    assert_eq!(status, 503);
    let (inbox, mut events) = Inbox::channel(4);
    let (reporter, mut liveness) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let ctx = AdapterContext {
        inbox,
        liveness: reporter,
        shutdown: shutdown.clone(),
    };
    let a = run.adapter.clone();
    let task = tokio::spawn(async move { a.run(ctx).await });
    tokio::time::timeout(WAIT, liveness.wait_for(|l| *l == Liveness::Live))
        .await
        .unwrap()
        .unwrap();
    let (status, _) = run.post("gh", &headers, &body).await;
    assert_eq!(status, 202);
    let ev = tokio::time::timeout(WAIT, events.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ev.message_id, Some(signed_key("gh", None, &body)));
    shutdown.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn send_only_logs() {
    let run = start().await;
    let sent = run
        .adapter
        .send(&OutboundMessage {
            chat_id: "gh:1".into(),
            thread_id: None,
            reply_to: None,
            text: "an answer nobody reads here".into(),
            choices: Vec::new(),
        })
        .await
        .unwrap();
    assert_eq!(sent.message_id, None);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn a_route_without_a_secret_refuses_to_start() {
    let mut config = WebhookConfig::default();
    config.routes.insert(
        "deploys".to_owned(),
        WebhookRouteConfig {
            secret: None,
            secret_env: None,
            scheme: WebhookScheme::Hmac,
            prompt: String::new(),
            deliver: "local".to_owned(),
            events: Vec::new(),
            enabled: true,
        },
    );
    let env = Env::from_pairs(Vec::<(String, String)>::new());
    let err = WebhookSettings::from_config(&config, &env).unwrap_err();
    assert!(matches!(err, WebhookError::MissingSecret { ref route } if route == "deploys"));
    assert!(err.to_string().contains("deploys"), "{err}");
    // An empty secret is no secret.
    if let Some(r) = config.routes.get_mut("deploys") {
        r.secret = Some(Secret::new(""));
    }
    assert!(matches!(
        WebhookSettings::from_config(&config, &env),
        Err(WebhookError::MissingSecret { .. })
    ));
    // From the environment it starts.
    if let Some(r) = config.routes.get_mut("deploys") {
        r.secret = None;
        r.secret_env = Some("DEPLOY_HOOK_SECRET".to_owned());
    }
    let env = Env::from_pairs([("DEPLOY_HOOK_SECRET", "from-env-secret")]);
    let settings = WebhookSettings::from_config(&config, &env)
        .unwrap()
        .unwrap();
    assert_eq!(
        settings.routes["deploys"].secret.expose(),
        "from-env-secret"
    );
}

/// What the gateway's inbound dedupe holds across restarts: (chat id,
/// message id) pairs, answered the way the runner answers
/// [`Inbox::admit`].
type Taken = Arc<std::sync::Mutex<std::collections::HashSet<(String, String)>>>;

/// A fresh adapter (a process's worth of memory: its replay cache and rate
/// limit start empty) serving on its own listener, whose events are
/// admitted against `taken`. Returns the base URL and the events taken.
async fn process(
    taken: Taken,
    rate_limit_per_minute: u32,
) -> (
    String,
    mpsc::UnboundedReceiver<MessageEvent>,
    CancellationToken,
) {
    let mut settings = WebhookSettings::new(routes()).with_clock(|| START);
    settings.rate_limit_per_minute = rate_limit_per_minute;
    let adapter = Arc::new(WebhookAdapter::new(settings).unwrap());
    let mut ingress = Ingress::bind("127.0.0.1", 0).await.unwrap();
    ingress.mount(adapter.mount());
    let base = format!("http://{}", ingress.local_addr());
    let stop = CancellationToken::new();
    tokio::spawn(ingress.serve(stop.clone()));
    let (inbox, mut admits) = Inbox::admitting(4);
    let (fresh_tx, fresh) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(admit) = admits.recv().await {
            let id = (
                admit.event.source.chat_id.clone(),
                admit.event.message_id.clone().unwrap_or_default(),
            );
            let first = taken.lock().unwrap().insert(id);
            let admission = if first {
                Admission::Accepted
            } else {
                Admission::Duplicate
            };
            let event = admit.answer(admission);
            if first {
                let _ = fresh_tx.send(event);
            }
        }
    });
    let (reporter, mut liveness) = LivenessReporter::new();
    let ctx = AdapterContext {
        inbox,
        liveness: reporter,
        shutdown: stop.clone(),
    };
    tokio::spawn(async move { adapter.run(ctx).await });
    tokio::time::timeout(WAIT, liveness.wait_for(|l| *l == Liveness::Live))
        .await
        .unwrap()
        .unwrap();
    (base, fresh, stop)
}

async fn post_to(base: &str, route: &str, headers: &[(&str, String)], body: &[u8]) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/webhooks/{route}"))
        .body(body.to_vec());
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Found: after a restart, a captured signed GitHub delivery resent with a
/// new `X-GitHub-Delivery` became a second turn, because the event was
/// named by that unsigned header. Now the event is named by what is
/// signed, so the gateway's dedupe (which survives the restart) knows it,
/// and the adapter answers 200 `duplicate`, not 202, without spending the
/// rate limit.
#[tokio::test]
async fn a_replay_after_a_restart_is_the_gateways_duplicate_not_accepted() {
    let taken: Taken = Arc::default();
    let body = pr_body();
    let gh = |delivery: &str| {
        let sig = format!("sha256={}", hex(&hmac(GH_SECRET.as_bytes(), &body)));
        vec![
            ("X-GitHub-Event", "pull_request".to_owned()),
            ("X-GitHub-Delivery", delivery.to_owned()),
            ("X-Hub-Signature-256", sig),
        ]
    };
    let (base, mut fresh, first_run) = process(taken.clone(), 1).await;
    let (status, json) = post_to(&base, "gh", &gh("d-original"), &body).await;
    assert_eq!((status, json["status"].as_str()), (202, Some("accepted")));
    assert!(fresh.recv().await.is_some());
    first_run.cancel();

    // The restarted process remembers nothing itself; a budget of one
    // delivery a minute, so a replay that spent it would refuse the next.
    let (base, mut fresh, _second_run) = process(taken.clone(), 1).await;
    for delivery in ["d-forged-1", "d-forged-2"] {
        let (status, json) = post_to(&base, "gh", &gh(delivery), &body).await;
        assert_eq!(status, 200, "{json}");
        assert_eq!(json["status"], "duplicate");
        assert_eq!(json["delivery_id"], delivery);
    }
    let mut without_id = gh("");
    without_id.retain(|(k, _)| *k != "X-GitHub-Delivery");
    let (status, json) = post_to(&base, "gh", &without_id, &body).await;
    assert_eq!((status, json["status"].as_str()), (200, Some("duplicate")));
    assert_eq!(taken.lock().unwrap().len(), 1);
    assert!(fresh.try_recv().is_err(), "a replay became a turn");

    // A genuinely new delivery still gets the route's one unit.
    let other = serde_json::to_vec(&json!({"number": 43})).unwrap();
    let sig = format!("sha256={}", hex(&hmac(GH_SECRET.as_bytes(), &other)));
    let headers = vec![
        ("X-GitHub-Event", "pull_request".to_owned()),
        ("X-GitHub-Delivery", "d-new".to_owned()),
        ("X-Hub-Signature-256", sig),
    ];
    let (status, json) = post_to(&base, "gh", &headers, &other).await;
    assert_eq!((status, json["status"].as_str()), (202, Some("accepted")));
    let ev = tokio::time::timeout(WAIT, fresh.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ev.message_id, Some(signed_key("gh", None, &other)));
}
