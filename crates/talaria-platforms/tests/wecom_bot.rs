//! The WeCom intelligent robot's adapter against the fake long
//! connection: the subscription, heartbeats, message callbacks (text,
//! mixed, voice, files whose ciphertext the `openssl` command line
//! computes, never the adapter's code), answers bound to their message's
//! `req_id`, proactive DMs, the three-step upload, welcomes and repeats.
#![cfg(feature = "wecom")]

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use talaria_adapter::{AttachmentSource, MediaKind, OutboundFile};
use talaria_core::Secret;
use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, ChatType, Inbox, Liveness, LivenessReporter,
    MessageEvent, OutboundMessage, SendError,
};
use talaria_platforms::wecom::bot::{Access, Policy, WecomBotAdapter, WecomBotSettings};
use talaria_testkit::FakeWecomBot;
use talaria_testkit::wait::{WAIT, wait_for};
use talaria_testkit::wecom_bot::{BAD_SECRET, dm_body, group_body};
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const BOT_ID: &str = "aibtest0001";
const SECRET: &str = "wecom-robot-secret-0002";
/// A file key as WeCom sends one: 43 characters of base64.
const AESKEY: &str = "Zm9vYmFyYmF6cXV4MDEyMzQ1Njc4OWFiY2RlZmdoaWo";

fn settings(fake: &FakeWecomBot) -> WecomBotSettings {
    WecomBotSettings {
        bot_id: BOT_ID.into(),
        secret: Secret::new(SECRET),
        websocket_url: fake.ws_url(),
        access: Access {
            dm: Policy::Open,
            dm_allow_from: vec![],
            allow_all: false,
            group: Policy::Open,
            group_allow_from: vec![],
        },
        media_hosts: vec![fake.media_host()],
        welcome: Some("Hello, I am Talaria.".into()),
        ping_interval: Duration::from_millis(200),
        request_timeout: Duration::from_secs(3),
        rate_limit_wait: Duration::from_millis(100),
    }
}

struct Running {
    adapter: Arc<WecomBotAdapter>,
    events: mpsc::Receiver<MessageEvent>,
    liveness: watch::Receiver<Liveness>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AdapterError>>,
}

fn spawn(settings: WecomBotSettings) -> Running {
    let adapter = Arc::new(WecomBotAdapter::new(settings).unwrap());
    let (inbox, events) = Inbox::channel(16);
    let (reporter, liveness) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let ctx = AdapterContext {
        inbox,
        liveness: reporter,
        shutdown: shutdown.clone(),
    };
    let task = {
        let adapter = adapter.clone();
        tokio::spawn(async move { adapter.run(ctx).await })
    };
    Running {
        adapter,
        events,
        liveness,
        shutdown,
        task,
    }
}

