//! `talaria store migrate`, as a user moving from one machine to several
//! runs it: a home on SQLite holds a conversation (an API-server turn of a
//! real `talaria gateway run` against the mock LLM); the copy refuses while
//! that gateway runs, then copies into a fresh PostgreSQL schema once it
//! stopped, printing no password; the home is switched to PostgreSQL as the
//! command says; and the next turn of the same session carries the earlier
//! one to the model. A database whose copy did not finish is refused until
//! the copy is run again.

use crate::crash_support;

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crash_support::{Home, gateway_command, home};
use talaria_store::{PostgresOptions, PostgresStore, SessionStore};
use talaria_testkit::{MockOpenAi, Reply};

const KEY: &str = "sk-migrate-api-key-0123456789";
const SESSION: &str = "migrate-session-1";

/// A port nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The test server's URL with a password in it (the test server trusts
/// local connections, so any password is accepted), to show it is never
/// printed. A URL that has one already is used as it is.
fn url_with_password() -> (String, String) {
    let url = talaria_testkit::postgres::url();
    if let Some(password) = password_of(&url) {
        return (url, password);
    }
    let password = "migrate-test-secret-0451".to_owned();
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let at = rest
        .find('@')
        .filter(|at| rest.find('/').is_none_or(|slash| *at < slash))
        .expect("the test URL names a user");
    let with = format!("{scheme}://{}:{password}{}", &rest[..at], &rest[at..]);
    (with, password)
}

fn password_of(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let userinfo = &authority[..authority.rfind('@')?];
    Some(userinfo.split_once(':')?.1.to_owned())
}

/// A gateway with the API server on `port`, its log beside the home.
struct Gateway {
    child: Option<Child>,
    log: PathBuf,
}

