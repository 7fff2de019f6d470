//! Real mail servers on 127.0.0.1 for the e-mail tests: Dovecot for IMAP
//! (a passwd-file user, Maildir storage, no TLS) and an aiosmtpd SMTP
//! server that requires a login and writes every mail it accepts to a
//! Maildir the test reads. Both come from Debian's packages
//! (`dovecot-imapd`, `python3-aiosmtpd`); a missing one fails the test
//! with the install line rather than skipping it.
//!
//! Each [`MailServer`] has its own temporary directory (configuration,
//! sockets, mail) and ports, and stops its servers when dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::wait::wait_within;

/// The bot's account on both servers.
pub const ADDRESS: &str = "bot@example.test";
/// Its password.
pub const PASSWORD: &str = "bot-password-0123";

const START_TIMEOUT: Duration = Duration::from_secs(20);

/// One mail the SMTP server accepted, decoded.
#[derive(Debug, Clone)]
pub struct SentMail {
    /// The envelope sender (`MAIL FROM`).
    pub mail_from: String,
    /// The envelope recipients (`RCPT TO`).
    pub rcpt_to: Vec<String>,
    /// The `From` header.
    pub from: String,
    /// The `To` header.
    pub to: String,
    /// The `Subject` header, decoded.
    pub subject: String,
    /// The `Message-ID` (no angle brackets), when set.
    pub message_id: Option<String>,
    /// The `In-Reply-To` (no angle brackets), when set.
    pub in_reply_to: Option<String>,
    /// The `References`, oldest first, without angle brackets.
    pub references: Vec<String>,
    /// The `Content-Type` (type/subtype).
    pub content_type: String,
    /// The body, decoded.
    pub text: String,
    /// The attached files, decoded from their MIME parts.
    pub attachments: Vec<MailAttachment>,
    /// The mail as received.
    pub raw: String,
}

/// One file attached to a mail the SMTP server accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailAttachment {
    /// Its file name (`Content-Disposition` `filename`, else the type's
    /// `name`).
    pub name: Option<String>,
    /// Its `Content-Type` (type/subtype).
    pub content_type: String,
    /// Its `Content-Disposition` type (`attachment`, `inline`).
    pub disposition: Option<String>,
    /// Its bytes, transfer-decoded.
    pub bytes: Vec<u8>,
}

/// Dovecot and the SMTP server, running until dropped.
pub struct MailServer {
    dir: tempfile::TempDir,
    dovecot: Child,
    smtp: Child,
    imap_port: u16,
    smtp_port: u16,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port on 127.0.0.1")
}

fn dovecot_binary() -> PathBuf {
    ["/usr/sbin/dovecot", "/usr/local/sbin/dovecot"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "Dovecot is not installed, and the e-mail tests need a real IMAP server: \
                 apt-get install -y dovecot-imapd"
            )
        })
}

fn python_with_aiosmtpd() -> PathBuf {
    for python in ["/usr/bin/python3", "python3"] {
        let ok = Command::new(python)
            .args(["-c", "import aiosmtpd"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return PathBuf::from(python);
        }
    }
    panic!(
        "aiosmtpd is not installed, and the e-mail tests need a real SMTP server: \
         apt-get install -y python3-aiosmtpd"
    )
}

const SMTP_SINK: &str = r#"
import signal, sys
from aiosmtpd.controller import Controller
from aiosmtpd.handlers import Mailbox
from aiosmtpd.smtp import AuthResult, LoginPassword

port, maildir, user, password = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]

def check(server, session, envelope, mechanism, auth_data):
    ok = (isinstance(auth_data, LoginPassword)
          and auth_data.login.decode() == user
          and auth_data.password.decode() == password)
    # handled=False: aiosmtpd then answers a failure with 535 itself.
    return AuthResult(success=ok, handled=False)

controller = Controller(Mailbox(maildir), hostname="127.0.0.1", port=port,
                        authenticator=check, auth_required=True,
                        auth_require_tls=False)
controller.start()
print("ready", flush=True)
signal.sigwait([signal.SIGTERM, signal.SIGINT])
controller.stop()
"#;

