//! `talaria gateway run` with its API server, for the tests that drive it
//! over HTTP.

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
}

impl ApiGateway {
    /// Starts the gateway of `home`, whose API server listens on `port`,
    /// and waits for its `/health` (its log is `home/gateway.log`).
    pub async fn start(home: &Path, port: u16) -> ApiGateway {
        let log = home.join("gateway.log");
        let child = Command::new(env!("CARGO_BIN_EXE_talaria"))
            .arg("--home")
            .arg(home)
            .args(["gateway", "run"])
            .env_remove("TALARIA_HOME")
            .env_remove("OPENAI_API_KEY")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("the gateway starts");
        let mut gateway = ApiGateway {
            child,
            url: format!("http://127.0.0.1:{port}"),
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
                panic!(
                    "the gateway exited ({status}):\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "no /health");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for ApiGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
