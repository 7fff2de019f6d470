//! The Signal adapter against the fake signal-cli REST API in
//! talaria-testkit: real HTTP and a real WebSocket on 127.0.0.1.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, ChatType, Inbox, Liveness, LivenessReporter,
    MessageEvent, OutboundMessage, SendError,
};
use talaria_platforms::signal::{SignalAdapter, SignalReceiveMode, SignalSettings};
use talaria_testkit::FakeSignal;
use talaria_testkit::signal::{Mode, NewMessage, Person};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const BOT: &str = "+15550009999";
const WAIT: Duration = Duration::from_secs(10);
/// The ping interval of tests about silence: a socket is given up after
/// two of them.
const PING: Duration = Duration::from_millis(150);
/// The ping interval elsewhere, long enough that a loaded machine never
/// makes a healthy socket look silent.
const CALM_PING: Duration = Duration::from_secs(2);

fn alice() -> Person {
    Person::numbered(1, "Alice")
}

fn settings(fake: &FakeSignal, account: &str) -> SignalSettings {
    SignalSettings {
        ping_interval: CALM_PING,
        poll_interval: Duration::from_millis(50),
        connect_timeout: Duration::from_secs(5),
        send_timeout: Duration::from_secs(5),
        ..SignalSettings::new(fake.url(), account)
    }
}

fn adapter(fake: &FakeSignal) -> Arc<SignalAdapter> {
    Arc::new(SignalAdapter::new(settings(fake, BOT)).unwrap())
}

struct Running {
    events: mpsc::Receiver<MessageEvent>,
    liveness: watch::Receiver<Liveness>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AdapterError>>,
}

fn spawn(adapter: &Arc<SignalAdapter>) -> Running {
    spawn_with_room(adapter, 16)
}

