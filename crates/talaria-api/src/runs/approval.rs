//! Approvals for a run: the agent's [`Interaction`] that puts a dangerous
//! command on the run (an `approval.request` event, status
//! `waiting_for_approval`) and waits for `POST /v1/runs/{id}/approval`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rand::Rng;
use talaria_agent::interaction::{ApprovalDecision, ApprovalRequest, ClarifyRequest, Interaction};
use tokio::sync::oneshot;

use super::registry::{Pending, Run};
use crate::error::ApiError;

/// Asks the run's client; silence for `wait` is a denial.
pub(crate) struct RunInteraction {
    pub(crate) run: Arc<Run>,
    /// `approvals.timeout_secs`, the same wait the chats give.
    pub(crate) wait: Duration,
}

/// Withdraws the request when the wait ends without an answer, whichever
/// way it ends: our timeout, the tool's own (the same length, so either
/// may fire first), or the tool giving up because the turn stopped.
struct Withdraw<'a> {
    run: &'a Run,
    id: &'a str,
    asked: std::time::Instant,
    wait: Duration,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        let why = if self.asked.elapsed() >= self.wait {
            "timeout"
        } else {
            "cancelled"
        };
        self.run.expire(self.id, why);
    }
}

#[async_trait]
impl Interaction for RunInteraction {
    async fn approve(&self, request: &ApprovalRequest) -> ApprovalDecision {
        let (tx, rx) = oneshot::channel();
        let n: u128 = rand::rng().random();
        let id = format!("appr_{n:032x}");
        let mut choices = vec!["once", "session"];
        if request.always.is_some() {
            choices.push("always");
        }
        choices.push("deny");
        self.run.ask(Pending {
            id: id.clone(),
            command: request.command.clone(),
            reason: request.reason.clone(),
            choices,
            answer: tx,
        });
        let _withdraw = Withdraw {
            run: &self.run,
            id: &id,
            asked: std::time::Instant::now(),
            wait: self.wait,
        };
        match tokio::time::timeout(self.wait, rx).await {
            Ok(Ok(decision)) => decision,
            // The request was dropped unanswered (the run ended).
            Ok(Err(_)) => ApprovalDecision::Deny,
            Err(_) => ApprovalDecision::TimedOut,
        }
    }

    /// A run has no channel for open questions: the model is told nobody
    /// can answer and goes on with its best judgement.
    async fn clarify(&self, _request: &ClarifyRequest) -> Option<String> {
        None
    }
}

/// The decision a client sent.
///
/// # Errors
/// 400 for anything but `once`, `session`, `always` or `deny`.
pub(crate) fn parse_decision(
    raw: Option<&serde_json::Value>,
) -> Result<ApprovalDecision, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "'decision' must be one of \"once\", \"session\", \"always\" or \"deny\"",
            "invalid_decision",
        )
    };
    match raw.and_then(serde_json::Value::as_str).map(str::trim) {
        Some("once") => Ok(ApprovalDecision::Once),
        Some("session") => Ok(ApprovalDecision::Session),
        Some("always") => Ok(ApprovalDecision::Always),
        Some("deny") => Ok(ApprovalDecision::Deny),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    fn request() -> ApprovalRequest {
        ApprovalRequest {
            command: "rm -r build".into(),
            reason: "recursive delete (rm -r)".into(),
            pattern_key: "recursive delete (rm -r)".into(),
            always: Some("rm -r build".into()),
        }
    }

    #[tokio::test]
    async fn an_unanswered_request_times_out_and_is_withdrawn() {
        let run = Arc::new(Run::new(
            "run_x".into(),
            "s".into(),
            "m".into(),
            CancellationToken::new(),
        ));
        let interaction = RunInteraction {
            run: run.clone(),
            wait: Duration::from_millis(20),
        };
        let decision = interaction.approve(&request()).await;
        assert_eq!(decision, ApprovalDecision::TimedOut);
        assert!(run.answer(None, ApprovalDecision::Once).is_err());
        let last = run.read_after(1, 10);
        assert!(last.events[0].data.contains("\"timeout\""));
    }

    #[tokio::test]
    async fn a_wait_given_up_early_is_cancelled_not_timed_out() {
        let run = Arc::new(Run::new(
            "run_z".into(),
            "s".into(),
            "m".into(),
            CancellationToken::new(),
        ));
        let interaction = RunInteraction {
            run: run.clone(),
            wait: Duration::from_secs(30),
        };
        let gave_up =
            tokio::time::timeout(Duration::from_millis(20), interaction.approve(&request())).await;
        assert!(gave_up.is_err());
        assert!(run.answer(None, ApprovalDecision::Once).is_err());
        assert!(
            run.read_after(1, 10).events[0]
                .data
                .contains("\"cancelled\"")
        );
    }

    #[tokio::test]
    async fn an_answer_reaches_the_waiting_tool() {
        let run = Arc::new(Run::new(
            "run_y".into(),
            "s".into(),
            "m".into(),
            CancellationToken::new(),
        ));
        let interaction = RunInteraction {
            run: run.clone(),
            wait: Duration::from_secs(30),
        };
        let answering = run.clone();
        tokio::spawn(async move {
            loop {
                if answering.answer(None, ApprovalDecision::Session).is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        assert_eq!(
            interaction.approve(&request()).await,
            ApprovalDecision::Session
        );
    }

    #[test]
    fn decisions_are_the_four_words() {
        assert_eq!(
            parse_decision(Some(&json!("once"))).ok(),
            Some(ApprovalDecision::Once)
        );
        assert_eq!(
            parse_decision(Some(&json!("deny"))).ok(),
            Some(ApprovalDecision::Deny)
        );
        for bad in [json!("yes"), json!(1), json!(null)] {
            assert!(parse_decision(Some(&bad)).is_err(), "{bad}");
        }
        assert!(parse_decision(None).is_err());
    }
}
