//! The skill tools, with the ancestor's names and arguments:
//! `skills_list`, `skill_view` and `skill_manage`. `skills_list` also
//! carries the skills index into the system prompt of new sessions.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::Utc;
use serde_json::{Value, json};
use talaria_agent::tools::{Tool, ToolContext, ToolError, ToolResult};

use crate::skills::{Library, Origin, SkillError, SkillInfo};

/// The three skill tools over one library.
pub fn skill_tools(library: Arc<Library>) -> Vec<Arc<dyn Tool>> {
    tools(library, None)
}

/// The skill tools as the background review gets them: what it creates is
/// marked as the agent's own, and it may change only skills the agent
/// created, and only after reading them with `skill_view` in this review
/// (read before write).
pub fn review_skill_tools(library: Arc<Library>) -> Vec<Arc<dyn Tool>> {
    tools(library, Some(Arc::new(Mutex::new(HashSet::new()))))
}

/// `skill_manage` alone, for a caller other than the model (the HTTP
/// API): the same checks and the same learning log, its changes recorded
/// as `actor`'s.
pub fn skill_manage_as(library: Arc<Library>, actor: &'static str) -> Arc<dyn Tool> {
    Arc::new(SkillManage {
        library,
        review: None,
        actor,
    })
}

fn tools(library: Arc<Library>, review: Option<Viewed>) -> Vec<Arc<dyn Tool>> {
    let actor = if review.is_some() { "review" } else { "agent" };
    vec![
        Arc::new(SkillsList {
            library: library.clone(),
        }),
        Arc::new(SkillView {
            library: library.clone(),
            review: review.clone(),
        }),
        Arc::new(SkillManage {
            library,
            review,
            actor,
        }),
    ]
}

/// The skills (and files) the review has read: `name` or `name/path`.
type Viewed = Arc<Mutex<HashSet<String>>>;

fn viewed_key(name: &str, file: Option<&str>) -> String {
    match file {
        None | Some("SKILL.md") => name.to_owned(),
        Some(f) => format!("{name}/{f}"),
    }
}

fn text_arg<'a>(args: &'a Value, name: &str) -> Result<Option<&'a str>, ToolError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ToolError::new(format!("`{name}` must be a string"))),
    }
}

fn required<'a>(args: &'a Value, name: &str, action: &str) -> Result<&'a str, ToolError> {
    text_arg(args, name)?.ok_or_else(|| ToolError::new(format!("`{action}` needs `{name}`")))
}

fn failed(e: SkillError) -> ToolError {
    ToolError::new(e.0)
}

fn origin(info: &SkillInfo) -> &'static str {
    match info.origin {
        Origin::User => "yours",
        Origin::Bundled => "bundled",
    }
}

/// `skills_list`: names, descriptions and categories.
pub struct SkillsList {
    library: Arc<Library>,
}

#[async_trait]
impl Tool for SkillsList {
    fn name(&self) -> &str {
        "skills_list"
    }

    fn description(&self) -> &str {
        "List the available skills (tested procedures for recurring tasks), optionally of one category. Load one with skill_view."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "category": {"type": "string", "description": "only this category"}
            }
        })
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> ToolResult {
        let category = text_arg(&args, "category")?.map(str::to_owned);
        let library = self.library.clone();
        let all = tokio::task::spawn_blocking(move || library.list())
            .await
            .map_err(|e| ToolError::new(e.to_string()))?;
        let mut categories: Vec<&str> = all.iter().map(|s| s.category.as_str()).collect();
        categories.dedup();
        let skills: Vec<Value> = all
            .iter()
            .filter(|s| category.as_deref().is_none_or(|c| s.category == c))
            .map(|s| {
                json!({
                    "name": s.name,
                    "description": s.description,
                    "category": s.category,
                    "source": origin(s),
                })
            })
            .collect();
        Ok(json!({
            "success": true,
            "count": skills.len(),
            "skills": skills,
            "categories": categories,
            "hint": "skill_view(name) loads a skill's full instructions",
        })
        .to_string())
    }

    fn prompt_block(&self) -> Option<String> {
        let index = self.library.index();
        (!index.is_empty()).then_some(index)
    }
}

/// `skill_view`: a skill's instructions, or one of its files.
pub struct SkillView {
    library: Arc<Library>,
    review: Option<Viewed>,
}

#[async_trait]
impl Tool for SkillView {
    fn name(&self) -> &str {
        "skill_view"
    }

