//! IRC's kit: a real ngIRCd ([`crate::ircd::Ircd`]), people on it as real
//! IRC clients, and a line proxy between the bot and the server.
//!
//! The people (Alice on the allowlist, Mallory on no list) connect to the
//! server directly and sit in [`CHANNEL`]. Every line they send is followed
//! by a `PING` whose `PONG` is awaited, so by the time a push returns the
//! server has relayed the line to the bot: pushes from different people
//! reach the bot in the order they were made.
//!
//! The bot connects through the proxy, which forwards every line and reads
//! what passes:
//! - a connection counts once the server shows the bot joining
//!   [`CHANNEL`]; the server's `001` and `NICK` lines say the bot's nick;
//! - the bot's `PRIVMSG` lines up to the `PING` that confirms a send are
//!   one sent message ([`Out`]), its lines joined with newlines (a line of
//!   one space, the bot's paragraph break, read as an empty line);
//! - [`PlatformKit::hang_send`] swallows those lines and that `PING`, so
//!   the server never sees the message and the bot never gets its
//!   confirmation; [`PlatformKit::drop_connection`] closes both sides.
//!
//! IRC keeps nothing for a nick that is not there: a push while the bot is
//! away waits in the kit and is sent when the bot is back in the channel,
//! as a person would say it again.

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use super::{Out, PlatformKit, Threaded, Who};
use crate::ircd::Ircd;
use crate::wait::wait_for;

/// The channel everyone is in.
pub const CHANNEL: &str = "#talaria";

/// The nick the bot is configured with.
pub const BOT_NICK: &str = "talaria";

/// The person on the allowlist.
pub const FRIEND: &str = "alice";

/// A person on no list.
pub const STRANGER: &str = "mallory";

/// The server's connection password (`PASS`), which must never be logged.
pub const PASSWORD: &str = "irc-server-password-5ecret";

/// How long a person waits for the server to confirm a line.
const CONFIRM_WAIT: Duration = Duration::from_secs(20);

/// A person connected to the server: a blocking socket, a thread reading
/// it, and everything they received.
pub struct Person {
    nick: String,
    writer: Mutex<TcpStream>,
    state: Arc<Mutex<Heard>>,
    pongs: Mutex<mpsc::Receiver<String>>,
    tokens: AtomicU64,
}

#[derive(Default)]
struct Heard {
    /// Every line received, as received (CRLF excluded).
    raw: Vec<Vec<u8>>,
}

impl Person {
    /// Connects to `ircd` as `nick`, registers, and joins `channels`.
    pub fn connect(ircd: &Ircd, nick: &str, channels: &[&str]) -> Person {
        let port = ircd.port();
        let stream = TcpStream::connect(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("{nick} cannot reach the IRC server: {e}"));
        let _ = stream.set_nodelay(true);
        let reader = BufReader::new(stream.try_clone().expect("clone socket"));
        let (pong_tx, pong_rx) = mpsc::channel();
        let (welcome_tx, welcome_rx) = mpsc::channel();
        let state = Arc::new(Mutex::new(Heard::default()));
        let person = Person {
            nick: nick.to_owned(),
            writer: Mutex::new(stream),
            state: state.clone(),
            pongs: Mutex::new(pong_rx),
            tokens: AtomicU64::new(0),
        };
        let answer = person
            .writer
            .lock()
            .unwrap()
            .try_clone()
            .expect("clone socket");
        std::thread::spawn(move || read_person(reader, answer, state, pong_tx, welcome_tx));
        if let Some(password) = ircd.password() {
            person.write(&format!("PASS {password}"));
        }
        person.write(&format!("NICK {nick}"));
        person.write(&format!("USER {nick} 0 * :{nick}"));
        match welcome_rx.recv_timeout(CONFIRM_WAIT) {
            Ok(code) if code == "001" => {}
            Ok(code) => panic!("{nick} could not register: {code}"),
            Err(_) => panic!("{nick} got no welcome from the IRC server"),
        }
        for channel in channels {
            person.write(&format!("JOIN {channel}"));
        }
        person.sync();
        person
    }

    /// The person's nick.
    pub fn nick(&self) -> &str {
        &self.nick
    }

