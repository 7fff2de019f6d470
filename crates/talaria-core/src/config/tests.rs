use super::secret::names_a_credential;
use super::*;

#[test]
fn platform_variables_are_shell_names() {
    assert_eq!(
        platform_var("telegram", "HOME_CHANNEL"),
        "TELEGRAM_HOME_CHANNEL"
    );
    assert_eq!(
        platform_var("whatsapp-cloud", "ALLOWED_USERS"),
        "WHATSAPP_CLOUD_ALLOWED_USERS"
    );
}

#[test]
fn constant_time_eq_is_plain_equality() {
    assert!(constant_time_eq(b"abcd", b"abcd"));
    assert!(!constant_time_eq(b"abcd", b"abce"));
    assert!(!constant_time_eq(b"xbcd", b"abcd"));
    assert!(!constant_time_eq(b"abc", b"abcd"));
    assert!(!constant_time_eq(b"", b"0123456789abcdef"));
    assert!(constant_time_eq(b"", b""));
}

fn parse(text: &str) -> Result<(Config, Vec<String>), ConfigError> {
    Config::parse(text, Path::new("config.yaml"))
}

#[test]
fn homeassistant_keys_are_read_and_their_tokens_redacted() {
    let (c, w) = parse(
        "platforms:\n  homeassistant:\n    url: http://ha.local:8123\n    token: ha-token-0123456789\n    conversation_token: conv-secret-0123456789\n    allowed_services: [light.*]\n    reply_timeout_secs: 30\n",
    )
    .unwrap();
    assert!(w.is_empty(), "{w:?}");
    let ha = &c.platforms.homeassistant;
    assert_eq!(ha.url.as_deref(), Some("http://ha.local:8123"));
    assert_eq!(ha.allowed_services, ["light.*"]);
    assert_eq!(ha.reply_timeout_secs, 30);
    assert_eq!(HomeAssistantConfig::default().reply_timeout_secs, 60);
    let secrets = c.secret_values();
    assert!(secrets.contains(&"ha-token-0123456789".to_owned()));
    assert!(secrets.contains(&"conv-secret-0123456789".to_owned()));
    assert!(!format!("{ha:?}").contains("ha-token-0123456789"));
}