/// A run whose inbox holds `room` events before the adapter must wait.
fn spawn_with_room(adapter: &Arc<SignalAdapter>, room: usize) -> Running {
    let (inbox, events) = Inbox::channel(room);
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

    async fn live(&mut self) {
        tokio::time::timeout(WAIT, self.liveness.wait_for(|l| *l == Liveness::Live))
            .await
            .expect("never live")
            .unwrap();
    }

    /// Waits for `run` to end by itself.
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

fn out(chat_id: &str, reply_to: Option<&str>, text: &str) -> OutboundMessage {
    OutboundMessage {
        chat_id: chat_id.into(),
        thread_id: None,
        reply_to: reply_to.map(Into::into),
        text: text.into(),
        choices: Vec::new(),
    }
}

#[tokio::test]
async fn a_dm_becomes_an_event_once_the_account_check_made_it_live() {
    let fake = FakeSignal::start(BOT, Mode::JsonRpc).await;
    let a = adapter(&fake);
    let mut run = spawn(&a);
    run.live().await;
    let ts = fake.push(NewMessage::dm(&alice(), "hello there"));
    let ev = run.next().await;
    assert_eq!(ev.text, "hello there");
    assert_eq!(ev.source.platform, "signal");
    assert_eq!(ev.source.chat_id, alice().uuid);
    assert_eq!(ev.source.chat_type, ChatType::Dm);
    assert_eq!(ev.source.user_id.as_deref(), Some(alice().uuid.as_str()));
    assert_eq!(ev.source.user_name.as_deref(), Some("Alice"));
    assert_eq!(ev.source.thread_id, None);
    assert_eq!(
        ev.message_id.as_deref(),
        Some(format!("{ts}:{}", alice().uuid).as_str())
    );
    assert_eq!(a.credential(), Some(("signal-phone", BOT.to_owned())));
    let paths: Vec<String> = fake.requests().into_iter().map(|r| r.path).collect();
    let receive = format!("/v1/receive/{BOT}");
    assert_eq!(paths[..3], ["/v1/about", "/v1/accounts", receive.as_str()]);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn an_account_the_server_does_not_hold_is_fatal_and_never_live() {
    let fake = FakeSignal::start(BOT, Mode::JsonRpc).await;
    let a = Arc::new(SignalAdapter::new(settings(&fake, "+15550001234")).unwrap());
    let run = spawn(&a);
    fake.push(NewMessage::dm(&alice(), "anyone?"));
    let liveness = run.liveness.clone();
    let err = run.ended().await.unwrap_err();
    assert!(
        matches!(&err, AdapterError::Fatal(m) if m.contains("+15550001234")),
        "{err}"
    );
    assert_ne!(*liveness.borrow(), Liveness::Live);
    assert!(fake.connections().is_empty());
    assert_eq!(fake.queued(), 1);

    // Polling servers say the same through `receive` when they have no
    // accounts list; here they have one.
    let poller = FakeSignal::start(BOT, Mode::Normal).await;
    let a = Arc::new(SignalAdapter::new(settings(&poller, "+15550001234")).unwrap());
    let err = spawn(&a).ended().await.unwrap_err();
    assert!(matches!(err, AdapterError::Fatal(_)), "{err}");
    assert_eq!(poller.polls(), 0);
}

#[tokio::test]
async fn an_unreachable_server_is_a_disconnect_and_sends_are_unavailable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let s = SignalSettings {
        send_timeout: Duration::from_secs(5),
        ..SignalSettings::new(url, BOT)
    };
    let a = Arc::new(SignalAdapter::new(s).unwrap());
    let err = spawn(&a).ended().await.unwrap_err();
    assert!(matches!(err, AdapterError::Disconnected(_)), "{err}");
    let err = a.send(&out(&alice().uuid, None, "hi")).await.unwrap_err();
    assert!(matches!(err, SendError::Unavailable(_)), "{err}");
}

#[tokio::test]
async fn the_servers_mode_picks_polling_and_the_first_poll_makes_it_live() {
    let fake = FakeSignal::start(BOT, Mode::Normal).await;
    // Configured for the WebSocket: the server's `normal` mode wins.
    let a = adapter(&fake);
    let mut run = spawn(&a);
    run.live().await;
    assert!(fake.polls() >= 1);
    let first = fake.push(NewMessage::dm(&alice(), "one"));
    let second = fake.push(NewMessage::dm(&alice(), "two"));
    let a1 = run.next().await;
    let a2 = run.next().await;
    assert_eq!((a1.text.as_str(), a2.text.as_str()), ("one", "two"));
    assert!(a1.message_id.unwrap().starts_with(&first.to_string()));
    assert!(a2.message_id.unwrap().starts_with(&second.to_string()));
    assert!(fake.connections().is_empty());
    assert_eq!(fake.queued(), 0);
    run.stop().await.unwrap();

    // A configured `poll` against a WebSocket server loses the same way.
    let ws = FakeSignal::start(BOT, Mode::JsonRpc).await;
    let s = SignalSettings {
        receive_mode: SignalReceiveMode::Poll,
        ..settings(&ws, BOT)
    };
    let mut run = spawn(&Arc::new(SignalAdapter::new(s).unwrap()));
    run.live().await;
    ws.wait_for_connections(1, WAIT).await;
    run.stop().await.unwrap();
}

#[tokio::test]
async fn group_messages_need_a_mention_and_answers_quote_them() {
    let fake = FakeSignal::start(BOT, Mode::JsonRpc).await;
    let a = adapter(&fake);
    let mut run = spawn(&a);
    run.live().await;
    let group = "R3JvdXAyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjI=";
    fake.push(NewMessage::dm(&alice(), "chatting among ourselves").in_group(group, "Team"));
    let ts = fake.push(
        NewMessage::dm(&alice(), "what time is it?")
            .in_group(group, "Team")
            .mentioning(BOT),
    );
    let ev = run.next().await;
    assert_eq!(ev.text, "what time is it?");
    assert_eq!(ev.source.chat_type, ChatType::Group);
    assert_eq!(ev.source.chat_id, FakeSignal::group_recipient(group));
    assert_eq!(ev.source.chat_name.as_deref(), Some("Team"));
    let reply_to = ev.message_id.clone().unwrap();
    let sent = a
        .send(&out(&ev.source.chat_id, Some(&reply_to), "It is **noon**."))
        .await
        .unwrap();
    let got = fake.wait_for_sent(1, WAIT).await;
    assert_eq!(got[0].recipients, vec![FakeSignal::group_recipient(group)]);
    assert_eq!(got[0].message, "It is noon.");
    assert_eq!(got[0].quote_timestamp, Some(ts));
    assert_eq!(got[0].quote_author.as_deref(), Some(alice().uuid.as_str()));
    assert_eq!(sent.message_id, Some(format!("{}:{BOT}", got[0].timestamp)));
    // A DM answer quotes nothing.
    a.send(&out(&alice().uuid, Some(&reply_to), "hi"))
        .await
        .unwrap();
    let got = fake.wait_for_sent(2, WAIT).await;
    assert_eq!(got[1].quote_timestamp, None);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn attachments_are_listed_and_receipts_typing_sync_and_junk_are_skipped() {
    let fake = FakeSignal::start(BOT, Mode::JsonRpc).await;
    let a = adapter(&fake);
    let mut run = spawn(&a);
    run.live().await;
    let who = alice();
    let envelope = |extra: serde_json::Value| {
        let mut e = json!({"source": who.number, "sourceNumber": who.number,
                           "sourceUuid": who.uuid, "sourceName": who.name,
                           "sourceDevice": 1, "timestamp": 1700000000001_i64});
        for (k, v) in extra.as_object().unwrap() {
            e[k] = v.clone();
        }
        json!({"envelope": e, "account": BOT})
    };
    fake.push_raw(envelope(
        json!({"receiptMessage": {"when": 1, "isDelivery": true,
                                                      "isRead": false, "timestamps": [1]}}),
    ));
    fake.push_raw(envelope(
        json!({"typingMessage": {"action": "STARTED", "timestamp": 1}}),
    ));
    fake.push_raw(envelope(
        json!({"syncMessage": {"sentMessage": {"message": "from my phone",
        "timestamp": 5, "destination": "+15550000002"}}}),
    ));
    fake.push_raw(envelope(
        json!({"dataMessage": {"timestamp": 7, "message": null,
        "reaction": {"emoji": "👍", "targetAuthor": BOT, "targetSentTimestamp": 3}}}),
    ));
    fake.push_raw(json!({"error": "signal-cli hiccup"}));
    fake.push_raw(json!("not an object"));
    fake.push(
        NewMessage::dm(&alice(), "look")
            .with_attachment("image/jpeg", "cat.jpg", 3000)
            .with_attachment("application/pdf", "", 10),
    );
    let ev = run.next().await;
    assert_eq!(ev.text, "look");
    let labels: Vec<(String, Option<u64>)> =
        ev.attachments.iter().map(|a| (a.label(), a.size)).collect();
    assert_eq!(
        labels,
        [
            ("image cat.jpg".to_owned(), Some(3000)),
            ("document".to_owned(), Some(10))
        ]
    );
    // Still the same socket: nothing above broke it.
    assert_eq!(fake.connections().len(), 1);
    assert!(run.events.try_recv().is_err());
    run.stop().await.unwrap();
}

/// The socket drops with an event in flight: written by the server just
/// before it hung up, read by the adapter while its inbox is full. The
/// adapter hands it over before it reports the connection gone; what came
/// while it was away arrives on the next connection; nothing twice.
#[tokio::test]
async fn a_dropped_socket_loses_and_repeats_nothing() {
    let fake = FakeSignal::start(BOT, Mode::JsonRpc).await;
    let a = adapter(&fake);
    let mut run = spawn_with_room(&a, 1);
    run.live().await;
    // Only a socket the fake registered receives pushes (see below).
    fake.wait_for_connections(1, WAIT).await;
    // "one" fills the inbox; "two" is on the wire when the socket drops.
    fake.push(NewMessage::dm(&alice(), "one"));
    fake.push(NewMessage::dm(&alice(), "two"));
    fake.drop_connection();
    assert_eq!(run.next().await.text, "one");
    assert_eq!(run.next().await.text, "two");
    let err = tokio::time::timeout(WAIT, &mut run.task)
        .await
        .expect("run did not notice")
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, AdapterError::Disconnected(_)), "{err}");
    fake.push(NewMessage::dm(&alice(), "meanwhile"));
    // What the supervisor does: run again.
    let mut again = spawn(&a);
    again.live().await;
    fake.push(NewMessage::dm(&alice(), "after"));
    assert_eq!(again.next().await.text, "meanwhile");
    assert_eq!(again.next().await.text, "after");
    // A repeat of anything above would come before this marker.
    fake.push(NewMessage::dm(&alice(), "marker"));
    assert_eq!(again.next().await.text, "marker");
    assert_eq!(fake.connections().len(), 2);
    assert!(run.events.try_recv().is_err());
    again.stop().await.unwrap();
}

