//! The Telegram adapter against the fake Bot API in talaria-testkit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, Admission, ChatType, Inbox, Liveness, LivenessReporter,
    MessageEvent, OutboundMessage, SendError,
};
use talaria_platforms::telegram::{TelegramAdapter, TelegramSettings};
use talaria_testkit::FakeTelegram;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "123456:TEST-token_abc";
const WAIT: Duration = Duration::from_secs(10);

fn adapter(fake: &FakeTelegram, require_mention: bool) -> Arc<TelegramAdapter> {
    Arc::new(
        TelegramAdapter::new(TelegramSettings {
            token: TOKEN.into(),
            base_url: fake.base_url(),
            require_mention,
            poll_timeout: Duration::from_secs(1),
            streaming_edits: false,
        })
        .unwrap(),
    )
}

struct Running {
    events: mpsc::Receiver<MessageEvent>,
    liveness: watch::Receiver<Liveness>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AdapterError>>,
}

fn spawn(adapter: &Arc<TelegramAdapter>, capacity: usize) -> Running {
    let (inbox, events) = Inbox::channel(capacity);
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

    async fn stop(self) -> Result<(), AdapterError> {
        self.shutdown.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("run did not return")
            .expect("run panicked")
    }
}

fn out(
    chat_id: &str,
    thread_id: Option<&str>,
    reply_to: Option<&str>,
    text: &str,
) -> OutboundMessage {
    OutboundMessage {
        chat_id: chat_id.into(),
        thread_id: thread_id.map(Into::into),
        reply_to: reply_to.map(Into::into),
        text: text.into(),
        choices: Vec::new(),
    }
}

#[tokio::test]
async fn dm_text_becomes_an_event() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let mut run = spawn(&a, 8);
    fake.push_private_text(42, "hello there");
    let ev = run.next().await;
    assert_eq!(ev.text, "hello there");
    assert_eq!(ev.source.platform, "telegram");
    assert_eq!(ev.source.chat_id, "42");
    assert_eq!(ev.source.chat_type, ChatType::Dm);
    assert_eq!(ev.source.user_id.as_deref(), Some("42"));
    assert_eq!(ev.source.user_name.as_deref(), Some("user42"));
    assert_eq!(ev.source.thread_id, None);
    assert!(!ev.source.is_bot);
    assert!(ev.message_id.is_some());
    assert_eq!(*run.liveness.borrow(), Liveness::Live);
    assert_eq!(a.bot_username().as_deref(), Some(fake.bot_username()));
    assert_eq!(
        a.credential(),
        Some(("telegram-bot-token", TOKEN.to_owned()))
    );
    run.stop().await.unwrap();
}

#[tokio::test]
async fn forum_topics_and_the_general_topic() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let mut run = spawn(&a, 8);
    fake.push_group_text(-100, 5, "in a topic", Some(17), true);
    fake.push_group_text(-100, 5, "in general", None, true);
    // A reply thread in an ordinary group is not a topic.
    fake.push_group_text(-200, 5, "plain group", Some(9), false);

    let topic = run.next().await;
    assert_eq!(topic.source.chat_type, ChatType::Forum);
    assert_eq!(topic.source.thread_id.as_deref(), Some("17"));
    assert_eq!(topic.source.chat_name.as_deref(), Some("Group -100"));
    let general = run.next().await;
    assert_eq!(general.source.chat_type, ChatType::Forum);
    assert_eq!(general.source.thread_id.as_deref(), Some("1"));
    let group = run.next().await;
    assert_eq!(group.source.chat_type, ChatType::Group);
    assert_eq!(group.source.thread_id, None);
    assert_eq!(group.source.user_id.as_deref(), Some("5"));
    run.stop().await.unwrap();
}

