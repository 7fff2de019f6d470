//! Where log lines go, always through the secret redactor, so that no log
//! line can carry a key even when a library logs a request.
//!
//! The gateway (`talaria gateway run`) logs to stderr: under systemd that is
//! the journal, and `gateway start` points it at `logs/gateway.log`. Every
//! other command is run by a person at a terminal, so its log goes to
//! `$TALARIA_HOME/logs/talaria.log` and the terminal shows only what is
//! meant for the person: the command's own warnings and the short notices
//! libraries send under [`NOTICE_TARGET`] ("could not reach the model
//! server; trying again in 2 s"), one plain line each.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use talaria_core::{Home, Redactor};
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// The target of events meant for the person at the terminal as well as
/// for the log (`tracing::warn!(target: "talaria::notice", ...)`, at WARN
/// or above). The library crates spell it out, since a target must be a
/// literal.
pub const NOTICE_TARGET: &str = "talaria::notice";

/// The level a log has unless `TALARIA_LOG` (or `RUST_LOG`) says otherwise:
/// the same for the gateway and for the other commands.
pub const DEFAULT_LEVEL: &str = "info";

/// The file the commands other than the gateway log to, in the home's
/// `logs/`.
pub const LOG_FILE: &str = "talaria.log";

/// A log file larger than this at start is moved aside (`talaria.log.1`,
/// replacing the previous one), so the log cannot grow without bound.
const ROTATE_AT: u64 = 10 * 1024 * 1024;

/// Libraries whose debug lines are about connections, not about what
/// Talaria does: kept at `info` when the log is at `debug` or `trace`,
/// unless the filter names them (`TALARIA_LOG=debug,hyper=debug`).
const CHATTY: &[&str] = &[
    "h2",
    "hickory_proto",
    "hickory_resolver",
    "hyper",
    "hyper_util",
    "mio",
    "reqwest",
    "rmcp",
    "rustls",
    "tokio_postgres",
    "tokio_rustls",
    "tokio_tungstenite",
    "tungstenite",
    "want",
];

/// Where this process logs.
#[derive(Debug, Clone)]
enum Destination {
    /// The gateway's stderr.
    Stderr,
    /// A file, with notices on the terminal.
    File(PathBuf),
}

static DESTINATION: OnceLock<Destination> = OnceLock::new();

/// Says where the log goes; called once, before [`init`]. `gateway` is for
/// the gateway process itself, whose stderr is its log.
pub fn choose(home: &Home, gateway: bool) {
    let destination = if gateway {
        Destination::Stderr
    } else {
        Destination::File(home.logs_dir().join(LOG_FILE))
    };
    let _ = DESTINATION.set(destination);
}

/// The log file of the commands other than the gateway, when one is used.
pub fn log_file() -> Option<PathBuf> {
    match DESTINATION.get() {
        Some(Destination::File(path)) => Some(path.clone()),
        _ => None,
    }
}

/// Installs the global subscriber. `TALARIA_LOG` (or `RUST_LOG`) sets the
/// filter; otherwise `default` applies. A second call does nothing.
pub fn init(redactor: Redactor, default: &str) {
    let spec = std::env::var("TALARIA_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .ok()
        .filter(|f| EnvFilter::try_new(f).is_ok())
        .unwrap_or_else(|| default.to_owned());
    let filter = || {
        EnvFilter::try_new(quiet_chatty_libraries(&spec))
            .unwrap_or_else(|_| EnvFilter::new(default))
    };
    let destination = DESTINATION.get().cloned().unwrap_or(Destination::Stderr);
    let file = match &destination {
        Destination::File(path) => match open_log(path) {
            Ok(file) => Some(Arc::new(file)),
            Err(e) => {
                eprintln!(
                    "talaria: cannot write the log {} ({e}); logging to the terminal instead",
                    path.display()
                );
                None
            }
        },
        Destination::Stderr => None,
    };
    // A second init (tests) fails harmlessly; the errors are ignored.
    match file {
        None => {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter())
                .with_writer(Redacting {
                    redactor,
                    out: Out::Stderr,
                })
                .with_target(false)
                // Colour codes only help a person at a terminal; in a log
                // file or a pipe they are noise.
                .with_ansi(io::stderr().is_terminal())
                .try_init();
        }
        Some(file) => {
            let to_file = tracing_subscriber::fmt::layer()
                .with_writer(Redacting {
                    redactor: redactor.clone(),
                    out: Out::File(file),
                })
                .with_target(false)
                .with_ansi(false)
                .with_filter(filter());
            // Notices are logged at WARN; the hint lets tracing skip the
            // terminal's check for every debug line.
            let to_terminal = Terminal { redactor }
                .with_filter(filter_fn(for_the_terminal).with_max_level_hint(LevelFilter::WARN));
            let _ = tracing_subscriber::registry()
                .with(to_file)
                .with(to_terminal)
                .try_init();
        }
    }
}