#[tokio::test]
async fn a_silent_socket_is_given_up_and_what_came_meanwhile_is_not_lost() {
    let fake = FakeSignal::start(BOT, Mode::JsonRpc).await;
    let s = SignalSettings {
        ping_interval: PING,
        ..settings(&fake, BOT)
    };
    let a = Arc::new(SignalAdapter::new(s).unwrap());
    let mut run = spawn(&a);
    run.live().await;
    // The adapter is live once its side of the socket is open; the fake
    // registers its side a moment later, and only a registered socket can
    // be silenced.
    fake.wait_for_connections(1, WAIT).await;
    // A hung server: the socket stays open but nothing comes back, not
    // even pongs.
    fake.go_silent();
    let liveness = run.liveness.clone();
    let err = run.ended().await.unwrap_err();
    assert!(
        matches!(&err, AdapterError::Disconnected(m) if m.contains("silent")),
        "{err}"
    );
    assert_eq!(*liveness.borrow(), Liveness::Degraded);
    fake.push(NewMessage::dm(&alice(), "are you there?"));
    let mut again = spawn(&a);
    assert_eq!(again.next().await.text, "are you there?");
    again.stop().await.unwrap();
}

#[tokio::test]
async fn send_errors_map_to_what_the_ledger_needs() {
    let fake = FakeSignal::start(BOT, Mode::JsonRpc).await;
    let s = SignalSettings {
        rate_limit_retries: 1,
        ..settings(&fake, BOT)
    };
    let a = Arc::new(SignalAdapter::new(s).unwrap());
    // Nobody by that number ever wrote: the server refuses it for good.
    let err = a.send(&out("+15550004321", None, "hi")).await.unwrap_err();
    assert!(matches!(err, SendError::Rejected(_)), "{err}");
    fake.add_contact("+15550004321");
    fake.fail_next_send_with(500, "Internal error");
    let err = a.send(&out("+15550004321", None, "hi")).await.unwrap_err();
    assert!(matches!(err, SendError::Transient(_)), "{err}");
    // One 429 is waited out; two exhaust the single retry.
    fake.fail_next_sends_with_429(None);
    a.send(&out("+15550004321", None, "after one"))
        .await
        .unwrap();
    fake.fail_next_sends_with_429(None);
    fake.fail_next_sends_with_429(Some(3));
    let err = a
        .send(&out("+15550004321", None, "after two"))
        .await
        .unwrap_err();
    assert_eq!(err, SendError::RateLimited(Duration::from_secs(3)));
    // signal-cli's own rate limit comes as a 400 with a telling text.
    fake.fail_next_send_with(
        400,
        "Failed to send message: [429] Rate limit exceeded: RateLimitException",
    );
    fake.fail_next_send_with(
        400,
        "Failed to send message: [429] Rate limit exceeded: RateLimitException",
    );
    let err = a.send(&out("+15550004321", None, "hi")).await.unwrap_err();
    assert!(matches!(err, SendError::RateLimited(_)), "{err}");
    let sent = fake.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].message, "after one");
}

