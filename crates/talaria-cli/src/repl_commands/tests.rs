//! The terminal's commands, and the table that runs every command through
//! both front ends (this terminal and a chat served by the gateway's
//! runner) and compares what each answers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use talaria_agent::NullObserver;
use talaria_agent::interaction::NoHuman;
use talaria_core::commands::{COMMANDS, CommandDef, resolve};
use talaria_core::{Env, Home};
use talaria_gateway::delivery::Delivery;
use talaria_gateway::hooks::Hooks;
use talaria_gateway::runner::{Runner, RunnerParts};
use talaria_gateway::slash::{Action, not_offered};
use talaria_gateway::supervisor::StatusBoard;
use talaria_gateway::{Adapter, Admission, Inbox, MessageEvent, SessionSource};
use talaria_testkit::recorder::Recorder;
use talaria_testkit::{MockOpenAi, Reply as ModelReply};
use tokio_util::sync::CancellationToken;

use super::*;

/// The command a terminal line runs, as the registry and the shared
/// actions resolve it; `None` for a prompt, an unknown name or a command
/// the terminal does not offer.
fn command(line: &str) -> Option<(&'static str, Action, &str)> {
    let inv = Invocation::parse(line)?;
    let def = resolve(inv.name)?;
    if !def.availability.offered_on(Availability::CliOnly) {
        return None;
    }
    Some((def.name, Action::of(def.name)?, inv.args))
}

#[test]
fn names_and_aliases_reach_their_actions() {
    assert_eq!(command("/new"), Some(("new", Action::New, "")));
    assert_eq!(
        command("/reset Trip plans"),
        Some(("new", Action::New, "Trip plans"))
    );
    assert_eq!(command("/Q do it"), Some(("queue", Action::Queue, "do it")));
    assert_eq!(command("/steer go"), Some(("steer", Action::Steer, "go")));
    assert_eq!(
        command("/compact"),
        Some(("compress", Action::Compress, ""))
    );
    assert_eq!(command("/commands"), Some(("help", Action::Help, "")));
    assert_eq!(command("/v"), Some(("version", Action::Version, "")));
    assert_eq!(command("/quit"), Some(("exit", Action::Exit, "")));
    assert_eq!(command("/EXIT"), Some(("exit", Action::Exit, "")));
    assert_eq!(command("/undo 2"), Some(("undo", Action::Undo, "2")));
}

#[test]
fn unknown_and_gateway_only_commands_are_not_terminal_commands() {
    assert_eq!(resolve("frobnicate"), None);
    assert_eq!(resolve("res"), None);
    for line in ["/sethome", "/set_home", "/approve always", "/deny"] {
        let inv = Invocation::parse(line).unwrap();
        assert!(resolve(inv.name).is_some(), "{line}");
        assert_eq!(command(line), None, "{line}");
    }
}

#[test]
fn text_that_is_not_a_command_goes_to_the_model() {
    for line in ["hello", "/usr/bin/ls -la", "/", "what does /new do?"] {
        assert_eq!(Invocation::parse(line), None, "{line}");
    }
}

#[test]
fn every_command_offered_in_the_terminal_is_implemented() {
    for c in COMMANDS {
        let line = format!("/{}", c.name);
        if c.availability.offered_on(Availability::CliOnly) {
            assert!(
                matches!(command(&line), Some((name, _, _)) if name == c.name),
                "{line} has no terminal action"
            );
        } else {
            assert_eq!(command(&line), None, "{line}");
        }
    }
}

/// What a front end made of one line, in words both can be compared in.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    /// Text shown to the user (said or refused).
    Text(String),
    /// A turn ran with this user text.
    Turn(String),
    /// The terminal left.
    Exit,
}

