//! The gateway end to end with IRC against a real server (ngIRCd, started
//! by the kit): the adapter contract suite, and what only IRC does: lines
//! within 512 bytes, a nick collision, a server restart, TLS with a
//! private authority, and text that tries to smuggle commands.

use crate::contract;

use std::sync::Arc;
use std::time::Duration;

use contract::{AdapterKit, Rig};
use talaria_adapter::{AdapterContext, Inbox, LivenessReporter};
use talaria_core::{Config, Env};
use talaria_gateway::{Adapter, Liveness};
use talaria_platforms::irc::{IrcAdapter, IrcSettings};
use talaria_testkit::Reply;
use talaria_testkit::ircd::Ircd;
use talaria_testkit::kit::irc::{BOT_NICK, CHANNEL, IrcKit, Person};
use talaria_testkit::kit::{PlatformKit, Who};
use talaria_testkit::wait::wait_for;
use tokio_util::sync::CancellationToken;

impl AdapterKit for IrcKit {
    fn adapter(&self, config: &Config, env: &Env) -> Arc<dyn Adapter> {
        let settings = IrcSettings::from_config(&config.section().unwrap(), env)
            .unwrap()
            .unwrap();
        Arc::new(IrcAdapter::new(settings).unwrap())
    }
}

adapter_contract!(IrcKit;
    run: dm_turn, group_mention, long_answer_split, dropped_connection, unauthorized;
    skip: thread_reply => contract::Skip::Threadless,
          redelivery => contract::Skip::DeliversOnce,
          rate_limit => contract::Skip::UnlimitedSends,
          media_in => contract::Skip::ReceivesNoFiles,
          media_out => contract::Skip::SendsNoFiles);

/// The bot's lines as Alice received them: each within 512 bytes with its
/// CRLF, each valid UTF-8.
fn lines_from_the_bot(person: &Person, bot: &str) -> Vec<String> {
    person
        .raw_lines()
        .into_iter()
        .filter(|raw| {
            let line = String::from_utf8_lossy(raw);
            line.strip_prefix(':')
                .and_then(|l| l.split(['!', ' ']).next())
                .is_some_and(|n| n.eq_ignore_ascii_case(bot))
                && line.split(' ').nth(1) == Some("PRIVMSG")
        })
        .map(|raw| {
            assert!(
                raw.len() + 2 <= 512,
                "a relayed line is {} bytes with its CRLF",
                raw.len() + 2
            );
            String::from_utf8(raw).expect("a line cut inside a character")
        })
        .collect()
}

/// A 3,000-byte answer of multi-byte text arrives as lines the server
/// relays whole (at most 512 bytes each, as Alice receives them with the
/// bot's source in front), never cut inside a character, and nothing of it
/// is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_answer_arrives_as_valid_lines_within_512_bytes() {
    let rig = Rig::<IrcKit>::started(&[], |_| {}).await;
    let mut answer = String::new();
    while answer.len() < 3000 {
        answer.push_str("Grüße aus Köln — 東京の天気は晴れ ☀️ ");
        answer.push_str(&"é".repeat(40));
    }
    rig.llm.push(Reply::text(answer.clone()));
    rig.kit.push_dm(Who::Friend, "write a lot");
    rig.wait_for_delivered(1).await;
    rig.kit.friend.sync();
    let lines = lines_from_the_bot(&rig.kit.friend, BOT_NICK);
    assert!(lines.len() >= 7, "{} lines", lines.len());
    // The texts, part numbers and the spaces servers trim at line ends
    // aside, join into the answer.
    let texts: String = lines
        .iter()
        .map(|l| l.split_once(" :").unwrap().1)
        .map(|t| match t.rfind(" (") {
            Some(i) if t.ends_with(')') && t[i..].contains('/') => &t[..i],
            _ => t,
        })
        .collect();
    let squeeze = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    assert_eq!(squeeze(&texts), squeeze(&answer));
}

/// Text that tries to end its line and start a command of its own is sent
/// as text: Alice reads it, and the bot is still connected and in the
/// channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_cannot_smuggle_commands() {
    let rig = Rig::<IrcKit>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text(
        "fine\r\nQUIT :gone\nPART #talaria\u{0}\r\nJOIN #elsewhere",
    ));
    rig.kit.push_dm(Who::Friend, "try it");
    rig.wait_for_delivered(1).await;
    rig.kit.friend.sync();
    assert_eq!(
        rig.kit.friend.messages_from(BOT_NICK),
        ["fine", "QUIT :gone", "PART #talaria", "JOIN #elsewhere"]
    );
    let connections = rig.kit.connections();
    rig.barrier().await;
    assert_eq!(rig.kit.connections(), connections, "the bot reconnected");
}

