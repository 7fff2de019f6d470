//! The Docker backend against the real daemon on this machine, with an
//! image built here from Debian's static busybox (nothing pulled).
//!
//! Every test labels its containers with an owner of its own and removes
//! them when it ends, however it ends.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use talaria_core::config::DockerConfig;
use talaria_exec::docker::{Docker, LABEL_OWNER, LABEL_PID, LABEL_SCOPE, LABEL_STARTED};
use talaria_exec::{Backend, CommandSpec, ExecError, Exit, Workspace};
use tokio::io::AsyncReadExt;

/// How long any one step may take before the test fails instead of
/// hanging (never a figure the test checks).
const PATIENCE: Duration = Duration::from_secs(120);

/// A test's own owner label, client and workspaces.
struct Rig {
    docker: Docker,
    owner: String,
    config: DockerConfig,
    root: tempfile::TempDir,
}

impl Rig {
    async fn new(tweak: impl FnOnce(&mut DockerConfig)) -> Rig {
        let image = talaria_testkit::docker::busybox_image().await;
        let mut config = DockerConfig {
            image,
            ..DockerConfig::default()
        };
        tweak(&mut config);
        let root = tempfile::tempdir().unwrap();
        let owner = format!("talaria-test:{}", root.path().display());
        let docker = Docker::connect(&config, &owner).unwrap();
        docker.ping().await.unwrap();
        Rig {
            docker,
            owner,
            config,
            root,
        }
    }

    fn workspace(&self, scope: &str) -> Workspace {
        Workspace::open(&self.root.path().join("workspaces"), scope).unwrap()
    }

    async fn backend(&self, scope: &str) -> Arc<dyn Backend> {
        self.docker
            .backend(scope, self.workspace(scope))
            .await
            .unwrap()
    }

    /// This rig's containers as the daemon lists them: (id, labels).
    async fn containers(&self) -> Vec<(String, HashMap<String, String>)> {
        containers_of(&self.owner).await
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        drop(Cleanup(self.owner.clone()));
    }
}

async fn containers_of(owner: &str) -> Vec<(String, HashMap<String, String>)> {
    use bollard::query_parameters::ListContainersOptionsBuilder;
    let api = talaria_testkit::docker::client().await;
    let filter = HashMap::from([("label".to_owned(), vec![format!("{LABEL_OWNER}={owner}")])]);
    api.list_containers(Some(
        ListContainersOptionsBuilder::new()
            .all(true)
            .filters(&filter)
            .build(),
    ))
    .await
    .unwrap()
    .into_iter()
    .map(|c| (c.id.unwrap(), c.labels.unwrap_or_default()))
    .collect()
}

/// The environment a command gets from the gateway: the allowlist of this
/// process's own.
fn spec(command: &str) -> CommandSpec {
    CommandSpec {
        command: command.to_owned(),
        workdir: None,
        env: talaria_exec::env::child_env(std::env::vars_os(), &[]),
        stdin: false,
        pty: false,
    }
}

/// Runs `command` to its end: its whole output and how it ended.
async fn run(backend: &dyn Backend, command: &str) -> (String, Exit) {
    let mut running = backend.spawn(spec(command)).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(PATIENCE, running.output.read_to_end(&mut out))
        .await
        .expect("the output never ended")
        .unwrap();
    let exit = tokio::time::timeout(PATIENCE, running.process.wait())
        .await
        .expect("the command never ended")
        .unwrap();
    running.process.disarm();
    (String::from_utf8(out).unwrap(), exit)
}

fn code(n: i32) -> Exit {
    Exit {
        code: Some(n),
        signal: None,
    }
}