    /// Writes one line (CRLF added) without waiting.
    pub fn write(&self, line: &str) {
        let mut w = self.writer.lock().unwrap();
        w.write_all(format!("{line}\r\n").as_bytes())
            .unwrap_or_else(|e| panic!("{} cannot write to the IRC server: {e}", self.nick));
    }

    /// Waits until the server processed every line written so far.
    pub fn sync(&self) {
        let token = format!("sync{}", self.tokens.fetch_add(1, Ordering::Relaxed));
        self.write(&format!("PING :{token}"));
        let pongs = self.pongs.lock().unwrap();
        let deadline = Instant::now() + CONFIRM_WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match pongs.recv_timeout(left) {
                Ok(t) if t == token => return,
                Ok(_) => continue,
                Err(_) => panic!("{}: the IRC server did not answer a PING", self.nick),
            }
        }
    }

    /// Says `text` to `target` and waits until the server relayed it.
    pub fn say(&self, target: &str, text: &str) {
        self.write(&format!("PRIVMSG {target} :{text}"));
        self.sync();
    }

    /// Every line received so far, as received.
    pub fn raw_lines(&self) -> Vec<Vec<u8>> {
        self.state.lock().unwrap().raw.clone()
    }

    /// The texts of the `PRIVMSG`s `from` sent this person or a channel
    /// they are in, in order.
    pub fn messages_from(&self, from: &str) -> Vec<String> {
        self.raw_lines()
            .iter()
            .filter_map(|raw| {
                let line = String::from_utf8_lossy(raw);
                let rest = line.strip_prefix(':')?;
                let (source, rest) = rest.split_once(' ')?;
                let nick = source.split('!').next()?;
                let (command, rest) = rest.split_once(' ')?;
                let (_, text) = rest.split_once(" :")?;
                (command == "PRIVMSG" && nick.eq_ignore_ascii_case(from)).then(|| text.to_owned())
            })
            .collect()
    }

    /// Leaves the server.
    pub fn quit(&self) {
        self.write("QUIT :bye");
        let _ = self.writer.lock().unwrap().shutdown(Shutdown::Write);
    }
}

impl Drop for Person {
    fn drop(&mut self) {
        if let Ok(w) = self.writer.lock() {
            let _ = w.shutdown(Shutdown::Both);
        }
    }
}

fn read_person(
    reader: BufReader<TcpStream>,
    mut answer: TcpStream,
    state: Arc<Mutex<Heard>>,
    pongs: mpsc::Sender<String>,
    welcome: mpsc::Sender<String>,
) {
    for raw in reader.split(b'\n') {
        let Ok(mut raw) = raw else { return };
        if raw.last() == Some(&b'\r') {
            raw.pop();
        }
        let line = String::from_utf8_lossy(&raw).into_owned();
        let words: Vec<&str> = line.split(' ').collect();
        let (command, args) = if line.starts_with(':') {
            (
                words.get(1).copied().unwrap_or(""),
                &words[2.min(words.len())..],
            )
        } else {
            (
                words.first().copied().unwrap_or(""),
                &words[1.min(words.len())..],
            )
        };
        match command {
            "PING" => {
                let token = args.join(" ");
                let _ = answer.write_all(format!("PONG {token}\r\n").as_bytes());
            }
            "PONG" => {
                let token = line.rsplit_once(':').map_or("", |(_, t)| t);
                let _ = pongs.send(token.to_owned());
            }
            "001" | "432" | "433" | "436" | "437" | "465" => {
                let _ = welcome.send(command.to_owned());
            }
            _ => {}
        }
        state.lock().unwrap().raw.push(raw);
    }
}

/// The proxy's view of the bot.
#[derive(Default)]
struct Bot {
    /// The nick of the newest registration.
    nick: Option<String>,
    /// In [`CHANNEL`] on the newest connection.
    present: bool,
    /// Connections that got as far as joining [`CHANNEL`].
    connections: usize,
    /// The newest connection's sockets (bot side, server side).
    sockets: Option<(u64, TcpStream, TcpStream)>,
    sent: Vec<Out>,
    /// The message being sent: its target and lines so far.
    sending: Option<(String, Vec<String>)>,
    attempts: Vec<Instant>,
    hang: bool,
    /// Pushes made while the bot was away: who, target, text.
    waiting: Vec<(Who, bool, String)>,
}

