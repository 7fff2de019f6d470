//! `talaria-bench`: Talaria's end-to-end load benchmark.
//!
//! Starts an instant mock LLM ([`mock`]) and `talaria gateway run` with
//! only the API server, pointed at it, then measures cold start, memory,
//! sequential and concurrent turns, disk writes and request sizes, with
//! the mock alone under the same client as the ceiling; then the latency
//! the bubblewrap sandbox adds to the agent's `terminal` calls. Everything
//! runs on 127.0.0.1. `docs/PERFORMANCE.md` describes the method and the figures.
//!
//! `talaria-bench pages` is a second benchmark: the dashboard's pages and
//! the API routes behind them on a store of 100,000 sessions ([`pages`]).
//!
//! # Layout
//!
//! - [`mock`]: the OpenAI-compatible model that answers at once.
//! - [`gateway`]: the process under test and its `/proc` counters.
//! - [`load`]: the closed-loop client and percentiles.
//! - [`terminal`]: `terminal` calls on the host against the sandbox.
//! - [`pages`]: a seeded store, and page loads against it.
//! - [`report`]: the figures, as Markdown, JSON and an SVG plot.
#![forbid(unsafe_code)]

mod gateway;
mod load;
mod mock;
mod pages;
mod report;
mod terminal;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};

use gateway::{API_KEY, Gateway};
use load::{Mode, Stop, Target, latency_percentiles, median};
use report::{ConcurrencyFigure, CurvePoint, Figures, SequentialFigure};

/// Talaria's end-to-end load benchmark (see docs/PERFORMANCE.md).
#[derive(Debug, Parser)]
#[command(name = "talaria-bench")]
struct Args {
    /// Another benchmark than the load benchmark.
    #[command(subcommand)]
    command: Option<Bench>,
    /// A few seconds in all, to check that everything works (CI).
    #[arg(long, global = true)]
    quick: bool,
    /// Repeats of each measurement; the median is reported.
    #[arg(long, global = true)]
    repeats: Option<usize>,
    /// Seconds of each concurrent run at 8 and 32 users.
    #[arg(long, global = true)]
    duration: Option<u64>,
    /// Sequential turns per mode and repeat.
    #[arg(long)]
    turns: Option<u64>,
    /// Turns of the disk-write measurement at 8 users.
    #[arg(long)]
    disk_turns: Option<u64>,
    /// Turns of the memory soak (RSS after 1,000 turns against after this).
    #[arg(long)]
    soak_turns: Option<u64>,
    /// `terminal` calls per command on the host, and as many in the
    /// bubblewrap sandbox.
    #[arg(long)]
    terminal_calls: Option<usize>,
    /// The `talaria` binary; by default the one built next to this program
    /// (built first when run through `cargo run`).
    #[arg(long, global = true)]
    talaria: Option<PathBuf>,
    /// Where results.md, results.json and latency.svg are written
    /// (`pages`: pages.md and pages.json).
    #[arg(long, default_value = "target/talaria-bench", global = true)]
    out: PathBuf,
}

/// The benchmarks besides the load benchmark.
#[derive(Debug, Subcommand)]
enum Bench {
    /// The dashboard's pages and the API routes behind them, on a store
    /// seeded with 100,000 sessions (2,000 with --quick).
    Pages {
        /// Sessions to seed (the long transcript comes on top).
        #[arg(long)]
        sessions: Option<usize>,
        /// Requests measured per route (after a warm-up).
        #[arg(long)]
        requests: Option<usize>,
    },
    /// Only the API server at 32 users with the session header and
    /// without it, in turn, as the full benchmark compares them
    /// (`--repeats`, `--duration`).
    Headerless,
}

/// How much of everything a run does.
#[derive(Debug, Clone, Copy)]
struct Plan {
    repeats: usize,
    cold_starts: usize,
    sequential_turns: u64,
    concurrent: Duration,
    curve_levels: &'static [usize],
    curve_duration: Duration,
    disk_turns: u64,
    soak_turns: u64,
    warmup_turns: u64,
    /// Users of the media burst, and the size of each one's file.
    burst_users: i64,
    burst_file_bytes: usize,
    /// `terminal` calls per command, on the host and in the sandbox each.
    terminal_calls: usize,
}

