//! The slash-command registry shared by the interactive CLI and the gateway.
//!
//! Both front ends split what the user typed with [`Invocation::parse`] and
//! look the name up with [`resolve`], so a command or alias means the same
//! thing everywhere and `/help` can never list something the dispatcher does
//! not know. Executing a command is `talaria_gateway::slash`'s job (one
//! implementation behind a small trait each front end implements); this
//! module only says what exists, where it is offered and whether it may run
//! while a turn is in progress.

use std::fmt::Write as _;

/// Which front ends offer a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Availability {
    /// Offered by the CLI and the gateway.
    Both,
    /// Offered only by the interactive CLI (for example `/exit`).
    CliOnly,
    /// Offered only in chats served by the gateway (for example `/sethome`).
    GatewayOnly,
}

impl Availability {
    /// Whether a command with this availability is offered on `surface`.
    ///
    /// `surface` names a front end: [`Availability::CliOnly`] means "the CLI",
    /// [`Availability::GatewayOnly`] means "the gateway", and
    /// [`Availability::Both`] means "any front end", so every command matches
    /// it.
    pub fn offered_on(self, surface: Availability) -> bool {
        match surface {
            Availability::Both => true,
            Availability::CliOnly => self != Availability::GatewayOnly,
            Availability::GatewayOnly => self != Availability::CliOnly,
        }
    }
}

/// What happens to a command sent while the agent is answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WhileRunning {
    /// Handled immediately, even mid-turn: controls of the running turn
    /// (`/stop`, `/approve`) and read-only or out-of-band commands.
    Allowed,
    /// Answered with "wait or /stop" mid-turn, because it reads or rewrites
    /// the transcript, the session or the model the running turn is using.
    Refused,
}

/// One slash command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandDef {
    /// The canonical name, lower-case, without the `/`.
    pub name: &'static str,
    /// Other names that resolve to this command.
    pub aliases: &'static [&'static str],
    /// One line for `/help`.
    pub description: &'static str,
    /// The arguments as shown in `/help` (`<prompt>`, `[N]`), or empty.
    pub args_hint: &'static str,
    /// Which front ends offer it.
    pub availability: Availability,
    /// Whether it may run while a turn is in progress.
    pub while_running: WhileRunning,
}

impl CommandDef {
    /// The canonical name followed by the aliases.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + use<> {
        std::iter::once(self.name).chain(self.aliases.iter().copied())
    }

    /// The usage line: `/name <args>`.
    pub fn usage(&self) -> String {
        if self.args_hint.is_empty() {
            format!("/{}", self.name)
        } else {
            format!("/{} {}", self.name, self.args_hint)
        }
    }
}

const fn def(
    name: &'static str,
    aliases: &'static [&'static str],
    args_hint: &'static str,
    description: &'static str,
    availability: Availability,
    while_running: WhileRunning,
) -> CommandDef {
    CommandDef {
        name,
        aliases,
        description,
        args_hint,
        availability,
        while_running,
    }
}

use Availability::{Both, CliOnly, GatewayOnly};
use WhileRunning::{Allowed, Refused};

