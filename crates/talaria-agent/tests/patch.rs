//! The `patch` tool: tolerant replacement (whitespace and indentation),
//! the unique-match rule, and unified diffs applied all-or-nothing.

use crate::tools_support;

use serde_json::{Value, json};
use talaria_agent::tools::Tool;
use talaria_agent::tools::files::PatchTool;
use tools_support::{Env, json};

fn read(env: &Env, name: &str) -> String {
    std::fs::read_to_string(env.work().join(name)).unwrap()
}

/// The ancestor's `patch` schema (hermes-agent `tools/file_tools.py`,
/// PATCH_SCHEMA): the same names, types, enum, defaults and required list.
/// `cross_profile` is left out: Talaria has no profiles to cross.
#[test]
fn the_schema_is_the_ancestors() {
    let ours = PatchTool.parameters();
    let props = ours["properties"].as_object().unwrap();
    let mut names: Vec<&str> = props.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "mode",
            "new_string",
            "old_string",
            "patch",
            "path",
            "replace_all"
        ]
    );
    assert_eq!(props["mode"]["enum"], json!(["replace", "patch"]));
    assert_eq!(props["mode"]["default"], json!("replace"));
    assert_eq!(props["replace_all"]["type"], json!("boolean"));
    assert_eq!(props["replace_all"]["default"], json!(false));
    for s in ["path", "old_string", "new_string", "patch"] {
        assert_eq!(props[s]["type"], json!("string"), "{s}");
    }
    assert_eq!(ours["required"], json!(["mode"]));
}

#[tokio::test]
async fn a_unified_diff_edits_two_files_and_creates_a_third() {
    let env = Env::new();
    std::fs::create_dir_all(env.work().join("src")).unwrap();
    let lib: String = (1..=30).map(|i| format!("line {i}\n")).collect();
    std::fs::write(env.work().join("src/lib.txt"), &lib).unwrap();
    std::fs::write(env.work().join("notes.md"), "# Notes\n\nfirst\nsecond\n").unwrap();
    // The first hunk's header is off by four lines (the file grew since the
    // diff was made) and one context line lost its trailing spaces vs. the
    // diff: both are tolerated.
    let diff = "diff --git a/src/lib.txt b/src/lib.txt\n\
                --- a/src/lib.txt\n\
                +++ b/src/lib.txt\n\
                @@ -6,3 +6,4 @@\n \
                line 10\n\
                -line 11\n\
                +line eleven\n\
                +line eleven and a half\n \
                line 12   \n\
                @@ -25,2 +26,2 @@\n \
                line 29\n\
                -line 30\n\
                +line thirty\n\
                --- a/notes.md\n\
                +++ b/notes.md\n\
                @@ -3,2 +3,3 @@\n \
                first\n\
                +between\n \
                second\n\
                --- /dev/null\n\
                +++ b/docs/new.md\n\
                @@ -0,0 +1,2 @@\n\
                +hello\n\
                +world\n";
    let out = json(
        &PatchTool
            .call(json!({"mode": "patch", "patch": diff}), &env.ctx)
            .await
            .unwrap(),
    );
    assert_eq!(out["success"], true);
    let files = out["files"].as_array().unwrap();
    assert_eq!(files.len(), 3, "{out}");
    assert_eq!(
        files[0],
        json!({"path": "src/lib.txt", "action": "modified", "hunks": 2})
    );
    assert_eq!(files[2]["action"], "created");
    let expected: String = (1..=30)
        .flat_map(|i| match i {
            11 => vec![
                "line eleven\n".to_owned(),
                "line eleven and a half\n".to_owned(),
            ],
            30 => vec!["line thirty\n".to_owned()],
            _ => vec![format!("line {i}\n")],
        })
        .collect();
    assert_eq!(read(&env, "src/lib.txt"), expected);
    assert_eq!(
        read(&env, "notes.md"),
        "# Notes\n\nfirst\nbetween\nsecond\n"
    );
    assert_eq!(read(&env, "docs/new.md"), "hello\nworld\n");
    let shown = out["diff"].as_str().unwrap();
    assert!(shown.contains("+line eleven and a half"), "{shown}");
    assert!(shown.contains("+++ b/docs/new.md"), "{shown}");
}

