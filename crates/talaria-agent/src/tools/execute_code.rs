//! The `execute_code` tool: the model writes a Python script that calls
//! Talaria's tools from a loop, and only what the script prints comes
//! back. Ten reads and a filter cost one model round trip instead of ten.
//!
//! The script runs where the conversation's commands run (its
//! [`talaria_exec::Backend`]: the host, the bubblewrap sandbox, a
//! container), so it can reach no more than a `terminal` command could.
//! It talks to this process over a Unix socket in a fresh directory the
//! backend can see: inside the workspace when there is one (mounted at
//! `/workspace`), else a private directory under the temp dir. A pathname
//! socket is found through the filesystem, so it works from the sandbox's
//! own network namespace. The directory holds the script, the generated
//! module (`talaria_tools`, also importable as `hermes_tools` for scripts
//! written for the ancestor) and the socket, and is removed afterwards.
//!
//! Each request the module sends is one tool call, run through
//! [`crate::dispatch::execute`] with the turn's [`ToolContext`], so the
//! dangerous-command guard, approvals, workspace confinement and
//! redaction apply exactly as to a call the model makes itself. Only the
//! tools of [`CALLABLE`] that are offered in this turn can be called, at
//! most `code_execution.max_tool_calls` times per script. Requests are
//! bounded in size and answered one at a time.
//!
//! The script is bounded like a `terminal` command: killed with everything
//! it started at `code_execution.timeout_secs` or when the turn is
//! interrupted, its output capped (head and tail) and redacted, its
//! environment the allowlisted one.

use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use talaria_exec::{Backend, BackendKind, CommandSpec, Running};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinSet;

use super::terminal::{Capture, Ending, Watched, authorize, command_env, drain_killed, watch};
use super::{Tool, ToolContext, ToolError, ToolResult, opt_str};
use crate::dispatch::error_json;

/// The tools a script may call (when the conversation offers them).
pub const CALLABLE: &[&str] = &[
    "web_search",
    "web_extract",
    "read_file",
    "write_file",
    "search_files",
    "patch",
    "terminal",
];

/// The module scripts import.
const MODULE: &str = include_str!("execute_code/talaria_tools.py");

/// The names the module is written under: Talaria's, and the ancestor's
/// so its scripts keep working.
const MODULE_FILES: &[&str] = &["talaria_tools.py", "hermes_tools.py"];

const SCRIPT_FILE: &str = "script.py";
const SOCKET_FILE: &str = "tools.sock";

/// The largest request a script may send: a `write_file` of a big file
/// fits, a runaway loop building one string does not.
const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// Connections open at once (a script's threads or child processes each
/// open their own).
const MAX_CONNECTIONS: usize = 8;

/// Longest socket path bound directly: `sun_path` holds 108 bytes on
/// Linux, the terminating NUL included. A longer one is reached through
/// the directory's descriptor (`/proc/self/fd/N/...`).
const MAX_SUN_PATH: usize = 100;

/// `terminal` arguments that would outlive the script; refused inside it.
const DETACHING_ARGS: &[&str] = &["background", "pty", "notify_on_complete", "watch_patterns"];

const DESCRIPTION: &str = "Run a Python 3 script that calls Talaria's tools from code: use it when a task \
needs several tool calls with logic between them (loops over files or pages, filtering large output \
before you read it, retrying). For one call, call the tool directly.\n\n\
In the script: `from talaria_tools import read_file, search_files, ...` (`hermes_tools` works too). \
Functions: web_search(query), web_extract(urls), read_file(path, offset=None, limit=None), \
write_file(path, content), search_files(pattern, target=None, path=None, file_glob=None, limit=None), \
patch(path, old_string, new_string, replace_all=None), terminal(command, timeout=None, workdir=None) \
(foreground only), plus json_parse(text), shell_quote(s) and retry(fn). Each returns the tool's result \
parsed as JSON when it is JSON (a dict), else its text (read_file gives `LINE|content` text). A failed \
call does not raise: it returns a dict with an \"error\" key. Only tools offered in this conversation \
work, and a script may make a limited number of tool calls (50 by default).\n\n\
Only what the script prints (stdout and stderr) comes back to you, head and tail when long: print a \
summary, not raw data. It runs where terminal commands run, in the same working directory, killed after \
a time limit (5 minutes by default). The result is JSON: status (success, error, timeout, interrupted), \
output, tool_calls_made, duration_seconds, exit_code.";

/// The `execute_code` tool. Not among [`super::Registry::with_core_tools`]:
/// front ends register it where they offer it.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExecuteCodeTool;

