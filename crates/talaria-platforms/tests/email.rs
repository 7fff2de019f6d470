//! The e-mail adapter on its own against real Dovecot (IMAP) and SMTP
//! servers on loopback: what it hands to the inbox, when it marks mail
//! `\Seen`, how replies are threaded, and how failures are reported.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use talaria_gateway::{
    Adapter, AdapterContext, AdapterError, Inbox, LivenessReporter, MessageEvent, OutboundMessage,
    SendError,
};
use talaria_platforms::email::MailTls;
use talaria_platforms::email::{EmailAdapter, EmailSettings, Endpoint};
use talaria_store::CursorStore;
use talaria_testkit::MailServer;
use talaria_testkit::email::{ADDRESS, PASSWORD};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

/// Cursors in memory, shared between adapters like the store would be.
#[derive(Default)]
struct MemCursors(Mutex<HashMap<(String, String), String>>);

#[async_trait]
impl CursorStore for MemCursors {
    async fn cursor(&self, p: &str, n: &str) -> talaria_store::Result<Option<String>> {
        Ok(self.0.lock().unwrap().get(&(p.into(), n.into())).cloned())
    }
    async fn set_cursor(&self, p: &str, n: &str, v: &str) -> talaria_store::Result<()> {
        self.0
            .lock()
            .unwrap()
            .insert((p.into(), n.into()), v.into());
        Ok(())
    }
    async fn delete_cursor(&self, p: &str, n: &str) -> talaria_store::Result<bool> {
        Ok(self
            .0
            .lock()
            .unwrap()
            .remove(&(p.to_owned(), n.to_owned()))
            .is_some())
    }
}

async fn servers() -> MailServer {
    tokio::task::spawn_blocking(MailServer::start)
        .await
        .unwrap()
}

fn settings(mail: &MailServer, password: &str) -> EmailSettings {
    EmailSettings {
        address: ADDRESS.into(),
        password: password.into(),
        imap: Endpoint {
            host: "127.0.0.1".into(),
            port: mail.imap_port(),
            tls: MailTls::None,
        },
        smtp: Endpoint {
            host: "127.0.0.1".into(),
            port: mail.smtp_port(),
            tls: MailTls::None,
        },
        mailbox: "INBOX".into(),
        poll_interval: Duration::from_millis(200),
        use_idle: false,
        timeout: Duration::from_secs(10),
    }
}

struct Running {
    events: mpsc::Receiver<MessageEvent>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), AdapterError>>,
    liveness: LivenessReporter,
}

