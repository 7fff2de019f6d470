//! `talaria import hermes`: bringing a hermes-agent home (Talaria's Python
//! ancestor, `~/.hermes`) into this one.
//!
//! The command works in two phases. First everything is read and planned
//! without writing: the ancestor's config mapped to Talaria's keys (and the
//! result loaded as Talaria would, so an import never leaves a
//! configuration that does not start), the variables, memory entries,
//! skills, sessions, cron jobs and pairing approvals that are not here yet.
//! `--dry-run` prints that plan and stops. Otherwise the sessions go in
//! one store transaction each (a session is there whole or not at all),
//! cron jobs and approvals through the store, and every file is written to
//! a temporary name and renamed into place.
//!
//! Everything is compared before it is added, so a second run adds
//! nothing: sessions are keyed by the ancestor's ids, memory entries and
//! variables by their text and names, skills by their names.

mod config_map;
mod files;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use talaria_core::Home;
use talaria_core::config::StoreBackend;
use talaria_gateway::cron::{CronError, Zone, jobs};
use talaria_store::hermes::{HermesDb, HermesSessions};
use talaria_store::sqlite::probe::Present;
use talaria_store::{CronStore, GatewayStore, PairingStore};

use crate::count;

/// Where the ancestor keeps its home unless told otherwise.
const HERMES_HOME_ENV: &str = "HERMES_HOME";

/// What `--from` names, else `$HERMES_HOME`, else `~/.hermes`.
fn source_home(from: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = from {
        return Ok(dir);
    }
    if let Some(dir) = std::env::var_os(HERMES_HOME_ENV).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .context("neither --from, HERMES_HOME nor HOME is set: say where the hermes-agent home is with --from DIR")?;
    Ok(PathBuf::from(home).join(".hermes"))
}

/// What the ancestor's home holds that this command reads; at least one
/// must be there for the folder to be taken for a hermes-agent home.
const HERMES_MARKERS: &[&str] = &[
    "config.yaml",
    "state.db",
    ".env",
    "SOUL.md",
    "memories",
    "skills",
    "cron",
];

/// Checks that `dir` is a readable hermes-agent home.
fn check_source(dir: &Path) -> anyhow::Result<()> {
    let meta = std::fs::metadata(dir).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            anyhow::anyhow!(
                "there is no hermes-agent home at {} (give its folder with --from DIR)",
                dir.display()
            )
        } else {
            anyhow::anyhow!("cannot read the hermes-agent home {}: {e}", dir.display())
        }
    })?;
    if !meta.is_dir() {
        bail!(
            "{} is not a folder; --from takes the hermes-agent home (the folder holding config.yaml and state.db)",
            dir.display()
        );
    }
    std::fs::read_dir(dir)
        .with_context(|| format!("cannot read the hermes-agent home {}", dir.display()))?;
    if !HERMES_MARKERS.iter().any(|m| dir.join(m).exists()) {
        bail!(
            "{} does not look like a hermes-agent home: it holds none of {}",
            dir.display(),
            HERMES_MARKERS.join(", ")
        );
    }
    Ok(())
}

/// One category of the report: a headline and the details under it.
struct Section {
    title: &'static str,
    lines: Vec<String>,
}

impl Section {
    fn new(title: &'static str) -> Section {
        Section {
            title,
            lines: Vec::new(),
        }
    }
    fn line(&mut self, text: impl Into<String>) {
        self.lines.push(text.into());
    }
}

