//! The Discord adapter against the fake Discord (REST and gateway) in
//! talaria-testkit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, ChatType, Inbox, Liveness, LivenessReporter,
    MessageEvent, OutboundMessage, SendError,
};
use talaria_platforms::discord::{DiscordAdapter, DiscordSettings, DiscordTimings};
use talaria_testkit::FakeDiscord;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "MTIzNDU2Nzg5.discord.test-token";
const WAIT: Duration = Duration::from_secs(10);
/// Short enough that heartbeat tests are quick, long enough that a busy
/// machine does not miss an ACK.
const BEAT: Duration = Duration::from_millis(150);

fn settings(fake: &FakeDiscord, require_mention: bool) -> DiscordSettings {
    DiscordSettings {
        token: TOKEN.into(),
        api_base: fake.api_base(),
        gateway_url: None,
        require_mention,
        timings: DiscordTimings {
            connect_timeout: Duration::from_secs(5),
            reidentify_delay: Duration::from_millis(50),
        },
    }
}

fn adapter(fake: &FakeDiscord, require_mention: bool) -> Arc<DiscordAdapter> {
    Arc::new(DiscordAdapter::new(settings(fake, require_mention)).unwrap())
}

struct Running {
    events: mpsc::Receiver<MessageEvent>,
    liveness: watch::Receiver<Liveness>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AdapterError>>,
}

fn spawn(adapter: &Arc<DiscordAdapter>, capacity: usize) -> Running {
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

    async fn ended(self) -> (Result<(), AdapterError>, mpsc::Receiver<MessageEvent>) {
        let result = tokio::time::timeout(WAIT, self.task)
            .await
            .expect("run did not return")
            .expect("run panicked");
        (result, self.events)
    }

    async fn stop(self) -> Result<(), AdapterError> {
        self.shutdown.cancel();
        self.ended().await.0
    }

    async fn wait_live(&mut self) {
        tokio::time::timeout(WAIT, self.liveness.wait_for(|l| *l == Liveness::Live))
            .await
            .expect("never live")
            .unwrap();
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
async fn identify_then_a_dm_becomes_an_event() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, true);
    let mut run = spawn(&a, 8);
    // Live only after READY, not when the socket opened.
    fake.wait_for_sessions(1, WAIT).await;
    run.wait_live().await;
    let id = fake.push_dm("42", "hello there");
    let ev = run.next().await;
    assert_eq!(ev.text, "hello there");
    assert_eq!(ev.source.platform, "discord");
    assert_eq!(ev.source.chat_type, ChatType::Dm);
    assert_eq!(ev.source.chat_id, FakeDiscord::dm_channel("42"));
    assert_eq!(ev.source.user_id.as_deref(), Some("42"));
    assert_eq!(ev.source.user_name.as_deref(), Some("User 42"));
    assert_eq!(ev.message_id.as_deref(), Some(id.as_str()));
    assert_eq!(a.bot_id().as_deref(), Some(fake.bot_id()));

    let identify = &fake.frames_with_op(2)[0].d;
    assert_eq!(identify["token"], TOKEN);
    // The intents sent, by the bits Discord's gateway documentation gives
    // them: GUILDS, GUILD_MESSAGES, DIRECT_MESSAGES and (privileged)
    // MESSAGE_CONTENT; no more, so no other privileged intent is asked for.
    let intents: u64 = (1 << 0) | (1 << 9) | (1 << 12) | (1 << 15);
    assert_eq!(identify["intents"], intents);
    let conn = &fake.connections()[0];
    assert_eq!(conn.path, "/gateway");
    assert_eq!(conn.query, "v=10&encoding=json");
    assert_eq!(
        a.credential(),
        Some(("discord-bot-token", TOKEN.to_owned()))
    );

    // A failing send degrades the connection; the next good one restores it.
    fake.fail_next_send_with_status(503);
    assert!(a.send(&out("55", None, None, "x")).await.is_err());
    assert_eq!(*run.liveness.borrow(), Liveness::Degraded);
    a.send(&out("55", None, None, "y")).await.unwrap();
    assert_eq!(*run.liveness.borrow(), Liveness::Live);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn guild_messages_need_a_mention_and_bots_are_ignored() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, true);
    let mut run = spawn(&a, 8);
    fake.wait_for_sessions(1, WAIT).await;
    let at = fake.mention();
    fake.push_guild_message("7", "70", "42", "just chatting");
    fake.push_guild_message("7", "70", "42", &format!("{at} what's up?"));
    fake.push_message(serde_json::json!({
        "channel_id": "70", "guild_id": "7", "content": format!("{at} I am a bot"),
        "author": {"id": "5", "username": "otherbot", "bot": true},
    }));
    fake.push_message(serde_json::json!({
        "channel_id": "70", "guild_id": "7", "content": "an echo of myself",
        "author": {"id": fake.bot_id(), "username": "talaria-test", "bot": true},
    }));
    fake.push_dm("9", "no mention needed");
    let first = run.next().await;
    assert_eq!(first.text, "what's up?");
    assert_eq!(first.source.chat_type, ChatType::Group);
    assert_eq!(first.source.chat_id, "70");
    assert_eq!(first.source.thread_id, None);
    assert_eq!(run.next().await.text, "no mention needed");
    assert!(run.events.try_recv().is_err());
    run.stop().await.unwrap();
}

