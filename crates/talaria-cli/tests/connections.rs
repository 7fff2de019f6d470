//! `talaria gateway run` as a real process under a lowered open-file limit
//! (`prlimit --nofile=256:256`), its API server and webhook listener each
//! flooded with more idle connections than the process may have files,
//! every one holding half a request. The gateway keeps working: `/health`
//! answers on both listeners, an allowed Telegram user's message is
//! answered (which needs descriptors for the database and the model), the
//! stalled connections are closed by the server within the header
//! timeout, and a body declared too large is refused with 413 before any of
//! it is sent. Also: the systemd unit `gateway install` writes raises the
//! open-file limit.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use talaria_testkit::{FakeTelegram, MockOpenAi, Reply};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout, timeout_at};

const TOKEN: &str = "424242:connections-test-token-abcdefgh";
const API_KEY: &str = "connections-test-api-key-0123456789";
const ALLOWED_USER: i64 = 4242;
/// The open-file limit the gateway runs under (soft and hard).
const NOFILE: u32 = 256;
/// Idle connections opened to EACH listener: more than the whole process
/// may have open.
const FLOOD: usize = 300;
/// The server's default header read timeout (docs/DEPLOYMENT.md).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A generous bound for "it did not hang".
const WAIT: Duration = Duration::from_secs(30);

/// The test process opens `2 * FLOOD` sockets itself: a low soft limit of
/// the machine running the tests must not fail it.
fn raise_own_open_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    }
    let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    assert!(
        soft >= (3 * FLOOD) as u64,
        "this test needs {} open files; the hard limit is {soft}",
        3 * FLOOD
    );
}

struct Gateway {
    _dir: tempfile::TempDir,
    root: PathBuf,
    child: Child,
}