#[tokio::test]
async fn groups_with_require_mention_only_pass_messages_for_the_bot() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, true);
    let mut run = spawn(&a, 8);
    let bot = fake.bot_username();
    fake.push_group_text(-1, 5, "just chatting", None, false);
    fake.push_group_text(-1, 5, &format!("hey @{bot} what's up"), None, false);
    fake.push_group_text(-1, 5, "/help@some_other_bot", None, false);
    fake.push_group_text(-1, 5, "/status", None, false);
    fake.push_update(json!({"message": {
        "chat": {"id": -1, "type": "supergroup", "title": "G"},
        "from": {"id": 6, "is_bot": false, "first_name": "Ann"},
        "text": "thanks!",
        "reply_to_message": {"message_id": 1, "chat": {"id": -1, "type": "supergroup"}, "date": 0,
            "text": "an answer", "from": {"id": fake.bot_id(), "is_bot": true, "first_name": "Bot"}},
    }}));
    // DMs are never filtered.
    fake.push_private_text(9, "no mention needed");

    let texts: Vec<String> = [
        run.next().await,
        run.next().await,
        run.next().await,
        run.next().await,
    ]
    .into_iter()
    .map(|e| e.text)
    .collect();
    assert_eq!(
        texts,
        [
            format!("hey @{bot} what's up"),
            "/status".to_owned(),
            "thanks!".to_owned(),
            "no mention needed".to_owned()
        ]
    );
    // The skipped ones were still confirmed, and none became an event.
    fake.wait_for_confirmed_updates(WAIT).await;
    assert!(run.events.try_recv().is_err());
    run.stop().await.unwrap();
    assert_eq!(fake.pending_updates(), 0);
}

#[tokio::test]
async fn the_offset_advances_only_after_hand_over() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    fake.push_private_text(1, "one");
    let u2 = fake.push_private_text(1, "two");
    let u3 = fake.push_private_text(1, "three");
    // The test is the runner, and admits each update only once it has
    // looked: the adapter waits in `admit` meanwhile, as behind a busy
    // runner.
    let (inbox, mut admits) = Inbox::admitting(1);
    let (reporter, _liveness) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let ctx = AdapterContext {
        inbox,
        liveness: reporter,
        shutdown: shutdown.clone(),
    };
    let runner = a.clone();
    let task = tokio::spawn(async move { runner.run(ctx).await });
    for text in ["one", "two", "three"] {
        let admit = tokio::time::timeout(WAIT, admits.recv())
            .await
            .expect("no update handed over in time")
            .expect("inbox closed");
        // The adapter is waiting for this admission, so a poll it made
        // before asking (and waited for, as every poll is) is on record.
        let calls = fake.get_updates_calls();
        assert_eq!(
            calls.len(),
            1,
            "polled again before {text:?} was handed over: {calls:?}"
        );
        assert_eq!(calls[0].offset, None);
        assert_eq!(admit.answer(Admission::Accepted).text, text);
    }
    // The batch is handed over, so the next poll confirms all three.
    let calls = fake.wait_for_get_updates_calls(2, WAIT).await;
    assert_eq!(calls[1].offset, Some(u3 + 1), "{calls:?}");
    assert!(calls.iter().all(|c| c.offset != Some(u2 + 1)));
    shutdown.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .expect("run did not return")
        .expect("run panicked")
        .unwrap();
}

#[tokio::test]
async fn an_update_not_handed_over_is_delivered_again() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let u1 = fake.push_private_text(1, "one");
    fake.push_private_text(1, "two");
    let run = spawn(&a, 1);
    fake.wait_for_get_updates_calls(1, WAIT).await;
    // "one" fills the inbox; "two", of the same batch, waits for room.
    talaria_testkit::wait::wait_for("\"one\" handed over", || async {
        match run.events.len() {
            1 => Ok(()),
            n => Err(n),
        }
    })
    .await;
    // Stop while "two" waits for the inbox: it must not be confirmed.
    let mut events = {
        let Running {
            events,
            shutdown,
            task,
            ..
        } = run;
        shutdown.cancel();
        tokio::time::timeout(WAIT, task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        events
    };
    assert_eq!(events.recv().await.unwrap().text, "one");

    // A reconnect with the same adapter resumes after "one" only.
    let mut run = spawn(&a, 8);
    assert_eq!(run.next().await.text, "two");
    let calls = fake.get_updates_calls();
    assert_eq!(calls[1].offset, Some(u1 + 1), "{calls:?}");
    run.stop().await.unwrap();
}