/// Starts `command` with stdin (or a terminal), writes `input`, closes
/// the input, and runs it to its end.
async fn converse(backend: &dyn Backend, command: &str, pty: bool, input: &[u8]) -> (String, Exit) {
    use tokio::io::AsyncWriteExt;
    let mut running = backend
        .spawn(CommandSpec {
            stdin: !pty,
            pty,
            ..spec(command)
        })
        .await
        .unwrap();
    let mut stdin = running.input.take().expect("an input was asked for");
    stdin.write_all(input).await.unwrap();
    stdin.flush().await.unwrap();
    if !pty {
        stdin.shutdown().await.unwrap();
    }
    let mut out = Vec::new();
    tokio::time::timeout(PATIENCE, running.output.read_to_end(&mut out))
        .await
        .expect("the output never ended")
        .unwrap();
    let exit = tokio::time::timeout(PATIENCE, running.process.wait())
        .await
        .expect("the command never ended")
        .unwrap();
    running.process.disarm();
    (String::from_utf8_lossy(&out).into_owned(), exit)
}

#[tokio::test]
async fn a_command_reads_its_stdin_and_one_on_a_terminal_sees_a_terminal() {
    let rig = Rig::new(|_| {}).await;
    let backend = rig.backend("stdin").await;
    let (out, exit) = converse(
        &*backend,
        "read x; echo got $x; cat; echo end",
        false,
        b"one\ntwo\n",
    )
    .await;
    assert_eq!(exit, code(0), "{out}");
    assert_eq!(out, "got one\ntwo\nend\n");
    let (out, exit) = converse(
        &*backend,
        "test -t 0 && echo terminal; read x; echo got $x",
        true,
        b"keys\n",
    )
    .await;
    assert_eq!(exit, code(0), "{out}");
    assert!(
        out.contains("terminal") && out.contains("got keys"),
        "{out:?}"
    );
}

#[tokio::test]
async fn a_command_gives_its_output_and_exit_code() {
    let rig = Rig::new(|_| {}).await;
    let b = rig.backend("chat-1").await;
    assert!(b.isolated());
    assert_eq!(b.workspace().unwrap(), &rig.workspace("chat-1"));
    let (out, exit) = run(&*b, "echo hello; pwd; echo \"$HOME\"; exit 3").await;
    assert_eq!(out, "hello\n/workspace\n/workspace\n");
    assert_eq!(exit, code(3));
    let (out, exit) = run(&*b, "true").await;
    assert_eq!(out, "");
    assert_eq!(exit, code(0));
    // A command that is not there: the shell's own message and code.
    let (out, exit) = run(&*b, "no-such-program-here").await;
    assert!(out.contains("no-such-program-here"), "{out}");
    assert_eq!(exit, code(127));
}

#[tokio::test]
async fn stdout_and_stderr_keep_their_order_and_large_output_arrives_whole() {
    let rig = Rig::new(|_| {}).await;
    let b = rig.backend("order").await;
    let script = "for i in 1 2 3 4 5 6 7 8 9 10; do echo out$i; echo err$i >&2; done";
    let want: String = (1..=10).map(|i| format!("out{i}\nerr{i}\n")).collect();
    // Several times: a lucky interleaving once proves little.
    for _ in 0..5 {
        let (out, exit) = run(&*b, script).await;
        assert_eq!(out, want);
        assert_eq!(exit, code(0));
    }
    // Far more than the pipe holds: the command waits for the reader, and
    // nothing is lost or reordered.
    let (out, exit) = run(&*b, "seq 1 200000").await;
    assert_eq!(exit, code(0));
    let want: String = (1..=200_000).map(|i| format!("{i}\n")).collect();
    assert_eq!(out.len(), want.len());
    assert!(out == want, "the large output differs");
}

