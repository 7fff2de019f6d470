use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use super::*;

fn temp_home() -> (tempfile::TempDir, Home) {
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path().join("home"));
    (dir, home)
}

fn file_pid(path: &Path) -> u32 {
    parse_record(&std::fs::read(path).unwrap()).unwrap().pid
}

#[test]
fn acquire_writes_a_private_record() {
    let (_dir, home) = temp_home();
    let pid_file = PidFile::acquire(&home).unwrap();
    let path = home.gateway_pid_file();
    assert_eq!(pid_file.path(), path);
    let record = parse_record(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(record.pid, std::process::id());
    assert_eq!(record.started_at, owner::current().started_at);
    assert_eq!(record.kind, PID_FILE_KIND);
    assert!(!record.argv.is_empty());
    assert!(record.started_unix > 1_600_000_000.0);
    assert_eq!(&record, pid_file.record());
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn a_second_acquire_in_the_same_process_is_refused() {
    // flock belongs to the open file description, so a second open of
    // the same file conflicts even within one process.
    let (_dir, home) = temp_home();
    let _first = PidFile::acquire(&home).unwrap();
    match PidFile::acquire(&home) {
        Err(PidFileError::AlreadyRunning { pid }) => assert_eq!(pid, std::process::id()),
        other => panic!("expected AlreadyRunning, got {other:?}"),
    }
    let info = running_gateway(&home).expect("the gateway is running");
    assert_eq!(info.pid, std::process::id());
    assert_eq!(info.record.unwrap().kind, PID_FILE_KIND);
}

#[test]
fn drop_removes_the_file_and_frees_the_lock() {
    let (_dir, home) = temp_home();
    let first = PidFile::acquire(&home).unwrap();
    drop(first);
    assert!(!home.gateway_pid_file().exists());
    assert_eq!(running_gateway(&home), None);
    let second = PidFile::acquire(&home).unwrap();
    second.release().unwrap();
    assert!(!home.gateway_pid_file().exists());
}

#[test]
fn release_leaves_a_file_that_is_no_longer_ours() {
    let (_dir, home) = temp_home();
    let pid_file = PidFile::acquire(&home).unwrap();
    let path = home.gateway_pid_file();
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, b"someone else's").unwrap();
    pid_file.release().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"someone else's");
}

#[test]
fn a_stale_file_without_a_lock_is_taken_over() {
    let (_dir, home) = temp_home();
    create_private_dir(home.root()).unwrap();
    let path = home.gateway_pid_file();
    std::fs::write(&path, br#"{"pid": 999999999, "kind": "talaria-gateway"}"#).unwrap();
    assert_eq!(running_gateway(&home), None);
    let pid_file = PidFile::acquire(&home).unwrap();
    assert_eq!(file_pid(&path), std::process::id());
    drop(pid_file);
}

/// Another process holding the lock, as a killed gateway would have.
/// Fails, never skips, where flock(1) is missing.
fn spawn_flock_holder(path: &Path) -> std::process::Child {
    let found = Command::new("flock")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    assert!(
        found.is_ok(),
        "this test needs flock(1) to hold the lock from another process: \
         install it with `apt-get install util-linux`"
    );
    let script = r#"exec 9>>"$1"; flock -x 9 || exit 1; printf '{"pid":%s}\n' "$$" >&9; echo locked; exec sleep 30"#;
    let mut child = Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked", "the helper could not take the lock");
    child
}

#[test]
fn a_lock_held_by_another_process_blocks_until_it_dies() {
    let (_dir, home) = temp_home();
    create_private_dir(home.root()).unwrap();
    let path = home.gateway_pid_file();
    let mut child = spawn_flock_holder(&path);
    match PidFile::acquire(&home) {
        Err(PidFileError::AlreadyRunning { pid }) => assert_eq!(pid, child.id()),
        other => panic!("expected AlreadyRunning, got {other:?}"),
    }
    assert_eq!(running_gateway(&home).map(|i| i.pid), Some(child.id()));

    child.kill().unwrap(); // SIGKILL: no cleanup, the file stays.
    child.wait().unwrap();
    assert_eq!(file_pid(&path), child.id());
    assert_eq!(running_gateway(&home), None);

    let pid_file = PidFile::acquire(&home).unwrap();
    assert_eq!(file_pid(&path), std::process::id());
    drop(pid_file);
    assert!(!path.exists());
}

#[test]
fn an_empty_locked_file_names_its_holder_through_the_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.lock");
    let Acquired::Locked { lock, .. } = LockedFile::try_acquire(&path).unwrap() else {
        panic!("the lock should be free");
    };
    // Nothing written yet, as just after a holder took the lock.
    let probe = File::open(&path).unwrap();
    assert_eq!(holder_pid(&probe), std::process::id());
    drop(lock);
}

