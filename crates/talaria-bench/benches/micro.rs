//! Micro-benchmarks of the hot paths (criterion).
//!
//! `cargo bench -p talaria-bench --bench micro` measures at full size:
//! FTS5 search over 100,000 and 1,000,000 stored messages, a ledger sweep
//! over 100,000 obligations. The large databases are built once and kept
//! under `target/talaria-bench-data/` (a million messages take a while).
//! Under `cargo test --benches` (criterion's test mode, what CI runs) each
//! benchmark runs once at a small size, to keep them compiling and working.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use talaria_core::Message;
use talaria_gateway::adapter::{LengthUnit, MessageLimits};
use talaria_gateway::ledger::Ledger;
use talaria_gateway::{KeyPolicy, SessionKey, SessionSource};
use talaria_store::sqlite::PAGE_SIZE;
use talaria_store::{
    LedgerStore, NewObligation, NewSession, NodeId, SearchQuery, SessionStore, SqliteStore,
};

/// Full sizes under `cargo bench`, small ones in test mode.
fn full_size() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Where built databases are kept between runs.
fn data_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let dir = target.join("talaria-bench-data");
    std::fs::create_dir_all(&dir).expect("the data directory");
    dir
}

fn session_keys(c: &mut Criterion) {
    let policy = KeyPolicy::default();
    let dm = SessionSource::dm("telegram", "123456789", "123456789");
    let mut thread = SessionSource::dm("discord", "998877665544332211", "42");
    thread.chat_type = talaria_gateway::ChatType::Group;
    thread.thread_id = Some("1122334455".to_owned());
    let mut g = c.benchmark_group("session_key");
    g.bench_function("dm", |b| {
        b.iter(|| SessionKey::for_source(std::hint::black_box(&dm), policy))
    });
    g.bench_function("group_thread", |b| {
        b.iter(|| SessionKey::for_source(std::hint::black_box(&thread), policy))
    });
    g.bench_function("validate_path_component", |b| {
        b.iter(|| {
            talaria_core::ids::validate_path_component(std::hint::black_box("api-0123456789abcdef"))
        })
    });
    g.finish();
}

fn store_append(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = SqliteStore::open(&dir.path().join("state.db")).expect("a store");
    rt.block_on(store.create_session(NewSession {
        id: "bench".to_owned(),
        source: "bench".to_owned(),
        ..NewSession::default()
    }))
    .expect("a session");
    let user = Message::user("Please note that the build passed.");
    let answer = Message::assistant("Done: noted. The build passed at 14:02 on main.");
    let mut g = c.benchmark_group("store");
    g.throughput(Throughput::Elements(1));
    g.bench_function("append_turn", |b| {
        b.iter(|| {
            rt.block_on(async {
                store.append_message("bench", &user).await.expect("append");
                store
                    .append_message("bench", &answer)
                    .await
                    .expect("append");
            })
        })
    });
    g.finish();
}

const WORDS: &[&str] = &[
    "deploy",
    "kubernetes",
    "invoice",
    "garden",
    "tomato",
    "rust",
    "compiler",
    "holiday",
    "flight",
    "berlin",
    "recipe",
    "pasta",
    "meeting",
    "budget",
    "quarterly",
    "report",
    "backup",
    "server",
    "password",
    "reminder",
    "dentist",
    "birthday",
    "present",
    "guitar",
    "lesson",
    "python",
    "database",
    "migration",
    "weather",
    "umbrella",
    "coffee",
    "grinder",
    "bicycle",
    "repair",
];

/// A database with `n` messages in sessions of 20, built once per size
/// (and page size: a database keeps the page size it was created with).
fn search_db(n: usize) -> PathBuf {
    let path = data_dir().join(format!("search-{n}-p{PAGE_SIZE}.db"));
    if path.exists() {
        return path;
    }
    let building = path.with_extension("building");
    let _ = std::fs::remove_file(&building);
    let rt = runtime();
    let store = SqliteStore::open(&building).expect("a store");
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    rt.block_on(async {
        for s in 0..n.div_ceil(20) {
            let id = format!("s{s}");
            store
                .create_session(NewSession {
                    id: id.clone(),
                    source: "telegram".to_owned(),
                    ..NewSession::default()
                })
                .await
                .expect("a session");
            for m in 0..20 {
                let text: Vec<&str> = (0..12)
                    .map(|_| WORDS[(next() % WORDS.len() as u64) as usize])
                    .collect();
                let text = text.join(" ");
                let msg = if m % 2 == 0 {
                    Message::user(text)
                } else {
                    Message::assistant(text)
                };
                store.append_message(&id, &msg).await.expect("append");
            }
        }
    });
    drop(store);
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", building.display()));
    }
    std::fs::rename(&building, &path).expect("rename");
    path
}