#[tokio::test]
async fn non_messages_and_malformed_updates_are_skipped() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let mut run = spawn(&a, 8);
    fake.push_update(json!({"callback_query": {"id": "x"}}));
    fake.push_update(json!({"message": {"chat": "not an object"}}));
    let last = fake.push_private_text(3, "after the junk");
    assert_eq!(run.next().await.text, "after the junk");
    let calls = fake.wait_for_get_updates_calls(2, WAIT).await;
    assert_eq!(calls.last().unwrap().offset, Some(last + 1));
    run.stop().await.unwrap();
}

#[tokio::test]
async fn send_with_thread_and_reply() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let sent = a
        .send(&out("-100", Some("17"), Some("55"), "in topic"))
        .await
        .unwrap();
    a.send(&out("-100", Some("1"), None, "in general"))
        .await
        .unwrap();
    let s = fake.sent();
    assert_eq!(sent.message_id, Some(s[0].message_id.to_string()));
    assert_eq!(s[0].chat_id, -100);
    assert_eq!(s[0].thread_id, Some(17));
    assert_eq!(s[0].reply_to, Some(55));
    assert_eq!(s[0].parse_mode.as_deref(), Some("HTML"));
    assert_eq!(s[0].text, "in topic");
    let params = &fake.send_attempts()[0].params;
    assert_eq!(params["allow_sending_without_reply"], json!(true));
    // The General topic is addressed by leaving the thread out.
    assert_eq!(s[1].thread_id, None);
    assert_eq!(s[1].reply_to, None);

    a.typing("-100", Some("17")).await.unwrap();
    let actions = fake.chat_actions();
    assert_eq!(actions[0].action, "typing");
    assert_eq!(actions[0].thread_id, Some(17));

    let id = sent.message_id.unwrap();
    a.edit("-100", &id, "edited **now**").await.unwrap();
    let edits = fake.edits();
    assert_eq!(edits[0].text, "edited <b>now</b>");
    // Editing to the same text is not an error.
    a.edit("-100", &id, "edited **now**").await.unwrap();
}

#[tokio::test]
async fn rate_limits_wait_retry_after() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    fake.fail_next_send_with_429(1);
    a.send(&out("7", None, None, "patience")).await.unwrap();
    let attempts = fake.send_attempts();
    assert_eq!(attempts.len(), 2);
    let gap = attempts[1].at.duration_since(attempts[0].at);
    assert!(gap >= Duration::from_secs(1), "retried after {gap:?}");
    assert_eq!(fake.sent().len(), 1);

    // Beyond the retry budget the caller hears about it.
    for _ in 0..4 {
        fake.fail_next_send_with_429(1);
    }
    let err = a.send(&out("7", None, None, "again")).await.unwrap_err();
    assert_eq!(err, SendError::RateLimited(Duration::from_secs(1)));
    // A wait too long to block on is reported at once.
    fake.fail_next_send_with_429(3600);
    let started = Instant::now();
    let err = a.send(&out("7", None, None, "later")).await.unwrap_err();
    assert_eq!(err, SendError::RateLimited(Duration::from_secs(3600)));
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[tokio::test]
async fn rejected_entities_fall_back_to_plain_text() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    fake.reject_entities_next(1);
    a.send(&out("7", None, None, "**bold** <tag>"))
        .await
        .unwrap();
    let s = fake.sent();
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].parse_mode, None);
    assert_eq!(s[0].text, "**bold** <tag>");
    assert_eq!(fake.send_attempts().len(), 2);
}

#[tokio::test]
async fn html_is_escaped() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let text = "<script>alert('x')</script> & a > b, `x<y` and\n```html\n<b>&amp;</b>\n```";
    a.send(&out("7", None, None, text)).await.unwrap();
    let s = &fake.sent()[0];
    // The fake validates the markup: a mistake would have been a 400 and a
    // plain-text retry.
    assert_eq!(s.parse_mode.as_deref(), Some("HTML"));
    assert_eq!(fake.send_attempts().len(), 1);
    assert!(
        s.text.starts_with(
            "&lt;script&gt;alert('x')&lt;/script&gt; &amp; a &gt; b, <code>x&lt;y</code>"
        ),
        "{}",
        s.text
    );
    assert!(
        s.text.contains(
            "<pre><code class=\"language-html\">&lt;b&gt;&amp;amp;&lt;/b&gt;</code></pre>"
        ),
        "{}",
        s.text
    );
    assert_eq!(
        s.rendered(),
        "<script>alert('x')</script> & a > b, x<y and\n<b>&amp;</b>"
    );
}

