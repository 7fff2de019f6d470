//! The IRC adapter: one nick on one network, in the channels it is told to
//! join and in private messages.
//!
//! [`IrcAdapter::run`] connects (TLS unless the server is on this
//! machine), logs in with SASL PLAIN when a password for it is set,
//! registers (`PASS`, `NICK`, `USER`; a nick in use gives way to `nick_`,
//! `nick_1`, ...), joins the channels and reads lines until the server
//! goes away. The adapter is [`Liveness::Live`] from the server's welcome.
//!
//! - **In**: a `PRIVMSG` to the bot is a DM (the chat is the sender's
//!   nick); one to a channel is answered only when it addresses the bot
//!   (`talaria: ...`) unless `require_mention` is off. `/me` actions
//!   become `* nick ...`; other CTCP requests and `NOTICE`s are never
//!   answered (RFC 2812 forbids answering a notice). IRC has no message
//!   ids, so each message gets one from the connection's start time and
//!   its order; a server's IRCv3 `msgid` is used where it sets one.
//! - **Out**: the answer's Markdown becomes plain text, each line one
//!   `PRIVMSG` cut to what fits the 512 bytes the server relays (its
//!   `:nick!user@host` in front included), paced by a token bucket so the
//!   server never disconnects the bot for flooding. IRC acknowledges
//!   nothing, so a send ends with a `PING` whose `PONG` proves the server
//!   processed every line before it: a `401 no such nick` or `404 cannot
//!   send to channel` arriving first refuses the send, a dropped
//!   connection makes it ambiguous.
//! - **Keepalive**: a `PING` every `ping_interval`; a server silent for
//!   two is given up and the supervisor reconnects. Each ping also tries
//!   to take back the configured nick and rejoins a channel the bot was
//!   kicked from.

mod config;
mod conn;
mod line;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use talaria_adapter::{
    Adapter, AdapterContext, AdapterError, Capabilities, ChatType, LengthUnit, Liveness,
    MessageEvent, MessageLimits, OutboundMessage, SendError, SenderIds, SentMessage, SessionSource,
};
use talaria_core::config::{secret_or_env, text_or_env};
use talaria_core::{Env, Secret};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::registry::{BuildError, Built, Platform, Setup};
use conn::{Connection, Endpoint};
use line::Message;

pub use config::{ENV, IrcConfig};

/// The longest message the gateway hands over by default, in characters:
/// the system this one descends from used 450.
pub const DEFAULT_MAX_MESSAGE_CHARS: usize = 450;

/// The token a send's confirming `PING` carries, before its number.
const CONFIRM: &str = "talaria-sent-";

/// Numerics that refuse a `PRIVMSG` to the target named in their second
/// parameter: no such nick (401) or channel (403), cannot send to the
/// channel (404: moderated, banned, not joined with `+n`), too many
/// targets (407), no text (412), registered or secure users only
/// (477, 489, 492 and 531 on some servers).
const REFUSALS: &[&str] = &[
    "401", "403", "404", "407", "412", "477", "489", "492", "531",
];

/// Numerics that refuse a `JOIN`: full (471), invite only (473), banned
/// (474), bad key (475), registered nicks only (477 on some servers).
const JOIN_REFUSALS: &[&str] = &["471", "473", "474", "475"];

/// What the adapter needs to connect.
#[derive(Debug, Clone)]
pub struct IrcSettings {
    /// The server's host name or address.
    pub server: String,
    /// Its port.
    pub port: u16,
    /// Connect with TLS.
    pub use_tls: bool,
    /// Extra certificates to trust (PEM).
    pub tls_ca_file: Option<String>,
    /// The nick wanted.
    pub nickname: String,
    /// The channels to join.
    pub channels: Vec<String>,
    /// Sent as `PASS`.
    pub server_password: Option<Secret>,
    /// `IDENTIFY`'d to NickServ after connecting (without SASL).
    pub nickserv_password: Option<Secret>,
    /// The SASL PLAIN account and password.
    pub sasl: Option<(String, Secret)>,
    /// In channels, answer only messages addressed to the bot.
    pub require_mention: bool,
    /// The gateway's part length, in characters.
    pub max_message_length: usize,
    /// Lines sent at once before pacing.
    pub flood_burst: u32,
    /// Between paced lines.
    pub flood_interval: Duration,
    /// Between the bot's own PINGs.
    pub ping_interval: Duration,
    /// How long connecting and registering may take.
    pub connect_timeout: Duration,
    /// How long the server may take to confirm a send, beyond the time
    /// its lines take to pace out.
    pub send_timeout: Duration,
}

