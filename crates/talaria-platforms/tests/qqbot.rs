//! The QQ Bot adapter against the fake QQ open platform (token, OpenAPI,
//! gateway) in talaria-testkit.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use talaria_adapter::{AttachmentSource, DownloadError, MediaKind, OutboundFile};
use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, ChatType, Inbox, Liveness, LivenessReporter,
    MessageEvent, OutboundMessage, SendError,
};
use talaria_platforms::qqbot::{QqbotAdapter, QqbotSettings, QqbotTimings};
use talaria_testkit::qqbot::{self as fake_qq, FakeQq};
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const APP_ID: &str = "1020304";
const SECRET: &str = "qq-test-secret-6d1e";
const WAIT: Duration = Duration::from_secs(10);
const BEAT: Duration = Duration::from_millis(200);
const USER: &str = "A1B2C3D4E5F6A7B8C9D0E1F2A3B4C5D6";

async fn fake() -> FakeQq {
    FakeQq::start(APP_ID, SECRET, BEAT).await
}

fn settings(fake: &FakeQq) -> QqbotSettings {
    QqbotSettings {
        app_id: APP_ID.into(),
        client_secret: SECRET.into(),
        api_base: fake.api_base(),
        token_url: fake.token_url(),
        gateway_url: None,
        markdown: true,
        all_guild_messages: false,
        media_hosts: vec!["127.0.0.1".into()],
        timings: QqbotTimings {
            connect_timeout: Duration::from_secs(5),
            reidentify_delay: Duration::from_millis(20),
            rate_limited_pause: Duration::from_millis(20),
        },
    }
}

fn adapter(s: QqbotSettings) -> Arc<QqbotAdapter> {
    Arc::new(QqbotAdapter::new(s).unwrap())
}

struct Running {
    events: mpsc::Receiver<MessageEvent>,
    liveness: watch::Receiver<Liveness>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AdapterError>>,
}

fn spawn(adapter: &Arc<QqbotAdapter>) -> Running {
    let (inbox, events) = Inbox::channel(16);
    let (reporter, liveness) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let a = adapter.clone();
    let stop = shutdown.clone();
    // As the supervisor does: a dropped connection is connected again.
    let task = tokio::spawn(async move {
        loop {
            let ctx = AdapterContext {
                inbox: inbox.clone(),
                liveness: reporter.clone(),
                shutdown: stop.clone(),
            };
            match a.run(ctx).await {
                Err(AdapterError::Disconnected(_)) if !stop.is_cancelled() => continue,
                other => return other,
            }
        }
    });
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

    async fn wait_live(&mut self) {
        tokio::time::timeout(WAIT, self.liveness.wait_for(|l| *l == Liveness::Live))
            .await
            .expect("never live")
            .unwrap();
    }
}

fn out(chat: &str, reply_to: Option<&str>, text: &str) -> OutboundMessage {
    OutboundMessage {
        chat_id: chat.into(),
        thread_id: None,
        reply_to: reply_to.map(Into::into),
        text: text.into(),
        choices: Vec::new(),
    }
}

