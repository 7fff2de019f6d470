//! The model calls of a turn not yet stored, with what each cost. They
//! are written with the next row (one transaction: the row, the session's
//! counters and cost, a ledger row per call), or when the turn ends.

use talaria_llm::ChatResponse;
use talaria_store::ModelCall;

use super::TurnRun;

/// Calls waiting for the next write.
#[derive(Debug, Default)]
pub(crate) struct PendingCalls {
    /// Not yet stored.
    pub(crate) calls: Vec<ModelCall>,
    /// A call of this turn already counted as its start.
    pub(crate) turn_counted: bool,
    /// What the turn's own calls are (`turn`, `cron`); compression is
    /// always `compression`.
    pub(crate) kind: Option<&'static str>,
}

impl PendingCalls {
    /// Takes the calls to store.
    pub(crate) fn take(&mut self) -> Vec<ModelCall> {
        std::mem::take(&mut self.calls)
    }
}

impl<'a> TurnRun<'a> {
    /// Files the turn's own calls under `kind` (`cron` for a scheduled job).
    pub(crate) fn with_call_kind(mut self, kind: &'static str) -> TurnRun<'a> {
        self.pending.kind = Some(kind);
        self
    }

    /// Stores the calls not yet stored, on their own (a `/compress` that
    /// runs no turn); a failure is logged, as the end of a turn does.
    pub(crate) async fn store_pending_calls(&mut self) {
        let calls = self.pending.take();
        if !calls.is_empty()
            && let Err(e) = self.parts.store.add_calls(&self.session.id, &calls).await
        {
            tracing::warn!(session = %self.session.id, error = %e, "could not store the model calls' usage");
        }
    }

    /// Counts a model call: its usage in the turn's total, and a priced
    /// ledger entry stored with the next row. `compression` marks a
    /// summary pass, which does not start a turn.
    pub(super) fn record_call(&mut self, response: &ChatResponse, compression: bool) {
        self.usage.add(&response.usage);
        let model = if response.model.is_empty() {
            self.parts.provider.model().to_owned()
        } else {
            response.model.clone()
        };
        let cost_micros = talaria_llm::pricing::cost_micros(
            &self.parts.config.prices,
            &response.provider,
            &model,
            &response.usage,
        );
        let kind = if compression {
            "compression"
        } else {
            self.pending.kind.unwrap_or("turn")
        };
        let starts_turn = !compression && !self.pending.turn_counted;
        if starts_turn {
            self.pending.turn_counted = true;
        }
        talaria_core::metrics::model_answered(
            &model,
            response.usage.input_tokens
                + response.usage.cache_read_tokens
                + response.usage.cache_write_tokens,
            response.usage.output_tokens,
            cost_micros,
        );
        self.pending.calls.push(ModelCall {
            provider: response.provider.clone(),
            model,
            kind: kind.to_owned(),
            usage: response.usage,
            cost_micros,
            tool_calls: u32::try_from(response.message.tool_calls.len()).unwrap_or(u32::MAX),
            starts_turn,
        });
    }
}