impl IrcSettings {
    /// Settings with the defaults for everything but the server and nick.
    pub fn new(server: impl Into<String>, nickname: impl Into<String>) -> IrcSettings {
        IrcSettings {
            server: server.into(),
            port: 6697,
            use_tls: true,
            tls_ca_file: None,
            nickname: nickname.into(),
            channels: Vec::new(),
            server_password: None,
            nickserv_password: None,
            sasl: None,
            require_mention: true,
            max_message_length: DEFAULT_MAX_MESSAGE_CHARS,
            flood_burst: 4,
            flood_interval: Duration::from_secs(1),
            ping_interval: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(30),
            send_timeout: Duration::from_secs(30),
        }
    }

    /// Settings from `platforms.irc` and the environment (the names of the
    /// system this one descends from: `IRC_SERVER`, `IRC_PORT`,
    /// `IRC_USE_TLS`, `IRC_NICKNAME`, `IRC_CHANNEL`, ...), or `None` when
    /// IRC is off: `enabled: false`, or no server.
    pub fn from_config(config: &IrcConfig, env: &Env) -> Result<Option<IrcSettings>, IrcError> {
        if config.enabled == Some(false) {
            return Ok(None);
        }
        let Some(server) = text_or_env(config.server.as_deref(), env, "IRC_SERVER") else {
            if config.enabled == Some(true) {
                tracing::warn!(
                    "platforms.irc.enabled is true but no server is set \
                     (platforms.irc.server or IRC_SERVER)"
                );
            }
            return Ok(None);
        };
        let use_tls = match config.use_tls {
            Some(tls) => tls,
            None => env.flag("IRC_USE_TLS").unwrap_or(true),
        };
        let port = match config.port {
            Some(port) => port,
            None => match env.get("IRC_PORT") {
                Some(text) => text
                    .trim()
                    .parse()
                    .map_err(|_| IrcError::BadPort(text.to_owned()))?,
                None if use_tls => 6697,
                None => 6667,
            },
        };
        let nickname = text_or_env(config.nickname.as_deref(), env, "IRC_NICKNAME")
            .unwrap_or_else(|| "talaria".to_owned());
        let channels = text_or_env(config.channel.as_deref(), env, "IRC_CHANNEL")
            .map(|list| {
                list.split(',')
                    .map(|c| c.trim().to_owned())
                    .filter(|c| !c.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let sasl = secret_or_env(config.sasl_password.as_ref(), env, "IRC_SASL_PASSWORD").map(
            |password| {
                let account =
                    text_or_env(config.sasl_username.as_deref(), env, "IRC_SASL_USERNAME")
                        .unwrap_or_else(|| nickname.clone());
                (account, password)
            },
        );
        let require_mention = env
            .flag("IRC_REQUIRE_MENTION")
            .unwrap_or(config.require_mention);
        Ok(Some(IrcSettings {
            port,
            use_tls,
            tls_ca_file: text_or_env(config.tls_ca_file.as_deref(), env, "IRC_TLS_CA_FILE"),
            channels,
            server_password: secret_or_env(
                config.server_password.as_ref(),
                env,
                "IRC_SERVER_PASSWORD",
            ),
            nickserv_password: secret_or_env(
                config.nickserv_password.as_ref(),
                env,
                "IRC_NICKSERV_PASSWORD",
            ),
            sasl,
            require_mention,
            max_message_length: config.max_message_length,
            flood_burst: config.flood_burst.max(1),
            flood_interval: Duration::from_millis(config.flood_interval_ms),
            ping_interval: Duration::from_secs(config.ping_interval_secs.max(1)),
            ..IrcSettings::new(server, nickname)
        }))
    }
}

/// Why the adapter could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IrcError {
    /// `IRC_PORT` is not a port number.
    #[error("IRC_PORT is {0:?}, not a port number")]
    BadPort(String),
    /// The nick is not one a server accepts.
    #[error(
        "the IRC nick {0:?} is not valid (letters, digits and []\\`_^{{|}}-, \
         not starting with a digit or -); set IRC_NICKNAME or platforms.irc.nickname"
    )]
    BadNick(String),
    /// A channel name is not one.
    #[error(
        "{0:?} is not an IRC channel name (IRC_CHANNEL, platforms.irc.channel): it starts with # or &"
    )]
    BadChannel(String),
    /// Plain text to a server that is not on this machine.
    #[error(
        "IRC without TLS is allowed only to a server on this machine, not {0}; \
         set IRC_USE_TLS=true (port 6697)"
    )]
    PlainToRemote(String),
}

