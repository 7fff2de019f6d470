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
        "model:\n  max_tokens: 100\nfallback_providers:\n  - {provider: openai, model: m}\nmcp_servers:\n  s:\n    command: x\n    env: {SOME_TOKEN: a, PLAIN: b}\n    headers: {X-Trace: c}\n  h: {url: \"https://mcp.example/mcp\"}\nplatforms:\n  example:\n    token: null\n    routes:\n      r: {secret: null}\n",
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
        // Core knows a section's credentials only by their names; each
        // section's owner checks its own type's (the platforms' registry,
        // the API server).
        ".platforms.example.token",
        ".platforms.example.routes.r.secret",
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
    let (c, _) = parse("platforms:\n  example:\n    token: tg-token-0123456789\n").unwrap();
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

/// A section as an owner outside core would declare it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
struct ExampleSection {
    enabled: Option<bool>,
    token: Option<Secret>,
    server: String,
    retries: u32,
    nested: ExampleNested,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
struct ExampleNested {
    depth: u8,
}

impl Default for ExampleSection {
    fn default() -> ExampleSection {
        ExampleSection {
            enabled: None,
            token: None,
            server: "https://example.org".to_owned(),
            retries: 3,
            nested: ExampleNested::default(),
        }
    }
}

impl PlatformSection for ExampleSection {
    const NAME: &'static str = "example";

