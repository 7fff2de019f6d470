//! The Email adapter: IMAP in, SMTP out.
//!
//! [`EmailAdapter::run`] logs in to the IMAP server, selects the mailbox
//! and hands every new mail to the gateway's inbox, then waits for more:
//! with IDLE when the server offers it, by polling every
//! `poll_interval` otherwise. A mail's id is `<uidvalidity>:<uid>`, so a
//! mail fetched twice (a lost cursor, an overlapping fetch) is recognised
//! by the runner's inbound dedupe and starts one turn. Only after the
//! inbox took a mail is it marked `\Seen` and the highest UID handed over
//! saved in the [`CursorStore`]; a restart resumes after it. A first
//! start (no saved position, or a changed UIDVALIDITY) answers none of
//! the mail already there: it starts at the mailbox's UIDNEXT.
//!
//! Replies go out over SMTP as plain text from the bot's address, with
//! `In-Reply-To` and `References` set from the mail answered and its
//! subject behind one `Re: `. What a reply needs from the mail it answers
//! (Message-ID, References, subject) is saved before the mail is handed
//! over, under both the mail's id and its thread, in a fixed ring of
//! cursor slots (see [`ReplyContexts`]): bounded, and still there after a
//! restart.
//!
//! Files: a mail arrives whole, its attachments' bytes with it, so each
//! is stored in the media cache at intake and handed over as
//! [`AttachmentSource::Cached`] (or [`AttachmentSource::Refused`] with the
//! reason, when over `media.max_bytes`). A file goes out as a reply mail
//! (threaded like any reply) of `multipart/mixed`: the caption as the
//! text part, the file as an attachment part. lettre builds a mail in
//! memory, so an outgoing file is bounded by [`MAX_ATTACHMENT_BYTES`].

mod config;
mod imap;
pub mod parse;
mod reply;

use crate::registry::{BuildError, Built, Platform, Setup};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures::TryStreamExt;
use lettre::message::header::ContentType;
use lettre::message::{Mailbox, Message, MessageBuilder, MultiPart, SinglePart};
use lettre::transport::smtp::AsyncSmtpTransport;
use lettre::transport::smtp::authentication::Credentials;
use lettre::{Address, AsyncTransport, Tokio1Executor};
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Attachment, AttachmentSource, ChatType, Liveness,
    MediaKind, MessageEvent, MessageLimits, OutboundFile, OutboundMessage, SendError, SentMessage,
    SessionSource,
};
use talaria_adapter::{Capabilities, LengthUnit, SenderIds};
use talaria_core::MediaRef;
use talaria_core::config::text_or_env;
use talaria_core::{Env, Secret};
use talaria_media::{Hint, MediaCache};
use talaria_store::CursorStore;

use parse::{Inbound, MailPart, Skip};
use reply::{ReplyContext, ReplyContexts};

pub use config::{ENV, EmailConfig, MailTls};

/// The platform's name in keys, config and environment variables.
pub const PLATFORM: &str = "email";

/// The longest text sent in one mail, in characters (the limit of the
/// system this one descends from); longer answers go out as several mails.
pub const MAX_MESSAGE_LEN: usize = 50_000;

/// The largest file sent as an attachment. lettre builds the whole mail
/// in memory (no streaming body), and its base64 makes it a third larger;
/// 25 MiB is also what the large mail providers accept in one mail.
pub const MAX_ATTACHMENT_BYTES: u64 = 25 * 1024 * 1024;

/// How long an IDLE runs before it is renewed: servers may end one after
/// 30 minutes (RFC 2177), and a renewal also shows the connection lives.
const IDLE_RENEW: Duration = Duration::from_secs(9 * 60);

/// Fetches in a row, while the server keeps announcing new mail, before
/// the adapter waits (IDLE or the poll interval) anyway.
const MAX_FETCH_ROUNDS: u32 = 5;

/// One mail server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The host name or IP address (no brackets for IPv6).
    pub host: String,
    /// The TCP port.
    pub port: u16,
    /// Implicit TLS, STARTTLS, or plain text (loopback only).
    pub tls: MailTls,
}

