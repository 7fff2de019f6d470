//! read_file, write_file and patch.

use crate::tools_support;

use proptest::prelude::*;
use serde_json::json;
use talaria_agent::tools::Tool;
use talaria_agent::tools::files::{PatchTool, ReadFileTool, WriteFileTool};
use tools_support::{Env, json};

fn numbered(n: usize) -> String {
    (1..=n).map(|i| format!("line {i}\n")).collect()
}

#[tokio::test]
async fn read_shows_numbered_lines_with_offset_and_limit() {
    let env = Env::new();
    std::fs::write(env.work().join("a.txt"), numbered(1000)).unwrap();
    let out = ReadFileTool
        .call(json!({"path": "a.txt"}), &env.ctx)
        .await
        .unwrap();
    assert!(
        out.starts_with("   1|line 1\n   2|line 2\n"),
        "{}",
        &out[..40]
    );
    assert!(out.contains(" 500|line 500\n"));
    assert!(!out.contains("line 501\n"));
    assert!(
        out.contains("Showing lines 1-500 of 1000") && out.contains("offset=501"),
        "{out}"
    );

    let out = ReadFileTool
        .call(
            json!({"path": "a.txt", "offset": 998, "limit": 10}),
            &env.ctx,
        )
        .await
        .unwrap();
    assert!(
        out.starts_with(" 998|line 998\n 999|line 999\n1000|line 1000\n"),
        "{out}"
    );
    assert!(out.contains("end of file"), "{out}");

    let out = ReadFileTool
        .call(
            json!({"path": "a.txt", "offset": "10", "limit": 2.0}),
            &env.ctx,
        )
        .await
        .unwrap();
    assert!(out.starts_with("  10|line 10\n  11|line 11\n"), "{out}");
    assert!(out.contains("offset=12"));

    let e = ReadFileTool
        .call(json!({"path": "a.txt", "offset": 5000}), &env.ctx)
        .await
        .unwrap_err();
    assert!(e.0.contains("offset") && e.0.contains("1000 lines"), "{e}");
}

#[tokio::test]
async fn read_refuses_binary_and_missing_files_and_redacts() {
    let env = Env::new();
    std::fs::write(env.work().join("bin"), b"ELF\0\x01\x02").unwrap();
    let e = ReadFileTool
        .call(json!({"path": "bin"}), &env.ctx)
        .await
        .unwrap_err();
    assert!(e.0.contains("binary"), "{e}");
    let e = ReadFileTool
        .call(json!({"path": "nope"}), &env.ctx)
        .await
        .unwrap_err();
    assert!(e.0.contains("does not exist"), "{e}");
    let e = ReadFileTool
        .call(json!({"path": "."}), &env.ctx)
        .await
        .unwrap_err();
    assert!(e.0.contains("directory"), "{e}");
    let e = ReadFileTool
        .call(json!({"path": 3}), &env.ctx)
        .await
        .unwrap_err();
    assert!(e.0.contains("path"), "{e}");
    std::fs::write(
        env.work().join(".env"),
        "OPENAI_API_KEY=sk-abcdefghijklmnopqrstuvwx\nOTHER=super-secret-value-123\n",
    )
    .unwrap();
    let out = ReadFileTool
        .call(json!({"path": ".env"}), &env.ctx)
        .await
        .unwrap();
    assert!(
        !out.contains("abcdefghijklmnopqrstuvwx") && !out.contains("super-secret-value-123"),
        "{out}"
    );
    assert!(out.contains("[REDACTED]"));
    std::fs::write(env.work().join("empty"), "").unwrap();
    let out = ReadFileTool
        .call(json!({"path": "empty"}), &env.ctx)
        .await
        .unwrap();
    assert!(out.contains("empty"), "{out}");
}

#[tokio::test]
async fn read_handles_crlf_invalid_utf8_and_long_lines() {
    let env = Env::new();
    let mut bytes = b"a\r\nb\xff\xfe\r\n".to_vec();
    bytes.extend(std::iter::repeat_n(b'x', 10_000));
    std::fs::write(env.work().join("odd"), &bytes).unwrap();
    let out = ReadFileTool
        .call(json!({"path": "odd"}), &env.ctx)
        .await
        .unwrap();
    assert!(out.starts_with("   1|a\n   2|b"), "{out:?}");
    assert!(out.contains("more chars"), "long line is cut");
    assert!(out.len() < 5000);
}

#[tokio::test]
async fn write_creates_parent_dirs_and_overwrites() {
    let env = Env::new();
    let out = json(
        &WriteFileTool
            .call(
                json!({"path": "deep/er/f.txt", "content": "one\ntwo\n"}),
                &env.ctx,
            )
            .await
            .unwrap(),
    );
    assert_eq!(out["bytes_written"], 8);
    assert_eq!(out["lines"], 2);
    let p = env.work().join("deep/er/f.txt");
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "one\ntwo\n");
    WriteFileTool
        .call(
            json!({"path": p.to_str().unwrap(), "content": "new"}),
            &env.ctx,
        )
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
    let e = WriteFileTool
        .call(json!({"path": "x"}), &env.ctx)
        .await
        .unwrap_err();
    assert!(e.0.contains("content"), "{e}");
    let e = WriteFileTool
        .call(json!({"path": "deep", "content": "x"}), &env.ctx)
        .await
        .unwrap_err();
    assert!(e.0.contains("directory"), "{e}");
}

#[cfg(unix)]
#[tokio::test]
async fn write_keeps_the_file_mode() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let p = env.work().join("run.sh");
    std::fs::write(&p, "old").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    WriteFileTool
        .call(
            json!({"path": "run.sh", "content": "#!/bin/sh\n"}),
            &env.ctx,
        )
        .await
        .unwrap();
    assert_eq!(
        std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o755
    );
}