#[tokio::test]
async fn a_bad_hunk_refuses_the_whole_diff_and_writes_nothing() {
    let env = Env::new();
    std::fs::write(env.work().join("a.txt"), "one\ntwo\nthree\n").unwrap();
    std::fs::write(env.work().join("b.txt"), "alpha\nbeta\n").unwrap();
    // The first file's hunk is fine; the second's context is not in b.txt.
    let diff = "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n\
                --- a/b.txt\n+++ b/b.txt\n@@ -1,2 +1,2 @@\n alpha\n-gamma\n+delta\n\
                --- /dev/null\n+++ b/c.txt\n@@ -0,0 +1 @@\n+new\n";
    let e = PatchTool
        .call(json!({"mode": "patch", "patch": diff}), &env.ctx)
        .await
        .unwrap_err();
    assert!(
        e.0.contains("hunk 1 of b.txt") && e.0.contains("nothing was changed"),
        "{e}"
    );
    assert_eq!(read(&env, "a.txt"), "one\ntwo\nthree\n");
    assert_eq!(read(&env, "b.txt"), "alpha\nbeta\n");
    assert!(!env.work().join("c.txt").exists());

    // Creating a file that exists is refused the same way.
    let diff = "--- /dev/null\n+++ b/a.txt\n@@ -0,0 +1 @@\n+x\n";
    let e = PatchTool
        .call(json!({"mode": "patch", "patch": diff}), &env.ctx)
        .await
        .unwrap_err();
    assert!(e.0.contains("already exists"), "{e}");
    assert_eq!(read(&env, "a.txt"), "one\ntwo\nthree\n");

    // Not a diff at all.
    let e = PatchTool
        .call(
            json!({"mode": "patch", "patch": "please change two"}),
            &env.ctx,
        )
        .await
        .unwrap_err();
    assert!(e.0.contains("unified diff"), "{e}");
}

#[tokio::test]
async fn diff_paths_go_through_the_file_tools_refusals() {
    let env = Env::new();
    let diff = "--- /dev/null\n+++ b/../.env\n@@ -0,0 +1 @@\n+KEY=x\n";
    // The home's credential file, addressed from the working directory.
    let home_env = env.ctx.home.root().join(".env");
    let rel = pathdiff(&env.work(), &home_env);
    let diff = diff.replace("../.env", &rel);
    let e = PatchTool
        .call(json!({"mode": "patch", "patch": diff}), &env.ctx)
        .await
        .unwrap_err();
    assert!(!home_env.exists(), "{e}");
}