impl Endpoint {
    fn is_loopback(&self) -> bool {
        crate::net::is_loopback(&self.host)
    }
}

/// What the adapter needs to connect.
#[derive(Debug, Clone)]
pub struct EmailSettings {
    /// The bot's address: the login on both servers and the `From`.
    pub address: String,
    /// Never logged.
    pub password: Secret,
    /// The IMAP server new mail is read from.
    pub imap: Endpoint,
    /// The SMTP server replies are sent through.
    pub smtp: Endpoint,
    /// The mailbox read for new mail.
    pub mailbox: String,
    /// Between checks for new mail when the server cannot IDLE.
    pub poll_interval: Duration,
    /// Use IDLE when the server offers it (tests turn it off to exercise
    /// polling).
    pub use_idle: bool,
    /// How long connecting, one IMAP command or one SMTP send may take.
    pub timeout: Duration,
}

/// `host` or `host:port` (`[v6]:port` too), with `default` for the port.
fn host_port(value: &str, default: u16) -> (String, u16) {
    let value = value.trim();
    if let Some(rest) = value.strip_prefix('[')
        && let Some((host, port)) = rest.split_once(']')
    {
        let port = port
            .strip_prefix(':')
            .and_then(|p| p.parse().ok())
            .unwrap_or(default);
        return (host.to_owned(), port);
    }
    match value.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => match port.parse() {
            Ok(p) => (host.to_owned(), p),
            Err(_) => (value.to_owned(), default),
        },
        _ => (value.to_owned(), default),
    }
}

impl EmailSettings {
    /// Settings from `platforms.email` and the environment, or `None` when
    /// e-mail is off: `enabled: false`, or no address, password, IMAP host
    /// or SMTP host (config, or `EMAIL_ADDRESS`, `EMAIL_PASSWORD`,
    /// `EMAIL_IMAP_HOST`, `EMAIL_SMTP_HOST`). A host may carry a port
    /// (`mail.example.com:1143`), which wins over `imap_port`/`smtp_port`.
    pub fn from_config(config: &EmailConfig, env: &Env) -> Option<EmailSettings> {
        if config.enabled == Some(false) {
            return None;
        }
        let address = text_or_env(config.address.as_deref(), env, "EMAIL_ADDRESS");
        // A password is taken as written: spaces at its ends may be part
        // of it, so it is not trimmed like the other values.
        let password = config
            .password
            .clone()
            .filter(|p| !p.expose().is_empty())
            .or_else(|| env.get("EMAIL_PASSWORD").map(Secret::new));
        let imap = text_or_env(config.imap_host.as_deref(), env, "EMAIL_IMAP_HOST");
        let smtp = text_or_env(config.smtp_host.as_deref(), env, "EMAIL_SMTP_HOST");
        let (Some(address), Some(password), Some(imap), Some(smtp)) =
            (address, password, imap, smtp)
        else {
            if config.enabled == Some(true) {
                tracing::warn!(
                    "platforms.email.enabled is true but the address, the password or a server \
                     is missing (EMAIL_ADDRESS, EMAIL_PASSWORD, EMAIL_IMAP_HOST, EMAIL_SMTP_HOST \
                     or their platforms.email keys)"
                );
            }
            return None;
        };
        let (imap_host, imap_port) = host_port(&imap, config.imap_port);
        let (smtp_host, smtp_port) = host_port(&smtp, config.smtp_port);
        Some(EmailSettings {
            address,
            password,
            imap: Endpoint {
                host: imap_host,
                port: imap_port,
                tls: config.imap_tls,
            },
            smtp: Endpoint {
                host: smtp_host,
                port: smtp_port,
                tls: config.smtp_tls,
            },
            mailbox: if config.mailbox.trim().is_empty() {
                "INBOX".to_owned()
            } else {
                config.mailbox.trim().to_owned()
            },
            poll_interval: Duration::from_secs(config.poll_interval_secs.max(1)),
            use_idle: true,
            timeout: Duration::from_secs(60),
        })
    }
}

