//! search_files: content and file-name search over an ignore-aware walk.

use crate::tools_support;

use serde_json::{Value, json};
use talaria_agent::tools::Tool;
use talaria_agent::tools::search_files::SearchFilesTool;
use tools_support::{Env, json};

fn tree(env: &Env) {
    let w = env.work();
    let write = |p: &str, s: &str| {
        let path = w.join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, s).unwrap();
    };
    write(".gitignore", "target/\n*.log\n");
    write(
        "src/main.rs",
        "fn main() {\n    println!(\"hello\");\n}\n// TODO: tidy\n",
    );
    write("src/lib.rs", "pub fn helper() {}\n// TODO: docs\n");
    write("README.md", "hello docs\n");
    write("target/debug/out.rs", "// TODO: generated\n");
    write("app.log", "TODO in a log\n");
    write(".hidden/secret.rs", "// TODO: hidden\n");
    write("bin.dat", "TODO\0binary\n");
}

async fn search(env: &Env, args: Value) -> Value {
    json(&SearchFilesTool.call(args, &env.ctx).await.unwrap())
}

#[tokio::test]
async fn content_search_honours_gitignore_hidden_and_binary() {
    let env = Env::new();
    tree(&env);
    let out = search(&env, json!({"pattern": "TODO"})).await;
    let results = out["results"].as_str().unwrap();
    assert_eq!(
        results, "src/lib.rs:2:// TODO: docs\nsrc/main.rs:4:// TODO: tidy",
        "{out}"
    );
    assert_eq!(out["total_count"], 2);
    assert!(
        out["summary"]
            .as_str()
            .unwrap()
            .contains("2 matching line(s) in 2 file(s)")
    );
}

#[tokio::test]
async fn regex_glob_context_and_modes() {
    let env = Env::new();
    tree(&env);
    let out = search(&env, json!({"pattern": "fn \\w+\\(", "file_glob": "*.rs"})).await;
    assert_eq!(out["total_count"], 2, "{out}");
    let out = search(&env, json!({"pattern": "hello", "file_glob": "*.md"})).await;
    assert_eq!(out["results"], "README.md:1:hello docs");
    let out = search(&env, json!({"pattern": "println", "context": 1})).await;
    assert_eq!(
        out["results"],
        "src/main.rs-1-fn main() {\nsrc/main.rs:2:    println!(\"hello\");\nsrc/main.rs-3-}",
        "{out}"
    );
    let out = search(
        &env,
        json!({"pattern": "TODO", "output_mode": "files_only"}),
    )
    .await;
    assert_eq!(out["results"], "src/lib.rs\nsrc/main.rs");
    let out = search(
        &env,
        json!({"pattern": "o", "output_mode": "count", "path": "src"}),
    )
    .await;
    assert!(
        out["results"].as_str().unwrap().contains("src/main.rs:"),
        "{out}"
    );
}

#[tokio::test]
async fn limit_and_offset_page_through_results() {
    let env = Env::new();
    let body: String = (1..=30).map(|i| format!("match {i}\n")).collect();
    std::fs::write(env.work().join("many.txt"), body).unwrap();
    let out = search(&env, json!({"pattern": "match", "limit": 10})).await;
    let lines: Vec<&str> = out["results"].as_str().unwrap().lines().collect();
    assert_eq!(lines.len(), 10);
    assert_eq!(lines[0], "many.txt:1:match 1");
    assert_eq!(out["truncated"], true);
    assert!(
        out["summary"].as_str().unwrap().contains("offset=10"),
        "{out}"
    );
    let out = search(&env, json!({"pattern": "match", "limit": 10, "offset": 25})).await;
    let lines: Vec<&str> = out["results"].as_str().unwrap().lines().collect();
    assert_eq!(
        lines,
        [
            "many.txt:26:match 26",
            "many.txt:27:match 27",
            "many.txt:28:match 28",
            "many.txt:29:match 29",
            "many.txt:30:match 30"
        ]
    );
    assert_eq!(out["truncated"], false);
}

#[tokio::test]
async fn file_search_by_substring_and_glob() {
    let env = Env::new();
    tree(&env);
    let out = search(&env, json!({"pattern": "MAIN", "target": "files"})).await;
    assert_eq!(out["results"], "src/main.rs", "{out}");
    let out = search(&env, json!({"pattern": "*.rs", "target": "files"})).await;
    assert_eq!(out["results"], "src/lib.rs\nsrc/main.rs", "{out}");
    let out = search(&env, json!({"pattern": "src/*.rs", "target": "files"})).await;
    assert_eq!(out["total_count"], 2, "{out}");
    let out = search(
        &env,
        json!({"pattern": "nothing-like-this", "target": "files"}),
    )
    .await;
    assert_eq!(out["total_count"], 0);
    assert!(out["summary"].as_str().unwrap().contains("No files"));
}

#[tokio::test]
async fn errors_are_clear() {
    let env = Env::new();
    for (args, needle) in [
        (json!({"pattern": "(unclosed"}), "regular expression"),
        (json!({}), "pattern"),
        (json!({"pattern": ""}), "pattern"),
        (json!({"pattern": "x", "target": "web"}), "target"),
        (json!({"pattern": "x", "path": "missing"}), "does not exist"),
        (json!({"pattern": "x", "limit": "lots"}), "limit"),
        (json!({"pattern": "x", "file_glob": "a{"}), "file_glob"),
    ] {
        let e = SearchFilesTool
            .call(args.clone(), &env.ctx)
            .await
            .unwrap_err();
        assert!(e.0.contains(needle), "{args}: {e}");
    }
}

#[tokio::test]
async fn matches_are_redacted() {
    let env = Env::new();
    std::fs::write(
        env.work().join("k.txt"),
        "token = sk-abcdefghijklmnopqrstuvwx\n",
    )
    .unwrap();
    let out = SearchFilesTool
        .call(json!({"pattern": "token"}), &env.ctx)
        .await
        .unwrap();
    assert!(!out.contains("abcdefghijklmnopqrstuvwx"), "{out}");
    assert!(out.contains("[REDACTED]"));
}

#[test]
fn search_is_parallel_safe() {
    assert!(SearchFilesTool.parallel_safe());
}
