//! The local Chromium process: finding the program, starting it so that it
//! dies with us, reading its DevTools address, and sweeping away the
//! Chromium a previous gateway left behind when it was killed.
//!
//! Chromium is started through a tiny `sh` that leads a process group of
//! its own: the shell runs Chromium in the background and then waits on its
//! standard input, a pipe whose other end only this process holds. When this
//! process ends, however it ends (SIGKILL included), the pipe closes, the
//! read returns and the shell kills the whole group. No `prctl`, no unsafe
//! code. Dropping [`ChromiumProcess`] kills the group at once as well.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use super::BrowserError;

/// Programs tried on `PATH` when `browser.chromium_path` is unset.
const CANDIDATES: &[&str] = &[
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
];

/// How long Chromium may take to print its DevTools address.
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest stderr line kept for an error message or the log.
const MAX_LINE: usize = 400;

/// The shell that leads Chromium's process group (see the module doc).
/// `kill -KILL 0` signals the group, the shell included.
const WRAPPER: &str = r#""$@" &
read -r _ || :
kill -KILL 0"#;

/// The prefix of each profile directory under the data directory; the
/// owner's process id follows, so a sweep can tell a live owner's.
const PROFILE_PREFIX: &str = "chromium-";

/// The program to run: `configured`, else the first candidate on `PATH`.
pub(crate) fn find_program(configured: Option<&Path>) -> Result<PathBuf, BrowserError> {
    if let Some(path) = configured {
        if path.is_file() {
            return Ok(path.to_path_buf());
        }
        return Err(BrowserError::Unavailable(format!(
            "browser.chromium_path is {}, which is not a file: install Chromium or correct \
             the setting",
            path.display()
        )));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in CANDIDATES {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    Err(BrowserError::Unavailable(format!(
        "no Chromium found on PATH (looked for {}): install it (Debian: apt-get install \
         chromium) or set browser.chromium_path",
        CANDIDATES.join(", ")
    )))
}

/// Whether this process runs as root (Chromium's sandbox refuses root).
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the effective user of the process.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The profile directory this process uses under `data_dir`.
pub(crate) fn profile_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(format!("{PROFILE_PREFIX}{}", std::process::id()))
}

/// A running Chromium, its process group and the pipe that keeps it alive.
pub(crate) struct ChromiumProcess {
    child: Child,
    /// Held open: closing it makes the wrapper end the group.
    stdin: Option<ChildStdin>,
    pgid: Pid,
    profile: PathBuf,
}

impl ChromiumProcess {
    /// Starts `program` headless with its profile in `profile`, its
    /// traffic through the proxy at `proxy_port`, and returns it with the
    /// DevTools WebSocket address it printed.
    pub(crate) async fn start(
        program: &Path,
        profile: &Path,
        proxy_port: u16,
    ) -> Result<(ChromiumProcess, String), BrowserError> {
        tokio::fs::create_dir_all(profile).await.map_err(|e| {
            BrowserError::Unavailable(format!(
                "cannot create the browser profile directory {}: {e}",
                profile.display()
            ))
        })?;
        let mut args: Vec<String> = vec![
            "--headless=new".into(),
            "--remote-debugging-port=0".into(),
            "--remote-debugging-address=127.0.0.1".into(),
            format!("--user-data-dir={}", profile.display()),
            // Every request goes through the guard's proxy, loopback
            // included (Chromium bypasses a proxy for loopback unless told
            // not to).
            format!("--proxy-server=http://127.0.0.1:{proxy_port}"),
            "--proxy-bypass-list=<-loopback>".into(),
            // WebRTC would otherwise send UDP past the proxy.
            "--force-webrtc-ip-handling-policy=disable_non_proxied_udp".into(),
            "--webrtc-ip-handling-policy=disable_non_proxied_udp".into(),
            // The crash reporter runs as a process of its own that writes
            // outside the profile.
            "--disable-crash-reporter".into(),
            "--disable-breakpad".into(),
            "--no-first-run".into(),
            "--no-default-browser-check".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-default-apps".into(),
            "--disable-extensions".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-gpu".into(),
            "--mute-audio".into(),
            "--hide-scrollbars".into(),
            "--password-store=basic".into(),
            "--window-size=1280,900".into(),
            // Back and forward load pages again (a page restored from the
            // back-forward cache fires no load event to wait for); no
            // silent upgrade of http to https that a plain server can't
            // answer.
            "--disable-features=BackForwardCache,HttpsUpgrades,HttpsFirstBalancedModeAutoEnable,\
             Translate,MediaRouter,OptimizationHints"
                .into(),
        ];
        if running_as_root() {
            // Chromium's own sandbox will not start as root.
            args.push("--no-sandbox".into());
        }
        args.push("about:blank".into());

        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(WRAPPER)
            .arg("talaria-chromium")
            .arg(program)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            BrowserError::Unavailable(format!("cannot start {}: {e}", program.display()))
        })?;
        let pgid = match child.id() {
            Some(id) => Pid::from_raw(id as i32),
            None => {
                return Err(BrowserError::Unavailable(format!(
                    "{} exited at once",
                    program.display()
                )));
            }
        };
        let stdin = child.stdin.take();
        let stderr = child.stderr.take();
        let mut process = ChromiumProcess {
            child,
            stdin,
            pgid,
            profile: profile.to_path_buf(),
        };
        let Some(stderr) = stderr else {
            return Err(BrowserError::Unavailable(
                "Chromium's error output could not be read".into(),
            ));
        };
        let mut lines = BufReader::new(stderr).lines();
        let mut last = Vec::new();
        let found = tokio::time::timeout(LAUNCH_TIMEOUT, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(at) = line.find("ws://") {
                    return Some(line[at..].trim().to_owned());
                }
                if last.len() == 5 {
                    last.remove(0);
                }
                last.push(cut(&line));
            }
            None
        })
        .await;
        let ws = match found {
            Ok(Some(ws)) => ws,
            Ok(None) => {
                process.kill();
                return Err(BrowserError::Unavailable(format!(
                    "Chromium ({}) exited before it was ready: {}",
                    program.display(),
                    last.join(" / ")
                )));
            }
            Err(_) => {
                process.kill();
                return Err(BrowserError::Unavailable(format!(
                    "Chromium ({}) did not start within {} seconds: {}",
                    program.display(),
                    LAUNCH_TIMEOUT.as_secs(),
                    last.join(" / ")
                )));
            }
        };
        // Chromium keeps writing to stderr: read it to the end so the pipe
        // never fills and stalls it; the log gets it at debug level.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::debug!(target: "talaria_web::browser::chromium", "{}", cut(&line));
            }
        });
        Ok((process, ws))
    }

    /// Kills the whole group now.
    pub(crate) fn kill(&mut self) {
        // Closing the pipe alone would do it, a moment later; the signal
        // makes it immediate.
        self.stdin = None;
        let _ = killpg(self.pgid, Signal::SIGKILL);
        let _ = self.child.start_kill();
    }

    /// Kills the group, waits for the shell and removes the profile.
    pub(crate) async fn shutdown(mut self) {
        self.kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
        // Chromium's children may still be writing for a moment after the
        // signal: a failed removal is retried once, then left for the sweep.
        if tokio::fs::remove_dir_all(&self.profile).await.is_err() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _ = tokio::fs::remove_dir_all(&self.profile).await;
        }
    }
}

