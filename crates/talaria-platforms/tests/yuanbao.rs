//! The Yuanbao adapter against the fake platform: the signed token (with
//! its HMAC checked by an independent implementation), the bound socket,
//! pushes, acknowledgements, dedupe, recalls, sends and close codes.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use talaria_core::Secret;
use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, ChatType, Inbox, Liveness, LivenessReporter,
    MessageEvent, OutboundMessage, SendError,
};
use talaria_platforms::yuanbao::{Access, Policy, YuanbaoAdapter, YuanbaoSettings};
use talaria_testkit::FakeYuanbao;
use talaria_testkit::wait::WAIT;
use talaria_testkit::yuanbao::{BOT_ID, OWNER_ID, wire};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const APP_KEY: &str = "ak-test-0001";
const APP_SECRET: &str = "sk-test-secret-0002";

fn settings(fake: &FakeYuanbao) -> YuanbaoSettings {
    YuanbaoSettings {
        app_key: Secret::new(APP_KEY),
        app_secret: Secret::new(APP_SECRET),
        bot_id: None,
        ws_url: fake.ws_url(),
        api_domain: fake.api_domain(),
        route_env: Some("test-env".into()),
        access: Access {
            dm: Policy::Open,
            dm_allow_from: vec![],
            group: Policy::Open,
            group_allow_from: vec![],
            allow_all: false,
        },
        ping_interval: Duration::from_millis(200),
        pong_timeout: Duration::from_millis(300),
        request_timeout: Duration::from_secs(2),
        cos_endpoint: fake.cos_endpoint(),
        media_hosts: vec!["myqcloud.com".into()],
    }
}

struct Running {
    adapter: Arc<YuanbaoAdapter>,
    events: mpsc::Receiver<MessageEvent>,
    liveness: watch::Receiver<Liveness>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AdapterError>>,
}

fn spawn(settings: YuanbaoSettings) -> Running {
    let adapter = Arc::new(YuanbaoAdapter::new(settings).unwrap());
    let (inbox, events) = Inbox::channel(16);
    let (reporter, liveness) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let ctx = AdapterContext {
        inbox,
        liveness: reporter,
        shutdown: shutdown.clone(),
    };
    let a = adapter.clone();
    let task = tokio::spawn(async move { a.run(ctx).await });
    Running {
        adapter,
        events,
        liveness,
        shutdown,
        task,
    }
}

async fn next(events: &mut mpsc::Receiver<MessageEvent>) -> MessageEvent {
    tokio::time::timeout(WAIT, events.recv())
        .await
        .expect("no event in time")
        .expect("inbox closed")
}

async fn ended(r: Running) -> Result<(), AdapterError> {
    tokio::time::timeout(WAIT, r.task)
        .await
        .expect("run did not end")
        .unwrap()
}