/// A nick already taken gives way to `talaria_`, under which the bot
/// answers; once the nick is free again the bot takes it back (at its
/// next ping) and answers under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nick_in_use_gives_way_to_a_fallback_and_is_taken_back() {
    let mut rig = Rig::<IrcKit>::new(&[], |_| {}).await;
    let squatter = rig.kit.person(BOT_NICK, false);
    let seen = rig.kit.connections();
    rig.start();
    rig.kit.wait_connected(seen + 1).await;
    assert_eq!(rig.kit.bot_nick().as_deref(), Some("talaria_"));
    rig.llm
        .push(Reply::text("first answer, under the fallback"));
    rig.kit.push_dm(Who::Friend, "who are you?");
    rig.wait_for_text("first answer, under the fallback").await;

    squatter.quit();
    wait_for("the bot to take its nick back", || async {
        match rig.kit.bot_nick() {
            Some(nick) if nick == BOT_NICK => Ok(()),
            other => Err(other),
        }
    })
    .await;
    rig.llm
        .push(Reply::text("second answer, under the own nick"));
    rig.kit.push_dm(Who::Friend, "and now?");
    // Delivered is the server's PONG after the line: relayed to Alice
    // before her own PONG.
    rig.wait_for_delivered(2).await;
    rig.kit.friend.sync();
    assert_eq!(
        rig.kit.friend.messages_from("talaria_"),
        ["first answer, under the fallback"]
    );
    assert_eq!(
        rig.kit.friend.messages_from(BOT_NICK),
        ["second answer, under the own nick"]
    );
}

/// The server killed and started again: the bot reconnects, registers,
/// rejoins the channel and answers there and in private.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bot_comes_back_after_a_server_restart() {
    let mut rig = Rig::<IrcKit>::started(&[], |_| {}).await;
    rig.llm.push(Reply::text("before the restart"));
    rig.kit.push_dm(Who::Friend, "hello");
    rig.wait_for_text("before the restart").await;

    let seen = rig.kit.connections();
    rig.kit.restart_server();
    rig.kit.wait_connected(seen + 1).await;
    rig.llm.push(Reply::text("after the restart"));
    let asked = rig.kit.push_in_group("still there?", true);
    let sent = rig.wait_for_text("after the restart").await;
    assert!(
        sent.iter()
            .any(|o| o.chat == asked.chat && o.text == "after the restart")
    );
    rig.llm.push(Reply::text("and in private"));
    rig.kit.push_dm(Who::Friend, "and here?");
    rig.wait_for_text("and in private").await;
    assert_eq!(rig.status().map(|s| s.0), Some(Liveness::Live));
    rig.wait_for_delivered(3).await;
}

/// An adapter running on its own: what it hands over, its liveness, its
/// stop switch and its task.
type Running = (
    tokio::sync::mpsc::Receiver<talaria_adapter::MessageEvent>,
    tokio::sync::watch::Receiver<Liveness>,
    CancellationToken,
    tokio::task::JoinHandle<Result<(), talaria_adapter::AdapterError>>,
);

/// Runs `adapter` with a fresh inbox.
fn run(adapter: Arc<IrcAdapter>) -> Running {
    let (inbox, events) = Inbox::channel(16);
    let (liveness, live) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    let ctx = AdapterContext {
        inbox,
        liveness,
        shutdown: shutdown.clone(),
    };
    let task = tokio::spawn(async move { adapter.run(ctx).await });
    (events, live, shutdown, task)
}

/// Over TLS, a server whose certificate a private authority signed is
/// trusted once that authority is configured, and not before: without it
/// the connection fails on the certificate and nothing is sent in clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_verified_against_the_configured_authority() {
    let ircd = Ircd::start_tls();
    let port = ircd.tls_port().unwrap();
    let mut settings = IrcSettings::new("127.0.0.1", "tlsbot");
    settings.port = port;
    settings.channels = vec![CHANNEL.to_owned()];

    let untrusted = Arc::new(IrcAdapter::new(settings.clone()).unwrap());
    let (_events, _live, _stop, task) = run(untrusted);
    let failed = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        failed.contains("TLS") && failed.contains("certificate"),
        "{failed}"
    );

    settings.tls_ca_file = Some(ircd.ca_file().display().to_string());
    let adapter = Arc::new(IrcAdapter::new(settings).unwrap());
    let (mut events, mut live, stop, task) = run(adapter.clone());
    tokio::time::timeout(
        Duration::from_secs(30),
        live.wait_for(|l| *l == Liveness::Live),
    )
    .await
    .unwrap()
    .unwrap();
    let alice = Person::connect(&ircd, "alice", &[CHANNEL]);
    alice.say("tlsbot", "hello over TLS");
    let event = tokio::time::timeout(Duration::from_secs(30), events.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(event.text, "hello over TLS");
    assert_eq!(event.source.chat_id, "alice");
    adapter
        .send(&talaria_adapter::OutboundMessage {
            chat_id: "alice".into(),
            thread_id: None,
            reply_to: None,
            text: "**hello** back".into(),
            choices: Vec::new(),
        })
        .await
        .unwrap();
    alice.sync();
    assert_eq!(alice.messages_from("tlsbot"), ["hello back"]);
    // A message to someone who is not there is refused for good.
    let gone = adapter
        .send(&talaria_adapter::OutboundMessage {
            chat_id: "nobody".into(),
            thread_id: None,
            reply_to: None,
            text: "anyone?".into(),
            choices: Vec::new(),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&gone, talaria_adapter::SendError::Rejected(why) if why.contains("nobody")),
        "{gone:?}"
    );
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // The bot said goodbye rather than vanishing.
    wait_for("the bot's QUIT", || async {
        alice.sync();
        let quit = alice.raw_lines().iter().any(|raw| {
            let line = String::from_utf8_lossy(raw);
            line.starts_with(":tlsbot!") && line.contains(" QUIT ")
        });
        if quit { Ok(()) } else { Err("no QUIT yet") }
    })
    .await;
}