#[tokio::test]
async fn the_workspace_is_shared_within_a_scope_and_invisible_to_another() {
    let rig = Rig::new(|_| {}).await;
    let a = rig.backend("scope-a").await;
    let b = rig.backend("scope-b").await;
    let (_, exit) = run(&*a, "echo kept > note.txt; echo warm > /tmp/t").await;
    assert_eq!(exit, code(0));
    // The same container answers the next command (its /tmp is its own),
    // and the workspace is the host directory.
    let (out, _) = run(&*a, "cat /workspace/note.txt /tmp/t").await;
    assert_eq!(out, "kept\nwarm\n");
    let host = rig.workspace("scope-a").host().join("note.txt");
    assert_eq!(std::fs::read_to_string(&host).unwrap(), "kept\n");
    // The other scope sees neither.
    let (out, exit) = run(&*b, "ls -A /workspace; cat /tmp/t").await;
    assert_ne!(exit, code(0));
    assert!(!out.contains("note.txt") && !out.contains("warm"), "{out}");
    // Nor does any container see the host around the workspace (where the
    // home's .env and state.db would be).
    std::fs::write(rig.root.path().join(".env"), "OPENAI_API_KEY=sk-test\n").unwrap();
    let around = rig.root.path().display().to_string();
    let (out, exit) = run(&*a, &format!("cat {around}/.env; ls {around}")).await;
    assert_ne!(exit, code(0));
    assert!(!out.contains("sk-test"), "{out}");
    assert_eq!(rig.containers().await.len(), 2);
}

#[tokio::test]
async fn without_network_nothing_on_the_host_is_reachable() {
    let rig = Rig::new(|_| {}).await;
    assert!(!rig.config.network);
    let b = rig.backend("net").await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let gateway = bridge_gateway().await;

    // Only a loopback of its own, and no route anywhere.
    let (out, _) = run(
        &*b,
        "ls /sys/class/net; echo routes; tail -n +2 /proc/net/route",
    )
    .await;
    assert_eq!(out, "lo\nroutes\n");
    // A client reaches a server inside the container (so a failure below
    // is the network, not the tools); tried until the server is up. The
    // clean-up's own complaints stay out of the output: busybox's httpd
    // forks a worker per request, which may exit between `killall`
    // listing it and killing it ("can't kill pid 25").
    let (out, _) = run(
        &*b,
        "mkdir -p /tmp/www && echo pong > /tmp/www/x && httpd -p 127.0.0.1:7777 -h /tmp/www && \
         for i in $(seq 1 100); do wget -q -O - http://127.0.0.1:7777/x 2>/dev/null && break; \
         sleep 0.1; done; killall httpd 2>/dev/null; true",
    )
    .await;
    assert_eq!(out, "pong\n");
    // ...but neither the host's loopback nor the bridge's gateway.
    let (out, exit) = run(&*b, &format!("echo x | nc -w 5 127.0.0.1 {port}")).await;
    assert_ne!(exit, code(0), "{out}");
    let (out, exit) = run(&*b, &format!("echo x | nc -w 5 {gateway} {port}")).await;
    assert_ne!(exit, code(0), "{out}");
    assert!(out.contains("unreachable"), "{out}");
    // Nothing got to the host's listener.
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
}

/// The docker bridge's gateway address: the host as a container with a
/// network would reach it.
async fn bridge_gateway() -> String {
    let api = talaria_testkit::docker::client().await;
    let net = api
        .inspect_network(
            "bridge",
            None::<bollard::query_parameters::InspectNetworkOptions>,
        )
        .await
        .unwrap();
    let config = net
        .ipam
        .and_then(|i| i.config)
        .into_iter()
        .flatten()
        .find(|c| c.subnet.as_deref().is_some_and(|s| s.contains('.')))
        .expect("the bridge network has an IPv4 subnet");
    if let Some(gateway) = config.gateway {
        return gateway;
    }
    // Older daemons leave it out: it is the subnet's first address.
    let subnet = config.subnet.unwrap();
    let base: std::net::Ipv4Addr = subnet.split('/').next().unwrap().parse().unwrap();
    std::net::Ipv4Addr::from(u32::from(base) + 1).to_string()
}

#[tokio::test]
async fn the_environment_holds_none_of_the_hosts_variables() {
    // The secret is planted in a child test process's environment (this
    // process's own cannot be changed safely while threads run).
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "docker::env_probe", "--ignored", "--nocapture"])
        .env("TALARIA_TEST_SECRET_XYZ", "planted-s3cret-4711")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "{stdout}\n{stderr}");
}