impl Drop for ChromiumProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn cut(line: &str) -> String {
    line.chars().take(MAX_LINE).collect()
}

/// Kills the Chromium processes a previous owner of `data_dir` left
/// running and removes their profiles; returns how many processes were
/// killed. A process is left alone unless its command line names a
/// profile under `data_dir` whose owner (the process id in the profile's
/// name) is no longer running; this process's own profile is never
/// touched.
pub fn sweep(data_dir: &Path) -> usize {
    let own = std::process::id();
    let alive = |pid: u32| Path::new(&format!("/proc/{pid}")).exists();
    let mut killed = Vec::new();
    let Ok(others) = other_processes() else {
        return 0;
    };
    for (pid, raw) in others {
        let Some(owner) = profile_owner(&raw, data_dir) else {
            continue;
        };
        if owner == own || (owner != pid && alive(owner)) {
            continue;
        }
        let target = Pid::from_raw(pid as i32);
        if kill(target, Signal::SIGKILL).is_ok() {
            killed.push(pid);
        }
    }
    // The profiles are removed once their processes are gone (a process
    // still writing would leave files behind); a killed process is gone
    // when its command line is (a zombie has none).
    let running =
        |pid: &u32| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| !c.is_empty());
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while killed.iter().any(running) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let killed = killed.len();
    // Profiles whose owner is gone are only leftovers now.
    if let Ok(entries) = std::fs::read_dir(data_dir) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(owner) = name
                .to_str()
                .and_then(|n| n.strip_prefix(PROFILE_PREFIX))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if owner != own && !alive(owner) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    if killed > 0 {
        tracing::info!(
            killed,
            dir = %data_dir.display(),
            "killed Chromium processes left by a previous run"
        );
    }
    killed
}

/// The owner's process id when the command line `raw` (NUL-separated)
/// holds `--user-data-dir=<data_dir>/chromium-<pid>`.
fn profile_owner(raw: &[u8], data_dir: &Path) -> Option<u32> {
    let want = format!("--user-data-dir={}/{PROFILE_PREFIX}", data_dir.display());
    raw.split(|&b| b == 0).find_map(|arg| {
        let arg = std::str::from_utf8(arg).ok()?;
        let rest = arg.strip_prefix(&want)?;
        rest.trim_end_matches('/').parse::<u32>().ok()
    })
}

/// Processes whose command line mentions `needle` (tests and diagnostics:
/// "is any Chromium of this profile still running?").
pub fn processes_mentioning(needle: &str) -> io::Result<Vec<u32>> {
    Ok(other_processes()?
        // A zombie has an empty command line and is no longer running.
        .filter(|(_, raw)| !raw.is_empty() && String::from_utf8_lossy(raw).contains(needle))
        .map(|(pid, _)| pid)
        .collect())
}

/// Every other process whose command line can be read: its id and its
/// NUL-separated command line.
fn other_processes() -> io::Result<impl Iterator<Item = (u32, Vec<u8>)>> {
    let own = std::process::id();
    Ok(std::fs::read_dir("/proc")?
        .flatten()
        .filter_map(move |entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            if pid == own {
                return None;
            }
            let raw = std::fs::read(entry.path().join("cmdline")).ok()?;
            Some((pid, raw))
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_is_read_from_the_profile_argument() {
        let dir = Path::new("/home/t/browser");
        let raw = b"chromium\0--headless=new\0--user-data-dir=/home/t/browser/chromium-4242\0x";
        assert_eq!(profile_owner(raw, dir), Some(4242));
        let other = b"chromium\0--user-data-dir=/elsewhere/chromium-4242\0";
        assert_eq!(profile_owner(other, dir), None);
        let odd = b"chromium\0--user-data-dir=/home/t/browser/chromium-x\0";
        assert_eq!(profile_owner(odd, dir), None);
    }
}
