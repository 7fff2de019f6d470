//! The Mattermost adapter against the fake Mattermost server in
//! talaria-testkit: real HTTP and a real WebSocket on 127.0.0.1.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, ChatType, Inbox, Liveness, LivenessReporter,
    MessageEvent, OutboundMessage, SendError,
};
use talaria_platforms::mattermost::{MattermostAdapter, MattermostSettings};
use talaria_testkit::FakeMattermost;
use talaria_testkit::mattermost::NewPost;
use talaria_testkit::wait::wait_for;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "mmtesttoken0123456789abcdef";
const WAIT: Duration = Duration::from_secs(10);
/// The ping interval of tests about silence: a socket is given up after
/// two of them.
const PING: Duration = Duration::from_millis(150);
/// The ping interval elsewhere, long enough that a loaded machine never
/// makes a healthy socket look silent.
const CALM_PING: Duration = Duration::from_secs(2);

fn settings(fake: &FakeMattermost, token: &str) -> MattermostSettings {
    MattermostSettings {
        ping_interval: CALM_PING,
        connect_timeout: Duration::from_secs(5),
        send_timeout: Duration::from_secs(5),
        ..MattermostSettings::new(fake.url(), token)
    }
}

fn adapter(fake: &FakeMattermost) -> Arc<MattermostAdapter> {
    Arc::new(MattermostAdapter::new(settings(fake, TOKEN)).unwrap())
}

/// An adapter that pings every [`PING`].
fn pinging_adapter(fake: &FakeMattermost) -> Arc<MattermostAdapter> {
    let s = MattermostSettings {
        ping_interval: PING,
        ..settings(fake, TOKEN)
    };
    Arc::new(MattermostAdapter::new(s).unwrap())
}

struct Running {
    events: mpsc::Receiver<MessageEvent>,
    liveness: watch::Receiver<Liveness>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AdapterError>>,
}

