//! The figures a run produces, and how they are shown: a Markdown table
//! with each budget next to its figure, JSON for tools, and an SVG plot of
//! latency against concurrency.

use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;
use serde::Serialize;

use crate::load::quantile;

/// Everything one run measured. Times in milliseconds, sizes in bytes
/// unless the name says MB (MiB).
#[derive(Debug, Default, Serialize)]
pub struct Figures {
    pub machine: String,
    pub plan: String,
    pub cold_health_ms: f64,
    pub cold_first_answer_ms: f64,
    pub idle_rss_mb: f64,
    pub rss_after_load_mb: f64,
    pub rss_after_1k_mb: f64,
    pub rss_after_soak_mb: f64,
    /// The anonymous part of the RSS figures (heap, stacks; not the
    /// binary's mapped code and data, which the kernel can drop and share).
    pub idle_rss_anon_mb: f64,
    pub rss_after_1k_anon_mb: f64,
    pub rss_after_soak_anon_mb: f64,
    pub soak_turns: u64,
    /// The mock alone, sequential, the same client: the harness's floor.
    pub mock_sequential_p50_ms: f64,
    pub sequential: Vec<SequentialFigure>,
    pub concurrent: Vec<ConcurrencyFigure>,
    /// `write_bytes` of the gateway process per turn (8 users).
    pub disk_bytes_per_turn: f64,
    /// Growth of `state.db` plus its WAL per turn (8 users).
    pub db_growth_bytes_per_turn: f64,
    /// The model request that opens a fresh session's first turn.
    pub first_request_bytes: f64,
    pub curve: Vec<CurvePoint>,
    /// Users sending one large file each at once, through Telegram.
    pub media_burst: Option<MediaBurst>,
    /// `terminal` calls on the host and in the bubblewrap sandbox, one
    /// entry per command.
    pub terminal: Vec<TerminalFigure>,
}

/// The latency of one command run through the `terminal` tool, on the host
/// and in the sandbox, from calls alternated between the two.
#[derive(Debug, Default, Serialize)]
pub struct TerminalFigure {
    /// The command line each call ran.
    pub command: String,
    /// Calls of each kind.
    pub calls: usize,
    /// Per call on the host (the owner's local backend).
    pub local_p50_ms: f64,
    /// The 95th percentile on the host.
    pub local_p95_ms: f64,
    /// Per call in the bubblewrap sandbox (an untrusted conversation's).
    pub sandbox_p50_ms: f64,
    /// The 95th percentile in the sandbox.
    pub sandbox_p95_ms: f64,
    /// What the sandbox adds to a call: sandbox p50 − local p50.
    pub added_p50_ms: f64,
}

impl TerminalFigure {
    /// The figure of `command` from each call's latency on the host and in
    /// the sandbox (sorted in place).
    pub fn from_samples(
        command: &str,
        local: &mut [Duration],
        sandbox: &mut [Duration],
    ) -> TerminalFigure {
        let local_p50_ms = ms(quantile(local, 0.50));
        let sandbox_p50_ms = ms(quantile(sandbox, 0.50));
        TerminalFigure {
            command: command.to_owned(),
            calls: local.len().min(sandbox.len()),
            local_p50_ms,
            local_p95_ms: ms(quantile(local, 0.95)),
            sandbox_p50_ms,
            sandbox_p95_ms: ms(quantile(sandbox, 0.95)),
            added_p50_ms: sandbox_p50_ms - local_p50_ms,
        }
    }
}

/// Milliseconds, divided from whole nanoseconds so that whole
/// milliseconds come out exact (the budget's edge is judged on them).
fn ms(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e6
}

/// Many users each sending a large file at the same moment: what the
/// gateway's memory does while it streams them into the cache.
#[derive(Debug, Default, Serialize)]
pub struct MediaBurst {
    pub users: usize,
    pub file_mb: f64,
    /// RSS just before the files were sent.
    pub rss_before_mb: f64,
    /// The highest RSS seen (sampled every 10 ms) until every user had
    /// an answer.
    pub rss_peak_mb: f64,
    pub rss_anon_before_mb: f64,
    pub rss_anon_peak_mb: f64,
    /// From the first file sent to the last answer.
    pub seconds: f64,
}