#[tokio::test]
async fn token_identify_with_intents_and_every_kind_of_message() {
    let fake = fake().await;
    let a = adapter(settings(&fake));
    let mut run = spawn(&a);
    fake.wait_for_sessions(1, WAIT).await;
    run.wait_live().await;
    // `expires_in` came as a string; one token served identify and REST.
    assert_eq!(fake.token_fetches(), 1);
    assert_eq!(
        fake.identified_intents(),
        [fake_qq::GROUP_AND_C2C | fake_qq::PUBLIC_GUILD_MESSAGES | fake_qq::DIRECT_MESSAGE]
    );
    let identify = fake.wait_for_frames(2, 1, WAIT).await;
    assert!(
        identify[0].d["token"]
            .as_str()
            .unwrap()
            .starts_with("QQBot fake-access-token-")
    );
    assert_eq!(identify[0].d["shard"], serde_json::json!([0, 1]));

    let id = fake.push_c2c(USER, "hello there");
    let ev = run.next().await;
    assert_eq!(
        (ev.source.chat_type, ev.source.chat_id.as_str()),
        (ChatType::Dm, USER)
    );
    assert_eq!(
        (ev.text.as_str(), ev.message_id.as_deref()),
        ("hello there", Some(id.as_str()))
    );

    fake.push_group_at("G1", "M1", "what is the time");
    let ev = run.next().await;
    assert_eq!(ev.source.chat_type, ChatType::Group);
    assert_eq!(ev.source.chat_id, "group:G1");
    assert_eq!(ev.source.user_id.as_deref(), Some("M1"));
    assert_eq!(ev.text, "what is the time", "the leading @bot is stripped");

    // Without GUILD_MESSAGES the unaddressed channel message never comes;
    // the @-message comes once, as AT_MESSAGE_CREATE.
    fake.push_guild("7", "55", "42", "chatter", false);
    fake.push_guild("7", "55", "42", "hey bot", true);
    let ev = run.next().await;
    assert_eq!(
        (ev.source.chat_id.as_str(), ev.text.as_str()),
        ("channel:55", "hey bot")
    );

    fake.push_direct("9", "42", "psst");
    let ev = run.next().await;
    assert_eq!(
        (ev.source.chat_type, ev.source.chat_id.as_str()),
        (ChatType::Dm, "dms:9")
    );
    assert!(run.events.try_recv().is_err());
    assert_eq!(run.stop().await, Ok(()));
}

#[tokio::test]
async fn replies_are_passive_with_a_new_seq_per_part_then_proactive() {
    let fake = fake().await;
    let a = adapter(settings(&fake));
    let mut run = spawn(&a);
    run.wait_live().await;
    let id = fake.push_c2c(USER, "write a lot");
    run.next().await;
    a.typing(USER, None).await.unwrap();
    // Renewed at most every 50 s: a second call sends nothing.
    a.typing(USER, None).await.unwrap();
    assert_eq!(fake.typing().len(), 1);
    a.send(&out(USER, Some(&id), "**part** one")).await.unwrap();
    a.send(&out(USER, None, "part two")).await.unwrap();
    let sent = fake.sent();
    assert_eq!(sent.len(), 2);
    assert!(
        sent.iter()
            .all(|s| s.msg_id.as_deref() == Some(id.as_str()))
    );
    assert_eq!(sent[0].msg_seq, Some(2), "the typing notice took seq 1");
    assert_eq!(sent[1].msg_seq, Some(3));
    assert!(sent[0].markdown);
    assert_eq!(sent[0].text, "**part** one");
    // QQ's cap on replies to one C2C message is four: the fifth goes out
    // proactively, without msg_id.
    a.send(&out(USER, None, "three")).await.unwrap();
    a.send(&out(USER, None, "four")).await.unwrap();
    a.send(&out(USER, None, "five")).await.unwrap();
    let sent = fake.sent();
    assert_eq!(sent[4].msg_id, None);
    // A chat nobody wrote in gets proactive messages, until QQ's quota.
    fake.set_proactive_quota(1);
    a.send(&out("group:G9", None, "cron says hi"))
        .await
        .unwrap();
    let refused = a.send(&out("group:G9", None, "again")).await.unwrap_err();
    assert!(matches!(refused, SendError::Rejected(_)), "{refused:?}");
    assert!(refused.to_string().contains("40034040"), "{refused}");
    run.stop().await.unwrap();
}

#[tokio::test]
async fn a_seq_qq_saw_already_is_retried_with_the_next() {
    let fake = fake().await;
    let a = adapter(settings(&fake));
    let mut run = spawn(&a);
    run.wait_live().await;
    let id = fake.push_c2c(USER, "hi");
    run.next().await;
    // As after a restart: another process already used seq 1.
    fake.fail_next_send(400, fake_qq::CODE_DUPLICATE_SEQ);
    a.send(&out(USER, Some(&id), "answer")).await.unwrap();
    let sent = fake.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].msg_seq, Some(2));
    run.stop().await.unwrap();
}