fn spawn(adapter: &Arc<MattermostAdapter>) -> Running {
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

fn out(chat_id: &str, thread_id: Option<&str>, text: &str) -> OutboundMessage {
    OutboundMessage {
        chat_id: chat_id.into(),
        thread_id: thread_id.map(Into::into),
        reply_to: None,
        text: text.into(),
        choices: Vec::new(),
    }
}

#[tokio::test]
async fn a_dm_becomes_an_event_once_the_hello_made_it_live() {
    let fake = FakeMattermost::start(TOKEN).await;
    let a = adapter(&fake);
    let mut run = spawn(&a);
    run.live().await;
    let id = fake.push(NewPost::dm("alice", "hello there"));
    let ev = run.next().await;
    assert_eq!(ev.text, "hello there");
    assert_eq!(ev.source.platform, "mattermost");
    assert_eq!(ev.source.chat_id, "dmalice");
    assert_eq!(ev.source.chat_type, ChatType::Dm);
    assert_eq!(ev.source.user_id.as_deref(), Some("alice"));
    assert_eq!(ev.source.user_name.as_deref(), Some("useralice"));
    assert_eq!(ev.source.thread_id, None);
    assert_eq!(ev.message_id.as_deref(), Some(id.as_str()));
    assert_eq!(a.bot_username().as_deref(), Some(fake.bot_username()));
    assert_eq!(a.credential(), Some(("mattermost-token", TOKEN.to_owned())));
    let conns = fake.connections();
    assert_eq!(conns.len(), 1);
    assert!(conns[0].header_auth);
    assert_eq!(a.connection_id(), Some(conns[0].connection_id.clone()));
    run.stop().await.unwrap();
}

#[tokio::test]
async fn a_socket_without_a_hello_is_never_live_and_is_given_up() {
    let fake = FakeMattermost::start(TOKEN).await;
    fake.mute_new_connections(true);
    let a = pinging_adapter(&fake);
    let run = spawn(&a);
    fake.wait_for_connections(1, WAIT).await;
    let liveness = run.liveness.clone();
    // Given up by the adapter, long before this test would give up on it.
    let err = tokio::time::timeout(WAIT, run.ended())
        .await
        .expect("a socket without a hello was kept")
        .unwrap_err();
    assert!(matches!(err, AdapterError::Disconnected(_)), "{err:?}");
    assert!(err.to_string().contains("silent"), "{err}");
    // TCP and the WebSocket handshake succeeded; that is not enough.
    assert_ne!(*liveness.borrow(), Liveness::Live);

    fake.mute_new_connections(false);
    let mut run = spawn(&a);
    run.live().await;
    run.stop().await.unwrap();
}

#[tokio::test]
async fn channels_need_a_mention_and_their_answers_go_to_a_thread() {
    let fake = FakeMattermost::start(TOKEN).await;
    let a = adapter(&fake);
    let mut run = spawn(&a);
    run.live().await;
    let bot = fake.bot_username();
    fake.push(NewPost::channel("town", "bob", "just chatting"));
    fake.push(NewPost::channel("town", "bob", "system stuff").of_kind("system_join_channel"));
    let asked = fake.push(NewPost::channel(
        "town",
        "bob",
        &format!("@{bot} what's up?"),
    ));
    let ev = run.next().await;
    assert_eq!(ev.text, "what's up?");
    assert_eq!(ev.source.chat_type, ChatType::Group);
    assert_eq!(ev.source.chat_name.as_deref(), Some("Channel town"));
    assert_eq!(ev.source.thread_id.as_deref(), Some(asked.as_str()));
    assert_eq!(ev.message_id.as_deref(), Some(asked.as_str()));

    // The answer lands in the thread; the server echoes it back as a
    // `posted` event from the bot, which is not an event.
    let sent = a
        .send(&out("town", ev.source.thread_id.as_deref(), "all good"))
        .await
        .unwrap();
    let posts = fake.wait_for_posts(1, WAIT).await;
    assert_eq!(posts[0].root_id.as_deref(), Some(asked.as_str()));
    assert_eq!(sent.message_id.as_deref(), Some(posts[0].id.as_str()));

    // A follow-up in that thread needs no mention; one in another thread does.
    let other = fake.push(NewPost::channel("town", "bob", "unrelated"));
    fake.push(NewPost::channel("town", "bob", "in another thread").in_thread(&other));
    fake.push(NewPost::channel("town", "bob", "and then?").in_thread(&asked));
    let ev = run.next().await;
    assert_eq!(ev.text, "and then?");
    assert_eq!(ev.source.thread_id.as_deref(), Some(asked.as_str()));
    // Private channels and group messages follow the same rule.
    fake.push(NewPost::channel("priv", "bob", "quiet").of_channel_type("P"));
    fake.push(NewPost::channel("grp", "bob", &format!("@{bot} hi")).of_channel_type("G"));
    let ev = run.next().await;
    assert_eq!(ev.source.chat_id, "grp");
    assert_eq!(ev.text, "hi");
    run.stop().await.unwrap();
}

#[tokio::test]
async fn sends_keep_markdown_defuse_broadcasts_and_reply_in_threads() {
    let fake = FakeMattermost::start(TOKEN).await;
    fake.add_channel("town", "O");
    let a = adapter(&fake);
    a.send(&out(
        "town",
        None,
        "**Done** <br>ping @channel, see `@here`",
    ))
    .await
    .unwrap();
    let posts = fake.wait_for_posts(1, WAIT).await;
    assert_eq!(
        posts[0].message,
        "**Done** \nping @\u{200B}channel, see `@here`"
    );
    assert_eq!(posts[0].root_id, None);
    // A thread root the server does not know is refused for good.
    let err = a
        .send(&out("town", Some("nosuchpost0000000000000000"), "x"))
        .await
        .unwrap_err();
    assert!(matches!(err, SendError::Rejected(_)), "{err:?}");
    // So is an unknown channel (no permission), and a 5xx is transient.
    let err = a.send(&out("elsewhere", None, "x")).await.unwrap_err();
    assert!(matches!(err, SendError::Rejected(_)), "{err:?}");
    fake.fail_next_post_with(503);
    let err = a.send(&out("town", None, "x")).await.unwrap_err();
    assert!(matches!(err, SendError::Transient(_)), "{err:?}");
    // The longest post Mattermost takes goes through whole.
    let long = "y".repeat(a.limits().max_len);
    a.send(&out("town", None, &long)).await.unwrap();
    assert_eq!(fake.wait_for_posts(2, WAIT).await[1].message, long);
}

#[tokio::test]
async fn a_429_is_waited_out_as_the_headers_say_and_then_reported() {
    let fake = FakeMattermost::start(TOKEN).await;
    fake.add_channel("town", "O");
    let a = adapter(&fake);

    fake.fail_next_posts_with_429(1, None);
    let started = Instant::now();
    a.send(&out("town", None, "after the reset")).await.unwrap();
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(950), "{waited:?}");
    assert_eq!(fake.post_attempts().len(), 2);
    assert_eq!(fake.posts().len(), 1);

    // Retry-After wins over the reset header; too long a wait is reported
    // rather than waited out: the send ends, with one attempt, well before
    // the ten minutes it was told to wait.
    fake.fail_next_posts_with_429(1, Some(600));
    let before = fake.post_attempts().len();
    let err = tokio::time::timeout(WAIT, a.send(&out("town", None, "x")))
        .await
        .expect("the send waited out a ten-minute Retry-After")
        .unwrap_err();
    assert_eq!(err, SendError::RateLimited(Duration::from_secs(600)));
    assert_eq!(fake.post_attempts().len() - before, 1);

    // Retries are bounded: three waits, then RateLimited.
    let before = fake.post_attempts().len();
    for _ in 0..4 {
        fake.fail_next_posts_with_429(0, None);
    }
    let err = a.send(&out("town", None, "x")).await.unwrap_err();
    assert!(matches!(err, SendError::RateLimited(_)), "{err:?}");
    assert_eq!(fake.post_attempts().len() - before, 4);
    assert_eq!(fake.posts().len(), 1);
}