impl Gateway {
    fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("gateway.log")).unwrap_or_default()
    }

    /// The address printed after `marker` at start (`… on http://ADDR`).
    async fn address(&mut self, marker: &str) -> SocketAddr {
        let deadline = Instant::now() + WAIT;
        loop {
            let log = self.log();
            if let Some(rest) = log.split(marker).nth(1)
                && let Some(url) = rest.split_whitespace().next()
            {
                return url.trim_start_matches("http://").parse().unwrap();
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the gateway exited ({status}):\n{log}");
            }
            assert!(
                Instant::now() < deadline,
                "no `{marker}` in the log:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `talaria gateway run` with Telegram, the API server and one webhook
/// route, through `prlimit` so its open-file limit is [`NOFILE`].
fn start_gateway(llm: &MockOpenAi, tg: &FakeTelegram) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("home");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("config.yaml"),
        format!(
            "model:\n  default: mock-model\n  provider: custom\n  base_url: {}\n  \
             api_key: sk-test-secret-key-0123456789\nagent:\n  api_max_retries: 1\n\
             platforms:\n  telegram:\n    base_url: {}\n    poll_timeout_secs: 1\n  \
             api_server:\n    port: 0\n    key: {API_KEY}\n  \
             webhook:\n    port: 0\n    routes:\n      probe:\n        \
             secret: connections-test-webhook-secret\n        scheme: github\n",
            llm.base_url(),
            tg.base_url()
        ),
    )
    .unwrap();
    std::fs::write(
        root.join(".env"),
        format!("TELEGRAM_BOT_TOKEN={TOKEN}\nTELEGRAM_ALLOWED_USERS={ALLOWED_USER}\n"),
    )
    .unwrap();
    let log = std::fs::File::create(root.join("gateway.log")).unwrap();
    let mut command = Command::new("prlimit");
    command
        .arg(format!("--nofile={NOFILE}:{NOFILE}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(&root)
        .args(["gateway", "run"]);
    for var in [
        "TALARIA_HOME",
        "TALARIA_DATABASE_URL",
        "TALARIA_NODE_HOST",
        "TELEGRAM_BOT_TOKEN",
        "TELEGRAM_ALLOWED_USERS",
        "GATEWAY_ALLOW_ALL_USERS",
        "GATEWAY_ALLOWED_USERS",
        "API_SERVER_KEY",
        "API_SERVER_PORT",
        "API_SERVER_HOST",
        "API_SERVER_ENABLED",
    ] {
        command.env_remove(var);
    }
    let child = command
        .env("TALARIA_GATEWAY_LOCK_DIR", dir.path().join("locks"))
        .env("TALARIA_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("cannot run prlimit (util-linux)");
    Gateway {
        _dir: dir,
        root,
        child,
    }
}

/// Opens up to `n` connections to `addr`, each sending `half` (a request
/// head without its end) and then nothing. Stops early when a connection
/// does not complete within a few seconds (a server that no longer
/// accepts, its backlog full): the caller checks the count once it has
/// seen what the server still does.
async fn flood(addr: SocketAddr, n: usize, half: &str) -> Vec<TcpStream> {
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        let Ok(connected) = timeout(Duration::from_secs(5), TcpStream::connect(addr)).await else {
            break;
        };
        let mut s = connected.unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
        s.write_all(half.as_bytes()).await.unwrap();
        streams.push(s);
    }
    streams
}

/// Sends `request` on a new connection and reads the answer until the
/// server closes (requests say `Connection: close`), within [`WAIT`].
async fn exchange(addr: SocketAddr, request: &str, within: Duration) -> String {
    let work = async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        // Bounded: an answer larger than 64 KiB is not what these ask for.
        while answer.len() < 64 * 1024 {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
        String::from_utf8_lossy(&answer).into_owned()
    };
    timeout(within, work)
        .await
        .unwrap_or_else(|_| panic!("no answer from {addr} within {within:?} to {request:?}"))
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
}

/// Reads `s` until the server closes it (EOF or reset) or `deadline`
/// passes; whether it was closed. What the server writes first (an error
/// status, say) is read and dropped, at most 64 KiB.
async fn closed_by_server(mut s: TcpStream, deadline: Instant) -> bool {
    let mut buf = [0u8; 1024];
    let mut read = 0usize;
    loop {
        match timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(n)) => {
                read += n;
                if read > 64 * 1024 {
                    return false;
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_under_a_low_open_file_limit_does_not_take_the_gateway_down() {
    raise_own_open_file_limit();
    let llm = MockOpenAi::start().await;
    let tg = FakeTelegram::start(TOKEN).await;
    let mut gateway = start_gateway(&llm, &tg);
    let api = gateway.address("API server listening on ").await;
    let ingress = gateway.address("webhook listener on ").await;
    tg.wait_for_get_updates_calls(1, WAIT).await;

    // Both listeners get more half requests than the process may have
    // files, all at once.
    let started = Instant::now();
    let (api_flood, ingress_flood) = tokio::join!(
        flood(
            api,
            FLOOD,
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        ),
        flood(
            ingress,
            FLOOD,
            "POST /webhooks/probe HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        ),
    );

    // The gateway still answers health checks on both...
    for addr in [api, ingress] {
        let answer = exchange(addr, &get("/health"), WAIT).await;
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "/health on {addr} during the flood: {answer:?}\n{}",
            gateway.log()
        );
    }
    // ...and an allowed user's turn runs: the store and the model still
    // get the descriptors they need.
    llm.push(Reply::text("still here"));
    tg.push_private_text(ALLOWED_USER, "are you there?");
    let sent = tg.wait_for_sent(1, WAIT).await;
    assert!(
        sent[0].rendered().contains("still here"),
        "{:?}\n{}",
        sent[0].rendered(),
        gateway.log()
    );
    assert!(
        !gateway.log().contains("Too many open files"),
        "{}",
        gateway.log()
    );

    assert_eq!(
        (api_flood.len(), ingress_flood.len()),
        (FLOOD, FLOOD),
        "every connection of the flood completes"
    );
    // Every stalled connection is closed by the server: those it evicted
    // to make room at once, the rest when the header timeout runs out.
    let deadline = started + HEADER_TIMEOUT + WAIT;
    let closed = futures_count(
        api_flood
            .into_iter()
            .chain(ingress_flood)
            .map(|s| closed_by_server(s, deadline)),
    )
    .await;
    assert_eq!(
        closed,
        2 * FLOOD,
        "stalled connections closed by the server within the header timeout"
    );

    // A body declared larger than the route takes is refused before any of
    // it is sent: the answer comes well before the body read timeout.
    let huge = 100 * 1024 * 1024;
    let answer = exchange(
        api,
        &format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\
             Authorization: Bearer {API_KEY}\r\nContent-Type: application/json\r\n\
             Content-Length: {huge}\r\nConnection: close\r\n\r\n"
        ),
        Duration::from_secs(10),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "API server: {answer:?}");
    let answer = exchange(
        ingress,
        &format!(
            "POST /webhooks/probe HTTP/1.1\r\nHost: 127.0.0.1\r\n\
             Content-Type: application/json\r\nX-GitHub-Event: push\r\n\
             Content-Length: {huge}\r\nConnection: close\r\n\r\n"
        ),
        Duration::from_secs(10),
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 413"),
        "webhook listener: {answer:?}"
    );
    assert!(
        gateway.child.try_wait().unwrap().is_none(),
        "{}",
        gateway.log()
    );
}

/// Runs the checks side by side (each is bounded by its own deadline) and
/// counts those that held.
async fn futures_count<F>(checks: impl Iterator<Item = F>) -> usize
where
    F: std::future::Future<Output = bool> + Send + 'static,
{
    let tasks: Vec<_> = checks.map(tokio::spawn).collect();
    let mut held = 0;
    for task in tasks {
        if task.await.unwrap() {
            held += 1;
        }
    }
    held
}

#[test]
fn the_unit_gateway_install_writes_raises_the_open_file_limit() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let config = dir.path().join("xdg");
    let out = Command::new(env!("CARGO_BIN_EXE_talaria"))
        .arg("--home")
        .arg(&home)
        .args(["gateway", "install"])
        .env_remove("TALARIA_HOME")
        .env("XDG_CONFIG_HOME", &config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let unit =
        std::fs::read_to_string(config.join("systemd/user/talaria-gateway.service")).unwrap();
    let limit = unit
        .lines()
        .find_map(|l| l.strip_prefix("LimitNOFILE="))
        .unwrap_or_else(|| panic!("no LimitNOFILE in\n{unit}"));
    assert!(
        limit.trim().parse::<u64>().unwrap() >= 65536,
        "LimitNOFILE={limit}"
    );
    // Under `[Service]`, where systemd reads it.
    let service = unit.find("[Service]").unwrap();
    let install = unit.find("[Install]").unwrap();
    let at = unit.find("LimitNOFILE=").unwrap();
    assert!(service < at && at < install, "{unit}");
}