/// Why the adapter could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmailError {
    /// `EMAIL_ADDRESS` is not an address.
    #[error("the e-mail address is not of the form name@domain: {0:?}")]
    BadAddress(String),
    /// A connection without TLS to another machine would send the
    /// password in the clear.
    #[error(
        "platforms.email.{0}_tls is `none`, which is only allowed for a loopback host, \
         not {1}; use `implicit` or `starttls`"
    )]
    InsecureTls(&'static str, String),
    /// The SMTP client could not be built.
    #[error("cannot set up the SMTP client: {0}")]
    Smtp(String),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where reading stands: the mailbox's UIDVALIDITY and the highest UID
/// handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Position {
    validity: u32,
    last_uid: u32,
}

impl Position {
    fn parse(value: &str) -> Option<Position> {
        let (v, u) = value.split_once(':')?;
        Some(Position {
            validity: v.parse().ok()?,
            last_uid: u.parse().ok()?,
        })
    }

    fn render(self) -> String {
        format!("{}:{}", self.validity, self.last_uid)
    }
}

/// The Email connector (see the module docs).
pub struct EmailAdapter {
    settings: EmailSettings,
    from: Mailbox,
    domain: String,
    smtp: AsyncSmtpTransport<Tokio1Executor>,
    cursors: Arc<dyn CursorStore>,
    contexts: ReplyContexts,
    /// Kept across `run` calls, so a reconnect continues where the last
    /// connection stopped even when saving the cursor failed.
    position: Mutex<Option<Position>>,
    /// Where attachments are stored at intake; without one they are
    /// refused (named to the model, not shown).
    media: Option<MediaCache>,
}

impl fmt::Debug for EmailAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmailAdapter")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Why one connection ended, before it becomes an [`AdapterError`].
enum Stop {
    Shutdown,
    Failed(AdapterError),
}

impl From<AdapterError> for Stop {
    fn from(e: AdapterError) -> Stop {
        Stop::Failed(e)
    }
}

fn lost(what: &str, e: impl fmt::Display) -> Stop {
    Stop::Failed(AdapterError::Disconnected(format!(
        "IMAP {what} failed: {e}"
    )))
}