impl ExecuteCodeTool {
    /// The tool.
    pub fn new() -> ExecuteCodeTool {
        ExecuteCodeTool
    }
}

#[async_trait]
impl Tool for ExecuteCodeTool {
    fn name(&self) -> &str {
        "execute_code"
    }

    fn description(&self) -> &str {
        DESCRIPTION
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "description": "Python 3 source to run. Import tools with `from talaria_tools import read_file, terminal, ...` and print your result."
                }
            },
            "required": ["code"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolResult {
        let code = match opt_str(&args, "code")? {
            Some(code) => code,
            None if args.get("command").is_some() => {
                return Err(ToolError::new(
                    "execute_code takes Python source in `code`, not `command`; for a shell \
                     command call terminal(command=...)",
                ));
            }
            None => {
                return Err(ToolError::new(
                    "missing required argument `code` (the Python source to run)",
                ));
            }
        };
        if code.trim().is_empty() {
            return Err(ToolError::new(
                "argument `code` is empty: give the Python source to run",
            ));
        }
        if code.contains('\0') {
            return Err(ToolError::new("argument `code` contains a NUL byte"));
        }
        let backend = match &ctx.execution.backend {
            Ok(b) => b.clone(),
            Err(unavailable) => {
                return Err(ToolError::new(format!(
                    "scripts cannot run in this conversation: {unavailable}"
                )));
            }
        };
        if backend.kind() == BackendKind::Ssh {
            return Err(ToolError::new(
                "execute_code is not available here: this conversation's commands run on a \
                 remote host (ssh), where a script cannot reach Talaria's tools. Call the tools \
                 directly, or run Python there with terminal.",
            ));
        }
        let (check_dir, run_dir) = workdir(ctx, backend.as_ref())?;
        // The script can do whatever a command can; it is checked as one.
        if let Err(blocked) = authorize(code, &check_dir, ctx).await {
            return Ok(blocked);
        }
        let files = RunFiles::create(backend.as_ref(), code)
            .map_err(|e| ToolError::new(format!("cannot prepare the script's directory: {e}")))?;
        let listener = files
            .listen()
            .map_err(|e| ToolError::new(format!("cannot open the tools socket: {e}")))?;

        let token = format!("{:032x}", rand::random::<u128>());
        // Tool calls still running when the script ends stop with it.
        let calls_cancel = ctx.cancel.child_token();
        let calls = Arc::new(Calls {
            ctx: ToolContext {
                cancel: calls_cancel.clone(),
                ..ctx.clone()
            },
            token: token.clone(),
            max: ctx.config.code_execution.max_tool_calls,
            made: AtomicU32::new(0),
            untrusted: AtomicBool::new(false),
            one_at_a_time: tokio::sync::Mutex::new(()),
        });
        let server = tokio::spawn(serve(listener, calls.clone()));

        let started = Instant::now();
        let ran = run_script(backend.as_ref(), ctx, &files, &token, run_dir).await;
        calls_cancel.cancel();
        server.abort();
        let _ = server.await;
        files.remove();

        let (ending, output) = ran?;
        Ok(report(ctx, &calls, ending, output, started.elapsed()))
    }
}

/// Where the script runs: on this machine (for the guard's checks) and as
/// the backend sees it. The same directory a `terminal` command without
/// `workdir` gets, so relative paths mean the same to the script and to
/// the tools it calls.
fn workdir(
    ctx: &ToolContext,
    backend: &dyn Backend,
) -> Result<(PathBuf, Option<PathBuf>), ToolError> {
    if let Some(ws) = backend.workspace() {
        return Ok((ws.host().to_path_buf(), Some(ws.inner().to_path_buf())));
    }
    let host = match (&ctx.execution.workspace, &ctx.config.terminal.cwd) {
        (Some(ws), _) => ws.host().to_path_buf(),
        (None, Some(c)) => super::resolve_path(ctx, &c.to_string_lossy())?,
        (None, None) => ctx.workdir.clone(),
    };
    if !host.is_dir() {
        return Err(ToolError::new(format!(
            "the working directory {} does not exist",
            super::shown_path(ctx, &host)
        )));
    }
    Ok((host.clone(), Some(host)))
}

/// The directory of one run: the script, the module and the socket.
struct RunFiles {
    dir: tempfile::TempDir,
    /// The directory as the script's backend sees it.
    inner: PathBuf,
}

