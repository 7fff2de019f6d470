//! The shared commands' pure parts; `talaria-cli`'s table test runs every
//! command through both front ends.

use talaria_core::commands::COMMANDS;

use super::*;

fn record(id: &str, title: Option<&str>) -> SessionRecord {
    SessionRecord {
        id: id.to_owned(),
        source: "cli".to_owned(),
        title: title.map(str::to_owned),
        started_at: 1_700_000_000.0,
        message_count: 4,
        ..SessionRecord::default()
    }
}

#[test]
fn every_command_in_the_registry_has_an_action() {
    for c in COMMANDS {
        assert!(Action::of(c.name).is_some(), "/{} has no action", c.name);
    }
    assert_eq!(Action::of("frobnicate"), None);
}

#[test]
fn commands_offered_elsewhere_say_where() {
    assert_eq!(
        not_offered("sethome", Availability::GatewayOnly),
        "/sethome is only available in chats served by the gateway. Type /help to see the commands here."
    );
    assert!(not_offered("exit", Availability::CliOnly).contains("in the terminal"));
}

#[test]
fn titles_lose_control_characters_and_are_capped() {
    assert_eq!(clean_title("My notes").as_deref(), Some("My notes"));
    assert_eq!(clean_title("a\u{1b}[31mb\n").as_deref(), Some("a[31mb"));
    assert_eq!(clean_title("\u{7}\t"), None);
    assert_eq!(
        clean_title(&"é".repeat(150)).map(|t| t.chars().count()),
        Some(100)
    );
}

#[test]
fn undo_counts() {
    assert_eq!(exchange_count(""), Some(1));
    assert_eq!(exchange_count("3"), Some(3));
    assert_eq!(exchange_count("0"), None);
    assert_eq!(exchange_count("-1"), None);
    assert_eq!(exchange_count("two"), None);
}

#[test]
fn approval_arguments() {
    assert_eq!(approval_from_args(""), ApprovalDecision::Once);
    assert_eq!(approval_from_args(" Session "), ApprovalDecision::Session);
    assert_eq!(approval_from_args("always"), ApprovalDecision::Always);
    assert_eq!(approval_from_args("permanent"), ApprovalDecision::Always);
}

#[test]
fn session_list_is_numbered_and_marks_the_current_one() {
    let list = vec![record("s2", Some("Trip")), record("s1", None)];
    let out = format_sessions(&list, &[7, 4], Some("s1"));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[1].starts_with(" 1. Trip · s2 · "), "{out}");
    assert!(!lines[1].contains("(current)"), "{out}");
    assert!(lines[2].starts_with(" 2. (untitled) · s1 · "), "{out}");
    assert!(lines[2].ends_with("4 messages (current)"), "{out}");
    assert_eq!(
        format_sessions(&[], &[], Some("s1")),
        "No conversations yet."
    );
    assert_eq!(messages(1), "1 message");
}