impl EmailAdapter {
    /// Checks the settings and builds the SMTP client; does not connect.
    /// `cursors` keeps the reading position and the reply contexts across
    /// restarts.
    pub fn new(
        settings: EmailSettings,
        cursors: Arc<dyn CursorStore>,
    ) -> Result<EmailAdapter, EmailError> {
        let address: Address = settings
            .address
            .trim()
            .parse()
            .map_err(|_| EmailError::BadAddress(settings.address.clone()))?;
        if !parse::is_plain_address(address.as_ref()) {
            return Err(EmailError::BadAddress(settings.address.clone()));
        }
        for (which, endpoint) in [("imap", &settings.imap), ("smtp", &settings.smtp)] {
            if endpoint.tls == MailTls::None && !endpoint.is_loopback() {
                return Err(EmailError::InsecureTls(which, endpoint.host.clone()));
            }
        }
        // lettre builds its TLS config from rustls' process default when
        // more than one backend is compiled in; ring is the workspace's.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let host = settings.smtp.host.clone();
        let builder = match settings.smtp.tls {
            MailTls::Implicit => AsyncSmtpTransport::<Tokio1Executor>::relay(&host)
                .map_err(|e| EmailError::Smtp(e.to_string()))?,
            MailTls::Starttls => AsyncSmtpTransport::<Tokio1Executor>::starttls_relay(&host)
                .map_err(|e| EmailError::Smtp(e.to_string()))?,
            MailTls::None => AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&host),
        };
        let smtp = builder
            .port(settings.smtp.port)
            .credentials(Credentials::new(
                settings.address.trim().to_owned(),
                settings.password.expose().to_owned(),
            ))
            .timeout(Some(settings.timeout))
            .build();
        Ok(EmailAdapter {
            from: Mailbox::new(None, address.clone()),
            domain: address.domain().to_owned(),
            smtp,
            contexts: ReplyContexts {
                store: cursors.clone(),
                cache: Mutex::new(HashMap::new()),
            },
            cursors,
            position: Mutex::new(None),
            media: None,
            settings,
        })
    }

    /// The same adapter storing inbound attachments in `cache` (the
    /// gateway's media cache).
    pub fn with_media(mut self, cache: MediaCache) -> EmailAdapter {
        self.media = Some(cache);
        self
    }

    /// Stores one attached file in the media cache, or says why not.
    async fn intake(&self, part: &MailPart) -> Attachment {
        let claimed =
            talaria_adapter::media::guess_kind(part.mime.as_deref(), part.name.as_deref());
        let size = part.bytes.len() as u64;
        let refused = |why: String| Attachment {
            kind: claimed,
            name: part.name.clone(),
            mime: part.mime.clone(),
            size: Some(size),
            source: AttachmentSource::Refused(why),
        };
        let Some(cache) = &self.media else {
            return refused("files from e-mail are not kept: no media cache is set up".into());
        };
        // The cache refuses it too, but only after writing it out.
        if size > cache.max_bytes() {
            return refused(format!(
                "the file is too large: {} MiB, the limit is {} MiB",
                size.div_ceil(1 << 20),
                cache.max_bytes() >> 20
            ));
        }
        let hint = Hint {
            name: part.name.as_deref(),
            mime: part.mime.as_deref(),
            voice: false,
        };
        match cache.store(&part.bytes[..], hint).await {
            Ok(stored) => Attachment {
                kind: stored.kind,
                name: part.name.clone(),
                mime: part.mime.clone(),
                size: Some(stored.bytes),
                source: AttachmentSource::Cached(MediaRef {
                    kind: stored.kind,
                    path: stored.path,
                    mime: stored.mime,
                }),
            },
            Err(e) => {
                tracing::warn!(error = %e, "an e-mail attachment was not stored");
                refused(e.to_string())
            }
        }
    }

    /// The cursor holding the position, per account and mailbox.
    fn cursor_name(&self) -> String {
        format!(
            "uid:{}:{}",
            self.settings.address.trim().to_lowercase(),
            self.settings.mailbox
        )
    }

    async fn save_position(&self, position: Position) {
        *lock(&self.position) = Some(position);
        if let Err(e) = self
            .cursors
            .set_cursor(PLATFORM, &self.cursor_name(), &position.render())
            .await
        {
            // Kept in memory meanwhile; a restart before the next save
            // fetches again, and the runner drops what it already took.
            tracing::warn!("cannot save the e-mail position: {e}");
        }
    }

    /// Bounds one IMAP step by the configured timeout.
    async fn step<T, E: fmt::Display>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, E>>,
    ) -> Result<T, Stop> {
        match tokio::time::timeout(self.settings.timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(lost(what, e)),
            Err(_) => Err(lost(what, "timed out")),
        }
    }

    async fn login(&self) -> Result<imap::Session, Stop> {
        let endpoint = &self.settings.imap;
        let client = imap::connect(endpoint, self.settings.timeout)
            .await
            .map_err(|e| {
                Stop::Failed(AdapterError::Disconnected(format!(
                    "cannot connect to the IMAP server {}:{}: {e}",
                    endpoint.host, endpoint.port
                )))
            })?;
        let login = client.login(
            self.settings.address.trim(),
            self.settings.password.expose(),
        );
        match tokio::time::timeout(self.settings.timeout, login).await {
            Ok(Ok(session)) => Ok(session),
            Ok(Err((async_imap::error::Error::No(why), _))) => {
                Err(Stop::Failed(AdapterError::Fatal(format!(
                    "the IMAP server refused the login for {} ({}); check EMAIL_ADDRESS and \
                     EMAIL_PASSWORD",
                    self.settings.address.trim(),
                    why.trim()
                ))))
            }
            Ok(Err((e, _))) => Err(lost("login", e)),
            Err(_) => Err(lost("login", "timed out")),
        }
    }

    /// One connection: log in, select, then fetch and wait until shutdown
    /// or a failure.
    async fn serve(&self, ctx: &AdapterContext) -> Result<(), Stop> {
        let mut session = self.login().await?;
        let caps = self.step("CAPABILITY", session.capabilities()).await?;
        let idle = self.settings.use_idle && caps.has_str("IDLE");
        let mailbox = self
            .step("SELECT", session.select(&self.settings.mailbox))
            .await?;
        let validity = mailbox
            .uid_validity
            .ok_or_else(|| lost("SELECT", "the server named no UIDVALIDITY for the mailbox"))?;
        let uid_next = match mailbox.uid_next {
            Some(n) => n,
            None => {
                let all = self.step("UID SEARCH", session.uid_search("ALL")).await?;
                all.into_iter().max().unwrap_or(0) + 1
            }
        };
        let mut position = self.starting_position(validity, uid_next).await?;
        tracing::info!(
            mailbox = %self.settings.mailbox,
            idle,
            after_uid = position.last_uid,
            "reading mail"
        );
        ctx.liveness.set(Liveness::Live);
        let mut rounds = 0;
        loop {
            position = self.fetch_new(&mut session, position, ctx).await?;
            // Mail that arrived while those commands ran was announced in
            // their answers (an untagged EXISTS), and a server does not
            // announce it again to the IDLE that follows: look once more
            // first. Bounded, for a server that says EXISTS every time.
            rounds += 1;
            if announced_arrivals(&session) && rounds < MAX_FETCH_ROUNDS {
                continue;
            }
            rounds = 0;
            if idle {
                let mut handle = session.idle();
                self.step("IDLE", handle.init()).await?;
                let (wait, _stop) = handle.wait_with_timeout(IDLE_RENEW);
                tokio::select! {
                    biased;
                    _ = ctx.shutdown.cancelled() => return Err(Stop::Shutdown),
                    r = wait => { r.map_err(|e| lost("IDLE", e))?; }
                }
                session = self.step("IDLE DONE", handle.done()).await?;
            } else {
                tokio::select! {
                    biased;
                    _ = ctx.shutdown.cancelled() => return Err(Stop::Shutdown),
                    _ = tokio::time::sleep(self.settings.poll_interval) => {}
                }
                self.step("NOOP", session.noop()).await?;
            }
        }
    }

    /// Where to start: after the saved UID when the mailbox is the same
    /// (same UIDVALIDITY), else at the mailbox's UIDNEXT.
    async fn starting_position(&self, validity: u32, uid_next: u32) -> Result<Position, Stop> {
        let mut saved = *lock(&self.position);
        if saved.is_none() {
            saved = self
                .cursors
                .cursor(PLATFORM, &self.cursor_name())
                .await
                .map_err(|e| {
                    Stop::Failed(AdapterError::Disconnected(format!(
                        "cannot read the saved e-mail position: {e}"
                    )))
                })?
                .as_deref()
                .and_then(Position::parse);
        }
        match saved {
            Some(p) if p.validity == validity => Ok(p),
            other => {
                if other.is_some() {
                    tracing::warn!(
                        "the mailbox's UIDVALIDITY changed: its UIDs were reassigned, so only \
                         mail arriving from now on is answered"
                    );
                } else {
                    tracing::info!(
                        "first start on this mailbox: mail already there is not answered, only \
                         newer mail"
                    );
                }
                let p = Position {
                    validity,
                    last_uid: uid_next.saturating_sub(1),
                };
                self.save_position(p).await;
                Ok(p)
            }
        }
    }

    /// Fetches every mail after `position` and hands it over, in UID
    /// order; returns the new position.
    async fn fetch_new(
        &self,
        session: &mut imap::Session,
        mut position: Position,
        ctx: &AdapterContext,
    ) -> Result<Position, Stop> {
        let range = format!("{}:*", position.last_uid.saturating_add(1));
        let fetches: Vec<_> = self
            .step("UID FETCH", async {
                session
                    .uid_fetch(&range, "(UID BODY.PEEK[])")
                    .await?
                    .try_collect::<Vec<_>>()
                    .await
            })
            .await?;
        let mut mails: Vec<(u32, Vec<u8>)> = fetches
            .iter()
            .filter_map(|f| Some((f.uid?, f.body().unwrap_or_default().to_vec())))
            // `n:*` always names the last mail, even one below `n`.
            .filter(|(uid, _)| *uid > position.last_uid)
            .collect();
        mails.sort_by_key(|(uid, _)| *uid);
        for (uid, raw) in mails {
            let id = format!("{}:{uid}", position.validity);
            match parse::parse(&raw, &self.settings.address) {
                Ok(mail) => {
                    if let Some(event) = self.event(&id, &mail).await {
                        tokio::select! {
                            biased;
                            _ = ctx.shutdown.cancelled() => return Err(Stop::Shutdown),
                            r = ctx.inbox.submit(event) => {
                                if r.is_err() {
                                    return Err(Stop::Shutdown);
                                }
                            }
                        }
                        let set = uid.to_string();
                        self.step("UID STORE", async {
                            session
                                .uid_store(&set, "+FLAGS.SILENT (\\Seen)")
                                .await?
                                .try_collect::<Vec<_>>()
                                .await
                        })
                        .await?;
                    }
                }
                Err(Skip::Unparseable | Skip::NoSender) => {
                    tracing::info!(uid, "skipping a mail without a usable sender");
                }
                Err(why) => tracing::info!(uid, "not answering a mail: {why}"),
            }
            position.last_uid = uid;
            self.save_position(position).await;
        }
        Ok(position)
    }

    /// The event for one mail, with its reply context saved first; `None`
    /// when there is nothing to answer.
    async fn event(&self, id: &str, mail: &Inbound) -> Option<MessageEvent> {
        let mut text = mail.body.clone();
        if !mail.is_reply() && !mail.subject.is_empty() {
            // The first mail of a thread often asks in its subject.
            text = if text.is_empty() {
                mail.subject.clone()
            } else {
                format!("Subject: {}\n\n{text}", mail.subject)
            };
        }
        if text.trim().is_empty() && mail.attachments.is_empty() {
            tracing::info!(id, "skipping an empty mail");
            return None;
        }
        let thread = mail
            .thread_root()
            .map(|root| talaria_core::ids::hash_id("mail", root));
        let context = ReplyContext::of(mail);
        self.contexts.save(&format!("msg:{id}"), &context).await;
        if let Some(t) = &thread {
            self.contexts.save(&format!("thread:{t}"), &context).await;
        }
        let source = SessionSource {
            platform: PLATFORM.to_owned(),
            chat_id: mail.from.clone(),
            chat_name: mail.from_name.clone(),
            chat_type: ChatType::Dm,
            user_id: Some(mail.from.clone()),
            user_name: mail.from_name.clone(),
            thread_id: thread,
            is_bot: false,
        };
        let mut event = MessageEvent::text(source, text);
        event.message_id = Some(id.to_owned());
        for part in &mail.attachments {
            event.attachments.push(self.intake(part).await);
        }

        Some(event)
    }

    /// The mail for one outbound message.
    async fn compose(&self, message: &OutboundMessage) -> Result<(Message, String), SendError> {
        let (builder, own_id) = self
            .headers(
                &message.chat_id,
                message.reply_to.as_deref(),
                message.thread_id.as_deref(),
                &message.text,
            )
            .await?;
        let mail = builder
            .header(ContentType::TEXT_PLAIN)
            .body(message.text.clone())
            .map_err(|e| SendError::Rejected(format!("cannot build the mail: {e}")))?;
        Ok((mail, own_id))
    }

    /// The mail carrying one file: `multipart/mixed`, the caption (or a
    /// line naming the file) as text, then the file. `None` when the file
    /// is over [`MAX_ATTACHMENT_BYTES`].
    async fn compose_file(
        &self,
        file: &OutboundFile,
    ) -> Result<Option<(Message, String)>, SendError> {
        let unreadable =
            |e: std::io::Error| SendError::Rejected(format!("cannot read {}: {e}", file.name));
        let size = tokio::fs::metadata(&file.path)
            .await
            .map_err(unreadable)?
            .len();
        if size > MAX_ATTACHMENT_BYTES {
            return Ok(None);
        }
        // Read whole (lettre has no streamed body), capped in case the
        // file grew since it was measured.
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        {
            use tokio::io::AsyncReadExt;
            tokio::fs::File::open(&file.path)
                .await
                .map_err(unreadable)?
                .take(MAX_ATTACHMENT_BYTES + 1)
                .read_to_end(&mut bytes)
                .await
                .map_err(unreadable)?;
        }
        if bytes.len() as u64 > MAX_ATTACHMENT_BYTES {
            return Ok(None);
        }
        let text = match file.caption.as_deref().filter(|c| !c.trim().is_empty()) {
            Some(caption) => caption.to_owned(),
            None => format!("Attached: {}", file.name),
        };
        let (builder, own_id) = self
            .headers(
                &file.chat_id,
                file.reply_to.as_deref(),
                file.thread_id.as_deref(),
                &text,
            )
            .await?;
        let attachment = lettre::message::Attachment::new(file.name.clone())
            .body(bytes, content_type(&file.mime));
        let body = MultiPart::mixed()
            .singlepart(SinglePart::plain(text))
            .singlepart(attachment);
        let mail = builder
            .multipart(body)
            .map_err(|e| SendError::Rejected(format!("cannot build the mail: {e}")))?;
        Ok(Some((mail, own_id)))
    }

    /// The headers of a mail to `chat_id`: threaded after the mail
    /// answered (`reply_to`, else the thread's latest), else with a
    /// subject made from `text`. Returns the builder and the Message-ID.
    async fn headers(
        &self,
        chat_id: &str,
        reply_to: Option<&str>,
        thread_id: Option<&str>,
        text: &str,
    ) -> Result<(MessageBuilder, String), SendError> {
        let to: Address = chat_id
            .trim()
            .parse()
            .map_err(|_| SendError::Rejected(format!("not an address: {chat_id:?}")))?;
        let mut context = None;
        if let Some(id) = reply_to {
            context = self.contexts.load(&format!("msg:{id}")).await;
        }
        if context.is_none()
            && let Some(t) = thread_id
        {
            context = self.contexts.load(&format!("thread:{t}")).await;
        }
        let subject = match &context {
            Some(c) => parse::reply_subject(&c.subject),
            None => parse::fresh_subject(text),
        };
        let own_id = format!(
            "talaria.{:016x}{:08x}@{}",
            rand::random::<u64>(),
            rand::random::<u32>(),
            self.domain
        );
        let mut builder = Message::builder()
            .from(self.from.clone())
            .to(Mailbox::new(None, to))
            .subject(subject)
            .message_id(Some(format!("<{own_id}>")))
            .date_now();
        if let Some(c) = &context {
            if let Some(answered) = &c.message_id {
                builder = builder.in_reply_to(format!("<{answered}>"));
            }
            let refs = c.reply_references();
            if !refs.is_empty() {
                let joined: Vec<String> = refs.iter().map(|r| format!("<{r}>")).collect();
                builder = builder.references(joined.join(" "));
            }
        }
        Ok((builder, own_id))
    }
}