#[tokio::test]
async fn a_bad_token_is_fatal_for_run_and_rejected_for_send() {
    let fake = FakeMattermost::start(TOKEN).await;
    fake.add_channel("town", "O");
    let a = Arc::new(MattermostAdapter::new(settings(&fake, "wrongtoken")).unwrap());
    let err = spawn(&a).ended().await.unwrap_err();
    assert!(matches!(err, AdapterError::Fatal(_)), "{err:?}");
    assert!(!err.to_string().contains("wrongtoken"));
    let err = a.send(&out("town", None, "x")).await.unwrap_err();
    assert!(matches!(err, SendError::Rejected(_)), "{err:?}");
    assert!(fake.connections().is_empty());
}

#[tokio::test]
async fn a_dropped_connection_is_resumed_without_losing_or_repeating_an_event() {
    let fake = FakeMattermost::start(TOKEN).await;
    let a = adapter(&fake);
    let mut run = spawn(&a);
    run.live().await;
    fake.push(NewPost::dm("alice", "one"));
    assert_eq!(run.next().await.text, "one");

    fake.drop_connection();
    let err = run.ended().await.unwrap_err();
    assert!(matches!(err, AdapterError::Disconnected(_)), "{err:?}");
    // Posted while nobody listened: the server keeps them for a resume.
    fake.push(NewPost::dm("alice", "two"));
    fake.push(NewPost::dm("alice", "three"));

    let mut run = spawn(&a);
    run.live().await;
    let conns = fake.connections();
    assert_eq!(conns.len(), 2);
    assert!(conns[1].resumed, "{conns:#?}");
    assert_eq!(
        conns[1].asked_id.as_deref(),
        Some(conns[0].connection_id.as_str())
    );
    // hello was 0 and "one" 1: the next wanted is 2.
    assert_eq!(conns[1].asked_seq, Some(2));
    assert_eq!(run.next().await.text, "two");
    assert_eq!(run.next().await.text, "three");
    fake.push(NewPost::dm("alice", "four"));
    assert_eq!(run.next().await.text, "four");
    assert!(run.events.try_recv().is_err(), "nothing twice");
    run.stop().await.unwrap();
}

