//! `talaria gateway run` with its API server, for the tests that drive it
//! over HTTP.

// Each test binary that includes this module uses a part of it.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free port on 127.0.0.1 for the API server.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The gateway, killed when dropped.
pub struct ApiGateway {
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    log: std::path::PathBuf,
}

impl ApiGateway {
    /// Starts the gateway of `home`, whose API server listens on `port`,
    /// and waits for its `/health` (its log is `home/gateway.log`).
    pub async fn start(home: &Path, port: u16) -> ApiGateway {
        ApiGateway::launch(home, port, None).await
    }

    /// [`ApiGateway::start`] with `workdir` as the gateway's working
    /// directory (where the host's commands run).
    pub async fn start_in(home: &Path, port: u16, workdir: &Path) -> ApiGateway {
        ApiGateway::launch(home, port, Some(workdir)).await
    }

    async fn launch(home: &Path, port: u16, workdir: Option<&Path>) -> ApiGateway {
        let log = home.join("gateway.log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_talaria"));
        command
            .arg("--home")
            .arg(home)
            .args(["gateway", "run"])
            // Only the home's own settings count: nothing from the
            // environment the tests run in.
            .env_remove("TALARIA_HOME")
            .env_remove("OPENAI_API_KEY")
            .env_remove("TELEGRAM_BOT_TOKEN")
            .env_remove("API_SERVER_KEY")
            .env_remove("API_SERVER_PORT")
            .env("TALARIA_GATEWAY_LOCK_DIR", home.join("locks"))
            .env("TALARIA_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"));
        if let Some(dir) = workdir {
            command.current_dir(dir);
        }
        let child = command.spawn().expect("the gateway starts");
        let mut gateway = ApiGateway {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
        };
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = http.get(format!("{}/health", gateway.url)).send().await
                && r.status().is_success()
            {
                return gateway;
            }
            if let Ok(Some(status)) = gateway.child.try_wait() {
                panic!("the gateway exited ({status}):\n{}", gateway.log());
            }
            assert!(
                Instant::now() < deadline,
                "the gateway never answered /health:\n{}",
                gateway.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What the gateway has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ApiGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
