//! Spending budgets (`budget:`): whether a turn may start, and the words
//! for why not. Checked where every turn begins ([`crate::Agent::run_turn_with`]),
//! so chats, the terminal, the API server, cron and subagents all respect
//! it; the background review checks it before it starts.
//!
//! The spend is a sum over the per-call ledger's indexes (today's or this
//! month's rows of the home, or of one chat), never a scan of transcripts.

use talaria_core::config::{Config, SpendLimits};
use talaria_store::spend::{next_utc_day, next_utc_month, utc_day_start, utc_month_start};
use talaria_store::{SessionRecord, SessionStore, SpendScope, StoreError, Timestamp};

/// Whose budget it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// The home's (everything together).
    Home,
    /// One chat's, as `budget.chats` names it.
    Chat(String),
}

/// A budget period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// From 00:00 UTC today.
    Day,
    /// From the first of the month, 00:00 UTC.
    Month,
}

/// A budget that is spent.
#[derive(Debug, Clone, PartialEq)]
pub struct Exceeded {
    /// Whose.
    pub owner: Owner,
    /// Which period.
    pub period: Period,
    /// The limit, in micro-dollars.
    pub limit_micros: u64,
    /// Spent in the period so far, in micro-dollars.
    pub spent_micros: u64,
    /// When the period ends.
    pub resets_at: Timestamp,
    /// When this was checked.
    pub now: Timestamp,
}

impl Exceeded {
    /// The sentence a refused turn answers with, e.g. "The daily budget of
    /// $5.00 is spent ($5.02 today); it resets at 00:00 UTC, in 3 h 12 min."
    pub fn message(&self) -> String {
        let whose = match &self.owner {
            Owner::Home => "The",
            Owner::Chat(_) => "This chat's",
        };
        let (period, spent_when, reset) = match self.period {
            Period::Day => ("daily", "today", "at 00:00 UTC".to_owned()),
            Period::Month => (
                "monthly",
                "this month",
                format!("on {} at 00:00 UTC", day_name(self.resets_at)),
            ),
        };
        format!(
            "{whose} {period} budget of {} is spent ({} {spent_when}); it resets {reset}, in {}.",
            usd(self.limit_micros),
            usd(self.spent_micros),
            duration(self.resets_at - self.now),
        )
    }
}

/// `2027-01-01` for a time.
fn day_name(t: Timestamp) -> String {
    chrono::DateTime::from_timestamp(t as i64, 0).map_or_else(
        || "the 1st".to_owned(),
        |d| d.format("%Y-%m-%d").to_string(),
    )
}

/// Dollars as people read them: cents, or four decimals under a cent.
pub fn usd(micros: u64) -> String {
    let dollars = micros as f64 / 1_000_000.0;
    if micros == 0 || micros >= 10_000 {
        format!("${dollars:.2}")
    } else {
        format!("${dollars:.4}")
    }
}

/// A wait in words: "3 h 12 min", "2 d 5 h", "40 min", "under a minute".
pub fn duration(secs: f64) -> String {
    let mins = (secs.max(0.0) / 60.0).ceil() as u64;
    let (days, hours, minutes) = (mins / 1440, mins % 1440 / 60, mins % 60);
    match (days, hours, minutes) {
        (0, 0, 0) => "under a minute".to_owned(),
        (0, 0, m) => format!("{m} min"),
        (0, h, 0) => format!("{h} h"),
        (0, h, m) => format!("{h} h {m} min"),
        (d, 0, _) => format!("{d} d"),
        (d, h, _) => format!("{d} d {h} h"),
    }
}

/// Dollars as whole micro-dollars (a limit from `config.yaml`).
fn micros(usd: f64) -> u64 {
    if usd.is_finite() && usd > 0.0 {
        (usd * 1_000_000.0).round() as u64
    } else {
        0
    }
}

/// The spend of one scope today and this month.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Spend {
    /// Micro-dollars since 00:00 UTC.
    pub today: u64,
    /// Micro-dollars since the first of the month.
    pub month: u64,
}

/// What `scope` spent today and this month (two indexed sums; the month's
/// is skipped when `need_month` is false).
pub async fn spend(
    store: &dyn SessionStore,
    scope: &SpendScope,
    now: Timestamp,
) -> Result<Spend, StoreError> {
    Ok(Spend {
        today: store.spend_since(utc_day_start(now), scope).await?,
        month: store.spend_since(utc_month_start(now), scope).await?,
    })
}