/// IRC's kit (see the module docs).
pub struct IrcKit {
    /// The server, for tests that restart it.
    pub ircd: Ircd,
    /// Alice, on the allowlist.
    pub friend: Person,
    /// Mallory, on no list.
    pub stranger: Person,
    proxy_port: u16,
    bot: Arc<Mutex<Bot>>,
    pushes: AtomicUsize,
}

impl IrcKit {
    /// The kit around a server started by the caller (a TLS one, say).
    pub fn around(ircd: Ircd) -> IrcKit {
        let friend = Person::connect(&ircd, FRIEND, &[CHANNEL]);
        let stranger = Person::connect(&ircd, STRANGER, &[CHANNEL]);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the IRC proxy");
        let proxy_port = listener.local_addr().expect("proxy address").port();
        let bot = Arc::new(Mutex::new(Bot::default()));
        let server_port = ircd.port();
        let shared = bot.clone();
        std::thread::spawn(move || accept(listener, server_port, shared));
        IrcKit {
            ircd,
            friend,
            stranger,
            proxy_port,
            bot,
            pushes: AtomicUsize::new(0),
        }
    }

    /// The port the bot connects to (the proxy).
    pub fn proxy_port(&self) -> u16 {
        self.proxy_port
    }

    /// The bot's nick on its newest connection.
    pub fn bot_nick(&self) -> Option<String> {
        self.bot.lock().unwrap().nick.clone()
    }

    /// Another person on the server, in [`CHANNEL`] when `join`.
    pub fn person(&self, nick: &str, join: bool) -> Person {
        let channels: &[&str] = if join { &[CHANNEL] } else { &[] };
        Person::connect(&self.ircd, nick, channels)
    }

    /// Restarts the server (SIGKILL, then the same port) and brings Alice
    /// and Mallory back; the bot finds its own way back.
    pub fn restart_server(&mut self) {
        {
            let mut bot = self.bot.lock().unwrap();
            bot.present = false;
        }
        self.ircd.restart();
        self.friend = Person::connect(&self.ircd, FRIEND, &[CHANNEL]);
        self.stranger = Person::connect(&self.ircd, STRANGER, &[CHANNEL]);
    }

    fn person_for(&self, who: Who) -> &Person {
        match who {
            Who::Friend => &self.friend,
            Who::Stranger => &self.stranger,
        }
    }

    /// Says `text` as `who`, in [`CHANNEL`] or to the bot; held while the
    /// bot is away.
    fn push(&self, who: Who, in_channel: bool, text: &str) -> String {
        let id = self.pushes.fetch_add(1, Ordering::Relaxed) + 1;
        let nick = {
            let mut bot = self.bot.lock().unwrap();
            match (&bot.nick, bot.present) {
                (Some(nick), true) => nick.clone(),
                _ => {
                    bot.waiting.push((who, in_channel, text.to_owned()));
                    return id.to_string();
                }
            }
        };
        let target = if in_channel { CHANNEL } else { nick.as_str() };
        self.person_for(who).say(target, text);
        id.to_string()
    }

    /// Sends what waited for the bot, once it is back.
    fn flush_waiting(&self) {
        let (nick, waiting) = {
            let mut bot = self.bot.lock().unwrap();
            match (&bot.nick, bot.present) {
                (Some(nick), true) => (nick.clone(), std::mem::take(&mut bot.waiting)),
                _ => return,
            }
        };
        for (who, in_channel, text) in waiting {
            let target = if in_channel { CHANNEL } else { nick.as_str() };
            self.person_for(who).say(target, &text);
        }
    }
}

fn accept(listener: TcpListener, server_port: u16, bot: Arc<Mutex<Bot>>) {
    let mut next_id = 0u64;
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        let Ok(server) = TcpStream::connect(("127.0.0.1", server_port)) else {
            // The server is down (a restart): the bot tries again.
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        next_id += 1;
        let id = next_id;
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        {
            let mut b = bot.lock().unwrap();
            b.present = false;
            b.sending = None;
            if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
                b.sockets = Some((id, c, s));
            }
        }
        let (Ok(client_r), Ok(server_w), Ok(server_r), Ok(client_w)) = (
            client.try_clone(),
            server.try_clone(),
            server.try_clone(),
            client.try_clone(),
        ) else {
            continue;
        };
        let up = bot.clone();
        std::thread::spawn(move || bot_to_server(id, client_r, server_w, up));
        let down = bot.clone();
        std::thread::spawn(move || server_to_bot(id, server_r, client_w, down));
    }
}

