//! The Feishu adapter's webhook against deliveries built here: signatures
//! computed with Python's `hashlib` and bodies encrypted with the
//! `openssl` command line, independently of the adapter's own code.
#![cfg(feature = "feishu")]

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use talaria_adapter::{Adapter, AdapterContext, Inbox, LivenessReporter, MessageEvent};
use talaria_core::Secret;
use talaria_platforms::feishu::{FeishuAdapter, FeishuSettings};
use talaria_platforms::ingress::Ingress;
use talaria_testkit::feishu::{FakeFeishu, event, text_message};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const KEY: &str = "test-encrypt-key-abc";
const TOKEN: &str = "test-verification-token";
const BOT: &str = "ou_bot_test";

/// Hex SHA-256 of `timestamp + nonce + key + body`, by Python.
fn python_signature(timestamp: &str, nonce: &str, key: &str, body: &[u8]) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(
            "import sys,hashlib; a=sys.argv; \
             print(hashlib.sha256((a[1]+a[2]+a[3]).encode()+bytes.fromhex(a[4])).hexdigest())",
        )
        .arg(timestamp)
        .arg(nonce)
        .arg(key)
        .arg(hex(body))
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `{"encrypt": base64(iv ‖ AES-256-CBC)}` by `openssl enc`, keyed with
/// SHA-256 of the key (by Python).
fn openssl_encrypt(key: &str, plain: &str) -> Value {
    let digest = Command::new("python3")
        .arg("-c")
        .arg("import sys,hashlib; print(hashlib.sha256(sys.argv[1].encode()).hexdigest())")
        .arg(key)
        .output()
        .unwrap();
    let key_hex = String::from_utf8(digest.stdout).unwrap().trim().to_owned();
    let iv = "000102030405060708090a0b0c0d0e0f";
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("plain.json");
    std::fs::write(&input, plain).unwrap();
    let out = Command::new("openssl")
        .args([
            "enc",
            "-aes-256-cbc",
            "-nosalt",
            "-K",
            &key_hex,
            "-iv",
            iv,
            "-in",
        ])
        .arg(&input)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut blob: Vec<u8> = (0u8..16).collect();
    blob.extend_from_slice(&out.stdout);
    let b64 = Command::new("python3")
        .arg("-c")
        .arg("import sys,base64; print(base64.b64encode(bytes.fromhex(sys.argv[1])).decode())")
        .arg(hex(&blob))
        .output()
        .unwrap();
    json!({"encrypt": String::from_utf8(b64.stdout).unwrap().trim()})
}

struct Hooked {
    url: String,
    events: mpsc::Receiver<MessageEvent>,
    stop: CancellationToken,
    _fake: FakeFeishu,
    http: reqwest::Client,
}