#[tokio::test]
async fn markdown_off_and_guild_channels_send_plain_text() {
    let fake = fake().await;
    let mut s = settings(&fake);
    s.markdown = false;
    let a = adapter(s);
    let mut run = spawn(&a);
    run.wait_live().await;
    let id = fake.push_c2c(USER, "hi");
    run.next().await;
    a.send(&out(USER, Some(&id), "## Title\n**bold**"))
        .await
        .unwrap();
    let gid = fake.push_guild("7", "55", "42", "yo", true);
    run.next().await;
    a.send(&out("channel:55", Some(&gid), "*a* **b**"))
        .await
        .unwrap();
    let sent = fake.sent();
    assert!(!sent[0].markdown);
    assert_eq!(sent[0].text, "Title\nbold");
    assert_eq!(
        (sent[1].scope.as_str(), sent[1].text.as_str()),
        ("channels", "*a* b")
    );
    assert_eq!(sent[1].msg_id.as_deref(), Some(gid.as_str()));
    run.stop().await.unwrap();
}

#[tokio::test]
async fn a_revoked_token_is_fetched_again_for_rest_and_for_the_gateway() {
    let fake = fake().await;
    fake.expires_in_as_string(false);
    let a = adapter(settings(&fake));
    let mut run = spawn(&a);
    run.wait_live().await;
    let id = fake.push_c2c(USER, "hi");
    run.next().await;
    fake.revoke_tokens();
    a.send(&out(USER, Some(&id), "still here")).await.unwrap();
    assert_eq!(fake.token_fetches(), 2);
    // The gateway refuses the old token (4004): a new one, and a fresh
    // identify rather than a resume.
    fake.revoke_tokens();
    assert!(fake.close_connection(4004));
    fake.wait_for_sessions(2, WAIT).await;
    assert_eq!(fake.ready_and_resumed(), (2, 0));
    assert_eq!(fake.token_fetches(), 3);
    let err = run.stop().await;
    assert_eq!(err, Ok(()));
}

#[tokio::test]
async fn reconnect_resumes_and_a_replay_is_not_handed_over_twice() {
    let fake = fake().await;
    let a = adapter(settings(&fake));
    let mut run = spawn(&a);
    run.wait_live().await;
    let id = fake.push_c2c(USER, "one");
    assert_eq!(run.next().await.message_id.as_deref(), Some(id.as_str()));
    assert!(fake.send_reconnect());
    fake.wait_for_sessions(2, WAIT).await;
    assert_eq!(fake.ready_and_resumed(), (1, 1));
    // QQ delivering the same message again (after a resume, say).
    fake.push_message(
        "C2C_MESSAGE_CREATE",
        serde_json::json!({"id": id, "content": "one", "author": {"user_openid": USER}}),
    );
    fake.push_c2c(USER, "two");
    assert_eq!(run.next().await.text, "two");
    // A session QQ forgot is identified afresh.
    assert!(fake.invalidate_session(false));
    fake.wait_for_sessions(3, WAIT).await;
    assert_eq!(fake.ready_and_resumed(), (2, 1));
    // 4009 (session timed out) resumes.
    assert!(fake.close_connection(4009));
    fake.wait_for_sessions(4, WAIT).await;
    assert_eq!(fake.ready_and_resumed(), (2, 2));
    run.stop().await.unwrap();
}

