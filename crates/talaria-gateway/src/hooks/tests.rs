use super::*;

fn parse(text: &str) -> Result<Manifest, String> {
    Manifest::parse(text, "my-hook")
}

#[test]
fn manifest_defaults_and_fields() {
    let m = parse("events: [agent:end]\n").unwrap();
    assert_eq!(m.name, "my-hook");
    assert_eq!(m.description, "");
    assert_eq!(m.timeout, DEFAULT_TIMEOUT);
    assert_eq!(m.events, vec![EventPattern::Exact("agent:end".into())]);

    let m = parse(
        "name: audit\ndescription: Logs turns\nevents:\n  - message:received\n  - \"agent:*\"\n  - command:*\ntimeout_secs: 3\n",
    )
    .unwrap();
    assert_eq!(m.name, "audit");
    assert_eq!(m.description, "Logs turns");
    assert_eq!(m.timeout, Duration::from_secs(3));
    assert_eq!(
        m.events,
        vec![
            EventPattern::Exact("message:received".into()),
            EventPattern::Prefix("agent".into()),
            EventPattern::Prefix("command".into()),
        ]
    );
    assert!(m.warnings.is_empty(), "{:?}", m.warnings);
}

#[test]
fn manifest_without_usable_events_is_refused() {
    for text in [
        "",
        "name: x\n",
        "events: []\n",
        "events: [nope:nothing, \"bogus:*\", command:no-such-command]\n",
        "events: [: : :\n",
        "events: agent:end\n",
    ] {
        assert!(parse(text).is_err(), "{text:?} loaded");
    }
    let why = parse("name: x\n").unwrap_err();
    assert!(why.contains("no events"), "{why}");
}

#[test]
fn unusable_entries_warn_but_the_rest_loads() {
    let m = parse("events: [agent:end, agent:step, agent:end]\n").unwrap();
    assert_eq!(m.events, vec![EventPattern::Exact("agent:end".into())]);
    assert_eq!(m.warnings.len(), 1, "{:?}", m.warnings);
    assert!(m.warnings[0].contains("agent:step"));
}

#[test]
fn timeouts_are_clamped() {
    assert_eq!(
        parse("events: [agent:end]\ntimeout_secs: 600\n")
            .unwrap()
            .timeout,
        MAX_TIMEOUT
    );
    assert_eq!(
        parse("events: [agent:end]\ntimeout_secs: 0\n")
            .unwrap()
            .timeout,
        Duration::from_secs(1)
    );
}

#[test]
fn command_events_resolve_to_canonical_names() {
    let m = parse("events: [command:reset, COMMAND:New]\n").unwrap();
    assert_eq!(m.events, vec![EventPattern::Exact("command:new".into())]);
}

#[test]
fn matching_exact_command_wildcard_and_prefix() {
    let exact = EventPattern::parse("agent:end").unwrap();
    assert!(exact.matches("agent:end"));
    assert!(!exact.matches("agent:start"));
    assert!(!exact.matches("agent:endx"));

    let commands = EventPattern::parse("command:*").unwrap();
    assert!(commands.matches("command:new"));
    assert!(commands.matches(&events::command("status")));
    assert!(!commands.matches("commander:new"));
    assert!(!commands.matches("agent:end"));

    let sessions = EventPattern::parse("session:*").unwrap();
    for e in ["session:start", "session:end", "session:reset"] {
        assert!(sessions.matches(e), "{e}");
    }
    assert!(!sessions.matches("sessions:start"));
    assert!(!sessions.matches("message:received"));

    let new = EventPattern::parse("command:new").unwrap();
    assert!(new.matches("command:new"));
    assert!(!new.matches("command:status"));

    assert!(EventPattern::parse("cron:run").is_ok());
    assert!(EventPattern::parse("*").is_err());
    assert!(EventPattern::parse("agent").is_err());
}

#[test]
fn every_fixed_event_has_a_subscribable_prefix() {
    for e in events::FIXED {
        let (prefix, _) = e.split_once(':').unwrap();
        assert!(events::PREFIXES.contains(&prefix), "{e}");
        assert!(EventPattern::Prefix(prefix.into()).matches(e));
    }
}

#[test]
fn input_is_one_json_line() {
    let bytes = encode("agent:end", &serde_json::json!({"a": 1}));
    assert_eq!(bytes.last(), Some(&b'\n'));
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["event"], "agent:end");
    assert_eq!(v["payload"]["a"], 1);
    assert!(v["timestamp"].as_f64().unwrap() > 1.0e9);
}

#[tokio::test]
async fn no_hooks_means_nothing_runs() {
    let hooks = Hooks::none();
    assert!(hooks.is_empty());
    assert!(!hooks.wants("agent:end"));
    hooks.emit("agent:end", Value::Null);
    assert!(
        hooks
            .emit_and_wait("agent:end", Value::Null)
            .await
            .is_empty()
    );
}