#[tokio::test]
async fn typing_is_shown_to_the_chat() {
    let fake = FakeSignal::start(BOT, Mode::JsonRpc).await;
    let a = adapter(&fake);
    a.typing(&alice().uuid, None).await.unwrap();
    let t = fake.wait_for_typing(1, WAIT).await;
    assert_eq!(t[0].number, BOT);
    assert_eq!(t[0].recipient, alice().uuid);
    assert!(t[0].show);
}

#[tokio::test]
async fn a_redelivered_envelope_carries_the_same_message_id() {
    let fake = FakeSignal::start(BOT, Mode::JsonRpc).await;
    let a = adapter(&fake);
    let mut run = spawn(&a);
    run.live().await;
    let ts = fake.push(NewMessage::dm(&alice(), "once"));
    let first = run.next().await;
    fake.redeliver(ts);
    let second = run.next().await;
    assert_eq!(first.message_id, second.message_id);
    assert_eq!(first.source.chat_id, second.source.chat_id);
    run.stop().await.unwrap();
}

// ---- media ----------------------------------------------------------------

/// A 2×2 red PNG, encoded by hand (signature, IHDR, zlib'd IDAT, IEND).
const PNG: [u8; 73] = [
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x02, 0x08, 0x02, 0x00, 0x00, 0x00, 0xfd, 0xd4, 0x9a,
    0x73, 0x00, 0x00, 0x00, 0x10, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0x00,
    0x44, 0x0c, 0x10, 0x0a, 0x00, 0x1f, 0xee, 0x03, 0xfd, 0x8b, 0x5f, 0x14, 0xd4, 0x00, 0x00, 0x00,
    0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

/// The first Ogg page of an Opus stream: the page header and `OpusHead`
/// (nothing here decodes audio, so the header alone is enough).
fn ogg_opus() -> Vec<u8> {
    let mut page = b"OggS".to_vec();
    page.extend([0, 2]); // version, beginning of stream
    page.extend([0; 8]); // granule position
    page.extend([1, 0, 0, 0]); // serial
    page.extend([0; 4]); // page sequence
    page.extend([0; 4]); // checksum
    page.extend([1, 19]); // one segment of 19 bytes
    page.extend(b"OpusHead");
    page.extend([1, 1, 0x38, 0x01, 0x80, 0xbb, 0, 0, 0, 0, 0]);
    page
}

const PDF: &[u8] = b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n";

async fn read_all(download: talaria_adapter::Download) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut reader = download.reader;
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes).await.unwrap();
    bytes
}