    fn description(&self) -> &str {
        "Load a skill's full instructions by name (and the list of its support files), or one support file with file_path (for example references/api.md)."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "the skill's name"},
                "file_path": {"type": "string", "description": "a support file inside the skill: references/..., templates/..., scripts/... or assets/..."}
            },
            "required": ["name"]
        })
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolResult {
        let name = required(&args, "name", "skill_view")?.trim().to_owned();
        let file = text_arg(&args, "file_path")?
            .map(str::to_owned)
            .filter(|f| f != "SKILL.md");
        let library = self.library.clone();
        let review = self.review.clone();
        let (mut out, wanted) = tokio::task::spawn_blocking(
            move || -> Result<(Value, Option<(Vec<String>, bool)>), ToolError> {
                if let Some(viewed) = &review {
                    viewed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(viewed_key(&name, file.as_deref()));
                }
                if let Some(file) = file {
                    let content = library.read_file(&name, &file).map_err(failed)?;
                    library.viewed(&name, Utc::now());
                    let out = json!({
                        "success": true,
                        "name": name,
                        "file_path": file,
                        "content": content,
                    });
                    return Ok((out, None));
                }
                let skill = library.read(&name).map_err(failed)?;
                library.viewed(&name, Utc::now());
                let env = skill.info.frontmatter.required_env_names();
                let agent_made =
                    library.usage().get(&skill.info.name).created_by.as_deref() == Some("agent");
                let out = json!({
                    "success": true,
                    "name": skill.info.name,
                    "description": skill.info.description,
                    "category": skill.info.category,
                    "source": origin(&skill.info),
                    "related_skills": skill.info.frontmatter.related_skills,
                    "required_environment_variables": env,
                    "content": skill.text,
                    "skill_dir": skill.info.dir.map(|d| d.display().to_string()),
                    "linked_files": skill.files,
                });
                Ok((out, Some((env, agent_made))))
            },
        )
        .await
        .map_err(|e| ToolError::new(e.to_string()))??;
        if let Some((env, agent_made)) = wanted.filter(|(env, _)| !env.is_empty()) {
            out["environment"] = json!(grant_env(ctx, &env, agent_made));
        }
        Ok(out.to_string())
    }
}

/// Lets the session's commands see the variables a loaded skill declared,
/// and says what was done. Only in the owner's conversations (elsewhere the
/// people in the chat could print them) and only for skills a person put
/// there: a skill the agent wrote itself could otherwise declare any
/// credential it wanted to read.
fn grant_env(ctx: &ToolContext, names: &[String], agent_made: bool) -> String {
    let list = names.join(", ");
    if agent_made {
        return format!(
            "{list} not passed to commands: this skill was written by the agent, and only skills a \
             person installed may ask for variables"
        );
    }
    if ctx.execution.trust != talaria_agent::execution::Trust::Owner {
        return format!(
            "{list} not passed to commands: this conversation is not the owner's, and its \
             commands never get the owner's variables"
        );
    }
    ctx.session
        .skill_env
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .extend(names.iter().cloned());
    format!("{list} passed to commands for the rest of this session (when set)")
}

/// `skill_manage`: create, change and delete the user's skills.
pub struct SkillManage {
    library: Arc<Library>,
    review: Option<Viewed>,
    /// Who the learning log says made the change.
    actor: &'static str,
}

#[async_trait]
impl Tool for SkillManage {
    fn name(&self) -> &str {
        "skill_manage"
    }

