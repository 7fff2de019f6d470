//! `/skill-name [instructions]` in chat: the skill's instructions loaded
//! into that turn's message, so the model follows them now.

use chrono::Utc;

use crate::skills::Library;
use crate::skills::usage::Event;

/// The message a turn gets for `/name args`, or `None` when no skill has
/// that name. Counts a use.
///
/// The name is matched as typed (lower-cased), then with `_` read as `-`,
/// because Telegram's command menu allows only underscores
/// (`/system_health` is the `system-health` skill).
pub fn invocation(library: &Library, name: &str, args: &str) -> Option<String> {
    let typed = name.to_ascii_lowercase();
    let skill = library
        .read(&typed)
        .or_else(|_| library.read(&typed.replace('_', "-")))
        .ok()?;
    library
        .usage()
        .record(&skill.info.name, Event::Used, Utc::now());
    let mut message = format!(
        "[The user invoked the \"{}\" skill: follow its instructions, loaded below.]\n\n{}",
        skill.info.name,
        skill.text.trim()
    );
    if let Some(dir) = &skill.info.dir {
        message.push_str(&format!("\n\n[Skill directory: {}]", dir.display()));
    }
    if !skill.files.is_empty() {
        message.push_str(&format!(
            "\n[Support files (load with skill_view and file_path): {}]",
            skill.files.join(", ")
        ));
    }
    let args = args.trim();
    if !args.is_empty() {
        message.push_str(&format!(
            "\n\nThe user's instruction with the skill: {args}"
        ));
    }
    Some(message)
}

/// What `/learn <topic>` asks of the agent: find out, then write one
/// skill with `skill_manage`.
pub fn learn_prompt(topic: &str) -> String {
    format!(
        "[The user asked you to learn a skill: {topic}]\n\nFind out how this is done well: use what you know, the files and tools you have, and what you can check here. Then write it down as ONE skill with skill_manage (action create; load the writing-skills skill first if you are unsure of the format): a name for the class of task, a description saying when to use it, and numbered steps with the exact commands and checks. Put long reference material in references/ with write_file. Finish by saying in two sentences what the skill covers."
    )
}

/// `/skills`: the skills by category, one line each.
pub fn listing(library: &Library) -> String {
    let skills = library.list();
    if skills.is_empty() {
        return "No skills yet.".to_owned();
    }
    let mut out = String::new();
    let mut category = "";
    for s in &skills {
        if s.category != category {
            category = &s.category;
            out.push_str(&format!("{category}:\n"));
        }
        let description: String = s.description.chars().take(80).collect();
        out.push_str(&format!("  /{} - {description}\n", s.name));
    }
    out.push_str("Type /<name> to use one, or /learn <topic> to have me write a new one.");
    out
}