/// Every built-in command, in the order `/help` lists them.
///
/// Names and aliases are lower-case and use `-`, never `_`: [`resolve`]
/// maps Telegram's `_` form onto them, so an underscore alias would be
/// unreachable.
pub static COMMANDS: &[CommandDef] = &[
    // Session control.
    def(
        "new",
        &["reset"],
        "",
        "Start a fresh conversation (stops the running turn)",
        Both,
        Allowed,
    ),
    def(
        "stop",
        &[],
        "",
        "Interrupt the running turn; the conversation is kept",
        Both,
        Allowed,
    ),
    def(
        "status",
        &[],
        "",
        "Show the conversation, whether a turn is running and what is queued",
        Both,
        Allowed,
    ),
    def(
        "queue",
        &["q"],
        "<prompt>",
        "Run a prompt as its own turn after the current one",
        Both,
        Allowed,
    ),
    def(
        "background",
        &["bg"],
        "<prompt>",
        "Run a prompt as its own conversation in the background; the answer comes here when ready",
        GatewayOnly,
        Allowed,
    ),
    def(
        "steer",
        &[],
        "<prompt>",
        "Add guidance to the running turn after its next tool call",
        Both,
        Allowed,
    ),
    def(
        "approve",
        &[],
        "[session|always]",
        "Approve the command waiting for approval",
        GatewayOnly,
        Allowed,
    ),
    def(
        "deny",
        &[],
        "",
        "Deny the command waiting for approval",
        GatewayOnly,
        Allowed,
    ),
    // Sessions and transcript. Everything here rewrites or switches what the
    // running turn is appending to, so it waits for the turn to end.
    def(
        "resume",
        &[],
        "[title or id]",
        "Switch to an earlier conversation",
        Both,
        Refused,
    ),
    def(
        "sessions",
        &[],
        "",
        "List recent conversations",
        Both,
        Allowed,
    ),
    // Refused because the end of a turn may set the title too, and the
    // user's choice must not race with (and lose to) the automatic one.
    def(
        "title",
        &[],
        "[name]",
        "Show or set the conversation title",
        Both,
        Refused,
    ),
    def(
        "retry",
        &[],
        "",
        "Send the last message again",
        Both,
        Refused,
    ),
    def(
        "undo",
        &[],
        "[N]",
        "Remove the last N exchanges from the conversation",
        Both,
        Refused,
    ),
    def(
        "compress",
        &["compact"],
        "",
        "Summarise older turns to free context",
        Both,
        Refused,
    ),
    // Configuration.
    def(
        "model",
        &[],
        "[name|provider:name|default]",
        "Show or switch this conversation's model",
        Both,
        Refused,
    ),
    def(
        "sethome",
        &["set-home"],
        "",
        "Make this chat the home channel for notifications",
        GatewayOnly,
        Allowed,
    ),
    // Information.
    def(
        "usage",
        &[],
        "",
        "Show token usage for this conversation",
        Both,
        Allowed,
    ),
    def(
        "whoami",
        &[],
        "",
        "Show who and where you are, as the bot sees it",
        Both,
        Allowed,
    ),
    def(
        "help",
        &["commands"],
        "",
        "List the commands",
        Both,
        Allowed,
    ),
    def(
        "version",
        &["v"],
        "",
        "Show the Talaria version",
        Both,
        Allowed,
    ),
    def(
        "skills",
        &[],
        "",
        "List the skills (yours and the bundled ones)",
        Both,
        Allowed,
    ),
    def(
        "learn",
        &[],
        "<topic>",
        "Have the agent research a topic and write it down as a skill",
        Both,
        Refused,
    ),
    def(
        "reload-mcp",
        &[],
        "",
        "Read the MCP servers from config.yaml again (restarts changed ones)",
        Both,
        Refused,
    ),
    // In a chat app a photo is simply sent; the terminal needs a command.
    def(
        "image",
        &["attach"],
        "PATH [message]",
        "Attach an image (or any file) to your next message",
        CliOnly,
        Refused,
    ),
    def("exit", &["quit"], "", "Leave the chat", CliOnly, Allowed),
];

/// The command `name` refers to, by exact name or alias.
///
/// `name` is matched case-insensitively after stripping any leading `/`s,
/// and `_` is read as `-` because Telegram's command menu only allows
/// underscores (`/set_home` is `/sethome`). There is no prefix matching:
/// `/res` resolves to nothing rather than guessing between `reset` and
/// `resume`.
///
/// A bot suffix is not stripped here: `reset@mybot` resolves to nothing.
/// Callers parse it off first ([`Invocation::parse`] does), because only
/// they know whether the suffix names this bot.
pub fn resolve(name: &str) -> Option<&'static CommandDef> {
    let wanted = name
        .trim_start_matches('/')
        .to_ascii_lowercase()
        .replace('_', "-");
    COMMANDS.iter().find(|c| c.names().any(|n| n == wanted))
}

/// A slash command as typed: `/name@bot args`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invocation<'a> {
    /// The name as typed, without `/` and without an `@bot` suffix. Not yet
    /// lower-cased or resolved to a canonical command.
    pub name: &'a str,
    /// Everything after the first run of whitespace, trimmed.
    pub args: &'a str,
}