#[tokio::test]
async fn thread_messages_map_to_the_parent_and_replies_go_to_the_thread() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, false);
    let mut run = spawn(&a, 8);
    fake.wait_for_sessions(1, WAIT).await;
    fake.push_thread_message("7", "70", "7001", "42", "inside the thread");
    let ev = run.next().await;
    assert_eq!(ev.source.chat_type, ChatType::Thread);
    assert_eq!(ev.source.chat_id, "70");
    assert_eq!(ev.source.thread_id.as_deref(), Some("7001"));
    run.stop().await.unwrap();

    // A new session learns the thread from GUILD_CREATE.
    let b = adapter(&fake, false);
    let mut run = spawn(&b, 8);
    fake.wait_for_sessions(2, WAIT).await;
    fake.push_thread_message("7", "70", "7001", "42", "still inside");
    let ev = run.next().await;
    assert_eq!(ev.source.thread_id.as_deref(), Some("7001"));
    run.stop().await.unwrap();

    let sent = a
        .send(&out("70", Some("7001"), ev.message_id.as_deref(), "answer"))
        .await
        .unwrap();
    a.typing("70", Some("7001")).await.unwrap();
    let s = &fake.sent()[0];
    assert_eq!(s.channel_id, "7001");
    assert_eq!(s.reply_to, ev.message_id);
    assert_eq!(sent.message_id.as_deref(), Some(s.id.as_str()));
    assert_eq!(fake.typing()[0].channel_id, "7001");
}

#[tokio::test]
async fn a_dropped_connection_resumes_without_losing_or_repeating_events() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, false);
    let mut run = spawn(&a, 8);
    fake.wait_for_sessions(1, WAIT).await;
    fake.push_dm("42", "before the drop");
    assert_eq!(run.next().await.text, "before the drop");

    assert!(fake.drop_connection());
    let (result, mut events) = run.ended().await;
    assert!(
        matches!(result, Err(AdapterError::Disconnected(_))),
        "{result:?}"
    );
    // Pushed while nobody is connected: the session keeps it.
    fake.push_dm("42", "during the drop");

    let mut run = spawn(&a, 8);
    fake.wait_for_sessions(2, WAIT).await;
    assert_eq!(run.next().await.text, "during the drop");
    fake.push_dm("42", "after the resume");
    assert_eq!(run.next().await.text, "after the resume");
    assert!(run.events.try_recv().is_err(), "nothing twice");
    assert!(events.try_recv().is_err());

    let resume = &fake.frames_with_op(6)[0].d;
    assert_eq!(resume["token"], TOKEN);
    assert_eq!(resume["session_id"], "fake-session-1");
    assert_eq!(fake.connections()[1].path, "/resume");
    assert_eq!(fake.ready_and_resumed(), (1, 1));
    run.stop().await.unwrap();
}