fn search(c: &mut Criterion) {
    let sizes: &[usize] = if full_size() {
        &[100_000, 1_000_000]
    } else {
        &[2_000]
    };
    let rt = runtime();
    let mut g = c.benchmark_group("fts5_search");
    g.sample_size(30);
    for &n in sizes {
        let store = SqliteStore::open(&search_db(n)).expect("the search db");
        let mut i = 0usize;
        g.bench_function(format!("{n}_messages"), |b| {
            b.iter(|| {
                i += 1;
                let text = format!(
                    "{} {}",
                    WORDS[i % WORDS.len()],
                    WORDS[(i * 7) % WORDS.len()]
                );
                rt.block_on(store.search(SearchQuery {
                    text,
                    sources: Vec::new(),
                    exclude_session: None,
                    limit: 10,
                }))
                .expect("search")
            })
        });
    }
    g.finish();
}

/// Every owner but the sweeping one is dead.
/// A ledger with `n` open obligations of a node that is gone (it never
/// announced itself, which a sweep reads as dead), built once.
fn ledger_db(n: usize) -> PathBuf {
    let path = data_dir().join(format!("ledger-nodes-{n}-p{PAGE_SIZE}.db"));
    if path.exists() {
        return path;
    }
    let building = path.with_extension("building");
    let _ = std::fs::remove_file(&building);
    let rt = runtime();
    let store = SqliteStore::open(&building).expect("a store");
    rt.block_on(async {
        for i in 0..n {
            store
                .record_obligation(NewObligation {
                    id: format!("ob{i}"),
                    session_key: format!("agent:main:telegram:dm:{}", i % 1000),
                    platform: "telegram".to_owned(),
                    chat_id: format!("{}", i % 1000),
                    thread_id: None,
                    reply_to: Some(format!("{i}")),
                    content: "An answer that was cut off by a crash.".to_owned(),
                    owner: NodeId::new("gone").expect("a node id"),
                    settles: Vec::new(),
                })
                .await
                .expect("record");
        }
    });
    drop(store);
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", building.display()));
    }
    std::fs::rename(&building, &path).expect("rename");
    path
}

fn ledger_sweep(c: &mut Criterion) {
    let n = if full_size() { 100_000 } else { 1_000 };
    let template = ledger_db(n);
    let rt = runtime();
    let deliverable: HashSet<String> = ["telegram".to_owned()].into();
    let mut g = c.benchmark_group("ledger");
    g.sample_size(10);
    g.bench_function(format!("sweep_{n}_obligations"), |b| {
        b.iter_batched(
            || {
                // Each sweep claims every row, so each gets a fresh copy.
                let dir = tempfile::tempdir().expect("a temp dir");
                let path = dir.path().join("state.db");
                std::fs::copy(&template, &path).expect("copy");
                let store = Arc::new(SqliteStore::open(&path).expect("a store"));
                (
                    dir,
                    Ledger::new(store, NodeId::new("sweeper").expect("a node id")),
                )
            },
            |(_dir, ledger)| {
                let claimed = rt.block_on(ledger.sweep(&deliverable)).expect("sweep");
                assert_eq!(claimed.len(), n);
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

fn splitting(c: &mut Criterion) {
    let paragraph = "The deployment finished without errors; all **47 services** report \
                     healthy, and the `migrate` step took 3.2 s. Next: rotate the keys.\n\n";
    let mut answer = String::new();
    for n in 0.. {
        if answer.len() >= 100_000 {
            break;
        }
        answer.push_str(paragraph);
        if n % 7 == 6 {
            answer.push_str("```rust\nfn main() {\n    println!(\"hello\");\n}\n```\n\n");
        }
    }
    let limits = MessageLimits {
        max_len: 4096,
        unit: LengthUnit::Utf16,
    };
    let mut g = c.benchmark_group("split");
    g.throughput(Throughput::Bytes(answer.len() as u64));
    g.bench_function("100kB_answer_telegram", |b| {
        b.iter(|| talaria_gateway::split::split_message(std::hint::black_box(&answer), limits))
    });
    g.finish();
}

fn sse(c: &mut Criterion) {
    let mut stream = String::new();
    for i in 0..5_000 {
        stream.push_str(&format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"token{i} \"}},\"finish_reason\":null}}]}}\n\n"
        ));
    }
    stream.push_str("data: [DONE]\n\n");
    let bytes = stream.into_bytes();
    let mut g = c.benchmark_group("sse");
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.bench_function("parse_5000_chunks_in_1kB_reads", |b| {
        b.iter(|| {
            let mut parser = talaria_llm::sse::SseParser::new();
            let mut events = 0usize;
            for piece in bytes.chunks(1024) {
                events += parser.push(piece).len();
            }
            events += parser.finish().len();
            assert_eq!(events, 5_001);
        })
    });
    g.finish();
}

// criterion_group! writes `pub fn benches` without a doc comment; inside a
// private module it is not exported, so missing_docs does not ask for one.
mod group {
    use super::*;

    criterion_group!(
        benches,
        session_keys,
        store_append,
        search,
        ledger_sweep,
        splitting,
        sse
    );
}

criterion_main!(group::benches);