#[tokio::test]
async fn events_sent_again_at_old_sequence_numbers_are_not_handed_over_twice() {
    let fake = FakeMattermost::start(TOKEN).await;
    let a = adapter(&fake);
    let mut run = spawn(&a);
    run.live().await;
    fake.push(NewPost::dm("alice", "one"));
    fake.push(NewPost::dm("alice", "two"));
    assert_eq!(run.next().await.text, "one");
    assert_eq!(run.next().await.text, "two");
    fake.resend_from(1);
    fake.push(NewPost::dm("alice", "three"));
    assert_eq!(run.next().await.text, "three");
    assert!(run.events.try_recv().is_err());
    run.stop().await.unwrap();
}

/// Waits until the adapter has taken the connection id `id` from a hello.
/// The answer to the first action may come before the hello (a server
/// reads and writes independently) and already counts as live, so the id
/// is awaited rather than read at once.
async fn takes_connection(a: &MattermostAdapter, id: &str) {
    wait_for("the adapter to take the hello's connection id", || {
        let now = a.connection_id();
        async move {
            if now.as_deref() == Some(id) {
                Ok(())
            } else {
                Err(now)
            }
        }
    })
    .await;
}

#[tokio::test]
async fn a_connection_the_server_forgot_starts_afresh_with_a_new_hello() {
    let fake = FakeMattermost::start(TOKEN).await;
    let a = adapter(&fake);
    let mut run = spawn(&a);
    run.live().await;
    let first = fake.connections()[0].connection_id.clone();
    takes_connection(&a, &first).await;
    fake.expire_connection();
    run.ended().await.unwrap_err();
    let mut run = spawn(&a);
    run.live().await;
    let conns = fake.connections();
    assert!(!conns[1].resumed);
    assert_eq!(conns[1].asked_id.as_deref(), Some(first.as_str()));
    assert_ne!(conns[1].connection_id, first);
    takes_connection(&a, &conns[1].connection_id).await;
    // Sequence numbers start over with the new connection.
    fake.push(NewPost::dm("alice", "fresh"));
    assert_eq!(run.next().await.text, "fresh");
    run.stop().await.unwrap();
}

