//! The IRC adapter's SASL PLAIN login, against a scripted server: ngIRCd
//! has no SASL, so the server here follows the IRCv3 specifications
//! (`capability-negotiation` 3.2 and `sasl-3.1`) step by step and records
//! every line the adapter sent:
//!
//! 1. `CAP LS 302` → `CAP * LS :multi-prefix sasl=PLAIN,EXTERNAL`
//! 2. `CAP REQ :sasl` → `CAP * ACK :sasl`
//! 3. `AUTHENTICATE PLAIN` → `AUTHENTICATE +`
//! 4. `AUTHENTICATE <base64>` in 400-byte pieces, `+` after an exact 400 →
//!    `900` and `903`, or `904` for a wrong password
//! 5. `CAP END` (registration resumes) → `001`
//!
//! The server does not welcome the client before `CAP END`, as the
//! specification requires of a server once `CAP LS` was sent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use talaria_adapter::{AdapterContext, AdapterError, Inbox, Liveness, LivenessReporter};
use talaria_core::Secret;
use talaria_gateway::Adapter;
use talaria_platforms::irc::{IrcAdapter, IrcSettings};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// What the scripted server saw.
#[derive(Default)]
struct Seen {
    lines: Vec<String>,
    /// The decoded SASL payload.
    payload: Option<Vec<u8>>,
}

/// A server that accepts one connection and runs the SASL script,
/// accepting `password` for account `account`.
async fn scripted_server(account: &'static str, password: String) -> (u16, Arc<Mutex<Seen>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let record = seen.clone();
    tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let (read, mut write) = socket.into_split();
        let mut lines = BufReader::new(read).lines();
        let mut encoded = String::new();
        let mut nick = String::from("*");
        while let Ok(Some(line)) = lines.next_line().await {
            record.lock().unwrap().lines.push(line.clone());
            let reply = match line.split(' ').collect::<Vec<_>>().as_slice() {
                ["CAP", "LS", "302"] => {
                    ":sasl.test CAP * LS :multi-prefix sasl=PLAIN,EXTERNAL\r\n".to_owned()
                }
                ["CAP", "REQ", ":sasl"] => ":sasl.test CAP * ACK :sasl\r\n".to_owned(),
                ["NICK", n] => {
                    nick = (*n).to_owned();
                    String::new()
                }
                ["AUTHENTICATE", "PLAIN"] => "AUTHENTICATE +\r\n".to_owned(),
                ["AUTHENTICATE", piece] => {
                    if *piece != "+" {
                        encoded.push_str(piece);
                    }
                    if piece.len() == 400 {
                        // More to come.
                        String::new()
                    } else {
                        let payload = base64::engine::general_purpose::STANDARD
                            .decode(&encoded)
                            .unwrap();
                        let expected = format!("{account}\0{account}\0{password}");
                        let ok = payload == expected.as_bytes();
                        record.lock().unwrap().payload = Some(payload);
                        if ok {
                            format!(
                                ":sasl.test 900 {nick} {nick}!u@h {account} :You are now logged in as {account}\r\n\
                                 :sasl.test 903 {nick} :SASL authentication successful\r\n"
                            )
                        } else {
                            format!(":sasl.test 904 {nick} :SASL authentication failed\r\n")
                        }
                    }
                }
                ["CAP", "END"] => format!(":sasl.test 001 {nick} :Welcome to the scripted net\r\n"),
                ["PING", token] => format!(":sasl.test PONG sasl.test {token}\r\n"),
                _ => String::new(),
            };
            if !reply.is_empty() && write.write_all(reply.as_bytes()).await.is_err() {
                break;
            }
        }
    });
    (port, seen)
}

fn settings(port: u16, password: &str) -> IrcSettings {
    let mut s = IrcSettings::new("127.0.0.1", "saslbot");
    s.port = port;
    s.use_tls = false;
    s.sasl = Some(("botaccount".into(), Secret::new(password)));
    s
}

fn context() -> (
    AdapterContext,
    tokio::sync::watch::Receiver<Liveness>,
    CancellationToken,
) {
    let (inbox, _events) = Inbox::channel(4);
    let (liveness, live) = LivenessReporter::new();
    let shutdown = CancellationToken::new();
    (
        AdapterContext {
            inbox,
            liveness,
            shutdown: shutdown.clone(),
        },
        live,
        shutdown,
    )
}

/// The whole exchange in order, a password long enough to need three
/// pieces, and the welcome only after `CAP END`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_plain_logs_in_before_registration_ends() {
    let password = "p".repeat(650);
    let (port, seen) = scripted_server("botaccount", password.clone()).await;
    let adapter = Arc::new(IrcAdapter::new(settings(port, &password)).unwrap());
    let (ctx, mut live, stop) = context();
    let running = adapter.clone();
    let task = tokio::spawn(async move { running.run(ctx).await });
    tokio::time::timeout(
        Duration::from_secs(20),
        live.wait_for(|l| *l == Liveness::Live),
    )
    .await
    .unwrap()
    .unwrap();
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let seen = seen.lock().unwrap();
    let expected = format!("botaccount\0botaccount\0{password}");
    assert_eq!(seen.payload.as_deref(), Some(expected.as_bytes()));
    let commands: Vec<String> = seen
        .lines
        .iter()
        .map(|l| match l.split_once(' ') {
            Some(("AUTHENTICATE", arg)) if arg != "PLAIN" => {
                format!("AUTHENTICATE <{}>", arg.len())
            }
            _ => l.clone(),
        })
        .collect();
    // 650 + 22 bytes encode to 896 characters: 400, 400, 96.
    assert_eq!(
        commands[..9],
        [
            "CAP LS 302",
            "NICK saslbot",
            "USER saslbot 0 * :Talaria",
            "CAP REQ :sasl",
            "AUTHENTICATE PLAIN",
            "AUTHENTICATE <400>",
            "AUTHENTICATE <400>",
            "AUTHENTICATE <96>",
            "CAP END",
        ]
    );
}

/// A wrong password ends the connection as a fatal error that names the
/// settings to fix; the password itself is never in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_sasl_login_is_fatal_and_says_what_to_fix() {
    let (port, _seen) = scripted_server("botaccount", "right".into()).await;
    let adapter = IrcAdapter::new(settings(port, "wrong-password-123")).unwrap();
    let (ctx, _live, _stop) = context();
    let error = tokio::time::timeout(Duration::from_secs(20), adapter.run(ctx))
        .await
        .unwrap()
        .unwrap_err();
    match error {
        AdapterError::Fatal(why) => {
            assert!(
                why.contains("SASL") && why.contains("IRC_SASL_PASSWORD"),
                "{why}"
            );
            assert!(!why.contains("wrong-password-123"), "{why}");
        }
        other => panic!("{other:?}"),
    }
}

/// A server without the sasl capability cannot log the bot in: the
/// connection is refused rather than made without the login.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_sasl_is_refused_when_sasl_is_configured() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let (read, mut write) = socket.into_split();
        let mut lines = BufReader::new(read).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.starts_with("CAP LS") {
                let _ = write
                    .write_all(b":plain.test CAP * LS :multi-prefix away-notify\r\n")
                    .await;
            }
        }
    });
    let adapter = IrcAdapter::new(settings(port, "pw")).unwrap();
    let (ctx, _live, _stop) = context();
    let error = tokio::time::timeout(Duration::from_secs(20), adapter.run(ctx))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(&error, AdapterError::Fatal(why) if why.contains("sasl capability")),
        "{error:?}"
    );
}
