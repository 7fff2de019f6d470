//! The ancestor's own access policies for the platforms that have them
//! (`<PLATFORM>_DM_POLICY`, `<PLATFORM>_GROUP_POLICY`: WeCom's robot,
//! Yuanbao). An adapter applies them to each message before the gateway's
//! allowlists and pairing, which still apply to whatever they let through.

/// One access policy, as the ancestor names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Anyone (the gateway's allowlists still apply).
    Open,
    /// Only the listed users (DMs) or chats (groups).
    Allowlist,
    /// DMs: strangers are offered a pairing code by the gateway. Groups:
    /// closed, as the ancestor treats it.
    Pairing,
    /// Nothing gets through.
    Disabled,
}

impl Policy {
    /// The policy named `name` (any case); `None` for an unknown name.
    pub fn parse(name: &str) -> Option<Policy> {
        match name.trim().to_ascii_lowercase().as_str() {
            "open" => Some(Policy::Open),
            "allowlist" => Some(Policy::Allowlist),
            "pairing" => Some(Policy::Pairing),
            "disabled" => Some(Policy::Disabled),
            _ => None,
        }
    }
}

/// Who may reach the bot, before the gateway's own allowlists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// Direct messages.
    pub dm: Policy,
    /// The users a DM allowlist admits (`<PLATFORM>_ALLOWED_USERS`).
    pub dm_allow_from: Vec<String>,
    /// `<PLATFORM>_ALLOW_ALL_USERS`: the DM allowlist is lifted.
    pub allow_all: bool,
    /// Groups.
    pub group: Policy,
    /// The chats a group allowlist admits.
    pub group_allow_from: Vec<String>,
}

impl Access {
    /// Why a direct message from `from` is turned away; `None` when it
    /// passes.
    pub fn refuses_dm(&self, from: &str) -> Option<&'static str> {
        match self.dm {
            Policy::Open | Policy::Pairing => None,
            Policy::Allowlist if self.allow_all || self.dm_allow_from.iter().any(|u| u == from) => {
                None
            }
            Policy::Allowlist => Some("the sender is not on the DM allowlist"),
            Policy::Disabled => Some("direct messages are disabled"),
        }
    }

    /// Why a message in group `chat` is turned away; `None` when it
    /// passes.
    pub fn refuses_group(&self, chat: &str) -> Option<&'static str> {
        match self.group {
            Policy::Open => None,
            Policy::Allowlist if self.group_allow_from.iter().any(|g| g == chat) => None,
            Policy::Allowlist => Some("the group is not on the group allowlist"),
            Policy::Pairing | Policy::Disabled => Some("groups are closed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(dm: Policy, group: Policy) -> Access {
        Access {
            dm,
            dm_allow_from: vec!["ann".into()],
            allow_all: false,
            group,
            group_allow_from: vec!["team".into()],
        }
    }

    #[test]
    fn names_parse_in_any_case_and_unknown_ones_do_not() {
        assert_eq!(Policy::parse(" AllowList "), Some(Policy::Allowlist));
        assert_eq!(Policy::parse("pairing"), Some(Policy::Pairing));
        assert_eq!(Policy::parse("everyone"), None);
    }

    #[test]
    fn each_policy_admits_what_it_says() {
        let a = access(Policy::Allowlist, Policy::Allowlist);
        assert_eq!(a.refuses_dm("ann"), None);
        assert!(a.refuses_dm("bob").is_some());
        assert_eq!(a.refuses_group("team"), None);
        assert!(a.refuses_group("other").is_some());
        let lifted = Access {
            allow_all: true,
            ..a.clone()
        };
        assert_eq!(lifted.refuses_dm("bob"), None);
        let p = access(Policy::Pairing, Policy::Pairing);
        assert_eq!(p.refuses_dm("bob"), None, "the gateway offers pairing");
        assert!(p.refuses_group("team").is_some(), "pairing closes groups");
        let d = access(Policy::Disabled, Policy::Disabled);
        assert!(d.refuses_dm("ann").is_some());
        assert!(d.refuses_group("team").is_some());
        let o = access(Policy::Open, Policy::Open);
        assert_eq!(o.refuses_dm("bob"), None);
        assert_eq!(o.refuses_group("other"), None);
    }
}