/// The IRC connector (see the module docs).
pub struct IrcAdapter {
    endpoint: Endpoint,
    channels: Vec<String>,
    nickserv_password: Option<Secret>,
    require_mention: bool,
    max_message_length: usize,
    ping_interval: Duration,
    connect_timeout: Duration,
    send_timeout: Duration,
    flood: Flood,
    /// The connection sends go through, while there is one.
    link: Mutex<Option<Link>>,
}

impl fmt::Debug for IrcAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IrcAdapter")
            .field("server", &self.endpoint.host)
            .field("port", &self.endpoint.port)
            .field("tls", &self.endpoint.tls)
            .field("nick", &self.endpoint.nick)
            .field("channels", &self.channels)
            .finish_non_exhaustive()
    }
}

impl IrcAdapter {
    /// Checks the settings; does not connect.
    pub fn new(settings: IrcSettings) -> Result<IrcAdapter, IrcError> {
        if !line::is_valid_nick(&settings.nickname) {
            return Err(IrcError::BadNick(settings.nickname));
        }
        if let Some(bad) = settings
            .channels
            .iter()
            .find(|c| !line::is_channel(c) || c.contains([' ', ',', '\u{7}']))
        {
            return Err(IrcError::BadChannel(bad.clone()));
        }
        if !settings.use_tls && !crate::net::is_loopback(&settings.server) {
            return Err(IrcError::PlainToRemote(settings.server));
        }
        Ok(IrcAdapter {
            endpoint: Endpoint {
                host: settings.server,
                port: settings.port,
                tls: settings.use_tls,
                ca_file: settings.tls_ca_file,
                nick: settings.nickname,
                server_password: settings.server_password.map(|s| s.expose().to_owned()),
                sasl: settings
                    .sasl
                    .map(|(account, password)| (account, password.expose().to_owned())),
            },
            channels: settings.channels,
            nickserv_password: settings.nickserv_password,
            require_mention: settings.require_mention,
            max_message_length: settings.max_message_length,
            ping_interval: settings.ping_interval,
            connect_timeout: settings.connect_timeout,
            send_timeout: settings.send_timeout,
            flood: Flood::new(settings.flood_burst, settings.flood_interval),
            link: Mutex::new(None),
        })
    }

    fn current_link(&self) -> Option<Link> {
        self.link.lock().ok()?.clone()
    }

    fn set_link(&self, link: Option<Link>) {
        if let Ok(mut slot) = self.link.lock() {
            *slot = link;
        }
    }