#[test]
fn the_holder_is_found_in_proc_locks() {
    let table = "1: FLOCK  ADVISORY  WRITE 4242 00:2a:1234 0 EOF\n\
                 1: -> FLOCK  ADVISORY  WRITE 77 00:2a:1234 0 EOF\n\
                 2: POSIX  ADVISORY  WRITE 55 00:2a:999 0 EOF\n\
                 3: FLOCK  ADVISORY  READ 66 00:2a:777 0 EOF\n";
    assert_eq!(flock_holder(table, 1234), Some(4242));
    assert_eq!(flock_holder(table, 999), None);
    assert_eq!(flock_holder(table, 777), None);
    assert_eq!(flock_holder(table, 5), None);
}

#[test]
fn status_round_trips() {
    let (_dir, home) = temp_home();
    create_private_dir(home.root()).unwrap();
    assert_eq!(read_status(&home).unwrap(), None);
    let status = GatewayStatus {
        node: None,
        pid: 42,
        started_at_unix: 1_700_000_000.25,
        state: "running".into(),
        adapters: BTreeMap::from([(
            "telegram".to_owned(),
            AdapterStatus {
                liveness: "live".into(),
                since: 1_700_000_001.5,
                last_error: Some("was down".into()),
            },
        )]),
        running_sessions: vec!["agent:main:telegram:dm:1".into()],
        ledger: BTreeMap::from([("pending".to_owned(), 2)]),
        commands: vec!["untrusted commands: sandbox".into()],
        updated_at: 1_700_000_002.0,
    };
    write_status(&home, &status).unwrap();
    assert_eq!(read_status(&home).unwrap(), Some(status.clone()));
    let mode = std::fs::metadata(home.gateway_state_file())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // Overwriting leaves no temporary files behind.
    let stopped = GatewayStatus {
        node: None,
        state: "stopped".into(),
        ..status
    };
    write_status(&home, &stopped).unwrap();
    assert_eq!(read_status(&home).unwrap(), Some(stopped));
    let names: Vec<_> = std::fs::read_dir(home.root())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("gateway_state.json")]);

    std::fs::write(home.gateway_state_file(), b"{not json").unwrap();
    assert_eq!(
        read_status(&home).unwrap_err().kind(),
        io::ErrorKind::InvalidData
    );
}

#[test]
fn the_unit_runs_the_gateway_for_this_home() {
    let home = Home::at("/home/ann/.talaria");
    let unit = systemd_unit(Path::new("/usr/local/bin/talaria"), &home);
    assert!(unit.contains("ExecStart=/usr/local/bin/talaria gateway run\n"));
    assert!(unit.contains("Environment=TALARIA_HOME=/home/ann/.talaria\n"));
    for line in [
        "[Unit]",
        "Description=Talaria gateway",
        "Wants=network-online.target",
        "After=network-online.target",
        "RestartPreventExitStatus=78",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        "WatchdogSec=60",
        "Restart=on-failure",
        "RestartSec=5",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=60",
        "LimitNOFILE=65536",
        "[Install]",
        "WantedBy=default.target",
    ] {
        assert!(
            unit.lines().any(|l| l == line),
            "missing {line:?} in\n{unit}"
        );
    }
}

#[test]
fn unit_paths_are_quoted_for_systemd() {
    let home = Home::at("/home/ann/My Talaria 100%");
    let unit = systemd_unit(Path::new("/opt/my apps/$bin/talaria"), &home);
    assert!(
        unit.contains("ExecStart=\"/opt/my apps/$$bin/talaria\" gateway run\n"),
        "{unit}"
    );
    assert!(
        unit.contains("Environment=\"TALARIA_HOME=/home/ann/My Talaria 100%%\"\n"),
        "{unit}"
    );
    assert_eq!(quote_systemd(br#"a"b\c"#, false), r#""a\"b\\c""#);
    assert_eq!(quote_systemd(b"a\xffb", false), r#""a\xffb""#);
    assert_eq!(quote_systemd(b"a\nb", false), r#""a\nb""#);
}

#[test]
fn signal_stop_refuses_group_pids_and_wait_sees_exit() {
    assert_eq!(
        signal_stop(0).unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    assert!(signal_stop(u32::MAX).is_err());

    let mut child = Command::new("sleep")
        .arg("30")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let pinned = pin(pid);
    assert!(!wait_for_exit(&pinned, Duration::from_millis(50)));
    signal_stop(pid).unwrap();
    // The child exits on SIGTERM; until reaped it is a zombie, which
    // counts as exited.
    assert!(wait_for_exit(&pinned, Duration::from_secs(10)));
    child.wait().unwrap();
}
