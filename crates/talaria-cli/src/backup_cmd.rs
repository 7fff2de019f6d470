//! `talaria backup` and `talaria restore`: one archive of a home, and a
//! home made again from one.
//!
//! The archive is a gzip'd tar holding `MANIFEST.json` first, then the
//! home's files under `home/`: the database as a consistent snapshot
//! (SQLite's online backup API, so a running gateway is fine),
//! `config.yaml`, `SOUL.md`, memories, skills, the learning log, hooks,
//! cron output and the chat history; `.env` only with `--with-secrets`.
//! Logs, the media cache, tool output, workspaces and a running
//! gateway's PID, socket and status files are left out: they are made
//! again, or belong to a process that is not in the archive.
//!
//! The manifest lists every file with its size and SHA-256. A restore
//! unpacks into a staging folder beside the home, checks every file
//! against the manifest (nothing missing, nothing extra, nothing outside
//! `home/`, no links) and the database's integrity, and only then puts
//! the staging folder in the home's place. A home that is not empty is
//! only replaced with `--force`, never while its gateway runs, and is
//! kept beside it under a dated name rather than deleted.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use talaria_core::Home;
use talaria_gateway::process;

/// The archive format this build writes and reads.
const FORMAT: u32 = 1;

/// What is backed up, relative to the home: files and whole folders.
const INCLUDED: &[&str] = &[
    "config.yaml",
    "SOUL.md",
    "chat_history",
    "memories",
    "skills",
    "learning",
    "hooks",
    "cron",
];

const MANIFEST: &str = "MANIFEST.json";
const PREFIX: &str = "home";

/// One file in the archive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    /// Relative to the home, `/`-separated.
    path: String,
    size: u64,
    sha256: String,
}

/// `MANIFEST.json`.
#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    format: u32,
    talaria_version: String,
    created: String,
    with_secrets: bool,
    files: Vec<Entry>,
}

