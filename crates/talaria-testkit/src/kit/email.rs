//! E-mail's kit: real Dovecot (IMAP) for the mailbox the gateway reads and
//! a real SMTP server that keeps what the gateway sends (see
//! [`crate::email`]).
//!
//! A "direct message" is a mail to the bot, answered to its sender. The
//! gateway holds one IMAP connection; it has connected when Dovecot logged
//! it in and it reads the mailbox: the kit then drops a probe mail from an
//! address on no list into the INBOX and waits until the gateway takes it
//! (marks it `\Seen`; the runner ignores its sender). A probe that arrived
//! before the gateway looked at the mailbox is history to it and never
//! taken, so the kit drops another until one is.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use talaria_adapter::MediaKind;

use super::{KitFile, Out, PlatformKit, Uploaded, Who};
use crate::MailServer;
use crate::email::{ADDRESS, PASSWORD};
use crate::wait::{WAIT, wait_for};

/// Who the probe mails come from: an address on no allowlist.
const PROBE_SENDER: &str = "kit-probe@example.invalid";
/// How long the kit waits for the gateway to take one probe before it
/// drops another.
const PROBE_PATIENCE: Duration = Duration::from_secs(3);

/// The mail servers, with a friend and a stranger writing to the bot.
pub struct EmailKit {
    /// The servers, for platform-specific tests; deliver through
    /// [`EmailKit::deliver`] so the kit can tell its logins from the
    /// gateway's.
    pub mail: MailServer,
    /// Logins to Dovecot the kit made itself.
    own_logins: AtomicUsize,
    /// Whether the SMTP server is paused ([`PlatformKit::hang_send`]).
    paused: AtomicBool,
    next_id: AtomicU64,
}

/// The address `who` writes from.
pub fn address(who: Who) -> &'static str {
    match who {
        Who::Friend => "alice@example.org",
        Who::Stranger => "mallory@example.net",
    }
}

impl PlatformKit for EmailKit {
    const NAME: &'static str = "email";
    // Every part of a long answer is a reply to the mail it answers.
    const DM_REPLY_QUOTES: bool = false;
    // A mail that answers none starts a thread, and a thread is a
    // conversation.
    const DMS_CONTINUE: bool = false;

    async fn start() -> EmailKit {
        let mail = match tokio::task::spawn_blocking(MailServer::start).await {
            Ok(mail) => mail,
            Err(e) => panic!("the mail servers did not start: {e}"),
        };
        EmailKit {
            mail,
            own_logins: AtomicUsize::new(0),
            paused: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
        }
    }