/// Sequential turns of one kind.
#[derive(Debug, Default, Serialize)]
pub struct SequentialFigure {
    pub mode: String,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub first_byte_p50_ms: Option<f64>,
    /// Gateway CPU time (user + system) per turn.
    pub cpu_ms_per_turn: f64,
}

/// Closed-loop users at one concurrency.
#[derive(Debug, Default, Serialize)]
pub struct ConcurrencyFigure {
    pub users: usize,
    /// Driven without the session header: conversations that all open
    /// with the same word, each request resending its history.
    pub without_header: bool,
    pub turns_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub cpu_ms_per_turn: f64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub mock_turns_per_sec: f64,
    pub mock_p50_ms: f64,
    pub mock_p99_ms: f64,
}

/// One point of the latency curve.
#[derive(Debug, Default, Serialize)]
pub struct CurvePoint {
    pub users: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub turns_per_sec: f64,
    pub mock_p50_ms: f64,
    pub mock_p99_ms: f64,
    pub mock_turns_per_sec: f64,
}

impl Figures {
    /// Empty figures naming the machine they are measured on.
    pub fn describe_machine() -> Figures {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
            .unwrap_or_else(|| "unknown CPU".to_owned());
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned();
        Figures {
            machine: format!("{model}, {cores} cores, Linux {kernel}"),
            ..Figures::default()
        }
    }

    fn sequential(&self, mode: &str) -> Option<&SequentialFigure> {
        self.sequential.iter().find(|s| s.mode == mode)
    }

    /// The header path at `users`.
    pub fn at(&self, users: usize) -> Option<&ConcurrencyFigure> {
        self.concurrent
            .iter()
            .find(|c| c.users == users && !c.without_header)
    }

    /// The header-less load at `users`.
    fn without_header_at(&self, users: usize) -> Option<&ConcurrencyFigure> {
        self.concurrent
            .iter()
            .find(|c| c.users == users && c.without_header)
    }
}

/// A budget line: what is measured, the figure, the budget, met or not.
struct Check {
    what: &'static str,
    figure: String,
    budget: &'static str,
    met: bool,
}

