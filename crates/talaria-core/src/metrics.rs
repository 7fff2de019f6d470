//! The numbers a monitoring system scrapes from a running gateway, named
//! once here so every crate records them under the same names and labels.
//!
//! Recording goes through the `metrics` facade: where no recorder is
//! installed (the CLI's one-shot commands, tests of a single crate) every
//! call is a no-op costing a load and a branch. `talaria gateway run`
//! installs the Prometheus recorder and the API server renders it at
//! `/metrics`.
//!
//! Labels are bounded by configuration, never by traffic: platforms, model
//! names, tool names, states and outcomes, no chat or user ids.

use std::time::Duration;

/// Turns finished, by platform and outcome (`ok`, `error`, `interrupted`).
pub const TURNS: &str = "talaria_turns_total";
/// How long turns took, from the message taken to the answer ready.
pub const TURN_SECONDS: &str = "talaria_turn_duration_seconds";
/// Calls to a model, by model and outcome (`ok`, `error`).
pub const MODEL_CALLS: &str = "talaria_model_calls_total";
/// Tokens, by model and kind (`input`, `output`).
pub const TOKENS: &str = "talaria_tokens_total";
/// What the calls cost, by model, in millionths of a US dollar (counters
/// are whole numbers).
pub const COST: &str = "talaria_cost_micro_usd_total";
/// Tool calls, by tool.
pub const TOOL_CALLS: &str = "talaria_tool_calls_total";
/// Tool calls that failed, by tool.
pub const TOOL_ERRORS: &str = "talaria_tool_errors_total";
/// Rows of the delivery ledger, by state (read when scraped).
pub const LEDGER_ROWS: &str = "talaria_ledger_rows";
/// 1 while a platform's connector is connected and receiving, else 0.
pub const ADAPTER_CONNECTED: &str = "talaria_adapter_connected";
/// Times a platform's connector failed and was started again.
pub const ADAPTER_RECONNECTS: &str = "talaria_adapter_reconnects_total";
/// Inbound messages dropped because they had been taken before (a
/// platform re-delivering, a webhook retried).
pub const DUPLICATES: &str = "talaria_inbound_duplicates_total";
/// Messages waiting behind a busy conversation's running turn.
pub const BUSY_QUEUED: &str = "talaria_busy_queue_depth";
/// Cron job runs, by outcome (`ok`, `silent`, `error`, `missed`).
pub const CRON_RUNS: &str = "talaria_cron_runs_total";
/// Leases this node holds in the store, by kind (`connector`: the
/// platform credentials it runs); set with the status file.
pub const NODE_LEASES: &str = "talaria_node_leases";

/// The buckets of [`TURN_SECONDS`]: a chat answer takes seconds, a turn
/// with tools minutes.
pub const TURN_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// A turn finished.
pub fn turn_finished(platform: &str, outcome: &'static str, took: Duration) {
    metrics::counter!(TURNS, "platform" => platform.to_owned(), "outcome" => outcome).increment(1);
    metrics::histogram!(TURN_SECONDS, "platform" => platform.to_owned()).record(took.as_secs_f64());
}

/// A model answered: its tokens and cost.
pub fn model_answered(model: &str, input_tokens: u64, output_tokens: u64, cost_micros: u64) {
    metrics::counter!(MODEL_CALLS, "model" => model.to_owned(), "outcome" => "ok").increment(1);
    metrics::counter!(TOKENS, "model" => model.to_owned(), "kind" => "input")
        .increment(input_tokens);
    metrics::counter!(TOKENS, "model" => model.to_owned(), "kind" => "output")
        .increment(output_tokens);
    metrics::counter!(COST, "model" => model.to_owned()).increment(cost_micros);
}

/// A model call failed (after its retries and fallbacks).
pub fn model_failed(model: &str) {
    metrics::counter!(MODEL_CALLS, "model" => model.to_owned(), "outcome" => "error").increment(1);
}

/// A tool call finished.
pub fn tool_finished(tool: &str, ok: bool) {
    metrics::counter!(TOOL_CALLS, "tool" => tool.to_owned()).increment(1);
    if !ok {
        metrics::counter!(TOOL_ERRORS, "tool" => tool.to_owned()).increment(1);
    }
}

/// A platform's connector is connected (or not) now.
pub fn adapter_connected(platform: &str, connected: bool) {
    metrics::gauge!(ADAPTER_CONNECTED, "platform" => platform.to_owned()).set(if connected {
        1.0
    } else {
        0.0
    });
}

/// A platform's connector failed and will be started again.
pub fn adapter_reconnect(platform: &str) {
    metrics::counter!(ADAPTER_RECONNECTS, "platform" => platform.to_owned()).increment(1);
}

/// An inbound message was dropped as taken before.
pub fn duplicate_dropped(platform: &str) {
    metrics::counter!(DUPLICATES, "platform" => platform.to_owned()).increment(1);
}

/// `waiting` messages wait behind busy conversations now (set when the
/// gateway writes its status).
pub fn busy_queued(waiting: usize) {
    metrics::gauge!(BUSY_QUEUED).set(waiting as f64);
}

/// A cron job ran.
pub fn cron_ran(outcome: &'static str) {
    metrics::counter!(CRON_RUNS, "outcome" => outcome).increment(1);
}

/// The ledger holds `rows` rows in `state` (set when scraped).
pub fn ledger_rows(state: &str, rows: u64) {
    metrics::gauge!(LEDGER_ROWS, "state" => state.to_owned()).set(rows as f64);
}

/// This node holds `leases` leases of `kind` (set when scraped).
pub fn node_leases(kind: &'static str, leases: usize) {
    metrics::gauge!(NODE_LEASES, "kind" => kind).set(leases as f64);
}

/// Gives every metric its `# HELP` line; called once, by whoever installs
/// the recorder.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(TURNS, "Turns finished, by platform and outcome.");
    describe_histogram!(
        TURN_SECONDS,
        Unit::Seconds,
        "How long turns took, from the message taken to the answer ready."
    );
    describe_counter!(MODEL_CALLS, "Model calls, by model and outcome.");
    describe_counter!(TOKENS, "Tokens used, by model and kind (input, output).");
    describe_counter!(
        COST,
        "What the model calls cost, by model, in millionths of a US dollar."
    );
    describe_counter!(TOOL_CALLS, "Tool calls, by tool.");
    describe_counter!(TOOL_ERRORS, "Tool calls that failed, by tool.");
    describe_gauge!(LEDGER_ROWS, "Rows of the delivery ledger, by state.");
    describe_gauge!(
        ADAPTER_CONNECTED,
        "1 while a platform's connector is connected and receiving."
    );
    describe_counter!(
        ADAPTER_RECONNECTS,
        "Times a platform's connector failed and was started again."
    );
    describe_counter!(
        DUPLICATES,
        "Inbound messages dropped because they had been taken before."
    );
    describe_gauge!(
        BUSY_QUEUED,
        "Messages waiting behind a busy conversation's running turn."
    );
    describe_counter!(CRON_RUNS, "Cron job runs, by outcome.");
    describe_gauge!(
        NODE_LEASES,
        "Leases this node holds in the shared store, by kind."
    );
}
