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
/// At most `max` characters on one line, cut after a whole word with an
/// ellipsis when the text is longer.
fn clip_at_word(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        return flat;
    }
    let head: String = flat.chars().take(max.saturating_sub(1)).collect();
    let cut = match head.rfind(' ') {
        Some(i) if i >= head.len() / 2 => &head[..i],
        _ => head.as_str(),
    };
    format!("{}…", cut.trim_end_matches([',', ';', ':', '.', ' ']))
}

/// The `/skills` answer: every skill by category, each with the start of
/// its description, and how to use or write one.
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
        out.push_str(&format!(
            "  /{} - {}\n",
            s.name,
            clip_at_word(&s.description, 80)
        ));
    }
    out.push_str("Type /<name> to use one, or /learn <topic> to have me write a new one.");
    out
}

#[cfg(test)]
mod clip_tests {
    use super::clip_at_word;

    #[test]
    fn long_descriptions_are_cut_after_a_whole_word() {
        assert_eq!(clip_at_word("Short one.", 80), "Short one.");
        let cut = clip_at_word("Find the cause of a failing test, then fix it properly", 30);
        assert_eq!(cut, "Find the cause of a failing…");
    }
}