    fn description(&self) -> &str {
        "Create, rewrite, patch or delete your own skills and their support files. A skill is a SKILL.md with YAML frontmatter (name, description) and step-by-step instructions. Read a skill with skill_view before changing it."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["create", "edit", "patch", "delete", "write_file", "remove_file"]},
                "name": {"type": "string", "description": "the skill: lower-case letters, digits, . _ -"},
                "category": {"type": "string", "description": "create: a folder to group it in (same rules as the name)"},
                "content": {"type": "string", "description": "create/edit: the whole SKILL.md, starting with ---\\nname: ...\\ndescription: ...\\n---"},
                "old_string": {"type": "string", "description": "patch: the exact text to replace"},
                "new_string": {"type": "string", "description": "patch: the replacement"},
                "replace_all": {"type": "boolean", "description": "patch: replace every occurrence"},
                "file_path": {"type": "string", "description": "patch/write_file/remove_file: a support file (references/..., templates/..., scripts/..., assets/...); patch defaults to SKILL.md"},
                "file_content": {"type": "string", "description": "write_file: the file's content"}
            },
            "required": ["action", "name"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolResult {
        let action = required(&args, "action", "skill_manage")?.to_owned();
        let name = required(&args, "name", &action)?.trim().to_owned();
        let shared = ctx.store.shared_files();
        if let Some(files) = shared {
            // A change builds on the deployment's newest copy of the skill.
            talaria_agent::shared_home::pull(&ctx.home, files)
                .await
                .map_err(|e| ToolError::new(format!("cannot bring skills up to date: {e}")))?;
        }
        let existed = self.library.file_of(&name, None);
        let skill = name.clone();
        let args = args.clone();
        let library = self.library.clone();
        let review = self.review.clone();
        let actor = self.actor;
        let result = tokio::task::spawn_blocking(move || -> ToolResult {
            let now = Utc::now();
            if let Some(viewed) = &review
                && action != "create"
            {
                guard_review_write(&library, viewed, &name, &action, &args)?;
            }
            let by = review.as_ref().map(|_| "agent");
            // The file this action changes, read before and after for the
            // learning log.
            let file = match action.as_str() {
                "patch" | "write_file" | "remove_file" => text_arg(&args, "file_path")?,
                _ => None,
            };
            let known = library.file_of(&name, file);
            let before = known.as_ref().and_then(|p| std::fs::read(p).ok());
            let message = match action.as_str() {
                "create" => {
                    let content = required(&args, "content", "create")?;
                    let category = text_arg(&args, "category")?.map(str::trim);
                    let dir = library
                        .create(&name, category, content, by, now)
                        .map_err(failed)?;
                    format!(
                        "Skill '{name}' created at {}. It is in the skills index from the next session; skill_view works now.",
                        dir.display()
                    )
                }
                "edit" => {
                    let content = required(&args, "content", "edit")?;
                    library.edit(&name, content, now).map_err(failed)?;
                    format!("Skill '{name}' updated (full rewrite).")
                }
                "patch" => {
                    let old = required(&args, "old_string", "patch")?;
                    let new = text_arg(&args, "new_string")?.unwrap_or_default();
                    let all = matches!(args.get("replace_all"), Some(Value::Bool(true)));
                    let file = text_arg(&args, "file_path")?;
                    let count = library
                        .patch(&name, file, old, new, all, now)
                        .map_err(failed)?;
                    format!(
                        "Patched {} in skill '{name}' ({count} replacement{}).",
                        file.unwrap_or("SKILL.md"),
                        if count == 1 { "" } else { "s" }
                    )
                }
                "delete" => {
                    library.delete(&name).map_err(failed)?;
                    format!("Skill '{name}' deleted.")
                }
                "write_file" => {
                    let file = required(&args, "file_path", "write_file")?;
                    let content = required(&args, "file_content", "write_file")?;
                    library.write_file(&name, file, content, now).map_err(failed)?;
                    format!("File '{file}' written to skill '{name}'.")
                }
                "remove_file" => {
                    let file = required(&args, "file_path", "remove_file")?;
                    library.remove_file(&name, file, now).map_err(failed)?;
                    format!("File '{file}' removed from skill '{name}'.")
                }
                other => {
                    return Err(ToolError::new(format!(
                        "unknown action `{other}`: use create, edit, patch, delete, write_file or remove_file"
                    )));
                }
            };
            // After a delete the skill is gone: log where it was.
            if let Some(path) = library.file_of(&name, file).or(known) {
                let after = std::fs::read(&path).ok();
                let target = match file {
                    Some(f) if f != "SKILL.md" => format!("skill:{name}/{f}"),
                    _ => format!("skill:{name}"),
                };
                library.log().record(
                    actor,
                    &action,
                    &target,
                    &path,
                    before.as_deref(),
                    after.as_deref(),
                );
            }
            Ok(json!({"success": true, "message": message}).to_string())
        })
        .await
        .map_err(|e| ToolError::new(e.to_string()))??;
        if let Some(files) = shared
            && let Some(prefix) = self
                .library
                .file_of(&skill, None)
                .or(existed)
                .and_then(|md| shared_prefix(&ctx.home, &md))
        {
            // The change is made here; the other nodes get it now. Failing
            // to send it is not the model's problem: the next reconcile
            // sends it.
            if let Err(e) = talaria_agent::shared_home::push(&ctx.home, files, &prefix).await {
                tracing::warn!(%skill, "the change stays on this node for now: {e}");
            }
        }
        Ok(result)
    }
}

/// `skills/<…>/<name>/`: the shared prefix of the skill whose SKILL.md is
/// at `skill_md`, when it lives in the home.
fn shared_prefix(home: &talaria_core::Home, skill_md: &std::path::Path) -> Option<String> {
    let rel = skill_md.parent()?.strip_prefix(home.root()).ok()?;
    let rel = rel.to_str()?;
    rel.starts_with("skills/").then(|| format!("{rel}/"))
}

/// What the background review may change: skills the agent created, after
/// reading the very file it changes in this review.
fn guard_review_write(
    library: &Library,
    viewed: &Viewed,
    name: &str,
    action: &str,
    args: &Value,
) -> Result<(), ToolError> {
    let record = library.usage().get(name);
    if record.created_by.as_deref() != Some("agent") {
        return Err(ToolError::new(format!(
            "`{name}` was not written by the agent; the review may only change skills the agent created"
        )));
    }
    let file = match action {
        "patch" | "write_file" | "remove_file" => text_arg(args, "file_path")?,
        _ => None,
    };
    // A new support file has nothing to read; SKILL.md must have been read.
    let key = if action == "write_file" {
        name.to_owned()
    } else {
        viewed_key(name, file)
    };
    let seen = viewed
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&key);
    if !seen {
        return Err(ToolError::new(format!(
            "read it first: call skill_view(name=\"{name}\"{}) in this review before changing it",
            file.filter(|f| *f != "SKILL.md" && action != "write_file")
                .map(|f| format!(", file_path=\"{f}\""))
                .unwrap_or_default()
        )));
    }
    Ok(())
}