impl Plan {
    fn from_args(args: &Args) -> Plan {
        let mut plan = if args.quick {
            Plan {
                repeats: 1,
                cold_starts: 1,
                sequential_turns: 20,
                concurrent: Duration::from_millis(500),
                curve_levels: &[1, 8, 32],
                curve_duration: Duration::from_millis(300),
                disk_turns: 200,
                soak_turns: 1_200,
                warmup_turns: 10,
                burst_users: 4,
                burst_file_bytes: 1024 * 1024,
                terminal_calls: 20,
            }
        } else {
            Plan {
                repeats: 3,
                cold_starts: 5,
                sequential_turns: 1_000,
                concurrent: Duration::from_secs(20),
                curve_levels: &[1, 2, 4, 8, 16, 32, 64],
                curve_duration: Duration::from_secs(5),
                disk_turns: 1_000,
                soak_turns: 100_000,
                warmup_turns: 200,
                burst_users: 32,
                burst_file_bytes: 10 * 1024 * 1024,
                terminal_calls: 500,
            }
        };
        if let Some(r) = args.repeats {
            plan.repeats = r.max(1);
        }
        if let Some(d) = args.duration {
            plan.concurrent = Duration::from_secs(d.max(1));
        }
        if let Some(t) = args.turns {
            plan.sequential_turns = t.max(1);
        }
        if let Some(t) = args.disk_turns {
            plan.disk_turns = t.max(1);
        }
        if let Some(t) = args.soak_turns {
            plan.soak_turns = t.max(1_001);
        }
        if let Some(c) = args.terminal_calls {
            plan.terminal_calls = c.max(1);
        }
        plan
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Bench::Pages { sessions, requests }) = args.command {
        return run_pages(&args, pages::Plan::new(args.quick, sessions, requests));
    }
    let plan = Plan::from_args(&args);
    if let Some(Bench::Headerless) = args.command {
        return run_headerless(&args, plan);
    }
    terminal::require_bubblewrap()?;
    let (talaria, runtime) = (talaria_binary(&args)?, new_runtime()?);
    let figures = runtime.block_on(run(&talaria, plan))?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let markdown = report::markdown(&figures);
    std::fs::write(args.out.join("results.md"), &markdown)?;
    std::fs::write(
        args.out.join("results.json"),
        serde_json::to_string_pretty(&figures)?,
    )?;
    report::plot(&figures, &args.out.join("latency.svg"))?;
    println!("{markdown}");
    println!("written to {}", args.out.display());
    Ok(())
}

/// The `talaria` binary under test: `--talaria`, or the one built next to
/// this program.
fn talaria_binary(args: &Args) -> anyhow::Result<PathBuf> {
    match &args.talaria {
        Some(p) => Ok(p.clone()),
        None => build_talaria(),
    }
}

fn new_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

/// `talaria-bench headerless`: prints and writes headerless.md.
fn run_headerless(args: &Args, plan: Plan) -> anyhow::Result<()> {
    let (talaria, runtime) = (talaria_binary(args)?, new_runtime()?);
    let figures = runtime.block_on(async {
        let mock = mock::Mock::start().await?;
        let (gw, target, mock_target) = warmed_gateway(&talaria, &mock, &client()?, &plan).await?;
        let figures = concurrency(&gw, &target, &mock_target, &plan, &[32], 32).await;
        gw.stop();
        figures
    })?;
    let markdown = report::headerless_markdown(&figures);
    print!("{markdown}");
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    std::fs::write(args.out.join("headerless.md"), &markdown)?;
    Ok(())
}

/// `talaria-bench pages`: writes pages.md and pages.json.
fn run_pages(args: &Args, plan: pages::Plan) -> anyhow::Result<()> {
    let (talaria, runtime) = (talaria_binary(args)?, new_runtime()?);
    let figures = runtime.block_on(pages::run(&talaria, plan))?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let markdown = report::pages_markdown(&figures);
    std::fs::write(args.out.join("pages.md"), &markdown)?;
    std::fs::write(
        args.out.join("pages.json"),
        serde_json::to_string_pretty(&figures)?,
    )?;
    println!("{markdown}");
    println!("written to {}", args.out.display());
    Ok(())
}