/// `talaria import hermes`.
pub async fn hermes(home: Home, from: Option<PathBuf>, dry_run: bool) -> anyhow::Result<ExitCode> {
    let source = source_home(from)?;
    check_source(&source)?;
    let loaded = crate::sections::load(&home)?;

    // Phase one: read and plan, writing nothing.
    let config = config_map::plan(&source)?;
    let env = files::plan_env(&source, &home)?;
    let soul = files::plan_soul(&source, &home)?;
    let memories = files::plan_memories(&source, &home)?;
    let skills = files::plan_skills(&source, &home)?;
    let (db, sessions) = read_sessions(&source).await?;
    let cron = files::read_cron_jobs(&source)?;
    let pairing = files::read_pairing(&source)?;
    let cron_notes = cron.notes.clone();
    let pairing_notes = pairing.notes.clone();

    // A dry run on SQLite reads the file through a read-only connection
    // (opening the store would migrate it and checkpoint its log, and a
    // dry run leaves the home byte for byte as it was); otherwise the
    // store answers, and is what the import writes to.
    let uses_sqlite = loaded.config.store.backend == StoreBackend::Sqlite;
    let store: Option<Arc<dyn GatewayStore>> = if dry_run && uses_sqlite {
        None
    } else {
        Some(crate::runtime::open_store(&home, &loaded.config, &loaded.env).await?)
    };
    let present = match &store {
        Some(store) => present_in_store(store.as_ref(), &sessions, &cron, &pairing).await?,
        None if home.state_db().exists() => {
            let db = home.state_db();
            let ids: Vec<String> = sessions
                .sessions
                .iter()
                .map(|s| s.record.id.clone())
                .collect();
            let names: Vec<String> = cron
                .jobs
                .iter()
                .filter_map(|j| j.spec.name.clone())
                .collect();
            let users: Vec<(String, String)> = pairing
                .approved
                .iter()
                .map(|a| (a.platform.clone(), a.user_id.clone()))
                .collect();
            tokio::task::spawn_blocking(move || {
                talaria_store::sqlite::probe::present(&db, &ids, &names, &users)
            })
            .await
            .context("the database reader stopped")??
        }
        None => Present::default(),
    };

    let (known, new_sessions): (Vec<_>, Vec<_>) = sessions
        .sessions
        .into_iter()
        .partition(|s| present.sessions.contains(&s.record.id));
    let known_sessions = known.len();
    let (known, new_jobs): (Vec<_>, Vec<_>) = cron.jobs.into_iter().partition(|j| {
        j.spec
            .name
            .as_ref()
            .is_some_and(|n| present.jobs.contains(n))
    });
    let known_jobs = known.len();
    let (known, new_approvals): (Vec<_>, Vec<_>) = pairing.approved.into_iter().partition(|a| {
        present
            .approvals
            .contains(&(a.platform.clone(), a.user_id.clone()))
    });
    let known_approvals = known.len();

    println!(
        "{} {} into {}{}",
        if dry_run { "Would import" } else { "Importing" },
        source.display(),
        home.root().display(),
        if dry_run {
            " (dry run: nothing is changed)"
        } else {
            ""
        }
    );

    // Phase two: write. Files first (each renamed into place whole), so
    // the skills cron jobs name are there when the jobs are checked.
    let mut report = vec![
        files::apply_memories(&home, &memories, dry_run)?,
        files::apply_skills(&home, &skills, dry_run)?,
        files::apply_env(&home, &env, dry_run)?,
        files::apply_soul(&home, &soul, dry_run)?,
        config_map::apply(&home, &config, dry_run)?,
    ];

    let mut s = Section::new("sessions");
    let messages: usize = new_sessions.iter().map(|s| s.messages).sum();
    s.line(format!(
        "{} {} ({}), {} already imported",
        count(new_sessions.len(), "session", "sessions"),
        verb(dry_run, "to import", "imported"),
        count(messages, "message", "messages"),
        known_sessions
    ));
    if sessions.skipped_rows > 0 {
        s.line(format!(
            "{} left out (system rows, and roles Talaria has no place for)",
            count(sessions.skipped_rows, "row", "rows")
        ));
    }
    if !dry_run && let (Some(store), Some(db)) = (&store, &db) {
        // One transcript in memory at a time, however long the history.
        for session in new_sessions {
            let id = session.record.id.clone();
            let db = db.clone();
            let read = id.clone();
            let messages = tokio::task::spawn_blocking(move || {
                db.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .transcript(&read)
            })
            .await
            .context("the session reader stopped")?
            .with_context(|| format!("cannot read session {id}"))?;
            // Without the ancestor's system prompt (it describes its own
            // tools and home), Talaria writes its own on the next turn.
            let imported = talaria_store::ImportedSession {
                record: session.record,
                messages,
            };
            store
                .import_session(imported)
                .await
                .with_context(|| format!("cannot import session {id}"))?;
        }
    }
    report.push(s);

    let mut s = Section::new("cron jobs");
    s.line(format!(
        "{} {}, {} already here (by name)",
        count(new_jobs.len(), "job", "jobs"),
        verb(dry_run, "to import", "imported"),
        known_jobs
    ));
    for note in &cron_notes {
        s.line(note.clone());
    }
    for job in &new_jobs {
        let name = job.spec.name.clone().unwrap_or_default();
        if !job.dropped.is_empty() {
            s.line(format!(
                "job `{name}`: {} not imported (Talaria's jobs have no such setting)",
                job.dropped.join(", ")
            ));
        }
    }
    if !dry_run && let Some(store) = &store {
        let zone = Zone::from_config(&loaded.config.cron).map_err(anyhow::Error::msg)?;
        for job in new_jobs {
            let name = job.spec.name.clone().unwrap_or_default();
            match jobs::create(store.as_ref(), &home, zone, job.spec, chrono::Utc::now()).await {
                Ok(made) => {
                    if job.paused {
                        jobs::pause(store.as_ref(), &made.id).await?;
                    }
                }
                // One job Talaria will not take (a one-shot in the past, a
                // skill that is not here) does not stop the others.
                Err(CronError::Invalid(why)) => {
                    s.line(format!("job `{name}` not imported: {why}"));
                }
                Err(e) => return Err(e).with_context(|| format!("cannot import job `{name}`")),
            }
        }
    }
    report.push(s);

    let mut s = Section::new("pairing");
    s.line(format!(
        "{} {}, {} already approved here",
        count(new_approvals.len(), "approved user", "approved users"),
        verb(dry_run, "to import", "imported"),
        known_approvals
    ));
    for note in &pairing_notes {
        s.line(note.clone());
    }
    if !dry_run && let Some(store) = &store {
        for a in &new_approvals {
            store
                .pairing_grant(
                    &a.platform,
                    &a.user_id,
                    a.user_name.as_deref(),
                    a.approved_at,
                )
                .await
                .with_context(|| {
                    format!("cannot import the approval of {}:{}", a.platform, a.user_id)
                })?;
        }
    }
    report.push(s);

    for section in &report {
        println!("{}:", section.title);
        for line in &section.lines {
            println!("  {line}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What of the import `store` holds already.
async fn present_in_store(
    store: &dyn GatewayStore,
    sessions: &HermesSessions,
    cron: &files::CronJobs,
    pairing: &files::Pairing,
) -> anyhow::Result<Present> {
    let mut present = Present::default();
    for s in &sessions.sessions {
        if store.session(&s.record.id).await?.is_some() {
            present.sessions.insert(s.record.id.clone());
        }
    }
    for name in cron.jobs.iter().filter_map(|j| j.spec.name.as_ref()) {
        if CronStore::job(store, name).await?.is_some() {
            present.jobs.insert(name.clone());
        }
    }
    for a in &pairing.approved {
        if PairingStore::pairing_is_approved(store, &a.platform, &a.user_id).await? {
            present
                .approvals
                .insert((a.platform.clone(), a.user_id.clone()));
        }
    }
    Ok(present)
}

/// The ancestor's session database, when it has one, and its sessions
/// (without their transcripts).
async fn read_sessions(
    source: &Path,
) -> anyhow::Result<(Option<Arc<Mutex<HermesDb>>>, HermesSessions)> {
    let db = source.join("state.db");
    if !db.exists() {
        return Ok((None, HermesSessions::default()));
    }
    let path = db.clone();
    let (reader, sessions) = tokio::task::spawn_blocking(move || {
        let reader = HermesDb::open(&path)?;
        let sessions = reader.sessions()?;
        Ok::<_, talaria_store::StoreError>((reader, sessions))
    })
    .await
    .context("the session reader stopped")?
    .with_context(|| format!("cannot import the sessions of {}", db.display()))?;
    Ok((Some(Arc::new(Mutex::new(reader))), sessions))
}

/// The words for what happens: what a dry run would do, or what was done.
fn verb(dry_run: bool, would: &'static str, did: &'static str) -> &'static str {
    if dry_run { would } else { did }
}

/// Names in `names` joined for a report line, at most a few.
fn some_names<'a>(names: impl IntoIterator<Item = &'a String>) -> String {
    const SHOWN: usize = 8;
    let names: Vec<&String> = names.into_iter().collect();
    let mut text = names
        .iter()
        .take(SHOWN)
        .map(|n| n.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(", and {} more", names.len() - SHOWN));
    }
    text
}
