//! The agent's Markdown in Discord's dialect.
//!
//! Discord renders most Markdown itself (bold, italics, code, fences,
//! lists, quotes, `#`-`###` headings, masked links), so only what it shows
//! literally is changed, and never inside code fences:
//!
//! - headings deeper than `###` become bold lines;
//! - thematic breaks (`---`, `***`, `___`) become a drawn line;
//! - pipe tables become code blocks, which keep their columns aligned in
//!   Discord's monospace font.

/// What a thematic break becomes.
const RULE: &str = "──────────";

/// Converts one (already split) chunk to Discord Markdown.
pub(crate) fn to_discord(text: &str) -> String {
    let lines: Vec<&str> = text.split('\n').collect();
    let mut out: Vec<String> = Vec::with_capacity(lines.len());
    let mut in_fence = false;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            out.push(line.to_owned());
            i += 1;
            continue;
        }
        if in_fence {
            out.push(line.to_owned());
            i += 1;
            continue;
        }
        if is_table_row(line) && lines.get(i + 1).is_some_and(|l| is_table_separator(l)) {
            let end = lines[i..]
                .iter()
                .position(|l| !is_table_row(l))
                .map_or(lines.len(), |p| i + p);
            out.push("```".to_owned());
            out.extend(lines[i..end].iter().map(|l| (*l).to_owned()));
            out.push("```".to_owned());
            i = end;
            continue;
        }
        out.push(convert_line(line));
        i += 1;
    }
    out.join("\n")
}

fn convert_line(line: &str) -> String {
    let trimmed = line.trim();
    let hashes = trimmed.chars().take_while(|c| *c == '#').count();
    if hashes > 3 && hashes <= 6 {
        let rest = &trimmed[hashes..];
        if rest.starts_with(' ') && !rest.trim().is_empty() {
            return format!("**{}**", rest.trim().trim_end_matches('#').trim_end());
        }
    }
    if is_rule(trimmed) {
        return RULE.to_owned();
    }
    line.to_owned()
}

/// Three or more of one of `-`, `*`, `_`, optionally spaced, and nothing else.
fn is_rule(trimmed: &str) -> bool {
    let mut chars = trimmed.chars().filter(|c| *c != ' ');
    let Some(first) = chars.next() else {
        return false;
    };
    matches!(first, '-' | '*' | '_')
        && trimmed.chars().filter(|c| *c == first).count() >= 3
        && trimmed.chars().all(|c| c == first || c == ' ')
}

fn is_table_row(line: &str) -> bool {
    let t = line.trim();
    t.len() >= 2 && t.starts_with('|') && t[1..].contains('|')
}

/// `|---|:---:|` and the like.
fn is_table_separator(line: &str) -> bool {
    let t = line.trim();
    is_table_row(t) && t.contains('-') && t.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_markdown_is_left_alone() {
        let text = "# Title\n## Sub\n### Small\n**bold** _it_ `code` ~~s~~\n> quote\n- item\n[link](https://x.y)";
        assert_eq!(to_discord(text), text);
    }

    #[test]
    fn deep_headings_become_bold() {
        assert_eq!(to_discord("#### Details ##"), "**Details**");
        assert_eq!(to_discord("###### Six"), "**Six**");
        // Not headings: no space, or more than six.
        assert_eq!(to_discord("####nospace"), "####nospace");
        assert_eq!(to_discord("####### seven"), "####### seven");
    }

    #[test]
    fn rules_and_tables() {
        assert_eq!(to_discord("a\n---\nb"), format!("a\n{RULE}\nb"));
        assert_eq!(to_discord("* * *"), RULE);
        assert_eq!(to_discord("-- x"), "-- x");
        assert_eq!(
            to_discord("Sizes:\n| a | b |\n|---|:-:|\n| 1 | 2 |\nafter"),
            "Sizes:\n```\n| a | b |\n|---|:-:|\n| 1 | 2 |\n```\nafter"
        );
        // A lone pipe line is not a table.
        assert_eq!(to_discord("| just this |"), "| just this |");
    }

    #[test]
    fn nothing_changes_inside_fences() {
        let text = "```md\n#### keep\n---\n| a | b |\n|---|---|\n```\n#### change";
        assert_eq!(
            to_discord(text),
            "```md\n#### keep\n---\n| a | b |\n|---|---|\n```\n**change**"
        );
    }
}