/// `to` relative to `from` (both absolute, `to` under a common ancestor).
fn pathdiff(from: &std::path::Path, to: &std::path::Path) -> String {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".into(); from.len() - common];
    parts.extend(
        to[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

#[tokio::test]
async fn a_shifted_block_is_replaced_with_the_files_indentation() {
    let env = Env::new();
    let src = "class A:\n    def f(self):\n        if x:\n            return 1\n        return 2\n";
    std::fs::write(env.work().join("a.py"), src).unwrap();
    // The model copied the method without its class indentation and wrote
    // the replacement at that same (wrong) level.
    let out = json(
        &PatchTool
            .call(
                json!({
                    "path": "a.py",
                    "old_string": "def f(self):\n    if x:\n        return 1\n",
                    "new_string": "def f(self):\n    if x and y:\n        return 1\n    log()\n",
                }),
                &env.ctx,
            )
            .await
            .unwrap(),
    );
    assert_eq!(out["replacements"], 1);
    assert_eq!(out["match"], "indentation");
    assert_eq!(
        read(&env, "a.py"),
        "class A:\n    def f(self):\n        if x and y:\n            return 1\n        log()\n        return 2\n"
    );
}

#[tokio::test]
async fn trailing_spaces_and_tabs_versus_spaces_are_tolerated() {
    let env = Env::new();
    std::fs::write(env.work().join("t.txt"), "a = 1   \nb = 2\t\nc = 3\n").unwrap();
    let out = json(
        &PatchTool
            .call(
                json!({"path": "t.txt", "old_string": "a = 1\nb = 2", "new_string": "a = 10\nb = 20"}),
                &env.ctx,
            )
            .await
            .unwrap(),
    );
    assert_eq!(out["match"], "trailing_whitespace");
    assert_eq!(read(&env, "t.txt"), "a = 10\nb = 20\nc = 3\n");

    std::fs::write(env.work().join("m.py"), "def f():\n\treturn 1\n").unwrap();
    let out = json(
        &PatchTool
            .call(
                json!({"path": "m.py", "old_string": "def f():\n    return 1", "new_string": "def f():\n    return 2"}),
                &env.ctx,
            )
            .await
            .unwrap(),
    );
    assert_eq!(out["match"], "line_trimmed");
    assert!(read(&env, "m.py").contains("return 2"));

    // Runs of whitespace inside a line.
    std::fs::write(env.work().join("w.txt"), "x  =   compute( a,  b )\n").unwrap();
    let out = json(
        &PatchTool
            .call(
                json!({"path": "w.txt", "old_string": "compute( a, b )", "new_string": "compute(a, b, c)"}),
                &env.ctx,
            )
            .await
            .unwrap(),
    );
    assert_eq!(out["match"], "whitespace_collapsed");
    assert_eq!(read(&env, "w.txt"), "x  =   compute(a, b, c)\n");
}

#[tokio::test]
async fn an_ambiguous_fuzzy_match_is_refused_with_its_count_and_lines() {
    let env = Env::new();
    let src =
        "fn a() {\n    let v = 1;\n}\nfn b() {\n        let v = 1;\n}\nfn c() {\n  let v = 1;\n}\n";
    std::fs::write(env.work().join("r.rs"), src).unwrap();
    let e = PatchTool
        .call(
            json!({"path": "r.rs", "old_string": "let v = 1;  ", "new_string": "let v = 2;"}),
            &env.ctx,
        )
        .await
        .unwrap_err();
    assert!(e.0.contains("3 places"), "{e}");
    assert!(e.0.contains("lines 2, 5, 8"), "{e}");
    assert!(e.0.contains("replace_all"), "{e}");
    assert_eq!(read(&env, "r.rs"), src);

    let out = json(
        &PatchTool
            .call(
                json!({"path": "r.rs", "old_string": "let v = 1;  ", "new_string": "let v = 2;", "replace_all": true}),
                &env.ctx,
            )
            .await
            .unwrap(),
    );
    assert_eq!(out["replacements"], 3);
    assert_eq!(read(&env, "r.rs").matches("let v = 2;").count(), 3);
}

#[tokio::test]
async fn a_miss_shows_the_closest_region() {
    let env = Env::new();
    let src: String = (1..=20)
        .map(|i| format!("value_{i} = compute({i})\n"))
        .collect();
    std::fs::write(env.work().join("v.py"), &src).unwrap();
    let e = PatchTool
        .call(
            json!({"path": "v.py", "old_string": "value_12 = compute(twelve)", "new_string": "x"}),
            &env.ctx,
        )
        .await
        .unwrap_err();
    assert!(e.0.contains("not found"), "{e}");
    assert!(e.0.contains("lines 12-12"), "{e}");
    assert!(e.0.contains("  12|value_12 = compute(12)"), "{e}");
    assert_eq!(read(&env, "v.py"), src);
}

#[tokio::test]
async fn missing_arguments_per_mode_are_named() {
    let env = Env::new();
    let e: Value = json!(
        PatchTool
            .call(json!({"mode": "patch"}), &env.ctx)
            .await
            .unwrap_err()
            .0
    );
    assert!(e.as_str().unwrap().contains("`patch`"), "{e}");
    let e = PatchTool
        .call(json!({"mode": "rewrite", "patch": "x"}), &env.ctx)
        .await
        .unwrap_err();
    assert!(e.0.contains("mode"), "{e}");
}
