//! The Weixin adapter against the fake iLink bot API in talaria-testkit.
//! The media tests compute their ciphertexts with the `openssl` command
//! line, independently of the adapter's (and the fake's) own AES.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use serde_json::json;
use talaria_adapter::{AttachmentSource, MediaKind, OutboundFile};
use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, ChatType, Inbox, Liveness, LivenessReporter,
    MessageEvent, OutboundMessage, SendError,
};
use talaria_platforms::weixin::{WeixinAdapter, WeixinSettings, WeixinTimings};
use talaria_store::CursorStore;
use talaria_testkit::weixin::{ACCOUNT_ID, FakeWeixin};
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "e9b0c1d2a3f4@im.bot:0600test5e2d";
const PEER: &str = "o9cq80_peer@im.wechat";
const WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Cursors(Mutex<HashMap<(String, String), String>>);

#[async_trait]
impl CursorStore for Cursors {
    async fn cursor(&self, platform: &str, name: &str) -> talaria_store::Result<Option<String>> {
        Ok(self
            .0
            .lock()
            .unwrap()
            .get(&(platform.into(), name.into()))
            .cloned())
    }

    async fn set_cursor(
        &self,
        platform: &str,
        name: &str,
        value: &str,
    ) -> talaria_store::Result<()> {
        self.0
            .lock()
            .unwrap()
            .insert((platform.into(), name.into()), value.into());
        Ok(())
    }

    async fn delete_cursor(&self, platform: &str, name: &str) -> talaria_store::Result<bool> {
        Ok(self
            .0
            .lock()
            .unwrap()
            .remove(&(platform.into(), name.into()))
            .is_some())
    }
}

fn adapter(fake: &FakeWeixin, cursors: Arc<Cursors>) -> Arc<WeixinAdapter> {
    let settings = WeixinSettings {
        token: TOKEN.into(),
        account_id: ACCOUNT_ID.into(),
        base_url: fake.base_url(),
        cdn_base_url: fake.cdn_base_url(),
        timings: WeixinTimings {
            poll_timeout: Duration::from_secs(1),
            poll_retry: Duration::from_millis(20),
            poll_backoff: Duration::from_millis(40),
            chunk_delay: Duration::from_millis(200),
            chunk_retries: 2,
            chunk_retry_delay: Duration::from_millis(300),
        },
    };
    Arc::new(WeixinAdapter::new(settings, cursors).unwrap())
}

struct Running {
    events: mpsc::Receiver<MessageEvent>,
    liveness: watch::Receiver<Liveness>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AdapterError>>,
}

fn spawn(a: &Arc<WeixinAdapter>) -> Running {
    let (inbox, events) = Inbox::channel(16);
    let (reporter, liveness) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let ctx = AdapterContext {
        inbox,
        liveness: reporter,
        shutdown: shutdown.clone(),
    };
    let a = a.clone();
    let task = tokio::spawn(async move { a.run(ctx).await });
    Running {
        events,
        liveness,
        shutdown,
        task,
    }
}

impl Running {
    async fn next(&mut self) -> MessageEvent {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("no event in time")
            .expect("inbox closed")
    }

    async fn ended(self) -> Result<(), AdapterError> {
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("run did not return")
            .expect("run panicked")
    }

    async fn stop(self) -> Result<(), AdapterError> {
        self.shutdown.cancel();
        self.ended().await
    }
}

fn out(text: &str) -> OutboundMessage {
    OutboundMessage {
        chat_id: PEER.into(),
        thread_id: None,
        reply_to: None,
        text: text.into(),
        choices: Vec::new(),
    }
}

