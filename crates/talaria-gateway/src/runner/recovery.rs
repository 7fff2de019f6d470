//! Owed turns a dead node left unanswered (see [`crate::owed`]): run
//! again from the transcript they left, or, when too old or tried too
//! often, their sender told they were lost.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use talaria_core::Role;
use talaria_store::OwedTurn;

use super::lane::Queued;
use super::{Runner, prompt_text};
use crate::event::MessageEvent;
use crate::key::SessionKey;
use crate::owed;

impl Runner {
    /// Takes over the owed turns (see [`crate::owed`]) of nodes that died
    /// (this one's previous process, or another node of the deployment) on
    /// `platforms`, where their answers can be sent now, and runs each
    /// again, or tells its user it was lost.
    pub async fn recover_owed(&self, platforms: &HashSet<String>) {
        let inner = &self.inner;
        if platforms.is_empty() || inner.draining.load(Ordering::SeqCst) {
            return;
        }
        // A crashed predecessor on this host is declared dead now, not when
        // its heartbeat lease runs out.
        if let Err(e) = crate::node::reap_local(inner.store.as_ref(), &inner.node).await {
            tracing::warn!(error = %e, "could not check this host's gateways for dead ones");
        }
        let platforms: Vec<String> = platforms.iter().cloned().collect();
        let claimed = match inner
            .store
            .claim_owed_turns(&inner.node, &platforms, owed::CLAIM_LIMIT)
            .await
        {
            Ok(claimed) => claimed,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for unanswered messages of a stopped gateway");
                return;
            }
        };
        if !claimed.is_empty() {
            tracing::info!(
                count = claimed.len(),
                "taking over messages a stopped gateway had not answered"
            );
        }
        for turn in claimed {
            self.resume_owed(turn).await;
        }
    }

    /// Runs a claimed owed turn again, or says it was lost.
    async fn resume_owed(&self, turn: OwedTurn) {
        if crate::jobs::is_job(&turn.id) {
            // A job's work died with its node: it can only be said lost.
            self.report_lost_job(turn).await;
            return;
        }
        let inner = &self.inner;
        let event: MessageEvent = match serde_json::from_str(&turn.event) {
            Ok(event) => event,
            Err(e) => {
                // Written by this code; unreadable only after a downgrade.
                tracing::error!(id = %turn.id, error = %e, "an unanswered message cannot be read back; dropping it");
                self.settle(&[turn.id]).await;
                return;
            }
        };
        let key = match SessionKey::for_source(&event.source, inner.policy) {
            Ok(key) => key,
            Err(e) => {
                tracing::warn!(error = %e, "an unanswered message has an unusable chat id; dropping it");
                self.settle(&[turn.id]).await;
                return;
            }
        };
        let age = talaria_core::unix_now() - turn.accepted_at;
        if turn.claims > owed::MAX_CLAIMS || age > owed::MAX_AGE.as_secs_f64() {
            tracing::warn!(key = %key, claims = turn.claims, age_secs = age, "giving up on an unanswered message; telling its sender");
            // Through the ledger, which settles the turn in the transaction
            // that records the notice: a crash now neither loses the notice
            // nor sends a second one.
            let to = inner.delivery.answer_address(&event);
            let reference = format!("lost:{}", turn.id);
            let settles = [turn.id];
            let _ = inner
                .delivery
                .deliver_reply_settling(
                    key.as_str(),
                    &reference,
                    &to,
                    &owed::lost_notice(&event.text),
                    None,
                    &settles,
                )
                .await;
            if inner.delivery.ledger().is_none() {
                self.settle(&settles).await;
            }
            return;
        }
        tracing::info!(key = %key, claims = turn.claims, "running an unanswered message again");
        self.rewind_unanswered(&key, &prompt_text(&event)).await;
        self.submit(
            key,
            Queued {
                event,
                mergeable: false,
                owed: vec![turn.id],
            },
        );
    }

    /// Removes what a dead process wrote of a turn it did not finish (the
    /// user row, tool calls and results after it), so the turn run again
    /// starts from the same transcript instead of seeing its message twice.
    /// Only when the transcript ends in that very message's turn.
    async fn rewind_unanswered(&self, key: &SessionKey, prompt: &str) {
        let inner = &self.inner;
        let session = match inner.router.peek(key).await {
            Ok(Some(session)) => session,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(key = %key, error = %e, "cannot read the conversation of an unanswered message");
                return;
            }
        };
        let rows = match inner.store.messages(&session.id).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(key = %key, error = %e, "cannot read the conversation of an unanswered message");
                return;
            }
        };
        let Some(last_user) = rows.iter().rposition(|r| r.message.role == Role::User) else {
            return;
        };
        let answered = rows[last_user + 1..]
            .iter()
            .any(|r| r.message.role == Role::Assistant && r.message.tool_calls.is_empty());
        if rows[last_user].message.content == prompt
            && !answered
            && let Err(e) = inner.agent.rewind(&session.id, 1).await
        {
            tracing::warn!(key = %key, error = %e, "cannot remove an unfinished turn; running it again after it");
        }
    }
}