    /// Reads and handles lines until the connection ends.
    async fn serve(
        &self,
        mut conn: Connection,
        state: Arc<LinkState>,
        mut outgoing: mpsc::Receiver<String>,
        ctx: &AdapterContext,
    ) -> Result<(), AdapterError> {
        let mut joined: HashSet<String> = HashSet::new();
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let mut ids = Ids { started, next: 0 };
        let mut heard = Instant::now();
        let mut ticks =
            tokio::time::interval_at(Instant::now() + self.ping_interval, self.ping_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => {
                    // Best effort: the server drops the nick either way.
                    let _ = tokio::time::timeout(
                        Duration::from_secs(2),
                        conn.write("QUIT :Talaria is stopping"),
                    )
                    .await;
                    return Ok(());
                }
                read = conn::read_from(&mut conn.reader) => {
                    let Some(m) = read? else {
                        return Err(AdapterError::Disconnected(
                            "the IRC server closed the connection".into(),
                        ));
                    };
                    heard = Instant::now();
                    if !self.on_message(&mut conn, &state, &mut joined, &mut ids, m, ctx).await? {
                        return Ok(());
                    }
                }
                Some(text) = outgoing.recv() => conn.write(&text).await?,
                _ = ticks.tick() => {
                    if heard.elapsed() > self.ping_interval * 2 {
                        return Err(AdapterError::Disconnected(format!(
                            "the IRC server said nothing for {:?}",
                            heard.elapsed()
                        )));
                    }
                    conn.write("PING :talaria-keepalive").await?;
                    if !state.nick().eq_ignore_ascii_case(&self.endpoint.nick) {
                        conn.write(&format!("NICK {}", self.endpoint.nick)).await?;
                    }
                    for channel in &self.channels {
                        if !joined.contains(&channel.to_ascii_lowercase()) {
                            conn.write(&format!("JOIN {channel}")).await?;
                        }
                    }
                }
            }
        }
    }

    /// Handles one line after registration. `Ok(false)`: stop (shutdown,
    /// or the runner is gone).
    async fn on_message(
        &self,
        conn: &mut Connection,
        state: &LinkState,
        joined: &mut HashSet<String>,
        ids: &mut Ids,
        m: Message,
        ctx: &AdapterContext,
    ) -> Result<bool, AdapterError> {
        let from_me = m
            .nick()
            .is_some_and(|n| n.eq_ignore_ascii_case(&state.nick()));
        if from_me && let Some(source) = &m.source {
            // The server shows the bot's full source on its own JOIN,
            // NICK and echoes: what it puts in front of every relayed line.
            state.source_len.store(source.len() + 2, Ordering::Relaxed);
        }
        match m.command.as_str() {
            "PING" => conn.write(&format!("PONG :{}", m.param(0))).await?,
            "PONG" => {
                let token = m.params.last().map_or("", String::as_str);
                if let Some(n) = token.strip_prefix(CONFIRM).and_then(|n| n.parse().ok()) {
                    state.confirm(n);
                }
            }
            "ERROR" => {
                return Err(AdapterError::Disconnected(format!(
                    "the IRC server ended the connection: {}",
                    m.param(0)
                )));
            }
            "NICK" if from_me => {
                tracing::info!(nick = m.param(0), "IRC nick changed");
                state.set_nick(m.param(0));
            }
            "JOIN" if from_me => {
                tracing::info!(channel = m.param(0), "joined the IRC channel");
                joined.insert(m.param(0).to_ascii_lowercase());
            }
            "PART" if from_me => {
                joined.remove(&m.param(0).to_ascii_lowercase());
            }
            "KICK" if m.param(1).eq_ignore_ascii_case(&state.nick()) => {
                tracing::warn!(
                    channel = m.param(0),
                    by = m.nick().unwrap_or(""),
                    reason = m.param(2),
                    "kicked from the IRC channel; rejoining at the next ping"
                );
                joined.remove(&m.param(0).to_ascii_lowercase());
            }
            code if REFUSALS.contains(&code) => {
                state.refuse(m.param(1), m.params.last().map_or("", String::as_str));
            }
            code if JOIN_REFUSALS.contains(&code) => {
                tracing::warn!(
                    channel = m.param(1),
                    reason = m.params.last().map_or("", String::as_str),
                    "the IRC server refused to let the bot join"
                );
            }
            "PRIVMSG" if !from_me => {
                let Some(event) = self.inbound(&m, &state.nick(), ids) else {
                    return Ok(true);
                };
                return Ok(tokio::select! {
                    biased;
                    _ = ctx.shutdown.cancelled() => false,
                    r = ctx.inbox.submit(event) => r.is_ok(),
                });
            }
            _ => {}
        }
        Ok(true)
    }

    /// A `PRIVMSG` as the event it starts, or `None` for one the bot does
    /// not answer (unaddressed in a channel, a CTCP request, empty).
    fn inbound(&self, m: &Message, my_nick: &str, ids: &mut Ids) -> Option<MessageEvent> {
        let nick = m.nick()?;
        let target = m.param(0);
        let mut text = m.param(1).to_owned();
        if let Some((verb, rest)) = line::ctcp(&text) {
            if !verb.eq_ignore_ascii_case("ACTION") {
                tracing::debug!(verb, from = nick, "ignoring a CTCP request");
                return None;
            }
            text = format!("* {nick} {rest}");
        }
        let channel = line::is_channel(target);
        if channel && self.require_mention {
            text = line::addressed(&text, my_nick)?.to_owned();
        }
        if text.trim().is_empty() {
            return None;
        }
        let (chat_id, chat_type, chat_name) = if channel {
            (
                target.to_ascii_lowercase(),
                ChatType::Group,
                Some(target.to_owned()),
            )
        } else {
            (nick.to_ascii_lowercase(), ChatType::Dm, None)
        };
        let source = SessionSource {
            platform: "irc".to_owned(),
            chat_id,
            chat_name,
            chat_type,
            user_id: Some(nick.to_ascii_lowercase()),
            user_name: Some(nick.to_owned()),
            thread_id: None,
            is_bot: false,
        };
        let mut event = MessageEvent::text(source, text);
        event.message_id = Some(m.msgid.clone().unwrap_or_else(|| ids.next()));
        Some(event)
    }
}