fn checks(f: &Figures) -> Vec<Check> {
    let mut out = Vec::new();
    let mut push = |what, figure: String, budget, met| {
        out.push(Check {
            what,
            figure,
            budget,
            met,
        })
    };
    if let Some(s) = f.sequential("whole answer") {
        push(
            "gateway CPU per sequential turn",
            format!("{:.3} ms", s.cpu_ms_per_turn),
            "≤ 1 ms",
            s.cpu_ms_per_turn <= 1.0,
        );
        let overhead = s.p50_ms - f.mock_sequential_p50_ms;
        push(
            "overhead per sequential turn, p50 (turn − mock alone)",
            format!("{overhead:.3} ms"),
            "≤ 1 ms",
            overhead <= 1.0,
        );
    }
    if let Some(c) = f.at(32) {
        push(
            "throughput at 32 users",
            format!("{:.0} turns/s, {} errors", c.turns_per_sec, c.errors),
            "≥ 2,000 turns/s, 0 errors",
            c.turns_per_sec >= 2000.0 && c.errors == 0,
        );
        push(
            "p99 at 32 users",
            format!("{:.2} ms", c.p99_ms),
            "≤ 50 ms",
            c.p99_ms <= 50.0,
        );
    }
    if let (Some(h), Some(c)) = (f.at(32), f.without_header_at(32)) {
        push(
            "throughput at 32 users without the session header (same opening)",
            format!(
                "{:.0} turns/s ({:.0}% of the header path), {} errors",
                c.turns_per_sec,
                100.0 * c.turns_per_sec / h.turns_per_sec.max(1e-9),
                c.errors
            ),
            "≥ the header path, 0 errors",
            c.turns_per_sec >= h.turns_per_sec && c.errors == 0,
        );
    }
    if let Some(m) = &f.media_burst {
        let growth = m.rss_anon_peak_mb - m.rss_anon_before_mb;
        let per_user = growth / (m.users.max(1) as f64);
        push(
            "memory growth while users each send a large file at once (32 × 10 MB in the full run)",
            format!(
                "{growth:.1} MB anonymous at the peak, {per_user:.2} MB per user ({:.0} MB of files)",
                m.users as f64 * m.file_mb
            ),
            "≤ 2 MB per user: streamed, never a whole file",
            per_user <= 2.0 && per_user < m.file_mb,
        );
    }
    if !f.terminal.is_empty() {
        let added: Vec<String> = f
            .terminal
            .iter()
            .map(|t| format!("`{}` {:.2} ms", t.command, t.added_p50_ms))
            .collect();
        push(
            "added latency of a sandboxed terminal call (sandbox p50 − local p50)",
            added.join(", "),
            "< 20 ms",
            f.terminal.iter().all(|t| t.added_p50_ms < 20.0),
        );
    }
    push(
        "launch to /health",
        format!("{:.1} ms", f.cold_health_ms),
        "≤ 50 ms",
        f.cold_health_ms <= 50.0,
    );
    push(
        "launch to first answer",
        format!("{:.1} ms", f.cold_first_answer_ms),
        "≤ 100 ms",
        f.cold_first_answer_ms <= 100.0,
    );
    push(
        "idle RSS",
        format!("{:.1} MB", f.idle_rss_mb),
        "≤ 15 MB",
        f.idle_rss_mb <= 15.0,
    );
    let growth = f.rss_after_soak_mb - f.rss_after_1k_mb;
    push(
        "RSS growth from 1,000 turns to the end of the soak",
        format!(
            "{growth:+.1} MB ({:.1} → {:.1} MB over {} turns)",
            f.rss_after_1k_mb, f.rss_after_soak_mb, f.soak_turns
        ),
        "≤ 10 MB",
        growth <= 10.0,
    );
    push(
        "disk written per turn (8 users)",
        format!("{:.1} kB", f.disk_bytes_per_turn / 1000.0),
        "≤ 20 kB",
        f.disk_bytes_per_turn <= 20_000.0,
    );
    push(
        "first model request for a one-line message",
        format!("{:.1} kB", f.first_request_bytes / 1000.0),
        "≤ 20 kB",
        f.first_request_bytes <= 20_000.0,
    );
    out
}

/// The results as Markdown: the budget table, then every figure.
pub fn markdown(f: &Figures) -> String {
    let mut s = String::new();
    s.push_str(&format!("Machine: {}\n\n", f.machine));
    s.push_str("| Budget | Figure | Target | Met |\n|---|---|---|---|\n");
    for c in checks(f) {
        s.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            c.what,
            c.figure,
            c.budget,
            if c.met { "yes" } else { "**no**" }
        ));
    }
    s.push_str("\n| Sequential turns | p50 | p99 | first byte p50 | gateway CPU/turn |\n");
    s.push_str("|---|---|---|---|---|\n");
    s.push_str(&format!(
        "| mock alone (same client) | {:.3} ms | | | |\n",
        f.mock_sequential_p50_ms
    ));
    for q in &f.sequential {
        s.push_str(&format!(
            "| {} | {:.3} ms | {:.3} ms | {} | {:.3} ms |\n",
            q.mode,
            q.p50_ms,
            q.p99_ms,
            q.first_byte_p50_ms
                .map(|v| format!("{v:.3} ms"))
                .unwrap_or_default(),
            q.cpu_ms_per_turn
        ));
    }
    s.push('\n');
    s.push_str(&concurrency_table(&f.concurrent));
    if !f.terminal.is_empty() {
        s.push_str(
            "\n| Terminal call | calls | local p50 | local p95 | sandbox p50 | sandbox p95 | added (p50) |\n",
        );
        s.push_str("|---|---|---|---|---|---|---|\n");
        for t in &f.terminal {
            s.push_str(&format!(
                "| `{}` | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |\n",
                t.command,
                t.calls,
                t.local_p50_ms,
                t.local_p95_ms,
                t.sandbox_p50_ms,
                t.sandbox_p95_ms,
                t.added_p50_ms
            ));
        }
    }
    s.push_str(&format!(
        "\nCold start: {:.1} ms to /health, {:.1} ms to the first answer. \
         RSS: {:.1} MB idle, {:.1} MB after the load, {:.1} MB after 1,000 soak turns, \
         {:.1} MB after {}. Disk: {:.1} kB written per turn; state.db and WAL grew \
         {:.1} kB per turn. First model request: {:.1} kB.\n",
        f.cold_health_ms,
        f.cold_first_answer_ms,
        f.idle_rss_mb,
        f.rss_after_load_mb,
        f.rss_after_1k_mb,
        f.rss_after_soak_mb,
        f.soak_turns,
        f.disk_bytes_per_turn / 1000.0,
        f.db_growth_bytes_per_turn / 1000.0,
        f.first_request_bytes / 1000.0
    ));
    s.push_str(&format!(
        "Anonymous memory (RssAnon): {:.1} MB idle, {:.1} MB after 1,000 soak turns, \
         {:.1} MB after {}.\n",
        f.idle_rss_anon_mb, f.rss_after_1k_anon_mb, f.rss_after_soak_anon_mb, f.soak_turns,
    ));
    if let Some(m) = &f.media_burst {
        s.push_str(&format!(
            "Media burst: {} users each sent a {:.0} MB file at once through Telegram; RSS \
             {:.1} MB before, {:.1} MB at the peak (anonymous {:.1} → {:.1} MB); every user \
             answered within {:.1} s.\n",
            m.users,
            m.file_mb,
            m.rss_before_mb,
            m.rss_peak_mb,
            m.rss_anon_before_mb,
            m.rss_anon_peak_mb,
            m.seconds
        ));
    }
    s
}

