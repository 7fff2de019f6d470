//! One run of a hook's handler: a process of its own fed the event on
//! stdin, killed with its process group when it outlives its timeout.

use std::ffi::OsString;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use talaria_exec::process_group::GroupKiller;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::{Hook, LINGER, MAX_STDERR, MAX_STDOUT, MAX_TIMEOUT};

/// The handler's stdin.
pub(super) fn encode(event: &str, payload: &Value) -> Vec<u8> {
    let timestamp = talaria_core::unix_now();
    let doc = serde_json::json!({
        "event": event,
        "timestamp": timestamp,
        "payload": payload,
    });
    let mut bytes = doc.to_string().into_bytes();
    // Line-oriented readers (`read line`) expect the line to end.
    bytes.push(b'\n');
    bytes
}

/// Bytes read from a pipe, at most a cap of them kept.
struct Captured {
    bytes: Vec<u8>,
    overflowed: bool,
}

/// Reads `pipe` to its end, keeping at most `cap` bytes. The rest is read
/// and discarded so a chatty handler never blocks on a full pipe.
async fn read_capped(pipe: Option<impl AsyncRead + Unpin>, cap: usize) -> Captured {
    let mut out = Captured {
        bytes: Vec::new(),
        overflowed: false,
    };
    let Some(mut pipe) = pipe else {
        return out;
    };
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return out,
            Ok(n) => {
                let room = cap.saturating_sub(out.bytes.len());
                if n > room {
                    out.overflowed = true;
                }
                out.bytes.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

enum Ending {
    Exited(std::process::ExitStatus),
    TimedOut,
}

/// One run of `hook`'s handler with `input` on stdin.
pub(super) async fn run(
    hook: &Hook,
    event: &str,
    env: &[(OsString, OsString)],
    input: &[u8],
) -> Option<Value> {
    let name = hook.name();
    let mut cmd = tokio::process::Command::new(&hook.handler);
    cmd.current_dir(&hook.dir)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(hook = %name, event, error = %e, "cannot start the hook handler");
            return None;
        }
    };
    let mut killer = GroupKiller::new(child.id());
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let io = async {
        let feed = async {
            if let Some(mut stdin) = stdin {
                // A handler that ignores its input may exit before reading
                // it: a broken pipe is not its failure.
                if let Err(e) = stdin.write_all(input).await {
                    tracing::debug!(hook = %name, error = %e, "hook did not read its input");
                }
            }
        };
        let (_, out, err) = tokio::join!(
            feed,
            read_capped(stdout, MAX_STDOUT),
            read_capped(stderr, MAX_STDERR)
        );
        (out, err)
    };
    tokio::pin!(io);

    let deadline = tokio::time::sleep(hook.timeout());
    tokio::pin!(deadline);
    let linger = tokio::time::sleep(MAX_TIMEOUT);
    tokio::pin!(linger);
    let mut status = None;
    let mut output = None;
    let mut lingered = false;
    let ending = loop {
        if let (Some(s), Some(_)) = (status, &output) {
            break Ending::Exited(s);
        }
        tokio::select! {
            o = &mut io, if output.is_none() => output = Some(o),
            s = child.wait(), if status.is_none() => match s {
                Ok(s) => {
                    status = Some(s);
                    linger.as_mut().reset(tokio::time::Instant::now() + LINGER);
                }
                Err(e) => {
                    tracing::warn!(hook = %name, event, error = %e, "cannot wait for the hook handler");
                    return None;
                }
            },
            _ = &mut linger, if status.is_some() && output.is_none() && !lingered => {
                // The handler is gone but something it started still holds
                // its output open; the run ends now, so does that.
                tracing::warn!(hook = %name, event, "hook handler left processes holding its output; killed them");
                lingered = true;
                killer.kill();
            },
            _ = &mut deadline => break Ending::TimedOut,
        }
    };
    let status = match ending {
        Ending::TimedOut => {
            killer.kill();
            // Reap it: the group was sent SIGKILL, so this is quick.
            let _ = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
            tracing::warn!(
                hook = %name,
                event,
                timeout_secs = hook.timeout().as_secs(),
                "hook handler timed out; killed it and everything it started"
            );
            return None;
        }
        Ending::Exited(s) => s,
    };
    // Background processes that let go of the output are the hook's own.
    killer.disarm();
    let (out, err) = output?;
    let stderr = String::from_utf8_lossy(&err.bytes);
    let stderr = stderr.trim();
    if !status.success() {
        tracing::warn!(hook = %name, event, status = %status, stderr = %stderr, "hook handler failed");
        return None;
    }
    if !stderr.is_empty() {
        tracing::debug!(hook = %name, event, stderr = %stderr, "hook handler wrote to stderr");
    }
    if out.overflowed {
        tracing::warn!(
            hook = %name,
            event,
            "hook handler printed more than {MAX_STDOUT} bytes; its answer is ignored"
        );
        return None;
    }
    let text = String::from_utf8_lossy(&out.bytes);
    if text.trim().is_empty() {
        return None;
    }
    match serde_json::from_str(&text) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(hook = %name, event, error = %e, "hook handler printed something that is not JSON; ignored");
            None
        }
    }
}