#[test]
fn mcp_servers_are_read_and_checked() {
    let (c, w) = parse(
        "mcp_servers:\n  github:\n    command: npx\n    args: [-y, server-github]\n    env: {GITHUB_TOKEN: \"${GH_TOKEN}\"}\n    tools: {exclude: [delete_repo]}\n  remote:\n    url: https://mcp.example.com/mcp\n    headers: {Authorization: Bearer literal-token-123456}\n    lazy: true\n",
    )
    .unwrap();
    assert!(w.is_empty(), "{w:?}");
    let gh = &c.mcp_servers["github"];
    assert_eq!(gh.args, ["-y", "server-github"]);
    assert!(gh.enabled && !gh.lazy && gh.timeout == 120);
    assert!(gh.tools.admits("create_issue") && !gh.tools.admits("delete_repo"));
    assert!(c.mcp_servers["remote"].lazy);
    // A literal header is a secret; a `${VAR}` reference is not a value.
    let secrets = c.secret_values();
    assert!(secrets.contains(&"Bearer literal-token-123456".to_owned()));
    assert!(!secrets.iter().any(|s| s.contains("${")));

    for (bad, key) in [
        ("mcp_servers:\n  x:\n    args: [a]\n", "mcp_servers.x"),
        (
            "mcp_servers:\n  x:\n    command: a\n    url: http://b\n",
            "mcp_servers.x",
        ),
        (
            "mcp_servers:\n  x:\n    url: ftp://b\n",
            "mcp_servers.x.url",
        ),
        (
            "mcp_servers:\n  bad name:\n    command: a\n",
            "mcp_servers.bad name",
        ),
        (
            "mcp_servers:\n  x:\n    command: a\n    timeout: 0\n",
            "mcp_servers.x.timeout",
        ),
    ] {
        match parse(bad) {
            Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{bad}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn the_signal_section_is_read_and_checked() {
    let (c, w) = parse(
        "platforms:\n  signal:\n    http_url: http://127.0.0.1:8080\n    account: \"+4915112345678\"\n    receive_mode: poll\n    poll_interval_secs: 5\n    require_mention: false\n",
    )
    .unwrap();
    assert!(w.is_empty(), "{w:?}");
    let s = &c.platforms.signal;
    assert_eq!(s.http_url.as_deref(), Some("http://127.0.0.1:8080"));
    assert_eq!(s.account.as_deref(), Some("+4915112345678"));
    assert_eq!(s.receive_mode, SignalReceiveMode::Poll);
    assert_eq!((s.poll_interval_secs, s.require_mention), (5, false));
    // Unquoted, YAML reads a number; it comes back with its `+`.
    let (c, _) = parse("platforms:\n  signal:\n    account: +4915112345678\n").unwrap();
    assert_eq!(
        c.platforms.signal.account.as_deref(),
        Some("+4915112345678")
    );
    let (c, _) = parse("platforms:\n  signal: {}\n").unwrap();
    assert_eq!(c.platforms.signal, SignalConfig::default());
    assert_eq!(
        c.platforms.signal.receive_mode,
        SignalReceiveMode::Websocket
    );
    match parse("platforms:\n  signal:\n    http_url: localhost:8080\n") {
        Err(ConfigError::Invalid { key, .. }) => assert_eq!(key, "platforms.signal.http_url"),
        other => panic!("{other:?}"),
    }
    assert!(parse("platforms:\n  signal:\n    receive_mode: sse\n").is_err());
}

#[test]
fn empty_file_means_defaults() {
    let (c, w) = parse("").unwrap();
    assert_eq!(c, Config::default());
    assert!(w.is_empty());
    assert_eq!(c.agent.max_turns, 90);
}

#[test]
fn reads_the_model_section() {
    let (c, w) = parse(
        "model:\n  default: qwen3\n  provider: custom\n  base_url: http://127.0.0.1:8000/v1\n  api_key: sk-local-123456789\nfallback_providers:\n  - {provider: openrouter, model: meta/llama, api_key: or-key-123456789}\nagent:\n  max_turns: 12\n",
    )
    .unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(c.model.default.as_deref(), Some("qwen3"));
    assert_eq!(c.agent.max_turns, 12);
    assert_eq!(c.fallback_providers[0].provider, ProviderKind::Openrouter);
    let ep = c.primary_endpoint(&Env::default()).unwrap();
    assert_eq!(ep.base_url, "http://127.0.0.1:8000/v1");
    assert_eq!(ep.api_key.unwrap().expose(), "sk-local-123456789");
}

#[test]
fn unknown_keys_warn_with_their_path() {
    let (_, w) = parse("agent:\n  max_turn: 5\nmodle: x\n").unwrap();
    assert!(w.iter().any(|l| l.contains("agent.max_turn")), "{w:?}");
    assert!(w.iter().any(|l| l.contains("modle")), "{w:?}");
}

#[test]
fn invalid_values_name_key_and_form() {
    let e = parse("agent:\n  max_turns: lots\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("agent.max_turns"), "{e}");
    let e = parse("model:\n  provider: skynet\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("model.provider"), "{e}");
    assert!(e.contains("custom"), "{e}");
    let e = parse("model:\n  base_url: ftp://x\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("model.base_url") && e.contains("http"), "{e}");
    let e = parse("compression:\n  threshold: 3\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("compression.threshold"), "{e}");
}

#[test]
fn errors_name_the_line_of_their_key_even_when_a_name_holds_dots() {
    let e = parse(
        "agent:\n  max_turns: 5\nmcp_servers:\n  my.tools:\n    command: a\n    timeout: 0\n",
    )
    .unwrap_err();
    match e {
        // Dots are not allowed in a server's name: the error is on
        // the name, whose key holds a dot.
        ConfigError::Invalid { key, line, .. } => {
            assert_eq!(key, "mcp_servers.my.tools");
            assert_eq!(line, Some(4));
        }
        other => panic!("{other:?}"),
    }
    let e = parse("model:\n  default: m\n  temperature: warm\n").unwrap_err();
    assert!(
        e.to_string()
            .ends_with(", line 3: `model.temperature`: expected a number, not the text \"warm\""),
        "{e}"
    );
}

#[test]
fn broken_yaml_is_a_syntax_error() {
    let e = parse("model: [unclosed\n").unwrap_err();
    assert!(matches!(e, ConfigError::Syntax { .. }), "{e}");
}

#[test]
fn missing_model_says_what_to_set() {
    let e = Config::default()
        .primary_endpoint(&Env::default())
        .unwrap_err();
    assert!(e.contains("model.default"), "{e}");
    let mut c = Config::default();
    c.model.default = Some("m".into());
    let e = c.primary_endpoint(&Env::default()).unwrap_err();
    assert!(e.contains("model.base_url"), "{e}");
    c.model.provider = ProviderKind::Anthropic;
    let e = c.primary_endpoint(&Env::default()).unwrap_err();
    assert!(e.contains("ANTHROPIC_API_KEY"), "{e}");
    let ep = c
        .primary_endpoint(&Env::from_pairs([("ANTHROPIC_API_KEY", "k-123456789")]))
        .unwrap();
    assert_eq!(ep.base_url, "https://api.anthropic.com");
}

#[test]
fn the_environment_overrides_the_files_model_and_server() {
    let mut c = Config::default();
    c.model.default = Some("from-file".into());
    c.model.base_url = Some("http://127.0.0.1:8080/v1".into());
    let ep = c.primary_endpoint(&Env::default()).unwrap();
    assert_eq!(
        (ep.model.as_str(), ep.base_url.as_str()),
        ("from-file", "http://127.0.0.1:8080/v1")
    );
    let env = Env::from_pairs([
        ("TALARIA_MODEL", "from-env"),
        ("TALARIA_BASE_URL", "http://127.0.0.1:9999/v1"),
    ]);
    let ep = c.primary_endpoint(&env).unwrap();
    assert_eq!(
        (ep.model.as_str(), ep.base_url.as_str()),
        ("from-env", "http://127.0.0.1:9999/v1")
    );
    // Set but empty is not set.
    let env = Env::from_pairs([("TALARIA_MODEL", "")]);
    assert_eq!(c.primary_endpoint(&env).unwrap().model, "from-file");
}

/// Plants a distinct value in every leaf of `tree` that holds a
/// credential by its name (and a URL with credentials in every URL
/// leaf), recording `(path, value, is_url)`. The leaves come from the
/// serialized configuration itself, so a field added to the schema is
/// planted without this test naming it.
fn plant(tree: &mut serde_json::Value, path: &str, planted: &mut Vec<(String, String, bool)>) {
    use serde_json::Value;
    match tree {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                let here = format!("{path}.{k}");
                let tag: String = here
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                    .collect();
                let leaf = v.is_null() || v.is_string();
                let low = k.to_ascii_lowercase();
                if leaf
                    && (path.ends_with(".headers") || names_a_credential(k))
                    && !low.ends_with("_env")
                {
                    let value = format!("planted{tag}-0123456789");
                    *v = Value::String(value.clone());
                    planted.push((here, value, false));
                } else if leaf
                    // An unset MCP `url` stays unset: a server has
                    // `command` or `url`, not both.
                    && (v.is_string() || !path.starts_with(".mcp_servers"))
                    && (low.contains("url") || low.ends_with("base") || low == "homeserver")
                {
                    let value = format!(
                        "https://bot:pw{tag}-0123456789@h.example/v1?api-key=qk{tag}-0123456789"
                    );
                    *v = Value::String(value.clone());
                    planted.push((here, value, true));
                } else {
                    plant(v, &here, planted);
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                plant(item, &format!("{path}[{i}]"), planted);
            }
        }
        _ => {}
    }
}

#[test]
fn every_credential_in_the_config_is_a_secret_and_redacted() {
    // One entry in every map and list, so their fields are walked too;
    // numbers set where a field's name only sounds like a credential
    // (`max_tokens`).
    let (base, w) = parse(
        "model:\n  max_tokens: 100\nfallback_providers:\n  - {provider: openai, model: m}\nmcp_servers:\n  s:\n    command: x\n    env: {SOME_TOKEN: a, PLAIN: b}\n    headers: {X-Trace: c}\n  h: {url: \"https://mcp.example/mcp\"}\nplatforms:\n  webhook:\n    routes:\n      r: {scheme: github}\n",
    )
    .unwrap();
    assert!(w.is_empty(), "{w:?}");
    let mut tree = serde_json::to_value(&base).unwrap();
    let mut planted = Vec::new();
    plant(&mut tree, "", &mut planted);
    let paths: Vec<&str> = planted.iter().map(|(p, _, _)| p.as_str()).collect();
    // The walk reaches every kind of credential the issue names.
    for want in [
        ".model.api_key",
        ".model.base_url",
        ".fallback_providers[0].api_key",
        ".memory.mem0.api_key",
        ".store.postgres_url",
        ".platforms.telegram.token",
        ".platforms.discord.token",
        ".platforms.mattermost.token",
        ".platforms.slack.bot_token",
        ".platforms.slack.app_token",
        ".platforms.api_server.key",
        ".platforms.webhook.routes.r.secret",
        ".platforms.matrix.access_token",
        ".platforms.whatsapp_cloud.token",
        ".platforms.whatsapp_cloud.app_secret",
        ".platforms.whatsapp_cloud.verify_token",
        ".platforms.sms.auth_token",
        ".platforms.email.password",
        ".platforms.homeassistant.token",
        ".platforms.homeassistant.conversation_token",
        ".mcp_servers.s.env.SOME_TOKEN",
        ".mcp_servers.s.headers.X-Trace",
        ".mcp_servers.h.url",
    ] {
        assert!(paths.contains(&want), "{want} was not planted: {paths:?}");
    }
    let text = serde_json::to_string(&tree).unwrap();
    let (c, w) = parse(&text).unwrap();
    assert!(w.is_empty(), "{w:?}");
    let redactor = crate::Redactor::new(c.secret_values());
    let printed = serde_saphyr::to_string(&c).unwrap();
    let debugged = format!("{c:?}");
    for (path, value, is_url) in &planted {
        let parts: Vec<String> = if *is_url {
            let url = url_secrets(value);
            assert_eq!(url.len(), 2, "{path}: {url:?}");
            url
        } else {
            vec![value.clone()]
        };
        let shown = redactor.redact(&format!("the model read: {value}."));
        for part in &parts {
            assert!(
                !shown.contains(part.as_str()),
                "{path}: {part} survives as {shown}"
            );
        }
        // A credential held by name must be a `Secret` (an MCP map's
        // values excepted: they may be `${VAR}` references): printing
        // or logging the config masks it.
        if !is_url && !path.starts_with(".mcp_servers") {
            assert!(
                !printed.contains(value.as_str()),
                "{path} is printed in plain: not a Secret"
            );
            assert!(
                !debugged.contains(value.as_str()),
                "{path} is in Debug in plain: not a Secret"
            );
        }
    }
    // An MCP env value not named as a credential is not redacted.
    assert!(!c.secret_values().iter().any(|v| v == "b"));
}

#[test]
fn the_secret_walk_leaves_printing_masked() {
    let (c, _) = parse("platforms:\n  telegram:\n    token: tg-token-0123456789\n").unwrap();
    assert_eq!(c.secret_values(), ["tg-token-0123456789"]);
    // The walk turned revealing off again.
    let shown = serde_saphyr::to_string(&c).unwrap();
    assert!(!shown.contains("tg-token-0123456789"), "{shown}");
    assert!(shown.contains("****6789"), "{shown}");
}

#[test]
fn secrets_are_masked_when_printed() {
    let (c, _) = parse("model:\n  api_key: sk-abcdefghijklmnop\n").unwrap();
    let shown = serde_saphyr::to_string(&c).unwrap();
    assert!(!shown.contains("sk-abcdefghijklmnop"), "{shown}");
    assert!(shown.contains("****mnop"), "{shown}");
    assert!(!format!("{c:?}").contains("sk-abcdefghijklmnop"));
}

#[test]
fn dotenv_is_overridden_by_process_env() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(".env");
    std::fs::write(&p, "TALARIA_TEST_ONLY_IN_FILE=from-file-value\nPATH=nope\n").unwrap();
    let env = Env::load(&p).unwrap();
    assert_eq!(
        env.get("TALARIA_TEST_ONLY_IN_FILE"),
        Some("from-file-value")
    );
    assert_ne!(env.get("PATH"), Some("nope"));
    assert!(env.secret_values().contains(&"from-file-value".to_owned()));
}

#[test]
fn webhook_defaults_and_routes() {
    let (c, w) = parse("").unwrap();
    assert!(w.is_empty());
    let wh = &c.platforms.webhook;
    assert_eq!(wh.enabled, None);
    assert_eq!(wh.host, "127.0.0.1");
    assert_eq!(wh.port, 8644);
    assert_eq!(wh.max_body_bytes, 1024 * 1024);
    assert_eq!(wh.rate_limit_per_minute, 30);
    assert_eq!((wh.header_timeout_secs, wh.body_timeout_secs), (10, 30));
    let api = &c.platforms.api_server;
    assert_eq!((api.header_timeout_secs, api.body_timeout_secs), (10, 30));
    assert!(wh.routes.is_empty());

    let (c, w) = parse(
        "platforms:\n  webhook:\n    routes:\n      gh-push:\n        secret: s3cr3t-value-123\n        scheme: github\n        events: [push]\n      alerts:\n        secret_env: ALERTS_SECRET\n        scheme: svix\n        deliver: telegram:42\n        prompt: 'Alert {payload.title}'\n        enabled: false\n        colour: red\n",
    )
    .unwrap();
    assert!(
        w.iter()
            .any(|l| l.contains("platforms.webhook.routes.alerts.colour")),
        "{w:?}"
    );
    let routes = &c.platforms.webhook.routes;
    let gh = &routes["gh-push"];
    assert_eq!(gh.scheme, WebhookScheme::Github);
    assert_eq!(gh.deliver, "local");
    assert_eq!(gh.events, vec!["push".to_owned()]);
    assert!(gh.enabled);
    assert_eq!(gh.prompt, "");
    assert!(!format!("{gh:?}").contains("s3cr3t-value-123"));
    let alerts = &routes["alerts"];
    assert_eq!(alerts.scheme, WebhookScheme::Svix);
    assert_eq!(alerts.secret, None);
    assert_eq!(alerts.secret_env.as_deref(), Some("ALERTS_SECRET"));
    assert_eq!(alerts.deliver, "telegram:42");
    assert!(!alerts.enabled);
}

#[test]
fn webhook_routes_need_a_scheme_and_a_strict_name() {
    let e = parse("platforms:\n  webhook:\n    routes:\n      a:\n        secret: x\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("platforms.webhook.routes") && e.contains("scheme"),
        "{e}"
    );
    let e = parse(
        "platforms:\n  webhook:\n    routes:\n      a:\n        secret: x\n        scheme: md5\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("scheme") && e.contains("github"), "{e}");
    for bad in ["'../x'", "'a b'", "'.hidden'", "'a/b'"] {
        let e = parse(&format!(
            "platforms:\n  webhook:\n    routes:\n      {bad}:\n        secret: x\n        scheme: hmac\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("route name"), "{bad}: {e}");
    }
}

#[test]
fn email_settings_and_tls_modes_are_read() {
    let (c, w) = parse(
        "platforms:\n  email:\n    address: bot@example.org\n    imap_host: imap.example.org\n    imap_tls: starttls\n    smtp_tls: none\n    poll_interval_secs: 30\n",
    )
    .unwrap();
    assert!(w.is_empty(), "{w:?}");
    let e = &c.platforms.email;
    assert_eq!(e.address.as_deref(), Some("bot@example.org"));
    assert_eq!(e.imap_tls, MailTls::Starttls);
    assert_eq!(e.smtp_tls, MailTls::None);
    assert_eq!((e.imap_port, e.smtp_port), (993, 587));
    assert_eq!(e.mailbox, "INBOX");
    assert_eq!(e.poll_interval_secs, 30);
    let err = parse("platforms:\n  email:\n    imap_tls: maybe\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("platforms.email.imap_tls"), "{err}");
}
