//! `talaria gateway run` as a real process with WhatsApp Cloud configured:
//! the adapter is wired into the shared webhook listener, Meta's signed
//! delivery (retried while the gateway starts, as Meta retries) is answered
//! once through the fake Graph API, and a half-configured WhatsApp stops
//! the start with an error naming what is missing. (The crash re-send is
//! the suite's, in `gateway_crash.rs`.)

use crate::crash_support;

use std::process::Child;
use std::time::{Duration, Instant};

use crash_support::{Home, spawn_gateway};
use talaria_testkit::kit::PlatformKit;
use talaria_testkit::kit::whatsapp::{ADA, APP_SECRET, NUMBER, TOKEN, VERIFY, WhatsappKit};
use talaria_testkit::whatsapp::MetaWebhook;
use talaria_testkit::{MockOpenAi, Reply};

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
    let kit = WhatsappKit::start().await;
    let home = crash_support::kit_home(&llm, &kit);
    let _gateway = Running(spawn_gateway(&home, &home.root.join("test-gateway.log")));
    let base = listener_address(&home).await;
    assert_eq!(base, kit.base, "the listener is where the section put it");
    let meta = MetaWebhook::new(&base, APP_SECRET);

    let handshake = meta.verify("subscribe", VERIFY, "4242").await;
    assert_eq!((handshake.status, handshake.body.as_str()), (200, "4242"));

    llm.push(Reply::text("Hello from the gateway."));
    let payload = WhatsappKit::text_from(ADA, "wamid.CLI1", "hello?");
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
    let sent = kit.fake.wait_for_sent(1, WAIT).await;
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
