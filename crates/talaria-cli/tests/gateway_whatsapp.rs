//! `talaria gateway run` as a real process with WhatsApp Cloud configured:
//! the adapter is wired into the shared webhook listener, Meta's signed
//! delivery (retried while the gateway starts, as Meta retries) is answered
//! once through the fake Graph API, and a half-configured WhatsApp stops
//! the start with an error naming what is missing.

mod crash_support;

use std::process::Child;
use std::time::{Duration, Instant};

use crash_support::{Home, spawn_gateway};
use talaria_testkit::whatsapp::{API_VERSION, MetaWebhook, delivery, text};
use talaria_testkit::{FakeGraph, MockOpenAi, Reply};

const TOKEN: &str = "EAAGclitest-access-token-0123456789";
const NUMBER: &str = "106540352242922";
const APP_SECRET: &str = "cli-app-secret-0123456789";
const VERIFY: &str = "cli-verify-token-0123";
const ADA: &str = "16505551234";
const WAIT: Duration = Duration::from_secs(20);

/// Kills the gateway when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn log(home: &Home) -> String {
    std::fs::read_to_string(home.root.join("test-gateway.log")).unwrap_or_default()
}

/// The listener's address, from the line the gateway prints at start.
async fn listener_address(home: &Home) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = log(home);
        if let Some(rest) = text.split("webhook listener on ").nth(1)
            && let Some(url) = rest.split_whitespace().next()
        {
            return url.to_owned();
        }
        assert!(Instant::now() < deadline, "no listener address:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_serves_whatsapp_on_the_shared_listener() {
    let llm = MockOpenAi::start().await;
    let graph = FakeGraph::start(TOKEN, NUMBER).await;
    let home = crash_support::home(
        &llm,
        &format!(
            "  webhook:\n    port: 0\n  whatsapp_cloud:\n    graph_base: {}\n    \
             api_version: {API_VERSION}\n",
            graph.base_url()
        ),
        &format!(
            "WHATSAPP_CLOUD_TOKEN={TOKEN}\nWHATSAPP_CLOUD_PHONE_NUMBER_ID={NUMBER}\n\
             WHATSAPP_CLOUD_APP_SECRET={APP_SECRET}\nWHATSAPP_CLOUD_VERIFY_TOKEN={VERIFY}\n\
             WHATSAPP_CLOUD_ALLOWED_USERS={ADA}\n"
        ),
    );
    let _gateway = Running(spawn_gateway(&home, &home.root.join("test-gateway.log")));
    let base = listener_address(&home).await;
    let meta = MetaWebhook::new(&base, APP_SECRET);

    let handshake = meta.verify("subscribe", VERIFY, "4242").await;
    assert_eq!((handshake.status, handshake.body.as_str()), (200, "4242"));

    llm.push(Reply::text("Hello from the gateway."));
    let payload = delivery(
        NUMBER,
        &[(ADA, "Ada")],
        vec![text(ADA, "wamid.CLI1", "hello?")],
        vec![],
    );
    // 503 until the adapter's run has attached the inbox; Meta retries,
    // and so does this test.
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = meta.deliver(&payload).await;
        if answer.status == 200 {
            break;
        }
        assert_eq!(answer.status, 503, "{answer:?}\n{}", log(&home));
        assert!(Instant::now() < deadline, "never taken:\n{}", log(&home));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Delivered again once taken: still one turn.
    assert_eq!(meta.deliver(&payload).await.status, 200);
    let sent = graph.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].to, ADA);
    assert_eq!(sent[0].body, "Hello from the gateway.");
    assert_eq!(sent[0].context.as_deref(), Some("wamid.CLI1"));
    assert_eq!(llm.requests().len(), 1);
    let text = log(&home);
    for secret in [TOKEN, APP_SECRET, VERIFY] {
        assert!(!text.contains(secret), "a secret was logged:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_configured_whatsapp_stops_the_start_naming_what_is_missing() {
    let llm = MockOpenAi::start().await;
    let home = crash_support::home(
        &llm,
        "  webhook:\n    port: 0\n",
        &format!("WHATSAPP_CLOUD_TOKEN={TOKEN}\nWHATSAPP_CLOUD_PHONE_NUMBER_ID={NUMBER}\n"),
    );
    let mut gateway = Running(spawn_gateway(&home, &home.root.join("test-gateway.log")));
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = gateway.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "still running:\n{}", log(&home));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!status.success());
    let text = log(&home);
    assert!(
        text.contains("WHATSAPP_CLOUD_APP_SECRET, WHATSAPP_CLOUD_VERIFY_TOKEN"),
        "{text}"
    );
    assert!(!text.contains(TOKEN), "the token was logged:\n{text}");
}
