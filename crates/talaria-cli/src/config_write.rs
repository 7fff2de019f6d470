//! `talaria config get | set | edit`: one setting read as it takes effect,
//! one set in `config.yaml` with its comments and layout kept, or the
//! whole file edited; a change is written only when the result passes
//! what `config check` checks, and the previous file is kept as
//! `config.yaml.bak`.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use serde_json::Value;
use talaria_core::Home;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::config_cmd::{Findings, Report};
use crate::yaml_set;

/// What a new file starts with when `config edit` makes one.
const NEW_FILE: &str = "# Talaria's configuration. `talaria config show` prints every setting\n\
                        # as it takes effect, `talaria config check` checks this file.\n";

/// Prints the effective value of `key` (secrets masked): a scalar as is,
/// a mapping or list as YAML.
pub fn get(home: &Home, key: &str) -> anyhow::Result<ExitCode> {
    let path = yaml_set::parse_key(key).map_err(anyhow::Error::msg)?;
    let report = Report::gather(home);
    let (tree, from_env) = report.effective().map_err(anyhow::Error::msg)?;
    let mut node = tree;
    for (i, part) in path.iter().enumerate() {
        match node.get(part) {
            Some(child) => node = child,
            None => {
                eprintln!("{}", unknown(key, &path[..i], node));
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    match node {
        Value::String(s) => println!("{s}"),
        Value::Null => println!("null"),
        Value::Bool(_) | Value::Number(_) => println!("{node}"),
        _ => print!("{}", serde_saphyr::to_string(node)?),
    }
    if let Some(v) = from_env.iter().find(|v| v.key == key) {
        eprintln!("(from {} in {})", v.var, v.origin);
    }
    Ok(ExitCode::SUCCESS)
}

/// Why `key` names no setting, with the settings its deepest existing
/// parent has.
fn unknown(key: &str, found: &[String], parent: &Value) -> String {
    let mut said = format!("no setting `{key}`");
    if let Value::Object(map) = parent {
        let names: Vec<&str> = map.keys().map(String::as_str).collect();
        if found.is_empty() {
            said.push_str(&format!("; the sections are: {}", names.join(", ")));
        } else {
            said.push_str(&format!(
                "; `{}` has: {}",
                found.join("."),
                names.join(", ")
            ));
        }
    } else if !found.is_empty() {
        said.push_str(&format!("; `{}` is a single value", found.join(".")));
    }
    said
}

/// Sets `key` to `value` (read as a YAML scalar) in `config.yaml`, in
/// place; nothing is written unless the result loads and passes
/// `config check` with no error or warning the file did not have.
pub fn set(home: &Home, key: &str, value: &str) -> anyhow::Result<ExitCode> {
    let file = home.config_file();
    let parsed = yaml_set::parse_key(key)
        .and_then(|path| yaml_set::parse_value(value).map(|value| (path, value)));
    let (path, value) = match parsed {
        Ok(parsed) => parsed,
        Err(why) => {
            eprintln!("error: {why}\nnothing was written to {}", file.display());
            return Ok(ExitCode::FAILURE);
        }
    };
    let old = read(&file)?;
    let text = old.as_deref().unwrap_or("");
    let new = match yaml_set::set(text, &path, &value) {
        Ok(new) => new,
        Err(why) => {
            eprintln!(
                "cannot set `{key}` in {}: {why}\nnothing was written",
                file.display()
            );
            return Ok(ExitCode::FAILURE);
        }
    };
    if old.as_deref() == Some(new.as_str()) {
        println!("{key} is already {}; nothing changed", shown(home, key));
        return Ok(ExitCode::SUCCESS);
    }
    let before = Report::of_text(home, text).findings();
    let after = Report::of_text(home, &new);
    let problems = match after.findings() {
        Err(e) => vec![format!("the file would not load: {e}")],
        // A key nothing reads is nearly always a misspelt one.
        Ok(found) => added(&before, &found, true),
    };
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("error: {p}");
        }
        if let Some(hint) = known_near(home, key, &path) {
            eprintln!("{hint}");
        }
        eprintln!("nothing was written to {}", file.display());
        return Ok(ExitCode::FAILURE);
    }
    let was = old.as_ref().map(|_| shown(home, key));
    let backup = write(&file, old.as_deref(), &new)?;
    let now = shown(home, key);
    match was {
        Some(was) if was != now => println!("{key}: {was} -> {now}"),
        _ => println!("{key}: {now}"),
    }
    if let Some(backup) = backup {
        eprintln!("previous file kept as {}", backup.display());
    }
    after_write_notes(home, key, &before, &after);
    Ok(ExitCode::SUCCESS)
}

/// When `path` is not a setting of this build, what its deepest parent
/// that is one has.
fn known_near(home: &Home, key: &str, path: &[String]) -> Option<String> {
    let report = Report::gather(home);
    let (tree, _) = report.effective().ok()?;
    let mut node = tree;
    for (i, part) in path.iter().enumerate() {
        match node.get(part) {
            Some(child) => node = child,
            None => return Some(unknown(key, &path[..i], node)),
        }
    }
    None
}

/// The effective value of `key` as `config get` prints it, on one line.
fn shown(home: &Home, key: &str) -> String {
    let report = Report::gather(home);
    let Ok((tree, _)) = report.effective() else {
        return "?".to_owned();
    };
    let mut node = tree;
    for part in key.split('.') {
        match node.get(part) {
            Some(child) => node = child,
            None => return "?".to_owned(),
        }
    }
    match node {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// What is worth knowing once a change is written: a value the
/// environment overrides, errors the file had already, that a running
/// gateway reads the file at its start.
fn after_write_notes(home: &Home, key: &str, before: &Result<Findings, String>, after: &Report) {
    if let Ok((_, from_env)) = after.effective()
        && let Some(v) = from_env.iter().find(|v| v.key == key)
    {
        eprintln!(
            "note: {} from {} takes the place of this value",
            v.var, v.origin
        );
    }
    if let Ok(found) = after.findings() {
        let new = added(before, &found, false);
        for e in found.errors.iter().filter(|e| !new.contains(e)) {
            eprintln!("note: still to fix: {e}");
        }
        let old_notes = before.as_ref().map(|b| b.notes.as_slice()).unwrap_or(&[]);
        for n in found.notes.iter().filter(|n| !old_notes.contains(n)) {
            eprintln!("warning: {n}");
        }
    }
    if talaria_gateway::process::running_gateway(home).is_some() {
        eprintln!("note: the running gateway uses the new value once restarted");
    }
}

/// The errors (and, when `warnings`, the warnings) `after` has that
/// `before` did not: what a change brings. A change to a file that did
/// not load is judged by loading alone: it mends the file, whatever else
/// remains to fix.
fn added(before: &Result<Findings, String>, after: &Findings, warnings: bool) -> Vec<String> {
    let Ok(before) = before else {
        return Vec::new();
    };
    // By topic: an endpoint that was unusable and still is, for another
    // reason, is the same thing left to fix.
    let mut out: Vec<String> = after
        .errors
        .iter()
        .zip(&after.topics)
        .filter(|(_, topic)| !before.topics.contains(topic))
        .map(|(e, _)| e.clone())
        .collect();
    if warnings {
        out.extend(
            after
                .warnings
                .iter()
                .filter(|w| !before.warnings.contains(w))
                .cloned(),
        );
    }
    out
}

/// Opens `$VISUAL`, `$EDITOR` or `vi` on `config.yaml`, then checks the
/// result: kept (with a `.bak` of what it replaces) when it passes
/// `config check` with no error the file did not have; otherwise, on a
/// terminal, offered for another edit, and else kept aside while the
/// previous file is put back.
pub async fn edit(home: &Home) -> anyhow::Result<ExitCode> {
    let file = home.config_file();
    let old = read(&file)?;
    if old.is_none() {
        write(&file, None, NEW_FILE)?;
    }
    let start = old.clone().unwrap_or_else(|| NEW_FILE.to_owned());
    let before = Report::of_text(home, &start).findings();
    let editor = std::env::var("VISUAL")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .or_else(|| {
            std::env::var("EDITOR")
                .ok()
                .filter(|v| !v.trim().is_empty())
        })
        .unwrap_or_else(|| "vi".to_owned());
    // Ctrl-C belongs to the editor while it runs (it reaches it, being in
    // the terminal's foreground group) and must not end this process
    // before the check and the restore; at the question after an invalid
    // edit it means no. Caught from here on: the handler is in place once
    // `signal` returns.
    let mut interrupts =
        signal(SignalKind::interrupt()).context("cannot take Ctrl-C while the editor runs")?;
    edit_until_valid(
        home,
        &file,
        old.as_deref(),
        &start,
        &before,
        &editor,
        &mut interrupts,
    )
    .await
}

async fn edit_until_valid(
    home: &Home,
    file: &Path,
    old: Option<&str>,
    start: &str,
    before: &Result<Findings, String>,
    editor: &str,
    interrupts: &mut Signal,
) -> anyhow::Result<ExitCode> {
    loop {
        let mut child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{editor} \"$1\""))
            .arg("sh")
            .arg(file)
            .spawn()
            .with_context(|| format!("cannot start the editor `{editor}`"))?;
        let status = loop {
            tokio::select! {
                status = child.wait() => {
                    break status.with_context(|| format!("cannot wait for the editor `{editor}`"))?;
                }
                _ = interrupts.recv() => {}
            }
        };
        let new = read(file)?.unwrap_or_default();
        if !status.success() {
            eprintln!("the editor `{editor}` failed ({status})");
            return give_up(file, old, start, &new);
        }
        if new == start {
            if old.is_none() {
                // Only the header this command wrote: no file was wanted.
                std::fs::remove_file(file)
                    .with_context(|| format!("cannot remove {}", file.display()))?;
            }
            println!("no changes");
            return Ok(ExitCode::SUCCESS);
        }
        let after = Report::of_text(home, &new);
        let problems = match after.findings() {
            Err(e) => vec![e],
            Ok(found) => {
                for w in added(before, &found, true)
                    .iter()
                    .filter(|w| !found.errors.contains(w))
                {
                    eprintln!("warning: {w}");
                }
                added(before, &found, false)
            }
        };
        if problems.is_empty() {
            if let Ok(found) = after.findings() {
                for e in &found.errors {
                    eprintln!("note: still to fix: {e}");
                }
            }
            // The editor wrote the file; the backup is the text before it.
            let backup = match old {
                Some(old) => Some(backup(file, old)?),
                None => None,
            };
            println!("saved {}", file.display());
            if let Some(backup) = backup {
                eprintln!("previous file kept as {}", backup.display());
            }
            if talaria_gateway::process::running_gateway(home).is_some() {
                eprintln!("note: the running gateway uses the new settings once restarted");
            }
            return Ok(ExitCode::SUCCESS);
        }
        for p in &problems {
            eprintln!("error: {p}");
        }
        if !again(interrupts).await? {
            return give_up(file, old, start, &new);
        }
    }
}

/// Whether to open the editor again: asked on a terminal, no elsewhere;
/// Ctrl-C and Ctrl-D say no.
async fn again(interrupts: &mut Signal) -> anyhow::Result<bool> {
    if !std::io::stdin().is_terminal() {
        return Ok(false);
    }
    eprint!("Edit again? [Y/n] ");
    std::io::stderr().flush()?;
    // Read on a thread of its own, so Ctrl-C can answer instead; a read
    // left waiting there ends with the process.
    let answer = tokio::task::spawn_blocking(|| {
        let mut answer = String::new();
        let read = std::io::stdin().lock().read_line(&mut answer)?;
        Ok::<_, std::io::Error>((read > 0).then_some(answer))
    });
    let answer = tokio::select! {
        answer = answer => answer.context("cannot read the answer")??,
        _ = interrupts.recv() => None,
    };
    let Some(answer) = answer else {
        eprintln!();
        return Ok(false);
    };
    Ok(!matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "n" | "no"
    ))
}