#[tokio::test]
async fn an_event_not_handed_over_is_replayed_on_resume() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, false);
    // Capacity 1 and nobody reading: "one" fills the inbox, "two" waits.
    let run = spawn(&a, 1);
    fake.wait_for_sessions(1, WAIT).await;
    fake.push_dm("1", "one");
    fake.push_dm("1", "two");
    // "one" fills the inbox; "two" comes after it on the socket.
    talaria_testkit::wait::wait_for("\"one\" handed over", || async {
        match run.events.len() {
            1 => Ok(()),
            n => Err(n),
        }
    })
    .await;
    run.shutdown.cancel();
    let (result, mut events) = run.ended().await;
    result.unwrap();
    assert_eq!(events.recv().await.unwrap().text, "one");
    assert!(events.recv().await.is_none());

    let mut run = spawn(&a, 8);
    assert_eq!(run.next().await.text, "two");
    assert_eq!(fake.ready_and_resumed(), (1, 1));
    run.stop().await.unwrap();
}

#[tokio::test]
async fn reconnect_and_invalid_session_requests_are_followed() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, false);
    let mut run = spawn(&a, 8);
    fake.wait_for_sessions(1, WAIT).await;
    // op 7: reconnect and resume within the same run.
    assert!(fake.send_reconnect());
    fake.wait_for_sessions(2, WAIT).await;
    assert_eq!(fake.ready_and_resumed(), (1, 1));
    fake.push_dm("3", "after op 7");
    assert_eq!(run.next().await.text, "after op 7");

    // op 9 resumable: resume again.
    assert!(fake.invalidate_session(true));
    fake.wait_for_sessions(3, WAIT).await;
    assert_eq!(fake.ready_and_resumed(), (1, 2));

    // op 9 not resumable: a fresh identify after a short wait.
    assert!(fake.invalidate_session(false));
    fake.wait_for_sessions(4, WAIT).await;
    assert_eq!(fake.ready_and_resumed(), (2, 2));
    fake.push_dm("3", "new session");
    assert_eq!(run.next().await.text, "new session");
    assert!(!run.task.is_finished());
    run.stop().await.unwrap();
}

#[tokio::test]
async fn heartbeats_carry_the_sequence_and_a_zombie_connection_is_dropped() {
    let fake = FakeDiscord::start_with_heartbeat(TOKEN, BEAT).await;
    let a = adapter(&fake, false);
    let mut run = spawn(&a, 8);
    fake.wait_for_sessions(1, WAIT).await;
    fake.push_dm("4", "numbered");
    run.next().await;
    let beats = fake.wait_for_frames(1, 3, WAIT).await;
    // READY is 1, GUILD_CREATEs none, the message 2.
    assert_eq!(beats.last().unwrap().d, 2);
    // op 1 from the server gets a beat at once, not at the next interval.
    let n = fake.frames_with_op(1).len();
    let asked = Instant::now();
    assert!(fake.request_heartbeat());
    let beats = fake.wait_for_frames(1, n + 1, WAIT).await;
    assert!(
        beats[n].at.duration_since(asked) < BEAT,
        "{:?}",
        beats[n].at.duration_since(asked)
    );
    assert_eq!(*run.liveness.borrow(), Liveness::Live);

    fake.ack_heartbeats(false);
    let mut liveness = run.liveness.clone();
    let (result, _) = run.ended().await;
    assert!(
        matches!(&result, Err(AdapterError::Disconnected(m)) if m.contains("heartbeat")),
        "{result:?}"
    );
    assert_eq!(*liveness.borrow_and_update(), Liveness::Degraded);
    // The zombie's session is resumed on the next connection.
    fake.ack_heartbeats(true);
    let run = spawn(&a, 8);
    fake.wait_for_sessions(2, WAIT).await;
    assert_eq!(fake.ready_and_resumed(), (1, 1));
    run.stop().await.unwrap();
}