impl<'a> Invocation<'a> {
    /// Parses `/cmd`, `/cmd args`, `/cmd@botname args`.
    ///
    /// Text that only looks like a command is not one: a path such as
    /// `/usr/bin/ls` (a `/` after the name), a lone `/`, or a name with
    /// characters no command uses. Such text is meant for the model.
    pub fn parse(text: &'a str) -> Option<Invocation<'a>> {
        let rest = text.trim_start().strip_prefix('/')?;
        let (head, args) = match rest.find(char::is_whitespace) {
            Some(i) => (&rest[..i], rest[i..].trim()),
            None => (rest, ""),
        };
        let name = match head.split_once('@') {
            Some((name, bot)) if !bot.is_empty() && !bot.contains('/') => name,
            Some(_) => return None,
            None => head,
        };
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        valid.then_some(Invocation { name, args })
    }
}

/// The `/help` text for one front end, one command per line with its
/// arguments, aliases and description.
///
/// `surface` selects the front end as in [`Availability::offered_on`]:
/// [`Availability::GatewayOnly`] lists what a chat user can type,
/// [`Availability::CliOnly`] what the CLI user can, [`Availability::Both`]
/// lists every command.
pub fn help_text(surface: Availability) -> String {
    let mut out = String::from("Commands:\n");
    for c in COMMANDS
        .iter()
        .filter(|c| c.availability.offered_on(surface))
    {
        let _ = write!(out, "{}", c.usage());
        if !c.aliases.is_empty() {
            let aliases: Vec<String> = c.aliases.iter().map(|a| format!("/{a}")).collect();
            let _ = write!(out, " (also {})", aliases.join(", "));
        }
        let _ = writeln!(out, " — {}", c.description);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn invocations_and_text_that_only_looks_like_one() {
        let p = Invocation::parse;
        assert_eq!(
            p("/new"),
            Some(Invocation {
                name: "new",
                args: ""
            })
        );
        assert_eq!(
            p("/queue  do this  "),
            Some(Invocation {
                name: "queue",
                args: "do this"
            })
        );
        assert_eq!(
            p("/reset@MyBot now"),
            Some(Invocation {
                name: "reset",
                args: "now"
            })
        );
        assert_eq!(p("/reload-mcp").map(|i| i.name), Some("reload-mcp"));
        assert_eq!(p("/usr/bin/ls"), None);
        assert_eq!(p("/usr/bin/ls -la"), None);
        assert_eq!(p("/"), None);
        assert_eq!(p("/ new"), None);
        assert_eq!(p("hello /new"), None);
        assert_eq!(p("/new@"), None);
        assert_eq!(p("/étoile"), None);
    }

    #[test]
    fn every_name_and_alias_resolves_to_its_command() {
        for c in COMMANDS {
            for n in c.names() {
                assert_eq!(resolve(n).map(|d| d.name), Some(c.name), "{n}");
                assert_eq!(resolve(&format!("/{n}")).map(|d| d.name), Some(c.name));
            }
        }
    }

    #[test]
    fn required_commands_and_aliases_exist() {
        let expected: &[(&str, &[&str])] = &[
            ("new", &["reset"]),
            ("stop", &[]),
            ("status", &[]),
            ("help", &["commands"]),
            ("queue", &["q"]),
            ("steer", &[]),
            ("background", &["bg"]),
            ("approve", &[]),
            ("deny", &[]),
            ("resume", &[]),
            ("sessions", &[]),
            ("title", &[]),
            ("retry", &[]),
            ("undo", &[]),
            ("compress", &["compact"]),
            ("model", &[]),
            ("usage", &[]),
            ("whoami", &[]),
            ("sethome", &["set-home"]),
            ("version", &["v"]),
            ("image", &["attach"]),
            ("exit", &["quit"]),
        ];
        for (name, aliases) in expected {
            let c = resolve(name).unwrap_or_else(|| panic!("/{name} is missing"));
            assert_eq!(c.name, *name);
            for a in *aliases {
                assert_eq!(resolve(a).map(|d| d.name), Some(*name), "alias {a}");
            }
        }
        assert_eq!(resolve("exit").unwrap().availability, CliOnly);
    }

    #[test]
    fn case_slashes_and_underscores_are_normalised() {
        assert_eq!(resolve("RESET").map(|d| d.name), Some("new"));
        assert_eq!(resolve("/Reset").map(|d| d.name), Some("new"));
        assert_eq!(resolve("//new").map(|d| d.name), Some("new"));
        assert_eq!(resolve("set_home").map(|d| d.name), Some("sethome"));
        assert_eq!(resolve("/SET_HOME").map(|d| d.name), Some("sethome"));
    }

    #[test]
    fn no_prefix_matching_and_no_bot_suffix_handling() {
        assert_eq!(resolve("/res"), None);
        assert_eq!(resolve("ne"), None);
        assert_eq!(resolve("news"), None);
        assert_eq!(resolve(""), None);
        assert_eq!(resolve("/"), None);
        assert_eq!(resolve(" new"), None);
        // The caller strips `@bot`; a suffix left on is not a command.
        assert_eq!(resolve("reset@bot"), None);
    }

    #[test]
    fn names_and_aliases_are_unique_and_well_formed() {
        let mut seen = HashSet::new();
        for c in COMMANDS {
            for n in c.names() {
                assert!(seen.insert(n), "/{n} is defined twice");
                assert!(
                    !n.is_empty()
                        && n.chars()
                            .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-'),
                    "/{n} is not lower-case ascii with dashes"
                );
            }
        }
    }

    #[test]
    fn commands_that_touch_the_transcript_or_model_are_refused_mid_turn() {
        for name in ["model", "retry", "undo", "compress", "resume", "title"] {
            assert_eq!(resolve(name).unwrap().while_running, Refused, "/{name}");
        }
        for name in [
            "stop", "new", "status", "approve", "deny", "queue", "steer", "help", "version",
            "whoami", "usage",
        ] {
            assert_eq!(resolve(name).unwrap().while_running, Allowed, "/{name}");
        }
    }

    #[test]
    fn help_lists_each_surface_with_hints_and_aliases() {
        let gateway = help_text(GatewayOnly);
        assert!(
            gateway.contains("/queue <prompt> (also /q) — "),
            "{gateway}"
        );
        assert!(gateway.contains("/sethome"), "{gateway}");
        assert!(gateway.contains("/approve [session|always]"), "{gateway}");
        assert!(!gateway.contains("/exit"), "{gateway}");

        let cli = help_text(CliOnly);
        assert!(cli.contains("/exit (also /quit)"), "{cli}");
        assert!(!cli.contains("/sethome"), "{cli}");

        let all = help_text(Both);
        assert_eq!(all.lines().count(), COMMANDS.len() + 1);
    }
}