/// Opens the log for appending (creating `logs/`), moving a large one
/// aside first.
fn open_log(path: &std::path::Path) -> io::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if std::fs::metadata(path).is_ok_and(|m| m.len() > ROTATE_AT) {
        let mut old = path.as_os_str().to_owned();
        old.push(".1");
        // Another process may have moved it already; either way a fresh
        // file is opened below.
        let _ = std::fs::rename(path, old);
    }
    OpenOptions::new().create(true).append(true).open(path)
}

/// Whether an event is shown at the terminal: notices, and this command's
/// own warnings and errors (a configuration key it does not know). Library
/// warnings stay in the log.
fn for_the_terminal(meta: &tracing::Metadata<'_>) -> bool {
    if meta.target() == NOTICE_TARGET {
        return true;
    }
    // This binary's modules are `talaria::…`; the library crates are
    // `talaria_llm::…` and so on.
    meta.target().starts_with("talaria::") && *meta.level() <= Level::WARN
}

/// Adds `<library>=info` for each of [`CHATTY`] the filter does not name,
/// when its default level is `debug` or `trace`.
fn quiet_chatty_libraries(spec: &str) -> String {
    let directives: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    let verbose = directives.iter().any(|d| {
        d.parse::<LevelFilter>()
            .is_ok_and(|level| level > LevelFilter::INFO)
    });
    if !verbose {
        return spec.to_owned();
    }
    let named = |library: &str| {
        directives.iter().any(|d| {
            let target = d.split(['=', '[']).next().unwrap_or_default();
            target == library || target.starts_with(&format!("{library}::"))
        })
    };
    let mut out = spec.to_owned();
    for library in CHATTY.iter().filter(|l| !named(l)) {
        let _ = write!(out, ",{library}=info");
    }
    out
}

/// Where a [`Redacting`] writer writes.
#[derive(Clone)]
enum Out {
    Stderr,
    File(Arc<File>),
}

/// Writes each formatted event after redaction.
#[derive(Clone)]
struct Redacting {
    redactor: Redactor,
    out: Out,
}

impl Write for Redacting {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let clean = self.redactor.redact(&text);
        // One write per event: lines of processes sharing the file do not
        // interleave.
        match &self.out {
            Out::Stderr => io::stderr().write_all(clean.as_bytes())?,
            Out::File(file) => (&**file).write_all(clean.as_bytes())?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match &self.out {
            Out::Stderr => io::stderr().flush(),
            Out::File(file) => (&**file).flush(),
        }
    }
}

impl<'a> MakeWriter<'a> for Redacting {
    type Writer = Redacting;

    fn make_writer(&'a self) -> Redacting {
        self.clone()
    }
}

/// Prints an event's message alone, as a line for a person: no time, no
/// level, no fields (those are in the log).
struct Terminal {
    redactor: Redactor,
}

impl<S: Subscriber> Layer<S> for Terminal {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        let prefix = if event.metadata().target() == NOTICE_TARGET {
            ""
        } else if *event.metadata().level() == Level::ERROR {
            "error: "
        } else {
            "warning: "
        };
        let line = self.redactor.redact(&format!("{prefix}{}\n", message.0));
        let _ = io::stderr().write_all(line.as_bytes());
    }
}

/// Collects an event's `message` field.
struct Message(String);

impl Visit for Message {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_chatter_is_kept_out_of_debug_unless_named() {
        assert_eq!(quiet_chatty_libraries("info"), "info");
        assert_eq!(
            quiet_chatty_libraries("warn,talaria_llm=debug"),
            "warn,talaria_llm=debug"
        );
        let debug = quiet_chatty_libraries("debug");
        assert!(debug.contains(",hyper=info"), "{debug}");
        assert!(debug.contains(",reqwest=info"), "{debug}");
        let named = quiet_chatty_libraries("debug,hyper_util::client=trace");
        assert!(!named.contains("hyper_util=info"), "{named}");
        assert!(named.contains(",hyper=info"), "{named}");
        assert!(EnvFilter::try_new(named).is_ok());
    }
}
