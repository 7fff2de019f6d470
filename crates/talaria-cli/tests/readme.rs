//! The README walked as a newcomer walks it: every shell block in it runs,
//! in order, as written, in one fresh account (an empty `HOME`, `talaria`
//! installed the way the README says), against the mock model. A block
//! that cannot run here says so in its fence (`sh no-test: <why>`), and
//! the reason is required.

use std::path::{Path, PathBuf};
use std::time::Duration;

use talaria_testkit::{MockOpenAi, Reply};

/// A fenced shell block of the README.
struct Block {
    /// 1-based line of the opening fence.
    line: usize,
    /// Why it is not run, when it is not.
    skipped: Option<String>,
    script: String,
}

fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every ```sh block, with its fence's `no-test:` reason if it has one.
fn shell_blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        match &mut open {
            None => {
                let Some(info) = line.strip_prefix("```") else {
                    continue;
                };
                let mut words = info.splitn(2, ' ');
                if words.next() != Some("sh") {
                    continue;
                }
                let rest = words.next().unwrap_or("").trim();
                let skipped = match rest.strip_prefix("no-test:") {
                    Some(reason) => {
                        let reason = reason.trim();
                        assert!(
                            !reason.is_empty(),
                            "README line {}: `no-test:` needs a reason",
                            i + 1
                        );
                        Some(reason.to_owned())
                    }
                    None => {
                        assert!(
                            rest.is_empty(),
                            "README line {}: unknown fence words `{rest}` (only `no-test: <why>`)",
                            i + 1
                        );
                        None
                    }
                };
                open = Some(Block {
                    line: i + 1,
                    skipped,
                    script: String::new(),
                });
            }
            Some(block) => {
                if line.starts_with("```") {
                    blocks.extend(open.take());
                } else {
                    block.script.push_str(line);
                    block.script.push('\n');
                }
            }
        }
    }
    assert!(open.is_none(), "README ends inside a code block");
    blocks
}

/// A fresh account: an empty home directory, a checkout whose
/// `target/release/talaria` is the binary under test, and a `PATH` with
/// only the system's directories (the README's own steps put `talaria` on
/// it).
struct Account {
    _dir: tempfile::TempDir,
    home: PathBuf,
    checkout: PathBuf,
}

impl Account {
    fn new() -> Account {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let checkout = dir.path().join("talaria");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(checkout.join("target/release")).unwrap();
        std::fs::copy(
            env!("CARGO_BIN_EXE_talaria"),
            checkout.join("target/release/talaria"),
        )
        .unwrap();
        Account {
            _dir: dir,
            home,
            checkout,
        }
    }

    /// Runs `script` with bash (stopping at the first failing command), in
    /// the checkout, as this account, with the model pointed at `model`.
    async fn run(&self, script: &str, model: &str) -> std::process::Output {
        // Each block is a fresh shell, as if typed later: what a block
        // exports does not carry over, so `talaria` must be found the way
        // a new terminal finds it.
        let path = format!(
            "{}/.local/bin:/usr/local/bin:/usr/bin:/bin",
            self.home.display()
        );
        let child = tokio::process::Command::new("bash")
            .arg("-euo")
            .arg("pipefail")
            .arg("-c")
            .arg(script)
            .current_dir(&self.checkout)
            .env_clear()
            .env("HOME", &self.home)
            .env("PATH", path)
            .env("LANG", "C.UTF-8")
            // The README's model server is on 127.0.0.1:8080; the test's
            // mock is elsewhere, and these two override the configuration
            // as the README documents.
            .env("TALARIA_BASE_URL", model)
            .env("TALARIA_MODEL", "mock-model")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        tokio::time::timeout(Duration::from_secs(60), child)
            .await
            .unwrap_or_else(|_| panic!("a README block ran for over a minute:\n{script}"))
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_shell_block_of_the_readme_runs_as_written() {
    let text = readme();
    let blocks = shell_blocks(&text);
    let mock = MockOpenAi::start().await;
    for _ in 0..20 {
        mock.push(Reply::text("Mock answer from the README walk."));
    }
    let account = Account::new();
    let mut ran = 0;
    for block in &blocks {
        if block.skipped.is_some() {
            continue;
        }
        let out = account.run(&block.script, &mock.base_url()).await;
        assert!(
            out.status.success(),
            "README block at line {} failed ({}):\n{}\n--- stdout\n{}\n--- stderr\n{}",
            block.line,
            out.status,
            block.script,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ran += 1;
    }
    // The walk really happened: the blocks ran, installed the binary,
    // wrote a configuration and asked the model.
    assert!(ran >= 4, "only {ran} README blocks ran");
    assert!(account.home.join(".local/bin/talaria").is_file());
    assert!(account.home.join(".talaria/config.yaml").is_file());
    assert!(
        !mock.requests().is_empty(),
        "no README block reached the model"
    );
}

#[test]
fn fences_are_read_with_their_reasons() {
    let text = "intro\n```sh\necho one\n```\n```sh no-test: needs a bot\necho two\n```\n```yaml\na: 1\n```\n";
    let blocks = shell_blocks(text);
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0].line, 2);
    assert_eq!(blocks[0].script, "echo one\n");
    assert!(blocks[0].skipped.is_none());
    assert_eq!(blocks[1].skipped.as_deref(), Some("needs a bot"));
}