fn outbound(
    dir: &std::path::Path,
    chat_id: &str,
    name: &str,
    bytes: &[u8],
    kind: talaria_adapter::MediaKind,
    mime: &str,
) -> talaria_adapter::OutboundFile {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    talaria_adapter::OutboundFile {
        chat_id: chat_id.to_owned(),
        thread_id: None,
        reply_to: None,
        path,
        kind,
        mime: mime.to_owned(),
        name: name.to_owned(),
        caption: None,
    }
}

#[tokio::test]
async fn an_inbound_photo_voice_note_and_document_download_as_the_bytes_sent() {
    use talaria_adapter::{AttachmentSource, MediaKind};
    let fake = FakeSignal::start(BOT, Mode::JsonRpc).await;
    let a = adapter(&fake);
    let mut run = spawn(&a);
    run.live().await;
    let ogg = ogg_opus();
    let photo = fake.add_file(&PNG, "png");
    let voice = fake.add_file(&ogg, "ogg");
    let doc = fake.add_file(PDF, "pdf");
    fake.push(
        NewMessage::dm(&alice(), "")
            .with_file(&photo, "image/png", Some("desk.png"), PNG.len() as u64)
            .with_file(&voice, "audio/ogg", None, ogg.len() as u64)
            .with_file(&doc, "application/pdf", Some("q3.pdf"), PDF.len() as u64),
    );
    let ev = run.next().await;
    let kinds: Vec<_> = ev.attachments.iter().map(|a| a.kind).collect();
    assert_eq!(
        kinds,
        [MediaKind::Image, MediaKind::Voice, MediaKind::Document]
    );
    for (attachment, want) in ev.attachments.iter().zip([PNG.to_vec(), ogg, PDF.to_vec()]) {
        let AttachmentSource::Remote(locator) = &attachment.source else {
            panic!("a remote attachment: {attachment:?}")
        };
        let download = a.download(locator).await.unwrap();
        assert_eq!(download.length, Some(want.len() as u64));
        assert_eq!(read_all(download).await, want);
    }
    run.stop().await.unwrap();
}

#[tokio::test]
async fn a_missing_attachment_is_gone_and_odd_locators_are_never_asked_for() {
    use talaria_adapter::DownloadError;
    let fake = FakeSignal::start(BOT, Mode::JsonRpc).await;
    let a = adapter(&fake);
    let err = a.download("n0SuchFile.png").await.unwrap_err();
    assert!(
        matches!(&err, DownloadError::Gone(m) if m.contains("404")),
        "{err:?}"
    );
    let asked = fake.requests().len();
    for odd in ["../../etc/passwd", "http://127.0.0.1:1/x", "a/b", ""] {
        let err = a.download(odd).await.unwrap_err();
        assert!(matches!(err, DownloadError::Gone(_)), "{odd}: {err:?}");
    }
    assert_eq!(fake.requests().len(), asked);
}