impl Drop for Hooked {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn hooked(encrypt_key: Option<&str>) -> Hooked {
    let fake = FakeFeishu::start("cli_t", "secret_t", BOT).await;
    let mut settings = FeishuSettings::new("cli_t", "secret_t", &fake.base_url());
    settings.encrypt_key = encrypt_key.map(Secret::new);
    settings.verification_token = Some(Secret::new(TOKEN));
    let adapter = FeishuAdapter::new(settings).unwrap();
    let mut ingress = Ingress::bind("127.0.0.1", 0).await.unwrap();
    let addr = ingress.local_addr();
    ingress.mount(adapter.mount());
    let stop = CancellationToken::new();
    tokio::spawn(ingress.serve(stop.clone()));
    let (inbox, events) = Inbox::channel(16);
    let (liveness, _) = LivenessReporter::new();
    let ctx = AdapterContext {
        inbox,
        liveness,
        shutdown: stop.clone(),
    };
    tokio::spawn(async move { adapter.run(ctx).await });
    let http = reqwest::Client::new();
    // Deliveries are taken once the adapter attached its inbox.
    let health = format!("http://{addr}/health");
    for _ in 0..200 {
        if http
            .get(&health)
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Hooked {
        url: format!("http://{addr}/feishu/webhook"),
        events,
        stop,
        _fake: fake,
        http,
    }
}

impl Hooked {
    async fn post(&self, body: &[u8], headers: &[(&str, String)]) -> (u16, Value) {
        let mut r = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .body(body.to_vec());
        for (k, v) in headers {
            r = r.header(*k, v);
        }
        let answer = r.send().await.unwrap();
        let status = answer.status().as_u16();
        (status, answer.json().await.unwrap_or(Value::Null))
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn signed(body: &[u8], at: u64, nonce: &str) -> Vec<(&'static str, String)> {
    let ts = at.to_string();
    let sig = python_signature(&ts, nonce, KEY, body);
    vec![
        ("X-Lark-Request-Timestamp", ts),
        ("X-Lark-Request-Nonce", nonce.to_owned()),
        ("X-Lark-Signature", sig),
    ]
}

fn dm(event_id: &str, message_id: &str, text: &str) -> Value {
    event(
        event_id,
        "im.message.receive_v1",
        TOKEN,
        text_message("ou_ada", message_id, "oc_dm", "p2p", None, text, json!([])),
    )
}

#[tokio::test]
async fn the_url_challenge_is_answered_plain_and_encrypted_with_the_right_token() {
    let mut h = hooked(Some(KEY)).await;
    let plain = json!({"type": "url_verification", "challenge": "abc123", "token": TOKEN});
    let (status, body) = h.post(plain.to_string().as_bytes(), &[]).await;
    assert_eq!((status, body), (200, json!({"challenge": "abc123"})));
    let wrong = json!({"type": "url_verification", "challenge": "abc123", "token": "nope"});
    let (status, _) = h.post(wrong.to_string().as_bytes(), &[]).await;
    assert_eq!(status, 401);
    let encrypted = openssl_encrypt(
        KEY,
        &json!({"type": "url_verification", "challenge": "enc-9", "token": TOKEN}).to_string(),
    );
    let (status, body) = h.post(encrypted.to_string().as_bytes(), &[]).await;
    assert_eq!((status, body), (200, json!({"challenge": "enc-9"})));
    let other_key = openssl_encrypt("another-key", &plain.to_string());
    let (status, _) = h.post(other_key.to_string().as_bytes(), &[]).await;
    assert_eq!(status, 400);
    assert!(h.events.try_recv().is_err());
}

#[tokio::test]
async fn signed_encrypted_events_are_taken_once_and_tampered_or_stale_ones_refused() {
    let mut h = hooked(Some(KEY)).await;
    let body = openssl_encrypt(KEY, &dm("ev-1", "om_1", "hello").to_string())
        .to_string()
        .into_bytes();
    let headers = signed(&body, now(), "n-1");

    // Tampered: one byte of the body changed after signing.
    let mut tampered = body.clone();
    let at = tampered.len() - 5;
    tampered[at] = if tampered[at] == b'A' { b'B' } else { b'A' };
    assert_eq!(h.post(&tampered, &headers).await.0, 401);
    // No signature at all.
    assert_eq!(h.post(&body, &[]).await.0, 401);
    // Signed ten minutes ago: a replay of an old capture.
    let old = signed(&body, now() - 600, "n-0");
    assert_eq!(h.post(&body, &old).await.0, 401);
    assert!(
        h.events.try_recv().is_err(),
        "nothing refused was handed on"
    );

    assert_eq!(h.post(&body, &headers).await.0, 200);
    let got = tokio::time::timeout(Duration::from_secs(5), h.events.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.text, "hello");
    assert_eq!(got.message_id.as_deref(), Some("om_1"));
    assert_eq!(got.source.chat_id, "oc_dm");
    assert_eq!(got.source.user_id.as_deref(), Some("ou_ada"));

    // Replayed within the window: accepted as Feishu's retry, ignored.
    assert_eq!(h.post(&body, &headers).await.0, 200);
    let again = tokio::time::timeout(Duration::from_millis(500), h.events.recv()).await;
    assert!(again.is_err(), "a replay was handed on: {again:?}");
}

#[tokio::test]
async fn without_an_encrypt_key_the_token_decides_and_group_messages_need_a_mention() {
    let mut h = hooked(None).await;
    let group = |id: &str, text: &str, mentions: Value| {
        event(
            &format!("ev-{id}"),
            "im.message.receive_v1",
            TOKEN,
            text_message("ou_ada", id, "oc_g", "group", None, text, mentions),
        )
    };
    let unaddressed = group("om_a", "just chatting", json!([]));
    assert_eq!(h.post(unaddressed.to_string().as_bytes(), &[]).await.0, 200);
    let mentions = json!([{"key": "@_user_1", "id": {"open_id": BOT}, "name": "Bot"}]);
    let addressed = group("om_b", "@_user_1 what now?", mentions);
    let mut forged = addressed.clone();
    forged["header"]["token"] = json!("forged");
    assert_eq!(h.post(forged.to_string().as_bytes(), &[]).await.0, 401);
    assert_eq!(h.post(addressed.to_string().as_bytes(), &[]).await.0, 200);
    let got = tokio::time::timeout(Duration::from_secs(5), h.events.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.message_id.as_deref(), Some("om_b"));
    assert_eq!(got.text, "what now?");
    // An encrypted body when no key is configured cannot be read.
    let encrypted = openssl_encrypt(KEY, &addressed.to_string());
    assert_eq!(h.post(encrypted.to_string().as_bytes(), &[]).await.0, 400);
    assert!(h.events.try_recv().is_err());
}