/// Message ids for a network that has none: the connection's start (in
/// milliseconds) and the message's place on it, unique across restarts.
struct Ids {
    started: u128,
    next: u64,
}

impl Ids {
    fn next(&mut self) -> String {
        self.next += 1;
        format!("{}.{}", self.started, self.next)
    }
}

/// The live connection, as sends see it.
#[derive(Clone)]
struct Link {
    /// Lines for the connection to write, in order.
    outgoing: mpsc::Sender<String>,
    state: Arc<LinkState>,
}

/// What the reading side learns that sends need.
struct LinkState {
    nick: Mutex<String>,
    /// The length of `:nick!user@host ` as the server relays it.
    source_len: AtomicUsize,
    next_token: AtomicU64,
    /// Sends waiting for their confirming `PONG`.
    waiting: Mutex<HashMap<u64, Waiting>>,
}

struct Waiting {
    target: String,
    refusal: Option<String>,
    done: oneshot::Sender<Result<(), String>>,
}

impl LinkState {
    fn new(nick: &str) -> LinkState {
        LinkState {
            nick: Mutex::new(nick.to_owned()),
            source_len: AtomicUsize::new(line::source_len_guess(nick)),
            next_token: AtomicU64::new(1),
            waiting: Mutex::new(HashMap::new()),
        }
    }

    fn nick(&self) -> String {
        self.nick.lock().map(|n| n.clone()).unwrap_or_default()
    }

    fn set_nick(&self, nick: &str) {
        if let Ok(mut n) = self.nick.lock() {
            *n = nick.to_owned();
        }
        // Until the server shows the new source, assume the longest.
        self.source_len
            .fetch_max(line::source_len_guess(nick), Ordering::Relaxed);
    }

    /// Registers a send to `target`; its token goes in the confirming PING.
    fn expect(&self, target: &str) -> (u64, oneshot::Receiver<Result<(), String>>) {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let (done, rx) = oneshot::channel();
        if let Ok(mut waiting) = self.waiting.lock() {
            waiting.insert(
                token,
                Waiting {
                    target: target.to_owned(),
                    refusal: None,
                    done,
                },
            );
        }
        (token, rx)
    }

    fn forget(&self, token: u64) {
        if let Ok(mut waiting) = self.waiting.lock() {
            waiting.remove(&token);
        }
    }

    /// The server refused a line to `target`: every send to it still
    /// waiting fails when its PONG comes.
    fn refuse(&self, target: &str, reason: &str) {
        if let Ok(mut waiting) = self.waiting.lock() {
            for w in waiting.values_mut() {
                if w.target.eq_ignore_ascii_case(target) {
                    w.refusal = Some(format!("{target}: {reason}"));
                }
            }
        }
    }

    /// The connection is gone: every waiting send ends, ambiguous.
    fn abandon_all(&self) {
        if let Ok(mut waiting) = self.waiting.lock() {
            waiting.clear();
        }
    }

    /// The PONG for `token`: the server processed the send's lines.
    fn confirm(&self, token: u64) {
        let done = self.waiting.lock().ok().and_then(|mut w| w.remove(&token));
        if let Some(w) = done {
            let _ = w.done.send(match w.refusal {
                Some(reason) => Err(reason),
                None => Ok(()),
            });
        }
    }
}

/// A token bucket: `burst` lines at once, then one per `interval`. Shared
/// by every send, so concurrent answers are paced together, in the order
/// they asked (Tokio's mutex is fair).
struct Flood {
    burst: f64,
    interval: Duration,
    state: tokio::sync::Mutex<(f64, Instant)>,
}

