//! A Matrix client that really encrypts, for the Matrix adapter's
//! end-to-end encryption tests: matrix-nio (with its `e2e` extra, on
//! vodozemac) in a Python process of its own, against a real Synapse
//! ([`crate::synapse`]). It is an implementation independent of the
//! adapter's, so a test passing means two implementations agree, not one
//! with itself.
//!
//! [`EncryptingClient::login`] starts `e2ee_client.py` (embedded here) from
//! the Python environment of [`crate::python`], failing when nio is
//! missing, and logs in as a new device. The program speaks one JSON
//! object a line over stdin/stdout; commands run concurrently on its side
//! and answers are matched by id, so a test may wait for a message while
//! it sends another. nio's own log (stderr) is written to `nio.log` in the
//! store directory, and its tail is quoted in every panic.
//!
//! Files go both ways: [`EncryptingClient::send_file`] uploads one
//! encrypted as Matrix clients do in an encrypted room, and a received
//! message that carries one (a `file` object, or a plain `url`) comes with
//! its downloaded, decrypted bytes in [`Received::file`].
//!
//! The process is killed when the client is dropped, and ends itself when
//! the test process is gone (it watches its parent pid) or its stdin
//! closes.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::lock;
use crate::synapse::Synapse;

/// The program the process runs (see its docstring).
const PROGRAM: &str = include_str!("e2ee_client.py");

/// How many lines of nio's log a panic quotes.
const TAIL_LINES: usize = 80;

/// How long a command that is not itself a wait may take (a login
/// includes the first sync and the key upload; a send, the key query,
/// claim and sharing).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(90);

/// Extra time given to a command that waits on the Python side for
/// `timeout`, so the program's own answer (with what it saw) arrives
/// before this side gives up.
const ANSWER_SLACK: Duration = Duration::from_secs(30);

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

/// One nio device, logged in and syncing (see the module docs).
pub struct EncryptingClient {
    user_id: String,
    device_id: String,
    child: Mutex<Child>,
    stdin: Mutex<ChildStdin>,
    pending: Pending,
    next_id: AtomicU64,
    exited: Arc<AtomicBool>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    log_path: PathBuf,
}

impl std::fmt::Debug for EncryptingClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptingClient")
            .field("user_id", &self.user_id)
            .field("device_id", &self.device_id)
            .field("log", &self.log_path)
            .finish_non_exhaustive()
    }
}

/// A message as nio received it.
#[derive(Clone, PartialEq)]
pub struct Received {
    /// The event's id.
    pub event_id: String,
    /// The `body` of the (decrypted) content; empty when nio could not
    /// decrypt it.
    pub body: String,
    /// It arrived as `m.room.encrypted`.
    pub encrypted: bool,
    /// nio decrypted it (false for a plaintext message, and for an
    /// encrypted one whose key never came).
    pub decrypted: bool,
    /// The content's `m.relates_to`, if any (nio copies a cleartext one
    /// from the encrypted envelope when the plaintext lacks it).
    pub relates_to: Option<Value>,
    /// The whole (decrypted) content: `msgtype`, `format`,
    /// `formatted_body`, ...; `{}` when nio could not decrypt it.
    pub content: Value,
    /// Why nio could not use the event, when it could not (no megolm
    /// session for it, an encrypted event its schema rejects, ...); also
    /// why its file could not be fetched or decrypted, or how its `file`
    /// object strays from the spec (`v` not `v2`, a key not
    /// `oct`/`A256CTR`, a top-level `url` beside it) though it decrypted.
    pub detail: Option<String>,
    /// The file the message carries (any msgtype), downloaded from the
    /// homeserver (`/_matrix/client/v1/media/download`, authenticated):
    /// decrypted with the content's `file` object (key, iv, and the
    /// ciphertext's SHA-256 checked first) when it has one, else the raw
    /// bytes of its top-level `url`. `None` when the message has neither,
    /// or the download or decryption failed (then `detail` says why).
    pub file: Option<Vec<u8>>,
    /// The file came as an encrypted attachment (a `file` object), not a
    /// plain `url`; true even when fetching it failed.
    pub file_encrypted: bool,
}