#[tokio::test]
async fn a_wrong_token_and_refused_intents_are_fatal() {
    let fake = FakeDiscord::start(TOKEN).await;
    let mut s = settings(&fake, false);
    s.token = "wrong.token.value".into();
    let bad = Arc::new(DiscordAdapter::new(s.clone()).unwrap());
    // /gateway/bot refuses it first.
    let (result, _) = spawn(&bad, 1).ended().await;
    match result {
        Err(AdapterError::Fatal(m)) => assert!(!m.contains("wrong.token"), "token leaked: {m}"),
        other => panic!("expected Fatal, got {other:?}"),
    }
    // With the URL configured the gateway itself closes with 4004.
    s.gateway_url = Some(fake.gateway_url());
    let bad = Arc::new(DiscordAdapter::new(s).unwrap());
    let (result, _) = spawn(&bad, 1).ended().await;
    assert!(
        matches!(result, Err(AdapterError::Fatal(ref m)) if m.contains("4004")),
        "{result:?}"
    );

    let a = adapter(&fake, false);
    let run = spawn(&a, 1);
    fake.wait_for_sessions(1, WAIT).await;
    assert!(fake.close_connection(4014));
    let (result, _) = run.ended().await;
    assert!(
        matches!(result, Err(AdapterError::Fatal(ref m)) if m.contains("intent")),
        "{result:?}"
    );

    // Other close codes reconnect.
    let run = spawn(&a, 1);
    fake.wait_for_sessions(2, WAIT).await;
    assert!(fake.close_connection(4000));
    let (result, _) = run.ended().await;
    assert!(
        matches!(result, Err(AdapterError::Disconnected(_))),
        "{result:?}"
    );
}

#[tokio::test]
async fn malformed_payloads_are_skipped() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, false);
    let mut run = spawn(&a, 8);
    fake.wait_for_sessions(1, WAIT).await;
    fake.push_dispatch(
        "MESSAGE_CREATE",
        serde_json::json!({"id": 5, "content": []}),
    );
    fake.push_dispatch("MESSAGE_CREATE", serde_json::json!("not an object"));
    fake.push_dispatch("SOMETHING_NEW", serde_json::json!({"x": 1}));
    fake.push_dm("8", "after the junk");
    assert_eq!(run.next().await.text, "after the junk");
    assert_eq!(*run.liveness.borrow(), Liveness::Live);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn sends_reply_without_pinging_everyone_and_are_formatted() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, true);
    a.send(&out(
        "55",
        None,
        Some("1001"),
        "#### Result\n@everyone done",
    ))
    .await
    .unwrap();
    let s = &fake.sent()[0];
    assert_eq!(s.channel_id, "55");
    assert_eq!(s.content, "**Result**\n@everyone done");
    assert_eq!(s.reply_to.as_deref(), Some("1001"));
    let parse = s.allowed_mentions["parse"].as_array().unwrap();
    assert!(
        !parse.iter().any(|p| p == "everyone" || p == "roles"),
        "{parse:?}"
    );
    assert!(fake.send_attempts()[0].authorized);
    a.typing("55", None).await.unwrap();
    assert_eq!(fake.typing()[0].channel_id, "55");
}

#[tokio::test]
async fn rate_limits_wait_retry_after_and_empty_buckets() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, true);
    fake.fail_next_send_with_429(0.3, false);
    a.send(&out("55", None, None, "patience")).await.unwrap();
    let attempts = fake.send_attempts();
    assert_eq!(attempts.len(), 2);
    let gap = attempts[1].at.duration_since(attempts[0].at);
    assert!(gap >= Duration::from_millis(300), "retried after {gap:?}");

    // Remaining 0: the next request in the bucket waits for the reset
    // instead of earning a 429.
    fake.exhaust_bucket_next(0.4);
    a.send(&out("55", None, None, "one")).await.unwrap();
    let before = Instant::now();
    a.send(&out("55", None, None, "two")).await.unwrap();
    assert!(
        before.elapsed() >= Duration::from_millis(300),
        "{:?}",
        before.elapsed()
    );
    // Another channel is another bucket: no wait.
    fake.exhaust_bucket_next(5.0);
    a.send(&out("56", None, None, "three")).await.unwrap();
    let before = Instant::now();
    a.send(&out("57", None, None, "four")).await.unwrap();
    assert!(before.elapsed() < Duration::from_secs(2));

    // Beyond the retry budget the caller hears about it.
    for _ in 0..4 {
        fake.fail_next_send_with_429(0.05, true);
    }
    let err = a.send(&out("55", None, None, "again")).await.unwrap_err();
    assert_eq!(err, SendError::RateLimited(Duration::from_millis(50)));
    // A wait too long to block on is reported at once.
    fake.fail_next_send_with_429(3600.0, false);
    let started = Instant::now();
    let err = a.send(&out("55", None, None, "later")).await.unwrap_err();
    assert_eq!(err, SendError::RateLimited(Duration::from_secs(3600)));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(fake.sent().len(), 5);
}

