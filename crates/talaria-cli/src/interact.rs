//! Terminal prompts for dangerous-command approvals and clarifying questions.

use std::io::{self, BufRead, Write};
use std::time::Duration;

use async_trait::async_trait;
use talaria_agent::interaction::{ApprovalDecision, ApprovalRequest, ClarifyRequest, Interaction};

/// Asks on the terminal. Without a terminal (piped input, scripts) nobody can
/// answer, so approvals are denied and questions go unanswered.
pub struct CliInteraction {
    interactive: bool,
    timeout: Duration,
}

impl CliInteraction {
    pub fn new(interactive: bool, timeout: Duration) -> CliInteraction {
        CliInteraction {
            interactive,
            timeout,
        }
    }

    /// Prints `prompt` on stderr and reads one line, or `None` on timeout or
    /// end of input.
    async fn read_answer(&self, prompt: String) -> Option<String> {
        let read = tokio::task::spawn_blocking(move || {
            eprint!("{prompt}");
            let _ = io::stderr().flush();
            let mut line = String::new();
            match io::stdin().lock().read_line(&mut line) {
                Ok(0) | Err(_) => None,
                Ok(_) => Some(line.trim().to_owned()),
            }
        });
        match tokio::time::timeout(self.timeout, read).await {
            Ok(Ok(answer)) => answer,
            _ => {
                eprintln!("\n(no answer in {}s)", self.timeout.as_secs());
                None
            }
        }
    }
}

#[async_trait]
impl Interaction for CliInteraction {
    async fn approve(&self, request: &ApprovalRequest) -> ApprovalDecision {
        if !self.interactive {
            return ApprovalDecision::Deny;
        }
        let prompt = format!(
            "\n⚠  The agent wants to run a command that needs approval ({}):\n    {}\n   [o]nce · [s]ession · [a]lways · [d]eny > ",
            request.reason, request.command
        );
        match self.read_answer(prompt).await.as_deref() {
            None => ApprovalDecision::TimedOut,
            Some("o" | "once" | "y" | "yes") => ApprovalDecision::Once,
            Some("s" | "session") => ApprovalDecision::Session,
            Some("a" | "always") => ApprovalDecision::Always,
            Some(_) => ApprovalDecision::Deny,
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
        let answer = self.read_answer(prompt).await?;
        // A bare number picks that choice.
        if let Ok(n) = answer.parse::<usize>()
            && (1..=request.choices.len()).contains(&n)
        {
            return Some(request.choices[n - 1].clone());
        }
        Some(answer)
    }
}