#[tokio::test]
#[ignore = "run by the_environment_holds_none_of_the_hosts_variables, with a planted secret"]
async fn env_probe() {
    let secret = std::env::var("TALARIA_TEST_SECRET_XYZ").expect("planted by the parent test");
    let rig = Rig::new(|_| {}).await;
    let b = rig.backend("env").await;
    let (out, exit) = run(
        &*b,
        "env; echo @@; tr '\\0' '\\n' < /proc/self/environ; echo @@; env | base64; echo @@; \
         tr '\\0' '\\n' < /proc/1/environ",
    )
    .await;
    assert_eq!(exit, code(0));
    let parts: Vec<&str> = out.split("@@\n").collect();
    assert_eq!(parts.len(), 4, "{out}");
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(parts[2].split_whitespace().collect::<String>())
        .unwrap();
    let decoded = String::from_utf8(decoded).unwrap();
    for text in [out.as_str(), decoded.as_str()] {
        assert!(!text.contains(&secret), "{text}");
        assert!(!text.contains("TALARIA_TEST_SECRET_XYZ"), "{text}");
    }
    // Every variable is one the allowlist lets through, one the backend
    // sets, or one the shell or the daemon adds itself.
    let allowed = |name: &str| {
        talaria_exec::env::BASE_ENV.contains(&name)
            || talaria_exec::env::NON_INTERACTIVE
                .iter()
                .any(|(n, _)| *n == name)
            || name.starts_with("LC_")
            || ["HOSTNAME", "PWD", "SHLVL", "OLDPWD", "_"].contains(&name)
            // Podman marks its containers so.
            || name == "container"
    };
    for part in [parts[0], parts[1], decoded.as_str(), parts[3]] {
        for line in part.lines().filter(|l| !l.is_empty()) {
            let name = line.split('=').next().unwrap();
            assert!(allowed(name), "{name} reached the container: {part}");
        }
    }
    assert!(parts[0].lines().any(|l| l == "HOME=/workspace"), "{out}");
    assert!(parts[0].lines().any(|l| l == "TMPDIR=/tmp"), "{out}");
}

#[tokio::test]
async fn kill_ends_the_command_and_the_next_command_works() {
    let rig = Rig::new(|_| {}).await;
    let b = rig.backend("kill").await;
    let mut running = b
        .spawn(spec(
            "echo kept > file; echo started; sleep 1000 & sleep 999; echo never",
        ))
        .await
        .unwrap();
    let mut first = [0u8; 8];
    tokio::time::timeout(PATIENCE, running.output.read_exact(&mut first))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&first, b"started\n");
    // A wait given up on (a timeout in a select!) leaves the process
    // usable: wait is cancel-safe.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), running.process.wait())
            .await
            .is_err()
    );
    tokio::time::timeout(PATIENCE, running.process.kill())
        .await
        .unwrap();
    let exit = tokio::time::timeout(PATIENCE, running.process.wait())
        .await
        .expect("the killed command never ended")
        .unwrap();
    assert_eq!(exit.signal, Some(9));
    let mut rest = Vec::new();
    tokio::time::timeout(PATIENCE, running.output.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(!String::from_utf8_lossy(&rest).contains("never"));

    // The sleeps are gone (the background one too), the workspace is not,
    // and commands run again.
    let (out, exit) = run(&*b, "ps; cat file").await;
    assert_eq!(exit, code(0));
    assert!(!out.contains("sleep 99"), "{out}");
    assert!(out.ends_with("kept\n"), "{out}");
    assert_eq!(rig.containers().await.len(), 1);
}