impl Running {
    async fn next(&mut self) -> MessageEvent {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("no event in time")
            .expect("inbox closed")
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let r = tokio::time::timeout(WAIT, self.task)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r, Ok(()));
    }

    async fn wait_live(&self) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.liveness.get() != talaria_gateway::Liveness::Live {
            assert!(tokio::time::Instant::now() < deadline, "never live");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn run(adapter: Arc<EmailAdapter>) -> Running {
    let (inbox, events) = Inbox::channel(16);
    let (liveness, _watch) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let ctx = AdapterContext {
        inbox,
        liveness: liveness.clone(),
        shutdown: shutdown.clone(),
    };
    let task = tokio::spawn(async move { adapter.run(ctx).await });
    Running {
        events,
        shutdown,
        task,
        liveness,
    }
}

async fn wait_seen(mail: &MailServer, uid: u32) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !mail.flags(uid).contains("\\Seen") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            mail.flags(uid)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_hands_over_new_mail_and_marks_it_seen_after() {
    let mail = servers().await;
    let cursors = Arc::new(MemCursors::default());
    let old = mail.deliver_text("alice@example.org", "Old", "old@x", "history");
    let adapter = Arc::new(EmailAdapter::new(settings(&mail, PASSWORD), cursors.clone()).unwrap());
    assert_eq!(
        adapter.credential(),
        Some((
            "email-imap",
            format!("{ADDRESS}@127.0.0.1:{}/INBOX", mail.imap_port())
        ))
    );
    let mut running = run(adapter.clone());
    running.wait_live().await;
    let uid = mail.deliver(
        "From: Alice <Alice@Example.org>\nTo: bot@example.test\nSubject: Files\n\
         Message-ID: <files@example.org>\nMIME-Version: 1.0\n\
         Content-Type: multipart/mixed; boundary=\"b\"\n\n--b\nContent-Type: text/html\n\n\
         <p>See <b>attached</b></p>\n--b\nContent-Type: image/png\n\
         Content-Disposition: attachment; filename=\"chart.png\"\n\
         Content-Transfer-Encoding: base64\n\niVBORw0KGgo=\n--b--\n",
    );
    let event = running.next().await;
    let validity = mail.uid_validity();
    assert_eq!(event.message_id, Some(format!("{validity}:{uid}")));
    assert_eq!(event.source.platform, "email");
    assert_eq!(event.source.chat_id, "alice@example.org");
    assert_eq!(event.source.user_id.as_deref(), Some("alice@example.org"));
    assert_eq!(event.source.user_name.as_deref(), Some("Alice"));
    let thread = event.source.thread_id.clone().unwrap();
    assert!(thread.starts_with("mail_"), "{thread}");
    talaria_core::ids::validate_path_component(&thread).unwrap();
    assert!(
        event.text.starts_with("Subject: Files\n\n"),
        "{}",
        event.text
    );
    assert!(event.text.contains("See attached"), "{}", event.text);
    assert!(!event.text.contains("chart.png"), "{}", event.text);
    // This adapter has no media cache: the file is named, not kept.
    let [chart] = event.attachments.as_slice() else {
        panic!("{:?}", event.attachments)
    };
    assert_eq!(chart.name.as_deref(), Some("chart.png"));
    assert_eq!(chart.size, Some(8));
    assert!(
        matches!(&chart.source, talaria_adapter::AttachmentSource::Refused(why) if why.contains("no media cache")),
        "{chart:?}"
    );
    wait_seen(&mail, uid).await;
    assert!(
        !mail.flags(old).contains("\\Seen"),
        "mail from before the first start is left alone"
    );
    let saved = cursors
        .cursor("email", &format!("uid:{ADDRESS}:INBOX"))
        .await
        .unwrap();
    assert_eq!(saved, Some(format!("{validity}:{uid}")));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_marked_seen_before_the_inbox_takes_it() {
    let mail = servers().await;
    let cursors = Arc::new(MemCursors::default());
    let adapter = Arc::new(EmailAdapter::new(settings(&mail, PASSWORD), cursors.clone()).unwrap());
    // An inbox of one: the second mail waits in `submit` until the test
    // reads the first.
    let (inbox, mut events) = Inbox::channel(1);
    let (liveness, _watch) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let ctx = AdapterContext {
        inbox,
        liveness: liveness.clone(),
        shutdown: shutdown.clone(),
    };
    let a = adapter.clone();
    let task = tokio::spawn(async move { a.run(ctx).await });
    let deadline = tokio::time::Instant::now() + WAIT;
    while liveness.get() != talaria_gateway::Liveness::Live {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = mail.deliver_text("a@example.org", "1", "one@x", "one");
    let second = mail.deliver_text("a@example.org", "2", "two@x", "two");
    let third = mail.deliver_text("a@example.org", "3", "three@x", "three");
    wait_seen(&mail, first).await;
    // The first is in the channel, the second waits in `submit`.
    assert!(!mail.flags(second).contains("\\Seen"));
    assert!(!mail.flags(third).contains("\\Seen"));
    let e1 = events.recv().await.unwrap();
    assert!(e1.text.ends_with("one"));
    let e2 = events.recv().await.unwrap();
    assert!(e2.text.ends_with("two"));
    wait_seen(&mail, second).await;
    let e3 = tokio::time::timeout(WAIT, events.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(e3.text.ends_with("three"));
    shutdown.cancel();
    assert_eq!(task.await.unwrap(), Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_thread_after_a_restart_and_fresh_mail_has_its_own_subject() {
    let mail = servers().await;
    let cursors = Arc::new(MemCursors::default());
    let adapter = Arc::new(EmailAdapter::new(settings(&mail, PASSWORD), cursors.clone()).unwrap());
    let mut running = run(adapter.clone());
    running.wait_live().await;
    mail.deliver(
        "From: carol@example.org\nTo: bot@example.test\nSubject: =?UTF-8?Q?Gr=C3=BC=C3=9Fe?=\n\
         Message-ID: <c2@example.org>\nIn-Reply-To: <c1@example.org>\n\
         References: <c0@example.org> <c1@example.org>\n\nhello again",
    );
    let event = running.next().await;
    running.stop().await;
    assert_eq!(
        event.text, "hello again",
        "a reply's subject is not repeated"
    );

    // A new adapter (a new process) sharing the store answers the mail.
    let later = EmailAdapter::new(settings(&mail, PASSWORD), cursors.clone()).unwrap();
    later
        .send(&OutboundMessage {
            chat_id: event.source.chat_id.clone(),
            thread_id: event.source.thread_id.clone(),
            reply_to: event.message_id.clone(),
            text: "Grüße zurück".into(),
            choices: Vec::new(),
        })
        .await
        .unwrap();
    // A later part of the same answer carries only the thread.
    later
        .send(&OutboundMessage {
            chat_id: event.source.chat_id.clone(),
            thread_id: event.source.thread_id.clone(),
            reply_to: None,
            text: "part two".into(),
            choices: Vec::new(),
        })
        .await
        .unwrap();
    // A scheduled message answers nothing.
    let sent_id = later
        .send(&OutboundMessage {
            chat_id: "carol@example.org".into(),
            thread_id: None,
            reply_to: None,
            text: "Daily report\nAll is well.".into(),
            choices: Vec::new(),
        })
        .await
        .unwrap()
        .message_id
        .unwrap();
    let sent = mail.wait_for_sent(3, WAIT).await;
    for m in &sent[..2] {
        assert_eq!(m.subject, "Re: Grüße");
        assert_eq!(m.in_reply_to.as_deref(), Some("c2@example.org"));
        assert_eq!(
            m.references,
            vec!["c0@example.org", "c1@example.org", "c2@example.org"]
        );
        assert_eq!(m.mail_from, ADDRESS);
    }
    assert_eq!(sent[0].text.trim_end(), "Grüße zurück");
    assert_eq!(sent[2].subject, "Daily report");
    assert_eq!(sent[2].in_reply_to, None);
    assert!(sent[2].references.is_empty());
    assert_eq!(sent[2].message_id.as_deref(), Some(sent_id.as_str()));
    assert!(sent_id.ends_with("@example.test"), "{sent_id}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_fatal_for_run_and_unavailable_for_send() {
    let mail = servers().await;
    let adapter = Arc::new(
        EmailAdapter::new(
            settings(&mail, "wrong-password-xyz"),
            Arc::new(MemCursors::default()),
        )
        .unwrap(),
    );
    let running = run(adapter.clone());
    let r = tokio::time::timeout(WAIT, running.task)
        .await
        .unwrap()
        .unwrap();
    let Err(AdapterError::Fatal(why)) = r else {
        panic!("{r:?}")
    };
    assert!(why.contains(ADDRESS), "{why}");
    assert!(!why.contains("wrong-password-xyz"), "{why}");
    let err = adapter
        .send(&OutboundMessage {
            chat_id: "alice@example.org".into(),
            thread_id: None,
            reply_to: None,
            text: "hi".into(),
            choices: Vec::new(),
        })
        .await
        .unwrap_err();
    assert!(matches!(err, SendError::Unavailable(_)), "{err:?}");
    assert!(mail.sent().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_servers_and_bad_recipients() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let closed = Endpoint {
        host: "127.0.0.1".into(),
        port,
        tls: MailTls::None,
    };
    let s = EmailSettings {
        address: ADDRESS.into(),
        password: PASSWORD.into(),
        imap: closed.clone(),
        smtp: closed,
        mailbox: "INBOX".into(),
        poll_interval: Duration::from_secs(1),
        use_idle: true,
        timeout: Duration::from_secs(5),
    };
    let adapter = Arc::new(EmailAdapter::new(s, Arc::new(MemCursors::default())).unwrap());
    let running = run(adapter.clone());
    let r = tokio::time::timeout(WAIT, running.task)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(r, Err(AdapterError::Disconnected(_))), "{r:?}");
    let out = |to: &str| OutboundMessage {
        chat_id: to.into(),
        thread_id: None,
        reply_to: None,
        text: "hi".into(),
        choices: Vec::new(),
    };
    let err = adapter.send(&out("alice@example.org")).await.unwrap_err();
    assert!(matches!(err, SendError::Unavailable(_)), "{err:?}");
    let err = adapter.send(&out("not an address")).await.unwrap_err();
    assert!(matches!(err, SendError::Rejected(_)), "{err:?}");
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

/// One MIME part of a test mail: the file base64'd in lines.
fn part(content_type: &str, name: &str, bytes: &[u8]) -> String {
    use base64::Engine;
    let data = base64::engine::general_purpose::STANDARD.encode(bytes);
    let lines: Vec<&str> = data
        .as_bytes()
        .chunks(76)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "--b\nContent-Type: {content_type}; name=\"{name}\"\n\
         Content-Disposition: attachment; filename=\"{name}\"\n\
         Content-Transfer-Encoding: base64\n\n{}\n",
        lines.join("\n")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attachments_are_stored_in_the_media_cache_at_intake() {
    use talaria_adapter::{AttachmentSource, MediaKind};
    let mail = servers().await;
    let dir = tempfile::tempdir().unwrap();
    let cache = talaria_media::MediaCache::new(dir.path().join("media"), 1000);
    let adapter = Arc::new(
        EmailAdapter::new(settings(&mail, PASSWORD), Arc::new(MemCursors::default()))
            .unwrap()
            .with_media(cache),
    );
    let mut running = run(adapter.clone());
    running.wait_live().await;
    let ogg = ogg_opus();
    let big = vec![7u8; 1500];
    let raw = format!(
        "From: Alice <alice@example.org>\nTo: bot@example.test\nSubject: Files\n\
         Message-ID: <media@example.org>\nMIME-Version: 1.0\n\
         Content-Type: multipart/mixed; boundary=\"b\"\n\n\
         --b\nContent-Type: text/plain\n\nThree files\n{}{}{}{}--b--\n",
        part("image/png", "chart.png", &PNG),
        part("audio/ogg", "note.ogg", &ogg),
        part("application/pdf", "q3.pdf", PDF),
        part("application/octet-stream", "big.bin", &big),
    );
    mail.deliver(&raw);
    let event = running.next().await;
    assert_eq!(event.text.trim(), "Subject: Files\n\nThree files");
    let got: Vec<_> = event
        .attachments
        .iter()
        .map(|a| (a.name.as_deref(), a.mime.as_deref(), a.size))
        .collect();
    assert_eq!(
        got,
        [
            (Some("chart.png"), Some("image/png"), Some(73)),
            (Some("note.ogg"), Some("audio/ogg"), Some(ogg.len() as u64)),
            (
                Some("q3.pdf"),
                Some("application/pdf"),
                Some(PDF.len() as u64)
            ),
            (
                Some("big.bin"),
                Some("application/octet-stream"),
                Some(1500)
            ),
        ]
    );
    for (attachment, want, kind) in event
        .attachments
        .iter()
        .zip([&PNG[..], &ogg, PDF])
        .map(|(a, w)| (a, w, a.kind))
    {
        let AttachmentSource::Cached(stored) = &attachment.source else {
            panic!("stored at intake: {attachment:?}")
        };
        assert!(stored.path.starts_with(dir.path()), "{stored:?}");
        assert_eq!(std::fs::read(&stored.path).unwrap(), want);
        assert_eq!(stored.kind, kind);
    }
    assert_eq!(event.attachments[0].kind, MediaKind::Image);
    assert_eq!(event.attachments[2].kind, MediaKind::Document);
    let AttachmentSource::Refused(why) = &event.attachments[3].source else {
        panic!("over the limit: {:?}", event.attachments[3])
    };
    assert!(why.contains("too large"), "{why}");
    // Nothing to fetch later: the bytes came with the mail.
    assert!(matches!(
        adapter.download("anything").await,
        Err(talaria_adapter::DownloadError::Unsupported)
    ));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_go_out_attached_to_a_threaded_reply() {
    use talaria_adapter::{MediaKind, OutboundFile};
    let mail = servers().await;
    let adapter = Arc::new(
        EmailAdapter::new(settings(&mail, PASSWORD), Arc::new(MemCursors::default())).unwrap(),
    );
    let mut running = run(adapter.clone());
    running.wait_live().await;
    mail.deliver_text(
        "alice@example.org",
        "Numbers",
        "ask@example.org",
        "Send me the chart",
    );
    let event = running.next().await;
    running.stop().await;
    let dir = tempfile::tempdir().unwrap();
    let ogg = ogg_opus();
    let file = |name: &str, bytes: &[u8], kind: MediaKind, mime: &str, caption: Option<&str>| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        OutboundFile {
            chat_id: event.source.chat_id.clone(),
            thread_id: event.source.thread_id.clone(),
            reply_to: event.message_id.clone(),
            path,
            kind,
            mime: mime.to_owned(),
            name: name.to_owned(),
            caption: caption.map(str::to_owned),
        }
    };
    let files = [
        file(
            "chart.png",
            &PNG,
            MediaKind::Image,
            "image/png",
            Some("Here it is"),
        ),
        file("reply.ogg", &ogg, MediaKind::Voice, "audio/ogg", None),
        file("q3.pdf", PDF, MediaKind::Document, "application/pdf", None),
    ];
    let mut ids = Vec::new();
    for f in &files {
        ids.push(adapter.send_file(f).await.unwrap().message_id.unwrap());
    }
    let sent = mail.wait_for_sent(3, WAIT).await;
    for ((m, f), id) in sent.iter().zip(&files).zip(&ids) {
        assert_eq!(m.content_type, "multipart/mixed");
        assert_eq!(m.rcpt_to, ["alice@example.org"]);
        assert_eq!(m.subject, "Re: Numbers");
        assert_eq!(m.in_reply_to.as_deref(), Some("ask@example.org"));
        assert_eq!(m.references, ["ask@example.org"]);
        assert_eq!(m.message_id.as_deref(), Some(id.as_str()));
        let [a] = m.attachments.as_slice() else {
            panic!("one attachment: {:?}", m.attachments)
        };
        assert_eq!(a.name.as_deref(), Some(f.name.as_str()));
        assert_eq!(a.content_type, f.mime);
        assert_eq!(a.disposition.as_deref(), Some("attachment"));
        assert_eq!(a.bytes, std::fs::read(&f.path).unwrap());
    }
    assert_eq!(sent[0].text.trim_end(), "Here it is");
    assert_eq!(sent[1].text.trim_end(), "Attached: reply.ogg");
    // A file that cannot be read is refused, nothing sent.
    let missing = OutboundFile {
        path: dir.path().join("absent.pdf"),
        ..files[2].clone()
    };
    assert!(matches!(
        adapter.send_file(&missing).await,
        Err(SendError::Rejected(_))
    ));
    assert_eq!(mail.sent().len(), 3);
    // Past 25 MiB the file is named in a text reply instead (sparse: never
    // read, nothing on disk).
    let huge = file(
        "huge.pdf",
        b"",
        MediaKind::Document,
        "application/pdf",
        None,
    );
    std::fs::File::options()
        .write(true)
        .open(&huge.path)
        .unwrap()
        .set_len(26 * 1024 * 1024)
        .unwrap();
    adapter.send_file(&huge).await.unwrap();
    let sent = mail.wait_for_sent(4, WAIT).await;
    assert_eq!(sent[3].content_type, "text/plain");
    assert!(sent[3].attachments.is_empty());
    assert!(
        sent[3]
            .text
            .contains("huge.pdf (application/pdf; email cannot carry this file)"),
        "{}",
        sent[3].text
    );
    assert_eq!(sent[3].in_reply_to.as_deref(), Some("ask@example.org"));
}