impl std::fmt::Debug for Received {
    // A file is shown by its length: a panic message quoting a received
    // message should not hold hundreds of kilobytes of numbers.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Received")
            .field("event_id", &self.event_id)
            .field("body", &self.body)
            .field("encrypted", &self.encrypted)
            .field("decrypted", &self.decrypted)
            .field("relates_to", &self.relates_to)
            .field("content", &self.content)
            .field("detail", &self.detail)
            .field(
                "file",
                &self.file.as_ref().map(|f| format!("{} bytes", f.len())),
            )
            .field("file_encrypted", &self.file_encrypted)
            .finish()
    }
}

impl EncryptingClient {
    /// Logs in as `localpart` (registered on `hs` beforehand, so its
    /// password is `pw-{localpart}-0123456789`) as a new nio device, with
    /// nio's store (olm account, sessions, sync token) in `store_dir`, and
    /// starts nio's sync loop. Returns once a first sync went through and
    /// the device's keys are uploaded: from then on others can encrypt
    /// for it.
    ///
    /// # Panics
    /// When nio is not installed, or the login fails (with nio's log).
    pub async fn login(hs: &Synapse, localpart: &str, store_dir: &Path) -> EncryptingClient {
        // Checked once per test process: each check is a Python start.
        static PYTHON: OnceLock<PathBuf> = OnceLock::new();
        let python = PYTHON.get_or_init(|| crate::python::python_with(&["nio", "vodozemac"]));
        if let Err(e) = std::fs::create_dir_all(store_dir) {
            panic!("cannot create nio's store {}: {e}", store_dir.display());
        }
        let log_path = store_dir.join("nio.log");
        let log_file = match std::fs::File::create(&log_path) {
            Ok(f) => f,
            Err(e) => panic!("cannot create {}: {e}", log_path.display()),
        };
        let spawned = Command::new(python)
            .arg("-c")
            .arg(PROGRAM)
            .current_dir(store_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => panic!("cannot start nio with {}: {e}", python.display()),
        };
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            panic!("nio's process has no pipes");
        };

        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let tail = stderr_tail.clone();
        let echo = std::env::var_os("TALARIA_NIO_ECHO").is_some();
        let label = localpart.to_owned();
        spawn_thread("nio-stderr", move || {
            let mut log_file = log_file;
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(log_file, "{line}");
                if echo {
                    eprintln!("[nio {label}] {line}");
                }
                let mut tail = lock(&tail);
                if tail.len() == TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });

        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let exited = Arc::new(AtomicBool::new(false));
        let (answers, gone) = (pending.clone(), exited.clone());
        spawn_thread("nio-stdout", move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(answer) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let Some(id) = answer.get("id").and_then(Value::as_u64) else {
                    continue;
                };
                if let Some(waiter) = lock(&answers).remove(&id) {
                    let _ = waiter.send(answer);
                }
            }
            // The process is gone: whoever still waits learns it now.
            gone.store(true, Ordering::SeqCst);
            lock(&answers).clear();
        });

        let mut client = EncryptingClient {
            user_id: format!("@{localpart}:{}", crate::synapse::SERVER_NAME),
            device_id: String::new(),
            child: Mutex::new(child),
            stdin: Mutex::new(stdin),
            pending,
            next_id: AtomicU64::new(1),
            exited,
            stderr_tail,
            log_path,
        };
        let answer = client
            .call(
                "login",
                json!({
                    "homeserver": hs.homeserver(),
                    "user_id": client.user_id,
                    "password": format!("pw-{localpart}-0123456789"),
                    "store_dir": store_dir.display().to_string(),
                    "device_name": format!("talaria nio test ({localpart})"),
                }),
                COMMAND_TIMEOUT,
            )
            .await;
        client.device_id = text(&answer, "device_id");
        if let Some(user_id) = answer.get("user_id").and_then(Value::as_str) {
            client.user_id = user_id.to_owned();
        }
        client
    }

    /// The device id nio logged in with.
    pub fn device_id(&self) -> &str {
        &self.device_id
    }

    /// The full user id (`@localpart:localhost`).
    pub fn user_id(&self) -> &str {
        &self.user_id
    }

    /// The end of nio's log (the whole log is in `nio.log` in the store
    /// directory).
    pub fn log_tail(&self) -> String {
        lock(&self.stderr_tail)
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Creates a room with `m.room.encryption` (`m.megolm.v1.aes-sha2`)
    /// in its initial state, inviting `invite`; `is_direct` makes it a DM
    /// (`is_direct` in createRoom and the `trusted_private_chat` preset,
    /// else `private_chat`). Returns once nio's sync has the room, as
    /// encrypted; the room id.
    ///
    /// # Panics
    /// When the homeserver refuses, or nio's sync does not bring the room.
    pub async fn create_encrypted_room(&self, invite: &[&str], is_direct: bool) -> String {
        let answer = self
            .call(
                "create_room",
                json!({ "invite": invite, "is_direct": is_direct }),
                COMMAND_TIMEOUT,
            )
            .await;
        text(&answer, "room_id")
    }

    /// Joins `room` (after an invite) and returns once nio's sync has it.
    ///
    /// # Panics
    /// When the homeserver refuses, or nio's sync does not bring the room.
    pub async fn join(&self, room: &str) {
        self.call("join", json!({ "room": room }), COMMAND_TIMEOUT)
            .await;
    }

    /// Sends an `m.room.message` `m.text` with the plain `body`, encrypted
    /// when the room is (nio's `ignore_unverified_devices=True`: nobody is
    /// verified here). Before an encrypted send the members are read from
    /// the homeserver and all their devices queried afresh, so a device
    /// that appeared since gets the room key; a member who has not joined
    /// yet (only invited) gets it only if its devices exist, so call
    /// [`Self::wait_until_joined`] first when the other side joins late.
    /// Returns the event id.
    ///
    /// # Panics
    /// When nio cannot send (with its log).
    pub async fn send_text(&self, room: &str, body: &str) -> String {
        let answer = self
            .call(
                "send_text",
                json!({ "room": room, "body": body }),
                COMMAND_TIMEOUT,
            )
            .await;
        text(&answer, "event_id")
    }

    /// Uploads `bytes` and sends them as an `m.room.message` of `msgtype`
    /// (`m.file`, `m.image`, ...) with `body` and `filename` = `name` and
    /// `info: {mimetype: mime, size}`. In an encrypted room the upload is
    /// encrypted as Matrix clients do (AES-256-CTR; nio's `upload(...,
    /// encrypt=True)`): the content carries `file: {url, key, iv, hashes,
    /// v}` and no top-level `url`, and the message itself is then
    /// encrypted like [`Self::send_text`]'s. In a plaintext room the bytes
    /// are uploaded as they are under a top-level `url`. Returns the event
    /// id.
    ///
    /// # Panics
    /// When the upload or the send fails (with nio's log).
    pub async fn send_file(
        &self,
        room: &str,
        name: &str,
        bytes: &[u8],
        mime: &str,
        msgtype: &str,
    ) -> String {
        let answer = self
            .call(
                "send_file",
                json!({
                    "room": room,
                    "name": name,
                    "data": BASE64.encode(bytes),
                    "mimetype": mime,
                    "msgtype": msgtype,
                }),
                COMMAND_TIMEOUT,
            )
            .await;
        text(&answer, "event_id")
    }

    /// Waits up to `timeout` for the next `m.room.message` in `room` from
    /// `sender` that no earlier call returned (oldest first, including
    /// history the first sync brought). An encrypted event nio cannot
    /// decrypt is given up to 10 seconds (within `timeout`) for its key
    /// to arrive, then returned with `decrypted: false`, an empty body
    /// and the reason in `detail`, so a test fails on what went wrong
    /// rather than on a timeout. A file the message carries is fetched
    /// (and decrypted) before it is returned, within 20 seconds, into
    /// [`Received::file`].
    ///
    /// # Panics
    /// When `timeout` passes without such a message (with what nio saw).
    pub async fn wait_for_message(&self, room: &str, sender: &str, timeout: Duration) -> Received {
        let answer = self
            .call(
                "next_message",
                json!({
                    "room": room,
                    "sender": sender,
                    "timeout_ms": u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                }),
                timeout + ANSWER_SLACK,
            )
            .await;
        let Some(m) = answer.get("message").filter(|m| !m.is_null()) else {
            self.fail(&format!(
                "{} waited {timeout:?} for a message from {sender} in {room}; nio saw none ({answer})",
                self.user_id
            ));
        };
        Received {
            event_id: text(m, "event_id"),
            body: text(m, "body"),
            encrypted: m.get("encrypted").and_then(Value::as_bool) == Some(true),
            decrypted: m.get("decrypted").and_then(Value::as_bool) == Some(true),
            relates_to: m.get("relates_to").filter(|v| !v.is_null()).cloned(),
            content: m.get("content").cloned().unwrap_or_else(|| json!({})),
            detail: m.get("detail").and_then(Value::as_str).map(str::to_owned),
            file: match m
                .get("file")
                .and_then(Value::as_str)
                .map(|b| BASE64.decode(b))
            {
                None => None,
                Some(Ok(bytes)) => Some(bytes),
                Some(Err(e)) => self.fail(&format!("nio sent a file that is not base64: {e}")),
            },
            file_encrypted: m.get("file_encrypted").and_then(Value::as_bool) == Some(true),
        }
    }

    /// Waits until `user` is joined to `room` as nio's sync sees it.
    ///
    /// # Panics
    /// When `timeout` passes first.
    pub async fn wait_until_joined(&self, room: &str, user: &str, timeout: Duration) {
        let answer = self
            .call(
                "wait_joined",
                json!({
                    "room": room,
                    "user": user,
                    "timeout_ms": u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                }),
                timeout + ANSWER_SLACK,
            )
            .await;
        if answer.get("joined").and_then(Value::as_bool) != Some(true) {
            self.fail(&format!(
                "{} waited {timeout:?} for {user} to join {room} as nio sees it ({answer})",
                self.user_id
            ));
        }
    }

    /// Sends one command and waits for its answer (`ok: true`).
    async fn call(&self, cmd: &str, mut args: Value, wait: Duration) -> Value {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        args["id"] = json!(id);
        args["cmd"] = json!(cmd);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        if self.exited.load(Ordering::SeqCst) {
            lock(&self.pending).remove(&id);
            self.fail(&format!("nio's process is gone; cannot {cmd}"));
        }
        let written = {
            let mut stdin = lock(&self.stdin);
            writeln!(stdin, "{args}").and_then(|()| stdin.flush())
        };
        if let Err(e) = written {
            lock(&self.pending).remove(&id);
            self.fail(&format!("cannot write the {cmd} command to nio: {e}"));
        }
        let answer = match tokio::time::timeout(wait, rx).await {
            Ok(Ok(a)) => a,
            Ok(Err(_)) => self.fail(&format!("nio's process ended during {cmd}")),
            Err(_) => {
                lock(&self.pending).remove(&id);
                self.fail(&format!("nio did not answer {cmd} within {wait:?}"));
            }
        };
        if answer.get("ok").and_then(Value::as_bool) != Some(true) {
            let error = answer
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("(no error given)");
            self.fail(&format!("{cmd} failed in nio: {error}"));
        }
        answer
    }

    fn fail(&self, what: &str) -> ! {
        // Let the stderr thread catch up with a process that just died.
        std::thread::sleep(Duration::from_millis(200));
        let status = match lock(&self.child).try_wait() {
            Ok(Some(s)) => format!(" (nio's process exited: {s})"),
            _ => String::new(),
        };
        panic!(
            "{what}{status}\n--- nio log ({}) ---\n{}",
            self.log_path.display(),
            self.log_tail()
        );
    }
}

impl Drop for EncryptingClient {
    fn drop(&mut self) {
        let mut child = lock(&self.child);
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn text(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn spawn_thread(name: &str, f: impl FnOnce() + Send + 'static) {
    if let Err(e) = std::thread::Builder::new().name(name.to_owned()).spawn(f) {
        panic!("cannot start a thread for nio: {e}");
    }
}
