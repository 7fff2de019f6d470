//! What model calls cost: the per-call ledger (`model_calls`), the spend a
//! budget is checked against, and the report `talaria insights` prints.
//!
//! Every call the agent makes is one ledger row, written in the same
//! transaction as the usage counters of its session, with the session's
//! platform and chat copied in so that sums by chat need no join. Costs
//! are whole micro-dollars, so sums are exact.

use chrono::{DateTime, Datelike, TimeZone, Utc};
use serde::{Deserialize, Serialize};
use talaria_core::Usage;

use crate::Timestamp;

/// One model call, as the agent reports it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelCall {
    /// The provider that answered (after any fallback): `openai`, `custom`...
    pub provider: String,
    /// The model that answered, as the provider named it.
    pub model: String,
    /// What the call was for: `turn`, `compression`, `review`, `cron`...
    pub kind: String,
    /// The tokens it used.
    pub usage: Usage,
    /// What it cost, in micro-dollars (millionths of a US dollar).
    pub cost_micros: u64,
    /// Tool calls the answer asked for.
    pub tool_calls: u32,
    /// Whether this call began a turn (counts turns without reading the
    /// transcript).
    pub starts_turn: bool,
}

impl ModelCall {
    /// The usage of `calls` together.
    pub fn total_usage(calls: &[ModelCall]) -> Usage {
        let mut total = Usage::default();
        for call in calls {
            total.input_tokens = total.input_tokens.saturating_add(call.usage.input_tokens);
            total.output_tokens = total.output_tokens.saturating_add(call.usage.output_tokens);
            total.cache_read_tokens = total
                .cache_read_tokens
                .saturating_add(call.usage.cache_read_tokens);
            total.cache_write_tokens = total
                .cache_write_tokens
                .saturating_add(call.usage.cache_write_tokens);
            total.reasoning_tokens = total
                .reasoning_tokens
                .saturating_add(call.usage.reasoning_tokens);
        }
        total
    }
}

/// Whose spend is summed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpendScope {
    /// Every call of the home.
    All,
    /// The calls of sessions with this routing key.
    SessionKey(String),
    /// The calls of sessions from `platform` in chat `chat_id`.
    Chat {
        /// The session source (`telegram`, ...).
        platform: String,
        /// The platform's chat id.
        chat_id: String,
    },
}

/// Sums over a set of ledger rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UsageTotals {
    /// Model calls.
    pub calls: u64,
    /// Turns begun.
    pub turns: u64,
    /// Tool calls the models asked for.
    pub tool_calls: u64,
    /// Prompt tokens processed afresh.
    pub input_tokens: u64,
    /// Tokens generated.
    pub output_tokens: u64,
    /// Prompt tokens read from a cache.
    pub cache_read_tokens: u64,
    /// Prompt tokens written to a cache.
    pub cache_write_tokens: u64,
    /// Generated tokens spent on reasoning.
    pub reasoning_tokens: u64,
    /// Cost in micro-dollars.
    pub cost_micros: u64,
}

/// One group of a [`UsageReport`]: a day, a model, a platform or a chat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageGroup {
    /// The day (`YYYY-MM-DD`, UTC), model, platform or chat it sums.
    pub name: String,
    /// The sums.
    #[serde(flatten)]
    pub totals: UsageTotals,
}

/// Usage since a time, summed in total and by day, model, platform and
/// chat (the chat is the session key, else `platform:chat_id`, else the
/// platform). Days come oldest first; the other groups costliest first,
/// each list at most the `top` asked for.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UsageReport {
    /// Everything together.
    pub total: UsageTotals,
    /// By UTC day.
    pub by_day: Vec<UsageGroup>,
    /// By the model that answered.
    pub by_model: Vec<UsageGroup>,
    /// By session source.
    pub by_platform: Vec<UsageGroup>,
    /// By chat.
    pub by_chat: Vec<UsageGroup>,
}

/// SQL for the chat a ledger row belongs to, over its own columns.
pub(crate) const CHAT_EXPR: &str = "COALESCE(session_key, CASE WHEN chat_id IS NULL THEN platform ELSE platform || ':' || chat_id END)";

fn at(ts: Timestamp) -> DateTime<Utc> {
    let secs = ts.floor();
    // Out of chrono's range only for absurd clocks: the epoch is harmless.
    Utc.timestamp_opt(secs as i64, 0)
        .single()
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}

fn stamp(t: Option<DateTime<Utc>>) -> Timestamp {
    t.map_or(0.0, |t| t.timestamp() as f64)
}

/// 00:00 UTC of the day `now` falls in.
pub fn utc_day_start(now: Timestamp) -> Timestamp {
    let t = at(now);
    stamp(
        Utc.with_ymd_and_hms(t.year(), t.month(), t.day(), 0, 0, 0)
            .single(),
    )
}

/// 00:00 UTC of the first of the month `now` falls in.
pub fn utc_month_start(now: Timestamp) -> Timestamp {
    let t = at(now);
    stamp(
        Utc.with_ymd_and_hms(t.year(), t.month(), 1, 0, 0, 0)
            .single(),
    )
}

/// 00:00 UTC of the day after the one `now` falls in.
pub fn next_utc_day(now: Timestamp) -> Timestamp {
    utc_day_start(now) + 86_400.0
}

/// 00:00 UTC of the first of the month after the one `now` falls in.
pub fn next_utc_month(now: Timestamp) -> Timestamp {
    let t = at(now);
    let (year, month) = if t.month() == 12 {
        (t.year() + 1, 1)
    } else {
        (t.year(), t.month() + 1)
    };
    stamp(Utc.with_ymd_and_hms(year, month, 1, 0, 0, 0).single())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_days_and_months() {
        // 2026-12-06 09:10:11 UTC.
        let now = 1_796_548_211.0;
        assert_eq!(utc_day_start(now), 1_796_515_200.0);
        assert_eq!(next_utc_day(now), 1_796_601_600.0);
        // 2026-12-01 and 2027-01-01.
        assert_eq!(utc_month_start(now), 1_796_083_200.0);
        assert_eq!(next_utc_month(now), 1_798_761_600.0);
    }

    #[test]
    fn totals_of_calls_saturate() {
        let call = |n| ModelCall {
            usage: Usage {
                input_tokens: n,
                output_tokens: 1,
                ..Usage::default()
            },
            ..ModelCall::default()
        };
        let total = ModelCall::total_usage(&[call(u64::MAX), call(5)]);
        assert_eq!((total.input_tokens, total.output_tokens), (u64::MAX, 2));
    }
}