#[tokio::test]
async fn patch_replaces_exactly_once_and_returns_a_diff() {
    let env = Env::new();
    let p = env.work().join("m.rs");
    std::fs::write(&p, "fn a() {}\nfn b() {}\nfn c() {}\n").unwrap();
    let out = json(
        &PatchTool
            .call(
                json!({"path": "m.rs", "old_string": "fn b() {}", "new_string": "fn b() { todo!() }"}),
                &env.ctx,
            )
            .await
            .unwrap(),
    );
    assert_eq!(out["replacements"], 1);
    let diff = out["diff"].as_str().unwrap();
    assert!(
        diff.contains("--- a/m.rs") && diff.contains("+++ b/m.rs"),
        "{diff}"
    );
    assert!(
        diff.contains("-fn b() {}\n") && diff.contains("+fn b() { todo!() }\n"),
        "{diff}"
    );
    assert_eq!(
        std::fs::read_to_string(&p).unwrap(),
        "fn a() {}\nfn b() { todo!() }\nfn c() {}\n"
    );
}

#[tokio::test]
async fn patch_with_no_match_fails_with_a_hint() {
    let env = Env::new();
    let p = env.work().join("m.py");
    std::fs::write(&p, "def f():\n\treturn 1\n").unwrap();
    let e = PatchTool
        .call(
            json!({"path": "m.py", "old_string": "return 2", "new_string": "x"}),
            &env.ctx,
        )
        .await
        .unwrap_err();
    assert!(
        e.0.contains("not found") && e.0.contains("read_file"),
        "{e}"
    );
    let e = PatchTool
        .call(
            json!({"path": "m.py", "old_string": "   2|\treturn 1", "new_string": "x"}),
            &env.ctx,
        )
        .await
        .unwrap_err();
    assert!(e.0.contains("LINE|"), "{e}");
    assert_eq!(
        std::fs::read_to_string(&p).unwrap(),
        "def f():\n\treturn 1\n"
    );
}

#[tokio::test]
async fn patch_with_many_matches_needs_replace_all() {
    let env = Env::new();
    let p = env.work().join("c.txt");
    std::fs::write(&p, "x = 1\ny = 1\nz = 1\n").unwrap();
    let e = PatchTool
        .call(
            json!({"path": "c.txt", "old_string": "= 1", "new_string": "= 2"}),
            &env.ctx,
        )
        .await
        .unwrap_err();
    assert!(
        e.0.contains("3 places") && e.0.contains("replace_all"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_to_string(&p).unwrap(),
        "x = 1\ny = 1\nz = 1\n"
    );
    let out = json(
        &PatchTool
            .call(
                json!({"path": "c.txt", "old_string": "= 1", "new_string": "= 2", "replace_all": true}),
                &env.ctx,
            )
            .await
            .unwrap(),
    );
    assert_eq!(out["replacements"], 3);
    assert_eq!(
        out["diff"].as_str().unwrap().matches("\n+").count(),
        3 + 1,
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(&p).unwrap(),
        "x = 2\ny = 2\nz = 2\n"
    );
}

#[tokio::test]
async fn patch_validates_its_arguments() {
    let env = Env::new();
    std::fs::write(env.work().join("f"), "abc").unwrap();
    for (args, needle) in [
        (
            json!({"path": "f", "old_string": "", "new_string": "x"}),
            "old_string",
        ),
        (
            json!({"path": "f", "old_string": "a", "new_string": "a"}),
            "identical",
        ),
        (json!({"path": "f", "new_string": "x"}), "old_string"),
        (json!({"path": "f", "old_string": "a"}), "new_string"),
        (
            json!({"path": "f", "old_string": "a", "new_string": "b", "replace_all": "maybe"}),
            "replace_all",
        ),
        (
            json!({"path": "f", "old_string": "a", "new_string": "b", "mode": "patch"}),
            "mode",
        ),
        (
            json!({"path": "missing", "old_string": "a", "new_string": "b"}),
            "does not exist",
        ),
    ] {
        let e = PatchTool.call(args.clone(), &env.ctx).await.unwrap_err();
        assert!(e.0.contains(needle), "{args}: {e}");
    }
    // Deleting text (empty new_string) is allowed.
    PatchTool
        .call(
            json!({"path": "f", "old_string": "b", "new_string": ""}),
            &env.ctx,
        )
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(env.work().join("f")).unwrap(), "ac");
}

#[tokio::test]
async fn dotdot_paths_are_resolved_not_refused() {
    let env = Env::new();
    WriteFileTool
        .call(json!({"path": "../outside.txt", "content": "ok"}), &env.ctx)
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(env.dir.path().join("outside.txt")).unwrap(),
        "ok"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn file_tools_never_panic(
        content in "\\PC{0,300}",
        old in "\\PC{0,10}",
        new in "\\PC{0,10}",
        offset in any::<i64>(),
        limit in any::<i64>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let env = Env::new();
        rt.block_on(async {
            let _ = WriteFileTool.call(json!({"path": "p.txt", "content": content}), &env.ctx).await;
            let _ = ReadFileTool.call(json!({"path": "p.txt", "offset": offset, "limit": limit}), &env.ctx).await;
            let _ = PatchTool.call(json!({"path": "p.txt", "old_string": old, "new_string": new, "replace_all": true}), &env.ctx).await;
            let _ = ReadFileTool.call(json!({"path": old}), &env.ctx).await;
        });
    }
}
