//! A real IRC server, ngIRCd from Debian's packages, on 127.0.0.1.
//!
//! [`Ircd::start`] writes a configuration of its own (no ident, DNS or PAM
//! lookups; any number of connections from one address) and runs
//! `ngircd -n` on a free port; [`Ircd::start_tls`] also listens with TLS on
//! a second port, with a certificate for `127.0.0.1` and `localhost`
//! signed by a throwaway authority made with `openssl`. [`Ircd::restart`]
//! kills the server with SIGKILL and starts it again on the same ports.
//! Dropping the [`Ircd`] kills it. A machine without ngIRCd fails the test,
//! saying what to install (`scripts/test` installs it).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running ngIRCd.
pub struct Ircd {
    dir: tempfile::TempDir,
    child: Option<Child>,
    port: u16,
    tls_port: Option<u16>,
    password: Option<String>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port on 127.0.0.1")
}

fn ngircd_binary() -> PathBuf {
    [
        "/usr/sbin/ngircd",
        "/usr/local/sbin/ngircd",
        "/usr/bin/ngircd",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
    .unwrap_or_else(|| {
        panic!(
            "ngircd is not installed, and the IRC tests need a real IRC server: \
                 apt-get install -y ngircd"
        )
    })
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run openssl (apt-get install -y openssl): {e}"));
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An authority (`ca.pem`) and a server certificate it signed
/// (`server.pem`, `server.key`) for 127.0.0.1 and localhost.
fn make_certificates(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509", "-days", "2", "-subj", "/CN=Talaria test CA"];
    ca.extend(ec);
    ca.extend(["-keyout", "ca.key", "-out", "ca.pem"]);
    openssl(dir, &ca);
    let mut csr = vec!["req", "-subj", "/CN=127.0.0.1"];
    csr.extend(ec);
    csr.extend(["-keyout", "server.key", "-out", "server.csr"]);
    openssl(dir, &csr);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write server.ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-extfile",
            "server.ext",
            "-out",
            "server.pem",
        ],
    );
}

/// Lets the server read its files: run as root it drops to `nobody`.
fn readable(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

impl Ircd {
    /// A plain-text server.
    pub fn start() -> Ircd {
        Ircd::launch(false, None)
    }

    /// A plain-text server that requires `password` (`PASS`) of everyone.
    pub fn with_password(password: &str) -> Ircd {
        Ircd::launch(false, Some(password))
    }

    /// A server that also listens with TLS ([`Ircd::tls_port`], trusting
    /// [`Ircd::ca_file`]).
    pub fn start_tls() -> Ircd {
        Ircd::launch(true, None)
    }

    fn launch(tls: bool, password: Option<&str>) -> Ircd {
        // Before any work: a missing server fails with the install line.
        ngircd_binary();
        let dir = tempfile::tempdir().expect("temp dir");
        readable(dir.path(), 0o755);
        let port = free_port();
        let tls_port = tls.then(free_port);
        let mut conf = format!(
            "[Global]\n\
             Name = irc.talaria.test\n\
             Info = Talaria test server\n\
             AdminInfo1 = Talaria tests\n\
             AdminInfo2 = 127.0.0.1\n\
             AdminEMail = tests@talaria.invalid\n\
             Listen = 127.0.0.1\n\
             Ports = {port}\n\
             PidFile = {pid}\n\
             MotdPhrase = Talaria test server\n\
             Password = {password}\n\
             [Limits]\n\
             MaxConnectionsIP = 0\n\
             MaxJoins = 0\n\
             MaxNickLength = 30\n\
             PingTimeout = 120\n\
             PongTimeout = 20\n\
             [Options]\n\
             DNS = no\n\
             Ident = no\n\
             PAM = no\n\
             ConnectIPv6 = no\n",
            pid = dir.path().join("ngircd.pid").display(),
            password = password.unwrap_or(""),
        );
        if let Some(tls_port) = tls_port {
            make_certificates(dir.path());
            for file in ["server.pem", "server.key", "ca.pem"] {
                readable(&dir.path().join(file), 0o644);
            }
            conf.push_str(&format!(
                "[SSL]\nCertFile = {}\nKeyFile = {}\nPorts = {tls_port}\n",
                dir.path().join("server.pem").display(),
                dir.path().join("server.key").display(),
            ));
        }
        let conf_path = dir.path().join("ngircd.conf");
        std::fs::write(&conf_path, conf).expect("write ngircd.conf");
        readable(&conf_path, 0o644);
        let mut ircd = Ircd {
            dir,
            child: None,
            port,
            tls_port,
            password: password.map(str::to_owned),
        };
        ircd.spawn();
        ircd
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("ngircd.log"))
            .expect("open ngircd.log");
        let child = Command::new(ngircd_binary())
            .arg("-n")
            .arg("-f")
            .arg(self.dir.path().join("ngircd.conf"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start ngircd: {e}"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        let ports: Vec<u16> = std::iter::once(self.port).chain(self.tls_port).collect();
        for port in ports {
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                if let Some(status) = self
                    .child
                    .as_mut()
                    .and_then(|c| c.try_wait().ok().flatten())
                {
                    panic!("ngircd exited with {status}:\n{}", self.log());
                }
                assert!(
                    Instant::now() < deadline,
                    "ngircd did not listen on {port} within 20 s:\n{}",
                    self.log()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// The plain-text port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The password everyone must send, when there is one.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The TLS port, for a server started with [`Ircd::start_tls`].
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// The authority that signed the TLS certificate (PEM).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// What the server logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ngircd.log")).unwrap_or_default()
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server and starts it again on the same ports; everyone
    /// connected loses the connection.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Ircd {
    fn drop(&mut self) {
        self.kill();
    }
}