#[tokio::test]
async fn texts_become_dm_events_and_replies_carry_the_context_token() {
    let fake = FakeWeixin::start(TOKEN, Duration::from_millis(300)).await;
    let cursors = Arc::new(Cursors::default());
    let a = adapter(&fake, cursors.clone());
    let mut run = spawn(&a);
    let id = fake.push_text(PEER, "hello");
    let ev = run.next().await;
    assert_eq!(
        (ev.source.chat_type, ev.source.chat_id.as_str()),
        (ChatType::Dm, PEER)
    );
    assert_eq!(
        (ev.text.as_str(), ev.message_id.as_deref()),
        ("hello", Some(id.as_str()))
    );
    tokio::time::timeout(WAIT, run.liveness.wait_for(|l| *l == Liveness::Live))
        .await
        .unwrap()
        .unwrap();
    // Our own echoes, bot messages, groups and files are not turns.
    fake.push_raw(
        serde_json::json!({"message_id": 1, "from_user_id": ACCOUNT_ID,
        "message_type": 1, "item_list": [{"type": 1, "text_item": {"text": "me"}}]}),
    );
    fake.push_raw(serde_json::json!({"message_id": 2, "from_user_id": PEER,
        "message_type": 2, "item_list": [{"type": 1, "text_item": {"text": "bot"}}]}));
    fake.push_raw(
        serde_json::json!({"message_id": 3, "from_user_id": PEER, "room_id": "r@chatroom",
        "message_type": 1, "item_list": [{"type": 1, "text_item": {"text": "group"}}]}),
    );
    fake.push_raw(serde_json::json!({"message_id": 4, "from_user_id": PEER,
        "message_type": 1, "item_list": [{"type": 3, "voice_item": {"text": "a transcript"}}]}));
    assert_eq!(run.next().await.text, "a transcript");
    // The same message again is not handed over twice.
    fake.redeliver(&id);
    fake.push_text(PEER, "next");
    assert_eq!(run.next().await.text, "next");

    a.send(&out("answer one")).await.unwrap();
    a.send(&out("answer two")).await.unwrap();
    let sent = fake.sent();
    assert_eq!(sent[0].context_token, fake.context_token(PEER));
    // Paced: the second part no sooner than the configured delay.
    assert!(sent[1].at.duration_since(sent[0].at) >= Duration::from_millis(200));
    assert!(fake.requests().iter().all(|r| r.well_formed));
    // The cursor and the token are in the store.
    let kept = cursors.0.lock().unwrap().clone();
    assert!(
        kept.keys()
            .any(|(p, n)| p == "weixin" && n.ends_with("get_updates_buf"))
    );
    assert!(
        kept.values()
            .any(|v| Some(v) == fake.context_token(PEER).as_ref())
    );
    run.stop().await.unwrap();
}

#[tokio::test]
async fn a_stale_token_is_dropped_and_rate_limits_are_waited_out() {
    let fake = FakeWeixin::start(TOKEN, Duration::from_millis(300)).await;
    let a = adapter(&fake, Arc::new(Cursors::default()));
    let mut run = spawn(&a);
    fake.push_text(PEER, "hi");
    run.next().await;
    fake.rotate_context_token(PEER);
    a.send(&out("still arrives")).await.unwrap();
    let sent = fake.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].context_token, None);
    // -2: waited out, no sooner than the retry delay.
    fake.fail_next_send(-2);
    a.send(&out("later")).await.unwrap();
    let attempts = fake.send_attempts();
    let n = attempts.len();
    // The stale token was dropped after the first refusal: two tries only.
    assert_eq!(n, 4);
    assert_eq!(fake.sent()[1].context_token, None);
    assert!(attempts[n - 1].at.duration_since(attempts[n - 2].at) >= Duration::from_millis(300));
    // Rate-limited past the retries: the ledger hears how long to wait.
    for _ in 0..3 {
        fake.fail_next_send(-2);
    }
    let err = a.send(&out("never")).await.unwrap_err();
    assert!(matches!(err, SendError::RateLimited(_)), "{err:?}");
    // Another refusal is final, and names its code.
    fake.fail_next_send(-3);
    let err = a.send(&out("no")).await.unwrap_err();
    assert!(
        matches!(&err, SendError::Rejected(m) if m.contains("-3")),
        "{err:?}"
    );
    // A poll answered -2 is retried.
    let polls = fake.polls();
    fake.fail_next_poll(-2);
    // The poll in flight, then the refused one, then one more.
    fake.wait_for_polls(polls + 3, WAIT).await;
    let refused = fake
        .requests()
        .iter()
        .filter(|r| r.endpoint == "getupdates")
        .count();
    assert!(refused >= polls + 3);
    fake.push_text(PEER, "after the pause");
    assert_eq!(run.next().await.text, "after the pause");
    run.stop().await.unwrap();
}

#[tokio::test]
async fn typing_fetches_a_ticket_once() {
    let fake = FakeWeixin::start(TOKEN, Duration::from_millis(300)).await;
    let a = adapter(&fake, Arc::new(Cursors::default()));
    a.typing(PEER, None).await.unwrap();
    a.typing(PEER, None).await.unwrap();
    let typing = fake.typing();
    assert_eq!(typing.len(), 2);
    assert_eq!(typing[0].1, typing[1].1, "the ticket is cached");
    let getconfig = fake
        .requests()
        .iter()
        .filter(|r| r.endpoint == "getconfig")
        .count();
    assert_eq!(getconfig, 1);
}

