//! Approvals and clarifying questions asked in the chat: the agent's
//! [`Interaction`] for a chat turn. The question goes out as a message;
//! the answer comes back as `/approve`, `/deny` or the next plain message,
//! through the lane's waiting slot.

use std::time::Duration;

use async_trait::async_trait;
use talaria_adapter::Choice;
use talaria_agent::interaction::{ApprovalDecision, ApprovalRequest, ClarifyRequest, Interaction};
use tokio::sync::oneshot;

use super::Runner;
use crate::delivery::Address;
use crate::key::SessionKey;

/// How long a clarifying question waits for its answer.
const CLARIFY_TIMEOUT: Duration = Duration::from_secs(300);

/// Approvals and questions for one chat: asked in the chat, answered with
/// `/approve`, `/deny` or the next plain message.
pub(super) struct ChatInteraction {
    pub(super) runner: Runner,
    pub(super) key: SessionKey,
    pub(super) to: Address,
}

#[async_trait]
impl Interaction for ChatInteraction {
    async fn approve(&self, request: &ApprovalRequest) -> ApprovalDecision {
        let inner = &self.runner.inner;
        let (tx, rx) = oneshot::channel();
        inner.lanes().entry(self.key.clone()).or_default().approval = Some(tx);
        let timeout = Duration::from_secs(inner.config.approvals.timeout_secs.max(1));
        let text = format!(
            "⚠️ The agent wants to run a command that needs your approval:\n\n{}\n\nWhy: {}\n\nReply /approve to run it once, /approve session to allow it for this conversation, /approve always to allow it from now on, or /deny. Without an answer in {}s it is denied.",
            request.command,
            request.reason,
            timeout.as_secs()
        );
        inner
            .delivery
            .notify_with_choices(&self.to, &text, &approval_choices())
            .await;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(decision)) => decision,
            Ok(Err(_)) => ApprovalDecision::Deny,
            Err(_) => {
                if let Some(lane) = inner.lanes().get_mut(&self.key) {
                    lane.approval = None;
                }
                inner
                    .delivery
                    .notify(&self.to, "⌛ No answer in time; the command was not run.")
                    .await;
                ApprovalDecision::TimedOut
            }
        }
    }

    async fn clarify(&self, request: &ClarifyRequest) -> Option<String> {
        let inner = &self.runner.inner;
        let (tx, rx) = oneshot::channel();
        inner.lanes().entry(self.key.clone()).or_default().clarify = Some(tx);
        let mut text = format!("❓ {}", request.question);
        for (i, choice) in request.choices.iter().enumerate() {
            text.push_str(&format!("\n{}. {choice}", i + 1));
        }
        inner.delivery.notify(&self.to, &text).await;
        let answer = tokio::time::timeout(CLARIFY_TIMEOUT, rx).await.ok()?.ok()?;
        // A number picks a choice.
        let picked = answer
            .trim()
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| request.choices.get(i).cloned());
        Some(picked.unwrap_or(answer))
    }
}

/// The answers to an approval as buttons, where the platform has them: a
/// click is the same command the question's text names.
fn approval_choices() -> [Choice; 4] {
    [
        Choice::new("Approve once", "/approve"),
        Choice::new("Approve for this conversation", "/approve session"),
        Choice::new("Always approve", "/approve always"),
        Choice::new("Deny", "/deny"),
    ]
}
