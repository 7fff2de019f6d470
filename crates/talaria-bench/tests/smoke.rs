//! The load benchmark end to end in its quick mode, against the `talaria`
//! binary of this build: keeps it compiling and working (CI runs this, not
//! the full benchmark). No figure is judged here; only that every phase
//! ran and wrote its results.

use std::path::PathBuf;
use std::process::Command;

/// The `talaria` binary next to this test's directory (`target/<profile>`),
/// which `cargo test --workspace` builds; built here when missing.
fn talaria() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap().to_path_buf();
    let bin = profile_dir.join("talaria");
    if !bin.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let status = Command::new(cargo)
            .args(["build", "-p", "talaria-cli", "--bin", "talaria"])
            .status()
            .unwrap();
        assert!(status.success(), "cannot build talaria");
    }
    bin
}

/// Runs `talaria-bench` with `args` against this build's `talaria`, which
/// must succeed; returns the directory it wrote its results to.
fn bench(args: &[&str]) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_talaria-bench"))
        .args(args)
        .arg("--talaria")
        .arg(talaria())
        .arg("--out")
        .arg(out.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    out
}

#[test]
fn the_quick_benchmark_runs_every_phase_and_writes_its_results() {
    let out = bench(&["--quick"]);
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("results.json")).unwrap()).unwrap();
    // Every phase produced figures, and no turn failed.
    assert!(results["cold_health_ms"].as_f64().unwrap() > 0.0);
    assert!(results["idle_rss_mb"].as_f64().unwrap() > 0.0);
    assert!(results["first_request_bytes"].as_f64().unwrap() > 1000.0);
    // Text, streamed, tool, photo and voice turns.
    assert_eq!(results["sequential"].as_array().unwrap().len(), 5);
    let burst = &results["media_burst"];
    assert!(burst["users"].as_u64().unwrap() > 0, "{burst}");
    assert!(
        burst["rss_peak_mb"].as_f64().unwrap() >= burst["rss_before_mb"].as_f64().unwrap(),
        "{burst}"
    );
    // 8 and 32 users with the header, 32 without it.
    assert_eq!(results["concurrent"].as_array().unwrap().len(), 3);
    for c in results["concurrent"].as_array().unwrap() {
        assert_eq!(c["errors"], 0, "{c}");
        assert!(c["turns_per_sec"].as_f64().unwrap() > 0.0, "{c}");
    }
    assert!(results["rss_after_soak_mb"].as_f64().unwrap() > 0.0);
    // `terminal` calls on the host and in the sandbox, for both commands
    // (bubblewrap is required: the run fails without it).
    let terminal = results["terminal"].as_array().unwrap();
    assert_eq!(terminal.len(), 2, "{terminal:?}");
    for t in terminal {
        assert_eq!(t["calls"], 20, "{t}");
        for key in ["local_p50_ms", "sandbox_p50_ms"] {
            assert!(t[key].as_f64().unwrap() > 0.0, "{t}");
        }
        assert!(t["sandbox_p95_ms"].as_f64() >= t["sandbox_p50_ms"].as_f64());
    }
    let md = std::fs::read_to_string(out.path().join("results.md")).unwrap();
    assert!(md.contains("| Budget | Figure | Target | Met |"), "{md}");
    assert!(
        md.contains("| added latency of a sandboxed terminal call"),
        "{md}"
    );
    let svg = std::fs::read_to_string(out.path().join("latency.svg")).unwrap();
    assert!(svg.contains("Talaria p99"));
}

#[test]
fn the_quick_headerless_comparison_runs_both_loads_in_turn() {
    let out = bench(&["headerless", "--quick", "--repeats", "2"]);
    let md = std::fs::read_to_string(out.path().join("headerless.md")).unwrap();
    // Both loads, each without an error, and the verdict.
    for row in ["| 32 | ", "| 32 (no header) | "] {
        let line = md
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("{md}"));
        assert_eq!(line.split('|').nth(6).map(str::trim), Some("0"), "{line}");
    }
    assert!(md.contains("of the header path's throughput"), "{md}");
}

#[test]
fn the_quick_pages_benchmark_seeds_a_store_and_measures_every_route() {
    let out = bench(&["pages", "--quick"]);
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("pages.json")).unwrap()).unwrap();
    // The quick store: 2,000 short sessions and the long one.
    assert_eq!(results["sessions"], 2_001, "{results}");
    assert!(results["messages"].as_u64().unwrap() > 8_000, "{results}");
    let routes = results["routes"].as_array().unwrap();
    // The floor and six API routes, and five pages once the dashboard
    // is served.
    let expected = if results["dashboard"] == true { 12 } else { 7 };
    assert_eq!(routes.len(), expected, "{routes:?}");
    for r in routes {
        assert_eq!(r["requests"], 20, "{r}");
        assert!(r["p50_ms"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["p95_ms"].as_f64() >= r["p50_ms"].as_f64(), "{r}");
        assert!(r["body_bytes"].as_u64().unwrap() > 0, "{r}");
        // Judged against the goal, except the floor.
        assert_eq!(r["under_goal"].is_null(), r["kind"] == "baseline", "{r}");
    }
    let md = std::fs::read_to_string(out.path().join("pages.md")).unwrap();
    assert!(md.contains("| `GET /api/sessions?limit=20` |"), "{md}");
}