/// `hex(HMAC-SHA256(secret, message))` from the openssl command line.
fn openssl_hmac(secret: &str, message: &str) -> String {
    let mut child = Command::new("openssl")
        .args(["dgst", "-sha256", "-hmac", secret])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("openssl runs");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(message.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    // "SHA2-256(stdin)= <hex>" (or "(stdin)= <hex>" on older builds).
    text.trim().rsplit(' ').next().unwrap().to_owned()
}

#[test]
fn openssl_agrees_with_a_known_hmac_vector() {
    // RFC 4231 test case 2: guards the helper the signature test relies on.
    assert_eq!(
        openssl_hmac("Jefe", "what do ya want for nothing?"),
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
}

#[tokio::test]
async fn the_token_request_is_signed_with_hmac_sha256_in_beijing_time() {
    let fake = FakeYuanbao::start(APP_KEY, APP_SECRET).await;
    let r = spawn(settings(&fake));
    fake.wait_for_connection(1, WAIT).await;
    let signs = fake.sign_requests();
    assert_eq!(signs.len(), 1);
    assert_eq!(signs[0].code, 0);
    let body = &signs[0].body;
    let field = |k: &str| body[k].as_str().unwrap().to_owned();
    let (nonce, ts, sig) = (field("nonce"), field("timestamp"), field("signature"));
    assert_eq!(field("app_key"), APP_KEY);
    assert_eq!(nonce.len(), 32);
    assert!(
        !body.to_string().contains(APP_SECRET),
        "the secret is never sent"
    );
    // Computed here by openssl, not by the adapter's code.
    let expected = openssl_hmac(APP_SECRET, &format!("{nonce}{ts}{APP_KEY}{APP_SECRET}"));
    assert_eq!(sig, expected);
    // Beijing time, to the second, and now.
    let at = chrono::DateTime::parse_from_rfc3339(&ts).unwrap();
    assert_eq!(at.offset().local_minus_utc(), 8 * 3600);
    assert!(!ts.contains('.'), "{ts}");
    let skew = (chrono::Utc::now().timestamp() - at.timestamp()).abs();
    assert!(skew < 120, "{ts} is {skew}s off");
    let header = |name: &str| {
        signs[0]
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(header("x-route-env").as_deref(), Some("test-env"));
    assert!(header("x-instance-id").is_some());
    // The auth-bind presented the issued token for the bot sign-token named.
    let binds = fake.binds();
    assert!(binds[0].known_token && binds[0].uid == BOT_ID && binds[0].code == 0);
    assert_eq!(binds[0].env_name, "test-env");
    assert_eq!(r.adapter.bot_id().as_deref(), Some(BOT_ID));
    r.shutdown.cancel();
    ended(r).await.unwrap();
}

#[tokio::test]
async fn the_fake_refuses_a_tampered_signature_and_a_replayed_request() {
    let fake = FakeYuanbao::start(APP_KEY, APP_SECRET).await;
    let r = spawn(settings(&fake));
    fake.wait_for_connection(1, WAIT).await;
    let accepted = fake.sign_requests()[0].body.clone();
    let url = format!("{}/api/v5/robotLogic/sign-token", fake.api_domain());
    let client = reqwest::Client::new();
    let post = |body: Value| {
        let client = client.clone();
        let url = url.clone();
        async move {
            client
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    // One hex digit of the signature changed.
    let mut tampered = accepted.clone();
    let sig = accepted["signature"].as_str().unwrap();
    let flipped = if sig.starts_with('0') { "1" } else { "0" };
    tampered["signature"] = json!(format!("{flipped}{}", &sig[1..]));
    assert_eq!(post(tampered).await["code"], 10001);
    // The timestamp changed under a valid-looking signature.
    let mut tampered = accepted.clone();
    tampered["timestamp"] = json!("2020-01-01T00:00:00+08:00");
    assert_eq!(post(tampered).await["code"], 10001);
    // The accepted request sent again word for word.
    assert_eq!(post(accepted).await["code"], 10003);
    r.shutdown.cancel();
    ended(r).await.unwrap();
}

#[tokio::test]
async fn a_wrong_secret_is_a_fatal_error_that_does_not_show_the_secret() {
    let fake = FakeYuanbao::start(APP_KEY, APP_SECRET).await;
    let mut s = settings(&fake);
    s.app_secret = Secret::new("sk-wrong-secret-77");
    let r = spawn(s);
    let err = ended(r).await.unwrap_err();
    let AdapterError::Fatal(text) = &err else {
        panic!("{err:?}");
    };
    assert!(text.contains("10001"), "{text}");
    assert!(!text.contains("sk-wrong-secret-77"), "{text}");
    assert_eq!(fake.connections(), 0);
}

#[tokio::test]
async fn a_retry_code_is_retried_and_an_expired_bind_signs_again() {
    let fake = FakeYuanbao::start(APP_KEY, APP_SECRET).await;
    fake.fail_next_sign(10099);
    fake.fail_next_bind(41103);
    let r = spawn(settings(&fake));
    fake.wait_for_connection(1, WAIT).await;
    let codes: Vec<i64> = fake.sign_requests().iter().map(|s| s.code).collect();
    assert_eq!(
        codes,
        vec![10099, 0, 0],
        "retried, then signed again for the bind"
    );
    let binds: Vec<i32> = fake.binds().iter().map(|b| b.code).collect();
    assert_eq!(binds, vec![41103, 0]);
    r.shutdown.cancel();
    ended(r).await.unwrap();
}

#[tokio::test]
async fn pushes_are_acknowledged_after_hand_over_and_a_replay_is_ignored() {
    let fake = FakeYuanbao::start(APP_KEY, APP_SECRET).await;
    let mut r = spawn(settings(&fake));
    fake.wait_for_connection(1, WAIT).await;
    let id = fake.push_dm("ann42", "hello there");
    let event = next(&mut r.events).await;
    assert_eq!(event.text, "hello there");
    assert_eq!(event.source.chat_id, "direct:ann42");
    assert_eq!(event.source.chat_type, ChatType::Dm);
    assert_eq!(event.source.user_id.as_deref(), Some("ann42"));
    assert_eq!(event.message_id.as_deref(), Some(id.as_str()));
    fake.wait_for_all_acked(WAIT).await;
    // The same msg_id pushed again (a lost ack, as the platform sees it).
    fake.redeliver_all();
    fake.push(&wire::dm("ann42", &id, "hello there"));
    // A new message is the barrier: the replays came before it.
    let id2 = fake.push_dm("ann42", "second");
    let event = next(&mut r.events).await;
    assert_eq!(event.message_id.as_deref(), Some(id2.as_str()));
    fake.wait_for_all_acked(WAIT).await;
    assert_eq!(fake.acks().len(), 4, "replays are acknowledged too");
    // A push is acknowledged only once it was handed over or dropped, so
    // a replay handed over would be queued by now.
    assert!(r.events.try_recv().is_err());
    r.shutdown.cancel();
    ended(r).await.unwrap();
}

#[tokio::test]
async fn groups_need_a_mention_the_owner_excepted_and_a_recall_drops_the_message() {
    let fake = FakeYuanbao::start(APP_KEY, APP_SECRET).await;
    let mut r = spawn(settings(&fake));
    fake.wait_for_connection(1, WAIT).await;
    fake.push_group("ann42", "g1", "just chatting", false);
    fake.push(&wire::group(
        OWNER_ID,
        "g1",
        &fake.next_msg_id(),
        vec![wire::text("/new")],
    ));
    let event = next(&mut r.events).await;
    assert_eq!(event.text, "/new", "the owner's command needs no mention");
    assert_eq!(event.source.chat_id, "group:g1");
    // Recalled before it came: never handed over.
    let recalled = fake.next_msg_id();
    fake.push(&wire::group_recall("g1", &[&recalled]));
    fake.push(&wire::group(
        "ann42",
        "g1",
        &recalled,
        vec![
            wire::mention(BOT_ID, "Talaria"),
            wire::text(" take this back"),
        ],
    ));
    let id = fake.push_group("ann42", "g1", "what time is it", true);
    let event = next(&mut r.events).await;
    assert_eq!(event.message_id.as_deref(), Some(id.as_str()));
    assert_eq!(event.text, "what time is it");
    assert_eq!(event.source.chat_type, ChatType::Group);
    assert_eq!(event.source.chat_name.as_deref(), Some("Pai g1"));
    // A push is acknowledged only once it was handed over or dropped, so
    // the chatter and the recalled message would be queued by now.
    fake.wait_for_all_acked(WAIT).await;
    assert!(r.events.try_recv().is_err());
    r.shutdown.cancel();
    ended(r).await.unwrap();
}

#[tokio::test]
async fn sends_wait_for_their_response_and_heartbeats_show_the_work() {
    let fake = FakeYuanbao::start(APP_KEY, APP_SECRET).await;
    let r = spawn(settings(&fake));
    let message = |chat: &str, text: &str| OutboundMessage {
        chat_id: chat.into(),
        thread_id: None,
        reply_to: None,
        text: text.into(),
        choices: Vec::new(),
    };
    // Not connected yet (or ever): nothing is sent and nothing is lost.
    let early = YuanbaoAdapter::new(settings(&fake)).unwrap();
    assert!(matches!(
        early.send(&message("direct:ann42", "x")).await,
        Err(SendError::Unavailable(_))
    ));
    fake.wait_for_connection(1, WAIT).await;
    let mut liveness = r.liveness.clone();
    liveness.wait_for(|l| *l == Liveness::Live).await.unwrap();

    r.adapter.typing("direct:ann42", None).await.unwrap();
    r.adapter
        .send(&message("direct:ann42", "**hi** there"))
        .await
        .unwrap();
    let mut group = message("group:g1", "to the group");
    group.reply_to = Some("msg-9".into());
    r.adapter.send(&group).await.unwrap();
    let sent = fake.sent();
    assert_eq!(sent[0].chat, "direct:ann42");
    assert_eq!(sent[0].text, "**hi** there", "Yuanbao renders markdown");
    assert_eq!(sent[0].from, BOT_ID);
    assert_eq!(sent[1].chat, "group:g1");
    assert_eq!(sent[1].ref_msg_id.as_deref(), Some("msg-9"));
    let beats: Vec<(String, i32)> = fake
        .heartbeats()
        .into_iter()
        .map(|h| (h.chat, h.beat))
        .collect();
    assert_eq!(
        beats,
        vec![("direct:ann42".into(), 1), ("direct:ann42".into(), 2)],
        "RUNNING while working, FINISH once sent"
    );

    // A refusal is retried after a wait; every request id is fresh.
    fake.fail_next_send(20016);
    let before = fake.send_attempts().len();
    r.adapter
        .send(&message("direct:ann42", "again"))
        .await
        .unwrap();
    let attempts = fake.send_attempts();
    assert_eq!(attempts.len(), before + 2);
    assert!(attempts[before + 1].at.duration_since(attempts[before].at) >= Duration::from_secs(1));
    assert_ne!(attempts[before].msg_id, attempts[before + 1].msg_id);
    // Not a chat id: refused for good.
    assert!(matches!(
        r.adapter.send(&message("ann42", "x")).await,
        Err(SendError::Rejected(_))
    ));
    // No answer in time: may or may not have arrived.
    fake.hang_sends(true);
    assert!(matches!(
        r.adapter.send(&message("direct:ann42", "lost?")).await,
        Err(SendError::Ambiguous(_))
    ));
    fake.hang_sends(false);
    r.shutdown.cancel();
    ended(r).await.unwrap();
}

#[tokio::test]
async fn close_codes_decide_whether_to_reconnect() {
    let fake = FakeYuanbao::start(APP_KEY, APP_SECRET).await;
    let r = spawn(settings(&fake));
    fake.wait_for_connection(1, WAIT).await;
    fake.close_with(4013);
    let err = ended(r).await.unwrap_err();
    assert!(
        matches!(&err, AdapterError::Fatal(t) if t.contains("4013")),
        "{err:?}"
    );

    let r = spawn(settings(&fake));
    fake.wait_for_connection(2, WAIT).await;
    fake.close_with(4011);
    let err = ended(r).await.unwrap_err();
    assert!(
        matches!(&err, AdapterError::Disconnected(t) if t.contains("4011")),
        "{err:?}"
    );
    // Each connection signed its own token.
    assert_eq!(fake.sign_requests().len(), 2);
}

#[tokio::test]
async fn two_unanswered_pings_give_the_socket_up() {
    let fake = FakeYuanbao::start(APP_KEY, APP_SECRET).await;
    let r = spawn(settings(&fake));
    fake.wait_for_connection(1, WAIT).await;
    // Answered pings first: the watchdog leaves a healthy socket alone.
    talaria_testkit::wait::wait_for("two pings", || async {
        if fake.pings() >= 2 {
            Ok(())
        } else {
            Err(fake.pings())
        }
    })
    .await;
    fake.go_deaf(true);
    let err = ended(r).await.unwrap_err();
    assert!(
        matches!(&err, AdapterError::Disconnected(t) if t.contains("two pings")),
        "{err:?}"
    );
}

/// Reads a download to its end.
async fn read_all(d: talaria_adapter::Download) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let mut reader = d.reader;
    reader.read_to_end(&mut out).await.unwrap();
    out
}

fn image_push(fake: &FakeYuanbao, bytes: &[u8]) -> (String, wire::InboundMessagePush) {
    let url = fake.add_resource(bytes);
    let id = fake.next_msg_id();
    let mut push = wire::dm("ann42", &id, "");
    push.msg_body = vec![wire::MsgBodyElement {
        msg_type: "TIMImageElem".into(),
        msg_content: Some(wire::MsgContent {
            uuid: "u1".into(),
            image_format: 3,
            image_info_array: vec![
                wire::ImageInfo {
                    r#type: 3,
                    size: 10,
                    url: "https://thumb.myqcloud.com/t".into(),
                    ..wire::ImageInfo::default()
                },
                wire::ImageInfo {
                    r#type: 1,
                    size: bytes.len() as u32,
                    width: 2,
                    height: 2,
                    url,
                },
            ],
            ..wire::MsgContent::default()
        }),
    }];
    (id, push)
}

#[tokio::test]
async fn an_image_is_an_attachment_fetched_through_the_download_endpoint() {
    let fake = FakeYuanbao::start(APP_KEY, APP_SECRET).await;
    let mut r = spawn(settings(&fake));
    fake.wait_for_connection(1, WAIT).await;
    let bytes = b"\x89PNG\r\n\x1a\nnot-really-a-png".to_vec();
    let (id, push) = image_push(&fake, &bytes);
    fake.push(&push);
    let event = next(&mut r.events).await;
    assert_eq!(event.message_id.as_deref(), Some(id.as_str()));
    assert_eq!(event.text, "", "an image alone is still a message");
    assert_eq!(event.attachments.len(), 1);
    let a = &event.attachments[0];
    assert_eq!(a.kind, talaria_adapter::MediaKind::Image);
    assert_eq!(
        a.size,
        Some(bytes.len() as u64),
        "the original, not the thumbnail"
    );
    let talaria_adapter::AttachmentSource::Remote(locator) = &a.source else {
        panic!("{a:?}");
    };
    let got = read_all(r.adapter.download(locator).await.unwrap()).await;
    assert_eq!(got, bytes);
    assert_eq!(fake.download_calls().len(), 1);
    assert_eq!(fake.download_calls()[0].status, 200);

    // The platform forgets the token: one 401, one new signature, fetched.
    let signs = fake.sign_requests().len();
    fake.expire_tokens();
    let got = read_all(r.adapter.download(locator).await.unwrap()).await;
    assert_eq!(got, bytes);
    let statuses: Vec<u16> = fake.download_calls().iter().map(|c| c.status).collect();
    assert_eq!(statuses, vec![200, 401, 200]);
    assert_eq!(fake.sign_requests().len(), signs + 1);
    r.shutdown.cancel();
    ended(r).await.unwrap();
}

#[tokio::test]
async fn files_are_fetched_only_from_the_api_and_the_media_hosts() {
    let fake = FakeYuanbao::start(APP_KEY, APP_SECRET).await;
    // Another server on this machine, standing for an internal address.
    let other = FakeYuanbao::start(APP_KEY, APP_SECRET).await;
    let inside = other.add_resource(b"internal secrets");
    let r = spawn(settings(&fake));
    fake.wait_for_connection(1, WAIT).await;
    let (_, push) = image_push(&fake, b"GIF89a");
    let rid = match push.msg_body[0]
        .msg_content
        .as_ref()
        .unwrap()
        .image_info_array[1]
        .url
        .split_once("resourceId=")
    {
        Some((_, id)) => format!("rid:{id}"),
        None => panic!("no resource id"),
    };
    // The download endpoint names an address elsewhere: refused, unfetched.
    fake.name_download_address(&format!("{}/yb-res/res-00001", other.api_domain()));
    let err = r.adapter.download(&rid).await.unwrap_err();
    assert!(
        matches!(&err, talaria_adapter::DownloadError::Gone(t) if t.contains("media_hosts")),
        "{err:?}"
    );
    // An element's own URL elsewhere: refused too.
    let err = r
        .adapter
        .download(&format!(
            "url:{}",
            inside.replace("/api/resource/download?resourceId=", "/yb-res/")
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(err, talaria_adapter::DownloadError::Gone(_)),
        "{err:?}"
    );
    for bad in [
        "url:http://169.254.169.254/latest/meta-data",
        "url:file:///etc/passwd",
        "nonsense",
    ] {
        assert!(r.adapter.download(bad).await.is_err(), "{bad}");
    }
    // Refused before any request left: the other server saw none.
    assert!(other.served().is_empty(), "{:?}", other.served());
    assert!(other.download_calls().is_empty());
    r.shutdown.cancel();
    ended(r).await.unwrap();
}

fn outbound(
    dir: &std::path::Path,
    name: &str,
    bytes: &[u8],
    kind: talaria_adapter::MediaKind,
    mime: &str,
) -> talaria_adapter::OutboundFile {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    talaria_adapter::OutboundFile {
        chat_id: "direct:ann42".into(),
        thread_id: None,
        reply_to: None,
        path,
        kind,
        mime: mime.into(),
        name: name.into(),
        caption: None,
    }
}

/// A real 3×2 PNG.
fn png() -> Vec<u8> {
    let img = image::RgbImage::from_fn(3, 2, |x, y| image::Rgb([x as u8 * 80, y as u8 * 90, 7]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

#[tokio::test]
async fn files_go_to_cos_signed_and_then_out_as_image_or_file_elements() {
    let fake = FakeYuanbao::start(APP_KEY, APP_SECRET).await;
    let r = spawn(settings(&fake));
    fake.wait_for_connection(1, WAIT).await;
    let mut liveness = r.liveness.clone();
    liveness.wait_for(|l| *l == Liveness::Live).await.unwrap();
    let dir = tempfile::tempdir().unwrap();

    let photo = png();
    let mut file = outbound(
        dir.path(),
        "chart.png",
        &photo,
        talaria_adapter::MediaKind::Image,
        "image/png",
    );
    file.caption = Some("the chart".into());
    r.adapter.send_file(&file).await.unwrap();
    let puts = fake.cos_puts();
    assert_eq!(puts.len(), 1);
    assert!(puts[0].accepted, "{:?}", puts[0].why);
    let sent = fake.sent();
    assert_eq!(sent.len(), 2, "the image, then its caption");
    let media = &sent[0].media;
    assert_eq!(media.len(), 1);
    assert_eq!(media[0].msg_type, "TIMImageElem");
    assert_eq!(media[0].image_format, 3, "PNG, read from the bytes");
    assert_eq!(media[0].dims, (3, 2));
    assert_eq!(fake.uploaded(&media[0].url).unwrap(), photo);
    assert_eq!(sent[1].text, "the chart");

    let pdf = b"%PDF-1.4 a report".to_vec();
    let file = outbound(
        dir.path(),
        "报告 1.pdf",
        &pdf,
        talaria_adapter::MediaKind::Document,
        "application/pdf",
    );
    r.adapter.send_file(&file).await.unwrap();
    let puts = fake.cos_puts();
    assert!(puts[1].accepted, "{:?}", puts[1].why);
    assert!(puts[1].path.ends_with("/报告 1.pdf"), "{}", puts[1].path);
    let media = &fake.sent()[2].media;
    assert_eq!(media[0].msg_type, "TIMFileElem");
    assert_eq!(media[0].name.as_deref(), Some("报告 1.pdf"));
    assert_eq!(fake.uploaded(&media[0].url).unwrap(), pdf);

    // The fake checks the signature: the accepted request replayed with
    // another content type is refused.
    let accepted = &fake.cos_puts()[1];
    let client = reqwest::Client::new();
    let mut replay = client.put(format!(
        "{}{}",
        fake.cos_endpoint(),
        accepted
            .path
            .replace(' ', "%20")
            .replace("报告", "%E6%8A%A5%E5%91%8A")
    ));
    for (k, v) in &accepted.headers {
        if k != "content-length" && k != "host" {
            let v = if k == "content-type" {
                "text/plain"
            } else {
                v.as_str()
            };
            replay = replay.header(k, v);
        }
    }
    let status = replay.body(pdf.clone()).send().await.unwrap().status();
    assert_eq!(status.as_u16(), 403);
    let last = fake.cos_puts().last().cloned().unwrap();
    assert!(
        !last.accepted && last.why == "SignatureDoesNotMatch",
        "{last:?}"
    );

    // Over 50 MB: refused before anything is asked or uploaded.
    let big = dir.path().join("big.bin");
    std::fs::File::create(&big)
        .unwrap()
        .set_len((50 << 20) + 1)
        .unwrap();
    let mut file = outbound(
        dir.path(),
        "small.bin",
        b"x",
        talaria_adapter::MediaKind::Document,
        "application/octet-stream",
    );
    file.path = big;
    file.name = "big.bin".into();
    let puts_before = fake.cos_puts().len();
    let err = r.adapter.send_file(&file).await.unwrap_err();
    assert!(
        matches!(&err, SendError::Rejected(t) if t.contains("50 MB")),
        "{err:?}"
    );
    assert_eq!(fake.cos_puts().len(), puts_before);
    assert_eq!(fake.sent().len(), 3);
    r.shutdown.cancel();
    ended(r).await.unwrap();
}