/// Ends connection `id` on both sides.
fn close(id: u64, bot: &Mutex<Bot>) {
    let mut b = bot.lock().unwrap();
    if let Some((current, c, s)) = &b.sockets
        && *current == id
    {
        let _ = c.shutdown(Shutdown::Both);
        let _ = s.shutdown(Shutdown::Both);
        b.sockets = None;
        b.present = false;
    }
}

fn bot_to_server(id: u64, from: TcpStream, mut to: TcpStream, bot: Arc<Mutex<Bot>>) {
    let reader = BufReader::new(from);
    for raw in reader.split(b'\n') {
        let Ok(raw) = raw else { break };
        let line = String::from_utf8_lossy(&raw)
            .trim_end_matches('\r')
            .to_owned();
        let forward = {
            let mut b = bot.lock().unwrap();
            let mut words = line.splitn(3, ' ');
            let command = words.next().unwrap_or("").to_ascii_uppercase();
            match command.as_str() {
                "PRIVMSG" => {
                    let target = words.next().unwrap_or("").to_ascii_lowercase();
                    let text = words
                        .next()
                        .map(|t| t.strip_prefix(':').unwrap_or(t))
                        .unwrap_or("");
                    let text = if text == " " { "" } else { text };
                    if b.sending.is_none() {
                        b.attempts.push(Instant::now());
                        b.sending = Some((target.clone(), Vec::new()));
                    }
                    if let Some((_, lines)) = &mut b.sending {
                        lines.push(text.to_owned());
                    }
                    !b.hang
                }
                "PING" if line.contains(":talaria-sent-") => {
                    if let Some((chat, lines)) = b.sending.take()
                        && !b.hang
                    {
                        let text = lines.join("\n");
                        b.sent.push(Out {
                            chat,
                            thread: None,
                            wire: text.clone(),
                            text,
                            reply_to: None,
                            at: Instant::now(),
                        });
                    }
                    !b.hang
                }
                _ => true,
            }
        };
        if forward && to.write_all(format!("{line}\r\n").as_bytes()).is_err() {
            break;
        }
    }
    close(id, &bot);
}

fn server_to_bot(id: u64, from: TcpStream, mut to: TcpStream, bot: Arc<Mutex<Bot>>) {
    let reader = BufReader::new(from);
    for raw in reader.split(b'\n') {
        let Ok(mut raw) = raw else { break };
        {
            let line = String::from_utf8_lossy(&raw);
            let line = line.trim_end_matches('\r');
            let mut b = bot.lock().unwrap();
            let current = b.sockets.as_ref().is_some_and(|(c, _, _)| *c == id);
            let words: Vec<&str> = line.split(' ').collect();
            let source_nick = words
                .first()
                .and_then(|w| w.strip_prefix(':'))
                .map(|s| s.split('!').next().unwrap_or(s));
            let command = words.get(1).copied().unwrap_or("");
            let is_bot = |b: &Bot| {
                source_nick
                    .is_some_and(|n| b.nick.as_deref().is_some_and(|m| m.eq_ignore_ascii_case(n)))
            };
            if current {
                match command {
                    "001" => b.nick = words.get(2).map(|n| n.to_string()),
                    "NICK" if is_bot(&b) => {
                        let new = words.get(2).map(|n| n.trim_start_matches(':').to_owned());
                        b.nick = new;
                    }
                    "JOIN"
                        if is_bot(&b)
                            && words.get(2).is_some_and(|c| {
                                c.trim_start_matches(':').eq_ignore_ascii_case(CHANNEL)
                            }) =>
                    {
                        b.present = true;
                        b.connections += 1;
                    }
                    _ => {}
                }
            }
        }
        raw.push(b'\n');
        if to.write_all(&raw).is_err() {
            break;
        }
    }
    close(id, &bot);
}

