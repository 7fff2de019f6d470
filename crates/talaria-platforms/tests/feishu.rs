//! The Feishu adapter's webhook against deliveries built here: signatures
//! computed with Python's `hashlib` and bodies encrypted with the
//! `openssl` command line, independently of the adapter's own code.
#![cfg(feature = "feishu")]

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use talaria_adapter::{
    Adapter, AdapterContext, Inbox, LivenessReporter, MediaKind, MessageEvent, OutboundFile,
};
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

/// The adapter on its own against the fake, for files.
async fn media_adapter() -> (FakeFeishu, FeishuAdapter, tempfile::TempDir) {
    let fake = FakeFeishu::start("cli_m", "secret_m", BOT).await;
    let mut settings = FeishuSettings::new("cli_m", "secret_m", &fake.base_url());
    settings.rate_limit_wait = Duration::from_millis(10);
    let adapter = FeishuAdapter::new(settings).unwrap();
    (fake, adapter, tempfile::tempdir().unwrap())
}

async fn read_all(download: talaria_adapter::Download) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut bytes = Vec::new();
    let mut reader = download.reader;
    reader.read_to_end(&mut bytes).await.unwrap();
    bytes
}

/// A resource is fetched through its message with the right `type`, the
/// token renewed once when refused; a locator that is not one the adapter
/// wrote never reaches Feishu; a resource Feishu does not have is gone.
#[tokio::test]
async fn downloads_stream_a_messages_resource_and_refuse_other_locators() {
    use talaria_adapter::DownloadError;
    let (fake, adapter, _dir) = media_adapter().await;
    fake.add_resource("om_pic", "img_v3_pic", true, "image/png", b"\x89PNG fake");
    fake.add_resource(
        "om_doc",
        "file_v3_doc",
        false,
        "application/pdf",
        b"%PDF-1.4",
    );
    let d = adapter.download("image:om_pic:img_v3_pic").await.unwrap();
    assert_eq!(d.length, Some(9));
    assert_eq!(read_all(d).await, b"\x89PNG fake");
    fake.invalidate_token();
    let d = adapter.download("file:om_doc:file_v3_doc").await.unwrap();
    assert_eq!(read_all(d).await, b"%PDF-1.4");
    assert_eq!(fake.tokens_issued(), 2);
    let calls = fake.calls();
    assert!(
        calls.contains(
            &"GET /open-apis/im/v1/messages/om_pic/resources/img_v3_pic?type=image".to_owned()
        ),
        "{calls:?}"
    );
    let before = fake.calls().len();
    for bad in [
        "image:om_pic:../../../open-apis/bot/v3/info",
        "https://open.feishu.cn/x",
        "file:oc_chat:file_v3_doc",
        "image:om_pic:img_v3_pic:x",
    ] {
        assert!(
            matches!(adapter.download(bad).await, Err(DownloadError::Gone(_))),
            "{bad}"
        );
    }
    assert_eq!(fake.calls().len(), before, "nothing reached Feishu");
    // The right key with the wrong type, and a key the message lacks.
    assert!(matches!(
        adapter.download("file:om_pic:img_v3_pic").await,
        Err(DownloadError::Gone(_))
    ));
    assert!(matches!(
        adapter.download("image:om_pic:img_v3_none").await,
        Err(DownloadError::Gone(_))
    ));
}

fn outbound(
    dir: &std::path::Path,
    name: &str,
    bytes: &[u8],
    kind: MediaKind,
    mime: &str,
) -> OutboundFile {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    OutboundFile {
        chat_id: "oc_files".into(),
        thread_id: None,
        reply_to: None,
        path,
        kind,
        mime: mime.into(),
        name: name.into(),
        caption: None,
    }
}

/// A photo goes through the image upload as an `image` message, a voice
/// note through the file upload (opus) as `audio`, a PDF as a `file`
/// replying in a topic thread; a re-send posts nothing twice.
#[tokio::test]
async fn files_are_uploaded_and_sent_as_their_message_types() {
    let (fake, adapter, dir) = media_adapter().await;
    let photo = outbound(
        dir.path(),
        "chart.png",
        b"\x89PNG chart",
        MediaKind::Image,
        "image/png",
    );
    let sent = adapter.send_file(&photo).await.unwrap();
    let voice = outbound(
        dir.path(),
        "note.ogg",
        b"OggS voice",
        MediaKind::Voice,
        "audio/ogg",
    );
    adapter.send_file(&voice).await.unwrap();
    fake.add_message("om_topic_q", "oc_topic", Some("omt_t1"));
    let mut pdf = outbound(
        dir.path(),
        "report.pdf",
        b"%PDF-1.4 r",
        MediaKind::Document,
        "application/pdf",
    );
    pdf.chat_id = "oc_topic".into();
    pdf.thread_id = Some("omt_t1".into());
    pdf.reply_to = Some("om_topic_q".into());
    pdf.caption = Some("the report".into());
    adapter.send_file(&pdf).await.unwrap();
    let uploads = fake.uploads();
    assert_eq!(uploads.len(), 3);
    assert_eq!(
        (uploads[0].file_type.as_deref(), uploads[0].bytes.as_slice()),
        (None, &b"\x89PNG chart"[..])
    );
    assert_eq!(uploads[1].file_type.as_deref(), Some("opus"));
    assert_eq!(uploads[2].file_type.as_deref(), Some("pdf"));
    assert_eq!(uploads[2].name.as_deref(), Some("report.pdf"));
    let posted = fake.sent();
    assert_eq!(posted.len(), 4, "three files and the caption: {posted:?}");
    assert_eq!(posted[0].msg_type, "image");
    assert_eq!(posted[0].key.as_deref(), Some(uploads[0].key.as_str()));
    assert_eq!(
        sent.message_id.as_deref(),
        Some(posted[0].message_id.as_str())
    );
    assert_eq!(posted[0].chat, "oc_files");
    assert_eq!(posted[1].msg_type, "audio");
    assert_eq!(posted[2].msg_type, "file");
    assert_eq!(posted[2].parent.as_deref(), Some("om_topic_q"));
    assert_eq!(
        posted[2].thread.as_deref(),
        Some("omt_t1"),
        "answered in the thread"
    );
    assert_eq!(
        (posted[3].msg_type.as_str(), posted[3].text.as_str()),
        ("text", "the report")
    );
    // The ledger sends the photo again (its answer was lost): one message.
    adapter.send_file(&photo).await.unwrap();
    assert_eq!(fake.sent().len(), 4);
}

/// A file over Feishu's 30 MB is refused with a clear error before any
/// upload, and so is an empty one.
#[tokio::test]
async fn a_file_too_large_for_feishu_is_a_clear_error() {
    let (fake, adapter, dir) = media_adapter().await;
    let path = dir.path().join("huge.bin");
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(31 * 1024 * 1024).unwrap();
    let mut huge = outbound(
        dir.path(),
        "x",
        b"",
        MediaKind::Document,
        "application/octet-stream",
    );
    huge.path = path;
    huge.name = "huge.bin".into();
    let err = adapter.send_file(&huge).await.unwrap_err();
    let talaria_adapter::SendError::Rejected(why) = err else {
        panic!("{err:?}")
    };
    assert!(why.contains("huge.bin") && why.contains("30 MB"), "{why}");
    let empty = outbound(
        dir.path(),
        "empty.txt",
        b"",
        MediaKind::Document,
        "text/plain",
    );
    assert!(matches!(
        adapter.send_file(&empty).await,
        Err(talaria_adapter::SendError::Rejected(_))
    ));
    assert!(fake.uploads().is_empty());
    assert!(fake.sent().is_empty());
}