/// The `Content-Type` of an attached file: its type as sniffed, or
/// `application/octet-stream` when that does not parse as one.
fn content_type(mime: &str) -> ContentType {
    ContentType::parse(mime)
        .or_else(|_| ContentType::parse("application/octet-stream"))
        .unwrap_or(ContentType::TEXT_PLAIN)
}

/// Empties the session's queue of unsolicited answers (a full queue drops
/// new ones) and says whether it announced new mail.
fn announced_arrivals(session: &imap::Session) -> bool {
    let mut arrived = false;
    while let Ok(response) = session.unsolicited_responses.try_recv() {
        arrived |= matches!(response, async_imap::types::UnsolicitedResponse::Exists(_));
    }
    arrived
}

/// Maps a failed SMTP send to what the gateway's ledger understands.
fn classify(e: &lettre::transport::smtp::Error) -> SendError {
    let code = e.status().map(|c| c.to_string());
    if code
        .as_deref()
        .is_some_and(|c| c.starts_with("535") || c.starts_with("530"))
    {
        // The account, not this mail, is the problem: keep the reply owed
        // until the operator fixes the password.
        return SendError::Unavailable(format!("the SMTP server refused the login: {e}"));
    }
    if e.is_permanent() {
        SendError::Rejected(e.to_string())
    } else if e.is_transient() {
        SendError::Transient(e.to_string())
    } else if e.is_timeout() {
        SendError::Ambiguous(e.to_string())
    } else {
        SendError::Unavailable(format!("cannot reach the SMTP server: {e}"))
    }
}