/// What `talaria-bench pages` measured: the dashboard's pages and the API
/// routes behind them on a large store (issue 27). Times in milliseconds.
#[derive(Debug, Default, Serialize)]
pub struct PagesFigures {
    /// The CPU, cores and kernel.
    pub machine: String,
    /// The amounts of the run.
    pub plan: String,
    /// The goal each page and route is judged against, on its p95.
    pub goal_ms: f64,
    /// Sessions in the store (the long transcript included).
    pub sessions: usize,
    /// Transcript rows in the store.
    pub messages: usize,
    /// How long seeding took, through the store's API.
    pub seed_seconds: f64,
    /// `state.db` and its WAL after seeding, in MiB.
    pub db_mb: f64,
    /// Launch of the gateway on the seeded home to `/health` answering.
    pub launch_to_health_ms: f64,
    /// Whether the build serves the dashboard (its login is not 404).
    pub dashboard: bool,
    /// Every route, in the order measured.
    pub routes: Vec<RouteFigure>,
}

/// What a measured route is.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteKind {
    /// `GET /health`: the same run's floor, not judged.
    #[default]
    Baseline,
    /// A dashboard page (HTML, behind the login cookie).
    Page,
    /// An API route a page calls (JSON, behind the key).
    Api,
}

/// Sequential requests of one route.
#[derive(Debug, Default, Serialize)]
pub struct RouteFigure {
    /// What the route shows.
    pub name: String,
    /// The path and query requested.
    pub path: String,
    /// Page, API route or the floor.
    pub kind: RouteKind,
    /// Requests measured (after the warm-up).
    pub requests: usize,
    /// Client latency to the last byte, median.
    pub p50_ms: f64,
    /// The 95th percentile, which the goal is judged on.
    pub p95_ms: f64,
    /// The slowest request.
    pub max_ms: f64,
    /// Size of the last body, in bytes.
    pub body_bytes: usize,
    /// Gateway CPU time (user + system) per request.
    pub cpu_ms_per_request: f64,
    /// Whether the p95 is under the goal; `None` for the floor.
    pub under_goal: Option<bool>,
}

impl RouteFigure {
    /// The figure of a route from each request's latency (sorted in
    /// place), judged against the goal of [`crate::pages::GOAL_MS`].
    pub fn from_samples(
        name: &str,
        path: &str,
        kind: RouteKind,
        latencies: &mut [Duration],
        body_bytes: usize,
        cpu_ms_per_request: f64,
    ) -> RouteFigure {
        let p95_ms = ms(quantile(latencies, 0.95));
        RouteFigure {
            name: name.to_owned(),
            path: path.to_owned(),
            kind,
            requests: latencies.len(),
            p50_ms: ms(quantile(latencies, 0.50)),
            p95_ms,
            max_ms: ms(quantile(latencies, 1.0)),
            body_bytes,
            cpu_ms_per_request,
            under_goal: (kind != RouteKind::Baseline).then_some(p95_ms < crate::pages::GOAL_MS),
        }
    }
}