/// The chat budget that applies to `record`, with the scope its spend is
/// summed over.
pub fn chat_limits(
    config: &Config,
    record: &SessionRecord,
) -> Option<(String, SpendLimits, SpendScope)> {
    let (name, limits) = config.budget.chat(
        record.session_key.as_deref(),
        &record.source,
        record.chat_id.as_deref(),
    )?;
    let scope = if record.session_key.as_deref() == Some(name) {
        SpendScope::SessionKey(name.to_owned())
    } else {
        SpendScope::Chat {
            platform: record.source.clone(),
            chat_id: record.chat_id.clone().unwrap_or_default(),
        }
    };
    Some((name.to_owned(), limits, scope))
}

fn over(owner: &Owner, limits: SpendLimits, spent: Spend, now: Timestamp) -> Option<Exceeded> {
    let check = |limit: Option<f64>, spent: u64, period, resets_at| {
        let limit = micros(limit?);
        (spent >= limit).then(|| Exceeded {
            owner: owner.clone(),
            period,
            limit_micros: limit,
            spent_micros: spent,
            resets_at,
            now,
        })
    };
    check(
        limits.daily_usd,
        spent.today,
        Period::Day,
        next_utc_day(now),
    )
    .or_else(|| {
        check(
            limits.monthly_usd,
            spent.month,
            Period::Month,
            next_utc_month(now),
        )
    })
}

/// The first spent budget that forbids a turn in `record`'s session now:
/// the chat's own first, then the home's. `None` when no budget is set or
/// none is spent.
pub async fn exceeded(
    config: &Config,
    store: &dyn SessionStore,
    record: &SessionRecord,
    now: Timestamp,
) -> Result<Option<Exceeded>, StoreError> {
    if !config.budget.is_set() {
        return Ok(None);
    }
    if let Some((name, limits, scope)) = chat_limits(config, record) {
        let spent = spend(store, &scope, now).await?;
        if let Some(e) = over(&Owner::Chat(name), limits, spent, now) {
            return Ok(Some(e));
        }
    }
    let home = config.budget.home();
    if home.daily_usd.is_none() && home.monthly_usd.is_none() {
        return Ok(None);
    }
    let spent = spend(store, &SpendScope::All, now).await?;
    Ok(over(&Owner::Home, home, spent, now))
}

/// Where a turn begins: `Ok` with the kind its calls are filed under
/// (`cron` for a scheduled job's session, else `turn`), or `Err` with the
/// outcome of a turn refused by a spent budget: no model is called, and
/// the user's message is stored (as a failed turn's is) so that nothing
/// is lost and `/retry` sends it once the budget resets. A store that
/// cannot answer does not block the turn: it is logged, and the turn's
/// own writes will report the trouble.
pub(crate) async fn gate(
    parts: &crate::parts::AgentParts,
    session: &crate::SessionHandle,
    user_text: &str,
    media: &[talaria_core::MediaRef],
) -> Result<&'static str, crate::TurnOutcome> {
    let session_id = session.id.as_str();
    let kind = if session.source() == "cron" {
        "cron"
    } else {
        "turn"
    };
    // Without a budget a turn costs no read here: this runs on every turn.
    if !parts.config.budget.is_set() {
        return Ok(kind);
    }
    let record = match parts.store.session(session_id).await {
        Ok(Some(record)) => record,
        Ok(None) => return Ok(kind),
        Err(e) => {
            tracing::warn!(session = %session_id, error = %e, "cannot read the session to check budgets");
            return Ok(kind);
        }
    };
    match exceeded(
        &parts.config,
        &*parts.store,
        &record,
        talaria_core::unix_now(),
    )
    .await
    {
        Ok(None) => Ok(kind),
        Ok(Some(e)) => {
            let message = e.message();
            tracing::info!(session = %session_id, source = %record.source, "turn refused: {message}");
            let row = talaria_core::Message::user_with_media(
                crate::memory_context::sanitize(user_text),
                media.to_vec(),
            );
            let new_messages = match parts.store.append_message(session_id, &row).await {
                Ok(_) => vec![row],
                Err(e) => {
                    tracing::warn!(session = %session_id, error = %e, "cannot store the refused message");
                    Vec::new()
                }
            };
            Err(crate::TurnOutcome {
                answer: message.clone(),
                exit: crate::TurnExit::Failed(message),
                new_messages,
                api_calls: 0,
                usage: talaria_core::Usage::default(),
                compressed: false,
                owed: false,
            })
        }
        Err(e) => {
            tracing::warn!(session = %session_id, error = %e, "cannot sum the spend to check budgets");
            Ok(kind)
        }
    }
}

