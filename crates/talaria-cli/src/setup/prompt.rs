//! Asking the questions of `talaria setup` on the terminal: one line per
//! answer from stdin, prompts on stderr, and secrets read with the echo
//! off (put back on Ctrl-C too, by the watcher `setup` starts).

use std::io::{self, BufRead, IsTerminal, Write};
use std::sync::Mutex;

use anyhow::Context;

/// The terminal settings to put back when Ctrl-C arrives while echo is off.
static SAVED_TERMINAL: Mutex<Option<nix::sys::termios::Termios>> = Mutex::new(None);

/// Puts back the terminal settings [`Prompter::ask_hidden`] saved, if it
/// is still in the middle of a hidden question.
pub(super) fn restore_terminal() {
    let saved = SAVED_TERMINAL
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    if let Some(saved) = saved {
        let _ =
            nix::sys::termios::tcsetattr(io::stdin(), nix::sys::termios::SetArg::TCSANOW, &saved);
    }
}

/// Answers read from stdin, one line each.
pub(super) struct Prompter {
    input: Box<dyn BufRead>,
    terminal: bool,
}

/// End of input: the user pressed Ctrl-D, or the pipe ran dry.
#[derive(Debug)]
struct Cancelled;

impl std::fmt::Display for Cancelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("setup cancelled before the end of the questions; nothing was written")
    }
}

impl std::error::Error for Cancelled {}

impl Prompter {
    /// Reads this process's standard input.
    pub(super) fn stdin() -> Prompter {
        Prompter {
            input: Box::new(io::stdin().lock()),
            terminal: io::stdin().is_terminal(),
        }
    }

    /// One line, trimmed, or `default` when it is empty.
    pub(super) fn ask(&mut self, question: &str, default: Option<&str>) -> anyhow::Result<String> {
        match default {
            Some(d) if !d.is_empty() => eprint!("{question} [{d}]: "),
            _ => eprint!("{question}: "),
        }
        io::stderr().flush()?;
        let line = self.read_line()?;
        Ok(if line.is_empty() {
            default.unwrap_or("").to_owned()
        } else {
            line
        })
    }

    /// Asks until `check` accepts the answer, saying why it did not.
    pub(super) fn ask_until<T>(
        &mut self,
        question: &str,
        default: Option<&str>,
        check: impl Fn(&str) -> Result<T, String>,
    ) -> anyhow::Result<T> {
        loop {
            let answer = self.ask(question, default)?;
            match check(&answer) {
                Ok(v) => return Ok(v),
                Err(why) => eprintln!("  {why}"),
            }
        }
    }

    /// A yes/no question.
    pub(super) fn confirm(&mut self, question: &str, default: bool) -> anyhow::Result<bool> {
        let hint = if default { "Y/n" } else { "y/N" };
        self.ask_until(&format!("{question} ({hint})"), None, |a| {
            match a.to_ascii_lowercase().as_str() {
                "" => Ok(default),
                "y" | "yes" => Ok(true),
                "n" | "no" => Ok(false),
                _ => Err("answer y or n".to_owned()),
            }
        })
    }

    /// One line typed with the terminal's echo off (a secret). The echo
    /// goes off before the question shows, so nothing typed in answer to
    /// it can be echoed.
    pub(super) fn ask_hidden(&mut self, question: &str) -> anyhow::Result<String> {
        use nix::sys::termios::{LocalFlags, SetArg, tcgetattr, tcsetattr};
        let saved = if self.terminal {
            tcgetattr(io::stdin()).ok()
        } else {
            None
        };
        let Some(saved) = saved else {
            // Not a terminal: nothing echoes.
            eprint!("{question}: ");
            io::stderr().flush()?;
            return self.read_line();
        };
        let mut quiet = saved.clone();
        quiet.local_flags.remove(LocalFlags::ECHO);
        // Enter still echoes a newline, so the next line starts afresh.
        quiet.local_flags.insert(LocalFlags::ECHONL);
        *SAVED_TERMINAL.lock().unwrap_or_else(|p| p.into_inner()) = Some(saved);
        let result = tcsetattr(io::stdin(), SetArg::TCSANOW, &quiet)
            .context("cannot turn the terminal's echo off")
            .and_then(|()| {
                eprint!("{question}: ");
                io::stderr().flush()?;
                self.read_line()
            });
        restore_terminal();
        result
    }

    fn read_line(&mut self) -> anyhow::Result<String> {
        let mut line = String::new();
        if self.input.read_line(&mut line)? == 0 {
            eprintln!();
            return Err(Cancelled.into());
        }
        Ok(line.trim().to_owned())
    }
}