/// Puts the previous file back (none, when there was none), keeping the
/// rejected text aside if it differs from what was there.
fn give_up(file: &Path, old: Option<&str>, start: &str, new: &str) -> anyhow::Result<ExitCode> {
    if new != start {
        let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S");
        let aside = sibling(file, &format!("rejected-{stamp}"));
        write(&aside, None, new)?;
        eprintln!("your edit is kept in {}", aside.display());
    }
    match old {
        Some(old) => {
            write(file, None, old)?;
            eprintln!("{} is as it was", file.display());
        }
        None => {
            std::fs::remove_file(file)
                .with_context(|| format!("cannot remove {}", file.display()))?;
            eprintln!("no {} was made", file.display());
        }
    }
    Ok(ExitCode::FAILURE)
}

/// The file's text; `None` when there is no file.
fn read(file: &Path) -> anyhow::Result<Option<String>> {
    match std::fs::read_to_string(file) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", file.display())),
    }
}

/// `<file>.<suffix>` beside `file`.
fn sibling(file: &Path, suffix: &str) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_owned();
    name.push(".");
    name.push(suffix);
    file.with_file_name(name)
}

/// Writes `old` to `<file>.bak`, with the file's permissions.
fn backup(file: &Path, old: &str) -> anyhow::Result<PathBuf> {
    let real = real_path(file);
    let backup = sibling(&real, "bak");
    write_replacing(&backup, old, permissions(&real))?;
    Ok(backup)
}

