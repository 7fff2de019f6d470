//! The Python environments that hold the third-party software the tests
//! drive Talaria with: the official OpenAI SDK (`openai`), the Synapse
//! homeserver (`matrix-synapse`), the Matrix client library with end-to-end
//! encryption (`matrix-nio[e2e]`), the MCP Python SDK (`mcp`), the
//! reference MCP servers (`mcp-server-time`) and the Prometheus client's
//! text-format parser (`prometheus-client`) in one; hermes-agent,
//! Talaria's Python ancestor (its modules `run_agent` and `hermes_state`),
//! which writes the homes `talaria import hermes` reads, in another of its
//! own: it pins an old `openai`, and the SDK tests must run against the
//! current one.
//!
//! `.ci/run` installs them into virtual environments at [`DEFAULT_VENV`]
//! and [`DEFAULT_HERMES_VENV`] (or wherever `TALARIA_TEST_VENV` and
//! `TALARIA_TEST_HERMES_VENV` point). A test that needs one of them fails,
//! never skips, when it is missing: a green run must mean the real thing
//! was exercised.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where `.ci/run` puts the virtual environment unless told otherwise.
pub const DEFAULT_VENV: &str = "/opt/talaria-py";

/// Where `.ci/run` puts hermes-agent's environment unless told otherwise.
pub const DEFAULT_HERMES_VENV: &str = "/opt/talaria-hermes";

/// hermes-agent's interpreter (`TALARIA_TEST_HERMES_VENV`, else
/// [`DEFAULT_HERMES_VENV`]), checked to import `modules`.
///
/// # Panics
/// When the interpreter is missing or a module does not import, saying how
/// to install it.
pub fn hermes_python(modules: &[&str]) -> PathBuf {
    let root = std::env::var_os("TALARIA_TEST_HERMES_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_HERMES_VENV));
    let python = root.join("bin").join("python");
    for module in modules {
        let ok = Command::new(&python)
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            panic!(
                "{module} is needed by this test and is not installed in {} (looked for {}). \
                 `.ci/run` installs it: python3 -m venv {0} && {0}/bin/pip install hermes-agent",
                root.display(),
                python.display(),
            );
        }
    }
    python
}

/// The virtual environment's root: `TALARIA_TEST_VENV`, else
/// [`DEFAULT_VENV`].
pub fn venv() -> PathBuf {
    std::env::var_os("TALARIA_TEST_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_VENV))
}

/// The path of `name` in the environment's `bin/` (an interpreter or an
/// installed console script such as `mcp-server-time`).
///
/// # Panics
/// When it is not there, with the command that installs it.
pub fn venv_bin(name: &str) -> PathBuf {
    let path = venv().join("bin").join(name);
    if !path.exists() {
        missing(&path, name);
    }
    path
}

/// The environment's interpreter, checked to import every module of
/// `modules`.
///
/// # Panics
/// When the interpreter is missing or a module does not import, saying how
/// to install it.
pub fn python_with(modules: &[&str]) -> PathBuf {
    let python = venv_bin("python");
    for module in modules {
        let ok = Command::new(&python)
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            missing(&python, module);
        }
    }
    python
}

fn missing(path: &Path, what: &str) -> ! {
    panic!(
        "{what} is needed by this test and is not installed in {} (looked for {}). \
         `.ci/run` installs it: python3 -m venv {0} && {0}/bin/pip install \
         openai matrix-synapse 'matrix-nio[e2e]' mcp mcp-server-time prometheus-client",
        venv().display(),
        path.display(),
    )
}
