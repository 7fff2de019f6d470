//! `talaria insights`: tokens, cost, turns and tool calls over the last
//! days, in total and by day, model, platform and chat, from the per-call
//! ledger (sums taken by the store, so the report costs the same however
//! long the history).

use std::process::ExitCode;

use talaria_store::spend::utc_day_start;
use talaria_store::{UsageGroup, UsageReport, UsageTotals};

use crate::runtime::Runtime;

/// Most models, platforms and chats listed (the costliest); days are all
/// listed.
const TOP: usize = 20;

/// `--days` accepted: a decade is more than any ledger holds.
const MAX_DAYS: u32 = 3650;

/// Prints the report for the last `days` days (today included, UTC), as
/// tables or as JSON.
pub async fn run(rt: &Runtime, days: u32, json: bool) -> anyhow::Result<ExitCode> {
    if days == 0 || days > MAX_DAYS {
        anyhow::bail!("--days must be from 1 to {MAX_DAYS}");
    }
    let now = talaria_core::unix_now();
    let since = utc_day_start(now) - f64::from(days - 1) * 86_400.0;
    let report = rt.store.usage_report(since, TOP).await?;
    if json {
        let value = serde_json::json!({
            "days": days,
            "since": since,
            "report": report,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{}", render(&report, days));
    }
    Ok(ExitCode::SUCCESS)
}

/// Dollars with four decimals: a report sums many small calls.
fn dollars(micros: u64) -> String {
    format!("${:.4}", micros as f64 / 1_000_000.0)
}

fn row(name: &str, t: &UsageTotals) -> Vec<String> {
    vec![
        name.to_owned(),
        t.turns.to_string(),
        t.calls.to_string(),
        t.tool_calls.to_string(),
        t.input_tokens.to_string(),
        t.output_tokens.to_string(),
        t.cache_read_tokens.to_string(),
        t.cache_write_tokens.to_string(),
        dollars(t.cost_micros),
    ]
}

fn table(title: &str, groups: &[UsageGroup]) -> String {
    let mut rows = vec![
        [
            title, "TURNS", "CALLS", "TOOLS", "IN", "OUT", "CACHE R", "CACHE W", "COST",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    rows.extend(groups.iter().map(|g| row(&g.name, &g.totals)));
    crate::columns(&rows)
}

/// The report as text: a summary line, then a table per grouping.
fn render(report: &UsageReport, days: u32) -> String {
    let t = &report.total;
    let span = if days == 1 {
        "today (UTC)".to_owned()
    } else {
        format!("the last {days} days (UTC)")
    };
    if t.calls == 0 {
        return format!("No model calls in {span}.\n");
    }
    let mut out = format!(
        "In {span}: {} turns, {} model calls, {} tool calls; {} tokens in, {} out, {} read from cache, {} written to cache; cost {}.\n",
        t.turns,
        t.calls,
        t.tool_calls,
        t.input_tokens,
        t.output_tokens,
        t.cache_read_tokens,
        t.cache_write_tokens,
        dollars(t.cost_micros)
    );
    for (title, groups) in [
        ("DAY", &report.by_day),
        ("MODEL", &report.by_model),
        ("PLATFORM", &report.by_platform),
        ("CHAT", &report.by_chat),
    ] {
        out.push('\n');
        out.push_str(&table(title, groups));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_ledger_says_so() {
        assert_eq!(
            render(&UsageReport::default(), 30),
            "No model calls in the last 30 days (UTC).\n"
        );
    }

    #[test]
    fn tables_line_up_with_figures() {
        let totals = UsageTotals {
            calls: 3,
            turns: 2,
            tool_calls: 1,
            input_tokens: 1200,
            output_tokens: 300,
            cost_micros: 12_345,
            ..UsageTotals::default()
        };
        let group = |name: &str| UsageGroup {
            name: name.to_owned(),
            totals,
        };
        let report = UsageReport {
            total: totals,
            by_day: vec![group("2026-12-06")],
            by_model: vec![group("gpt-4o-mini")],
            by_platform: vec![group("cli")],
            by_chat: vec![group("cli")],
        };
        let text = render(&report, 1);
        assert!(
            text.starts_with(
                "In today (UTC): 2 turns, 3 model calls, 1 tool calls; 1200 tokens in, 300 out"
            ),
            "{text}"
        );
        assert!(text.contains("cost $0.0123."), "{text}");
        assert!(
            text.contains("gpt-4o-mini  2      3      1      1200  300  0        0        $0.0123"),
            "{text}"
        );
    }
}
