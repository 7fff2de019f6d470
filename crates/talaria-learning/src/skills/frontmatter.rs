//! SKILL.md: YAML frontmatter between `---` lines, then the instructions.
//!
//! The open Agent Skills format: `name` and `description` are required;
//! `version`, `author`, `license`, `platforms`, `metadata`,
//! `related_skills` and `category` are optional, and unknown keys are kept
//! out of the way rather than refused (other tools write their own).

use serde::Deserialize;

/// Longest description, in chars.
pub const MAX_DESCRIPTION_CHARS: usize = 1024;

/// The frontmatter fields Talaria reads.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Frontmatter {
    /// The skill's name; must match its folder.
    pub name: String,
    /// What the skill is for: shown in the index the model chooses from.
    pub description: String,
    /// The author's version string, shown, not compared.
    pub version: Option<String>,
    /// Who wrote it, as they gave it.
    pub author: Option<String>,
    /// Its licence, as given.
    pub license: Option<String>,
    /// Operating systems the skill works on (`linux`, `macos`, ...); empty
    /// means all.
    pub platforms: Vec<String>,
    /// The `metadata` map as written (tags, other tools' fields); Talaria
    /// keeps it without reading it.
    pub metadata: serde_json::Value,
    /// Skills to look at alongside this one (drawn as links in the graph).
    pub related_skills: Vec<String>,
    /// A category that overrides the folder's.
    pub category: Option<String>,
    /// Environment variables the skill's commands need (an API key, say),
    /// by name or as `{name: ...}` entries as other tools write them. In
    /// the owner's conversations, once the skill is loaded, commands get
    /// these variables and no others beyond the usual allowlist.
    pub required_environment_variables: Vec<RequiredEnv>,
}

/// One entry of `required_environment_variables`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum RequiredEnv {
    /// Just the name.
    Name(String),
    /// An entry with more fields (a prompt, a help text) Talaria leaves
    /// alone.
    Entry {
        /// The variable's name.
        #[serde(alias = "env_var")]
        name: String,
    },
}

impl Frontmatter {
    /// The names in `required_environment_variables` that are well-formed
    /// variable names (letters, digits and `_`, not starting with a digit).
    pub fn required_env_names(&self) -> Vec<String> {
        self.required_environment_variables
            .iter()
            .map(|r| match r {
                RequiredEnv::Name(n) | RequiredEnv::Entry { name: n } => n.trim().to_owned(),
            })
            .filter(|n| {
                !n.is_empty()
                    && !n.starts_with(|c: char| c.is_ascii_digit())
                    && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
            .collect()
    }
}

/// A SKILL.md split into its parts.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// The parsed frontmatter.
    pub frontmatter: Frontmatter,
    /// The instructions after the frontmatter.
    pub body: String,
}

/// Splits and reads a SKILL.md. A leading byte-order mark is tolerated.
pub fn parse(text: &str) -> Result<Parsed, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let rest = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))
        .ok_or("SKILL.md must start with a `---` line opening its YAML frontmatter")?;
    let (yaml, body) =
        split_closing(rest).ok_or("the frontmatter is not closed by a `---` line")?;
    let frontmatter: Frontmatter = if yaml.trim().is_empty() {
        Frontmatter::default()
    } else {
        serde_saphyr::from_str(yaml)
            .map_err(|e| format!("the frontmatter is not valid YAML: {e}"))?
    };
    Ok(Parsed {
        frontmatter,
        body: body.to_owned(),
    })
}

/// The YAML before the first line that is exactly `---`, and what follows
/// that line.
fn split_closing(rest: &str) -> Option<(&str, &str)> {
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end_matches(['\n', '\r']) == "---" {
            return Some((&rest[..offset], &rest[offset + line.len()..]));
        }
        offset += line.len();
    }
    (rest[offset..].trim_end() == "---").then(|| (&rest[..offset], ""))
}

/// The checks a skill written by the agent (or `talaria`) must pass: the
/// frontmatter names this skill and describes it, and there are
/// instructions.
pub fn check(parsed: &Parsed, name: &str) -> Result<(), String> {
    let fm = &parsed.frontmatter;
    if fm.name.trim().is_empty() {
        return Err("the frontmatter needs `name:`".into());
    }
    if fm.name.trim() != name {
        return Err(format!(
            "the frontmatter says `name: {}` but the skill is `{name}`; they must match",
            fm.name.trim()
        ));
    }
    if fm.description.trim().is_empty() {
        return Err(
            "the frontmatter needs `description:` (one or two sentences on when to use the skill)"
                .into(),
        );
    }
    if fm.description.chars().count() > MAX_DESCRIPTION_CHARS {
        return Err(format!(
            "the description is longer than {MAX_DESCRIPTION_CHARS} characters"
        ));
    }
    if parsed.body.trim().is_empty() {
        return Err("SKILL.md has no instructions after the frontmatter".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontmatter_and_body_are_split() {
        let p = parse(
            "\u{feff}---\nname: git-flow\ndescription: Branching the team's way.\nversion: '1.2'\nplatforms: [linux, macos]\nrelated_skills: [code-review]\nmetadata: {tags: [git]}\nextra: kept out\n---\n# Steps\n1. Branch.\n",
        )
        .unwrap();
        assert_eq!(p.frontmatter.name, "git-flow");
        assert_eq!(p.frontmatter.version.as_deref(), Some("1.2"));
        assert_eq!(p.frontmatter.platforms, ["linux", "macos"]);
        assert_eq!(p.frontmatter.related_skills, ["code-review"]);
        assert_eq!(p.frontmatter.metadata["tags"][0], "git");
        assert_eq!(p.body, "# Steps\n1. Branch.\n");
        assert!(check(&p, "git-flow").is_ok());
        assert!(check(&p, "other").unwrap_err().contains("must match"));
    }

    #[test]
    fn malformed_files_say_what_is_wrong() {
        assert!(parse("no frontmatter").unwrap_err().contains("---"));
        assert!(parse("---\nname: x\n").unwrap_err().contains("not closed"));
        assert!(
            parse("---\nname: [x\n---\nbody")
                .unwrap_err()
                .contains("YAML")
        );
        let empty_body = parse("---\nname: x\ndescription: d\n---\n\n").unwrap();
        assert!(
            check(&empty_body, "x")
                .unwrap_err()
                .contains("no instructions")
        );
        let no_description = parse("---\nname: x\n---\nbody").unwrap();
        assert!(
            check(&no_description, "x")
                .unwrap_err()
                .contains("description")
        );
        let closing_at_end = parse("---\nname: x\ndescription: d\n---").unwrap();
        assert_eq!(closing_at_end.body, "");
    }
}