impl RunFiles {
    /// A fresh private directory the backend can see, with the script and
    /// the module written into it.
    fn create(backend: &dyn Backend, code: &str) -> std::io::Result<RunFiles> {
        let (dir, inner) = match backend.workspace() {
            Some(ws) => {
                let dir = tempfile::Builder::new()
                    .prefix(".talaria-code-")
                    .tempdir_in(ws.host())?;
                let inner = ws.to_inner(dir.path());
                (dir, inner)
            }
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("talaria-code-")
                    .tempdir_in(std::env::temp_dir())?;
                let inner = dir.path().to_path_buf();
                (dir, inner)
            }
        };
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))?;
        std::fs::write(dir.path().join(SCRIPT_FILE), code)?;
        for name in MODULE_FILES {
            std::fs::write(dir.path().join(name), MODULE)?;
        }
        Ok(RunFiles { dir, inner })
    }

    /// Binds the socket, readable and writable by this user only.
    fn listen(&self) -> std::io::Result<UnixListener> {
        let path = self.dir.path().join(SOCKET_FILE);
        let listener = if path.as_os_str().len() <= MAX_SUN_PATH {
            UnixListener::bind(&path)?
        } else {
            let dir = std::fs::File::open(self.dir.path())?;
            let short = format!("/proc/self/fd/{}/{SOCKET_FILE}", dir.as_raw_fd());
            UnixListener::bind(short)?
        };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        Ok(listener)
    }

    fn inner(&self, name: &str) -> String {
        self.inner.join(name).display().to_string()
    }

    /// Removes the directory; a failure is logged, not the caller's.
    fn remove(self) {
        let shown = self.dir.path().display().to_string();
        if let Err(e) = self.dir.close() {
            tracing::warn!(dir = %shown, "cannot remove an execute_code directory: {e}");
        }
    }
}

/// `s` quoted for `sh`.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Runs the script and collects its output until it ends, times out or
/// the turn is interrupted.
async fn run_script(
    backend: &dyn Backend,
    ctx: &ToolContext,
    files: &RunFiles,
    token: &str,
    workdir: Option<PathBuf>,
) -> Result<(Ending, String), ToolError> {
    let cfg = &ctx.config.code_execution;
    let mut env: Vec<(String, String)> = command_env(ctx);
    let inherited_path = env
        .iter()
        .find(|(k, _)| k == "PYTHONPATH")
        .map(|(_, v)| v.clone());
    env.retain(|(k, _)| !k.starts_with("TALARIA_CODE_") && k != "PYTHONPATH");
    let module_dir = files.inner.display().to_string();
    let python_path = match inherited_path {
        Some(p) if !p.is_empty() => format!("{module_dir}:{p}"),
        _ => module_dir,
    };
    env.extend([
        ("TALARIA_CODE_SOCKET".to_owned(), files.inner(SOCKET_FILE)),
        ("TALARIA_CODE_TOKEN".to_owned(), token.to_owned()),
        ("PYTHONPATH".to_owned(), python_path),
        // Output printed before a kill still arrives.
        ("PYTHONUNBUFFERED".to_owned(), "1".to_owned()),
        ("PYTHONDONTWRITEBYTECODE".to_owned(), "1".to_owned()),
    ]);
    let spec = CommandSpec::new(
        format!(
            "exec {} {}",
            sh_quote(cfg.python.trim()),
            sh_quote(&files.inner(SCRIPT_FILE))
        ),
        workdir,
        env,
    );
    let Running {
        output: mut rx,
        mut process,
        ..
    } = backend
        .spawn(spec)
        .await
        .map_err(|e| ToolError::new(format!("cannot run the script: {e}")))?;

    let max_chars = cfg.max_output_chars.max(100);
    let mut capture = Capture::new(max_chars);
    let Watched { ending, eof, .. } = watch(
        &mut rx,
        process.as_mut(),
        &mut capture,
        Duration::from_secs(cfg.timeout_secs.max(1)),
        &ctx.cancel,
        "script",
    )
    .await?;
    match ending {
        // A container's processes are killed by restarting it, which would
        // take the conversation's other work with it; what the script left
        // there lost its socket and is the container's to end.
        Ending::Exited(_) if backend.kind() == BackendKind::Docker => process.disarm(),
        // Elsewhere what the script started stops with it.
        _ => process.kill().await,
    }
    if !eof {
        drain_killed(&mut rx, &mut capture).await;
    }
    Ok((ending, capture.finish(max_chars)))
}

