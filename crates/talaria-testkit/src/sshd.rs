//! A real OpenSSH server on 127.0.0.1 for the ssh backend's tests.
//!
//! [`Sshd::start`] generates a host key and a client key with `ssh-keygen`,
//! authorizes the client key, writes a known-hosts file with the host's
//! real key, and runs `/usr/sbin/sshd -D -e` on a free port with a config
//! of its own (key login only, `StrictModes no` since the files live in a
//! temp dir). The server logs in as the user running the tests; dropping
//! the [`Sshd`] kills it. A machine without `openssh-server` fails the
//! test, saying what to install (`scripts/test` installs it).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running sshd and the files a client needs to reach it.
pub struct Sshd {
    dir: tempfile::TempDir,
    child: Child,
    port: u16,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port on 127.0.0.1")
}

fn sshd_binary() -> PathBuf {
    ["/usr/sbin/sshd", "/usr/local/sbin/sshd"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "sshd is not installed, and the ssh backend's tests need a real OpenSSH \
                 server: apt-get install -y openssh-server"
            )
        })
}

/// A new ed25519 key pair at `path` and `path.pub`, without a passphrase.
pub fn keygen(path: &Path) {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "talaria-test", "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run ssh-keygen (apt-get install -y openssh-client): {e}")
        });
    assert!(
        out.status.success(),
        "ssh-keygen failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Sshd {
    /// Starts the server and waits until it greets.
    pub fn start() -> Sshd {
        let sshd = sshd_binary();
        // sshd refuses to start without its privilege separation directory.
        std::fs::create_dir_all("/run/sshd").unwrap_or_else(|e| {
            panic!("sshd needs /run/sshd and it cannot be created (run the tests as root): {e}")
        });
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path();
        keygen(&root.join("host_key"));
        keygen(&root.join("client_key"));
        std::fs::copy(root.join("client_key.pub"), root.join("authorized_keys"))
            .expect("write authorized_keys");
        let port = free_port();
        std::fs::write(
            root.join("known_hosts"),
            known_hosts_line(port, &root.join("host_key.pub")),
        )
        .expect("write known_hosts");
        let conf = root.join("sshd_config");
        std::fs::write(&conf, config(root, port)).expect("write sshd_config");
        // No environment of the test's: whatever a session gets, it gets
        // from sshd's own defaults or from the client.
        let child = Command::new(&sshd)
            .args(["-D", "-e", "-f"])
            .arg(&conf)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(root.join("sshd.log")).expect("log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", sshd.display()));
        let mut server = Sshd { dir, child, port };
        server.wait_for_greeting();
        server
    }

    fn wait_for_greeting(&mut self) {
        use std::io::Read;
        let deadline = Instant::now() + crate::wait::WAIT;
        loop {
            if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = [0u8; 4];
                if s.read_exact(&mut buf).is_ok() && &buf == b"SSH-" {
                    return;
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("sshd exited ({status}) before it served; {}", self.log());
            }
            if Instant::now() > deadline {
                panic!(
                    "sshd did not start on 127.0.0.1:{}; {}",
                    self.port,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The server's log so far, for failure messages.
    pub fn log(&self) -> String {
        format!(
            "its log:\n{}",
            std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
        )
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The private key the server accepts.
    pub fn client_key(&self) -> PathBuf {
        self.dir.path().join("client_key")
    }

    /// A known-hosts file holding the server's real key.
    pub fn known_hosts(&self) -> PathBuf {
        self.dir.path().join("known_hosts")
    }

    /// A known-hosts file that names the server with another key, as after
    /// a reinstall or in the middle of an attack.
    pub fn wrong_known_hosts(&self) -> PathBuf {
        let other = self.dir.path().join("other_host_key");
        if !other.exists() {
            keygen(&other);
        }
        let path = self.dir.path().join("wrong_known_hosts");
        std::fs::write(
            &path,
            known_hosts_line(self.port, &self.dir.path().join("other_host_key.pub")),
        )
        .expect("write known_hosts");
        path
    }

    /// A directory the test may use for files of its own (other keys).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The known-hosts line for a server on 127.0.0.1:`port` with the public
/// key in `pub_key`.
fn known_hosts_line(port: u16, pub_key: &Path) -> String {
    let key = std::fs::read_to_string(pub_key).expect("read public key");
    let mut fields = key.split_whitespace();
    let (kind, blob) = (
        fields.next().expect("key type"),
        fields.next().expect("key blob"),
    );
    format!("[127.0.0.1]:{port} {kind} {blob}\n")
}

fn config(root: &Path, port: u16) -> String {
    let d = root.display();
    format!(
        "Port {port}\n\
         ListenAddress 127.0.0.1\n\
         HostKey {d}/host_key\n\
         PidFile {d}/sshd.pid\n\
         AuthorizedKeysFile {d}/authorized_keys\n\
         StrictModes no\n\
         PubkeyAuthentication yes\n\
         PasswordAuthentication no\n\
         KbdInteractiveAuthentication no\n\
         UsePAM no\n\
         PermitRootLogin prohibit-password\n\
         PermitUserEnvironment no\n\
         PrintMotd no\n\
         PrintLastLog no\n\
         X11Forwarding no\n\
         AllowAgentForwarding no\n\
         AllowTcpForwarding no\n\
         LogLevel VERBOSE\n"
    )
}
