//! Logging to stderr through the secret redactor, so that no log line can
//! carry a key even when a library logs a request.

use std::io::{self, IsTerminal, Write};

use talaria_core::Redactor;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// Writes each formatted event to stderr after redaction.
#[derive(Clone)]
struct RedactingStderr {
    redactor: Redactor,
}

impl Write for RedactingStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        io::stderr().write_all(self.redactor.redact(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

impl<'a> MakeWriter<'a> for RedactingStderr {
    type Writer = RedactingStderr;

    fn make_writer(&'a self) -> RedactingStderr {
        self.clone()
    }
}

/// Installs the global subscriber. `TALARIA_LOG` (or `RUST_LOG`) sets the
/// filter; otherwise `default` applies (`warn` for interactive commands, so
/// the terminal stays readable; `info` for the gateway, whose log is read
/// after the fact).
pub fn init(redactor: Redactor, default: &str) {
    let filter = std::env::var("TALARIA_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new(default));
    // A second init (tests) is harmless; ignore the error.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(RedactingStderr { redactor })
        .with_target(false)
        // Colour codes only help a person at a terminal; in a log file or a
        // pipe they are noise.
        .with_ansi(io::stderr().is_terminal())
        .try_init();
}
