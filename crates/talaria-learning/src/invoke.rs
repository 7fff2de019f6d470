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
