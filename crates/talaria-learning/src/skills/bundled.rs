//! The skills shipped inside the binary (from the repository's `skills/`
//! folder). They are read-only and lose to a user skill of the same name.

/// One bundled skill.
#[derive(Debug, Clone, Copy)]
pub struct BundledSkill {
    /// The skill's name, as it is called (`/name`).
    pub name: &'static str,
    /// The category folder it sits in.
    pub category: &'static str,
    /// The whole SKILL.md.
    pub text: &'static str,
}

/// Every bundled skill.
pub const SKILLS: &[BundledSkill] = &[
    BundledSkill {
        name: "git-workflow",
        category: "software",
        text: include_str!("../../../../skills/software/git-workflow/SKILL.md"),
    },
    BundledSkill {
        name: "systematic-debugging",
        category: "software",
        text: include_str!("../../../../skills/software/systematic-debugging/SKILL.md"),
    },
    BundledSkill {
        name: "system-health",
        category: "ops",
        text: include_str!("../../../../skills/ops/system-health/SKILL.md"),
    },
    BundledSkill {
        name: "writing-skills",
        category: "meta",
        text: include_str!("../../../../skills/meta/writing-skills/SKILL.md"),
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::skills::{frontmatter, valid_name};

    #[test]
    fn every_bundled_skill_is_valid_and_named_by_its_folder() {
        for skill in SKILLS {
            assert!(valid_name(skill.name), "{}", skill.name);
            let parsed = frontmatter::parse(skill.text).unwrap();
            frontmatter::check(&parsed, skill.name).unwrap();
            assert_eq!(parsed.frontmatter.category.as_deref(), Some(skill.category));
        }
    }
}