    fn validate(&self) -> Result<(), SectionError> {
        if !is_http_url(&self.server) {
            return Err(SectionError::new(
                "server",
                "expected an http:// or https:// URL",
            ));
        }
        Ok(())
    }
}

fn section(text: &str) -> Result<(ExampleSection, Vec<String>), ConfigError> {
    let path = Path::new("config.yaml");
    let (config, _) = Config::parse(text, path)?;
    let origin = Origin {
        path,
        text: Some(text),
    };
    parse_section::<ExampleSection>(&config, &origin)
}

#[test]
fn a_section_the_file_leaves_out_is_its_defaults() {
    let (s, w) = section("model:\n  default: m\n").unwrap();
    assert_eq!(s, ExampleSection::default());
    assert!(w.is_empty(), "{w:?}");
    let (s, w) = section("platforms:\n  example: {}\n").unwrap();
    assert_eq!(s, ExampleSection::default());
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(
        ExampleSection::read(&Config::default()).unwrap(),
        ExampleSection::default()
    );
}

#[test]
fn a_sections_values_are_read_and_its_unknown_keys_warn_with_their_full_path() {
    let (s, w) = section(
        "platforms:\n  example:\n    token: tok-0123456789\n    retrys: 5\n    nested:\n      depth: 2\n      width: 1\n  other:\n    anything: 1\n",
    )
    .unwrap();
    assert_eq!(s.token.as_ref().map(Secret::expose), Some("tok-0123456789"));
    assert_eq!(s.nested.depth, 2);
    assert_eq!(
        w,
        [
            "config.yaml: unknown key `platforms.example.nested.width` (ignored)",
            "config.yaml: unknown key `platforms.example.retrys` (ignored)",
        ]
    );
    // Core itself warns about none of it: the sections are their owners'.
    let (_, w) = parse("platforms:\n  example:\n    retrys: 5\n").unwrap();
    assert!(w.is_empty(), "{w:?}");
}

#[test]
fn a_sections_wrong_values_name_the_key_path_and_line() {
    let e =
        section("model:\n  default: m\nplatforms:\n  example:\n    nested:\n      depth: deep\n")
            .unwrap_err();
    assert_eq!(
        e.to_string(),
        "config.yaml, line 6: `platforms.example.nested.depth`: expected a whole number from 0 to 255, not the text \"deep\""
    );
    let e = section("platforms:\n  example:\n    retries: 1\n    server: ftp://x\n").unwrap_err();
    match e {
        ConfigError::Invalid {
            key, line, message, ..
        } => {
            assert_eq!(key, "platforms.example.server");
            assert_eq!(line, Some(4));
            assert!(message.contains("http"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let e = section("platforms:\n  example: 5\n").unwrap_err();
    match e {
        ConfigError::Invalid { key, line, .. } => {
            assert_eq!(key, "platforms.example");
            assert_eq!(line, Some(2));
        }
        other => panic!("{other:?}"),
    }
    // Read without the text (a configuration built in code): no line.
    let mut config = Config::default();
    config.platforms.set("example.server", "ftp://x");
    match ExampleSection::read(&config).unwrap_err() {
        ConfigError::Invalid { key, line, .. } => {
            assert_eq!(key, "platforms.example.server");
            assert_eq!(line, None);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn raw_sections_mask_credentials_when_printed() {
    let (c, _) = parse(
        "platforms:\n  example:\n    token: raw-token-0123456789\n    secret_env: MY_SECRET\n    routes:\n      r: {secret: route-secret-0123456789}\n",
    )
    .unwrap();
    let printed = serde_saphyr::to_string(&c).unwrap();
    assert!(!printed.contains("raw-token-0123456789"), "{printed}");
    assert!(!printed.contains("route-secret-0123456789"), "{printed}");
    assert!(printed.contains("MY_SECRET"), "{printed}");
    assert!(!format!("{c:?}").contains("raw-token"));
    let secrets = c.secret_values();
    assert!(secrets.contains(&"raw-token-0123456789".to_owned()));
    assert!(secrets.contains(&"route-secret-0123456789".to_owned()));
    let (s, _) = section("platforms:\n  example:\n    token: raw-token-0123456789\n").unwrap();
    let checked = check_section::<ExampleSection>(
        &c,
        &Origin {
            path: Path::new("c"),
            text: None,
        },
    )
    .unwrap();
    assert_eq!(checked.shown["token"], "****6789");
    assert_eq!(checked.shown["retries"], 3);
    assert_eq!(s.token.map(|t| t.masked()).as_deref(), Some("****6789"));
}

#[test]
fn set_writes_a_value_as_the_file_would() {
    let mut c = Config::default();
    c.platforms.set("example.nested.depth", 4);
    c.platforms.set("example.server", "http://127.0.0.1:1");
    let s = ExampleSection::read(&c).unwrap();
    assert_eq!(
        (s.nested.depth, s.server.as_str()),
        (4, "http://127.0.0.1:1")
    );
    assert_eq!(c.platforms.names().collect::<Vec<_>>(), ["example"]);
}

#[test]
fn a_loaded_configuration_keeps_its_text_for_lines_but_never_prints_it() {
    let dir = tempfile::tempdir().unwrap();
    let home = crate::home::Home::at(dir.path());
    let text = "platforms:\n  example:\n    server: ftp://x\n    token: kept-token-0123456789\n";
    std::fs::write(home.config_file(), text).unwrap();
    let loaded = load(&home).unwrap();
    assert_eq!(loaded.text.as_deref(), Some(text));
    assert!(!format!("{loaded:?}").contains("kept-token"));
    match parse_section::<ExampleSection>(&loaded.config, &loaded.origin()) {
        Err(ConfigError::Invalid { key, line, .. }) => {
            assert_eq!(key, "platforms.example.server");
            assert_eq!(line, Some(3));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_media_section_has_its_defaults_reads_its_values_and_warns_of_unknown_keys() {
    let (c, w) = parse("").unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(c.media.max_bytes, 20 * 1024 * 1024);
    assert_eq!(c.media.image_max_px, 1568);
    assert_eq!(c.media.retention_days, 7);
    assert!(!c.media.describe_images);

    let (c, w) = parse(
        "media:\n  max_bytes: 1048576\n  image_max_px: 800\n  retention_days: 0\n  describe_images: true\n",
    )
    .unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(
        c.media,
        MediaConfig {
            max_bytes: 1_048_576,
            image_max_px: 800,
            retention_days: 0,
            describe_images: true,
        }
    );

    // A typo is a warning that names the key; the rest of the section is read.
    let (c, w) = parse("media:\n  max_byte: 5\n  image_max_px: 640\n").unwrap();
    assert_eq!(
        w,
        ["config.yaml: unknown key `media.max_byte` (ignored)"],
        "{w:?}"
    );
    assert_eq!(c.media.image_max_px, 640);
    assert_eq!(c.media.max_bytes, 20 * 1024 * 1024);

    for (bad, key) in [
        ("media:\n  max_bytes: lots\n", "media.max_bytes"),
        ("media:\n  max_bytes: 0\n", "media.max_bytes"),
        ("media:\n  image_max_px: -1\n", "media.image_max_px"),
        ("media:\n  image_max_px: 0\n", "media.image_max_px"),
        ("media:\n  retention_days: soon\n", "media.retention_days"),
        (
            "media:\n  describe_images: maybe\n",
            "media.describe_images",
        ),
    ] {
        match parse(bad) {
            Err(ConfigError::Invalid { key: k, line, .. }) => {
                assert_eq!(k, key, "{bad}");
                assert_eq!(line, Some(2), "{bad}");
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn vision_speech_and_image_settings_read_as_written_on_and_off_included() {
    let (c, w) = parse(
        "model:\n  vision: on\nstt:\n  provider: command\n  command: whisper-cli -f {path}\n  echo_transcript: yes\n\
         tts:\n  provider: openai\n  base_url: http://127.0.0.1:8880/v1\n  voice: af_heart\n  voice_reply: off\n\
         image_gen:\n  base_url: http://127.0.0.1:7860/v1\n  model: sdxl\n\
         auxiliary:\n  vision:\n    base_url: http://127.0.0.1:8080/v1\n    default: qwen2.5-vl\n\
         display:\n  memory_notifications: off\n",
    )
    .unwrap();
    assert!(w.is_empty(), "{w:?}");
    // YAML reads `on`, `off` and `yes` as booleans; each still means its word.
    assert_eq!(c.model.vision, VisionMode::On);
    assert_eq!(c.tts.voice_reply, VoiceReply::Off);
    assert_eq!(c.display.memory_notifications, MemoryNotifications::Off);
    assert!(c.stt.echo_transcript);
    assert_eq!(c.stt.provider, Some(SttProvider::Command));
    assert_eq!(c.tts.provider, Some(TtsProvider::Openai));
    assert_eq!(c.tts.voice, "af_heart");
    assert_eq!(c.image_gen.model, "sdxl");
    let aux = c.vision_endpoint(&Env::default()).unwrap().unwrap();
    assert_eq!(
        (aux.model.as_str(), aux.base_url.as_str()),
        ("qwen2.5-vl", "http://127.0.0.1:8080/v1")
    );
    for (yaml, vision) in [
        ("auto", VisionMode::Auto),
        ("off", VisionMode::Off),
        ("\"on\"", VisionMode::On),
    ] {
        let (c, _) = parse(&format!("model:\n  vision: {yaml}\n")).unwrap();
        assert_eq!(c.model.vision, vision, "{yaml}");
    }

    for (bad, key) in [
        ("model:\n  vision: sometimes\n", "model.vision"),
        ("tts:\n  voice_reply: loudly\n", "tts.voice_reply"),
        ("stt:\n  provider: command\n", "stt.command"),
        (
            "tts:\n  provider: command\n  command: \" \"\n",
            "tts.command",
        ),
        ("stt:\n  provider: whisper\n", "stt.provider"),
        ("image_gen:\n  base_url: ftp://x\n", "image_gen.base_url"),
        ("stt:\n  timeout_secs: 0\n", "stt.timeout_secs"),
    ] {
        match parse(bad) {
            Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{bad}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn delegation_settings_have_defaults_and_are_checked() {
    let (c, w) = parse("").unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(c.delegation.max_concurrent, 3);
    assert_eq!(c.delegation.max_iterations, 50);
    assert_eq!(c.delegation.model, None);
    assert!(!c.delegation.subagent_auto_approve);

    let (c, w) = parse(
        "delegation:\n  max_concurrent: 5\n  max_iterations: 12\n  model: small-model\n  subagent_auto_approve: true\n",
    )
    .unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(c.delegation.max_concurrent, 5);
    assert_eq!(c.delegation.max_iterations, 12);
    assert_eq!(c.delegation.model.as_deref(), Some("small-model"));
    assert!(c.delegation.subagent_auto_approve);

    for (text, key) in [
        (
            "delegation:\n  max_concurrent: 0\n",
            "delegation.max_concurrent",
        ),
        (
            "delegation:\n  max_iterations: 0\n",
            "delegation.max_iterations",
        ),
        ("delegation:\n  model: \" \"\n", "delegation.model"),
    ] {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains(key), "{text}: {e}");
    }
    let (_, w) = parse("delegation:\n  max_children: 4\n").unwrap();
    assert!(
        w.iter().any(|w| w.contains("delegation.max_children")),
        "{w:?}"
    );
}