#[tokio::test]
async fn send_errors_are_classified() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, true);
    for (status, rejected) in [(403, true), (404, true), (500, false), (503, false)] {
        fake.fail_next_send_with_status(status);
        let err = a.send(&out("55", None, None, "x")).await.unwrap_err();
        if rejected {
            assert!(matches!(err, SendError::Rejected(_)), "{status}: {err:?}");
        } else {
            assert!(matches!(err, SendError::Transient(_)), "{status}: {err:?}");
        }
    }
    let mut s = settings(&fake, true);
    s.token = "wrong.token".into();
    let bad = DiscordAdapter::new(s).unwrap();
    assert!(matches!(
        bad.send(&out("55", None, None, "x")).await,
        Err(SendError::Rejected(_))
    ));
}

#[tokio::test]
async fn shutdown_returns_ok_promptly() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, true);
    let run = spawn(&a, 1);
    fake.wait_for_sessions(1, WAIT).await;
    let started = Instant::now();
    run.shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(3), run.task)
        .await
        .expect("run ignored shutdown")
        .unwrap();
    assert_eq!(result, Ok(()));
    assert!(started.elapsed() < Duration::from_secs(3));
}

// ---- Files ----------------------------------------------------------------

use talaria_adapter::{AttachmentSource, DownloadError, MediaKind, OutboundFile};
use tokio::io::AsyncReadExt;

/// A real 1x1 PNG, encoded here (zlib with a stored block needs no
/// compressor, only the CRC-32 and Adler-32 checksums).
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
    let raw = [0u8, 0, 128, 255];
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
    ihdr.extend_from_slice(&1u32.to_be_bytes());
    ihdr.extend_from_slice(&1u32.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &zlib);
    chunk(&mut out, b"IEND", &[]);
    out
}

/// The first page of an OGG/Opus stream.
fn ogg_opus() -> Vec<u8> {
    let mut b = b"OggS\x00\x02".to_vec();
    b.resize(28, 0);
    b.extend_from_slice(b"OpusHead\x01\x01\x38\x01\x80\xbb\x00\x00\x00\x00\x00");
    b
}

fn pdf() -> Vec<u8> {
    b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n".to_vec()
}

async fn fetch(a: &DiscordAdapter, locator: &str) -> Result<Vec<u8>, DownloadError> {
    let mut d = a.download(locator).await?;
    let mut bytes = Vec::new();
    d.reader.read_to_end(&mut bytes).await.unwrap();
    assert_eq!(d.length, Some(bytes.len() as u64));
    Ok(bytes)
}

fn locator(ev: &MessageEvent, i: usize) -> String {
    match &ev.attachments[i].source {
        AttachmentSource::Remote(l) => l.clone(),
        other => panic!("not a remote attachment: {other:?}"),
    }
}

#[tokio::test]
async fn inbound_files_arrive_as_attachments_that_download_their_bytes() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, false);
    let mut run = spawn(&a, 8);
    run.wait_live().await;
    let dm = FakeDiscord::dm_channel("42");
    let photo = fake.add_file(&dm, png(), "cat.png", Some("image/png"));
    let doc = fake.add_file(&dm, pdf(), "report.pdf", Some("application/pdf"));
    fake.push_dm_with_files("42", "look", &[photo.clone(), doc], false);
    let voice = fake.add_file(&dm, ogg_opus(), "voice-message.ogg", Some("audio/ogg"));
    fake.push_dm_with_files("42", "", &[voice], true);

    let ev = run.next().await;
    assert_eq!(ev.text, "look");
    assert_eq!(ev.attachments.len(), 2);
    assert_eq!(ev.attachments[0].kind, MediaKind::Image);
    assert_eq!(ev.attachments[0].name.as_deref(), Some("cat.png"));
    assert_eq!(ev.attachments[0].size, Some(png().len() as u64));
    assert_eq!(locator(&ev, 0), photo["url"].as_str().unwrap());
    assert_eq!(fetch(&a, &locator(&ev, 0)).await.unwrap(), png());
    assert_eq!(ev.attachments[1].kind, MediaKind::Document);
    assert_eq!(ev.attachments[1].mime.as_deref(), Some("application/pdf"));
    assert_eq!(fetch(&a, &locator(&ev, 1)).await.unwrap(), pdf());

    let ev = run.next().await;
    assert_eq!(ev.attachments[0].kind, MediaKind::Voice);
    assert_eq!(fetch(&a, &locator(&ev, 0)).await.unwrap(), ogg_opus());
    assert_eq!(fake.file_fetches().len(), 3);
    // The CDN was asked without the bot's token.
    assert!(
        fake.requests()
            .iter()
            .all(|r| !r.path.contains("attachments"))
    );
    run.stop().await.unwrap();
}

