//! The DingTalk adapter against the fake DingTalk in talaria-testkit:
//! Stream mode over a real WebSocket, the webhooks and OpenAPI over real
//! HTTP.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use talaria_adapter::{MediaKind, OutboundFile};
use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, ChatType, Inbox, LivenessReporter, MessageEvent,
    OutboundMessage, SendError,
};
use talaria_platforms::dingtalk::{DingTalkAdapter, DingTalkSettings};
use talaria_testkit::FakeDingTalk;
use talaria_testkit::dingtalk::{Incoming, Via};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const ID: &str = "dingtestclient";
const SECRET: &str = "test-dingtalk-client-secret-0123456789";
const ROBOT_TOKEN: &str = "custom-robot-token-0123";
const ROBOT_SECRET: &str = "SECcustom-robot-secret-0123";
const WAIT: Duration = Duration::from_secs(10);

async fn fake() -> FakeDingTalk {
    FakeDingTalk::start(ID, SECRET, ROBOT_TOKEN, Some(ROBOT_SECRET)).await
}

fn settings(fake: &FakeDingTalk) -> DingTalkSettings {
    DingTalkSettings {
        client_id: ID.into(),
        client_secret: SECRET.into(),
        robot_code: ID.into(),
        api_base: fake.api_base(),
        media_base: fake.api_base(),
        card_template_id: None,
        webhook_hosts: vec![format!("{}/", fake.api_base())],
        require_mention: true,
        markdown: false,
        markdown_title: "Talaria".into(),
        rate_limit_wait: Duration::from_millis(200),
        ping_interval: Duration::from_millis(500),
        webhook_url: Some(fake.custom_robot_url().into()),
        webhook_secret: Some(ROBOT_SECRET.into()),
    }
}

struct Running {
    events: mpsc::Receiver<MessageEvent>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AdapterError>>,
}

fn spawn(adapter: &Arc<DingTalkAdapter>) -> Running {
    let (inbox, events) = Inbox::channel(16);
    let (reporter, _) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let ctx = AdapterContext {
        inbox,
        liveness: reporter,
        shutdown: shutdown.clone(),
    };
    let a = adapter.clone();
    let task = tokio::spawn(async move { a.run(ctx).await });
    Running {
        events,
        shutdown,
        task,
    }
}

async fn next(r: &mut Running) -> MessageEvent {
    tokio::time::timeout(WAIT, r.events.recv())
        .await
        .expect("an event")
        .expect("the inbox is open")
}

