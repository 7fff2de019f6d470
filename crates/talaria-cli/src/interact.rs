//! Terminal prompts for dangerous-command approvals and clarifying questions.
//!
//! An answer is read from the terminal while a turn runs, when the line
//! editor is not reading: the terminal is in its ordinary line mode, so
//! Ctrl-C there interrupts the turn (the question is then withdrawn). A
//! withdrawn question must not leave a read waiting on the terminal: that
//! read would take the next line typed at the chat prompt, and keep the
//! program from ending. So the answer is awaited in short polls that stop
//! as soon as nobody wants it, and only a complete line is ever read.

use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use talaria_agent::interaction::{ApprovalDecision, ApprovalRequest, ClarifyRequest, Interaction};

/// How often a waiting read checks whether its question was withdrawn.
const POLL_SLICE_MS: u16 = 100;

/// Asks on the terminal. Without a terminal (piped input, scripts) nobody can
/// answer, so approvals are denied and questions go unanswered.
pub struct CliInteraction {
    interactive: bool,
    timeout: Duration,
}

/// What came back from the terminal.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Line(String),
    /// End of input (Ctrl-D) or a terminal that cannot be read.
    Closed,
    /// No answer in time.
    TimedOut,
}

/// Sets the flag when dropped: the future waiting for the answer is gone
/// (the turn was interrupted, or time ran out), so the read must stop.
struct Withdraw(Arc<AtomicBool>);

impl Drop for Withdraw {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Waits for one complete line on standard input and reads it, unless
/// `withdrawn` is set first. In the terminal's line mode a line is readable
/// only once Enter was pressed, and one read returns at most one line, so
/// nothing typed after it is taken.
fn read_line_unless(withdrawn: &AtomicBool) -> Option<Answer> {
    let stdin = io::stdin();
    let fd = stdin.as_fd();
    loop {
        if withdrawn.load(Ordering::SeqCst) {
            return None;
        }
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(POLL_SLICE_MS)) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => break,
            Err(_) => return Some(Answer::Closed),
        }
    }
    if withdrawn.load(Ordering::SeqCst) {
        return None;
    }
    // Read the descriptor itself, not through the standard library's
    // buffered handle, which could keep bytes beyond the line.
    let Ok(owned) = fd.try_clone_to_owned() else {
        return Some(Answer::Closed);
    };
    let mut file = std::fs::File::from(owned);
    // One read: in line mode it returns the whole line (the terminal holds
    // at most 4095 characters of one), or what was typed before Ctrl-D.
    // Reading on could wait for a line meant for the chat prompt.
    let mut buf = vec![0u8; 8192];
    let bytes = loop {
        match file.read(&mut buf) {
            Ok(n) => break &buf[..n],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break &buf[..0],
        }
    };
    if bytes.is_empty() {
        return Some(Answer::Closed);
    }
    Some(Answer::Line(
        String::from_utf8_lossy(bytes).trim().to_owned(),
    ))
}

impl CliInteraction {
    pub fn new(interactive: bool, timeout: Duration) -> CliInteraction {
        CliInteraction {
            interactive,
            timeout,
        }
    }

    /// Prints `prompt` on stderr and reads one line.
    async fn read_answer(&self, prompt: String) -> Answer {
        eprint!("{prompt}");
        let _ = io::stderr().flush();
        let withdrawn = Arc::new(AtomicBool::new(false));
        let guard = Withdraw(withdrawn.clone());
        let read = tokio::task::spawn_blocking(move || read_line_unless(&withdrawn));
        let answer = match tokio::time::timeout(self.timeout, read).await {
            Ok(Ok(Some(answer))) => answer,
            Ok(Ok(None) | Err(_)) => Answer::Closed,
            Err(_) => {
                eprintln!("\n(no answer in {}s)", self.timeout.as_secs());
                Answer::TimedOut
            }
        };
        drop(guard);
        answer
    }
}

/// The approval question, saying what each answer allows.
fn approval_prompt(request: &ApprovalRequest) -> String {
    let mut prompt = format!(
        "\n⚠  The agent wants to run a command that needs approval ({}):\n    {}\n",
        request.reason, request.command
    );
    prompt.push_str("   [o]nce     run it this time\n");
    prompt.push_str(&format!(
        "   [s]ession  allow any command of this kind ({}) until this chat ends\n",
        request.reason
    ));
    if request.always.is_some() {
        prompt.push_str(
            "   [a]lways   allow exactly this command from now on (talaria approvals list shows it)\n",
        );
    }
    prompt.push_str("   [d]eny\n   > ");
    prompt
}

/// The decision an answer to [`approval_prompt`] means. Anything not
/// offered is a denial.
fn approval_decision(request: &ApprovalRequest, answer: &str) -> ApprovalDecision {
    match answer.to_ascii_lowercase().as_str() {
        "o" | "once" | "y" | "yes" => ApprovalDecision::Once,
        "s" | "session" => ApprovalDecision::Session,
        "a" | "always" if request.always.is_some() => ApprovalDecision::Always,
        _ => ApprovalDecision::Deny,
    }
}

#[async_trait]
impl Interaction for CliInteraction {
    async fn approve(&self, request: &ApprovalRequest) -> ApprovalDecision {
        if !self.interactive {
            return ApprovalDecision::Deny;
        }
        match self.read_answer(approval_prompt(request)).await {
            Answer::Line(answer) => approval_decision(request, &answer),
            Answer::Closed => ApprovalDecision::Deny,
            Answer::TimedOut => ApprovalDecision::TimedOut,
        }
    }

    async fn clarify(&self, request: &ClarifyRequest) -> Option<String> {
        if !self.interactive {
            return None;
        }
        let mut prompt = format!("\n?  {}\n", request.question);
        for (i, c) in request.choices.iter().enumerate() {
            prompt.push_str(&format!("   {}. {c}\n", i + 1));
        }
        prompt.push_str("   > ");
        let Answer::Line(answer) = self.read_answer(prompt).await else {
            return None;
        };
        // A bare number picks that choice.
        if let Ok(n) = answer.parse::<usize>()
            && (1..=request.choices.len()).contains(&n)
        {
            return Some(request.choices[n - 1].clone());
        }
        Some(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(always: Option<&str>) -> ApprovalRequest {
        ApprovalRequest {
            command: "rm -r somedir".into(),
            reason: "recursive delete (rm -r)".into(),
            pattern_key: "recursive delete (rm -r)".into(),
            always: always.map(str::to_owned),
        }
    }

    #[test]
    fn the_prompt_says_what_each_answer_allows() {
        let p = approval_prompt(&request(Some("rm -r somedir")));
        assert!(p.contains("    rm -r somedir\n"), "{p}");
        assert!(
            p.contains("any command of this kind (recursive delete (rm -r))"),
            "{p}"
        );
        assert!(p.contains("exactly this command from now on"), "{p}");
        let p = approval_prompt(&request(None));
        assert!(!p.contains("[a]lways"), "{p}");
    }

    #[test]
    fn always_is_taken_only_when_offered() {
        let r = request(Some("rm -r somedir"));
        assert_eq!(approval_decision(&r, "a"), ApprovalDecision::Always);
        assert_eq!(approval_decision(&r, "Always"), ApprovalDecision::Always);
        assert_eq!(approval_decision(&r, "s"), ApprovalDecision::Session);
        assert_eq!(approval_decision(&r, "y"), ApprovalDecision::Once);
        assert_eq!(approval_decision(&r, "maybe"), ApprovalDecision::Deny);
        assert_eq!(
            approval_decision(&request(None), "a"),
            ApprovalDecision::Deny
        );
    }
}