    /// An hour between polls: mail comes in through IDLE, in time for
    /// every wait.
    fn section(&self) -> String {
        format!(
            "  email:\n    imap_host: 127.0.0.1\n    imap_port: {}\n    imap_tls: none\n    \
             smtp_host: 127.0.0.1\n    smtp_port: {}\n    smtp_tls: none\n    \
             poll_interval_secs: 3600\n",
            self.mail.imap_port(),
            self.mail.smtp_port()
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        vec![
            ("EMAIL_ADDRESS".into(), ADDRESS.into()),
            ("EMAIL_PASSWORD".into(), PASSWORD.into()),
            ("EMAIL_ALLOWED_USERS".into(), address(Who::Friend).into()),
        ]
    }

    fn secret(&self) -> &str {
        PASSWORD
    }

    /// The gateway's logins: Dovecot's count less the kit's own (a login
    /// the kit is making may not be logged yet, so this never overcounts).
    fn connections(&self) -> usize {
        self.mail
            .logins()
            .saturating_sub(self.own_logins.load(Ordering::SeqCst))
    }

    async fn wait_connected(&self, n: usize) {
        wait_for(&format!("{n} gateway logins to the mailbox"), || async {
            let got = self.connections();
            if got >= n { Ok(()) } else { Err(got) }
        })
        .await;
        self.wait_reading().await;
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        let id = format!(
            "kit-{}@example.org",
            self.next_id.fetch_add(1, Ordering::Relaxed)
        );
        // No subject: the model reads the body as it is.
        self.deliver(&format!(
            "From: {}\nTo: {ADDRESS}\nSubject: \nMessage-ID: <{id}>\n\
             Date: Fri, 4 Dec 2026 10:00:00 +0000\nContent-Type: text/plain; charset=utf-8\n\n{text}\n",
            address(who)
        ));
        id
    }

    fn push_dm_file(&self, who: Who, file: &KitFile, caption: &str) -> String {
        let id = format!(
            "kit-{}@example.org",
            self.next_id.fetch_add(1, Ordering::Relaxed)
        );
        // A mail carries every kind the same way: a part of its type,
        // base64, in lines of 76 as RFC 2045 asks. A voice note is an
        // audio file its client attached.
        let encoded = base64::engine::general_purpose::STANDARD.encode(&file.bytes);
        let mut body = String::with_capacity(encoded.len() + encoded.len() / 76 * 2);
        for line in encoded.as_bytes().chunks(76) {
            body.push_str(&String::from_utf8_lossy(line));
            body.push('\n');
        }
        let (type_name, disposition) = match &file.name {
            Some(name) => (
                format!("; name=\"{name}\""),
                format!("attachment; filename=\"{name}\""),
            ),
            None => (String::new(), "attachment".to_owned()),
        };
        let boundary = format!("kit-boundary-{id}");
        self.deliver(&format!(
            "From: {from}\nTo: {ADDRESS}\nSubject: \nMessage-ID: <{id}>\n\
             Date: Fri, 4 Dec 2026 10:00:00 +0000\nMIME-Version: 1.0\n\
             Content-Type: multipart/mixed; boundary=\"{boundary}\"\n\n\
             --{boundary}\nContent-Type: text/plain; charset=utf-8\n\n{caption}\n\
             --{boundary}\nContent-Type: {mime}{type_name}\n\
             Content-Disposition: {disposition}\nContent-Transfer-Encoding: base64\n\n\
             {body}--{boundary}--\n",
            from = address(who),
            mime = file.mime,
        ));
        id
    }

    fn uploads(&self) -> Vec<Uploaded> {
        // A mail's attachment is shown by its type: an image inline or as
        // a picture, anything else as a file to open.
        self.mail
            .sent()
            .into_iter()
            .flat_map(|m| m.attachments)
            .map(|a| Uploaded {
                kind: match a.content_type.split('/').next().unwrap_or("") {
                    "image" => MediaKind::Image,
                    "audio" => MediaKind::Audio,
                    "video" => MediaKind::Video,
                    _ => MediaKind::Document,
                },
                name: a.name,
                bytes: a.bytes,
            })
            .collect()
    }

    fn dm_chat(&self, who: Who) -> String {
        address(who).to_owned()
    }

    fn sent(&self) -> Vec<Out> {
        let now = Instant::now();
        self.mail
            .sent()
            .into_iter()
            .map(|m| {
                let text = m.text.trim_end_matches(['\r', '\n']).to_owned();
                Out {
                    chat: m.rcpt_to.first().cloned().unwrap_or_default(),
                    // A mail thread is told by its headers, not a thread id.
                    thread: None,
                    text: text.clone(),
                    wire: text,
                    reply_to: m.in_reply_to,
                    // The SMTP server keeps no time: when the kit looked.
                    at: now,
                }
            })
            .collect()
    }

    async fn wait_sent(&self, n: usize) -> Vec<Out> {
        self.mail.wait_for_sent(n, WAIT).await;
        self.sent()
    }

    /// One per mail accepted, and one per connection to the SMTP server
    /// still open (a send under way, or hanging on a paused server).
    fn send_attempts(&self) -> Vec<Instant> {
        let n = self.mail.sent().len() + self.mail.smtp_connections();
        vec![Instant::now(); n]
    }

    async fn wait_send_attempts(&self, n: usize) {
        wait_for(&format!("{n} send attempts"), || async {
            let got = self.send_attempts().len();
            if got >= n { Ok(()) } else { Err(got) }
        })
        .await;
    }

    fn hang_send(&self, hang: bool) {
        if let Err(e) = self.mail.pause_smtp(hang) {
            panic!("cannot pause or resume the SMTP server: {e}");
        }
        self.paused.store(hang, Ordering::SeqCst);
    }

    async fn drop_connection(&self) {
        self.mail.kick();
    }
}

impl EmailKit {
    /// Puts `raw` (an RFC 5322 message) into the INBOX; returns its UID.
    pub fn deliver(&self, raw: &str) -> u32 {
        self.own_logins.fetch_add(1, Ordering::SeqCst);
        self.mail.deliver(raw)
    }

    /// Delivers a simple text mail; returns its UID.
    pub fn deliver_text(&self, from: &str, subject: &str, message_id: &str, body: &str) -> u32 {
        self.own_logins.fetch_add(1, Ordering::SeqCst);
        self.mail.deliver_text(from, subject, message_id, body)
    }

    /// The flags of the INBOX mail with `uid`.
    pub fn flags(&self, uid: u32) -> String {
        self.own_logins.fetch_add(1, Ordering::SeqCst);
        self.mail.flags(uid)
    }

    /// The INBOX's UIDVALIDITY.
    pub fn uid_validity(&self) -> u32 {
        self.own_logins.fetch_add(1, Ordering::SeqCst);
        self.mail.uid_validity()
    }

    /// Waits until a gateway takes a probe mail (see the module docs).
    async fn wait_reading(&self) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let id = format!(
                "kit-probe-{}@example.invalid",
                self.next_id.fetch_add(1, Ordering::Relaxed)
            );
            let uid = self.deliver_text(PROBE_SENDER, "probe", &id, "probe");
            let patience = tokio::time::Instant::now() + PROBE_PATIENCE;
            while tokio::time::Instant::now() < patience {
                if self.flags(uid).contains("\\Seen") {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "waited {WAIT:?} for the gateway to read the mailbox"
            );
        }
    }
}

impl Drop for EmailKit {
    /// A test that failed while sends hang leaves the SMTP server paused:
    /// let it go on, so it stops when the servers are dropped.
    fn drop(&mut self) {
        if self.paused.load(Ordering::SeqCst) {
            // Nothing to do about a failure here: the servers' own drop
            // kills what does not stop.
            let _ = self.mail.pause_smtp(false);
        }
    }
}
