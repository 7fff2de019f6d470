//! `talaria skills list | show | pin | unpin | archive | restore`, and
//! the curator's look at start-up.

use std::collections::HashSet;
use std::process::ExitCode;

use chrono::Utc;
use talaria_learning::curator;
use talaria_learning::skills::Origin;

use crate::cli::SkillsCommand;
use crate::runtime::Runtime;

pub async fn run(rt: &Runtime, command: SkillsCommand) -> anyhow::Result<ExitCode> {
    let lib = rt.skills.clone();
    let result: Result<String, String> = match command {
        SkillsCommand::List => {
            let records = lib.usage().all();
            let skills = lib.list();
            // The learning log says who wrote a skill: one the agent wrote
            // (even when asked to) is learned, as the learning graph shows.
            let learned = talaria_learning::skill_history::written_by_agent(&lib);
            // Columns as wide as the longest category and name, so a long
            // name does not push its row out of line.
            let category_width = skills.iter().map(|s| s.category.chars().count()).max();
            let name_width = skills.iter().map(|s| s.name.chars().count()).max();
            let mut out = String::new();
            for s in &skills {
                let r = records.get(&s.name).cloned().unwrap_or_default();
                let mut notes = vec![match s.origin {
                    Origin::User if learned.contains(&s.name) => "learned by the agent",
                    Origin::User => "yours",
                    Origin::Bundled => "bundled",
                }];
                if r.pinned {
                    notes.push("pinned");
                }
                if r.state != talaria_learning::skills::usage::SkillState::Active {
                    notes.push("stale");
                }
                out.push_str(&format!(
                    "{:<cw$}  {:<nw$}  used {:>3}  ({})\n    {}\n",
                    s.category,
                    s.name,
                    r.use_count,
                    notes.join(", "),
                    s.description,
                    cw = category_width.unwrap_or(0),
                    nw = name_width.unwrap_or(0),
                ));
            }
            Ok(out.trim_end().to_owned())
        }
        // The library's own message names the agent's tool; a person
        // lists skills with the command.
        SkillsCommand::Show { name } if lib.find(&name).is_none() => Err(no_such_skill(&name)),
        SkillsCommand::Show { name } => lib
            .read(&name)
            .map(|s| {
                let mut text = s.text.trim_end().to_owned();
                if !s.files.is_empty() {
                    text.push_str(&format!("\n\n(files: {})", s.files.join(", ")));
                }
                text
            })
            .map_err(|e| e.to_string()),
        SkillsCommand::Pin { name } | SkillsCommand::Unpin { name }
            if lib.find(&name).is_none() =>
        {
            Err(no_such_skill(&name))
        }
        SkillsCommand::Pin { name } => {
            lib.usage().change(&name, |r| r.pinned = true);
            Ok(format!(
                "pinned {name}: the curator leaves it alone and it cannot be deleted"
            ))
        }
        SkillsCommand::Unpin { name } => {
            lib.usage().change(&name, |r| r.pinned = false);
            Ok(format!("unpinned {name}"))
        }
        SkillsCommand::Archive { name } => curator::archive(&lib, &name, Utc::now())
            .map(|()| format!("archived {name}; `talaria skills restore {name}` brings it back"))
            .map_err(|e| e.to_string()),
        SkillsCommand::Restore { name } => curator::restore(&lib, &name, Utc::now())
            .map(|dir| format!("restored {name} to {}", dir.display()))
            .map_err(|e| e.to_string()),
        SkillsCommand::History { name } => {
            let wanted = name.map(|n| format!("skill:{n}"));
            let lines: Vec<String> = lib
                .log()
                .entries()
                .into_iter()
                .filter(|e| {
                    wanted
                        .as_ref()
                        .is_none_or(|w| e.target == *w || e.target.starts_with(&format!("{w}/")))
                })
                .map(|e| {
                    let short = |h: &Option<String>| {
                        h.as_deref()
                            .map_or("-".to_owned(), |h| h[..12.min(h.len())].to_owned())
                    };
                    format!(
                        "{}  {:<7} {:<11} {:<32} {} -> {}",
                        e.at.format("%Y-%m-%d %H:%M"),
                        e.actor,
                        e.action,
                        e.target,
                        short(&e.before),
                        short(&e.after)
                    )
                })
                .collect();
            Ok(if lines.is_empty() {
                "no changes recorded yet".to_owned()
            } else {
                lines.join("\n")
            })
        }
        SkillsCommand::Rollback { name } => {
            talaria_learning::skill_history::rollback_skill(&lib, &name).map_err(|e| e.to_string())
        }
    };
    match result {
        Ok(text) => {
            println!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("talaria: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

fn no_such_skill(name: &str) -> String {
    format!("no skill named `{name}`; `talaria skills list` shows them")
}

/// The curator's look when the CLI starts (it runs when its interval has
/// passed); a failure is logged, never in the way.
pub async fn curate_at_start(rt: &Runtime) {
    // Most starts are not due: skip reading the cron jobs then.
    if !curator::is_due(&rt.skills, &rt.config.curator, Utc::now()) {
        return;
    }
    let in_use: HashSet<String> = match rt.gateway_store.jobs().await {
        Ok(jobs) => jobs.into_iter().flat_map(|j| j.skills).collect(),
        Err(e) => {
            tracing::warn!("the skills curator was skipped: cannot read the cron jobs ({e})");
            return;
        }
    };
    let lib = rt.skills.clone();
    let config = rt.config.curator.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        curator::run_if_due(&lib, &config, &in_use, Utc::now())
    })
    .await;
    match outcome {
        Ok(Ok(Some(report))) if !report.is_empty() => eprintln!("{}", report.summary()),
        Ok(Err(e)) => tracing::warn!("the skills curator failed: {e}"),
        _ => {}
    }
}

/// `talaria learn graph`.
pub async fn graph(
    rt: &Runtime,
    format: crate::cli::GraphFormat,
    output: Option<std::path::PathBuf>,
) -> anyhow::Result<ExitCode> {
    use crate::cli::GraphFormat;
    let g = talaria_learning::graph::build(&rt.skills, &rt.home);
    let text = match format {
        GraphFormat::Json => serde_json::to_string_pretty(&g)?,
        GraphFormat::Dot => talaria_learning::graph::to_dot(&g),
        GraphFormat::Html => talaria_learning::graph::to_html(&g),
    };
    match output {
        Some(path) => {
            std::fs::write(&path, text)
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
            eprintln!(
                "wrote {} ({}, {})",
                path.display(),
                crate::count(g.stats.learned_skills, "learned skill", "learned skills"),
                crate::count(g.stats.memory_nodes, "memory card", "memory cards")
            );
        }
        None => println!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `talaria memory show | edit`.
pub async fn memory(rt: &Runtime, command: crate::cli::MemoryCommand) -> anyhow::Result<ExitCode> {
    use crate::cli::{MemoryCommand, MemoryFile};
    let dir = rt.home.memories_dir();
    match command {
        MemoryCommand::Show => {
            for (file, title) in [("MEMORY.md", "Agent's notes"), ("USER.md", "About you")] {
                let path = dir.join(file);
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let entries: Vec<&str> = text
                    .split(talaria_agent::tools::memory::ENTRY_DELIMITER)
                    .map(str::trim)
                    .filter(|e| !e.is_empty())
                    .collect();
                println!(
                    "{title} ({}, {}):",
                    path.display(),
                    crate::count(entries.len(), "entry", "entries")
                );
                for entry in entries {
                    println!("  - {}", entry.replace('\n', "\n    "));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        MemoryCommand::Edit { file } => {
            let name = match file {
                MemoryFile::Memory => "MEMORY.md",
                MemoryFile::User => "USER.md",
            };
            std::fs::create_dir_all(&dir)?;
            let path = dir.join(name);
            if !path.exists() {
                std::fs::write(&path, "")?;
            }
            let before = std::fs::read(&path).ok();
            let editor = std::env::var("VISUAL")
                .or_else(|_| std::env::var("EDITOR"))
                .unwrap_or_else(|_| "vi".into());
            let status = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("{editor} \"$1\""))
                .arg("sh")
                .arg(&path)
                .status()
                .map_err(|e| anyhow::anyhow!("cannot start the editor `{editor}`: {e}"))?;
            if !status.success() {
                anyhow::bail!("the editor `{editor}` failed ({status})");
            }
            let after = std::fs::read(&path).ok();
            rt.skills.log().record(
                "user",
                "memory",
                &format!("memory:{name}"),
                &path,
                before.as_deref(),
                after.as_deref(),
            );
            println!("saved {}; new sessions will see it", path.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}
