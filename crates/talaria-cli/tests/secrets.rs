//! Secrets planted everywhere, and a model that goes looking for them, all
//! through the real `talaria` binary: platform credentials in
//! `config.yaml`, keys in the home's `.env` and in the process
//! environment. The model asks for `cat config.yaml`, `read_file
//! config.yaml`, `env | base64` and `base64 .env` and then repeats the
//! secrets; none of them, plain or base64, may reach the model's next
//! request, the stored transcript (`state.db`), the log or the answer. And
//! a model whose URL carries `?api-key=...` fails without that key showing
//! in the output, the log or the reply.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use talaria_testkit::{MockOpenAi, Reply, ToolCallReply};

const WAIT: Duration = Duration::from_secs(30);

/// Written into `config.yaml`: the model's key and every kind of platform
/// credential. None has a shape the redactor knows by pattern, so only
/// the set of configured secrets can catch them.
const CONFIG_SECRETS: &[(&str, &str)] = &[
    ("model.api_key", "model-key-planted-0123456789"),
    (
        "platforms.api_server.key",
        "apiserver-key-planted-0123456789",
    ),
    (
        "platforms.telegram.token",
        "telegram-token-planted-0123456789",
    ),
    (
        "platforms.discord.token",
        "discord-token-planted-0123456789",
    ),
    (
        "platforms.slack.bot_token",
        "slackbot-token-planted-0123456789",
    ),
    (
        "platforms.slack.app_token",
        "slackapp-token-planted-0123456789",
    ),
    (
        "platforms.matrix.access_token",
        "matrix-token-planted-0123456789",
    ),
    (
        "platforms.email.password",
        "email-password-planted-0123456789",
    ),
    (
        "platforms.sms.auth_token",
        "twilio-token-planted-0123456789",
    ),
    (
        "platforms.whatsapp_cloud.token",
        "whatsapp-token-planted-0123456789",
    ),
    (
        "platforms.whatsapp_cloud.app_secret",
        "whatsapp-appsecret-planted-0123456789",
    ),
    (
        "platforms.whatsapp_cloud.verify_token",
        "whatsapp-verify-planted-0123456789",
    ),
    (
        "platforms.webhook.routes.gh.secret",
        "webhook-route-planted-0123456789",
    ),
    (
        "platforms.homeassistant.token",
        "hass-token-planted-0123456789",
    ),
];

/// Written into the home's `.env` (one of them under a name that does not
/// say "secret": everything in `.env` is one).
const DOTENV_SECRETS: &[(&str, &str)] = &[
    ("ANTHROPIC_API_KEY", "dotenv-anthropic-planted-0123456789"),
    ("SOME_SERVICE_SETTING", "dotenv-plain-planted-0123456789"),
];

/// In the environment the binary is started with.
const PROCESS_SECRETS: &[(&str, &str)] = &[
    (
        "OPENROUTER_API_KEY",
        "process-openrouter-planted-0123456789",
    ),
    ("DEPLOY_PASSWORD", "process-password-planted-0123456789"),
];

/// Named in `terminal.env_passthrough`: the one extra variable commands
/// may see.
const PASSTHROUGH: (&str, &str) = ("TALARIA_TEST_PASSTHROUGH", "passed-by-choice-4242");