#[tokio::test]
async fn a_silent_socket_is_rebuilt_and_what_came_meanwhile_is_replayed() {
    let fake = FakeMattermost::start(TOKEN).await;
    let a = pinging_adapter(&fake);
    let mut run = spawn(&a);
    run.live().await;
    // Pings go out and their answers keep the connection up.
    let pings = fake.pings();
    wait_for("two more pings", || async {
        let now = fake.pings();
        if now >= pings + 2 { Ok(()) } else { Err(now) }
    })
    .await;
    assert!(!run.task.is_finished());

    fake.go_silent();
    fake.push(NewPost::dm("alice", "while silent"));
    let err = tokio::time::timeout(WAIT, run.ended())
        .await
        .expect("a silent socket was kept")
        .unwrap_err();
    assert!(err.to_string().contains("silent"), "{err}");
    let mut run = spawn(&a);
    assert_eq!(run.next().await.text, "while silent");
    run.live().await;
    assert!(fake.connections()[1].resumed);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn malformed_frames_and_posts_are_skipped_without_dropping_the_socket() {
    let fake = FakeMattermost::start(TOKEN).await;
    let a = adapter(&fake);
    let mut run = spawn(&a);
    run.live().await;
    fake.push_raw_frame("{this is not json");
    fake.push_raw_frame("[1, 2, 3]");
    fake.push_event("posted", json!({"channel_type": "D", "post": "{broken"}));
    fake.push_event("posted", json!({"channel_type": "D", "post": 42}));
    fake.push_event("typing", json!({"parent_id": ""}));
    fake.push(NewPost::dm("alice", "still here"));
    assert_eq!(run.next().await.text, "still here");
    assert_eq!(fake.connections().len(), 1);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn typing_is_shown_in_the_channel_and_thread() {
    let fake = FakeMattermost::start(TOKEN).await;
    let a = adapter(&fake);
    let mut run = spawn(&a);
    run.live().await;
    a.typing("town", Some("root1")).await.unwrap();
    a.typing("dmalice", None).await.unwrap();
    let t = fake.wait_for_typing(2, WAIT).await;
    assert_eq!(t[0].user_id, fake.bot_id());
    assert_eq!(t[0].channel_id, "town");
    assert_eq!(t[0].parent_id.as_deref(), Some("root1"));
    assert_eq!(t[1].parent_id, None);
    run.stop().await.unwrap();
}

// --- Media (issue 22) ---

/// Small real files, made here: a 1×1 PNG, the first page of an Ogg/Opus
/// stream (what a voice note starts with; nothing decodes it here) and a
/// minimal PDF.
mod samples {
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

    fn chunk(out: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut tagged = kind.to_vec();
        tagged.extend_from_slice(data);
        out.extend_from_slice(&tagged);
        out.extend_from_slice(&crc32(&tagged).to_be_bytes());
    }

    /// A 1×1 opaque red PNG (zlib with one stored block).
    pub fn png() -> Vec<u8> {
        let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&1u32.to_be_bytes());
        ihdr.extend_from_slice(&1u32.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        chunk(&mut out, b"IHDR", &ihdr);
        let raw = [0u8, 255, 0, 0]; // filter byte, then one RGB pixel
        let (mut a, mut b) = (1u32, 0u32);
        for &x in &raw {
            a = (a + u32::from(x)) % 65521;
            b = (b + a) % 65521;
        }
        let mut z = vec![
            0x78,
            0x01,
            0x01,
            raw.len() as u8,
            0,
            !(raw.len() as u8),
            0xff,
        ];
        z.extend_from_slice(&raw);
        z.extend_from_slice(&((b << 16) | a).to_be_bytes());
        chunk(&mut out, b"IDAT", &z);
        chunk(&mut out, b"IEND", &[]);
        out
    }

    /// An Ogg page holding an `OpusHead` packet.
    pub fn ogg_opus() -> Vec<u8> {
        let head = b"OpusHead\x01\x01\x38\x01\x80\xbb\x00\x00\x00\x00\x00";
        let mut page = b"OggS\x00\x02".to_vec();
        page.extend_from_slice(&[0; 8]); // granule position
        page.extend_from_slice(&1u32.to_le_bytes()); // stream serial
        page.extend_from_slice(&0u32.to_le_bytes()); // page sequence
        page.extend_from_slice(&[0; 4]); // checksum (unchecked here)
        page.push(1);
        page.push(head.len() as u8);
        page.extend_from_slice(head);
        page
    }

    /// A one-page PDF with no content.
    pub fn pdf() -> Vec<u8> {
        b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 10 10]>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n".to_vec()
    }
}

use talaria_adapter::{AttachmentSource, DownloadError, MediaKind, OutboundFile};
use tokio::io::AsyncReadExt;

/// Everything a download hands over.
async fn fetch(a: &MattermostAdapter, locator: &str) -> Result<Vec<u8>, DownloadError> {
    let mut d = a.download(locator).await?;
    let mut bytes = Vec::new();
    d.reader.read_to_end(&mut bytes).await.unwrap();
    if let Some(len) = d.length {
        assert_eq!(len, bytes.len() as u64, "Content-Length matches the body");
    }
    Ok(bytes)
}

fn locator(ev: &MessageEvent, i: usize) -> String {
    match &ev.attachments[i].source {
        AttachmentSource::Remote(l) => l.clone(),
        other => panic!("not a remote attachment: {other:?}"),
    }
}

/// A file on disk for `send_file`.
fn outbound(
    dir: &tempfile::TempDir,
    chat: &str,
    name: &str,
    bytes: &[u8],
    kind: MediaKind,
    mime: &str,
) -> OutboundFile {
    let path = dir.path().join(name);
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
async fn inbound_files_are_typed_from_their_info_and_download_their_exact_bytes() {
    let fake = FakeMattermost::start(TOKEN).await;
    let a = adapter(&fake);
    let mut run = spawn(&a);
    run.live().await;
    let (png, ogg, pdf) = (samples::png(), samples::ogg_opus(), samples::pdf());
    let chan = "dmuser1";
    let p = fake.add_file(chan, "cat.png", "image/png", &png);
    let v = fake.add_file(chan, "voice.ogg", "audio/ogg", &ogg);
    let d = fake.add_file(chan, "report.pdf", "application/pdf", &pdf);
    fake.push(NewPost::dm("user1", "look").with_files(&[&p, &v, &d]));
    let ev = run.next().await;
    assert_eq!(ev.text, "look");
    assert_eq!(ev.attachments.len(), 3);
    let kinds: Vec<MediaKind> = ev.attachments.iter().map(|a| a.kind).collect();
    assert_eq!(
        kinds,
        [MediaKind::Image, MediaKind::Audio, MediaKind::Document]
    );
    assert_eq!(ev.attachments[0].name.as_deref(), Some("cat.png"));
    assert_eq!(ev.attachments[0].mime.as_deref(), Some("image/png"));
    assert_eq!(ev.attachments[2].size, Some(pdf.len() as u64));
    assert_eq!(fetch(&a, &locator(&ev, 0)).await.unwrap(), png);
    assert_eq!(fetch(&a, &locator(&ev, 1)).await.unwrap(), ogg);
    assert_eq!(fetch(&a, &locator(&ev, 2)).await.unwrap(), pdf);
    let gets: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/api/v4/files/"))
        .collect();
    assert_eq!(gets.len(), 3);
    assert!(gets.iter().all(|r| r.authorized && r.method == "GET"));

    // A file-only post is still an event.
    let only = fake.add_file(chan, "a.png", "image/png", &png);
    fake.push(NewPost::dm("user1", "").with_files(&[&only]));
    let ev = run.next().await;
    assert_eq!(ev.attachments.len(), 1);
    run.stop().await.unwrap();
}

#[tokio::test]
async fn missing_files_are_gone_and_addresses_are_never_fetched() {
    let fake = FakeMattermost::start(TOKEN).await;
    let a = adapter(&fake);
    let err = fetch(&a, "nosuchfile0000000000000000").await.unwrap_err();
    assert!(matches!(err, DownloadError::Gone(_)), "{err:?}");
    assert!(!err.to_string().contains(TOKEN));
    let before = fake.requests().len();
    for foreign in [
        "https://evil.example/file",
        "../users/me",
        "abc/../../x",
        "",
    ] {
        match fetch(&a, foreign).await.unwrap_err() {
            DownloadError::Gone(why) => {
                assert!(why.contains("not a Mattermost file address"), "{why}")
            }
            other => panic!("{foreign}: {other:?}"),
        }
    }
    assert_eq!(
        fake.requests().len(),
        before,
        "no request for a foreign address"
    );
}

#[tokio::test]
async fn files_are_uploaded_as_multipart_then_posted_with_their_ids() {
    let fake = FakeMattermost::start(TOKEN).await;
    fake.add_channel("chan1", "O");
    let root = fake.push(NewPost::channel("chan1", "user1", "@talaria-bot hi"));
    let a = adapter(&fake);
    let dir = tempfile::tempdir().unwrap();
    let (png, ogg, pdf) = (samples::png(), samples::ogg_opus(), samples::pdf());

    let mut photo = outbound(
        &dir,
        "chan1",
        "chart.png",
        &png,
        MediaKind::Image,
        "image/png",
    );
    photo.caption = Some("the chart".into());
    photo.thread_id = Some(root.clone());
    let sent = a.send_file(&photo).await.unwrap();
    let voice = outbound(
        &dir,
        "chan1",
        "answer.ogg",
        &ogg,
        MediaKind::Voice,
        "audio/ogg",
    );
    a.send_file(&voice).await.unwrap();
    let doc = outbound(
        &dir,
        "chan1",
        "report.pdf",
        &pdf,
        MediaKind::Document,
        "application/pdf",
    );
    a.send_file(&doc).await.unwrap();

    let uploads = fake.uploads();
    assert_eq!(uploads.len(), 3);
    let expect = [
        ("chart.png", "image/png", &png),
        ("answer.ogg", "audio/ogg", &ogg),
        ("report.pdf", "application/pdf", &pdf),
    ];
    for (u, (name, mime, bytes)) in uploads.iter().zip(expect) {
        assert_eq!(u.fields, ["channel_id", "files"]);
        assert_eq!(u.channel_id, "chan1");
        assert_eq!(u.filename, name);
        assert_eq!(u.content_type.as_deref(), Some(mime));
        assert_eq!(&u.bytes, bytes);
    }
    let posts = fake.posts();
    assert_eq!(posts.len(), 3);
    assert_eq!(sent.message_id.as_deref(), Some(posts[0].id.as_str()));
    assert_eq!(posts[0].message, "the chart");
    assert_eq!(posts[0].root_id.as_deref(), Some(root.as_str()));
    assert_eq!(posts[0].file_ids, [uploads[0].file_id.clone()]);
    assert_eq!(posts[1].message, "", "no caption, no text");
    assert_eq!(posts[1].root_id, None);
    assert_eq!(posts[1].file_ids, [uploads[1].file_id.clone()]);
    assert_eq!(posts[2].file_ids, [uploads[2].file_id.clone()]);
    // What was uploaded can be fetched back.
    assert_eq!(fetch(&a, &uploads[2].file_id).await.unwrap(), pdf);
}

#[tokio::test]
async fn refused_uploads_are_rejected_and_nothing_is_posted() {
    let fake = FakeMattermost::start(TOKEN).await;
    fake.add_channel("chan1", "O");
    let a = adapter(&fake);
    let dir = tempfile::tempdir().unwrap();
    let doc = outbound(
        &dir,
        "chan1",
        "report.pdf",
        &samples::pdf(),
        MediaKind::Document,
        "application/pdf",
    );
    fake.set_max_file_size(10);
    match a.send_file(&doc).await {
        Err(SendError::Rejected(why)) => assert!(why.contains("413"), "{why}"),
        other => panic!("{other:?}"),
    }
    fake.set_max_file_size(1 << 20);
    let elsewhere = OutboundFile {
        chat_id: "nochannel".into(),
        ..doc.clone()
    };
    assert!(matches!(
        a.send_file(&elsewhere).await,
        Err(SendError::Rejected(_))
    ));
    let mut gone = doc.clone();
    gone.path = dir.path().join("missing.pdf");
    assert!(matches!(
        a.send_file(&gone).await,
        Err(SendError::Rejected(_))
    ));
    assert!(fake.posts().is_empty());
    let bad = MattermostAdapter::new(settings(&fake, "wrongtoken")).unwrap();
    let err = bad.send_file(&doc).await.unwrap_err();
    assert!(!format!("{err:?}").contains("wrongtoken"));
}