#[tokio::test]
async fn kill_ends_a_command_whose_output_nobody_reads() {
    let rig = Rig::new(|_| {}).await;
    let b = rig.backend("unread").await;
    // Far more output than the pipe holds, and nobody reading past the
    // first bytes: the command is stuck writing when it is killed.
    let mut running = b
        .spawn(spec("echo started; seq 1 1000000; sleep 1000"))
        .await
        .unwrap();
    let mut first = [0u8; 8];
    running.output.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"started\n");
    tokio::time::timeout(PATIENCE, running.process.kill())
        .await
        .unwrap();
    let exit = tokio::time::timeout(PATIENCE, running.process.wait())
        .await
        .expect("a killed command whose output was unread never ended")
        .unwrap();
    assert_eq!(exit.signal, Some(9));
    // What was written before the kill can still be read, then it ends.
    let mut rest = Vec::new();
    tokio::time::timeout(PATIENCE, running.output.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.len() < 1_000_000 * 7, "{}", rest.len());
}

#[tokio::test]
async fn dropping_a_running_command_kills_it() {
    let rig = Rig::new(|_| {}).await;
    let b = rig.backend("drop").await;
    let mut running = b.spawn(spec("echo up; sleep 1000")).await.unwrap();
    let mut first = [0u8; 3];
    running.output.read_exact(&mut first).await.unwrap();
    drop(running);
    // The next command runs after the kill, never into it: the sleep is
    // gone and the command itself is whole.
    let (out, exit) = run(&*b, "echo after; ps").await;
    assert_eq!(exit, code(0));
    assert!(out.starts_with("after\n"), "{out}");
    assert!(!out.contains("sleep 1000"), "{out}");
}

#[tokio::test]
async fn the_pids_limit_stops_a_fork_loop() {
    let rig = Rig::new(|c| c.pids = 32).await;
    let b = rig.backend("forks").await;
    // The loop runs in a subshell that dies at the first fork refused; the
    // count and the clean-up that follow fork nothing (a glob and builtins).
    let (out, _) = run(
        &*b,
        "( i=0; while [ $i -lt 200 ]; do sleep 300 & i=$((i+1)); done; echo all-started ); \
         set -- /proc/[0-9]*; echo \"live $#\"; kill -9 -1 2>/dev/null; echo cleaned",
    )
    .await;
    assert!(!out.contains("all-started"), "{out}");
    assert!(out.contains("can't fork"), "{out}");
    assert!(out.ends_with("cleaned\n"), "{out}");
    let live: usize = out
        .lines()
        .find_map(|l| l.strip_prefix("live "))
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX);
    assert!(live <= 32, "{live} processes: {out}");
    // With the sleeps gone, commands run again.
    let (out, exit) = run(&*b, "echo fine").await;
    assert_eq!((out.as_str(), exit), ("fine\n", code(0)));
}

#[tokio::test]
async fn release_removes_the_container_and_the_next_command_makes_another() {
    let rig = Rig::new(|_| {}).await;
    let b = rig.backend("reset").await;
    run(&*b, "echo stays > f").await;
    let before = rig.containers().await;
    assert_eq!(before.len(), 1);
    assert_eq!(
        before[0].1.get(LABEL_SCOPE).map(String::as_str),
        Some("reset")
    );
    rig.docker.release("reset").await;
    assert!(rig.containers().await.is_empty());
    // The old backend still works, in a new container, with the files.
    let (out, _) = run(&*b, "cat f").await;
    assert_eq!(out, "stays\n");
    let after = rig.containers().await;
    assert_eq!(after.len(), 1);
    assert_ne!(after[0].0, before[0].0);
    // The backend's own release does the same.
    b.release().await;
    assert!(rig.containers().await.is_empty());
}

#[tokio::test]
async fn a_container_removed_behind_our_back_is_made_again() {
    let rig = Rig::new(|_| {}).await;
    let b = rig.backend("vanish").await;
    run(&*b, "echo here > f").await;
    assert_eq!(
        talaria_testkit::docker::remove_labelled(LABEL_OWNER, &rig.owner).await,
        1
    );
    let (out, exit) = run(&*b, "cat f").await;
    assert_eq!((out.as_str(), exit), ("here\n", code(0)));
    assert_eq!(rig.containers().await.len(), 1);
}