impl PlatformKit for IrcKit {
    const NAME: &'static str = "irc";
    // IRC shows no replies.
    const DM_REPLY_QUOTES: bool = false;

    async fn start() -> IrcKit {
        IrcKit::around(Ircd::with_password(PASSWORD))
    }

    fn section(&self) -> String {
        format!(
            "  irc:\n    server: 127.0.0.1\n    port: {}\n    use_tls: false\n    nickname: {BOT_NICK}\n    \
             channel: \"{CHANNEL}\"\n    flood_burst: 5\n    flood_interval_ms: 300\n    ping_interval_secs: 3\n",
            self.proxy_port
        )
    }

    fn dotenv(&self) -> Vec<(String, String)> {
        vec![
            ("IRC_ALLOWED_USERS".into(), "Alice".into()),
            ("IRC_SERVER_PASSWORD".into(), PASSWORD.into()),
        ]
    }

    fn secret(&self) -> &str {
        PASSWORD
    }

    fn connections(&self) -> usize {
        self.bot.lock().unwrap().connections
    }

    async fn wait_connected(&self, n: usize) {
        wait_for(&format!("{n} bot connections in {CHANNEL}"), || async {
            let got = self.connections();
            if got >= n { Ok(()) } else { Err(got) }
        })
        .await;
        self.flush_waiting();
    }

    fn push_dm(&self, who: Who, text: &str) -> String {
        self.push(who, false, text)
    }

    fn dm_chat(&self, who: Who) -> String {
        self.person_for(who).nick().to_ascii_lowercase()
    }

    fn sent(&self) -> Vec<Out> {
        self.bot.lock().unwrap().sent.clone()
    }

    async fn wait_sent(&self, n: usize) -> Vec<Out> {
        wait_for(&format!("{n} messages from the bot"), || async {
            let sent = self.sent();
            if sent.len() >= n {
                Ok(sent)
            } else {
                Err(sent.into_iter().map(|o| o.text).collect::<Vec<_>>())
            }
        })
        .await
    }

    fn send_attempts(&self) -> Vec<Instant> {
        self.bot.lock().unwrap().attempts.clone()
    }

    async fn wait_send_attempts(&self, n: usize) {
        wait_for(&format!("{n} sends from the bot"), || async {
            let got = self.send_attempts().len();
            if got >= n { Ok(()) } else { Err(got) }
        })
        .await;
    }

    fn hang_send(&self, hang: bool) {
        self.bot.lock().unwrap().hang = hang;
    }

    async fn drop_connection(&self) {
        let sockets = self.bot.lock().unwrap().sockets.take();
        if let Some((_, c, s)) = sockets {
            let _ = c.shutdown(Shutdown::Both);
            let _ = s.shutdown(Shutdown::Both);
        }
        self.bot.lock().unwrap().present = false;
        // The server has seen the bot leave before anyone speaks again.
        let bot = self.bot.lock().unwrap().nick.clone().unwrap_or_default();
        wait_for("the server to drop the bot's connection", || async {
            self.friend.write(&format!("ISON {bot}"));
            self.friend.sync();
            let gone = self
                .friend
                .raw_lines()
                .iter()
                .rev()
                .map(|r| String::from_utf8_lossy(r).into_owned())
                .find(|l| l.split(' ').nth(1) == Some("303"))
                .is_some_and(|l| {
                    !l.rsplit_once(':').is_some_and(|(_, nicks)| {
                        nicks.split(' ').any(|n| n.eq_ignore_ascii_case(&bot))
                    })
                });
            if gone { Ok(()) } else { Err("still online") }
        })
        .await;
    }

    fn push_stranger_in_group(&self, text: &str) {
        let nick = self.bot_nick().unwrap_or_else(|| BOT_NICK.to_owned());
        self.push(Who::Stranger, true, &format!("{nick}: {text}"));
    }

    fn push_in_group(&self, text: &str, mention: bool) -> Threaded {
        let text = if mention {
            let nick = self.bot_nick().unwrap_or_else(|| BOT_NICK.to_owned());
            format!("{nick}: {text}")
        } else {
            text.to_owned()
        };
        let id = self.push(Who::Friend, true, &text);
        Threaded {
            id,
            chat: CHANNEL.to_owned(),
            thread: None,
        }
    }
}