impl Gateway {
    fn start(home: &Home, name: &str) -> Gateway {
        let log = home.root.join(format!("{name}.log"));
        let child = gateway_command(home, &log).spawn().unwrap();
        Gateway {
            child: Some(child),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, and wait for a clean exit.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "{}", self.log());
                return;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the gateway did not stop\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn wait_for_health(http: &reqwest::Client, port: u16, gateway: &Gateway) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let up = http
            .get(format!("http://127.0.0.1:{port}/health"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if up {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the API server did not come up\n{}",
            gateway.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One API-server turn of the session; returns the answer.
async fn turn(http: &reqwest::Client, port: u16, text: &str) -> String {
    let response = http
        .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .bearer_auth(KEY)
        .header("x-talaria-session-id", SESSION)
        .json(&serde_json::json!({
            "model": "talaria",
            "messages": [{"role": "user", "content": text}],
        }))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    let body: serde_json::Value = response.json().await.unwrap();
    body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// `talaria store migrate` in `home`.
fn migrate(home: &Home, url: &str, schema: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(&home.root)
        .args(["store", "migrate", "--to", url, "--schema", schema])
        .env_remove("TALARIA_HOME")
        .env_remove("TALARIA_DATABASE_URL")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_continues_on_postgres_after_the_move() {
    let llm = MockOpenAi::start().await;
    let port = free_port();
    let home = home(
        &llm,
        &format!("  api_server:\n    enabled: true\n    host: 127.0.0.1\n    port: {port}\n"),
        &format!("API_SERVER_KEY={KEY}\n"),
    );
    let schema = talaria_testkit::postgres::fresh_schema().await;
    let (url, password) = url_with_password();
    let http = reqwest::Client::new();

    // One machine, on SQLite: the first turn.
    let mut gateway = Gateway::start(&home, "sqlite");
    wait_for_health(&http, port, &gateway).await;
    llm.push(Reply::text("the llama is called Pablo"));
    assert_eq!(
        turn(&http, port, "remember: my llama is Pablo").await,
        "the llama is called Pablo"
    );

    // The copy refuses while the gateway runs, and writes nothing.
    let refused = migrate(&home, &url, &schema);
    let (out, err) = text(&refused);
    assert!(!refused.status.success(), "{out}\n{err}");
    assert!(err.contains("gateway") && err.contains("running"), "{err}");
    assert!(err.contains("talaria gateway stop"), "{err}");
    gateway.stop();

    // Stopped: the copy goes through, and no output carries the password.
    let copied = migrate(&home, &url, &schema);
    let (out, err) = text(&copied);
    assert!(copied.status.success(), "{out}\n{err}");
    assert!(
        !out.contains(&password) && !err.contains(&password),
        "{out}\n{err}"
    );
    assert!(out.contains("***"), "{out}");
    for table in ["sessions", "messages", "cron_jobs"] {
        assert!(out.contains(table), "{out}");
    }
    assert!(out.contains("same number of rows on both sides"), "{out}");

    // The home is switched as the command says: its `store:` lines into
    // config.yaml, the URL into .env.
    let config_lines: String = out
        .lines()
        .skip_while(|l| *l != "store:")
        .take_while(|l| !l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        config_lines,
        format!("store:\n  backend: postgres\n  postgres_schema: {schema}\n"),
        "{out}"
    );
    assert!(out.contains("TALARIA_DATABASE_URL="), "{out}");
    let config = home.root.join("config.yaml");
    let mut yaml = std::fs::read_to_string(&config).unwrap();
    yaml.push_str(&config_lines);
    std::fs::write(&config, yaml).unwrap();
    let dotenv = home.root.join(".env");
    let mut env = std::fs::read_to_string(&dotenv).unwrap();
    env.push_str(&format!("TALARIA_DATABASE_URL={url}\n"));
    std::fs::write(&dotenv, env).unwrap();
    // The old file moves aside, so nothing can quietly keep using it.
    std::fs::rename(home.root.join("state.db"), home.root.join("state.db.old")).unwrap();

    // On PostgreSQL, the same session continues: the model sees turn one.
    let mut gateway = Gateway::start(&home, "postgres");
    wait_for_health(&http, port, &gateway).await;
    llm.push(Reply::text("Pablo"));
    assert_eq!(turn(&http, port, "what is my llama called?").await, "Pablo");
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    let transcript: Vec<(String, String)> = requests[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] != "system")
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_owned(),
                m["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        transcript,
        [
            ("user".to_owned(), "remember: my llama is Pablo".to_owned()),
            (
                "assistant".to_owned(),
                "the llama is called Pablo".to_owned()
            ),
            ("user".to_owned(), "what is my llama called?".to_owned()),
        ],
        "{}",
        gateway.log()
    );
    gateway.stop();
    assert!(!home.root.join("state.db").exists());

    // The database holds both turns, the copied rows before the new ones.
    let mut options = PostgresOptions::new(talaria_testkit::postgres::url());
    options.schema = Some(schema);
    options.max_connections = 2;
    let store = PostgresStore::connect(options).await.unwrap();
    let messages = store.messages(SESSION).await.unwrap();
    assert_eq!(messages.len(), 4, "{messages:?}");
    assert!(messages.windows(2).all(|w| w[0].id < w[1].id));
}

/// A copy that stopped halfway leaves its marker unfinished; nothing runs
/// on such a database (it would look like lost conversations) until the
/// same `store migrate` is run again and finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_runs_on_a_database_whose_copy_did_not_finish() {
    let llm = MockOpenAi::start().await;
    let port = free_port();
    let home = home(
        &llm,
        &format!("  api_server:\n    enabled: true\n    host: 127.0.0.1\n    port: {port}\n"),
        &format!("API_SERVER_KEY={KEY}\n"),
    );
    {
        let store = talaria_store::SqliteStore::open(&home.root.join("state.db")).unwrap();
        store
            .create_session(talaria_store::NewSession {
                id: SESSION.to_owned(),
                source: "api_server".to_owned(),
                ..talaria_store::NewSession::default()
            })
            .await
            .unwrap();
    }
    let schema = talaria_testkit::postgres::fresh_schema().await;
    let url = talaria_testkit::postgres::url();
    let copied = migrate(&home, &url, &schema);
    assert!(copied.status.success(), "{:?}", text(&copied));
    // What a copy cut off before its verification leaves behind.
    let client = talaria_testkit::postgres::connect(Some(&schema)).await;
    client
        .execute("UPDATE talaria_copy SET finished_at = NULL", &[])
        .await
        .unwrap();

    let config = home.root.join("config.yaml");
    let mut yaml = std::fs::read_to_string(&config).unwrap();
    yaml.push_str(&format!(
        "store:\n  backend: postgres\n  postgres_url: {url}\n  postgres_schema: {schema}\n"
    ));
    std::fs::write(&config, yaml).unwrap();

    let log = home.root.join("refused.log");
    let mut command = gateway_command(&home, &log);
    let status = command.status().unwrap();
    assert!(!status.success());
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("never finished") && said.contains("talaria store migrate"),
        "{said}"
    );
    assert!(!health_answers(port).await);

    // The same copy again finishes it, and the database is usable.
    let again = migrate(&home, &url, &schema);
    assert!(again.status.success(), "{:?}", text(&again));
    let listed = Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(&home.root)
        .args(["sessions", "list"])
        .env_remove("TALARIA_HOME")
        .env_remove("TALARIA_DATABASE_URL")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(listed.status.success(), "{:?}", text(&listed));
    assert!(text(&listed).0.contains(SESSION), "{:?}", text(&listed));
}

async fn health_answers(port: u16) -> bool {
    reqwest::get(format!("http://127.0.0.1:{port}/health"))
        .await
        .is_ok_and(|r| r.status().is_success())
}