/// The tool's result for a run that ended as `ending` with `output`.
fn report(
    ctx: &ToolContext,
    calls: &Calls,
    ending: Ending,
    output: String,
    took: Duration,
) -> String {
    let cfg = &ctx.config.code_execution;
    let mut output = ctx.redactor.redact(&output);
    // What the web tools brought in may have reached the printout.
    if calls.untrusted.load(Ordering::Relaxed) {
        output = crate::untrusted::wrap("execute_code", &output);
    }
    let (status, exit_code, error) = match ending {
        Ending::Exited(exit) if exit.code == Some(0) => ("success", exit.code, None),
        Ending::Exited(exit) if exit.code == Some(127) && python_missing(&output, &cfg.python) => (
            "error",
            exit.code,
            Some(format!(
                "execute_code needs Python 3 where this conversation's commands run, and `{}` \
                 was not found there. Install Python 3 there (Debian or Ubuntu: apt install \
                 python3; with the docker backend, use an image that has it, \
                 terminal.docker.image), or set code_execution.python to the interpreter's \
                 path. Until then, use the tools directly.",
                cfg.python.trim()
            )),
        ),
        Ending::Exited(exit) => {
            let how = match (exit.code, exit.signal) {
                (Some(code), _) => format!("exited with code {code}"),
                (None, Some(sig)) => format!("was killed by signal {sig}"),
                (None, None) => "ended abnormally".to_owned(),
            };
            (
                "error",
                exit.code,
                Some(format!(
                    "the script {how}; the output shows why (a Python traceback ends it)"
                )),
            )
        }
        Ending::TimedOut => (
            "timeout",
            None,
            Some(format!(
                "the script ran for {}s, its limit (code_execution.timeout_secs), and was \
                 killed with everything it started; the output is what it printed until then. \
                 Do less per script, or print progress as you go.",
                cfg.timeout_secs.max(1)
            )),
        ),
        Ending::Cancelled => (
            "interrupted",
            None,
            Some("the user interrupted; the script was killed".to_owned()),
        ),
    };
    let mut out = serde_json::Map::new();
    out.insert("status".into(), json!(status));
    out.insert("output".into(), json!(output));
    out.insert(
        "tool_calls_made".into(),
        json!(calls.made.load(Ordering::Relaxed)),
    );
    out.insert(
        "duration_seconds".into(),
        json!((took.as_secs_f64() * 100.0).round() / 100.0),
    );
    out.insert("exit_code".into(), json!(exit_code));
    if let Some(error) = error {
        out.insert("error".into(), json!(error));
    }
    Value::Object(out).to_string()
}

/// Whether `output` is the shell saying the interpreter `python` does
/// not exist.
fn python_missing(output: &str, python: &str) -> bool {
    let lower = output.to_ascii_lowercase();
    lower.contains(&python.trim().to_ascii_lowercase())
        && (lower.contains("not found") || lower.contains("no such file"))
}

/// One script's tool calls: what it may call, and how many it made.
struct Calls {
    /// The turn's context, with a cancel token that also fires when the
    /// script ends.
    ctx: ToolContext,
    token: String,
    max: u32,
    made: AtomicU32,
    /// Whether a tool whose output comes from outside was called.
    untrusted: AtomicBool,
    /// Held while a call runs: one at a time, in the order they came.
    one_at_a_time: tokio::sync::Mutex<()>,
}

impl Calls {
    /// The answer line (without its newline) to one request line.
    async fn answer(&self, line: &[u8]) -> String {
        let result = match self.run(line).await {
            Ok(text) | Err(text) => text,
        };
        json!({ "result": result }).to_string()
    }