#[tokio::test]
async fn send_errors_are_classified() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    fake.block_chat(8);
    assert!(matches!(
        a.send(&out("8", None, None, "hi")).await,
        Err(SendError::Rejected(_))
    ));
    assert!(matches!(
        a.send(&out("@nowhere", None, None, "hi")).await,
        Err(SendError::Rejected(d)) if d.contains("chat not found")
    ));
}

#[tokio::test]
async fn a_wrong_token_is_fatal() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = Arc::new(
        TelegramAdapter::new(TelegramSettings {
            token: "999:wrong".into(),
            base_url: fake.base_url(),
            require_mention: false,
            poll_timeout: Duration::from_secs(1),
            streaming_edits: false,
        })
        .unwrap(),
    );
    let run = spawn(&a, 1);
    let result = tokio::time::timeout(WAIT, run.task).await.unwrap().unwrap();
    match result {
        Err(AdapterError::Fatal(m)) => assert!(!m.contains("wrong"), "token leaked: {m}"),
        other => panic!("expected Fatal, got {other:?}"),
    }
}

#[tokio::test]
async fn failed_polls_degrade_then_disconnect() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    fake.fail_next_get_updates(2);
    let mut run = spawn(&a, 8);
    fake.push_private_text(4, "still here");
    // Two failures, then recovery.
    assert_eq!(run.next().await.text, "still here");
    assert_eq!(*run.liveness.borrow(), Liveness::Live);
    run.stop().await.unwrap();

    fake.fail_next_get_updates(100);
    let run = spawn(&a, 8);
    let mut liveness = run.liveness.clone();
    let result = tokio::time::timeout(WAIT, run.task).await.unwrap().unwrap();
    assert!(
        matches!(result, Err(AdapterError::Disconnected(_))),
        "{result:?}"
    );
    assert_eq!(*liveness.borrow_and_update(), Liveness::Degraded);
}

#[tokio::test]
async fn shutdown_returns_ok_promptly() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = Arc::new(
        TelegramAdapter::new(TelegramSettings {
            token: TOKEN.into(),
            base_url: fake.base_url(),
            require_mention: false,
            poll_timeout: Duration::from_secs(30),
            streaming_edits: false,
        })
        .unwrap(),
    );
    let run = spawn(&a, 1);
    fake.wait_for_get_updates_calls(1, WAIT).await;
    let started = Instant::now();
    run.shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(2), run.task)
        .await
        .expect("run ignored shutdown")
        .unwrap();
    assert_eq!(result, Ok(()));
    assert!(started.elapsed() < Duration::from_secs(2));
}

// ---- Files ----------------------------------------------------------------

use talaria_adapter::{AttachmentSource, DownloadError, MediaKind, OutboundFile};
use talaria_testkit::telegram::FileKind;
use tokio::io::AsyncReadExt;

/// A real 2x1 PNG, encoded here: zlib with stored blocks needs no
/// compressor, only the CRC-32 and Adler-32 checksums.
fn png() -> Vec<u8> {
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = 0xffff_ffffu32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xedb8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }
    fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        out.extend_from_slice(&body);
        out.extend_from_slice(&crc32(&body).to_be_bytes());
    }
    // One scanline: filter byte 0, then a red and a blue RGB pixel.
    let raw = [0u8, 255, 0, 0, 0, 0, 255];
    let (mut a, mut b) = (1u32, 0u32);
    for &x in &raw {
        a = (a + u32::from(x)) % 65521;
        b = (b + a) % 65521;
    }
    let mut zlib = vec![0x78, 0x01, 0x01];
    zlib.extend_from_slice(&(raw.len() as u16).to_le_bytes());
    zlib.extend_from_slice(&(!(raw.len() as u16)).to_le_bytes());
    zlib.extend_from_slice(&raw);
    zlib.extend_from_slice(&((b << 16) | a).to_be_bytes());
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&2u32.to_be_bytes());
    ihdr.extend_from_slice(&1u32.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &zlib);
    chunk(&mut out, b"IEND", &[]);
    out
}