/// The pages run as Markdown: the store, then a row per route with its
/// verdict against the goal.
pub fn pages_markdown(f: &PagesFigures) -> String {
    let mut s = String::new();
    s.push_str(&format!("Machine: {}\n\n", f.machine));
    s.push_str(&format!(
        "Store: {} sessions, {} messages; state.db and WAL {:.1} MB, seeded in {:.1} s \
         through the store's API. Launch on it to /health: {:.1} ms.\n\n",
        thousands(f.sessions),
        thousands(f.messages),
        f.db_mb,
        f.seed_seconds,
        f.launch_to_health_ms
    ));
    if !f.dashboard {
        s.push_str(
            "This build serves no dashboard (`POST /ui/login` answered 404): \
             the API routes behind the pages only.\n\n",
        );
    }
    s.push_str(&format!(
        "| Route | Request | p50 | p95 | max | body | gateway CPU/request | p95 < {:.0} ms |\n",
        f.goal_ms
    ));
    s.push_str("|---|---|---|---|---|---|---|---|\n");
    for r in &f.routes {
        let verdict = match r.under_goal {
            None => "(floor)",
            Some(true) => "yes",
            Some(false) => "**no**",
        };
        s.push_str(&format!(
            "| {} | `GET {}` | {:.2} ms | {:.2} ms | {:.2} ms | {:.1} kB | {:.2} ms | {} |\n",
            r.name,
            r.path,
            r.p50_ms,
            r.p95_ms,
            r.max_ms,
            r.body_bytes as f64 / 1000.0,
            r.cpu_ms_per_request,
            verdict
        ));
    }
    s
}

/// `100000` as `100,000`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Latency (p50 and p99) against concurrent users, Talaria and the mock
/// alone, on log-scaled axes.
pub fn plot(f: &Figures, path: &Path) -> anyhow::Result<()> {
    if f.curve.is_empty() {
        return Ok(());
    }
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let max_users = f.curve.iter().map(|p| p.users).max().unwrap_or(1) as f64;
    let (lo, hi) = f
        .curve
        .iter()
        .flat_map(|p| [p.p50_ms, p.p99_ms, p.mock_p50_ms, p.mock_p99_ms])
        .filter(|v| *v > 0.0)
        .fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Turn latency against concurrent users (instant mock LLM)",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (1.0..max_users * 1.2).log_scale(),
            (lo.max(0.001) * 0.8..hi * 1.25).log_scale(),
        )
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("concurrent users")
        .y_desc("latency (ms)")
        .draw()
        .map_err(draw_error)?;
    let series: [Series; 4] = [
        ("Talaria p50", BLUE, |p| p.p50_ms),
        ("Talaria p99", RED, |p| p.p99_ms),
        ("mock alone p50", GREEN, |p| p.mock_p50_ms),
        ("mock alone p99", MAGENTA, |p| p.mock_p99_ms),
    ];
    for (name, color, value) in series {
        let points: Vec<(f64, f64)> = f
            .curve
            .iter()
            .map(|p| (p.users as f64, value(p).max(0.001)))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(draw_error)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )
            .map_err(draw_error)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(draw_error)?;
    root.present().map_err(draw_error)?;
    Ok(())
}