/// The `talaria` binary next to this one, built first when this program
/// runs under `cargo run` (which sets `CARGO`), so the figures are always
/// of the current source in the same profile.
fn build_talaria() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("no directory for this program")?;
    if let Ok(cargo) = std::env::var("CARGO") {
        let release = dir.ends_with("release");
        let mut build = Command::new(cargo);
        build.args(["build", "-p", "talaria-cli", "--bin", "talaria"]);
        if release {
            build.arg("--release");
        }
        let status = build.status().context("cannot run cargo build")?;
        if !status.success() {
            bail!("building talaria failed");
        }
    }
    let talaria = dir.join("talaria");
    if !talaria.is_file() {
        bail!(
            "{} not found: build it (cargo build --release -p talaria-cli) or pass --talaria",
            talaria.display()
        );
    }
    Ok(talaria)
}

async fn run(talaria: &Path, plan: Plan) -> anyhow::Result<Figures> {
    let mock = mock::Mock::start().await?;
    let http = client()?;
    let mut figures = Figures::describe_machine();
    figures.plan = format!("{plan:?}");

    eprintln!("cold starts ({})", plan.cold_starts);
    let (mut health, mut first, mut idle, mut request) = (vec![], vec![], vec![], vec![]);
    let mut idle_anon = Vec::new();
    for _ in 0..plan.cold_starts {
        let mut gw = Gateway::launch(talaria, &mock.base_url())?;
        let to_health = gw.wait_healthy(&http, Duration::from_secs(30)).await?;
        let target = Target::gateway(http.clone(), &gw.base, API_KEY);
        target
            .turn("bench-cold", Mode::Text)
            .await
            .with_context(|| format!("the first turn failed:\n{}", gw.log_tail()))?;
        let to_answer = gw.launched.elapsed();
        request.push(
            mock.stats
                .last_turn_request_bytes
                .load(std::sync::atomic::Ordering::Relaxed) as f64,
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let sample = gw.sample()?;
        idle.push(sample.rss_bytes as f64);
        idle_anon.push(sample.rss_anon_bytes as f64);
        health.push(ms(to_health));
        first.push(ms(to_answer));
        gw.stop();
    }
    figures.cold_health_ms = median(&health);
    figures.cold_first_answer_ms = median(&first);
    figures.idle_rss_mb = median(&idle) / MB;
    figures.idle_rss_anon_mb = median(&idle_anon) / MB;
    figures.first_request_bytes = median(&request);

    let (gw, target, mock_target) = warmed_gateway(talaria, &mock, &http, &plan).await?;

    eprintln!(
        "sequential turns ({} per mode and repeat)",
        plan.sequential_turns
    );
    let mut mock_p50 = vec![];
    for r in 0..plan.repeats {
        let turns = load::sequential(
            &mock_target,
            &format!("mock{r}"),
            plan.sequential_turns,
            Mode::Text,
        )
        .await?;
        mock_p50.push(ms(latency_percentiles(&turns).0));
    }
    figures.mock_sequential_p50_ms = median(&mock_p50);
    for (mode, name, tag) in [
        (Mode::Text, "whole answer", "text"),
        (Mode::Stream, "streamed", "stream"),
        (Mode::Tool, "one tool call", "tool"),
        (Mode::Image, "one photo (vision)", "image"),
        (Mode::Voice, "one voice note (speech to text)", "voice"),
    ] {
        let (mut p50, mut p99, mut fb, mut cpu) = (vec![], vec![], vec![], vec![]);
        for r in 0..plan.repeats {
            let before = gw.sample()?;
            let turns = load::sequential(
                &target,
                &format!("seq{r}{tag}"),
                plan.sequential_turns,
                mode,
            )
            .await?;
            let after = gw.sample()?;
            let (a, b) = latency_percentiles(&turns);
            p50.push(ms(a));
            p99.push(ms(b));
            cpu.push((after.cpu_secs - before.cpu_secs) * 1000.0 / turns.len() as f64);
            let mut first: Vec<Duration> = turns.iter().filter_map(|t| t.first_byte).collect();
            fb.push(ms(load::quantile(&mut first, 0.5)));
        }
        figures.sequential.push(SequentialFigure {
            mode: name.to_owned(),
            p50_ms: median(&p50),
            p99_ms: median(&p99),
            first_byte_p50_ms: (mode == Mode::Stream).then(|| median(&fb)),
            cpu_ms_per_turn: median(&cpu),
        });
    }

    eprintln!("disk writes ({} turns at 8 users)", plan.disk_turns);
    let (before, db_before) = (gw.sample()?, gw.db_bytes());
    let run = load::concurrent(&target, "disk", 8, Mode::Text, Stop::Turns(plan.disk_turns)).await;
    let (after, db_after) = (gw.sample()?, gw.db_bytes());
    check_errors(&run, &gw)?;
    let n = run.turns.len().max(1) as f64;
    figures.disk_bytes_per_turn = (after.write_bytes - before.write_bytes) as f64 / n;
    figures.db_growth_bytes_per_turn = (db_after as f64 - db_before as f64) / n;

    figures.concurrent = concurrency(&gw, &target, &mock_target, &plan, &[8, 32], 32).await?;

    eprintln!("latency against concurrency");
    for &users in plan.curve_levels {
        let run = load::concurrent(
            &target,
            &format!("curve{users}"),
            users,
            Mode::Text,
            Stop::After(plan.curve_duration),
        )
        .await;
        check_errors(&run, &gw)?;
        let alone = load::concurrent(
            &mock_target,
            &format!("mcurve{users}"),
            users,
            Mode::Text,
            Stop::After(plan.curve_duration),
        )
        .await;
        let (p50, p99) = latency_percentiles(&run.turns);
        let (mp50, mp99) = latency_percentiles(&alone.turns);
        figures.curve.push(CurvePoint {
            users,
            p50_ms: ms(p50),
            p99_ms: ms(p99),
            turns_per_sec: run.throughput(),
            mock_p50_ms: ms(mp50),
            mock_p99_ms: ms(mp99),
            mock_turns_per_sec: alone.throughput(),
        });
    }
    figures.rss_after_load_mb = gw.sample()?.rss_bytes as f64 / MB;
    gw.stop();

    eprintln!("memory soak ({} turns at 32 users)", plan.soak_turns);
    let mut gw = Gateway::launch(talaria, &mock.base_url())?;
    gw.wait_healthy(&http, Duration::from_secs(30)).await?;
    let target = Target::gateway(http.clone(), &gw.base, API_KEY);
    let run = load::concurrent(&target, "soak1k", 32, Mode::Text, Stop::Turns(1_000)).await;
    check_errors(&run, &gw)?;
    let sample = gw.sample()?;
    figures.rss_after_1k_mb = sample.rss_bytes as f64 / MB;
    figures.rss_after_1k_anon_mb = sample.rss_anon_bytes as f64 / MB;
    let run = load::concurrent(
        &target,
        "soak",
        32,
        Mode::Text,
        Stop::Turns(plan.soak_turns - 1_000),
    )
    .await;
    check_errors(&run, &gw)?;
    figures.soak_turns = plan.soak_turns;
    let sample = gw.sample()?;
    figures.rss_after_soak_mb = sample.rss_bytes as f64 / MB;
    figures.rss_after_soak_anon_mb = sample.rss_anon_bytes as f64 / MB;
    gw.stop();

    eprintln!(
        "media burst ({} users, one {} MB file each, at once)",
        plan.burst_users,
        plan.burst_file_bytes / (1024 * 1024)
    );
    figures.media_burst = Some(media_burst(talaria, &mock, plan).await?);

    // Last, with every gateway stopped: nothing else of the benchmark's
    // competes with the calls for the two cores.
    eprintln!(
        "terminal calls ({} per command on the host and in the sandbox, alternated)",
        plan.terminal_calls
    );
    figures.terminal = terminal::measure(plan.terminal_calls).await?;
    Ok(figures)
}

/// 32 users of a fake Telegram each send a 10 MB file at the same moment;
/// the gateway's memory is sampled until every one has an answer. The
/// files are streamed into the media cache, so memory grows by buffers,
/// not by files.
async fn media_burst(
    talaria: &Path,
    mock: &mock::Mock,
    plan: Plan,
) -> anyhow::Result<report::MediaBurst> {
    use talaria_testkit::telegram::FileKind;
    let (users_n, file_bytes) = (plan.burst_users, plan.burst_file_bytes);
    let token = "777001:bench-token-abcdefghijklmnopq";
    let tg = talaria_testkit::FakeTelegram::start(token).await;
    let users: Vec<String> = (1..=users_n).map(|u| (5000 + u).to_string()).collect();
    let mut gw = Gateway::launch_with(
        talaria,
        &mock.base_url(),
        &format!("  telegram:\n    base_url: {}\n", tg.base_url()),
        &format!(
            "TELEGRAM_BOT_TOKEN={token}\nTELEGRAM_ALLOWED_USERS={}\n",
            users.join(",")
        ),
    )?;
    let http = reqwest::Client::new();
    gw.wait_healthy(&http, Duration::from_secs(30)).await?;
    tg.wait_for_get_updates_calls(1, Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Bytes no compressor or dedupe could shrink, the same for each user
    // (each download is still its own stream).
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let bytes: Vec<u8> = (0..file_bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let file = tg.add_file(bytes, Some("data.bin"), Some("application/octet-stream"));
    let before = gw.sample()?;
    let started = Instant::now();
    for u in 1..=users_n {
        tg.push_private_file(5000 + u, FileKind::Document, &file, Some("keep this"));
    }
    let (mut peak, mut peak_anon) = (before.rss_bytes, before.rss_anon_bytes);
    loop {
        let s = gw.sample()?;
        peak = peak.max(s.rss_bytes);
        peak_anon = peak_anon.max(s.rss_anon_bytes);
        if tg.sent().len() >= users_n as usize {
            break;
        }
        if started.elapsed() > Duration::from_secs(180) {
            bail!(
                "only {} of {users_n} users were answered:\n{}",
                tg.sent().len(),
                gw.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    gw.stop();
    Ok(report::MediaBurst {
        users: users_n as usize,
        file_mb: file_bytes as f64 / MB,
        rss_before_mb: before.rss_bytes as f64 / MB,
        rss_peak_mb: peak as f64 / MB,
        rss_anon_before_mb: before.rss_anon_bytes as f64 / MB,
        rss_anon_peak_mb: peak_anon as f64 / MB,
        seconds,
    })
}

const MB: f64 = 1024.0 * 1024.0;

/// The benchmark's client.
fn client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        // Below the server's keep-alive limit (its header timeout, 10 s):
        // a pooled connection the server is closing at the moment it is
        // reused fails the request ("connection closed before message
        // completed"), which a client with a longer idle time meets
        // between the benchmark's phases.
        .pool_idle_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .build()
}

/// A gateway started and warmed up, the target of its API server, and the
/// mock's own endpoint sent the last request the gateway made (the same
/// work for the model side, without the gateway: the ceiling).
async fn warmed_gateway(
    talaria: &Path,
    mock: &mock::Mock,
    http: &reqwest::Client,
    plan: &Plan,
) -> anyhow::Result<(Gateway, Target, Target)> {
    let mut gw = Gateway::launch(talaria, &mock.base_url())?;
    gw.wait_healthy(http, Duration::from_secs(30)).await?;
    let target = Target::gateway(http.clone(), &gw.base, API_KEY);
    load::sequential(&target, "warmup", plan.warmup_turns, Mode::Text).await?;
    let replay = mock
        .stats
        .last_turn_request
        .lock()
        .ok()
        .and_then(|b| b.clone())
        .context("the mock saw no turn")?;
    let mock_target = Target::mock(http.clone(), &mock.base_url(), replay.to_vec());
    Ok((gw, target, mock_target))
}

/// The closed-loop runs at each number of `users` in turn, `plan.repeats`
/// times, each followed by the mock alone under the same client (the
/// ceiling). At `headerless_users` every repeat also runs the header-less
/// load (identical openings, histories resent) right beside the header
/// path, which goes first in every other repeat: the two are judged
/// against each other, so they meet the same store and the same machine,
/// and neither always runs on the other's leftovers.
async fn concurrency(
    gw: &Gateway,
    target: &Target,
    mock_target: &Target,
    plan: &Plan,
    levels: &[usize],
    headerless_users: usize,
) -> anyhow::Result<Vec<ConcurrencyFigure>> {
    let headerless = target.clone().without_header();
    let mut figures = Vec::new();
    for &users in levels {
        let paired = users == headerless_users;
        eprintln!(
            "{users} users{}, {:?} per repeat",
            if paired {
                ", with the session header and without it in turn"
            } else {
                ""
            },
            plan.concurrent
        );
        let (mut with, mut without, mut alone) =
            (Runs::default(), Runs::default(), Runs::default());
        for r in 0..plan.repeats {
            let mut kinds = vec![(target, false)];
            if paired {
                kinds.push((&headerless, true));
                if r % 2 == 1 {
                    kinds.reverse();
                }
            }
            for (load_target, without_header) in kinds {
                let tag = format!("c{users}r{r}{}", if without_header { "n" } else { "" });
                let (before, client_before) = (gw.sample()?, gateway::sample(std::process::id())?);
                let run = load::concurrent(
                    load_target,
                    &tag,
                    users,
                    Mode::Text,
                    Stop::After(plan.concurrent),
                )
                .await;
                let (after, client_after) = (gw.sample()?, gateway::sample(std::process::id())?);
                let n = run.turns.len().max(1) as f64;
                let cpu = (after.cpu_secs - before.cpu_secs) * 1000.0 / n;
                let client_cpu = (client_after.cpu_secs - client_before.cpu_secs) * 1000.0 / n;
                let written = (after.write_bytes - before.write_bytes) as f64 / n / 1000.0;
                eprintln!(
                    "  repeat {r}{}: {:.0} turns/s, CPU per turn {cpu:.3} ms (client and mock {client_cpu:.3} ms), {written:.1} kB written per turn, {} errors",
                    if without_header { ", no header" } else { "" },
                    run.throughput(),
                    run.errors
                );
                let runs = if without_header {
                    &mut without
                } else {
                    &mut with
                };
                runs.add(&run, cpu);
            }
            let run = load::concurrent(
                mock_target,
                &format!("m{users}r{r}"),
                users,
                Mode::Text,
                Stop::After(plan.concurrent),
            )
            .await;
            alone.add(&run, 0.0);
        }
        figures.push(with.figure(users, false, &alone));
        if paired {
            figures.push(without.figure(users, true, &alone));
        }
    }
    Ok(figures)
}

/// The repeats of one kind of concurrent run.
#[derive(Default)]
struct Runs {
    turns_per_sec: Vec<f64>,
    p50_ms: Vec<f64>,
    p99_ms: Vec<f64>,
    cpu_ms_per_turn: Vec<f64>,
    errors: u64,
    first_error: Option<String>,
}

impl Runs {
    fn add(&mut self, run: &load::LoadResult, cpu_ms_per_turn: f64) {
        let (p50, p99) = latency_percentiles(&run.turns);
        self.turns_per_sec.push(run.throughput());
        self.p50_ms.push(ms(p50));
        self.p99_ms.push(ms(p99));
        self.cpu_ms_per_turn.push(cpu_ms_per_turn);
        self.errors += run.errors;
        if self.first_error.is_none() {
            self.first_error.clone_from(&run.first_error);
        }
    }

    /// The medians, beside those of the mock alone.
    fn figure(self, users: usize, without_header: bool, alone: &Runs) -> ConcurrencyFigure {
        ConcurrencyFigure {
            users,
            without_header,
            turns_per_sec: median(&self.turns_per_sec),
            p50_ms: median(&self.p50_ms),
            p99_ms: median(&self.p99_ms),
            cpu_ms_per_turn: median(&self.cpu_ms_per_turn),
            errors: self.errors,
            first_error: self.first_error,
            mock_turns_per_sec: median(&alone.turns_per_sec),
            mock_p50_ms: median(&alone.p50_ms),
            mock_p99_ms: median(&alone.p99_ms),
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A run that had errors makes its figures meaningless: stop and say why.
fn check_errors(run: &load::LoadResult, gw: &Gateway) -> anyhow::Result<()> {
    if run.errors > 0 {
        bail!(
            "{} of {} turns failed at {} users; first: {}\n{}",
            run.errors,
            run.errors + run.turns.len() as u64,
            run.concurrency,
            run.first_error.as_deref().unwrap_or("?"),
            gw.log_tail()
        );
    }
    Ok(())
}