/// The first page of an OGG/Opus stream: enough for anything that reads
/// its type from the bytes.
fn ogg_opus() -> Vec<u8> {
    let mut b = b"OggS\x00\x02".to_vec();
    b.resize(28, 0);
    b.extend_from_slice(b"OpusHead\x01\x01\x38\x01\x80\xbb\x00\x00\x00\x00\x00");
    b
}

fn pdf() -> Vec<u8> {
    b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n".to_vec()
}

async fn fetch(
    a: &TelegramAdapter,
    locator: &str,
) -> Result<(Vec<u8>, Option<u64>), DownloadError> {
    let mut d = a.download(locator).await?;
    let mut bytes = Vec::new();
    d.reader.read_to_end(&mut bytes).await.unwrap();
    Ok((bytes, d.length))
}

fn remote(ev: &MessageEvent) -> (MediaKind, String) {
    assert_eq!(ev.attachments.len(), 1, "{:?}", ev.attachments);
    let att = &ev.attachments[0];
    match &att.source {
        AttachmentSource::Remote(l) => (att.kind, l.clone()),
        other => panic!("not a remote attachment: {other:?}"),
    }
}

#[tokio::test]
async fn inbound_files_arrive_as_attachments_that_download_their_bytes() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let mut run = spawn(&a, 8);
    let photo = fake.add_file(png(), None, None);
    let voice = fake.add_file(ogg_opus(), None, Some("audio/ogg"));
    let doc = fake.add_file(pdf(), Some("report.pdf"), Some("application/pdf"));
    fake.push_private_file(42, FileKind::Photo, &photo, Some("what is this?"));
    fake.push_private_file(42, FileKind::Voice, &voice, None);
    fake.push_private_file(42, FileKind::Document, &doc, None);

    let ev = run.next().await;
    assert_eq!(ev.text, "what is this?");
    // The full size, not the thumbnail that comes first.
    assert_eq!(remote(&ev), (MediaKind::Image, photo.clone()));
    assert_eq!(ev.attachments[0].size, Some(png().len() as u64));
    assert_eq!(ev.attachments[0].mime.as_deref(), Some("image/jpeg"));
    assert_eq!(
        fetch(&a, &photo).await.unwrap(),
        (png(), Some(png().len() as u64))
    );

    let ev = run.next().await;
    assert_eq!(ev.text, "");
    assert_eq!(remote(&ev), (MediaKind::Voice, voice.clone()));
    assert_eq!(ev.attachments[0].mime.as_deref(), Some("audio/ogg"));
    assert_eq!(fetch(&a, &voice).await.unwrap().0, ogg_opus());

    let ev = run.next().await;
    assert_eq!(remote(&ev), (MediaKind::Document, doc.clone()));
    assert_eq!(ev.attachments[0].name.as_deref(), Some("report.pdf"));
    assert_eq!(ev.attachments[0].mime.as_deref(), Some("application/pdf"));
    assert_eq!(fetch(&a, &doc).await.unwrap().0, pdf());

    // Each download asked getFile, then fetched the path it gave.
    let get_file: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "getFile")
        .map(|r| r.params["file_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(get_file, [photo, voice, doc]);
    assert_eq!(fake.downloads().len(), 3);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn downloads_refused_by_telegram() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    // The link expired: getFile answers, the file server says 404.
    let expired = fake.add_file(pdf(), Some("old.pdf"), None);
    fake.expire_file(&expired);
    let err = fetch(&a, &expired).await.unwrap_err();
    assert!(
        matches!(&err, DownloadError::Gone(m) if m.contains("404")),
        "{err:?}"
    );
    assert!(!err.to_string().contains("TEST-token"), "{err}");
    assert_eq!(fake.downloads().len(), 1);

    // A file id Telegram does not know.
    let err = fetch(&a, "AgACAgIAAxkBAAIBunknown").await.unwrap_err();
    assert!(
        matches!(&err, DownloadError::Gone(m) if m.contains("invalid file_id")),
        "{err:?}"
    );

    // Over the 20 MB bots may fetch: refused before any download.
    let big = fake.add_file(vec![7u8; 20 * 1024 * 1024 + 1], Some("big.bin"), None);
    let err = fetch(&a, &big).await.unwrap_err();
    assert!(matches!(err, DownloadError::TooLarge(_)), "{err:?}");
    assert_eq!(fake.downloads().len(), 1);
}

#[tokio::test]
async fn a_foreign_address_is_refused_without_a_request() {
    let fake = FakeTelegram::start(TOKEN).await;
    let elsewhere = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let file = elsewhere.add_file(pdf(), Some("x.pdf"), None);
    for locator in [
        format!(
            "{}/file/bot{TOKEN}/documents/file_1.pdf",
            elsewhere.base_url()
        ),
        format!("//{}/x", elsewhere.addr()),
        "../../etc/passwd".to_owned(),
        String::new(),
    ] {
        let err = fetch(&a, &locator).await.unwrap_err();
        assert_eq!(
            err,
            DownloadError::Gone("the attachment is not a Telegram file address".into()),
            "{locator}"
        );
    }
    assert!(fake.requests().is_empty());
    assert!(elsewhere.requests().is_empty());
    assert!(elsewhere.downloads().is_empty());
    // The same file id is unknown to this bot's server.
    assert!(matches!(
        fetch(&a, &file).await,
        Err(DownloadError::Gone(_))
    ));
}

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        Files {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn file(&self, name: &str, bytes: &[u8], kind: MediaKind, mime: &str) -> OutboundFile {
        let path = self.dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        OutboundFile {
            chat_id: "42".into(),
            thread_id: None,
            reply_to: None,
            path,
            kind,
            mime: mime.into(),
            name: name.into(),
            caption: None,
        }
    }
}

#[tokio::test]
async fn send_file_uploads_a_photo_a_voice_note_and_a_document() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let files = Files::new();

    let mut photo = files.file("chart.png", &png(), MediaKind::Image, "image/png");
    photo.chat_id = "-100".into();
    photo.thread_id = Some("17".into());
    photo.reply_to = Some("5".into());
    photo.caption = Some("the **chart** <3".into());
    let sent = a.send_file(&photo).await.unwrap();
    let voice = files.file("answer.ogg", &ogg_opus(), MediaKind::Voice, "audio/ogg");
    a.send_file(&voice).await.unwrap();
    let doc = files.file("report.pdf", &pdf(), MediaKind::Document, "application/pdf");
    a.send_file(&doc).await.unwrap();

    let ups = fake.uploads();
    assert_eq!(ups.len(), 3, "{ups:?}");
    let p = &ups[0];
    assert_eq!(
        (p.method.as_str(), p.field.as_str()),
        ("sendPhoto", "photo")
    );
    assert_eq!(p.chat_id, -100);
    assert_eq!(p.thread_id, Some(17));
    assert_eq!(p.reply_to, Some(5));
    assert_eq!(
        p.fields
            .get("allow_sending_without_reply")
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(p.parse_mode.as_deref(), Some("HTML"));
    assert_eq!(p.caption.as_deref(), Some("the <b>chart</b> &lt;3"));
    assert_eq!(p.rendered_caption().as_deref(), Some("the chart <3"));
    assert_eq!(p.file_name.as_deref(), Some("chart.png"));
    assert_eq!(p.content_type.as_deref(), Some("image/png"));
    assert_eq!(p.bytes, png());
    assert_eq!(sent.message_id, Some(p.message_id.to_string()));

    let v = &ups[1];
    assert_eq!(
        (v.method.as_str(), v.field.as_str()),
        ("sendVoice", "voice")
    );
    assert_eq!(v.chat_id, 42);
    assert_eq!(
        (v.thread_id, v.reply_to, v.caption.as_deref()),
        (None, None, None)
    );
    assert_eq!(v.content_type.as_deref(), Some("audio/ogg"));
    assert_eq!(v.bytes, ogg_opus());

    let d = &ups[2];
    assert_eq!(
        (d.method.as_str(), d.field.as_str()),
        ("sendDocument", "document")
    );
    assert_eq!(d.file_name.as_deref(), Some("report.pdf"));
    assert_eq!(d.content_type.as_deref(), Some("application/pdf"));
    {
        use sha2::Digest;
        assert_eq!(d.sha256(), format!("{:x}", sha2::Sha256::digest(pdf())));
    }
    assert_eq!(d.bytes, pdf());
    // What was uploaded can be fetched back like any file.
    assert_eq!(fetch(&a, &d.file_id).await.unwrap().0, pdf());
    assert!(fake.sent().is_empty());
}

#[tokio::test]
async fn images_telegram_would_not_take_as_photos_go_as_documents() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let files = Files::new();
    let gif = files.file(
        "a.gif",
        b"GIF89a\x01\x00\x01\x00\x00\x00\x00;",
        MediaKind::Image,
        "image/gif",
    );
    a.send_file(&gif).await.unwrap();
    // Over sendPhoto's 10 MB.
    let big = files.file(
        "big.png",
        &vec![0u8; 10 * 1024 * 1024 + 1],
        MediaKind::Image,
        "image/png",
    );
    a.send_file(&big).await.unwrap();
    let ups = fake.uploads();
    assert_eq!(ups[0].method, "sendDocument");
    assert_eq!(ups[0].file_name.as_deref(), Some("a.gif"));
    assert_eq!(ups[1].method, "sendDocument");
    assert_eq!(ups[1].len(), 10 * 1024 * 1024 + 1);
}