#[tokio::test]
async fn files_go_base64_in_one_send_with_the_caption_as_text() {
    use talaria_adapter::MediaKind;
    let fake = FakeSignal::start(BOT, Mode::JsonRpc).await;
    let a = adapter(&fake);
    fake.add_contact(&alice().uuid);
    let dir = tempfile::tempdir().unwrap();
    let ogg = ogg_opus();
    let mut png = outbound(
        dir.path(),
        &alice().uuid,
        "chart.png",
        &PNG,
        MediaKind::Image,
        "image/png",
    );
    png.caption = Some("**Q3** sales".to_owned());
    let voice = outbound(
        dir.path(),
        &alice().uuid,
        "reply.ogg",
        &ogg,
        MediaKind::Voice,
        "audio/ogg",
    );
    let pdf = outbound(
        dir.path(),
        &alice().uuid,
        "q3.pdf",
        PDF,
        MediaKind::Document,
        "application/pdf",
    );
    for file in [&png, &voice, &pdf] {
        let sent = a.send_file(file).await.unwrap();
        assert!(sent.message_id.unwrap().ends_with(BOT));
    }
    let got = fake.wait_for_sent(3, WAIT).await;
    let shape: Vec<_> = got
        .iter()
        .map(|s| {
            let [att] = s.attachments.as_slice() else {
                panic!("one attachment: {s:?}")
            };
            (
                s.message.as_str(),
                att.mime.as_deref(),
                att.filename.as_deref(),
                att.bytes.clone(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (
                "Q3 sales",
                Some("image/png"),
                Some("chart.png"),
                PNG.to_vec()
            ),
            ("", Some("audio/ogg"), Some("reply.ogg"), ogg),
            ("", Some("application/pdf"), Some("q3.pdf"), PDF.to_vec()),
        ]
    );
    assert!(
        got.iter()
            .all(|s| s.recipients == [alice().uuid] && s.number == BOT)
    );
}

#[tokio::test]
async fn a_file_in_a_group_quotes_and_refusals_are_classified() {
    use talaria_adapter::MediaKind;
    let fake = FakeSignal::start(BOT, Mode::JsonRpc).await;
    let a = adapter(&fake);
    let group = "R3JvdXAzMzMzMzMzMzMzMzMzMzMzMzMzMzMzMzMzMzM=";
    // The server learns of the group from a message in it.
    fake.push(
        NewMessage::dm(&alice(), "hi all")
            .in_group(group, "Team")
            .at(1_700_000_000_123),
    );
    let chat = FakeSignal::group_recipient(group);
    let dir = tempfile::tempdir().unwrap();
    let mut file = outbound(
        dir.path(),
        &chat,
        "a.pdf",
        PDF,
        MediaKind::Document,
        "application/pdf",
    );
    file.reply_to = Some(format!("1700000000123:{}", alice().uuid));
    a.send_file(&file).await.unwrap();
    let got = fake.wait_for_sent(1, WAIT).await;
    assert_eq!(got[0].recipients, vec![chat]);
    assert_eq!(got[0].quote_timestamp, Some(1_700_000_000_123));
    assert_eq!(got[0].attachments[0].bytes, PDF);
    // An unknown recipient is refused for good; a rate limit waits.
    let stranger = outbound(
        dir.path(),
        "+15550001234",
        "b.pdf",
        PDF,
        MediaKind::Document,
        "application/pdf",
    );
    assert!(matches!(
        a.send_file(&stranger).await,
        Err(SendError::Rejected(_))
    ));
    // A wait over a minute is not held: reported at once.
    fake.fail_next_sends_with_429(Some(120));
    assert!(matches!(
        a.send_file(&file).await,
        Err(SendError::RateLimited(_))
    ));
    let missing = talaria_adapter::OutboundFile {
        path: dir.path().join("absent.pdf"),
        ..file
    };
    assert!(matches!(
        a.send_file(&missing).await,
        Err(SendError::Rejected(_))
    ));
}

#[tokio::test]
async fn a_file_past_signals_limit_goes_as_a_text_line_unread() {
    use talaria_adapter::MediaKind;
    let fake = FakeSignal::start(BOT, Mode::JsonRpc).await;
    let a = adapter(&fake);
    fake.add_contact(&alice().uuid);
    let dir = tempfile::tempdir().unwrap();
    let file = outbound(
        dir.path(),
        &alice().uuid,
        "huge.mp4",
        b"",
        MediaKind::Video,
        "video/mp4",
    );
    // Sparse: 101 MiB on paper, nothing on disk, and never read.
    std::fs::File::options()
        .write(true)
        .open(&file.path)
        .unwrap()
        .set_len(101 * 1024 * 1024)
        .unwrap();
    a.send_file(&file).await.unwrap();
    let got = fake.wait_for_sent(1, WAIT).await;
    assert!(got[0].attachments.is_empty());
    assert!(
        got[0]
            .message
            .contains("huge.mp4 (video/mp4; signal cannot carry this file)"),
        "{}",
        got[0].message
    );
}