#[tokio::test]
async fn idle_containers_are_reaped_and_busy_ones_kept() {
    let rig = Rig::new(|c| c.idle_timeout_secs = 1).await;
    let idle = rig.backend("idle").await;
    let busy = rig.backend("busy").await;
    run(&*idle, "true").await;
    let mut long = busy.spawn(spec("sleep 1000")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    rig.docker.reap_idle().await;
    let left = rig.containers().await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].1.get(LABEL_SCOPE).map(String::as_str), Some("busy"));
    long.process.kill().await;
    // And idle ones come back on demand.
    let (out, _) = run(&*idle, "echo back").await;
    assert_eq!(out, "back\n");
}

#[tokio::test]
async fn sweep_removes_containers_of_dead_gateways_and_keeps_live_ones() {
    let rig = Rig::new(|_| {}).await;
    // Ours: made by this (live) process.
    rig.backend("live").await;
    // Labelled by a process that has ended, and by a pid that lives but
    // started at another time (reused).
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let dead = fake_container(&rig, &rig.owner, &dead_pid.to_string(), "12345").await;
    let reused = fake_container(&rig, &rig.owner, &std::process::id().to_string(), "1").await;
    // Another home's, dead too: not ours to remove.
    let other_owner = format!("{}-other", rig.owner);
    let other = fake_container(&rig, &other_owner, &dead_pid.to_string(), "12345").await;

    assert_eq!(rig.docker.sweep().await.unwrap(), 2);
    let left: Vec<String> = rig.containers().await.into_iter().map(|c| c.0).collect();
    assert_eq!(left.len(), 1);
    assert!(!left.contains(&dead) && !left.contains(&reused));
    assert_eq!(containers_of(&other_owner).await.len(), 1);
    assert!(containers_of(&other_owner).await[0].0 == other);
    talaria_testkit::docker::remove_labelled(LABEL_OWNER, &other_owner).await;
    assert_eq!(rig.docker.sweep().await.unwrap(), 0);
}

/// A stopped container labelled as a gateway's would be.
async fn fake_container(rig: &Rig, owner: &str, pid: &str, started: &str) -> String {
    let api = talaria_testkit::docker::client().await;
    let labels = HashMap::from([
        (LABEL_OWNER.to_owned(), owner.to_owned()),
        (LABEL_PID.to_owned(), pid.to_owned()),
        (LABEL_STARTED.to_owned(), started.to_owned()),
        (LABEL_SCOPE.to_owned(), "fake".to_owned()),
    ]);
    api.create_container(
        None::<bollard::query_parameters::CreateContainerOptions>,
        bollard::models::ContainerCreateBody {
            image: Some(rig.config.image.clone()),
            cmd: Some(vec!["true".to_owned()]),
            labels: Some(labels),
            ..Default::default()
        },
    )
    .await
    .unwrap()
    .id
}