/// A plotted line: its label, colour and the value it takes from a point.
type Series = (&'static str, RGBColor, fn(&CurvePoint) -> f64);

fn draw_error(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("cannot draw the plot: {e}")
}

/// The concurrent runs as a Markdown table.
fn concurrency_table(concurrent: &[ConcurrencyFigure]) -> String {
    let mut s = String::new();
    s.push_str(
        "| Users | turns/s | p50 | p99 | CPU/turn | errors | mock alone turns/s | mock p50 | mock p99 | share of mock |\n",
    );
    s.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
    for c in concurrent {
        let users = if c.without_header {
            format!("{} (no header)", c.users)
        } else {
            c.users.to_string()
        };
        s.push_str(&format!(
            "| {} | {:.0} | {:.2} ms | {:.2} ms | {:.3} ms | {} | {:.0} | {:.2} ms | {:.2} ms | {:.0}% |\n",
            users,
            c.turns_per_sec,
            c.p50_ms,
            c.p99_ms,
            c.cpu_ms_per_turn,
            c.errors,
            c.mock_turns_per_sec,
            c.mock_p50_ms,
            c.mock_p99_ms,
            100.0 * c.turns_per_sec / c.mock_turns_per_sec.max(1e-9)
        ));
    }
    s
}

/// The paired comparison alone (`talaria-bench headerless`): both loads
/// and the header-less budget.
pub fn headerless_markdown(concurrent: &[ConcurrencyFigure]) -> String {
    let mut s = concurrency_table(concurrent);
    let header = concurrent.iter().find(|c| !c.without_header);
    let without = concurrent.iter().find(|c| c.without_header);
    if let (Some(h), Some(c)) = (header, without) {
        let met = c.turns_per_sec >= h.turns_per_sec && c.errors == 0;
        s.push_str(&format!(
            "\nWithout the header: {:.0}% of the header path's throughput, {:.0}% of its CPU per turn ({}).\n",
            100.0 * c.turns_per_sec / h.turns_per_sec.max(1e-9),
            100.0 * c.cpu_ms_per_turn / h.cpu_ms_per_turn.max(1e-9),
            if met { "budget met" } else { "budget **not** met" }
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_are_judged_from_the_figures() {
        let mut f = Figures {
            cold_health_ms: 12.0,
            cold_first_answer_ms: 140.0,
            idle_rss_mb: 9.0,
            ..Figures::default()
        };
        f.concurrent.push(ConcurrencyFigure {
            users: 32,
            turns_per_sec: 2500.0,
            p99_ms: 60.0,
            ..ConcurrencyFigure::default()
        });
        let c = checks(&f);
        let met = |what: &str| c.iter().find(|c| c.what == what).map(|c| c.met);
        assert_eq!(met("launch to /health"), Some(true));
        assert_eq!(met("launch to first answer"), Some(false));
        assert_eq!(met("throughput at 32 users"), Some(true));
        assert_eq!(met("p99 at 32 users"), Some(false));
        let headerless = "throughput at 32 users without the session header (same opening)";
        assert_eq!(met(headerless), None);
        f.concurrent.push(ConcurrencyFigure {
            users: 32,
            without_header: true,
            turns_per_sec: 2400.0,
            ..ConcurrencyFigure::default()
        });
        let c = checks(&f);
        let met = |what: &str| c.iter().find(|c| c.what == what).map(|c| c.met);
        // Judged against the header path, not the absolute budget.
        assert_eq!(met(headerless), Some(false));
        assert_eq!(met("throughput at 32 users"), Some(true));
        assert!(markdown(&f).contains("| 32 (no header) | 2400 |"));
        assert!(markdown(&f).contains("| p99 at 32 users | 60.00 ms | ≤ 50 ms | **no** |"));
    }

    #[test]
    fn the_sandbox_budget_is_judged_on_the_added_p50_of_every_command() {
        let ms = Duration::from_millis;
        // Host calls of 2..=21 ms, sandbox calls 10 ms slower each: the
        // p50s are the 10th of 20 (11 and 21 ms), the p95s the 19th.
        let mut local: Vec<Duration> = (2..=21).rev().map(ms).collect();
        let mut sandbox: Vec<Duration> = (12..=31).map(ms).collect();
        let t = TerminalFigure::from_samples("true", &mut local, &mut sandbox);
        assert_eq!(t.calls, 20);
        assert_eq!(
            (
                t.local_p50_ms,
                t.local_p95_ms,
                t.sandbox_p50_ms,
                t.sandbox_p95_ms
            ),
            (11.0, 20.0, 21.0, 30.0)
        );
        assert_eq!(t.added_p50_ms, 10.0);

        let what = "added latency of a sandboxed terminal call (sandbox p50 − local p50)";
        let mut f = Figures::default();
        let met = |f: &Figures| {
            checks(f)
                .into_iter()
                .find(|c| c.what == what)
                .map(|c| c.met)
        };
        // No terminal phase, no line.
        assert_eq!(met(&f), None);
        f.terminal.push(t);
        assert_eq!(met(&f), Some(true));
        // One command over the budget fails the line, whatever the others.
        f.terminal.push(TerminalFigure::from_samples(
            "echo talaria-bench",
            &mut [ms(5)],
            &mut [ms(45)],
        ));
        assert_eq!(met(&f), Some(false));
        // 20 ms exactly is not under 20 ms.
        f.terminal.pop();
        f.terminal.push(TerminalFigure::from_samples(
            "echo talaria-bench",
            &mut [ms(5)],
            &mut [ms(25)],
        ));
        assert_eq!(met(&f), Some(false));
        let md = markdown(&f);
        assert!(
            md.contains(
                "| added latency of a sandboxed terminal call (sandbox p50 − local p50) | \
                 `true` 10.00 ms, `echo talaria-bench` 20.00 ms | < 20 ms | **no** |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| `true` | 20 | 11.00 ms | 20.00 ms | 21.00 ms | 30.00 ms | 10.00 ms |"),
            "{md}"
        );
    }

    #[test]
    fn routes_are_judged_on_their_p95_and_the_floor_is_not() {
        let ms = Duration::from_millis;
        // 19 fast requests and one slow: the p95 is the 19th of 20.
        let mut fast: Vec<Duration> = (1..=19).map(ms).chain([ms(400)]).collect();
        let page = RouteFigure::from_samples(
            "overview page",
            "/ui/",
            RouteKind::Page,
            &mut fast,
            12_345,
            1.5,
        );
        assert_eq!((page.p50_ms, page.p95_ms, page.max_ms), (10.0, 19.0, 400.0));
        assert_eq!(page.under_goal, Some(true));
        let mut slow: Vec<Duration> = (0..20).map(|_| ms(100)).collect();
        let api = RouteFigure::from_samples("a", "/api/x", RouteKind::Api, &mut slow, 10, 0.1);
        // 100 ms exactly is not under 100 ms.
        assert_eq!(api.under_goal, Some(false));
        let floor = RouteFigure::from_samples(
            "floor",
            "/health",
            RouteKind::Baseline,
            &mut [ms(1)],
            2,
            0.0,
        );
        assert_eq!(floor.under_goal, None);

        let f = PagesFigures {
            goal_ms: 100.0,
            sessions: 100_001,
            messages: 400_404,
            routes: vec![floor, page, api],
            ..PagesFigures::default()
        };
        let md = pages_markdown(&f);
        assert!(md.contains("100,001 sessions, 400,404 messages"), "{md}");
        assert!(md.contains("serves no dashboard"), "{md}");
        assert!(
            md.contains(
                "| overview page | `GET /ui/` | 10.00 ms | 19.00 ms | 400.00 ms | 12.3 kB | 1.50 ms | yes |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| `GET /api/x` |") && md.contains("| **no** |"),
            "{md}"
        );
        assert!(md.contains("| (floor) |"), "{md}");
        let json = serde_json::to_value(&f).unwrap();
        assert_eq!(json["routes"][1]["kind"], "page");
        assert_eq!(json["routes"][0]["under_goal"], serde_json::Value::Null);
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(2_001), "2,001");
        assert_eq!(thousands(100_000), "100,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn the_plot_is_an_svg_with_every_series() {
        let mut f = Figures::default();
        for (users, base) in [(1usize, 0.3f64), (8, 0.9), (32, 3.0)] {
            f.curve.push(CurvePoint {
                users,
                p50_ms: base,
                p99_ms: base * 3.0,
                mock_p50_ms: base / 3.0,
                mock_p99_ms: base,
                ..CurvePoint::default()
            });
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("latency.svg");
        plot(&f, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(100)]);
        for label in [
            "Talaria p50",
            "Talaria p99",
            "mock alone p50",
            "mock alone p99",
        ] {
            assert!(svg.contains(label), "{label}");
        }
    }
}
