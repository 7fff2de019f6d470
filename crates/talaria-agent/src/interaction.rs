//! How the agent asks a human: approvals for dangerous commands and
//! clarifying questions. The CLI prompts on the terminal; the gateway will
//! answer through `/approve` and `/deny`.

use async_trait::async_trait;

/// A dangerous action waiting for a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRequest {
    /// The command as shown to the human (already redacted).
    pub command: String,
    /// Why it needs approval (the matched pattern's description).
    pub reason: String,
    /// Stable key of the matched pattern, remembered for "session".
    pub pattern_key: String,
    /// What "always" would remember from now on: exactly this command line.
    /// `None` when this request cannot be remembered beyond the session (a
    /// multi-line command, one holding a secret, or an action that is not a
    /// command): a front end then does not offer "always".
    pub always: Option<String>,
}

/// The human's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalDecision {
    /// Run it this once.
    Once,
    /// Run it and allow every command of its kind (the matched patterns)
    /// for the rest of the session.
    Session,
    /// Run it and allow exactly this command from now on (see
    /// [`ApprovalRequest::always`]).
    Always,
    /// Do not run it; the tool reports the refusal to the model.
    Deny,
    /// Nobody answered in time: treated as a denial.
    TimedOut,
}

/// A question for the human, open or multiple choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClarifyRequest {
    /// What the model wants to know, shown as asked.
    pub question: String,
    /// Up to four choices; empty for an open question.
    pub choices: Vec<String>,
}

/// The channel to a human. Implementations must honour their own timeout.
#[async_trait]
pub trait Interaction: Send + Sync {
    /// Asks whether a command may run. Never fails: no answer is a denial
    /// ([`ApprovalDecision::TimedOut`]).
    async fn approve(&self, request: &ApprovalRequest) -> ApprovalDecision;
    /// The answer, or `None` when no human can answer.
    async fn clarify(&self, request: &ClarifyRequest) -> Option<String>;
}

/// For contexts with no human (tests, batch jobs): denies every approval and
/// answers no question.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHuman;

#[async_trait]
impl Interaction for NoHuman {
    async fn approve(&self, _request: &ApprovalRequest) -> ApprovalDecision {
        ApprovalDecision::Deny
    }

    async fn clarify(&self, _request: &ClarifyRequest) -> Option<String> {
        None
    }
}