const FRIEND: Incoming<'static> = Incoming {
    conversation: "cidDM1",
    group: false,
    staff_id: "staff1",
    at_robot: false,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_acknowledged_after_hand_over_and_unaddressed_group_chatter_is_not_handed_over()
 {
    let fake = fake().await;
    let adapter = Arc::new(DingTalkAdapter::new(settings(&fake), None).unwrap());
    let mut run = spawn(&adapter);
    fake.wait_for_connection(1, WAIT).await;
    let group = |at_robot| Incoming {
        conversation: "cidG1",
        group: true,
        staff_id: "staff1",
        at_robot,
    };
    fake.push_text(&group(false), "among ourselves");
    let id = fake.push_text(&group(true), "robot, help");
    let event = next(&mut run).await;
    assert_eq!(event.text, "robot, help");
    assert_eq!(event.message_id.as_deref(), Some(id.as_str()));
    assert_eq!(event.source.chat_type, ChatType::Group);
    assert_eq!(event.source.chat_id, "cidG1");
    assert_eq!(event.source.user_id.as_deref(), Some("staff1"));
    fake.wait_for_all_acked(WAIT).await;
    assert!(fake.acks().iter().all(|a| a.code == 200));
    // A re-delivery is acknowledged and dropped.
    fake.redeliver(&id);
    fake.wait_for_all_acked(WAIT).await;
    let dm = fake.push_text(&FRIEND, "direct");
    let event = next(&mut run).await;
    assert_eq!(event.message_id.as_deref(), Some(dm.as_str()));
    assert_eq!(event.source.chat_type, ChatType::Dm);
    // An answer goes to the session webhook as text (markdown is off).
    adapter
        .send(&OutboundMessage {
            chat_id: "cidDM1".into(),
            thread_id: None,
            reply_to: None,
            text: "**plain**".into(),
            choices: Vec::new(),
        })
        .await
        .unwrap();
    let sent = fake.sent();
    assert_eq!(
        (sent[0].via, sent[0].msgtype.as_str(), sent[0].text.as_str()),
        (Via::Session, "text", "**plain**")
    );
    run.shutdown.cancel();
    assert_eq!(run.task.await.unwrap(), Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_webhook_outside_the_allowed_hosts_is_never_posted_to() {
    let fake = fake().await;
    let adapter = Arc::new(DingTalkAdapter::new(settings(&fake), None).unwrap());
    let mut run = spawn(&adapter);
    fake.wait_for_connection(1, WAIT).await;
    // A listener standing for an internal service the webhook points at.
    let trap = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let trap_url = format!("http://{}/internal", trap.local_addr().unwrap());
    fake.push_message(
        &FRIEND,
        json!({ "msgtype": "text", "text": {"content": "hi"}, "sessionWebhook": trap_url }),
    );
    next(&mut run).await;
    adapter
        .send(&OutboundMessage {
            chat_id: "cidDM1".into(),
            thread_id: None,
            reply_to: None,
            text: "answer".into(),
            choices: Vec::new(),
        })
        .await
        .unwrap();
    // It went through the robot send API, to the user.
    let sent = fake.sent();
    assert_eq!(
        (sent[0].via, sent[0].conversation.as_str()),
        (Via::Robot, "cidDM1")
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(200), trap.accept())
            .await
            .is_err(),
        "the adapter connected to the webhook's host"
    );
    run.shutdown.cancel();
    let _ = run.task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_fatal() {
    let fake = fake().await;
    let mut s = settings(&fake);
    s.client_secret = "not-the-secret".into();
    let adapter = Arc::new(DingTalkAdapter::new(s, None).unwrap());
    let run = spawn(&adapter);
    let result = tokio::time::timeout(WAIT, run.task).await.unwrap().unwrap();
    match result {
        Err(AdapterError::Fatal(m)) => {
            assert!(m.contains("DINGTALK_CLIENT_SECRET"), "{m}");
            assert!(!m.contains("not-the-secret"), "{m}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_fast_is_retried_no_sooner_than_the_configured_wait() {
    let fake = fake().await;
    let adapter = Arc::new(DingTalkAdapter::new(settings(&fake), None).unwrap());
    let mut run = spawn(&adapter);
    fake.wait_for_connection(1, WAIT).await;
    fake.push_text(&FRIEND, "hello");
    next(&mut run).await;
    fake.fail_next_send(talaria_testkit::dingtalk::SendFault::TooFast);
    adapter
        .send(&OutboundMessage {
            chat_id: "cidDM1".into(),
            thread_id: None,
            reply_to: None,
            text: "x".into(),
            choices: Vec::new(),
        })
        .await
        .unwrap();
    let attempts = fake.send_attempts();
    assert_eq!(attempts.len(), 2);
    assert!(attempts[1].at.duration_since(attempts[0].at) >= Duration::from_millis(200));
    assert_eq!(fake.sent().len(), 1);
    run.shutdown.cancel();
    let _ = run.task.await;
}

/// The custom robot's signature, computed here with the HMAC crate.
fn independent_sign(secret: &str, timestamp: i64) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{timestamp}\n{secret}").as_bytes());
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

async fn post_custom(fake: &FakeDingTalk, timestamp: i64, sign: &str) -> Value {
    let mut url = reqwest::Url::parse(&fake.custom_robot_url()).unwrap();
    url.query_pairs_mut()
        .append_pair("timestamp", &timestamp.to_string())
        .append_pair("sign", sign);
    reqwest::Client::new()
        .post(url)
        .json(&json!({ "msgtype": "text", "text": { "content": "by hand" } }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_custom_robot_is_signed_and_the_fake_refuses_tampered_and_replayed_signatures() {
    let fake = fake().await;
    let adapter = DingTalkAdapter::new(settings(&fake), None).unwrap();
    adapter
        .send(&OutboundMessage {
            chat_id: "webhook".into(),
            thread_id: None,
            reply_to: None,
            text: "from cron".into(),
            choices: Vec::new(),
        })
        .await
        .unwrap();
    let sent = fake.sent();
    assert_eq!(
        (sent[0].via, sent[0].text.as_str()),
        (Via::Custom, "from cron")
    );
    // The adapter's query carried a signature the test computes itself.
    let now = chrono::Utc::now().timestamp_millis();
    let ok = post_custom(&fake, now, &independent_sign(ROBOT_SECRET, now)).await;
    assert_eq!(ok["errcode"], 0, "{ok}");
    // A vector fixed in advance (Python: base64.b64encode(hmac.new(
    // b"SECcustom-robot-secret-0123", b"1700000000000\nSECcustom-robot-
    // secret-0123", hashlib.sha256).digest())).
    assert_eq!(
        independent_sign(ROBOT_SECRET, 1_700_000_000_000),
        include_str!("dingtalk_sign_vector.txt").trim()
    );
    // Tampered: signed with another secret.
    let bad = post_custom(&fake, now, &independent_sign("SECother", now)).await;
    assert_eq!(bad["errcode"], 310000, "{bad}");
    // Replayed: a signature captured two hours ago.
    let old = now - 2 * 3_600_000;
    let replayed = post_custom(&fake, old, &independent_sign(ROBOT_SECRET, old)).await;
    assert_eq!(replayed["errcode"], 310000, "{replayed}");
    assert_eq!(fake.sent().len(), 2);
}

fn outbound(chat: &str, path: &std::path::Path, kind: MediaKind, mime: &str) -> OutboundFile {
    OutboundFile {
        chat_id: chat.into(),
        thread_id: None,
        reply_to: None,
        path: path.to_owned(),
        kind,
        mime: mime.into(),
        name: path.file_name().unwrap().to_string_lossy().into_owned(),
        caption: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_go_up_then_out_as_images_or_files_and_what_dingtalk_cannot_take_is_named() {
    let fake = fake().await;
    let adapter = Arc::new(DingTalkAdapter::new(settings(&fake), None).unwrap());
    let mut run = spawn(&adapter);
    fake.wait_for_connection(1, WAIT).await;
    fake.push_text(&FRIEND, "send me things");
    next(&mut run).await;
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("chart.png");
    std::fs::write(&png, b"\x89PNG\r\n\x1a\n a chart").unwrap();
    adapter
        .send_file(&outbound("cidDM1", &png, MediaKind::Image, "image/png"))
        .await
        .unwrap();
    let files = fake.file_messages();
    assert_eq!(files.len(), 1);
    assert_eq!(
        (files[0].msg_key.as_str(), files[0].conversation.as_str()),
        ("sampleImageMsg", "cidDM1")
    );
    let uploads = fake.uploads();
    assert_eq!(
        (uploads[0].kind.as_str(), uploads[0].media_id.as_str()),
        ("image", files[0].media.as_str())
    );
    assert_eq!(uploads[0].file_name, "chart.png");
    // The image went through the robot API to the user, not the webhook.
    let batch = fake
        .requests()
        .into_iter()
        .rfind(|r| r.path == "/v1.0/robot/oToMessages/batchSend")
        .unwrap();
    assert_eq!(batch.body["userIds"], json!(["staff1"]));
    // A text file is not a format DingTalk's upload takes: a line names it.
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, b"some notes").unwrap();
    adapter
        .send_file(&outbound(
            "cidDM1",
            &notes,
            MediaKind::Document,
            "text/plain",
        ))
        .await
        .unwrap();
    let sent = fake.sent();
    assert!(sent.last().unwrap().text.contains("notes.txt"), "{sent:?}");
    // Past 20 MB nothing is uploaded, and the error names the limit.
    let big = dir.path().join("big.pdf");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(21 * 1024 * 1024)
        .unwrap();
    let e = adapter
        .send_file(&outbound(
            "cidDM1",
            &big,
            MediaKind::Document,
            "application/pdf",
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, SendError::Rejected(m) if m.contains("20 MB")),
        "{e:?}"
    );
    // A chat the robot never heard from gets nothing uploaded either.
    let e = adapter
        .send_file(&outbound(
            "someone-else",
            &png,
            MediaKind::Image,
            "image/png",
        ))
        .await
        .unwrap_err();
    assert!(matches!(e, SendError::Rejected(_)), "{e:?}");
    assert_eq!(fake.uploads().len(), 1);
    run.shutdown.cancel();
    assert_eq!(run.task.await.unwrap(), Ok(()));
}