/// Writes `new` to `file` in one step (a reader never sees half of it),
/// after keeping `old` as `<file>.bak`; the backup's path, if one was
/// made. A file that is a link is written where the link points.
fn write(file: &Path, old: Option<&str>, new: &str) -> anyhow::Result<Option<PathBuf>> {
    let backup = match old {
        Some(old) => Some(backup(file, old)?),
        None => None,
    };
    let real = real_path(file);
    write_replacing(&real, new, permissions(&real))?;
    Ok(backup)
}

/// Where `file` really is: the target of a link, so that writing
/// replaces the file and not the link.
fn real_path(file: &Path) -> PathBuf {
    std::fs::canonicalize(file).unwrap_or_else(|_| file.to_owned())
}

/// The permissions of `file`, or owner-only for a new one (the file may
/// hold keys).
fn permissions(file: &Path) -> std::fs::Permissions {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(file)
        .map(|m| m.permissions())
        .unwrap_or_else(|_| std::fs::Permissions::from_mode(0o600))
}

fn write_replacing(path: &Path, text: &str, mode: std::fs::Permissions) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut temp = tempfile::Builder::new()
        .prefix(".talaria-config-")
        .tempfile_in(dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    temp.write_all(text.as_bytes())
        .and_then(|()| temp.as_file().sync_all())
        .and_then(|()| std::fs::set_permissions(temp.path(), mode))
        .with_context(|| format!("cannot write {}", path.display()))?;
    temp.persist(path)
        .map_err(|e| e.error)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_key_names_what_its_parent_has() {
        let tree = serde_json::json!({"agent": {"max_turns": 20, "api_max_retries": 2}});
        let said = unknown("agent.max_turn", &["agent".to_owned()], &tree["agent"]);
        assert_eq!(
            said,
            "no setting `agent.max_turn`; `agent` has: api_max_retries, max_turns"
        );
        let said = unknown("agnt.x", &[], &tree);
        assert_eq!(said, "no setting `agnt.x`; the sections are: agent");
    }

    #[test]
    fn a_write_replaces_the_file_keeps_a_backup_and_follows_a_link() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.yaml");
        std::fs::write(&real, "a: 1\n").unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o640)).unwrap();
        let link = dir.path().join("config.yaml");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let backup = write(&link, Some("a: 1\n"), "a: 2\n").unwrap().unwrap();
        assert_eq!(backup, real.with_file_name("real.yaml.bak"));
        assert_eq!(std::fs::read_to_string(&backup).unwrap(), "a: 1\n");
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(std::fs::read_to_string(&link).unwrap(), "a: 2\n");
        let mode = std::fs::metadata(&real).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
    }
}