    /// The tool's result text, or an `{"error": ...}` text saying why the
    /// call was not made.
    async fn run(&self, line: &[u8]) -> Result<String, String> {
        let refuse = |message: String| error_json(&message);
        let request: Value = serde_json::from_slice(line)
            .map_err(|e| refuse(format!("the request is not JSON: {e}")))?;
        if request.get("token").and_then(Value::as_str) != Some(self.token.as_str()) {
            return Err(refuse(
                "the request does not carry this script's token".to_owned(),
            ));
        }
        let name = request
            .get("tool")
            .and_then(Value::as_str)
            .ok_or_else(|| refuse("the request names no tool".to_owned()))?;
        if !CALLABLE.contains(&name) {
            return Err(refuse(format!(
                "`{name}` cannot be called from execute_code; these can (when offered in this \
                 conversation): {}. Call other tools directly.",
                CALLABLE.join(", ")
            )));
        }
        let Some(tool) = self.ctx.tools.get(name) else {
            let offered: Vec<&str> = CALLABLE
                .iter()
                .copied()
                .filter(|n| self.ctx.tools.get(n).is_some())
                .collect();
            return Err(refuse(format!(
                "`{name}` is not available in this conversation, so a script cannot call it \
                 either. Available to scripts here: {}.",
                if offered.is_empty() {
                    "none".to_owned()
                } else {
                    offered.join(", ")
                }
            )));
        };
        let args = match request.get("args") {
            None | Some(Value::Null) => json!({}),
            Some(args @ Value::Object(_)) => args.clone(),
            Some(other) => {
                return Err(refuse(format!(
                    "the arguments must be an object, got {}",
                    super::json_type(other)
                )));
            }
        };
        if name == "terminal"
            && let Some(key) = DETACHING_ARGS
                .iter()
                .find(|k| args.get(**k).is_some_and(truthy))
        {
            return Err(refuse(format!(
                "terminal runs in the foreground only inside execute_code: `{key}` is not \
                 accepted here. Start background work with a terminal call of your own."
            )));
        }
        let _turn = self.one_at_a_time.lock().await;
        let made = self.made.load(Ordering::Relaxed);
        if made >= self.max {
            return Err(refuse(format!(
                "this script has made {} tool calls, the most one script may make \
                 (code_execution.max_tool_calls); finish with what you have, or go on with \
                 normal tool calls",
                self.max
            )));
        }
        self.made.store(made + 1, Ordering::Relaxed);
        if tool.untrusted_output() {
            self.untrusted.store(true, Ordering::Relaxed);
        }
        self.ctx.progress.line(format!("execute_code → {name}"));
        let (text, _ok) = crate::dispatch::execute(tool.clone(), args, self.ctx.clone()).await;
        Ok(text)
    }
}

/// Whether an argument asks for something (`true`, a non-empty list).
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => {
            let s = s.trim();
            !s.is_empty() && !s.eq_ignore_ascii_case("false") && s != "0"
        }
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Answers the script's requests until the task is aborted.
async fn serve(listener: UnixListener, calls: Arc<Calls>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    while connections.try_join_next().is_some() {}
                    if connections.len() >= MAX_CONNECTIONS {
                        tokio::spawn(turn_away(stream));
                        continue;
                    }
                    connections.spawn(connection(stream, calls.clone()));
                }
                Err(e) => {
                    tracing::warn!("execute_code: accepting a connection failed: {e}");
                    // Out of descriptors or the like: wait instead of spinning.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Tells a connection over the limit why it is closed.
async fn turn_away(mut stream: UnixStream) {
    let line = json!({
        "result": error_json(&format!(
            "too many connections to Talaria at once (at most {MAX_CONNECTIONS}); call tools \
             from fewer threads or processes"
        ))
    })
    .to_string();
    let _ = stream.write_all(format!("{line}\n").as_bytes()).await;
}

/// Answers one connection's requests, a line each, in order.
async fn connection(stream: UnixStream, calls: Arc<Calls>) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    loop {
        let mut line = Vec::new();
        let limit = (MAX_REQUEST_BYTES + 1) as u64;
        match (&mut reader).take(limit).read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let reply = if line.len() > MAX_REQUEST_BYTES {
            // The script is still sending: read the rest of the line
            // without keeping it, so it gets the answer, not a broken pipe.
            drop(line);
            if skip_line(&mut reader).await.is_err() {
                return;
            }
            json!({
                "result": error_json(&format!(
                    "the request is larger than {} MiB; pass big data through a file",
                    MAX_REQUEST_BYTES / (1024 * 1024)
                ))
            })
            .to_string()
        } else {
            calls.answer(&line).await
        };
        if write
            .write_all(format!("{reply}\n").as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Reads up to and including the next newline, discarding it.
async fn skip_line<R: tokio::io::AsyncBufRead + Unpin>(reader: &mut R) -> std::io::Result<()> {
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|b| *b == b'\n') {
            Some(at) => {
                reader.consume(at + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                reader.consume(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(sh_quote("a'b"), r"'a'\''b'");
        assert_eq!(sh_quote("/usr/bin/python3"), "'/usr/bin/python3'");
    }

    #[test]
    fn only_asking_values_count_as_asking() {
        assert!(truthy(&json!(true)));
        assert!(truthy(&json!("true")));
        assert!(truthy(&json!(["x"])));
        assert!(!truthy(&json!(false)));
        assert!(!truthy(&json!("false")));
        assert!(!truthy(&json!([])));
        assert!(!truthy(&json!(null)));
    }

    #[test]
    fn a_missing_interpreter_is_recognised() {
        assert!(python_missing(
            "sh: 1: exec: nopython: not found\n",
            "nopython"
        ));
        assert!(!python_missing("Traceback: ValueError\n", "python3"));
    }
}