impl Flood {
    fn new(burst: u32, interval: Duration) -> Flood {
        let burst = f64::from(burst.max(1));
        Flood {
            burst,
            interval,
            state: tokio::sync::Mutex::new((burst, Instant::now())),
        }
    }

    /// Waits for a line's turn.
    async fn take(&self) {
        let mut state = self.state.lock().await;
        let (tokens, last) = &mut *state;
        if !self.interval.is_zero() {
            let refill = last.elapsed().as_secs_f64() / self.interval.as_secs_f64();
            *tokens = (*tokens + refill).min(self.burst);
        } else {
            *tokens = self.burst;
        }
        *last = Instant::now();
        if *tokens < 1.0 {
            let wait = self.interval.mul_f64(1.0 - *tokens);
            tokio::time::sleep(wait).await;
            *tokens = 1.0;
            *last = Instant::now();
        }
        *tokens -= 1.0;
    }
}

/// The platform's declaration, at the default part length.
pub const CAPABILITIES: Capabilities = Capabilities {
    sender_ids: SenderIds::Nick,
    ..Capabilities::chat(MessageLimits {
        max_len: DEFAULT_MAX_MESSAGE_CHARS,
        unit: LengthUnit::Chars,
    })
};

#[async_trait]
impl Adapter for IrcAdapter {
    fn platform(&self) -> &'static str {
        "irc"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            limits: MessageLimits {
                max_len: self.max_message_length,
                unit: LengthUnit::Chars,
            },
            ..CAPABILITIES
        }
    }

    fn credential(&self) -> Option<(&'static str, String)> {
        // One nick on one network: a second gateway would only get `nick_`
        // and answer under another name.
        Some((
            "irc",
            format!(
                "{}:{}:{}",
                self.endpoint.host.to_ascii_lowercase(),
                self.endpoint.port,
                self.endpoint.nick.to_ascii_lowercase()
            ),
        ))
    }

    async fn run(&self, ctx: AdapterContext) -> Result<(), AdapterError> {
        ctx.liveness.set(Liveness::Connecting);
        let mut conn = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            r = conn::open(&self.endpoint, self.connect_timeout) => r?,
        };
        tracing::info!(
            server = %self.endpoint.host,
            nick = %conn.nick,
            "connected to IRC"
        );
        if self.endpoint.sasl.is_none()
            && let Some(password) = &self.nickserv_password
        {
            conn.write(&format!("PRIVMSG NickServ :IDENTIFY {}", password.expose()))
                .await?;
        }
        for channel in &self.channels {
            conn.write(&format!("JOIN {channel}")).await?;
        }
        let (outgoing, rx) = mpsc::channel(64);
        let state = Arc::new(LinkState::new(&conn.nick));
        self.set_link(Some(Link {
            outgoing,
            state: state.clone(),
        }));
        ctx.liveness.set(Liveness::Live);
        let ended = self.serve(conn, state.clone(), rx, &ctx).await;
        self.set_link(None);
        // Sends still waiting for their PONG learn at once that it will not
        // come: their lines may or may not have reached the server.
        state.abandon_all();
        ended
    }

    async fn send(&self, message: &OutboundMessage) -> Result<SentMessage, SendError> {
        let target = message.chat_id.trim();
        if target.is_empty() || target.contains([' ', ',', '\r', '\n', '\0']) {
            return Err(SendError::Rejected(format!(
                "{target:?} is not an IRC nick or channel"
            )));
        }
        let Some(link) = self.current_link() else {
            return Err(SendError::Unavailable(
                "not connected to the IRC server".into(),
            ));
        };
        let mut text = crate::plain::to_plain(&message.text);
        if text.trim().is_empty() {
            text = message.text.clone();
        }
        let budget = line::text_budget(target, link.state.source_len.load(Ordering::Relaxed));
        let lines = line::lines(&text, budget);
        let (token, confirmed) = link.state.expect(target);
        for (i, piece) in lines.iter().enumerate() {
            self.flood.take().await;
            if link
                .outgoing
                .send(format!("PRIVMSG {target} :{piece}"))
                .await
                .is_err()
            {
                link.state.forget(token);
                return Err(if i == 0 {
                    SendError::Unavailable("the IRC connection closed".into())
                } else {
                    SendError::Ambiguous(format!(
                        "the IRC connection closed after {i} of {} lines",
                        lines.len()
                    ))
                });
            }
        }
        if link
            .outgoing
            .send(format!("PING :{CONFIRM}{token}"))
            .await
            .is_err()
        {
            link.state.forget(token);
            return Err(SendError::Ambiguous(
                "the IRC connection closed before the server confirmed the message".into(),
            ));
        }
        // Servers pace a client's lines too (ngIRCd takes about three a
        // second past a short burst): allow a second for each.
        let lines_time = Duration::from_secs(1).saturating_mul(lines.len() as u32);
        match tokio::time::timeout(self.send_timeout + lines_time, confirmed).await {
            Ok(Ok(Ok(()))) => Ok(SentMessage { message_id: None }),
            Ok(Ok(Err(refusal))) => Err(SendError::Rejected(refusal)),
            Ok(Err(_)) => Err(SendError::Ambiguous(
                "the IRC connection dropped before the server confirmed the message".into(),
            )),
            Err(_) => {
                link.state.forget(token);
                Err(SendError::Ambiguous(format!(
                    "the IRC server did not confirm the message within {:?}",
                    self.send_timeout + lines_time
                )))
            }
        }
    }
}