#[tokio::test]
async fn the_containers_of_a_killed_gateway_are_swept_at_the_next_start() {
    let rig = Rig::new(|_| {}).await;
    rig.backend("survivor").await;
    // A gateway in another process makes a container, then is killed.
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "docker::gateway_probe",
            "--ignored",
            "--nocapture",
        ])
        .env("TALARIA_TEST_OWNER", &rig.owner)
        .env("TALARIA_TEST_ROOT", rig.root.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let ready = std::thread::spawn(move || {
        let mut seen = String::new();
        let mut buf = [0u8; 256];
        while !seen.contains("GATEWAY-READY") {
            let n = stdout.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        seen
    });
    let seen = tokio::task::spawn_blocking(move || ready.join().unwrap())
        .await
        .unwrap();
    assert!(seen.contains("GATEWAY-READY"), "{seen}");
    assert_eq!(rig.containers().await.len(), 2);
    child.kill().unwrap();
    child.wait().unwrap();
    // Still there: nobody removed it on the way down.
    assert_eq!(rig.containers().await.len(), 2);

    // The next start (a new client of the same home) sweeps it, and keeps
    // the one of the gateway that still runs.
    let next = Docker::connect(&rig.config, &rig.owner).unwrap();
    next.ping().await.unwrap();
    assert_eq!(next.sweep().await.unwrap(), 1);
    let left = rig.containers().await;
    assert_eq!(left.len(), 1);
    assert_eq!(
        left[0].1.get(LABEL_SCOPE).map(String::as_str),
        Some("survivor")
    );
}

#[tokio::test]
#[ignore = "run by the_containers_of_a_killed_gateway_are_swept_at_the_next_start"]
async fn gateway_probe() {
    let owner = std::env::var("TALARIA_TEST_OWNER").expect("set by the parent test");
    let root = std::env::var("TALARIA_TEST_ROOT").expect("set by the parent test");
    let config = DockerConfig {
        image: talaria_testkit::docker::busybox_image().await,
        ..DockerConfig::default()
    };
    let docker = Docker::connect(&config, &owner).unwrap();
    docker.ping().await.unwrap();
    let ws = Workspace::open(&std::path::Path::new(&root).join("workspaces"), "doomed").unwrap();
    let b = docker.backend("doomed", ws).await.unwrap();
    let (out, _) = run(&*b, "echo up").await;
    assert_eq!(out, "up\n");
    println!("GATEWAY-READY");
    // Killed by the parent from here on.
    tokio::time::sleep(PATIENCE).await;
}

#[tokio::test]
async fn a_missing_image_is_unavailable_and_says_how_to_get_it() {
    let rig = Rig::new(|c| c.image = "talaria-test-missing:never-built".to_owned()).await;
    let err = rig
        .docker
        .backend("x", rig.workspace("x"))
        .await
        .unwrap_err();
    let ExecError::Unavailable(msg) = err else {
        panic!("not Unavailable: {err:?}");
    };
    assert!(msg.contains("talaria-test-missing:never-built"), "{msg}");
    assert!(msg.contains("docker pull"), "{msg}");
    assert!(rig.containers().await.is_empty());
}

#[tokio::test]
async fn a_socket_that_is_not_there_is_unavailable() {
    let config = DockerConfig {
        host: Some("unix:///nonexistent/docker.sock".to_owned()),
        ..DockerConfig::default()
    };
    let err = Docker::connect(&config, "nobody").unwrap_err();
    assert!(
        matches!(&err, ExecError::Unavailable(m) if m.contains("/nonexistent/docker.sock")),
        "{err:?}"
    );
}

#[tokio::test]
async fn the_container_is_limited_and_labelled_as_configured() {
    let rig = Rig::new(|c| {
        c.memory_mb = 64;
        c.cpus = 0.5;
        c.pids = 50;
    })
    .await;
    let b = rig.backend("limits").await;
    // Inside: no capabilities at all, and no way to gain privileges.
    let (out, _) = run(
        &*b,
        "grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status",
    )
    .await;
    assert_eq!(
        out,
        "CapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nNoNewPrivs:\t1\n"
    );
    let listed = rig.containers().await;
    assert_eq!(listed.len(), 1);
    let (id, labels) = &listed[0];
    assert_eq!(labels.get(LABEL_PID), Some(&std::process::id().to_string()));
    assert_eq!(labels.get(LABEL_SCOPE).map(String::as_str), Some("limits"));
    let api = talaria_testkit::docker::client().await;
    let inspected = api
        .inspect_container(
            id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .unwrap();
    let host = inspected.host_config.unwrap();
    assert_eq!(host.memory, Some(64 * 1024 * 1024));
    assert_eq!(host.nano_cpus, Some(500_000_000));
    assert_eq!(host.pids_limit, Some(50));
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    // (Capabilities and no-new-privileges were checked from inside,
    // where it counts: daemons report them differently.)
    assert!(host.tmpfs.unwrap().contains_key("/tmp"));
    // The workspace is the one mount from the host (the container's own
    // list: Podman leaves the host config's out).
    let mounts: Vec<_> = inspected
        .mounts
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.source.as_deref().is_some_and(|s| s.starts_with('/')))
        .filter(|m| m.destination.as_deref() != Some("/tmp"))
        .collect();
    assert_eq!(mounts.len(), 1, "{mounts:?}");
    assert_eq!(mounts[0].destination.as_deref(), Some("/workspace"));
    assert_eq!(
        mounts[0].source.as_deref(),
        rig.workspace("limits").host().to_str()
    );
}

#[tokio::test]
async fn backends_give_untrusted_conversations_a_container() {
    use talaria_core::config::{BackendKind, TerminalConfig};
    use talaria_exec::{Backends, Trust};
    let image = talaria_testkit::docker::busybox_image().await;
    let home = tempfile::tempdir().unwrap();
    let workspaces = home.path().join("workspaces");
    let config = TerminalConfig {
        untrusted_backend: BackendKind::Docker,
        workspaces_dir: Some(workspaces.clone()),
        docker: DockerConfig {
            image,
            ..DockerConfig::default()
        },
        ..TerminalConfig::default()
    };
    let backends = Backends::new(
        &config,
        &talaria_core::Home::at(home.path()),
        home.path().into(),
    );
    // The pool labels the containers with its workspaces directory.
    let owner = workspaces.display().to_string();
    let _cleanup = Cleanup(owner.clone());
    assert_eq!(backends.start().await, None);
    let b = backends
        .backend(Trust::Untrusted, "telegram:group:-100")
        .await
        .unwrap();
    assert_eq!(b.kind(), BackendKind::Docker);
    assert!(b.describe().contains("network none"), "{}", b.describe());
    let (out, exit) = run(&*b, "echo from-the-pool > f; cat f").await;
    assert_eq!((out.as_str(), exit), ("from-the-pool\n", code(0)));
    assert_eq!(containers_of(&owner).await.len(), 1);
    backends.release("telegram:group:-100").await;
    assert!(containers_of(&owner).await.is_empty());
    // The owner's own conversations stay on the host, as configured.
    let local = backends.backend(Trust::Owner, "terminal").await.unwrap();
    assert_eq!(local.kind(), BackendKind::Local);
}

/// Removes an owner's containers when dropped.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let owner = self.0.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(talaria_testkit::docker::remove_labelled(
                LABEL_OWNER,
                &owner,
            ));
        })
        .join();
    }
}

#[tokio::test]
async fn a_command_runs_in_its_own_directory() {
    let rig = Rig::new(|_| {}).await;
    let b = rig.backend("dirs").await;
    run(&*b, "mkdir -p sub/deeper").await;
    let mut in_sub = spec("pwd");
    in_sub.workdir = Some("/workspace/sub/deeper".into());
    let mut running = b.spawn(in_sub).await.unwrap();
    let mut out = String::new();
    running.output.read_to_string(&mut out).await.unwrap();
    assert_eq!(out, "/workspace/sub/deeper\n");
    assert_eq!(running.process.wait().await.unwrap(), code(0));
    running.process.disarm();

    let mut missing = spec("pwd");
    missing.workdir = Some("/workspace/not-there".into());
    // A directory that is not there: the runtime's own message as the
    // output, and a shell's "could not run" code (Docker says 126, Podman
    // 127).
    let mut running = b.spawn(missing).await.unwrap();
    let mut out = String::new();
    running.output.read_to_string(&mut out).await.unwrap();
    assert!(out.contains("/workspace/not-there"), "{out}");
    let exit = running.process.wait().await.unwrap();
    assert!(exit == code(126) || exit == code(127), "{exit:?}");
    running.process.disarm();
}