/// What the platform can do; also the registry's declaration.
pub const CAPABILITIES: Capabilities = Capabilities {
    sender_ids: SenderIds::Email,
    // A mail carries any file.
    receives: ALL_KINDS,
    sends: ALL_KINDS,
    ..Capabilities::chat(MessageLimits {
        max_len: MAX_MESSAGE_LEN,
        unit: LengthUnit::Chars,
    })
};

const ALL_KINDS: &[MediaKind] = &[
    MediaKind::Image,
    MediaKind::Voice,
    MediaKind::Audio,
    MediaKind::Video,
    MediaKind::Document,
];

#[async_trait]
impl Adapter for EmailAdapter {
    fn platform(&self) -> &'static str {
        PLATFORM
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn credential(&self) -> Option<(&'static str, String)> {
        // Two readers of one mailbox would race on the cursor and the
        // `\Seen` flags.
        Some((
            "email-imap",
            format!(
                "{}@{}:{}/{}",
                self.settings.address.trim().to_lowercase(),
                self.settings.imap.host.to_lowercase(),
                self.settings.imap.port,
                self.settings.mailbox
            ),
        ))
    }

    /// IMAP `LOGIN` with the address and password, then `LOGOUT`: a
    /// server that answers `NO` refused the credentials
    /// ([`AdapterError::Fatal`]). SMTP is not asked: its credentials are
    /// tried with the first mail sent.
    async fn whoami(&self) -> Option<Result<String, AdapterError>> {
        let mut session = match self.login().await {
            Ok(session) => session,
            Err(Stop::Failed(e)) => return Some(Err(e)),
            Err(Stop::Shutdown) => {
                return Some(Err(AdapterError::Disconnected("stopped".to_owned())));
            }
        };
        // Polite, and not worth a failure: the login is what was asked.
        if let Err(Stop::Failed(e)) = self.step("LOGOUT", session.logout()).await {
            tracing::debug!("the IMAP LOGOUT after the credentials check failed: {e}");
        }
        let endpoint = &self.settings.imap;
        Some(Ok(format!(
            "{} on the IMAP server {}:{}",
            self.settings.address.trim(),
            endpoint.host,
            endpoint.port
        )))
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        ctx.liveness.set(Liveness::Connecting);
        let served = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = self.serve(&ctx) => r,
        };
        match served {
            Ok(()) | Err(Stop::Shutdown) => Ok(()),
            Err(Stop::Failed(e)) => Err(e),
        }
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let (mail, own_id) = self.compose(message).await?;
        match self.smtp.send(mail).await {
            Ok(_) => Ok(SentMessage {
                message_id: Some(own_id),
            }),
            Err(e) => Err(classify(&e)),
        }
    }

    /// A reply mail with the file attached; a file over
    /// [`MAX_ATTACHMENT_BYTES`] is announced by a text line instead.
    async fn send_file(&self, file: &OutboundFile) -> Result<SentMessage, SendError> {
        let Some((mail, own_id)) = self.compose_file(file).await? else {
            let text = file.fallback_text(PLATFORM);
            return self
                .send(&OutboundMessage {
                    chat_id: file.chat_id.clone(),
                    thread_id: file.thread_id.clone(),
                    reply_to: file.reply_to.clone(),
                    text,
                    choices: Vec::new(),
                })
                .await;
        };
        match self.smtp.send(mail).await {
            Ok(_) => Ok(SentMessage {
                message_id: Some(own_id),
            }),
            Err(e) => Err(classify(&e)),
        }
    }
}

/// The registry's entry for e-mail.
pub const ENTRY: Platform = Platform {
    name: PLATFORM,
    title: "e-mail",
    standalone: true,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<EmailConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = EmailSettings::from_config(&setup.section()?, setup.env) else {
        return Ok(None);
    };
    let adapter = EmailAdapter::new(settings, setup.cursors.clone())
        .map_err(BuildError::set_up)?
        .with_media(setup.media.clone());
    Ok(Some(Built::connected(adapter)))
}

#[cfg(test)]
mod tests;