/// The registry's entry for IRC.
pub const ENTRY: Platform = Platform {
    name: "irc",
    title: "IRC",
    // A message goes out only on a registered connection, which only a
    // running gateway holds: `talaria send` hands it to the gateway.
    standalone: false,
    capabilities: CAPABILITIES,
    check: talaria_core::config::check_section::<IrcConfig>,
    env: ENV,
    build,
};

fn build(setup: &Setup<'_>) -> Result<Option<Built>, BuildError> {
    let Some(settings) = IrcSettings::from_config(&setup.section()?, setup.env)
        .map_err(BuildError::misconfigured)?
    else {
        return Ok(None);
    };
    let adapter = IrcAdapter::new(settings).map_err(BuildError::set_up)?;
    Ok(Some(Built::connected(adapter)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter(require_mention: bool) -> IrcAdapter {
        let mut s = IrcSettings::new("127.0.0.1", "talaria");
        s.use_tls = false;
        s.require_mention = require_mention;
        IrcAdapter::new(s).unwrap()
    }

    fn privmsg(line: &str) -> Message {
        Message::parse(line).unwrap()
    }

    #[test]
    fn from_config_reads_the_ancestors_variables() {
        let env = Env::from_pairs([
            ("IRC_SERVER", "irc.example.org"),
            ("IRC_CHANNEL", "#one, #two"),
            ("IRC_NICKNAME", "helper"),
            ("IRC_SASL_PASSWORD", "s3cret"),
            ("IRC_REQUIRE_MENTION", "false"),
        ]);
        let s = IrcSettings::from_config(&IrcConfig::default(), &env)
            .unwrap()
            .unwrap();
        assert_eq!(
            (s.server.as_str(), s.port, s.use_tls),
            ("irc.example.org", 6697, true)
        );
        assert_eq!(s.channels, ["#one", "#two"]);
        assert_eq!(s.nickname, "helper");
        let (account, password) = s.sasl.unwrap();
        assert_eq!((account.as_str(), password.expose()), ("helper", "s3cret"));
        assert!(!s.require_mention);
        let plain = Env::from_pairs([("IRC_SERVER", "localhost"), ("IRC_USE_TLS", "false")]);
        let s = IrcSettings::from_config(&IrcConfig::default(), &plain)
            .unwrap()
            .unwrap();
        assert_eq!((s.port, s.use_tls), (6667, false));
        let none = Env::from_pairs(Vec::<(String, String)>::new());
        assert!(
            IrcSettings::from_config(&IrcConfig::default(), &none)
                .unwrap()
                .is_none()
        );
        let bad = Env::from_pairs([("IRC_SERVER", "h"), ("IRC_PORT", "ircd")]);
        assert!(matches!(
            IrcSettings::from_config(&IrcConfig::default(), &bad),
            Err(IrcError::BadPort(_))
        ));
    }

    #[test]
    fn new_refuses_bad_nicks_channels_and_plain_text_to_remote_servers() {
        let mut s = IrcSettings::new("irc.example.org", "talaria");
        s.use_tls = false;
        assert!(matches!(
            IrcAdapter::new(s.clone()),
            Err(IrcError::PlainToRemote(_))
        ));
        s.use_tls = true;
        s.channels = vec!["talaria".into()];
        assert!(matches!(
            IrcAdapter::new(s.clone()),
            Err(IrcError::BadChannel(_))
        ));
        s.channels = vec!["#talaria".into()];
        s.nickname = "1bot".into();
        assert!(matches!(
            IrcAdapter::new(s.clone()),
            Err(IrcError::BadNick(_))
        ));
        s.nickname = "bot".into();
        assert!(IrcAdapter::new(s).is_ok());
    }

    #[test]
    fn private_messages_channels_and_actions_map_to_events() {
        let a = adapter(true);
        let mut ids = Ids {
            started: 7,
            next: 0,
        };
        let dm = a
            .inbound(
                &privmsg(":Alice!~a@h PRIVMSG talaria :hello"),
                "talaria",
                &mut ids,
            )
            .unwrap();
        assert_eq!(dm.source.chat_type, ChatType::Dm);
        assert_eq!(dm.source.chat_id, "alice");
        assert_eq!(dm.source.user_id.as_deref(), Some("alice"));
        assert_eq!(dm.source.user_name.as_deref(), Some("Alice"));
        assert_eq!(dm.message_id.as_deref(), Some("7.1"));
        let group = a
            .inbound(
                &privmsg(":alice!~a@h PRIVMSG #Chan :talaria: what time is it"),
                "talaria",
                &mut ids,
            )
            .unwrap();
        assert_eq!(group.source.chat_type, ChatType::Group);
        assert_eq!(group.source.chat_id, "#chan");
        assert_eq!(group.text, "what time is it");
        assert_eq!(group.message_id.as_deref(), Some("7.2"));
        assert!(
            a.inbound(
                &privmsg(":alice!~a@h PRIVMSG #chan :just chatting"),
                "talaria",
                &mut ids
            )
            .is_none()
        );
        assert!(
            adapter(false)
                .inbound(
                    &privmsg(":alice!~a@h PRIVMSG #chan :just chatting"),
                    "talaria",
                    &mut ids
                )
                .is_some()
        );
        let action = a
            .inbound(
                &privmsg(":alice!~a@h PRIVMSG talaria :\u{1}ACTION waves\u{1}"),
                "talaria",
                &mut ids,
            )
            .unwrap();
        assert_eq!(action.text, "* alice waves");
        assert!(
            a.inbound(
                &privmsg(":alice!~a@h PRIVMSG talaria :\u{1}VERSION\u{1}"),
                "talaria",
                &mut ids
            )
            .is_none()
        );
        let tagged = a
            .inbound(
                &privmsg("@msgid=xyz :alice!~a@h PRIVMSG talaria :hi"),
                "talaria",
                &mut ids,
            )
            .unwrap();
        assert_eq!(tagged.message_id.as_deref(), Some("xyz"));
    }

    #[test]
    fn a_refusal_fails_only_the_sends_to_its_target() {
        let state = LinkState::new("talaria");
        let (a, mut a_rx) = state.expect("alice");
        let (b, mut b_rx) = state.expect("#chan");
        state.refuse("Alice", "No such nick");
        state.confirm(a);
        state.confirm(b);
        assert_eq!(a_rx.try_recv().unwrap(), Err("Alice: No such nick".into()));
        assert_eq!(b_rx.try_recv().unwrap(), Ok(()));
        // A lost connection ends every send still waiting.
        let (_, mut c_rx) = state.expect("bob");
        state.abandon_all();
        assert!(matches!(
            c_rx.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Closed)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn the_flood_bucket_lets_a_burst_through_then_paces() {
        let flood = Flood::new(3, Duration::from_secs(1));
        let start = Instant::now();
        let mut at = Vec::new();
        for _ in 0..6 {
            flood.take().await;
            at.push(start.elapsed().as_millis());
        }
        assert_eq!(at, [0, 0, 0, 1000, 2000, 3000]);
        // Idle time refills the bucket, up to the burst.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let start = Instant::now();
        for _ in 0..4 {
            flood.take().await;
        }
        assert_eq!(start.elapsed().as_millis(), 1000);
    }
}