#[tokio::test]
async fn an_expired_login_ends_polling_for_good_with_the_fix() {
    let fake = FakeWeixin::start(TOKEN, Duration::from_millis(300)).await;
    let a = adapter(&fake, Arc::new(Cursors::default()));
    let run = spawn(&a);
    fake.wait_for_polls(1, WAIT).await;
    fake.fail_next_poll(-14);
    match run.ended().await {
        Err(AdapterError::Fatal(m)) => {
            assert!(
                m.contains("log in again") && m.contains("WEIXIN_TOKEN"),
                "{m}"
            );
            assert!(!m.contains(TOKEN));
        }
        other => panic!("{other:?}"),
    }
    let polls = fake.polls();
    // Run again (as the supervisor would): no poll, the same reason.
    let run = spawn(&a);
    assert!(matches!(run.ended().await, Err(AdapterError::Fatal(_))));
    assert_eq!(fake.polls(), polls);
}

const KEY_HEX: &str = "00112233445566778899aabbccddeeff";

/// `data` through `openssl enc -aes-128-ecb` (PKCS#7 padding is
/// openssl's default) with the key `hex`; `decrypt` runs it backwards.
fn openssl(hex: &str, data: &[u8], decrypt: bool) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::write(&input, data).unwrap();
    let mut cmd = std::process::Command::new("openssl");
    cmd.args(["enc", "-aes-128-ecb", "-nosalt", "-K", hex, "-in"])
        .arg(&input);
    if decrypt {
        cmd.arg("-d");
    }
    let out = cmd.output().expect("openssl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn raw_key() -> Vec<u8> {
    (0..16)
        .map(|i| u8::from_str_radix(&KEY_HEX[i * 2..i * 2 + 2], 16).unwrap())
        .collect()
}

async fn read_all(a: &WeixinAdapter, locator: &str) -> Vec<u8> {
    let mut dl = a.download(locator).await.unwrap();
    let mut got = Vec::new();
    dl.reader.read_to_end(&mut got).await.unwrap();
    got
}

#[tokio::test]
async fn media_items_are_fetched_from_the_cdn_and_decrypted() {
    let fake = FakeWeixin::start(TOKEN, Duration::from_millis(300)).await;
    let a = adapter(&fake, Arc::new(Cursors::default()));
    let mut run = spawn(&a);
    let b64 = base64::engine::general_purpose::STANDARD;
    // A report, 1000 bytes, its key as base64 of the raw bytes; a photo,
    // a whole number of blocks, its key as image_item's hex (which wins
    // over a media key that is garbage).
    let report: Vec<u8> = (0..1000u32).map(|i| (i % 199) as u8).collect();
    let photo: Vec<u8> = (0..64u32).map(|i| (i * 3) as u8).collect();
    let report_param = fake.put_cdn_file(openssl(KEY_HEX, &report, false));
    let photo_param = fake.put_cdn_file(openssl(KEY_HEX, &photo, false));
    fake.push_items(
        PEER,
        json!([
            {"type": 4, "file_item": {"file_name": "report.pdf", "len": "1000",
                "media": {"encrypt_query_param": report_param, "aes_key": b64.encode(raw_key()),
                          "encrypt_type": 1}}},
            {"type": 2, "image_item": {"aeskey": KEY_HEX,
                "media": {"encrypt_query_param": photo_param, "aes_key": "bm90IGEga2V5"}}},
            {"type": 3, "voice_item": {"text": "call mum at six",
                "media": {"encrypt_query_param": "unused", "aes_key": b64.encode(raw_key())}}},
            {"type": 5, "video_item": {"media": {"encrypt_query_param": "v", "aes_key": "bm9wZQ=="}}}
        ]),
    );
    let ev = run.next().await;
    assert_eq!(ev.text, "call mum at six");
    assert_eq!(ev.attachments.len(), 3, "{:?}", ev.attachments);
    let doc = &ev.attachments[0];
    assert_eq!(
        (doc.kind, doc.name.as_deref(), doc.size),
        (MediaKind::Document, Some("report.pdf"), Some(1000))
    );
    let AttachmentSource::Remote(doc_loc) = &doc.source else {
        panic!("{doc:?}");
    };
    assert_eq!(read_all(&a, doc_loc).await, report);
    let AttachmentSource::Remote(img_loc) = &ev.attachments[1].source else {
        panic!("{:?}", ev.attachments[1]);
    };
    assert_eq!(ev.attachments[1].kind, MediaKind::Image);
    assert_eq!(read_all(&a, img_loc).await, photo);
    // A video whose key opens nothing is refused in words, not fetched.
    assert!(matches!(
        ev.attachments[2].source,
        AttachmentSource::Refused(_)
    ));
    // A file the CDN does not have is gone; a body not of whole blocks
    // is an error, never garbage handed on.
    assert!(
        a.download("00112233445566778899aabbccddeeff:nope")
            .await
            .is_err()
    );
    let cut = fake.put_cdn_file(openssl(KEY_HEX, &report, false)[..100].to_vec());
    let mut dl = a.download(&format!("{KEY_HEX}:{cut}")).await.unwrap();
    let mut sink = Vec::new();
    assert!(dl.reader.read_to_end(&mut sink).await.is_err());
    run.stop().await.unwrap();
}

