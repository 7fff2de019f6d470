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
    assert!(
        event
            .text
            .ends_with("\n[attachments: chart.png (image/png, 8 bytes)]"),
        "{}",
        event.text
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
    };
    let err = adapter.send(&out("alice@example.org")).await.unwrap_err();
    assert!(matches!(err, SendError::Unavailable(_)), "{err:?}");
    let err = adapter.send(&out("not an address")).await.unwrap_err();
    assert!(matches!(err, SendError::Rejected(_)), "{err:?}");
}