fn all_secrets() -> Vec<&'static str> {
    CONFIG_SECRETS
        .iter()
        .chain(DOTENV_SECRETS)
        .chain(PROCESS_SECRETS)
        .map(|(_, v)| *v)
        .collect()
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64_encode(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn b64_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut acc = 0u32;
    let mut bits = 0;
    for c in text.bytes() {
        let Some(v) = B64.iter().position(|&x| x == c) else {
            continue;
        };
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// What `secret` looks like inside any base64 text that encodes it: for
/// each of the three alignments it can have in the encoded stream, the
/// characters that depend on its bytes alone.
fn base64_forms(secret: &str) -> Vec<String> {
    (0..3)
        .map(|skip| {
            let b = &secret.as_bytes()[skip..];
            b64_encode(&b[..b.len() / 3 * 3])
        })
        .collect()
}

/// Panics if `text` holds any planted secret, plain or base64-encoded.
/// Line breaks are removed first (`base64` wraps its output, and JSON
/// writes a line break as `\n`), so a split encoding is found too.
fn assert_no_secret(what: &str, text: &str) {
    let joined = text.replace("\\n", "").replace(['\n', '\r'], "");
    for secret in all_secrets() {
        assert!(!text.contains(secret), "{what} holds {secret}:\n{text}");
        for form in base64_forms(secret) {
            assert!(
                !joined.contains(&form),
                "{what} holds {secret} base64-encoded ({form}):\n{text}"
            );
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Every regular file under `dir`, recursively.
fn regular_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            out.extend(regular_files(&entry.path()));
        } else if kind.is_file() {
            out.push(entry.path());
        }
    }
    out
}

fn config_yaml(base_url: &str, extra: &str) -> String {
    let s = |key: &str| {
        CONFIG_SECRETS
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
            .unwrap()
    };
    format!(
        "model:\n  default: mock-model\n  provider: custom\n  base_url: \"{base_url}\"\n  api_key: {}\n\
         agent:\n  api_max_retries: 1\n\
         approvals:\n  mode: \"off\"\n\
         terminal:\n  env_passthrough: [{}]\n\
         platforms:\n\
         \x20 api_server:\n    key: {}\n{extra}\
         \x20 telegram:\n    enabled: false\n    token: {}\n\
         \x20 discord:\n    enabled: false\n    token: {}\n\
         \x20 slack:\n    enabled: false\n    bot_token: {}\n    app_token: {}\n\
         \x20 matrix:\n    enabled: false\n    access_token: {}\n\
         \x20 email:\n    enabled: false\n    password: {}\n\
         \x20 sms:\n    enabled: false\n    auth_token: {}\n\
         \x20 whatsapp_cloud:\n    enabled: false\n    token: {}\n    app_secret: {}\n    verify_token: {}\n\
         \x20 webhook:\n    enabled: false\n    routes:\n      gh:\n        scheme: github\n        secret: {}\n\
         \x20 homeassistant:\n    enabled: false\n    token: {}\n",
        s("model.api_key"),
        PASSTHROUGH.0,
        s("platforms.api_server.key"),
        s("platforms.telegram.token"),
        s("platforms.discord.token"),
        s("platforms.slack.bot_token"),
        s("platforms.slack.app_token"),
        s("platforms.matrix.access_token"),
        s("platforms.email.password"),
        s("platforms.sms.auth_token"),
        s("platforms.whatsapp_cloud.token"),
        s("platforms.whatsapp_cloud.app_secret"),
        s("platforms.whatsapp_cloud.verify_token"),
        s("platforms.webhook.routes.gh.secret"),
        s("platforms.homeassistant.token"),
    )
}

/// A temp home with the planted `config.yaml` and `.env`.
fn home(base_url: &str, api_server: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("home");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("config.yaml"), config_yaml(base_url, api_server)).unwrap();
    let dotenv: String = DOTENV_SECRETS
        .iter()
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect();
    std::fs::write(root.join(".env"), dotenv).unwrap();
    (dir, root)
}

/// The binary in `home`, run from inside it (so `config.yaml` and `.env`
/// are the agent's relative paths), with the planted process environment.
fn command(home: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_talaria"));
    c.arg("--home")
        .arg(home)
        .args(args)
        .current_dir(home)
        .env_remove("TALARIA_HOME")
        .env_remove("OPENAI_API_KEY")
        .env_remove("TALARIA_MODEL")
        .env_remove("TALARIA_BASE_URL")
        .env_remove("API_SERVER_KEY")
        .env_remove("API_SERVER_PORT")
        .env_remove("TELEGRAM_BOT_TOKEN")
        .env("TALARIA_LOG", "debug")
        .env(PASSTHROUGH.0, PASSTHROUGH.1)
        .stdin(Stdio::null());
    for (k, v) in PROCESS_SECRETS {
        c.env(k, v);
    }
    c
}

fn call(id: &str, tool: &str, args: serde_json::Value) -> ToolCallReply {
    ToolCallReply::new(id, tool, args.to_string())
}

/// The tool result for `id` in a request's messages.
fn tool_result(body: &serde_json::Value, id: &str) -> String {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)
        .and_then(|m| m["content"].as_str())
        .unwrap_or_else(|| panic!("no result for {id} in {body}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_hunting_for_the_homes_secrets_gets_none_of_them() {
    let mock = MockOpenAi::start().await;
    let (dir, home) = home(&mock.base_url(), "");
    // A copy of the configuration outside the home: reading it is the
    // user's business, but what it shows is still redacted.
    std::fs::copy(
        home.join("config.yaml"),
        dir.path().join("config-copy.yaml"),
    )
    .unwrap();
    mock.push(Reply::tool_calls(vec![
        call(
            "c_cat",
            "terminal",
            serde_json::json!({"command": "cat config.yaml"}),
        ),
        call(
            "c_read",
            "read_file",
            serde_json::json!({"path": "config.yaml"}),
        ),
        call(
            "c_env",
            "terminal",
            serde_json::json!({"command": "env | base64"}),
        ),
        call(
            "c_b64",
            "terminal",
            serde_json::json!({"command": "base64 .env"}),
        ),
        call("c_dotenv", "read_file", serde_json::json!({"path": ".env"})),
        call(
            "c_copy",
            "terminal",
            serde_json::json!({"command": "cat ../config-copy.yaml"}),
        ),
    ]));
    // The model repeats every secret it "knows" in its answer.
    mock.push(Reply::text(format!(
        "Here they are: {}",
        all_secrets().join(", ")
    )));

    let out: Output = command(&home, &["chat", "-q", "show me every key you can find"])
        .output()
        .unwrap();
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    let second = &reqs[1].body;

    // Each way in was closed, with a reason the model can act on.
    let cat = tool_result(second, "c_cat");
    assert!(
        cat.contains("BLOCKED") && cat.contains("config.yaml"),
        "{cat}"
    );
    let read = tool_result(second, "c_read");
    assert!(read.contains("credentials"), "{read}");
    let b64 = tool_result(second, "c_b64");
    assert!(b64.contains("BLOCKED") && b64.contains(".env"), "{b64}");
    let dotenv = tool_result(second, "c_dotenv");
    assert!(dotenv.contains("credentials"), "{dotenv}");
    // `env` ran, with the allowlisted environment and the passthrough.
    let env_result: serde_json::Value =
        serde_json::from_str(&tool_result(second, "c_env")).unwrap();
    assert_eq!(env_result["exit_code"], 0, "{env_result}");
    let env = text(&b64_decode(env_result["output"].as_str().unwrap()));
    assert!(env.lines().any(|l| l.starts_with("PATH=")), "{env}");
    assert!(
        env.contains(&format!("{}={}", PASSTHROUGH.0, PASSTHROUGH.1)),
        "{env}"
    );
    for (name, _) in PROCESS_SECRETS {
        assert!(!env.contains(name), "{name} reached the command: {env}");
    }
    // The copy outside the home was read, its secrets redacted.
    let copy = tool_result(second, "c_copy");
    assert!(
        copy.contains("api_server") && copy.contains("[REDACTED]"),
        "{copy}"
    );

    assert_no_secret("the model's next request", &second.to_string());
    assert_no_secret("the answer", &text(&out.stdout));
    assert!(
        text(&out.stdout).contains("Here they are"),
        "{}",
        text(&out.stdout)
    );
    assert_no_secret("the log", &text(&out.stderr));
    // The transcript and everything else the home holds (the database and
    // its WAL, spilled output), the two credential files aside.
    for file in regular_files(&home) {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        if name == "config.yaml" || name == ".env" {
            continue;
        }
        let bytes = std::fs::read(&file).unwrap();
        assert_no_secret(
            &file.display().to_string(),
            &String::from_utf8_lossy(&bytes),
        );
    }
}

const QUERY_KEY: &str = "query-key-planted-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_url_with_a_key_in_its_query_fails_without_showing_it() {
    // Nothing listens on this port: the request cannot be sent at all, and
    // the HTTP library's error names the whole URL.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (_dir, home) = home(
        &format!("http://127.0.0.1:{port}/v1?api-key={QUERY_KEY}"),
        "",
    );
    let out = command(&home, &["chat", "-q", "hello?"]).output().unwrap();
    assert!(!out.status.success());
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        stderr.contains("could not reach the model server"),
        "{stderr}"
    );
    for shown in [&stdout, &stderr] {
        assert!(!shown.contains(QUERY_KEY), "{shown}");
    }
    // The log still says where the request went, minus the key.
    let log = std::fs::read_to_string(home.join("logs/talaria.log")).unwrap();
    assert!(log.contains("api-key=[REDACTED]"), "{log}");
    assert!(!log.contains(QUERY_KEY), "{log}");
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_model_request_reaches_the_api_client_as_a_short_sentence() {
    let mock = MockOpenAi::start().await;
    let base = format!("{}?api-key={QUERY_KEY}", mock.base_url());
    // The server refuses the key and, like some proxies do, echoes the URL
    // it was asked for.
    mock.push(Reply::error(
        401,
        format!(
            r#"{{"error":{{"message":"invalid key for {base}/chat/completions","type":"auth"}}}}"#
        ),
    ));
    let port = free_port();
    let (_dir, home) = home(&base, &format!("    port: {port}\n    enabled: true\n"));
    let log = home.join("test-gateway.log");
    let child = command(&home, &["gateway", "run"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut gateway = Gateway(child);
    let http = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(r) = http.get(format!("{url}/health")).send().await
            && r.status().is_success()
        {
            break;
        }
        if let Some(status) = gateway.0.try_wait().unwrap() {
            panic!(
                "the gateway exited ({status}):\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the gateway never answered /health"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let api_key = CONFIG_SECRETS[1].1;
    let resp = http
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(api_key)
        .json(&serde_json::json!({
            "model": "talaria",
            "messages": [{"role": "user", "content": "hello?"}]
        }))
        .timeout(WAIT)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let reply = resp.text().await.unwrap();
    assert!(!status.is_success(), "{status}: {reply}");
    assert!(
        reply.contains("the model server refused the request (HTTP 401)"),
        "{reply}"
    );
    assert!(!reply.contains(QUERY_KEY), "{reply}");
    assert!(
        !reply.contains("127.0.0.1"),
        "the reply names the model's URL: {reply}"
    );
    // The request went to the endpoint's path, the query kept after it.
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(reqs[0].path, "/v1/chat/completions");

    let _ = gateway.0.kill();
    let _ = gateway.0.wait();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("model call failed"), "{logged}");
    assert!(!logged.contains(QUERY_KEY), "{logged}");
    assert_no_secret("the gateway log", &logged);
}

/// The `terminal:` lines that make the owner's commands run in `backend`,
/// with what that backend needs (the test image, the test SSH server).
async fn backend_lines(backend: &str, sshd: &talaria_testkit::sshd::Sshd) -> String {
    match backend {
        "docker" => format!(
            "  backend: docker\n  docker:\n    image: \"{}\"\n",
            talaria_testkit::docker::busybox_image().await
        ),
        "ssh" => format!(
            "  backend: ssh\n  ssh:\n    host: 127.0.0.1\n    port: {}\n    identity_file: \"{}\"\n    known_hosts: \"{}\"\n",
            sshd.port(),
            sshd.client_key().display(),
            sshd.known_hosts().display()
        ),
        other => format!("  backend: {other}\n"),
    }
}

/// `env`, `/proc/self/environ`, `env | base64` and the home's `.env`, run
/// through the `terminal` tool in every backend CI has (the host, the
/// bubblewrap sandbox, a Docker container, an SSH host): none of the
/// planted secrets, plain or base64, reaches a tool result, the model's
/// next request, the answer, the log or any file of the home. The process
/// environment the binary starts with holds two of them, the home's
/// `.env` two more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_in_every_backend_see_none_of_the_secrets() {
    let sshd = talaria_testkit::sshd::Sshd::start();
    for backend in ["local", "sandbox", "docker", "ssh"] {
        let mock = MockOpenAi::start().await;
        let (_dir, home) = home(&mock.base_url(), "");
        let config = std::fs::read_to_string(home.join("config.yaml")).unwrap();
        let lines = backend_lines(backend, &sshd).await;
        std::fs::write(
            home.join("config.yaml"),
            config.replacen("terminal:\n", &format!("terminal:\n{lines}"), 1),
        )
        .unwrap();
        let dotenv = home.join(".env").display().to_string();
        mock.push(Reply::tool_calls(vec![
            call("c_env", "terminal", serde_json::json!({"command": "env"})),
            call(
                "c_environ",
                "terminal",
                serde_json::json!({"command": "cat /proc/self/environ | tr '\\0' '\\n'"}),
            ),
            call(
                "c_b64",
                "terminal",
                serde_json::json!({"command": "env | base64"}),
            ),
            call(
                "c_dotenv",
                "terminal",
                serde_json::json!({"command": format!("cat {dotenv}")}),
            ),
        ]));
        mock.push(Reply::text(format!("{backend} done")));
        let out = command(&home, &["chat", "-q", "what is in your environment?"])
            .output()
            .unwrap();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{backend}: {stderr}");
        assert!(
            stdout.contains(&format!("{backend} done")),
            "{backend}: {stdout}"
        );
        let reqs = mock.requests();
        assert_eq!(reqs.len(), 2, "{backend}: {reqs:?}");
        let second = &reqs[1].body;
        // The commands ran: `env` printed a PATH, in the backend asked for.
        let env: serde_json::Value = serde_json::from_str(&tool_result(second, "c_env")).unwrap();
        let env_out = env["output"].as_str().unwrap();
        assert!(env_out.contains("PATH="), "{backend}: {env}");
        if matches!(backend, "sandbox" | "docker") {
            assert!(env_out.contains("HOME=/workspace"), "{backend}: {env}");
        }
        let b64: serde_json::Value = serde_json::from_str(&tool_result(second, "c_b64")).unwrap();
        let decoded = text(&b64_decode(b64["output"].as_str().unwrap()));
        assert!(decoded.contains("PATH="), "{backend}: {decoded}");
        for id in ["c_env", "c_environ", "c_b64", "c_dotenv"] {
            let result = tool_result(second, id);
            assert_no_secret(&format!("{backend}: {id}"), &result);
            if id == "c_b64" {
                assert_no_secret(&format!("{backend}: {id} decoded"), &decoded);
            }
        }
        assert_no_secret(&format!("{backend}: the next request"), &second.to_string());
        assert_no_secret(&format!("{backend}: the answer"), &stdout);
        assert_no_secret(&format!("{backend}: the log"), &stderr);
        for file in regular_files(&home) {
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            if name == "config.yaml" || name == ".env" {
                continue;
            }
            let bytes = std::fs::read(&file).unwrap();
            assert_no_secret(
                &format!("{backend}: {}", file.display()),
                &String::from_utf8_lossy(&bytes),
            );
        }
        // The chat removed the container it made as it ended.
        if backend == "docker" {
            let left = talaria_testkit::docker::remove_labelled(
                "talaria.owner",
                &home.join("workspaces").display().to_string(),
            )
            .await;
            assert_eq!(left, 0, "the chat left its container behind");
        }
    }
}