fn outbound(
    dir: &std::path::Path,
    name: &str,
    kind: MediaKind,
    mime: &str,
    bytes: &[u8],
) -> OutboundFile {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    OutboundFile {
        chat_id: PEER.into(),
        thread_id: None,
        reply_to: None,
        path,
        kind,
        mime: mime.into(),
        name: name.into(),
        caption: None,
    }
}

#[tokio::test]
async fn a_file_sent_is_encrypted_uploaded_and_sent_as_an_item() {
    let fake = FakeWeixin::start(TOKEN, Duration::from_millis(300)).await;
    let a = adapter(&fake, Arc::new(Cursors::default()));
    let dir = tempfile::tempdir().unwrap();
    let photo: Vec<u8> = (0..5000u32).map(|i| (i % 241) as u8).collect();
    a.send_file(&outbound(
        dir.path(),
        "chart.png",
        MediaKind::Image,
        "image/png",
        &photo,
    ))
    .await
    .unwrap();
    let mut notes = outbound(
        dir.path(),
        "notes.txt",
        MediaKind::Document,
        "text/plain",
        b"sixteen bytes!!!",
    );
    notes.caption = Some("the notes".into());
    a.send_file(&notes).await.unwrap();
    let sent = fake.wait_for_media(2, WAIT).await;
    let uploads = fake.uploads();
    assert_eq!(uploads.len(), 2);
    // What reached the CDN opens with openssl and the key named in
    // getuploadurl, and the item hands over that key as base64 of its hex.
    assert_eq!(
        openssl(&uploads[0].aeskey_hex, &uploads[0].ciphertext, true),
        photo
    );
    assert_eq!(uploads[0].ciphertext.len(), 5008);
    assert_eq!(uploads[0].media_type, 1);
    assert_eq!(sent[0].item_type, 2);
    let key_b64 = sent[0].item["image_item"]["media"]["aes_key"]
        .as_str()
        .unwrap();
    let key_text = base64::engine::general_purpose::STANDARD
        .decode(key_b64)
        .unwrap();
    assert_eq!(String::from_utf8(key_text).unwrap(), uploads[0].aeskey_hex);
    assert_eq!(
        openssl(&uploads[1].aeskey_hex, &uploads[1].ciphertext, true),
        b"sixteen bytes!!!"
    );
    // 16 bytes take a whole block of padding.
    assert_eq!(uploads[1].ciphertext.len(), 32);
    assert_ne!(
        uploads[0].aeskey_hex, uploads[1].aeskey_hex,
        "a fresh key per file"
    );
    assert_eq!(
        (sent[1].item_type, sent[1].name.as_deref()),
        (4, Some("notes.txt"))
    );
    assert_eq!(sent[1].item["file_item"]["len"], "16");
    let captions = fake.wait_for_sent(1, WAIT).await;
    assert_eq!(captions[0].text, "the notes");
    assert!(fake.requests().iter().all(|r| r.well_formed));
}

#[tokio::test]
async fn an_upload_address_off_the_cdn_is_not_followed() {
    let fake = FakeWeixin::start(TOKEN, Duration::from_millis(300)).await;
    let a = adapter(&fake, Arc::new(Cursors::default()));
    let dir = tempfile::tempdir().unwrap();
    let doc = outbound(
        dir.path(),
        "a.txt",
        MediaKind::Document,
        "text/plain",
        b"hello",
    );
    // The CDN's own address (full) is used as given.
    fake.answer_full_upload_url("{cdn}/upload");
    a.send_file(&doc).await.unwrap();
    assert_eq!(fake.wait_for_media(1, WAIT).await[0].bytes, b"hello");
    // The same server under another name is not one of the hosts: with
    // no upload_param to fall back on, nothing is uploaded.
    let other = fake.cdn_base_url().replace("127.0.0.1", "localhost");
    fake.answer_full_upload_url(&format!("{other}/upload"));
    let err = a.send_file(&doc).await.unwrap_err();
    assert!(matches!(err, SendError::Transient(_)), "{err:?}");
    assert_eq!(fake.uploads().len(), 1);
}