#[tokio::test]
async fn downloads_refused_and_foreign_addresses() {
    let fake = FakeDiscord::start(TOKEN).await;
    let elsewhere = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, false);
    let f = fake.add_file("5", pdf(), "old.pdf", None);
    let url = f["url"].as_str().unwrap().to_owned();
    fake.expire_file(f["id"].as_str().unwrap());
    let err = fetch(&a, &url).await.unwrap_err();
    assert!(
        matches!(&err, DownloadError::Gone(m) if m.contains("404")),
        "{err:?}"
    );
    assert!(!err.to_string().contains("test-token"), "{err}");
    // A wrong signature is refused like an expired one.
    let g = fake.add_file("5", pdf(), "new.pdf", None);
    let forged = g["url"].as_str().unwrap().replace("hm=", "hm=00");
    assert!(matches!(
        fetch(&a, &forged).await,
        Err(DownloadError::Gone(_))
    ));
    assert_eq!(fake.file_fetches().len(), 2);

    let theirs = elsewhere.add_file("5", pdf(), "x.pdf", None);
    for foreign in [
        theirs["url"].as_str().unwrap().to_owned(),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://cdn.discordapp.com/attachments/1/2/a.png".to_owned(),
        "https://cdn.discordapp.com.example/attachments/1/2/a.png".to_owned(),
        "not a url".to_owned(),
    ] {
        assert_eq!(
            fetch(&a, &foreign).await.unwrap_err(),
            DownloadError::Gone("the attachment is not a Discord file address".into()),
            "{foreign}"
        );
    }
    assert!(elsewhere.file_fetches().is_empty());
    assert!(elsewhere.requests().is_empty());
    assert_eq!(fake.file_fetches().len(), 2);
}

#[tokio::test]
async fn redirects_are_followed_only_to_discord_file_addresses() {
    let fake = FakeDiscord::start(TOKEN).await;
    let elsewhere = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, false);
    // Within the file hosts: followed.
    let real = fake.add_file("5", pdf(), "r.pdf", None);
    let hop = fake.add_redirect("5", "hop.pdf", real["url"].as_str().unwrap());
    assert_eq!(
        fetch(&a, hop["url"].as_str().unwrap()).await.unwrap(),
        pdf()
    );
    // To another host: not followed, and nothing reaches it.
    let theirs = elsewhere.add_file("5", pdf(), "x.pdf", None);
    let away = fake.add_redirect("5", "away.pdf", theirs["url"].as_str().unwrap());
    let err = fetch(&a, away["url"].as_str().unwrap()).await.unwrap_err();
    assert!(
        matches!(&err, DownloadError::Unavailable(m) if m.contains("302")),
        "{err:?}"
    );
    assert!(elsewhere.file_fetches().is_empty());
    assert_eq!(fake.file_fetches().len(), 3);
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
            chat_id: "555".into(),
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
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, false);
    let files = Files::new();
    let mut photo = files.file("chart.png", &png(), MediaKind::Image, "image/png");
    photo.thread_id = Some("777".into());
    photo.reply_to = Some("123".into());
    photo.caption = Some("the **chart** @everyone".into());
    let sent = a.send_file(&photo).await.unwrap();
    let voice = files.file("answer.ogg", &ogg_opus(), MediaKind::Voice, "audio/ogg");
    a.send_file(&voice).await.unwrap();
    let doc = files.file("report.pdf", &pdf(), MediaKind::Document, "application/pdf");
    a.send_file(&doc).await.unwrap();

    let ups = fake.wait_for_uploads(3, WAIT).await;
    assert_eq!(ups.len(), 3, "{ups:?}");
    let p = &ups[0];
    // A thread is its own channel.
    assert_eq!(p.channel_id, "777");
    assert_eq!(p.reply_to.as_deref(), Some("123"));
    assert_eq!(p.content.as_deref(), Some("the **chart** @everyone"));
    assert_eq!(
        p.payload["allowed_mentions"]["parse"],
        serde_json::json!(["users"])
    );
    assert_eq!(p.payload["attachments"][0]["filename"], "chart.png");
    assert_eq!(p.files.len(), 1);
    assert_eq!(p.files[0].field, "files[0]");
    assert_eq!(p.files[0].file_name.as_deref(), Some("chart.png"));
    assert_eq!(p.files[0].content_type.as_deref(), Some("image/png"));
    assert_eq!(p.files[0].bytes, png());
    assert_eq!(sent.message_id.as_deref(), Some(p.id.as_str()));

    let v = &ups[1];
    assert_eq!(v.channel_id, "555");
    assert_eq!((v.content.as_deref(), v.reply_to.as_deref()), (None, None));
    assert_eq!(v.files[0].content_type.as_deref(), Some("audio/ogg"));
    assert_eq!(v.files[0].bytes, ogg_opus());

    let d = &ups[2];
    assert_eq!(d.files[0].file_name.as_deref(), Some("report.pdf"));
    assert_eq!(d.files[0].content_type.as_deref(), Some("application/pdf"));
    {
        use sha2::Digest;
        assert_eq!(
            d.files[0].sha256(),
            format!("{:x}", sha2::Sha256::digest(pdf()))
        );
    }
    // What was uploaded is on the CDN like any attachment.
    let url = d.attachments[0]["url"].as_str().unwrap();
    assert_eq!(fetch(&a, url).await.unwrap(), pdf());
    assert!(fake.sent().is_empty());
    assert!(fake.requests().iter().all(|r| r.authorized));
}

