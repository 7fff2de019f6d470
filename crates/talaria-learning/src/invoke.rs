//! `/skill-name [instructions]` in chat: the skill's instructions loaded
//! into that turn's message, so the model follows them now.

use chrono::Utc;

use crate::skills::Library;
use crate::skills::usage::Event;

/// The message a turn gets for `/name args`, or `None` when no skill has
/// that name. Counts a use.
pub fn invocation(library: &Library, name: &str, args: &str) -> Option<String> {
    let skill = library.read(name).ok()?;
    library.usage().record(name, Event::Used, Utc::now());
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