/// `talaria backup [FILE] [--with-secrets]`.
pub fn backup(home: &Home, file: Option<PathBuf>, with_secrets: bool) -> anyhow::Result<ExitCode> {
    if !home.root().is_dir() {
        bail!("there is no home at {} to back up", home.root().display());
    }
    let file = file.unwrap_or_else(|| {
        PathBuf::from(format!(
            "talaria-backup-{}.tar.gz",
            chrono::Local::now().format("%Y%m%d-%H%M%S")
        ))
    });
    if file.exists() {
        bail!(
            "{} exists already; name another file, or move it away first",
            file.display()
        );
    }
    let staging = tempfile::Builder::new()
        .prefix(".talaria-backup-")
        .tempdir_in(home.root())
        .context("cannot make a staging folder in the home")?;
    // The database, as of one moment.
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    if home.state_db().exists() {
        let snapshot = staging.path().join("state.db");
        talaria_store::snapshot::snapshot_sqlite(&home.state_db(), &snapshot)
            .context("cannot copy the database")?;
        files.push(("state.db".to_owned(), snapshot));
    }
    let mut names: Vec<&str> = INCLUDED.to_vec();
    if with_secrets {
        names.push(".env");
    }
    for name in names {
        collect(home.root(), Path::new(name), &mut files)?;
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    let mut entries = Vec::new();
    for (rel, path) in &files {
        let (size, sha256) = digest(path).with_context(|| format!("cannot read {rel}"))?;
        entries.push(Entry {
            path: rel.clone(),
            size,
            sha256,
        });
    }
    let manifest = Manifest {
        format: FORMAT,
        talaria_version: env!("CARGO_PKG_VERSION").to_owned(),
        created: chrono::Utc::now().to_rfc3339(),
        with_secrets,
        files: entries,
    };
    // Written beside the target and renamed at the end: a backup that
    // stops halfway leaves no file that looks whole.
    let partial = file.with_extension("partial");
    let written = write_archive(&partial, &manifest, &files);
    if let Err(e) = written {
        let _ = fs::remove_file(&partial);
        return Err(e);
    }
    fs::rename(&partial, &file)
        .with_context(|| format!("cannot name the archive {}", file.display()))?;
    let total: u64 = manifest.files.iter().map(|e| e.size).sum();
    println!(
        "Backed up {} ({} bytes) to {}{}",
        crate::count(manifest.files.len(), "file", "files"),
        total,
        file.display(),
        if with_secrets {
            "; it holds the .env secrets: keep it safe"
        } else {
            " (without .env: pass --with-secrets to include it)"
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// Adds the file or the files under `rel` (relative to `root`) to
/// `files`; what does not exist is skipped, links are not followed.
fn collect(root: &Path, rel: &Path, files: &mut Vec<(String, PathBuf)>) -> anyhow::Result<()> {
    let path = root.join(rel);
    let Ok(meta) = fs::symlink_metadata(&path) else {
        return Ok(());
    };
    if meta.is_file() {
        let name = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/");
        files.push((name, path));
    } else if meta.is_dir() {
        let mut children: Vec<_> = fs::read_dir(&path)
            .with_context(|| format!("cannot list {}", path.display()))?
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        children.sort();
        for child in children {
            collect(root, &rel.join(child), files)?;
        }
    }
    Ok(())
}

fn digest(path: &Path) -> io::Result<(u64, String)> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hex(&hasher.finalize())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_archive(
    file: &Path,
    manifest: &Manifest,
    files: &[(String, PathBuf)],
) -> anyhow::Result<()> {
    let out = private_file(file).with_context(|| format!("cannot create {}", file.display()))?;
    let gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let json = serde_json::to_vec_pretty(manifest)?;
    let mut header = tar::Header::new_gnu();
    header.set_size(json.len() as u64);
    header.set_mode(0o600);
    header.set_mtime(chrono::Utc::now().timestamp().max(0) as u64);
    header.set_cksum();
    tar.append_data(&mut header, MANIFEST, json.as_slice())?;
    for ((rel, path), entry) in files.iter().zip(&manifest.files) {
        let mut f = File::open(path).with_context(|| format!("cannot read {rel}"))?;
        let mut header = tar::Header::new_gnu();
        header.set_size(entry.size);
        header.set_mode(0o600);
        header.set_mtime(chrono::Utc::now().timestamp().max(0) as u64);
        header.set_cksum();
        // A file that changed size since it was hashed would not match
        // its manifest line; the restore would refuse the archive.
        tar.append_data(
            &mut header,
            format!("{PREFIX}/{rel}"),
            (&mut f).take(entry.size),
        )?;
    }
    let gz = tar.into_inner()?;
    let out = gz.finish()?;
    out.sync_all()?;
    Ok(())
}

fn private_file(path: &Path) -> io::Result<File> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

/// `talaria restore FILE [--force]`.
pub fn restore(home: &Home, file: &Path, force: bool) -> anyhow::Result<ExitCode> {
    // The empty folders every command makes in a new home do not count.
    let occupied = holds_files(home.root());
    if occupied && !force {
        bail!(
            "{} is not empty; restore into another home (--home DIR), or pass --force to \
             replace it (the current one is kept beside it)",
            home.root().display()
        );
    }
    if occupied && let Some(info) = process::running_gateway(home) {
        bail!(
            "a gateway is running on {} (pid {}); stop it first: talaria gateway stop",
            home.root().display(),
            info.pid
        );
    }
    let root = home.root();
    let parent = root
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let staging = tempfile::Builder::new()
        .prefix(".talaria-restore-")
        .tempdir_in(parent)
        .context("cannot make a staging folder beside the home")?;
    let manifest = unpack(file, staging.path())?;
    if staging.path().join("state.db").exists() {
        talaria_store::snapshot::check_sqlite(&staging.path().join("state.db"))
            .context("the archive's database is damaged")?;
    }
    set_private(staging.path())?;
    let kept = if occupied {
        let aside = root.with_file_name(format!(
            "{}.replaced-{}",
            root.file_name()
                .map_or("home".into(), |n| n.to_string_lossy()),
            chrono::Local::now().format("%Y%m%d-%H%M%S")
        ));
        fs::rename(root, &aside)
            .with_context(|| format!("cannot move {} aside", root.display()))?;
        Some(aside)
    } else {
        if root.exists() {
            // Only empty folders: nothing is lost.
            fs::remove_dir_all(root)
                .with_context(|| format!("cannot replace {}", root.display()))?;
        }
        None
    };
    let staged = staging.keep();
    if let Err(e) = fs::rename(&staged, root) {
        // Put the old home back rather than leave none.
        if let Some(aside) = &kept {
            let _ = fs::rename(aside, root);
        }
        return Err(e)
            .with_context(|| format!("cannot put the restored home at {}", root.display()));
    }
    println!(
        "Restored {} from {} (written {}) into {}",
        crate::count(manifest.files.len(), "file", "files"),
        file.display(),
        manifest.created,
        root.display()
    );
    if let Some(aside) = kept {
        println!("The home that was there is kept at {}", aside.display());
    }
    if !manifest.with_secrets {
        println!("The archive holds no .env: set the secrets again (talaria setup, or edit .env).");
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether `dir` holds a file (or a link) anywhere below it.
fn holds_files(dir: &Path) -> bool {
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    entries.filter_map(Result::ok).any(|e| match e.file_type() {
        Ok(t) if t.is_dir() => holds_files(&e.path()),
        _ => true,
    })
}

/// Unpacks `file` into `into`, checking it against its manifest.
fn unpack(file: &Path, into: &Path) -> anyhow::Result<Manifest> {
    let f = File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(f));
    let mut manifest: Option<Manifest> = None;
    let mut seen: Vec<Entry> = Vec::new();
    for item in archive
        .entries()
        .context("not a Talaria backup (not a .tar.gz)")?
    {
        let mut item = item.context("the archive is damaged")?;
        let kind = item.header().entry_type();
        let name = item.path().context("an unreadable name")?.into_owned();
        if name == Path::new(MANIFEST) {
            let mut json = Vec::new();
            item.by_ref()
                .take(16 * 1024 * 1024)
                .read_to_end(&mut json)?;
            let m: Manifest =
                serde_json::from_slice(&json).context("the manifest is unreadable")?;
            if m.format != FORMAT {
                bail!(
                    "the archive is of format {}; this talaria reads format {FORMAT}",
                    m.format
                );
            }
            manifest = Some(m);
            continue;
        }
        if !kind.is_file() {
            bail!(
                "the archive holds {} that is not a plain file",
                name.display()
            );
        }
        let rel = name
            .strip_prefix(PREFIX)
            .ok()
            .filter(|r| {
                !r.as_os_str().is_empty()
                    && r.components().all(|c| matches!(c, Component::Normal(_)))
            })
            .with_context(|| format!("the archive holds {}, outside the home", name.display()))?
            .to_owned();
        let dest = into.join(&rel);
        if let Some(dir) = dest.parent() {
            fs::create_dir_all(dir)?;
        }
        let mut out =
            private_file(&dest).with_context(|| format!("cannot write {}", rel.display()))?;
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = item.read(&mut buf).context("the archive is damaged")?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])?;
            size += n as u64;
        }
        out.sync_all()?;
        let path = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/");
        seen.push(Entry {
            path,
            size,
            sha256: hex(&hasher.finalize()),
        });
    }
    let manifest = manifest.context("not a Talaria backup: the archive has no manifest")?;
    let mut listed = manifest.files.clone();
    listed.sort_by(|a, b| a.path.cmp(&b.path));
    seen.sort_by(|a, b| a.path.cmp(&b.path));
    for want in &listed {
        match seen.iter().find(|s| s.path == want.path) {
            None => bail!("the archive lacks {}, which its manifest lists", want.path),
            Some(got) if got != want => bail!(
                "{} does not match the manifest (the archive is damaged or was changed)",
                want.path
            ),
            Some(_) => {}
        }
    }
    if let Some(extra) = seen
        .iter()
        .find(|s| !listed.iter().any(|l| l.path == s.path))
    {
        bail!(
            "the archive holds {}, which its manifest does not list",
            extra.path
        );
    }
    Ok(manifest)
}

/// Folders 0700, as the home's own.
fn set_private(dir: &Path) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                set_private(&entry.path())?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn home_with(files: &[(&str, &str)]) -> (tempfile::TempDir, Home) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("home");
        for (rel, text) in files {
            let p = root.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
        (dir, Home::at(root))
    }

    #[test]
    fn a_round_trip_keeps_the_files_and_leaves_out_what_is_not_ours() {
        let (dir, home) = home_with(&[
            ("config.yaml", "model: {}\n"),
            (".env", "SECRET=1\n"),
            ("memories/MEMORY.md", "the llama is Pablo"),
            ("skills/a/SKILL.md", "---\nname: a\n---\n"),
            ("logs/gateway.log", "noise"),
            ("media/ab", "cache"),
        ]);
        let archive = dir.path().join("b.tar.gz");
        backup(&home, Some(archive.clone()), false).unwrap();
        let target = Home::at(dir.path().join("restored"));
        restore(&target, &archive, false).unwrap();
        let r = target.root();
        assert_eq!(
            fs::read_to_string(r.join("memories/MEMORY.md")).unwrap(),
            "the llama is Pablo"
        );
        assert!(r.join("skills/a/SKILL.md").exists());
        assert!(!r.join(".env").exists(), "secrets only when asked");
        assert!(!r.join("logs").exists() && !r.join("media").exists());
        // A second restore into the same, now full, home needs --force.
        let e = restore(&target, &archive, false).unwrap_err().to_string();
        assert!(e.contains("--force"), "{e}");
        restore(&target, &archive, true).unwrap();
        let kept: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("restored.replaced-")
            })
            .collect();
        assert_eq!(kept.len(), 1, "the replaced home is kept");
    }

    #[test]
    fn a_tampered_or_foreign_archive_is_refused_before_anything_is_written() {
        let (dir, home) = home_with(&[("config.yaml", "a: 1\n"), ("memories/M.md", "x")]);
        let archive = dir.path().join("b.tar.gz");
        backup(&home, Some(archive.clone()), true).unwrap();
        // Re-pack with one file changed but the manifest kept.
        let bad = dir.path().join("bad.tar.gz");
        {
            let mut input =
                tar::Archive::new(flate2::read::GzDecoder::new(File::open(&archive).unwrap()));
            let out = File::create(&bad).unwrap();
            let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
                out,
                flate2::Compression::default(),
            ));
            for item in input.entries().unwrap() {
                let mut item = item.unwrap();
                let name = item.path().unwrap().into_owned();
                let mut data = Vec::new();
                item.read_to_end(&mut data).unwrap();
                if name == Path::new("home/memories/M.md") {
                    data = b"y".to_vec();
                }
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o600);
                h.set_cksum();
                tar.append_data(&mut h, &name, data.as_slice()).unwrap();
            }
            tar.into_inner().unwrap().finish().unwrap();
        }
        let target = Home::at(dir.path().join("t"));
        let e = restore(&target, &bad, false).unwrap_err().to_string();
        assert!(e.contains("memories/M.md"), "{e}");
        assert!(!target.root().exists(), "nothing written");
        let junk = dir.path().join("junk.tar.gz");
        fs::write(&junk, b"not an archive").unwrap();
        assert!(restore(&target, &junk, false).is_err());
        assert!(!target.root().exists());
    }
}