#[tokio::test]
async fn uploads_wait_out_rate_limits_and_long_captions_follow() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, false);
    let files = Files::new();
    fake.fail_next_send_with_429(0.2, false);
    let mut doc = files.file("r.pdf", &pdf(), MediaKind::Document, "application/pdf");
    doc.caption = Some("word ".repeat(500));
    let started = Instant::now();
    a.send_file(&doc).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(200));
    let ups = fake.uploads();
    assert_eq!(ups.len(), 1);
    // Each attempt streamed the whole file again.
    assert_eq!(ups[0].files[0].bytes, pdf());
    assert_eq!(ups[0].content, None);
    let sent = fake.sent();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert!(
        sent.iter()
            .all(|s| s.reply_to.as_deref() == Some(ups[0].id.as_str()))
    );
}

#[tokio::test]
async fn upload_failures_are_classified_and_files_too_large_become_a_line() {
    let fake = FakeDiscord::start(TOKEN).await;
    let a = adapter(&fake, false);
    let files = Files::new();
    fake.fail_next_send_with_status(403);
    let doc = files.file("r.pdf", &pdf(), MediaKind::Document, "application/pdf");
    assert!(matches!(
        a.send_file(&doc).await,
        Err(SendError::Rejected(_))
    ));
    fake.fail_next_send_with_status(502);
    assert!(matches!(
        a.send_file(&doc).await,
        Err(SendError::Transient(_))
    ));

    let mut gone = files.file("gone.pdf", &pdf(), MediaKind::Document, "application/pdf");
    std::fs::remove_file(&gone.path).unwrap();
    gone.chat_id = "555".into();
    assert!(
        matches!(a.send_file(&gone).await, Err(SendError::Rejected(m)) if m.contains("gone.pdf"))
    );
    let mut bad = doc.clone();
    bad.chat_id = "../x".into();
    assert!(matches!(
        a.send_file(&bad).await,
        Err(SendError::Rejected(_))
    ));

    // Over the 10 MiB a server without boosts takes: Discord says 413.
    let mut big = files.file(
        "big.mp4",
        &vec![1u8; 10 * 1024 * 1024 + 1],
        MediaKind::Video,
        "video/mp4",
    );
    big.caption = Some("the clip".into());
    a.send_file(&big).await.unwrap();
    assert!(fake.uploads().is_empty());
    let sent = fake.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].content,
        "📎 big.mp4 (video/mp4; discord cannot carry this file)\nthe clip"
    );
}

#[test]
fn discord_says_what_it_carries() {
    let caps = talaria_platforms::discord::CAPABILITIES;
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
