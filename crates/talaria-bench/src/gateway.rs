//! `talaria gateway run` as the process under test: a fresh home pointed
//! at the mock, launch, readiness, and what `/proc` says about it.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The API key the benchmark's gateway is given.
pub const API_KEY: &str = "bench-api-key-0123456789abcdef";

/// Clock ticks per second in `/proc/<pid>/stat` (USER_HZ). It is 100 on
/// every Linux architecture Talaria targets; `getconf CLK_TCK` confirms.
const TICKS_PER_SEC: f64 = 100.0;

/// A gateway process with its own home.
pub struct Gateway {
    child: Child,
    /// When the process was spawned, for the cold-start figures.
    pub launched: Instant,
    /// `http://127.0.0.1:port`.
    pub base: String,
    home: tempfile::TempDir,
}

/// One reading of the process's counters.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// User plus system CPU time of all threads, in seconds.
    pub cpu_secs: f64,
    /// Resident set size, in bytes.
    pub rss_bytes: u64,
    /// Its anonymous part (heap, stacks), in bytes: what the process
    /// itself holds, as opposed to mapped pages of its binary.
    pub rss_anon_bytes: u64,
    /// Bytes the process caused to be written to storage (page-dirtying
    /// time, so rewriting an already dirty page is not counted twice).
    pub write_bytes: u64,
}

impl Gateway {
    /// Writes a home whose only platform is the API server, pointed at the
    /// model at `model_url`, and starts `talaria gateway run` in it.
    pub fn launch(talaria: &Path, model_url: &str) -> anyhow::Result<Gateway> {
        Gateway::launch_with(talaria, model_url, "", "")
    }

    /// [`Gateway::launch`] with more platforms (`platforms_yaml`, lines
    /// indented under `platforms:`) and `.env` lines.
    pub fn launch_with(
        talaria: &Path,
        model_url: &str,
        platforms_yaml: &str,
        dotenv: &str,
    ) -> anyhow::Result<Gateway> {
        Gateway::launch_in(new_home()?, talaria, model_url, platforms_yaml, dotenv)
    }

    /// [`Gateway::launch_with`] in `home`, made beforehand with
    /// [`new_home`] (a home whose `state.db` is already filled, say).
    pub fn launch_in(
        home: tempfile::TempDir,
        talaria: &Path,
        model_url: &str,
        platforms_yaml: &str,
        dotenv: &str,
    ) -> anyhow::Result<Gateway> {
        let port = free_port()?;
        std::fs::write(
            home.path().join("config.yaml"),
            format!(
                "model:\n  default: bench-model\n  provider: custom\n  base_url: {model_url}\n  \
                 api_key: sk-bench-0123456789\n  vision: \"on\"\n\
                 stt:\n  provider: openai\n  base_url: {model_url}\n  api_key: sk-bench-0123456789\n\
                 platforms:\n  api_server:\n    port: {port}\n    max_concurrent_runs: 256\n{platforms_yaml}"
            ),
        )?;
        std::fs::write(
            home.path().join(".env"),
            format!("API_SERVER_KEY={API_KEY}\n{dotenv}"),
        )?;
        let log = std::fs::File::create(home.path().join("bench-gateway.log"))?;
        let launched = Instant::now();
        let child = Command::new(talaria)
            .arg("--home")
            .arg(home.path())
            .args(["gateway", "run"])
            .env_remove("TALARIA_HOME")
            .env_remove("TELEGRAM_BOT_TOKEN")
            .env_remove("API_SERVER_KEY")
            .env_remove("API_SERVER_PORT")
            .env("TALARIA_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", talaria.display()))?;
        Ok(Gateway {
            child,
            launched,
            base: format!("http://127.0.0.1:{port}"),
            home,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The home directory.
    pub fn home(&self) -> &Path {
        self.home.path()
    }

    /// Polls `/health` until it answers 200; returns the time since launch.
    pub async fn wait_healthy(
        &mut self,
        http: &reqwest::Client,
        limit: Duration,
    ) -> anyhow::Result<Duration> {
        let url = format!("{}/health", self.base);
        loop {
            if let Ok(r) = http.get(&url).send().await
                && r.status().is_success()
            {
                return Ok(self.launched.elapsed());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "the gateway exited ({status}) before answering /health:\n{}",
                    self.log_tail()
                );
            }
            if self.launched.elapsed() > limit {
                bail!(
                    "the gateway did not answer /health within {limit:?}:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// The current counters, from `/proc/<pid>/stat`, `status` and `io`.
    pub fn sample(&self) -> anyhow::Result<Sample> {
        sample(self.pid())
    }

    /// Current size of `state.db` and its WAL, in bytes.
    pub fn db_bytes(&self) -> u64 {
        ["state.db", "state.db-wal"]
            .iter()
            .filter_map(|f| std::fs::metadata(self.home().join(f)).ok())
            .map(|m| m.len())
            .sum()
    }

    /// The end of the gateway's log, for error messages.
    pub fn log_tail(&self) -> String {
        let log =
            std::fs::read_to_string(self.home().join("bench-gateway.log")).unwrap_or_default();
        let start = log.len().saturating_sub(2000);
        log.get(start..).unwrap_or("").to_owned()
    }

    /// Stops the process (SIGTERM, then SIGKILL after a grace period).
    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh, empty home directory, removed when dropped.
pub fn new_home() -> anyhow::Result<tempfile::TempDir> {
    Ok(tempfile::Builder::new()
        .prefix("talaria-bench-")
        .tempdir()?)
}

/// The number after `name` on its line (`VmRSS:   1234 kB` → 1234).
fn field_value(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// A port nobody listens on right now.
fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// The counters of process `pid` now, from `/proc/<pid>/stat`, `status`
/// and `io`.
pub fn sample(pid: u32) -> anyhow::Result<Sample> {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let stat = std::fs::read_to_string(proc.join("stat"))?;
    // The command name may contain spaces; fields are counted after
    // its closing parenthesis. utime and stime are fields 14 and 15.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("unexpected /proc/<pid>/stat")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields
            .get(i)
            .context("short /proc/<pid>/stat")?
            .parse::<f64>()?)
    };
    // `after` starts at field 3 (state), so field n is at index n - 3.
    let cpu_secs = (ticks(11)? + ticks(12)?) / TICKS_PER_SEC;
    let status = std::fs::read_to_string(proc.join("status"))?;
    let rss_kb = field_value(&status, "VmRSS:").context("no VmRSS")?;
    let anon_kb = field_value(&status, "RssAnon:").context("no RssAnon")?;
    let io = std::fs::read_to_string(proc.join("io"))?;
    let write_bytes = field_value(&io, "write_bytes:").context("no write_bytes")?;
    Ok(Sample {
        cpu_secs,
        rss_bytes: rss_kb * 1024,
        rss_anon_bytes: anon_kb * 1024,
        write_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_fields_are_read_by_name() {
        let status = "Name:\ttalaria\nVmRSS:\t   12345 kB\nThreads:\t3\n";
        assert_eq!(field_value(status, "VmRSS:"), Some(12345));
        assert_eq!(field_value(status, "VmHWM:"), None);
        let io = "rchar: 10\nwrite_bytes: 4096\n";
        assert_eq!(field_value(io, "write_bytes:"), Some(4096));
    }
}