#[tokio::test]
async fn uploads_wait_out_rate_limits_and_fall_back_to_a_plain_caption() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let files = Files::new();
    fake.fail_next_send_with_429(1);
    fake.reject_entities_next(1);
    let mut doc = files.file("r.pdf", &pdf(), MediaKind::Document, "application/pdf");
    doc.caption = Some("a *b*".into());
    let started = Instant::now();
    a.send_file(&doc).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(900));
    let ups = fake.uploads();
    assert_eq!(ups.len(), 1);
    assert_eq!(ups[0].caption.as_deref(), Some("a *b*"));
    assert_eq!(ups[0].parse_mode, None);
    // Each attempt streamed the whole file again.
    assert_eq!(ups[0].bytes, pdf());
    let attempts = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "sendDocument")
        .count();
    assert_eq!(attempts, 3);
}

#[tokio::test]
async fn a_long_caption_follows_the_file_as_a_reply() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let files = Files::new();
    let mut photo = files.file("p.png", &png(), MediaKind::Image, "image/png");
    photo.caption = Some("word ".repeat(300));
    a.send_file(&photo).await.unwrap();
    let ups = fake.uploads();
    assert_eq!(ups[0].caption, None);
    let sent = fake.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].rendered().trim(), "word ".repeat(300).trim());
    assert_eq!(sent[0].reply_to, Some(ups[0].message_id));
}