/// Runs the adapter as the supervisor would: again after each failure.
fn spawn_supervised(settings: WecomBotSettings) -> Running {
    let adapter = Arc::new(WecomBotAdapter::new(settings).unwrap());
    let (inbox, events) = Inbox::channel(16);
    let (reporter, liveness) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let task = {
        let adapter = adapter.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            loop {
                let ctx = AdapterContext {
                    inbox: inbox.clone(),
                    liveness: reporter.clone(),
                    shutdown: shutdown.clone(),
                };
                let r = adapter.run(ctx).await;
                if shutdown.is_cancelled() {
                    return r;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    Running {
        adapter,
        events,
        liveness,
        shutdown,
        task,
    }
}

async fn next_event(events: &mut mpsc::Receiver<MessageEvent>) -> MessageEvent {
    tokio::time::timeout(WAIT, events.recv())
        .await
        .expect("an event in time")
        .expect("the inbox is open")
}

fn text(chat: &str, text: &str) -> OutboundMessage {
    OutboundMessage {
        chat_id: chat.into(),
        thread_id: None,
        reply_to: None,
        text: text.into(),
        choices: Vec::new(),
    }
}

/// `plain` encrypted by `openssl enc` on its own: key = the aeskey
/// decoded, IV = its first 16 bytes, padded here to a 32-byte block.
fn openssl_seal(plain: &[u8]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("plain");
    let mut padded = plain.to_vec();
    let pad = 32 - plain.len() % 32;
    padded.extend(std::iter::repeat_n(pad as u8, pad));
    std::fs::write(&input, &padded).unwrap();
    let key = Command::new("sh")
        .args([
            "-c",
            &format!("printf %s '{AESKEY}=' | openssl base64 -d -A | od -An -tx1 | tr -d ' \\n'"),
        ])
        .output()
        .unwrap();
    let key = String::from_utf8(key.stdout).unwrap();
    assert_eq!(key.len(), 64, "{key}");
    let out = Command::new("openssl")
        .args([
            "enc",
            "-aes-256-cbc",
            "-nopad",
            "-K",
            &key,
            "-iv",
            &key[..32],
            "-in",
        ])
        .arg(&input)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

async fn read_all(adapter: &WecomBotAdapter, locator: &str) -> std::io::Result<Vec<u8>> {
    let mut download = adapter.download(locator).await.unwrap();
    let mut bytes = Vec::new();
    download.reader.read_to_end(&mut bytes).await?;
    Ok(bytes)
}

fn locator(event: &MessageEvent) -> String {
    match &event.attachments[0].source {
        AttachmentSource::Remote(l) => l.clone(),
        other => panic!("not remote: {other:?}"),
    }
}

#[tokio::test]
async fn a_wrong_secret_is_a_fatal_error_that_names_the_variables_not_the_secret() {
    let fake = FakeWecomBot::start(BOT_ID, "the-right-secret").await;
    let mut s = settings(&fake);
    s.secret = Secret::new("a-wrong-secret-value");
    let running = spawn(s);
    let result = tokio::time::timeout(WAIT, running.task)
        .await
        .unwrap()
        .unwrap();
    let Err(AdapterError::Fatal(why)) = result else {
        panic!("{result:?}");
    };
    assert!(why.contains("WECOM_SECRET"), "{why}");
    assert!(!why.contains("a-wrong-secret-value"), "{why}");
    assert_eq!(fake.subscriptions(), vec![(BOT_ID.to_owned(), BAD_SECRET)]);
}

#[tokio::test]
async fn texts_voice_and_mixed_messages_become_events_and_repeats_are_dropped() {
    let fake = FakeWecomBot::start(BOT_ID, SECRET).await;
    let mut r = spawn(settings(&fake));
    fake.wait_for_connection(1, WAIT).await;
    let id = fake.push_text_dm("ann", "hello robot");
    let e = next_event(&mut r.events).await;
    assert_eq!(e.text, "hello robot");
    assert_eq!(e.source.chat_id, "ann");
    assert_eq!(e.source.chat_type, ChatType::Dm);
    assert_eq!(e.message_id.as_deref(), Some(id.as_str()));

    // Delivered again: dropped. The voice message after it is the barrier.
    fake.redeliver(&id);
    let voice = fake.next_msgid();
    fake.push_message(dm_body(
        &voice,
        "ann",
        "voice",
        json!({ "content": "call mum" }),
    ));
    let e = next_event(&mut r.events).await;
    assert_eq!(e.text, "call mum");

    let mixed = fake.next_msgid();
    fake.push_message(group_body(
        &mixed,
        "bob",
        "wrgroup1",
        "mixed",
        json!({ "msg_item": [
            { "msgtype": "text", "text": { "content": "@Talaria\u{2005}what is this" } },
            { "msgtype": "image", "image": { "url": fake.host_media(openssl_seal(b"png!")), "aeskey": AESKEY } },
        ]}),
    ));
    let e = next_event(&mut r.events).await;
    assert_eq!(e.text, "what is this");
    assert_eq!(e.source.chat_id, "wrgroup1");
    assert_eq!(e.source.chat_type, ChatType::Group);
    assert_eq!(e.source.user_id.as_deref(), Some("bob"));
    assert_eq!(e.attachments[0].kind, MediaKind::Image);
    assert_eq!(read_all(&r.adapter, &locator(&e)).await.unwrap(), b"png!");
    wait_for("a heartbeat", || async {
        if fake.pings() >= 1 {
            Ok(())
        } else {
            Err(fake.pings())
        }
    })
    .await;
    r.shutdown.cancel();
    assert!(r.task.await.unwrap().is_ok());
}

#[tokio::test]
async fn files_decrypt_as_they_stream_and_a_bad_key_or_host_is_refused() {
    let fake = FakeWecomBot::start(BOT_ID, SECRET).await;
    let mut r = spawn(settings(&fake));
    fake.wait_for_connection(1, WAIT).await;
    // 32 bytes: a whole block of padding; 1.5 MB: many network reads.
    for plain in [
        vec![7u8; 32],
        (0..1_500_000u32).map(|i| (i % 251) as u8).collect(),
    ] {
        let url = fake.host_media(openssl_seal(&plain));
        let id = fake.next_msgid();
        fake.push_message(dm_body(
            &id,
            "ann",
            "file",
            json!({ "url": url, "aeskey": AESKEY }),
        ));
        let e = next_event(&mut r.events).await;
        assert_eq!(e.attachments[0].kind, MediaKind::Document);
        assert_eq!(read_all(&r.adapter, &locator(&e)).await.unwrap(), plain);
    }
    // Another key: the padding does not check out at the end.
    let url = fake.host_media(openssl_seal(b"secret plans"));
    let other = format!("{} {url}", "YmFyYmF6cXV4Zm9vMDEyMzQ1Njc4OWFiY2RlZmdoaWo");
    assert!(read_all(&r.adapter, &other).await.is_err());
    // A URL off the media hosts is never fetched.
    let fetched = fake.media_fetches().len();
    let off = format!("{AESKEY} https://evil.example/f00001");
    assert!(matches!(
        r.adapter.download(&off).await,
        Err(talaria_adapter::DownloadError::Gone(_))
    ));
    assert_eq!(fake.media_fetches().len(), fetched);
    r.shutdown.cancel();
}

#[tokio::test]
async fn answers_use_the_messages_req_id_and_dms_go_proactively_after_a_reconnect() {
    let fake = FakeWecomBot::start(BOT_ID, SECRET).await;
    let mut r = spawn_supervised(settings(&fake));
    fake.wait_for_connection(1, WAIT).await;
    fake.push_text_dm("ann", "hi");
    fake.push_text_group("bob", "wrgroup1", "hello group", true);
    next_event(&mut r.events).await;
    next_event(&mut r.events).await;
    r.adapter.send(&text("ann", "**hi** ann")).await.unwrap();
    r.adapter.send(&text("wrgroup1", "hi group")).await.unwrap();
    let sent = fake.wait_for_sent(2, WAIT).await;
    assert!(sent[0].answering.is_some() && sent[0].chat == "ann" && sent[0].msgtype == "markdown");
    assert_eq!(sent[0].text, "**hi** ann");
    assert!(sent[1].answering.is_some() && sent[1].chat == "wrgroup1" && sent[1].group);

    fake.drop_connection();
    fake.wait_for_connection(2, WAIT).await;
    wait_for("live again", || async {
        if *r.liveness.borrow() == Liveness::Live {
            Ok(())
        } else {
            Err(*r.liveness.borrow())
        }
    })
    .await;
    // The old req_ids belong to a closed connection: the DM goes
    // proactively, the group cannot be reached.
    r.adapter.send(&text("ann", "still here")).await.unwrap();
    let sent = fake.wait_for_sent(3, WAIT).await;
    assert_eq!(sent[2].answering, None);
    assert_eq!(sent[2].chat, "ann");
    let err = r
        .adapter
        .send(&text("wrgroup1", "anyone?"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, SendError::Rejected(why) if why.contains("group")),
        "{err:?}"
    );
    // A user the robot never heard from is refused by WeCom, for good.
    let err = r.adapter.send(&text("nobody", "hi")).await.unwrap_err();
    assert!(matches!(err, SendError::Rejected(_)), "{err:?}");
    // Too fast: waited out and retried.
    fake.fail_next_send(45_009);
    r.adapter.send(&text("ann", "after a pause")).await.unwrap();
    assert_eq!(fake.wait_for_sent(4, WAIT).await[3].text, "after a pause");
    assert_eq!(
        fake.refusals()
            .iter()
            .filter(|f| f.errcode == 45_009)
            .count(),
        1
    );
    r.shutdown.cancel();
}

#[tokio::test]
async fn a_file_is_uploaded_in_chunks_with_its_md5_and_sent() {
    let fake = FakeWecomBot::start(BOT_ID, SECRET).await;
    let mut r = spawn(settings(&fake));
    fake.wait_for_connection(1, WAIT).await;
    fake.push_text_dm("ann", "send me the report");
    next_event(&mut r.events).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.bin");
    let bytes: Vec<u8> = (0..1_200_000u32).map(|i| (i * 31 % 256) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    let file = OutboundFile {
        chat_id: "ann".into(),
        thread_id: None,
        reply_to: None,
        path,
        kind: MediaKind::Document,
        mime: "application/octet-stream".into(),
        name: "report.bin".into(),
        caption: None,
    };
    r.adapter.send_file(&file).await.unwrap();
    let uploads = fake.uploads();
    assert_eq!(uploads.len(), 1);
    assert_eq!(uploads[0].bytes, bytes);
    assert_eq!(uploads[0].kind, "file");
    assert_eq!(uploads[0].filename, "report.bin");
    let chunks = fake
        .requests()
        .iter()
        .filter(|q| q.cmd == "aibot_upload_media_chunk")
        .count();
    assert_eq!(chunks, 3, "512 KiB chunks");
    let sent = fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].msgtype, "file");
    assert_eq!(
        sent[0].media_id.as_deref(),
        Some(uploads[0].media_id.as_str())
    );
    assert_eq!(sent[0].answering, None, "a file goes to a user directly");
    r.shutdown.cancel();
}

#[tokio::test]
async fn enter_chat_is_welcomed_and_a_takeover_stops_the_adapter() {
    let fake = FakeWecomBot::start(BOT_ID, SECRET).await;
    let r = spawn_supervised(settings(&fake));
    fake.wait_for_connection(1, WAIT).await;
    let req = fake.push_event("ann", "enter_chat");
    wait_for("the welcome", || async {
        let w = fake.welcomes();
        if w.is_empty() { Err(w) } else { Ok(()) }
    })
    .await;
    assert_eq!(
        fake.welcomes(),
        vec![(req, "Hello, I am Talaria.".to_owned())]
    );
    fake.supersede();
    wait_for("standing by", || async {
        if *r.liveness.borrow() == Liveness::Standby {
            Ok(())
        } else {
            Err(*r.liveness.borrow())
        }
    })
    .await;
    // Never subscribes again.
    assert_eq!(fake.subscriptions().len(), 1);
    r.shutdown.cancel();
    assert!(
        tokio::time::timeout(WAIT, r.task)
            .await
            .unwrap()
            .unwrap()
            .is_ok()
    );
}

#[tokio::test]
async fn unanswered_pings_give_the_connection_up() {
    let fake = FakeWecomBot::start(BOT_ID, SECRET).await;
    let r = spawn(settings(&fake));
    fake.wait_for_connection(1, WAIT).await;
    fake.go_deaf(true);
    let result = tokio::time::timeout(WAIT, r.task).await.unwrap().unwrap();
    assert!(
        matches!(&result, Err(AdapterError::Disconnected(why)) if why.contains("ping")),
        "{result:?}"
    );
}