fn dovecot_config(dir: &Path, port: u16) -> String {
    let d = dir.display();
    format!(
        r#"base_dir = {d}/run
state_dir = {d}/state
instance_name = talaria-test-{port}
log_path = {d}/dovecot.log
protocols = imap
listen = 127.0.0.1
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
auth_failure_delay = 0
mailbox_idle_check_interval = 1 secs
mail_location = maildir:{d}/mail/%u
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {d}/passwd
}}
userdb {{
  driver = static
  args = uid=65534 gid=65534 home={d}/mail/%u
}}
service imap-login {{
  chroot =
  inet_listener imap {{
    address = 127.0.0.1
    port = {port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
service anvil {{
  chroot =
}}
"#
    )
}

fn chown_to_nobody(path: &Path) {
    std::os::unix::fs::chown(path, Some(65534), Some(65534)).unwrap_or_else(|e| {
        panic!(
            "cannot chown {} (the tests run as root): {e}",
            path.display()
        )
    });
}

/// Waits until `port` greets with a line starting with `prefix`.
fn wait_for_greeting(port: u16, prefix: &str, what: &str, log: &Path) {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(stream) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let mut line = String::new();
            if BufReader::new(stream).read_line(&mut line).is_ok() && line.starts_with(prefix) {
                return;
            }
        }
        if Instant::now() > deadline {
            panic!(
                "{what} did not start on 127.0.0.1:{port}; its log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl MailServer {
    /// Starts both servers with the bot's account ([`ADDRESS`],
    /// [`PASSWORD`]) and waits until they answer.
    pub fn start() -> MailServer {
        let dovecot_bin = dovecot_binary();
        let python = python_with_aiosmtpd();
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path();
        // Dovecot's mail processes run as nobody and must reach the mail.
        std::fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod temp dir");
        // Not `sent`: the SMTP sink creates its Maildir only where none exists.
        for sub in ["run", "state", "mail"] {
            std::fs::create_dir_all(root.join(sub)).expect("mkdir");
        }
        chown_to_nobody(&root.join("mail"));
        std::fs::write(
            root.join("passwd"),
            format!("{ADDRESS}:{{PLAIN}}{PASSWORD}:::::\n"),
        )
        .expect("write passwd");

        let imap_port = free_port();
        let conf = root.join("dovecot.conf");
        std::fs::write(&conf, dovecot_config(root, imap_port)).expect("write dovecot.conf");
        let dovecot = Command::new(&dovecot_bin)
            .arg("-F")
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(root.join("dovecot.stderr")).expect("log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", dovecot_bin.display()));

        let smtp_port = free_port();
        let script = root.join("smtp_sink.py");
        std::fs::write(&script, SMTP_SINK).expect("write smtp sink");
        let smtp = Command::new(&python)
            .arg(&script)
            .arg(smtp_port.to_string())
            .arg(root.join("sent"))
            .arg(ADDRESS)
            .arg(PASSWORD)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(root.join("smtp.log")).expect("log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));

        let server = MailServer {
            dir,
            dovecot,
            smtp,
            imap_port,
            smtp_port,
        };
        let root = server.dir.path();
        wait_for_greeting(imap_port, "* OK", "Dovecot", &root.join("dovecot.log"));
        wait_for_greeting(smtp_port, "220", "the SMTP server", &root.join("smtp.log"));
        server
    }

    /// `127.0.0.1:<port>` of the IMAP server.
    pub fn imap_host(&self) -> String {
        format!("127.0.0.1:{}", self.imap_port)
    }

    /// `127.0.0.1:<port>` of the SMTP server.
    pub fn smtp_host(&self) -> String {
        format!("127.0.0.1:{}", self.smtp_port)
    }

    /// The IMAP server's port on 127.0.0.1.
    pub fn imap_port(&self) -> u16 {
        self.imap_port
    }

    /// The SMTP server's port on 127.0.0.1.
    pub fn smtp_port(&self) -> u16 {
        self.smtp_port
    }

    /// A logged-in IMAP connection for the test's own look at the mailbox.
    pub fn imap(&self) -> RawImap {
        RawImap::login(self.imap_port, ADDRESS, PASSWORD)
    }

    /// Puts `raw` (an RFC 5322 message, `\n` or `\r\n` line ends) into the
    /// INBOX with APPEND and returns its UID.
    pub fn deliver(&self, raw: &str) -> u32 {
        let mut imap = self.imap();
        let uid = imap.append("INBOX", raw);
        imap.logout();
        uid
    }

    /// Delivers a simple text mail; returns its UID.
    pub fn deliver_text(&self, from: &str, subject: &str, message_id: &str, body: &str) -> u32 {
        self.deliver(&format!(
            "From: {from}\nTo: {ADDRESS}\nSubject: {subject}\nMessage-ID: <{message_id}>\n\
             Date: Fri, 4 Dec 2026 10:00:00 +0000\nContent-Type: text/plain; charset=utf-8\n\n{body}\n"
        ))
    }

    /// The mails the SMTP server accepted so far, oldest first.
    pub fn sent(&self) -> Vec<SentMail> {
        let mut files: Vec<(std::time::SystemTime, String, PathBuf)> = Vec::new();
        for sub in ["new", "cur"] {
            let Ok(entries) = std::fs::read_dir(self.dir.path().join("sent").join(sub)) else {
                continue;
            };
            for e in entries.flatten() {
                let modified = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .unwrap_or(std::time::UNIX_EPOCH);
                files.push((
                    modified,
                    e.file_name().to_string_lossy().into_owned(),
                    e.path(),
                ));
            }
        }
        // Maildir names start with the delivery time; the name breaks ties
        // within one clock tick.
        files.sort();
        files
            .into_iter()
            .filter_map(|(_, _, path)| std::fs::read(path).ok())
            .map(|raw| decode(&raw))
            .collect()
    }

    /// Waits until at least `n` mails were sent and returns them all.
    ///
    /// # Panics
    /// When `timeout` passes first (the message lists the subjects sent).
    pub async fn wait_for_sent(&self, n: usize, timeout: Duration) -> Vec<SentMail> {
        // The mails land in a maildir no change counter watches: poll it.
        wait_within(&format!("{n} sent mails"), timeout, || async {
            let sent = self.sent();
            if sent.len() >= n {
                Ok(sent)
            } else {
                Err(sent.into_iter().map(|m| m.subject).collect::<Vec<_>>())
            }
        })
        .await
    }

    /// The flags of the INBOX mail with `uid` (`\Seen` once the bot took it).
    pub fn flags(&self, uid: u32) -> String {
        let mut imap = self.imap();
        imap.command("EXAMINE INBOX");
        let out = imap.command(&format!("UID FETCH {uid} (FLAGS)"));
        imap.logout();
        out
    }

    /// The INBOX's UIDVALIDITY.
    pub fn uid_validity(&self) -> u32 {
        let mut imap = self.imap();
        let out = imap.command("STATUS INBOX (UIDVALIDITY)");
        imap.logout();
        out.split("UIDVALIDITY ")
            .nth(1)
            .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|s| s.parse().ok())
            .expect("UIDVALIDITY in the STATUS answer")
    }
}

impl Drop for MailServer {
    fn drop(&mut self) {
        // SIGTERM, so Dovecot's master takes its login, auth and mail
        // processes down with it.
        for child in [&mut self.dovecot, &mut self.smtp] {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
        }
        for child in [&mut self.dovecot, &mut self.smtp] {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() > deadline => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
    }
}

fn decode(raw: &[u8]) -> SentMail {
    let text = String::from_utf8_lossy(raw).into_owned();
    use mail_parser::MimeHeaders;
    let message = mail_parser::MessageParser::default()
        .parse(raw)
        .expect("the SMTP server stored a mail that does not parse");
    let header = |name: &str| {
        message
            .header_raw(name)
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    let ids = |v: &mail_parser::HeaderValue<'_>| -> Vec<String> {
        match v {
            mail_parser::HeaderValue::Text(t) => vec![t.to_string()],
            mail_parser::HeaderValue::TextList(l) => l.iter().map(|t| t.to_string()).collect(),
            _ => Vec::new(),
        }
    };
    let content_type = message
        .content_type()
        .map(|ct| format!("{}/{}", ct.ctype(), ct.subtype().unwrap_or("")))
        .unwrap_or_default();
    SentMail {
        mail_from: header("X-MailFrom"),
        rcpt_to: header("X-RcptTo")
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect(),
        from: header("From"),
        to: header("To"),
        subject: message.subject().unwrap_or_default().to_owned(),
        message_id: message.message_id().map(str::to_owned),
        in_reply_to: ids(message.in_reply_to()).into_iter().next(),
        references: ids(message.references()),
        content_type,
        text: message
            .body_text(0)
            .map(|t| t.into_owned())
            .unwrap_or_default(),
        attachments: message
            .attachments()
            .map(|part| MailAttachment {
                name: part.attachment_name().map(str::to_owned),
                content_type: part
                    .content_type()
                    .map(|ct| format!("{}/{}", ct.ctype(), ct.subtype().unwrap_or("")))
                    .unwrap_or_default(),
                disposition: part.content_disposition().map(|d| d.ctype().to_owned()),
                bytes: part.contents().to_vec(),
            })
            .collect(),
        raw: text,
    }
}

/// A minimal synchronous IMAP client for the test's side: tagged commands
/// and their untagged answers as text.
pub struct RawImap {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    tag: u32,
}

impl RawImap {
    /// Connects and logs in (panics on failure: the server is the test's).
    pub fn login(port: u16, user: &str, password: &str) -> RawImap {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to Dovecot");
        stream
            .set_read_timeout(Some(Duration::from_secs(15)))
            .expect("timeout");
        let writer = stream.try_clone().expect("clone");
        let mut imap = RawImap {
            reader: BufReader::new(stream),
            writer,
            tag: 0,
        };
        let mut greeting = String::new();
        imap.reader.read_line(&mut greeting).expect("greeting");
        let out = imap.command(&format!("LOGIN \"{user}\" \"{password}\""));
        assert!(out.contains(" OK"), "login refused: {out}");
        imap
    }

    /// Runs one command; returns everything the server answered, ending
    /// with the tagged line (which must be OK).
    pub fn command(&mut self, command: &str) -> String {
        self.tag += 1;
        let tag = format!("t{}", self.tag);
        self.writer
            .write_all(format!("{tag} {command}\r\n").as_bytes())
            .expect("write");
        self.read_until_tagged(&tag)
    }

    fn read_until_tagged(&mut self, tag: &str) -> String {
        let mut out = String::new();
        loop {
            let mut line = String::new();
            let n = self.reader.read_line(&mut line).expect("read");
            assert!(n > 0, "the IMAP server closed the connection: {out}");
            out.push_str(&line);
            // A literal `{n}` at the end of a line is followed by n bytes.
            if let Some(len) = line
                .trim_end()
                .strip_suffix('}')
                .and_then(|l| l.rsplit_once('{'))
                .and_then(|(_, n)| n.parse::<usize>().ok())
            {
                let mut buf = vec![0; len];
                self.reader.read_exact(&mut buf).expect("literal");
                out.push_str(&String::from_utf8_lossy(&buf));
                continue;
            }
            if line.starts_with(&format!("{tag} ")) {
                assert!(
                    line.starts_with(&format!("{tag} OK")),
                    "IMAP command failed: {out}"
                );
                return out;
            }
        }
    }

    /// APPENDs `raw` to `mailbox` and returns the new mail's UID.
    pub fn append(&mut self, mailbox: &str, raw: &str) -> u32 {
        let normalized = raw.replace("\r\n", "\n").replace('\n', "\r\n");
        self.tag += 1;
        let tag = format!("t{}", self.tag);
        self.writer
            .write_all(format!("{tag} APPEND {mailbox} {{{}+}}\r\n", normalized.len()).as_bytes())
            .expect("write");
        self.writer.write_all(normalized.as_bytes()).expect("write");
        self.writer.write_all(b"\r\n").expect("write");
        let out = self.read_until_tagged(&tag);
        out.split("APPENDUID ")
            .nth(1)
            .and_then(|s| s.split_whitespace().nth(1))
            .and_then(|s| s.trim_end_matches(']').parse().ok())
            .unwrap_or_else(|| panic!("no APPENDUID in {out}"))
    }

    /// Sends `LOGOUT` and closes the session; a failed write is ignored
    /// because the connection is dropped either way.
    pub fn logout(mut self) {
        let _ = self.writer.write_all(b"z LOGOUT\r\n");
    }
}

/// What the platform kit ([`crate::kit::email`]) asks of the servers
/// beyond the tests' own API.
impl MailServer {
    /// How many times the bot's account logged in to Dovecot so far (the
    /// gateway's logins and the test's own), from Dovecot's log.
    pub fn logins(&self) -> usize {
        let log = std::fs::read_to_string(self.dir.path().join("dovecot.log")).unwrap_or_default();
        log.matches(&format!("Login: user=<{ADDRESS}>")).count()
    }

    /// Cuts every IMAP session of the bot's account (`doveadm kick`), as
    /// a server restart or a network drop would.
    ///
    /// # Panics
    /// When `doveadm` cannot be run.
    pub fn kick(&self) {
        let status = Command::new("doveadm")
            .arg("-c")
            .arg(self.dir.path().join("dovecot.conf"))
            .args(["kick", ADDRESS])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("cannot run doveadm: {e}"));
        assert!(status.success(), "doveadm kick failed: {status}");
    }

    /// While `paused` holds, the SMTP server is stopped (SIGSTOP): a
    /// client's connection is taken by the system and never answered, so a
    /// send hangs. Clearing it lets the server go on (SIGCONT).
    ///
    /// # Errors
    /// When `kill` cannot be run or fails.
    pub fn pause_smtp(&self, paused: bool) -> std::io::Result<()> {
        let signal = if paused { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .arg(signal)
            .arg(self.smtp.id().to_string())
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("kill {signal}: {status}")))
        }
    }

    /// How many connections to the SMTP server are open or waiting to be
    /// taken: a send in progress, even while the server is paused.
    pub fn smtp_connections(&self) -> usize {
        // /proc/net/tcp: local address as HEX_IP:HEX_PORT, then the remote
        // one, then the state (01: established).
        let port = format!(":{:04X}", self.smtp_port);
        std::fs::read_to_string("/proc/net/tcp")
            .unwrap_or_default()
            .lines()
            .skip(1)
            .filter(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                fields.len() > 3 && fields[1].ends_with(&port) && fields[3] == "01"
            })
            .count()
    }
}