#[tokio::test]
async fn upload_failures_are_classified_and_oversized_files_become_a_line() {
    let fake = FakeTelegram::start(TOKEN).await;
    let a = adapter(&fake, false);
    let files = Files::new();
    fake.block_chat(8);
    let mut doc = files.file("r.pdf", &pdf(), MediaKind::Document, "application/pdf");
    doc.chat_id = "8".into();
    assert!(
        matches!(a.send_file(&doc).await, Err(SendError::Rejected(m)) if m.contains("blocked"))
    );

    let mut gone = files.file("gone.pdf", &pdf(), MediaKind::Document, "application/pdf");
    std::fs::remove_file(&gone.path).unwrap();
    gone.chat_id = "42".into();
    assert!(
        matches!(a.send_file(&gone).await, Err(SendError::Rejected(m)) if m.contains("gone.pdf"))
    );

    // Over the 50 MB bots may upload (a sparse file: nothing is written).
    let huge = files.file("huge.mp4", b"", MediaKind::Video, "video/mp4");
    std::fs::File::options()
        .write(true)
        .open(&huge.path)
        .unwrap()
        .set_len(50 * 1024 * 1024 + 1)
        .unwrap();
    a.send_file(&huge).await.unwrap();
    assert!(fake.uploads().is_empty());
    let sent = fake.sent();
    assert_eq!(sent.len(), 1);
    assert!(
        sent[0]
            .rendered()
            .starts_with("📎 huge.mp4 (video/mp4; telegram cannot carry this file)"),
        "{}",
        sent[0].text
    );
}

#[test]
fn telegram_says_what_it_carries() {
    let caps = talaria_platforms::telegram::CAPABILITIES;
    for kind in [
        MediaKind::Image,
        MediaKind::Voice,
        MediaKind::Audio,
        MediaKind::Video,
        MediaKind::Document,
    ] {
        assert!(
            caps.receives.contains(&kind) && caps.sends.contains(&kind),
            "{kind:?}"
        );
    }
}
