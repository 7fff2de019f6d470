//! The learning log read skill by skill: which of the user's skills the
//! agent wrote, and undoing its latest change to one
//! (`talaria skills rollback`). Apart from [`crate::log`] because these
//! need the skills library, which itself writes to the log.

use std::collections::BTreeSet;

use crate::skills::{Library, SkillError};

/// The user's skills the agent wrote: those its background review made of
/// its own accord (`created_by: agent` in the usage file, which the curator
/// manages) and those it made in a conversation, asked or not (from the
/// learning log). Every other skill in the user's folder is the user's own.
pub fn written_by_agent(library: &Library) -> BTreeSet<String> {
    let mut names = library.log().skills_created_by_agent();
    names.extend(
        library
            .usage()
            .all()
            .into_iter()
            .filter(|(_, r)| r.created_by.as_deref() == Some("agent"))
            .map(|(name, _)| name),
    );
    names
}

/// Undoes the latest change the agent or its review made to skill
/// `name`'s SKILL.md: puts back the content before it (or removes a skill
/// it created). The undo is logged too, as `user`. Returns what was done.
pub fn rollback_skill(library: &Library, name: &str) -> Result<String, SkillError> {
    let log = library.log();
    let target = format!("skill:{name}");
    let entry = log
        .entries()
        .into_iter()
        .rev()
        .find(|e| e.target == target && (e.actor == "agent" || e.actor == "review"))
        .ok_or_else(|| {
            SkillError(format!(
                "the learning log has no change by the agent to `{name}`"
            ))
        })?;
    let path = log.home().join(&entry.path);
    let current = std::fs::read(&path).ok();
    let message = match &entry.before {
        None => {
            let dir = path
                .parent()
                .ok_or_else(|| SkillError("the logged path has no folder".into()))?;
            if dir.exists() {
                std::fs::remove_dir_all(dir)
                    .map_err(|e| SkillError(format!("cannot remove {}: {e}", dir.display())))?;
            }
            library.usage().forget(name);
            format!("removed `{name}`, which the agent had created")
        }
        Some(hash) => {
            let content = log.blob(hash).ok_or_else(|| {
                SkillError(format!(
                    "the content before is missing from the log ({hash})"
                ))
            })?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| SkillError(format!("cannot create {}: {e}", dir.display())))?;
            }
            std::fs::write(&path, &content)
                .map_err(|e| SkillError(format!("cannot write {}: {e}", path.display())))?;
            format!(
                "restored `{name}` to before the {} by the {} at {}",
                entry.action,
                entry.actor,
                entry.at.format("%Y-%m-%d %H:%M UTC")
            )
        }
    };
    let after = std::fs::read(&path).ok();
    log.record(
        "user",
        "rollback",
        &target,
        &path,
        current.as_deref(),
        after.as_deref(),
    );
    library.invalidate();
    Ok(message)
}