/// The two front ends over one home, one store and one model.
struct Fronts {
    mock: MockOpenAi,
    rt: Runtime,
    agent: Arc<Agent>,
    client: Arc<LlmClient>,
    session: Option<SessionHandle>,
    recorder: Arc<Recorder>,
    inbox: Inbox,
    stop: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Fronts {
    async fn start() -> Fronts {
        let mock = MockOpenAi::start().await;
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        home.ensure().unwrap();
        std::fs::write(
            home.config_file(),
            format!(
                "model:\n  default: mock-model\n  base_url: {}\n",
                mock.base_url()
            ),
        )
        .unwrap();
        let rt = Runtime::load(home.clone(), "warn").await.unwrap();
        let (agent, client) = rt.agent(Arc::new(NoHuman)).unwrap();
        let session = agent.new_session(SOURCE).await.unwrap();
        let recorder = Arc::new(Recorder::new("telegram"));
        let runner = Runner::new(RunnerParts {
            config: rt.config.clone(),
            env: Env::from_pairs([("TELEGRAM_ALLOWED_USERS", "42")]),
            home,
            agent: agent.clone(),
            store: rt.gateway_store.clone(),
            delivery: Delivery::new(vec![recorder.clone() as Arc<dyn Adapter>], None),
            board: Arc::new(StatusBoard::default()),
            hooks: Arc::new(Hooks::none()),
            turn_leases: None,
            backends: rt.backends.clone(),
            node: talaria_store::NodeId::random(),
            media: Arc::new(
                talaria_gateway::media::MediaServices::from_config(
                    &rt.config,
                    &rt.loaded.env,
                    &rt.home,
                    "mock-model",
                )
                .0,
            ),
        });
        let (inbox, events) = Inbox::admitting(16);
        let stop = CancellationToken::new();
        let serving = stop.clone();
        tokio::spawn(async move { runner.serve(events, serving).await });
        Fronts {
            mock,
            rt,
            agent,
            client,
            session: Some(session),
            recorder,
            inbox,
            stop,
            _dir: dir,
        }
    }

    /// The line at the terminal; a turn it asks for is run, as the REPL
    /// would.
    async fn terminal(&mut self, line: &str) -> Answer {
        let invocation = Invocation::parse(line).expect("a command");
        let session = self.session.take().expect("a session");
        let agent = self.agent.clone();
        let client = self.client.clone();
        let mut commands = Commands::new(&self.rt, &agent, &client, session);
        let reply = commands.answer(invocation).await;
        let session = commands.session().clone();
        let answer = match reply {
            Reply::Say(text) | Reply::Refuse(text) => Answer::Text(text),
            Reply::Turn(text) => {
                self.mock.push(ModelReply::text("ok"));
                let outcome = agent
                    .run_turn(&session, &text, &NullObserver, CancellationToken::new())
                    .await
                    .unwrap();
                assert_eq!(outcome.answer, "ok");
                Answer::Turn(text)
            }
            Reply::Exit => Answer::Exit,
            Reply::Done => Answer::Text(String::new()),
        };
        self.session = Some(session);
        answer
    }

    /// The line in the chat: the one message the runner sends back, or the
    /// turn it starts (waited for until answered).
    async fn chat(&mut self, line: &str, turn: bool) -> Answer {
        let before_sent = self.recorder.sent().len();
        let before_asked = self.mock.requests().len();
        if turn {
            self.mock.push(ModelReply::text("ok"));
        }
        let event = MessageEvent::text(SessionSource::dm("telegram", "42", "42"), line);
        assert_eq!(self.inbox.admit(event).await.unwrap(), Admission::Accepted);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let sent: Vec<String> = self.recorder.sent().into_iter().map(|m| m.text).collect();
            if sent.len() > before_sent {
                if !turn {
                    assert_eq!(sent.len(), before_sent + 1, "{sent:?}");
                    return Answer::Text(sent[before_sent].clone());
                }
                assert_eq!(sent[before_sent..], ["ok".to_owned()], "{line}");
                let asked = self.mock.requests();
                assert_eq!(asked.len(), before_asked + 1, "{line}");
                let user = asked[before_asked].body["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .rev()
                    .find(|m| m["role"] == "user")
                    .and_then(|m| m["content"].as_str())
                    .unwrap_or_default()
                    .to_owned();
                return Answer::Turn(user);
            }
            assert!(
                Instant::now() < deadline,
                "no answer to {line:?} in the chat"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Every session's id: what `normalize` hides.
    async fn ids(&self) -> Vec<String> {
        let all = self
            .rt
            .store
            .list_sessions(SessionFilter {
                limit: 100,
                ..SessionFilter::default()
            })
            .await
            .unwrap();
        all.into_iter().map(|s| s.id).collect()
    }
}

impl Drop for Fronts {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// What a row expects of the two answers.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// The same text in both (session ids and dates aside).
    Same,
    /// The same turn in both.
    SameTurn,
    /// Both start alike; the rest is the front end's own (where the user
    /// is, what else it serves, how to restart it).
    SamePrefix(&'static str),
    /// Only the terminal offers it: the chat says so.
    TerminalOnly,
    /// Only chats offer it: the terminal says so.
    ChatOnly,
    /// Only the terminal offers it, and answers with this beginning; the
    /// chat says it is not offered there.
    TerminalOnlySays(&'static str),
}

/// Session ids and `YYYY-MM-DD HH:MM` times replaced by placeholders: the
/// two front ends run different sessions, started moments apart.
fn normalize(text: &str, ids: &[String]) -> String {
    let mut out = text.to_owned();
    for id in ids {
        out = out.replace(id.as_str(), "<id>");
    }
    let chars: Vec<char> = out.chars().collect();
    let shape = "dddd-dd-dd dd:dd";
    let fits = |at: usize| {
        shape.chars().enumerate().all(|(i, s)| {
            chars.get(at + i).is_some_and(|&c| match s {
                'd' => c.is_ascii_digit(),
                other => c == other,
            })
        })
    };
    let mut result = String::new();
    let mut i = 0;
    while i < chars.len() {
        if fits(i) {
            result.push_str("<when>");
            i += shape.len();
        } else {
            result.push(chars[i]);
            i += 1;
        }
    }
    result
}

/// Every command, in an order that leaves the two front ends in the same
/// state after each row (a turn one runs, the other runs too).
const TABLE: &[(&str, Expect)] = &[
    ("/help", Expect::SamePrefix("Commands:\n/new (also /reset)")),
    ("/version", Expect::Same),
    ("/title Trip", Expect::Same),
    ("/title", Expect::Same),
    (
        "/status",
        Expect::SamePrefix(
            "Conversation: <id> (Trip)\nMessages: 2 · tokens in 10 / out 5\nIdle\nModel: mock-model",
        ),
    ),
    ("/usage", Expect::Same),
    ("/model", Expect::Same),
    ("/model other-model", Expect::Same),
    ("/model default", Expect::Same),
    ("/whoami", Expect::SamePrefix("")),
    ("/sessions", Expect::Same),
    ("/undo 5", Expect::Same),
    ("/undo zero", Expect::Same),
    ("/retry", Expect::SameTurn),
    ("/undo", Expect::Same),
    ("/undo", Expect::Same),
    ("/retry", Expect::Same),
    ("/compress", Expect::Same),
    ("/queue", Expect::Same),
    ("/steer", Expect::Same),
    ("/queue do this", Expect::SameTurn),
    ("/steer go on", Expect::SameTurn),
    ("/stop", Expect::SamePrefix("Nothing is running.")),
    ("/learn", Expect::Same),
    ("/learn rotating nginx logs", Expect::SameTurn),
    ("/skills", Expect::Same),
    ("/system-health only the disks", Expect::SameTurn),
    ("/reload-mcp", Expect::Same),
    ("/approve", Expect::ChatOnly),
    ("/deny", Expect::ChatOnly),
    ("/sethome", Expect::ChatOnly),
    ("/background", Expect::ChatOnly),
    ("/exit", Expect::TerminalOnly),
    ("/image", Expect::TerminalOnlySays("usage: /image PATH")),
    ("/new Fresh", Expect::Same),
    ("/resume", Expect::Same),
    ("/resume fresh", Expect::Same),
    ("/resume 1", Expect::Same),
    ("/resume nope", Expect::Same),
    ("/frobnicate now", Expect::Same),
];

fn def_of(line: &str) -> Option<&'static CommandDef> {
    resolve(Invocation::parse(line)?.name)
}

#[test]
fn the_table_covers_every_command() {
    for c in COMMANDS {
        assert!(
            TABLE.iter().any(|(line, _)| def_of(line) == Some(c)),
            "/{} is not in the table",
            c.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_answers_alike_in_the_terminal_and_in_a_chat() {
    let mut f = Fronts::start().await;
    // One exchange in each, so both have a conversation to act on.
    assert_eq!(
        f.terminal("/queue hello").await,
        Answer::Turn("hello".to_owned())
    );
    assert_eq!(
        f.chat("hello", true).await,
        Answer::Turn("hello".to_owned())
    );
    for &(line, expect) in TABLE {
        let turn = matches!(expect, Expect::SameTurn);
        let terminal = f.terminal(line).await;
        let chat = f.chat(line, turn).await;
        let ids = f.ids().await;
        let text = |a: &Answer| match a {
            Answer::Text(t) => normalize(t, &ids),
            other => panic!("{line}: a text was expected, not {other:?}"),
        };
        match expect {
            Expect::Same => assert_eq!(text(&terminal), text(&chat), "{line}"),
            Expect::SameTurn => {
                assert!(matches!(terminal, Answer::Turn(_)), "{line}: {terminal:?}");
                assert_eq!(terminal, chat, "{line}");
            }
            Expect::SamePrefix(prefix) => {
                let (t, c) = (text(&terminal), text(&chat));
                assert!(t.starts_with(prefix), "{line}: {t}");
                assert!(c.starts_with(prefix), "{line}: {c}");
                assert_ne!(t, c, "{line}: the same after all; make it Same");
            }
            Expect::ChatOnly => {
                let def = def_of(line).unwrap();
                assert_eq!(
                    text(&terminal),
                    not_offered(def.name, def.availability),
                    "{line}"
                );
                assert!(!text(&chat).contains("only available"), "{line}: {chat:?}");
            }
            Expect::TerminalOnlySays(prefix) => {
                let def = def_of(line).unwrap();
                assert!(text(&terminal).starts_with(prefix), "{line}: {terminal:?}");
                assert_eq!(
                    text(&chat),
                    not_offered(def.name, def.availability),
                    "{line}"
                );
            }
            Expect::TerminalOnly => {
                let def = def_of(line).unwrap();
                assert_eq!(terminal, Answer::Exit, "{line}");
                assert_eq!(
                    text(&chat),
                    not_offered(def.name, def.availability),
                    "{line}"
                );
            }
        }
    }
}