/// `(daily budget $5.00, monthly budget $50.00)`, or nothing without one.
fn limits_words(limits: SpendLimits) -> String {
    let mut parts = Vec::new();
    if let Some(d) = limits.daily_usd {
        parts.push(format!("daily budget {}", usd(micros(d))));
    }
    if let Some(m) = limits.monthly_usd {
        parts.push(format!("monthly budget {}", usd(micros(m))));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

/// What `/usage` adds after the session's tokens: the home's spend today
/// and this month against its budgets, and the chat's when it has its own.
pub async fn spend_lines(
    config: &Config,
    store: &dyn SessionStore,
    record: &SessionRecord,
    now: Timestamp,
) -> Result<Vec<String>, StoreError> {
    let home = spend(store, &SpendScope::All, now).await?;
    let mut lines = vec![format!(
        "Spent today {}, this month {}{}.",
        usd(home.today),
        usd(home.month),
        limits_words(config.budget.home())
    )];
    if let Some((_, limits, scope)) = chat_limits(config, record) {
        let chat = spend(store, &scope, now).await?;
        lines.push(format!(
            "This chat: {} today, {} this month{}.",
            usd(chat.today),
            usd(chat.month),
            limits_words(limits)
        ));
    }
    if let Some(e) = exceeded(config, store, record, now).await? {
        lines.push(e.message());
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_names_the_budget_the_spend_and_the_reset() {
        // 2026-12-06 20:48:00 UTC: 3 h 12 min before midnight.
        let now = 1_796_590_080.0;
        let e = Exceeded {
            owner: Owner::Home,
            period: Period::Day,
            limit_micros: 5_000_000,
            spent_micros: 5_020_000,
            resets_at: next_utc_day(now),
            now,
        };
        assert_eq!(
            e.message(),
            "The daily budget of $5.00 is spent ($5.02 today); it resets at 00:00 UTC, in 3 h 12 min."
        );
        let e = Exceeded {
            owner: Owner::Chat("telegram:42".into()),
            period: Period::Month,
            limit_micros: 50_000_000,
            spent_micros: 50_000_100,
            resets_at: next_utc_month(now),
            now,
        };
        assert_eq!(
            e.message(),
            "This chat's monthly budget of $50.00 is spent ($50.00 this month); it resets on 2027-01-01 at 00:00 UTC, in 25 d 3 h."
        );
    }

    #[test]
    fn amounts_and_waits_in_words() {
        assert_eq!(usd(0), "$0.00");
        assert_eq!(usd(12_300), "$0.01");
        assert_eq!(usd(1_234), "$0.0012");
        assert_eq!(usd(5_020_000), "$5.02");
        assert_eq!(duration(30.0), "1 min");
        assert_eq!(duration(0.0), "under a minute");
        assert_eq!(duration(3600.0), "1 h");
        assert_eq!(duration(2.0 * 86_400.0 + 5.0 * 3600.0), "2 d 5 h");
    }

    #[test]
    fn a_limit_is_spent_when_reached() {
        let limits = SpendLimits {
            daily_usd: Some(1.0),
            monthly_usd: Some(10.0),
        };
        let now = 1_796_590_080.0;
        let spent = |today, month| Spend { today, month };
        assert_eq!(
            over(&Owner::Home, limits, spent(999_999, 999_999), now),
            None
        );
        let day = over(&Owner::Home, limits, spent(1_000_000, 1_000_000), now).unwrap();
        assert_eq!(day.period, Period::Day);
        let month = over(&Owner::Home, limits, spent(0, 10_000_000), now).unwrap();
        assert_eq!(month.period, Period::Month);
    }
}