#[tokio::test]
async fn fatal_close_codes_stop_with_a_clear_reason() {
    let fake = fake().await;
    let a = adapter(settings(&fake));
    let mut run = spawn(&a);
    run.wait_live().await;
    assert!(fake.close_connection(4914));
    match run.ended().await {
        Err(AdapterError::Fatal(m)) => assert!(m.contains("sandbox"), "{m}"),
        other => panic!("{other:?}"),
    }
    // An intent the bot may not have is refused at identify (4014).
    let fake = self::fake().await;
    fake.permit_intents(
        fake_qq::GROUP_AND_C2C | fake_qq::PUBLIC_GUILD_MESSAGES | fake_qq::DIRECT_MESSAGE,
    );
    let mut s = settings(&fake);
    s.all_guild_messages = true;
    let run = spawn(&adapter(s));
    match run.ended().await {
        Err(AdapterError::Fatal(m)) => assert!(m.contains("4014"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn wrong_credentials_are_fatal_and_never_leak() {
    let fake = fake().await;
    let mut s = settings(&fake);
    s.client_secret = "not-the-secret-value".into();
    let run = spawn(&adapter(s));
    match run.ended().await {
        Err(AdapterError::Fatal(m)) => {
            assert!(m.contains("QQ_CLIENT_SECRET"), "{m}");
            assert!(!m.contains("not-the-secret-value"), "{m}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_rate_limit_is_waited_out_no_sooner_than_asked() {
    let fake = fake().await;
    let a = adapter(settings(&fake));
    let mut run = spawn(&a);
    run.wait_live().await;
    let id = fake.push_c2c(USER, "hi");
    run.next().await;
    fake.rate_limit_next_send(1.0);
    a.send(&out(USER, Some(&id), "patience")).await.unwrap();
    let attempts = fake.send_attempts();
    assert_eq!(attempts.len(), 2);
    assert!(attempts[1].at.duration_since(attempts[0].at) >= Duration::from_secs(1));
    // A reply QQ refuses outright (the window passed) is rejected.
    fake.set_passive_window(Duration::ZERO);
    let err = a.send(&out(USER, Some(&id), "late")).await.unwrap_err();
    assert!(matches!(err, SendError::Rejected(_)), "{err:?}");
    run.stop().await.unwrap();
}

/// A PNG's first bytes, which is all QQ's format check (and the fake's) reads.
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR-rest-of-a-picture";

fn file(
    dir: &std::path::Path,
    chat: &str,
    name: &str,
    kind: MediaKind,
    mime: &str,
    bytes: &[u8],
) -> OutboundFile {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    OutboundFile {
        chat_id: chat.into(),
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
async fn attachments_are_fetched_with_the_token_from_the_media_hosts_only() {
    let fake = fake().await;
    let a = adapter(settings(&fake));
    let mut run = spawn(&a);
    fake.wait_for_sessions(1, WAIT).await;
    let url = fake.serve_media("p.png", PNG.to_vec());
    // QQ's scheme-less form of the same address is made https, which the
    // plain-HTTP fake cannot answer: the whole form is used here.
    fake.push_c2c_with(
        USER,
        "see",
        json!([
            {"content_type": "image/png", "url": url, "filename": "p.png", "size": PNG.len()},
            {"content_type": "voice", "url": "https://multimedia.nt.qq.com.cn/v.silk",
             "asr_refer_text": "call mum at six"}
        ]),
    );
    let ev = run.next().await;
    assert_eq!(ev.text, "see\ncall mum at six");
    assert_eq!(ev.attachments.len(), 1);
    let AttachmentSource::Remote(locator) = &ev.attachments[0].source else {
        panic!("{:?}", ev.attachments[0]);
    };
    assert_eq!(ev.attachments[0].kind, MediaKind::Image);
    let mut dl = a.download(locator).await.unwrap();
    let mut got = Vec::new();
    dl.reader.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, PNG);
    let fetches = || {
        fake.requests()
            .into_iter()
            .filter(|r| r.path.starts_with("/media/"))
            .collect::<Vec<_>>()
    };
    assert_eq!(fetches().len(), 1);
    assert!(fetches()[0].authorized, "the QQBot token goes with a fetch");
    // Another host (the same server under another name) is never asked.
    let elsewhere = locator.replace("127.0.0.1", "localhost");
    assert!(matches!(
        a.download(&elsewhere).await,
        Err(DownloadError::Gone(_))
    ));
    assert!(matches!(
        a.download("file:///etc/passwd").await,
        Err(DownloadError::Gone(_))
    ));
    assert!(matches!(
        a.download(&locator.replace("p.png", "missing.png")).await,
        Err(DownloadError::Gone(_))
    ));
    assert_eq!(fetches().len(), 2, "only the allowed host was asked");
    run.stop().await.unwrap();
}

#[tokio::test]
async fn files_are_uploaded_then_sent_as_passive_media_messages() {
    let fake = fake().await;
    let a = adapter(settings(&fake));
    let mut run = spawn(&a);
    fake.wait_for_sessions(1, WAIT).await;
    let id = fake.push_c2c(USER, "send me things");
    run.next().await;
    let dir = tempfile::tempdir().unwrap();
    let png = file(
        dir.path(),
        USER,
        "chart.png",
        MediaKind::Image,
        "image/png",
        PNG,
    );
    a.send_file(&png).await.unwrap();
    // An MP3 is no SILK: it goes as a file, and so does a WebP picture.
    let mp3 = file(
        dir.path(),
        USER,
        "song.mp3",
        MediaKind::Audio,
        "audio/mpeg",
        b"ID3\x04tune",
    );
    a.send_file(&mp3).await.unwrap();
    let sent = fake.wait_for_media(2, WAIT).await;
    assert_eq!(
        (
            sent[0].file_type,
            sent[0].bytes.as_slice(),
            sent[0].name.as_deref()
        ),
        (1, PNG, Some("chart.png"))
    );
    assert_eq!(
        (sent[1].file_type, sent[1].name.as_deref()),
        (4, Some("song.mp3"))
    );
    assert_eq!(sent[1].bytes, b"ID3\x04tune");
    // Both replied passively to the user's message, each with its own seq.
    assert!(
        sent.iter()
            .all(|m| m.msg_id.as_deref() == Some(id.as_str()))
    );
    assert_ne!(sent[0].msg_seq, sent[1].msg_seq);
    let uploads: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path == format!("/v2/users/{USER}/files"))
        .collect();
    assert_eq!(uploads.len(), 2);
    assert!(
        uploads
            .iter()
            .all(|r| r.authorized && r.body["srv_send_msg"] == false)
    );
    // A file QQ would not take inline is refused with its reason, unsent.
    let big = dir.path().join("big.bin");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(talaria_platforms::qqbot::MAX_INLINE_UPLOAD + 1)
        .unwrap();
    let mut huge = file(
        dir.path(),
        USER,
        "x.bin",
        MediaKind::Document,
        "application/octet-stream",
        b"x",
    );
    huge.path = big;
    let err = a.send_file(&huge).await.unwrap_err();
    assert!(
        matches!(&err, SendError::Rejected(m) if m.contains("x.bin")),
        "{err:?}"
    );
    // A guild channel has no files endpoint: a line names the file.
    let guild = file(
        dir.path(),
        "channel:55",
        "g.png",
        MediaKind::Image,
        "image/png",
        PNG,
    );
    fake.set_proactive_quota(10);
    a.send_file(&guild).await.unwrap();
    let lines = fake.wait_for_sent(1, WAIT).await;
    assert_eq!(lines[0].scope, "channels");
    assert!(lines[0].text.contains("g.png"), "{}", lines[0].text);
    assert_eq!(fake.media_sent().len(), 2);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn a_group_file_goes_to_the_groups_files_endpoint() {
    let fake = fake().await;
    let a = adapter(settings(&fake));
    let mut run = spawn(&a);
    fake.wait_for_sessions(1, WAIT).await;
    let id = fake.push_group_at("G1", "M1", "a picture please");
    run.next().await;
    let dir = tempfile::tempdir().unwrap();
    let mut png = file(
        dir.path(),
        "group:G1",
        "p.png",
        MediaKind::Image,
        "image/png",
        PNG,
    );
    png.caption = Some("here".into());
    a.send_file(&png).await.unwrap();
    let sent = fake.wait_for_media(1, WAIT).await;
    assert_eq!(
        (sent[0].scope.as_str(), sent[0].target.as_str()),
        ("groups", "G1")
    );
    assert_eq!(sent[0].msg_id.as_deref(), Some(id.as_str()));
    assert_eq!(sent[0].content.as_deref(), Some("here"));
    run.stop().await.unwrap();
}
